"""Metrics of text models, and the noise of a difference between two models' figures on the same rows.

- `f1`: the task's F1. Class labels: macro F1 over the classes in the labels or the predictions (sklearn's
  average="macro"), with each class's F1 as `f1:<class>`. Token tags (measure.text.labels.Tags): F1 over entities
  read from IOB2 tags, an entity counting when its type and both ends match (conlleval's and seqeval's default,
  computed by nervaluate's strict scheme). SQuAD answers (Answers): the official v1.1 token-overlap F1, the best
  over the gold answers, averaged over rows.
- `exact_match`: SQuAD's exact match of the normalised answer text.
- `spearman` / `pearson`: rank / linear correlation of the model's similarity with the gold scores. An output of
  one value per row is the pair's score (a cross-encoder); more values per row are sentence embeddings, rows 2i and
  2i+1 a pair's two sentences (measure.text reads pairs that way for an encoder), scored by their cosine. A
  [rows, sequence, hidden] output is not pooled: exit 2 naming convert's --task.

Each metric is computed from per-row parts (`rows_of`), so it can be recomputed on any resample of the rows:
`paired_bootstrap` gives the 95% interval of the difference of two models' figures over BOOTSTRAP resamples of
the rows (seed fixed), the noise of metrics that are no mean of per-row losses. A metric that is such a mean
(exact match, SQuAD F1) also gives its per-row values.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from optkit.core.errors import UsageError
from optkit.measure.text.labels import Answers, Tags

TEXT_METRICS = ("f1", "spearman", "pearson", "exact_match")
BOOTSTRAP = 1000
SEED = 0
MAX_ANSWER_TOKENS = 30      # a predicted answer span is at most this long (the SQuAD reference scripts' default)


@dataclass
class Rows:
    """A metric's per-row parts: `value(idx)` recomputes it on rows `idx` (None: all); `per_row`: each row's own
    value where the metric is their mean, else None; `extra`: further figures on all rows (per-class F1)."""
    n: int
    stat: Any
    per_row: np.ndarray | None = None
    extra: dict | None = None

    def value(self, idx: np.ndarray | None = None) -> float:
        return float(self.stat(np.arange(self.n) if idx is None else idx))

    def resampled(self, resamples: int = BOOTSTRAP, seed: int = SEED) -> np.ndarray:
        """The figure on each of `resamples` resamples of the rows, drawn from `seed`: the same rows for every model
        of the same n, so two models' vectors pair up (kept: the choice among candidates compares many pairs)."""
        cache = self.__dict__.setdefault("_resampled", {})
        if (resamples, seed) not in cache:
            rng = np.random.default_rng(seed)
            cache[(resamples, seed)] = np.array([self.value(rng.integers(0, self.n, self.n))
                                                 for _ in range(resamples)])
        return cache[(resamples, seed)]


def rows_of(metric: str, outputs: list, labels: Any, classes: list[str] | None = None) -> Rows:
    labels = np.asarray(labels) if not isinstance(labels, np.ndarray) else labels
    kind = _kind(labels)
    if metric == "exact_match" and kind != "answers":
        raise UsageError("metric exact_match scores question answering (SQuAD answers); use accuracy for classes")
    if metric in ("spearman", "pearson"):
        return _correlation(metric, _pooled(outputs), labels)
    if kind == "answers":
        return _squad(metric, outputs, labels)
    if kind == "tags":
        return _entities(np.asarray(outputs[0]), labels)
    return _macro_f1(np.asarray(outputs[0]), labels, classes)


def _pooled(outputs: list) -> np.ndarray:
    """The output a pair metric scores: the first one per sentence (a sentence-transformers export gives
    token_embeddings first, then sentence_embedding), else the first (refused as per token)."""
    arrays = [np.asarray(o) for o in outputs]
    return next((a for a in arrays if a.ndim < 3), arrays[0])


def _kind(labels: np.ndarray) -> str:
    if labels.dtype == object and len(labels):
        first = labels[0]
        return "tags" if isinstance(first, Tags) else "answers" if isinstance(first, Answers) else "other"
    return "numbers"


# ------------------------------------------------------------ classes
def _macro_f1(out: np.ndarray, labels: np.ndarray, classes: list[str] | None) -> Rows:
    if out.ndim != 2 or out.shape[1] < 2:
        raise UsageError(f"metric f1 needs class scores [N, C] but the output has shape {list(out.shape)}")
    if labels.dtype.kind not in "iu" and not (labels.dtype.kind == "f" and np.array_equal(labels, np.round(labels))):
        raise UsageError(f"metric f1 needs class indices as labels, not {labels.dtype.name} values")
    if len(labels) != len(out):
        raise UsageError(f"{len(labels)} labels for {len(out)} model outputs")
    y, p, c = labels.astype(np.int64), out.argmax(axis=1), out.shape[1]
    if y.min() < 0 or y.max() >= c:
        raise UsageError(f"labels range {y.min()}..{y.max()} but the model's output has {c} classes")

    def per_class(idx):
        yy, pp = y[idx], p[idx]
        tp = np.bincount(yy[yy == pp], minlength=c).astype(np.float64)
        gold, pred = np.bincount(yy, minlength=c), np.bincount(pp, minlength=c)
        present = (gold + pred) > 0
        den = gold + pred
        return np.where(den > 0, 2 * tp / np.where(den > 0, den, 1), 0.0), present

    def stat(idx):
        f1, present = per_class(idx)
        return float(f1[present].mean()) if present.any() else float("nan")

    f1, present = per_class(np.arange(len(y)))
    names = classes if classes and len(classes) == c else [str(i) for i in range(c)]
    return Rows(len(y), stat, extra={f"f1:{names[i]}": float(f1[i]) for i in range(c) if present[i]})


