"""One folder-commit mechanism (core.atomic.commit_folder) for every folder optkit writes: an atomic_path folder,
a split's parts, a package version, a model's preprocessor folder. A new folder is renamed into place; an existing
one is replaced only when it is recognisably optkit's own, entry by entry with the file that makes it a result
last, the folder itself kept (a lock on it still guards it); anything else is exit 2 and left untouched."""
from __future__ import annotations

import os

import pytest

from optkit.core.atomic import atomic_path, commit_folder, remove, stage_folder
from optkit.core.errors import UsageError


def _staged(dest, files: dict[str, str]):
    tmp = stage_folder(dest)
    for name, text in files.items():
        (tmp / name).write_text(text)
    return tmp


def test_a_new_folder_is_renamed_into_place(tmp_path):
    dest = tmp_path / "out"
    tmp = _staged(dest, {"a.onnx": "a", "split.json": "{}"})
    assert tmp.parent == tmp_path and tmp.name.startswith(".out.tmp-")
    commit_folder(tmp, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["a.onnx", "split.json"] and not tmp.exists()
    assert oct(dest.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # a server may read it as another user


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_existing_folder_is_never_replaced_without_a_rule_nor_when_it_is_not_ours(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "mine.txt").write_text("mine")
    for ours in (None, lambda p: (p / "split.json").is_file()):
        tmp = _staged(dest, {"split.json": "{}"})
        with pytest.raises(UsageError, match="exists and is not a folder optkit wrote"):
            commit_folder(tmp, dest, ours=ours, last="split.json")
        remove(tmp)
        assert [p.name for p in dest.iterdir()] == ["mine.txt"]
    with pytest.raises(UsageError, match="is an existing folder"):
        with atomic_path(dest, directory=True):
            pass
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]


def test_ours_is_replaced_entry_by_entry_in_the_same_folder_result_file_last(tmp_path, monkeypatch):
    dest = tmp_path / "out"
    dest.mkdir()
    for name in ("pre.onnx", "core.onnx", "post.onnx", "split.json"):
        (dest / name).write_text("old")
    (dest / "sub").mkdir()
    inode = dest.stat().st_ino
    tmp = _staged(dest, {"core.onnx": "new", "pre.onnx": "new", "split.json": "new"})
    seen = []
    real = os.replace

    def watch(src, dst):  # split.json is gone until the last rename
        seen.append((os.path.basename(dst), (dest / "split.json").exists()))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", watch)
    commit_folder(tmp, dest, ours=lambda p: True, last="split.json")
    assert seen == [("core.onnx", False), ("pre.onnx", False), ("split.json", False)]
    assert sorted(p.name for p in dest.iterdir()) == ["core.onnx", "pre.onnx", "split.json"]
    assert {p.read_text() for p in dest.iterdir()} == {"new"} and dest.stat().st_ino == inode


def test_split_replaces_its_own_output_and_refuses_a_foreign_folder(cli, tmp_path):
    from test_split_probe import _stft_like

    out = tmp_path / "parts"
    model = _stft_like(tmp_path / "stft.onnx")
    r = cli("split", model, "-o", out)
    assert r.rc == 0, r.err
    inode = out.stat().st_ino
    before = sorted(p.name for p in out.iterdir())
    assert "split.json" in before and len(before) >= 3
    r = cli("split", model, "-o", out)
    assert r.rc == 0, r.err
    assert sorted(p.name for p in out.iterdir()) == before and out.stat().st_ino == inode
    (out / "notes.txt").write_text("mine")
    r = cli("split", model, "-o", out)
    assert r.rc == 2 and "is not a previous optkit split output" in r.err
    assert (out / "notes.txt").read_text() == "mine"
