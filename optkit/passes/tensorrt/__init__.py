"""Pass `tensorrt.build`: an ONNX model (often the quantize pass's QDQ output) -> a serialized TensorRT engine.

TensorRT 10.x and 11.x Python API: explicit-batch networks, the ONNX parser, explicit quantization (INT8 only from a
Q/DQ model: the implicit calibrators are gone), one optimization profile for dynamic inputs (MIN:OPT:MAX from
--shape, values for shape-tensor inputs), a workspace limit, the builder optimization level, and a timing cache
that is loaded before and saved after every build so later builds reuse it: only a file of the user's own that
group and others cannot write is loaded or replaced (core.cachedir; said at -v), and the per-user one is saved in a
0700 folder of the user's own.

Precision (`select_precision`): strongly typed networks are the default for int8 (Q/DQ) builds, as NVIDIA's
explicit-quantization guide recommends. fp16 / bf16 use the weak-typing builder flags only where the installed
TensorRT still has them (10.x; deprecated since 10.12, removed in 11). Elsewhere, or with --strongly-typed, the
model is cast to fp16 / bf16 first (`cast_model`) and built strongly typed.

The build runs in a child process (run_isolated): the CLI process never initialises CUDA, so the measurements
that follow can still fork, and a crashing builder becomes an exit-3 error. The engine is written to a temporary
file next to the destination, checked against the ONNX model on onnxruntime (CPU) and only then renamed into place.
"""
from __future__ import annotations

import logging
import os
import stat
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from optkit.contracts.base import MAX_MIB
from optkit.core.artifact import Artifact
from optkit.core.atomic import PathRole, atomic_path
from optkit.core.cachedir import PRIVATE_FILE, NoCacheDir, cache_dir, private_folder, trusted
from optkit.core.errors import DependencyError, PassError, UsageError, ValidationError
from optkit.core.formats import Format
from optkit.core.isolate import run_isolated
from optkit.core.registry import Pass, PassConfig, PassContext, cli, missing_extra, register
from optkit.core.shapes import format_shape
from optkit.measure.inputs import synthesize
from optkit.onnx import io as onnx_io
from optkit.passes.tensorrt.check import EVAL_BATCH, check_model
from optkit.runtimes.onnx import OnnxSession
from optkit.runtimes.tensorrt import TensorRTSession, gpu_problem, import_tensorrt, load_plugins, make_logger

log = logging.getLogger(__name__)

# Output closeness the build must keep, as max |engine - onnx| / max |onnx| per output.
DEFAULT_TOLERANCE = {"fp32": 1e-2, "fp32-no-tf32": 1e-4, "fp16": 3e-2, "bf16": 8e-2, "int8": 0.15}


