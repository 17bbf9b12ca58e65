"""optkit split on real detectors (PicoDet layout, PP-OCRv4 DBNet) with their pre/post-processing in the graph, a
sample CNN with nothing to split, and bad input: exit 2 or 3 with one line and nothing written."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import _detectors as D
import numpy as np
import pytest

from conftest import no_result_files, one_error_line

CONTRACT = {"schema", "model", "provider", "inputs", "outputs", "parts", "cuts", "naive_cut_bytes_per_sample"}


@pytest.fixture(scope="module")
def pico(tmp_path_factory, realcases):
    folder = tmp_path_factory.mktemp("pico")
    model = D.picodet_with_post(folder / "layout_post.onnx")
    np.savez(folder / "page.npz", image_u8=D.page_image((1754, 1240)))
    return model, folder / "page.npz"


@pytest.fixture(scope="module")
def pico_split(pico, tmp_path_factory):
    from conftest import run_cli

    model, data = pico
    out = tmp_path_factory.mktemp("pico_out") / "split"
    r = run_cli("split", model, "-o", out, "--data", data, "--json")
    assert r.rc == 0, r.err
    return out, json.loads(r.out)


def _wired(doc: dict, folder: Path) -> None:
    """The contract: every part a valid ONNX model whose inputs are model inputs or earlier parts' outputs."""
    import onnx

    assert CONTRACT <= set(doc)
    assert json.loads((folder / "split.json").read_text()) == doc
    have = {t["name"] for t in doc["inputs"]}
    for part in doc["parts"]:
        m = onnx.load(str(folder / part["file"]))
        onnx.checker.check_model(m)
        assert part["sha256"] == hashlib.sha256((folder / part["file"]).read_bytes()).hexdigest()
        assert [i.name for i in m.graph.input] == [t["name"] for t in part["inputs"]]
        assert {t["name"] for t in part["inputs"]} <= have, part["name"]
        have |= {t["name"] for t in part["outputs"]}
    assert {t["name"] for t in doc["outputs"]} <= have
    assert sorted(p.name for p in folder.iterdir()) == sorted([p["file"] for p in doc["parts"]] + ["split.json"])


def test_picodet_auto_cut(pico_split):
    out, doc = pico_split
    _wired(doc, out)
    parts = {p["name"]: p for p in doc["parts"]}
    assert [p["name"] for p in doc["parts"]] == ["pre", "core", "post"]
    assert parts["core"]["device"] == "gpu" and parts["core"]["ops"]["Conv"] == 102
    assert "NonMaxSuppression" in parts["post"]["ops"] and "NonMaxSuppression" in parts["post"]["why"]
    # the preprocessing's resize runs in pre: the resized uint8 image crosses, not the 4x larger float tensor
    assert parts["pre"]["ops"] == {"Unsqueeze": 1, "Resize": 1}
    pre_core = next(c for c in doc["cuts"] if (c["from"], c["to"]) == ("pre", "core"))
    assert pre_core["bytes_per_sample"] == 800 * 608 * 3
    core_post = next(c for c in doc["cuts"] if (c["from"], c["to"]) == ("core", "post"))
    assert core_post["bytes_per_sample"] == 2605 * 14 * 4       # top-1000 per level, boxes and 10 class scores
    assert doc["gpu_bytes_per_sample"] == 800 * 608 * 3 + 2605 * 14 * 4
    # naive: the Unsqueezes feeding NMS stay on the GPU, so boxes and scores cross twice (NMS and the Gathers
    # after it read both); auto moves them to post
    assert doc["naive_cut_bytes_per_sample"] == 1754 * 1240 * 3 + 2 * 2605 * 14 * 4
    assert doc["preprocess_boundary_bytes_per_sample"] == 800 * 608 * 3 * 4
    assert doc["check"]["bit_exact"]


