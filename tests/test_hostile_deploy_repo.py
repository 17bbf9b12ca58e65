"""Hostile input, round 4 (issue 29), the package repository on disk: every file optkit reads back (the version
index, a version's lineage, best.json, the report's figures, a version's config.pbtxt) goes through one schema
and is user input: exit 2, one line naming the file and the key, nothing changed. Packagers and serve-version
running at once keep every version; a killed packager blocks nobody. Each case runs the real CLI.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLES, one_error_line, run_cli

# issue 29: every command here leaves HOME and TMPDIR as it found them
pytestmark = pytest.mark.usefixtures("fresh_home_and_tmp")

CNN = "cnn.onnx"


def snapshot(folder: Path) -> dict[str, object]:
    """Every entry under `folder`: a file's bytes, a link's target, a folder's name."""
    out: dict[str, object] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        out[key] = ("link", os.readlink(p)) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return out


def refused(work: Path, *args, names: tuple[str, ...]) -> str:
    """The command exits 2 with one line naming each of `names`, and leaves `work` as it was."""
    before = snapshot(work)
    r = run_cli(*args, cwd=work, timeout=120)
    line = one_error_line(r)
    assert r.rc == 2, (args, r.rc, r.err)
    for name in names:
        assert name in line, (args, name, line)
    assert "internal error" not in line
    assert snapshot(work) == before, f"{args} changed the folder"
    return line


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A folder with the sample CNN and a Triton repository of it: versions 1 (tag v1) and 2 (served)."""
    root = tmp_path_factory.mktemp("base")
    shutil.copyfile(SAMPLES / "torch_cnn.onnx", root / CNN)
    for tag in ("v1", "v2"):
        r = run_cli("package", CNN, "--to", "triton", "-o", "repo", "--name", "cnn", "--tag", tag, cwd=root)
        assert r.rc == 0, r.err
    return root


@pytest.fixture
def work(base, tmp_path) -> Path:
    shutil.copytree(base, tmp_path / "w", symlinks=True)
    return tmp_path / "w"


def sha(path: Path) -> str:
    from optkit.core.artifact import Artifact

    return Artifact.load(str(path)).sha256


def best_json(work: Path, setting: dict | None = None, figures: dict | None = None, **top) -> Path:
    """best.json as `optkit tune -o` writes it, with `setting`/`figures` keys replaced."""
    s = {"provider": "cpu", "threads": 1, "batch": 8, "concurrency": 2, "sessions": "per-thread",
         "session": {"inter_op_threads": None, "execution_mode": "sequential", "graph_optimization": "all",
                     "cpu_mem_arena": True, "mem_pattern": True}}
    s.update(setting or {})
    f = {"throughput_per_s": 900.0, "p50_ms": 1.0, "memory_mb": 120.0}
    f.update(figures or {})
    doc = {"model": CNN, "model_sha256": sha(work / CNN), "objective": ["throughput"],
           "best": {"setting": s, "label": "t", "figures": f, "trial": 0,
                    "confirmed": {"figure": "throughput_per_s", "mean": 900.0, "ci95": [880.0, 920.0], "rounds": 3}}}
    doc.update(top)
    path = work / "best.json"
    path.write_text(json.dumps(doc))
    return path


# ------------------------------------------------------------------ best.json: the schema matches what tune writes

TUNED_BAD = {
    "concurrency-negative": ({"concurrency": -3}, None, "best.setting.concurrency"),
    "batch-huge": ({"batch": 10 ** 12}, None, "best.setting.batch"),
    "batch-text": ({"batch": "32; x"}, None, "best.setting.batch"),
    "batch-bool": ({"batch": True}, None, "best.setting.batch"),
    "batch-float": ({"batch": 8.0}, None, "best.setting.batch"),
    "provider-unknown": ({"provider": "foo"}, None, "best.setting.provider"),
    "threads-nan": ({"threads": math.nan}, None, "best.setting.threads"),
    "threads-zero": ({"threads": 0}, None, "best.setting.threads"),
    "sessions-unknown": ({"sessions": "all"}, None, "best.setting.sessions"),
    "setting-unknown-key": ({"gpu_memory": 1}, None, "best.setting.gpu_memory"),
    "session-unknown-key": ({"session": {"arena": True}}, None, "best.setting.session.arena"),
    "session-mode": ({"session": {"execution_mode": "fast"}}, None, "best.setting.session.execution_mode"),
    "inter-op-huge": ({"session": {"inter_op_threads": 10 ** 6}}, None, "best.setting.session.inter_op_threads"),
    "memory-negative": (None, {"memory_mb": -50}, "best.figures.memory_mb"),
    "memory-huge": (None, {"memory_mb": 1e300}, "best.figures.memory_mb"),
    "memory-text": (None, {"memory_mb": "lots"}, "best.figures.memory_mb"),
    "figure-infinite": (None, {"p90_ms": math.inf}, "best.figures.p90_ms"),
}


@pytest.mark.parametrize("case", sorted(TUNED_BAD))
def test_hand_edited_best_json_is_refused(work, case):
    setting, figures, key = TUNED_BAD[case]
    best = best_json(work, setting, figures)
    refused(work, "package", CNN, "--to", "triton", "-o", "new", "--tuned", best.name, "--manifests", "kserve",
            names=("best.json", f"key {key}"))
    assert not (work / "new").exists()


@pytest.mark.parametrize("doc,key", [
    ([1, 2], "best.json: Input should be"),
    ({"model": CNN}, "key best: Field required"),
    ({"best": {"setting": [1]}}, "key best.setting"),
    ({"best": {"setting": {}, "figures": []}}, "key best.figures"),
    ({"best": {"setting": {}}, "model_sha256": "abc"}, "key model_sha256"),
], ids=["list", "no-best", "setting-list", "figures-list", "sha-short"])
def test_best_json_of_the_wrong_shape_is_refused(work, doc, key):
    (work / "best.json").write_text(json.dumps(doc))
    refused(work, "package", CNN, "--to", "triton", "-o", "new", "--tuned", "best.json", names=("best.json", key))


def test_best_json_the_user_names_through_a_link_is_read(work):
    """--tuned names a file of the user's: a link to it is as good as the file (a package holds no links)."""
    best_json(work).rename(work / "real.json")
    (work / "best.json").symlink_to("real.json")
    r = run_cli("package", CNN, "--to", "triton", "-o", "new", "--tuned", "best.json", cwd=work)
    assert r.rc == 0, r.err


