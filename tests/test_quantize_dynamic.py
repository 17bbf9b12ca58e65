"""Dynamic INT8 searches which op types to quantize (MatMul/attention/recurrent alone, then with Conv and Gather)
and never writes a model slower than its parent beyond the noise unless allow_slower: real torch models exported
to ONNX, real onnxruntime, no mocks."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import one_error_line


def _export(net, example, path: Path) -> Path:
    import torch

    torch.onnx.export(net.eval(), (example,), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17, dynamo=False)
    return path


def _conv_stack(torch, with_head: bool):
    """A small detector-like backbone: 3x3 convs at 16-32 channels on a 32x32 image (what ConvInteger is slow on),
    with or without a Linear head."""
    layers = [torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU()]
    for _ in range(2):
        layers += [torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU()]
    layers += [torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU()]
    if with_head:
        layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 256), torch.nn.ReLU(),
                   torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)]
    return torch.nn.Sequential(*layers)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("dyn-models")
    img = torch.randn(1, 3, 32, 32)
    mlp = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    return {"conv": _export(_conv_stack(torch, False), img, d / "conv.onnx"),
            "conv_head": _export(_conv_stack(torch, True), img, d / "conv_head.onnx"),
            "mlp": _export(mlp, torch.randn(1, 512), d / "mlp.onnx")}


def _ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def _runs(path: Path) -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    shape = [d if isinstance(d, int) else 1 for d in sess.get_inputs()[0].shape]
    out = sess.run(None, {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)})
    assert np.isfinite(out[0]).all()


def _quantize(cli, src: Path, out: Path, *extra):
    r = cli("quantize", src, "-o", out, "--mode", "dynamic", "--json", *extra)
    data = json.loads(r.out) if r.out.strip().startswith("{") else {}
    return r, data


def _not_slower_or_refused(r, data, out: Path) -> dict | None:
    """Written and not slower than the parent beyond the noise (the chosen one's interval reaches down to the
    limit), or refused with exit 3: nothing at -o, the candidate kept aside, a hint that never suggests dynamic mode.
    Returns the chosen candidate when written."""
    rejected = out.with_name(f"{out.stem}.REJECTED.onnx")
    if r.rc == 3:
        msg = one_error_line(r)
        assert "dynamic INT8 is" in msg and "kept as" in msg and "--allow-slower" in msg
        assert "--mode dynamic" not in msg and "ConvInteger" in msg
        assert not out.exists() and rejected.exists()
        _runs(rejected)
        return None
    assert r.rc == 0, r.err
    q = data["stages"][1]["measurements"]["quantize"]
    chosen = next(c for c in q["candidates"] if c.get("chosen"))
    assert chosen["latency_ratio_ci95"][0] <= 1.05, chosen  # not slower beyond the noise
    assert not q["settings"]["speed"]["slower"] and not rejected.exists()
    _runs(out)
    return chosen


def test_conv_net_with_a_matmul_head_keeps_conv_float_or_is_refused(cli, models, tmp_path):
    out = tmp_path / "q.onnx"
    r, data = _quantize(cli, models["conv_head"], out, "--per-channel", "--full-search")  # both tiers, whatever
    # this CPU's kernel table says of ConvInteger (its skip: tests/test_quantize_kernels.py)
    cands = data.get("stages", [{}, {}])[1].get("measurements", {}).get("quantize", {}).get("candidates") or \
        data.get("candidates")
    # both tiers were tried: Linear layers alone (Conv float), then with Conv (no duplicates)
    tiers = {tuple(c["op_types"]) for c in cands}
    assert tiers == {("MatMul",), ("MatMul", "Conv")}, tiers
    assert len(cands) == len({(c["variant"]) for c in cands})
    chosen = _not_slower_or_refused(r, data, out)
    if chosen is not None:
        ops = _ops(out)
        assert "MatMulInteger" in ops  # the Linear layers (Gemm, rewritten as MatMul) are quantized
        if chosen["float_ops"] == ["Conv"]:
            assert "Conv" in ops and "ConvInteger" not in ops
        else:
            assert "ConvInteger" in ops


def test_conv_only_net_is_never_written_slower(cli, models, tmp_path):
    out = tmp_path / "q.onnx"
    r, data = _quantize(cli, models["conv"], out, "--per-channel", "--no-reduce-range")
    if r.rc == 0:
        assert "ConvInteger" in _ops(out)
    else:  # the hint says there was nothing to leave float, and what suits the model instead
        assert "no MatMul, Attention, LSTM to quantize alone" in r.err and "--mode static" in r.err
    _not_slower_or_refused(r, data, out)
    cands = data["stages"][1]["measurements"]["quantize"]["candidates"] if r.rc == 0 else data["candidates"]
    assert len(cands) == 1 and cands[0]["op_types"] == ["Conv"]  # nothing to leave float: one tier only


def test_conv_only_net_allowed_slower_says_nothing_gets_faster(cli, models, tmp_path):
    out = tmp_path / "allowed.onnx"
    r, data = _quantize(cli, models["conv"], out, "--per-channel", "--no-reduce-range", "--allow-slower")
    assert r.rc == 0, r.err
    stage = data["stages"][1]
    said = [n for n in stage["notes"] if "nothing in this model that it makes faster" in n]
    assert len(said) == 1 and "Conv x4" in said[0] and "ConvInteger" in said[0]
    if stage["measurements"]["quantize"]["settings"]["speed"]["slower"]:  # written, loudly
        assert any("SLOWER" in w and "written anyway (allow_slower" in w for w in stage["warnings"])
    assert "ConvInteger" in _ops(out) and not out.with_name("allowed.REJECTED.onnx").exists()
    _runs(out)


def test_matmul_heavy_model_is_still_quantized(cli, models, tmp_path):
    out = tmp_path / "q.onnx"
    r, data = _quantize(cli, models["mlp"], out)
    assert r.rc == 0, r.err
    ops = _ops(out)
    assert "MatMulInteger" in ops and "Gemm" not in ops
    q = data["stages"][1]["measurements"]["quantize"]
    assert {tuple(c["op_types"]) for c in q["candidates"]} == {("MatMul",)}  # no Conv or Gather: one tier
    assert any("rewrote 3 Gemm nodes as MatMul" in n for n in data["stages"][1]["notes"])
    assert out.stat().st_size < 0.4 * models["mlp"].stat().st_size
    _runs(out)


def test_user_op_types_override_the_tiers(cli, models, tmp_path):
    out = tmp_path / "q.onnx"
    r, data = _quantize(cli, models["conv_head"], out, "--exclude-op", "Conv", "--per-channel", "--no-reduce-range",
                        "--allow-slower")
    assert r.rc == 0, r.err
    cands = data["stages"][1]["measurements"]["quantize"]["candidates"]
    assert [c["op_types"] for c in cands] == [["MatMul"]] and cands[0]["float_ops"] == []
    assert "ConvInteger" not in _ops(out)
