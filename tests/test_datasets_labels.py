"""Image-folder labels from a CSV or a class list (a folder holding a subset of a model's classes), and the
preprocessing options resample and scalar mean/std; `optkit eval --labels/--preprocess`."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from PIL import Image

from optkit.core.errors import UsageError
from optkit.measure.datasets import Preprocess, load_dataset

from conftest import one_error_line

# the folder holds 3 of the model's 10 classes: red images are class 7, green 3, blue 9
COLORS = {"red": ((250, 10, 10), 7), "green": ((10, 250, 10), 3), "blue": ((10, 10, 250), 9)}
CLASSES = 10


def _model(path):
    """A real ONNX classifier: the mean of each colour channel, scored for 10 classes (red -> 7, green -> 3,
    blue -> 9)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.zeros((3, CLASSES), np.float32)
    for channel, (_, cls) in enumerate(COLORS.values()):
        w[channel, cls] = 1.0
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]),
         helper.make_node("MatMul", ["flat", "w"], ["logits"])],
        "colours", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def folder(tmp_path):
    """<tmp>/images/<colour>/<n>.png, two images per colour, and the model."""
    root = tmp_path / "images"
    for name, (rgb, _) in COLORS.items():
        (root / name).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (10 + i, 12), rgb).save(root / name / f"{i}.png")
    _model(tmp_path / "colours.onnx")
    return root


def _csv(path, rows, header=True):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(["file", "class_index", "note"])
        w.writerows(rows)
    return path


def _rows(folder):
    return [(f"{name}/{i}.png", cls, "x") for name, (_, cls) in COLORS.items() for i in range(2)]


PRE = {"resize": [8, 8]}


def test_positional_labels_are_the_sorted_folder_order(folder):
    ds = load_dataset(folder, PRE)
    assert ds.classes == ["blue", "green", "red"] and list(ds.labels) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("header", [True, False])
def test_csv_labels_give_the_model_class_indices(folder, tmp_path, header):
    labels = _csv(tmp_path / "labels.csv", _rows(folder), header)
    ds = load_dataset(folder, PRE, labels)
    assert list(ds.labels) == [7, 7, 3, 3, 9, 9] and ds.arrays[""].shape == (6, 3, 8, 8)


def test_class_list_maps_folder_names(folder, tmp_path):
    names = [f"class{i}" for i in range(CLASSES)]
    for name, (_, cls) in COLORS.items():
        names[cls] = f"{name} some description, words"   # the first word names the class
    (tmp_path / "classes.txt").write_text("\n".join(names) + "\n\n")
    ds = load_dataset(folder, PRE, tmp_path / "classes.txt")
    assert list(ds.labels) == [9, 9, 3, 3, 7, 7] and len(ds.classes) == CLASSES


