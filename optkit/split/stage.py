"""`split.onnx`: `optkit split` as a recipe stage (pipeline/kinds.py lists it). Its options are data, SplitConfig,
as every pass's are (the command's flags are derived from it). The stage passes its model through unchanged (the
next stage takes the whole model) and writes the parts beside it, in the stage's folder (PARTS/: pre.onnx,
core.onnx, post.onnx and split.json, as `optkit split -o` writes them); split.json's document is the stage's
`measurements.split`, which a later `package:` entry of this stage serves as an ensemble, in memory
(package.ensemble.from_split). `optkit split` is this stage's one-stage recipe; it commits PARTS/ to its -o."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from optkit.core.artifact import Artifact
from optkit.core.atomic import PathRole
from optkit.core.errors import UsageError
from optkit.core.formats import Format
from optkit.core.registry import Pass, PassConfig, PassContext, cli
from optkit.onnx.io import copy_model
from optkit.split import split_model
from optkit.split.graph import parse_dims
from optkit.split.placement import PROVIDERS

PARTS = "parts"


class SplitConfig(PassConfig):
    provider: str = Field(default="tensorrt", description="Where the core part runs: tensorrt (trt check's table of "
                                                         "what TensorRT builds), cuda (onnxruntime's CUDA provider's "
                                                         "ops); cpu has nothing to split.",
                          json_schema_extra=cli("--provider", metavar="[tensorrt|cuda|cpu]"))
    cut: list[str] = Field(default_factory=lambda: ["auto"],
                           description="auto (the cut with the fewest bytes crossing CPU<->GPU per sample), preprocess "
                                       "(at the boundary optkit preprocess recorded; what optkit package cuts at) or "
                                       "node names whose outputs are the cut points (repeatable; default: auto).",
                           json_schema_extra=cli("--cut"))
    dims: list[str] = Field(default_factory=list,
                            description="Size of a dynamic input dim, NAME=SIZE (repeatable; default: the data's "
                                        "sizes, else batch 1, images 224, stated in the report; one the data "
                                        "contradicts is refused).", json_schema_extra=cli("--dim"))
    data: Annotated[str | None, PathRole("input")] = Field(
        default=None, description="Sample inputs the chain of parts is checked on: an .npz with one array per input "
                                  "or, for a model taking uint8 images, an image folder (its first image); it sizes "
                                  "the dynamic dims `dims` does not name (default: synthesized inputs).",
        json_schema_extra=cli(recipe_only="the command's --data (a shared option)"))

    @field_validator("provider")
    @classmethod
    def _provider(cls, v: str) -> str:
        if v not in PROVIDERS:
            raise ValueError(f"unknown --provider {v!r}; choose {', '.join(PROVIDERS)}")
        return v

    @field_validator("dims")
    @classmethod
    def _dims(cls, v: list[str]) -> list[str]:
        try:
            parse_dims(v)  # NAME=SIZE, each once
        except UsageError as e:
            raise ValueError(e.message) from None
        return v


class SplitOnnx(Pass):
    name = "split.onnx"
    summary = "CPU / GPU / CPU parts where the fewest bytes cross, checked bit-exact (the model passes through)"
    accepts = (Format.ONNX,)
    produces = Format.ONNX
    Config = SplitConfig
    measured = False
    recipe_paths = True

    def run(self, artifact: Artifact, config: SplitConfig, ctx: PassContext) -> Artifact:
        cuts = "auto" if config.cut in ([], ["auto"]) else config.cut
        parts = Path(ctx.output).parent / PARTS
        doc = split_model(Path(artifact.path), parts, provider=config.provider, cuts=cuts, dims=config.dims,
                          data=config.data)
        ctx.measurements["split"] = doc
        ctx.note(f"split into {', '.join(p['name'] for p in doc['parts'])} ({doc['cut']} cut), beside the model in "
                 f"{PARTS}/" if doc["parts"] else f"nothing to split: {doc['nothing_to_split']}")
        copy_model(artifact.path, ctx.output)
        return Artifact.load(str(ctx.output))


def parts_of(stage) -> Path | None:
    """The parts folder of a split stage (a report Stage), or None when it split nothing."""
    doc = stage.measurements.get("split") if isinstance(stage.measurements, dict) else None
    return Path(stage.output.path).parent / PARTS if isinstance(doc, dict) and doc.get("parts") else None
