"""The quantize search: prepare the float model, try settings (engine.py's strategy for the mode), check each
candidate against the parent, keep sensitive nodes in float when none meets the budget, and keep the fastest
candidate that meets every budget, as measured on this machine (budget.py's Budget judges and picks).

Cheap first: candidates are screened on a subset of the check data and only plausible ones are scored on the
whole set; only those that meet every budget are timed, against the FP32 parent in one child process
(measure.paired.paired_latencies: call by call, clearly slower candidates dropped early, TIMING_LIMIT_S in all);
costlier calibrations are tried only when the cheap ones miss. `max_candidates` and `time_budget` bound the
search. The phases' times (build, score, time) are reported as `phases_s` and logged at -v.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.batching import count, first_call, fixed_batch, stack_samples, stackable, trim
from optkit.core.errors import UsageError, ValidationError
from optkit.core.registry import PassContext, require_extra
from optkit.core.text import first_line
from optkit.measure.accuracy import compute, resolve_metric
from optkit.measure.fidelity import attention_mask, check_names, refuse_nonfinite_reference
from optkit.measure.inputs import probe, synthesize
from optkit.measure.model import MeasureSettings
from optkit.measure.paired import MIN_CHANGE, paired_latencies
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx import session as onnx_session
from optkit.onnx.session import quiet_ort
from optkit.passes.quantize import ops as qops
from optkit.passes.quantize.budget import Budget
from optkit.passes.quantize.candidates import Candidate, Settings, aside_path, keep_rejected
from optkit.passes.quantize.config import LOWER_IS_BETTER, MIN_OPSET, QuantizeConfig
from optkit.passes.quantize.engine import Dynamic, Int4, calibration_reader, contrib_excludes, strategy_for

log = logging.getLogger(__name__)

PREPROCESS_GROWTH = 1.02  # a pre-processed model this much larger than its input is not used
TIMING_LIMIT_S = 14.0     # the timing of all candidates against the parent, session opening included (the
                          # phase, with its child process and loading, stays within 15 s)
TIMING_TRIALS = 8         # fresh sessions each; the race drops clearly slower candidates after trials 3 and 5
SCORE_THREADS = None      # scoring uses every core: onnxruntime's CPU kernels split the work, not the sums,
                          # so the outputs are the same bit for bit as on one thread (checked on float, QDQ, QOp)
CLEARLY_SLOWER = 1.5      # screening: this much slower than a candidate that met the budgets cannot be chosen
TIMING_RUNS = 100         # calls of each model a trial at most (the time limit usually stops it first)


class Quantizer:
    def __init__(self, artifact: Artifact, cfg: QuantizeConfig, ctx: PassContext):
        self.artifact, self.cfg, self.ctx = artifact, cfg, ctx
        self.mode = cfg.mode
        self.work = Path(tempfile.mkdtemp(prefix="optkit-quant-"))  # removed by __exit__ on every path
        self.strategy = strategy_for(cfg, self.work)
        self.candidates: list[Candidate] = []
        self.settings: dict[str, Any] = {}
        self.deadline = time.monotonic() + cfg.time_budget if cfg.time_budget else math.inf
        self.prepared = self.work / "prepared.onnx"
        self.float_model = None
        self.quantizable: list[str] = []  # "Conv x12": the ops of the mode the model holds
        self.parent = None
        self.specs: list = []
        self.out_names: list[str] = []
        self.checked: list[str] = []
        self.calib_feeds: dict | None = None
        self.check_feeds: dict = {}
        self.labels = None
        self.mask = None
        self.parent_outputs: list = []
        self.parent_accuracy: float | None = None
        self.budget = Budget.of(cfg)
        self.phases = {"build": 0.0, "score": 0.0, "time": 0.0}  # seconds spent in each phase of the search
        self.nothing_faster: str | None = None  # dynamic: the one line saying no op here gets faster

    def __enter__(self) -> Quantizer:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    # ------------------------------------------------------------ orchestration
    def execute(self) -> Path:
        try:
            return self._execute()
        finally:
            phases = {k: round(v, 3) for k, v in self.phases.items()}
            log.info("quantize search: %d candidates; build %.1f s, score %.1f s, timing %.1f s",
                     len(self.candidates), *self.phases.values())
            self.ctx.measurements["quantize"] = {"mode": self.mode, "settings": self.settings,
                                                 "candidates": [c.public() for c in self.candidates],
                                                 "phases_s": phases}

    @contextlib.contextmanager
    def _phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] += time.perf_counter() - start

    def _execute(self) -> Path:
        if self.mode == "fp16":
            require_extra("quantize", "quantize mode fp16")
        self._check_flags()
        model = onnx_io.load(self.artifact.path)
        already = graph.is_quantized(model)
        if already:
            raise UsageError(f"{self.artifact.path} is already quantized (it holds {', '.join(already)}); "
                             "quantize the float model instead")
        self._check_quantizable(model)
        self._prepare(model)
        self._load_data()
        self.settings.update(budget=self.budget.kind, budget_value=self.budget.value)
        space = self.strategy.space()
        tried = self._try_all(space) if self.cfg.latency_search else self._first_that_builds(space)
        if not any(c.passed for c in tried):
            best = self._best_settings(tried, 2)
            tried += self._try_all(self.strategy.slower_tier(best) if self.cfg.latency_search else [])
        if not any(c.passed for c in tried) and self.budget.fallback:
            tried += self._fallback(max(tried, key=self.budget.score))
        passing = [c for c in tried if c.passed]
        if not passing:
            raise self._refusal(tried)
        return self._finish(passing)

    def _try_all(self, space: list[Settings]) -> list[Candidate]:
        out = []
        for settings in space:
            if len(self.candidates) >= self.cfg.max_candidates or (self.candidates and time.monotonic() > self.deadline):
                if not self.settings.get("stopped"):
                    self.settings["stopped"] = (f"after {len(self.candidates)} candidates"
                                                + (" (time budget)" if time.monotonic() > self.deadline else ""))
                break
            twin = self._twin_missed(settings)
            if twin is not None:
                self.settings.setdefault("skipped", []).append(
                    {"variant": settings.label(), "why": f"the same arithmetic as candidate {twin.index} "
                                                        f"({twin.settings.label()}), which missed the budget"})
                log.info("skipped %s: its QDQ twin missed the budget", settings.label())
                continue
            out.append(self._candidate(settings))
        return out

    def _twin_missed(self, settings: Settings) -> Candidate | None:
        """A QOperator setting whose QDQ twin (same types, channels, range, calibration, float nodes) was scored
        and missed the budget: onnxruntime runs both on the same integer kernels, so the format changes speed,
        not the outputs (on EfficientNet-Lite1 the twins' cosines agree to 1e-5), and it cannot win."""
        if settings.format != "qoperator":
            return None
        twin = replace(settings, format="qdq")
        return next((c for c in self.candidates if c.settings == twin and c.fidelity is not None and not c.passed
                     and c.slower_than is None), None)  # a slower twin is no verdict: the format changes speed

    def _first_that_builds(self, space: list[Settings]) -> list[Candidate]:
        """Without the search: the first setting, or the next when onnxruntime cannot build it."""
        tried = []
        for settings in space[:4]:
            tried.append(self._candidate(settings))
            if not tried[-1].error:
                break
        return tried

    def _best_settings(self, tried: list[Candidate], n: int) -> list[Settings]:
        ok = [c for c in tried if not c.error]
        return [c.settings for c in sorted(ok, key=self.budget.score, reverse=True)[:n]]

    # ------------------------------------------------------------ checks up front
    def _check_flags(self) -> None:
        cfg, data = self.cfg, self.ctx.data
        Budget.check_flags(cfg, data)
        if cfg.metric:
            resolve_metric(cfg.metric)
            ev = data.get("eval")
            if ev is None:
                raise UsageError(f"metric {cfg.metric} (--metric) needs eval data (data.eval / --eval-data)")
            if ev.labels is None:
                raise UsageError(f"metric {cfg.metric} (--metric) needs labels, and {ev.source} has none "
                                 "(add a 'labels' array, or use max_fidelity_loss / --max-fidelity-loss)")
        if self.mode == "static" and data.get("calibration") is None and not cfg.synthetic_calibration:
            raise UsageError("static quantization needs calibration data (data.calibration / --calibration-data), or "
                             "synthetic_calibration (--synthetic-calibration) to calibrate on random inputs, which usually "
                             "costs accuracy")

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
            inits = {i.name for i in model.graph.initializer}
            k = qops.INT4_WEIGHT_INPUT
            present = [op for op in present if (qops.int4_gathers(model) if op == "Gather" else any(
                n.op_type == op and len(n.input) > k[op] and n.input[k[op]] in inits for n in model.graph.node))]
        self.quantizable = [f"{op} x{counts[op]}" for op in present]
        if not present:
            have = ", ".join(sorted(counts)) or "no ops"
            raise UsageError(f"nothing to quantize in {self.artifact.path} for mode {self.mode}: it has {have}; "
                             f"onnxruntime quantizes {', '.join(wanted)}"
                             + (" with constant weights" if self.mode == "int4" else "")
                             + ("; its ONNX-domain Attention stays float (onnxruntime quantizes com.microsoft's)"
                                if qops.contrib_lookalikes(model) else ""))

    # ------------------------------------------------------------ preparation
    def _prepare(self, model) -> None:
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
        if self.mode in ("static", "dynamic"):
            moved = graph.constants_to_initializers(model)
            if moved:
                ctx.note(f"moved {moved} Constant nodes into initializers (weights held as Constant nodes are not "
                         "quantized otherwise)")
        if isinstance(self.strategy, Int4):
            model = self._prepare_int4(model)
        raw = self.work / "float.onnx"
        onnx_io.save(model, raw)
        if cfg.preprocess and self.mode in ("static", "dynamic"):
            from onnxruntime.quantization.shape_inference import quant_pre_process

            quiet_ort()
            try:  # in our scratch folder: it writes <uuid>.data and sym_shape_infer_temp.onnx to the cwd
                with contextlib.chdir(self.work):
                    quant_pre_process(str(raw), str(self.prepared), skip_symbolic_shape=graph.has_subgraphs(model))
                m = onnx_io.load(self.prepared)
                graph.name_nodes(m)
                onnx_io.save(m, self.prepared)
                grown = os.path.getsize(self.prepared) / os.path.getsize(raw)
                if grown > PREPROCESS_GROWTH:  # constant folding copied weights into several subgraphs
                    ctx.note(f"pre-processing skipped: onnxruntime's graph optimization made the model {grown:.2f}x "
                             "larger (constants copied into subgraphs); quantizing the model as it is")
                    shutil.copyfile(raw, self.prepared)
                else:
                    ctx.note("pre-processed: shape inference and onnxruntime graph optimization before quantizing")
            except Exception as e:  # noqa: BLE001 - symbolic shape inference fails on some graphs
                ctx.note(f"pre-processing skipped ({first_line(e)[:120]}); quantizing the model as it is")
                shutil.copyfile(raw, self.prepared)
        else:
            shutil.copyfile(raw, self.prepared)
        if isinstance(self.strategy, Dynamic):
            self._prepare_dynamic()
        self.float_model = onnx_io.load(self.prepared)

    def _prepare_dynamic(self) -> None:
        """onnxruntime's dynamic quantizer has no integer Gemm: Linear layers exported as Gemm are rewritten as
        MatMul [+ Add] (after pre-processing, whose optimizer would fuse them back) so their weights can be
        quantized. Then the op types the search varies (Dynamic.tiers), and one line when the model holds nothing
        that dynamic INT8 makes faster."""
        cfg, ctx = self.cfg, self.ctx
        if "Gemm" not in cfg.op_types_exclude and (not cfg.op_types_include or "Gemm" in cfg.op_types_include):
            model = onnx_io.load(self.prepared)
            n = qops.gemm_to_matmul(model, exclude=set(cfg.nodes_exclude))
            if n:
                onnx_io.save(model, self.prepared)
                ctx.note(f"dynamic: rewrote {n} Gemm nodes as MatMul (+ Add) so their weights can be quantized "
                         "(onnxruntime's dynamic quantizer takes MatMul, not Gemm)")
        counts = qops.dynamic_ops(onnx_io.load(self.prepared))
        self.strategy.present = set(counts)
        if not cfg.op_types_include and not self._dynamic_fast_ops():
            slow = [f"{op} x{counts[op]}" for op in qops.DYNAMIC_SLOW if counts.get(op)]
            self.nothing_faster = (f"dynamic INT8: nothing in this model that it makes faster (no MatMul, Gemm, "
                                   f"Attention or LSTM); its {', '.join(slow)} can only get smaller"
                                   + (", and ConvInteger is usually slower than float Conv" if counts.get("Conv") else ""))
            ctx.note(self.nothing_faster)
            log.info("%s", self.nothing_faster)

    def _dynamic_fast_ops(self) -> list[str]:
        return [op for op in qops.DYNAMIC_FAST if op in self.strategy.present and op not in self.cfg.op_types_exclude]

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
            self.strategy.gathers = gathers
        return model

    def _load_data(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        self.parent = onnx_session.session(self.artifact.path, threads=SCORE_THREADS)
        self.specs = onnx_session.input_specs(self.parent, self.artifact.path)
        self.out_names = [o.name for o in self.parent.get_outputs()]
        self.checked = check_names(cfg.check_outputs, self.out_names)
        calib, ev = ctx.data.get("calibration"), ctx.data.get("eval")
        if self.mode == "static":
            if calib is not None:
                sub = calib.subset(cfg.calibration_size, ctx.seed)
                self.calib_feeds = sub.bind(self.specs, stream=True)  # read a call at a time by _reader
                self.settings["calibration"] = {"source": calib.source, "samples": len(sub)}
            else:
                n = min(cfg.calibration_size, 64) if stackable(self.specs) else 8
                self.calib_feeds = self._synthesized(n, ctx.seed)
                self.settings["calibration"] = {"source": "synthetic", "samples": n}
                ctx.warn(f"SYNTHETIC CALIBRATION: calibrated on {n} random inputs, not real data; activation "
                         "ranges may be wrong and accuracy may suffer. Give calibration data (data.calibration / --calibration-data) for a real result")
        source = ev if ev is not None else calib
        if source is not None:
            sub = source.subset(cfg.check_samples, ctx.seed + 1)
            self.check_feeds = trim(self.specs, sub.bind(self.specs))
            kept = count(self.check_feeds)
            self.labels = sub.labels[:kept] if source is ev and sub.labels is not None else None
            self.settings["check"] = {"source": source.source, "samples": kept, "of": len(source),
                                      "subset": kept < len(source)}
        else:
            n = min(cfg.check_samples or 32, 32)
            self.check_feeds = self._synthesized(n, ctx.seed + 1000)
            self.settings["check"] = {"source": "synthetic", "samples": n}
            ctx.note(f"checked against the parent on {n} synthesized inputs (no data given)")
        self.mask = attention_mask(self.specs, self.check_feeds,
                                   [onnx_session.spec_of(o) for o in self.parent.get_outputs()])
        try:
            self.parent_outputs = self._run(self.parent, self.check_feeds)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001  onnxruntime refuses the inputs: the model needs real ones
            given = "synthesized inputs" if source is None else source.source
            raise UsageError(f"{self.artifact.path} does not run on {given}: {first_line(e)[:200]}; give inputs "
                             "it accepts as eval data (data.eval / --eval-data; shapes / --shape for dynamic dims)") from None
        refuse_nonfinite_reference(self.artifact.path, self.parent_outputs, self.out_names, self.specs,
                                   self.check_feeds, "synthesized inputs" if source is None else source.source,
                                   only=None if cfg.metric else self.checked)
        self.parent_accuracy = self._accuracy(self.parent_outputs, self.labels) if cfg.metric else None

    def _synthesized(self, n: int, seed: int) -> dict:
        """n synthesized samples, one whole call each; dims nobody set are probed once."""
        names = self.out_names
        shapes, _ = probe(self.specs, lambda f: self.parent.run(names, f), self.ctx.shapes, self.ctx.values,
                          self.ctx.seed)
        return stack_samples([synthesize(self.specs, shapes, 1, seed + i, self.ctx.values) for i in range(n)])

    def _run(self, session, feeds: dict) -> list:
        return onnx_session.run_all(session, feeds, self.out_names)

    def _accuracy(self, outputs, labels) -> float:
        res = compute(self.cfg.metric, outputs, labels, self.out_names)
        return float(res.get(self.cfg.metric, next(iter(res.values()))))

    # ------------------------------------------------------------ one candidate
    def _candidate(self, settings: Settings) -> Candidate:
        cand = Candidate(index=len(self.candidates), settings=settings, path=self.work / f"cand{len(self.candidates)}.onnx")
        self.candidates.append(cand)
        raw = self.work / f"cand{cand.index}.raw.onnx"
        with self._phase("build"):
            if not self._build(cand, raw):
                return cand
        with self._phase("score"):
            self._score(cand)
        return cand

    def _build(self, cand: Candidate, raw: Path) -> bool:
        """Quantize with the candidate's settings and write it; False (cand.error set) when that fails."""
        settings = cand.settings
        exclude = sorted(set(self.cfg.nodes_exclude) | set(settings.float_nodes) | contrib_excludes(self.float_model))
        try:
            self.strategy.build(self.prepared, settings, raw, calibration=self._reader, exclude=exclude)
        except (UsageError, ValidationError):
            raise
        except Exception as e:  # noqa: BLE001 - onnxruntime cannot build this point of the space
            cand.error = f"onnxruntime could not quantize with {settings.label()}: {first_line(e)[:160]}"
            return False
        model = onnx_io.load(raw)
        if self.mode != "fp16" and not graph.is_quantized(model):
            if not settings.float_nodes:
                raise ValidationError(
                    f"nothing was quantized in {self.artifact.path} (mode {self.mode}): onnxruntime's quantizer left "
                    f"every node float ({', '.join(self.quantizable)}: their weights are not constants it can reach, "
                    "e.g. inside If subgraphs, or their inputs are not float); nothing was written")
            cand.error = "nothing was quantized (every quantizable node is kept float)"
            return False
        if self.cfg.compact:
            graph.compact(model)
        onnx_io.save(model, cand.path)
        cand.bytes = os.path.getsize(cand.path)
        cand.ratio = cand.bytes / self.artifact.size_bytes()
        return True

    def _score(self, cand: Candidate) -> None:
        """The candidate's figures against the parent's outputs (a subset first in the latency search), and
        whether it meets the budget."""
        try:
            sess = onnx_session.session(cand.path, threads=SCORE_THREADS)
        except UsageError as e:
            cand.error = e.message
            return
        n = count(self.check_feeds)
        screen = self._screen_size(n)
        if self.cfg.latency_search and screen:  # cheap first: a subset, then the whole set
            start = time.perf_counter()
            self._score_on(cand, sess, screen)
            cand.screen_s = time.perf_counter() - start
            if not cand.error and self.budget.hopeless(cand):
                cand.screened_out = True
                return
            winner = None if cand.error else self._clearly_faster_winner(cand, sess)
            if winner is not None:
                cand.slower_than = winner.index
                return
        self._score_on(cand, sess, n)
        cand.passed = self.budget.meets(cand)

    def _screen_size(self, n: int) -> int:
        """How many of the n check samples a candidate is screened on first (0: none). A fidelity loss past
        twice its budget shows on a quarter of the set (8 samples at least: a conv-heavy model's dynamic INT8 on
        32 synthesized inputs is refused after 8 each); an accuracy drop's noise margin is only useful on
        screen_samples, on a set at least twice that."""
        quarter = n if self.budget.on_accuracy else max(8, n // 4)
        screen = min(self.cfg.screen_samples, quarter)
        return screen if 2 * screen <= n else 0

    def _clearly_faster_winner(self, cand: Candidate, sess) -> Candidate | None:
        """A candidate that met every budget and runs the check data CLEARLY_SLOWER times faster than `cand`: then
        `cand` cannot be chosen and is not scored on the whole set (nor timed). Its screening run gives the first
        hint; interleaved repeats of one call of each confirm it (one run on a shared machine can be slow)."""
        if not self._speed_matters() or cand.screen_s is None:
            return None
        done = [c for c in self.candidates if c.passed and c.screen_s is not None and self.budget.fits(c)]
        if not done:
            return None
        best = min(done, key=lambda c: c.screen_s)
        if cand.screen_s < CLEARLY_SLOWER * best.screen_s:
            return None
        feeds = first_call(self.specs, self.check_feeds, fixed_batch(self.specs) or 8)
        mine, theirs = [], []
        try:
            other = onnx_session.session(best.path, threads=SCORE_THREADS)
            for _ in range(3):
                mine.append(_call_seconds(sess, feeds))
                theirs.append(_call_seconds(other, feeds))
        except Exception:  # noqa: BLE001 - no verdict on speed: it is scored like any other
            return None
        return best if min(mine) >= CLEARLY_SLOWER * min(theirs) else None

    def _score_on(self, cand: Candidate, sess, n: int) -> None:
        feeds = {k: v[:n] for k, v in self.check_feeds.items()}
        try:
            out = self._run(sess, feeds)
        except UsageError as e:
            cand.error = e.message
            return
        except Exception as e:  # noqa: BLE001 - a candidate onnxruntime loads but cannot run
            cand.error = f"the quantized model does not run: {first_line(e)[:160]}"
            return
        ref = [r[:n] if np.ndim(r) else r for r in self.parent_outputs]
        mask = self.mask.first(n) if self.mask is not None else None
        cand.fidelity = qops.fidelity(ref, out, self.out_names, mask=mask, only=self.checked)
        cand.checked_on = n
        if self.cfg.metric:
            labels = self.labels[:n] if self.labels is not None else None
            cand.accuracy = self._accuracy(out, labels)
            base = self.parent_accuracy if n == count(self.check_feeds) else self._accuracy(ref, labels)
            cand.accuracy_drop = (cand.accuracy - base if self.cfg.metric in LOWER_IS_BETTER
                                  else base - cand.accuracy)

    def _reader(self):
        """onnxruntime CalibrationDataReader over the calibration samples, in calls the model accepts."""
        return calibration_reader(self.specs, self.calib_feeds)

    # ------------------------------------------------------------ node fallback
    def _fallback(self, first: Candidate) -> list[Candidate]:
        ranked = self._rank(first)
        tried = []
        for k in _schedule(len(ranked), self.cfg.max_candidates - len(self.candidates)):
            cand = self._candidate(first.settings.with_float(name for name, _ in ranked[:k]))
            tried.append(cand)
            if cand.passed:
                break
        return tried

    def _rank(self, first: Candidate) -> list[tuple[str, float]]:
        """Nodes ranked by how much error they add: error of their outputs against the FP32 activations
        minus the error already on their inputs (measured on the fully quantized candidate)."""
        fmodel = self.float_model
        raw = self.work / f"cand{first.index}.raw.onnx"
        if not raw.exists():
            return []
        quantized = onnx_io.load(raw)
        qtensors = {o for n in graph.all_nodes(quantized.graph) for o in n.output}
        init = {i.name for i in fmodel.graph.initializer}
        nodes = [n for n in fmodel.graph.node if n.name not in self.cfg.nodes_exclude]
        tensors = sorted({o for n in nodes for o in n.output if o in qtensors})
        feeds = {k: v[:32] for k, v in self.check_feeds.items()}
        try:
            f_path, q_path = self.work / "f_dbg.onnx", self.work / "q_dbg.onnx"
            onnx_io.save(graph.with_outputs(fmodel, tensors), f_path)
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
        self.settings["sensitivity"] = [{"node": n, "added_error": round(s, 6)} for n, s in scores[:20]]
        return scores

    # ------------------------------------------------------------ choosing: size, speed
    def _finish(self, passing: list[Candidate]) -> Path:
        """Keep the fastest candidate that meets every budget (size included; Budget.pick breaks ties in the
        noise for accuracy, then size); refuse (exit 3) a static or dynamic INT8 result slower than its parent
        unless allowed."""
        pool = list(passing)
        if self._speed_matters() and self.mode == "static":
            pool += self._slow_conv_variant(min(passing, key=lambda c: c.bytes))
        fits = [c for c in pool if self.budget.fits(c)]
        if not fits:
            best = min(pool, key=lambda c: c.bytes)
            dest = keep_rejected(best, aside_path(self.ctx), "missed the size budget")
            raise ValidationError(
                f"no {self.mode} candidate met the size budget ({best.ratio:.3f}x of the parent at best, budget "
                f"{self.budget.max_size_ratio:g}x); the smallest was kept as {dest}",
                details={"candidates": [c.public() for c in self.candidates]})
        if self.cfg.measure_candidates and (len(fits) > 1 or self._speed_matters()):
            with self._phase("time"):
                self._time(fits)
        chosen = self.budget.pick(fits)
        chosen.chosen = True
        self.settings.update(chosen.settings.to_dict())
        self._say_chosen(chosen)
        if self._speed_matters():
            self._slower_check(chosen, fits)
        return chosen.path

    def _speed_matters(self) -> bool:
        return self.mode in ("static", "dynamic") and self.cfg.target == "cpu" and self.cfg.measure_candidates

    def _slow_conv_variant(self, cand: Candidate) -> list[Candidate]:
        """Conv nodes with <= 4 input channels per group (the first conv of an image model, depthwise convs)
        often run slower in int8 than in float; the variant that keeps them float is timed like the others."""
        inits = {i.name: i for i in self.float_model.graph.initializer}
        slow = []
        for n in self.float_model.graph.node:
            if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits:
                dims = list(inits[n.input[1]].dims)
                if len(dims) >= 3 and dims[1] <= 4 and n.name not in self.cfg.nodes_exclude + list(cand.float_nodes):
                    slow.append(n.name)
        if not slow or not self.cfg.latency_search or len(self.candidates) >= self.cfg.max_candidates:
            return []
        self.settings["int8_slow_nodes"] = slow
        variant = self._candidate(cand.settings.with_float([*cand.float_nodes, *slow]))
        return [variant] if variant.passed else []

    def _time(self, pool: list[Candidate]) -> None:
        """Each candidate against the FP32 parent at batch 1 on one thread, on the first call of the check data:
        measure.paired's one way of timing (call by call in one child process, fresh sessions each trial, the
        ratio with its 95% interval), all candidates in one run; one clearly slower than the best stops being
        timed after trial 3 or 5 (its figures are those of the trials it was in)."""
        feeds = first_call(self.specs, self.check_feeds, 1)
        settings = MeasureSettings(provider="cpu", threads=1, batch=1, warmup=10, runs=TIMING_RUNS)
        try:
            results = paired_latencies(self.artifact, [Artifact.load(str(c.path)) for c in pool], settings,
                                       trials=TIMING_TRIALS, data=feeds, limit_s=TIMING_LIMIT_S)
        except Exception as e:  # noqa: BLE001 - latency informs the choice; a failure must not hide the result
            self.ctx.note(f"candidate latency not measured: {first_line(e)}")
            return
        for c, r in zip(pool, results):
            c.p50_ms, c.latency_ratio, c.latency_ratio_ci95 = r["after"]["p50_ms"], r["ratio"], r["ratio_ci95"]
            c.latency_trials = r["trials"]
        longest = max(results, key=lambda r: r["trials"])
        self.settings.update(parent_p50_ms=longest["before"]["p50_ms"],
                             latency_settings=f"batch 1, 1 thread, paired with the parent call by call, up to "
                                              f"{TIMING_TRIALS} trials (clearly slower candidates dropped early)")

    def _slower_check(self, chosen: Candidate, pool: list[Candidate]) -> None:
        """Refused only when slower than max_latency_ratio beyond the timing noise (Budget.too_slow)."""
        cfg, ratio = self.cfg, chosen.latency_ratio
        if ratio is None:
            return
        lo, hi = chosen.latency_ratio_ci95
        slower = self.budget.too_slow(chosen)
        self.settings["speed"] = {"latency_ratio": ratio, "latency_ratio_ci95": [lo, hi],
                                  "max_latency_ratio": cfg.max_latency_ratio, "slower": slower}
        figures = (f"{ratio:.2f}x the parent's latency (95% CI {lo:.2f}-{hi:.2f}x) at batch 1 on one thread, "
                   f"p50 {chosen.p50_ms:.3f} ms vs {self.settings['parent_p50_ms']:.3f} ms")
        if not slower:
            inside = " - within the timing noise of the limit" if hi > cfg.max_latency_ratio else ""
            self.ctx.note(f"latency: {figures}{inside}; the fastest of {len(pool)} candidates that meet the "
                          "budgets (ties within the noise: the most accurate, then the smallest)")
            return
        tried = "; ".join(f"{c.settings.label()}: {c.latency_ratio:.2f}x" for c in pool if c.latency_ratio)
        # how it compares with the parent, said as the tables say it: "same" when the interval holds 1.0 (±3%)
        if lo > 1 + MIN_CHANGE:
            verdict = "SLOWER than its FP32 parent"
        elif hi < 1 - MIN_CHANGE:
            verdict = f"faster than its FP32 parent, but not {cfg.max_latency_ratio:g}x as fast"
        else:
            verdict = "no faster than its FP32 parent (the same within the noise)"
        why, instead = (self._dynamic_hint(chosen) if self.mode == "dynamic"
                        else ("int8 kernels do not pay off here", "or keep the model float"))
        msg = (f"{self.mode} INT8 is {verdict} on this CPU: {figures} (limit {cfg.max_latency_ratio:g}x; candidates: "
               f"{tried}); {why}")
        if cfg.allow_slower:
            self.ctx.warn(msg + "; written anyway (allow_slower / --allow-slower)")
            return
        dest = keep_rejected(chosen, aside_path(self.ctx), "slower than its parent")
        raise ValidationError(msg + f"; kept as {dest}. Set allow_slower (--allow-slower) to accept it (e.g. for size), "
                              f"{instead}", details={"candidates": [c.public() for c in self.candidates],
                                                     "rejected": str(dest)})

    def _dynamic_hint(self, chosen: Candidate) -> tuple[str, str]:
        """Why a dynamic INT8 result is slower, and what would help instead (never dynamic mode itself)."""
        ops = chosen.settings.op_types
        conv = "Conv" in ops if ops is not None else "Conv" in self.strategy.present
        fast = self._dynamic_fast_ops()
        if conv:
            why = "its Conv nodes run as ConvInteger, slower here than float Conv"
            kept = [c for c in self.candidates if "Conv" in c.settings.float_ops]
            timed = [c for c in kept if c.latency_ratio is not None]
            if timed:
                best = min(timed, key=lambda c: c.latency_ratio)
                why += f"; they were tried float too ({best.settings.label()}: {best.latency_ratio:.2f}x)"
            elif kept:
                why += f"; they were tried float too, and that missed the budget ({self._figures(kept[0])[:200]})"
            elif not fast:
                why += f" (the model has no {', '.join(qops.DYNAMIC_FAST[:3])} to quantize alone)"
            return why, ("or keep the model float; static INT8 (--mode static, with calibration data) runs Conv as "
                         "QLinearConv, usually faster than float")
        what = "/".join(op for op in (ops or fast) if op in qops.DYNAMIC_FAST) or "quantized"
        return f"its {what} int8 kernels do not pay off at these sizes here", "or keep the model float"

    # ------------------------------------------------------------ telling the user
    def _figures(self, cand: Candidate) -> str:
        if cand.error:
            return cand.error
        f = cand.fidelity
        s = f"cosine {f['cosine']:.4f} (loss {f['loss']:.4g}), max |diff| {f['max_abs_error']:.3g}"
        if f.get("top1_agreement") is not None:
            s += f", top-1 agreement {f['top1_agreement']:.3f}"
        if len(self.checked) < len(self.out_names):
            s += f" on {', '.join(self.checked)}"
        if cand.accuracy is not None:
            s += f", {self.cfg.metric} {cand.accuracy:.4f} (parent {self.parent_accuracy:.4f})"
        n = count(self.check_feeds)
        if cand.screened_out and cand.checked_on < n:
            s += f" on the {cand.checked_on} of {n} samples it was screened on"
        return s + f"; budget: {self.budget}"

    def _say_chosen(self, cand: Candidate) -> None:
        ctx, s = self.ctx, cand.settings
        if self.mode in ("static", "dynamic"):
            ctx.note(f"{self.mode} INT8: {s.label()}"
                     + (", symmetric for TensorRT (zero points 0, float bias)" if self.cfg.target == "tensorrt" else "")
                     + (f", chosen from {len(self.candidates)} candidates measured on this machine"
                        if len(self.candidates) > 1 else ""))
        check = self.settings["check"]
        where = f"{check['samples']} {check['source']} inputs"
        ctx.note(f"checked against the parent on {where}: {self._figures(cand)}")
        if check.get("subset"):
            noise = self.budget.noise(check["samples"], self.parent_accuracy)
            ctx.note(f"judged on {check['samples']} of {check['of']} samples (check_samples / --check-samples): "
                     f"{self.budget.kind} is known to about +-{noise:.3g} (95%)"
                     + (" - the verdict is inside that noise" if abs(self.budget.margin(cand)) < noise else ""))
        slow = set(self.settings.get("int8_slow_nodes") or ())
        sensitive = [n for n in cand.float_nodes if n not in slow]
        if sensitive:
            ctx.note(f"kept {len(sensitive)} sensitive nodes in float: {', '.join(sensitive)}")
        if len(sensitive) < len(cand.float_nodes):
            ctx.note(f"kept {len(cand.float_nodes) - len(sensitive)} small-channel Conv nodes in float (their int8 "
                     f"kernels were slower here): {', '.join(n for n in cand.float_nodes if n in slow)}")
        slow = [c for c in self.candidates if c.slower_than is not None]
        if slow:
            ctx.note(f"{len(slow)} candidates not scored on the whole set nor timed: on the screening subset they ran "
                     f"at least {CLEARLY_SLOWER:g}x slower than one that met the budgets ("
                     + ", ".join(f"{c.settings.label()}: slower than #{c.slower_than}" for c in slow) + ")")
        if self.settings.get("skipped"):
            ctx.note(f"skipped {len(self.settings['skipped'])} QOperator settings whose QDQ twin missed the budget "
                     "(the same integer kernels: the format changes speed, not the outputs)")
        if self.settings.get("stopped"):
            ctx.note(f"the search stopped {self.settings['stopped']} (max_candidates / --max-candidates, time_budget / --time-budget)")

    def _refusal(self, tried: list[Candidate]) -> ValidationError:
        """No candidate met the budget: the best one is kept as REJECTED and the error says why."""
        scored = [c for c in tried if not c.error]
        if not scored:
            errors = sorted({c.error for c in tried})
            if len(tried) == 1:
                return ValidationError(f"onnxruntime's {self.mode} quantizer wrote a model onnxruntime cannot "
                                       f"load ({errors[0]}); nothing was written. Keep the failing node types "
                                       "float with op_types_exclude (--exclude-op)", details={"candidates": [c.public() for c in tried]})
            return ValidationError(f"no {self.mode} candidate could be built or run ({'; '.join(errors)[:300]}); "
                                   "nothing was written", details={"candidates": [c.public() for c in tried]})
        best = max(scored, key=self.budget.score)
        if not self.budget.fallback:  # no budget asked for: nothing is written, not even the best
            of = f" (the best of {len(scored)} settings tried)" if len(scored) > 1 else ""
            return ValidationError(
                f"{self.mode} quantization moved the outputs past the tolerance: {self._figures(best)}{of}; "
                f"the model was not written. Rerun with fallback (--fallback) to keep the most sensitive nodes in float, "
                f"or loosen tolerance (--tolerance)" + self._static_instead(), details={"candidates": [c.public() for c in self.candidates]})
        dest = keep_rejected(best, aside_path(self.ctx), f"missed the {self.budget.kind} budget")
        return ValidationError(
            f"no {self.mode} candidate met the budget ({self.budget.kind} {self.budget.value:g}) after {len(tried)} tries; "
            f"the best ({best.settings.label()}, {len(best.float_nodes)} nodes in float: {self._figures(best)}) "
            f"was kept as {dest}" + self._static_instead(), details={"candidates": [c.public() for c in self.candidates],
                                                                     "rejected": str(dest)})

    def _static_instead(self) -> str:
        """Dynamic mode on a model it cannot make faster (Conv only): say so, and what suits it."""
        if self.nothing_faster is None or "Conv" not in self.strategy.present:
            return ""
        return ("; nothing here gets faster in dynamic INT8 anyway (no MatMul, Gemm, Attention or LSTM; ConvInteger is "
                "usually slower than float Conv): static INT8 (--mode static, with calibration data) suits this model")


def _call_seconds(sess, feeds: dict) -> float:
    start = time.perf_counter()
    sess.run(None, feeds)
    return time.perf_counter() - start


def _schedule(n: int, budget: int) -> list[int]:
    """How many nodes to keep in float at each step: 1, 2, 4, ... then all ranked nodes."""
    steps, k = [], 1
    while k < n and len(steps) < budget - 1:
        steps.append(k)
        k *= 2
    if n and len(steps) < budget:
        steps.append(n)
    return steps

