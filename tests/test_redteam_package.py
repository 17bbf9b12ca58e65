"""Issue 29, red team (red-1): the package repository and its registry attacked again with variations of the
reproducers. Each case runs the real CLI: exit 2, one error line without a traceback, nothing written, inputs
unchanged, no password shown or stored.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import SAMPLES, one_error_line, run_cli

# issue 29: every command here leaves HOME and TMPDIR as it found them
pytestmark = pytest.mark.usefixtures("fresh_home_and_tmp")

CNN = "cnn.onnx"
SECRET = "Sekr1tPW"


def snapshot(folder: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        out[key] = ("link", os.readlink(p)) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return out


def refused(work: Path, *args, names: tuple[str, ...] = ()) -> str:
    before = snapshot(work)
    r = run_cli(*args, cwd=work, timeout=120)
    line = one_error_line(r)
    assert r.rc == 2, (args, r.rc, r.err)
    assert "internal error" not in line and len(line) < 400, line
    for name in names:
        assert name in line, (args, name, line)
    assert SECRET not in r.out + r.err
    assert snapshot(work) == before, f"{args} changed the folder"
    return line


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The sample CNN, a Triton repository of it (versions 1 and 2) and an MLflow one (version 1)."""
    root = tmp_path_factory.mktemp("base")
    shutil.copyfile(SAMPLES / "torch_cnn.onnx", root / CNN)
    for tag in ("v1", "v2"):
        r = run_cli("package", CNN, "--to", "triton", "-o", "repo", "--name", "cnn", "--tag", tag, cwd=root)
        assert r.rc == 0, r.err
    r = run_cli("package", CNN, "--to", "mlflow", "-o", "mrepo", "--name", "cnn", cwd=root)
    assert r.rc == 0, r.err
    return root


@pytest.fixture
def work(base, tmp_path) -> Path:
    shutil.copytree(base, tmp_path / "w", symlinks=True)
    return tmp_path / "w"


# ------------------------------------------------------------------ odd --version / --tag / -o values

@pytest.mark.parametrize("value", ["1" * 5000, "0" * 5000 + "1" * 11], ids=["5000-digits", "zeros-then-11-digits"])
def test_a_version_of_thousands_of_digits_is_refused(work, value):
    """int() refuses a string of over 4,300 digits: was an internal error (exit 3) echoing the whole value."""
    refused(work, "package", CNN, "--to", "triton", "-o", "repo", "--name", "cnn", "--version", value,
            names=("--version",))
    refused(work, "package", "serve-version", "repo/cnn", "--version", value, names=("--version",))


def test_leading_zeros_name_the_same_version(work):
    r = run_cli("package", "serve-version", "repo/cnn", "--version", "0" * 5000 + "1", cwd=work)
    assert r.rc == 0, r.err
    assert json.loads((work / "repo" / "cnn" / "optkit-versions.json").read_text())["served"] == 1


@pytest.mark.parametrize("tag", [" v1", "a" * 5000, "v\n1"], ids=["space", "huge", "newline"])
def test_serve_version_checks_the_tag_it_is_given(work, tag):
    refused(work, "package", "serve-version", "repo/cnn", "--tag", tag, names=("--tag",))


def test_an_output_under_a_file_is_named_as_such(work):
    refused(work, "package", CNN, "--to", "triton", "-o", "cnn.onnx/repo", names=("is not a folder",))


def test_a_linked_repository_is_named_by_serve_version(work):
    (work / "repo").rename(work / "real")
    (work / "repo").symlink_to("real")
    line = refused(work, "package", "serve-version", "repo/cnn", "--version", "1", names=("symbolic link",))
    assert "-o" not in line


# ------------------------------------------------------------------ --storage-uri goes into every manifest

@pytest.mark.parametrize("uri, says", [
    (f"s3://AKIAKEY:{SECRET}@bucket/models", "carries a credential"),
    (f"https://bob:{SECRET}@store.example/x", "carries a credential"),
    (f"pvc://claim/p?password={SECRET}", "carries a credential"),
    ("s3://bob@bucket/models", "carries a credential"),
    (f"gs://bucket/p?X-Goog-Signature={SECRET}", "no query"),
    ("s3://bucket/p\nkind: Secret", "no query, fragment or space"),
    ("bucket/models", "SCHEME://"),
], ids=["password", "https-password", "password-arg", "user", "signed-url", "newline", "no-scheme"])
def test_a_storage_uri_with_a_secret_or_a_query_is_refused(work, uri, says):
    refused(work, "package", CNN, "--to", "triton", "-o", "new", "--manifests", "kserve,seldon",
            "--storage-uri", uri, names=("--storage-uri", says))


# ------------------------------------------------------------------ --registry on a user's database

def _sqlite(path: Path, *statements: str) -> Path:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("statements", [
    ["CREATE TABLE tags (key TEXT, value TEXT)", "INSERT INTO tags VALUES ('k', 'v')"],
    ["CREATE TABLE alembic_version (version_num TEXT)", "INSERT INTO alembic_version VALUES ('myapp001')",
     "CREATE TABLE tags (key TEXT, value TEXT)"],
    ["CREATE TABLE alembic_version (version_num TEXT)", "INSERT INTO alembic_version VALUES ('myapp001')"],
], ids=["mlflow-table-name-subset-columns", "other-apps-alembic", "alembic-alone"])
@pytest.mark.parametrize("url", ["sqlite:///user.db", "sqlite:///user.db?timeout=5", "sqlite:///link.db",
                                 "sqlite:///file:user.db?mode=rw&uri=true"],
                         ids=["plain", "query", "link", "uri"])
