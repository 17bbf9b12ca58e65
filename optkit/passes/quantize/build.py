"""Building candidates: the settings a search tries come from the mode's strategy (engine.py); here a Builder
writes one candidate's file, and the helpers decide which settings are worth building: a QOperator setting
whose QDQ twin missed the budget is skipped, small-channel Conv nodes may stay float, and the node fallback
ranks the nodes by the error they add and keeps 1, 2, 4, ... of them float."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError, ValidationError
from optkit.core.text import first_line
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx import session as onnx_session
from optkit.passes.quantize import ops as qops
from optkit.passes.quantize.candidates import Candidate, Settings
from optkit.passes.quantize.config import QuantizeConfig
from optkit.passes.quantize.engine import Strategy, contrib_excludes
from optkit.passes.quantize.prepare import SCORE_THREADS


class Builder:
    """Writes a candidate: the strategy quantizes the prepared model with the candidate's settings (its float
    nodes, the user's excluded nodes and contrib look-alikes kept float) to `raw`, then the file is checked to
    hold something quantized, compacted if asked, and saved as the candidate's path with its size."""

    def __init__(self, parent: Artifact, cfg: QuantizeConfig, strategy: Strategy, prepared: Path, float_model,
                 reader: Callable | None = None, quantizable: list[str] | None = None):
        self.parent, self.cfg, self.strategy = parent, cfg, strategy
        self.prepared, self.float_model = prepared, float_model
        self.reader = reader                 # () -> onnxruntime CalibrationDataReader (static)
        self.quantizable = quantizable or []  # "Conv x12": said when nothing was quantized

    def build(self, cand: Candidate, raw: Path) -> bool:
        """Quantize with the candidate's settings and write it; False (cand.error set) when that fails."""
        settings, mode = cand.settings, self.cfg.mode
        exclude = sorted(set(self.cfg.nodes_exclude) | set(settings.float_nodes) | contrib_excludes(self.float_model))
        try:
            self.strategy.build(self.prepared, settings, raw, calibration=self.reader, exclude=exclude)
        except (UsageError, ValidationError):
            raise
        except Exception as e:  # noqa: BLE001 - onnxruntime cannot build this point of the space
            cand.error = f"onnxruntime could not quantize with {settings.label()}: {first_line(e)[:160]}"
            return False
        model = onnx_io.load(raw)
        if mode != "fp16" and not graph.is_quantized(model):
            if not settings.float_nodes:
                raise ValidationError(
                    f"nothing was quantized in {self.parent.path} (mode {mode}): onnxruntime's quantizer left "
                    f"every node float ({', '.join(self.quantizable)}: their weights are not constants it can reach, "
                    "e.g. inside If subgraphs, or their inputs are not float); nothing was written")
            cand.error = "nothing was quantized (every quantizable node is kept float)"
            return False
        if self.cfg.compact:
            graph.compact(model)
        onnx_io.save(model, cand.path)
        cand.bytes = os.path.getsize(cand.path)
        cand.ratio = cand.bytes / self.parent.size_bytes()
        return True


def twin_missed(settings: Settings, candidates: list[Candidate]) -> Candidate | None:
    """A QOperator setting whose QDQ twin (same types, channels, range, calibration, float nodes) was scored
    and missed the budget: onnxruntime runs both on the same integer kernels, so the format changes speed,
    not the outputs (on EfficientNet-Lite1 the twins' cosines agree to 1e-5), and it cannot win."""
    if settings.format != "qoperator":
        return None
    twin = replace(settings, format="qdq")
    return next((c for c in candidates if c.settings == twin and c.fidelity is not None and not c.passed
                 and c.slower_than is None), None)  # a slower twin is no verdict: the format changes speed


def small_channel_convs(float_model, exclude) -> list[str]:
    """Conv nodes with <= 4 input channels per group (the first conv of an image model, depthwise convs), which
    often run slower in int8 than in float; those in `exclude` are left out."""
    inits = {i.name: i for i in float_model.graph.initializer}
    exclude = set(exclude)
    slow = []
    for n in float_model.graph.node:
        if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits:
            dims = list(inits[n.input[1]].dims)
            if len(dims) >= 3 and dims[1] <= 4 and n.name not in exclude:
                slow.append(n.name)
    return slow


def rank(float_model, raw: Path, check_feeds: dict, nodes_exclude, work: Path) -> list[tuple[str, float]]:
    """Nodes ranked by how much error they add: error of their outputs against the FP32 activations minus the
    error already on their inputs, measured on the fully quantized candidate whose raw build is `raw` (empty
    when it is missing)."""
    if not raw.exists():
        return []
    quantized = onnx_io.load(raw)
    qtensors = {o for n in graph.all_nodes(quantized.graph) for o in n.output}
    init = {i.name for i in float_model.graph.initializer}
    nodes = [n for n in float_model.graph.node if n.name not in nodes_exclude]
    tensors = sorted({o for n in nodes for o in n.output if o in qtensors})
    feeds = {k: v[:32] for k, v in check_feeds.items()}
    try:
        f_path, q_path = work / "f_dbg.onnx", work / "q_dbg.onnx"
        onnx_io.save(graph.with_outputs(float_model, tensors), f_path)
        onnx_io.save(graph.with_outputs(quantized, tensors), q_path)
        fo = onnx_session.run_all(onnx_session.session(f_path, threads=SCORE_THREADS), feeds, tensors)
        qo = onnx_session.run_all(onnx_session.session(q_path, threads=SCORE_THREADS), feeds, tensors)
        err = {t: qops.rel_error(a, b) for t, a, b in zip(tensors, fo, qo)}
    except Exception:  # noqa: BLE001 - some graphs will not expose intermediates: rank by op type instead
        err = {}
    qnames = {n.name for n in quantized.graph.node}
    heavy = qops.WEIGHT_OPS + graph.RECURRENT + graph.CONTROL_FLOW
    scores = []
    for n in nodes:
        outs = [err[o] for o in n.output if o in err]
        if not outs:
            if err:
                continue
            score = 1.0 if n.op_type in heavy else 0.0
        else:
            ins = [err.get(i, 0.0) for i in n.input if i and i not in init]
            score = max(outs) - max(ins, default=0.0)
        if score > 0 and (n.name not in qnames or n.op_type in heavy):
            scores.append((n.name, float(score)))
    scores.sort(key=lambda s: -s[1])
    return scores


def schedule(n: int, budget: int) -> list[int]:
    """How many nodes to keep in float at each step: 1, 2, 4, ... then all ranked nodes."""
    steps, k = [], 1
    while k < n and len(steps) < budget - 1:
        steps.append(k)
        k *= 2
    if n and len(steps) < budget:
        steps.append(n)
    return steps