def test_best_json_that_is_a_fifo_is_refused(work):
    os.mkfifo(work / "best.json")
    refused(work, "package", CNN, "--to", "triton", "-o", "new", "--tuned", "best.json",
            names=("best.json", "not a regular file"))


def test_a_tuned_setting_within_bounds_is_packaged_as_written(work):
    best = best_json(work, {"batch": 16, "concurrency": 3, "provider": "cuda"}, {"memory_mb": 100.0})
    r = run_cli("package", CNN, "--to", "triton", "-o", "new", "--tuned", best.name, "--manifests", "kserve",
                cwd=work)
    assert r.rc == 0, r.err
    config = (work / "new" / "cnn" / "config.pbtxt").read_text()
    assert "max_batch_size: 16" in config and "count: 3 kind: KIND_GPU" in config
    assert "memory: 150Mi" in (work / "new" / "cnn" / "1" / "manifests" / "kserve.yaml").read_text()


# ------------------------------------------------------------------ the report's figures the manifests use

def report_json(work: Path, memory: dict, latency: dict | None = None) -> Path:
    from optkit.report.schema import ArtifactRef, Report, Stage

    ref = ArtifactRef(path=CNN, format="onnx", sha256=sha(work / CNN))
    rep = Report(command="optkit bench", stages=[Stage(name="bench", output=ref, measurements={
        "memory": {"peak_mb": 10.0, "baseline_mb": 5.0}, "latency": {"p50_ms": 1.0}})])
    doc = json.loads(rep.to_json())
    doc["stages"][0]["measurements"]["memory"].update(memory)
    doc["stages"][0]["measurements"]["latency"].update(latency or {})
    path = work / "r.json"
    path.write_text(json.dumps(doc))  # NaN and Infinity as JSON's literals, as some tools write them
    return path


@pytest.mark.parametrize("memory,latency,key", [
    ({"peak_mb": -50}, None, "memory.peak_mb"),
    ({"peak_mb": math.nan}, None, "memory.peak_mb"),
    ({"peak_mb": 1e300}, None, "memory.peak_mb"),
    ({"peak_mb": "big"}, None, "memory.peak_mb"),
    ({"baseline_mb": -1}, None, "memory.baseline_mb"),
    ({}, {"p50_ms": -1.0}, "latency.p50_ms"),
    ({}, {"ci95_pct": math.inf}, "latency.ci95_pct"),
], ids=["peak-negative", "peak-nan", "peak-huge", "peak-text", "baseline-negative", "p50-negative", "ci-inf"])
def test_hand_edited_report_figures_are_refused(work, memory, latency, key):
    rep = report_json(work, memory, latency)
    refused(work, "package", CNN, "--to", "triton", "-o", "new", "--report", rep.name, "--manifests", "kserve",
            names=("r.json", key))  # the report reader or the package schema names it


