"""Pass `tensorrt.build`: an ONNX model (often the quantize pass's QDQ output) -> a serialized TensorRT engine.

TensorRT 10 Python API: explicit-batch networks, the ONNX parser, FP32 / FP16 / BF16 builder flags,
INT8 only from an explicitly quantized (Q/DQ) model (the implicit calibrators are deprecated and not used),
optional strongly typed networks (precision comes from the model's own types), one optimization profile for
dynamic inputs (MIN:OPT:MAX from --shape), a workspace limit, the builder optimization level, and a timing cache
that is loaded before and saved after every build so later builds reuse it.

The build runs in a child process (run_isolated): the CLI process never initialises CUDA, so the measurements
that follow can still fork, and a crashing builder becomes an exit-3 error. The engine is written to a temporary
file next to the destination, checked against the ONNX model on onnxruntime (CPU) and only then renamed into place.
"""
from __future__ import annotations

import time
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.cachedir import cache_dir
from optkit.core.errors import PassError, UsageError, ValidationError
from optkit.core.formats import Format
from optkit.core.isolate import run_isolated
from optkit.core.registry import Pass, PassConfig, PassContext, missing_extra, register
from optkit.core.shapes import format_shape
from optkit.measure.inputs import synthesize
from optkit.passes.tensorrt.check import check_model
from optkit.runtimes.onnx import OnnxSession
from optkit.runtimes.tensorrt import TensorRTSession, gpu_problem, import_tensorrt, make_logger

# Output closeness the build must keep, as max |engine - onnx| / max |onnx| per output.
DEFAULT_TOLERANCE = {"fp32": 1e-2, "fp32-no-tf32": 1e-4, "fp16": 3e-2, "bf16": 8e-2, "int8": 0.15}


class TensorRTBuildConfig(PassConfig):
    precision: Literal["fp32", "fp16", "bf16", "int8"] = Field(
        "fp16", description="fp32, fp16, bf16, or int8 (needs a Q/DQ model). With strongly_typed: fp32 (as in the "
                            "model) or int8 (a Q/DQ model).")
    strongly_typed: bool = Field(False, description="Strongly typed network: every tensor keeps the model's type.")
    profile: dict[str, list[list[int]]] = Field(
        default_factory=dict, description="Optimization profile: input name -> [MIN, OPT, MAX] shapes.")
    workspace_mb: int | None = Field(None, ge=1, description="Workspace memory pool limit (MiB).")
    optimization_level: int = Field(3, ge=0, le=5, description="Builder optimization level 0-5 (TensorRT's default 3).")
    timing_cache: str | None = Field(
        "auto", description="Timing cache file, loaded and saved on every build; 'auto' = the per-user cache, "
                            "null or '' = none.")
    tf32: bool = Field(True, description="Allow TF32 for fp32 layers (TensorRT's default).")
    validate_output: bool = Field(True, description="Compare the engine with the ONNX model on sample inputs.")
    tolerance: float | None = Field(None, gt=0, description="Max |engine - onnx| / max|onnx| (default by precision).")


