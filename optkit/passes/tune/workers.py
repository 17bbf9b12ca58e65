"""The workers of a study: who this one is (`this_worker`: host, boot, pid), what machine it measures on
(`machine_kind`, part of a study's identity), whether a trial's worker still lives (`worker_alive`), and the
heartbeat a running trial keeps (`Heartbeat`). Other modules read these through the module (`workers.X`), so a
test can patch one name here."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from optkit.core import interrupts
from optkit.core.text import first_line
from optkit.passes.tune.space import cores

log = logging.getLogger(__name__)

HEARTBEAT_S, GRACE_S = 5, 30  # a running trial's heartbeat; a trial silent for longer has lost its worker


def _host() -> str:
    """This machine: its name and boot (a pid means nothing on another machine or after a reboot)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def machine_kind() -> dict[str, Any]:
    """What a trial's figures depend on besides the setting: the CPU (its model), how many cores this process may
    use, the architecture. Part of a study's identity: figures measured on different kinds are never mixed."""
    import platform

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"arch": platform.machine(), "cpu": cpu or platform.processor(), "cores": cores()}


def kind_label(kind: Any) -> str:
    if not isinstance(kind, dict):
        return "an unknown machine (a study made before optkit recorded the machine)"
    return f"{kind.get('cpu') or '?'}, {kind.get('cores')} cores, {kind.get('arch')}"


def worker_label(worker: Any) -> str:
    """A worker as people read it: its host name and process id."""
    if not isinstance(worker, dict):
        return "(no worker)"
    return f"{str(worker.get('host', '?')).split('/')[0]} pid {worker.get('pid', '?')}"


def this_worker() -> dict[str, Any]:
    import psutil

    return {"host": _host(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def worker_alive(worker: Any) -> bool | None:
    """Whether the process that runs a trial is still there: True or False on this machine, None elsewhere."""
    import psutil

    if not isinstance(worker, dict) or worker.get("host") != _host():
        return None
    try:
        p = psutil.Process(int(worker["pid"]))
        return abs(p.create_time() - float(worker["started"])) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


class Heartbeat:
    """While a trial runs, tell the storage every HEARTBEAT_S seconds that its worker lives: Optuna's heartbeat
    on a database, a `heartbeat` user attribute in a journal (which has none)."""

    def __init__(self, storage, trial_id: int):
        self.storage, self.trial_id, self.stop = storage, trial_id, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="optkit-tune-heartbeat")

    def beat(self) -> None:
        try:
            if hasattr(self.storage, "record_heartbeat") and self.storage.get_heartbeat_interval():
                self.storage.record_heartbeat(self.trial_id)
            else:
                self.storage.set_trial_user_attr(self.trial_id, "heartbeat", time.time())
        except Exception as e:  # noqa: BLE001 - a missed beat is not worth stopping a tune for
            log.debug("tune heartbeat: %s", first_line(e))

    def _loop(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            self.beat()

    def __enter__(self):
        with interrupts.deferred():  # never half a write
            self.beat()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def is_this_process(worker: Any) -> bool:
    """Whether a trial's recorded worker is this process."""
    return isinstance(worker, dict) and (worker.get("pid"), worker.get("host")) == (os.getpid(), _host())


def workers_of(trials: list) -> dict[str, int]:
    """Finished trials per worker (host name and pid), most first: who ran the study's trials."""
    counts: dict[str, int] = {}
    for t in trials:
        label = worker_label(t.user_attrs.get("worker"))
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
