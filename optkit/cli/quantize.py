"""optkit quantize MODEL -o OUT --mode dynamic|static|fp16|int4"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core.errors import UsageError, ValidationError
from optkit.core.shapes import parse_shapes, parse_values


def register(app: typer.Typer) -> None:
    @app.command("quantize")
    @flags.pass_options("quantize.onnx")
    def quantize_cmd(
        model: str = typer.Argument(..., help="ONNX model (float32)."),
        output: str = typer.Option(..., "-o", "--output", help="Where to write the quantized model."),
        calibration_data: Optional[str] = options.CALIBRATION_DATA,
        eval_data: Optional[str] = options.EVAL_DATA,
        labels: Optional[str] = options.LABELS,
        max_samples: Optional[int] = options.MAX_SAMPLES,
        threads: Optional[int] = options.THREADS,
        shape: Optional[list[str]] = options.SHAPE,
        value: Optional[list[str]] = options.VALUE,
        report: Optional[str] = options.OUTPUT_REPORT,
        as_json: bool = options.JSON,
        print_recipe: bool = options.PRINT_RECIPE,
        *,
        config: dict,
    ) -> None:
        """Quantize an ONNX model, checked against its parent; accuracy-aware with a budget."""
        from optkit.measure.model import DataSpec, MeasureSettings
        from optkit.passes.quantize.candidates import check_rejected_path, rejected_path

        common.guard_outputs({"-o": output, "--report": report}, [model, calibration_data, eval_data, labels])
        check_rejected_path(rejected_path(Path(output)), inputs=[model, calibration_data, eval_data, labels])
        mode = config.get("mode", flags.default("quantize.onnx", "mode"))
        if mode not in ("dynamic", "static", "fp16", "int4"):
            raise UsageError(f"unknown --mode {mode!r}; choose dynamic, static, fp16 or int4")
        config["mode"] = mode
        settings = MeasureSettings(threads=threads, shapes=parse_shapes(shape), values=parse_values(value),
                                   check_outputs=config.get("check_outputs", []))
        data = {"calibration": calibration_data} if calibration_data else {}
        spec = DataSpec(path=eval_data, labels=labels, max_samples=max_samples) if eval_data else None
        run_and_explain(f"quantize.onnx-{mode}", model, output, config, settings=settings,
                        command=f"optkit quantize {model} --mode {mode}",
                        eval_data=spec, metric=config.get("metric"), report_path=report, as_json=as_json, data=data,
                        print_recipe=print_recipe)


def run_and_explain(pass_name, model, output, config, *, as_json, **kwargs):
    """run_single_stage, plus: the candidate table when a search ran, and the trade-off table on failure."""
    import json

    try:
        report = common.run_single_stage(pass_name, model, output, config, as_json=as_json, **kwargs)
        if report is None:  # --print-recipe: printed, nothing ran
            return
    except ValidationError as e:
        cands = e.details.get("candidates")
        if cands:
            if as_json:
                common.print_json(json.dumps({"error": e.message, "candidates": cands}, indent=2))
            else:
                print_candidates(cands, title="candidates (none met the budget)")
        raise
    stage = report.stages[-1]
    cands = (stage.measurements.get("quantize") or {}).get("candidates") or []
    if len(cands) > 1 and not as_json:
        print_candidates(cands, title="candidates tried")
    if len(report.stages) == 2 and not as_json:
        a = (report.stages[0].measurements.get("latency") or {}).get("p50_ms")
        b = (stage.measurements.get("latency") or {}).get("p50_ms")
        change = stage.measurements.get("latency_change") or {}
        if a and b and change.get("significant") and change.get("ratio", 0) > 1:
            from rich.text import Text

            common.console().print(Text("warning", "bold yellow"), f"the result is slower than its parent "
                                   f"(p50 {b:.3f} ms vs {a:.3f} ms): int8 kernels do not pay off on a model "
                                   f"this small on this CPU; consider keeping it float"
                                   + "".join(f" or --mode {m}" for m in ("fp16", "dynamic") if not pass_name.endswith(m)))
    return report


def print_candidates(cands, title: str) -> None:
    """One row per candidate, within 80 columns: settings (+ nodes kept float), size and latency against the
    parent, accuracy drop or cosine, verdict."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("#", "settings", "size", "latency", "drop", "cosine", "verdict"):
        table.add_column(col, no_wrap=True)
    for c in cands:
        fid = c.get("fidelity") or {}
        verdict = "chosen" if c.get("chosen") else ("pass" if c.get("passed") else
                                                    "screened" if c.get("screened_out") else
                                                    f"slower than #{c['slower_than']}" if "slower_than" in c else "FAIL")
        if c.get("error"):
            verdict = "error"
        if c.get("rejected_file"):
            verdict = "best (REJECTED)"
        floats = len(c.get("float_nodes") or [])
        table.add_row(
            str(c.get("index")), str(c.get("variant") or "-") + (f" +{floats} float" if floats else ""),
            f"{c['ratio']:.2f}x" if c.get("ratio") else "-",
            f"{c['latency_ratio']:.2f}x" if c.get("latency_ratio") else "-",
            f"{c['accuracy_drop']:+.4f}" if "accuracy_drop" in c else "-",
            f"{fid['cosine']:.5f}" if "cosine" in fid else "-", verdict)
    common.console().print(table)
