"""optkit profile MODEL [--data D] [--compare OTHER] [--trace FILE] [--logdir DIR]"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, onestage, options
from optkit.core import strictjson
from optkit.core.atomic import Output, adding_folder, atomic_path
from optkit.core.errors import UsageError
from optkit.core.formats import Format
from optkit.core.shapes import parse_shapes, parse_values

NAME_WIDTH = 34  # node names are cut to this, so every table fits 80 columns
NUMERIC = ("nodes", "ms", "share", "a ms", "b ms", "delta", "delta ms")


@flags.pass_options("profile.onnx")
@flags.groups("data", "text", "runtime", "shape", "value", "json", "print_recipe")
def profile_cmd(
    model: str = typer.Argument(..., help="ONNX model (or Keras / SavedModel with --logdir)."),
    compare: Optional[str] = typer.Option(None, "--compare",
                                          help="A second ONNX model (e.g. its INT8 copy), side by side."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Write the Chrome trace (Perfetto, chrome://tracing): "
                                        "at most 100 MB, whole profiled calls, the first that fit."),
    logdir: Optional[str] = typer.Option(None, "--logdir",
                                         help="Keras / SavedModel: write a TensorBoard profile log (tf.profiler)."),
    *,
    config: dict,
    shared: options.Shared,
) -> None:
    """Where the time goes: per op type and per node (onnxruntime's profiler, or OpenVINO's per-layer counters
    with --runtime openvino or an IR), against the p50 latency."""
    from optkit.core.isolate import run_isolated
    from optkit.core.registry import build_config
    from optkit.measure import profile as prof
    from optkit.measure.model import MeasureSettings
    from optkit.measure.profile_ov import profile_model
    from optkit.passes import get_pass
    data, shape, value, as_json, print_recipe = shared.data, shared.shape, shared.value, shared.as_json, \
        shared.print_recipe

    common.guard_outputs([Output("--trace", trace), adding_folder("--logdir", logdir)],
                         common.inputs_of(shared, {"MODEL": model, "--compare": compare}))
    if print_recipe and (compare or logdir):
        raise UsageError("--print-recipe: --compare and --logdir have no recipe stage; a recipe profiles one "
                         "ONNX model (stage profile.onnx)")
    config["trace"] = bool(trace)  # a stage writes its trace beside its output; the command copies it to --trace
    if shared.runtime is not None:
        config["runtime"] = shared.runtime
    cfg = build_config(get_pass("profile.onnx"), config)  # the Config's defaults and bounds
    top, runs, threads = cfg.top, cfg.runs, cfg.threads
    artifact = common.load_artifact(model)
    other = common.load_artifact(compare) if compare else None
    kwargs = dict(runs=runs, threads=threads, shapes=parse_shapes(shape), values=parse_values(value))
    if artifact.format in (Format.KERAS, Format.TF_SAVEDMODEL):
        if not logdir:
            raise UsageError(f"{model} is a {artifact.format.value} model: give --logdir DIR for a TensorBoard "
                             "profile, or convert it to ONNX first (optkit convert) for per-op tables")
        if trace or compare:
            raise UsageError("--trace and --compare are for ONNX models; a Keras / SavedModel profile goes to "
                             "--logdir (open it with TensorBoard's profile plugin)")
        return _print_tf(prof.profile_tf(artifact, logdir, **kwargs, data=_dataset(data)), as_json)
    for flag, art in (("MODEL", artifact), ("--compare", other)):
        if art is not None and art.format not in (Format.ONNX, Format.OPENVINO_IR):
            raise UsageError(f"{flag} {art.path} is {art.format.value}: optkit profile takes ONNX models, OpenVINO "
                             "IR (and Keras / SavedModel with --logdir); convert it to ONNX first (optkit convert)")
    if logdir:
        raise UsageError("--logdir is for Keras / SavedModel models; for ONNX write a Chrome trace with --trace")
    if trace and (cfg.runtime == "openvino" or artifact.format == Format.OPENVINO_IR):
        raise UsageError("a Chrome trace (--trace) is onnxruntime's profiler's; OpenVINO's per-layer counters have "
                         "no timeline: drop --trace or profile on onnxruntime")
    if other is None:  # one model: the one-stage recipe (profile.onnx), through the recipe runner
        result = run_profile_stage(model, cfg, MeasureSettings(shapes=kwargs["shapes"], values=kwargs["values"]),
                                   data=shared.item(data), trace=trace, print_recipe=print_recipe)
        if result is None:  # --print-recipe: printed, nothing ran
            return
    else:  # two models side by side: both profiled whole, then compared (no recipe stage does this)
        kwargs["data"] = _dataset(data)
        b = run_isolated(profile_model, other, cfg.runtime, **kwargs, what=f"profiling {compare}")
        a = run_isolated(profile_model, artifact, cfg.runtime, **kwargs, trace=trace, what=f"profiling {model}")
        result = {"model": model, **_top(a, top)}
        both = prof.compare(a, b)
        result["compare"] = {"model": compare, "profile": _top(b, top), **both, "ops": both["ops"][:top],
                             "nodes": both["nodes"][:top], "matched": len(both["nodes"])}
    if as_json:
        common.print_json(strictjson.dumps(result, indent=2, nulls=True))
    else:
        _print_onnx(result, top)


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_cmd)

def _dataset(data: Optional[str]):
    if not data:
        return None
    from optkit.measure.datasets import load_dataset

    return load_dataset(data)


def run_profile_stage(model: str, cfg, settings, *, data: Optional[str], trace: Optional[str],
                      print_recipe: bool = False) -> Optional[dict]:
    """One model's profile as a one-stage recipe (profile.onnx) run by the recipe runner; the figures read from
    the report's stage (measurements.profile), the Chrome trace copied from beside the stage's output to --trace.
    None with print_recipe (printed, nothing ran)."""
    import shutil
    from pathlib import Path

    def keep(stage) -> None:
        p = stage.measurements["profile"]
        if trace and p.get("trace"):
            with atomic_path(trace) as tmp:
                shutil.copyfile(Path(stage.output.path).with_name(p["trace"]), tmp)
        stage.output.path = model  # the model, unchanged: profile's product is its figures

    report = onestage.run_recipe_stage("profile.onnx", model, cfg, settings=settings,
                                       command=f"optkit profile {model}", output=model, keep=keep,
                                       data={"eval": data} if data else None, print_recipe=print_recipe)
    if report is None:
        return None
    p = report.stages[-1].measurements["profile"]
    return {"model": model, **_top(p, cfg.top), "trace": str(trace) if trace and p.get("trace") else None}


def _top(p: dict, top: int) -> dict:
    return {**p, "ops": p["ops"][:top], "nodes": p["nodes"][:top]}


def _cut(name: str, width: int = NAME_WIDTH) -> str:
    return name if len(name) <= width else name[:8] + "..." + name[-(width - 11):]


def _table(title: str, columns: tuple[str, ...]):
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in columns:
        table.add_column(col, no_wrap=True, justify="right" if col in NUMERIC else "left")
    return table


def _summary_line(p: dict, label: str = "") -> str:
    verdict = "within" if p["within_10pct"] else "NOT within"
    how = (f"{p['runs']} calls profiled by OpenVINO's per-layer counters" if p.get("runtime") else
           f"{p['runs']} calls profiled; {p['total_raw_ms']:.4g} ms as recorded, less the profiler's "
           f"{p['profiler_overhead_us_per_kernel']:.2g} us per kernel measured here")
    line = (f"{label}{'layers' if p.get('runtime') else 'kernels'} {p['total_ms']:.4g} ms per call ({how}); "
            f"p50 latency {p['p50_ms']:.4g} ms: the per-op total is {p['total_vs_p50']:.2f}x the p50, {verdict} 10%")
    if p["total_vs_p50"] < 1 - 0.10 and p.get("call_overhead_us"):
        line += (f" (a call also costs about {p['call_overhead_us']:.2g} us outside its kernels: session.run, "
                 "feeds, outputs)")
    return line


def _print_onnx(r: dict, top: int) -> None:
    con = common.console()
    c = r.get("compare")
    if c is None:
        ops = _table(f"time per op type (top {top})", ("op", "nodes", "ms", "share"))
        for o in r["ops"]:
            ops.add_row(o["op"], str(o["nodes"]), f"{o['ms']:.4f}", f"{o['share']:.1%}")
        con.print(ops)
        kernels = any("kernel" in n for n in r["nodes"])  # OpenVINO names the kernel each layer ran
        nodes = _table(f"slowest nodes (top {top})", ("node", "op", *(("kernel",) if kernels else ()), "ms", "share"))
        for n in r["nodes"]:
            nodes.add_row(_cut(n["node"], 22 if kernels else NAME_WIDTH), n["op"],
                          *((_cut(n.get("kernel", ""), 18),) if kernels else ()), f"{n['ms']:.4f}", f"{n['share']:.1%}")
        con.print(nodes)
        con.print(_summary_line(r))
    else:
        con.print(f"a = {r['model']}")
        con.print(f"b = {c['model']}")
        ops = _table(f"time per op type (top {top} by change)", ("op", "a ms", "b ms", "delta ms"))
        for o in c["ops"]:
            ops.add_row(_cut(o["op"], 24), f"{o['a_ms']:.4f}", f"{o['b_ms']:.4f}", f"{o['delta_ms']:+.4f}")
        ops.add_row("total", f"{c['a_total_ms']:.4f}", f"{c['b_total_ms']:.4f}",
                    f"{c['b_total_ms'] - c['a_total_ms']:+.4f}")
        con.print(ops)
        nodes = _table(f"matched nodes (top {top} by change of {c['matched']})",
                       ("node (a)", "op in b", "a ms", "b ms", "delta"))
        for n in c["nodes"]:
            nodes.add_row(_cut(n["a_node"], 24), _cut(n["b_op"], 21), f"{n['a_ms']:.4f}", f"{n['b_ms']:.4f}",
                          f"{n['delta_ms']:+.4f}")
        con.print(nodes)
        for side, name in (("a", r["model"]), ("b", c["model"])):
            floats = c[f"float_in_{side}"]
            if floats:
                counts: dict[str, list] = {}
                for n in floats:
                    counts.setdefault(n["op"], []).append(n["ms"])
                said = ", ".join(f"{op} x{len(ms)} ({sum(ms):.4f} ms)" for op, ms in counts.items())
                con.print(f"float compute still running in the quantized model {side} ({name}): {said}")
        if not c["float_in_a"] and not c["float_in_b"]:
            con.print("float compute in a quantized model: none (or neither model runs quantized kernels)")
        con.print(_summary_line(r, "a: "))
        con.print(_summary_line(c["profile"], "b: "))
    for label, p in (("", r),) if c is None else (("a: ", r), ("b: ", c["profile"])):
        for note in p.get("notes", []):
            con.print(f"note: {label}{note}")
    if r.get("trace"):
        con.print(f"Chrome trace: {r['trace']} (open in https://ui.perfetto.dev or chrome://tracing)")


def _print_tf(r: dict, as_json: bool) -> None:
    if as_json:
        common.print_json(strictjson.dumps(r, indent=2, nulls=True))
        return
    con = common.console()
    con.print(f"TensorBoard profile of {r['runs']} calls in {r['logdir']} (p50 latency {r['p50_ms']:.4g} ms); "
              f"view it with: tensorboard --logdir {r['logdir']} (profile plugin: pip install tensorboard-plugin-profile)")
