"""convert.openvino: an ONNX model -> OpenVINO IR (NAME.xml + NAME.bin), validated against onnxruntime.

ov.convert_model reads the ONNX file and ov.save_model writes the IR with the weights as they are (no fp16
compression: an FP32 model stays FP32). The IR is written into a temporary folder beside the destination,
run on OpenVINO on the validation inputs against onnxruntime on the ONNX file, and renamed into place only
when every output is within tolerance: the .bin first, then the .xml (the file a reader opens), so an interrupted
run leaves no .xml that looks like a result. A quantized (QDQ) model runs int8 on OpenVINO and rounds unlike
onnxruntime at each requantization: its outputs are judged by cosine similarity (QDQ_MIN_COSINE) unless
--atol / --rtol are given."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.batching import run_batched
from optkit.core.errors import ValidationError
from optkit.core.formats import Format, ir_weights
from optkit.core.interrupts import check as check_interrupted
from optkit.core.registry import PassContext
from optkit.measure.fidelity import compare_outputs
from optkit.onnx.graph import all_nodes
from optkit.onnx.io import load
from optkit.onnx.session import input_specs, ort_session
from optkit.passes.convert.common import validate, validation_feeds
from optkit.runtimes.openvino import OpenVINOSession, save_ir

QDQ_MIN_COSINE = 0.995   # a QDQ model's outputs on OpenVINO against onnxruntime's (measured: >= 0.999 on CNNs)


def convert_openvino(artifact: Artifact, config, ctx: PassContext) -> Artifact:
    dest = Path(ctx.output)
    quantized = any(n.op_type == "QuantizeLinear" for n in all_nodes(load(artifact.path, external_data=False).graph))
    with tempfile.TemporaryDirectory(prefix=".optkit-ir-", dir=dest.parent) as tmp:
        staged = Path(tmp) / "model.xml"
        save_ir(artifact.path, staged)
        figures = _validate(artifact, Artifact.load(staged), config, ctx, quantized)
        ctx.measurements["validation"] = figures
        check_interrupted()
        os.replace(ir_weights(staged), ir_weights(dest))
        os.replace(staged, dest)
    ctx.note(f"OpenVINO IR {dest.name} + {ir_weights(dest).name}, checked against onnxruntime on "
             f"{figures['inputs']}")
    return artifact.derive(dest, Format.OPENVINO_IR, "convert.openvino", config.model_dump(mode="json"))


def _validate(onnx: Artifact, ir: Artifact, config, ctx: PassContext, quantized: bool) -> dict:
    ref_sess = ort_session(onnx.path)
    specs = input_specs(ref_sess, onnx.path)
    feeds, labels, source = validation_feeds(ctx, specs, config)
    names = [o.name for o in ref_sess.get_outputs()]
    ref = run_batched(lambda f: ref_sess.run(names, f), specs, feeds, 64)
    sess = OpenVINOSession(ir)
    out = run_batched(sess.run, specs, feeds, 64)
    sess.close()
    if quantized and config.atol is None and config.rtol is None:
        figures = compare_outputs(ref, out, names)
        for name, f in figures["outputs"].items():
            if f.get("cosine", 1.0) < QDQ_MIN_COSINE:
                raise ValidationError(f"output {name!r} of the quantized model on OpenVINO is off onnxruntime's: "
                                      f"cosine {f['cosine']:.4f} < {QDQ_MIN_COSINE}; nothing written (give --atol "
                                      "/ --rtol to judge by tolerance instead)")
    else:
        dtypes = [str(r.dtype) for r in ref]
        figures = validate(ref, out, names, dtypes, config, "onnxruntime (the ONNX file)", labels)
    figures["inputs"] = source
    return figures


def copy_ir(src: str | Path, dest: str | Path) -> None:
    """Copy an OpenVINO IR atomically: its weights (.bin) first, then the .xml a reader opens."""
    for a, b in ((ir_weights(src), ir_weights(dest)), (Path(src), Path(dest))):
        with atomic_path(b) as tmp:
            shutil.copyfile(a, tmp)
