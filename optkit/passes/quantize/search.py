"""The quantize pass's engine: prepare, quantize, check against the parent, and the accuracy-aware search."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.batching import fixed_batch, stackable, trim
from optkit.core.errors import PassError, UsageError, ValidationError
from optkit.core.isolate import run_isolated
from optkit.core.registry import PassContext, require_extra
from optkit.core.text import first_line
from optkit.measure.accuracy import compute, resolve_metric
from optkit.measure.inputs import synthesize
from optkit.measure.latency import measure_latency
from optkit.measure.model import MeasureSettings, measure
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx import session as onnx_session
from optkit.onnx.session import quiet_ort
from optkit.passes.quantize import ops as qops
from optkit.passes.quantize.config import (
    LOWER_IS_BETTER,
    MIN_OPSET,
    TOLERANCE,
    QuantizeConfig,
    rejected_path,
)
from optkit.runtimes.base import open_session

# onnxruntime extra_options for TensorRT-ready QDQ: symmetric int8 (zero points 0), bias left float
TENSORRT_OPTIONS = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False}


class Quantizer:
    def __init__(self, artifact: Artifact, cfg: QuantizeConfig, ctx: PassContext):
        self.artifact, self.cfg, self.ctx = artifact, cfg, ctx
        self.mode = cfg.mode
        self.tmp = Path(tempfile.mkdtemp(prefix="optkit-quant-"))  # removed by __exit__ on every path
        self.candidates: list[dict[str, Any]] = []
        self.settings: dict[str, Any] = {}
        # the format of the candidate being built (auto starts with QDQ; the latency search tries both)
        self.fmt = "qoperator" if cfg.format == "qoperator" and cfg.target == "cpu" else "qdq"

    def __enter__(self) -> Quantizer:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------ orchestration
    def execute(self) -> Path:
        try:
            return self._execute()
        finally:
            self.ctx.measurements["quantize"] = {"mode": self.mode, "settings": self.settings,
                                                 "candidates": [_public(c) for c in self.candidates]}

    def _execute(self) -> Path:
        cfg, ctx = self.cfg, self.ctx
        if self.mode == "fp16":
            require_extra("quantize", "quantize mode fp16")
        self._check_flags()
        model = onnx_io.load(self.artifact.path)
        already = graph.is_quantized(model)
        if already:
            raise UsageError(f"{self.artifact.path} is already quantized (it holds {', '.join(already)}); "
                             "quantize the float model instead")
        self._check_quantizable(model)
        self.prepared = self._prepare(model)
        self._load_data()
        budget_kind, budget = self._budget()
        self.settings.update(budget=budget_kind, budget_value=budget)

        first = self._candidate([])
        if self._passes(first):
            return self._finish(first)
        if not self._search_on():
            self._latency([first])
            if first.get("error"):
                raise ValidationError(
                    f"onnxruntime's {self.mode} quantizer wrote a model onnxruntime cannot load ({first['error']}); "
                    "nothing was written. Keep the failing node types float with --exclude-op",
                    details={"candidates": [_public(first)]})
            raise ValidationError(
                f"{self.mode} quantization moved the outputs past the tolerance: {self._figures(first)}; "
                f"the model was not written. Rerun with --fallback to keep the most sensitive nodes in float, "
                f"or loosen --tolerance", details={"candidates": [_public(first)]})
        ranked = self._rank(first)
        tried = [first]
        for k in _schedule(len(ranked), cfg.max_candidates - 1):
            cand = self._candidate([name for name, _ in ranked[:k]])
            tried.append(cand)
            if self._passes(cand):
                break
        if not any(c["passed"] for c in tried) or not self._speed_search_on():
            self._latency(tried)
        ok = [c for c in tried if c["passed"]]
        if ok:
            return self._finish(ok[0])
        best = max(tried, key=self._score)
        dest = rejected_path(ctx.output)
        with atomic_path(dest) as tmp:
            tmp.write_bytes(Path(best["path"]).read_bytes())
        best["rejected_file"] = str(dest)
        raise ValidationError(
            f"no {self.mode} candidate met the budget ({budget_kind} {budget:g}) after {len(tried)} tries; "
            f"the best ({len(best['float_nodes'])} nodes in float: {self._figures(best)}) was kept as {dest}",
            details={"candidates": [_public(c) for c in tried], "rejected": str(dest)})

    # ------------------------------------------------------------ checks up front
    def _check_flags(self) -> None:
        cfg, data = self.cfg, self.ctx.data
        if cfg.max_accuracy_drop is not None:
            if not cfg.metric:
                raise UsageError("--max-accuracy-drop needs --metric (e.g. top1)")
            if data.get("eval") is None:
                raise UsageError("--max-accuracy-drop needs labelled --eval-data")
        if cfg.metric:
            resolve_metric(cfg.metric)
            ev = data.get("eval")
            if ev is None:
                raise UsageError(f"--metric {cfg.metric} needs --eval-data")
            if ev.labels is None:
                raise UsageError(f"--metric {cfg.metric} needs labels, and {ev.source} has none "
                                 "(add a 'labels' array, or use --max-fidelity-loss)")
        if cfg.max_accuracy_drop is not None and cfg.max_fidelity_loss is not None:
            raise UsageError("give one budget: --max-accuracy-drop or --max-fidelity-loss")
        if self.mode == "static" and data.get("calibration") is None and not cfg.synthetic_calibration:
            raise UsageError("static quantization needs --calibration-data (or --synthetic-calibration to "
                             "calibrate on random inputs, which usually costs accuracy)")

    def _check_quantizable(self, model) -> None:
        counts = graph.op_counts(model)
        for node in qops.contrib_lookalikes(model):  # never quantized (qops.CONTRIB_ONLY)
            counts[node.op_type] -= 1
        wanted = {"dynamic": qops.DYNAMIC_OPS, "static": qops.STATIC_ANCHORS, "int4": qops.INT4_OPS}.get(self.mode)
        if self.cfg.op_types_include:
            wanted = tuple(self.cfg.op_types_include)
        if wanted is None:  # fp16
            if not graph.float_io(model) and not any(i.data_type == 1 for i in model.graph.initializer):
                raise UsageError(f"{self.artifact.path} has no float32 tensors to convert to fp16")
            return
        present = [op for op in wanted if counts.get(op) and op not in self.cfg.op_types_exclude]
        if self.mode == "int4":
            import onnx

            inits = {i.name for i in model.graph.initializer}
            k = qops.INT4_WEIGHT_INPUT
            present = [op for op in present if (qops.int4_gathers(model) if op == "Gather" else any(
                n.op_type == op and len(n.input) > k[op] and n.input[k[op]] in inits for n in model.graph.node))]
            _ = onnx
        if not present:
            have = ", ".join(sorted(counts)) or "no ops"
            raise UsageError(f"nothing to quantize in {self.artifact.path} for mode {self.mode}: it has {have}; "
                             f"onnxruntime quantizes {', '.join(wanted)}"
                             + (" with constant weights" if self.mode == "int4" else "")
                             + ("; its ONNX-domain Attention stays float (onnxruntime quantizes com.microsoft's)"
                                if qops.contrib_lookalikes(model) else ""))

    # ------------------------------------------------------------ preparation
    def _prepare(self, model) -> Path:
        cfg, ctx = self.cfg, self.ctx
        need = MIN_OPSET[self.mode]
        have = graph.opset(model)
        if have < need:
            model = graph.upgrade_opset(model, need)
            model.ir_version = max(model.ir_version, 7)  # opset 13 needs IR 7 (initializers need not be inputs)
            ctx.note(f"upgraded the model from opset {have} to {need} first ({self.mode} quantization, "
                     "per-channel QDQ and dynamic quantization need opset 13 or later)")
        inits = {i.name for i in model.graph.initializer}
        as_inputs = [v for v in model.graph.input if v.name in inits]
        if as_inputs and model.ir_version >= 4:  # weights listed as inputs are not constant: nothing would fold
            keep = [v for v in model.graph.input if v.name not in inits]
            del model.graph.input[:]
            model.graph.input.extend(keep)
            ctx.note(f"treated {len(as_inputs)} initializers listed as graph inputs as constants")
        named = graph.name_nodes(model)
        if named:
            ctx.note(f"named {named} unnamed nodes so they can be listed and excluded")
        if self.mode == "int4":
            model = self._prepare_int4(model)
        raw = self.tmp / "float.onnx"
        onnx_io.save(model, raw)
        prepared = self.tmp / "prepared.onnx"
        if cfg.preprocess and self.mode in ("static", "dynamic"):
            from onnxruntime.quantization.shape_inference import quant_pre_process

            quiet_ort()

            try:  # in our scratch folder: it writes <uuid>.data and sym_shape_infer_temp.onnx to the cwd
                with contextlib.chdir(self.tmp):
                    quant_pre_process(str(raw), str(prepared), skip_symbolic_shape=graph.has_subgraphs(model))
                m = onnx_io.load(prepared)
                graph.name_nodes(m)
                onnx_io.save(m, prepared)
                ctx.note("pre-processed: shape inference and onnxruntime graph optimization before quantizing")
            except Exception as e:  # symbolic shape inference fails on some graphs: quantize without it
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                ctx.note(f"pre-processing skipped ({first[:120]}); quantizing the model as it is")
                shutil.copyfile(raw, prepared)
        else:
            shutil.copyfile(raw, prepared)
        self.float_model = onnx_io.load(prepared)
        return prepared

    def _prepare_int4(self, model):
        """MatMulNBits takes MatMul only: Gemm layers (torch Linear on 2-D inputs, attention out_proj) are
        rewritten as MatMul [+ Add] first. Embedding tables (constant Gather data) become GatherBlockQuantized,
        whose int4 type needs opset 21: the model is upgraded when it has one (skipped with a note if the
        upgrade fails)."""
        cfg, ctx = self.cfg, self.ctx
        if "Gemm" not in cfg.op_types_exclude and (not cfg.op_types_include or "Gemm" in cfg.op_types_include):
            n = qops.gemm_to_matmul(model, exclude=set(cfg.nodes_exclude))
            if n:
                ctx.note(f"int4: rewrote {n} Gemm nodes as MatMul (+ Add) so their weights can be quantized")
        self.int4_gathers: list[str] = []
        if "Gather" not in cfg.op_types_exclude and (not cfg.op_types_include or "Gather" in cfg.op_types_include):
            gathers = qops.int4_gathers(model)
            if gathers and graph.opset(model) < 21:
                have = graph.opset(model)
                try:
                    model = graph.upgrade_opset(model, 21)
                    model.ir_version = max(model.ir_version, 10)
                    ctx.note(f"int4: upgraded the model from opset {have} to 21 (int4 embedding tables)")
                except Exception as e:
                    ctx.note(f"int4: embedding tables stay float (opset {have} -> 21 upgrade failed: "
                             f"{str(e).splitlines()[0][:100] if str(e) else type(e).__name__})")
                    gathers = []
            self.int4_gathers = gathers
        return model

    def _load_data(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        self.parent = onnx_session.session(self.artifact.path)
        specs = onnx_session.input_specs(self.parent)
        self.out_names = [o.name for o in self.parent.get_outputs()]
        calib, ev = ctx.data.get("calibration"), ctx.data.get("eval")
        self.calib_feeds = None
        if self.mode == "static":
            if calib is not None:
                sub = calib.subset(cfg.calibration_size, ctx.seed)
                self.calib_feeds = sub.bind(specs)
                self.settings["calibration"] = {"source": calib.source, "samples": len(sub)}
            else:
                n = min(cfg.calibration_size, 64) if stackable(specs) else 1
                self.calib_feeds = _stack([synthesize(specs, ctx.shapes, 1, ctx.seed + i) for i in range(n)])
                self.settings["calibration"] = {"source": "synthetic", "samples": n}
                ctx.warn(f"SYNTHETIC CALIBRATION: calibrated on {n} random inputs, not real data; activation "
                         "ranges may be wrong and accuracy may suffer. Pass --calibration-data for a real result")
        source = ev if ev is not None else calib
        self.labels = None
        if source is not None:
            sub = source.subset(cfg.check_samples, ctx.seed + 1)
            self.check_feeds = trim(specs, sub.bind(specs))
            kept = len(next(iter(self.check_feeds.values()))) if self.check_feeds else len(sub)
            self.labels = sub.labels[:kept] if source is ev and sub.labels is not None else None
            self.settings["check"] = {"source": source.source, "samples": kept}
        else:
            n = min(cfg.check_samples, 32) if stackable(specs) else 1
            self.check_feeds = _stack([synthesize(specs, ctx.shapes, 1, ctx.seed + 1000 + i) for i in range(n)])
            self.settings["check"] = {"source": "synthetic", "samples": n}
            ctx.note(f"checked against the parent on {n} synthesized inputs (no data given)")
        try:
            self.parent_outputs = onnx_session.run_all(self.parent, self.check_feeds, self.out_names)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001  onnxruntime refuses the inputs: the model needs real ones
            given = "synthesized inputs" if source is None else source.source
            raise UsageError(f"{self.artifact.path} does not run on {given}: {first_line(e)[:200]}; give inputs "
                             "it accepts with --eval-data (and --shape for dynamic dims)") from None
        self._refuse_nonfinite_parent("synthesized inputs" if source is None else source.source)
        self.parent_accuracy = self._accuracy(self.parent_outputs) if cfg.metric else None

    def _refuse_nonfinite_parent(self, given: str) -> None:
        """The float model's own NaN / Inf outputs leave nothing to check a quantized model against (every
        cosine would be -1): say so, rather than blame quantization and suggest --fallback."""
        if self.cfg.max_accuracy_drop is not None:  # judged on the metric, which refuses NaN outputs itself
            return
        for name, out in zip(self.out_names, self.parent_outputs):
            out = np.asarray(out)
            if out.dtype.kind in "fc" and out.size and not np.isfinite(out).all():
                bad = int(out.size - np.count_nonzero(np.isfinite(out)))
                raise ValidationError(
                    f"{self.artifact.path} itself gives {bad} NaN/Inf values out of {out.size} in output {name!r} "
                    f"on {given}, so a quantized model cannot be checked against it; nothing was written. Give "
                    "inputs on which its outputs are finite with --eval-data")

    def _budget(self) -> tuple[str, float]:
        cfg = self.cfg
        if cfg.max_accuracy_drop is not None:
            return f"{cfg.metric} drop", cfg.max_accuracy_drop
        if cfg.max_fidelity_loss is not None:
            return "fidelity loss", cfg.max_fidelity_loss
        return "fidelity loss", cfg.tolerance if cfg.tolerance is not None else TOLERANCE[self.mode]

    def _search_on(self) -> bool:
        return self.cfg.fallback or self.cfg.max_accuracy_drop is not None or self.cfg.max_fidelity_loss is not None

    # ------------------------------------------------------------ quantizing one candidate
    def _resolved(self) -> dict[str, Any]:
        cfg = self.cfg
        vnni = qops.has_vnni()
        if cfg.target == "tensorrt":  # TensorRT: signed symmetric INT8 everywhere, full range
            # per-tensor weights by default: with symmetric activations onnxruntime 1.32's per-channel QDQ moved
            # the sample CNN to cosine 0.979 (per-tensor: 0.996); --per-channel asks for it anyway
            return {"activation_type": "int8", "weight_type": "int8", "per_channel": bool(cfg.per_channel),
                    "reduce_range": False, "vnni": vnni, "target": "tensorrt"}
        # onnxruntime's int8-activation QOperator kernels are slow on x86 with or without VNNI (measured 3x
        # slower than uint8 on MNIST with VNNI; its docs say the same): auto gives QOperator uint8 activations
        act = cfg.activation_type if cfg.activation_type != "auto" else (
            "int8" if vnni and self.fmt == "qdq" else "uint8")
        # onnxruntime's QOperator per-channel path crashes on int32-bias scale adjustment: per-tensor there
        per_channel = cfg.per_channel if cfg.per_channel is not None else (
            self.mode == "static" and self.fmt == "qdq")
        reduce_range = cfg.reduce_range if cfg.reduce_range is not None else (
            not vnni and cfg.weight_type == "int8")
        return {"activation_type": act, "weight_type": cfg.weight_type, "per_channel": per_channel,
                "reduce_range": reduce_range, "vnni": vnni}

    def _quantize(self, exclude: list[str], dest: Path) -> None:
        cfg, mode = self.cfg, self.mode
        exclude = sorted(set(cfg.nodes_exclude) | set(exclude)
                         | {n.name for n in qops.contrib_lookalikes(self.float_model)})
        if mode in ("static", "dynamic"):
            from onnxruntime.quantization import QuantType

            r = self._resolved()
            self.settings.update({k: v for k, v in r.items()})
            qt = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
            op_types = self._op_types()
            if mode == "dynamic":
                from onnxruntime.quantization import quantize_dynamic

                quantize_dynamic(str(self.prepared), str(dest), op_types_to_quantize=op_types,
                                 per_channel=r["per_channel"], reduce_range=r["reduce_range"],
                                 weight_type=qt[r["weight_type"]], nodes_to_quantize=cfg.nodes_include or None,
                                 nodes_to_exclude=exclude, extra_options={"MatMulConstBOnly": True})
                return
            from onnxruntime.quantization import (
                CalibrationMethod,
                QuantFormat,
                quantize_static,
            )

            method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                      "percentile": CalibrationMethod.Percentile}[cfg.calibration_method]
            quantize_static(
                str(self.prepared), str(dest), _Reader(self.calib_feeds, self.parent),
                quant_format=QuantFormat.QDQ if self.fmt == "qdq" else QuantFormat.QOperator,
                op_types_to_quantize=op_types, per_channel=r["per_channel"], reduce_range=r["reduce_range"],
                activation_type=qt[r["activation_type"]], weight_type=qt[r["weight_type"]],
                nodes_to_quantize=cfg.nodes_include or None, nodes_to_exclude=exclude, calibrate_method=method,
                # the per-channel int32-bias weight-scale adjustment crashes in onnxruntime 1.2x-1.3x
                extra_options={"QDQDisableWeightAdjustForInt32Bias": True, "WeightAdjustForInt32Bias": False,
                               **(TENSORRT_OPTIONS if cfg.target == "tensorrt" else {})},
            )
            return
        if mode == "fp16":
            from onnxconverter_common import float16

            model = onnx_io.load(self.prepared)
            block = set(exclude)
            if cfg.nodes_include:
                block |= {n.name for n in model.graph.node if n.name not in cfg.nodes_include}
            out = float16.convert_float_to_float16(model, keep_io_types=cfg.keep_io_types,
                                                   node_block_list=sorted(block) or None,
                                                   op_block_list=cfg.op_types_exclude or None)
            onnx_io.save(out, dest)
            self.settings.update(keep_io_types=cfg.keep_io_types)
            return
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        model = onnx_io.load(self.prepared)
        gathers = getattr(self, "int4_gathers", [])
        # only float embedding tables: any other Gather (shape arithmetic, int tables) is left alone
        exclude = sorted(set(exclude) | {n.name for n in model.graph.node
                                         if n.op_type == "Gather" and n.name not in gathers})
        types = ("MatMul", "Gather") if gathers else ("MatMul",)
        q = MatMulNBitsQuantizer(model, bits=4, block_size=cfg.block_size,
                                 is_symmetric=cfg.symmetric, accuracy_level=cfg.accuracy_level,
                                 nodes_to_exclude=exclude, nodes_to_include=cfg.nodes_include or None,
                                 op_types_to_quantize=types)
        q.process()
        onnx_io.save(q.model.model, dest)
        self.settings.update(block_size=cfg.block_size, symmetric=cfg.symmetric)

    def _op_types(self) -> list[str] | None:
        cfg = self.cfg
        if not cfg.op_types_include and not cfg.op_types_exclude:
            return None
        if cfg.op_types_include:
            base = list(cfg.op_types_include)
        else:
            from onnxruntime.quantization.registry import (
                IntegerOpsRegistry,
                QDQRegistry,
                QLinearOpsRegistry,
            )

            reg = IntegerOpsRegistry if self.mode == "dynamic" else (
                QDQRegistry if self.fmt == "qdq" else QLinearOpsRegistry)
            base = sorted(reg)
        return [t for t in base if t not in cfg.op_types_exclude]

    def _candidate(self, float_nodes: list[str]) -> dict[str, Any]:
        idx = len(self.candidates)
        raw = self.tmp / f"cand{idx}.raw.onnx"
        try:
            import contextlib
            import sys

            with contextlib.redirect_stdout(sys.stderr):  # onnxruntime prints progress; keep --json clean
                self._quantize(float_nodes, raw)
        except (UsageError, ValidationError):
            raise
        except Exception as e:

            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PassError(f"onnxruntime could not quantize {self.artifact.path} ({self.mode}): {first[:200]}") \
                from None
        final = self.tmp / f"cand{idx}.onnx"
        model = onnx_io.load(raw)
        if self.cfg.compact:
            graph.compact(model)
        onnx_io.save(model, final)
        cand: dict[str, Any] = {"index": idx, "float_nodes": list(float_nodes), "raw": raw, "path": final,
                                "format": self.fmt if self.mode == "static" else None,
                                "activation_type": self.settings.get("activation_type"),
                                "bytes": os.path.getsize(final), "ratio": os.path.getsize(final) / self.artifact.size_bytes(),
                                "chosen": False}
        try:
            sess = onnx_session.session(final)
            out = onnx_session.run_all(sess, self.check_feeds, self.out_names)
        except UsageError as e:
            cand.update(passed=False, error=e.message, fidelity={"loss": float("inf"), "cosine": 0.0})
            self.candidates.append(cand)
            return cand
        cand["fidelity"] = qops.fidelity(self.parent_outputs, out, self.out_names)
        if self.cfg.metric:
            cand["accuracy"] = self._accuracy(out)
            cand["accuracy_drop"] = self._drop(cand["accuracy"])
        cand["passed"] = self._passes(cand)
        self.candidates.append(cand)
        return cand

    def _accuracy(self, outputs) -> float:
        res = compute(self.cfg.metric, outputs, self.labels, self.out_names)
        return float(res.get(self.cfg.metric, next(iter(res.values()))))

    def _drop(self, acc: float) -> float:
        if self.cfg.metric in LOWER_IS_BETTER:
            return acc - self.parent_accuracy
        return self.parent_accuracy - acc

    def _passes(self, cand: dict[str, Any]) -> bool:
        if cand.get("error"):
            return False
        kind, budget = self._budget()
        if self.cfg.max_accuracy_drop is not None:
            return cand["accuracy_drop"] <= budget + 1e-12
        return bool(np.isfinite(cand["fidelity"]["loss"])) and cand["fidelity"]["loss"] <= budget

    def _score(self, cand: dict[str, Any]) -> float:
        if cand.get("error"):
            return -np.inf
        if self.cfg.max_accuracy_drop is not None:
            return -cand["accuracy_drop"]
        return -cand["fidelity"]["loss"]

    def _figures(self, cand: dict[str, Any]) -> str:
        if cand.get("error"):
            return f"the quantized model does not load ({cand['error']})"
        f = cand["fidelity"]
        s = f"cosine {f['cosine']:.4f} (loss {f['loss']:.4g}), max |diff| {f['max_abs_error']:.3g}"
        if f.get("top1_agreement") is not None:
            s += f", top-1 agreement {f['top1_agreement']:.3f}"
        if "accuracy" in cand:
            s += f", {self.cfg.metric} {cand['accuracy']:.4f} (parent {self.parent_accuracy:.4f})"
        kind, budget = self._budget()
        return s + f"; budget: {kind} <= {budget:g}"

    def _say_chosen(self, cand: dict[str, Any]) -> None:
        ctx, r = self.ctx, self.settings
        if self.mode in ("static", "dynamic"):
            why = "this CPU has VNNI" if r.get("vnni") else "this CPU lacks VNNI (u8s8 kernels, reduce_range " \
                                                          "avoids their saturation)"
            ctx.note(f"{self.mode} INT8: activations {r['activation_type']}, weights {r['weight_type']}, "
                     f"per-channel {'on' if r['per_channel'] else 'off'}, reduce-range "
                     f"{'on' if r['reduce_range'] else 'off'} ({why})"
                     + (f", {cand.get('format', self.fmt).upper()}" if self.mode == "static" else "")
                     + (", symmetric for TensorRT (zero points 0, float bias)" if r.get("target") else ""))
        ctx.note(f"checked against the parent on {r['check']['samples']} {r['check']['source']} inputs: "
                 f"{self._figures(cand)}")
        if cand["float_nodes"]:
            ctx.note(f"kept {len(cand['float_nodes'])} sensitive nodes in float: {', '.join(cand['float_nodes'])}")
        if len(self.candidates) > 1:
            ctx.note(f"tried {len(self.candidates)} candidates (see measurements.quantize.candidates)")

    # ------------------------------------------------------------ search helpers
    def _rank(self, first: dict[str, Any]) -> list[tuple[str, float]]:
        """Nodes ranked by how much error they add: error of their outputs against the FP32 activations
        minus the error already on their inputs (measured on the fully quantized candidate)."""
        fmodel = self.float_model
        quantized = onnx_io.load(first["raw"])
        qtensors = {o for n in graph.all_nodes(quantized.graph) for o in n.output}
        init = {i.name for i in fmodel.graph.initializer}
        nodes = [n for n in fmodel.graph.node if n.name not in self.cfg.nodes_exclude]
        tensors = sorted({o for n in nodes for o in n.output if o in qtensors})
        feeds = {k: v[:32] for k, v in self.check_feeds.items()}
        err: dict[str, float] = {}
        try:
            fs = onnx_session.session(_save(graph.with_outputs(fmodel, tensors), self.tmp / "f_dbg.onnx"))
            qs = onnx_session.session(_save(graph.with_outputs(quantized, tensors), self.tmp / "q_dbg.onnx"))
            fo = onnx_session.run_all(fs, feeds, tensors)
            qo = onnx_session.run_all(qs, feeds, tensors)
            err = {t: qops.rel_error(a, b) for t, a, b in zip(tensors, fo, qo)}
        except Exception:  # some graphs will not expose intermediates: rank by op type instead
            err = {}
        qnames = {n.name for n in quantized.graph.node}
        scores = []
        for n in nodes:
            outs = [err[o] for o in n.output if o in err]
            if not outs:
                if err:
                    continue
                score = 1.0 if n.op_type in qops.WEIGHT_OPS + graph.RECURRENT + graph.CONTROL_FLOW else 0.0
            else:
                ins = [err.get(i, 0.0) for i in n.input if i and i not in init]
                score = max(outs) - max(ins, default=0.0)
            touched = n.name not in qnames or n.op_type in qops.WEIGHT_OPS + graph.RECURRENT + graph.CONTROL_FLOW
            if score > 0 and touched:
                scores.append((n.name, float(score)))
        scores.sort(key=lambda s: -s[1])
        self.settings["sensitivity"] = [{"node": n, "added_error": round(s, 6)} for n, s in scores[:20]]
        return scores

    # ------------------------------------------------------------ choosing: size, speed
    def _speed_search_on(self) -> bool:
        return self.mode == "static" and self.cfg.target == "cpu" and self.cfg.measure_candidates

    def _finish(self, cand: dict[str, Any]) -> Path:
        """The accuracy search found `cand`. For static INT8 on the CPU, build its faster-maybe variants (other
        format, int8-unfriendly nodes kept float), time them all against the parent and keep the fastest that
        meets the budgets; refuse (exit 3) a result slower than its parent unless allowed."""
        cfg = self.cfg
        pool = [cand]
        if self._speed_search_on() and cfg.latency_search:
            slow = [n for n in self._int8_unfriendly() if n not in cand["float_nodes"]]
            fmts = ["qdq", "qoperator"] if cfg.format == "auto" else [cand["format"]]
            for fmt in fmts:
                for extra in ([], slow) if slow else ([],):
                    if fmt == cand["format"] and not extra:
                        continue
                    self.fmt = fmt
                    try:
                        v = self._candidate(cand["float_nodes"] + extra)
                    except Exception as e:  # a variant onnxruntime cannot build is skipped, said in the notes
                        self.ctx.note(f"variant {fmt} (+{len(extra)} float nodes) not built: {e}")
                        continue
                    v["variant"] = f"{fmt}" + (f", {len(extra)} int8-slow nodes float" if extra else "")
                    if v["passed"]:
                        pool.append(v)
            if slow:
                self.settings["int8_slow_nodes"] = slow
        cand.setdefault("variant", cand.get("format") or self.mode)
        if self._speed_search_on():
            self._time(pool)
        elif self._search_on():
            self._latency(pool)
        budget = cfg.max_size_ratio
        fits = [c for c in pool if budget is None or c["ratio"] <= budget + 1e-12]
        if not fits:
            best = min(pool, key=lambda c: c["bytes"])
            dest = rejected_path(self.ctx.output)
            with atomic_path(dest) as tmp:
                tmp.write_bytes(Path(best["path"]).read_bytes())
            best["rejected_file"] = str(dest)
            raise ValidationError(
                f"no {self.mode} candidate met the size budget ({best['ratio']:.3f}x of the parent at best, budget "
                f"{budget:g}x); the smallest was kept as {dest}", details={"candidates": [_public(c) for c in pool]})
        chosen = self._fastest(fits)  # when every variant is slower than the parent, this is the least slow
        for c in self.candidates:
            c["chosen"] = c is chosen
        if chosen.get("format"):
            self.fmt = chosen["format"]
            self.settings.update(self._resolved())  # the settings reported are the chosen candidate's
        self._say_chosen(chosen)
        if self._speed_search_on():
            self._slower_check(chosen, pool)
        return chosen["path"]

    def _int8_unfriendly(self) -> list[str]:
        """Conv nodes with <= 4 input channels per group (the 1-channel first conv of an image model, depthwise
        convs): their int8 kernels (im2col + a GEMM with a tiny K, layout transposes) run slower than the float
        NCHWc ones on CPUs without VNNI; measured, not assumed: they only stay float when that variant wins."""
        inits = {i.name: i for i in self.float_model.graph.initializer}
        out = []
        for n in self.float_model.graph.node:
            if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits:
                dims = list(inits[n.input[1]].dims)
                if len(dims) >= 3 and dims[1] <= 4 and n.name not in self.cfg.nodes_exclude:
                    out.append(n.name)
        return out

    def _fastest(self, pool: list[dict[str, Any]]) -> dict[str, Any]:
        timed = [c for c in pool if c.get("p50_ms")]
        if not timed:
            return min(pool, key=lambda c: c["bytes"])
        best = min(c["p50_ms"] for c in timed)
        near = [c for c in timed if c["p50_ms"] <= best * 1.03]  # within noise: the smaller file wins
        return min(near, key=lambda c: (c["bytes"], c["p50_ms"]))

    def _time(self, pool: list[dict[str, Any]], rounds: int = 5) -> None:
        """p50 at batch 1 on one thread, parent and candidates interleaved over rounds in one child process
        (optkit.measure's latency module on optkit's onnxruntime sessions), best round kept: the machine may be
        shared, the low figure is the model's, the high ones are the neighbours'."""

        paths = [str(self.artifact.path)] + [str(c["path"]) for c in pool]
        try:
            best = run_isolated(_time_interleaved, paths, self.ctx.shapes, self.ctx.seed, rounds,
                                what="timing the quantized candidates")
        except Exception as e:  # latency informs the choice; a failure must not hide the result
            self.ctx.note(f"candidate latency not measured: {e}")
            return
        base = best[0]
        self.settings.update(parent_p50_ms=base, latency_settings=f"batch 1, 1 thread, best p50 of {rounds} "
                                                                  "interleaved rounds")
        for c, t in zip(pool, best[1:]):
            c["p50_ms"] = t
            c["latency_ratio"] = t / base if base else None

    def _slower_check(self, chosen: dict[str, Any], pool: list[dict[str, Any]]) -> None:
        cfg, ratio = self.cfg, chosen.get("latency_ratio")
        if ratio is None:
            return
        self.settings["speed"] = {"latency_ratio": ratio, "max_latency_ratio": cfg.max_latency_ratio,
                                  "slower": ratio > cfg.max_latency_ratio}
        if ratio <= cfg.max_latency_ratio:
            self.ctx.note(f"latency: {ratio:.2f}x the parent's p50 at batch 1 on one thread "
                          f"({chosen['p50_ms']:.3f} ms vs {self.settings['parent_p50_ms']:.3f} ms), the fastest "
                          f"of {len(pool)} variants")
            return
        tried = "; ".join(f"{c.get('variant')}: {c['latency_ratio']:.2f}x" for c in pool if c.get("latency_ratio"))
        msg = (f"static INT8 is SLOWER than its FP32 parent on this CPU: p50 {chosen['p50_ms']:.3f} ms vs "
               f"{self.settings['parent_p50_ms']:.3f} ms ({ratio:.2f}x at batch 1, one thread; variants tried: "
               f"{tried}); int8 kernels do not pay off on a model this small"
               + ("" if qops.has_vnni() else " on a CPU without VNNI"))
        if cfg.allow_slower:
            self.ctx.warn(msg + "; written anyway (--allow-slower)")
            return
        dest = rejected_path(self.ctx.output)
        with atomic_path(dest) as tmp:
            tmp.write_bytes(Path(chosen["path"]).read_bytes())
        chosen["rejected_file"] = str(dest)
        raise ValidationError(msg + f"; kept as {dest}. Pass --allow-slower to accept it (e.g. for size), "
                              "or keep the model float", details={"candidates": [_public(c) for c in pool],
                                                                 "rejected": str(dest)})

    def _latency(self, cands: list[dict[str, Any]]) -> None:
        if not self.cfg.measure_candidates:
            return

        settings = MeasureSettings(warmup=5, runs=50, shapes=self.ctx.shapes, seed=self.ctx.seed)
        try:
            base = measure(self.artifact, settings)["latency"]["p50_ms"]
            self.settings["parent_p50_ms"] = base
            for c in cands:
                if c.get("error"):
                    continue
                p50 = measure(Artifact.load(c["path"]), settings)["latency"]["p50_ms"]
                c["p50_ms"] = p50
                c["latency_ratio"] = p50 / base if base else None
        except Exception as e:  # latency is informative here; a failure must not hide the result
            self.ctx.note(f"candidate latency not measured: {e}")


def _Reader(feeds: dict[str, np.ndarray], parent_session):
    """onnxruntime CalibrationDataReader over bound feeds, in batches the model accepts."""
    from onnxruntime.quantization import CalibrationDataReader

    fixed = fixed_batch(onnx_session.input_specs(parent_session))
    step = fixed or 16
    n = len(next(iter(feeds.values())))
    stop = n - n % step if (fixed or n >= step) else n  # equal batches: histogram calibrators stack them
    items = [{k: v[s:s + step] for k, v in feeds.items()} for s in range(0, stop, step)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(items)

        def get_next(self):
            return next(self._it, None)

        def rewind(self):
            self._it = iter(items)

    return Reader()


def _time_interleaved(paths: list[str], shapes, seed: int, rounds: int) -> list[float]:
    sessions = [open_session(Artifact.load(p), provider="cpu", threads=1) for p in paths]
    feeds = [synthesize(s.inputs, shapes, batch=1, seed=seed) for s in sessions]
    best = [float("inf")] * len(paths)
    for _ in range(rounds):
        for i, (s, f) in enumerate(zip(sessions, feeds)):
            best[i] = min(best[i], measure_latency(s, f, warmup=10, runs=60)["p50_ms"])
    return best


def _stack(feeds_list: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([f[k] for f in feeds_list], axis=0) for k in feeds_list[0]}


def _save(model, path: Path) -> Path:
    onnx_io.save(model, path)
    return path


def _schedule(n: int, budget: int) -> list[int]:
    """How many nodes to keep in float at each step: 1, 2, 4, ... then all ranked nodes."""
    steps, k = [], 1
    while k < n and len(steps) < budget - 1:
        steps.append(k)
        k *= 2
    if n and len(steps) < budget:
        steps.append(n)
    return steps


def _public(c: dict[str, Any]) -> dict[str, Any]:
    keep = ("index", "variant", "format", "activation_type", "float_nodes", "bytes", "ratio", "accuracy", "accuracy_drop", "p50_ms", "latency_ratio",
            "passed", "chosen", "error", "rejected_file")
    d = {k: c[k] for k in keep if k in c}
    if "fidelity" in c:
        d["fidelity"] = {k: v for k, v in c["fidelity"].items() if k != "outputs"}
    return d
