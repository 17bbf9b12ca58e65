"""`optkit tune` workers sharing one study on a real PostgreSQL server (tests/_postgres.py starts one on 127.0.0.1
from the installed binaries, with password authentication, and removes it afterwards).

Each worker is its own `optkit tune` process. Where a test needs workers "on several hosts", each gets a host
name of its own (optkit.passes.tune.workers._host patched before main), so that a worker killed with SIGKILL is found
by its heartbeat, as on another machine, not by its process id; the heartbeat is 1 s and its grace 3 s there
(5 s and 30 s in use) to keep the test short. Everything else is the CLI as users run it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from _postgres import PASSWORD

from conftest import ROOT, SAMPLES

pytest.importorskip("optuna")

CNN = str(SAMPLES / "torch_cnn.onnx")
FAST = ["--trial-seconds", "0.15", "--confirm", "0"]
SMALL = ["--space", "threads=1,2", "--space", "batch=1,8", "--space", "graph_optimization=basic,all",
         "--space", "cpu_mem_arena=true", "--space", "mem_pattern=true"]


@pytest.fixture(scope="module")
def pg(postgres):
    postgres.create_database("tune")  # one database, a study per test (a database each costs seconds)
    return postgres


def _prelude(host: str | None = None, heartbeat: bool = False, machine: str | None = None) -> str:
    lines = ["import optkit.passes.tune.workers as _t"]  # who a worker is, its machine, its heartbeat
    if host:
        lines.append(f"_t._host = lambda: {host + '/boot'!r}")
    if heartbeat:
        lines.append("_t.HEARTBEAT_S, _t.GRACE_S = 1, 3")
    if machine:
        lines.append(f"_t.machine_kind = lambda: {{'arch': 'x86_64', 'cpu': {machine!r}, 'cores': 64}}")
    return "\n".join(lines)


STARTED: list[subprocess.Popen] = []  # workers this module started: none outlives its test


@pytest.fixture(autouse=True)
def _no_worker_left():
    yield
    while STARTED:
        p = STARTED.pop()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


def _start(args, cwd, prelude: str = "") -> subprocess.Popen:
    """One worker: the CLI in a process (and session) of its own."""
    code = f"import sys\n{prelude}\nsys.argv = ['optkit', *sys.argv[1:]]\nfrom optkit.cli.main import main\nmain()\n"
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
                         start_new_session=True)
    STARTED.append(p)
    return p


def _run(args, cwd=ROOT, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def _tune(url: str, study: str, trials: int, *extra) -> list[str]:
    return ["tune", CNN, "--trials", str(trials), *FAST, *SMALL, "--storage", url, "--study", study, *extra]


def _trials(url: str, study: str):
    """The study's trials (not the bookkeeping ones), read through a storage closed again at once: the tests poll
    this, and connections left to the garbage collector would fill the server's slots."""
    import optuna

    storage = optuna.storages.RDBStorage(url)
    try:
        return [t for t in optuna.load_study(study_name=study, storage=storage).get_trials()
                if not t.user_attrs.get("skipped")]
    finally:
        storage.engine.dispose()


def _finished(trials) -> list:
    return [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]


def _measured_once(finished) -> None:
    measured = [json.dumps(t.user_attrs["setting"], sort_keys=True) for t in finished
                if "duplicate_of" not in t.user_attrs]
    assert len(measured) == len(set(measured)), measured  # a setting is measured by one worker only


def _line(text: str, start: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.startswith(start))


def _one_error(p, rc: int, word: str) -> str:
    lines = [line for line in p.stderr.strip().splitlines() if line.strip()]
    assert p.returncode == rc, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and lines and lines[-1].startswith("error: "), p.stderr[-2000:]
    assert sum(line.startswith("error") for line in lines) == 1 and word in lines[-1], p.stderr
    assert PASSWORD not in p.stdout + p.stderr
    return lines[-1]


# ------------------------------------------------------------------ several workers, one study

@pytest.fixture(scope="module")
def three_workers(pg, tmp_path_factory):
    """Three workers ("host-a", "host-b", "host-c"), started separately on one study of 9 trials."""
    work = tmp_path_factory.mktemp("three")
    url = pg.url("tune")
    t0 = time.monotonic()
    # --confirm 2: the best two measured again, once for the study (by one worker), so all name the same best
    procs = [_start([*_tune(url, "shared", 9), "--confirm", "2", "-o", f"w{i}.json"], work,
                    _prelude(host=f"host-{c}")) for i, c in enumerate("abc")]
    outs = [p.communicate(timeout=300) for p in procs]
    wall = time.monotonic() - t0
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return {"url": url, "outs": [o for o, _ in outs], "wall": wall, "work": work}


