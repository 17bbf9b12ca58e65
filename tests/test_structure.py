"""Structure that keeps optkit readable: one place opens onnxruntime sessions, no module grows past a size."""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "optkit"


def test_one_onnxruntime_session_factory():
    """Every session goes through optkit.onnx.session.ort_session (providers, threads, telemetry off, quiet logs)."""
    files = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                   if "InferenceSession(" in p.read_text())
    assert len(files) <= 2, f"onnxruntime sessions opened outside optkit/onnx/session.py: {files}"
    assert "optkit/onnx/session.py" in files


def test_the_factory_keeps_each_callers_options(tmp_path):
    import numpy as np
    from onnx import TensorProto, helper

    from optkit.onnx.session import OrtSettings, ort_session

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    sess = ort_session(path, threads=2, ort_settings=OrtSettings(inter_op_threads=3, execution_mode="parallel"))
    so = sess.get_session_options()
    assert (so.intra_op_num_threads, so.inter_op_num_threads) == (2, 3)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    optimized = tmp_path / "opt.onnx"
    ort_session(model.SerializeToString(), optimization="basic", optimized_path=optimized)
    assert optimized.is_file()
    profiled = ort_session(path, profile_prefix=tmp_path / "prof")
    profiled.run(None, {"x": np.ones((1, 4), np.float32)})
    assert Path(profiled.end_profiling()).parent == tmp_path
