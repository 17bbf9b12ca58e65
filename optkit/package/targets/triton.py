"""Triton: a model repository entry, `<repo>/<name>/config.pbtxt` (the served version's config) and
`<name>/<N>/model.onnx` with its own `config.pbtxt`.

The config is built as a mapping in ModelConfig's JSON shape (the protobuf's field names), printed by
package.pbtxt and read back by its parser; serve-version changes `version_policy` in the parsed mapping and
prints it again. Every tuned setting maps onto a native field of ModelConfig for the onnxruntime backend; what
Triton cannot express is said, with what was written instead.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from optkit.core.artifact import Artifact, external_data_files, path_sha256
from optkit.core.errors import PassError, UsageError
from optkit.core.formats import Format
from optkit.core.registry import cli
from optkit.package import ensemble, pbtxt, scalars, schemas
from optkit.package.pbtxt import Ident
from optkit.package.signature import Signature, signature_of, warmup_dims
from optkit.package.target import Job, Served, Target, TargetConfig
from optkit.package.targets import triton_check, triton_ensemble, triton_openvino
from optkit.package.targets.triton_check import parse_if_installed
from optkit.package.tuned import Tuned
from optkit.runtimes.openvino import version as openvino_version

BACKEND = "onnxruntime"
CONFIG = "config.pbtxt"
# optkit's graph_optimization -> the onnxruntime backend's `optimization { graph { level } }` (absent = all)
GRAPH_LEVEL = {"basic": -1, "extended": 1, "disable": 2, "all": None}
# Triton holds a request this long for more to batch with; no tune figure says otherwise (stated default)
QUEUE_DELAY_US = 100
MAX_QUEUE_DELAY_US = 60_000_000  # a minute: a request held longer than that for a batch is a mistake
INDEX_FILE = "optkit-versions.json"
# ModelConfig's map fields (printed as repeated { key value } entries) and its repeated fields
MAPS = frozenset({"parameters", "inputs", "input_map", "output_map", "cc_model_filenames", "metric_tags"})
REPEATED = frozenset({"input", "output", "dims", "instance_group", "preferred_batch_size", "versions",
                      "model_warmup", "gpu_execution_accelerator", "cpu_execution_accelerator", "gpus", "shape",
                      "batch_input", "batch_output", "step", "profile", "priority_levels", "input_pinned_memory",
                      "allow_ragged_batch", "secondary_devices", "target_name", "source_input"})
# ModelConfig's top-level fields (tritonserver 2.5x): anything else in a config is refused by name
FIELDS = frozenset({
    "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input", "output", "batch_input",
    "batch_output", "optimization", "dynamic_batching", "sequence_batching", "ensemble_scheduling", "instance_group",
    "default_model_filename", "cc_model_filenames", "metric_tags", "parameters", "model_warmup",
    "model_operations", "model_transaction_policy", "model_repository_agents", "response_cache"})


@dataclass
class TritonConfig:
    config: dict[str, Any]                               # ModelConfig's JSON shape
    mapping: list[dict] = field(default_factory=list)    # tuned setting -> field, value written
    notes: list[str] = field(default_factory=list)       # what could not be expressed, and defaults used

    @property
    def text(self) -> str:
        return dumps(self.config)

    @property
    def max_batch_size(self) -> int:
        return self.config["max_batch_size"]


def dumps(config: dict[str, Any]) -> str:
    return pbtxt.dumps(config, MAPS)


def loads(text: str, where: str | Path = CONFIG) -> dict[str, Any]:
    """A config.pbtxt's mapping; a malformed one, or one with a field ModelConfig lacks, is exit 2."""
    config = pbtxt.loads(text, maps=MAPS, repeated=REPEATED, where=str(where))
    unknown = sorted(set(config) - FIELDS)
    if unknown:
        raise UsageError(f"{where}: key {unknown[0]}: not a field of Triton's ModelConfig")
    return config


