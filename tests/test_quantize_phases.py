"""The quantize search's phases, each driven alone: building candidates (prepare.py, build.py, the strategy's
settings), screening on a subset and scoring on the whole set (score.py), timing the survivors (timing.py) and
choosing (choose.py). Nothing here asserts that a model is faster: the choose phase is fed made-up figures,
and the timing phase is only checked to record its figures."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError, ValidationError
from optkit.core.registry import PassContext
from optkit.measure.datasets import load_dataset
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx import session as onnx_session
from optkit.passes.quantize import timing
from optkit.passes.quantize.budget import Budget
from optkit.passes.quantize.build import Builder, schedule, small_channel_convs, twin_missed
from optkit.passes.quantize.candidates import Candidate, Settings
from optkit.passes.quantize.choose import Chooser
from optkit.passes.quantize.config import QuantizeConfig
from optkit.passes.quantize.engine import calibration_reader, strategy_for
from optkit.passes.quantize.prepare import Reference, check_quantizable, load_reference, prepare
from optkit.passes.quantize.score import Scorer

CNN = "torch_cnn.onnx"


def _matmul(path: Path, scale: float = 1.0) -> Path:
    """y = x @ w + b: a tiny float model (scale: its weights multiplied by that)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 8)) * scale).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(8, np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Add", ["h", "b"], ["y"],
                                                                                          name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], [w, b])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _eval_feeds(samples: Path, n: int = 64) -> tuple[dict, np.ndarray]:
    data = np.load(samples / "digits_eval_nchw.npz")
    return {"input": data["input"][:n]}, data["labels"][:n]


def _broken_copy(samples: Path, dest: Path) -> Path:
    """The sample CNN with its first conv's weights negated: it runs, but its outputs are far from the parent's."""
    model = onnx_io.load(samples / CNN)
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.name == "features.0.weight":
            init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))
    onnx_io.save(model, dest)
    return dest


def _cand(index: int, path: Path, **figures) -> Candidate:
    return Candidate(index=index, settings=Settings(format="qdq", per_channel=bool(index % 2)), path=path, **figures)


# ------------------------------------------------------------ building candidates
def test_the_settings_each_mode_searches(tmp_path):
    static = strategy_for(QuantizeConfig(mode="static"), tmp_path).space()
    assert len(static) == 16 and len(set(static)) == 16   # format x activation x per-channel x reduce-range
    assert static[0] == Settings(format="qdq", activation_type="uint8", weight_type="int8", per_channel=True,
                                 reduce_range=False, calibration="minmax")
    assert {s.format for s in static} == {"qdq", "qoperator"} and {s.calibration for s in static} == {"minmax"}
    # QOperator tries per-tensor first
    assert next(s for s in static if s.format == "qoperator").per_channel is False
    # costlier tier for the best two: bias correction, then percentile and entropy calibration
    tier = strategy_for(QuantizeConfig(mode="static"), tmp_path).slower_tier(static[:2])
    assert [(s.bias_correction, s.calibration) for s in tier] == [
        (True, "minmax"), (True, "minmax"), (None, "percentile"), (None, "percentile"), (None, "entropy"),
        (None, "entropy")]
    trt = strategy_for(QuantizeConfig(mode="static", target="tensorrt"), tmp_path)
    assert trt.space() == [Settings(format="qdq", activation_type="int8", weight_type="int8", per_channel=False,
                                    reduce_range=False, calibration="minmax")] and trt.slower_tier(static) == []
    narrowed = strategy_for(QuantizeConfig(mode="static", format="qdq", activation_type="int8", per_channel=True),
                            tmp_path).space()
    assert [s.reduce_range for s in narrowed] == [False, True]

    dynamic = strategy_for(QuantizeConfig(mode="dynamic"), tmp_path)
    dynamic.present = {"MatMul", "Conv"}
    space = dynamic.space()
    assert len(space) == 8
    assert {(s.op_types, s.float_ops) for s in space} == {(("MatMul",), ("Conv",)), (("MatMul", "Conv"), ())}
    assert space[0].op_types == ("MatMul",) and space[0].per_channel and not space[0].reduce_range
    dynamic.present = {"Conv"}   # nothing dynamic INT8 makes faster: one tier, Conv quantized
    assert {s.op_types for s in dynamic.space()} == {("Conv",)}

    for mode in ("fp16", "int4"):
        assert strategy_for(QuantizeConfig(mode=mode), tmp_path).space() == [Settings()]


