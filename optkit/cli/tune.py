"""optkit tune MODEL [--data D] --objective throughput|latency|cost [--slo 'p99<=20ms'] [--max-memory 2GB];
optkit tune --storage URL --study NAME --report: a shared study's results, from any machine, without measuring"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from optkit.cli import common, flags, onestage, options
from optkit.core.atomic import check_output_path, write_text
from optkit.core.errors import UsageError
from optkit.core.shapes import parse_shapes, parse_values


def parse_space(items: list[str]) -> dict[str, list[str]]:
    space = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise UsageError(f"space (--space) {item!r}: write NAME=V1,V2,... e.g. batch=1,8,32")
        space[name.strip()] = [v.strip() for v in values.split(",") if v.strip()]
    return space


def _check_storage(storage: Optional[str], output: Path, others: list) -> None:
    """The study's file (the default beside -o, an sqlite:/// or journal: path) is none of the other files,
    and an existing SQLite file is an Optuna study (never a user's own database)."""
    from optkit.passes.tune import check_storage_file, default_study_path, sqlite_url, storage_file

    path = default_study_path(output) if storage is None else storage_file(storage)
    if path is None:
        return
    for other in others:
        if other and Path(other).resolve() == path.resolve():
            raise UsageError(f"the tune study file {path} is also {other}: give another -o or storage (--storage)")
    check_storage_file(storage or sqlite_url(path))


@flags.pass_options("tune.onnx")
@flags.groups("data", "text", "shape", "value", "json", "print_recipe")
def tune_cmd(
    model: Optional[str] = typer.Argument(None, help="ONNX model (none with --report alone: read a study)."),
    output: Optional[str] = typer.Option(None, "-o", "--output",
                                         help="Best settings JSON (default: MODEL_NAME.tune.json here)."),
    report: Optional[str] = typer.Option(
        None, "--report",  # given with no value, main.optional_values makes it "-"
        help="Also write the JSON report to this file. --report with no file and no MODEL: print the results "
             "of the study that storage (--storage) and study (--study) name, measuring nothing."),
    *,
    config: dict,
    shared: options.Shared,
) -> None:
    """Find the serving settings (threads, batch, requests in flight, sessions, onnxruntime options) that
    best meet an objective, by Bayesian search (Optuna TPE); writes the best settings, an onnxruntime
    SessionOptions snippet and the recipe lines that serve and gate the model that way."""
    from optkit.core.registry import build_config, require_extra
    from optkit.measure.model import MeasureSettings
    from optkit.passes import get_pass
    from optkit.passes.tune import Slo
    data, shape, value, as_json, print_recipe = shared.data, shared.shape, shared.value, shared.as_json, \
        shared.print_recipe

    require_extra("tune", "optkit tune")
    if model is None or report == "-":
        if model is not None:
            raise UsageError("--report needs a FILE when tuning a MODEL (--report with no file and no MODEL "
                             "reads a study)")
        if report != "-":
            raise UsageError("optkit tune needs a MODEL to tune, or --report with no file and no MODEL to read "
                             "a study (with storage (--storage) and study (--study))")
        return show_study(config, as_json)
    for text in config.get("slo", []):
        Slo(text)  # its own line ("SLO 'p99<=x': ..."), before the config's
    output = output or f"{Path(model).stem}.tune.json"
    common.guard_outputs({"-o": output, "--report": report}, common.inputs_of(shared, {"MODEL": model}))
    _check_storage(config.get("storage"), Path(output), [output, report, model, data])
    if "objective" in config:
        config["objective"] = [o.strip() for item in config["objective"] for o in item.split(",") if o.strip()]
    if "space" in config:
        config["space"] = parse_space(config["space"])
    cfg = build_config(get_pass("tune.onnx"), config, unknown="unknown option")
    settings = MeasureSettings(shapes=parse_shapes(shape), values=parse_values(value), seed=cfg.seed)
    run_tune(model, cfg, settings, data=shared.item(data), output=Path(output), report_path=report, as_json=as_json,
             print_recipe=print_recipe)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_cmd)

def show_study(config: dict, as_json: bool) -> None:
    """`optkit tune --storage URL --study NAME --report`: the study's results as its storage holds them."""
    from optkit.passes.tune import read_study

    url = config.get("storage")
    if not url:
        raise UsageError("--report with no MODEL reads a study: give its storage (--storage URL) and study "
                         "(--study NAME)")
    wait = config.get("storage_wait", 20.0)
    result = read_study(url, config.get("study"), wait=float(wait))
    if as_json:
        from optkit.core import strictjson

        common.print_json(strictjson.dumps(result, indent=2))
        return
    _print_study(result)


