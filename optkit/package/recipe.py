"""`package:` in a recipe: after the stages ran and every gate passed, the chosen stage's model is packaged with
the run's report (the lineage) and the recipe's tune stage (the settings, handed over as an object), as
`optkit package` does. Each entry is a PackageConfig (package/config.py), the options `optkit package` takes.

    package:
      - {to: triton, output: ../repo, name: cnn, tag: v1.0, manifests: kserve,seldon}
      - {to: mlflow, output: ../mlrepo, name: cnn}
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optkit.core.atomic import Input, Output, same_file
from optkit.core.errors import UsageError
from optkit.core.text import redact_config
from optkit.package import repo
from optkit.package.build import INPUTS, check_options, outputs, package
from optkit.package.config import PackageConfig
from optkit.package.tuned import from_result


@dataclass
class PackageStep:
    """One `package:` entry as a step of the run: the files it reads (tuned, data, capacity) and the repository
    it writes (package.repo.output: only the model's folders, never a version already there)."""
    loaded: Any  # pipeline.recipe.LoadedRecipe
    index: int
    spec: PackageConfig

    def paths(self) -> tuple[list[Input], list[Output]]:
        loaded, spec = self.loaded, self.spec
        own = loaded.resolve(loaded.recipe.capacity.output) if loaded.recipe.capacity else None
        inputs = []
        for key in INPUTS:
            given = loaded.resolve(getattr(spec, key))
            if given and not (key == "capacity" and own and same_file(given, own)):  # this run's own: written first
                inputs.append(Input(loaded.where(("package", self.index, key)), given))
        cfg = spec.model_copy(update={"output": loaded.resolve(spec.output)})
        return inputs, outputs(cfg, spec.name or loaded.name, lambda k: loaded.where(("package", self.index, k)))


def check_specs(loaded) -> None:
    """Before any stage runs: each target is known, each repository new or optkit's, each name and tag valid
    (else exit 2). The recipe as the run records it (report.json's `recipe`) keeps no registry password."""
    raw = loaded.raw.get("package") if isinstance(loaded.raw, dict) else None
    if isinstance(raw, (list, dict)):  # the entries were read already (loaded.recipe.package): only the record
        loaded.raw["package"] = redact_config(raw)
    for i, spec in enumerate(loaded.recipe.package):
        try:
            target = check_options(spec, "to")
            if spec.report:
                raise UsageError("report: a recipe packages with its own run's report; leave report out")
            for key in ("tuned", "data", "capacity"):  # relative to the recipe: there before the stages run
                given = getattr(spec, key)
                if given and not Path(loaded.resolve(given)).exists():
                    raise UsageError(f"{key}: {given} does not exist")
            out = Path(loaded.resolve(spec.output))
            name = repo.check_name(spec.name or loaded.name)
            repo.check_tag(spec.tag)
            index = repo.precheck(out, name, target.name)
            repo.next_version(index, spec.version, spec.tag)
        except UsageError as e:  # the flags' names are those of the package: entry's keys
            raise UsageError(f"recipe package[{i}] (output {spec.output}): {e.message}") from None


def package_run(loaded, report, run_dir: Path) -> list:
    """Package each spec's stage model; the tune stage's result (when the recipe has one for that model) is its
    tuned setting, unless the entry names a best.json (`tuned:`)."""
    results = []
    # the recipe's own `capacity:` (written by this run) goes into the manifests of an entry that names none
    capacity_out = loaded.resolve(loaded.recipe.capacity.output) if loaded.recipe.capacity else None
    for spec in loaded.recipe.package:
        stages = report.stages
        stage = next((s for s in stages if s.name == spec.stage), None) if spec.stage else stages[-1]
        if stage is None:
            raise UsageError(f"package: stage {spec.stage!r} is not a stage of this recipe")
        tuned = None
        tune = next((s for s in reversed(stages) if s.pass_name == "tune.onnx"
                     and s.output.sha256 == stage.output.sha256), None)
        if not spec.tuned and tune is not None and isinstance(tune.measurements.get("tune"), dict):
            tuned = from_result(tune.measurements["tune"], f"stage {tune.name} (tune.onnx)", tune.output.path,
                                tune.output.sha256)
        cfg = spec.model_copy(update={
            "output": loaded.resolve(spec.output), "name": spec.name or loaded.name,
            "tuned": loaded.resolve(spec.tuned), "data": loaded.resolve(spec.data),
            "capacity": loaded.resolve(spec.capacity) or (capacity_out if spec.manifests else None),
            "report": str(run_dir / "report.json")})
        results.append(package(stage.output.path, cfg, tuned=tuned, shapes=dict(loaded.recipe.measure.shapes)))
    return results
