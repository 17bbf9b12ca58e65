"""What each step of a recipe reads and writes, and the one guard over them, before any stage runs.

Every step declares its files with one method, `paths() -> (inputs, outputs)` (core.atomic.Step): the recipe's
own reads (`Source`: the recipe file, the model with its weights and factory, the data with labels and a metric's
file, the baseline), each stage (`PassStage`: the files its Config names, from the PathRole of each field; a
split.onnx or capacity.plan stage, and the `capacity:` section, which runs as one) and each `package:` entry
(package.recipe.PackageStep).
`guard` checks every output against every input and every other output (core.atomic.check_steps): `optkit run`,
its --dry-run, `optkit.run` and `optkit.run_pass` (and every command, through its one-stage recipe) refuse, exit 2,
before anything is written. A new kind of step implements paths() and is added to `steps_of`.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from optkit.core.atomic import Input, Output, Step, check_steps, declared_paths, python_file
from optkit.package.recipe import PackageStep
from optkit.pipeline.recipe import LoadedRecipe


@dataclass
class Source:
    """The run's reads before any stage: the recipe file, the model, the data, the baseline reports."""
    loaded: LoadedRecipe
    baseline: str | None = None  # --baseline REPORT.json (optkit.run's baseline=)

    def paths(self) -> tuple[list[Input], list[Output]]:
        loaded, r = self.loaded, self.loaded.recipe
        inputs = [Input("the recipe file", loaded.path)] if loaded.path else []
        if r.model is not None:
            inputs.append(Input("model.path", loaded.model_path))
        if r.model is not None and r.model.weights:
            inputs.append(Input("model.weights", loaded.resolve(r.model.weights)))
        for key in ("calibration", "eval", "train"):
            item = getattr(r.data, key)
            if item is None:
                continue
            inputs.append(Input(f"data.{key}.path", loaded.resolve(item.path)))
            if item.labels:
                inputs.append(Input(f"data.{key}.labels", loaded.resolve(item.labels)))
            metric_file = python_file(getattr(item, "metric", None))
            if metric_file:  # read as the metric is: relative to the working folder
                inputs.append(Input(f"data.{key}.metric", metric_file))
        if r.baseline:
            inputs.append(Input("baseline", loaded.resolve(r.baseline)))
        if self.baseline:
            inputs.append(Input("baseline (--baseline)", self.baseline))
        return inputs, []


@dataclass
class PassStage:
    """A stage: the files its Config names (fields marked with core.atomic.PathRole). Its model goes to the run's
    workspace, which is optkit's own."""
    loaded: LoadedRecipe
    index: int
    config: object  # the pass's built Config

    def paths(self) -> tuple[list[Input], list[Output]]:
        return declared_paths(self.config, lambda field: self.loaded.where((*self.loaded.config_loc(self.index),
                                                                             field)))


def steps_of(loaded: LoadedRecipe, configs: Iterable, baseline: str | None = None) -> list[Step]:
    """Every step of the recipe, in order; `configs` are the stages' built Configs (recipe.validate's)."""
    steps: list[Step] = [Source(loaded, baseline)]
    steps += [PassStage(loaded, i, cfg) for i, cfg in enumerate(configs)]
    steps += [PackageStep(loaded, i, spec) for i, spec in enumerate(loaded.recipe.package)]
    return steps


def guard(loaded: LoadedRecipe, resolved: list, *, baseline: str | None = None,
          outputs: Iterable[Output] = (), workspace: str | os.PathLike | None = None) -> None:
    """Before any stage (and in a dry run): no output of any step, nor `outputs` (a command's -o, --report, ...),
    is an input, another output, a link, a device, or a folder where a file is written, nor lies in what the
    run keeps in `workspace` (its stage cache, this recipe's run folders) (UsageError, exit 2)."""
    own = [] if workspace is None else [
        Output(f"the workspace's stage cache (--workspace {workspace})", Path(workspace) / ".cache", folder=True),
        Output(f"this recipe's run folders (--workspace {workspace})", Path(workspace) / loaded.name, folder=True)]
    check_steps(steps_of(loaded, [cfg for _, cfg in resolved], baseline), outputs=outputs, own=own)
