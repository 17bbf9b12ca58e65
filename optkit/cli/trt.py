"""optkit trt build MODEL.onnx -o MODEL.engine | optkit trt check MODEL.onnx"""
from __future__ import annotations

import os
from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core import strictjson
from optkit.core.errors import PassError, UsageError
from optkit.core.formats import Format
from optkit.core.text import printable

trt_app = typer.Typer(
    name="trt", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="TensorRT: build an engine from ONNX (needs an NVIDIA GPU), or check a model for TensorRT on any machine.",
)

def register(app: typer.Typer) -> None:
    app.add_typer(trt_app, name="trt")


@trt_app.command("build")
@flags.pass_options("tensorrt.build")
@flags.groups("data", "metric_optional", "provider", "timing", "output", "print_recipe")
def build_cmd(
    model: str = typer.Argument(..., help="ONNX model (e.g. the QDQ output of `optkit quantize`)."),
    output: str = options.output_file("Engine file to write (.engine or .plan)."),
    no_timing_cache: bool = typer.Option(False, "--no-timing-cache", help="Build without a timing cache."),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help="Time the engine replayed from a CUDA graph."),
    *,
    config: dict,
    shared: options.Shared,
) -> None:
    """Build a TensorRT engine from an ONNX model, check it against the model, and measure both."""
    from optkit.core.registry import build_config
    from optkit.measure.model import DataSpec
    from optkit.passes import get_pass
    from optkit.passes.tensorrt.check import opt_shapes, parse_profiles

    if no_timing_cache:
        if "timing_cache" in config:
            raise UsageError("give timing_cache (--timing-cache) or --no-timing-cache, not both")
        config["timing_cache"] = None
    cache = config.get("timing_cache", flags.default("tensorrt.build", "timing_cache"))
    cache_file = None if cache in (None, "", "auto") else cache
    common.guard_outputs({"-o": output, "--report": shared.report, "--timing-cache": cache_file},
                         common.inputs_of(shared, {"MODEL": model}))
    if shared.metric and not shared.data:
        raise UsageError("metric (--metric) needs data (--data)")
    if "profile" in config:
        config["profile"] = parse_profiles(config["profile"])
    build_config(get_pass("tensorrt.build"), config)  # bad options fail before any work
    if cuda_graphs:
        os.environ["OPTKIT_TRT_CUDA_GRAPHS"] = "1"  # read by the TensorRT session in the measuring process
    settings = shared.settings(shapes=opt_shapes(config.get("profile", {})))
    common.run_single_stage(
        "tensorrt.build", model, output, config, command=f"optkit trt build {model}", settings=settings,
        eval_data=DataSpec(path=shared.data) if shared.data else None, metric=shared.metric,
        report_path=shared.report, as_json=shared.as_json, print_recipe=shared.print_recipe,
    )


@trt_app.command("check")
@flags.pass_options("tensorrt.build", only=("profile",))  # the build's --shape, MIN:OPT:MAX profiles included
@flags.groups("json")
def check_cmd(
    model: str = typer.Argument(..., help="ONNX model to check."),
    precision: Optional[str] = typer.Option(None, "--precision", help="Check for this build precision (int8 needs Q/DQ)."),
    strict: bool = typer.Option(False, "--strict", help="Treat warnings as blocking too."),
    *,
    config: dict,
    shared: options.Shared,
) -> None:
    """What can be checked without a GPU: unsupported ops, plugin ops, dynamic dims without a profile, Q/DQ
    placements TensorRT rejects; and whether the installed onnxruntime can run ONNX models on TensorRT
    (--provider tensorrt). Exit 0 when nothing blocks a build, 3 when something does (--strict: warnings too).
    """
    from optkit.passes.tensorrt.check import check_model, parse_profiles
    from optkit.runtimes.tensorrt import ort_tensorrt_status

    artifact = common.load_artifact(model)
    if artifact.format != Format.ONNX:
        raise UsageError(f"optkit trt check reads ONNX models; {model} is {artifact.format.value}")
    if precision not in (None, "fp32", "fp16", "bf16", "int8"):
        raise UsageError(f"unknown --precision {precision!r}; choose fp32, fp16, bf16 or int8")
    result = check_model(artifact.path, shapes=parse_profiles(config.get("profile")), precision=precision)
    ort_status = ort_tensorrt_status()
    if shared.as_json:
        common.print_json(strictjson.dumps({**result.to_dict(strict), "onnxruntime": ort_status}, indent=2))
    else:
        _render(result, strict)
        _render_ort(ort_status)
    blocking = result.blocking(strict)
    if blocking:
        kinds = "problem" if len(blocking) == 1 else "problems"
        raise PassError(f"{len(blocking)} {kinds} would block a TensorRT build of {model}: {blocking[0].message}")


def _render(result, strict: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    con = common.console()
    con.print(Text(printable(result.model), "bold"), f" opset {result.opset}, {result.nodes} nodes"
              + (", explicitly quantized (Q/DQ)" if result.quantized else ""))
    con.print(f"checked against {result.table}")
    if not result.findings:
        con.print("no problems found", style="green")
        return
    table = Table("severity", "check", "node", "op", "finding", title_justify="left")
    style = {"error": "red", "warning": "yellow", "info": "dim"}
    for f in result.findings:
        table.add_row(Text(f.severity, style[f.severity]), f.code, f.node or "", f.op or "",
                      f.message)
    con.print(table)
    blocking = result.blocking(strict)
    con.print(f"{len(result.errors)} error(s), {len(result.warnings)} warning(s)"
              + (": nothing blocks a build" if not blocking else ""))


def _render_ort(status: dict) -> None:
    con = common.console()
    if status["tensorrt"]:
        con.print(f"onnxruntime {status['version']}: TensorRT and CUDA providers available (--provider tensorrt)")
    else:
        con.print(f"--provider tensorrt: {status['why']}", style="yellow")
