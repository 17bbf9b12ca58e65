"""BERT-style sentence encoders for quantization tests and benchmarks, built here from a `transformers` config with
deterministic weights (no hub download), exported to ONNX, and real English sentence pairs to feed them.

The sizes: "minilm" is the shape of all-MiniLM-L6-v2 (6 layers, 384 wide, 12 heads, a 30,522-token table),
"bert-base" the shape of bert-base-uncased (12 layers, 768 wide); "tiny" is a 2-layer, 64-wide encoder with the
same 30,522-token table, so the embedding table dominates its size as in a real small encoder; "tiny-1head" the
same with a single attention head.

The sentences are the descriptions scikit-learn ships with its bundled datasets (real English prose), split into
sentences and paired with their neighbours; a WordPiece vocabulary is trained on them with `tokenizers`, so the
token ids are a real tokenizer's. The weights are random (seeded): outputs are compared with the FP32 parent's.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np

SIZES = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256},
    "tiny-1head": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 1, "intermediate_size": 256},
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
}
VOCAB = 30522
STDLIB_PROSE = ("argparse", "csv", "json", "logging", "pathlib", "shutil", "subprocess", "tarfile", "zipfile")


def sentences() -> list[str]:
    """Real English sentences: scikit-learn's bundled dataset descriptions and the docstrings of a fixed list of
    standard-library modules, deduplicated, in a fixed order."""
    import importlib

    from sklearn import datasets

    text = " ".join(getattr(datasets, f)().DESCR for f in ("load_iris", "load_digits", "load_wine",
                                                           "load_breast_cancer", "load_diabetes", "load_linnerud"))
    for name in STDLIB_PROSE:
        mod = importlib.import_module(name)
        text += " " + " ".join(filter(None, [mod.__doc__] + [getattr(mod, a).__doc__ for a in sorted(dir(mod))
                                                               if not a.startswith("_") and callable(getattr(mod, a))]))
    text = re.sub(r"[=\-*:|]{2,}|\.\. \S+|\s+", " ", text)
    out, seen = [], set()
    for s in re.split(r"(?<=[.!?])\s+", text):
        s = s.strip()
        if 20 <= len(s) <= 300 and s not in seen and sum(c.isalpha() for c in s) > len(s) / 2:
            seen.add(s)
            out.append(s)
    return out


def tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=4000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def pairs(seq: int, n: int | None = None) -> dict[str, np.ndarray]:
    """Neighbouring sentences as pairs, padded (or truncated) to `seq` tokens: input_ids, attention_mask,
    token_type_ids, int64 [n, seq]."""
    texts = sentences()
    tok = tokenizer(texts)
    tok.enable_padding(length=seq, pad_id=0)
    tok.enable_truncation(max_length=seq)
    enc = tok.encode_batch(list(zip(texts[:-1:2], texts[1::2]))[:n])
    return {"input_ids": np.array([e.ids for e in enc], np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], np.int64)}


def encoder(size: str, cache: Path) -> Path:
    """The ONNX file of a `size` encoder (SIZES), seeded weights, exported at opset 17 with the legacy exporter
    (the graph onnxruntime's transformer optimizer recognises), dynamic batch and sequence. Cached in `cache`."""
    out, meta = cache / f"encoder-{size}.onnx", cache / f"encoder-{size}.json"
    key = json.dumps({**SIZES[size], "vocab": VOCAB, "v": 2}, sort_keys=True)
    if out.exists() and meta.exists() and meta.read_text() == key:
        return out
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    # eager attention: the graph onnxruntime's fusions match (SDPA's mask arithmetic hides the Attention pattern)
    config = BertConfig(vocab_size=VOCAB, max_position_embeddings=512, attn_implementation="eager", **SIZES[size])
    model = BertModel(config, add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):  # positional inputs, one output: what the legacy exporter traces cleanly
        def __init__(self):
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    feeds = {k: torch.from_numpy(v) for k, v in pairs(16, 2).items()}
    cache.mkdir(parents=True, exist_ok=True)
    dyn = {0: "batch", 1: "sequence"}
    tmp = out.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(Encoder(), tuple(feeds.values()), str(tmp), input_names=list(feeds),
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={**{k: dyn for k in feeds}, "last_hidden_state": dyn})
    tmp.replace(out)
    meta.write_text(key)
    return out


# ---------------------------------------------------------------- text models with their tokenizer, as convert writes them
TEXT_SIZE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}
TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


