"""profile.onnx: where an ONNX model's time goes (onnxruntime's profiler), as a recipe stage.

The model passes through unchanged (written with onnx.io.copy_model); the figures go in the stage's
measurements under "profile": the per-call kernel total, the top op types and nodes, the p50 latency measured in
the same process, and the Chrome trace's file name (written beside the output, for Perfetto or
chrome://tracing; at most 100 MB: whole profiled calls, the first that fit). A large graph gets fewer calls than
`runs` (nodes x calls stays under measure.profile.EVENT_BUDGET): `runs` in the figures is the number profiled, and
the stage's notes say why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from optkit.core.artifact import Artifact
from optkit.core.formats import Format
from optkit.core.registry import MAX_THREADS, Pass, PassConfig, PassContext, cli, register
from optkit.measure.model import max_threads
from optkit.measure.profile import MAX_RUNS
from optkit.measure.profile_ov import profile_model
from optkit.onnx.io import copy_model
from optkit.passes.convert.openvino import copy_ir

TOP_NODES = 20


class ProfileConfig(PassConfig):
    top: int = Field(default=10, ge=1, le=1000, description="Op types and nodes shown (and kept in the figures).",
                     json_schema_extra=cli("--top"))
    runs: int = Field(default=50, ge=1, le=MAX_RUNS,
                      description="Profiled calls (after 10 warm-up calls); fewer on a large graph: nodes x calls "
                                  "stays under 200,000 (the output says so).",
                      json_schema_extra=cli("--runs", group="measurement"))
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS, description="Intra-op threads (default: the "
                                                                                 "runtime's).",
                                json_schema_extra=cli("--threads", group="measurement"))
    runtime: Literal["onnxruntime", "openvino"] | None = Field(
        default=None, description="The runtime profiled: onnxruntime (its profiler; the default for ONNX) or openvino "
                                  "(the CPU plugin's per-layer counters, each with the kernel it ran; an OpenVINO IR "
                                  "always).",
        json_schema_extra=cli(recipe_only="the command's --runtime sets it"))
    trace: bool = Field(default=True, description="Write the Chrome trace beside the output.",
                        json_schema_extra=cli(recipe_only="a stage writes its trace beside its output; the command's "
                                                          "--trace names the file instead"))


    @field_validator("threads")
    @classmethod
    def _threads(cls, v: int | None) -> int | None:
        if v is not None and v > max_threads():  # bench's rule: 100,000 threads were started, and hung
            raise ValueError(f"{v} threads is more than {max_threads()} (4x the CPUs here, at least 64)")
        return v


def trace_path(output: Path) -> Path:
    return output.with_name(output.name.removesuffix(".onnx") + ".trace.json")


@register
class ProfileOnnx(Pass):
    name = "profile.onnx"
    summary = "onnxruntime's profiler: time per op type and node (and a Chrome trace); the model is unchanged"
    accepts = (Format.ONNX, Format.OPENVINO_IR)
    produces = Format.ONNX
    Config = ProfileConfig

    def run(self, artifact: Artifact, config: ProfileConfig, ctx: PassContext) -> Artifact:
        output = Path(ctx.output)
        data = ctx.data.get("eval") if ctx.data.get("eval") is not None else ctx.data.get("calibration")
        on_ov = config.runtime == "openvino" or artifact.format == Format.OPENVINO_IR
        trace = trace_path(output) if config.trace and not on_ov else None
        prof = profile_model(artifact, config.runtime, runs=config.runs, threads=config.threads, shapes=ctx.shapes,
                             values=ctx.values, data=data, trace=trace, seed=ctx.seed)
        if artifact.format == Format.OPENVINO_IR:
            output = output.with_suffix(".xml")
            copy_ir(artifact.path, output)
        else:
            copy_model(artifact.path, output)
        # every figure the profiler gives; the op types cut to `top`, the nodes to `top` (at least TOP_NODES)
        ctx.measurements["profile"] = {
            **prof, "ops": prof["ops"][: config.top], "nodes": prof["nodes"][: max(config.top, TOP_NODES)],
            "trace": trace.name if trace else None, "threads": config.threads, "runs_asked": config.runs,
            "trace_calls": prof.get("trace_calls"), "notes": prof.get("notes", []),
        }
        for text in prof.get("notes", []):
            ctx.note(f"profile: {text}")
        ctx.note(f"profile: kernels {prof['total_ms']:.3g} ms per call, p50 {prof['p50_ms']:.3g} ms "
                 f"({prof['total_vs_p50']:.2f}x)" + (f"; Chrome trace {trace.name} beside the model" if trace else ""))
        return artifact.derive(output, artifact.format, self.name, config.model_dump(mode="json"))
