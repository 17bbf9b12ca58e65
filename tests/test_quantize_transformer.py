"""Dynamic INT8 of a BERT-style encoder (a transformers config, seeded weights, a real 30,522-token table, real
sentence pairs): the written file quantizes the embedding tables too (an int8-sized file, not one 2.5x larger for
a cosine gain inside the noise), onnxruntime's transformer fusions race the unfused candidates, and a fused model
that does not compute what its parent does is never used."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from optkit.passes.quantize import fusion

sys.path.insert(0, str(Path(__file__).parent))
from _encoders import encoder, pairs  # noqa: E402

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("encoder")
    np.savez(d / "pairs.npz", **pairs(16, 64))
    return encoder("tiny", d), d / "pairs.npz"


def test_dynamic_int8_of_an_encoder_quantizes_its_tables_and_tries_the_fusions(tiny, cli, tmp_path):
    model, data = tiny
    out = tmp_path / "q.onnx"
    r = cli("quantize", str(model), "-o", str(out), "--mode", "dynamic", "--eval-data", str(data),
            "--allow-slower", "--json")
    assert r.rc == 0, r.err
    stage = json.loads(r.out)["stages"][-1]
    q = stage["measurements"]["quantize"]
    variants = [c["variant"] for c in q["candidates"]]
    assert any("fused" in v for v in variants), variants        # the fused model raced the others
    chosen = next(c for c in q["candidates"] if c["chosen"])
    assert "Gather" not in chosen["variant"]                     # the tables were quantized
    assert chosen["ratio"] <= 0.30                               # 0.27 here: the 30k x 64 table is most of it
    assert out.stat().st_size <= 0.30 * model.stat().st_size
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert ops & {"MatMulInteger", "QAttention", "DynamicQuantizeMatMul"}
    assert ops & {"QEmbedLayerNormalization", "DequantizeLinear"}  # the table is int8 in the file either way
    assert chosen["fidelity"]["cosine"] >= 0.99
    assert any("transformer fusions apply" in n for n in stage.get("notes", [])), stage.get("notes")


def test_no_fusion_keeps_standard_onnx_ops(tiny, cli, tmp_path):
    model, data = tiny
    out = tmp_path / "q.onnx"
    r = cli("quantize", str(model), "-o", str(out), "--mode", "dynamic", "--eval-data", str(data),
            "--allow-slower", "--no-fusion", "--json")
    assert r.rc == 0, r.err
    q = json.loads(r.out)["stages"][-1]["measurements"]["quantize"]
    assert not any("fused" in c["variant"] for c in q["candidates"])
    assert all(n.domain in ("", "ai.onnx") for n in onnx.load(str(out)).graph.node)


def test_fusion_reads_heads_and_width_from_a_dynamic_graph(tiny, tmp_path):
    model, _ = tiny
    assert fusion.fusion_shape(onnx.load(str(model))) == (2, 64)   # view(batch, seq, -1, 32) of width 64
    fused = fusion.fuse(model, tmp_path / "fused.onnx")
    assert fused and fused.get("Attention") == 2 and fused.get("EmbedLayerNormalization") == 1


def test_a_fused_model_that_computes_something_else_is_refused():
    a = [np.ones((2, 4, 8), np.float32)]
    assert fusion.same_outputs(a, [a[0] + 1e-6])
    assert not fusion.same_outputs(a, [a[0] * 1.01])
    assert not fusion.same_outputs(a, [a[0].reshape(2, 8, 4)])
    assert not fusion.same_outputs(a, [np.full_like(a[0], np.nan)])


def test_a_model_that_is_no_transformer_is_left_alone(samples, tmp_path):
    assert fusion.fuse(samples / "torch_cnn.onnx", tmp_path / "f.onnx") is None
    assert not (tmp_path / "f.onnx").exists()


def test_a_single_head_encoder_is_fused_too(tmp_path):
    model = encoder("tiny-1head", tmp_path)
    assert fusion.fusion_shape(onnx.load(str(model))) == (1, 64)   # view(batch, seq, 1, 64): the head is the width
    fused = fusion.fuse(model, tmp_path / "fused.onnx")
    assert fused and fused.get("Attention") == 2, fused


def test_heads_the_graph_does_not_say_are_left_to_the_optimizer(tiny):
    """A width without heads is refused by onnxruntime's optimizer (which then fuses nothing at all, not even the
    LayerNorm and Gelu subgraphs): the shape is (0, 0) unless both are known."""
    model = onnx.load(str(tiny[0]))
    model.graph.input.append(onnx.helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, [4]))
    for n in model.graph.node:  # every reshape's target given at run time: the heads are not in the graph
        if n.op_type == "Reshape":
            n.input[1] = "shape"
    assert fusion.fusion_shape(model) == (0, 0)


def test_a_fusion_that_removes_a_returned_tensor_is_not_used_and_prints_nothing(tiny, capfd, tmp_path):
    """The optimizer fuses attention even where its probabilities are also a graph output: the fused file would
    not load. Not written; and the optimizer's own prints stay off the console (said at -v)."""
    model = onnx.load(str(tiny[0]))
    probs = next(n for n in model.graph.node if n.op_type == "Softmax").output[0]
    model.graph.output.append(onnx.helper.make_tensor_value_info(probs, onnx.TensorProto.FLOAT, None))
    onnx.save(model, tmp_path / "probs.onnx")
    capfd.readouterr()
    assert fusion.fuse(tmp_path / "probs.onnx", tmp_path / "fused.onnx") is None
    assert not (tmp_path / "fused.onnx").exists()
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    assert not fusion.same_outputs([np.ones(3)], [np.ones(3), np.ones(3)])  # another output count: not the same


