"""optkit package MODEL --to TARGET -o REPO (each target's own options beside the shared ones); optkit package
serve-version REPO/NAME; optkit package inspect"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core import strictjson
from optkit.core.text import printable

SUBCOMMANDS = ("serve-version", "inspect", "build")
# a target option's parameter -> the targets that declare it (their help sections); set by register()
OWNERS: dict[str, list[str]] = {}


def _sections(cmd, ctx, arguments: bool = False) -> list[tuple[str, list]]:
    """The build command's options in sections: the shared ones (with MODEL, unless `arguments` puts it in a
    section of its own), then each target's own ("triton options", "mlflow options", a plugin's)."""
    args, shared, own = [], [], {}
    for p in cmd.get_params(ctx):
        row = p.get_help_record(ctx)
        if row is None:
            continue
        if arguments and p.param_type_name == "argument":
            args.append(row)
            continue
        for target in OWNERS.get(p.name, [None]):
            (own.setdefault(target, []) if target else shared).append(row)
    return [*([("Arguments", args)] if args else []), ("", shared), *((f"{t} options", rows) for t, rows in own.items())]


class BuildCommand(typer.core.TyperCommand):
    """`optkit package MODEL --help`: the options grouped per target."""

    def format_options(self, ctx, formatter) -> None:
        for title, rows in _sections(self, ctx, arguments=True):
            with formatter.section(title or "Options"):
                formatter.write_dl(rows)


class PackageGroup(typer.core.TyperGroup):
    """`optkit package MODEL ...` builds a package; `serve-version` and `inspect` are sub-commands."""
    usage = "optkit package MODEL --to TARGET -o REPO [OPTIONS]"

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["build", *args]
        return super().parse_args(ctx, args)

    def format_help(self, ctx, formatter) -> None:
        super().format_help(ctx, formatter)
        build = self.commands.get("build")
        if build is None:
            return
        sub = build.context_class(build, info_name="package", parent=ctx)
        for title, rows in _sections(build, sub):
            with formatter.section(title or self.usage):
                formatter.write_dl(rows)


def register(app: typer.Typer) -> None:
    """The package commands, with each registered target's own options (a plugin's too: loaded here)."""
    from optkit.package.target import choices, get_target, option_specs

    per_target = option_specs()
    specs, serve_specs = [], []
    OWNERS.clear()
    for target, fields in per_target.items():
        serving = get_target(target).serve_options
        for spec in (s for s in fields if s.get("flag")):
            OWNERS.setdefault(flags.param_name(spec), []).append(target)
            specs.append(spec)  # one option two targets share is declared identically (checked): added once
            if spec["key"] in serving:
                serve_specs.append({**spec, "help": serving[spec["key"]]})
    names = list(per_target)
    PackageGroup.usage = f"optkit package MODEL --to {'|'.join(names)} -o REPO [OPTIONS]"
    pkg = typer.Typer(cls=PackageGroup, no_args_is_help=True, rich_markup_mode=None,
                      help="Package a model for a server (Triton repository, MLflow model) with its tuned settings, "
                           "versions kept for rollback and its lineage: optkit package MODEL --to triton -o REPO.")
    app.add_typer(pkg, name="package")
    pkg.command("build", hidden=True, cls=BuildCommand)(
        flags.package_options(specs, {"to": f"The package target: {choices(names)}."})(build_cmd))
    pkg.command("serve-version")(flags.derived_options(serve_specs)(serve_cmd))
    pkg.command("inspect")(inspect_cmd)


def build_cmd(model: str = typer.Argument(..., help="ONNX model, or a folder `optkit split` wrote (a Triton "
                                                     "ensemble)."),
              as_json: bool = options.JSON, *, config: dict) -> None:
    """Package MODEL for a server; the version is built aside and renamed into place."""
    from optkit.package.build import package

    result = package(model, config)
    if as_json:
        common.print_json(strictjson.dumps(result.__dict__, indent=2, default=str))
        return
    con = common.console()
    was = f" (served before: {result.served_before})" if result.served_before else ""
    con.print(f"{result.target} package {result.name} version {result.version}"
              f"{' tag ' + result.tag if result.tag else ''} written to {result.path}; served now{was}")
    for row in result.mapping:
        where = row["field"] or "not expressible (see notes)"
        con.print(f"  {row['setting']} = {row['value']} -> {where}" +
                  (f" = {row['written']}" if row["field"] else ""), highlight=False)
    for note in result.notes:
        con.print(f"note: {note}", highlight=False)


def serve_cmd(
    model_dir: str = typer.Argument(..., help="REPO/NAME, a model optkit packaged."),
    version: Optional[str] = flags.package_option("version", "The version number to serve."),
    tag: Optional[str] = flags.package_option("tag", "Serve the version with this tag instead."),
    as_json: bool = options.JSON, *, config: dict,
) -> None:
    """Serve another version (rollback or promote); no version is removed. Says what was served before."""
    from optkit.package.manage import serve_version

    out = serve_version(model_dir, version, tag, **config)
    if as_json:
        common.print_json(strictjson.dumps(out, indent=2))
        return
    tagged = f" ({out['tag']})" if out["tag"] else ""
    common.console().print(f"{out['model']}: serving version {out['served']}{tagged}, was {out['before']}; "
                           f"versions kept: {', '.join(map(str, out['versions']))}", highlight=False)
    if out.get("registry"):
        r = out["registry"]
        common.console().print(f"registry {r['uri']}: alias {r['alias']} -> version {r['version']} "
                               f"(was {r['before']})", highlight=False)


def inspect_cmd(
    path: str = typer.Argument(..., help="A package repository, REPO/NAME or REPO/NAME/N."),
    as_json: bool = options.JSON,
) -> None:
    """Versions, tags, which one is served, and each version's lineage (source, passes, figures)."""
    show(path, as_json)