def test_build_a_static_candidate_of_the_sample_cnn(samples, tmp_path):
    """prepare + load_reference + Builder alone: the first static setting gives a quantized file with its size."""
    cfg = QuantizeConfig(mode="static", calibration_size=16, check_samples=32)
    ctx = PassContext(output=tmp_path / "out.onnx", data={
        "calibration": load_dataset(samples / "digits_calib_nchw.npz"),
        "eval": load_dataset(samples / "digits_eval_nchw.npz")})
    parent = Artifact.load(str(samples / CNN))
    model = onnx_io.load(parent.path)
    assert check_quantizable(model, cfg, parent.path) == ["Conv x3", "Gemm x2"]
    work = tmp_path / "work"
    work.mkdir()
    strategy = strategy_for(cfg, work)
    float_model, nothing_faster = prepare(model, cfg, ctx, strategy, work, work / "prepared.onnx")
    assert nothing_faster is None and (work / "prepared.onnx").exists()
    settings: dict = {}
    ref = load_reference(parent.path, cfg, ctx, settings)
    assert settings["calibration"]["samples"] == 16 and settings["check"]["samples"] == 32 and ref.samples == 32
    builder = Builder(parent, cfg, strategy, work / "prepared.onnx", float_model,
                      reader=lambda: calibration_reader(ref.specs, ref.calib_feeds))
    cand = Candidate(index=0, settings=strategy.space()[0], path=work / "cand0.onnx")
    assert builder.build(cand, work / "cand0.raw.onnx"), cand.error
    assert graph.is_quantized(onnx_io.load(cand.path)) and cand.bytes > 0 and 0 < cand.ratio < 1
    # the small-channel Conv (1 input channel) is the one the static search may keep float
    assert small_channel_convs(float_model, []) == [float_model.graph.node[0].name]
    assert small_channel_convs(float_model, [float_model.graph.node[0].name]) == []