@register
class TensorRTBuild(Pass):
    name = "tensorrt.build"
    summary = "ONNX -> TensorRT engine (fp32/fp16/bf16, int8 from Q/DQ, dynamic-shape profiles, timing cache)"
    accepts = (Format.ONNX,)
    produces = Format.TRT_ENGINE
    extra = "trt"
    Config = TensorRTBuildConfig

    @classmethod
    def missing(cls) -> str | None:
        """The install hint when tensorrt is not importable; else why no GPU is usable; else None."""
        hint = missing_extra(cls.extra)
        if hint:
            return hint

        return gpu_problem()

    def run(self, artifact: Artifact, config: TensorRTBuildConfig, ctx: PassContext) -> Artifact:
        plan = make_plan(artifact.path, config, ctx.shapes)
        for text in plan["notes"]:
            ctx.note(text)
        cache_path = timing_cache_path(config.timing_cache)
        cache_blob = cache_path.read_bytes() if cache_path is not None and cache_path.is_file() else b""
        with atomic_path(ctx.output) as tmp:
            info = run_isolated(build_engine, artifact.path, str(tmp), config.model_dump(mode="json"), plan,
                                cache_blob, ctx.seed, what=f"building a TensorRT engine from {artifact.path}")
        blob = info.pop("timing_cache_blob", None)
        if cache_path is not None and blob:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(cache_path) as tmp_cache:
                tmp_cache.write_bytes(blob)
            info["timing_cache"] = {"path": str(cache_path), "loaded_bytes": len(cache_blob), "saved_bytes": len(blob),
                                    "reused": info.get("timing_cache_reused", False)}
            ctx.note(f"timing cache {cache_path} " + ("reused" if info["timing_cache"]["reused"] else "started")
                     + f", saved ({len(blob):,} bytes)")
        info.pop("timing_cache_reused", None)
        for text in info.pop("notes", []):
            ctx.note(text)
        for text in info.pop("warnings", []):
            ctx.warn(text)
        ctx.measurements["tensorrt"] = info
        return artifact.derive(ctx.output, Format.TRT_ENGINE, self.name, config.model_dump(mode="json"),
                               shapes=plan["shapes"], tensorrt=info.get("version"))


# -- planning on the CPU (no tensorrt) ---------------------------------------------------------------------
def make_plan(onnx_path: str, config: TensorRTBuildConfig, shapes: dict[str, list[int]] | None = None) -> dict:
    """Check the config against the model and resolve one optimization profile; UsageError (exit 2) when wrong."""

    report = check_model(onnx_path)
    notes: list[str] = []
    if config.strongly_typed and config.precision in ("fp16", "bf16"):
        raise UsageError(f"a strongly typed network takes its precision from the model, so --precision "
                         f"{config.precision} does not apply; convert the model to {config.precision} first, or "
                         "drop --strongly-typed")
    if config.precision == "int8" and not report.quantized:
        raise UsageError("int8 needs an explicitly quantized model (QuantizeLinear/DequantizeLinear nodes); "
                         "TensorRT's implicit INT8 calibration is deprecated: quantize to QDQ first "
                         "(optkit quantize MODEL --format qdq), then build with --precision int8")
    qdq = [f for f in report.errors if f.code.startswith("qdq-")]
    if qdq:  # TensorRT's explicit quantization is symmetric INT8: no build can succeed, so say why now
        raise UsageError(f"{onnx_path} is quantized in a way TensorRT rejects ({len(qdq)} Q/DQ problem(s); first at "
                         f"{qdq[0].node}: {qdq[0].message}); `optkit trt check {onnx_path}` lists them all")
    given: dict[str, list[list[int]]] = {k: [list(s) for s in v] for k, v in config.profile.items()}
    for name, shape in (shapes or {}).items():
        given.setdefault(name, [list(shape)] * 3)
    names = [i["name"] for i in report.inputs]
    if "" in given:
        if len(names) != 1:
            raise UsageError(f"the model has {len(names)} inputs ({', '.join(names)}): write --shape NAME=DIMS")
        given[names[0]] = given.pop("")
    for key in given:
        if key not in names:
            raise UsageError(f"--shape names input {key!r}, but the model's inputs are {', '.join(names)}")
    profiles: dict[str, list[list[int]]] = {}
    opt: dict[str, list[int]] = {}
    for inp in report.inputs:
        name, dims = inp["name"], inp["shape"]
        prof = given.get(name)
        if prof is not None:
            for which, shape in zip(("MIN", "OPT", "MAX"), prof):
                if dims is not None and len(shape) != len(dims):
                    raise UsageError(f"--shape {which} for input {name!r} has {len(shape)} dims but the model "
                                     f"expects {len(dims)} ({format_shape(dims)})")
                for i, (want, have) in enumerate(zip(dims or [], shape)):
                    if isinstance(want, int) and want != have:
                        raise UsageError(f"--shape {which} for input {name!r} sets dim {i} to {have} but the model "
                                         f"fixes it at {want} ({format_shape(dims)})")
            if len({tuple(s) for s in prof}) > 1 or dims is None or any(not isinstance(d, int) for d in dims):
                profiles[name] = prof
            opt[name] = prof[1]
            continue
        if dims is None:
            raise UsageError(f"input {name!r} has no declared shape; give it with --shape {name}=DIMS")
        dynamic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
        if not dynamic:
            opt[name] = list(dims)
            continue
        pattern = "x".join(str(d) if isinstance(d, int) else "N" for d in dims)
        if dynamic != [0]:
            raise UsageError(f"input {name!r} has dynamic dims ({pattern}) and no optimization profile; give "
                             f"--shape {name}=DIMS or {name}=MIN:OPT:MAX")
        fixed = [1] + list(dims[1:])
        profiles[name] = [fixed, fixed, fixed]
        opt[name] = fixed
        notes.append(f"input {name!r} has a dynamic batch dim and no profile: the engine takes batch 1 only "
                     f"(give --shape {name}=MIN:OPT:MAX for a range)")
    blocking = [f.message for f in report.errors if f.code not in ("dynamic-dim", "int8-needs-qdq")]
    return {"profiles": profiles, "shapes": opt, "quantized": report.quantized, "notes": notes,
            "check_errors": blocking[:3]}