def show(path: str, as_json: bool) -> None:
    """`optkit package inspect PATH` (and `optkit inspect` on a package)."""
    from optkit.package.manage import inspect

    out = inspect(path)
    if as_json:
        common.print_json(strictjson.dumps(out, indent=2, default=str))
        return
    con = common.console()
    for m in out.get("models", []):
        con.print(f"{m['name']} ({m['target']}) at {printable(m['path'])}: served {m['served']}", highlight=False)
        for v in m["versions"]:
            _print_version(con, v["version"], v.get("tag"), v["served"], v.get("lineage") or {})
    if "version" in out:
        v = out["version"]
        _print_version(con, None, None, None, v)


def _print_version(con, number, tag, served, lin: dict) -> None:
    head = f"  {'*' if served else ' '} {number}" if number is not None else f"  {printable(lin.get('path'))}"
    src = lin.get("source") or {}
    figures = []
    if lin.get("p50_ms") is not None:
        noise = f" ±{lin['p50_ci95_pct']:.0f}%" if isinstance(lin.get("p50_ci95_pct"), (int, float)) else ""
        figures.append(f"p50 {lin['p50_ms']:.4g} ms{noise}")
    for k, v in (lin.get("accuracy") or {}).items():
        if k != "samples":
            figures.append(f"{k} {v:.4g}")
    if lin.get("size_bytes"):
        figures.append(f"{lin['size_bytes']:,} bytes")
    con.print(f"{head}{' ' + tag if tag else ''}  {printable(lin.get('created', ''))}  "
              f"tuned: {printable(lin.get('tuned') or '-')}",
              highlight=False)
    passes = " -> ".join(printable(p) for p in lin.get("passes", []) if p) or "no passes recorded"
    con.print(f"      source {printable(src.get('path'))} ({printable((src.get('sha256') or '')[:12])}) -> {passes}",
              highlight=False)
    conf = lin.get("confirmed") or {}
    if conf.get("mean") is not None and conf.get("ci95"):
        figures.append(f"tuned {printable(conf.get('figure'))} {conf['mean']:.4g} (95% CI {conf['ci95'][0]:.4g}-"
                       f"{conf['ci95'][1]:.4g}, {conf.get('rounds', '?')} rounds)")
    if figures:
        con.print("      " + ", ".join(figures), highlight=False)