def test_a_users_database_with_mlflow_named_tables_is_refused(work, statements, url):
    """A table bearing an MLflow table's name with fewer columns passed as an older MLflow registry: MLflow then
    added its 30-odd tables to the user's database (and failed, exit 3, after writing the version)."""
    _sqlite(work / "user.db", *statements)
    (work / "link.db").symlink_to("user.db")
    refused(work, "package", CNN, "--to", "mlflow", "-o", "m", "--registry", url,
            names=("is not an MLflow registry",))


@pytest.mark.parametrize("registry", ["userdir", "file://{work}/userdir", "user.db"])
def test_a_file_store_registry_is_refused_before_anything_is_written(work, registry):
    """MLflow refuses its file store (maintenance mode): was exit 3 after the version was written."""
    (work / "userdir").mkdir()
    (work / "userdir" / "notes.txt").write_text("mine")
    refused(work, "package", CNN, "--to", "mlflow", "-o", "m", "--registry", registry.format(work=work),
            names=("MLflow's file store",))
    refused(work, "package", "serve-version", "mrepo/cnn", "--version", "1", "--registry",
            registry.format(work=work), names=("MLflow's file store",))


# ------------------------------------------------------------------ secrets in hand-edited package files

def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_an_index_holding_a_registry_password_is_refused(work):
    _edit(work / "mrepo" / "cnn" / "optkit-versions.json", lambda d: d["versions"][0].update(registry={
        "uri": f"postgresql://u:{SECRET}@h/db", "version": "1", "alias": "served"}))
    for command in (("package", "inspect", "mrepo", "--json"), ("inspect", "mrepo/cnn"),
                    ("package", CNN, "--to", "mlflow", "-o", "mrepo", "--name", "cnn")):
        refused(work, *command, names=("optkit-versions.json", "registry"))


def test_package_inspect_json_shows_no_password_from_a_lineage(work):
    def change(d):
        d["notes"].append(f"see http://a:{SECRET}@x/")
        d["source"]["path"] = f"postgresql://u:{SECRET}@h/db"
    _edit(work / "mrepo" / "cnn" / "1" / "optkit-package.json", change)
    for command in (("package", "inspect", "mrepo", "--json"), ("inspect", "mrepo/cnn/1", "--json"),
                    ("package", "inspect", "mrepo")):
        r = run_cli(*command, cwd=work)
        assert r.rc == 0, r.err
        assert SECRET not in r.out + r.err, command


# ------------------------------------------------------------------ serve-version serves only what optkit wrote

@pytest.mark.parametrize("model, damage, says", [
    ("repo/cnn", lambda v: (v / "model.onnx").write_bytes(b"garbage"), "was edited"),
    ("repo/cnn", lambda v: (v / "model.onnx").unlink(), "is missing"),
    ("repo/cnn", lambda v: (v / "optkit-report.json").write_bytes(b"\xff{}"), "was edited"),
    ("mrepo/cnn", lambda v: (v / "MLmodel").write_text("flavors: {}\n"), "was edited"),
    ("mrepo/cnn", lambda v: (v / "model.onnx").write_bytes(b"\x00" * 10), "was edited"),
], ids=["triton-garbage-model", "triton-missing-model", "triton-report", "mlflow-MLmodel", "mlflow-model"])
def test_serve_version_refuses_a_damaged_version(work, model, damage, says):
    damage(work / model / "1")
    refused(work, "package", "serve-version", model, "--version", "1", names=(says,))


def test_serve_version_serves_an_intact_version(work):
    for model in ("repo/cnn", "mrepo/cnn"):
        r = run_cli("package", "serve-version", model, "--version", "1", cwd=work)
        assert r.rc == 0, r.err


# ------------------------------------------------------------------ best.json, edited

def _best(work: Path, change) -> None:
    from optkit.core.artifact import Artifact

    sha = Artifact.load(str(work / CNN)).sha256
    best = {"setting": {"provider": "cpu", "threads": 1, "batch": 8, "concurrency": 2, "sessions": "per-thread"},
            "label": "t", "figures": {"throughput_per_s": 900.0, "memory_mb": 120.0}, "trial": 0,
            "confirmed": {"figure": "throughput_per_s", "mean": 900.0, "ci95": [880.0, 920.0], "rounds": 3}}
    change(best)
    (work / "best.json").write_text(json.dumps({"model": CNN, "model_sha256": sha, "objective": ["throughput"],
                                                "best": best}))


@pytest.mark.parametrize("change, key", [
    (lambda b: b["confirmed"].update(ci95=[1e308, -1e308]), "best.confirmed"),
    (lambda b: b["confirmed"].update(rounds=10 ** 30), "best.confirmed.rounds"),
    (lambda b: b["confirmed"].update(figure="p50\n\x1b[31m"), "best.confirmed.figure"),
    (lambda b: b.update(label="x\n\x1b[31mred"), "best.label"),
    (lambda b: b.update(label="a" * 100_000), "best.label"),
], ids=["band-inverted", "rounds-huge", "figure-control", "label-control", "label-huge"])
def test_hand_edited_best_json_variations_are_refused(work, change, key):
    _best(work, change)
    refused(work, "package", CNN, "--to", "triton", "-o", "new", "--tuned", "best.json",
            names=("best.json", key))


def test_the_best_json_tune_writes_is_packaged(work):
    _best(work, lambda b: None)
    r = run_cli("package", CNN, "--to", "triton", "-o", "new", "--tuned", "best.json", cwd=work)
    assert r.rc == 0, r.err
    assert hashlib.sha256((work / "new" / "cnn" / "1" / "model.onnx").read_bytes()).hexdigest() == \
        hashlib.sha256((work / CNN).read_bytes()).hexdigest()
