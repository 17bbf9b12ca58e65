"""Preprocessing and post-processing into the graph (`preprocess.onnx`, `optkit preprocess`).

In front: optkit's own image preprocess spec (optkit.measure.preprocess.Preprocess, the `--preprocess` that
`optkit eval` takes) as ONNX ops, so the model takes what a client has: a uint8 RGB batch [N,H,W,3] (gray:
[N,H,W,1]) of any size, resized (shorter side computed from the shape, or fixed [h, w]; Resize opset 18 with
antialias as PIL), centre-cropped, scaled, normalized, laid out and cast in the graph. Behind: softmax + top-k on
a classifier's scores (`--top-k`), or a detector head's best anchors above a score threshold
(`--score-threshold`, `--max-detections`), so what leaves the model is smaller.

Checked like every pass: the preprocessed model against optkit's PIL path + the original model on real images
(--data, an image folder) or synthesized ones of several sizes (max scaled output difference within
`tolerance`, top-1 changed on at most `max_top1_changes` images), and the post-processing against numpy doing
the same on the model's own outputs. Past either, nothing is written (exit 3).

The written model's metadata_props["optkit.preprocess"] is JSON {"input": the new input, "outputs": the tensors
that feed the original model's input(s), "spec": the spec}: the boundary `optkit split` / `optkit package` cut at;
"optkit.postprocess" likewise names what replaced which outputs.
"""
from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pydantic import Field, field_validator

from optkit.core import strictjson
from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.errors import PassError, UsageError, ValidationError
from optkit.core.formats import Format
from optkit.core.registry import MAX_SAMPLES, Pass, PassConfig, PassContext, cli, register
from optkit.core.text import first_line
from optkit.measure.preprocess import parse_preprocess
from optkit.onnx import io as onnx_io
from optkit.passes.preprocess import graph as g
from optkit.passes.preprocess.check import check

META_PRE = "optkit.preprocess"
META_POST = "optkit.postprocess"
MAX_DETECTIONS = 100   # --max-detections when only --score-threshold is given
MAX_K = 2**31 - 1      # --top-k / --max-detections: TopK's k is an int64 in the graph; no model has more classes


