"""Issue 29 (items 10, 11, 13): `--labels` rows and `--preprocess` values are user input. Duplicate or
conflicting rows, rows naming files outside the folder, absurd class indices and lines, and preprocess values
out of bounds are refused with exit 2 and one line naming the file and row (or the key), from the CLI, a
recipe and the Python API alike; nothing is written and the inputs are left as they were."""
from __future__ import annotations

import csv
import hashlib
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from optkit.core.errors import UsageError
from optkit.measure.datasets import load_dataset

from conftest import no_result_files, one_error_line

# issue 29: every command here leaves HOME and TMPDIR as it found them
pytestmark = pytest.mark.usefixtures("fresh_home_and_tmp")

# red images are class 7, green 3, blue 9 of a 10-class model
COLORS = {"red": ((250, 10, 10), 7), "green": ((10, 250, 10), 3), "blue": ((10, 10, 250), 9)}
CLASSES = 10
PRE = "{resize: [8, 8]}"


def _model(path, dtype="float"):
    """A real ONNX classifier: each colour channel's mean scores its class."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.zeros((3, CLASSES), np.float32)
    for channel, (_, cls) in enumerate(COLORS.values()):
        w[channel, cls] = 1.0
    nodes, first = [], "input"
    if dtype == "uint8":
        nodes.append(helper.make_node("Cast", ["input"], ["as_float"], to=TensorProto.FLOAT))
        first = "as_float"
    nodes += [helper.make_node("GlobalAveragePool", [first], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("MatMul", ["flat", "w"], ["logits"])]
    elem = TensorProto.UINT8 if dtype == "uint8" else TensorProto.FLOAT
    graph = helper.make_graph(nodes, "colours", [helper.make_tensor_value_info("input", elem, ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def setup(tmp_path):
    """<tmp>/in/images/<colour>/<n>.png (3 per colour), the model and a good labels.csv; <tmp>/out for reports."""
    src = tmp_path / "in"
    root = src / "images"
    for name, (rgb, _) in COLORS.items():
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (10 + i, 12), rgb).save(root / name / f"{i}.png")
    (tmp_path / "out").mkdir()
    model = _model(src / "colours.onnx")
    return model, root, _csv(src / "labels.csv", _rows())


def _rows():
    return [(f"{name}/{i}.png", cls) for name, (_, cls) in COLORS.items() for i in range(3)]


def _csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file", "class_index"])
        w.writerows(rows)
    return path


def _digest(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _eval(cli, model, folder, labels, pre=PRE, report=None):
    args = ["eval", model, "--data", folder, "--labels", labels, "--preprocess", pre]
    return cli(*args, *(["--report", report] if report else []), "--json")


def _refused(cli, tmp_path, setup, labels, pre=PRE, *parts):
    """The eval exits 2 with one line holding `parts`; no report, inputs byte-identical."""
    model, folder, _ = setup
    before = _digest(tmp_path / "in")
    report = tmp_path / "out" / "report.json"
    r = _eval(cli, model, folder, labels, pre, report)
    assert r.rc == 2, (r.rc, r.err)
    line = one_error_line(r)
    for part in parts:
        assert part in line, line
    assert len(line.replace(str(tmp_path), "<tmp>")) < 400, line  # the temp folder's own length aside
    assert no_result_files(tmp_path / "out") == []
    assert _digest(tmp_path / "in") == before
    return line


def _top1(r) -> float:
    return json.loads(r.out)["stages"][0]["measurements"]["accuracy"]["top1"]


def test_good_labels_score_every_image_once(cli, setup):
    model, folder, labels = setup
    r = _eval(cli, model, folder, labels)
    assert r.rc == 0, r.err
    rep = json.loads(r.out)
    assert _top1(r) == 1.0 and rep["stages"][0]["measurements"]["accuracy"]["samples"] == 9


# ---- item 10: labels rows

def test_duplicate_row_is_refused(cli, tmp_path, setup):
    labels = _csv(tmp_path / "in" / "dup.csv", _rows() + [("red/1.png", 7)])
    line = _refused(cli, tmp_path, setup, labels, PRE, "dup.csv line 11", "red/1.png is listed again",
                    "first on line 3", "'red/1.png,7'")
    assert "exit" not in line


def test_image_under_two_classes_is_refused(cli, tmp_path, setup):
    labels = _csv(tmp_path / "in" / "two.csv", _rows() + [("./blue/0.png", 3)])
    _refused(cli, tmp_path, setup, labels, PRE, "two.csv line 11", "under class 3 here but under class 9 on line 8",
             "'./blue/0.png,3'")


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_rows_leaving_the_folder_are_refused(cli, tmp_path, setup, where):
    _, folder, _ = setup
    outside = tmp_path / "in" / "secret.png"
    Image.new("RGB", (10, 12), (250, 10, 10)).save(outside)
    name = {"parent": "../secret.png", "absolute": str(outside), "symlink": "red/link.png"}[where]
    if where == "symlink":
        (folder / "red" / "link.png").symlink_to(outside)
    labels = _csv(tmp_path / "in" / "out.csv", _rows() + [(name, 7)])
    line = _refused(cli, tmp_path, setup, labels, PRE, "out.csv line 11", f"image {name} is outside",
                    "rows name files inside the folder")
    assert ("through a symlink" in line) == (where == "symlink")


def test_huge_class_index_is_refused(cli, tmp_path, setup):
    labels = _csv(tmp_path / "in" / "big.csv", _rows() + [("red/1.png", 10**29)])
    _refused(cli, tmp_path, setup, labels, PRE, "big.csv line 11", "class index 1000000000", "too large")


def test_class_index_beyond_the_model_is_refused(cli, tmp_path, setup):
    labels = _csv(tmp_path / "in" / "over.csv", [*_rows()[:-1], ("blue/2.png", 2**62)])
    _refused(cli, tmp_path, setup, labels, PRE, "10 classes")


def test_100_mb_line_is_refused(cli, tmp_path, setup):
    labels = tmp_path / "in" / "long.csv"
    with open(labels, "w") as f:
        f.write("file,class_index\nred/0.png,7\n")
        f.write("red/1.png," + "7" * (100 << 20) + "\n")
    _refused(cli, tmp_path, setup, labels, PRE, "long.csv line 3 is 104,857,610 characters long", "at most 4,096")


@pytest.mark.parametrize("rows, words", [
    ("file,class_index\nred/0.png,7\nred/1.png,1_0\n", "line 3: class index '1_0' is not a whole number"),
    ("file,class_index\nred/0.png,7\n\"red/1.png,7\n", "line 3: expected file,class_index"),
    ("file,class_index\nred/0.png,7\nred/\x1b[31m1.png,7\n", "line 3: image red/\\x1b[31m1.png not found"),
    ("red/0.png,seven\nred/1.png,7\n", "line 1: class index 'seven' is not a whole number"),  # no header
    ("file,class_index\n" + "x" * 5000 + "\n", "line 2 is 5,000 characters long"),
])
def test_odd_rows_are_refused(tmp_path, setup, rows, words):
    _, folder, _ = setup
    labels = tmp_path / "odd.csv"
    labels.write_text(rows)
    with pytest.raises(UsageError) as e:
        load_dataset(folder, {"resize": [8, 8]}, labels)
    assert words in e.value.message and e.value.message.isprintable()


def test_class_list_line_is_bounded(tmp_path, setup):
    _, folder, _ = setup
    (tmp_path / "classes.txt").write_text("red\ngreen\n" + "b" * 10_000 + "\n")
    with pytest.raises(UsageError, match=r"classes.txt line 3 is 10,000 characters long"):
        load_dataset(folder, {"resize": [8, 8]}, tmp_path / "classes.txt")


def test_real_imagenet_labels_with_a_repeated_row(cli, realcases, tmp_path):
    """The real labels.csv of imagenet100 with its first image listed again: refused before any image is
    decoded (no figure counted twice)."""
    src = realcases / "imagenet100" / "labels.csv"
    lines = src.read_text().splitlines()
    (tmp_path / "labels.csv").write_text("\n".join([*lines, lines[1]]) + "\n")
    r = cli("eval", realcases / "efficientnet_lite1.onnx", "--data", realcases / "imagenet100", "--labels",
            tmp_path / "labels.csv", "--preprocess", "{resize: 272, center_crop: 240, scale: 1, mean: 127, std: 128}")
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert f"line {len(lines) + 1}" in line and "is listed again (first on line 2" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labels.csv"]


# ---- item 11: preprocess values, one schema for every way they arrive

@pytest.mark.parametrize("pre, words", [
    ("{resize: [8, 8], std: .inf}", "--preprocess std: inf is not a finite number"),
    ("{resize: [8, 8], std: 0}", "--preprocess std: 0 would divide pixels by 0"),
    ("{resize: [8, 8], mean: .nan}", "--preprocess mean: nan is not a finite number"),
    ("{resize: [8, 8], scale: -1}", "--preprocess scale: -1 must be over 0"),
    ("{resize: 8, center_crop: -5}", "--preprocess center_crop: -5 is out of range: give 1 to 8192"),
    ("{resize: [0, 0]}", "--preprocess resize: 0 is out of range"),
    ("{resize: -1}", "--preprocess resize: -1 is out of range"),
    ("{resize: 30000}", "--preprocess resize: 30000 is out of range: give 1 to 8192"),
    ("{resize: true}", "--preprocess resize: true is not a whole number"),
    ("{resize: [8, 8], mean: [0.1, 0.2]}", "--preprocess mean: [0.1, 0.2] has 2 values but the images have 3"),
    ("{resize: [8, 8], dtype: float8}", "--preprocess dtype: 'float8' is not a dtype"),
    ("{resize: [8, 8], center_crop: [9, 4]}", "--preprocess center_crop: [9, 4] is larger than resize"),
    ("{resize: [8, 8], sharpen: 1}", "--preprocess sharpen: unknown key"),
])
def test_bad_preprocess_values_exit_2_naming_the_key(cli, tmp_path, setup, pre, words):
    _refused(cli, tmp_path, setup, setup[2], pre, words)


@pytest.mark.parametrize("mapping, words", [
    ({"std": float("inf")}, "preprocess std: inf is not a finite number"),
    ({"resize": 8, "center_crop": [4, 9]}, "preprocess center_crop: 4x9 (height x width) is larger than"),
    ({"color": "gray", "mean": [1, 2, 3]}, "preprocess mean: [1, 2, 3] has 3 values but the images have 1"),
    ({"dtype": "int4"}, "preprocess dtype: 'int4'"),
    ({"resize": [8, 8, 8]}, "preprocess resize: [8, 8, 8] has 3 items"),
    ({"resize": 8.5}, "preprocess resize: 8.5 is not a whole number"),
    ({"mean": [1, True, 3]}, "preprocess mean: true is not a number"),
    ({"mean": 10**400}, "preprocess mean: 1000000"),
    ({1: 2}, "preprocess 1: keys should be strings"),
    ([1, 2], "preprocess [1, 2] is not a mapping"),
])
def test_python_api_gives_the_same_usage_errors(setup, mapping, words):
    _, folder, labels = setup
    with pytest.raises(UsageError) as e:
        load_dataset(folder, mapping, labels)
    assert words in e.value.message


def test_crop_larger_than_the_image_is_refused(setup):
    _, folder, labels = setup
    with pytest.raises(UsageError, match=r"center_crop: 20x20 .* is larger than .*0.png, 12x10 \(set resize\)"):
        load_dataset(folder, {"center_crop": 20}, labels)


def test_int8_images_for_a_float_model_are_refused(cli, tmp_path, setup):
    # pixels 0..1 as int8 would all be 0: a top-1 of 0.000 with exit 0 before
    _refused(cli, tmp_path, setup, setup[2], "{resize: [8, 8], dtype: int8}",
             "preprocess dtype int8: pixels of", "not whole numbers in -128..127")
    _refused(cli, tmp_path, setup, setup[2], "{resize: [8, 8], scale: 0.5, dtype: int8}",
             "preprocess dtype int8 does not fit input 'input' of the model, which takes float32")


def test_uint8_images_for_a_uint8_model_score(cli, tmp_path, setup):
    _, folder, labels = setup
    model = _model(tmp_path / "in" / "bytes.onnx", "uint8")
    r = _eval(cli, model, folder, labels, "{resize: [8, 8], scale: 1, dtype: uint8}")
    assert r.rc == 0, r.err
    assert _top1(r) == 1.0


def test_images_too_large_for_the_model_are_refused_before_they_are_read(cli, tmp_path, setup):
    """resize 8192 on images the 8x8 model cannot take: refused from the headers' sizes (64M pixels at most
    on the way), and a size the model does not take before any image but the first is decoded."""
    _refused(cli, tmp_path, setup, setup[2], "{resize: 8192}", "preprocess resize:", "more than 67,108,864")
    _refused(cli, tmp_path, setup, setup[2], "{resize: [4000, 4000]}", "input 'input'", "4000")


def _recipe(tmp_path, setup, data: dict):
    import yaml

    model, folder, labels = setup
    rec = {"name": "r", "model": {"path": str(model)},
           "data": {"eval": {"path": str(folder), "labels": str(labels), "metric": "top1", **data}},
           "stages": [{"pass": "simplify.onnx"}], "measure": {"runs": 3, "warmup": 1, "trials": 1}}
    path = tmp_path / "in" / "recipe.yaml"
    path.write_text(yaml.safe_dump(rec, sort_keys=False))
    return path


@pytest.mark.parametrize("data, words", [
    ({"preprocess": {"resize": [8, 8], "std": float("inf")}}, "data.eval.preprocess.std: inf is not a finite"),
    ({"preprocess": {"resize": [8, 8], "dtype": "float8"}}, "data.eval.preprocess.dtype: 'float8' is not a dtype"),
    ({"preprocess": {"resize": 30000}}, "data.eval.preprocess.resize: 30000 is out of range"),
])
def test_recipe_preprocess_takes_the_same_schema(cli, tmp_path, setup, data, words):
    recipe = _recipe(tmp_path, setup, data)
    before = _digest(tmp_path / "in")
    r = cli("run", recipe, "--workspace", tmp_path / "out")
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert "recipe.yaml:" in line and words in line, line
    assert no_result_files(tmp_path / "out") == [] and _digest(tmp_path / "in") == before


def test_recipe_labels_rows_are_checked(cli, tmp_path, setup):
    dup = _csv(tmp_path / "in" / "dup.csv", _rows() + [("green/2.png", 3)])
    recipe = _recipe(tmp_path, setup, {"labels": str(dup), "preprocess": {"resize": [8, 8]}})
    r = cli("run", recipe, "--workspace", tmp_path / "out")
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert "data.eval.path" in line and "dup.csv line 11" in line and "green/2.png is listed again" in line
    assert no_result_files(tmp_path / "out") == []


def test_a_copied_folder_scores_like_the_original(cli, tmp_path, setup):
    """A labels file naming each image once through another spelling (./, a/../a) is still one image each."""
    model, folder, _ = setup
    copy = tmp_path / "in" / "copy"
    shutil.copytree(folder, copy)
    labels = _csv(tmp_path / "in" / "spelled.csv", [(f"./{n}" if i % 2 else f"{n.split('/')[0]}/../{n}", c)
                                                    for i, (n, c) in enumerate(_rows())])
    r = _eval(cli, model, copy, labels)
    assert r.rc == 0, r.err
    assert _top1(r) == 1.0 and json.loads(r.out)["stages"][0]["measurements"]["accuracy"]["samples"] == 9


def _idx(path, arr):
    import struct

    path.write_bytes(struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) +
                     arr.astype(np.uint8).tobytes())
    return path


@pytest.mark.parametrize("pre, words", [
    ({"mean": [0.1, 0.2, 0.3]}, "preprocess mean: "),
    ({"scale": 1, "dtype": "int8"}, "preprocess dtype int8: pixels of"),
])
def test_idx_images_take_the_same_checks(tmp_path, pre, words):
    images = _idx(tmp_path / "t-images-idx3-ubyte", np.full((2, 4, 4), 200))
    _idx(tmp_path / "t-labels-idx1-ubyte", np.array([1, 2]))
    with pytest.raises(UsageError, match=words):
        load_dataset(images, pre)
    assert load_dataset(images, {"scale": 1, "dtype": "uint8"}).arrays[""].dtype == np.uint8
