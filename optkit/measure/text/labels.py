"""Labels of text data, read as the metric needs them: similarity scores (floats), class indices (a class name
through the model's id2label, or an integer inside it), token tags per word, SQuAD answers.

Token-classification and question-answering labels are one object per row (`Tags`, `Answers`) in a numpy object
array, so subsets and slices of the labels stay aligned with the rows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from optkit.core.errors import UsageError
from optkit.measure.preprocess import clip

SCORE_METRICS = ("spearman", "pearson")
CLASS_METRICS = ("top1", "top5", "accuracy", "f1")


@dataclass(frozen=True)
class Tags:
    """One row's gold tags per word (class indices) and the token position of each word's first sub-token; words
    cut by truncation are left out (`cut` counts them). `classes` names the indices (the model's id2label)."""
    tags: np.ndarray
    positions: np.ndarray
    classes: tuple[str, ...]
    cut: int = 0


@dataclass(frozen=True)
class Answers:
    """One row's gold answer texts, its context, and the character span of each context token (token position ->
    (start, end)); `first`: the position of the first context token."""
    texts: tuple[str, ...]
    context: str
    offsets: np.ndarray
    first: int


class Labeler:
    """Turns a row's label values into what the metric scores; every refusal names the row."""

    def __init__(self, metric: str | None, id2label: dict[int, str], data_names: dict[str, list[str]] | None = None):
        self.metric = metric
        self.id2label, self.label2id = id2label, {v: k for k, v in id2label.items()}
        self.data_names = data_names or {}

    @property
    def kind(self) -> str | None:
        """scores, classes, numbers (a metric of the user's own: numbers, or class names) or None (no metric)."""
        if self.metric is None:
            return None
        if self.metric in SCORE_METRICS:
            return "scores"
        if self.metric in CLASS_METRICS:
            return "classes"
        return "numbers"

    def _classes(self) -> str:
        names = [f"{i}: {n}" for i, n in sorted(self.id2label.items())][:8]
        return f"id2label {{{', '.join(names)}{', ...' if len(self.id2label) > 8 else ''}}}" if names else \
            "the model's config.json has no id2label"

    def class_id(self, value: Any, where: str, column: str = "label") -> int:
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, np.integer)) and column in self.data_names:
            names = self.data_names[column]
            if 0 <= value < len(names) and names[value] in self.label2id:
                return self.label2id[names[value]]   # the data set's ClassLabel name, as the model numbers it
        if isinstance(value, str):
            if value in self.label2id:
                return self.label2id[value]
            text = value.strip()
            if text.lstrip("-").isdigit():
                value = int(text)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, (int, np.integer)):
            if value < 0 or (self.id2label and value not in self.id2label):
                raise UsageError(f"{where}: label {value} is outside the model's classes ({self._classes()})")
            return int(value)
        hint = "; similarity scores need --metric spearman or pearson" if _is_number(value) else ""
        raise UsageError(f"{where}: label {clip(str(value), 40)!r} is not one of the model's classes "
                         f"({self._classes()}){hint}")

    def score(self, value: Any, where: str) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            v = float("nan")
        if isinstance(value, bool) or not np.isfinite(v):
            raise UsageError(f"{where}: label {clip(str(value), 40)!r} is not a finite number; {self.metric} "
                             "compares similarity scores")
        return v

    def label(self, value: Any, where: str) -> Any:
        kind = self.kind
        if kind == "scores":
            return self.score(value, where)
        if kind == "classes":
            return self.class_id(value, where)
        return self.score(value, where) if _is_number(value) else self.class_id(value, where)

    def tags(self, values: Any, words: int, where: str) -> list[int]:
        if not isinstance(values, (list, tuple)) or len(values) != words:
            n = len(values) if isinstance(values, (list, tuple)) else "no list of"
            raise UsageError(f"{where}: {n} tags for {words} tokens; give one tag per token")
        ids = [self.class_id(v, where, "tags") for v in values]
        return ids

    def check_tag_names(self, source: str) -> tuple[str, ...]:
        """The model's tag names, which must be IOB2 (O, B-X, I-X) for entities to be read from them."""
        names = tuple(self.id2label[i] for i in sorted(self.id2label))
        bad = [n for n in names if n != "O" and not n.startswith(("B-", "I-"))]
        if not names or bad:
            raise UsageError(f"{source}: entity F1 reads entities from IOB2 tags (O, B-X, I-X); the model's "
                             f"id2label has {clip(bad[0] if bad else '(none)', 30)!r}")
        return names


def answers_of(value: Any, where: str) -> tuple[str, ...]:
    """SQuAD `answers`: {"text": [...], "answer_start": [...]}, or a list of texts, or one text."""
    texts = value.get("text") if isinstance(value, dict) else value
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise UsageError(f"{where}: answers are not SQuAD's {{\"text\": [...], \"answer_start\": [...]}}")
    return tuple(texts)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return np.isfinite(float(value))
    except (TypeError, ValueError):
        return False
