"""optkit prune MODEL -o OUT --train DATA [--sparsity 0.5] [--method channels|unstructured] ...

Keras models (.keras / .h5) go through `prune.keras` (TF-MOT), PyTorch factories (file.py:make_model) through
`prune.torch`. Fine-tuning may run distributed: --strategy mirrored / multi-worker (TF_CONFIG) for Keras, and
--strategy ddp under torchrun for PyTorch (see docs/distributed.md).
"""
from __future__ import annotations

from typing import Optional

import typer

from optkit.cli import common, flags, options
from optkit.core.atomic import Output, adding_folder
from optkit.core.errors import UsageError
from optkit.core.formats import Format, detect_format


def split_names(values: Optional[list[str]]) -> Optional[list[str]]:
    if values is None:
        return None
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def pair(value: Optional[str], option: str, sep: str) -> Optional[list[int]]:
    if value is None:
        return None
    try:
        a, b = (int(v) for v in value.lower().replace("x", sep).split(sep))
    except ValueError:
        raise UsageError(f"bad {option} {value!r}: expected two integers like 2{sep}4") from None
    return [a, b]


def add_tensorboard(config: dict, folder: Optional[str]) -> None:
    """--tensorboard: checked before any work (the tensorboard package, a folder), then part of the config."""
    if folder is not None:
        from optkit.passes.training.finetune import check_tensorboard

        check_tensorboard(folder)
        config["tensorboard"] = folder


def load_train_data(train, eval_data, pre):
    from optkit.measure.datasets import load_dataset

    data = {}
    if train:
        data["train"] = load_dataset(train, pre)
    if eval_data:
        data["eval"] = load_dataset(eval_data, pre)
    return data


def run_stage(pass_name, model, output, config, *, shared, command, preprocess):
    """run_single_stage on the chief; other workers of a distributed job train, then write and report nothing."""
    from optkit.measure.model import DataSpec
    from optkit.passes.training.distributed import is_chief

    train, eval_data, weights, settings = shared.train, shared.eval_data, shared.weights, shared.settings()
    spec = DataSpec(path=eval_data, preprocess=preprocess) if eval_data else None
    if shared.print_recipe or is_chief():
        # the chief of a distributed job measures its input last: its workers wait for it in the first collective
        result = common.run_single_stage(pass_name, model, output, config, command=command, settings=settings,
                                         weights=weights, eval_data=spec,
                                         metric=shared.metric if eval_data else None, report_path=shared.report,
                                         as_json=shared.as_json, print_recipe=shared.print_recipe,
                                         data={"train": {"path": train, "preprocess": preprocess}} if train else {},
                                         input_last=config.get("strategy", "none") != "none")
        if result is not None and not shared.as_json:
            print_details(result)
        return result
    import shutil
    import tempfile
    from pathlib import Path

    from optkit.pipeline.stage import run_pass

    data = load_train_data(train, eval_data, preprocess)
    scratch = Path(tempfile.mkdtemp(prefix="optkit-worker-"))
    try:  # a worker takes part in every collective (training, saving) but its copy is thrown away
        run_pass(common.load_artifact(model, weights), pass_name, config, scratch / Path(output).name,
                 shapes=settings.shapes, seed=settings.seed, data=data)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"worker done: fine-tuning finished; the chief writes {output}")


def print_details(report) -> None:
    """Per-layer sparsity (or channels) and the gzip sizes, under the report table."""
    from rich.table import Table

    stages = report.stages
    m = stages[-1].measurements
    layers = (m.get("sparsity") or m.get("pruning") or {}).get("layers")
    if layers:
        channels = (m.get("pruning") or {}).get("channels") or {}
        table = Table(title="per-layer sparsity", title_justify="left")
        for col in ("layer", "weights", "zeros", "sparsity") + (("channels",) if channels else ()):
            table.add_column(col)
        for name, v in layers.items():
            row = [name, f"{v['weights']:,}", f"{v['zeros']:,}", f"{v['sparsity']:.1%}"]
            if channels:
                c = channels.get(name)
                row.append(f"{c['before']} -> {c['after']}" if c else "-")
            table.add_row(*row)
        common.console().print(table)
    sizes = [(s.measurements.get("size") or {}).get("gzip_bytes") for s in stages]
    if len(sizes) == 2 and all(sizes):
        common.console().print(f"gzip size: {sizes[0]:,} -> {sizes[1]:,} bytes ({sizes[1] / sizes[0]:.2f}x)")


@flags.pass_options("prune.keras", "prune.torch")
@flags.groups("finetune", "weights", "measure", "output", "print_recipe")
def prune_cmd(
    model: str = typer.Argument(..., help="Keras model (.keras/.h5) or PyTorch factory (file.py:make_model)."),
    output: str = options.output_file("Keras: .keras/.h5; torch: .pt2 (torch.export) or .pt (TorchScript)."),
    *, config: dict, shared: options.Shared,
) -> None:
    """Prune a Keras or PyTorch model and fine-tune it on your data; the result continues to convert/quantize."""
    from optkit.core.registry import build_config
    from optkit.passes import get_pass

    common.guard_outputs([Output("-o", output), Output("--report", shared.report),
                          adding_folder("--tensorboard", config.get("tensorboard"))],
                         common.inputs_of(shared, {"MODEL": model}))
    fmt = detect_format(model)
    for key in ("layers", "exclude"):
        if config.get(key):
            config[key] = split_names(config[key])
    for key, flag, sep in (("block_size", "--block-size", "x"), ("m_by_n", "--m-by-n", ":")):
        if key in config:
            config[key] = pair(config[key], flag, sep)
    add_tensorboard(config, config.pop("tensorboard", None))
    if fmt == Format.KERAS:
        pass_name, default_layout = "prune.keras", "nhwc"
    elif fmt == Format.TORCH_MODULE:
        pass_name, default_layout = "prune.torch", "nchw"
    else:
        raise UsageError(f"prune fine-tunes Keras models (.keras/.h5) and PyTorch factories (file.py:make_model "
                         f"with --weights); {model} is {fmt.value}: prune the source model, then export it")
    config = {k: v for k, v in config.items() if k in flags.keys(pass_name)}  # the other format's flags: unused
    shared.settings()  # bad --threads, --shape or --value fail before the Config is checked
    build_config(get_pass(pass_name), config)  # bad options fail before any data is read
    run_stage(pass_name, model, output, config, shared=shared, command=f"optkit prune {model}",
              preprocess={"layout": shared.layout or default_layout, "color": shared.color})


def register(app: typer.Typer) -> None:
    app.command("prune")(prune_cmd)
