"""`package:` in a recipe: after the stages ran and every gate passed, the chosen stage's model is packaged with
the run's report (the lineage), as `optkit package` does. Each entry is a PackageConfig (package/config.py), the
options `optkit package` takes.

    package:
      - {to: triton, output: ../repo, name: cnn, tag: v1.0, manifests: kserve,seldon}
      - {to: mlflow, output: ../mlrepo, name: cnn, stage: split}

What the run made is handed over in memory, never read back from a file the run wrote: the report; the tune stage's
result for the entry's model (its setting, checked by best.json's contract); a split stage's plan (the entry of a
split stage serves its parts: package.ensemble.from_split); and a capacity stage's CAPACITY.json document (checked
by its contract) for an entry with manifests that names none, or names the file that stage wrote.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optkit.capacity import stage as capacity_stage
from optkit.contracts import base
from optkit.contracts import capacity as capacity_contract
from optkit.core.atomic import Input, Output, same_file
from optkit.core.errors import UsageError
from optkit.core.text import redact_config
from optkit.package import ensemble, repo
from optkit.package.build import INPUTS, check_options, outputs, package
from optkit.package.config import PackageConfig
from optkit.package.tuned import from_result
from optkit.split import stage as split_stage


@dataclass
class PackageStep:
    """One `package:` entry as a step of the run: the files it reads (tuned, data, capacity) and the repository
    it writes (package.repo.output: only the model's folders, never a version already there)."""
    loaded: Any  # pipeline.recipe.LoadedRecipe
    index: int
    spec: PackageConfig

    def paths(self) -> tuple[list[Input], list[Output]]:
        loaded, spec = self.loaded, self.spec
        own = _capacity_outputs(loaded)
        inputs = []
        for key in INPUTS:
            given = loaded.resolve(getattr(spec, key))
            if given and not (key == "capacity" and any(same_file(given, o) for o in own)):  # this run's: in memory
                inputs.append(Input(loaded.where(("package", self.index, key)), given))
        cfg = spec.model_copy(update={"output": loaded.resolve(spec.output)})
        return inputs, outputs(cfg, spec.name or loaded.name, lambda k: loaded.where(("package", self.index, k)))


def _capacity_outputs(loaded) -> list[str]:
    """The CAPACITY.json files this run's capacity stages write (resolved as the stages resolve them)."""
    return [loaded.resolve(st.config["output"]) for st in loaded.stages
            if st.pass_name == capacity_stage.CapacityPlan.name and st.config.get("output")]


def check_specs(loaded) -> None:
    """Before any stage runs: each target is known, each repository new or optkit's, each name and tag valid
    (else exit 2). The recipe as the run records it (report.json's `recipe`) keeps no registry password."""
    raw = loaded.raw.get("package") if isinstance(loaded.raw, dict) else None
    if isinstance(raw, (list, dict)):  # the entries were read already (loaded.recipe.package): only the record
        loaded.raw["package"] = redact_config(raw)
    own = _capacity_outputs(loaded)
    for i, spec in enumerate(loaded.recipe.package):
        try:
            target = check_options(spec, "to")
            if spec.report:
                raise UsageError("report: a recipe packages with its own run's report; leave report out")
            for key in ("tuned", "data", "capacity"):  # relative to the recipe: there before the stages run
                given = getattr(spec, key)
                if given and not Path(loaded.resolve(given)).exists() and not (
                        key == "capacity" and any(same_file(loaded.resolve(given), o) for o in own)):
                    raise UsageError(f"{key}: {given} does not exist")
            out = Path(loaded.resolve(spec.output))
            name = repo.check_name(spec.name or loaded.name)
            repo.check_tag(spec.tag)
            index = repo.precheck(out, name, target.name)
            repo.next_version(index, spec.version, spec.tag)
        except UsageError as e:  # the flags' names are those of the package: entry's keys
            raise UsageError(f"recipe package[{i}] (output {spec.output}): {e.message}") from None


def package_run(loaded, report, run_dir: Path) -> list:
    """Package each spec's stage model with what the run handed over in memory (module docstring)."""
    results = []
    for spec in loaded.recipe.package:
        stages = report.stages
        stage = next((s for s in stages if s.name == spec.stage), None) if spec.stage else _last_model(stages)
        if stage is None:
            raise UsageError(f"package: stage {spec.stage!r} is not a stage of this recipe")
        capacity, capacity_path = _capacity(loaded, spec, stages)
        cfg = spec.model_copy(update={
            "output": loaded.resolve(spec.output), "name": spec.name or loaded.name,
            "tuned": loaded.resolve(spec.tuned), "data": loaded.resolve(spec.data), "capacity": capacity_path,
            "report": str(run_dir / "report.json")})
        results.append(package(stage.output.path, cfg, tuned=None if spec.tuned else _tuned(stages, stage),
                               shapes=dict(loaded.recipe.measure.shapes), report=report,
                               plan=_split_plan(stage), capacity=capacity))
    return results


def _last_model(stages: list):
    """The stage an entry without `stage:` packages: the last one that made a model (a capacity stage passes its
    input through: the stage before it)."""
    return next((s for s in reversed(stages) if s.pass_name != capacity_stage.CapacityPlan.name), stages[-1])


def _tuned(stages: list, stage):
    """The tune stage's result for the stage's model (the same sha256), as the package's tuned setting."""
    tune = next((s for s in reversed(stages) if s.pass_name == "tune.onnx"
                 and s.output.sha256 == stage.output.sha256), None)
    if tune is None or not isinstance(tune.measurements.get("tune"), dict):
        return None
    return from_result(tune.measurements["tune"], f"stage {tune.name} (tune.onnx)", tune.output.path,
                       tune.output.sha256)


def _split_plan(stage):
    """A split stage's parts as the package serves them: its split.json document, held by the stage."""
    folder = split_stage.parts_of(stage)
    if folder is None:
        return None
    return ensemble.from_split(stage.measurements["split"], folder, f"stage {stage.name} (split.onnx)")


def _capacity(loaded, spec: PackageConfig, stages: list):
    """(this run's capacity document for the entry, in memory; the CAPACITY.json path the manifests name): the one
    the entry names when a stage of this run wrote it, else the last capacity stage's for an entry with manifests
    that names none; (None, the entry's own file) otherwise, which package reads as `optkit package` does."""
    given = loaded.resolve(spec.capacity)
    runs = [s for s in stages if capacity_stage.document(s) is not None]
    if given:
        runs = [s for s in runs if same_file(given, capacity_stage.output_of(s))]
    elif not spec.manifests:
        runs = []
    if not runs:
        return None, given
    stage = runs[-1]
    doc = base.validate(capacity_stage.document(stage), capacity_contract.CapacityFile,
                        f"stage {stage.name} (capacity.plan)", capacity_contract.HINT)
    return doc, str(capacity_stage.output_of(stage))
