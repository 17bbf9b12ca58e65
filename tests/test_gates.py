"""Gates: parsing, absolute / first-stage / baseline gates, noise-aware latency, `optkit gate` exit codes."""
from __future__ import annotations

import json
import math

import pytest

from optkit.core.errors import UsageError
from optkit.pipeline.gates import check_gates_plan, evaluate, parse_gate, parse_gates
from optkit.report.schema import ArtifactRef, Report, Stage

from conftest import one_error_line


def stage(name, *, size=None, p50=None, ci=None, norm=None, norm_ci=None, acc=None, cosine=None):
    m = {}
    if size is not None:
        m["size"] = {"bytes": size}
    if p50 is not None:
        m["latency"] = {"p50_ms": p50, "p90_ms": p50 * 1.2, "p99_ms": p50 * 1.5, "ci95_pct": ci, "trials": 5}
        if norm is not None:
            m["latency"].update(normalized=norm, normalized_ci95_pct=norm_ci)
    if acc is not None:
        m["accuracy"] = {"metric": "top1", "top1": acc}
    if cosine is not None:
        m["fidelity"] = {"cosine": cosine, "max_abs_error": 0.0}
    return Stage(name=name, output=ArtifactRef(path=f"{name}.onnx", format="onnx", sha256=name), measurements=m)


def report(*stages) -> Report:
    return Report(command="test", stages=list(stages))


R = report(stage("input", size=1_000_000, p50=2.0, ci=2.0, acc=0.97),
           stage("int8", size=300_000, p50=1.0, ci=2.0, acc=0.965, cosine=0.999))


def test_parse_forms():
    assert parse_gate("size_mb <= 5").text == "size_mb <= 5"
    g = parse_gate("latency_p90_ms@input < 3.5")
    assert (g.metric, g.stage, g.op, g.threshold) == ("latency_p90_ms", "input", "<", 3.5)
    assert parse_gate("p50_ms <= 1").metric == "latency_p50_ms"            # alias
    assert parse_gate("latency_regression_pct <= 10%").threshold == 10
    assert parse_gate({"metric": "accuracy", "min": 0.9}).op == ">="
    assert parse_gate({"metric": "size_mb", "max": 2, "stage": "int8"}).stage == "int8"


@pytest.mark.parametrize("spec, words", [
    ("size_mbb <= 5", "did you mean 'size_mb'"),
    ("size_mb = 5", "cannot read gate"),
    ({"metric": "size_mb"}, "exactly one of"),
    ({"metric": "size_mb", "value": 3}, "no op"),
])
def test_parse_errors(spec, words):
    with pytest.raises(UsageError, match=words):
        parse_gate(spec)


def test_absolute_and_first_stage_gates():
    res = evaluate(R, parse_gates(["size_mb <= 0.5", "size_ratio <= 0.35", "accuracy_drop <= 0.01",
                                   "speedup >= 1.5", "accuracy >= 0.99", "cosine >= 0.99",
                                   "latency_p50_ms@input <= 1"]))
    by = {r.gate: r for r in res}
    assert by["size_mb <= 0.5"].passed and by["size_mb <= 0.5"].value == pytest.approx(0.3)
    assert by["size_ratio <= 0.35"].passed and by["size_ratio <= 0.35"].margin == pytest.approx(0.05)
    assert by["accuracy_drop <= 0.01"].passed and by["accuracy_drop <= 0.01"].value == pytest.approx(0.005)
    assert by["speedup >= 1.5"].passed and by["speedup >= 1.5"].value == pytest.approx(2.0)
    assert not by["accuracy >= 0.99"].passed and by["accuracy >= 0.99"].margin < 0
    assert by["cosine >= 0.99"].passed
    assert not by["latency_p50_ms@input <= 1"].passed and by["latency_p50_ms@input <= 1"].stage == "input"