def timing_cache_path(setting: str | None) -> Path | None:
    """Where the timing cache lives: None (no cache), a file named by the user, or the per-user default."""
    if not setting:
        return None
    if setting != "auto":
        return Path(setting).expanduser()
    try:
        version = metadata.version("tensorrt")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return cache_dir() / f"tensorrt-{version}-timing.cache"


# -- the build (child process; imports tensorrt) -------------------------------------------------------------
def build_engine(onnx_path: str, engine_path: str, cfg: dict[str, Any], plan: dict, cache_blob: bytes,
                 seed: int = 0) -> dict[str, Any]:
    trt = import_tensorrt()
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    flags = 0
    if cfg["strongly_typed"]:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise parser_error(parser, onnx_path, plan.get("check_errors") or [])

    bconf = builder.create_builder_config()
    if cfg["workspace_mb"]:
        bconf.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(cfg["workspace_mb"]) << 20)
    bconf.builder_optimization_level = int(cfg["optimization_level"])
    precision = cfg["precision"]
    notes: list[str] = []
    if not cfg["strongly_typed"]:
        if precision in ("fp16", "int8"):
            bconf.set_flag(trt.BuilderFlag.FP16)
        if precision == "bf16":
            bconf.set_flag(trt.BuilderFlag.BF16)
        if precision == "int8":  # explicit quantization: Q/DQ scales from the model, no calibrator
            bconf.set_flag(trt.BuilderFlag.INT8)
            notes.append("int8 from the model's Q/DQ scales; layers outside Q/DQ pairs may run in fp16")
    if not cfg["tf32"]:
        bconf.clear_flag(trt.BuilderFlag.TF32)

    dynamic = []
    for i in range(network.num_inputs):
        t = network.get_input(i)
        if any(d < 0 for d in t.shape):
            dynamic.append(t.name)
    if dynamic:
        prof = builder.create_optimization_profile()
        for name in dynamic:
            lo, opt, hi = plan["profiles"].get(name) or [plan["shapes"][name]] * 3
            prof.set_shape(name, lo, opt, hi)
        bconf.add_optimization_profile(prof)

    reused = False
    if cfg.get("timing_cache"):
        cache = bconf.create_timing_cache(bytes(cache_blob)) if cache_blob else None
        if cache is not None and bconf.set_timing_cache(cache, False):
            reused = True
        else:
            if cache_blob:
                notes.append("the timing cache was made by another GPU or TensorRT version; started a fresh one")
            cache = bconf.create_timing_cache(b"")
            bconf.set_timing_cache(cache, False)

    start = time.perf_counter()
    serialized = builder.build_serialized_network(network, bconf)
    build_s = time.perf_counter() - start
    if serialized is None:
        why = logger.errors[-1].splitlines()[0] if logger.errors else "no reason given"
        raise PassError(f"TensorRT could not build an engine from {onnx_path}: {why}",
                        details={"errors": logger.errors[-10:]})
    with open(engine_path, "wb") as f:
        f.write(serialized)

    info: dict[str, Any] = {
        "version": trt.__version__, "precision": precision, "strongly_typed": cfg["strongly_typed"],
        "build_s": round(build_s, 3), "profiles": {k: plan["profiles"][k] for k in dynamic if k in plan["profiles"]},
        "optimization_level": cfg["optimization_level"], "workspace_mb": cfg["workspace_mb"],
        "timing_cache_reused": reused, "notes": notes, "warnings": [],
    }
    if cfg.get("timing_cache"):
        info["timing_cache_blob"] = bytes(bconf.get_timing_cache().serialize())
    del serialized, parser, network, bconf, builder
    if cfg["validate_output"]:
        info["validation"] = validate_engine(onnx_path, engine_path, plan, cfg, seed)
    return info


