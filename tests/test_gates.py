"""Gates: parsing, absolute / first-stage / baseline gates, noise-aware latency, `optkit gate` exit codes."""
from __future__ import annotations

import json

import pytest

from conftest import one_error_line
from optkit.core.errors import UsageError
from optkit.gates import check_gates_plan, evaluate, parse_gate, parse_gates
from optkit.report.schema import ArtifactRef, Report, Stage


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


def test_regression_within_noise_is_not_a_failure():
    base = report(stage("m", p50=1.0, ci=10, norm=1.0, norm_ci=10))
    cur = report(stage("m", p50=1.12, ci=10, norm=1.12, norm_ci=10))   # +12% but noise is ±~16%
    (r,) = evaluate(cur, parse_gates(["latency_regression_pct <= 10"]), base)
    assert r.passed and r.value == pytest.approx(12.0) and "noise" in r.detail
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