def test_three_workers_run_exactly_the_trials_once_and_agree(three_workers):
    trials = _trials(three_workers["url"], "shared")
    finished = _finished(trials)
    assert len(finished) == 9 and not [t for t in trials if t.state.name == "RUNNING"]
    _measured_once(finished)
    hosts = {t.user_attrs["worker"]["host"].split("/")[0] for t in finished}
    assert len(hosts) >= 2, hosts  # the trials were shared out
    bests = {_line(out, "best:") for out in three_workers["outs"]}
    assert len(bests) == 1, bests  # every worker names the same best setting, with the same interval
    assert "measured again" in bests.pop()
    assert sum("the best settings were measured again by host-" in out for out in three_workers["outs"]) == 2
    per = _line(three_workers["outs"][0], "trials per worker:")
    assert sum(int(part.rsplit(":", 1)[1]) for part in per.split(": ", 1)[1].split(", ")) == 9, per
    best = json.loads((three_workers["work"] / "w0.json").read_text())
    assert best["study"]["trials"] == 9 and sum(best["study"]["workers"].values()) == 9
    assert PASSWORD not in json.dumps(best) and "***" in best["study"]["storage"]
    print(f"\n3 workers, 9 trials: {per}; wall {three_workers['wall']:.1f} s")


def test_the_report_reads_the_study_from_any_machine(three_workers):
    r = _run(["tune", "--storage", three_workers["url"], "--study", "shared", "--report"])
    assert r.returncode == 0, r.stderr
    label = _line(three_workers["outs"][0], "best:").split(";")[0]  # best: LABEL; measured again: ...
    assert _line(r.stdout, "best:").startswith(label + " (") and "measured again by host-" in r.stdout, r.stdout
    assert "9 trials finished" in r.stdout and "host-a pid" in r.stdout + " ".join(three_workers["outs"])
    assert PASSWORD not in r.stdout + r.stderr
    j = _run(["tune", "--report", "--storage", three_workers["url"], "--study", "shared", "--json"])
    assert j.returncode == 0, j.stderr
    got = json.loads(j.stdout)
    assert got["trials"] == 9 and sum(got["workers"].values()) == 9 and got["best"]["label"]
    assert got["machine"]["cores"] >= 1 and PASSWORD not in j.stdout
    r = _run(["tune", "--storage", three_workers["url"], "--study", "nosuch", "--report"])
    assert "no study 'nosuch'" in _one_error(r, 2, "shared")


def test_a_worker_on_another_kind_of_machine_is_refused(three_workers, tmp_path):
    """The study's identity holds the machine kind (CPU model, cores, architecture): a worker on another kind
    does not add its figures to the study; it names the two kinds."""
    p = _start([*_tune(three_workers["url"], "shared", 9), "-o", "x.json"], tmp_path,
               _prelude(machine="Some Other CPU"))
    out, err = p.communicate(timeout=120)
    line = _one_error(subprocess.CompletedProcess(p.args, p.returncode, out, err), 2, "another kind of machine")
    assert "Some Other CPU" in line and "its own study" in line
    assert not (tmp_path / "x.json").exists()


def test_a_worker_killed_mid_trial_is_failed_by_its_heartbeat(pg, tmp_path):
    url = pg.url("tune")
    args = ["tune", CNN, "--trials", "7", "--trial-seconds", "0.5", "--confirm", "0", *SMALL,
            "--storage", url, "--study", "killed"]
    # worker a starts alone and is killed in its first trial; b and c start after (started together, b and c
    # once ran all seven trials before a's first was seen running, and a ended with none)
    victim = _start([*args, "-o", "wa.json"], tmp_path, _prelude(host="host-a", heartbeat=True))

    def running_on_a():
        try:
            return any(t.state.name == "RUNNING" and t.user_attrs.get("worker", {}).get("host") == "host-a/boot"
                       and "setting" in t.user_attrs for t in _trials(url, "killed"))
        except Exception:  # noqa: BLE001 - the study is not there yet
            return False

    end = time.monotonic() + 90
    while not running_on_a():
        assert time.monotonic() < end and victim.poll() is None, "worker a never ran a trial"
        time.sleep(0.1)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    procs = [_start([*args, "-o", f"w{c}.json"], tmp_path, _prelude(host=f"host-{c}", heartbeat=True)) for c in "bc"]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        outs.append(out)
    trials = _trials(url, "killed")
    finished, failed = _finished(trials), [t for t in trials if t.state.name == "FAIL"]
    assert len(finished) == 7, [(t.number, t.state.name) for t in trials]  # the lost trial was run again
    _measured_once(finished)
    assert len(failed) == 1 and failed[0].user_attrs["worker"]["host"] == "host-a/boot"
    assert "failed" not in failed[0].user_attrs  # failed by Optuna's heartbeat check, not by a process id
    assert len({_line(o, "best:") for o in outs}) == 1
    assert any("stale trial left running by a stopped worker" in o for o in outs)


# ------------------------------------------------------------------ connection faults

