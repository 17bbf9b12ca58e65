"""The quantize search's first step: the checks up front, the float model prepared for quantizing (opset,
constants, onnxruntime's pre-processing, the mode's rewrites), and the Reference every candidate is checked
against (the parent's outputs and accuracy on the check data, and the calibration feeds)."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optkit.core.batching import count, run_batched, stack_samples, stackable, trim
from optkit.core.errors import UsageError
from optkit.core.lightimports import ort_tools_without_torch
from optkit.core.registry import PassContext
from optkit.core.text import first_line
from optkit.measure.accuracy import compute, metric_rows, per_sample, resolve_metric
from optkit.measure.fidelity import attention_mask, check_names, refuse_nonfinite_reference
from optkit.measure.inputs import probe, synthesize
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx import session as onnx_session
from optkit.onnx.session import quiet_ort
from optkit.passes.quantize import fusion
from optkit.passes.quantize import ops as qops
from optkit.passes.quantize.budget import Budget
from optkit.passes.quantize.config import MIN_OPSET, QuantizeConfig
from optkit.passes.quantize.engine import Dynamic, Int4, Strategy
from optkit.runtimes.base import Session
from optkit.runtimes.openvino import OpenVINOSession

log = logging.getLogger("optkit.passes.quantize.search")  # the search's one logger, as before the split

PREPROCESS_GROWTH = 1.02  # a pre-processed model this much larger than its input is not used
SCORE_THREADS = None      # scoring uses every core: onnxruntime's CPU kernels split the work, not the sums,
                          # so the outputs are the same bit for bit as on one thread (checked on float, QDQ, QOp)


# ------------------------------------------------------------ checks up front
def check_flags(cfg: QuantizeConfig, data: dict) -> None:
    """The flags make sense together and with the data given (else a UsageError, exit 2)."""
    Budget.check_flags(cfg, data)
    if cfg.metric:
        resolve_metric(cfg.metric)
        ev = data.get("eval")
        if ev is None:
            raise UsageError(f"metric {cfg.metric} (--metric) needs eval data (data.eval / --eval-data)")
        if ev.labels is None:
            raise UsageError(f"metric {cfg.metric} (--metric) needs labels, and {ev.source} has none "
                             "(add a 'labels' array, or use max_fidelity_loss / --max-fidelity-loss)")
    if cfg.runtime == "openvino":
        OpenVINOSession.available()   # exit 4 with the install command, before any work
    if cfg.mode == "static" and data.get("calibration") is None and not cfg.synthetic_calibration:
        raise UsageError("static quantization needs calibration data (data.calibration / --calibration-data), or "
                         "mode dynamic (--mode dynamic) which needs none, or synthetic_calibration "
                         "(--synthetic-calibration) to calibrate on random inputs, which usually costs accuracy")


def check_quantizable(model, cfg: QuantizeConfig, path) -> list[str]:
    """The ops of the mode the model holds ("Conv x12"); a UsageError when there is nothing to quantize."""
    mode = cfg.mode
    counts = graph.op_counts(model)
    for node in qops.contrib_lookalikes(model):  # never quantized (qops.CONTRIB_ONLY)
        counts[node.op_type] -= 1
    wanted = {"dynamic": qops.DYNAMIC_OPS, "static": qops.STATIC_ANCHORS, "int4": qops.INT4_OPS}.get(mode)
    if cfg.op_types_include:
        wanted = tuple(cfg.op_types_include)
    if wanted is None:  # fp16
        if not graph.float_io(model) and not any(i.data_type == 1 for i in model.graph.initializer):
            raise UsageError(f"{path} has no float32 tensors to convert to fp16")
        return []
    present = [op for op in wanted if counts.get(op) and op not in cfg.op_types_exclude]
    if mode == "int4":
        inits = {i.name for i in model.graph.initializer}
        k = qops.INT4_WEIGHT_INPUT
        present = [op for op in present if (qops.int4_gathers(model) if op == "Gather" else any(
            n.op_type == op and len(n.input) > k[op] and n.input[k[op]] in inits for n in model.graph.node))]
    if not present:
        have = ", ".join(sorted(counts)) or "no ops"
        raise UsageError(f"nothing to quantize in {path} for mode {mode}: it has {have}; "
                         f"onnxruntime quantizes {', '.join(wanted)}"
                         + (" with constant weights" if mode == "int4" else "")
                         + ("; its ONNX-domain Attention stays float (onnxruntime quantizes com.microsoft's)"
                            if qops.contrib_lookalikes(model) else ""))
    return [f"{op} x{counts[op]}" for op in present]


# ------------------------------------------------------------ preparation
def prepare(model, cfg: QuantizeConfig, ctx: PassContext, strategy: Strategy, work: Path,
            prepared: Path) -> tuple[Any, str | None]:
    """Write the model to quantize to `prepared`; (the prepared float model, the one line saying that nothing
    here gets faster in dynamic INT8, or None). Sets what the strategy learns from the model (Dynamic.present,
    Int4.gathers)."""
    mode = cfg.mode
    need = MIN_OPSET[mode]
    have = graph.opset(model)
    if have < need:
        model = graph.upgrade_opset(model, need)
        model.ir_version = max(model.ir_version, 7)  # opset 13 needs IR 7 (initializers need not be inputs)
        ctx.note(f"upgraded the model from opset {have} to {need} first ({mode} quantization, "
                 "per-channel QDQ and dynamic quantization need opset 13 or later)")
    inits = {i.name for i in model.graph.initializer}
    as_inputs = [v for v in model.graph.input if v.name in inits]
    if as_inputs and model.ir_version >= 4:  # weights listed as inputs are not constant: nothing would fold
        keep = [v for v in model.graph.input if v.name not in inits]
        del model.graph.input[:]
        model.graph.input.extend(keep)
        ctx.note(f"treated {len(as_inputs)} initializers listed as graph inputs as constants")
    if any(v.name in inits for v in model.graph.value_info):
        # an initializer's shape is its own: torch's dynamo exporter also lists it in value_info, a copy that goes
        # stale when a weight is rewritten (Gemm transB -> MatMul), and shape inference then refuses the model
        keep = [v for v in model.graph.value_info if v.name not in inits]
        del model.graph.value_info[:]
        model.graph.value_info.extend(keep)
    named = graph.name_nodes(model)
    if named:
        ctx.note(f"named {named} unnamed nodes so they can be listed and excluded")
    if mode in ("static", "dynamic"):
        moved = graph.constants_to_initializers(model)
        if moved:
            ctx.note(f"moved {moved} Constant nodes into initializers (weights held as Constant nodes are not "
                     "quantized otherwise)")
    if isinstance(strategy, Int4):
        model = _prepare_int4(model, cfg, ctx, strategy)
    raw = work / "float.onnx"
    onnx_io.save(model, raw)
    if cfg.preprocess and mode in ("static", "dynamic"):
        _preprocess(model, raw, prepared, work, ctx)
    else:
        shutil.copyfile(raw, prepared)
    nothing_faster = _prepare_dynamic(prepared, cfg, ctx, strategy) if isinstance(strategy, Dynamic) else None
    return onnx_io.load(prepared), nothing_faster


def _preprocess(model, raw: Path, prepared: Path, work: Path, ctx: PassContext) -> None:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    ort_tools_without_torch()  # its symbolic shape inference imports onnxruntime.tools, which imports torch
    quiet_ort()
    try:  # in our scratch folder: it writes <uuid>.data and sym_shape_infer_temp.onnx to the cwd
        with contextlib.chdir(work):
            # onnxruntime's symbolic shape inference reads ops by type alone: a standard op named as a contrib
            # one (opset 23 Attention) trips its asserts, so ONNX's own shape inference does there
            skip = graph.has_subgraphs(model) or bool(qops.contrib_lookalikes(model))
            quant_pre_process(str(raw), str(prepared), skip_symbolic_shape=skip)
        m = onnx_io.load(prepared)
        graph.name_nodes(m)
        onnx_io.save(m, prepared)
        grown = os.path.getsize(prepared) / os.path.getsize(raw)
        if grown > PREPROCESS_GROWTH:  # constant folding copied weights into several subgraphs
            ctx.note(f"pre-processing skipped: onnxruntime's graph optimization made the model {grown:.2f}x "
                     "larger (constants copied into subgraphs); quantizing the model as it is")
            shutil.copyfile(raw, prepared)
        else:
            ctx.note("pre-processed: shape inference and onnxruntime graph optimization before quantizing")
    except Exception as e:  # noqa: BLE001 - symbolic shape inference fails on some graphs
        ctx.note(f"pre-processing skipped ({first_line(e)[:120]}); quantizing the model as it is")
        shutil.copyfile(raw, prepared)


def _prepare_dynamic(prepared: Path, cfg: QuantizeConfig, ctx: PassContext, strategy: Dynamic) -> str | None:
    """onnxruntime's dynamic quantizer has no integer Gemm: Linear layers exported as Gemm are rewritten as
    MatMul [+ Add] (after pre-processing, whose optimizer would fuse them back) so their weights can be
    quantized. Then the op types the search varies (Dynamic.tiers), and one line when the model holds nothing
    that dynamic INT8 makes faster."""
    if "Gemm" not in cfg.op_types_exclude and (not cfg.op_types_include or "Gemm" in cfg.op_types_include):
        model = onnx_io.load(prepared)
        n = qops.gemm_to_matmul(model, exclude=set(cfg.nodes_exclude))
        if n:
            onnx_io.save(model, prepared)
            ctx.note(f"dynamic: rewrote {n} Gemm nodes as MatMul (+ Add) so their weights can be quantized "
                     "(onnxruntime's dynamic quantizer takes MatMul, not Gemm)")
    counts = qops.dynamic_ops(onnx_io.load(prepared))
    strategy.present = set(counts)
    tried = cfg.fusion and cfg.latency_search and not cfg.op_types_include and cfg.target == "cpu"
    if tried and (cfg.nodes_include or cfg.nodes_exclude):
        # the names are the unfused graph's: the fused one merges those nodes into Attention and friends, where
        # the quantizer would quantize an excluded node, or find none of the included ones
        if fusion.looks_like_transformer(onnx_io.load(prepared)):
            ctx.note("dynamic: onnxruntime's transformer fusions not tried: they merge the nodes named by "
                     "nodes_include / nodes_exclude (--include-node / --exclude-node) into fused ops")
    elif tried:
        fused = fusion.fuse(prepared, prepared.parent / "fused.onnx")
        if fused:
            strategy.fused = prepared.parent / "fused.onnx"
            ctx.note("dynamic: onnxruntime's transformer fusions apply ("
                     + ", ".join(f"{op} x{n}" for op, n in fused.items()) + "); the fused model's candidates race "
                     "the others (contrib ops: a fused result runs on onnxruntime only; --no-fusion to skip)")
    if cfg.op_types_include or dynamic_fast_ops(strategy, cfg):
        return None
    slow = [f"{op} x{counts[op]}" for op in qops.DYNAMIC_SLOW if counts.get(op)]
    nothing_faster = (f"dynamic INT8: nothing in this model that it makes faster (no MatMul, Gemm, "
                      f"Attention or LSTM); its {', '.join(slow)} can only get smaller"
                      + (", and ConvInteger is usually slower than float Conv" if counts.get("Conv") else ""))
    ctx.note(nothing_faster)
    log.info("%s", nothing_faster)
    return nothing_faster


def dynamic_fast_ops(strategy: Strategy, cfg: QuantizeConfig) -> list[str]:
    """The op types the model has that dynamic INT8 makes faster (qops.DYNAMIC_FAST), less those excluded."""
    present = getattr(strategy, "present", set())
    return [op for op in qops.DYNAMIC_FAST if op in present and op not in cfg.op_types_exclude]


def _prepare_int4(model, cfg: QuantizeConfig, ctx: PassContext, strategy: Int4):
    """MatMulNBits takes MatMul only: Gemm layers (torch Linear on 2-D inputs, attention out_proj) are
    rewritten as MatMul [+ Add] first. Embedding tables (constant Gather data) become GatherBlockQuantized,
    whose int4 type needs opset 21: the model is upgraded when it has one (skipped with a note if the
    upgrade fails)."""
    if "Gemm" not in cfg.op_types_exclude and (not cfg.op_types_include or "Gemm" in cfg.op_types_include):
        n = qops.gemm_to_matmul(model, exclude=set(cfg.nodes_exclude))
        if n:
            ctx.note(f"int4: rewrote {n} Gemm nodes as MatMul (+ Add) so their weights can be quantized")
    if "Gather" not in cfg.op_types_exclude and (not cfg.op_types_include or "Gather" in cfg.op_types_include):
        gathers = qops.int4_gathers(model)
        if gathers and graph.opset(model) < 21:
            have = graph.opset(model)
            try:
                model = graph.upgrade_opset(model, 21)
                model.ir_version = max(model.ir_version, 10)
                ctx.note(f"int4: upgraded the model from opset {have} to 21 (int4 embedding tables)")
            except UsageError as e:
                ctx.note(f"int4: embedding tables stay float ({e.message[:140]})")
                gathers = []
        strategy.gathers = gathers
    return model


# ------------------------------------------------------------ the reference
@dataclass
class Reference:
    """The parent and the data every candidate is checked against: its session, inputs and outputs, the check
    feeds with their labels and padding mask, its outputs and accuracy on them, and the calibration feeds."""

    parent: Any                        # the parent's onnxruntime session
    specs: list
    out_names: list[str]
    check_feeds: dict
    checked: list[str] = field(default_factory=list)  # the outputs judged (check_outputs)
    metric: str | None = None
    labels: Any = None
    mask: Any = None                   # measure.fidelity.Padding, or None
    parent_outputs: list = field(default_factory=list)
    parent_accuracy: float | None = None
    parent_rows: Any = None            # the metric's per-row parts, where it has no per-sample loss
    parent_sample: Any = None          # the metric of each check sample, where it has one (accuracy.per_sample)
    calib_feeds: dict | None = None

    @classmethod
    def of(cls, path, check_feeds: dict, *, metric: str | None = None, labels=None, check_outputs=()) -> Reference:
        """The parent at `path` run on `check_feeds` (no checks of the data: load_reference does those)."""
        parent = onnx_session.session(path, threads=SCORE_THREADS)
        specs = onnx_session.input_specs(parent, path)
        out_names = [o.name for o in parent.get_outputs()]
        ref = cls(parent, specs, out_names, check_feeds, check_names(list(check_outputs), out_names), metric, labels)
        ref.parent_outputs = ref.run(parent, check_feeds)
        ref.parent_accuracy = ref.accuracy(ref.parent_outputs, labels) if metric else None
        return ref

    @property
    def samples(self) -> int:
        return count(self.check_feeds)

    def run(self, session, feeds: dict) -> list:
        """Every output (in the parent's order) over `feeds`: an onnxruntime session's, or an optkit Session's
        (OpenVINO: the same outputs in the same order)."""
        if isinstance(session, Session):
            known = [s for s in session.outputs if s.shape is not None]
            return run_batched(session.run, self.specs, feeds, 64,
                               outputs=known if len(known) == len(session.outputs) else None)
        return onnx_session.run_all(session, feeds, self.out_names)

    def accuracy(self, outputs, labels) -> float:
        res = compute(self.metric, outputs, labels, self.out_names)
        return float(res.get(self.metric, next(iter(res.values()))))


def load_reference(path, cfg: QuantizeConfig, ctx: PassContext, settings: dict) -> Reference:
    """The Reference for the parent at `path` on the run's data (eval, else calibration, else synthesized);
    records where the calibration and check data came from in `settings` ("calibration", "check")."""
    parent = onnx_session.session(path, threads=SCORE_THREADS)
    specs = onnx_session.input_specs(parent, path)
    out_names = [o.name for o in parent.get_outputs()]
    ref = Reference(parent, specs, out_names, {}, check_names(cfg.check_outputs, out_names), cfg.metric)
    calib, ev = ctx.data.get("calibration"), ctx.data.get("eval")
    if cfg.mode == "static":
        if calib is not None:
            sub = calib.subset(cfg.calibration_size, ctx.seed)
            ref.calib_feeds = sub.bind(specs, stream=True)  # read a call at a time by the calibration reader
            settings["calibration"] = {"source": calib.source, "samples": len(sub)}
        else:
            n = min(cfg.calibration_size, 64) if stackable(specs) else 8
            ref.calib_feeds = _synthesized(ref, ctx, n, ctx.seed)
            settings["calibration"] = {"source": "synthetic", "samples": n}
            ctx.warn(f"SYNTHETIC CALIBRATION: calibrated on {n} random inputs, not real data; activation "
                     "ranges may be wrong and accuracy may suffer. Give calibration data (data.calibration / --calibration-data) for a real result")
    source = ev if ev is not None else calib
    if source is not None:
        sub = source.subset(cfg.check_samples, ctx.seed + 1)
        ref.check_feeds = trim(specs, sub.bind(specs))
        kept = count(ref.check_feeds)
        ref.labels = sub.labels[:kept] if source is ev and sub.labels is not None else None
        settings["check"] = {"source": source.source, "samples": kept, "of": len(source),
                             "subset": kept < len(source)}
    else:
        n = min(cfg.check_samples or 32, 32)
        ref.check_feeds = _synthesized(ref, ctx, n, ctx.seed + 1000)
        settings["check"] = {"source": "synthetic", "samples": n}
        ctx.note(f"checked against the parent on {n} synthesized inputs (no data given)")
    ref.mask = attention_mask(specs, ref.check_feeds, [onnx_session.spec_of(o) for o in parent.get_outputs()])
    try:
        ref.parent_outputs = ref.run(parent, ref.check_feeds)
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001  onnxruntime refuses the inputs: the model needs real ones
        given = "synthesized inputs" if source is None else source.source
        raise UsageError(f"{path} does not run on {given}: {first_line(e)[:200]}; give inputs "
                         "it accepts as eval data (data.eval / --eval-data; shapes / --shape for dynamic dims)") from None
    refuse_nonfinite_reference(path, ref.parent_outputs, out_names, specs, ref.check_feeds,
                               "synthesized inputs" if source is None else source.source,
                               only=None if cfg.metric else ref.checked)
    ref.parent_accuracy = ref.accuracy(ref.parent_outputs, ref.labels) if cfg.metric else None
    ref.parent_rows = metric_rows(cfg.metric, ref.parent_outputs, ref.labels) if cfg.metric else None
    Budget.of(cfg).check_rows(ref.parent_rows, cfg.metric)
    ref.parent_sample = per_sample(cfg.metric, ref.parent_outputs, ref.labels) if cfg.metric else None
    return ref


def _synthesized(ref: Reference, ctx: PassContext, n: int, seed: int) -> dict:
    """n synthesized samples, one whole call each; dims nobody set are probed once."""
    names = ref.out_names
    shapes, _ = probe(ref.specs, lambda f: ref.parent.run(names, f), ctx.shapes, ctx.values, ctx.seed)
    return stack_samples([synthesize(ref.specs, shapes, 1, seed + i, ctx.values) for i in range(n)])