def _ops(path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_an_op_type_kept_float_stays_float_in_the_fused_candidates(tiny, cli, tmp_path):
    """--exclude-op Attention: no candidate, fused or not, holds QAttention."""
    model, data = tiny
    out = tmp_path / "q.onnx"
    r = cli("quantize", str(model), "-o", str(out), "--mode", "dynamic", "--eval-data", str(data),
            "--allow-slower", "--exclude-op", "Attention", "--json")
    assert r.rc == 0, r.err
    assert "QAttention" not in _ops(out) and _ops(out) & {"MatMulInteger", "DynamicQuantizeMatMul"}


@pytest.mark.parametrize("flag", ["--exclude-node", "--include-node"])
def test_named_nodes_are_honoured_the_fusion_is_not_tried(tiny, cli, tmp_path, flag):
    """Node names are the unfused graph's: the fused one merges the query projection into Attention, where it
    was quantized although excluded (QAttention), or where none of the included nodes is found (exit 3)."""
    model, data = tiny
    query = next(n.name for n in onnx.load(str(model)).graph.node
                 if n.op_type == "MatMul" and "layer.0/attention/self/query" in n.name)
    out = tmp_path / "q.onnx"
    r = cli("quantize", str(model), "-o", str(out), "--mode", "dynamic", "--eval-data", str(data),
            "--allow-slower", flag, query, "--json")
    assert r.rc == 0, r.err
    stage = json.loads(r.out)["stages"][-1]
    assert not any("fused" in c["variant"] for c in stage["measurements"]["quantize"]["candidates"])
    assert any("fusions not tried" in n for n in stage.get("notes", [])), stage.get("notes")
    q = onnx.load(str(out))
    assert "QAttention" not in _ops(out)
    integer = [n for n in q.graph.node if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul")]
    assert (len(integer) == 1) if flag == "--include-node" else (len(integer) >= 1)
    assert all(n.domain in ("", "ai.onnx") for n in q.graph.node)


def test_a_missed_budget_races_float_tables_against_a_fallback_that_keeps_them_int8(tiny, cli, tmp_path):
    """A budget the fully quantized encoder misses: the slower tier keeps the embedding tables (Gather) float,
    and the node fallback runs beside it with the tables left out of its ranking (they stay int8, a quarter of
    their float size), so the choice rule can weigh a small file against a large one."""
    model, data = tiny
    out = tmp_path / "q.onnx"
    r = cli("quantize", str(model), "-o", str(out), "--mode", "dynamic", "--eval-data", str(data), "--allow-slower",
            "--no-fusion", "--max-fidelity-loss", "0.00001", "--per-channel", "--no-reduce-range", "--max-candidates",
            "5", "--json")
    assert r.rc in (0, 3), r.err
    body = json.loads(r.out)
    cands = body["stages"][-1]["measurements"]["quantize"]["candidates"] if r.rc == 0 else body["candidates"]
    assert r.rc == 0 or not out.exists()
    gathers = {n.name for n in onnx.load(str(model)).graph.node if n.op_type == "Gather"}
    assert any(c.get("float_ops") == ["Gather"] for c in cands)                     # the float-table tier
    fallback = [c for c in cands if c["float_nodes"]]
    assert fallback and not any(set(c["float_nodes"]) & gathers for c in fallback)  # tables stay int8 there
