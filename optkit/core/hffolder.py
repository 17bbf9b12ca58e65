"""A Hugging Face model folder (transformers or sentence-transformers): which files make the model, and the checks
made before any library reads them. Every problem is exit 2 naming the file.

A folder is `config.json` with its weights (`model.safetensors`, a sharded safetensors index, or
`pytorch_model.bin`), its preprocessor files (tokenizer, image processor), and for sentence-transformers
`modules.json` and the modules' folders (`1_Pooling/config.json`, ...). Every file the model is made of must lie
inside the folder: a link that leaves it is refused, except in the Hugging Face cache, where a snapshot's files
are links into its own repository's `blobs/`.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from optkit.core.errors import UsageError

CONFIG = "config.json"
MODULES = "modules.json"          # sentence-transformers' list of modules
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
OTHER_WEIGHTS = {"tf_model.h5": "TensorFlow", "flax_model.msgpack": "Flax", "model.onnx": "ONNX",
                 "model.ckpt.index": "TensorFlow"}
# the files a tokenizer or image processor is read from (transformers' names), and the configs their users read:
# config.json (id2label, model_type), sentence_bert_config.json (max_seq_length)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "source.spm", "target.spm", "bpe.codes")
IMAGE_FILES = ("preprocessor_config.json", "processor_config.json")
PREPROCESSOR_FILES = TOKENIZER_FILES + IMAGE_FILES + (CONFIG, "sentence_bert_config.json")
MAX_JSON = 64 << 20               # a config or index file read here (tokenizer.json of a large vocabulary: ~20 MB)
MAX_HEADER = 100 << 20            # a safetensors header (the format's own limit)


def is_folder(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / CONFIG).is_file() or (p / MODULES).is_file())


def allowed_root(folder: Path) -> Path:
    """Where the folder's files may resolve to: the folder, or for a Hub cache snapshot
    (`models--org--name/snapshots/REV/`) its repository folder (the links point into `blobs/`)."""
    folder = Path(folder).absolute()
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.resolve()
    return folder.resolve()


def inside(folder: Path, file: Path) -> Path:
    """`file` (in `folder`), checked to be a regular file that resolves inside the folder (or its Hub
    repository); exit 2 naming it otherwise."""
    real = Path(os.path.realpath(file))
    root = allowed_root(folder)
    if real != root and root not in real.parents:
        raise UsageError(f"{file} is a link to {real}, outside the model folder {folder}; copy the file into the "
                         "folder (optkit reads a model's files from its own folder only)")
    if not real.is_file():
        raise UsageError(f"{file} is not a regular file")
    return file


def read_json(file: Path, folder: Path) -> dict:
    inside(folder, file)
    if file.stat().st_size > MAX_JSON:
        raise UsageError(f"{file} is over {MAX_JSON >> 20} MB; it is not a model's configuration")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{file} is not valid JSON ({str(e)[:80]}); restore it from the model's source") from None
    if not isinstance(data, (dict, list)):
        raise UsageError(f"{file} holds {type(data).__name__}, not a JSON object")
    return data


def config(folder: Path) -> dict:
    file = Path(folder) / CONFIG
    if not file.is_file():
        raise UsageError(f"{folder} has no {CONFIG}; a Hugging Face model folder holds one")
    data = read_json(file, Path(folder))
    if not isinstance(data, dict):
        raise UsageError(f"{file} holds a list, not the model's configuration")
    return data


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a transformers folder, each checked (inside the folder; a safetensors file whole; the
    shards an index names present). Exit 2 when there are none."""
    folder = Path(folder)
    for name in WEIGHTS:
        f = folder / name
        if not f.exists() and not f.is_symlink():
            continue
        inside(folder, f)
        if name.endswith(".index.json"):
            index = read_json(f, folder)
            shards = sorted(set((index.get("weight_map") or {}).values())) if isinstance(index, dict) else []
            if not shards or not all(isinstance(s, str) and Path(s).name == s for s in shards):
                raise UsageError(f"{f} has no weight_map of shard files beside it; restore it from the model's source")
            files = []
            for s in shards:
                shard = folder / s
                if not shard.exists():
                    raise UsageError(f"{shard} is missing ({f.name} names it); download the model again")
                files.append(check_weights(folder, shard))
            return [f, *files]
        return [check_weights(folder, f)]
    others = [f"{n} ({kind})" for n, kind in OTHER_WEIGHTS.items() if (folder / n).exists()]
    raise UsageError(f"{folder} has no weights optkit reads (model.safetensors or pytorch_model.bin)"
                     + (f"; it has {', '.join(others)}" if others else "") + "; add the model's weights")