def test_baseline_gates_use_normalised_latency_and_noise():
    base = report(stage("input", size=1_000_000, p50=2.0, ci=3, norm=0.50, norm_ci=3, acc=0.97))
    # the raw p50 doubled (a slower runner), but the normalised latency moved 4%: no regression
    slower_machine = report(stage("input", size=1_000_000, p50=4.0, ci=3, norm=0.52, norm_ci=3, acc=0.97))
    res = evaluate(slower_machine, parse_gates(["latency_regression_pct <= 10", "size_growth_pct <= 0"]), base)
    assert all(r.passed for r in res), res
    assert "normalised" in res[0].detail
    # a real 20% regression, with 3% noise each side: caught
    slower_model = report(stage("input", size=1_100_000, p50=2.4, ci=3, norm=0.60, norm_ci=3, acc=0.96))
    res = evaluate(slower_model, parse_gates(["latency_regression_pct <= 10", "size_growth_pct <= 5",
                                              "accuracy_drop_vs_baseline <= 0.005"]), base)
    assert [r.passed for r in res] == [False, False, False]
    assert res[0].value == pytest.approx(20.0)


def test_regression_within_noise_cannot_be_judged():
    base = report(stage("m", p50=1.0, ci=10, norm=1.0, norm_ci=10))
    cur = report(stage("m", p50=1.12, ci=10, norm=1.12, norm_ci=10))   # +12% but noise is ±~16%
    (r,) = evaluate(cur, parse_gates(["latency_regression_pct <= 10"]), base)
    assert not r.passed and r.verdict == "cannot judge" and r.value == pytest.approx(12.0)
    assert r.detail.startswith("cannot judge: the noise (±15.8%) is wider than the margin (2%)")
    quiet = report(stage("m", p50=1.12, ci=0.5, norm=1.12, norm_ci=0.5))
    quiet_base = report(stage("m", p50=1.0, ci=0.5, norm=1.0, norm_ci=0.5))
    (r,) = evaluate(quiet, parse_gates(["latency_regression_pct <= 10"]), quiet_base)
    assert not r.passed


def test_missing_figures_and_plan_checks():
    with pytest.raises(UsageError, match="no latency figures"):
        evaluate(report(stage("m", size=10)), parse_gates(["latency_p90_ms <= 1"]))
    with pytest.raises(UsageError, match="baseline"):
        evaluate(R, parse_gates(["size_growth_pct <= 1"]))
    with pytest.raises(UsageError, match="no stage 'nope'"):
        evaluate(R, parse_gates(["size_mb@nope <= 1"]))
    with pytest.raises(UsageError, match="add data.eval"):
        check_gates_plan(parse_gates(["accuracy_drop <= 0.01"]), stages=["input", "a"], measured={"size"},
                         has_baseline=False)
    with pytest.raises(UsageError, match="measure.latency: false"):
        check_gates_plan(parse_gates(["speedup >= 1"]), stages=["input"], measured={"size"}, has_baseline=False)


def test_gate_cli_exit_codes(cli, tmp_path):
    path = tmp_path / "report.json"
    R.save(path)
    ok = cli("gate", path, "size_ratio <= 0.35", "accuracy_drop <= 0.01", "--junit", tmp_path / "j.xml",
             "--markdown", tmp_path / "r.md")
    assert ok.rc == 0, ok.err
    assert "size_ratio <= 0.35" in ok.out and "pass" in ok.out and "margin" in ok.out
    assert 'tests="2" failures="0"' in (tmp_path / "j.xml").read_text()
    assert "all 2 gates passed" in (tmp_path / "r.md").read_text()

    bad = cli("gate", path, "size_ratio <= 0.2", "accuracy_drop <= 0.01", "--junit", tmp_path / "j.xml", "--json")
    assert bad.rc == 1
    rows = json.loads(bad.out)
    assert [r["passed"] for r in rows] == [False, True]
    assert "1 of 2 gates failed: size_ratio <= 0.2" in one_error_line(bad)
    junit = (tmp_path / "j.xml").read_text()
    assert junit.count("<testcase") == 2 and junit.count("<failure") == 1

    for args, words in [(("size_mbb <= 1",), "did you mean"), (("latency_regression_pct <= 5",), "baseline"),
                        (("latency_p50_ms <= 1", "--baseline", tmp_path / "none.json"), "not found")]:
        r = cli("gate", path, *args)
        assert r.rc == 2 and words in one_error_line(r), r.err
    missing = cli("gate", tmp_path / "nope.json", "size_mb <= 1")
    assert missing.rc == 2 and "not found" in one_error_line(missing)
    no_lat = report(stage("m", size=10))
    no_lat.save(tmp_path / "nolat.json")
    r = cli("gate", tmp_path / "nolat.json", "latency_p90_ms <= 1")
    assert r.rc == 2 and "no latency figures" in one_error_line(r)