class TensorRTBuildConfig(PassConfig):
    precision: Literal["fp32", "fp16", "bf16", "int8"] = Field(
        "fp16", description="fp32, fp16, bf16, or int8 (needs a Q/DQ model). Strongly typed fp16/bf16 casts the "
                            "model to that type first.",
        json_schema_extra=cli("--precision", help="fp32, fp16, bf16, or int8 (int8 needs a Q/DQ model: no "
                                                  "calibration)."))
    strongly_typed: bool | None = Field(
        None, description="Strongly typed network: every tensor keeps the model's type. null (auto): strongly "
                          "typed for int8 (Q/DQ) and wherever TensorRT has no precision flags (TensorRT 11).",
        json_schema_extra=cli("--strongly-typed", secondary="--weakly-typed", help=(
            "Strongly typed network: precision comes from the model's types (fp16/bf16: the model is cast first). "
            "Default: strongly typed for int8 and wherever TensorRT has no precision flags (TensorRT 11); "
            "--weakly-typed uses TensorRT 10's FP16/BF16/INT8 builder flags.")))
    profile: dict[str, list[list[int]]] = Field(
        default_factory=dict, description="Optimization profile: input name -> [MIN, OPT, MAX] shapes.",
        json_schema_extra=cli("--shape", kind="list", help=(
            "Input shape: name=1x3x224x224 (fixed) or name=MIN:OPT:MAX for a dynamic-shape optimization profile, "
            "e.g. input=1x3x224x224:8x3x224x224:32x3x224x224 (repeatable; by default the model's shapes, a "
            "dynamic batch 1 to 64).")))
    workspace_mb: int | None = Field(None, ge=1, le=int(MAX_MIB), description="Workspace memory pool limit (MiB).",
                                     json_schema_extra=cli("--workspace-mb"))
    optimization_level: int = Field(3, ge=0, le=5, description="Builder optimization level 0-5 (TensorRT's default 3).",
                                    json_schema_extra=cli("--opt-level"))
    timing_cache: Annotated[str | None, PathRole("output", names=lambda v: None if v == "auto" else v)] = Field(
        "auto", description="Timing cache file, loaded and saved on every build; 'auto' = the per-user cache, "
                            "null or '' = none.",
        json_schema_extra=cli("--timing-cache", help="Timing cache file, loaded and saved on every build ('auto': "
                                                     "per-user, the default; --no-timing-cache: none)."))
    tf32: bool = Field(True, description="Allow TF32 for fp32 layers (TensorRT's default).",
                       json_schema_extra=cli("--no-tf32", sets=False, help="Disallow TF32 for fp32 layers."))
    validate_output: bool = Field(True, description="Compare the engine with the ONNX model on sample inputs.",
                                  json_schema_extra=cli("--no-validate", sets=False, group="evaluation",
                                                        help="Skip comparing the engine with the ONNX model."))
    tolerance: float | None = Field(None, gt=0, le=1000, description="Max |engine - onnx| / max|onnx| (default by precision).",
                                    json_schema_extra=cli("--tolerance", group="budgets"))


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
        cache_blob = read_timing_cache(cache_path)
        with atomic_path(ctx.output) as tmp:
            info = run_isolated(build_engine, artifact.path, str(tmp), config.model_dump(mode="json"), plan,
                                cache_blob, ctx.seed, what=f"building a TensorRT engine from {artifact.path}")
        blob = info.pop("timing_cache_blob", None)
        unsaved = save_timing_cache(cache_path, blob, per_user=config.timing_cache == "auto") if blob else None
        if unsaved:
            ctx.note(f"timing cache {cache_path} not saved: {unsaved}")
        elif cache_path is not None and blob:
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
    """Check the config against the model and resolve one optimization profile; UsageError (exit 2) when wrong.

    `shapes` are the measurement's shapes (recipe `measure.shapes`): they set OPT, and a dynamic batch dim still
    spans 1..max(OPT, EVAL_BATCH) so accuracy can run. --shape / `profile` entries are taken as given. For a 1-D
    integer input whose given entries have as many numbers as the input has elements, they are its values (a
    shape-tensor input: TensorRT's profile holds its values, set_shape_input)."""

    report = check_model(onnx_path)
    if config.precision == "int8" and not report.quantized:
        raise UsageError("int8 needs an explicitly quantized model (QuantizeLinear/DequantizeLinear nodes); "
                         "TensorRT's implicit INT8 calibration is gone: quantize to QDQ first "
                         "(optkit quantize MODEL --format qdq), then build with precision int8 (--precision int8)")
    qdq = [f for f in report.errors if f.code.startswith("qdq-")]
    if qdq:  # TensorRT's explicit quantization is symmetric INT8: no build can succeed, so say why now
        raise UsageError(f"{onnx_path} is quantized in a way TensorRT rejects ({len(qdq)} Q/DQ problem(s); first at "
                         f"{qdq[0].node}: {qdq[0].message}); `optkit trt check {onnx_path}` lists them all")
    names = [i["name"] for i in report.inputs]
    given = _given_profiles(config.profile, names)
    measured = {k: list(v) for k, v in (shapes or {}).items() if k not in given}
    if "" in measured and len(names) == 1:
        measured[names[0]] = measured.pop("")
    plan: dict[str, Any] = {"profiles": {}, "shapes": {}, "values": {}, "quantized": report.quantized, "notes": []}
    for inp in report.inputs:
        _plan_input(plan, inp, given.get(inp["name"]), measured.get(inp["name"]))
    blocking = [f.message for f in report.errors if f.code not in ("dynamic-dim", "int8-needs-qdq")]
    plan["check_errors"] = blocking[:3]
    return plan


