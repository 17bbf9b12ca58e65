"""convert.hf: a Hugging Face transformers / sentence-transformers folder -> validated ONNX.

The exporter is torch.onnx.export(dynamo=True) of the task's module (runtimes.hf_model: the transformers model and,
for sentence embeddings, sentence-transformers' pooling, Dense and Normalize as optkit writes them), with the
batch and sequence axes dynamic; the TorchScript exporter only where dynamo fails (noted). docs/hf.md says why
not transformers' own exporters or optimum. The file is checked (onnx.checker, standard ops only) and validated
(hf_check) before it is renamed into place; its tokenizer travels with it by core.preprocessor's rule (the
pipeline stage writes OUT.preprocessor/ and its record).
"""
from __future__ import annotations

import time
from types import SimpleNamespace

from optkit.core import trust
from optkit.core.artifact import Artifact
from optkit.core.errors import OptkitError, PassError, UsageError
from optkit.core.formats import Format
from optkit.core.registry import PassContext, require_extra
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx.io import Staging
from optkit.onnx.session import ort_session
from optkit.passes.convert import hf_check, hf_inputs
from optkit.passes.convert.common import check_model, unsupported_nodes
from optkit.passes.convert.torch import export_module
from optkit.runtimes import hf_model

PASS = "convert.hf"
TASK_KEY = "optkit.task"   # ONNX metadata: the task the model was exported for


def convert_hf(artifact: Artifact, config, ctx: PassContext) -> Artifact:
    require_extra("hf", PASS)
    import torch

    start = time.perf_counter()
    spec = hf_model.describe(artifact.path, config.task)
    inputs = _preprocessor(spec)   # the tokenizer (or image processor) checked before the model is loaded
    module, names = hf_model.load(spec)
    batches, where = _batches(spec, names, inputs, ctx, config)
    ref = hf_check.run(module, batches, names)
    out_names = list(spec.outputs)
    example = tuple(torch.from_numpy(batches[0][n]) for n in names)
    dynamic = {n: ({0: "batch"} if n == "pixel_values" else {0: "batch", 1: "sequence"}) for n in names}
    specs = [TensorSpec(n, list(batches[0][n].shape), str(batches[0][n].dtype)) for n in names]
    with Staging(ctx.output) as stage:
        try:
            used, opset, got = _export_checked(module, example, specs, out_names, dynamic, config.opset, stage,
                                               batches, names, config, ctx)
        except _RuntimeFailure as e:
            if config.opset is not None:
                raise PassError(str(e)) from None
            # onnxruntime may not run every op of the newest opset (opset 23's RotaryEmbedding and Attention,
            # fused by the exporter's optimizer, with the shapes a causal LM gives them): one opset older
            used, opset, got = _export_checked(module, example, specs, out_names, dynamic, e.opset - 1, stage,
                                               batches, names, config, ctx)
            ctx.note(f"onnxruntime could not run the opset {e.opset} export ({e.detail}); exported at opset "
                     f"{opset}")
        _stamp_task(stage.model, spec.task)
        ref64 = hf_check.float64_reference(module, batches, names)
        outputs = hf_check.judge(out_names, batches, got, ref, ref64, config.atol, config.rtol,
                                 f"the {hf_model.TASKS[spec.task][0]} model (transformers)")
        figures = {"task": spec.task, "inputs": where, "exporter": used, "opset": opset,
                   "reference": _versions(), "outputs": outputs, "source_dtype": spec.source_dtype}
        st = _sentence_transformers(spec, batches, names, got, outputs, config)
        if st is not None:
            figures["sentence_transformers"] = st
        if spec.source_dtype not in ("float32", "None"):
            ctx.note(f"weights stored as {spec.source_dtype} were exported as float32 (optkit quantize --mode fp16 "
                     "makes a float16 file)")
        figures["seconds"] = round(time.perf_counter() - start, 2)
        ctx.measurements["validation"] = figures
        stage.commit()
    return artifact.derive(ctx.output, Format.ONNX, PASS, config.model_dump(mode="json"), task=spec.task,
                           input_names=names, output_names=out_names, exporter=used, opset=figures["opset"])