def build_config(name: str, sig: Signature, tuned: Tuned, warmup: dict[str, list[int]] | None, version: int,
                 queue_delay_us: int = QUEUE_DELAY_US, gpu: bool = False, backend: str = BACKEND) -> TritonConfig:
    """`gpu` (--gpu): a GPU instance group where the tuned provider is the CPU's (CUDA, no accelerator); no
    `warmup` (dims not known): no model_warmup. `backend` openvino: Triton's OpenVINO backend on the IR
    (model.xml + model.bin), with optkit's OpenVINO settings as its parameters."""
    cfg = TritonConfig(config={})
    c, m, notes = cfg.config, cfg.mapping, cfg.notes

    def mapped(setting: str, value, fld: str, written) -> None:
        m.append({"setting": setting, "value": value, "field": fld, "written": written})

    batch = int(tuned.get("batch") or 1)
    max_batch = batch if sig.batchable else 0
    mapped("batch", batch, "max_batch_size", max_batch)
    if not sig.batchable and batch > 1:
        notes.append(f"batch {batch} cannot be expressed: the model's first dim is not a dynamic batch axis in "
                     "every input and output; wrote max_batch_size: 0 (no batching)")
    c.update(name=name, backend=backend, max_batch_size=max_batch,
             version_policy={"specific": {"versions": [version]}})
    batching = max_batch > 0
    for role, tensors in (("input", sig.inputs), ("output", sig.outputs)):
        c[role] = [{"name": t.name, "data_type": Ident(t.triton_type), **_served(sig.served_dims(t, batching))}
                   for t in tensors]

    # instances: requests in flight and sessions
    conc, sessions = int(tuned.get("concurrency") or 1), tuned.get("sessions") or "shared"
    provider = tuned.get("provider") or "cpu"
    if gpu and provider == "cpu":
        mapped("--gpu", True, "instance_group.kind", "KIND_GPU")
        provider = "cuda"
    kind = "KIND_CPU" if provider == "cpu" else "KIND_GPU"
    mapped("concurrency", conc, "instance_group.count", conc)
    mapped("sessions", sessions, "instance_group.count (one session per instance)", conc)
    if sessions == "shared" and conc > 1:
        notes.append(f"sessions shared with {conc} in flight cannot be expressed: a Triton instance runs one batch "
                     f"at a time on its own session; wrote instance_group count {conc} (one session each, as "
                     "per-thread sessions)")
    mapped("provider", provider, "instance_group.kind", kind)
    c["instance_group"] = [{"count": conc, "kind": Ident(kind)}]
    if batching and batch > 1:
        mapped("batch", batch, "dynamic_batching.preferred_batch_size", [batch])
        c["dynamic_batching"] = {"preferred_batch_size": [batch], "max_queue_delay_microseconds": queue_delay_us}
        notes.append(f"dynamic_batching max_queue_delay_microseconds: {queue_delay_us} (--queue-delay-us; not a "
                     "tuned figure)")

    if backend == "openvino":
        c["default_model_filename"] = triton_openvino.IR_FILE
        c["parameters"] = triton_openvino.parameters(tuned, mapped)
        return _warm(cfg, sig, warmup, batching)
    c["parameters"] = _parameters(tuned, mapped)

    # optimisation: graph level, accelerators
    s = tuned.session
    level = GRAPH_LEVEL.get(s.get("graph_optimization") or "all")
    opt: dict[str, Any] = {}
    if level is not None:
        opt["graph"] = {"level": level}
    mapped("session.graph_optimization", s.get("graph_optimization") or "all", "optimization.graph.level",
           level if level is not None else "absent (all)")
    if provider == "tensorrt":
        opt["execution_accelerators"] = {"gpu_execution_accelerator": [{"name": "tensorrt"}]}
        mapped("provider", provider, "optimization.execution_accelerators.gpu_execution_accelerator", "tensorrt")
    if opt:
        c["optimization"] = opt

    return _warm(cfg, sig, warmup, batching)


def _warm(cfg: TritonConfig, sig: Signature, warmup: dict[str, list[int]] | None, batching: bool) -> TritonConfig:
    """Warm-up with zero data of the served shapes (none where the dims are not known)."""
    c = cfg.config
    if warmup is None:
        return cfg
    c["model_warmup"] = [{"name": "zeros", "batch_size": 1 if batching else 0, "inputs": {
        t.name: {"data_type": Ident(t.triton_type), "dims": list(warmup[t.name] or [1]), "zero_data": True}
        for t in sig.inputs}}]
    return cfg


def _parameters(tuned: Tuned, mapped) -> dict[str, Any]:
    """The onnxruntime backend's parameters from the tuned session settings (each a mapping row)."""
    s = tuned.session
    params: list[tuple[str, str, str, object]] = []
    if tuned.get("threads"):
        params.append(("threads", "intra_op_thread_count", str(int(tuned.get("threads"))), tuned.get("threads")))
    mode = s.get("execution_mode") or "sequential"
    params.append(("session.execution_mode", "execution_mode", "1" if mode == "parallel" else "0", mode))
    if mode == "parallel" and s.get("inter_op_threads"):
        params.append(("session.inter_op_threads", "inter_op_thread_count", str(int(s["inter_op_threads"])),
                       s["inter_op_threads"]))
    for key, param in (("cpu_mem_arena", "enable_mem_arena"), ("mem_pattern", "enable_mem_pattern")):
        params.append((f"session.{key}", param, "1" if s.get(key, True) else "0", s.get(key, True)))
    out = {}
    for setting, key, text, value in params:
        mapped(setting, value, f"parameters.{key}", text)
        out[key] = {"string_value": text}
    return out


