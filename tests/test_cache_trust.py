"""Caches are trusted only when they are the user's own (issue 39, W8): the int8 kernel table, onnxruntime's
TensorRT engine / timing cache folder, the TensorRT timing cache and the run workspace's stage cache. A planted
file that is writable by group or others (or, as root, owned by another user) is ignored, said at -v, and the
result is what it is without it; a cache folder that is not the user's own and private is not written; the
folders optkit makes are 0700 and its cache files 0600."""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import _testpasses  # noqa: F401 - registers test.copy / test.scale
import onnx
import pytest
from test_pipeline import ran, write_recipe
from test_quantize_kernels import Counting, _model, _quantize, _ratios

from optkit.core.cachedir import NotPrivate, private_folder, trusted
from optkit.passes.quantize import kernels
from optkit.passes.tensorrt import read_timing_cache, save_timing_cache
from optkit.pipeline.recipe import load_recipe
from optkit.pipeline.runner import RunOptions, execute
from optkit.runtimes.onnx import provider_list

NOBODY = 65534
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _not_ours(path: Path, how: str) -> str:
    """Make `path` someone else's: writable by group or others, or (as root only) owned by nobody. What -v says."""
    if how == "owner":
        if not ROOT:
            pytest.skip("only root can give a file to another user")
        os.chown(path, NOBODY, NOBODY)
        return f"owned by uid {NOBODY}"
    os.chmod(path, _mode(path) | (0o020 if how == "group" else 0o002))
    return f"writable by {'group' if how == 'group' else 'others'}"


HOW = ["group", "others", "owner"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "home" / "cache"
    monkeypatch.setenv("OPTKIT_CACHE_DIR", str(d))
    return d


def test_the_folders_optkit_makes_are_0700(cache):
    key = kernels.table_key()
    assert kernels.write_cached(kernels.cache_path(key), key, _ratios())
    assert _mode(cache) == 0o700 and _mode(cache.parent) == 0o700   # its missing parent too
    assert _mode(kernels.cache_path(key)) == 0o600
    options = dict(provider_list("tensorrt")[0][1])
    assert Path(options["trt_engine_cache_path"]) == cache / "ort-tensorrt" and _mode(cache / "ort-tensorrt") == 0o700
    assert save_timing_cache(cache / "t.cache", b"blob", per_user=True) is None and _mode(cache / "t.cache") == 0o600


# ------------------------------------------------------------------ the int8 kernel table

@pytest.mark.parametrize("how", HOW)
def test_a_planted_kernel_table_is_ignored_and_replaced_by_a_measured_one(cache, caplog, how):
    key = kernels.table_key()
    path = kernels.cache_path(key)
    assert kernels.write_cached(path, key, _ratios(conv3x3_small={"dynamic": 5.0}))  # in bounds: only its owner tells
    says = _not_ours(path, how)
    measured = Counting(_ratios())
    with caplog.at_level("INFO", logger="optkit"):
        table = kernels.load_table(measured)
    assert measured.calls == 1 and not table.cached and table.ratios == _ratios()
    assert f"kernel table {path} ignored: {says}" in caplog.text
    assert kernels.read_cached(path, key) == _ratios() and _mode(path) == 0o600 and path.stat().st_uid == os.getuid()


@pytest.mark.parametrize("how", HOW)
def test_a_kernel_cache_folder_not_ours_is_not_written(cache, caplog, how):
    cache.mkdir(parents=True, mode=0o700)
    says = _not_ours(cache, how)
    measured = Counting()
    with caplog.at_level("INFO", logger="optkit"):
        table = kernels.load_table(measured)
    assert measured.calls == 1 and table.ratios == measured.ratios and list(cache.iterdir()) == []
    assert f"cache folder {cache} is {says}" in caplog.text and "not cached" in caplog.text


def test_a_planted_table_no_longer_changes_which_model_quantize_writes(cli, cache, tmp_path):
    """The same in-bounds table, the user's own and private, skips the ConvInteger tier; writable by group it is
    ignored (measured again), said at -v, and the planted 37.50x decides nothing (a figure no CPU's int8 convs
    measure, so the measured table cannot say it too)."""
    from optkit.onnx import io as onnx_io

    model = tmp_path / "m.onnx"
    onnx_io.save(_model(tmp_path, convs=3), model)
    key = kernels.table_key()
    path = kernels.cache_path(key)
    planted = _ratios(conv3x3_small={"dynamic": 37.5})
    assert kernels.write_cached(path, key, planted)
    q, _ = _quantize(cli, tmp_path, model, "--per-channel", "--no-reduce-range")
    assert any("ConvInteger runs 37.50x" in s["why"] for s in q["settings"].get("skipped", []))  # the control
    os.chmod(path, 0o664)
    q, err = _quantize(cli, tmp_path, model, "--per-channel", "--no-reduce-range")
    assert f"kernel table {path} ignored: writable by group" in err
    assert q["settings"]["kernel_table"]["cached"] is False
    assert not any("37.50x" in s["why"] for s in q["settings"].get("skipped", []))
    assert _mode(path) == 0o600 and kernels.read_cached(path, key) != planted


# ------------------------------------------------------------------ onnxruntime's TensorRT caches

@pytest.mark.parametrize("how", HOW)
def test_ort_tensorrt_caches_are_not_used_with_a_planted_file_or_a_folder_not_ours(cache, caplog, how):
    assert isinstance(provider_list("tensorrt")[0], tuple)  # the user's own folder: engines cached
    engine = cache / "ort-tensorrt" / "TensorrtExecutionProvider_TRTKernel_graph_1.engine"
    engine.write_bytes(b"planted")
    os.chmod(engine, 0o600)
    assert isinstance(provider_list("tensorrt")[0], tuple)
    says = _not_ours(engine, how)
    with caplog.at_level("INFO", logger="optkit"):
        assert provider_list("tensorrt") == ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                             "CPUExecutionProvider"]
    assert f"{engine} ignored: {says}" in caplog.text
    engine.unlink()
    says = _not_ours(cache / "ort-tensorrt", how)
    caplog.clear()
    with caplog.at_level("INFO", logger="optkit"):
        assert provider_list("tensorrt")[0] == "TensorrtExecutionProvider"
    assert f"is {says}" in caplog.text
    assert provider_list("cuda") == ["CUDAExecutionProvider", "CPUExecutionProvider"]