def test_the_server_stopped_mid_study_then_the_study_resumes(pg, tmp_path):
    url = pg.url("tune")
    args = [*_tune(url, "stopped", 6), "--trial-seconds", "0.4"]
    procs = [_start([*args, "-o", f"w{i}.json"], tmp_path) for i in range(2)]

    def mid_study():
        try:
            states = [t.state.name for t in _trials(url, "stopped")]
        except Exception:  # noqa: BLE001 - not there yet
            return False
        return states.count("COMPLETE") >= 2 and "RUNNING" in states

    end = time.monotonic() + 90
    while not mid_study():
        assert time.monotonic() < end and all(p.poll() is None for p in procs), "no trial ran"
        time.sleep(0.1)
    pg.stop("fast")
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)
            line = _one_error(subprocess.CompletedProcess(p.args, p.returncode, out, err), 2, "lost the tune storage")
            assert "run the same command to resume" in line and "***" in line
    finally:
        pg.start()
    r = _run([*args, "-o", "again.json", "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trials = _trials(url, "stopped")
    finished = _finished(trials)
    assert len(finished) == 6, [(t.number, t.state.name) for t in trials]  # nothing counted twice
    _measured_once(finished)
    assert not [t for t in trials if t.state.name == "RUNNING"]
    assert "already done (resumed)" in " ".join(json.loads(r.stdout)["stages"][-1]["notes"])


def test_a_wrong_password_is_exit_2_and_never_printed(pg, tmp_path):
    wrong = "Wr0ng-Pa55-x7"
    r = _run([*_tune(pg.url("postgres", password=wrong), "s", 2), "-o", "b.json"], cwd=tmp_path)
    line = _one_error(r, 2, "password authentication failed")
    assert wrong not in r.stdout + r.stderr and "***" in line
    assert not list(tmp_path.iterdir())


def test_a_database_that_does_not_exist_is_exit_2_naming_it(pg, tmp_path):
    r = _run([*_tune(pg.url("no_such_db"), "s", 2), "-o", "b.json"], cwd=tmp_path)
    assert 'database "no_such_db" does not exist' in _one_error(r, 2, "no_such_db")


def test_a_server_that_never_answers_is_given_up_at_the_stated_limit(tmp_path):
    """A port that accepts TCP and never speaks: each try ends at its connect timeout, the whole at --storage-wait."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        t0 = time.monotonic()
        r = _run(["tune", CNN, "--trials", "2", *FAST, "--storage", f"postgresql://u:{PASSWORD}@127.0.0.1:"
                  f"{s.getsockname()[1]}/db", "--storage-wait", "3", "-o", "b.json"], cwd=tmp_path, timeout=60)
        took = time.monotonic() - t0
    line = _one_error(r, 2, "did not accept a connection within 3 s")
    assert "--storage-wait" in line and took < 15, (took, line)


def test_a_server_slow_to_start_is_waited_for(pg, tmp_path):
    url = pg.url("tune")
    pg.stop("fast")
    try:
        p = _start([*_tune(url, "late", 2), "--storage-wait", "40", "-o", "b.json"], tmp_path)
        time.sleep(3)
    finally:
        pg.start()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    assert len(_finished(_trials(url, "late"))) == 2


# ------------------------------------------------------------------ the parts

@pytest.mark.parametrize("url, shown", [
    ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:pw@h:5432/db?sslmode=require", "postgresql://u:***@h:5432/db?sslmode=require"),
    ("postgresql://u@h/db?password=pw&x=1", "postgresql://u@h/db?password=***&x=1"),
    ("postgresql+psycopg://u:a:b/c@h/db", "postgresql+psycopg://u:***@h/db"),
    ("postgresql://h/db", "postgresql://h/db"),
])
def test_storage_urls_are_shown_without_their_password(url, shown):
    from optkit.passes.tune import _redact

    assert _redact(url) == shown


def test_a_stage_config_is_reported_without_a_storage_password():
    """A recipe's tune stage names its storage in its config: the report and the logs show it masked."""
    from optkit.core.text import redact_config

    cfg = {"storage": f"postgresql://optkit:{PASSWORD}@db:5432/tune", "space": {"threads": [1, 2]},
           "slo": ["p99<=20ms"], "study": "s", "trials": 4}
    shown = redact_config(cfg)
    assert PASSWORD not in json.dumps(shown) and shown["storage"] == "postgresql://optkit:***@db:5432/tune"
    assert {k: v for k, v in shown.items() if k != "storage"} == {k: v for k, v in cfg.items() if k != "storage"}


def test_the_report_on_an_empty_database_writes_nothing_there(pg):
    """--report reads: on a database with no study it says so, and leaves no Optuna table behind."""
    import sqlalchemy

    url = pg.create_database("empty_report")
    r = _run(["tune", "--storage", url, "--study", "s", "--report"])
    assert "no study in tune storage" in _one_error(r, 2, "holds none")
    engine = sqlalchemy.create_engine(url)
    try:
        assert sqlalchemy.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
