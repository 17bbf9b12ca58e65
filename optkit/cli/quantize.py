"""optkit quantize MODEL -o OUT --mode dynamic|static|fp16|int4"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from optkit.cli import common, options
from optkit.core.errors import UsageError, ValidationError
from optkit.core.shapes import parse_shapes, parse_values


def register(app: typer.Typer) -> None:
    @app.command("quantize")
    def quantize_cmd(
        model: str = typer.Argument(..., help="ONNX model (float32)."),
        output: str = typer.Option(..., "-o", "--output", help="Where to write the quantized model."),
        mode: str = typer.Option("static", "--mode", help="dynamic, static, fp16 or int4."),
        calibration_data: Optional[str] = typer.Option(None, "--calibration-data",
                                                       help="Inputs for static calibration (.npz, images, IDX)."),
        calibration_size: Optional[int] = typer.Option(None, "--calibration-size", min=1,
                                                       help="Calibration samples (default 256)."),
        calibration_method: Optional[str] = typer.Option(None, "--calibration-method",
                                                         help="minmax, entropy or percentile (default: minmax, then "
                                                              "the others when minmax misses the budget)."),
        synthetic_calibration: bool = typer.Option(False, "--synthetic-calibration",
                                                   help="Calibrate on random inputs (warned loudly)."),
        fmt: str = typer.Option("auto", "--format",
                                help="Static INT8 format: auto (both searched, the fastest within budgets kept), "
                                     "qdq or qoperator."),
        target: str = typer.Option("cpu", "--target",
                                   help="cpu (onnxruntime, latency-aware) or tensorrt (symmetric int8 QDQ, zero points "
                                        "0, float bias: what TensorRT builds)."),
        max_size_ratio: Optional[float] = typer.Option(None, "--max-size-ratio", min=0,
                                                       help="Budget: output size / input size (e.g. 0.3)."),
        allow_slower: bool = typer.Option(False, "--allow-slower",
                                          help="Static INT8: write the result even when it is slower than its parent "
                                               "(otherwise exit 3, the model kept as .REJECTED.onnx)."),
        max_latency_ratio: Optional[float] = typer.Option(None, "--max-latency-ratio", min=0,
                                                          help="Static INT8: slower means p50 (batch 1, 1 thread) "
                                                               "above this x the parent's beyond the timing noise "
                                                               "(default 1.05)."),
        no_latency_search: bool = typer.Option(False, "--no-latency-search",
                                               help="Build only the first setting (no search over formats, types, "
                                                    "per-channel, reduce-range, calibration)."),
        per_channel: Optional[bool] = typer.Option(None, "--per-channel/--per-tensor",
                                                   help="Per-channel weights (default: both searched)."),
        reduce_range: Optional[bool] = typer.Option(None, "--reduce-range/--no-reduce-range",
                                                    help="7-bit weights (default: both searched)."),
        activation_type: str = typer.Option("auto", "--activation-type",
                                            help="auto (both searched), uint8 or int8."),
        weight_type: str = typer.Option("int8", "--weight-type", help="int8 or uint8."),
        include_nodes: Optional[list[str]] = typer.Option(None, "--include-node", help="Quantize only these nodes."),
        exclude_nodes: Optional[list[str]] = typer.Option(None, "--exclude-node", help="Keep these nodes float."),
        include_ops: Optional[list[str]] = typer.Option(None, "--include-op", help="Quantize only these op types."),
        exclude_ops: Optional[list[str]] = typer.Option(None, "--exclude-op", help="Keep these op types float."),
        no_preprocess: bool = typer.Option(False, "--no-preprocess", help="Skip shape inference + optimization."),
        keep_io_types: bool = typer.Option(True, "--keep-io-types/--fp16-io", help="fp16: keep float32 inputs/outputs."),
        block_size: int = typer.Option(32, "--block-size", min=16, help="int4: weights per scale."),
        eval_data: Optional[str] = typer.Option(None, "--eval-data", help="Data to check and evaluate on."),
        labels: Optional[str] = typer.Option(None, "--labels", help="IDX labels for --eval-data (default: beside)."),
        max_samples: Optional[int] = typer.Option(None, "--max-samples", min=1,
                                                  help="Evaluate on a deterministic subset of --eval-data."),
        metric: Optional[str] = typer.Option(None, "--metric", help="top1, top5, mse, mae, cosine or module:fn."),
        max_accuracy_drop: Optional[float] = typer.Option(None, "--max-accuracy-drop", min=0,
                                                          help="Budget: metric drop (0.01 = 1 point)."),
        max_fidelity_loss: Optional[float] = typer.Option(None, "--max-fidelity-loss", min=0,
                                                          help="Budget: 1 - cosine to the FP32 outputs."),
        tolerance: Optional[float] = typer.Option(None, "--tolerance", min=0,
                                                  help="The check's fidelity budget (default per mode)."),
        fallback: bool = typer.Option(False, "--fallback",
                                      help="When the check fails, keep sensitive nodes in float until it holds."),
        max_candidates: Optional[int] = typer.Option(None, "--max-candidates", min=1,
                                                     help="Candidates the search may try (default 20)."),
        time_budget: Optional[float] = typer.Option(None, "--time-budget", min=1,
                                                    help="Seconds the search may take (default 600)."),
        check_samples: Optional[int] = typer.Option(None, "--check-samples", min=1,
                                                    help="Judge budgets on this many eval samples (default: all; "
                                                         "a subset is reported with its sampling noise)."),
        check_output: Optional[list[str]] = typer.Option(None, "--check-output",
                                                         help="Budgets judge this output only (repeatable; "
                                                              "default: every output)."),
        threads: Optional[int] = options.THREADS,
        shape: Optional[list[str]] = options.SHAPE,
        value: Optional[list[str]] = options.VALUE,
        report: Optional[str] = options.OUTPUT_REPORT,
        as_json: bool = options.JSON,
        print_recipe: bool = options.PRINT_RECIPE,
    ) -> None:
        """Quantize an ONNX model, checked against its parent; accuracy-aware with a budget."""
        from optkit.measure.model import DataSpec, MeasureSettings
        from optkit.passes.quantize.candidates import check_rejected_path, rejected_path

        common.guard_outputs({"-o": output, "--report": report}, [model, calibration_data, eval_data, labels])
        check_rejected_path(rejected_path(Path(output)), inputs=[model, calibration_data, eval_data, labels])
        if mode not in ("dynamic", "static", "fp16", "int4"):
            raise UsageError(f"unknown --mode {mode!r}; choose dynamic, static, fp16 or int4")
        settings = MeasureSettings(threads=threads, shapes=parse_shapes(shape), values=parse_values(value),
                                   check_outputs=check_output or [])
        data = {"calibration": calibration_data} if calibration_data else {}
        spec = DataSpec(path=eval_data, labels=labels, max_samples=max_samples) if eval_data else None
        config = dict(
            mode=mode, format=fmt, target=target, max_size_ratio=max_size_ratio, allow_slower=allow_slower,
            max_latency_ratio=max_latency_ratio, latency_search=not no_latency_search, per_channel=per_channel, reduce_range=reduce_range,
            activation_type=activation_type, weight_type=weight_type, calibration_method=calibration_method,
            calibration_size=calibration_size, synthetic_calibration=synthetic_calibration,
            preprocess=not no_preprocess, nodes_include=include_nodes or [], nodes_exclude=exclude_nodes or [],
            op_types_include=include_ops or [], op_types_exclude=exclude_ops or [], keep_io_types=keep_io_types,
            block_size=block_size, metric=metric, max_accuracy_drop=max_accuracy_drop,
            max_fidelity_loss=max_fidelity_loss, tolerance=tolerance, fallback=fallback,
            max_candidates=max_candidates, time_budget=time_budget, check_samples=check_samples,
            check_outputs=check_output or [],
        )
        config = {k: v for k, v in config.items() if v is not None}  # unset: the pass's own default
        run_and_explain(f"quantize.onnx-{mode}", model, output, config, settings=settings,
                        command=f"optkit quantize {model} --mode {mode}",
                        eval_data=spec, metric=metric, report_path=report, as_json=as_json, data=data,
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
                                   f"this small on this CPU; consider keeping it float or --mode fp16/dynamic")
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
                                                    "screened" if c.get("screened_out") else "FAIL")
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
