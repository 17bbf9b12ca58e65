"""optkit split MODEL -o DIR [--provider tensorrt|cuda|cpu] [--cut auto|NODE ...] [--dim NAME=SIZE ...]"""
from __future__ import annotations

from pathlib import Path

import typer

from optkit.cli import common, flags, onestage, options
from optkit.core import strictjson


@flags.pass_options("split.onnx")
@flags.groups("data", "json", "print_recipe")
def split_cmd(
    model: str = typer.Argument(..., help="ONNX model to split."),
    output: str = options.output_file("Folder to write pre.onnx / core.onnx / post.onnx (only the parts needed) and "
                                      "split.json; new, empty, or a complete previous split output (written under "
                                      "the folder's lock: a second run waits)."),
    *, config: dict, shared: options.Shared,
) -> None:
    """Cut an ONNX model into CPU / GPU / CPU parts where the fewest bytes cross, checked bit-exact against it
    (on --data, an .npz with one array per input or, for a model taking uint8 images, an image folder's first
    image; else synthesized inputs). --data sizes the dynamic dims --dim does not name. The GPU part is placed for
    --provider tensorrt by default (trt check's table); cuda uses onnxruntime's CUDA provider's ops; cpu has
    nothing to split."""
    from optkit.core.atomic import Output
    from optkit.core.registry import build_config
    from optkit.split import check_model, write
    from optkit.split.stage import SplitOnnx

    common.guard_outputs([Output("-o", output, folder=True)], {"MODEL": model, "--data": shared.data})
    if shared.data:
        config["data"] = str(Path(shared.data).absolute())  # the printed recipe runs from anywhere
    cfg = build_config(SplitOnnx, config)
    check_model(Path(model))  # split's own line for a model of another format, before the recipe
    write.check_out_dir(Path(output), Path(model))

    def keep(stage) -> None:  # the stage's parts folder committed to -o under its lock (nothing to split: nothing)
        _publish(stage, Path(model), Path(output))

    report = onestage.run_recipe_stage(SplitOnnx.name, model, cfg, settings=None, command=f"optkit split {model}",
                                       output=output, keep=keep, print_recipe=shared.print_recipe,
                                       outputs=[Output("-o", output, folder=True)])
    if report is None:  # --print-recipe: printed, nothing ran
        return
    doc = report.stages[-1].measurements["split"]
    if shared.as_json:
        common.print_json(strictjson.dumps(doc, indent=2))
    else:
        _render(doc, output)


def _publish(stage, model: Path, out: Path) -> None:
    """Copy the stage's parts beside -o and commit them there (split.write.commit: under -o's lock, checked again)."""
    import shutil

    from optkit.core.atomic import remove, stage_folder
    from optkit.split import stage as split_stage
    from optkit.split import write

    parts = split_stage.parts_of(stage)
    if parts is None:
        return
    tmp = stage_folder(out)
    try:
        for f in sorted(parts.iterdir()):
            shutil.copyfile(f, tmp / f.name)
        write.commit(tmp, out, model, on_wait=lambda: typer.echo(f"waiting: another optkit split is writing {out}",
                                                                 err=True))
    finally:
        remove(tmp)
    stage.notes.append(f"parts written to {out}")


def _render(doc: dict, output: str) -> None:
    from rich.table import Table
    from rich.text import Text

    from optkit.core.shapes import format_shape
    from optkit.report.table import human_bytes

    con = common.console()
    if not doc["parts"]:
        con.print(f"nothing to split: {doc['nothing_to_split']}; nothing written")
        return
    con.print(Text(doc["model"], "bold"), f" split for {doc['provider']} into "
              + ", ".join(p["name"] for p in doc["parts"]) + f" ({doc['cut']} cut), written to {output}")
    from_data = doc.get("dims", {}).get("data")
    if from_data:
        source = doc.get("data", {})
        what = f" ({source['image']}, the first of {source['images']} images)" if source.get("kind") == "images" else ""
        con.print("dynamic dims from the data" + what + ": " + ", ".join(f"{k}={v}" for k, v in from_data.items()))
    assumed = doc.get("dims", {}).get("assumed")
    if assumed:
        con.print("dynamic dims assumed: " + ", ".join(f"{k}={v}" for k, v in assumed.items())
                  + " (set them with --dim NAME=SIZE)")
    parts = Table("part", "device", "ops", "why", title="parts", title_justify="left")
    for p in doc["parts"]:
        ops = ", ".join(f"{op} {n}" for op, n in list(p["ops"].items())[:8]) + (" ..." if len(p["ops"]) > 8 else "")
        parts.add_row(p["name"], p["device"], ops, p["why"])
    con.print(parts)
    cuts = Table("cut", "tensor", "dtype", "shape", "bytes/sample", title="bytes crossing each cut",
                 title_justify="left")
    for c in doc["cuts"]:
        for t in c["tensors"]:
            cuts.add_row(f"{c['from']} -> {c['to']}", t["name"], t["dtype"] or "?", format_shape(t["shape"]),
                         human_bytes(t["bytes_per_sample"]))
        cuts.add_row(f"{c['from']} -> {c['to']}", "total", "", "", human_bytes(c["bytes_per_sample"]))
    con.print(cuts)
    con.print(f"CPU<->GPU per sample (model inputs/outputs on the GPU included): {human_bytes(doc['gpu_bytes_per_sample'])}"
              f"; the naive cut (everything {doc['provider']} runs on the GPU): "
              f"{human_bytes(doc['naive_cut_bytes_per_sample'])}")
    check = doc.get("check", {})
    if check:
        con.print(f"chain check: {check['outputs']} output(s) bit-exact equal to the original ({check['runtime']})",
                  style="green")


def register(app: typer.Typer) -> None:
    app.command("split")(split_cmd)
