"""optkit quantize MODEL -o OUT --mode dynamic|static|fp16|int4"""
from __future__ import annotations

from pathlib import Path

import typer

from optkit.cli import common, flags, options
from optkit.core import strictjson
from optkit.core.atomic import python_file
from optkit.core.errors import UsageError, ValidationError


@flags.pass_options("quantize.onnx")
@flags.groups("calibration_data", "eval", "text", "runtime", "measure", "output", "print_recipe")
def quantize_cmd(
    model: str = typer.Argument(..., help="ONNX model (float32)."),
    output: str = options.output_file("Where to write the quantized model (ONNX; an OpenVINO IR NAME.xml + "
                                      "NAME.bin when it ends in .xml)."),
    *, config: dict, shared: options.Shared,
) -> None:
    """Quantize an ONNX model, checked against its parent; accuracy-aware with a budget."""
    from optkit.measure.model import DataSpec
    from optkit.passes.quantize.candidates import check_rejected_path, rejected_path

    inputs = common.inputs_of(shared, {"MODEL": model, "--metric": python_file(config.get("metric"))})
    common.guard_outputs({"-o": output, "--report": shared.report}, inputs)
    check_rejected_path(rejected_path(Path(output)), inputs=list(inputs.values()))
    mode = config.get("mode", flags.default("quantize.onnx", "mode"))
    if mode not in ("dynamic", "static", "fp16", "int4"):
        raise UsageError(f"unknown --mode {mode!r}; choose dynamic, static, fp16 or int4")
    config["mode"] = mode
    if shared.runtime is not None:  # built, scored and timed where it will run; measured there too
        config["runtime"] = shared.runtime
    to_ir = output.lower().endswith(".xml")
    if to_ir and shared.runtime != "openvino":
        raise UsageError(f"-o {output}: an OpenVINO IR is written for --runtime openvino; add it (candidates are then "
                         "judged on OpenVINO) or give -o NAME.onnx")
    settings = shared.settings(check_outputs=config.get("check_outputs", []))
    data = {"calibration": shared.item(shared.calibration_data)} if shared.calibration_data else {}
    spec = DataSpec(path=shared.eval_data, labels=shared.labels, max_samples=shared.max_samples, **shared.text()) \
        if shared.eval_data else None
    run_and_explain(f"quantize.onnx-{mode}", model, output, config, settings=settings,
                    command=f"optkit quantize {model} --mode {mode}", eval_data=spec, metric=config.get("metric"),
                    report_path=shared.report, as_json=shared.as_json, data=data, print_recipe=shared.print_recipe,
                    then=[{"pass": "convert.openvino"}] if to_ir else None)


def run_and_explain(pass_name, model, output, config, *, as_json, **kwargs):
    """run_single_stage, plus: the candidate table when a search ran, and the trade-off table on failure."""
    
    try:
        report = common.run_single_stage(pass_name, model, output, config, as_json=as_json, **kwargs)
        if report is None:  # --print-recipe: printed, nothing ran
            return
    except ValidationError as e:
        cands = e.details.get("candidates")
        if cands:
            if as_json:
                common.print_json(strictjson.dumps({"error": e.message, "candidates": cands}, indent=2, nulls=True))
            else:
                print_candidates(cands, title="candidates (none met the budget)")
        raise
    stage = next((s for s in report.stages if "quantize" in s.measurements), report.stages[-1])
    cands = (stage.measurements.get("quantize") or {}).get("candidates") or []
    if len(cands) > 1 and not as_json and common.STATE.verbose:  # the search's reasoning: -v (and the reports)
        print_candidates(cands, title="candidates tried")
    if len(report.stages) >= 2 and not as_json:
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
    # a budget at a confidence is judged on the drop's upper bound: the column shows that figure, not the point
    bounded = any(c.get("drop_bound") is not None for c in cands)
    for col in ("#", "settings", "size", "latency", "drop bound" if bounded else "drop", "cosine", "verdict"):
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
            _drop(c, bounded),
            f"{fid['cosine']:.5f}" if "cosine" in fid else "-", verdict)
    common.console().print(table)


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize_cmd)


def _drop(c: dict, bounded: bool) -> str:
    """The drop a candidate was judged on: its upper bound where the budget has a confidence and the bound is
    known (a candidate screened on a subset has its measured drop only), else the measured drop."""
    if "accuracy_drop" not in c:
        return "-"
    if bounded and c.get("drop_bound") is not None:
        return f"{max(c['drop_bound'], c['accuracy_drop']):+.4f}"
    return f"{c['accuracy_drop']:+.4f}"
