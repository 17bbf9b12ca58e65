"""Text data where --data goes: each format read, tokenized by the model's own tokenizer and scored as transformers
and onnxruntime give it by hand; batching by length; every bad input exit 2 with one line naming the file and row.

The models are tiny seeded BERTs with a real WordPiece tokenizer beside them, as `optkit convert` writes a Hugging
Face model (tests/_encoders.text_model); the sentence pairs are the STS Benchmark test set as shipped
(tests/data/sts-test.csv, see tests/data/README.md)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _encoders import SENTIMENT, TAGS, conll_entities, text_model

from conftest import ROOT, one_error_line

STS = ROOT / "tests" / "data" / "sts-test.csv"
ROWS = [("I loved this film, truly.", "positive"), ("It was fine, I guess.", "neutral"),
        ("Terrible acting and a worse plot.", "negative"), ("The argparse module parses command lines.", "neutral"),
        ("A \"quoted\" word; and a semicolon.", "positive"), ("Short.", "negative")]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    cache = tmp_path_factory.mktemp("textmodels")
    return {k: text_model(k, cache) for k in ("classifier", "encoder")}


def _hand_logits(model: Path, texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
    """transformers' tokenizer, one row at a time (no padding), and onnxruntime: the figures by hand."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model.with_suffix(".preprocessor")))
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out = []
    for i, t in enumerate(texts):
        enc = tok(t, pairs[i] if pairs else None, return_tensors="np")
        out.append(sess.run(None, {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask",
                                                                          "token_type_ids")})[0][0])
    return np.array(out)