def _served(dims: list[int]) -> dict[str, Any]:
    """A tensor's dims. Triton wants at least one dim: a scalar (a sample rate, a step count; or a batched
    model's [batch] tensor) is served as dims [1] reshaped to the model's [], as Triton's docs do."""
    return {"dims": list(dims)} if dims else {"dims": [1], "reshape": {"shape": []}}


def served_version(config: dict[str, Any]) -> int | None:
    """The one version a config's version_policy serves (optkit writes `specific` with one version)."""
    policy = config.get("version_policy") if isinstance(config, dict) else None  # a hand edit: any shape
    specific = policy.get("specific") if isinstance(policy, dict) else None
    versions = specific.get("versions") if isinstance(specific, dict) else None
    if isinstance(versions, list) and len(versions) == 1 and isinstance(versions[0], int) \
            and not isinstance(versions[0], bool):
        return versions[0]
    return None


def with_version(config: dict[str, Any], version: int) -> dict[str, Any]:
    """The same config serving another version (rollback / promote)."""
    return {**config, "version_policy": {"specific": {"versions": [version]}}}


def schema_check(text: str) -> dict | None:
    """Parse with Triton's own ModelConfig (tritonclient's model_config_pb2) where tritonclient is installed:
    the inputs/outputs as parsed; None when it is not installed. A parse error is exit 3 (optkit's bug)."""
    try:
        return parse_if_installed(text)
    except Exception as e:
        raise PassError(f"the generated config.pbtxt does not parse as Triton's ModelConfig: {e}") from None


class TritonOptions(TargetConfig):
    backend: Literal["onnxruntime", "openvino"] | None = Field(
        default=None, description="Triton backend: onnxruntime, or openvino (the model as OpenVINO IR, optkit's "
                                  "OpenVINO settings); default: the tuned runtime (--tuned), else onnxruntime.",
        json_schema_extra=cli("--backend"))
    queue_delay_us: int | None = Field(default=None, ge=0, le=MAX_QUEUE_DELAY_US,
                                       description=f"Triton dynamic batching queue delay (default {QUEUE_DELAY_US}).",
                                       json_schema_extra=cli("--queue-delay-us"))
    gpu: bool | None = Field(default=None, description="Triton: serve the model (a split model's core) on a GPU "
                                                        "instance group (KIND_GPU) although the tuned provider is the "
                                                        "CPU's; a tune on tensorrt adds its TensorRT accelerator.",
                             json_schema_extra=cli("--gpu", sets=True, help="Serve the model (a split model's core) on "
                                                                 "KIND_GPU."))


