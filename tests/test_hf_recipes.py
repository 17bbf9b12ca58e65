"""The Hugging Face recipes (recipes/hf-sentence-embeddings.yaml, recipes/hf-text-classifier.yaml) run end to end:
convert -> dynamic INT8 with an accuracy budget -> gates (-> a Triton package with its tokenizer). A recipe cannot
build the folder it reads, and its model is a Hub id this machine does not hold: the test builds a tiny seeded
folder and writes a copy of the recipe beside it with model.path set to that folder, the data and package paths
made absolute, a smaller sample of the data where it is large (max_samples, with the
drop gate widened to what that sample can judge), allow_slower (a tiny model's INT8
speed is noise, and tests hold no timing threshold) and no stage timing (`measure.latency: false`: the test is
about the chain, the budget and the gates, and each recipe runs in well under a minute); every other key (stages,
metric, budget, gates) is the recipe's own."""
from __future__ import annotations

import json

import pytest
import yaml
from _hf_models import build

from conftest import ROOT

pytest.importorskip("transformers")

RECIPES = ROOT / "recipes"


def _copy(name: str, folder, tmp_path, max_samples: int | None = None):
    """The recipe as the test runs it (see the module's text), written beside the folder."""
    rec = yaml.safe_load((RECIPES / name).read_text(encoding="utf-8"))
    rec["model"]["path"] = folder.name
    for item in rec["data"].values():
        item["path"] = str((RECIPES / item["path"]).resolve())
        if max_samples:
            item["max_samples"] = max_samples
    for stage in rec["stages"]:
        if stage["pass"].startswith("quantize."):
            stage.setdefault("config", {})["allow_slower"] = True
    rec["measure"]["latency"] = False
    if max_samples:  # a drop gate of half a point cannot be judged on 60 pairs (bootstrap noise about +-0.0066)
        rec["gates"] = [g.replace("accuracy_drop@int8 <= 0.005", "accuracy_drop@int8 <= 0.05") for g in rec["gates"]]
        # nor bounded at 95% by quantize's budget (a 0.0012 drop's bound was 0.0073): the measured drop is judged
        for stage in rec["stages"]:
            if stage["pass"].startswith("quantize.") and "max_accuracy_drop" in stage.get("config", {}):
                stage["config"]["budget_confidence"] = 0.5
    for entry in rec.get("package", []):
        entry["output"] = str(tmp_path / "repo")
        entry["data"] = str((RECIPES / entry["data"]).resolve())
    path = folder.parent / name
    path.write_text(yaml.safe_dump(rec, sort_keys=False), encoding="utf-8")
    return path, rec


def _run(cli, path, tmp_path):
    r = cli("run", path, "--workspace", tmp_path / "runs", "--json")
    assert r.rc == 0, r.err
    rep = json.loads(r.out)
    assert [s["name"] for s in rep["stages"]] == ["input", "onnx", "int8"]
    assert rep["gates"] and all(g["passed"] for g in rep["gates"]), rep["gates"]
    return rep


def test_sentence_embeddings_recipe_runs(cli, tmp_path):
    folder = build("sentence-embeddings", tmp_path / "encoder")
    path, rec = _copy("hf-sentence-embeddings.yaml", folder, tmp_path, max_samples=60)
    assert rec["data"]["eval"]["metric"] == "spearman"
    rep = _run(cli, path, tmp_path)
    acc = {s["name"]: s["measurements"]["accuracy"] for s in rep["stages"]}
    assert acc["int8"]["metric"] == "spearman" and acc["int8"]["samples"] == 120   # 60 pairs, two sentences each
    assert acc["onnx"]["spearman"] - acc["int8"]["spearman"] <= 0.005 + 1e-9


def test_text_classifier_recipe_runs_and_packages_the_tokenizer(cli, tmp_path):
    from optkit.core import preprocessor

    folder = build("text-classification", tmp_path / "classifier", labels=("NEGATIVE", "POSITIVE"))
    path, _ = _copy("hf-text-classifier.yaml", folder, tmp_path)
    rep = _run(cli, path, tmp_path)
    acc = {s["name"]: s["measurements"]["accuracy"] for s in rep["stages"]}
    assert acc["input"]["metric"] == "accuracy" and acc["input"]["samples"] == 40
    assert acc["input"]["accuracy"] == acc["onnx"]["accuracy"]   # the ONNX file equals transformers
    vdir = tmp_path / "repo" / "sst2" / "1"
    assert preprocessor.resolve(vdir / "model.onnx") == vdir / "tokenizer"
    assert json.loads((vdir / "optkit-package.json").read_text())["preprocessor"]["source"]["path"] == str(folder)
