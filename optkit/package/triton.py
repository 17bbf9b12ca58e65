"""A Triton model repository entry: `<repo>/<name>/config.pbtxt` and `<name>/<N>/model.onnx`.

Every tuned setting maps onto a native field of Triton's ModelConfig for the onnxruntime backend (the table is in
docs/package.md); what Triton cannot express is said, with what was written instead.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from optkit.package.signature import Signature
from optkit.package.tuned import Tuned

BACKEND = "onnxruntime"
# optkit's graph_optimization -> the onnxruntime backend's `optimization { graph { level } }` (absent = all)
GRAPH_LEVEL = {"basic": -1, "extended": 1, "disable": 2, "all": None}
# Triton holds a request this long for more to batch with; no tune figure says otherwise (stated default)
QUEUE_DELAY_US = 100


@dataclass
class TritonConfig:
    text: str                                   # config.pbtxt
    mapping: list[dict] = field(default_factory=list)   # tuned setting -> field, value written
    notes: list[str] = field(default_factory=list)       # what could not be expressed, and defaults used
    max_batch_size: int = 0


def build_config(name: str, sig: Signature, tuned: Tuned, warmup: dict[str, list[int]], version: int,
                 queue_delay_us: int = QUEUE_DELAY_US) -> TritonConfig:
    cfg = TritonConfig(text="")
    m, notes = cfg.mapping, cfg.notes

    def mapped(setting: str, value, fld: str, written) -> None:
        m.append({"setting": setting, "value": value, "field": fld, "written": written})

    # batch
    batch = int(tuned.get("batch") or 1)
    if sig.batchable:
        cfg.max_batch_size = batch
        mapped("batch", batch, "max_batch_size", batch)
    else:
        cfg.max_batch_size = 0
        mapped("batch", batch, "max_batch_size", 0)
        if batch > 1:
            notes.append(f"batch {batch} cannot be expressed: the model's first dim is not a dynamic batch axis in "
                         "every input and output; wrote max_batch_size: 0 (no batching)")
    lines = [f"name: {_q(name)}", f"backend: {_q(BACKEND)}", f"max_batch_size: {cfg.max_batch_size}"]
    lines.append(f"version_policy: {{ specific: {{ versions: [{version}] }} }}")
    batching = cfg.max_batch_size > 0
    for role, tensors in (("input", sig.inputs), ("output", sig.outputs)):
        items = [f"  {{ name: {_q(t.name)} data_type: {t.triton_type} {_served(sig.served_dims(t, batching))} }}"
                 for t in tensors]
        lines.append(f"{role} [\n" + ",\n".join(items) + "\n]")

    # instances: requests in flight and sessions
    conc, sessions = int(tuned.get("concurrency") or 1), tuned.get("sessions") or "shared"
    provider = tuned.get("provider") or "cpu"
    kind = "KIND_CPU" if provider == "cpu" else "KIND_GPU"
    mapped("concurrency", conc, "instance_group.count", conc)
    mapped("sessions", sessions, "instance_group.count (one session per instance)", conc)
    if sessions == "shared" and conc > 1:
        notes.append(f"sessions shared with {conc} in flight cannot be expressed: a Triton instance runs one batch "
                     f"at a time on its own session; wrote instance_group count {conc} (one session each, as "
                     "per-thread sessions)")
    mapped("provider", provider, "instance_group.kind", kind)
    lines.append(f"instance_group [ {{ count: {conc} kind: {kind} }} ]")
    if batching and batch > 1:
        mapped("batch", batch, "dynamic_batching.preferred_batch_size", [batch])
        lines.append(f"dynamic_batching {{ preferred_batch_size: [ {batch} ] "
                     f"max_queue_delay_microseconds: {queue_delay_us} }}")
        notes.append(f"dynamic_batching max_queue_delay_microseconds: {queue_delay_us} (--queue-delay-us; not a "
                     "tuned figure)")

    # onnxruntime backend parameters
    s = tuned.session
    params: list[tuple[str, str, str, object]] = []
    if tuned.get("threads"):
        params.append(("threads", "intra_op_thread_count", str(int(tuned.get("threads"))), tuned.get("threads")))
    mode = s.get("execution_mode") or "sequential"
    params.append(("session.execution_mode", "execution_mode", "1" if mode == "parallel" else "0", mode))
    if mode == "parallel" and s.get("inter_op_threads"):
        params.append(("session.inter_op_threads", "inter_op_thread_count", str(int(s["inter_op_threads"])),
                       s["inter_op_threads"]))
    params.append(("session.cpu_mem_arena", "enable_mem_arena", "1" if s.get("cpu_mem_arena", True) else "0",
                   s.get("cpu_mem_arena", True)))
    params.append(("session.mem_pattern", "enable_mem_pattern", "1" if s.get("mem_pattern", True) else "0",
                   s.get("mem_pattern", True)))
    for setting, key, text, value in params:
        mapped(setting, value, f"parameters.{key}", text)
        lines.append(f"parameters {{ key: {_q(key)} value: {{ string_value: {_q(text)} }} }}")

    # optimisation: graph level, accelerators
    level = GRAPH_LEVEL.get(s.get("graph_optimization") or "all")
    opt = []
    if level is not None:
        opt.append(f"graph {{ level: {level} }}")
    mapped("session.graph_optimization", s.get("graph_optimization") or "all", "optimization.graph.level",
           level if level is not None else "absent (all)")
    if provider == "tensorrt":
        opt.append('execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" } ] }')
        mapped("provider", provider, "optimization.execution_accelerators.gpu_execution_accelerator", "tensorrt")
    if opt:
        lines.append("optimization { " + " ".join(opt) + " }")

    # warm-up with zero data of the served shapes
    inputs = " ".join(
        f"inputs {{ key: {_q(t.name)} value: {{ data_type: {t.triton_type} dims: {_dims(warmup[t.name] or [1])} "
        f"zero_data: true }} }}" for t in sig.inputs)
    lines.append(f"model_warmup [ {{ name: \"zeros\" batch_size: {1 if batching else 0} {inputs} }} ]")
    cfg.text = "\n".join(lines) + "\n"
    return cfg


def _q(text: str) -> str:
    return json.dumps(text)  # a valid protobuf text-format string for any name (quotes, escapes)


def _served(dims: list[int]) -> str:
    """A tensor's dims field. Triton wants at least one dim: a scalar (a sample rate, a step count; or a
    batched model's [batch] tensor) is served as dims [1] reshaped to the model's [], as Triton's docs do."""
    return f"dims: {_dims(dims)}" if dims else "dims: [ 1 ] reshape: { shape: [ ] }"


def _dims(dims: list[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def with_version(text: str, version: int) -> str:
    """The same config serving another version (rollback/promote)."""
    import re

    return re.sub(r"version_policy: \{ specific: \{ versions: \[[0-9]+\] \} \}",
                  f"version_policy: {{ specific: {{ versions: [{version}] }} }}", text, count=1)


def served_version(text: str) -> int | None:
    import re

    found = re.search(r"version_policy: \{ specific: \{ versions: \[([0-9]{1,10})\] \} \}", text)
    return int(found[1]) if found else None


def schema_check(text: str) -> dict | None:
    """Parse with Triton's own ModelConfig (tritonclient's model_config_pb2) where tritonclient is installed:
    the inputs/outputs as parsed; None when it is not installed. A parse error is exit 3 (optkit's bug)."""
    from optkit.core.errors import PassError
    from optkit.package.triton_check import parse_if_installed

    try:
        return parse_if_installed(text)
    except Exception as e:
        raise PassError(f"the generated config.pbtxt does not parse as Triton's ModelConfig: {e}") from None
