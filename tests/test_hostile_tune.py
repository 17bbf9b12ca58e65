"""Hostile and careless use of `optkit tune`: interrupts inside Optuna's bookkeeping, workers killed mid-trial,
a user's own database where the study would go, time budgets a setting cannot meet, and bad bounds. Each case
runs the real CLI on a copy of the sample CNN and asserts the exit code, the one-line message and the file
system afterwards (inputs byte-identical, nothing left behind but what the case expects).
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from test_hostile import snapshot

from conftest import ROOT, Result, one_error_line

pytest.importorskip("optuna")

CNN = "torch_cnn.onnx"
FAST = ["--trial-seconds", "0.15", "--confirm", "0"]
SMALL = ["--space", "threads=1,2", "--space", "batch=1,8", "--space", "graph_optimization=basic,all",
         "--space", "cpu_mem_arena=true", "--space", "mem_pattern=true", "--space", "concurrency=1,2",
         "--space", "runtime=onnxruntime"]
STUDY = "best.optkit-study.db"  # the default study file beside -o best.json
SLOW_CHILD = ("import time\nimport optkit.measure.serving as _sv\n"
              "def _slow(*a, **k):\n    time.sleep(3600)\n_sv._measure = _slow\n")  # no trial comes back


@pytest.fixture
def work(tmp_path, samples):
    (tmp_path / CNN).write_bytes((samples / CNN).read_bytes())
    return tmp_path


def _env():
    return {**os.environ, "COLUMNS": "200"}


def _start(args, cwd, prelude: str = ""):
    """The CLI in a session of its own (a process group to signal), SIGINT at its default as in a terminal.
    `prelude`: Python run before optkit's main (to patch a library for a precise interrupt)."""
    code = f"import sys\n{prelude}\nsys.argv = ['optkit', *sys.argv[1:]]\nfrom optkit.cli.main import main\nmain()\n"
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _run(args, cwd, timeout=120) -> tuple[Result, float]:
    """The CLI as a user runs it, and its wall time."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       env=_env(), timeout=timeout)
    return Result(p.returncode, p.stdout, p.stderr), time.monotonic() - t0


def _trials(db: Path) -> list[tuple[int, str, dict]]:
    """(number, state, user attributes) of every trial in an SQLite study file."""
    con = sqlite3.connect(f"file:{urllib.parse.quote(str(db))}?mode=ro", uri=True, timeout=10)
    try:
        rows = con.execute("SELECT trial_id, number, state FROM trials ORDER BY trial_id").fetchall()
        attrs: dict[int, dict] = {}
        for tid, key, value in con.execute("SELECT trial_id, key, value_json FROM trial_user_attributes"):
            attrs.setdefault(tid, {})[key] = json.loads(value)
    finally:
        con.close()
    return [(n, state, attrs.get(tid, {})) for tid, n, state in rows]


def _states(db: Path) -> list[str]:
    try:
        return [s for _, s, a in _trials(db) if not a.get("skipped")]
    except sqlite3.Error:  # not created yet, or its tables not yet
        return []


def _wait(predicate, proc, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail(f"the command ended too early: {proc.communicate()}")
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("the command never reached the point to interrupt")


def _one_line(err: str, word: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err and lines and lines[-1].startswith("error: "), err
    assert sum(line.startswith("error") for line in lines) == 1 and word in lines[-1], err
    return lines[-1]


# ------------------------------------------------------------------ 3: interrupts

@pytest.mark.parametrize("where, sig, rc, word", [
    ("tell", "SIGTERM", 143, "terminated"),   # inside Optuna's tell: the trial is told whole, then 143
    ("ask", "SIGINT", 130, "interrupted"),    # inside ask: the new trial is marked FAIL, then 130
])
def test_signal_inside_optunas_bookkeeping_exits_cleanly(work, where, sig, rc, word):
    before = snapshot(work)
    prelude = (f"import os, signal, optuna\n_orig = optuna.study.Study.{where}\n_n = []\n"
               f"def _hook(self, *a, **k):\n    _n.append(1)\n"
               f"    if len(_n) == 3:\n        os.kill(os.getpid(), signal.{sig})\n    return _orig(self, *a, **k)\n"
               f"optuna.study.Study.{where} = _hook\n")
    proc = _start(["tune", CNN, "--trials", "8", *FAST, *SMALL, "-o", "best.json"], work, prelude)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == rc, err
    line = _one_line(err, word)
    assert "internal error" not in line and "resume" in line  # two trials are kept to resume from
    trials = _trials(work / STUDY)
    assert "RUNNING" not in [s for _, s, _ in trials]
    failed = [a.get("failed", "") for _, s, a in trials if s == "FAIL"]
    assert (failed == [f"interrupted ({'SIGTERM' if sig == 'SIGTERM' else 'Ctrl-C'})"]) == (where == "ask"), failed
    after = snapshot(work)
    assert {k: v for k, v in after.items() if k != STUDY} == before  # no best.json, inputs untouched


@pytest.mark.parametrize("sig, rc, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_signal_to_the_group_while_measuring_fails_the_trial(work, sig, rc, word):
    before = snapshot(work)
    proc = _start(["tune", CNN, "--trials", "20", "--trial-seconds", "1", "--confirm", "0", *SMALL,
                   "-o", "best.json"], work)
    _wait(lambda: _states(work / STUDY).count("COMPLETE") >= 1 and "RUNNING" in _states(work / STUDY), proc)
    time.sleep(0.5)  # inside the measurement
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == rc, err
    assert "resume" in _one_line(err, word)
    trials = _trials(work / STUDY)
    assert "RUNNING" not in [s for _, s, _ in trials]
    assert [a["failed"] for _, s, a in trials if s == "FAIL"] == \
        [f"interrupted ({'SIGTERM' if sig == signal.SIGTERM else 'Ctrl-C'})"]
    assert {k: v for k, v in snapshot(work).items() if k != STUDY} == before


def test_interrupt_before_any_trial_leaves_no_study_file(work):
    before = snapshot(work)
    proc = _start(["tune", CNN, "--trials", "20", "--trial-seconds", "1", "--confirm", "0", *SMALL,
                   "-o", "best.json"], work)
    _wait(lambda: (work / STUDY).exists(), proc)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "resume" not in _one_line(err, "terminated")
    assert snapshot(work) == before  # the study file it had made is gone: no trial had finished


# ------------------------------------------------------------------ 8: trials of a killed worker

@pytest.mark.parametrize("storage", ["sqlite:///s.db", "journal:s.log"])
def test_a_trial_whose_worker_died_before_naming_itself_is_failed_after_the_grace(tmp_path, monkeypatch, storage):
    """A worker killed between asking for a trial and writing who it is leaves a RUNNING trial with no worker and
    no heartbeat: Optuna never fails it, and later workers would wait for it forever (seen once in CI, a resume
    that hung). It is failed once it is older than the grace period."""
    import optuna

    from optkit.passes import tune
    from optkit.passes.tune import workers

    monkeypatch.chdir(tmp_path)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=tune.open_storage(storage), study_name="s")
    study.ask()  # and nothing more: no worker, no heartbeat, no setting
    stale: list[int] = []
    tune.fail_stale(study, stale)
    assert [t.state.name for t in study.get_trials()] == ["RUNNING"]  # it may still be naming itself
    monkeypatch.setattr(workers, "GRACE_S", 0.0)
    time.sleep(0.05)
    tune.fail_stale(study, stale)
    assert [t.state.name for t in study.get_trials()] == ["FAIL"] and stale == [0]


@pytest.mark.parametrize("storage", [None, "journal:study.log"])
def test_a_resume_fails_the_trials_a_killed_worker_left_running(work, storage):
    args = ["tune", CNN, "--trials", "5", "--trial-seconds", "0.6", "--confirm", "0", *SMALL, "-o", "best.json"]
    if storage:
        args += ["--storage", storage, "--study", "s"]
    proc = _start(args, work)
    if storage:
        import optuna

        journal: list = []  # one storage, read on as the journal grows

        def running():
            try:
                if not journal:
                    journal.append(optuna.storages.JournalStorage(
                        optuna.storages.journal.JournalFileBackend(str(work / "study.log"))))
                st = [t.state.name for t in optuna.load_study(study_name="s", storage=journal[0]).trials]
            except Exception:  # noqa: BLE001 - not there yet
                return False
            return "COMPLETE" in st and "RUNNING" in st
    else:
        def running():
            st = _states(work / STUDY)
            return "COMPLETE" in st and "RUNNING" in st
    _wait(running, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    p, _ = _run([*args, "--json"], work)
    assert p.rc == 0, p.err
    notes = " ".join(json.loads(p.out)["stages"][-1]["notes"])
    assert "1 stale trial left running by a stopped worker marked failed (not counted)" in notes, notes
    best = json.loads((work / "best.json").read_text())
    assert best["study"]["trials"] == 5 and best["study"]["stale"] == 1  # 5 measured, the stale one apart
    # the pid is recorded just after the trial starts: a kill in between leaves the reason without it
    assert [t["reason"] for t in best["failed_trials"]] in (
        [f"left running by a worker that stopped (pid {proc.pid})"], ["left running by a worker that stopped"])
    if not storage:
        assert "RUNNING" not in _states(work / STUDY)
    p, _ = _run(["tune", CNN, "--trials", "5", "--trial-seconds", "0.6", "--confirm", "0", *SMALL,
                 "-o", "best.json", *(["--storage", storage, "--study", "s"] if storage else [])], work)
    assert p.rc == 0 and "5 trials measured" in p.out and "1 failed" in p.out, p.out


# ------------------------------------------------------------------ 6: the study's file

def _user_db(path: Path) -> bytes:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO customers (name) VALUES ('Ada')")
    con.commit()
    con.close()
    return path.read_bytes()


def test_the_default_study_never_touches_a_users_database(work):
    data = _user_db(work / "app.db")
    p, _ = _run(["tune", CNN, "--trials", "2", *FAST, *SMALL, "-o", "app.json"], work)
    assert p.rc == 0, p.err
    assert (work / "app.db").read_bytes() == data
    assert sorted(x.name for x in work.iterdir()) == ["app.db", "app.json", "app.optkit-study.db", CNN]


@pytest.mark.parametrize("case", ["storage-flag", "default-name", "not-sqlite", "folder"])
def test_a_file_that_is_not_an_optuna_study_is_refused_before_any_work(work, case):
    args = ["tune", CNN, "--trials", "2", *FAST, "-o", "app.json"]
    if case == "storage-flag":
        _user_db(work / "app.db")
        args += ["--storage", "sqlite:///app.db"]
        words = "app.db is a database with tables of its own (customers), not an Optuna study"
    elif case == "default-name":
        _user_db(work / "app.optkit-study.db")
        words = "tables of its own (customers)"
    elif case == "not-sqlite":
        (work / "app.optkit-study.db").write_text("my notes\n")
        words = "app.optkit-study.db exists and is not an SQLite database"
    else:
        (work / "app.optkit-study.db").mkdir()
        words = "is not a regular file"
    before = snapshot(work)
    p, wall = _run(args, work)
    assert p.rc == 2, p.err
    line = one_error_line(p)
    assert words in line and ("-o or --storage" in line or "--storage" in line), line
    assert snapshot(work) == before


def test_a_failed_tune_leaves_no_study_file(work):
    """Exit 3 before any trial finished (every setting misses the budget): no empty study file stays."""
    before = snapshot(work)
    p, _ = _run(["tune", CNN, "--trials", "3", "--trial-seconds", "5", "--time-budget", "3s",
                 "--space", "concurrency=64", "--space", "sessions=per-thread", "-o", "best.json"], work)
    assert p.rc == 3, p.err
    line = one_error_line(p)
    assert "no tune trial finished" in line and "time budget" in line, line
    assert snapshot(work) == before


# ------------------------------------------------------------------ 7: the time budget

def test_the_time_budget_bounds_the_whole_tune(work):
    """--time-budget 8s with the default space and 1 s trials: done (with confirmation as far as it fits) in
    the budget plus start-up, loading and writing; generous for a loaded 2-core machine."""
    p, wall = _run(["tune", CNN, "--time-budget", "8s", "-o", "best.json", "--report", "r.json"], work)
    assert p.rc == 0, p.err
    assert wall < 25, wall
    assert "time budget" in p.out
    assert json.loads((work / "best.json").read_text())["study"]["trials"] >= 1


def test_a_setting_that_cannot_finish_in_the_budget_is_stopped_and_marked(work):
    """A setting whose child does not come back within the budget: stopped when the budget runs out and marked
    failed with the reason; the tune ends in time."""
    before = snapshot(work)
    p, wall = _finish(_start(["tune", CNN, "--space", "concurrency=256", "--space", "sessions=per-thread",
                              "--space", "threads=1", "--trials", "3", "--trial-seconds", "0.2", "--time-budget",
                              "8s", "-o", "best.json"], work, SLOW_CHILD))
    assert wall < 30, wall
    assert p.rc == 3, p.err
    line = one_error_line(p)
    assert "stopped at the time budget" in line and "256 in flight" in line, line
    assert snapshot(work) == before


# ------------------------------------------------------------------ 12: small ones

@pytest.mark.parametrize("slo", ["p99 <= 1e400 ms", "throughput >= 1e999"])
def test_a_non_finite_slo_is_refused_saying_slo(work, slo):
    before = snapshot(work)
    p, _ = _run(["tune", CNN, "--slo", slo, "-o", "best.json"], work)
    assert p.rc == 2, p.err
    line = one_error_line(p)
    assert f"SLO {slo!r}: the limit must be a finite positive number" in line and "sLO" not in line, line
    assert snapshot(work) == before


def test_a_recipes_slo_error_keeps_its_capitals():
    from optkit.core.registry import ConfigError, build_config
    from optkit.passes import get_pass

    with pytest.raises(ConfigError) as e:
        build_config(get_pass("tune.onnx"), {"slo": ["p99<=1e400ms"]})
    assert "slo (--slo): SLO 'p99<=1e400ms'" in e.value.message


def test_a_missing_mysql_driver_names_the_pip_package(work):
    pytest.importorskip("sqlalchemy")
    try:
        import MySQLdb  # noqa: F401
        pytest.skip("mysqlclient is installed")
    except ImportError:
        pass
    before = snapshot(work)
    p, _ = _run(["tune", CNN, "--storage", "mysql://u@127.0.0.1:1/db", "-o", "best.json"], work)
    assert p.rc == 4, p.err
    line = one_error_line(p)
    assert "pip install mysqlclient" in line and "MySQLdb" not in line, line
    assert snapshot(work) == before


def test_confirm_1_measures_the_best_again(work):
    p, _ = _run(["tune", CNN, "--trials", "2", "--trial-seconds", "0.15", "--confirm", "1", *SMALL,
                 "-o", "best.json"], work)
    assert p.rc == 0, p.err
    confirmed = json.loads((work / "best.json").read_text())["best"]["confirmed"]
    assert confirmed and confirmed["rounds"] == 3
    usage = subprocess.run([sys.executable, "-m", "optkit", "tune", "--help"], cwd=ROOT, capture_output=True,
                           text=True, env=_env()).stdout
    assert "1: the best only" in " ".join(usage.split())


# ------------------------------------------------------------------ round 2: the study's file, however named

def _finish(proc, timeout=90) -> tuple[Result, float]:
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=timeout)
    return Result(proc.returncode, out, err), time.monotonic() - t0


@pytest.mark.parametrize("url", [
    "sqlite:///file:user.db?mode=rw&uri=true",      # an SQLite URI filename, relative
    "sqlite:///file:./us%65r.db?uri=true&cache=shared",
    "sqlite:///file://localhost{abs}?uri=true",     # a URI with an authority, absolute
    "sqlite+pysqlite:///user.db",
    "sqlite:///user.db?timeout=5",
    "sqlite:///user.db?mode=rw",                    # a query the driver ignores: still user.db
    "sqlite:///{abs}",                              # sqlite:////abs/user.db
    "sqlite:///link.db",                            # a link to it
])
def test_every_sqlite_url_form_of_a_users_database_is_refused(work, url):
    _user_db(work / "user.db")
    (work / "link.db").symlink_to("user.db")
    before = snapshot(work)
    p, _ = _run(["tune", CNN, "--storage", url.replace("{abs}", str(work / "user.db")), "--trials", "2",
                 "--trial-seconds", "0.2", "--confirm", "0", "-o", "q.json"], work)
    assert p.rc == 2, p.err
    line = one_error_line(p)
    assert "is a database with tables of its own (customers), not an Optuna study" in line and \
        "--storage" in line, line
    assert snapshot(work) == before


@pytest.mark.parametrize("url, words", [
    ("sqlite+pysqlcipher:///user.db", "optkit opens SQLite through sqlite:/// (pysqlite) only"),
    ("sqlite:///file://otherhost/user.db?uri=true", "names host 'otherhost'"),
])
def test_an_sqlite_url_that_cannot_be_resolved_is_refused(work, url, words):
    _user_db(work / "user.db")
    before = snapshot(work)
    p, _ = _run(["tune", CNN, "--storage", url, "--trials", "1", *FAST, "-o", "q.json"], work)
    assert p.rc == 2, p.err
    assert words in one_error_line(p)
    assert snapshot(work) == before


def _optuna_db(path: Path) -> None:
    import optuna

    optuna.storages.RDBStorage(f"sqlite:///{path}").engine.dispose()


@pytest.mark.parametrize("case, words", [
    ("studies-and-customers", "tables of its own (customers)"),
    ("own-studies-only", "has a table 'studies' whose columns are not Optuna's"),
    ("optuna-less-one", "no trial_heartbeats"),
    ("optuna-other-columns", "a table 'studies' whose columns are not Optuna's"),
    ("optuna-plus-view", "tables of its own (recent)"),
])
def test_a_database_that_is_not_exactly_an_optuna_study_is_refused_before_any_write(work, case, words):
    db = work / "user.db"
    con = sqlite3.connect(db)
    if case in ("studies-and-customers", "own-studies-only"):
        con.execute("CREATE TABLE studies (id INTEGER PRIMARY KEY, title TEXT)")
        con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        if case == "studies-and-customers":
            con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
        con.commit()
        con.close()
    else:
        con.close()
        _optuna_db(db)
        con = sqlite3.connect(db)
        if case == "optuna-less-one":
            con.execute("DROP TABLE trial_heartbeats")
        elif case == "optuna-other-columns":
            con.execute("ALTER TABLE studies ADD COLUMN owner TEXT")
        else:
            con.execute("CREATE VIEW recent AS SELECT * FROM studies")
        con.commit()
        con.close()
    before = snapshot(work)
    p, _ = _run(["tune", CNN, "--storage", "sqlite:///user.db", "--trials", "2", *FAST, *SMALL, "-o", "q.json"],
                work)
    assert p.rc == 2, p.err
    line = one_error_line(p)
    assert words in line and "optkit does not write into it: give another storage (--storage)" in line, line
    assert "[SQL" not in p.err and "sqlalche" not in p.err.lower()
    assert snapshot(work) == before


def test_a_database_servers_database_gets_the_same_check(work):
    """The check a server's database (postgresql://, mysql://) gets before Optuna creates its tables, run here
    through SQLAlchemy on SQLite files: only an empty database or a whole Optuna study passes."""
    from optkit.core.errors import UsageError
    from optkit.passes.tune import check_server_schema

    _user_db(work / "user.db")
    _optuna_db(work / "optuna.db")
    sqlite3.connect(work / "empty.db").close()
    with pytest.raises(UsageError) as e:
        check_server_schema(f"sqlite:///{work / 'user.db'}")
    assert "tables of its own (customers)" in e.value.message and "give another storage (--storage)" in e.value.message
    check_server_schema(f"sqlite:///{work / 'optuna.db'}")
    check_server_schema(f"sqlite:///{work / 'empty.db'}")


def test_the_default_study_beside_an_output_in_an_odd_folder_is_that_file(work):
    """-o 'a?b%41/best.json': the study is 'a?b%41/best.optkit-study.db', not the file 'a' a URL would name."""
    data = _user_db(work / "a")
    folder = work / "a?b%41"
    folder.mkdir()
    p, _ = _run(["tune", CNN, "--trials", "1", *FAST, *SMALL, "-o", "a?b%41/best.json"], work)
    assert p.rc == 0, p.err
    assert (work / "a").read_bytes() == data
    assert sorted(x.name for x in folder.iterdir()) == ["best.json", STUDY]
    assert _states(folder / STUDY).count("COMPLETE") == 1


def test_a_whole_optuna_study_and_an_empty_file_are_used(work):
    _optuna_db(work / "optuna.db")
    (work / "empty.db").write_bytes(b"")
    for name in ("optuna.db", "empty.db"):
        p, _ = _run(["tune", CNN, "--storage", f"sqlite:///{name}", "--trials", "1", *FAST, *SMALL,
                     "-o", f"{name}.json"], work)
        assert p.rc == 0, p.err
        assert _states(work / name).count("COMPLETE") == 1


@pytest.mark.parametrize("storage, file", [
    ("sqlite:///new.db", "new.db"),
    ("sqlite:///file:new.db?uri=true", "new.db"),
    ("journal:new.log", "new.log"),
    (None, STUDY),
])
def test_a_failed_tune_removes_the_study_file_it_created(work, storage, file):
    """Exit 3 with no finished trial (the budget stops every setting): the study file this run created goes,
    --storage or not; a file that was there before stays."""
    (work / "old.db").write_bytes(b"")  # an empty SQLite file that was there before: kept
    before = snapshot(work)
    args = ["tune", CNN, "--trials", "1", "--trial-seconds", "0.2", "--time-budget", "3s", "--confirm", "0",
            "-o", "n.json"]
    p, _ = _finish(_start([*args, *(["--storage", storage] if storage else [])], work, SLOW_CHILD))
    assert p.rc == 3, p.err
    line = one_error_line(p)
    assert "no tune trial finished" in line and "stopped at the time budget" in line and "kept" not in line, line
    assert snapshot(work) == before
    p, _ = _finish(_start([*args, "--storage", "sqlite:///old.db"], work, SLOW_CHILD))
    assert p.rc == 3, p.err
    assert (work / "old.db").exists() and not (work / "n.json").exists()


def test_ctrl_c_before_any_trial_finished_removes_a_new_storage_file(work):
    before = snapshot(work)
    proc = _start(["tune", CNN, "--storage", "sqlite:///new.db", "--trials", "3", "--trial-seconds", "0.2",
                   "--confirm", "0", "-o", "n.json"], work, SLOW_CHILD)
    _wait(lambda: "RUNNING" in _states(work / "new.db"), proc)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    p, _ = _finish(proc)
    assert p.rc == 130, p.err
    line = _one_line(p.err, "interrupted")
    assert "resume" not in line, line
    assert snapshot(work) == before


@pytest.mark.parametrize("storage", [None, "sqlite:///s.db"])
def test_exit_3_with_trials_kept_says_where_the_study_is(work, storage):
    """Every setting misses the SLO (pruned by its probe): exit 3, and the study with its trials stays, named."""
    before = snapshot(work)
    p, _ = _run(["tune", CNN, "--slo", "throughput>=1e9", "--trials", "2", *FAST, *SMALL, "-o", "best.json",
                 *(["--storage", storage] if storage else [])], work)
    assert p.rc == 3, p.err
    line = one_error_line(p)
    file = work / ("s.db" if storage else STUDY)
    # one count in both halves of the line: the settings measured, a repeat of one not counted again
    assert "no setting met throughput>=1e9 in 2 measured trials" in line, line
    assert f"the study is kept in {file} (2 measured trials; run the same command to resume)" in line, line
    after = snapshot(work)
    assert {k: v for k, v in after.items() if k != file.name} == before and file.name in after


# ------------------------------------------------------------------ round 2: every trial is bounded

def test_without_a_budget_a_trial_is_stopped_at_the_stated_limit(work):
    """No --time-budget: a child that never comes back is stopped after the probe, --trial-seconds and the
    margin (here patched from 30 s to 2 s), marked failed with the reason; the search stops after 3 such."""
    before = snapshot(work)
    prelude = SLOW_CHILD + "import optkit.passes.tune.trial as _trial\n_trial.TRIAL_MARGIN_S = 2.0\n"
    p, wall = _finish(_start(["tune", CNN, "--trials", "2", "--trial-seconds", "0.2", "--confirm", "0",
                              "-o", "b.json"], work, prelude))
    assert p.rc == 3, p.err
    line = one_error_line(p)
    assert "no tune trial finished; the last: trial 2 stopped at the trial limit" in line and \
        "s (probe, trial_seconds (--trial-seconds) and max(30 s, 10 x trial_seconds) for set-up)" in line, line
    assert wall < 40, wall
    assert snapshot(work) == before
    usage = subprocess.run([sys.executable, "-m", "optkit", "tune", "--help"], cwd=ROOT, capture_output=True,
                           text=True, env=_env()).stdout
    assert "max(30 s, 10x these)" in " ".join(usage.split())
    assert "max(30 s, 10x `--trial-seconds`)" in " ".join((ROOT / "docs" / "tune.md").read_text().split())


def test_per_thread_sessions_that_oversubscribe_the_cores_are_left_out(work):
    """256 per-thread sessions of 2 threads each took ~47 s a trial (their pool threads spin on 2 cores): such
    settings are left out unmeasured (not counted), the others measured; the tune ends quickly. (16 sessions here:
    2 threads each already start more pool threads than 2 cores hold, and the measured ones stay cheap.)"""
    p, wall = _run(["tune", CNN, "--space", "concurrency=16", "--space", "sessions=per-thread", "--trials", "3",
                    "--trial-seconds", "0.2", "--confirm", "0", "-o", "b.json", "--json"], work)
    assert p.rc == 0, p.err
    assert wall < 55, wall
    best = json.loads((work / "b.json").read_text())
    assert best["study"]["trials"] == 3 and best["failed_trials"] == []
    stage = json.loads(p.out)["stages"][-1]
    assert all(t["setting"]["threads"] == 1 for t in stage["measurements"]["tune"]["trials"])
    notes = " ".join(stage["notes"])
    if os.cpu_count() == 2:
        assert "left out unmeasured: their sessions start more than 4 onnxruntime pool threads" in notes, notes
    left = [a["left_out"] for _, s, a in _trials(work / "b.optkit-study.db") if "left_out" in a]
    assert all("onnxruntime pool threads, more than" in r for r in left), left


def test_a_space_with_only_oversubscribed_settings_is_refused_up_front(work):
    before = snapshot(work)
    threads = max(2, os.cpu_count() or 1)
    p, _ = _run(["tune", CNN, "--space", "concurrency=256", "--space", "sessions=per-thread",
                 "--space", f"threads={threads}", "-o", "b.json"], work)
    assert p.rc == 2, p.err
    line = one_error_line(p)
    assert "every setting of this space starts more than" in line and "(--space) threads=1" in line, line
    assert snapshot(work) == before