def parser_error(parser, onnx_path: str, check_errors: list[str]) -> PassError:
    """One line naming the node and op the parser stopped at; every parser error kept in details."""
    errors = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        errors.append({"node": _call(e, "node_name"), "op": _call(e, "node_operator"), "index": _call(e, "node"),
                       "code": str(_call(e, "code")), "desc": str(_call(e, "desc") or "").strip()})
    if not errors:
        return PassError(f"TensorRT's ONNX parser could not read {onnx_path}")
    first = errors[0]
    where = (f"node {first['node']!r}" if first["node"] else f"node #{first['index']}") + \
        (f" (op {first['op']})" if first["op"] else "")
    desc = first["desc"].splitlines()[0] if first["desc"] else first["code"]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return PassError(f"TensorRT's ONNX parser failed at {where} in {onnx_path}: {desc}{more}; "
                     f"`optkit trt check {onnx_path}` lists what TensorRT does not support",
                     details={"parser_errors": errors, "check": check_errors})


def _call(obj, name):
    fn = getattr(obj, name, None)
    try:
        return fn() if callable(fn) else fn
    except Exception:  # noqa: BLE001 - older bindings lack some accessors
        return None


def validate_engine(onnx_path: str, engine_path: str, plan: dict, cfg: dict, seed: int = 0) -> dict:
    """Run the engine and the ONNX model (onnxruntime, CPU) on the same inputs; ValidationError past tolerance."""
    import numpy as np

    ref = OnnxSession(Artifact(path=onnx_path, format=Format.ONNX, sha256=""), provider="cpu")
    eng = TensorRTSession(Artifact(path=engine_path, format=Format.TRT_ENGINE, sha256=""), cuda_graphs=False)
    try:
        feeds = synthesize(ref.inputs, plan["shapes"], batch=1, seed=seed)
        want = dict(zip([o.name for o in ref.outputs], ref.run(feeds)))
        got = dict(zip([o.name for o in eng.outputs], eng.run({k: feeds[k] for k in [i.name for i in eng.inputs]})))
    finally:
        eng.close()
    precision = cfg["precision"]
    if cfg["strongly_typed"]:
        precision = "int8" if plan["quantized"] else "fp32"
    if precision == "fp32" and not cfg["tf32"]:
        precision = "fp32-no-tf32"
    tol = cfg["tolerance"] or DEFAULT_TOLERANCE[precision]
    per = {}
    for name, a in want.items():
        b = got.get(name)
        if b is None:
            raise ValidationError(f"the engine has no output {name!r} (it has {', '.join(got)})")
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(np.shape(a))
        diff = np.abs(a64 - b64)
        scale = max(float(np.abs(a64).max()) if a64.size else 0.0, 1e-6)
        worst = float(diff.max()) if diff.size else 0.0
        rel = worst / scale
        per[name] = {"max_abs_error": worst, "relative": rel}
        if not np.isfinite(b64).all() or rel > tol:
            idx = [int(i) for i in np.unravel_index(int(np.nan_to_num(diff, nan=np.inf).argmax()), diff.shape)] \
                if diff.size else []
            raise ValidationError(
                f"the engine's output {name!r} differs from the ONNX model by {worst:.3g} at {idx} "
                f"({rel:.1%} of its largest value; tolerance {tol:.1%} for {precision}); build with a higher "
                "precision or set a larger tolerance")
    return {"tolerance": tol, "precision": precision, "outputs": per, "shapes": plan["shapes"]}