def _write(path: Path, fmt: str, rows=ROWS) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if fmt == "csv":
        import csv

        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows(rows)
    elif fmt == "tsv":  # headerless: mapped by position
        path.write_text("".join(f"x\t{label}\t{text}\n" for text, label in rows), encoding="utf-8")
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({"text": t, "label": label}) + "\n" for t, label in rows), encoding="utf-8")
    elif fmt == "parquet":
        pq.write_table(pa.table({"text": [t for t, _ in rows], "label": [lab for _, lab in rows]}), path,
                       row_group_size=4)
    else:  # a datasets save_to_disk folder: an Arrow stream file, state.json, ClassLabel names in dataset_info.json
        path.mkdir()
        names = ["negative", "neutral", "positive"]
        table = pa.table({"text": [t for t, _ in rows], "label": [names.index(lab) for _, lab in rows]})
        with pa.OSFile(str(path / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        (path / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
        (path / "dataset_info.json").write_text(json.dumps({"features": {
            "text": {"dtype": "string", "_type": "Value"}, "label": {"names": names, "_type": "ClassLabel"}}}))
    return path


FORMATS = {"csv": "d.csv", "tsv": "d.tsv", "jsonl": "d.jsonl", "parquet": "d.parquet", "datasets": "folder"}


def _scored(model: Path, data: Path, metric: str = "accuracy", **text):
    """Through the Python API: the data set, bound to the model's inputs and run (measure.accuracy)."""
    from optkit.core.artifact import Artifact
    from optkit.measure.accuracy import compute, run_over
    from optkit.measure.datasets import load_dataset
    from optkit.measure.text import TextOptions
    from optkit.runtimes.base import open_session

    ds = load_dataset(data, model=model, text=TextOptions.of(metric=metric, **text))
    session = open_session(Artifact.load(str(model)))
    out = run_over(session, ds.bind(session.inputs, stream=True), batch=4)
    return ds, out, compute(metric, out, ds.labels, classes=ds.classes)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_format_scores_as_transformers_and_onnxruntime_do(models, tmp_path, fmt):
    data = _write(tmp_path / FORMATS[fmt], fmt)
    ds, out, figures = _scored(models["classifier"], data, columns="text=2,label=1" if fmt == "tsv" else None)
    logits = _hand_logits(models["classifier"], [t for t, _ in ROWS])
    gold = np.array([{v: k for k, v in SENTIMENT.items()}[lab] for _, lab in ROWS])
    np.testing.assert_array_equal(ds.labels, gold)
    np.testing.assert_allclose(out[0], logits, atol=1e-5)
    assert figures["accuracy"] == pytest.approx(float((logits.argmax(1) == gold).mean()))
    assert ds.describe()["rows"] == len(ROWS) and ds.describe()["truncated"] == 0


def test_eval_command_on_a_csv_gives_the_same_figure(cli, models, tmp_path):
    data = _write(tmp_path / "d.csv", "csv")
    r = cli("eval", models["classifier"], "--data", data, "--metric", "f1", "--json")
    assert r.rc == 0, r.err
    acc = json.loads(r.out)["stages"][0]["measurements"]["accuracy"]
    _, _, figures = _scored(models["classifier"], data, "f1")
    assert acc["f1"] == pytest.approx(figures["f1"]) and set(acc) >= {f"f1:{n}" for n in ("negative", "positive")}


def test_rows_batched_by_length_come_back_in_order(models, tmp_path):
    """Rows of very different lengths, batched by length and cut to each call's longest: the outputs equal one
    row at a time through transformers' tokenizer, in the file's order."""
    from optkit.core.artifact import Artifact
    from optkit.measure.accuracy import run_over
    from optkit.measure.datasets import load_dataset
    from optkit.runtimes.base import open_session

    texts = [(" ".join(["word"] * (1 + (i * 7) % 40)) + f" number {i}.", "neutral") for i in range(50)]
    data = _write(tmp_path / "long.jsonl", "jsonl", texts)
    ds = load_dataset(data, model=models["classifier"])
    session = open_session(Artifact.load(str(models["classifier"])))
    out = run_over(session, ds.bind(session.inputs, stream=True), batch=8)[0]
    np.testing.assert_allclose(out, _hand_logits(models["classifier"], [t for t, _ in texts]), atol=1e-5)


def test_sts_benchmark_spearman_end_to_end(cli, models):
    """`optkit eval ENCODER --data sts-test.csv --metric spearman` on the STS-B test pairs as shipped (headerless
    TSV, some rows with extra columns): the Spearman of the two sentences' cosine, as computed by hand."""
    from scipy.stats import spearmanr

    r = cli("eval", models["encoder"], "--data", STS, "--metric", "spearman", "--columns", "text=5,text_pair=6,label=4",
            "--max-samples", "200", "--json")
    assert r.rc == 0, r.err
    m = json.loads(r.out)["stages"][0]["measurements"]
    assert m["inputs"]["rows"] == 200 and m["inputs"]["pairs"] == "separate" and m["inputs"]["samples"] == 400
    # the same 200 rows by hand (max-samples picks rows with seed 0, as Dataset.subset does)
    idx = np.sort(np.random.default_rng(0).choice(1379, size=200, replace=False))
    rows = [x.split("\t") for x in STS.read_text(encoding="utf-8").splitlines()]
    a = _hand_logits(models["encoder"], [rows[i][5] for i in idx])
    b = _hand_logits(models["encoder"], [rows[i][6] for i in idx])
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    want = spearmanr(cos, [float(rows[i][4]) for i in idx])[0]
    assert m["accuracy"]["spearman"] == pytest.approx(want, abs=1e-6)


# ------------------------------------------------------------------ bad input: exit 2, one line, nothing written
def _bad(tmp_path: Path, kind: str) -> tuple[Path, list[str], str]:
    p = tmp_path / "bad.csv"
    if kind == "missing column":
        p.write_text("sentence,label\nhello there,positive\n", encoding="utf-8")
        return p, [], "no text column"
    if kind == "empty row":
        p.write_text("text,label\nhello there,positive\n  ,negative\n", encoding="utf-8")
        return p, [], "line 3: the text column is empty"
    if kind == "blank line":
        p.write_text("text,label\nhello there,positive\n\nbye,negative\n", encoding="utf-8")
        return p, [], "line 3 is blank"
    if kind == "not utf-8":
        p.write_bytes(b"text,label\nhello,positive\ncaf\xe9 au lait,neutral\n")
        return p, [], "line 3 is not UTF-8"
    if kind == "100 MB line":
        with open(p, "wb") as f:
            f.write(b"text,label\nhello,positive\n")
            f.write(b"a" * (100 << 20) + b",neutral\n")
        return p, [], "line 3 is over 1 MiB"
    if kind == "label outside id2label":
        p.write_text("text,label\nhello,positive\nbye,delighted\n", encoding="utf-8")
        return p, [], "line 3: label 'delighted' is not one of the model's classes"
    if kind == "class index outside id2label":
        p.write_text("text,label\nhello,positive\nbye,7\n", encoding="utf-8")
        return p, [], "line 3: label 7 is outside the model's classes"
    if kind == "truncation off":
        p.write_text("text,label\nhello,positive\n" + "word " * 300 + ",neutral\n", encoding="utf-8")
        return p, ["--no-truncation"], "tokens, over the model's limit of 128"
    if kind == "jsonl key missing":
        p = tmp_path / "bad.jsonl"
        p.write_text('{"text": "a", "label": "neutral"}\n{"txt": "b", "label": "neutral"}\n', encoding="utf-8")
        return p, [], "line 2 has no 'text'"
    if kind == "bad --columns":
        p.write_text("text,label\nhello,positive\n", encoding="utf-8")
        return p, ["--columns", "text=9"], "--columns text=9"
    raise AssertionError(kind)


CLI_BAD = ["missing column", "not utf-8", "100 MB line", "label outside id2label", "truncation off"]
API_BAD = ["empty row", "blank line", "class index outside id2label", "jsonl key missing", "bad --columns"]


@pytest.mark.parametrize("kind", CLI_BAD + API_BAD)
def test_bad_text_data_is_one_line_naming_file_and_row(cli, models, tmp_path, kind):
    data, extra, says = _bad(tmp_path, kind)
    report = tmp_path / "report.json"
    r = cli("eval", models["classifier"], "--data", data, "--metric", "accuracy", "--report", report, *extra)
    assert r.rc == 2, (r.rc, r.err)
    line = one_error_line(r)
    assert says in line and (str(data) in line or kind == "bad --columns"), line
    assert not report.exists()


@pytest.mark.parametrize("kind", API_BAD)
def test_bad_text_data_through_the_api_is_a_usage_error(models, tmp_path, kind):
    """The same refusals from the Python API: a UsageError (exit 2) whose one line names the file and row."""
    from optkit.core.errors import UsageError

    data, extra, says = _bad(tmp_path, kind)
    text = {"columns": extra[1]} if extra and extra[0] == "--columns" else {}
    with pytest.raises(UsageError) as e:
        _scored(models["classifier"], data, **text)
    assert e.value.exit_code == 2 and says in e.value.message and "\n" not in e.value.message
    assert str(data) in e.value.message or kind == "bad --columns"


def test_truncated_rows_are_counted(cli, models, tmp_path):
    data = tmp_path / "long.csv"
    data.write_text("text,label\nhello,positive\n" + "word " * 300 + ",neutral\n", encoding="utf-8")
    r = cli("eval", models["classifier"], "--data", data, "--metric", "accuracy", "--json")
    assert r.rc == 0, r.err
    inputs = json.loads(r.out)["stages"][0]["measurements"]["inputs"]
    assert inputs["truncated"] == 1 and inputs["max_tokens"] == 128 and inputs["token_limit"] == 128


def test_a_model_without_a_tokenizer_is_refused(cli, models, tmp_path, samples):
    data = _write(tmp_path / "d.csv", "csv")
    r = cli("eval", samples / "torch_cnn.onnx", "--data", data, "--metric", "accuracy")
    assert r.rc == 2
    assert "carries no tokenizer" in one_error_line(r)


def test_text_data_feeds_bench_tune_and_profile(cli, models, tmp_path):
    """bench, tune and profile take text data through --data (the recipe's data item), cut to the rows' lengths."""
    data = _write(tmp_path / "d.csv", "csv")
    r = cli("bench", models["classifier"], "--data", data, "--runs", "5", "--warmup", "1", "--json")
    assert r.rc == 0, r.err
    shapes = json.loads(r.out)["stages"][0]["measurements"]["inputs"]["shapes"]
    assert shapes["input_ids"][1] < 128
    r = cli("profile", models["classifier"], "--data", data, "--print-recipe")
    assert r.rc == 0 and "d.csv" in r.out, r.err


def test_token_classification_and_question_answering_from_jsonl(models, tmp_path):
    """CoNLL-shaped (tokens, ner_tags: names or indices) and SQuAD-shaped (question, context, answers) rows: the
    entity F1 equals conlleval's count on the words' first sub-tokens, by transformers' word_ids and onnxruntime;
    SQuAD's figures are their per-row mean."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from optkit.measure.accuracy import per_sample

    cache = models["classifier"].parent
    tagger, qa = text_model("tagger", cache), text_model("qa", cache)
    rows = [{"tokens": ["John", "lives", "in", "Paris", "."], "ner_tags": ["B-PER", "O", "O", "B-LOC", "O"]},
            {"tokens": ["Mary", "Smith", "visited", "New", "York"], "ner_tags": [1, 2, 0, 3, 4]},
            {"tokens": ["Nothing", "here"], "ner_tags": ["O", "O"]}]
    data = tmp_path / "ner.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ds, out, figures = _scored(tagger, data, "f1")
    tok = AutoTokenizer.from_pretrained(str(tagger.with_suffix(".preprocessor")))
    sess = ort.InferenceSession(str(tagger), providers=["CPUExecutionProvider"])
    names = [TAGS[i] for i in sorted(TAGS)]
    correct = n_gold = n_pred = 0
    for r in rows:
        enc = tok(r["tokens"], is_split_into_words=True, return_tensors="np")
        logits = sess.run(None, {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask",
                                                                       "token_type_ids")})[0][0]
        first = {}
        for pos, w in enumerate(enc.word_ids(0)):
            if w is not None and w not in first:
                first[w] = pos
        gold = [t if isinstance(t, str) else TAGS[t] for t in r["ner_tags"]]
        pred = [names[int(logits[first[w]].argmax())] for w in range(len(r["tokens"]))]
        g, p = conll_entities(gold), conll_entities(pred)
        correct, n_gold, n_pred = correct + len(g & p), n_gold + len(g), n_pred + len(p)
    assert figures["f1"] == pytest.approx(2 * correct / (n_gold + n_pred) if n_gold + n_pred else 0.0)

    qa_rows = [{"question": "Where is the tower?", "context": "The Eiffel Tower is in Paris, the capital of France.",
                "answers": {"text": ["Paris"], "answer_start": [23]}},
               {"question": "What is the capital?", "context": "Paris is the capital of France.",
                "answers": {"text": ["Paris"], "answer_start": [0]}}]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in qa_rows), encoding="utf-8")
    for metric in ("exact_match", "f1"):
        ds, out, figures = _scored(qa, data, metric)
        assert [o.shape[0] for o in out] == [2, 2] and 0.0 <= figures[metric] <= 1.0
        assert figures[metric] == pytest.approx(float(per_sample(metric, out, ds.labels).mean()))