def test_report_memory_makes_the_request(work):
    rep = report_json(work, {"peak_mb": 100.0, "baseline_mb": 20.0})
    r = run_cli("package", CNN, "--to", "triton", "-o", "new", "--report", rep.name, "--manifests", "kserve",
                cwd=work)
    assert r.rc == 0, r.err
    assert "memory: 180Mi" in (work / "new" / "cnn" / "1" / "manifests" / "kserve.yaml").read_text()


# ------------------------------------------------------------------ the version index and the lineage, edited

def edit_lineage(work: Path, change, version: int = 1) -> None:
    p = work / "repo" / "cnn" / str(version) / "optkit-package.json"
    doc = change(json.loads(p.read_text()))
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))


def _set(path: str, value):
    def change(doc):
        node = doc
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is KeyError:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return doc
    return change


INDEX_BAD = {
    "entry-not-a-mapping": (_set("versions.0", 3), "key versions.0"),
    "no-history": (_set("history", KeyError), "key history"),
    "top-level-list": (lambda d: [d], "optkit-versions.json: Input should be"),
    "version-text": (_set("versions.0.version", "1"), "key versions.0.version"),
    "version-huge": (_set("versions.0.version", 2 ** 40), "key versions.0.version"),
    "version-nan": (lambda d: json.dumps(d).replace('"version": 1,', '"version": NaN,'), "key versions.0.version"),
    "served-unknown": (_set("served", 7), "served: version 7"),
    "target-unknown": (_set("target", "kserve"), "key target"),
    "tag-newline": (_set("versions.0.tag", "v1\n"), "key versions.0.tag"),
    "sha-not-hex": (_set("versions.0.model_sha256", "x" * 64), "key versions.0.model_sha256"),
    "unknown-key": (_set("owner", "me"), "key owner"),
    "duplicate-version": (lambda d: {**d, "versions": [d["versions"][0]] * 2}, "listed twice"),
    "not-utf8": (lambda d: json.dumps(d).replace('"cnn"', '"c\udcffn"'), "optkit-versions.json"),
    "not-json": (lambda d: "{", "not JSON"),
}


def _write_index_bytes(work: Path, change) -> None:
    p = work / "repo" / "cnn" / "optkit-versions.json"
    text = change(json.loads(p.read_text()))
    p.write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else json.dumps(text).encode())


# every command that reads the index: package, serve-version, package inspect, plain inspect
READERS = {
    "package": ("package", CNN, "--to", "triton", "-o", "repo", "--name", "cnn"),
    "serve-version": ("package", "serve-version", "repo/cnn", "--version", "1"),
    "package-inspect": ("package", "inspect", "repo"),
    "inspect": ("inspect", "repo/cnn"),
}


@pytest.mark.parametrize("case", sorted(INDEX_BAD))
def test_hand_edited_index_is_refused_by_every_reader(work, case):
    change, key = INDEX_BAD[case]
    _write_index_bytes(work, change)
    for command in READERS.values():
        refused(work, *command, names=("optkit-versions.json", key))


LINEAGE_BAD = {
    "p50-text": (_set("measured.latency", {"p50_ms": "fast"}), "key measured.latency.p50_ms"),
    "p50-nan": (_set("measured.latency", {"p50_ms": math.nan}), "key measured.latency.p50_ms"),
    "passes-numbers": (_set("passes", [1, 2]), "key passes.0"),
    "top-level-list": (lambda d: [d], "optkit-package.json: Input should be"),
    "no-tuned": (_set("tuned", KeyError), "key tuned"),
    "tuned-batch-negative": (_set("tuned.setting.batch", -1), "key tuned.setting.batch"),
    "files-not-sha": (_set("files", {"config.pbtxt": 5}), "key files.config.pbtxt"),
    "confirmed-one-bound": (_set("tuned.confirmed", {"figure": "p50_ms", "mean": 1.0, "ci95": [1.0]}),
                            "key tuned.confirmed.ci95"),
    "accuracy-infinite": (_set("measured.accuracy", {"top1": math.inf}), "measured.accuracy"),
    "size-negative": (_set("measured.size", {"bytes": -4}), "key measured.size.bytes"),
}


@pytest.mark.parametrize("case", sorted(LINEAGE_BAD))
def test_hand_edited_lineage_is_refused_by_every_reader(work, case):
    change, key = LINEAGE_BAD[case]
    edit_lineage(work, change)
    for command in ("serve-version", "package-inspect", "inspect"):
        refused(work, *READERS[command], names=("optkit-package.json", key))
    refused(work, "inspect", "repo/cnn/1", names=("optkit-package.json", key))