def _given_profiles(profile: dict[str, list[list[int]]], names: list[str]) -> dict[str, list[list[int]]]:
    given = {k: [list(s) for s in v] for k, v in profile.items()}
    if "" in given:
        if len(names) != 1:
            raise UsageError(f"the model has {len(names)} inputs ({', '.join(names)}): give each its profile (--shape NAME=DIMS)")
        given[names[0]] = given.pop("")
    for key in given:
        if key not in names:
            raise UsageError(f"profile (--shape) names input {key!r}, but the model's inputs are {', '.join(names)}")
    return given


def _plan_input(plan: dict, inp: dict, prof: list[list[int]] | None, measured: list[int] | None) -> None:
    """One input's profile (plan["profiles"]), OPT shape (plan["shapes"]) or shape-tensor values (plan["values"])."""
    name, dims = inp["name"], inp["shape"]
    if prof is not None and _is_values(inp, prof):
        plan["values"][name] = prof
        plan["shapes"][name] = list(dims)
        return
    if prof is None and measured is not None:
        prof = [list(measured)] * 3
        if dims and not isinstance(dims[0], int) and measured:  # a dynamic batch: let accuracy run in batches
            prof = [[1] + measured[1:], measured, [max(measured[0], EVAL_BATCH)] + measured[1:]]
    if prof is not None:
        _check_profile(name, dims, prof)
        if len({tuple(s) for s in prof}) > 1 or dims is None or any(not isinstance(d, int) for d in dims):
            plan["profiles"][name] = prof
        plan["shapes"][name] = prof[1]
        return
    if dims is None:
        raise UsageError(f"input {name!r} has no declared shape; give it a profile (--shape {name}=DIMS)")
    dynamic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if not dynamic:
        plan["shapes"][name] = list(dims)
        return
    pattern = "x".join(str(d) if isinstance(d, int) else "N" for d in dims)
    if dynamic != [0]:
        raise UsageError(f"input {name!r} has dynamic dims ({pattern}) and no optimization profile; give "
                         f"a profile (--shape {name}=DIMS or {name}=MIN:OPT:MAX)")
    rest = list(dims[1:])
    plan["profiles"][name] = [[1] + rest, [1] + rest, [EVAL_BATCH] + rest]
    plan["shapes"][name] = [1] + rest
    plan["notes"].append(f"input {name!r} has a dynamic batch dim and no profile: the engine takes batch 1 to "
                         f"{EVAL_BATCH}, tuned for 1 (give a profile, --shape {name}=MIN:OPT:MAX, for another range)")


def _is_values(inp: dict, prof: list[list[int]]) -> bool:
    """A 1-D integer input of static length k given k numbers (not its shape [k]): shape-tensor values."""
    dims = inp["shape"]
    if inp["dtype"] not in ("int32", "int64") or not dims or len(dims) != 1 or not isinstance(dims[0], int):
        return False
    return all(len(s) == dims[0] for s in prof) and any(s != [dims[0]] for s in prof)


def _check_profile(name: str, dims: list | None, prof: list[list[int]]) -> None:
    for which, shape in zip(("MIN", "OPT", "MAX"), prof):
        if dims is not None and len(shape) != len(dims):
            raise UsageError(f"profile (--shape) {which} for input {name!r} has {len(shape)} dims but the model "
                             f"expects {len(dims)} ({format_shape(dims)})")
        for i, (want, have) in enumerate(zip(dims or [], shape)):
            if isinstance(want, int) and want != have:
                raise UsageError(f"profile (--shape) {which} for input {name!r} sets dim {i} to {have} but the model "
                                 f"fixes it at {want} ({format_shape(dims)})")


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
    try:
        return cache_dir() / f"tensorrt-{version}-timing.cache"
    except NoCacheDir:  # no absolute per-user folder: built without a timing cache
        return None


