"""Issue 29, the registry and its secrets: `package --to mlflow --registry` on someone's own database is refused
before anything is written (MLflow adds 30-odd tables to any database), a wrong password is one line at once, and
no password is printed or written anywhere (stdout, stderr, the package's files, the version index). The URL
redaction every printer uses (core.text.redact_url) is checked on every form a password takes.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path

import pytest
from _postgres import PASSWORD, free_port

from conftest import SAMPLES, no_result_files, one_error_line, run_cli

# issue 29: every command here leaves HOME and TMPDIR as it found them
pytestmark = pytest.mark.usefixtures("fresh_home_and_tmp")

CNN = SAMPLES / "torch_cnn.onnx"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _package(cwd: Path, registry: str, *args, model: Path = CNN):
    return run_cli("package", model, "--to", "mlflow", "-o", cwd / "m", "--registry", registry, *args, cwd=cwd,
                   timeout=180)


def _sqlite(path: Path, *statements: str) -> Path:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()
    return path


# ------------------------------------------------------------------ a user's SQLite database

@pytest.mark.parametrize("statements, says", [
    (["CREATE TABLE customers (id INTEGER, name TEXT)", "INSERT INTO customers VALUES (1, 'ann')"],
     "is a database with tables of its own (customers), not an MLflow registry"),
    (["CREATE TABLE runs (id INTEGER, payload TEXT)"], "has a table 'runs' whose columns are not MLflow's"),
    (["CREATE TABLE alembic_version (version_num TEXT)", "CREATE VIEW v AS SELECT 1"],
     "tables of its own (v)"),
])
def test_a_users_sqlite_database_is_refused_before_anything_is_written(tmp_path, statements, says):
    db = _sqlite(tmp_path / "userapp.db", *statements)
    before = _sha(db)
    r = _package(tmp_path, "sqlite:///userapp.db")
    line = one_error_line(r)
    assert r.rc == 2 and says in line and str(db) in line, r.err
    assert _sha(db) == before
    assert no_result_files(tmp_path) == ["userapp.db"]  # no package version either: checked before building


@pytest.mark.parametrize("make, says", [
    (lambda p: p.write_text("name,email\nann,a@b\n"), "is not an SQLite database"),
    (lambda p: p.mkdir(), "exists and is not a regular file"),
])
def test_a_registry_path_that_is_no_sqlite_file_is_refused(tmp_path, make, says):
    make(tmp_path / "reg.db")
    r = _package(tmp_path, f"sqlite:///{tmp_path}/reg.db")
    assert r.rc == 2 and says in one_error_line(r), r.err
    assert not (tmp_path / "m").exists()


def test_a_new_sqlite_registry_is_not_created_when_packaging_fails(tmp_path):
    """The check reads only: a registry file that does not exist yet is made by MLflow after the package is
    written, so a failed command leaves none (nor the folder MLflow would have made)."""
    r = _package(tmp_path, "sqlite:///new.db", model=tmp_path / "missing.onnx")
    assert r.rc == 2 and "does not exist" in one_error_line(r), r.err
    r = _package(tmp_path, "sqlite:///sub/new.db")
    assert r.rc == 2 and f"the folder {tmp_path / 'sub'} does not exist" in one_error_line(r), r.err
    assert no_result_files(tmp_path) == [] and not (tmp_path / "sub").exists()


def test_an_mlflow_server_that_does_not_answer_is_refused_before_anything_is_written(tmp_path):
    """Was exit 3 after the version was on disk; now the server is asked first (any answer will do)."""
    r = _package(tmp_path, f"http://alice:S3cret@127.0.0.1:{free_port()}/")
    assert r.rc == 2 and "cannot reach the registry http://alice:***@" in one_error_line(r), r.err
    assert "S3cret" not in r.out + r.err and not (tmp_path / "m").exists()


@pytest.mark.slow
def test_an_empty_file_and_mlflows_own_database_are_used(tmp_path):
    (tmp_path / "reg.db").write_bytes(b"")
    for expected in ("1", "2"):  # an empty file, then the MLflow database the first run made
        r = _package(tmp_path, "sqlite:///reg.db")
        assert r.rc == 0, r.err
        assert f"registered in sqlite:///reg.db as torch_cnn version {expected}" in " ".join(r.out.split())
    assert r.err.strip() == ""  # neither MLflow's nor alembic's log lines
    con = sqlite3.connect(tmp_path / "reg.db")
    assert con.execute("SELECT count(*) FROM model_versions").fetchone() == (2,)
    con.close()


# ------------------------------------------------------------------ a PostgreSQL server

@pytest.fixture(scope="module")
def pg(postgres):
    return postgres


def _tables(url: str) -> list[str]:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        return sorted(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _no_password(r, *texts: str, password: str = PASSWORD) -> None:
    for text in (r.out, r.err, *texts):
        assert password not in text, text


def test_a_users_postgresql_database_is_refused_and_keeps_its_tables(pg, tmp_path):
    import psycopg

    url = pg.create_database("userapp")
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE TABLE customers (id integer)")
    r = _package(tmp_path, url)
    line = one_error_line(r)
    assert r.rc == 2 and "tables of its own (customers), not an MLflow registry" in line, r.err
    assert f"postgresql://optkit:***@127.0.0.1:{pg.port}/userapp" in line
    _no_password(r)
    assert _tables(url) == ["customers"] and no_result_files(tmp_path) == []


def test_a_wrong_password_is_one_line_at_once(pg, tmp_path):
    wrong = "Wrong-pw-7d1e"
    start = time.monotonic()
    r = _package(tmp_path, pg.url(password=wrong))
    took = time.monotonic() - start
    line = one_error_line(r)
    assert r.rc == 2 and "password authentication failed" in line and "optkit:***@" in line, r.err
    assert len([x for x in r.err.splitlines() if x.strip()]) == 1
    _no_password(r, password=wrong)
    assert took < 30 and no_result_files(tmp_path) == []  # MLflow alone retries for 100 s, then exit 3


def test_no_server_and_no_database_are_one_line_at_once(pg, tmp_path):
    for url, says in ((f"postgresql://optkit:{PASSWORD}@127.0.0.1:{free_port()}/x", "cannot open the registry"),
                      (pg.url("nosuch"), 'database "nosuch" does not exist')):
        start = time.monotonic()
        r = _package(tmp_path, url)
        assert r.rc == 2 and says in one_error_line(r), r.err
        assert time.monotonic() - start < 30
        _no_password(r)
    assert no_result_files(tmp_path) == []


@pytest.mark.slow
def test_the_password_is_nowhere_after_registering_and_serving(pg, tmp_path):
    url = pg.create_database("registry")
    r = _package(tmp_path, url, "--json")
    assert r.rc == 0, r.err
    shown = f"postgresql://optkit:***@127.0.0.1:{pg.port}/registry"
    assert shown in r.out
    index = json.loads((tmp_path / "m" / "torch_cnn" / "optkit-versions.json").read_text())
    assert index["versions"][0]["registry"] == {"uri": shown, "version": "1", "alias": "served"}
    s = run_cli("package", "serve-version", tmp_path / "m" / "torch_cnn", "--version", "1", "--registry", url,
                cwd=tmp_path)
    assert s.rc == 0 and f"registry {shown}: alias served -> version 1" in s.out, s.err
    _no_password(r)
    _no_password(s)
    for f in (tmp_path / "m").rglob("*"):
        if f.is_file():
            assert PASSWORD.encode() not in f.read_bytes(), f
    assert {"registered_models", "model_versions", "alembic_version"} <= set(_tables(url))


# ------------------------------------------------------------------ redaction

@pytest.mark.parametrize("text, shown", [
    ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
    ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),                 # '@' in the password
    ("postgresql+psycopg://u:a:b/c@h/db", "postgresql+psycopg://u:***@h/db"),  # ':' and '/' in it
    ("postgresql://u:p%40ss%2F@h/db", "postgresql://u:***@h/db"),             # percent-encoded
    ("postgresql://u@h/db", "postgresql://u@h/db"),                           # a user alone stays
    ("postgresql://u@h/db?password=pw&sslmode=require", "postgresql://u@h/db?password=***&sslmode=require"),
    ("mysql://u@h/db?PASSWORD=pw", "mysql://u@h/db?PASSWORD=***"),
    ("http://alice:PW@host:8000/v2/models/m", "http://alice:***@host:8000/v2/models/m"),
    ("https://h/v2/models/m?token=abc&x=1", "https://h/v2/models/m?token=***&x=1"),
    ("a postgresql://u:x1@h/db and mysql://v:y2@h2/db, http://w@h3/x",
     "a postgresql://u:***@h/db and mysql://v:***@h2/db, http://w@h3/x"),  # several URLs in one text
    ("registry 'postgresql://u:pw@h/db' refused", "registry 'postgresql://u:***@h/db' refused"),
    ("next=postgresql%3A%2F%2Fu%3Asecret%40h%2Fdb", "next=postgresql%3A%2F%2Fu%3A***%40h%2Fdb"),
    ("invalid dsn: host=h password=secret dbname=x", "invalid dsn: host=h password=*** dbname=x"),
    ("{'host': 'h', 'password': 'se cret'}", "{'host': 'h', 'password': '***'}"),
    ("http://127.0.0.1:8000/v2/models/m", "http://127.0.0.1:8000/v2/models/m"),
    ("sqlite:////tmp/a@b/reg.db", "sqlite:////tmp/a@b/reg.db"),
    ("no url at all: a@b c:d", "no url at all: a@b c:d"),
])
def test_every_form_of_a_password_is_masked(text, shown):
    from optkit.core.text import redact_url

    assert redact_url(text) == shown


def test_library_messages_lose_the_password_of_the_url_given():
    """SQLAlchemy, psycopg and MLflow put the URL (or only its password) into their messages."""
    import sqlalchemy.exc

    from optkit.core.dburl import db_message
    from optkit.core.text import redact, redact_config
    from optkit.package.registry import _refused

    url = "postgresql://u:p%40ss-9Z@h/db"
    e = sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception(f"could not connect to {url.replace('%40', '@')}"))
    assert "p@ss-9Z" not in db_message(e) and "u:***@h/db" in db_message(e)
    assert redact("auth for p@ss-9Z failed", url) == "auth for *** failed"
    assert "ss-9Z" not in _refused(url, RuntimeError(f"store {url} said: password p@ss-9Z rejected\nmore"))
    cfg = redact_config({"url": "http://a:b-secret@h/v2/models/m", "token": "t0k", "runs": [1, 2]})
    assert cfg == {"url": "http://a:***@h/v2/models/m", "token": "***", "runs": [1, 2]}