@functools.cache
def _trained() -> str:
    return tokenizer(sentences()).to_str()


def hf_tokenizer(folder: Path, max_length: int = 128):
    """A WordPiece tokenizer trained on real sentences (`tokenizer`), saved as a transformers fast tokenizer."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_trained()), unk_token="[UNK]", pad_token="[PAD]",
                                  cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                  model_max_length=max_length,
                                  model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    tok.save_pretrained(str(folder))
    return tok


def text_model(kind: str, cache: Path, max_length: int = 128) -> Path:
    """A tiny seeded BERT exported to ONNX with its tokenizer folder beside it and the record stamped into its
    metadata (optkit.core.preprocessor), as `optkit convert` writes a Hugging Face model. `kind`: "classifier"
    (logits [batch, 3], SENTIMENT labels), "encoder" (a mean-pooled sentence_embedding [batch, 32]), "tagger"
    (token logits [batch, sequence, 5], TAGS) or "qa" (start_logits, end_logits [batch, sequence])."""
    import tempfile

    import onnx
    import torch
    from transformers import (
        BertConfig,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertModel,
    )

    from optkit.core import preprocessor

    out = cache / f"text-{kind}.onnx"
    if out.exists() and preprocessor.folder_beside(out).is_dir():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        tok = hf_tokenizer(Path(tmp), max_length)
        labels = {"classifier": SENTIMENT, "tagger": TAGS}.get(kind, {0: "LABEL_0", 1: "LABEL_1"})
        config = BertConfig(vocab_size=len(tok), max_position_embeddings=max_length, attn_implementation="eager",
                            id2label=labels, label2id={v: k for k, v in labels.items()}, **TEXT_SIZE)
        torch.manual_seed({"classifier": 1, "encoder": 2, "tagger": 3, "qa": 4}[kind])
        net = {"classifier": BertForSequenceClassification, "encoder": BertModel, "tagger": BertForTokenClassification,
               "qa": BertForQuestionAnswering}[kind](config).eval()
        config.save_pretrained(tmp)
        names = {"classifier": ["logits"], "encoder": ["sentence_embedding"], "tagger": ["logits"],
                 "qa": ["start_logits", "end_logits"]}[kind]

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, input_ids, attention_mask, token_type_ids):
                o = self.net(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
                if kind == "encoder":
                    m = attention_mask.unsqueeze(-1).to(o.last_hidden_state.dtype)
                    return (o.last_hidden_state * m).sum(1) / m.sum(1).clamp(min=1e-9)
                if kind == "qa":
                    return o.start_logits, o.end_logits
                return o.logits

        enc = tok(["a first sentence", "and a second, longer one"], padding=True, return_tensors="pt")
        feeds = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        dyn = {0: "batch", 1: "sequence"}
        axes = {k: dyn for k in ("input_ids", "attention_mask", "token_type_ids")}
        axes.update({n: (dyn if kind in ("tagger", "qa") else {0: "batch"}) for n in names})
        raw = Path(tmp) / "model.onnx"
        with torch.no_grad():
            torch.onnx.export(Wrapped(), feeds, str(raw), input_names=list(axes)[:3], output_names=names,
                              opset_version=17, dynamo=False, dynamic_axes=axes)
        files = [p for p in Path(tmp).iterdir() if p.is_file() and p.suffix != ".onnx"]
        record = preprocessor.write_folder(files, out)
        proto = onnx.load(str(raw))
        preprocessor.stamp(proto, record)
        onnx.save(proto, str(out))
    return out


def conll_entities(tags):
    """conlleval's chunks of an IOB2 sequence, by hand: (type, start, end)."""
    out, start, kind = [], None, None
    for i, t in enumerate([*tags, "O"]):
        if start is not None and (t == "O" or t.startswith("B-") or t[2:] != kind):
            out.append((kind, start, i - 1))
            start = kind = None
        if t != "O" and start is None:
            start, kind = i, t[2:]
    return set(out)