MAX_TIMING_CACHE = 256 << 20   # TensorRT's timing caches are a few MB


def read_timing_cache(path: Path | None) -> bytes:
    """The timing cache's bytes; b"" when there is none, or it is a link, not a regular file, over MAX_TIMING_CACHE
    or not the user's own and private (it steers which kernels go into the engine; said at -v)."""
    if path is None:
        return b""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TIMING_CACHE:
            log.info("TensorRT timing cache %s ignored: not a regular file of at most %d MiB", path,
                     MAX_TIMING_CACHE >> 20)
            return b""
        return f.read(MAX_TIMING_CACHE) if trusted(path, "TensorRT timing cache", st) else b""


def save_timing_cache(path: Path | None, blob: bytes, *, per_user: bool) -> str | None:
    """Write the timing cache (0600, atomically); why not, when it was not written: the per-user folder is not
    the user's own and private, or the file there is not (it is never replaced)."""
    if path is None:
        return None
    try:
        if per_user:
            private_folder(path.parent)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(path) and not trusted(path, "TensorRT timing cache"):
            return "the file there is not yours alone (a link, another user's, or writable by group or others)"
        with atomic_path(path) as tmp:
            tmp.write_bytes(blob)
            os.chmod(tmp, PRIVATE_FILE)
    except (OSError, UsageError) as e:
        log.info("TensorRT timing cache %s not saved (%s)", path, e)
        return str(e)
    return None


# -- precision: TensorRT 10's builder flags or a strongly typed network ----------------------------------------
def select_precision(trt, precision: str, strongly_typed: bool | None, quantized: bool) -> dict[str, Any]:
    """How to build `precision` with the installed TensorRT module `trt`, from its attributes alone.

    Returns {"strongly_typed": bool, "flags": BuilderFlag names to set, "cast": None | "fp16" | "bf16"}.
    TensorRT 11 removed BuilderFlag.FP16 / BF16 / INT8 (deprecated since 10.12); NVIDIA's migration guide
    ("Migrating from Weak Typing to Strong Typing", TensorRT 11 Python API migration) replaces FP16 / BF16 with a
    model cast to mixed precision (ModelOpt AutoCast) built as a strongly typed network, and INT8 with explicit
    Q/DQ quantization, which NVIDIA's explicit-quantization guide builds strongly typed. On TensorRT 11 every
    network is strongly typed; the STRONGLY_TYPED creation flag is deprecated there and still accepted."""
    has = {name for name in ("FP16", "BF16", "INT8") if hasattr(trt.BuilderFlag, name)}
    wanted = {"fp16": ["FP16"], "bf16": ["BF16"], "int8": ["FP16", "INT8"]}.get(precision, [])
    if strongly_typed is None:
        strongly_typed = precision == "int8" or not has or not set(wanted) <= has
    elif not strongly_typed and not set(wanted) <= has:
        missing = ", ".join(sorted(set(wanted) - has))
        raise UsageError(f"TensorRT {trt.__version__} has no BuilderFlag {missing} (removed in TensorRT 11): "
                         f"{precision} builds strongly typed there; drop strongly_typed: false (--weakly-typed)")
    elif not has:  # fp32 on TensorRT 11: strong typing is all there is
        strongly_typed = True
    if strongly_typed:
        cast = precision if precision in ("fp16", "bf16") and not quantized else None
        return {"strongly_typed": True, "flags": [], "cast": cast}
    if quantized and precision in ("fp16", "bf16"):
        wanted = wanted + ["INT8"] if "INT8" in has else wanted  # explicit Q/DQ layers next to reduced precision
    return {"strongly_typed": False, "flags": wanted, "cast": None}


