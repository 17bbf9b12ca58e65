"""optkit trt build MODEL.onnx -o MODEL.engine | optkit trt check MODEL.onnx"""
from __future__ import annotations

import json
import os
from typing import Optional

import typer

from optkit.cli import common, options
from optkit.core.errors import PassError, UsageError
from optkit.core.formats import Format
from optkit.core.text import printable

trt_app = typer.Typer(
    name="trt", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="TensorRT: build an engine from ONNX (needs an NVIDIA GPU), or check a model for TensorRT on any machine.",
)

PROFILE_SHAPE = typer.Option(
    None, "--shape",
    help="Input shape: name=1x3x224x224 (fixed) or name=MIN:OPT:MAX for a dynamic-shape optimization profile, "
         "e.g. input=1x3x224x224:8x3x224x224:32x3x224x224 (repeatable).")


def register(app: typer.Typer) -> None:
    app.add_typer(trt_app, name="trt")


@trt_app.command("build")
def build_cmd(
    model: str = typer.Argument(..., help="ONNX model (e.g. the QDQ output of `optkit quantize`)."),
    output: str = typer.Option(..., "-o", "--output", help="Engine file to write (.engine or .plan)."),
    precision: str = typer.Option("fp16", "--precision",
                                  help="fp32, fp16, bf16, or int8 (int8 needs a Q/DQ model: no calibration)."),
    strongly_typed: Optional[bool] = typer.Option(
        None, "--strongly-typed/--weakly-typed",
        help="Strongly typed network: precision comes from the model's types (fp16/bf16: the model is cast first). "
             "Default: strongly typed for int8 and wherever TensorRT has no precision flags (TensorRT 11); "
             "--weakly-typed uses TensorRT 10's FP16/BF16/INT8 builder flags."),
    shape: Optional[list[str]] = PROFILE_SHAPE,
    workspace_mb: Optional[int] = typer.Option(None, "--workspace-mb", min=1, help="Workspace memory limit (MiB)."),
    opt_level: int = typer.Option(3, "--opt-level", min=0, max=5, help="Builder optimization level 0-5."),
    timing_cache: str = typer.Option("auto", "--timing-cache",
                                     help="Timing cache file, loaded and saved on every build ('auto': per-user)."),
    no_timing_cache: bool = typer.Option(False, "--no-timing-cache", help="Build without a timing cache."),
    no_tf32: bool = typer.Option(False, "--no-tf32", help="Disallow TF32 for fp32 layers."),
    tolerance: Optional[float] = typer.Option(None, "--tolerance", min=0.0,
                                              help="Max |engine - onnx| / max|onnx| (default by precision)."),
    no_validate: bool = typer.Option(False, "--no-validate", help="Skip comparing the engine with the ONNX model."),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help="Time the engine replayed from a CUDA graph."),
    provider: str = typer.Option("cpu", "--provider", help="onnxruntime provider for measuring the ONNX input."),
    warmup: int = typer.Option(10, "--warmup", min=0, help="Untimed runs first."),
    runs: int = typer.Option(100, "--runs", min=1, help="Timed runs."),
    data: Optional[str] = options.DATA,
    metric: Optional[str] = options.METRIC_OPTIONAL,
    report: Optional[str] = options.OUTPUT_REPORT,
    as_json: bool = options.JSON,
    print_recipe: bool = options.PRINT_RECIPE,
) -> None:
    """Build a TensorRT engine from an ONNX model, check it against the model, and measure both."""
    from optkit.measure.model import DataSpec, MeasureSettings
    from optkit.passes.tensorrt.check import opt_shapes, parse_profiles

    cache_file = None if no_timing_cache or timing_cache == "auto" else timing_cache
    common.guard_outputs({"-o": output, "--report": report, "--timing-cache": cache_file}, [model, data])
    if precision not in ("fp32", "fp16", "bf16", "int8"):
        raise UsageError(f"unknown --precision {precision!r}; choose fp32, fp16, bf16 or int8")
    if metric and not data:
        raise UsageError("--metric needs --data")
    profiles = parse_profiles(shape)
    config = {
        "precision": precision, "strongly_typed": strongly_typed, "profile": profiles,
        "workspace_mb": workspace_mb, "optimization_level": opt_level,
        "timing_cache": None if no_timing_cache else timing_cache, "tf32": not no_tf32,
        "validate_output": not no_validate, "tolerance": tolerance or None,
    }
    if cuda_graphs:
        os.environ["OPTKIT_TRT_CUDA_GRAPHS"] = "1"  # read by the TensorRT session in the measuring process
    settings = MeasureSettings(provider=provider, warmup=warmup, runs=runs, shapes=opt_shapes(profiles))
    common.run_single_stage(
        "tensorrt.build", model, output, config, command=f"optkit trt build {model}", settings=settings,
        eval_data=DataSpec(path=data) if data else None, metric=metric, report_path=report, as_json=as_json,
        print_recipe=print_recipe,
    )


@trt_app.command("check")
def check_cmd(
    model: str = typer.Argument(..., help="ONNX model to check."),
    shape: Optional[list[str]] = PROFILE_SHAPE,
    precision: Optional[str] = typer.Option(None, "--precision", help="Check for this build precision (int8 needs Q/DQ)."),
    strict: bool = typer.Option(False, "--strict", help="Treat warnings as blocking too."),
    as_json: bool = options.JSON,
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
    result = check_model(artifact.path, shapes=parse_profiles(shape), precision=precision)
    ort_status = ort_tensorrt_status()
    if as_json:
        common.print_json(json.dumps({**result.to_dict(strict), "onnxruntime": ort_status}, indent=2))
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