def test_nothing_to_quantize_is_a_usage_error(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    with pytest.raises(UsageError, match="nothing to quantize .* for mode dynamic: it has Relu"):
        check_quantizable(model, QuantizeConfig(mode="dynamic"), "m.onnx")


def test_which_settings_are_worth_building(tmp_path):
    qdq = Settings(format="qdq", activation_type="uint8", weight_type="int8", per_channel=False,
                   reduce_range=False, calibration="minmax")
    qop = Settings(**{**qdq.__dict__, "format": "qoperator"})
    missed = Candidate(index=0, settings=qdq, path=tmp_path / "c0.onnx", fidelity={"loss": 0.5})
    assert twin_missed(qop, [missed]) is missed and twin_missed(qdq, [missed]) is None
    missed.slower_than = 3   # dropped for speed, not for its outputs: no verdict on the twin
    assert twin_missed(qop, [missed]) is None
    assert schedule(10, 20) == [1, 2, 4, 8, 10] and schedule(10, 3) == [1, 2, 10] and schedule(0, 5) == []


# ------------------------------------------------------------ screening and scoring
def test_screening_drops_a_candidate_whose_fidelity_fails(samples, tmp_path):
    feeds, _ = _eval_feeds(samples)
    cfg = QuantizeConfig(mode="static")
    ref = Reference.of(samples / CNN, feeds)
    scorer = Scorer(ref, Budget.of(cfg), cfg)
    assert scorer.screen_size(64) == 16   # a quarter of the set for a fidelity budget
    bad = _cand(0, _broken_copy(samples, tmp_path / "bad.onnx"))
    scorer.check(bad, [bad])
    assert bad.screened_out and not bad.passed and bad.checked_on == 16 and bad.fidelity["loss"] > 0.04
    good = _cand(1, Path(shutil.copy(samples / CNN, tmp_path / "good.onnx")))
    assert scorer.screen(good, onnx_session.session(good.path), [bad, good])
    assert good.checked_on == 16 and good.screen_s is not None and not good.passed  # screened, not yet scored
    scorer.score(good, onnx_session.session(good.path))
    assert good.passed and good.checked_on == 64 and good.fidelity["loss"] < 1e-6


def test_without_the_latency_search_no_screening(samples, tmp_path):
    feeds, _ = _eval_feeds(samples)
    cfg = QuantizeConfig(mode="static", latency_search=False)
    scorer = Scorer(Reference.of(samples / CNN, feeds), Budget.of(cfg), cfg)
    bad = _cand(0, _broken_copy(samples, tmp_path / "bad.onnx"))
    scorer.check(bad, [bad])
    assert not bad.screened_out and bad.checked_on == 64 and not bad.passed


def test_score_on_the_whole_set_with_a_metric(samples, tmp_path):
    feeds, labels = _eval_feeds(samples)
    cfg = QuantizeConfig(mode="static", metric="top1", max_accuracy_drop=0.02)
    ref = Reference.of(samples / CNN, feeds, metric="top1", labels=labels)
    assert 0.5 < ref.parent_accuracy <= 1
    scorer = Scorer(ref, Budget.of(cfg), cfg)
    same = _cand(0, Path(shutil.copy(samples / CNN, tmp_path / "same.onnx")))
    scorer.score(same, onnx_session.session(same.path))
    assert same.passed and same.accuracy_drop == 0 and same.accuracy == ref.parent_accuracy and same.checked_on == 64
    bad = _cand(1, _broken_copy(samples, tmp_path / "bad.onnx"))
    scorer.score(bad, onnx_session.session(bad.path))
    assert bad.checked_on == 64 and bad.accuracy_drop > 0.02 and not bad.passed


# ------------------------------------------------------------ timing the survivors
def test_timing_records_paired_figures(tmp_path, monkeypatch):
    """The survivors against the parent through measure.paired (no check of which is faster)."""
    monkeypatch.setattr(timing, "TIMING_LIMIT_S", 1.5)
    monkeypatch.setattr(timing, "TIMING_TRIALS", 2)
    parent = Artifact.load(str(_matmul(tmp_path / "parent.onnx")))
    pool = [_cand(0, _matmul(tmp_path / "a.onnx", 0.5)), _cand(1, _matmul(tmp_path / "b.onnx", 2.0))]
    feeds = {"x": np.ones((4, 16), np.float32)}
    specs = onnx_session.input_specs(onnx_session.session(parent.path), parent.path)
    notes: list[str] = []
    got = timing.time_candidates(parent, pool, specs, feeds, notes.append)
    assert not notes and got["parent_p50_ms"] > 0 and "up to 2 trials" in got["latency_settings"]
    for c in pool:
        assert c.p50_ms > 0 and c.latency_ratio > 0 and len(c.latency_ratio_ci95) == 2 and c.latency_trials >= 1
    missing = _cand(2, tmp_path / "missing.onnx")
    assert timing.time_candidates(parent, [missing], specs, feeds, notes.append) == {}
    assert notes and notes[0].startswith("candidate latency not measured: ")


# ------------------------------------------------------------ choosing
def _timed(index, path, ratio, ci, **figures) -> Candidate:
    c = _cand(index, path, bytes=1000 + index, ratio=0.3, passed=True, latency_ratio=ratio,
              latency_ratio_ci95=list(ci), p50_ms=ratio, **figures)
    c.fidelity = {"loss": 0.001}
    return c


def test_choose_picks_the_fastest_within_every_budget(tmp_path):
    cfg = QuantizeConfig(mode="static", max_size_ratio=0.5)
    ctx = PassContext(output=tmp_path / "out.onnx")
    slow, fast, big = (_timed(0, tmp_path / "a.onnx", 0.8, (0.75, 0.85)), _timed(1, tmp_path / "b.onnx", 0.4, (0.38, 0.42)),
                       _timed(2, tmp_path / "c.onnx", 0.2, (0.19, 0.21)))
    big.ratio = 0.9   # the fastest, but past the size budget
    missed = _timed(3, tmp_path / "d.onnx", 0.1, (0.09, 0.11))
    missed.passed = False
    chooser = Chooser(cfg, Budget.of(cfg), ctx, [slow, fast, big, missed])
    fits = chooser.fitting([slow, fast, big, missed])
    assert fits == [slow, fast]
    chosen = chooser.pick(fits)
    assert chosen is fast and fast.chosen and not slow.chosen
    settings = {"parent_p50_ms": 1.0}
    chooser.check_speed(chosen, fits, settings, lambda c: ("never asked", ""))
    assert settings["speed"]["slower"] is False
    assert any(n.startswith("search race (") and ": 0.40x the parent's" in n for n in ctx.notes)


def test_choose_refuses_a_clearly_slower_int8_result_unless_allowed(tmp_path):
    model = _matmul(tmp_path / "q.onnx")
    slower = _timed(0, model, 1.4, (1.3, 1.5))
    hint = lambda c: ("int8 kernels do not pay off here", "or keep the model float")  # noqa: E731
    cfg = QuantizeConfig(mode="static")
    ctx = PassContext(output=tmp_path / "out.onnx")
    chooser = Chooser(cfg, Budget.of(cfg), ctx, [slower])
    settings = {"parent_p50_ms": 1.0}
    with pytest.raises(ValidationError, match="static INT8 is SLOWER than its FP32 parent on this CPU") as err:
        chooser.check_speed(chooser.pick([slower]), [slower], settings, hint)
    assert settings["speed"]["slower"] is True and "Set allow_slower (--allow-slower)" in err.value.message
    assert (tmp_path / "out.REJECTED.onnx").exists() and not (tmp_path / "out.onnx").exists()
    # within the noise of the limit: not refused
    inside = _timed(1, model, 1.04, (0.98, 1.10))
    chooser.check_speed(inside, [inside], settings, hint)
    assert settings["speed"]["slower"] is False and "within the timing noise of the limit" in ctx.notes[-1]
    # allowed: written anyway, said loudly
    cfg = QuantizeConfig(mode="static", allow_slower=True)
    ctx = PassContext(output=tmp_path / "out2.onnx")
    Chooser(cfg, Budget.of(cfg), ctx, [slower]).check_speed(slower, [slower], settings, hint)
    assert ctx.warnings and ctx.warnings[0].endswith("written anyway (allow_slower / --allow-slower)")
    # untimed: nothing judged
    untimed = _cand(2, model, passed=True)
    settings = {}
    Chooser(cfg, Budget.of(cfg), ctx, [untimed]).check_speed(untimed, [untimed], settings, hint)
    assert "speed" not in settings


def test_choose_refuses_when_no_candidate_fits_the_size_budget(tmp_path):
    cfg = QuantizeConfig(mode="static", max_size_ratio=0.1)
    ctx = PassContext(output=tmp_path / "out.onnx")
    big = _timed(0, _matmul(tmp_path / "q.onnx"), 0.5, (0.45, 0.55))
    with pytest.raises(ValidationError, match="no static candidate met the size budget"):
        Chooser(cfg, Budget.of(cfg), ctx, [big]).fitting([big])
    assert (tmp_path / "out.REJECTED.onnx").exists()
