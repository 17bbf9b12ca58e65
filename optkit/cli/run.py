"""optkit run RECIPE.yaml [--dry-run] [--no-cache] [--baseline REPORT.json]"""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options
from optkit.core import strictjson
from optkit.core.errors import GateFailed, UsageError


@flags.groups("baseline", "json")
def run_cmd(
    recipe: str = typer.Argument(..., help="Recipe YAML file (`optkit recipe new` writes a starter)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the recipe and print the plan; run nothing."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Recompute every stage (do not reuse cached ones)."),
    new: bool = typer.Option(False, "--new", help="Start a new run even if the last one was interrupted."),
    workspace: str = typer.Option("runs", "--workspace", help="Folder for runs/RECIPE/RUN-ID/."),
    *, shared: options.Shared,
) -> None:
    """Run a recipe: every stage, measured, cached and resumable; reports; exit 1 when a gate fails."""
    from pathlib import Path

    from optkit.pipeline.recipe import load_recipe
    from optkit.pipeline.runner import RunOptions, execute, plan

    baseline, as_json = shared.baseline, shared.as_json
    loaded = load_recipe(recipe)
    if baseline and not Path(baseline).is_file():
        raise UsageError(f"baseline report {baseline} not found")
    if dry_run:
        rows = plan(loaded, baseline=baseline)
        _print_plan(loaded, rows, as_json)
        return
    from optkit.pipeline.workspace import Progress

    common.STATE.after_interrupt = "completed stages are kept; rerun the same command to resume"

    opts = RunOptions(workspace=Path(workspace), use_cache=not no_cache, resume=not new, baseline=baseline,
                      command=f"optkit run {recipe}", progress=Progress(quiet=False))
    outcome = execute(loaded, opts)
    common.emit(outcome.report, None, as_json)
    if not as_json:
        for pkg in outcome.packages:
            common.console().print(f"packaged: {pkg.target} {pkg.name} version {pkg.version} at {pkg.path}",
                                   highlight=False)
        if outcome.package_note:
            common.console().print(outcome.package_note, highlight=False)
    bad = outcome.failed_gates
    if bad:
        from optkit.report.table import failed_gate

        raise GateFailed(f"{len(bad)} of {len(outcome.gate_results)} gates failed: "
                         + ", ".join(failed_gate(g) for g in bad) + f" (see {outcome.run_dir}/report.md)")


def _print_plan(loaded, rows, as_json: bool) -> None:
    
    from optkit.pipeline.gates import gates_of_recipe
    from optkit.pipeline.validation import measured_figures

    gates = [g.text for g in gates_of_recipe(loaded)]
    m = loaded.recipe.measure
    if as_json:
        common.print_json(strictjson.dumps({"recipe": str(loaded.path), "name": loaded.name, "valid": True,
                                      "stages": rows, "gates": gates,
                                      "measure": m.model_dump(), "figures": sorted(measured_figures(loaded))},
                                     indent=2))
        return
    from rich.table import Table

    con = common.console()
    t = Table(title=f"plan: {loaded.path} (valid; nothing run)", title_justify="left")
    for c in ("stage", "pass", "from", "accepts", "gives", "config"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["stage"], r["pass"], r["from"], r["accepts"], r["format"],
                  ", ".join(f"{k}={v}" for k, v in r["config"].items()) or "-")
    con.print(t)
    from rich.text import Text

    for p, missing in dict((r["pass"], r["missing"]) for r in rows if not r["available"]).items():
        con.print(Text("note", "yellow"), f": {p} is not available on this machine ({missing}); "
                  "the recipe is valid, but running it here exits 4", sep="")
    lat = (f"latency {m.trials} trials x {m.runs} runs (warm-up {m.warmup}), batch {m.batch}, "
           f"threads {m.threads or 'default'}, provider {m.provider}" + (", normalised" if m.normalize else "")) \
        if m.latency else "no latency"
    con.print(f"measure: size, {lat}" + (f", {loaded.recipe.data.eval.metric} on {loaded.recipe.data.eval.path}"
                                         if loaded.recipe.data.eval else ""))
    con.print("gates: " + ("; ".join(gates) if gates else "none"))


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
