"""The options commands share, declared once. A value the user did not give is None and left out of the pass
config (`given`), so the pass's pydantic Config holds every default; help texts name it for the reader.
Only typer is imported here: `optkit --help` stays fast."""
from __future__ import annotations

import typer

# Shared option declarations, so every command spells them the same way.
JSON = typer.Option(False, "--json", help="Print the result as JSON instead of a table.")
SHAPE = typer.Option(None, "--shape", help="Input shape for dynamic dims: name=1x3x224x224 (repeatable; "
                                            "default: from the dim names, probed).")
VALUE = typer.Option(None, "--value", help="The value a scalar input is fed when there is no data: name=V, e.g. "
                                           "sr=16000 (repeatable).")
THREADS = typer.Option(None, "--threads", min=1, help="Intra-op threads (default: the runtime's).")
PROVIDER = typer.Option("cpu", "--provider", help="onnxruntime provider: cpu, cuda, tensorrt (ONNX models).")
WEIGHTS = typer.Option(None, "--weights", help="State dict for a factory model (loaded with weights_only=True).")
OUTPUT_REPORT = typer.Option(None, "--report", help="Also write the JSON report to this file.")
PRINT_RECIPE = typer.Option(False, "--print-recipe",
                            help="Print the equivalent one-stage recipe (for `optkit run`) and exit.")

# Data, declared once: every command that takes one of these takes it with this flag and this help.
DATA_HELP = ("Sample data: .npz, an image folder or IDX images; the command feeds it instead of random inputs "
             "(with labels, accuracy is measured too).")
DATA = typer.Option(None, "--data", help=DATA_HELP)
DATA_REQUIRED = typer.Option(..., "--data", help=DATA_HELP)
CALIBRATION_DATA = typer.Option(None, "--calibration-data", help="Inputs for static calibration (.npz, images, IDX).")
EVAL_DATA = typer.Option(None, "--eval-data", help="Labelled data the input and the result are measured (and "
                                                   "checked) on: .npz, image folder or IDX images.")
LABELS = typer.Option(None, "--labels", help="IDX labels for the data (default: the file beside it).")
MAX_SAMPLES = typer.Option(None, "--max-samples", min=1, help="Evaluate on a deterministic subset of the data.")
METRIC_HELP = "top1, top5, mse, mae, cosine or module:function (a custom metric runs your code)."

# Fine-tuning data: `optkit prune` and `optkit qat` (their flags come from passes.training.finetune.FinetuneConfig).
TRAIN = typer.Option(None, "--train", help="Labelled fine-tuning data: .npz (input + labels) or an image folder.")
METRIC = typer.Option("top1", "--metric", help=METRIC_HELP)
METRIC_OPTIONAL = typer.Option(None, "--metric", help=METRIC_HELP)
LAYOUT = typer.Option(None, "--layout", help="Image folders: nchw or nhwc (default: nhwc for Keras, nchw for torch).")
COLOR = typer.Option("rgb", "--color", help="Image folders: rgb, bgr or gray.")