def cast_model(src: str, precision: str, dest: str) -> str:
    """Write `src` cast to fp16 / bf16 (inputs and outputs kept float32) to `dest`; say which tool did it.

    NVIDIA's documented way to get fp16 / bf16 from a strongly typed build is ModelOpt AutoCast
    (modelopt.onnx.autocast.convert_to_mixed_precision(onnx_path, low_precision_type, keep_io_types=True); TensorRT
    11 migration guide, "Migrating from Weak Typing to Strong Typing"). Without ModelOpt, fp16 uses
    onnxconverter-common's float16 converter, which AutoCast itself builds on and the `trt` extra installs."""
    try:
        from modelopt.onnx.autocast import convert_to_mixed_precision
    except ImportError:
        convert_to_mixed_precision = None
    if convert_to_mixed_precision is not None:
        onnx_io.save(convert_to_mixed_precision(onnx_path=src, low_precision_type=precision, keep_io_types=True),
                     dest)
        return "ModelOpt AutoCast"
    if precision != "fp16":
        raise DependencyError(f"{precision} on a strongly typed network (TensorRT 11 has no BuilderFlag.BF16) needs "
                              "the model cast by ModelOpt AutoCast: pip install 'nvidia-modelopt[onnx]'")
    try:
        from onnxconverter_common import float16
    except ImportError:
        raise DependencyError("fp16 on a strongly typed network (TensorRT 11 has no BuilderFlag.FP16) casts the "
                              "model first: pip install 'optkit[trt]' (onnxconverter-common) or "
                              "'nvidia-modelopt[onnx]'") from None
    onnx_io.save(float16.convert_float_to_float16(onnx_io.load(src), keep_io_types=True), dest)
    return "onnxconverter-common float16"


# -- the build (child process; imports tensorrt) -------------------------------------------------------------
def build_engine(onnx_path: str, engine_path: str, cfg: dict[str, Any], plan: dict, cache_blob: bytes,
                 seed: int = 0) -> dict[str, Any]:
    trt = import_tensorrt()
    logger = make_logger(trt)
    load_plugins(trt, logger)
    choice = select_precision(trt, cfg["precision"], cfg["strongly_typed"], plan["quantized"])
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="optkit-trt-") as work:
        source = onnx_path
        if choice["cast"]:
            source = str(Path(work) / f"model.{choice['cast']}.onnx")
            tool = cast_model(onnx_path, choice["cast"], source)
            notes.append(f"cast to {choice['cast']} by {tool} and built strongly typed"
                         + ("" if cfg["strongly_typed"] else f" (TensorRT {trt.__version__} has no "
                            f"BuilderFlag.{choice['cast'].upper()})"))
        builder = trt.Builder(logger)
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if choice["strongly_typed"] else 0
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(source)):
            raise parser_error(parser, onnx_path, plan.get("check_errors") or [])
        bconf = builder_config(trt, builder, network, cfg, plan, choice)
        reused = set_timing_cache(bconf, cfg, cache_blob, notes)
        start = time.perf_counter()
        serialized = builder.build_serialized_network(network, bconf)
        build_s = time.perf_counter() - start
    if serialized is None:
        why = logger.errors[-1].splitlines()[0] if logger.errors else "no reason given"
        raise PassError(f"TensorRT could not build an engine from {onnx_path}: {why}",
                        details={"errors": logger.errors[-10:]})
    with open(engine_path, "wb") as f:
        f.write(serialized)
    if choice["strongly_typed"] and plan["quantized"]:
        notes.append("strongly typed: INT8 where the model has Q/DQ, other layers in the model's own float types"
                     + (f" (not {cfg['precision']}: export the Q/DQ model in {cfg['precision']} for that)"
                        if cfg["precision"] in ("fp16", "bf16") else ""))
    elif "INT8" in choice["flags"]:
        notes.append("int8 from the model's Q/DQ scales; layers outside Q/DQ pairs may run in fp16")
    info: dict[str, Any] = {
        "version": trt.__version__, "precision": cfg["precision"], "strongly_typed": choice["strongly_typed"],
        "builder_flags": choice["flags"], "cast": choice["cast"],
        "build_s": round(build_s, 3), "profiles": plan_profiles(network, plan),
        "optimization_level": cfg["optimization_level"], "workspace_mb": cfg["workspace_mb"],
        "timing_cache_reused": reused, "notes": notes, "warnings": [],
    }
    if cfg.get("timing_cache"):
        info["timing_cache_blob"] = bytes(bconf.get_timing_cache().serialize())
    del serialized, parser, network, bconf, builder
    if cfg["validate_output"]:
        info["validation"] = validate_engine(onnx_path, engine_path, plan, cfg, seed)
    return info