def test_flat_folder_with_labels_csv_uses_it(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for name, (rgb, cls) in COLORS.items():
        Image.new("RGB", (8, 8), rgb).save(flat / f"{name}.jpg")
    _csv(flat / "labels.csv", [(f"{n}.jpg", cls) for n, (_, cls) in COLORS.items()])
    assert list(load_dataset(flat).labels) == [7, 3, 9]


@pytest.mark.parametrize("content, match", [
    ("file,class_index\nred/0.png,7\nred/missing.png,7\n", r"line 3: image red/missing.png not found"),
    ("file,class_index\nred/0.png,seven\n", r"line 2: class index 'seven' is not a whole number"),
    ("red/0.png,-1\n", "negative"),
    ("red/0.png\n", "expected file,class_index"),
    ("file,class_index\n", "lists no images"),
])
def test_bad_csv_is_a_usage_error(folder, tmp_path, content, match):
    (tmp_path / "l.csv").write_text(content)
    with pytest.raises(UsageError, match=match):
        load_dataset(folder, PRE, tmp_path / "l.csv")


@pytest.mark.parametrize("content, match", [
    ("red\ngreen\n", r"folder .*blue is not in the class list"),
    ("red\n\ngreen\nblue\n", "line 2 is empty"),
    ("red\ngreen\nred\nblue\n", "names 'red' twice"),
])
def test_bad_class_list_is_a_usage_error(folder, tmp_path, content, match):
    (tmp_path / "c.txt").write_text(content)
    with pytest.raises(UsageError, match=match):
        load_dataset(folder, PRE, tmp_path / "c.txt")


def test_labels_of_another_kind_are_refused(folder, tmp_path):
    (tmp_path / "l.json").write_text("{}")
    with pytest.raises(UsageError, match=r"give a \.csv"):
        load_dataset(folder, PRE, tmp_path / "l.json")
    with pytest.raises(UsageError, match="not found"):
        load_dataset(folder, PRE, tmp_path / "absent.csv")


def test_resample_is_pil_filter(tmp_path):
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    (tmp_path / "c").mkdir()
    img.save(tmp_path / "c" / "a.png")
    got = {}
    for name, flt in (("nearest", Image.NEAREST), ("bilinear", Image.BILINEAR), ("bicubic", Image.BICUBIC)):
        x = load_dataset(tmp_path, {"resize": 10, "resample": name, "scale": 1}).arrays[""][0]
        want = np.asarray(img.resize((15, 10), flt), np.float32).transpose(2, 0, 1)
        assert np.array_equal(x, want)
        got[name] = x
    assert not np.array_equal(got["nearest"], got["bicubic"])
    assert Preprocess().resample == "bilinear"


def test_scalar_mean_std_is_every_channel(folder):
    one = load_dataset(folder, {**PRE, "scale": 1, "mean": 127, "std": 128}).arrays[""]
    per = load_dataset(folder, {**PRE, "scale": 1, "mean": [127] * 3, "std": [128] * 3}).arrays[""]
    assert np.array_equal(one, per) and one.min() < 0 < one.max()


def test_eval_scores_a_class_subset_with_csv_labels(cli, folder, tmp_path):
    model = tmp_path / "colours.onnx"
    r = cli("eval", model, "--data", folder, "--preprocess", "{resize: [8, 8]}", "--json")
    assert r.rc == 0, r.err
    assert _top1(r) == 0.0   # positional labels 0, 1, 2: wrong for this model
    labels = _csv(tmp_path / "labels.csv", _rows(folder))
    r = cli("eval", model, "--data", folder, "--labels", labels, "--preprocess", "{resize: [8, 8]}", "--json")
    assert r.rc == 0, r.err
    assert _top1(r) == 1.0


@pytest.mark.parametrize("case", ["missing file", "index out of range", "folder not listed", "bad preprocess"])
def test_eval_bad_labels_exit_2_with_one_line(cli, folder, tmp_path, case):
    model = tmp_path / "colours.onnx"
    pre = "{resize: [8, 8]}"
    if case == "missing file":
        labels, want = _csv(tmp_path / "l.csv", [("red/0.png", 7), ("red/9.png", 7)]), "red/9.png not found"
    elif case == "index out of range":
        labels, want = _csv(tmp_path / "l.csv", [("red/0.png", 7), ("blue/0.png", 12)]), "10 classes"
    elif case == "folder not listed":
        (tmp_path / "c.txt").write_text("red\ngreen\n")
        labels, want = tmp_path / "c.txt", "not in the class list"
    else:
        labels, want, pre = _csv(tmp_path / "l.csv", _rows(folder)), "--preprocess resample", "{resample: cubic}"
    r = cli("eval", model, "--data", folder, "--labels", labels, "--preprocess", pre)
    assert r.rc == 2, r.err
    assert want in one_error_line(r)


def _top1(r) -> float:
    rep = json.loads(r.out)
    return rep["stages"][0]["measurements"]["accuracy"]["top1"]


def test_real_imagenet_subset_scores_088(cli, realcases):
    """efficientnet_lite1 on 100 ImageNet images of classes 0, 10, ..., 990 (SOURCES.md): 0.88, the figure
    plain onnxruntime gives with the same preprocessing."""
    r = cli("eval", realcases / "efficientnet_lite1.onnx", "--data", realcases / "imagenet100", "--labels",
            realcases / "imagenet100" / "labels.csv", "--preprocess",
            "{resize: 272, resample: bicubic, center_crop: 240, scale: 1, mean: 127, std: 128}", "--json")
    assert r.rc == 0, r.err
    assert _top1(r) == pytest.approx(0.88)


def test_recipe_data_entry_takes_labels_and_preprocess(folder, tmp_path):
    import optkit

    labels = _csv(tmp_path / "labels.csv", _rows(folder))
    rec = {"name": "labels", "model": {"path": str(tmp_path / "colours.onnx")},
           "data": {"eval": {"path": str(folder), "labels": str(labels), "metric": "top1",
                             "preprocess": {"resize": [8, 8], "resample": "nearest", "scale": 1, "mean": 127,
                                            "std": 128}}},
           "stages": [{"pass": "simplify.onnx"}], "measure": {"runs": 3, "warmup": 1, "trials": 1}}
    report = optkit.run(rec, workspace=tmp_path / "runs", cache=False)
    assert [st.measurements["accuracy"]["top1"] for st in report.stages] == [1.0, 1.0]