# ---------------------------------------------------------------- trial distributions (optkit.measure.trials)

def trial_stage(name, trials, *, rungs=("mlp16x256", "mlp32x256"), scale=(1.0, 0.5), low=None):
    """A stage as latency_trials reports it: per-trial normalised latency on two reference rungs."""
    refs = {r: {"normalized": float(sorted(trials)[len(trials) // 2]) * k, "trial_normalized": [t * k for t in trials]}
            for r, k in zip(rungs, scale)}
    lat = {"p50_ms": 1.0, "trials": len(trials), "references": refs, "reference_name": rungs[0],
           "normalized": refs[rungs[0]]["normalized"], "trial_normalized": refs[rungs[0]]["trial_normalized"]}
    if low is not None:
        lat.update(trial_low_ms=low, low_ms=float(sorted(low)[len(low) // 2]))
    return Stage(name=name, output=ArtifactRef(path=f"{name}.onnx", format="onnx", sha256=name),
                 measurements={"latency": lat})


BASE_TRIALS = [1.00, 1.03, 0.98, 1.01, 0.99, 1.02, 1.00, 0.97]


def test_shift_ci_is_the_hodges_lehmann_estimate_with_a_mann_whitney_interval():
    from optkit.pipeline.gates import shift_ci

    cur = [t * 1.2 for t in BASE_TRIALS]
    est, lo, hi = shift_ci(BASE_TRIALS, cur)
    assert est == pytest.approx(math.log(1.2), abs=1e-9)          # a pure shift is recovered exactly
    assert lo < est < hi and hi - lo < 0.1
    # n = m = 8: K = floor(32 - 1.96 * sqrt(64 * 17 / 12)) = 13, so the 13th smallest / largest of 64 differences
    d = sorted(math.log(c) - math.log(b) for c in cur for b in BASE_TRIALS)
    assert (lo, hi) == (pytest.approx(d[12]), pytest.approx(d[64 - 13]))
    # one wild trial (a preemption storm) moves the estimate by little
    est2, _, _ = shift_ci(BASE_TRIALS, cur[:-1] + [cur[-1] * 3])
    assert abs(est2 - est) < 0.02
    # two trials a side: no K >= 1 inside the range, the interval is the whole range of differences
    _, lo, hi = shift_ci([1.0, 1.1], [1.2, 1.3])
    assert (lo, hi) == (pytest.approx(math.log(1.2 / 1.1)), pytest.approx(math.log(1.3)))


def test_regression_gate_uses_both_sides_trials():
    base = report(trial_stage("m", BASE_TRIALS))
    gate = parse_gates(["latency_regression_pct <= 10"])
    (same,) = evaluate(report(trial_stage("m", [t * 1.02 for t in reversed(BASE_TRIALS)])), gate, base)
    assert same.passed and same.value == pytest.approx(2.0, abs=0.5) and "95% CI" in same.detail
    (slow,) = evaluate(report(trial_stage("m", [t * 1.2 for t in BASE_TRIALS])), gate, base)
    assert not slow.passed and slow.value == pytest.approx(20.0, abs=0.5) and slow.margin < 0
    assert "normalised (mlp16x256+mlp32x256)" in slow.detail and "8+8 trials" in slow.detail
    # +15% over the threshold but the trials overlap so much that the slowdown is not above the noise: that is
    # not a pass (there is no benefit of the doubt), it cannot be judged
    noisy = [0.7, 1.5, 0.9, 1.4, 1.0, 1.6, 0.8, 1.3]
    (r,) = evaluate(report(trial_stage("m", [t * 1.15 for t in noisy])), gate, report(trial_stage("m", noisy)))
    assert not r.passed and r.verdict == "cannot judge" and r.value > 10 and r.margin < 0
    assert "95% CI" in r.detail and "measure longer or on a quieter runner" in r.detail
    # the same noise around an unchanged model: the interval holds 10% too, so it cannot be judged either
    (r,) = evaluate(report(trial_stage("m", list(reversed(noisy)))), gate, report(trial_stage("m", noisy)))
    assert r.verdict == "cannot judge" and r.value == pytest.approx(0.0) and r.margin == pytest.approx(10.0)


def test_regression_gate_compares_only_a_shared_reference_rung():
    gate = parse_gates(["latency_regression_pct <= 10"])
    base = report(trial_stage("m", BASE_TRIALS))
    # a bigger model brackets other rungs: only the one both timed is compared, on its own scale
    cur = report(trial_stage("m", [t * 1.2 for t in BASE_TRIALS], rungs=("mlp32x256", "mlp64x256"), scale=(0.5, 0.2)))
    (r,) = evaluate(cur, gate, base)
    assert "normalised (mlp32x256)" in r.detail and r.value == pytest.approx(20.0, abs=0.5) and not r.passed
    # both rungs shared, in the other order: combined per trial by their geometric mean, still +20%
    cur = report(trial_stage("m", [t * 1.2 for t in BASE_TRIALS], rungs=("mlp32x256", "mlp16x256"), scale=(0.5, 1.0)))
    (r,) = evaluate(cur, gate, base)
    assert r.value == pytest.approx(20.0, abs=0.5) and not r.passed
    # no rung in common: normalised figures are not comparable, the raw per-trial p10 is used instead
    base = report(trial_stage("m", BASE_TRIALS, low=[0.50] * 8))
    far = report(trial_stage("m", [t * 3 for t in BASE_TRIALS], rungs=("mlp64x256", "mlp128x256"), low=[0.51] * 8))
    (r,) = evaluate(far, gate, base)
    assert r.passed and "raw p10" in r.detail and r.value == pytest.approx(2.0)


def test_reference_rungs_depend_on_size_only_and_bracket_it():
    from optkit.measure.trials import REFERENCE_LAYER_BYTES as L
    from optkit.measure.trials import reference_rungs

    assert reference_rungs(22 * L) == (16, 32) and reference_rungs(27 * L) == (32, 16)   # share both rungs
    assert reference_rungs(int(8.4 * 2 ** 20)) == (32, 64)
    assert reference_rungs(10) == (1, 2) and reference_rungs(10 ** 10) == (128, 64)
    for size in (3 * L, 5 * L, 40 * L, 100 * L):
        a, b = reference_rungs(size)
        assert min(a, b) * L <= size <= max(a, b) * L and abs(math.log(a * L / size)) <= abs(math.log(b * L / size))


def test_latency_trials_reports_trial_distributions(tmp_path):
    from optkit.core.artifact import Artifact
    from optkit.measure.model import MeasureSettings
    from optkit.measure.trials import LOW_Q, reference_model_bytes, reference_rungs

    path = tmp_path / "m.onnx"
    path.write_bytes(reference_model_bytes(2))
    art = Artifact.load(str(path))
    from optkit.measure.trials import latency_trials

    lat = latency_trials(art, MeasureSettings(threads=1, warmup=1, runs=5), trials=3, normalize=True)
    assert lat["trials"] == 3 and lat["runs"] == 15 and lat["low_quantile"] == LOW_Q
    assert len(lat["trial_low_ms"]) == len(lat["trial_p50_ms"]) == 3
    assert all(lo <= p50 for lo, p50 in zip(lat["trial_low_ms"], lat["trial_p50_ms"]))
    names = [f"mlp{r}x256" for r in reference_rungs(art.size_bytes())]
    assert list(lat["references"]) == names and lat["reference_name"] == names[0]
    assert lat["trial_normalized"] == lat["references"][names[0]]["trial_normalized"]
    assert all(len(v["trial_normalized"]) == 3 and v["normalized"] > 0 for v in lat["references"].values())
    # the same model as its own baseline is no regression
    rep = report(Stage(name="m", output=ArtifactRef(path=str(path), format="onnx", sha256="x"),
                       measurements={"latency": lat}))
    (r,) = evaluate(rep, parse_gates(["latency_regression_pct <= 10"]), rep)
    # a busy machine may widen the band past the margin: then "cannot judge", never a failure judged as one
    assert r.value == pytest.approx(0.0) and (r.passed or r.detail.startswith("cannot judge")), r
    raw = latency_trials(art, MeasureSettings(threads=1, warmup=1, runs=5), trials=2, normalize=False)
    assert "references" not in raw and "normalized" not in raw and len(raw["trial_low_ms"]) == 2


def test_gates_on_figures_of_the_wrong_type_are_usage_errors_in_process():
    """A report built in Python is not checked by Report.load: every gate refuses a wrong-typed figure (exit 2)
    instead of crashing on it."""
    bad = stage("int8", size=300_000, p50=1.0, ci=2.0, acc=0.965)
    bad.measurements["latency"]["ci95_pct"] = "x"
    rep = report(stage("input", size=1_000_000, p50=2.0, ci=2.0, acc=0.97), bad)
    for g in ("latency_p50_ms <= 1", "speedup >= 1", "latency_regression_pct <= 10", "size_mb <= 1"):
        with pytest.raises(UsageError, match=r"stage 'int8': figure latency.ci95_pct is 'x', not a number"):
            evaluate(rep, parse_gates([g]), R)


def test_a_latency_figure_recorded_as_null_fails_the_regression_gate():
    """null is a non-finite figure: the regression gate fails on it, as the absolute latency gates do."""
    base = report(stage("input", size=1_000_000, p50=2.0, ci=2.0))
    base.stages[0].measurements["latency"]["p50_ms"] = None
    (r,) = evaluate(report(stage("input", size=1_000_000, p50=2.0, ci=2.0)),
                    parse_gates(["latency_regression_pct <= 10"]), base)
    assert not r.passed and "NaN" in r.detail
    (r,) = evaluate(base, parse_gates(["latency_p50_ms <= 10"]))
    assert not r.passed and "NaN" in r.detail


def _loaded(throughput, band):
    conc = {"concurrency": 2, "sessions": 2, "throughput_per_s": throughput, "p50_ms": 1.0, "p99_ms": 2.0}
    if band is not None:
        conc["ci95"] = {"throughput_per_s": band}
    return report(Stage(name="m", output=ArtifactRef(path="m.onnx", format="onnx", sha256="m"),
                        measurements={"concurrency": conc}))


@pytest.mark.parametrize("band, verdict", [
    ([950.0, 1050.0], "pass"),           # the whole band over 900
    ([850.0, 1150.0], "cannot judge"),   # the noise (±150) is wider than the margin (100)
    (None, "cannot judge"),              # a report without the band: not judged as exact
    ([None, None], "cannot judge"),      # too few calls to bound it
])
def test_throughput_under_load_is_judged_on_its_band(band, verdict):
    (r,) = evaluate(_loaded(1000.0, band), parse_gates(["throughput >= 900"]))
    assert r.verdict == verdict and r.passed == (verdict == "pass") and r.value == 1000.0, r.detail
    assert "2 in flight" in r.detail


def test_throughput_under_load_below_its_threshold_fails():
    (r,) = evaluate(_loaded(800.0, [750.0, 850.0]), parse_gates(["throughput >= 900"]))
    assert r.verdict == "fail" and "95% band 750 samples/s .. 850 samples/s" in r.detail


def test_a_load_band_that_does_not_hold_its_figure_is_bad_input():
    with pytest.raises(UsageError, match="ci95.throughput_per_s"):
        evaluate(_loaded(1000.0, [10.0, 20.0]), parse_gates(["throughput >= 900"]))