def check_weights(folder: Path, f: Path) -> Path:
    inside(folder, f)
    if f.stat().st_size == 0:
        raise UsageError(f"{f} is empty (0 bytes); download the model again")
    if f.name.endswith(".safetensors"):
        check_safetensors(f)
    return f


def check_safetensors(f: Path) -> None:
    """The header is whole and the tensors it describes fit in the file (a truncated download fails here)."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if n <= 0 or n > MAX_HEADER or 8 + n > size:
            raise UsageError(f"{f} is truncated or not a safetensors file (its header does not fit in its "
                             f"{size} bytes); download it again")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError):
            raise UsageError(f"{f} has a corrupt header (not JSON); download it again") from None
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, ValueError, IndexError, AttributeError):
        raise UsageError(f"{f} has a corrupt header (tensors without data_offsets); download it again") from None
    if 8 + n + end > size:
        raise UsageError(f"{f} is truncated: its header describes {8 + n + end} bytes, the file holds {size}; "
                         "download it again")


def modules(folder: Path) -> list[dict]:
    """sentence-transformers' modules.json, or [] for a plain transformers folder."""
    file = Path(folder) / MODULES
    if not file.is_file():
        return []
    data = read_json(file, Path(folder))
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str) for m in data):
        raise UsageError(f"{file} is not a list of modules ({{idx, name, path, type}}); restore it from the model's "
                         "source")
    for m in data:
        p = str(m.get("path") or "")
        if p and (Path(p).is_absolute() or ".." in Path(p).parts):
            raise UsageError(f"{file}: module path {p!r} leaves the model folder")
    return sorted(data, key=lambda m: m.get("idx", 0))


def transformer_folder(folder: Path) -> Path:
    """The folder holding config.json and the weights: the folder itself, or sentence-transformers' Transformer
    module's path (older models keep it in `0_Transformer/`)."""
    folder = Path(folder)
    for m in modules(folder):
        if m["type"].rsplit(".", 1)[-1] == "Transformer" and m.get("path"):
            return folder / m["path"]
    return folder


def model_files(folder: Path) -> list[Path]:
    """Every file the model is made of (for its sha256): configs, weights, preprocessor files, and the
    sentence-transformers modules' files; checked to lie inside the folder."""
    folder = Path(folder)
    inner = transformer_folder(folder)
    files = [inner / CONFIG] if (inner / CONFIG).is_file() else []
    files += weight_files(inner)
    for base in dict.fromkeys((folder, inner)):
        files += [base / n for n in PREPROCESSOR_FILES + (MODULES,) if n != CONFIG and (base / n).is_file()]
    for m in modules(folder):
        sub = folder / str(m.get("path") or "")
        if sub != folder and sub != inner and sub.is_dir():
            files += [f for f in sorted(sub.iterdir()) if f.is_file() or f.is_symlink()]
    for f in files:
        inside(folder, f)
    return list(dict.fromkeys(files))


def preprocessor_files(folder: Path) -> tuple[list[Path], str]:
    """The files a preprocessor folder takes from a model folder, and its kind (tokenizer | image-processor)."""
    folder = Path(folder)
    inner = transformer_folder(folder)
    found: dict[str, Path] = {}
    for base in (inner, folder):   # the root's (sentence-transformers') copy wins
        for n in PREPROCESSOR_FILES:
            if (base / n).is_file():
                found[n] = inside(folder, base / n)
    kind = "tokenizer" if any(n in found for n in TOKENIZER_FILES) else (
        "image-processor" if any(n in found for n in IMAGE_FILES) else "none")
    return [found[n] for n in sorted(found)], kind


def remote_code(folder: Path) -> str | None:
    """The file that names custom modelling or tokenizer code (`auto_map`), or None."""
    folder = Path(folder)
    inner = transformer_folder(folder)
    for f in (inner / CONFIG, inner / "tokenizer_config.json", folder / "tokenizer_config.json",
              inner / "preprocessor_config.json"):
        if f.is_file():
            data = read_json(f, folder)
            if isinstance(data, dict) and data.get("auto_map"):
                return str(f)
    return None
