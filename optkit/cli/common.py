"""What every command shares: error handling and exit codes, output, shared options."""
from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from typing import Optional

import typer

from optkit.core.atomic import check_output_path
from optkit.core.errors import EXIT_INTERRUPTED, EXIT_PASS, OptkitError


@dataclass
class _State:
    debug: bool = False


STATE = _State()


def run_app(app) -> int:
    """Run the typer app and turn every outcome into an exit code and at most one error line."""
    try:
        app(standalone_mode=False)
        return 0
    except OptkitError as e:
        if STATE.debug:
            traceback.print_exc()
            if "traceback" in e.details:
                print(e.details["traceback"], file=sys.stderr)
        print(f"error: {e.message}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    except Exception as e:  # click usage errors (typer vendors click in newer releases) and internal errors
        if type(e).__name__ == "Abort":
            print("interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        if hasattr(e, "show") and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            return e.exit_code
        if STATE.debug:
            traceback.print_exc()
        print(f"error: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_PASS


def console():
    from rich.console import Console

    return Console(stderr=False, highlight=False)


def print_json(text: str) -> None:
    sys.stdout.write(text.rstrip() + "\n")


# Shared option declarations, so every command spells them the same way.
JSON = typer.Option(False, "--json", help="Print the result as JSON instead of a table.")
SHAPE = typer.Option(None, "--shape", help="Input shape for dynamic dims: name=1x3x224x224 (repeatable).")
THREADS = typer.Option(None, "--threads", min=1, help="Intra-op threads (default: the runtime's).")
PROVIDER = typer.Option("cpu", "--provider", help="onnxruntime provider: cpu, cuda, tensorrt (ONNX models).")
WEIGHTS = typer.Option(None, "--weights", help="State dict for a factory model (loaded with weights_only=True).")
OUTPUT_REPORT = typer.Option(None, "--report", help="Also write the JSON report to this file.")
PRINT_RECIPE = typer.Option(False, "--print-recipe",
                            help="Print the equivalent one-stage recipe (for `optkit run`) and exit.")


def load_artifact(model: str, weights: Optional[str] = None, signature: Optional[str] = None, **meta):
    from optkit.core.artifact import Artifact

    return Artifact.load(model, weights=weights, signature=signature, **meta)


def measure_and_report(artifact, settings, *, command: str, report_path: Optional[str], as_json: bool,
                       **measure_kwargs) -> None:
    """Measure one artifact, wrap it as a one-stage report, print it (table or JSON), save it if asked."""
    from optkit.measure.model import measure
    from optkit.report.build import input_stage
    from optkit.report.schema import Report

    if report_path:
        check_output_path(report_path)
    stage = input_stage(artifact, measure(artifact, settings, **measure_kwargs), name="model")
    stage.config = settings.model_dump(exclude_defaults=True)
    emit(Report(command=command, stages=[stage]), report_path, as_json)


def emit(report, report_path: Optional[str], as_json: bool) -> None:
    """Save the report if asked, then print it as JSON or as tables."""
    from optkit.report.render import to_console

    if report_path:
        report.save(report_path)
    if as_json:
        print_json(report.to_json())
    else:
        to_console(report, console())


def run_single_stage(pass_name: str, model: str, output: str, config: dict, *, command: str, settings,
                     weights: Optional[str] = None, eval_data=None, metric: Optional[str] = None,
                     report_path: Optional[str] = None, as_json: bool = False, measure_input: bool = True,
                     signature: Optional[str] = None, source_meta: Optional[dict] = None,
                     print_recipe: bool = False, **ctx_fields):
    """The machinery of every single-stage command: run one pass, measure input and output, report.

    With print_recipe (the commands' --print-recipe), print the equivalent one-stage recipe and run nothing.
    """
    if print_recipe:
        return print_stage_recipe(pass_name, model, config, settings=settings, weights=weights,
                                  eval_data=eval_data, metric=metric, data=ctx_fields.get("data"))
    from optkit.core.pipeline import run_pass
    from optkit.measure.model import measure
    from optkit.report.build import input_stage, pass_stage
    from optkit.report.schema import Report

    if report_path:
        check_output_path(report_path)
    source = load_artifact(model, weights, signature, **(source_meta or {}))
    result = run_pass(source, pass_name, config, output, shapes=settings.shapes, seed=settings.seed, **ctx_fields)
    stages = []
    if measure_input:
        stages.append(input_stage(source, measure(source, settings, data=eval_data, metric=metric)))
    figures = measure(result.output, settings, data=eval_data, metric=metric, reference=source)
    stages.append(pass_stage(result, figures))
    report = Report(command=command, stages=stages)
    emit(report, report_path, as_json)
    return report


def print_stage_recipe(pass_name: str, model: str, config: dict, *, settings=None, weights: Optional[str] = None,
                       eval_data=None, metric: Optional[str] = None, data: Optional[dict] = None) -> None:
    """Print the one-stage recipe a single-stage command is equivalent to (validated first)."""
    from optkit.core.pipeline import build_config
    from optkit.core.registry import get_pass
    from optkit.recipe import from_dict, one_stage_recipe, to_yaml

    cfg = build_config(get_pass(pass_name), config)
    rec = one_stage_recipe(pass_name, model, cfg.model_dump(mode="json", exclude_defaults=True), settings=settings,
                           weights=weights, eval_data=eval_data, metric=metric, data=data)
    from_dict(rec)  # the printed recipe must load
    sys.stdout.write("# optkit recipe: the same as this command; save it and run `optkit run FILE.yaml`\n"
                     + to_yaml(rec))
