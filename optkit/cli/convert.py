"""optkit convert SRC -o OUT.onnx: PyTorch, TensorFlow and Hugging Face models to validated ONNX; an ONNX model
to OpenVINO IR with -o OUT.xml."""
from __future__ import annotations

import typer

from optkit.cli import common, flags, options
from optkit.core.errors import UsageError
from optkit.core.formats import Format, detect_format
from optkit.core.shapes import parse_shapes

TORCH_FORMATS = ("torch-module", "torchscript", "torch-export")
_KINDS = {"convert.torch": "PyTorch", "convert.tf": "TensorFlow", "convert.hf": "Hugging Face",
          "convert.openvino": "ONNX"}


@flags.pass_options("convert.torch", "convert.tf", "convert.hf", "convert.openvino")
@flags.groups("weights", "data", "measure", "output", "print_recipe")
def convert_cmd(
    model: str = typer.Argument(..., help="file.py:make_model, pkg.mod:make_model, TorchScript .pt, "
                                           ".pt2, SavedModel folder, .keras, .h5, .tflite, or a Hugging Face "
                                           "folder or Hub id (org/name, from the local cache)."),
    output: str = options.output_file("The ONNX file to write (an OpenVINO IR NAME.xml + NAME.bin when it ends "
                                      "in .xml and MODEL is ONNX)."),
    runs: int = typer.Option(50, "--runs", min=1, help="Timed runs for the latency figures."),
    *, config: dict, shared: options.Shared,
) -> None:
    """Convert a PyTorch, TensorFlow or Hugging Face model to ONNX, validated against the source framework (an
    ONNX model to OpenVINO IR with -o OUT.xml, validated against onnxruntime)."""
    from optkit.core.registry import build_config
    from optkit.passes import get_pass

    weights, data = shared.weights, shared.data
    common.guard_outputs({"-o": output, "--report": shared.report}, common.inputs_of(shared, {"MODEL": model}))
    fmt = detect_format(model)
    to_ir = output.lower().endswith(".xml")
    if to_ir != (fmt == Format.ONNX) and (to_ir or fmt == Format.ONNX):
        raise UsageError(f"-o {output}: an OpenVINO IR (.xml) is written from an ONNX model; convert {model} to "
                         ".onnx first, then that to .xml" if to_ir else
                         f"{model} is already ONNX: give -o NAME.xml for OpenVINO IR")
    if to_ir:
        pass_name = "convert.openvino"
        _only_options(config, pass_name, fmt)
        if weights:
            raise UsageError(f"weights (--weights) applies to PyTorch models, not {fmt.value}")
    elif fmt.value in TORCH_FORMATS:
        pass_name = "convert.torch"
        if config.get("signature"):
            raise UsageError("signature (--signature) applies to SavedModels")
        if config.get("task"):
            raise UsageError("task (--task) applies to Hugging Face models")
    elif fmt in (Format.KERAS, Format.TF_SAVEDMODEL, Format.TFLITE, Format.HF):
        pass_name = "convert.hf" if fmt == Format.HF else "convert.tf"
        if weights:
            raise UsageError(f"weights (--weights) applies to PyTorch models, not {fmt.value}")
        _only_options(config, pass_name, fmt)
    else:
        raise UsageError(f"convert takes PyTorch or TensorFlow models; {model} is {fmt.value}")
    build_config(get_pass(pass_name), config)  # bad options fail before any data is read
    shapes = parse_shapes(shared.shape)
    dataset = None
    if data:
        from optkit.measure.datasets import load_dataset

        dataset = load_dataset(data)
    if not shapes and dataset is not None and fmt == Format.TORCHSCRIPT and set(dataset.arrays) == {""}:
        shapes = {"": [1, *dataset.arrays[""].shape[1:]]}  # TorchScript does not declare its input shape
    settings = shared.settings(shapes=shapes, runs=runs, warmup=min(10, runs))
    rep = common.run_single_stage(
        pass_name, model, output, config, command=f"optkit convert {model}", settings=settings,
        weights=weights, report_path=shared.report, as_json=shared.as_json, signature=config.get("signature"),
        data={"eval": data} if data else {}, print_recipe=shared.print_recipe,
    )
    if rep is not None and not shared.as_json:
        _print_validation(rep)


def _only_options(config: dict, pass_name: str, fmt: Format) -> None:
    """The other converters' options are refused, naming whose they are."""
    for key in config:
        if key not in flags.keys(pass_name):
            owner = next(p for p in _KINDS if key in flags.keys(p))
            raise UsageError(f"{key} ({flags.field(owner, key)['flag']}) applies to {_KINDS[owner]} models, not "
                             f"{fmt.value}" + (" to OpenVINO IR" if pass_name == "convert.openvino" else ""))


def _print_validation(report) -> None:
    from rich.table import Table

    stage = report.stages[-1]
    val = stage.measurements.get("validation") or {}
    if not val:
        return
    table = Table(title=f"validation: source vs onnxruntime on {val.get('inputs', '')}", title_justify="left")
    noise = any("noise" in o for o in val.get("outputs", {}).values())  # Hugging Face: the tolerance from it
    cols = ("output",) + (() if noise else ("dtype",)) + ("max abs err", "max rel err", "top-1 agree") + (
        ("min cosine", "f32 noise", "tolerance") if noise else ("atol", "rtol"))
    for col in cols:
        table.add_column(col, justify="left" if col in ("output", "dtype") else "right")
    for name, o in val.get("outputs", {}).items():
        agree = o.get("top1_agreement")
        row = [name] + ([] if noise else [o.get("dtype", "")]) + [
            f"{o['max_abs_error']:.3g}", f"{o['max_rel_error']:.3g}", "-" if agree is None else f"{agree:.4f}"]
        row += ([f"{o['min_cosine']:.6f}", f"{o['noise']:.3g}" if "noise" in o else "-", f"{o['tolerance']:.3g}"]
                if noise else [f"{o.get('atol', 0):g}", f"{o.get('rtol', 0):g}"])
        table.add_row(*row)
    con = common.console()
    con.print(table)
    extra = [f"exporter {val['exporter']}" if "exporter" in val else "", f"opset {val['opset']}" if "opset" in val else ""]
    rules = {o["tolerance_rule"] for o in val.get("outputs", {}).values() if "tolerance_rule" in o}
    if rules:
        extra.append("tolerance: " + "; ".join(sorted(rules)) + " (padded positions left out)")
    if "sentence_transformers" in val:
        st = val["sentence_transformers"]
        extra.append(f"against sentence-transformers {st['version']}: max abs err " + ", ".join(
            f"{n} {o['max_abs_error']:.3g}" for n, o in st["outputs"].items()))
    if "onnx_top1" in val:
        extra.append(f"top-1 on the labels: source {val['source_top1']:.4f}, onnx {val['onnx_top1']:.4f}")
    con.print(", ".join(e for e in extra if e))


def register(app: typer.Typer) -> None:
    app.command("convert")(convert_cmd)
