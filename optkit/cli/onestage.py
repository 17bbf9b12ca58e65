"""Commands whose product is not a model (`optkit tune`: settings; `optkit profile`: per-op figures and a trace)
as one-stage recipes, like every other command (common.run_single_stage): the recipe `--print-recipe` prints,
run by the recipe runner in a scratch workspace. `keep(stage)` writes what the command keeps from the stage
while the workspace is there; the stage's model (unchanged) is not copied anywhere."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Optional


def run_recipe_stage(pass_name: str, model: str, config, *, settings, command: str, output: str,
                     keep: Callable, data: Optional[dict] = None, print_recipe: bool = False):
    """Build the one-stage recipe of `pass_name` with `config` (its built Config), print it (print_recipe:
    nothing runs, None) or run it; the Report."""
    from optkit.pipeline.api import run_one_stage
    from optkit.pipeline.recipe import from_dict, one_stage_recipe, to_yaml

    rec = one_stage_recipe(pass_name, model, config.model_dump(mode="json", exclude_defaults=True),
                           settings=settings, data=data)
    if print_recipe:
        from_dict(rec)  # the printed recipe must load
        sys.stdout.write("# optkit recipe: the same as this command; save it and run `optkit run FILE.yaml`\n"
                         + to_yaml(rec))
        return None
    return run_one_stage(rec, output, command=command, keep=keep)
