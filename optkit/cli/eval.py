"""optkit eval MODEL --data D --metric top1 [--reference REF]"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, options
from optkit.core.errors import UsageError
from optkit.core.shapes import parse_shapes, parse_values


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_cmd(
        model: str = typer.Argument(..., help="Model file, SavedModel folder or file.py:factory."),
        data: str = options.DATA_REQUIRED,
        metric: Optional[str] = options.METRIC,
        reference: Optional[str] = typer.Option(None, "--reference", help="Also report fidelity to this model."),
        labels: Optional[str] = typer.Option(
            None, "--labels", help="Labels: IDX file (default: beside the images); for an image folder a CSV of "
                                   "file,class_index rows or a .txt class list (line number = class index)."),
        preprocess: Optional[str] = typer.Option(
            None, "--preprocess", help="Image preprocessing as a YAML/JSON mapping, the recipe's keys, e.g. "
                                       "'{resize: 256, resample: bicubic, center_crop: 224, mean: 127, std: 128}'."),
        max_samples: Optional[int] = typer.Option(None, "--max-samples", min=1,
                                                  help="Evaluate a deterministic subset."),
        no_metric: bool = typer.Option(False, "--no-metric", help="Fidelity only (data without labels)."),
        provider: str = options.PROVIDER,
        threads: Optional[int] = options.THREADS,
        shape: Optional[list[str]] = options.SHAPE,
        value: Optional[list[str]] = options.VALUE,
        weights: Optional[str] = options.WEIGHTS,
        report: Optional[str] = options.OUTPUT_REPORT,
        as_json: bool = options.JSON,
    ) -> None:
        """Accuracy on labelled data, and fidelity to a reference model."""
        from optkit.measure.model import DataSpec, MeasureSettings

        common.guard_outputs({"--report": report}, [model, weights, data, labels, reference])
        if no_metric and reference is None:
            raise UsageError("--no-metric leaves nothing to measure; add --reference REF")
        settings = MeasureSettings(provider=provider, threads=threads, shapes=parse_shapes(shape), values=parse_values(value))
        pre = _parse_preprocess(preprocess) if preprocess else None
        artifact = common.load_artifact(model, weights)
        ref = common.load_artifact(reference) if reference else None
        common.measure_and_report(
            artifact, settings, command=f"optkit eval {model}", latency=False,
            data=DataSpec(path=data, labels=labels, preprocess=pre, max_samples=max_samples),
            metric=None if no_metric else metric, reference=ref, report_path=report, as_json=as_json,
        )


def _parse_preprocess(text: str) -> dict:
    """--preprocess: a YAML (or JSON) mapping with the keys of a recipe's `preprocess`, checked here."""
    from optkit.measure.datasets import parse_preprocess
    from optkit.pipeline.yamlsafe import yaml_with_lines

    mapping, _ = yaml_with_lines(text, "--preprocess")
    return parse_preprocess(mapping, "--preprocess").model_dump(exclude_defaults=True)
