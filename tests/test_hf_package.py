"""A package carries its model's tokenizer (package/preprocessor.py): Triton's version folder and the MLflow model
get `tokenizer/` beside model.onnx, the version's model.onnx names it (optkit finds it without flags), the copy is
checked after writing, and the lineage names its sha256 and the Hugging Face folder's files; a real tritonserver
serves the version and answers, on text tokenized by the packaged tokenizer, as onnxruntime does. A missing or
changed tokenizer folder is exit 2 with nothing written, by the command, a recipe's package: entry and the Python
API alike."""
from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
from _hf_models import build
from _triton import infer, log_tail, missing, proof_repository, tritonserver

from conftest import ROOT, one_error_line

pytest.importorskip("transformers")

DATA = ROOT / "tests" / "data" / "sentiment.csv"
LABELS = ("NEGATIVE", "POSITIVE")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """The tiny seeded classifier folder and its ONNX, converted once through the Python API (its tokenizer folder
    beside it, as `optkit convert` writes it)."""
    import optkit

    root = tmp_path_factory.mktemp("hfpkg")
    folder = build("text-classification", root / "clf", labels=LABELS)
    out = root / "m.onnx"
    optkit.run_pass("convert.hf", folder, out, measure={"latency": False})
    return folder, out


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def triton_repo(classifier, tmp_path_factory):
    from optkit.package.build import package

    _, model = classifier
    repo = tmp_path_factory.mktemp("tri") / "repo"
    package(str(model), to="triton", output=str(repo), name="clf", data=str(DATA))
    return repo


def test_triton_version_carries_the_tokenizer_and_the_lineage_names_the_source(classifier, triton_repo):
    from transformers import AutoTokenizer

    from optkit.core import preprocessor

    folder, model = classifier
    vdir = triton_repo / "clf" / "1"
    tok = vdir / "tokenizer"
    assert {"tokenizer.json", "tokenizer_config.json", "config.json"} <= {f.name for f in tok.iterdir()}
    assert not any(f.name.endswith(".safetensors") for f in tok.iterdir())
    assert preprocessor.resolve(vdir / "model.onnx") == tok   # the version's model finds it, no flag
    lin = json.loads((vdir / "optkit-package.json").read_text())
    pre = lin["preprocessor"]
    assert pre["path"] == "tokenizer" and pre["kind"] == "tokenizer"
    own = model.with_suffix(".preprocessor")
    assert pre["sha256"] == preprocessor.folder_sha256(tok) == preprocessor.folder_sha256(own)
    assert pre["source"]["path"] == str(folder.absolute())
    assert pre["source"]["files"]["model.safetensors"] == _sha(folder / "model.safetensors")
    assert pre["source"]["files"]["config.json"] == _sha(folder / "config.json")
    assert {f"tokenizer/{n}" for n in ("tokenizer.json", "config.json")} <= set(lin["files"])  # checked like the rest
    assert AutoTokenizer.from_pretrained(tok)("Great value.")["input_ids"]


def test_the_export_carries_no_stack_traces(classifier):
    """The dynamo exporter's per-node records (stack traces with this checkout's paths) are not written."""
    import onnx

    proto = onnx.load(str(classifier[1]))
    assert not any(n.metadata_props for n in proto.graph.node)
    assert str(ROOT).encode() not in classifier[1].read_bytes()


def test_tritonserver_serves_the_version_on_text_its_tokenizer_reads(classifier, triton_repo, tmp_path):
    if missing():
        pytest.skip(f"SKIPPED LOUDLY: {missing()}")
    import onnxruntime as ort
    from transformers import AutoTokenizer

    vdir = triton_repo / "clf" / "1"
    tok = AutoTokenizer.from_pretrained(vdir / "tokenizer")
    session = ort.InferenceSession(str(classifier[1]))
    proof = proof_repository(triton_repo, tmp_path / "proof")
    with tritonserver(proof, tmp_path / "work") as (url, proc):
        assert url, log_tail(tmp_path / "work")
        for text in ("The film was a delight from the first scene to the last.", "It broke."):  # batch 1: untuned
            feeds = {k: v.astype(np.int64) for k, v in tok([text], return_tensors="np").items()}
            dtype, shape, data = infer(url, "clf", feeds)["logits"]
            assert (dtype, shape) == ("FP32", [1, 2])
            np.testing.assert_allclose(np.array(data, np.float32).reshape(shape), session.run(None, feeds)[0],
                                       rtol=1e-5, atol=1e-5)


