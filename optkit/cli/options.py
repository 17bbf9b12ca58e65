"""The options commands share, declared once as plain data, and the one place a typer option is built from data.

A command includes shared options by group (or one by one, by name) and gets their values as one object:

    @app.command("quantize")                      # or register(app): app.command("quantize")(quantize_cmd)
    @flags.pass_options("quantize.onnx")          # the pass's own flags, derived from its Config -> `config`
    @flags.groups("calibration_data", "eval", "measure", "output", "print_recipe")
    def quantize_cmd(model: str = typer.Argument(...), output: str = options.output_file("Where to ..."),
                     *, config: dict, shared: options.Shared) -> None:
        settings = shared.settings()              # threads, --shape, --value (and provider, warm-up, runs)
        ... shared.eval_data, shared.labels, shared.report, shared.as_json ...

`flags.groups` adds the options of each name in GROUPS (or the one option of a name in OPTIONS) to the command's
signature, each in its help section (flags.GROUP_ORDER: data, evaluation, measurement, output), and hands the
body `shared`: a Shared with the values given (an option the command did not include keeps Shared's default,
which is the option's). A new shared option is one Opt in OPTIONS, one field of Shared, and a group if several
commands take it together; the same flag then has the same name, default and help in every command
(tests/test_options_once.py). A command's own options (few) stay hand-written; a required `-o/--output` is
`output_file(help)`. Only typer is imported here: `optkit --help` stays fast.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import typer


@dataclass(frozen=True)
class Opt:
    """One shared option: the body's attribute (and the click parameter's name), its flags and annotation, its
    default (... = required), help, bounds and help section (a flags.GROUP_ORDER name)."""
    param: str
    flags: tuple[str, ...]
    annotation: Any
    default: Any
    help: str
    group: str
    min: Optional[float] = None


def option(default: Any, flags: tuple[str, ...], *, help: str, min: Optional[float] = None,
           max: Optional[float] = None, metavar: Optional[str] = None) -> Any:
    """The typer option for one declaration (a shared Opt here, a pass's Config field in cli/flags.py)."""
    bounds = {k: v for k, v in (("min", min), ("max", max), ("metavar", metavar)) if v is not None}
    return typer.Option(default, *flags, help=help, **bounds)


def output_file(help: str) -> Any:
    """The required `-o/--output FILE` of a command that writes a model (its help says what is written)."""
    return option(..., ("-o", "--output"), help=help)


DATA_HELP = ("Sample data: .npz, an image folder or IDX images (an image of at most 64M pixels, by its header), or "
             "text (CSV, TSV, JSONL, Parquet, a datasets folder; tokenized by the model's own tokenizer); the "
             "command feeds it instead of random inputs (with labels, accuracy is measured too).")
METRIC_HELP = ("top1 (or accuracy), top5, f1, spearman, pearson, exact_match, mse, mae, cosine or module:function "
               "(a custom metric runs your code).")
_STR, _INT, _LIST = Optional[str], Optional[int], Optional[list[str]]

# keyed by the flag's name: "--eval-data" is "eval_data"
OPTIONS: dict[str, Opt] = {o.flags[0].lstrip("-").replace("-", "_"): o for o in (
    # data: what the command reads besides the model
    Opt("data", ("--data",), _STR, None, DATA_HELP, "data"),
    Opt("calibration_data", ("--calibration-data",), _STR, None, "Inputs for static calibration (.npz, images, IDX).",
        "data"),
    Opt("train", ("--train",), _STR, None, "Labelled fine-tuning data: .npz (input + labels) or an image folder.",
        "data"),
    Opt("layout", ("--layout",), _STR, None, "Image folders: nchw or nhwc (default: nhwc for Keras, nchw for torch).",
        "data"),
    Opt("color", ("--color",), str, "rgb", "Image folders: rgb, bgr or gray.", "data"),
    Opt("weights", ("--weights",), _STR, None, "State dict for a factory model (loaded with weights_only=True).",
        "data"),
    Opt("columns", ("--columns",), _STR, None, "Text data: the column of each role, by position (from 0) or header "
        "name, e.g. text=5,text_pair=6,label=4 (default: columns named text, text_pair, label).", "data"),
    Opt("no_truncation", ("--no-truncation",), bool, False, "Text data: a row over the model's token limit is an "
        "error instead of truncated (and counted).", "data"),
    # evaluation: labelled data and how it is scored
    Opt("eval_data", ("--eval-data",), _STR, None, "Labelled data the input and the result are measured (and "
        "checked) on: .npz, image folder or IDX images.", "evaluation"),
    Opt("labels", ("--labels",), _STR, None, "Labels: IDX file (default: beside the images); for an image folder a "
        "CSV of file,class_index rows or a .txt class list (line number = class index).", "evaluation"),
    Opt("max_samples", ("--max-samples",), _INT, None, "Evaluate on a deterministic subset of the data.",
        "evaluation", min=1),
    Opt("metric", ("--metric",), str, "top1", METRIC_HELP, "evaluation"),
    # measurement: how the model is run and timed
    Opt("runtime", ("--runtime",), _STR, None, "Runtime of an ONNX model: onnxruntime (default) or openvino (x86 "
        "CPUs; an OpenVINO IR .xml always runs on openvino).", "measurement"),
    Opt("provider", ("--provider",), str, "cpu", "onnxruntime provider: cpu, cuda, tensorrt (ONNX models).",
        "measurement"),
    Opt("threads", ("--threads",), _INT, None, "Intra-op threads (default: the runtime's).", "measurement", min=1),
    Opt("shape", ("--shape",), _LIST, None, "Input shape for dynamic dims: name=1x3x224x224 (repeatable; default: "
        "from the dim names, probed).", "measurement"),
    Opt("value", ("--value",), _LIST, None, "The value a scalar input is fed when there is no data: name=V, e.g. "
        "sr=16000 (repeatable).", "measurement"),
    Opt("warmup", ("--warmup",), int, 10, "Untimed runs first.", "measurement", min=0),
    Opt("runs", ("--runs",), int, 100, "Timed runs.", "measurement", min=1),
    # output: what is written and printed
    Opt("report", ("--report",), _STR, None, "Also write the JSON report to this file.", "output"),
    Opt("as_json", ("--json",), bool, False, "Print the result as JSON instead of a table.", "output"),
    Opt("print_recipe", ("--print-recipe",), bool, False,
        "Print the equivalent one-stage recipe (for `optkit run`) and exit.", "output"),
    Opt("baseline", ("--baseline",), _STR, None, "Baseline report.json for the baseline (regression) gates.", ""),
)}
# the same option, required or with no default (the body's attribute is the same)
OPTIONS["data_required"] = Opt("data", ("--data",), str, ..., DATA_HELP, "data")
OPTIONS["metric_optional"] = Opt("metric", ("--metric",), _STR, None, METRIC_HELP, "evaluation")

# Options several commands take together; a command names groups and single options alike.
GROUPS: dict[str, tuple[str, ...]] = {
    "measure": ("threads", "shape", "value"),        # how inputs are made and the model run
    "timing": ("warmup", "runs"),
    "eval": ("eval_data", "labels", "max_samples"),  # labelled data to measure (and check) on
    "finetune": ("train", "eval_data", "metric", "layout", "color"),
    "output": ("report", "json"),                    # a command that reports: the report file and --json
    "text": ("columns", "no_truncation"),            # how text data is read
}


@dataclass(frozen=True)
class Shared:
    """The shared options' values a command body gets (flags.groups); each default is its option's default."""
    data: Optional[str] = None
    calibration_data: Optional[str] = None
    train: Optional[str] = None
    layout: Optional[str] = None
    color: str = "rgb"
    weights: Optional[str] = None
    columns: Optional[str] = None
    no_truncation: bool = False
    eval_data: Optional[str] = None
    labels: Optional[str] = None
    max_samples: Optional[int] = None
    metric: Optional[str] = "top1"
    runtime: Optional[str] = None
    provider: str = "cpu"
    threads: Optional[int] = None
    shape: Optional[list[str]] = None
    value: Optional[list[str]] = None
    warmup: int = 10
    runs: int = 100
    report: Optional[str] = None
    as_json: bool = False
    print_recipe: bool = False
    baseline: Optional[str] = None

    def text(self) -> dict[str, Any]:
        """How text data is read (--columns, --no-truncation), as DataSpec and recipe data-item keys."""
        out: dict[str, Any] = {"columns": self.columns} if self.columns else {}
        return {**out, "truncation": False} if self.no_truncation else out

    def item(self, path: Optional[str]) -> Any:
        """A data path as a recipe data item, with how text data is read (the path alone when that is default)."""
        return None if path is None else ({"path": path, **self.text()} if self.text() else path)

    def settings(self, **more: Any) -> Any:
        """MeasureSettings from the provider, threads, --shape, --value, warm-up and runs; `more` adds or replaces."""
        from optkit.core.shapes import parse_shapes, parse_values
        from optkit.measure.model import MeasureSettings

        fields = {"runtime": self.runtime, "provider": self.provider, "threads": self.threads, "warmup": self.warmup, "runs": self.runs,
                  "shapes": parse_shapes(self.shape), "values": parse_values(self.value)}
        return MeasureSettings(**{**fields, **more})


def expand(names: tuple[str, ...]) -> list[Opt]:
    """The options of these group and option names, each once, in the order named."""
    out: list[Opt] = []
    for name in names:
        if name not in GROUPS and name not in OPTIONS:
            raise KeyError(f"no shared option group or option {name!r} (cli/options.py GROUPS, OPTIONS)")
        for key in GROUPS.get(name, (name,)):
            if OPTIONS[key] not in out:
                out.append(OPTIONS[key])
    return out


def typer_option(key: str) -> Any:
    return option(OPTIONS[key].default, OPTIONS[key].flags, help=OPTIONS[key].help, min=OPTIONS[key].min)


# --json on the package commands, which take no other shared option
JSON = typer_option("json")
