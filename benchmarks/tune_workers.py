"""`optkit tune` on one shared PostgreSQL study: 1 worker against 3 workers on the same --trials, each worker its own
`optkit tune` process (as on several machines). Prints the wall time of each run and the trials each worker ran.

    .venv/bin/python benchmarks/tune_workers.py              # --trials 12, ~1 minute on 2 cores
    .venv/bin/python benchmarks/tune_workers.py --trials 24 --trial-seconds 0.5

The server is a real PostgreSQL started on 127.0.0.1 from the installed binaries (tests/_postgres.py: initdb
into a temporary folder, removed afterwards). On one machine the workers share its cores: the 3-worker wall time
says what the coordination costs and gains here, not what 3 machines would give (there each worker has its own
cores, and the wall time falls toward a third).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _postgres import Postgres, why_not  # noqa: E402


def run(pg: Postgres, workers: int, trials: int, trial_seconds: float, work: Path) -> tuple[float, dict, int]:
    import optuna

    url = pg.create_database(f"w{workers}")
    cmd = [sys.executable, "-m", "optkit", "tune", str(ROOT / "sample_models" / "torch_cnn.onnx"),
           "--trials", str(trials), "--trial-seconds", str(trial_seconds), "--confirm", "0",
           "--space", "threads=1,2", "--space", "batch=1,8,32", "--space", "graph_optimization=basic,all",
           "--space", "cpu_mem_arena=true", "--space", "mem_pattern=true", "--storage", url, "--study", "bench"]
    t0 = time.monotonic()
    procs = [subprocess.Popen([*cmd, "-o", str(work / f"w{workers}-{i}.json")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
             for i in range(workers)]
    for p in procs:
        _, err = p.communicate(timeout=1800)
        if p.returncode:
            raise SystemExit(f"a worker failed (exit {p.returncode}): {err[-2000:]}")
    wall = time.monotonic() - t0
    pids = {p.pid: f"worker {i + 1}" for i, p in enumerate(procs)}
    per = {name: 0 for name in pids.values()}
    trials_done = optuna.load_study(study_name="bench", storage=url).get_trials()
    measured = 0
    for t in trials_done:
        if t.state.name in ("COMPLETE", "PRUNED") and not t.user_attrs.get("skipped"):
            name = pids.get(t.user_attrs["worker"]["pid"], "?")
            per[name] = per.get(name, 0) + 1
            measured += "duplicate_of" not in t.user_attrs
    return wall, per, measured


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--trial-seconds", type=float, default=0.3)
    args = ap.parse_args()
    missing = why_not()
    if missing:
        raise SystemExit(f"cannot start PostgreSQL here: {missing}")
    pg = Postgres()
    try:
        pg.start()
        with tempfile.TemporaryDirectory() as tmp:
            print(f"--trials {args.trials}, --trial-seconds {args.trial_seconds}, {os.cpu_count()} cores here")
            for n in (1, 3):
                wall, per, measured = run(pg, n, args.trials, args.trial_seconds, Path(tmp))
                print(f"{n} worker{'s' if n > 1 else ' '}: wall {wall:5.1f} s; trials per worker: "
                      + ", ".join(f"{k} {v}" for k, v in per.items())
                      + f" (total {sum(per.values())}, {measured} measured, {sum(per.values()) - measured} reused)")
    finally:
        pg.close()


if __name__ == "__main__":
    main()
