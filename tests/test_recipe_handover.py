"""A recipe's steps hand their results to later steps in memory: `optkit run` of a recipe with tune, split,
capacity and package steps writes no file that the same run then reads back (the tune stage's setting, the split's
plan, CAPACITY.json and the report reach the package entry as objects). Watched through Python's audit hooks: every
file the run commits into place (a rename's destination, or a file inside a folder renamed into place) and every
file it opens afterwards; a model file is the one thing a later stage reads by design (the next stage's input), and
the stage cache's copy of a stage folder is bookkeeping."""
from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

WATCH: dict = {"on": False, "committed": set(), "folders": set(), "read": []}


def _path(p) -> str | None:
    if isinstance(p, int):
        return None
    return os.path.abspath(os.fsdecode(p))


def _hook(event: str, args: tuple) -> None:
    if not WATCH["on"]:
        return
    if event == "os.rename" and args[2] in (None, -1) and args[3] in (None, -1):  # os.rename and os.replace
        dst = _path(args[1])
        (WATCH["folders"] if os.path.isdir(os.fsdecode(args[0])) else WATCH["committed"]).add(dst)
    elif event == "open" and not _in_cache_put():
        path, mode, flags = args
        if isinstance(path, (str, bytes, os.PathLike)) and (
                (mode is not None and not set(str(mode)) & set("wax+")) or (
                mode is None and flags is not None and not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))):
            WATCH["read"].append(_path(path))


def _in_cache_put() -> bool:
    """The stage cache copying a stage's folder (Workspace.cache_put): bookkeeping, not a hand-over."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "cache_put":
            return True
        frame = frame.f_back
    return False


sys.addaudithook(_hook)


def _read_back() -> list[str]:
    """The files read after the run committed them, models aside."""
    out = []
    for p in WATCH["read"]:
        if p is None or p.endswith((".onnx", ".onnx.data")):
            continue
        if p in WATCH["committed"] or any(p.startswith(f + os.sep) for f in WATCH["folders"]):
            out.append(p)
    return out


@pytest.fixture
def watching():
    WATCH.update(on=True, committed=set(), folders=set(), read=[])
    try:
        yield WATCH
    finally:
        WATCH["on"] = False


def test_the_watch_sees_a_file_read_back(tmp_path, watching):
    """The check can fail: a file committed by an atomic write, then read, is caught."""
    from optkit.core.atomic import write_text

    write_text(tmp_path / "CAPACITY.json", "{}")
    (tmp_path / "CAPACITY.json").read_text()
    assert _read_back() == [str(tmp_path / "CAPACITY.json")]


def test_tune_split_capacity_and_package_hand_over_in_memory(preprocessed, tmp_path, watching):
    import optkit

    recipe = {
        "version": 1, "name": "handover", "model": {"path": str(preprocessed)},
        "measure": {"latency": False, "shapes": {"image": [1, 8, 8, 1]}},
        "stages": [
            {"pass": "tune.onnx", "name": "tune",
             "config": {"objective": ["throughput"], "trials": 2, "trial_seconds": 0.2, "confirm": 1,
                        "space": {"batch": [1], "threads": [1], "concurrency": [1]}}},
            {"pass": "split.onnx", "name": "split", "config": {"cut": ["preprocess"], "dims": ["height=8", "width=8"]}},
            {"pass": "capacity.plan", "name": "capacity", "config": {"peak": 50, "output": "CAPACITY.json"}},
        ],
        "package": [{"to": "triton", "output": "repo", "name": "cnn", "stage": "split", "manifests": "kserve"}],
    }
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    report = optkit.run(path, workspace=tmp_path / "runs")
    watching["on"] = False
    assert _read_back() == []
    assert watching["committed"] and watching["folders"]  # the watch saw the run commit its files

    stages = {s.name: s for s in report.stages}
    assert [s.name for s in report.stages] == ["input", "tune", "split", "capacity"]
    assert stages["split"].measurements["split"]["cut"] == "preprocess" and not stages["split"].measured
    assert stages["split"].output.sha256 == stages["tune"].output.sha256  # split passes its model through
    capacity = json.loads((tmp_path / "CAPACITY.json").read_text())
    assert capacity == stages["capacity"].measurements["capacity"]
    assert "stage tune (tune.onnx)" in capacity["per_replica"]["source"]
    assert report.capacity is not None and report.capacity.output == str(tmp_path / "CAPACITY.json")
    lineage = json.loads((tmp_path / "repo" / "cnn" / "1" / "optkit-package.json").read_text())
    assert lineage["tuned"]["source"] == "stage tune (tune.onnx)"
    assert [p["name"] for p in lineage["split"]["parts"]] == ["pre", "core"]
    assert lineage["split"]["model_sha256"] == stages["tune"].output.sha256
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["cnn", "cnn.core", "cnn.pre"]
    kserve = (tmp_path / "repo" / "cnn" / "1" / "manifests" / "kserve.yaml").read_text()
    assert f"maxReplicas: {capacity['replicas']['max']}" in kserve
