"""Every image optkit decodes is bounded by its header first (issue 39, W5): an image that declares more than 64M
pixels (a 65-byte PNG of 40000x40000, a real 462 KB PNG of 12500x12000) is exit 2 with one line on every command
that reads images, before a pixel is decoded; PIL's own decompression-bomb limit is the same number, so its
warning or error never escapes; an IDX file's declared size is bounded the same way, and no more is read than it
declares. A single-stage command's data error names the flag the user typed, not the key of the one-stage recipe
it built (W10: `preprocess --data` said "recipe: data.eval.path")."""
from __future__ import annotations

import gzip
import re
import struct

import pytest
from _bounded import SPEC, image_model, png_header_only, png_solid

import optkit
from optkit.core.errors import UsageError

from conftest import no_result_files, one_error_line

BOMB = "declares more than 67,108,864 pixels (64M), optkit's limit per image"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{"bomb": a class folder holding the 40000x40000 PNG, "big": one holding the 12500x12000 PNG}, the image
    model, and that model with preprocessing in its graph (for split)."""
    tmp = tmp_path_factory.mktemp("images")
    for name in ("bomb", "big"):
        (tmp / name / "cls").mkdir(parents=True)
    png_header_only(tmp / "bomb" / "cls" / "bomb.png", 40000, 40000)
    png_solid(tmp / "big" / "cls" / "big.png", 12500, 12000)
    model = image_model(tmp / "m.onnx")
    u8 = tmp / "m_u8.onnx"
    from conftest import run_cli

    assert run_cli("preprocess", model, "-o", u8, "--preprocess", SPEC, "--check-samples", "2").rc == 0
    return tmp


COMMANDS = {  # name: the command's arguments (M: the model, U8: it with preprocessing, D: the folder, O: output)
    "eval": ["eval", "M", "--data", "D", "--preprocess", SPEC],
    "bench --data": ["bench", "M", "--data", "D", "--runs", "3", "--warmup", "1"],
    "quantize --calibration-data": ["quantize", "M", "-o", "O/q.onnx", "--calibration-data", "D"],
    "quantize --eval-data": ["quantize", "M", "-o", "O/q.onnx", "--eval-data", "D"],
    "preprocess --data": ["preprocess", "M", "-o", "O/p.onnx", "--preprocess", SPEC, "--data", "D"],
    "split --data": ["split", "U8", "-o", "O/split", "--data", "D"],
    "tune --data": ["tune", "M", "-o", "O/best.json", "--data", "D", "--trials", "1"],
    "profile --data": ["profile", "M", "--data", "D", "--runs", "2"],
    "run (a recipe's data:)": ["run", "O/recipe.yaml"],
}


@pytest.mark.parametrize("image", ["bomb", "big"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_image_past_64m_pixels_is_exit_2_on_every_command(cli, folders, tmp_path, command, image):
    folder = folders / image
    out = tmp_path / "out"
    out.mkdir()
    (out / "recipe.yaml").write_text(
        f"version: 1\nmodel: {{path: {folders / 'm.onnx'}}}\n"
        f"data:\n  eval: {{path: {folder}, preprocess: {SPEC}}}\nstages: [{{pass: simplify.onnx}}]\n")
    where = {"M": folders / "m.onnx", "U8": folders / "m_u8.onnx", "D": folder}
    args = [str(where.get(a, a)).replace("O/", f"{out}/") for a in COMMANDS[command]]
    r = cli(*args)
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert BOMB in line and str(folder / "cls") in line, line
    # the flag the user typed, not the key of the recipe the command built (W10); a recipe keeps its file and key
    flag = next((a for a in COMMANDS[command] if a.startswith("--") and a.endswith("data")), None)
    said = {"eval": "", "bench --data": "", "split --data": "", "run (a recipe's data:)":
            f"{out / 'recipe.yaml'}:4: data.eval.path: "}.get(command, f"{flag}: ")
    assert line.startswith(f"error: {said}image "), line
    assert "DecompressionBomb" not in r.err and "Warning" not in r.err
    assert no_result_files(out) == ["recipe.yaml"]


@pytest.mark.parametrize("image", ["bomb", "big"])
def test_the_python_api_raises_the_same_usage_error(folders, tmp_path, image):
    with pytest.raises(UsageError, match=re.escape(BOMB)):
        optkit.load_dataset(folders / image, {"resize": 272, "center_crop": 240})
    with pytest.raises(UsageError, match=re.escape(BOMB)):
        optkit.run({"version": 1, "model": {"path": str(folders / "m.onnx")},
                    "data": {"eval": {"path": str(folders / image), "preprocess": {"resize": 272, "center_crop": 240}}},
                    "stages": [{"pass": "simplify.onnx"}]}, workspace=tmp_path / "run")


def _idx(path, dims, payload: bytes = b"", gz=True):
    data = struct.pack(">HBB", 0, 0x08, len(dims)) + struct.pack(f">{len(dims)}I", *dims) + payload
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("case, dims, payload, says", [
    ("declared past the bound", (1 << 20, 1 << 20), b"", "more than 1,073,741,824"),
    ("unpacks past what it declares", (2, 28, 28), bytes(50_000_000), "trailing data"),
    ("product wraps int64", (65536, 65536, 65536, 65536), b"", "more than 1,073,741,824"),
])
def test_an_idx_file_is_bounded_by_its_header(cli, folders, tmp_path, case, dims, payload, says):
    """A 50 KB .gz that unpacks to 50 MB is read only as far as its header declares; a header past 1 GiB (or whose
    product wraps a 64-bit int) is refused before the data is read."""
    path = _idx(tmp_path / "images-idx3-ubyte.gz", dims, payload)
    r = cli("eval", folders / "m.onnx", "--data", path)
    assert r.rc == 2, r.err
    assert says in one_error_line(r) and str(path) in one_error_line(r)
    with pytest.raises(UsageError, match=says):
        optkit.load_dataset(path)