# ------------------------------------------------------------------ the TensorRT pass's timing cache

@pytest.mark.parametrize("how", HOW)
def test_a_timing_cache_not_ours_is_neither_loaded_nor_replaced(cache, caplog, how):
    path = cache / "tensorrt-10-timing.cache"
    assert save_timing_cache(path, b"ours", per_user=True) is None and read_timing_cache(path) == b"ours"
    says = _not_ours(path, how)
    with caplog.at_level("INFO", logger="optkit"):
        assert read_timing_cache(path) == b""
    assert f"TensorRT timing cache {path} ignored: {says}" in caplog.text
    assert "not yours alone" in save_timing_cache(path, b"new", per_user=True)
    assert path.read_bytes() == b"ours"                          # left as it is
    named = cache.parent / "named.cache"                         # a file the user names (--timing-cache): the same
    named.write_bytes(b"theirs")
    _not_ours(named, how)
    assert read_timing_cache(named) == b"" and save_timing_cache(named, b"new", per_user=False)
    link = cache / "link.cache"
    link.symlink_to(cache.parent / "elsewhere")
    assert read_timing_cache(link) == b""


@pytest.mark.parametrize("how", HOW)
def test_a_per_user_timing_cache_folder_not_ours_is_not_written(cache, how):
    cache.mkdir(parents=True, mode=0o700)
    says = _not_ours(cache, how)
    assert says in save_timing_cache(cache / "t.cache", b"blob", per_user=True)
    assert list(cache.iterdir()) == []


# ------------------------------------------------------------------ the run workspace's stage cache