def test_picodet_rerun_replaces_previous_output_and_named_cut(pico, pico_split, cli):
    model, data = pico
    out, _ = pico_split
    r = cli("split", model, "-o", out, "--cut", "concat_cand_boxes", "--cut", "transpose_cand_scores_t",
            "--data", data, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    _wired(doc, out)
    assert doc["cut"] == "named" and [p["name"] for p in doc["parts"]] == ["core", "post"]
    # the named cut leaves the preprocessing on the GPU: the client's full-size image crosses
    assert doc["gpu_bytes_per_sample"] == 1754 * 1240 * 3 + 2605 * 14 * 4


def test_dbnet_text_detector(tmp_path):
    src = D.dbnet_path()
    if src is None:
        pytest.skip("rapidocr_onnxruntime is not installed (pip install -c constraints.txt rapidocr_onnxruntime)")
    from optkit.split import split_model

    model = D.dbnet_with_post(src, tmp_path / "dbnet_post.onnx", image_hw=(540, 960), net_hw=(544, 960))
    np.savez(tmp_path / "page.npz", image_u8=D.page_image((540, 960)))
    doc = split_model(model, tmp_path / "out", data=tmp_path / "page.npz")
    _wired(doc, tmp_path / "out")
    parts = {p["name"]: p for p in doc["parts"]}
    assert parts["post"]["ops"] == {"NonZero": 1} and parts["core"]["ops"]["Conv"] == 62
    core_post = next(c for c in doc["cuts"] if (c["from"], c["to"]) == ("core", "post"))
    assert [t["name"] for t in core_post["tensors"]] == ["text_mask"] and core_post["bytes_per_sample"] == 544 * 960
    assert doc["naive_cut_bytes_per_sample"] >= doc["gpu_bytes_per_sample"]


def test_layout_as_shipped_and_cnn_have_nothing_to_split(cli, samples, realcases, tmp_path):
    for model in (samples / "torch_cnn.onnx", realcases / "layout_cdla.onnx"):
        r = cli("split", model, "-o", tmp_path / "out")
        assert r.rc == 0, r.err
        assert r.out.strip().startswith("nothing to split") and len(r.out.strip().splitlines()) <= 2, r.out
        assert not (tmp_path / "out").exists()
    r = cli("split", samples / "torch_cnn.onnx", "-o", tmp_path / "out", "--provider", "cpu", "--json")
    assert r.rc == 0 and json.loads(r.out)["parts"] == []


@pytest.mark.parametrize("cut, says", [
    ("no_such_node", "no node of that name"),
    ("conv2d_0.tmp_0", None),  # filled below: a backbone node whose cut leaves GPU work after it
])
def test_bad_cuts_exit_2_nothing_written(pico, cli, tmp_path, cut, says):
    import onnx

    model, _ = pico
    if says is None:
        node = next(n for n in onnx.load(str(model)).graph.node if n.op_type == "Conv")
        cut, says = node.name or node.output[0], "does not separate the graph"
        if not node.name:
            pytest.skip("the model's Conv nodes are unnamed")
    r = cli("split", model, "-o", tmp_path / "out", "--cut", cut)
    assert r.rc == 2, r.err
    assert says in one_error_line(r)
    assert no_result_files(tmp_path) == []


def _if_model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    w = onnx.numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    branch = lambda tag, op: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["h"], [f"{tag}_out"], name=f"inner_{tag}")], tag, [],
        [helper.make_tensor_value_info(f"{tag}_out", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
             helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("Squeeze", ["c"], ["cond"], name="sq"),
             helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=branch("then", "Relu"),
                              else_branch=branch("else", "Neg"))]
    zero = onnx.numpy_helper.from_array(np.zeros([1], np.float32), "zero")
    g = helper.make_graph(nodes, "ifm", [x], [y], initializer=[w, zero])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def test_if_model_splits_and_a_cut_through_its_subgraph_is_refused(cli, tmp_path):
    model = _if_model(tmp_path / "if.onnx")
    out = tmp_path / "out"
    r = cli("split", model, "-o", out, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    # the If reads h (16 bytes) from its outer scope: crossing h alone beats crossing h and the condition
    assert [p["name"] for p in doc["parts"]] == ["core", "post"] and doc["parts"][1]["ops"]["If"] == 1
    assert doc["parts"][0]["ops"] == {"MatMul": 1} and doc["gpu_bytes_per_sample"] == 16 + 16
    _wired(doc, out)
    r = cli("split", model, "-o", tmp_path / "out2", "--cut", "inner_then")
    assert r.rc == 2 and "inside a subgraph of If branch" in one_error_line(r)
    assert not (tmp_path / "out2").exists()


def test_bad_files_and_folders(cli, samples, tmp_path):
    model = _if_model(tmp_path / "if.onnx")
    r = cli("split", tmp_path / "missing.onnx", "-o", tmp_path / "o1")
    assert r.rc == 2 and "does not exist" in one_error_line(r)
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    r = cli("split", bad, "-o", tmp_path / "o2")
    assert r.rc == 2 and "cannot read" in one_error_line(r)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    r = cli("split", model, "-o", foreign)
    assert r.rc == 2 and "not a previous optkit split output" in one_error_line(r)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    r = cli("split", model, "-o", tmp_path / "o3", "--dim", "nope=3")
    assert r.rc == 2 and "--dim nope" in one_error_line(r)
    r = cli("split", model, "-o", tmp_path / "o3", "--provider", "tpu")
    assert r.rc == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.onnx", "foreign", "if.onnx"]


def test_chain_that_differs_exits_3_nothing_written(tmp_path, monkeypatch):
    from optkit.core.errors import ValidationError
    from optkit.split import split_model, write

    model = _if_model(tmp_path / "if.onnx")
    real = write.run_plain

    def skewed(data, feeds, names):
        out = real(data, feeds, names)
        return [o + 1 if n == "h" else o for n, o in zip(names, out)]

    monkeypatch.setattr(write, "run_plain", skewed)
    with pytest.raises(ValidationError, match="differs from the original"):
        split_model(model, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["if.onnx"]


def test_picodet_chain_from_optkit_preprocess_to_a_served_ensemble(realcases, cli, tmp_path):
    """The real chain on layout_cdla: `optkit preprocess` (uint8 page in, resize + normalize, and the dense head's
    best anchors over a threshold out: --score-threshold / --max-detections) -> `optkit split` -> `optkit package`
    -> tritonserver (when the tool folder is here), answering like the preprocessed model. tests/_detectors.py
    still writes the NMS variant above by hand: DFL decoding and NMS are not something preprocess puts in the
    graph (it leaves them to the client, cheap on the kept rows)."""
    model = tmp_path / "layout_u8.onnx"
    r = cli("preprocess", realcases / "layout_cdla.onnx", "-o", model, "--preprocess",
            "{resize: [800, 608], mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}",
            "--score-threshold", "0.5", "--max-detections", "100", "--json")
    assert r.rc == 0, r.err
    page = D.page_image((1754, 1240))[None]
    np.savez(tmp_path / "page.npz", image_uint8=page)   # the model's own input is `image`: the pass names it so
    r = cli("split", model, "-o", tmp_path / "split", "--data", tmp_path / "page.npz", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    _wired(doc, tmp_path / "split")
    assert doc["dims"] == {"given": {}, "data": {"height": 1754, "width": 1240}, "assumed": {}}  # the page's size
    parts = {p["name"]: p for p in doc["parts"]}
    assert parts["core"]["device"] == "gpu" and parts["core"]["ops"]["Conv"] == 102
    assert doc["check"]["bit_exact"] and doc["preprocess_boundary_bytes_per_sample"] == 800 * 608 * 3 * 4
    # the page crosses at most once, as uint8: never the 4x larger float tensor at the preprocessing boundary
    assert doc["gpu_bytes_per_sample"] <= doc["naive_cut_bytes_per_sample"]
    pre_core = next(c for c in doc["cuts"] if c["to"] == "core") if "pre" in parts else None
    assert pre_core is None or pre_core["bytes_per_sample"] <= 1754 * 1240 * 3
    r = cli("package", tmp_path / "split", "--to", "triton", "-o", tmp_path / "repo", "--name", "layout",
            "--data", tmp_path / "page.npz", "--json")
    assert r.rc == 0, r.err
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == sorted(
        ["layout"] + [f"layout.{p['name']}" for p in doc["parts"]])
    import _triton
    import onnxruntime as ort

    if _triton.missing():
        pytest.skip(f"packaged; not served: {_triton.missing()}")
    want = dict(zip([o.name for o in ort.InferenceSession(str(model)).get_outputs()],
                    ort.InferenceSession(str(model)).run(None, {"image_uint8": page})))
    proof = _triton.proof_repository(tmp_path / "repo", tmp_path / "proof")
    with _triton.tritonserver(proof, tmp_path, start_timeout=120) as (url, _):
        assert url, _triton.log_tail(tmp_path)
        got = _triton.infer(url, "layout", {"image_uint8": page})
    assert set(got) == set(want)
    for name, (_, shape, data) in got.items():
        assert list(shape) == list(want[name].shape), name
        np.testing.assert_allclose(np.array(data, want[name].dtype).reshape(shape), want[name], rtol=1e-4,
                                   atol=1e-4)
