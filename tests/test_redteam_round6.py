"""Red team, round 6 (isolated measurements, --budget-confidence, OpenVINO as a runtime and a package backend, the
residual-Add rewrite): each defect class found, tried on every entry point it applies to.

- a right-or-wrong metric's (top-1) drop bound was 0.0000 whenever no sample changed its answer, on any number of
  eval samples (2 samples: "one-sided 95% upper bound 0.0000"), and on 1 sample there was no bound at all while
  the budget still said it judged one: both met the budget;
- optkit.run_pass(..., metric="top1", max_accuracy_drop=D) was exit 2 "max_accuracy_drop needs a metric": the
  API's metric never reached the pass's own metric, as the command's --metric does.
"""
from __future__ import annotations

import numpy as np
import pytest
import yaml

import optkit
from optkit.core.errors import OptkitError

from conftest import SAMPLES, one_error_line, run_cli

CNN = SAMPLES / "torch_cnn.onnx"
CALIB = SAMPLES / "digits_calib_nchw.npz"
EVAL = SAMPLES / "digits_eval_nchw.npz"


# ------------------------------------------------------------------ an accuracy budget on a few eval samples

@pytest.fixture(scope="module")
def two_samples(tmp_path_factory):
    d = np.load(EVAL)
    path = tmp_path_factory.mktemp("tiny") / "two.npz"
    np.savez(path, input=d["input"][:2], labels=d["labels"][:2])
    return path


def _quantize_recipe(folder, evald, confidence=None):
    config = {"metric": "top1", "max_accuracy_drop": 0.02, "latency_search": False, "allow_slower": True}
    if confidence is not None:
        config["budget_confidence"] = confidence
    rec = {"version": 1, "name": "tiny", "model": {"path": str(CNN)},
           "data": {"calibration": {"path": str(CALIB)}, "eval": {"path": str(evald), "metric": "top1"}},
           "stages": [{"pass": "quantize.onnx-static", "config": config}], "measure": {"latency": False}}
    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump(rec, sort_keys=False))
    return path


@pytest.mark.parametrize("door", ["command", "recipe", "run_pass"])
def test_no_changed_answer_on_two_samples_is_no_95pct_bound_of_zero(tmp_path, two_samples, door):
    """No candidate changes an answer on 2 samples: the drop's one-sided 95% bound is not 0 (it was, and met
    a 0.02 budget); at --budget-confidence 0.5 the measured drop is judged and met."""
    out = tmp_path / "q.onnx"
    if door == "command":
        base = ("quantize", CNN, "--calibration-data", CALIB, "--eval-data", two_samples, "--metric", "top1",
                "--max-accuracy-drop", "0.02", "--no-latency-search", "--allow-slower", "-o", out)
        r = run_cli(*base)
        assert r.rc == 3, r.err
        assert "one-sided 95% upper bound 0.5" in one_error_line(r) and not out.exists()
        assert run_cli(*base, "--budget-confidence", "0.5").rc == 0 and out.exists()
    elif door == "recipe":
        r = run_cli("run", _quantize_recipe(tmp_path, two_samples), "--workspace", tmp_path / "runs")
        assert r.rc == 3, r.err
        assert "one-sided 95% upper bound 0.5" in one_error_line(r)
        r = run_cli("run", _quantize_recipe(tmp_path, two_samples, 0.5), "--workspace", tmp_path / "runs")
        assert r.rc == 0, r.err
    else:
        kw = dict(calibration=CALIB, eval=two_samples, metric="top1", max_accuracy_drop=0.02, latency_search=False,
                  allow_slower=True)
        with pytest.raises(OptkitError) as e:
            optkit.run_pass("quantize.onnx-static", CNN, out, **kw)
        assert e.value.exit_code == 3 and "one-sided 95% upper bound 0.5" in str(e.value) and not out.exists()
        rep = optkit.run_pass("quantize.onnx-static", CNN, out, **kw, budget_confidence=0.5)
        chosen = [c for c in rep.stages[-1].measurements["quantize"]["candidates"] if c.get("chosen")]
        assert out.exists() and chosen and chosen[0]["accuracy_drop"] == 0.0


def test_one_eval_sample_gets_a_bound_too():
    """One sample: a bound (it had none, and the budget judged the point while saying it judged the bound)."""
    from optkit.passes.quantize.budget import Budget
    from optkit.passes.quantize.config import QuantizeConfig

    b = Budget.of(QuantizeConfig(mode="static", metric="top1", max_accuracy_drop=0.02))
    one = b.drop_bound(None, None, np.array([-1.0]), np.array([-1.0]), False)
    assert one is not None and one > 0.5
    # many samples, one disagreement each way: the bound is the ordinary one, unchanged by the floor
    a, c = -np.ones(400), -np.ones(400)
    c[0], a[1] = 0.0, 0.0
    d = a - c
    expected = d.mean() + 1.6448536 * d.std(ddof=1) / np.sqrt(400)
    assert b.drop_bound(None, None, a, c, False) == pytest.approx(expected, rel=1e-6)
    # a continuous metric (mae, lower is better) with identical outputs keeps its bound of 0
    mae = Budget.of(QuantizeConfig(mode="static", metric="mae", max_accuracy_drop=0.02))
    assert mae.drop_bound(None, None, np.full(5, 0.3), np.full(5, 0.3), True) == pytest.approx(0.0)
