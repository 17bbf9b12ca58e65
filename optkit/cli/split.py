"""optkit split MODEL -o DIR [--provider tensorrt|cuda|cpu] [--cut auto|NODE ...] [--dim NAME=SIZE ...]"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from optkit.cli import common, options
from optkit.core import strictjson
from optkit.core.atomic import Output


def split_cmd(
    model: str = typer.Argument(..., help="ONNX model to split."),
    output: str = typer.Option(..., "-o", "--output", help="Folder to write pre.onnx / core.onnx / post.onnx (only "
                               "the parts needed) and split.json; new, empty, or a complete previous split output "
                               "(written under the folder's lock: a second run waits)."),
    provider: str = typer.Option("tensorrt", "--provider", help=options.OPTIONS["provider"].help),
    cut: Optional[list[str]] = typer.Option(None, "--cut", help="auto (default: the cut with the fewest bytes "
                                            "crossing CPU<->GPU per sample), preprocess (at the boundary optkit "
                                            "preprocess recorded; what optkit package cuts at) or node names whose "
                                            "outputs are the cut points (repeatable)."),
    dim: Optional[list[str]] = typer.Option(None, "--dim", help="Size of a dynamic input dim, NAME=SIZE "
                                            "(repeatable; default: the --data's sizes, else batch 1, images 224, "
                                            "stated in the report; one the data contradicts is refused)."),
    data: Optional[str] = options.typer_option("data"),
    as_json: bool = options.JSON,
) -> None:
    """Cut an ONNX model into CPU / GPU / CPU parts where the fewest bytes cross, checked bit-exact against it
    (on --data, an .npz with one array per input or, for a model taking uint8 images, an image folder's first
    image; else synthesized inputs). --data sizes the dynamic dims --dim does not name. The GPU part is placed for
    --provider tensorrt by default (trt check's table); cuda uses onnxruntime's CUDA provider's ops; cpu has
    nothing to split."""
    from optkit.split import split_model

    common.guard_outputs([Output("-o", output, folder=True)], {"MODEL": model, "--data": data})
    cuts = "auto" if not cut or cut == ["auto"] else cut
    def waiting() -> None:
        typer.echo(f"waiting: another optkit split is writing {output}", err=True)

    doc = split_model(Path(model), Path(output), provider=provider, cuts=cuts, dims=dim, data=data, on_wait=waiting)
    if as_json:
        common.print_json(strictjson.dumps(doc, indent=2))
    else:
        _render(doc, output)


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