def _planted_entry(ws: Path, other: Path) -> Path:
    """Replace the one cached stage output by `other`'s bytes and record their sha256: a whole, self-consistent
    entry that is not the stage's result (what a planted entry is)."""
    from optkit.core.artifact import content_sha256
    from optkit.core.formats import Format

    (entry,) = [p for p in (ws / ".cache").iterdir() if p.is_dir()]
    doc = json.loads((entry / "entry.json").read_text())
    model = entry / "files" / doc["artifact"]["path"]
    os.chmod(model, 0o600)
    shutil.copyfile(other, model)
    doc["artifact"]["sha256"] = content_sha256(model, Format.ONNX)
    (entry / "entry.json").write_text(json.dumps(doc))
    os.chmod(entry / "entry.json", 0o600)
    return model


@pytest.mark.parametrize("how", HOW)
def test_a_planted_stage_cache_entry_is_not_reused(tmp_path, how):
    marker = tmp_path / "m"
    recipe = write_recipe(tmp_path, [{"pass": "test.copy", "name": "copy", "config": {"marker": str(marker)}}])
    ws = tmp_path / "runs"
    first = execute(load_recipe(recipe), RunOptions(workspace=ws))
    real = (first.run_dir / "01-copy" / "model.onnx").read_bytes()
    assert _mode(ws / ".cache") == 0o700 and ran(marker) == 1
    entry = next(p for p in (ws / ".cache").iterdir() if p.is_dir())
    assert all(_mode(p) == (0o700 if p.is_dir() else 0o600) for p in entry.rglob("*"))
    other = onnx.load(str(first.run_dir / "01-copy" / "model.onnx"))
    other.doc_string = "planted"
    onnx.save(other, str(tmp_path / "other.onnx"))
    # the control: the planted entry, the user's own and private, is what the stage serves
    planted = _planted_entry(ws, tmp_path / "other.onnx")
    again = execute(load_recipe(recipe), RunOptions(workspace=ws))
    assert again.report.stages[1].cached and ran(marker) == 1
    assert (again.run_dir / "01-copy" / "model.onnx").read_bytes() == (tmp_path / "other.onnx").read_bytes() != real
    assert _mode(again.run_dir / "01-copy" / "model.onnx") & 0o044  # a result's modes, not the cache's 0600
    _not_ours(planted, how)
    third = execute(load_recipe(recipe), RunOptions(workspace=ws))
    assert not third.report.stages[1].cached and ran(marker) == 2
    assert any("dropped; recomputed" in n for n in third.report.stages[1].notes)
    assert (third.run_dir / "01-copy" / "model.onnx").read_bytes() == real


@pytest.mark.parametrize("how", HOW)
def test_a_stage_cache_folder_not_ours_is_neither_read_nor_written(tmp_path, how):
    marker = tmp_path / "m"
    recipe = write_recipe(tmp_path, [{"pass": "test.copy", "name": "copy", "config": {"marker": str(marker)}}])
    ws = tmp_path / "runs"
    execute(load_recipe(recipe), RunOptions(workspace=ws))
    before = sorted(p.name for p in (ws / ".cache").iterdir())
    says = _not_ours(ws / ".cache", how)
    again = execute(load_recipe(recipe), RunOptions(workspace=ws))
    assert not again.report.stages[1].cached and ran(marker) == 2
    assert any(n.startswith("stage cache not used: cache folder") and says in n for n in again.report.stages[1].notes)
    assert sorted(p.name for p in (ws / ".cache").iterdir()) == before


def test_the_helper_itself(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    os.chmod(f, 0o644)
    assert trusted(f, "test")                        # readable by others is fine: only writing is refused
    os.chmod(f, 0o646)
    assert not trusted(f, "test") and not trusted(tmp_path / "missing", "test")
    (tmp_path / "l").symlink_to(f)
    assert not trusted(tmp_path / "l", "test")
    with pytest.raises(NotPrivate, match="not a folder"):
        private_folder(f)
    d = tmp_path / "a" / "b"
    assert private_folder(d) == d and _mode(d) == _mode(d.parent) == 0o700
