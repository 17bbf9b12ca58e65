"""Gates on noisy figures: a gate whose 95% noise band straddles its threshold cannot be judged and never passes.

The reproducer (issue item 2): a stage measured p99 22.56 ms with noise ±62 ms, and `optkit gate report.json
"latency_p99_ms <= 0.05"` exited 0, "pass": the noise-aware rule gave the figure the benefit of the doubt, so on
a noisy runner every latency gate passed. Now the whole band must be on the right side to pass, the whole band
on the wrong side fails, and a band across the threshold is "cannot judge" (exit 1, its own verdict).
"""
from __future__ import annotations

import json
import math
import re

import pytest

from optkit.pipeline.gates import NO_BAND, evaluate, parse_gates
from optkit.report.schema import ArtifactRef, Report, Stage

from conftest import one_error_line


@pytest.fixture(scope="module")
def bench_report(sample_bench_report) -> dict:
    return sample_bench_report


def noisy(bench: dict, tmp_path, *, p99: float, noise: float, name: str = "report.json"):
    """The bench report with its latency measured in 5 trials, p99 `p99` ms and a 95% band of ±`noise` ms (the
    trials' and the runs' own: a p99 is judged on its own band, never on the p50's alone)."""
    d = json.loads(json.dumps(bench))
    lat = d["stages"][-1]["measurements"]["latency"]
    lat.update(p99_ms=p99, trials=5, ci95_pct=100 * noise / p99)
    lat["ci95"]["p99_ms"] = [max(p99 - noise, 0.0), p99 + noise]
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


def test_the_reproducer_cannot_be_judged(cli, tmp_path, bench_report):
    path = noisy(bench_report, tmp_path, p99=22.56, noise=62)
    r = cli("gate", path, "latency_p99_ms <= 0.05", "--junit", tmp_path / "j.xml", "--output", tmp_path / "out.json",
            "--markdown", tmp_path / "g.md")
    assert r.rc == 1, (r.out, r.err)
    assert ":x: cannot judge" in (tmp_path / "g.md").read_text()            # the PR comment says the same
    line = one_error_line(r)
    assert "latency_p99_ms <= 0.05" in line and "cannot judge" in line and "±62 ms" in line, line
    assert "measure longer or on a quieter runner" in line and "pass" not in line
    assert "cannot judge" in r.out                                          # the table's verdict
    assert "cannot judge: the noise (±62 ms)" in (tmp_path / "j.xml").read_text()
    (g,) = json.loads((tmp_path / "out.json").read_text())["gates"]
    assert g["passed"] is False and g["detail"].startswith("cannot judge: the noise (±62 ms) is wider than the margin")
    assert g["verdict"] == "cannot judge"


def test_a_band_wholly_under_the_threshold_passes(cli, tmp_path, bench_report):
    path = noisy(bench_report, tmp_path, p99=22.56, noise=62)
    r = cli("gate", path, "latency_p99_ms <= 100", "--json")
    assert r.rc == 0, r.err
    (g,) = json.loads(r.out)
    assert g["passed"] and "95% band 0 ms .. 84.6 ms" in g["detail"] and not g["detail"].startswith("cannot judge")


def test_a_band_wholly_over_the_threshold_fails(cli, tmp_path, bench_report):
    path = noisy(bench_report, tmp_path, p99=22.56, noise=2)
    r = cli("gate", path, "latency_p99_ms <= 0.05")
    assert r.rc == 1
    line = one_error_line(r)
    assert "latency_p99_ms <= 0.05 (fail)" in line and "cannot judge" not in line, line
    assert "FAIL" in r.out
    # and one of each: the error line counts both and names each verdict
    path = noisy(bench_report, tmp_path, p99=22.56, noise=62, name="wide.json")
    r = cli("gate", path, "latency_p99_ms <= 0.05", "latency_p99_ms >= 100", "latency_p99_ms <= 100")
    line = one_error_line(r)
    assert r.rc == 1 and "2 of 3 gates failed" in line
    assert "latency_p99_ms <= 0.05 (cannot judge" in line and "latency_p99_ms >= 100 (fail)" in line, line


# ---------------------------------------------------------------- every noise-carrying figure, both directions