# ------------------------------------------------------------------ serve-version serves only optkit's own config

def test_serve_version_refuses_a_linked_config(work):
    own = work / "repo" / "cnn" / "1" / "config.pbtxt"
    own.unlink()
    own.symlink_to("/etc/hostname")
    refused(work, *READERS["serve-version"], names=("1/config.pbtxt", "symbolic link"))
    refused(work, *READERS["package"], names=("1/config.pbtxt", "symbolic link"))


@pytest.mark.parametrize("where", ["cnn/link", "cnn/1/sub/model.onnx", "cnn/config.pbtxt", "cnn/optkit-versions.json"])
def test_links_anywhere_in_the_repository_are_refused(work, where):
    p = work / "repo" / where
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():  # the real file moved out, a link to it in its place
        real = work / (p.name + ".real")
        p.rename(real)
        p.symlink_to(real)
    else:
        p.symlink_to(work / CNN)
    for command in ("package", "serve-version"):
        refused(work, *READERS[command], names=(Path(where).name,))


@pytest.mark.parametrize("content,why", [
    (b'name: "cnn"\nbackend: "python"\n', "was edited"),
    (b"\xff\xfe garbage", "was edited"),
], ids=["edited", "not-utf8"])
def test_serve_version_refuses_an_edited_config(work, content, why):
    (work / "repo" / "cnn" / "1" / "config.pbtxt").write_bytes(content)
    refused(work, *READERS["serve-version"], names=("1/config.pbtxt", why))


def test_serve_version_refuses_a_config_edited_with_its_lineage(work):
    """Edited config and lineage record together: optkit's own structure is still checked."""
    import hashlib

    own = work / "repo" / "cnn" / "1" / "config.pbtxt"
    own.write_text(own.read_text().replace("versions: [ 1 ]", "versions: [ 2 ]"))
    digest = hashlib.sha256(own.read_bytes()).hexdigest()
    edit_lineage(work, lambda d: {**d, "files": {**d["files"], "config.pbtxt": digest}})
    refused(work, *READERS["serve-version"], names=("1/config.pbtxt", "key version_policy"))


def test_serve_version_rolls_back_with_optkit_own_config(work):
    r = run_cli(*READERS["serve-version"], cwd=work)
    assert r.rc == 0, r.err
    served = (work / "repo" / "cnn" / "config.pbtxt").read_bytes()
    assert served == (work / "repo" / "cnn" / "1" / "config.pbtxt").read_bytes()
    assert json.loads((work / "repo" / "cnn" / "optkit-versions.json").read_text())["served"] == 1


# ------------------------------------------------------------------ names, tags and version numbers

@pytest.mark.parametrize("flags,key", [
    (("--name", "abc\n"), "--name"),
    (("--name", "12"), "--name"),
    (("--tag", "v1\n"), "--tag"),
    (("--version", "²"), "--version"),
    (("--version", "٣"), "--version"),
    (("--version", "2147483648"), "--version"),
    (("--version", "0"), "--version"),
    (("--version", "-1"), "--version"),
], ids=["name-newline", "name-digits", "tag-newline", "version-superscript", "version-arabic", "version-2**31",
        "version-0", "version-negative"])
def test_names_tags_and_versions_are_checked_whole(work, flags, key):
    refused(work, "package", CNN, "--to", "triton", "-o", "new", *flags, names=(key,))


def test_serve_version_takes_ascii_digits_only(work):
    refused(work, "package", "serve-version", "repo/cnn", "--version", "١", names=("--version",))


def test_the_largest_version_is_taken(work):
    r = run_cli("package", CNN, "--to", "triton", "-o", "repo", "--name", "cnn", "--version", "2147483647", cwd=work)
    assert r.rc == 0, r.err
    refused(work, "package", CNN, "--to", "triton", "-o", "repo", "--name", "cnn", names=("2147483647",))


# ------------------------------------------------------------------ packagers at once; a killed one

def _spawn(work: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "optkit", *args], cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _index_versions(model_dir: Path) -> list[int]:
    return [v["version"] for v in json.loads((model_dir / "optkit-versions.json").read_text())["versions"]]


