"""optkit package MODEL --to triton|mlflow -o REPO; optkit package serve-version REPO/NAME; optkit package inspect"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core import strictjson
from optkit.core.text import printable

SUBCOMMANDS = ("serve-version", "inspect", "build")


class PackageGroup(typer.core.TyperGroup):
    """`optkit package MODEL ...` builds a package; `serve-version` and `inspect` are sub-commands."""

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
        rows = [r for r in (p.get_help_record(sub) for p in build.get_params(sub)) if r]
        with formatter.section("optkit package MODEL --to triton|mlflow -o REPO [OPTIONS]"):
            formatter.write_dl(rows)


def register(app: typer.Typer) -> None:
    pkg = typer.Typer(cls=PackageGroup, no_args_is_help=True, rich_markup_mode=None,
                      help="Package a model for a server (Triton repository, MLflow model) with its tuned settings, "
                           "versions kept for rollback and its lineage: optkit package MODEL --to triton -o REPO.")
    app.add_typer(pkg, name="package")
    pkg.command("build", hidden=True)(build_cmd)
    pkg.command("serve-version")(serve_cmd)
    pkg.command("inspect")(inspect_cmd)


@flags.package_options()
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
    registry: Optional[str] = flags.package_option("registry", "MLflow: move the alias 'served' in this model "
                                                               "registry (default: MLFLOW_REGISTRY_URI)."),
    as_json: bool = options.JSON,
) -> None:
    """Serve another version (rollback or promote); no version is removed. Says what was served before."""
    from optkit.package.manage import serve_version

    out = serve_version(model_dir, version, tag, registry)
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
