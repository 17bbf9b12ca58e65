"""optkit split sizes the dynamic dims nobody set as every command does (measure.inputs.probe climbs the dim
ladders until onnxruntime runs the model), or exits 2 naming the --dim to set; and its --cut messages suggest only
cuts that it then takes. Issue 39: W6 (silero VAD's stft needs a sequence the first rung does not give) and W10."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_split import _if_model

from optkit.core.errors import UsageError
from optkit.split import plan_split, split_model

from conftest import no_result_files, one_error_line


def _stft_like(path: Path, reshape_to: int | None = None) -> Path:
    """[batch, sequence] audio -> a Conv1d of kernel 256, stride 128 (silero VAD's stft shape: sequence >= 256),
    then Relu, the mean over time and where it is non-zero (NonZero: data-dependent, so on the CPU); with `reshape_to`, the samples are first reshaped to [-1, reshape_to] (a sequence of a multiple of
    it is needed, which no ladder rung is for 7)."""
    x = helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", "sequence"])
    y = helper.make_tensor_value_info("nz", TensorProto.INT64, [2, "n"])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 1, 256)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = [helper.make_node("Unsqueeze", ["audio", "axis1"], ["a3"], name="unsq"),
             helper.make_node("Conv", ["a3", "w"], ["c"], name="stft_conv", strides=[128]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r"], ["y"], name="mean", keepdims=0, axes=[2]),
             helper.make_node("NonZero", ["y"], ["nz"], name="nonzero")]
    if reshape_to:
        inits.append(numpy_helper.from_array(np.array([-1, reshape_to], np.int64), "to"))
        nodes.insert(0, helper.make_node("Reshape", ["audio", "to"], ["audio_r"], name="reshape"))
        nodes[1].input[0] = "audio_r"
    g = helper.make_graph(nodes, "stft", [x], [y], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def test_a_sequence_the_first_rung_does_not_run_is_probed(cli, tmp_path):
    model = _stft_like(tmp_path / "stft.onnx")
    out = tmp_path / "split"
    r = cli("split", model, "-o", out, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    # 128, 64 and 16 are shorter than the kernel: the ladder's next rung (512) runs, as it does for bench
    assert doc["dims"]["assumed"] == {"batch": 1, "sequence": 512} and doc["check"]["outputs"] == 1
    assert json.loads((out / "split.json").read_text())["dims"]["assumed"]["sequence"] == 512
    # the Python API probes the same way; a --dim still wins
    assert plan_split(model)["dims"]["assumed"]["sequence"] == 512
    doc = plan_split(model, dims={"sequence": 1024})
    assert doc["dims"]["given"] == {"sequence": 1024} and "sequence" not in doc["dims"]["assumed"]


def test_dims_no_rung_runs_are_exit_2_naming_the_dim_to_set(cli, tmp_path):
    model = _stft_like(tmp_path / "stft7.onnx", reshape_to=7 * 64)
    out = tmp_path / "split"
    r = cli("split", model, "-o", out)
    line = one_error_line(r)
    assert r.rc == 2 and "--dim sequence=SIZE" in line and "internal error" not in line, r.err
    assert "--dim batch" not in line and "--shape" not in line  # batch is never climbed; split has no --shape
    assert not out.exists() and no_result_files(tmp_path) == ["stft7.onnx"]
    with pytest.raises(UsageError, match="--dim sequence=SIZE"):
        split_model(model, out)
    assert not out.exists()
    r = cli("split", model, "-o", out, "--dim", "sequence=896")
    assert r.rc == 0, r.err
    assert (out / "split.json").is_file()


def test_silero_vad_and_every_shipped_onnx_model_is_never_an_internal_error(cli, realcases, samples, tmp_path):
    models = sorted(realcases.glob("*.onnx")) + [samples / "torch_cnn.onnx"]
    assert any(m.name == "silero_vad.onnx" for m in models)
    for model in models:
        for provider in ("tensorrt", "cuda"):
            r = cli("split", model, "-o", tmp_path / f"{model.stem}_{provider}", "--provider", provider)
            assert r.rc in (0, 2) and "internal error" not in r.err and "Traceback" not in r.err, (model, r.err)


def _suggested(line: str) -> list[str] | None:
    """The cut a refusal suggests: "cut at NODE instead" or "name that node too" (with the node it names)."""
    m = re.search(r"cut at (\S+) instead", line)
    if m:
        return [m.group(1)]
    m = re.search(r"--cut (.+?) does not separate the graph: tensor '[^']*' from (\S+) \(", line)
    if m and "name that node too" in line:
        return re.findall(r"(\S+) \([A-Za-z]+\)", m.group(1)) + [m.group(2)]
    return None


def test_every_cut_a_refusal_suggests_is_taken(tmp_path):
    """Every node of the If model, and every pair: a refusal is one UsageError, and the cut it suggests (if any) is
    accepted. Before: --cut inner_then suggested "cut at branch", which was then refused; --cut gt --cut matmul was
    an internal error (a tensor flowing back)."""
    model = _if_model(tmp_path / "if.onnx")
    proto = onnx.load(str(model))
    names = [n.name for n in proto.graph.node] + ["inner_then", "inner_else"]
    tried = [[a] for a in names] + [[a, b] for a in names for b in names if a < b]
    suggestions = 0
    for cut in tried:
        try:
            plan_split(model, cuts=cut)
        except UsageError as e:
            line = str(e)
            assert "\n" not in line and line.startswith("--cut"), line
            again = _suggested(line)
            if again:
                suggestions += 1
                plan_split(model, cuts=again)  # raises if the suggestion is refused
    assert suggestions >= 1
    with pytest.raises(UsageError) as e:
        plan_split(model, cuts=["inner_then"])
    assert "cut at branch" not in str(e.value) and "--cut auto" in str(e.value)


def test_an_empty_cut_on_a_model_with_unnamed_nodes_says_so(cli, tmp_path):
    model = _stft_like(tmp_path / "stft.onnx")
    proto = onnx.load(str(model))
    for node in proto.graph.node:
        node.name = ""
    onnx.save(proto, str(tmp_path / "unnamed.onnx"))
    for cut, says in (("", "a node name cannot be empty; 5 of the model's 5 nodes have no name"),
                      ("relu", "no node of that name in the model")):
        r = cli("split", tmp_path / "unnamed.onnx", "-o", tmp_path / "out", "--cut", cut)
        line = one_error_line(r)
        assert r.rc == 2 and says in line and "--cut auto" in line, r.err
        assert not (tmp_path / "out").exists()
    r = cli("split", model, "-o", tmp_path / "out", "--cut", "")
    assert r.rc == 2 and "cannot be empty; give a node's name" in one_error_line(r)