def builder_config(trt, builder, network, cfg: dict, plan: dict, choice: dict):
    """The builder config: memory pool, optimization level, precision flags, TF32, the optimization profile."""
    bconf = builder.create_builder_config()
    if cfg["workspace_mb"]:
        bconf.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(cfg["workspace_mb"]) << 20)
    bconf.builder_optimization_level = int(cfg["optimization_level"])
    for name in choice["flags"]:
        bconf.set_flag(getattr(trt.BuilderFlag, name))
    if not cfg["tf32"] and hasattr(trt.BuilderFlag, "TF32"):
        bconf.clear_flag(trt.BuilderFlag.TF32)
    prof = optimization_profile(builder, network, plan)
    if prof is not None:
        bconf.add_optimization_profile(prof)
    return bconf


def optimization_profile(builder, network, plan: dict):
    """One profile for the dynamic inputs (set_shape) and the shape-tensor inputs (set_shape_input, values);
    None when the network has neither."""
    prof = None
    for i in range(network.num_inputs):
        t = network.get_input(i)
        if t.is_shape_tensor:
            values = plan["values"].get(t.name)
            if values is None:
                raise UsageError(f"input {t.name!r} is a shape tensor: TensorRT's profile needs its values; give "
                                 f"a profile (--shape {t.name}=MIN:OPT:MAX) with each value list written like dims (e.g. "
                                 "1x3x224x224)")
            prof = prof or builder.create_optimization_profile()
            prof.set_shape_input(t.name, *values)
        elif any(d < 0 for d in t.shape):
            prof = prof or builder.create_optimization_profile()
            lo, opt, hi = plan["profiles"].get(t.name) or [plan["shapes"][t.name]] * 3
            prof.set_shape(t.name, lo, opt, hi)
    return prof


def plan_profiles(network, plan: dict) -> dict:
    """The profiles (and shape-tensor values) the engine was built with, for the report."""
    out = {}
    for i in range(network.num_inputs):
        name = network.get_input(i).name
        if name in plan["values"]:
            out[name] = {"values": plan["values"][name]}
        elif name in plan["profiles"] and any(d < 0 for d in network.get_input(i).shape):
            out[name] = plan["profiles"][name]
    return out


def set_timing_cache(bconf, cfg: dict, cache_blob: bytes, notes: list[str]) -> bool:
    """Load the timing cache into the builder config; True when the saved one was accepted."""
    if not cfg.get("timing_cache"):
        return False
    cache = bconf.create_timing_cache(bytes(cache_blob)) if cache_blob else None
    if cache is not None and bconf.set_timing_cache(cache, False):
        return True
    if cache_blob:
        notes.append("the timing cache was made by another GPU or TensorRT version; started a fresh one")
    bconf.set_timing_cache(bconf.create_timing_cache(b""), False)
    return False


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
        for name, values in plan["values"].items():  # a shape-tensor input is fed its OPT values
            feeds[name] = np.asarray(values[1], dtype=feeds[name].dtype)
        want = dict(zip([o.name for o in ref.outputs], ref.run(feeds)))
        got = dict(zip([o.name for o in eng.outputs], eng.run({k: feeds[k] for k in [i.name for i in eng.inputs]})))
    finally:
        eng.close()
    precision = "int8" if plan["quantized"] else cfg["precision"]
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
