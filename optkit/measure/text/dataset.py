"""Text data as a Dataset: rows of a CSV / TSV / JSONL / Parquet file or a `datasets` folder, tokenized by the
model's own tokenizer into the inputs the model names (input_ids, attention_mask, token_type_ids where it takes
them).

Loading scans the file once, streamed: every row is checked (columns, UTF-8, not blank, labels the model knows),
tokenized without truncation to learn its length, and its place in the file kept. The samples are then read
again on demand (`LazyArray`s that tokenize the rows asked for), padded to the longest row of the data; each
array carries every sample's token count (`lengths`), by which core.batching sorts a bounded window of samples
into batches of like length and cuts each call to its longest row. Rows over the model's limit are truncated
and counted (`truncated`); with truncation off they are exit 2 naming the first.

Sentence pairs scored by `spearman` / `pearson` on a model with more than one output value per row (a sentence
encoder) are read as two samples per row, the text then the pair, each labelled with the row's score: the metric
takes the cosine of the two embeddings. Otherwise a pair is one sample, tokenized as the tokenizer joins pairs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core import preprocessor
from optkit.core.errors import UsageError
from optkit.measure.lazy import LazyArray
from optkit.measure.preprocess import clip
from optkit.measure.text import rows as R
from optkit.measure.text.columns import Layout, layout, parse_columns
from optkit.measure.text.labels import SCORE_METRICS, Answers, Labeler, Tags, answers_of
from optkit.measure.text.tokenizer import Tokenizer

CHUNK = 256        # rows tokenized at a time while scanning
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class TextOptions:
    """How text data is read: the --columns mapping, truncation at the model's limit, the metric its labels are
    for, the tokenizer folder, and whether a pair is two samples (a sentence encoder's similarity)."""
    columns: dict = field(default_factory=dict)
    truncation: bool = True
    metric: str | None = None
    tokenizer: str | None = None
    pairs: str = "joint"     # joint | separate

    @classmethod
    def of(cls, columns: str | dict | None = None, **kw) -> TextOptions:
        return cls(columns=columns if isinstance(columns, dict) else parse_columns(columns), **kw)


class _Source:
    """A table read through its layout: rows by role, scanned once and fetched again by locator."""

    def __init__(self, table, lay: Layout, header: bool):
        self.table, self.lay, self.header = table, lay, header

    def where(self, loc) -> str:
        path = self.table.path
        return f"{path} line {loc[1]}" if isinstance(loc, tuple) else f"{path} row {loc + 1}"

    def scan(self):
        t = self.table
        if isinstance(t, R._Arrow):
            cols = sorted(set(self.lay.keys.values()))
            i = 0
            for batch in t.batches(cols):
                for row in batch:
                    yield i, self.lay.values(row, self.where(i))
                    i += 1
            return
        with open(t.path, "rb") as f:
            first = True
            for off, line, row in t.records(f):
                if first and self.header:
                    first = False
                    continue
                first = False
                loc = (off, line)
                yield loc, self.lay.values(row, self.where(loc))

    def fetch(self, locs: list) -> list[dict]:
        t = self.table
        if isinstance(t, R._Arrow):
            cols = sorted(set(self.lay.keys.values()))
            return [self.lay.values(r, "") for r in t.fetch([int(x) for x in locs], cols)]
        out = []
        with open(t.path, "rb") as f:
            for off, line in locs:
                _, _, row = next(t.records(f, int(off), int(line)))
                out.append(self.lay.values(row, ""))
        return out


def _layout(table, columns: dict, source: str) -> tuple[Layout, bool]:
    if isinstance(table, R._Arrow):
        return layout(table.column_names(), None, columns, source, positional=False), False
    if isinstance(table, R.JsonLines):
        with open(table.path, "rb") as f:
            first = next(table.records(f), None)
        if first is None:
            raise UsageError(f"{source} holds no rows; give a file with at least one")
        return layout(list(first[2]), None, columns, source, positional=False), False
    row = table.first_row
    named = any(isinstance(v, str) for v in columns.values())
    header = table.header_guess or named or (not columns and "text" in row)
    if not columns and not header:
        raise UsageError(f"{source} has no header row naming its columns (first row: {clip(' | '.join(row), 60)}); "
                         "map them by position, e.g. --columns text=0,label=1")
    return layout(row if header else None, len(row), columns, source, positional=True), header


def one_score_per_row(model: str | Path | None) -> bool | None:
    """Whether the model's first output holds one value per row (a cross-encoder's score); None: unknown."""
    if model is None:
        return None
    model = Path(model)
    if model.is_dir():
        import json

        try:
            cfg = json.loads((model / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        archs = cfg.get("architectures") or []
        return any("SequenceClassification" in str(a) for a in archs) and cfg.get("num_labels", len(
            cfg.get("id2label") or {0: 0, 1: 1})) == 1
    if model.suffix.lower() != ".onnx" or not model.is_file():
        return None
    import onnx

    try:
        out = onnx.load(str(model), load_external_data=False).graph.output[0]
    except Exception:  # noqa: BLE001  an unreadable model says so when it is loaded for real
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in out.type.tensor_type.shape.dim]
    return len(dims) <= 1 or (all(d is not None for d in dims[1:]) and int(np.prod(dims[1:])) == 1)


def text_tokenizer(model: str | Path | None, data: str | Path) -> Path:
    """The folder of the model's own tokenizer (core.preprocessor: checked); exit 2 when it has none."""
    folder = preprocessor.resolve(model) if model is not None else None
    if folder is None:
        which = f"{model} carries no tokenizer" if model is not None else "no model is given to tokenize it with"
        raise UsageError(f"{data} is text data, tokenized by the model's own tokenizer, and {which}; convert the "
                         "model from its Hugging Face folder with optkit convert (the tokenizer travels with it)")
    return Path(folder)


def load_text(path: Path, options: TextOptions, model: str | Path | None = None) -> TextDataset:
    """The Dataset of a text data file, tokenized by `options.tokenizer` (else the model's own, core.preprocessor)."""
    tok = Tokenizer(Path(options.tokenizer) if options.tokenizer else text_tokenizer(model, path))
    table = R.open_table(path)
    lay, header = _layout(table, options.columns, str(path))
    pairs = "joint"
    if lay.task == "text" and "text_pair" in lay.keys and options.metric in SCORE_METRICS:
        pairs = "joint" if one_score_per_row(model) else "separate"
    if lay.task != "text":
        tok.need_fast(lay.task)
    labeler = Labeler(options.metric, tok.id2label, getattr(table, "class_names", {}))
    scan = _Scan(_Source(table, lay, header), tok, labeler, options, pairs)
    return scan.run()


class _Scan:
    """One pass over the rows: checked, tokenized for their lengths, labelled."""

    def __init__(self, source: _Source, tok: Tokenizer, labeler: Labeler, options: TextOptions, pairs: str):
        self.source, self.tok, self.labeler, self.options, self.pairs = source, tok, labeler, options, pairs
        self.task = source.lay.task
        self.locs, self.lengths, self.labels = [], [], []
        self.truncated = 0
        self.want_labels = labeler.kind is not None
        self.classes = labeler.check_tag_names(str(source.table.path)) if (
            self.task == "token-classification" and self.want_labels) else tuple(
            tok.id2label[i] for i in sorted(tok.id2label))

    def run(self) -> TextDataset:
        chunk = []
        for loc, values in self.source.scan():
            if len(self.locs) + len(chunk) >= R.MAX_ROWS:
                raise R._too_many(self.source.table.path)
            chunk.append((loc, values))
            if len(chunk) == CHUNK:
                self._chunk(chunk)
                chunk = []
        if chunk:
            self._chunk(chunk)
        if not self.locs:
            raise UsageError(f"{self.source.table.path} holds no rows; give a file with at least one")
        locs = np.array(self.locs, dtype=np.int64)
        labels = None
        if self.want_labels:
            labels = np.empty(len(self.labels), dtype=object)
            labels[:] = self.labels
            if labels.size and not isinstance(self.labels[0], (Tags, Answers)):
                labels = labels.astype(np.float64 if self.labeler.kind != "classes" else np.int64)
        enc = Encoder(self.source, self.tok, self.task, self.pairs, locs)
        return TextDataset(enc, np.arange(len(locs)), np.array(self.lengths, dtype=np.int64), labels,
                           str(self.source.table.path), list(self.classes), self.truncated, self.options.truncation)

    def _text(self, value: Any, where: str, role: str) -> str:
        if not isinstance(value, str):
            raise UsageError(f"{where}: the {role} column holds {type(value).__name__}, not text")
        if not value.strip():
            raise UsageError(f"{where}: the {role} column is empty; every row needs its text")
        return value

    def _chunk(self, chunk: list) -> None:
        wheres = [self.source.where(loc) for loc, _ in chunk]
        vals = [v for _, v in chunk]
        if self.task == "token-classification":
            lengths, labels = self._tokens(vals, wheres)
        elif self.task == "question-answering":
            lengths, labels = self._qa(vals, wheres)
        else:
            lengths, labels = self._sentences(vals, wheres)
        limit = self.tok.limit
        for loc, where, n in zip([c[0] for c in chunk], wheres, lengths):
            if max(n) > limit and not self.options.truncation:
                raise UsageError(f"{where}: {max(n)} tokens, over the model's limit of {limit}, and truncation is "
                                 "off (--no-truncation / truncation: false); shorten the row or let optkit truncate it")
            self.truncated += max(n) > limit
            self.locs.append(loc if isinstance(loc, tuple) else (loc, 0))
            self.lengths.extend(min(x, limit) for x in n)
        self.labels.extend(labels)

    def _label(self, v: dict, where: str):
        if "label" not in v:
            raise UsageError(f"{where}: no label column, and metric {self.labeler.metric} needs labels; map it with "
                             "--columns label=...")
        return self.labeler.label(v["label"], where)

    def _sentences(self, vals: list[dict], wheres: list[str]):
        texts = [self._text(v["text"], w, "text") for v, w in zip(vals, wheres)]
        pair = [self._text(v["text_pair"], w, "text_pair") for v, w in zip(vals, wheres)] if (
            "text_pair" in self.source.lay.keys) else None
        if pair is not None and self.pairs == "separate":
            a = self.tok.encode(texts, limit=None)["input_ids"]
            b = self.tok.encode(pair, limit=None)["input_ids"]
            lengths = [(len(x), len(y)) for x, y in zip(a, b)]
        else:
            lengths = [(len(x),) for x in self.tok.encode(texts, pair, limit=None)["input_ids"]]
        labels = [self._label(v, w) for v, w in zip(vals, wheres)] if self.want_labels else []
        return lengths, labels

    def _tokens(self, vals: list[dict], wheres: list[str]):
        words = []
        for v, w in zip(vals, wheres):
            t = v["tokens"]
            if not isinstance(t, list) or not t or not all(isinstance(x, str) and x.strip() for x in t):
                raise UsageError(f"{w}: tokens is not a list of non-empty words")
            words.append(t)
        enc = self.tok.encode(words, limit=None, words=True)
        lengths = [(len(x),) for x in enc["input_ids"]]
        labels = []
        if self.want_labels:
            long = [i for i, n in enumerate(lengths) if n[0] > self.tok.limit]
            cut = self.tok.encode([words[i] for i in long], limit=self.tok.limit, words=True) if long else None
            for i, (v, w) in enumerate(zip(vals, wheres)):
                if "tags" not in v:
                    raise UsageError(f"{w}: no tags column, and metric {self.labeler.metric} needs them")
                tags = self.labeler.tags(v["tags"], len(words[i]), w)
                ids = cut.word_ids(long.index(i)) if i in long else enc.word_ids(i)
                first: dict[int, int] = {}
                for pos, wid in enumerate(ids):
                    if wid is not None and wid not in first:
                        first[wid] = pos
                kept = sorted(first)
                labels.append(Tags(np.array([tags[k] for k in kept], np.int64),
                                   np.array([first[k] for k in kept], np.int64), self.classes, len(tags) - len(kept)))
        return lengths, labels

    def _qa(self, vals: list[dict], wheres: list[str]):
        q = [self._text(v["question"], w, "question") for v, w in zip(vals, wheres)]
        c = [self._text(v["context"], w, "context") for v, w in zip(vals, wheres)]
        enc = self.tok.encode(q, c, limit=None, offsets=True)
        lengths = [(len(x),) for x in enc["input_ids"]]
        labels = []
        if self.want_labels:
            long = [i for i, n in enumerate(lengths) if n[0] > self.tok.limit]
            cut = self.tok.encode([q[i] for i in long], [c[i] for i in long], limit=self.tok.limit, offsets=True,
                                  only_second=True) if long else None
            for i, (v, w) in enumerate(zip(vals, wheres)):
                if "answers" not in v:
                    raise UsageError(f"{w}: no answers column, and metric {self.labeler.metric} needs it")
                e, j = (cut, long.index(i)) if i in long else (enc, i)
                seq = e.sequence_ids(j)
                offsets = np.array([o if s == 1 else (-1, -1) for o, s in zip(e["offset_mapping"][j], seq)], np.int64)
                first = next((p for p, s in enumerate(seq) if s == 1), len(seq))
                labels.append(Answers(answers_of(v["answers"], w), c[i], offsets, first))
        return lengths, labels


class Encoder:
    """Tokenizes the samples asked for, again, from their rows; the last call's arrays are kept, since the
    model's inputs (ids, mask, type ids) are read one after another for the same samples."""

    def __init__(self, source: _Source, tok: Tokenizer, task: str, pairs: str, locs: np.ndarray):
        self.source, self.tok, self.task, self.pairs, self.locs = source, tok, task, pairs, locs
        self.per_row = 2 if pairs == "separate" else 1
        self._last: tuple[bytes, dict] | None = None

    def read(self, name: str, samples: np.ndarray, width: int, limit: int, dtype) -> np.ndarray:
        key = samples.tobytes() + bytes(str((width, limit)), "ascii")
        if self._last is None or self._last[0] != key:
            self._last = (key, self._encode(samples, width, limit))
        return self._last[1][name].astype(dtype, copy=False)

    def _encode(self, samples: np.ndarray, width: int, limit: int) -> dict[str, np.ndarray]:
        rows = samples // self.per_row
        uniq, back = np.unique(rows, return_inverse=True)
        locs = [tuple(self.locs[r]) if self.locs.ndim == 2 and self.locs[r, 1] else int(self.locs[r, 0])
                for r in uniq]
        got = self.source.fetch(locs)
        vals = [got[i] for i in back]
        if self.task == "token-classification":
            enc = self.tok.encode([v["tokens"] for v in vals], limit=limit, words=True)
        elif self.task == "question-answering":
            enc = self.tok.encode([v["question"] for v in vals], [v["context"] for v in vals], limit=limit,
                                  only_second=True)
        elif self.pairs == "separate":
            enc = self.tok.encode([v["text_pair" if s % 2 else "text"] for v, s in zip(vals, samples)], limit=limit)
        else:
            pair = [v["text_pair"] for v in vals] if "text_pair" in self.source.lay.keys else None
            enc = self.tok.encode([v["text"] for v in vals], pair, limit=limit)
        n = len(samples)
        out = {"input_ids": np.full((n, width), self.tok.pad_id, np.int64),
               "attention_mask": np.zeros((n, width), np.int64), "token_type_ids": np.zeros((n, width), np.int64)}
        types = enc.get("token_type_ids")
        for i, ids in enumerate(enc["input_ids"]):
            k = min(len(ids), width)
            out["input_ids"][i, :k] = ids[:k]
            out["attention_mask"][i, :k] = 1
            if types is not None:
                out["token_type_ids"][i, :k] = types[i][:k]
        return out


class TextDataset:
    """Rows of a text file (`rows`: their numbers in the scan) read through an Encoder; see the module. It has
    measure.datasets.Dataset's interface: arrays, labels, source, classes, dtype, len, subset, bind."""

    def __init__(self, enc: Encoder, rows: np.ndarray, lengths: np.ndarray, labels, source: str,
                 classes: list[str], truncated: int, truncation: bool = True):
        self.enc, self.rows, self.all_lengths, self.truncated = enc, rows, lengths, truncated
        self.truncation = truncation
        self.source, self.classes, self.dtype = source, classes, None
        self.labels = None if labels is None else (labels if enc.per_row == 1 else np.repeat(labels, 2))
        self._row_labels = labels
        self.width = int(lengths.max())
        self.arrays = {k: self._array(k, self.width, self.enc.tok.limit, np.int64) for k in INPUTS}

    def __len__(self) -> int:
        return len(self.rows) * self.enc.per_row

    @property
    def samples(self) -> np.ndarray:
        k = self.enc.per_row
        return (self.rows[:, None] * k + np.arange(k)).ravel()

    def _array(self, name: str, width: int, limit: int, dtype) -> LazyArray:
        samples = self.samples
        lengths = np.minimum(self.all_lengths[samples], width)
        read = lambda idx: self.enc.read(name, samples[idx], width, limit, dtype)  # noqa: E731
        return LazyArray(read, len(samples), (width,), dtype, lengths=lengths)

    def describe(self) -> dict:
        """What the report says of the data: rows, samples, the task, truncated rows, the longest sample."""
        return {"rows": len(self.rows), "task": self.enc.task, "pairs": self.enc.pairs,
                "truncated": int(self.truncated), "max_tokens": self.width, "token_limit": self.enc.tok.limit}

    def subset(self, n: int | None, seed: int = 0) -> TextDataset:
        """A deterministic sample of n rows (a pair read as two samples stays together)."""
        if n is not None and n < 1:
            raise UsageError(f"max_samples {n} leaves no samples of {self.source} to use; give 1 or more")
        if n is None or n >= len(self.rows):
            return self
        idx = np.sort(np.random.default_rng(seed).choice(len(self.rows), size=n, replace=False))
        sub = TextDataset(self.enc, self.rows[idx], self.all_lengths, None, self.source, self.classes, self.truncated,
                          self.truncation)
        sub._row_labels = None if self._row_labels is None else self._row_labels[idx]
        sub.labels = None if sub._row_labels is None else (
            sub._row_labels if self.enc.per_row == 1 else np.repeat(sub._row_labels, 2))
        return sub

    def bind(self, specs: list, stream: bool = False) -> dict[str, np.ndarray]:
        """The model's inputs, named as it names them, read on demand (stream or not: text is always tokenized a
        batch at a time). A model input the tokenizer does not give, or one that is not [batch, sequence] of
        integers, is exit 2 naming it."""
        bound = {}
        widths = {s.shape[1] for s in specs if s.shape and len(s.shape) == 2 and isinstance(s.shape[1], int)
                  and s.shape[1] > 0}
        width = min(widths) if widths else self.width
        limit = min(self.enc.tok.limit, width)
        if width < self.width:
            over = int((self.all_lengths[self.samples] > width).sum())
            if over and not self.truncation:
                raise UsageError(f"{self.source}: {over} samples are over the model's fixed sequence length {width} "
                                 "and truncation is off (--no-truncation); shorten them or let optkit truncate")
        for s in specs:
            if s.name not in INPUTS:
                raise UsageError(f"{self.source} is text, tokenized into {', '.join(INPUTS)}, but the model also takes "
                                 f"{s.name!r}; give an .npz with one array per input instead")
            if s.shape is not None and len(s.shape) != 2:
                raise UsageError(f"{self.source} is text, tokenized into [batch, sequence] ids, but input {s.name!r} "
                                 f"has shape {list(s.shape)}")
            dtype = np.dtype(s.dtype) if s.dtype not in (None, "bfloat16") and "string" not in str(s.dtype) else None
            if dtype is None or dtype.kind not in "iu":
                raise UsageError(f"{self.source} is text, tokenized into integer ids, but input {s.name!r} takes "
                                 f"{s.dtype}")
            bound[s.name] = self._array(s.name, width, limit, dtype)
        return bound
