"""optkit eval MODEL --data D --metric top1 [--reference REF]"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core.errors import UsageError


@flags.groups("data_required", "text", "weights", "metric", "labels", "max_samples", "runtime", "provider", "measure",
               "output")
def eval_cmd(
    model: str = typer.Argument(..., help="Model file, SavedModel folder or file.py:factory."),
    reference: Optional[str] = typer.Option(None, "--reference", help="Also report fidelity to this model."),
    preprocess: Optional[str] = typer.Option(
        None, "--preprocess", help="Image preprocessing as a YAML/JSON mapping, the recipe's keys, e.g. "
                                   "'{resize: 256, resample: bicubic, center_crop: 224, mean: 127, std: 128}' "
                                   "(an image of at most 64M pixels as decoded and once resized)."),
    no_metric: bool = typer.Option(False, "--no-metric", help="Fidelity only (data without labels)."),
    *, shared: options.Shared,
) -> None:
    """Accuracy on labelled data, and fidelity to a reference model."""
    from optkit.measure.model import DataSpec

    common.guard_outputs({"--report": shared.report},
                         common.inputs_of(shared, {"MODEL": model, "--reference": reference}))
    if no_metric and reference is None:
        raise UsageError("--no-metric leaves nothing to measure; add --reference REF")
    settings = shared.settings()
    pre = _parse_preprocess(preprocess) if preprocess else None
    artifact = common.load_artifact(model, shared.weights)
    ref = common.load_artifact(reference) if reference else None
    common.measure_and_report(
        artifact, settings, command=f"optkit eval {model}", latency=False,
        data=DataSpec(path=shared.data, labels=shared.labels, preprocess=pre, max_samples=shared.max_samples,
                      **shared.text()),
        metric=None if no_metric else shared.metric, reference=ref, report_path=shared.report,
        as_json=shared.as_json,
    )


def _parse_preprocess(text: str) -> dict:
    """--preprocess: a YAML (or JSON) mapping with the keys of a recipe's `preprocess`, checked here."""
    from optkit.measure.datasets import parse_preprocess
    from optkit.pipeline.yamlsafe import yaml_with_lines

    mapping, _ = yaml_with_lines(text, "--preprocess")
    return parse_preprocess(mapping, "--preprocess").model_dump(exclude_defaults=True)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
