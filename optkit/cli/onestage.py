"""Commands whose product is not a model (`optkit tune`: settings; `optkit profile`: per-op figures and a trace;
`optkit split`: parts; `optkit capacity`: replicas and autoscaling) as one-stage recipes, like every other command (common.run_single_stage): the recipe `--print-recipe` prints,
run by the recipe runner in a scratch workspace. `keep(stage)` writes what the command keeps from the stage
while the workspace is there; the stage's model (unchanged) is not copied anywhere."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Optional


def run_recipe_stage(pass_name: str, model: Optional[str], config, *, settings, command: str, output: str,
                     keep: Callable, data: Optional[dict] = None, print_recipe: bool = False, outputs=None):
    """Build the one-stage recipe of `pass_name` with `config` (its built Config; model None: a stage that needs
    none), print it (print_recipe: nothing runs, None) or run it; the Report. `outputs`: what the command writes
    itself (core.atomic.Output), checked with the recipe's steps before the stage runs."""
    from optkit.pipeline.api import run_one_stage
    from optkit.pipeline.recipe import one_stage_recipe

    rec = one_stage_recipe(pass_name, model, config.model_dump(mode="json", exclude_defaults=True),
                           settings=settings, data=data)
    if print_recipe:
        show(rec)
        return None
    return run_one_stage(rec, output, command=command, keep=keep, outputs=outputs)


def show(rec: dict) -> None:
    """--print-recipe: the command's one-stage recipe, checked to load, printed; nothing runs."""
    from optkit.pipeline.recipe import from_dict, to_yaml

    from_dict(rec)  # the printed recipe must load
    sys.stdout.write("# optkit recipe: the same as this command; save it and run `optkit run FILE.yaml`\n"
                     + to_yaml(rec))
