"""split.onnx and capacity.plan are recipe stages like every pass: their options are data (validated before any
stage, exit 2 naming the recipe line), their commands are their one-stage recipes (`--print-recipe` prints one
that `optkit run` runs to the same files), and a recipe may have no model when its stages need none."""
from __future__ import annotations

import json

import pytest
import yaml
from test_split_probe import _stft_like

from conftest import SAMPLES, no_result_files, one_error_line

CNN = SAMPLES / "torch_cnn.onnx"


@pytest.fixture(scope="module")
def best(tmp_path_factory):
    """A best.json as `optkit tune -o` writes it (the contract's own document)."""
    from optkit.contracts import base, best

    folder = tmp_path_factory.mktemp("best")
    doc = best.document(str(CNN), "a" * 64, {"objective": ["throughput"], "best": {
        "setting": {"threads": 1, "batch": 1, "concurrency": 1, "sessions": "shared", "provider": "cpu"},
        "label": "t1", "figures": {"throughput_per_s": 120.0, "p99_ms": 4.0}}})
    (folder / "best.json").write_text(base.text(doc))
    return folder / "best.json"


def _recipe(tmp_path, rec: dict):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"version": 1, **rec}, sort_keys=False))
    return path


@pytest.mark.parametrize("rec, words", [
    ({"model": {"path": str(CNN)}, "stages": [{"pass": "split.onnx", "config": {"provider": "tpu"}}]},
     "stages[0].config.provider: unknown --provider 'tpu'"),
    ({"model": {"path": str(CNN)}, "stages": [{"pass": "split.onnx", "config": {"dims": ["batch"]}}]},
     "stages[0].config.dims: bad --dim 'batch'"),
    ({"model": {"path": str(CNN)}, "stages": [{"pass": "split.onnx", "config": {"data": "nope.npz"}}]},
     "stages[0].config.data: nope.npz does not exist (paths are relative to the recipe file)"),
    ({"model": {"path": str(CNN)}, "stages": [{"pass": "capacity.plan", "config": {"output": "c.json"}}]},
     "stages[0].config: give one of --peak RATE or --history FILE"),
    ({"stages": [{"pass": "capacity.plan", "config": {"output": "c.json", "peak": 5}}]},
     "stages[0].pass: capacity.plan needs a model, and the recipe has none"),
    ({"stages": [{"pass": "split.onnx"}]}, "split.onnx needs a model"),
    ({"stages": [{"pass": "capacity.plan", "config": {"output": "c.json", "peak": 5, "figures": "BEST"}}],
      "gates": ["size_mb <= 1"]}, "model: missing; data, gates, a baseline and package: entries need a model"),
])
def test_a_stage_kinds_bad_config_is_exit_2_naming_the_line_before_any_stage(cli, tmp_path, best, rec, words):
    rec = json.loads(json.dumps(rec).replace("BEST", str(best)))
    path = _recipe(tmp_path, rec)
    for args in (("--dry-run",), ("--workspace", tmp_path / "runs")):
        r = cli("run", path, *args)
        assert r.rc == 2, r.err
        line = one_error_line(r)
        assert str(path) in line and words in line, line
    assert no_result_files(tmp_path) == ["r.yaml"]


def test_split_prints_its_recipe_and_the_recipe_splits_the_same(cli, tmp_path):
    model = _stft_like(tmp_path / "stft.onnx")
    r = cli("split", model, "-o", tmp_path / "parts", "--dim", "sequence=1024", "--print-recipe")
    assert r.rc == 0, r.err
    rec = yaml.safe_load(r.out)
    assert rec["stages"] == [{"pass": "split.onnx", "config": {"dims": ["sequence=1024"]}}]
    assert not (tmp_path / "parts").exists()
    path = tmp_path / "r.yaml"
    path.write_text(r.out)
    run = cli("run", path, "--workspace", tmp_path / "runs", "--json")
    assert run.rc == 0, run.err
    stage = json.loads(run.out)["stages"][-1]
    cmd = cli("split", model, "-o", tmp_path / "parts", "--dim", "sequence=1024", "--json")
    assert cmd.rc == 0, cmd.err
    doc = json.loads(cmd.out)
    assert stage["measurements"]["split"] == doc and "size" not in stage["measurements"]  # the model passes through
    parts = tmp_path / "runs" / "r" / "latest" / "01-split" / "parts"
    assert {p.name: p.read_bytes() for p in parts.iterdir()} == \
        {p.name: p.read_bytes() for p in (tmp_path / "parts").iterdir()}


