"""The model's own tokenizer (its preprocessor folder, core.preprocessor) and what its config says of labels and
length: id2label / label2id and the longest input the model takes."""
from __future__ import annotations

import json
import os
from pathlib import Path

from optkit.core import trust
from optkit.core.errors import DependencyError, UsageError
from optkit.core.text import first_line
from optkit.measure.preprocess import clip

DEFAULT_LIMIT = 512      # a tokenizer and config that state no limit: BERT's
SANE_LIMIT = 1 << 20     # tokenizers without a limit report 1e30


class Tokenizer:
    """A Hugging Face tokenizer loaded from a local folder (never downloaded; its remote code only with
    --trust-code), with the labels and length limit of the model's config.json when the folder holds one."""

    def __init__(self, folder: Path):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import transformers
            from transformers import AutoTokenizer
        except ImportError:
            raise DependencyError("text data is tokenized by transformers: pip install 'optkit[text]'") from None
        transformers.logging.set_verbosity_error()   # "sequence longer than the maximum": counted, said once
        self.folder = Path(folder)
        try:
            self.tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                     trust_remote_code=trust.trusted())
        except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
            msg = first_line(e)
            if "trust_remote_code" in msg:
                raise UsageError(f"the tokenizer in {folder} runs its own code; rerun with --trust-code if you trust "
                                 "its author") from None
            raise UsageError(f"cannot load a tokenizer from {folder}: {clip(msg, 160)}") from None
        config = self._config()
        raw = config.get("id2label") or {}
        try:
            self.id2label = {int(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        except (TypeError, ValueError):
            raise UsageError(f"{folder}/config.json: id2label has a key that is not a class index") from None
        self.label2id = {v: k for k, v in self.id2label.items()}
        self.limit = self._limit(config)
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self.fast = bool(getattr(self.tok, "is_fast", False))

    def _config(self) -> dict:
        path = self.folder / "config.json"
        if not path.is_file():
            return {}
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot read {path}: {clip(first_line(e), 120)}") from None
        return raw if isinstance(raw, dict) else {}

    def _limit(self, config: dict) -> int:
        """The tokenizer's model_max_length, else the config's max_position_embeddings, else 512."""
        n = getattr(self.tok, "model_max_length", None)
        if isinstance(n, int) and 0 < n < SANE_LIMIT:
            return n
        n = config.get("max_position_embeddings")
        return n if isinstance(n, int) and 0 < n < SANE_LIMIT else DEFAULT_LIMIT

    def need_fast(self, task: str) -> None:
        if not self.fast:
            raise UsageError(f"{task} data needs a fast tokenizer (word and character offsets); the tokenizer in "
                             f"{self.folder} is a slow one: save it with tokenizer.json")

    def encode(self, first: list, second: list | None = None, *, limit: int | None, words: bool = False,
               only_second: bool = False, offsets: bool = False):
        """The tokenizer's BatchEncoding (no padding; truncated at `limit` unless it is None)."""
        how = ("only_second" if only_second else "longest_first") if limit is not None else False
        try:
            return self.tok(first, second, truncation=how, max_length=limit, padding=False,
                            is_split_into_words=words, return_token_type_ids=True, return_attention_mask=False,
                            return_offsets_mapping=offsets)
        except Exception as e:  # noqa: BLE001  the tokenizer refuses a row (a question longer than the limit)
            raise UsageError(f"the tokenizer in {self.folder} refused the data: {clip(first_line(e), 160)}") from None