class TritonTarget(Target):
    name = "triton"
    describe = "a Triton model repository (onnxruntime or OpenVINO backend)"
    Config = TritonOptions
    model_files = frozenset({CONFIG})
    manifest_format = "onnx"
    manifest_runtime = "kserve-tritonserver"
    manifest_level = "repository"  # KServe's Triton runtime reads a repository root, Seldon's a model folder

    accepts = (Format.ONNX, Format.OPENVINO_IR)

    def check(self, config, options) -> None:
        """--backend openvino: what it cannot serve, and OpenVINO there, before anything is read (a recipe's
        package: entries before any stage runs); a tune that picks it is checked when it is read (prepare)."""
        if options.backend == "openvino":
            triton_openvino.check(options.gpu)

    def open(self, job: Job) -> None:
        """A split folder, or a model with preprocessing in its graph, is served as an ensemble of its parts
        (package/ensemble.py reads it; targets/triton_ensemble.py writes it); any other model as it is."""
        plan = job.handed.get("plan") or ensemble.detect(job.model)  # a recipe's split stage hands its plan over
        if plan is None:
            super().open(job)
            if triton_openvino.is_ir(job):  # an OpenVINO IR: its ports are the signature
                job.sig = triton_openvino.signature_of_ir(job.model)
            return
        if plan.tmp is not None:
            job.temporaries.append(plan.tmp)
        whole = plan.kind == "preprocess"
        job.artifact = Artifact.load(job.model if whole else plan.core.path)
        job.named = job.model if whole else str(plan.source.parent)
        job.made_from = plan.model_sha256  # a tune or capacity of the model that was split counts for its core
        for p in plan.parts:
            if external_data_files(p.path):
                raise UsageError(f"{p.path}: its weights are in external data files; a part of an ensemble is "
                                 "packaged as one file here (save it with its weights inside)")
        job.sig = Signature(plan.inputs, plan.outputs, plan.batchable)
        job.state["plan"] = plan
        job.split = plan.record()

    def models(self, job: Job) -> list[str]:
        plan = job.state.get("plan")
        return triton_ensemble.check_names(job.name, plan) if plan is not None else []

    def prepare(self, job: Job) -> None:
        job.state["backend"] = backend = job.options.backend or \
            ("openvino" if triton_openvino.is_ir(job) else job.tuned.get("runtime") or BACKEND)
        if triton_openvino.is_ir(job) and backend != "openvino":
            raise UsageError(f"{job.model} is OpenVINO IR, which Triton serves with --backend openvino only; drop "
                             "--backend onnxruntime, or package the ONNX model it was converted from")
        if job.state.get("plan") is not None:
            if job.options.backend == "openvino":
                raise UsageError(f"--backend openvino serves one model; {job.model} is served as an ensemble of its "
                                 "parts (a split model or preprocessing in its graph), which run on onnxruntime: "
                                 "drop --backend openvino, or package the whole model file")
            if backend == "openvino":
                job.notes.append(f"--tuned {job.tuned.source} picked openvino; the parts of an ensemble are served on "
                                 "onnxruntime (Triton's onnxruntime backend), with the tuned threads, batch and "
                                 "concurrency")
                job.state["backend"] = BACKEND
            triton_ensemble.prepare(job, job.state["plan"], scalars.scalars)
            return
        sig = job.sig
        if any(scalars.scalars(sig)) and triton_openvino.is_ir(job):
            raise UsageError(f"{job.model}: a scalar input or output, which Triton serves only as a [1] tensor that "
                             "optkit puts in front of an ONNX graph; package the ONNX model it was converted from")
        if any(scalars.scalars(sig)):
            lifted, lift_notes = scalars.lift(job.model, sig)
            job.sig, job.state["lifted"] = signature_of(lifted, job.model), lifted
            job.notes.extend(lift_notes)
        probe = int(job.tuned.get("batch") or 1) if job.sig.batchable else 0
        warm, warm_notes = warmup_dims(job.sig, probe > 0, job.shapes, job.config.data, job.model)
        job.state["warmup"] = warm
        job.notes.extend(warm_notes)
        if backend == "openvino":
            job.state["ir"] = triton_openvino.ir_of(job)

    def serves_with(self, job: Job) -> dict[str, Any] | None:
        if job.state.get("backend") != "openvino":
            return None
        return {"threads": job.tuned.get("threads"), "concurrency": int(job.tuned.get("concurrency") or 1),
                "batch": int(job.tuned.get("batch") or 1), "openvino": openvino_version()}

    def write_version(self, job: Job, vdir: Path, number: int) -> dict[str, str]:
        delay = job.options.queue_delay_us
        delay = QUEUE_DELAY_US if delay is None else delay
        gpu = bool(job.options.gpu)
        backend = job.state["backend"]
        if job.state.get("plan") is not None:
            return triton_ensemble.write(job, job.root, vdir, number, build_config, dumps, delay, gpu)
        cfg = build_config(job.name, job.sig, job.tuned, job.state["warmup"], number, queue_delay_us=delay, gpu=gpu,
                           backend=backend)
        triton_openvino.backend_rows(job.tuned, backend, job.options.backend, triton_openvino.is_ir(job),
                                     cfg.mapping, cfg.notes)
        job.mapping[:], text = cfg.mapping, cfg.text
        job.notes.extend(cfg.notes)
        if backend == "openvino":  # the IR the OpenVINO backend loads, converted in prepare
            for f, name in zip(job.state["ir"], triton_openvino.IR_FILES):
                shutil.copyfile(f, vdir / name)
        elif job.state.get("lifted") is not None:
            import onnx

            onnx.save(job.state["lifted"], str(vdir / "model.onnx"))
        else:
            shutil.copyfile(job.model, vdir / "model.onnx")
        for location, f in job.externals:
            (vdir / location).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, vdir / location)
        (vdir / CONFIG).write_text(text, encoding="utf-8")
        job.state["config"] = cfg.config
        return {CONFIG: text}

    def validate(self, job: Job, vdir: Path) -> None:
        parsed = self._read_back(vdir / CONFIG, job.state["config"])
        parts = job.state.get("part_configs") or {}
        for model, config in parts.items():
            self._read_back(job.root / model / vdir.name / CONFIG, config)
        if parts:
            triton_ensemble.check_wiring(job.state["config"], parts, str(vdir / CONFIG))
        what = "config.pbtxt" + (" (the ensemble's and each part's)" if parts else "")
        if parsed is not None:
            job.notes.append(f"{what} parsed with Triton's ModelConfig (tritonclient)")
            return
        files = [f"{m}/{vdir.name}/{CONFIG}" for m in [job.name, *parts]]
        job.notes.append(f"{what} not checked against Triton's ModelConfig: {triton_check.unavailable()}; to check, "
                         f"run `python {Path(triton_check.__file__).resolve()} {' '.join(files)}` in the repository "
                         "with a Python that has tritonclient")

    @staticmethod
    def _read_back(path: Path, built: dict[str, Any]) -> dict | None:
        text = path.read_text(encoding="utf-8")
        try:
            again = loads(text, path)
        except UsageError as e:
            raise PassError(f"optkit's own config.pbtxt does not read back: {e.message}") from None
        if again != built:
            raise PassError(f"{path} does not read back as the config optkit built (printer/parser bug)")
        return schema_check(text)

    def serve(self, model_dir: Path, index: dict, number: int, recorded: dict, options) -> Served:
        current = schemas.read_bytes(model_dir / CONFIG, schemas.MAX_CONFIG_BYTES)
        try:
            text = current.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{model_dir / CONFIG}: not UTF-8 text (byte {e.start}), so not the config optkit "
                             f"wrote; restore it (a copy of {model_dir}/N/config.pbtxt of the version served)") from None
        try:  # the served config is replaced; what it served counts only when it is one of the versions
            was = served_version(loads(text, model_dir / CONFIG))
        except UsageError:
            was = None
        before = was if was in {v["version"] for v in index["versions"]} else index.get("served")
        own = self.version_config(model_dir / str(number) / CONFIG, name=index["name"], version=number,
                                  sha256=recorded["files"].get(CONFIG))
        replace = {model_dir / CONFIG: dumps(with_version(own, number))}
        for model, files in ((recorded.get("split") or {}).get("models") or {}).items():
            replace[model_dir.parent / model / CONFIG] = self._part_served(model_dir.parent / model, index, number,
                                                                           files)
        return Served(replace=replace, before=before)

    def _part_served(self, part_dir: Path, index: dict, number: int, files: dict[str, str]) -> str:
        """A part of an ensemble version: in the index's parts, its files as recorded, its config serving N."""
        if part_dir.name not in index.get("parts", []):
            raise UsageError(f"{part_dir}: not a part of {index['name']} in its {INDEX_FILE} (key parts); package "
                             "the model again")
        vdir = part_dir / str(number)
        for rel, digest in files.items():
            p = vdir / rel
            if Path(rel).is_absolute() or ".." in Path(rel).parts or p.is_symlink() or not p.is_file():
                raise UsageError(f"{p} is missing (the lineage lists it); restore it or package the model again")
            if path_sha256(p) != digest:
                raise UsageError(f"{p} was edited after optkit packaged it (its sha256 is not the lineage's); restore "
                                 "it or package the model again")
        own = self.version_config(vdir / CONFIG, name=part_dir.name, version=number, sha256=files.get(CONFIG))
        return dumps(with_version(own, number))

    @staticmethod
    def version_config(path: Path, *, name: str, version: int, sha256: str | None) -> dict[str, Any]:
        """A version's own config.pbtxt, before it is served: the bytes optkit recorded in the lineage (sha256),
        UTF-8, optkit's parser and Triton's ModelConfig where tritonclient is installed, and its name and
        version_policy (serving this version); else exit 2."""
        text = schemas.check_recorded_text(path, sha256, schemas.MAX_CONFIG_BYTES)
        config = loads(text, path)
        if config.get("name") != name:
            raise UsageError(f"{path}: key name: not {name!r}, the model's name; package the model again")
        if served_version(config) != version:
            raise UsageError(f"{path}: key version_policy: does not serve version {version}; package the model "
                             "again")
        try:
            parse_if_installed(text)
        except Exception as e:  # noqa: BLE001 - protobuf's ParseError and friends
            raise UsageError(f"{path}: not a Triton ModelConfig ({(str(e).splitlines() or [''])[0][:100]}); "
                             "package the model again") from None
        return config