class PreprocessConfig(PassConfig):
    preprocess: Optional[dict[str, Any]] = Field(
        default=None, description="The image preprocessing to put in the graph, as `optkit eval --preprocess` takes "
                                  "it (YAML/JSON), e.g. '{resize: 272, resample: bicubic, center_crop: 240, "
                                  "mean: 127, std: 128, scale: 1}'. The graph works on the crop, and refuses an "
                                  "image past 64M pixels as sent or once resized (docs/preprocess.md).",
        json_schema_extra=cli("--preprocess", kind="str", metavar="SPEC"))
    input_name: Optional[str] = Field(default=None, min_length=1, description="Name of the new uint8 image input "
                                                                          "(default: image, or image_uint8 where "
                                                                          "the model has that name).",
                            json_schema_extra=cli("--input-name"))
    top_k: Optional[int] = Field(default=None, ge=1, le=MAX_K,
                                 description="Classifiers: softmax + top-k in the graph; outputs scores and indices "
                                             "[N,K] instead of every class.",
                                 json_schema_extra=cli("--top-k"))
    scores_output: Optional[str] = Field(default=None, description="The class-score output --top-k reads (default: "
                                                                   "the only float [N, classes] output).",
                                         json_schema_extra=cli("--scores-output"))
    score_threshold: Optional[float] = Field(default=None, ge=-1e9, le=1e9, description="Detectors: keep anchors whose best class "
                                                                       "score is at least this (within the scores' "
                                                                       "range: 0..1 behind a Sigmoid/Softmax).",
                                             json_schema_extra=cli("--score-threshold"))
    max_detections: Optional[int] = Field(default=None, ge=1, le=MAX_K,
                                          description=f"Detectors: keep at most this many anchors, best first "
                                                      f"(default {MAX_DETECTIONS} with a threshold; at most the "
                                                      "head's anchors).",
                                          json_schema_extra=cli("--max-detections"))
    tolerance: float = Field(default=0.05, ge=0, le=1e6, description="Max output difference against PIL preprocessing + the "
                                                             "original model (scaled by max(1, |reference|)).",
                             json_schema_extra=cli("--tolerance", group="budgets"))
    max_top1_changes: int = Field(default=1, ge=0, le=MAX_SAMPLES, description="Checked images whose top-1 class may differ from "
                                                               "the PIL path's.",
                                  json_schema_extra=cli("--max-top1-changes", group="budgets"))
    check_samples: int = Field(default=256, ge=1, le=MAX_SAMPLES, description="Images the outputs are compared on (from --data, "
                                                              "else synthesized).",
                               json_schema_extra=cli("--check-samples", group="evaluation"))

    @field_validator("preprocess", mode="before")
    @classmethod
    def _spec(cls, v: Any) -> Any:

        if v is None:
            return None
        return parse_preprocess(v, "--preprocess").model_dump(mode="json", exclude_defaults=True)

    @field_validator("score_threshold", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        if v is not None and not (isinstance(v, (int, float)) and np.isfinite(v)):
            raise ValueError(f"{v!r} is not a finite number")
        return v


@register
class PreprocessOnnx(Pass):
    name = "preprocess.onnx"
    summary = "image preprocessing (uint8 in) and top-k / detection post-processing into the ONNX graph, checked"
    accepts = (Format.ONNX,)
    produces = Format.ONNX
    Config = PreprocessConfig
    keeps_inputs = False   # the result takes uint8 images: measured on its own, not against the input's data

    def run(self, artifact: Artifact, config: PreprocessConfig, ctx: PassContext) -> Artifact:
        import onnx


        detect = config.score_threshold is not None or config.max_detections is not None
        if config.preprocess is None and config.top_k is None and not detect:
            raise UsageError("nothing to put in the graph: give --preprocess SPEC, --top-k K, or --score-threshold / "
                             "--max-detections")
        if config.top_k is not None and detect:
            raise UsageError("--top-k is for classifiers, --score-threshold / --max-detections for detectors; give "
                             "one kind")
        pre = parse_preprocess(config.preprocess) if config.preprocess is not None else None
        source = onnx_io.load(artifact.path)
        _not_twice(source, artifact.path, pre is not None, config.top_k is not None or detect)
        model = copy.deepcopy(source)
        record = None
        if pre is not None:
            g.image_input(model, pre)  # a spec that does not fit is refused before any work
        # Resize's antialias needs opset 18; post-processing alone Softmax(axis=-1) and TopK's k input: 13
        target = g.MIN_OPSET if pre is not None else 13
        try:
            model, opset = g.upgrade_opset(model, target)
        except Exception as e:  # noqa: BLE001  onnx's converter has no adapter for some op
            raise PassError(f"cannot upgrade {artifact.path} from opset {g.opset(model)} to {target}: "
                            f"{first_line(e)[:200]}") from None
        if opset < target:
            ctx.note(f"opset upgraded {opset} -> {target} (onnx version converter)")
        if pre is not None:
            model, record = g.add_preprocess(model, pre, config.input_name)
        pre_model = copy.deepcopy(model)
        heads = None
        if config.top_k is not None:
            heads = g.add_topk(model, config.top_k, config.scores_output)
        elif detect:
            heads = g.add_detections(model, config.score_threshold, config.max_detections, MAX_DETECTIONS)
        _meta(model, META_PRE, record)
        if heads is not None:
            _meta(model, META_POST, {"kind": heads.kind, "replaced": heads.replaced, "outputs": heads.outputs,
                                     **heads.details})
        tmp = Path(tempfile.mkdtemp(prefix="optkit-preprocess-"))
        try:
            paths = {}
            for key, m in (("pre", pre_model), ("final", model)):
                paths[key] = tmp / f"{key}.onnx"
                try:
                    onnx.checker.check_model(m)
                except Exception as e:  # noqa: BLE001  our graph edit made an invalid model: a pass failure
                    raise PassError(f"the model with pre/post-processing is invalid: {first_line(e)[:200]}") from None
                onnx_io.save(m, paths[key])

            figures = check(artifact, pre, heads, paths, config, ctx)
            with atomic_path(ctx.output) as out_tmp:
                shutil.copyfile(paths["final"], out_tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        ctx.measurements["preprocess"] = figures
        return artifact.derive(ctx.output, Format.ONNX, self.name, config.model_dump(mode="json"))


def _not_twice(model, path, pre: bool, post: bool) -> None:
    """Exit 2 when the model already holds what this run would add: preprocessing in front of an input that takes
    uint8 images already (a second resize/normalize on top of the first), or top-k / detections on outputs that
    are top-k / detections already (softmax over the kept scores, indices into the kept rows: silently wrong).
    The metadata optkit wrote is the record; a model from before `optkit preprocess` is what to give."""
    keys = {p.key for p in model.metadata_props}
    for wanted, key, flag in ((pre, META_PRE, "--preprocess"), (post, META_POST, "--top-k / --score-threshold")):
        if wanted and key in keys:
            raise UsageError(f"{path} has {'pre' if key == META_PRE else 'post'}-processing in its graph already "
                             f"(metadata {key}, written by optkit preprocess); give the model from before it, or "
                             f"leave out {flag}")


def _meta(model, key: str, value: Any) -> None:
    if value is None:
        return
    for p in list(model.metadata_props):
        if p.key == key:
            model.metadata_props.remove(p)
    entry = model.metadata_props.add()
    entry.key, entry.value = key, strictjson.dumps(value, sort_keys=True)


__all__ = ["META_POST", "META_PRE", "PreprocessConfig", "PreprocessOnnx", "ValidationError"]
