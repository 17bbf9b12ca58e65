"""`package:` in a recipe: after the stages ran and every gate passed, the chosen stage's model is packaged with
the run's report (the lineage) and the recipe's tune stage (the settings), as `optkit package` does.

    package:
      - {to: triton, output: ../repo, name: cnn, tag: v1.0, manifests: kserve,seldon}
      - {to: mlflow, output: ../mlrepo, name: cnn}
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PackageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: Literal["triton", "mlflow"]
    output: str = Field(description="The repository folder (relative to the recipe).")
    name: str | None = None
    version: str = "auto"
    tag: str | None = None
    stage: str | None = Field(default=None, description="Whose model (default: the last stage).")
    manifests: str | None = None
    storage_uri: str | None = None
    memory_margin: float | None = None
    queue_delay_us: int | None = Field(default=None, ge=0)


def check_specs(loaded) -> None:
    """Before any stage runs: each repository is new or optkit's, each name and tag valid (else exit 2)."""
    from optkit.core.errors import UsageError
    from optkit.package import repo

    for i, spec in enumerate(loaded.recipe.package):
        try:
            out = Path(loaded.resolve(spec.output))
            name = repo.check_name(spec.name or loaded.name)
            repo.check_tag(spec.tag)
            index = repo.check_repo(out, name, spec.to)
            repo.next_version(index, spec.version, spec.tag)
        except UsageError as e:  # the flags' names are those of the package: entry's keys
            raise UsageError(f"recipe package[{i}] (output {spec.output}): {e.message}") from None


def package_run(loaded, report, run_dir: Path) -> list:
    """Package each spec's stage model; the tune stage's best setting (when the recipe has one) is its --tuned."""
    from optkit.core.errors import UsageError
    from optkit.package.build import package

    results = []
    report_path = run_dir / "report.json"
    for spec in loaded.recipe.package:
        stages = report.stages
        stage = next((s for s in stages if s.name == spec.stage), None) if spec.stage else stages[-1]
        if stage is None:
            raise UsageError(f"package: stage {spec.stage!r} is not a stage of this recipe")
        model = stage.output.path
        tuned_path = None
        tune = next((s for s in reversed(stages) if s.pass_name == "tune.onnx"
                     and s.output.sha256 == stage.output.sha256), None)
        if tune is not None and isinstance(tune.measurements.get("tune"), dict):
            tuned_path = run_dir / f"package-{spec.to}.best.json"
            result = tune.measurements["tune"]
            tuned_path.write_text(json.dumps({"model": model, "model_sha256": stage.output.sha256,
                                              **{k: v for k, v in result.items() if k != "trials"}}, indent=2))
        results.append(package(
            model, target=spec.to, output=loaded.resolve(spec.output), tuned_path=str(tuned_path) if tuned_path else None,
            name=spec.name or loaded.name, version=spec.version, tag=spec.tag, report_path=str(report_path),
            shapes=dict(loaded.recipe.measure.shapes), manifests=spec.manifests, storage_uri=spec.storage_uri,
            memory_margin=spec.memory_margin, queue_delay_us=spec.queue_delay_us))
    return results
