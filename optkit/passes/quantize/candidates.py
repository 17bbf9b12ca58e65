"""A quantize candidate: the settings onnxruntime's quantizer was asked for, the file it wrote, and its figures."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from optkit.core.atomic import atomic_path, check_side_output


@dataclass(frozen=True)
class Settings:
    """One point of the search space. Fields a mode does not use stay None."""

    format: str | None = None            # static: "qdq" or "qoperator"
    activation_type: str | None = None   # static: "uint8" or "int8"
    weight_type: str | None = None       # static, dynamic: "int8" or "uint8"
    per_channel: bool | None = None      # static, dynamic
    reduce_range: bool | None = None     # static, dynamic: 7-bit weights (u8s8 saturation on CPUs without VNNI)
    calibration: str | None = None       # static: "minmax", "percentile", "entropy"
    bias_correction: bool | None = None  # static: biases corrected for the weights' rounding (bias.py)
    float_nodes: tuple[str, ...] = ()    # nodes kept in float (the node fallback)
    op_types: tuple[str, ...] | None = None  # dynamic: the op types quantized (None: onnxruntime's defaults)
    float_ops: tuple[str, ...] = ()      # dynamic: op types the model has that this point keeps float (e.g. Conv)
    fused: bool | None = None            # dynamic: built from the transformer-fused model (fusion.py)

    def with_float(self, nodes) -> Settings:
        return replace(self, float_nodes=tuple(nodes))

    def label(self) -> str:
        """Short, for tables: "QDQ u8 pc minmax", "pc rr", "pc Conv+Gather float"."""
        parts = []
        if self.format:
            parts.append("QDQ" if self.format == "qdq" else "QOp")
        if self.activation_type:
            parts.append({"uint8": "u8", "int8": "s8"}[self.activation_type])
        if self.per_channel is not None:
            parts.append("pc" if self.per_channel else "pt")
        if self.reduce_range:
            parts.append("rr")
        if self.fused:
            parts.append("fused")
        if self.calibration:
            parts.append(self.calibration)
        if self.bias_correction:
            parts.append("bc")
        if self.float_ops:
            parts.append("+".join(self.float_ops) + " float")
        return " ".join(parts) or "-"

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if v is not None and k not in ("float_nodes", "op_types", "float_ops")}
        if self.op_types is not None:
            d |= {"op_types": list(self.op_types), "float_ops": list(self.float_ops)}
        return d | {"float_nodes": list(self.float_nodes)}


@dataclass
class Candidate:
    index: int
    settings: Settings
    path: Path
    bytes: int = 0
    ratio: float = 0.0                  # size / the parent's
    fidelity: dict[str, Any] | None = None
    accuracy: float | None = None
    accuracy_drop: float | None = None
    drop_bound: float | None = None     # the drop's one-sided upper confidence bound (Budget.drop_bound)
    checked_on: int = 0                 # samples the figures come from
    screened_out: bool = False          # failed the cheap check on a subset; never scored on the full set
    screen_s: float | None = None       # seconds its screening run took (the subset, every core)
    slower_than: int | None = None      # not scored further: clearly slower than this candidate, which passed
    p50_ms: float | None = None
    latency_ratio: float | None = None
    latency_ratio_ci95: list[float] | None = None
    latency_trials: int | None = None   # paired trials it was timed in (fewer: dropped as clearly slower)
    paired: dict | None = field(default=None, repr=False)  # its whole paired timing (timing.race_result)
    error: str | None = None
    sample_loss: Any = None             # per check sample, what the budget bounds (lower is better): the paired
                                        # test of Budget.more_accurate; not in the report
    rows: Any = None                    # a metric with no per-sample loss: its per-row parts on the check data
                                        # (measure.textmetrics.Rows), for the paired bootstrap; not in the report
    passed: bool = False
    chosen: bool = False
    rejected_file: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def float_nodes(self) -> tuple[str, ...]:
        return self.settings.float_nodes

    def public(self) -> dict[str, Any]:
        """What the report keeps (no paths to scratch files)."""
        d: dict[str, Any] = {"index": self.index, "variant": self.settings.label(), **self.settings.to_dict(),
                             "bytes": self.bytes, "ratio": self.ratio, "passed": self.passed,
                             "chosen": self.chosen, "checked_on": self.checked_on}
        for key in ("accuracy", "accuracy_drop", "drop_bound", "p50_ms", "latency_ratio", "latency_ratio_ci95", "latency_trials",
                    "error", "rejected_file"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        if self.screened_out:
            d["screened_out"] = True
        if self.slower_than is not None:
            d["slower_than"] = self.slower_than
        if self.fidelity is not None:
            d["fidelity"] = {k: v for k, v in self.fidelity.items() if k != "outputs"}
            d["fidelity"]["outputs"] = {name: {k: v for k, v in o.items() if k in ("cosine", "max_abs_error",
                                                                                     "checked", "masked_positions")}
                                        for name, o in (self.fidelity.get("outputs") or {}).items()}
        return d


REJECTED_KEY = "optkit.rejected"  # metadata that marks a model optkit kept aside (and may replace)


def rejected_path(output: Path) -> Path:
    """Where a result that missed a budget is kept: beside the output, under a name that says so."""
    output = Path(output)
    return output.with_name(f"{output.stem}.REJECTED{output.suffix or '.onnx'}")


def aside_path(ctx) -> Path:
    """Where this run keeps a refused result: the context's `aside` (a recipe's run folder), else beside the
    output."""
    return Path(ctx.aside) if ctx.aside is not None else rejected_path(ctx.output)


def check_rejected_path(dest: Path, inputs=()) -> Path:
    """Before any work: the kept-aside file may be written (not an input, not a file optkit did not write).
    Inputs that do not exist are left to their own 'not found'."""
    inputs = [p for p in inputs if p is not None and Path(str(p)).exists()]
    return check_side_output(dest, ours=_kept_aside, inputs=inputs, what="the rejected model")


def keep_rejected(cand: Candidate, dest: Path, reason: str) -> Path:
    """Write the best candidate that missed a budget to `dest` (aside_path), marked in its metadata as
    optkit's (so a later run may replace it, and no one else's file ever is); the output itself is never
    written."""
    import onnx

    dest = check_rejected_path(dest)
    model = onnx.load(str(cand.path), load_external_data=False)
    _set_prop(model, REJECTED_KEY, reason[:500])
    with atomic_path(dest) as tmp:
        onnx.save(model, str(tmp))
    cand.rejected_file = str(dest)
    return dest


def _set_prop(model, key: str, value: str) -> None:
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)


def _kept_aside(path: Path) -> bool:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not ONNX at all: certainly not ours
        return False
    return any(p.key == REJECTED_KEY for p in model.metadata_props)
