"""Bad Hugging Face model input: exit 2, one line naming the file or key, nothing written; on every command that
reads the model (convert, inspect, eval, bench) where the check applies before any work. A Hub id resolves from
the local cache only."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from _hf_models import build

from conftest import ROOT, no_result_files, one_error_line

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfbad")
    return {t: build(t, root / t) for t in ("feature-extraction", "text-classification")}


def _copy(src, dest):
    shutil.copytree(src, dest, symlinks=True)
    (dest / ".built").unlink(missing_ok=True)
    return dest


def _refused(cli, model, tmp_path, *extra, command="convert"):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    data = tmp_path / "tokens.npz"
    if command == "eval":
        import numpy as np

        ones = np.ones((2, 8), np.int64)
        np.savez(data, input_ids=ones, attention_mask=ones, token_type_ids=0 * ones)
    args = {"convert": ["convert", model, "-o", out / "m.onnx"], "inspect": ["inspect", model],
            "bench": ["bench", model, "--runs", "1"], "eval": ["eval", model, "--data", data]}[command]
    r = cli(*args, *extra)
    assert r.rc == 2, (r.rc, r.err[-2000:])
    line = one_error_line(r)
    assert len([x for x in r.err.splitlines() if x.startswith("error:")]) == 1
    assert no_result_files(out) == [] and not (out / "m.preprocessor").exists()
    return line


@pytest.mark.parametrize("command", ["convert", "inspect", "bench", "eval"])
def test_truncated_safetensors_on_every_command(cli, tiny, tmp_path, command):
    folder = _copy(tiny["feature-extraction"], tmp_path / "m")
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    line = _refused(cli, folder, tmp_path, command=command)
    assert str(f) in line and "truncated" in line and "download it again" in line


def test_folder_without_weights(cli, tiny, tmp_path):
    folder = _copy(tiny["feature-extraction"], tmp_path / "m")
    (folder / "model.safetensors").unlink()
    line = _refused(cli, folder, tmp_path)
    assert f"{folder} has no weights optkit reads (model.safetensors or pytorch_model.bin)" in line


def test_weight_file_linked_from_outside(cli, tiny, tmp_path):
    folder = _copy(tiny["feature-extraction"], tmp_path / "m")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "model.safetensors").rename(elsewhere / "model.safetensors")
    os.symlink(elsewhere / "model.safetensors", folder / "model.safetensors")
    line = _refused(cli, folder, tmp_path)
    assert f"{folder / 'model.safetensors'} is a link to" in line and "outside the model folder" in line


def test_unknown_architecture_names_the_tasks(cli, tiny, tmp_path):
    folder = _copy(tiny["feature-extraction"], tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForMaskedLM"]}))
    line = _refused(cli, folder, tmp_path)
    assert "architecture BertForMaskedLM" in line and "sentence-embeddings, text-classification" in line
    assert "--task" in line


def test_model_type_transformers_does_not_know(cli, tiny, tmp_path):
    folder = _copy(tiny["feature-extraction"], tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "optkit-nonexistent",
                                                    "architectures": ["NonexistentModel"]}))
    line = _refused(cli, folder, tmp_path)
    assert "optkit-nonexistent" in line and "tasks optkit exports" in line


def _refused_by_the_pass(folder, tmp_path, **config) -> str:
    """The same refusal through the Python API (the pass in this process: transformers imported once for the
    module); UsageError is exit 2 on the command line."""
    from optkit.core.artifact import Artifact
    from optkit.core.errors import UsageError
    from optkit.core.registry import PassContext, build_config
    from optkit.passes import get_pass

    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    cls = get_pass("convert.hf")
    with pytest.raises(UsageError) as e:
        cls().run(Artifact.load(folder), build_config(cls, config), PassContext(output=out / "m.onnx"))
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert no_result_files(out) == []
    return str(e.value)


def test_task_whose_head_the_weights_lack(cli, tiny, tmp_path):
    line = _refused(cli, tiny["feature-extraction"], tmp_path, "--task", "text-classification")
    assert "classifier" in line and "not saved with a text-classification head" in line


def test_tokenizer_missing(cli, tiny, tmp_path):
    folder = _copy(tiny["feature-extraction"], tmp_path / "m")
    for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (folder / n).unlink(missing_ok=True)
    line = _refused(cli, folder, tmp_path)
    assert f"{folder} has no tokenizer" in line


def test_tokenizer_not_matching_the_vocabulary(cli, tiny, tmp_path):
    """A model built for a 1,000-token table with a 4,000-token tokenizer: ids past its table."""
    import torch
    from _hf_models import TINY, _tokenizer
    from transformers import BertConfig, BertModel

    folder = tmp_path / "m"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=1000, max_position_embeddings=128, **TINY)).save_pretrained(folder)
    _tokenizer(folder)
    line = _refused(cli, folder, tmp_path)
    assert "vocab_size 1000" in line and "not this model's tokenizer" in line


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_remote_code_only_with_trust_code(cli, tiny, tmp_path, file):
    """Custom modelling or tokenizer code (auto_map) runs only with --trust-code."""
    folder = _copy(tiny["feature-extraction"], tmp_path / "m")
    cfg = json.loads((folder / file).read_text())
    (folder / file).write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "modeling_x.XModel",
                                                              "AutoTokenizer": ["tok_x.XTokenizer", None]}}))
    line = _refused(cli, folder, tmp_path)
    assert f"{folder / file} names custom modelling code (auto_map)" in line and "--trust-code" in line


def test_custom_sentence_transformers_module(cli, tiny, tmp_path):
    folder = _copy(tiny["feature-extraction"], tmp_path / "m")
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Mine", "type": "my_package.MyPooling"}]))
    line = _refused(cli, folder, tmp_path)
    assert "my_package.MyPooling" in line and "--task feature-extraction" in line


def test_hub_id_not_in_the_cache_names_the_download(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    line = _refused(cli, "optkit-test-org/no-such-model", tmp_path)
    assert "hf download optkit-test-org/no-such-model" in line and "optkit downloads nothing" in line


def test_hub_id_from_the_cache_layout(cli, tiny, tmp_path, monkeypatch):
    """A snapshot in the Hub cache is links into the repository's blobs/: those are allowed, and the model runs."""
    cache = tmp_path / "cache"
    repo = cache / "models--optkit-test-org--tiny-bert"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = repo / "snapshots" / rev
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    for i, f in enumerate(sorted(p for p in tiny["text-classification"].iterdir() if p.is_file() and p.name != ".built")):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    r = cli("inspect", "optkit-test-org/tiny-bert")
    assert r.rc == 0, r.err
    assert "hf" in r.out and "logits" in r.out


def test_offline_before_any_hub_import():
    """optkit's Hub helpers set the offline mode before huggingface_hub is imported, in a fresh process."""
    import subprocess
    import sys

    code = ("import os, sys; from optkit.core import hub; hub.local_model('a/b') if False else None; "
            "from optkit.runtimes import hf_model; hf_model.import_transformers(); "
            "import huggingface_hub.constants as c; print(c.HF_HUB_OFFLINE, c.HF_HUB_DISABLE_TELEMETRY)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env["HF_HUB_OFFLINE"] = "0"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == ["True", "True"]


class _Payload:
    """Unpickling this runs a command: what a pickled pytorch_model.bin can do when not loaded weights_only."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pytorch_model_bin_is_read_weights_only(tiny, tmp_path):
    import torch

    folder = _copy(tiny["feature-extraction"], tmp_path / "m")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    torch.save({"embeddings.word_embeddings.weight": _Payload(marker)}, folder / "pytorch_model.bin")
    line = _refused_by_the_pass(folder, tmp_path)
    assert "cannot load" in line and not marker.exists()