def _print_study(r: dict) -> None:
    from optkit.passes.tune import kind_label, num

    con = common.console()
    figure = r["objective_figure"]
    con.print(f"study {r['study']} in {r['storage']}: {r['trials']} trials finished ({r['pruned']} pruned, "
              f"{r['duplicates']} reused, {r['failed']} failed, {r['running']} running), "
              f"objective {', '.join(r['objective'])}", markup=False, highlight=False)
    con.print(f"machine: {kind_label(r['machine'])}", markup=False, highlight=False)
    if r["workers"]:
        con.print("trials per worker: " + ", ".join(f"{w}: {n}" for w, n in r["workers"].items()), markup=False,
                  highlight=False)
    best = r["best"]
    if best is None:
        con.print("best: none yet (no feasible finished trial)")
    else:
        conf = best.get("confirmed")
        how = (f"; measured again by {best['confirmed_by']}: {num(conf['mean'])} (95% CI {num(conf['ci95'][0])}-"
               f"{num(conf['ci95'][1])}) over {conf['rounds']} rounds") if conf else ""
        con.print(f"best: {best['label']} ({figure} {num(best['figures'][figure])}, trial {best['trial']}){how}",
                  markup=False, highlight=False)
    for t in r["failed_trials"][-5:]:
        con.print(f"trial {t['number']} failed ({t['worker']}): {t['reason']}", style="dim", markup=False,
                  highlight=False)


def run_tune(model: str, cfg, settings, *, data: Optional[str], output: Path, report_path: Optional[str],
             as_json: bool, print_recipe: bool = False) -> None:
    """The tune as a one-stage recipe (tune.onnx), through the recipe runner; best.json (its contract:
    optkit/contracts/best.py) and the printed figures are read from the report's tune stage (measurements.tune)."""
    from optkit.contracts import base, best

    def keep(stage) -> None:
        write_text(output, base.text(best.document(model, stage.input.sha256, stage.measurements["tune"])))
        stage.output.path = model  # the model, unchanged: tune's product is the settings
        stage.notes.append(f"best settings written to {output}")

    from optkit.passes.tune.search import check_onnx

    check_onnx(common.load_artifact(model))  # before the recipe: tune's own line for a model of another format
    if report_path and not print_recipe:
        check_output_path(report_path)
    try:
        report = onestage.run_recipe_stage("tune.onnx", model, cfg, settings=settings, command=f"optkit tune {model}",
                                           output=str(output), keep=keep, data={"eval": data} if data else None,
                                           print_recipe=print_recipe)
    except KeyboardInterrupt as e:
        kept = getattr(e, "kept", None)  # set by the tune.onnx pass: the study it leaves to resume from
        if kept:
            common.STATE.after_interrupt = f"nothing was written; {kept}"
        raise
    if report is None:  # --print-recipe: printed, nothing ran
        return
    if report_path:
        report.save(report_path)
    if as_json:
        common.print_json(report.to_json())
        return
    stage = report.stages[-1]
    _print(stage.measurements["tune"], stage.notes)


def _print(result: dict, notes: list[str]) -> None:
    from rich import box
    from rich.table import Table

    from optkit.passes.tune import num

    con = common.console()
    figure, maximize = result["objective_figure"], result["direction"] == "maximize"
    study = result["study"]
    failed = f", {study['failed']} failed" if study.get("failed") else ""
    table = Table(title=f"tune: {', '.join(result['objective'])}, {study['trials']} trials measured "
                        f"({study['pruned']} pruned{failed})", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for col in ("#", "setting", "samples/s", "p50 ms", "p99 ms", "MiB"):
        table.add_column(col, justify="left" if col == "setting" else "right", no_wrap=col != "setting")
    done = [t for t in result["trials"] if t["state"] == "complete" and "duplicate_of" not in t]
    done.sort(key=lambda t: t["figures"][figure] * (-1 if maximize else 1))
    for t in done[:10]:
        f = t["figures"]
        table.add_row(str(t["number"]), t["label"] + ("" if t["feasible"] else " (misses the SLO)"),
                      f"{f['throughput_per_s']:,.0f}", f"{f['p50_ms']:.3f}", f"{f['p99_ms']:.3f}",
                      f"{f['memory_mb']:.0f}")
    con.print(table)
    best = result["best"]
    conf = best.get("confirmed")
    how = (f"; measured again: {num(conf['mean'])} (95% CI {num(conf['ci95'][0])}-{num(conf['ci95'][1])}) "
           f"over {conf['rounds']} rounds") if conf else ""
    con.print(f"best: {best['label']}{how}")
    if len(study.get("workers") or {}) > 1:
        con.print("trials per worker: " + ", ".join(f"{w}: {n}" for w, n in study["workers"].items()),
                  markup=False, highlight=False)
    for t in result["ties"]:
        con.print(f"tie (within the noise): {t['label']}")
    for t in result.get("failed_trials", [])[-5:]:
        con.print(f"trial {t['number']} failed: {t['reason']}", style="dim")
    for note in notes:
        con.print(note, style="dim")
    import yaml

    on_ov = result["best"]["setting"].get("runtime") == "openvino"
    for title, text in ((("OpenVINO (optkit's settings: LATENCY hint, one stream, the threads above, f32):", "") if on_ov
                         else ("onnxruntime SessionOptions:", result["session_options"])),
                        ("recipe lines (measure and gate the model served this way):",
                         yaml.safe_dump(result["recipe"], sort_keys=False))):
        con.print(title)
        for line in text.splitlines():  # one by one: the console shows a newline inside a string as \n
            con.print(line, markup=False, highlight=False)