@pytest.mark.parametrize("existing", [False, True], ids=["new-repository", "existing-model"])
def test_concurrent_packagers_keep_every_version(work, existing):
    out = "repo" if existing else "fresh"
    versions = ["10", "20", "auto", "auto"]  # an auto never lands on 10 or 20
    procs = [_spawn(work, "package", CNN, "--to", "triton", "-o", out, "--name", "cnn", "--version", v)
             for v in versions]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _ in results), results
    model_dir = work / out / "cnn"
    kept = _index_versions(model_dir)
    assert len(kept) == (6 if existing else 4) and {10, 20} <= set(kept)
    assert sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir()) == kept
    assert not [p for p in model_dir.parent.rglob(".*tmp-*")] and not list(work.glob(".*tmp-*"))
    # what they left is a repository optkit goes on with
    r = run_cli("package", "serve-version", f"{out}/cnn", "--version", "10", cwd=work)
    assert r.rc == 0, r.err


def test_serve_version_and_packagers_at_once_keep_the_index_whole(work):
    procs = [_spawn(work, *READERS["package"]), _spawn(work, *READERS["serve-version"]),
             _spawn(work, *READERS["package"])]
    assert all(p.wait(timeout=120) == 0 for p in procs), [p.stderr.read() for p in procs]
    assert _index_versions(work / "repo" / "cnn") == [1, 2, 3, 4]
    history = json.loads((work / "repo" / "cnn" / "optkit-versions.json").read_text())["history"]
    assert sorted(h["why"] for h in history[2:]) == ["packaged", "packaged", "serve-version"]


KILLER = """
import os, signal, sys
from optkit.package import repo
def killed(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
repo.commit = killed
from optkit.package.build import package

package(sys.argv[1], target="triton", output=sys.argv[2], name="cnn")
"""


@pytest.mark.parametrize("out", ["repo", "fresh"], ids=["new-version", "new-repository"])
def test_a_killed_packager_blocks_nobody(work, out):
    p = subprocess.run([sys.executable, "-c", KILLER, CNN, out], cwd=work, capture_output=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == -signal.SIGKILL, p.stderr
    left = list(work.glob(".*.tmp-*")) + (list((work / out).rglob(".*.tmp-*")) if (work / out).exists() else [])
    assert left, "the killed packager left its staging folder"
    r = run_cli("package", CNN, "--to", "triton", "-o", out, "--name", "cnn", cwd=work)
    assert r.rc == 0, r.err
    assert not [q for q in left if q.exists()], "the stale staging folder stayed"
    assert _index_versions(work / out / "cnn") == ([1, 2, 3] if out == "repo" else [1])


def test_a_live_packagers_staging_folder_is_left(work):
    from optkit.package.repo import temp_prefix

    live = work / "repo" / "cnn" / (temp_prefix(Path("3")) + "busy")  # this test's own pid: alive
    live.mkdir()
    (live / "model.onnx").write_bytes(b"being written")
    r = run_cli(*READERS["package"], cwd=work)
    assert r.rc == 0, r.err
    assert (live / "model.onnx").read_bytes() == b"being written"


def test_an_older_optkits_staging_folder_is_named(work):
    (work / "repo" / "cnn" / ".2.tmp-abcd1234").mkdir()
    refused(work, *READERS["package"], names=(".2.tmp-abcd1234", "killed"))


def test_a_version_folder_the_index_does_not_list_is_named(work):
    shutil.copytree(work / "repo" / "cnn" / "2", work / "repo" / "cnn" / "7")
    refused(work, *READERS["package"], names=("'7'", "does not list"))


def test_an_edited_served_config_does_not_reach_the_history(work):
    top = work / "repo" / "cnn" / "config.pbtxt"
    top.write_text(top.read_text().replace("versions: [ 2 ]", "versions: [ 99999999999 ]"))
    r = run_cli(*READERS["serve-version"], cwd=work)
    assert r.rc == 0, r.err
    history = json.loads((work / "repo" / "cnn" / "optkit-versions.json").read_text())["history"]
    assert history[-1]["before"] == 2
    r = run_cli("package", "inspect", "repo", cwd=work)
    assert r.rc == 0, r.err


def test_a_linked_lineage_is_refused(work):
    lin = work / "repo" / "cnn" / "1" / "optkit-package.json"
    lin.rename(work / "lineage.json")
    lin.symlink_to(work / "lineage.json")
    for command in ("serve-version", "package-inspect", "inspect"):
        refused(work, *READERS[command], names=("optkit-package.json", "symbolic link"))


def test_serve_version_refuses_a_served_config_that_is_not_text(work):
    (work / "repo" / "cnn" / "config.pbtxt").write_bytes(b"\xff\xfe")
    refused(work, *READERS["serve-version"], names=("cnn/config.pbtxt", "not UTF-8"))