def _preprocessor(spec):
    if spec.image:
        transformers = hf_model.import_transformers()
        try:
            return transformers.AutoImageProcessor.from_pretrained(
                str(spec.folder), local_files_only=True, trust_remote_code=trust.trusted())
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"{spec.folder} has no image processor transformers can read "
                             f"(preprocessor_config.json): {first_line(e)}") from None
    tok = hf_model.tokenizer(spec)
    if tok.pad_token is None:   # causal LMs often have none: padding only for the comparison, masked out
        tok.pad_token = tok.eos_token or tok.unk_token or tok.convert_ids_to_tokens(0)
    tok.padding_side = "right"
    return tok


def _batches(spec, names, pre, ctx, config):
    if names == ["pixel_values"]:
        batches, where = hf_inputs.image_batches(pre, ctx.seed)
    else:
        batches, where = hf_inputs.text_batches(pre, names, spec.task, _limit(spec, pre))
    user = hf_inputs.data_batch(ctx.data.get("eval") or ctx.data.get("calibration"), names, config.samples, ctx.seed)
    if user is not None:
        batches.insert(0, user)
        where = f"{len(next(iter(user.values())))} rows of the data, and {where}"
    return batches, where


def _limit(spec, tok) -> int:
    """The longest sequence the model takes (its position table, the tokenizer's limit)."""
    limits = [int(spec.config.get("max_position_embeddings") or 0) or 512,
              int(getattr(tok, "model_max_length", 0) or 0) or 512]
    if spec.config.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        limits[0] -= 2   # their positions start after the padding index
    return max(8, min(limits))


class _RuntimeFailure(Exception):
    def __init__(self, opset: int, detail: str):
        super().__init__(f"onnxruntime cannot run the exported model (opset {opset}): {detail}")
        self.opset, self.detail = opset, detail


def _export_checked(module, example, specs, out_names, dynamic, opset, stage, batches, names, config, ctx):
    """Export into the staging folder, check the file, run it on the batches: (exporter, opset, outputs)."""
    used = export_module(module, module, example, specs, out_names, dynamic,
                         SimpleNamespace(exporter="dynamo", fallback=True, opset=opset), stage.model, ctx)
    proto = onnx_io.load(stage.model, external_data=False)
    bad = unsupported_nodes(proto)
    if bad:
        raise PassError(f"the exported model contains op {bad[0][0]}::{bad[0][1]} (node {bad[0][2]!r}), not a "
                        "standard ONNX operator; onnxruntime cannot run it")
    stage.finalize(config.external_data, ctx)
    check_model(stage.model)
    got_opset = graph.opset(proto)
    try:
        sess = ort_session(stage.model)
        got = [[o.astype("float64") for o in sess.run(None, {n: b[n] for n in names})] for b in batches]
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors
        raise _RuntimeFailure(got_opset, first_line(e)[:300]) from None
    return used, got_opset, got


def _stamp_task(path, task: str) -> None:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    for p in [p for p in proto.metadata_props if p.key == TASK_KEY]:
        proto.metadata_props.remove(p)
    proto.metadata_props.add(key=TASK_KEY, value=task)
    onnx.save_model(proto, str(path))


def _versions() -> str:
    import torch
    import transformers

    return f"transformers {transformers.__version__}, torch {torch.__version__.split('+')[0]}"


def _sentence_transformers(spec, batches, names, got, outputs, config) -> dict | None:
    """Where sentence-transformers is installed and the folder is one of its models: its own forward on the same
    tokens, against the ONNX outputs (the pooling optkit writes must be sentence-transformers')."""
    if spec.task != "sentence-embeddings" or not (spec.folder / "modules.json").is_file():
        return None
    try:
        import sentence_transformers
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    import torch

    model = SentenceTransformer(str(spec.folder), device="cpu", local_files_only=True,
                                trust_remote_code=trust.trusted()).eval()
    ref = []
    with torch.inference_mode():
        for b in batches:
            feats = model({n: torch.from_numpy(b[n]) for n in names})
            ref.append([feats[n].double().numpy() for n in spec.outputs])
    tolerances = {n: f["tolerance"] for n, f in outputs.items()}   # the same as against transformers
    figures = hf_check.judge(list(spec.outputs), batches, got, ref, None, tolerances, config.rtol,
                             f"sentence-transformers {sentence_transformers.__version__}")
    return {"version": sentence_transformers.__version__,
            "outputs": {n: {k: f[k] for k in ("max_abs_error", "max_rel_error", "min_cosine")}
                        for n, f in figures.items()}}