def test_capacity_prints_a_recipe_without_a_model_that_writes_the_same_file(cli, tmp_path, best):
    args = ["capacity", best, "--peak", "300", "--headroom", "0.3"]
    r = cli(*args, "-o", tmp_path / "c.json", "--print-recipe")
    assert r.rc == 0, r.err
    rec = yaml.safe_load(r.out)
    assert "model" not in rec and rec["stages"][0]["pass"] == "capacity.plan"
    assert rec["stages"][0]["config"]["figures"] == str(best) and not (tmp_path / "c.json").exists()
    path = tmp_path / "r.yaml"
    path.write_text(r.out)
    run = cli("run", path, "--workspace", tmp_path / "runs", "--json")
    assert run.rc == 0, run.err
    ran = (tmp_path / "c.json").read_bytes()
    cmd = cli(*args, "-o", tmp_path / "c.json", "--json")
    assert cmd.rc == 0, cmd.err
    assert (tmp_path / "c.json").read_bytes() == ran == cmd.out.encode()
    stage = json.loads(run.out)["stages"][0]
    assert stage["output"]["format"] == "capacity" and stage["measurements"]["capacity"] == json.loads(ran)


def test_gates_judge_the_last_stage_measured_not_a_capacity_stage(cli, tmp_path):
    path = _recipe(tmp_path, {"model": {"path": str(CNN)}, "measure": {"latency": False},
                              "stages": [{"pass": "quantize.onnx-fp16", "name": "fp16"}],
                              "capacity": {"peak": 5, "output": "c.json", "figures": None,
                                           "cpu_cores": 1.0},
                              "gates": ["size_ratio <= 0.6"]})
    r = cli("run", path, "--workspace", tmp_path / "runs", "--json")
    # the run's own figures hold no throughput without latency: capacity names what to give
    assert r.rc == 2 and "no stage has a throughput" in one_error_line(r), r.err
    rec = yaml.safe_load(path.read_text())
    rec["measure"] = {"latency": "paired", "runs": 20}
    path.write_text(yaml.safe_dump(rec))
    r = cli("run", path, "--workspace", tmp_path / "runs", "--json")
    assert r.rc == 0, r.err
    rep = json.loads(r.out)
    assert [s["name"] for s in rep["stages"]] == ["input", "fp16", "capacity"]
    assert rep["gates"][0]["stage"] == "fp16" and rep["gates"][0]["passed"]
    assert rep["capacity"]["output"] == str(tmp_path / "c.json") and (tmp_path / "c.json").is_file()


def test_stages_after_a_preprocess_stage_are_measured_on_their_own_inputs(cli, tmp_path):
    """preprocess.onnx changes the model's inputs (uint8 images): the stages after it get neither the recipe's data
    nor a comparison with the recipe's model (float [N,1,8,8]); they were compared with it, and failed."""
    path = _recipe(tmp_path, {"model": {"path": str(CNN)}, "measure": {"latency": "paired", "runs": 20},
                              "stages": [{"pass": "preprocess.onnx", "name": "u8",
                                          "config": {"preprocess": {"color": "gray", "resize": 8, "center_crop": 8}}},
                                         {"pass": "simplify.onnx", "name": "simple"}]})
    r = cli("run", path, "--workspace", tmp_path / "runs", "--json")
    assert r.rc == 0, r.err
    stages = {s["name"]: s["measurements"] for s in json.loads(r.out)["stages"]}
    assert "fidelity" not in stages["u8"] and "size" in stages["simple"]
    assert not {"fidelity", "latency_change"} & set(stages["simple"])
