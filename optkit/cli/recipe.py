"""optkit recipe new [PATH]; optkit recipe check RECIPE; optkit recipe gates"""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options
from optkit.core.atomic import write_text
from optkit.core.errors import UsageError

recipe_app = typer.Typer(help="Write and check recipes.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(recipe_app, name="recipe")


@recipe_app.command("new")
def new_cmd(
    path: str = typer.Argument("recipe.yaml", help="Where to write the starter recipe."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented starter recipe."""
    from pathlib import Path

    from optkit.pipeline.recipe import STARTER

    p = Path(path)
    common.guard_outputs({"recipe file": p})
    if p.exists() and not force:
        raise UsageError(f"{p} exists; choose another path or add --force")
    name = p.stem.replace(" ", "-") or "recipe"
    write_text(p, STARTER.format(path=p, name=name))
    print(f"wrote {p}; edit the model, data and stages, then: optkit run {p} --dry-run")


@recipe_app.command("check")
@flags.groups("baseline")
def check_cmd(recipe: str = typer.Argument(..., help="Recipe YAML file."), *, shared: options.Shared) -> None:
    """Validate a recipe (same as `optkit run RECIPE --dry-run`, without the plan)."""
    from optkit.pipeline.recipe import load_recipe
    from optkit.pipeline.runner import plan

    loaded = load_recipe(recipe)
    rows = plan(loaded, baseline=shared.baseline)
    print(f"{recipe}: valid, {len(rows) - 1} stages")


@recipe_app.command("gates")
def gates_cmd() -> None:
    """List the gate metrics."""
    from rich.table import Table

    from optkit.pipeline.gates import describe_metrics

    t = Table(title="gate metrics (write `metric <= value`, `metric@stage >= value`)", title_justify="left")
    for c in ("metric", "relative to", "meaning"):
        t.add_column(c)
    for name, kind, help_ in describe_metrics():
        t.add_row(name, {"absolute": "-", "first": "first stage", "baseline": "baseline report"}[kind], help_)
    common.console().print(t)