def stage(name, *, p50=10.0, ci=None, norm=None, trials=None, throughput=None):
    lat = {"p50_ms": p50, "p90_ms": p50 * 1.2, "p99_ms": p50 * 1.5, "ci95_pct": ci, "trials": 5,
           "throughput_per_s": throughput if throughput is not None else 1000 / p50}
    if ci is not None:  # the runs' own bands, as wide as the trials' spread: p90, p99 and throughput are judged on them
        lat["ci95"] = {k: [max(lat[k] * (1 - ci / 100), 0.0), lat[k] * (1 + ci / 100)]
                       for k in ("p90_ms", "p99_ms", "throughput_per_s")}
    if norm is not None:
        lat.update(normalized=norm, normalized_ci95_pct=ci)
    if trials is not None:
        lat.update(trial_p50_ms=trials, trial_low_ms=trials, low_ms=sorted(trials)[len(trials) // 2])
    return Stage(name=name, output=ArtifactRef(path=f"{name}.onnx", format="onnx", sha256=name),
                 measurements={"latency": lat, "size": {"bytes": 1_000_000}, "memory": {"peak_mb": 50.0}})


def judge(rep: Report, gate: str, baseline: Report | None = None) -> str:
    (r,) = evaluate(rep, parse_gates([gate]), baseline)
    if r.detail.startswith("cannot judge: the noise"):   # the line says so, and it is true: the noise is wider
        m = re.match(r"cannot judge: the noise \(±([\d.e+-]+)[^)]*\) is wider than the margin \(([\d.e+-]+)", r.detail)
        assert m and float(m[1]) >= float(m[2]) and abs(r.margin) == pytest.approx(float(m[2]), rel=0.01), r.detail
        assert "measure longer or on a quieter runner" in r.detail
    return r.verdict


# p50 10 ms ±20% (±2 ms): the band is 8 .. 12 ms; p99 15 ±3 ms; throughput 100/s ±20/s; normalised 0.5 ±0.1
NOISY = Report(command="t", stages=[stage("m", p50=10.0, ci=20.0, norm=0.5)])


@pytest.mark.parametrize("gate, expected", [
    ("latency_p50_ms <= 13", "pass"), ("latency_p50_ms <= 11", "cannot judge"), ("latency_p50_ms <= 9", "cannot judge"),
    ("latency_p50_ms <= 7", "fail"), ("latency_p50_ms < 12.5", "pass"),
    ("latency_p50_ms >= 7", "pass"), ("latency_p50_ms >= 9", "cannot judge"), ("latency_p50_ms >= 11", "cannot judge"),
    ("latency_p50_ms > 13", "fail"),
    ("latency_p90_ms <= 15", "pass"), ("latency_p90_ms <= 12.5", "cannot judge"), ("latency_p90_ms <= 9", "fail"),
    ("latency_p99_ms <= 19", "pass"), ("latency_p99_ms <= 16", "cannot judge"), ("latency_p99_ms >= 16", "cannot judge"),
    ("latency_p99_ms >= 11", "pass"), ("latency_p99_ms >= 19", "fail"),
    ("normalized_latency <= 0.7", "pass"), ("normalized_latency <= 0.55", "cannot judge"),
    ("normalized_latency >= 0.45", "cannot judge"), ("normalized_latency >= 0.7", "fail"),
    ("throughput >= 70", "pass"), ("throughput >= 110", "cannot judge"), ("throughput >= 90", "cannot judge"),
    ("throughput >= 130", "fail"), ("throughput <= 130", "pass"), ("throughput <= 90", "cannot judge"),
    ("throughput <= 70", "fail"),
])
def test_every_noisy_absolute_figure_in_both_directions(gate, expected):
    assert judge(NOISY, gate) == expected


def test_the_same_gates_on_a_quiet_figure_are_plain_pass_or_fail():
    quiet = Report(command="t", stages=[stage("m", p50=10.0, ci=0.5, norm=0.5)])
    assert judge(quiet, "latency_p50_ms <= 11") == "pass" and judge(quiet, "latency_p50_ms <= 9") == "fail"
    assert judge(quiet, "throughput >= 90") == "pass" and judge(quiet, "throughput >= 110") == "fail"
    # no band at all (one trial of an older report, no runs' band): not judged as exact, whatever the margin
    one = Report(command="t", stages=[stage("m", p50=10.0, ci=None)])
    for gate in ("latency_p50_ms <= 10", "latency_p50_ms < 10", "latency_p99_ms <= 1000", "throughput >= 1"):
        (r,) = evaluate(one, parse_gates([gate]))
        assert r.verdict == "cannot judge" and r.detail.startswith(f"cannot judge: {NO_BAND}"), r.detail
    # figures without noise: memory and size are plain comparisons
    assert judge(NOISY, "memory_mb <= 50") == "pass" and judge(NOISY, "memory_mb < 50") == "fail"
    assert judge(NOISY, "size_mb <= 0.9") == "fail"


def test_speedup_uses_both_stages_noise():
    # 20 ms -> 10 ms, each ±20%: speedup 2.0 with noise 2 * hypot(0.2, 0.2) = ±0.57
    rep = Report(command="t", stages=[stage("input", p50=20.0, ci=20.0), stage("fast", p50=10.0, ci=20.0)])
    assert judge(rep, "speedup >= 1.3") == "pass"
    assert judge(rep, "speedup >= 1.8") == "cannot judge" and judge(rep, "speedup >= 2.3") == "cannot judge"
    assert judge(rep, "speedup >= 2.7") == "fail"
    assert judge(rep, "speedup <= 2.7") == "pass" and judge(rep, "speedup <= 1.3") == "fail"


BASE = [1.00, 1.03, 0.98, 1.01, 0.99, 1.02, 1.00, 0.97]


@pytest.mark.parametrize("scale, noisy_trials, expected", [
    (1.02, False, "pass"),           # unchanged, quiet: the whole interval is under 10%
    (1.20, False, "fail"),           # +20%, quiet: the whole interval is over 10%
    (1.10, False, "cannot judge"),   # right at the threshold: the interval holds it
    (1.30, True, "cannot judge"),    # +30% but so noisy the interval reaches below 0: it used to pass (no longer)
    (1.00, True, "cannot judge"),    # unchanged but so noisy the interval reaches past 10%
])
def test_regression_gate_judges_the_whole_interval(scale, noisy_trials, expected):
    trials = [0.6, 1.5, 0.8, 1.4, 1.0, 1.7, 0.7, 1.3] if noisy_trials else BASE
    base = Report(command="t", stages=[stage("m", trials=trials)])
    cur = Report(command="t", stages=[stage("m", trials=[t * scale for t in reversed(trials)])])
    assert judge(cur, "latency_regression_pct <= 10", base) == expected
    (r,) = evaluate(cur, parse_gates(["latency_regression_pct <= 10"]), base)
    assert "95% CI" in r.detail and r.value == pytest.approx(100 * (scale - 1), abs=3 if noisy_trials else 1)
    # the other direction ("it got at least 10% faster") on the mirror image
    assert judge(base, "latency_regression_pct >= -10", cur) == {"pass": "pass", "fail": "fail"}.get(
        expected, "cannot judge")


def test_a_non_finite_noise_still_fails_not_cannot_judge():
    rep = Report(command="t", stages=[stage("m", p50=10.0, ci=20.0)])
    rep.stages[0].measurements["latency"]["ci95_pct"] = math.inf
    (r,) = evaluate(rep, parse_gates(["latency_p50_ms <= 100"]))
    assert not r.passed and r.verdict == "fail" and "noise is not a finite figure" in r.detail


# ---------------------------------------------------------------- red team: hand-edited bands, bands from bench

def edited(bench: dict, tmp_path, edit, name: str = "edited.json"):
    d = json.loads(json.dumps(bench))
    edit(d["stages"][-1]["measurements"]["latency"])
    path = tmp_path / name
    path.write_text(json.dumps(d))   # json writes NaN as its JavaScript literal, as other tools do
    return path


def bad_input(r) -> str:
    """Exit 2 with exactly one line on stderr (no table, no traceback)."""
    assert r.rc == 2, (r.rc, r.out, r.err)
    assert [line for line in r.err.splitlines() if line.strip()] == [one_error_line(r)], r.err
    return one_error_line(r)


def test_bench_gives_every_percentile_a_distribution_free_band(bench_report):
    from optkit.measure.latency import binomial_ranks

    lat = bench_report["stages"][-1]["measurements"]["latency"]
    assert lat["runs"] == 100 and "ci95_pct" not in lat
    for key in ("p50_ms", "p90_ms", "p99_ms", "throughput_per_s"):
        lo, hi = lat["ci95"][key]
        assert lo is not None and lo <= lat[key] and (hi is None or lat[key] <= hi), (key, lo, hi)
    # 100 runs bound the median and the 90th percentile on both sides, the 99th from below only (368 runs would)
    assert lat["ci95"]["p50_ms"][1] is not None and lat["ci95"]["p90_ms"][1] is not None
    assert lat["ci95"]["p99_ms"][1] is None
    # the ranks are the binomial(n, p) 2.5% / 97.5% quantiles (the 97.5% one plus one), computed here exactly
    for n, q in ((20, 0.5), (20, 0.9), (100, 0.9), (100, 0.99), (368, 0.99), (5, 0.5)):
        cdf = [sum(math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(k + 1)) for k in range(n + 1)]
        lo = next(k for k in range(n + 1) if cdf[k] >= 0.025)
        hi = next(k for k in range(n + 1) if cdf[k] >= 0.975)
        assert binomial_ranks(n, q) == (lo, min(hi + 1, n + 1)), (n, q)


def test_gates_on_a_bench_report_are_judged_on_its_band(cli, tmp_path, bench_report):
    lat = bench_report["stages"][-1]["measurements"]["latency"]
    p50, (lo, hi) = lat["p50_ms"], lat["ci95"]["p50_ms"]
    path = tmp_path / "R.json"
    path.write_text(json.dumps(bench_report))
    r = cli("gate", path, f"latency_p50_ms <= {hi * 1.01}", f"latency_p50_ms >= {lo * 0.99}", "throughput >= 1", "--json")
    assert r.rc == 0, r.err
    assert all(g["verdict"] == "pass" and "95% band" in g["detail"] for g in json.loads(r.out))
    r = cli("gate", path, f"latency_p50_ms <= {lo * 0.99}")
    assert r.rc == 1 and "(fail)" in one_error_line(r)
    if hi > p50:   # a margin smaller than the band (the red team's 0.25%): no longer an exact pass
        r = cli("gate", path, f"latency_p50_ms <= {(p50 + hi) / 2}", "--json")
        assert r.rc == 1
        (g,) = json.loads(r.out)
        assert g["verdict"] == "cannot judge" and g["detail"].startswith("cannot judge: the noise"), g
    # 20 runs cannot bound the 99th percentile from above: no threshold lets a `<=` gate pass on them
    r = cli("gate", path, "latency_p99_ms <= 1000")
    line = one_error_line(r)
    assert r.rc == 1 and "cannot judge: the 95% band has no upper end" in line and "at least 368 runs" in line, line
    r = cli("gate", path, "latency_p99_ms >= 1000")   # nor say it is not over any threshold
    line = one_error_line(r)
    assert r.rc == 1 and "(cannot judge: the 95% band has no upper end" in line, line
    r = cli("gate", path, f"latency_p99_ms <= {lat['ci95']['p99_ms'][0] * 0.99}")
    assert r.rc == 1 and "(fail)" in one_error_line(r)


@pytest.mark.parametrize("edit", [
    lambda lat: (lat.pop("ci95"), lat.update(p99_ms=0.0994, ci95_pct=None, trials=5)),   # the band edited to null
    lambda lat: (lat.pop("ci95"), lat.update(p99_ms=0.0994)),                            # deleted: an older report
], ids=["band-null", "band-deleted"])
def test_a_noisy_figure_without_a_band_cannot_be_judged(cli, tmp_path, bench_report, edit):
    path = edited(bench_report, tmp_path, edit)
    r = cli("gate", path, "latency_p99_ms <= 0.11", "latency_p50_ms <= 1000", "throughput >= 1", "--json")
    assert r.rc == 1, r.err
    rows = json.loads(r.out)
    assert [g["verdict"] for g in rows] == ["cannot judge"] * 3 and not any(g["passed"] for g in rows)
    assert all(g["detail"].startswith(f"cannot judge: {NO_BAND}") for g in rows), rows
    # the red team's 0.25% margin on the median is no longer an exact pass
    p50 = bench_report["stages"][-1]["measurements"]["latency"]["p50_ms"]
    r = cli("gate", path, f"latency_p50_ms <= {p50 * 1.0025}")
    line = one_error_line(r)
    assert r.rc == 1 and f"(cannot judge: {NO_BAND})" in line, line


HOSTILE = {
    "negative-band": (lambda lat: lat.update(p99_ms=0.0994, ci95_pct=-28.5, trials=5), "latency_p99_ms <= 0.08",
                      "figure latency.ci95_pct is -28.5, not a 95% band"),
    "negative-p99": (lambda lat: lat.update(p99_ms=-1), "latency_p99_ms <= 0.08", "figure latency.p99_ms is -1"),
    "negative-p50": (lambda lat: lat.update(p50_ms=-0.5), "latency_p50_ms <= 0.08", "figure latency.p50_ms is -0.5"),
    "negative-throughput": (lambda lat: lat.update(throughput_per_s=-3.0), "throughput <= 10",
                            "figure latency.throughput_per_s is -3.0"),
    "nan-band": (lambda lat: lat.update(ci95_pct=float("nan"), trials=5), "latency_p50_ms <= 1",
                 "figure latency.ci95_pct is nan, not a 95% band"),
    "string-band": (lambda lat: lat.update(ci95_pct="wide", trials=5), "latency_p50_ms <= 1",
                    "latency.ci95_pct is 'wide', not a number"),   # Report.load refuses it: "stages.0.measurements..."
    "negative-run-band": (lambda lat: lat["ci95"].update(p99_ms=[-1.0, 0.2]), "latency_p99_ms <= 0.5",
                          "figure latency.ci95.p99_ms is [-1.0, 0.2], not a 95% band"),
    "band-without-the-figure": (lambda lat: lat.update(p99_ms=0.0994) or lat["ci95"].update(p99_ms=[0.01, 0.02]),
                                "latency_p99_ms <= 0.08", "figure latency.ci95.p99_ms is [0.01, 0.02]"),
    "nan-run-band": (lambda lat: lat["ci95"].update(p50_ms=[float("nan"), 1.0]), "latency_p50_ms <= 1",
                     "figure latency.ci95.p50_ms is [nan, 1.0]"),
    "band-of-the-wrong-type": (lambda lat: lat.update(ci95="narrow"), "latency_p50_ms <= 1",
                               "figure latency.ci95 is 'narrow', not an object of 95% bands"),
    "negative-normalised-band": (lambda lat: lat.update(normalized=0.5, normalized_ci95_pct=-3.0),
                                 "normalized_latency <= 1", "figure latency.normalized_ci95_pct is -3.0"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_band_or_latency_no_measurement_gives_is_bad_input(cli, tmp_path, bench_report, name):
    edit, gate, words = HOSTILE[name]
    path = edited(bench_report, tmp_path, edit)
    r = cli("gate", path, gate, "--junit", tmp_path / "j.xml")
    line = bad_input(r)
    assert ("stage 'model'" in line or "stages.0." in line) and words in line, line
    assert "pass" not in line and not (tmp_path / "j.xml").exists()


def test_a_paired_interval_that_does_not_hold_its_ratio_is_bad_input():
    from optkit.core.errors import UsageError

    rep = Report(command="t", stages=[stage("input", p50=20.0, ci=2.0), stage("fast", p50=10.0, ci=2.0)])
    rep.stages[1].measurements["latency_change"] = {"ratio": 1.0, "ratio_ci95": [0.1, 0.2], "trials": 5}
    with pytest.raises(UsageError, match=r"stage 'fast': figure latency_change.ratio_ci95 is \[0.1, 0.2\]"):
        evaluate(rep, parse_gates(["speedup >= 4"]))
    rep.stages[1].measurements["latency_change"] = {"ratio": 0.5, "ratio_ci95": [0.45, 0.55], "trials": 5}
    (r,) = evaluate(rep, parse_gates(["speedup >= 1.5"]))
    assert r.verdict == "pass" and r.value == pytest.approx(2.0)


def test_a_run_report_with_trials_is_judged_as_before():
    """optkit run's figures (latency_trials: the trials' ci95_pct) keep their p50 verdicts: the trials' band
    comes first, also in a report that carries the runs' band as well. The p99 is judged on its own band (issue
    29): the runs' band with no upper end cannot be judged under a threshold, whatever the trials' p50 spread."""
    for extra, p99 in (({}, ("pass", "fail")),
                       ({"ci95": {"p50_ms": [9.99, 10.01], "p99_ms": [14.0, None]}}, ("cannot judge", "cannot judge"))):
        rep = Report(command="t", stages=[stage("m", p50=10.0, ci=20.0, norm=0.5)])
        rep.stages[0].measurements["latency"].update(extra)
        assert judge(rep, "latency_p50_ms <= 11") == "cannot judge" and judge(rep, "latency_p50_ms <= 13") == "pass"
        assert (judge(rep, "latency_p99_ms <= 19"), judge(rep, "latency_p99_ms >= 19")) == p99
    # one trial of a new run: no trials' band, the runs' band judges it
    rep = Report(command="t", stages=[stage("m", p50=10.0, ci=None)])
    rep.stages[0].measurements["latency"].update(runs=100, ci95={"p50_ms": [9.5, 10.5], "p99_ms": [14.0, None]})
    assert judge(rep, "latency_p50_ms <= 11") == "pass" and judge(rep, "latency_p50_ms <= 10.2") == "cannot judge"
    assert judge(rep, "latency_p99_ms >= 13") == "pass" and judge(rep, "latency_p99_ms <= 1000") == "cannot judge"
