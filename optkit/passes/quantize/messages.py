"""What the quantize search tells the user: a candidate's figures against its budget, the notes on the chosen
candidate, the refusal when no candidate met the budget, and why a slower INT8 result is slower."""
from __future__ import annotations

from optkit.core.errors import ValidationError
from optkit.core.registry import PassContext
from optkit.measure.textmetrics import paired_bootstrap
from optkit.passes.quantize import ops as qops
from optkit.passes.quantize.budget import Budget
from optkit.passes.quantize.candidates import Candidate, aside_path, keep_rejected
from optkit.passes.quantize.config import QuantizeConfig
from optkit.passes.quantize.engine import Strategy
from optkit.passes.quantize.prepare import Reference, dynamic_fast_ops
from optkit.passes.quantize.score import CLEARLY_SLOWER


class Teller:
    """`settings` and `candidates` are the search's own (read as they are when a message is made);
    `nothing_faster`: prepare's line saying nothing here gets faster in dynamic INT8, or None."""

    def __init__(self, cfg: QuantizeConfig, budget: Budget, ref: Reference, ctx: PassContext, settings: dict,
                 candidates: list[Candidate], strategy: Strategy, nothing_faster: str | None = None):
        self.cfg, self.mode, self.budget, self.ref, self.ctx = cfg, cfg.mode, budget, ref, ctx
        self.settings, self.candidates, self.strategy, self.nothing_faster = settings, candidates, strategy, nothing_faster

    def figures(self, cand: Candidate) -> str:
        if cand.error:
            return cand.error
        f, ref = cand.fidelity, self.ref
        s = f"cosine {f['cosine']:.4f} (loss {f['loss']:.4g}), max |diff| {f['max_abs_error']:.3g}"
        if f.get("top1_agreement") is not None:
            s += f", top-1 agreement {f['top1_agreement']:.3f}"
        if len(ref.checked) < len(ref.out_names):
            s += f" on {', '.join(ref.checked)}"
        if cand.accuracy is not None:
            s += f", {self.cfg.metric} {cand.accuracy:.4f} (parent {ref.parent_accuracy:.4f})"
            if cand.drop_bound is not None:
                s += (f", drop {cand.accuracy_drop:.4f} (one-sided {self.budget.confidence:.0%} upper bound "
                      f"{cand.drop_bound:.4f})")
        n = ref.samples
        if cand.screened_out and cand.checked_on < n:
            s += f" on the {cand.checked_on} of {n} samples it was screened on"
        return s + f"; budget: {self.budget}"

    def drop_noise(self, cand: Candidate, n: int) -> float:
        """The 95% noise of the candidate's metric drop: half the paired bootstrap interval for a metric with no
        per-sample loss (measure.textmetrics), else the sampling noise of a proportion (Budget.noise)."""
        if cand.rows is not None and self.ref.parent_rows is not None and cand.rows.n == self.ref.parent_rows.n:
            lo, hi = paired_bootstrap(self.ref.parent_rows, cand.rows)
            return (hi - lo) / 2
        return self.budget.noise(n, self.ref.parent_accuracy)

    def say_chosen(self, cand: Candidate) -> None:
        ctx, s = self.ctx, cand.settings
        if self.mode in ("static", "dynamic"):
            ctx.note(f"{self.mode} INT8: {s.label()}"
                     + (", symmetric for TensorRT (zero points 0, float bias)" if self.cfg.target == "tensorrt" else "")
                     + (f", chosen from {len(self.candidates)} candidates measured on this machine"
                        if len(self.candidates) > 1 else ""), brief=True)
        check = self.settings["check"]
        where = f"{check['samples']} {check['source']} inputs"
        ctx.note(f"checked against the parent on {where}: {self.figures(cand)}",
                 brief=self.mode not in ("static", "dynamic"))
        if check.get("subset"):
            noise = self.drop_noise(cand, check["samples"])
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
        skipped = self.settings.get("skipped", [])
        twins = [s for s in skipped if s.get("rule") != "kernels"]
        if twins:
            ctx.note(f"skipped {len(twins)} QOperator settings whose QDQ twin missed the budget "
                     "(the same integer kernels: the format changes speed, not the outputs)")
        by_table = [s for s in skipped if s.get("rule") == "kernels"]
        if by_table:  # kernels.py: this CPU's int8 kernels against float, per shape class
            ctx.note(f"skipped {len(by_table)} settings this CPU's kernel table says cannot win ("
                     + "; ".join(dict.fromkeys(s["why"] for s in by_table)) + "); full_search (--full-search) "
                     "builds them" + (", and they were built since no other met the budgets"
                                      if self.settings.get("skipped_tried") else ""))
        if self.settings.get("stopped"):
            ctx.note(f"the search stopped {self.settings['stopped']} (max_candidates / --max-candidates, time_budget / --time-budget)")

    def refusal(self, tried: list[Candidate]) -> ValidationError:
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
                f"{self.mode} quantization moved the outputs past the tolerance: {self.figures(best)}{of}; "
                f"the model was not written. Rerun with fallback (--fallback) to keep the most sensitive nodes in float, "
                f"or loosen tolerance (--tolerance)" + self.static_instead(), details={"candidates": [c.public() for c in self.candidates]})
        dest = keep_rejected(best, aside_path(self.ctx), f"missed the {self.budget.kind} budget")
        return ValidationError(
            f"no {self.mode} candidate met the budget ({self.budget.kind} {self.budget.value:g}) after {len(tried)} tries; "
            f"the best ({best.settings.label()}, {len(best.float_nodes)} nodes in float: {self.figures(best)}) "
            f"was kept as {dest}" + self.static_instead(), details={"candidates": [c.public() for c in self.candidates],
                                                                    "rejected": str(dest)})

    def static_instead(self) -> str:
        """Dynamic mode on a model it cannot make faster (Conv only): say so, and what suits it."""
        if self.nothing_faster is None or "Conv" not in self.strategy.present:
            return ""
        return ("; nothing here gets faster in dynamic INT8 anyway (no MatMul, Gemm, Attention or LSTM; ConvInteger is "
                "usually slower than float Conv): static INT8 (--mode static, with calibration data) suits this model")

    def slower_hint(self, chosen: Candidate) -> tuple[str, str]:
        """Why an INT8 result is slower than its parent, and what would help instead (choose.Chooser.check_speed)."""
        if self.mode == "dynamic":
            return self.dynamic_hint(chosen)
        return "int8 kernels do not pay off here", "or keep the model float"

    def dynamic_hint(self, chosen: Candidate) -> tuple[str, str]:
        """Why a dynamic INT8 result is slower, and what would help instead (never dynamic mode itself)."""
        ops = chosen.settings.op_types
        conv = "Conv" in ops if ops is not None else "Conv" in self.strategy.present
        fast = dynamic_fast_ops(self.strategy, self.cfg)
        if conv:
            why = "its Conv nodes run as ConvInteger, slower here than float Conv"
            kept = [c for c in self.candidates if "Conv" in c.settings.float_ops]
            timed = [c for c in kept if c.latency_ratio is not None]
            if timed:
                best = min(timed, key=lambda c: c.latency_ratio)
                why += f"; they were tried float too ({best.settings.label()}: {best.latency_ratio:.2f}x)"
            elif kept:
                why += f"; they were tried float too, and that missed the budget ({self.figures(kept[0])[:200]})"
            elif not fast:
                why += f" (the model has no {', '.join(qops.DYNAMIC_FAST[:3])} to quantize alone)"
            return why, ("or keep the model float; static INT8 (--mode static, with calibration data) runs Conv as "
                         "QLinearConv, usually faster than float Conv")
        what = "/".join(op for op in (ops or fast) if op in qops.DYNAMIC_FAST) or "quantized"
        return f"its {what} int8 kernels do not pay off at these sizes here", "or keep the model float"