# ------------------------------------------------------------ sentence pairs
def _correlation(metric: str, out: np.ndarray, labels: np.ndarray) -> Rows:
    from scipy import stats

    if labels.dtype.kind not in "iuf":
        raise UsageError(f"metric {metric} needs similarity scores as labels, not {labels.dtype.name} values")
    n = len(out)
    per = int(np.prod(out.shape[1:], dtype=np.int64)) if out.ndim > 1 else 1
    if out.ndim >= 3:
        raise UsageError(f"metric {metric}: the model's output {list(out.shape)} is one vector per token, not per "
                         "sentence; convert the model with --task sentence-embeddings (pooled) or give its pooled "
                         "output")
    if per == 1:
        if len(labels) != n:
            raise UsageError(f"{len(labels)} labels for {n} model outputs")
        score, gold = out.reshape(n).astype(np.float64), labels.astype(np.float64)
    else:
        if len(labels) != n or n < 2:
            raise UsageError(f"metric {metric} on sentence embeddings needs each pair as two samples (text, then "
                             f"text_pair); got {n} outputs for {len(labels)} labels")
        n -= n % 2
        a, b = out[0:n:2].reshape(n // 2, -1).astype(np.float64), out[1:n:2].reshape(n // 2, -1).astype(np.float64)
        den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        score = np.where(den > 0, (a * b).sum(1) / np.where(den > 0, den, 1), 0.0)
        gold = labels[0:n:2].astype(np.float64)
    fn = stats.spearmanr if metric == "spearman" else stats.pearsonr

    def stat(idx):
        s, g = score[idx], gold[idx]
        if len(idx) < 2 or np.ptp(s) == 0 or np.ptp(g) == 0:
            return float("nan")
        return float(fn(s, g)[0])

    return Rows(len(score), stat)


# ------------------------------------------------------------ token classification
def _entities(out: np.ndarray, labels: np.ndarray) -> Rows:
    from nervaluate import Evaluator

    if out.ndim != 3:
        raise UsageError(f"entity F1 needs token scores [N, sequence, tags] but the output has shape "
                         f"{list(out.shape)}")
    if len(labels) != len(out):
        raise UsageError(f"{len(labels)} labels for {len(out)} model outputs")
    classes = labels[0].classes
    if out.shape[2] != len(classes):
        raise UsageError(f"the model's output has {out.shape[2]} tags, its id2label {len(classes)}")
    pred = out.argmax(axis=2)
    counts = np.zeros((len(labels), 3), np.int64)     # correct, predicted, gold entities per row
    for i, t in enumerate(labels):
        keep = t.positions < out.shape[1]
        gold = [classes[k] for k in t.tags[keep]]
        guess = [classes[k] for k in pred[i, t.positions[keep]]]
        if not gold:
            continue
        res = Evaluator([gold], [guess], tags=_types(classes), loader="list").evaluate()["overall"]["strict"]
        counts[i] = (res.correct, res.actual, res.possible)

    def stat(idx):
        c, p, g = counts[idx].sum(axis=0)
        return float(2 * c / (p + g)) if p + g else 0.0

    return Rows(len(labels), stat)


def _types(classes) -> list[str]:
    return sorted({c[2:] for c in classes if c != "O"})


# ------------------------------------------------------------ question answering
def _normalize(text: str) -> str:
    """SQuAD v1.1's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _overlap_f1(pred: str, gold: str) -> float:
    p, g = _normalize(pred).split(), _normalize(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if not p or not g:
        return float(p == g)
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(g)
    return 2 * prec * rec / (prec + rec)


def best_span(start: np.ndarray, end: np.ndarray, a: Answers) -> str:
    """The answer text of the best (start <= end, inside the context, at most MAX_ANSWER_TOKENS) span."""
    ctx = np.nonzero(a.offsets[: len(start), 0] >= 0)[0]
    if not len(ctx):
        return ""
    s, e = start[ctx], end[ctx]
    score = s[:, None] + e[None, :]
    i, j = np.indices(score.shape)
    score = np.where((j >= i) & (j - i < MAX_ANSWER_TOKENS), score, -np.inf)
    bi, bj = np.unravel_index(int(np.argmax(score)), score.shape)
    return a.context[int(a.offsets[ctx[bi], 0]):int(a.offsets[ctx[bj], 1])]


def _squad(metric: str, outputs: list, labels: np.ndarray) -> Rows:
    if len(outputs) < 2 or np.ndim(outputs[0]) != 2:
        raise UsageError("question answering metrics need the model's start and end logits ([N, sequence] each)")
    start, end = np.asarray(outputs[0]), np.asarray(outputs[1])
    if len(labels) != len(start):
        raise UsageError(f"{len(labels)} labels for {len(start)} model outputs")
    per = np.zeros(len(labels))
    for i, a in enumerate(labels):
        pred = best_span(start[i], end[i], a)
        golds = a.texts or ("",)
        per[i] = max((float(_normalize(pred) == _normalize(g)) if metric == "exact_match" else _overlap_f1(pred, g))
                     for g in golds)
    return Rows(len(per), lambda idx: float(per[idx].mean()), per_row=per)


# ------------------------------------------------------------ noise
def paired_bootstrap(a: Rows, b: Rows, resamples: int = BOOTSTRAP, seed: int = SEED) -> tuple[float, float]:
    """The 95% interval of a's figure minus b's over resamples of the same rows (percentiles; resamples on which
    a figure is undefined, e.g. a constant correlation, are left out)."""
    if a.n != b.n:
        raise ValueError(f"paired rows differ: {a.n} and {b.n}")
    d = a.resampled(resamples, seed) - b.resampled(resamples, seed)
    d = d[np.isfinite(d)]
    if not len(d):
        return float("nan"), float("nan")
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float(lo), float(hi)