def test_mlflow_model_carries_the_tokenizer(cli, classifier, tmp_path):
    pytest.importorskip("mlflow")
    import yaml

    from optkit.core import preprocessor

    r = cli("package", classifier[1], "--to", "mlflow", "-o", tmp_path / "ml", "--name", "clf")
    assert r.rc == 0, r.err
    vdir = tmp_path / "ml" / "clf" / "1"
    assert preprocessor.resolve(vdir / "model.onnx") == vdir / "tokenizer"
    meta = yaml.safe_load((vdir / "MLmodel").read_text())["metadata"]["optkit"]["preprocessor"]
    assert meta["path"] == "tokenizer" and meta["sha256"] == preprocessor.folder_sha256(vdir / "tokenizer")
    r = cli("eval", vdir / "model.onnx", "--data", DATA, "--metric", "accuracy", "--json")
    assert r.rc == 0, r.err


@pytest.mark.parametrize("how", ["missing", "changed"])
@pytest.mark.parametrize("entry", ["command", "recipe", "api"])
def test_a_missing_or_changed_tokenizer_is_exit_2_and_nothing_written(cli, classifier, tmp_path, how, entry):
    from optkit.core.errors import UsageError

    work = tmp_path / "w"
    work.mkdir()
    model = work / "m.onnx"
    shutil.copyfile(classifier[1], model)
    src = classifier[1].with_suffix(".preprocessor")
    if how == "changed":
        shutil.copytree(src, work / "m.preprocessor")
        (work / "m.preprocessor" / "tokenizer.json").write_text("{}")
    repo = tmp_path / "repo"
    why = "which is missing" if how == "missing" else "changed since the model was written"
    if entry == "command":
        r = cli("package", model, "--to", "triton", "-o", repo, "--data", DATA)
        assert r.rc == 2 and why in one_error_line(r) and "m.preprocessor" in one_error_line(r)
    elif entry == "recipe":
        recipe = work / "r.yaml"
        recipe.write_text(f"version: 1\nname: r\nmodel: {{path: {model}}}\n"
                          "stages:\n  - {pass: simplify.onnx, name: s}\nmeasure: {latency: false}\n"
                          f"package:\n  - {{to: triton, output: {repo}, data: {DATA}}}\n")
        r = cli("run", recipe, "--workspace", tmp_path / "runs")
        assert r.rc == 2 and why in one_error_line(r)
    else:
        from optkit.package.build import package

        with pytest.raises(UsageError, match=why):
            package(str(model), to="triton", output=str(repo), data=str(DATA))
    assert not repo.exists()
    assert {p.name for p in work.iterdir()} <= {"m.onnx", "m.preprocessor", "r.yaml"}


def _accuracy(r) -> dict:
    assert r.rc == 0, r.err
    return json.loads(r.out)["stages"][-1]["measurements"]["accuracy"]


def test_classifier_accuracy_equals_transformers_fp32_and_onnxruntime_int8(cli, classifier, tmp_path):
    """`optkit eval --metric accuracy` on labelled text (a CSV of class names): the FP32 ONNX file scores exactly
    what transformers scores on the same rows; the INT8 file what onnxruntime gives for it on those rows (one call
    of all 40, padded to the longest, as optkit batches them: dynamic INT8 quantizes a call's activations
    together)."""
    import csv

    import onnxruntime as ort
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder, model = classifier
    rows = list(csv.DictReader(DATA.open(encoding="utf-8")))
    net = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    labels = np.array([net.config.label2id[r["label"]] for r in rows])
    enc = AutoTokenizer.from_pretrained(folder)([r["text"] for r in rows], padding=True, return_tensors="pt")
    with torch.no_grad():
        want = float((net(**enc).logits.argmax(1).numpy() == labels).mean())
    got = _accuracy(cli("eval", model, "--data", DATA, "--metric", "accuracy", "--json"))
    assert got["samples"] == len(rows) == 40 and got["accuracy"] == want
    q = tmp_path / "q.onnx"
    r = cli("quantize", model, "-o", q, "--mode", "dynamic", "--allow-slower", "--no-latency-search")
    assert r.rc == 0, r.err
    sess = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])
    logits = sess.run(None, {i.name: enc[i.name].numpy() for i in sess.get_inputs()})[0]
    got = _accuracy(cli("eval", q, "--data", DATA, "--metric", "accuracy", "--json"))
    assert got["samples"] == 40 and got["accuracy"] == float((logits.argmax(1) == labels).mean())
