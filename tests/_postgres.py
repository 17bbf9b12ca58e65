"""A real PostgreSQL server for the tests (and benchmarks/tune_workers.py), from the installed binaries: `initdb`
into a temporary folder, `pg_ctl start` on 127.0.0.1 and a free port (its unix socket in that folder), password
authentication (SCRAM) for every connection, stopped and removed afterwards.

initdb and postgres refuse to run as root: as root they run as the `postgres` user (runuser), which Debian's
`postgresql` package creates. What is missing is said by `why_not()`; the tests skip with that line.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

USER, PASSWORD = "optkit", "pg-Secret-4f9c"  # the server's superuser; a password no output may show
START_S = 30  # pg_ctl waits at most this long for the server to accept connections


def bindir() -> Path | None:
    """The folder of initdb / pg_ctl / postgres: on PATH, else Debian's /usr/lib/postgresql/N/bin (newest)."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                      key=lambda p: int(p.split("/")[-3]) if p.split("/")[-3].isdigit() else 0)
    return Path(versions[-1]).parent if versions else None


def _runner() -> list[str] | None:
    """The command prefix that runs the server's binaries: none as a user, runuser -u postgres as root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return None
    runuser = shutil.which("runuser")
    return [runuser, "-u", "postgres", "--"] if runuser else None


def why_not() -> str | None:
    """Why no server can be started here (None: it can)."""
    try:
        import psycopg  # noqa: F401 - the driver optkit's storage uses (SQLAlchemy's default for postgresql://)
    except ImportError:
        return "the PostgreSQL driver psycopg is not installed: pip install 'optkit[tune-db]'"
    if bindir() is None:
        return ("the PostgreSQL server (initdb, pg_ctl) is not installed: apt-get install postgresql, or put its "
                "bin folder on PATH")
    if _runner() is None:
        return "running as root without a 'postgres' user and runuser: initdb refuses root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """One server: `start()`, `stop()` (and start again: the same data, port and URL), `close()` removes it."""

    def __init__(self):
        self.bin, self.prefix = bindir(), _runner()
        # in /tmp: the postgres user must reach it (a root's TMPDIR may be closed to it), and a unix socket's
        # path must stay under 108 bytes
        self.folder = Path(tempfile.mkdtemp(prefix="optkit-pg-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.data, self.log = self.folder / "data", self.folder / "server.log"
        self.port = free_port()
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.folder, pw.pw_uid, pw.pw_gid)
        os.chmod(self.folder, 0o700)
        pwfile = self.folder / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        try:
            self._run("initdb", "-D", self.data, "-U", USER, f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E",
                      "UTF8", "--locale=C.UTF-8", "--no-sync", timeout=120)
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        pwfile.unlink()

    def _run(self, tool: str, *args, timeout: float = 60) -> subprocess.CompletedProcess:
        p = subprocess.run([*self.prefix, str(self.bin / tool), *map(str, args)], capture_output=True, text=True,
                           timeout=timeout, cwd=self.folder)
        if p.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(map(str, args))}: exit {p.returncode}: {p.stderr.strip()}\n{log}")
        return p

    def start(self) -> None:
        """Start the server and wait (at most START_S) until it accepts connections; a port taken meanwhile by
        another program is changed for a free one."""
        for attempt in range(3):
            try:
                self._run("pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", START_S, "-o",
                          f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off "
                          "-c full_page_writes=off -c synchronous_commit=off -c max_connections=60", "start",
                          timeout=START_S + 15)
                return
            except RuntimeError:
                if attempt == 2 or "could not bind" not in (self.log.read_text() if self.log.exists() else ""):
                    raise
                self.port = free_port()

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", 30, "stop", timeout=45)

    def close(self) -> None:
        """Stop the server whatever state it is in, and remove its folder."""
        try:
            self.stop("immediate")
        except Exception:  # noqa: BLE001 - the server is gone anyway: kill what its pid file names
            pid_file = self.data / "postmaster.pid"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text().split()[0]), 9)
                    time.sleep(0.5)
                except (OSError, ValueError):
                    pass
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, database: str = "postgres", password: str | None = PASSWORD, user: str = USER) -> str:
        auth = f"{user}:{password}" if password is not None else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
