"""Where a study is kept: an Optuna storage (`open_storage`): an SQLite file (by default optkit's own beside the
output: `default_study_path`, `stage_study_path`), a database server (PostgreSQL, MySQL) or a journal file. An
existing file or database is used only when it is empty or exactly an Optuna study's (`check_storage_file`,
`check_server_schema`); a server that does not accept connections yet is tried again (`connection_retries`); a
database gets Optuna's heartbeat (workers.HEARTBEAT_S, GRACE_S)."""
from __future__ import annotations

import json
import logging
import math
import os
import re
import sqlite3
import time
import urllib.parse
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optkit.core import dburl
from optkit.core.dburl import DRIVERS, is_sqlite
from optkit.core.errors import DependencyError, UsageError
from optkit.core.text import first_line, redact_url
from optkit.passes.tune import workers
from optkit.passes.tune.config import storage_file

log = logging.getLogger(__name__)

STUDY_SUFFIX = ".optkit-study.db"  # the default study file beside -o: a name no user file has
CONNECT_TIMEOUT_S = 5  # one connection try to a database server (its driver's connect_timeout)
# what a database server says while it is down, starting, stopping or full: worth trying again
_TRANSIENT = re.compile(r"refused|timeout expired|timed out|starting up|shutting down|not yet accepting|recovery mode|"
                        r"too many (clients|connections)|remaining connection slots|could not receive data|"
                        r"server closed the connection|connection reset|no route to host|temporarily unavailable|"
                        r"could not connect|can't connect|lost connection|consuming input failed|"
                        r"terminating connection", re.I)


def default_study_path(output: Path) -> Path:
    """The default study file beside `-o`: best.json -> best.optkit-study.db (a name of optkit's own)."""
    return output.with_name(output.stem + STUDY_SUFFIX)


def stage_study_path(ctx) -> Path:
    """The default study of a tune.onnx stage: in a recipe's run folder beside the stage's folder
    (runs/<recipe>/<run-id>/NN-<stage>.optkit-study.db, where a run stopped mid-tune resumes it), for run_pass
    beside its output (OUT.optkit-study.db, as optkit tune keeps it); never in the user's cache. The runner
    names that place as the context's `aside` (where a refused result is kept: NN-<stage>.REJECTED.onnx)."""
    if ctx.aside is None:
        return default_study_path(Path(ctx.output))
    aside = Path(ctx.aside)
    return aside.with_name(aside.stem.removesuffix(".REJECTED") + STUDY_SUFFIX)


def sqlite_url(path: Path) -> str:
    """The sqlite:/// URL that SQLAlchemy resolves to exactly `path` (a '?' or '%' in a folder's name escaped,
    else the URL would name another file)."""
    path = Path(path).absolute()
    url = "sqlite:///" + str(path).replace("%", "%25").replace("?", "%3F")
    if storage_file(url) != path:
        raise UsageError(f"the tune study file {path} cannot be named in an SQLite URL; give another -o or "
                         "storage (--storage)")
    return url


db_message = dburl.db_message


def _optuna_schema() -> dict[str, set[str] | None]:
    """Optuna's tables and their columns (None: the columns are not known)."""
    try:
        from optuna.storages._rdb.models import BaseModel

        schema: dict[str, set[str] | None] = {name: {c.name for c in t.columns}
                                               for name, t in BaseModel.metadata.tables.items()}
    except Exception:  # noqa: BLE001 - a moved private module: Optuna 5's tables, columns unchecked
        schema = dict.fromkeys(("studies", "study_directions", "study_system_attributes", "study_user_attributes",
                                "trial_heartbeats", "trial_intermediate_values", "trial_params",
                                "trial_system_attributes", "trial_user_attributes", "trial_values", "trials",
                                "version_info"))
    return schema | {"alembic_version": {"version_num"}}


def _schema_problem(tables: set[str], others: set[str], columns: Callable[[str], set[str]]) -> str | None:
    """None when a database (its tables, its views and triggers, a table's columns) is empty or exactly an
    Optuna study's (every table of Optuna's, with its columns, and nothing else); else what it holds instead."""
    if not tables and not others:
        return None
    schema = _optuna_schema()
    problem = dburl.foreign(tables, others, columns, schema, "Optuna", "an Optuna study")
    if problem:
        return problem
    missing = sorted(set(schema) - tables)
    if missing:  # PARTIAL: perhaps another worker is creating the study's tables right now
        return (f"holds only some of an Optuna study's tables ({dburl.shown(sorted(tables))}; "
                f"no {dburl.shown(missing)}), not a whole study{PARTIAL}")
    return None


PARTIAL = "\0"  # marks a schema problem another worker creating the tables explains for a moment
SCHEMA_WAIT_S = 3.0  # how long a partial Optuna schema is given to become whole


def _settled(read: Callable[[], str | None]) -> str | None:
    """A schema problem that stays: a partial Optuna schema (tables with Optuna's columns, some missing) is read
    again for up to SCHEMA_WAIT_S, as a worker starting beside this one may be creating it."""
    end = time.monotonic() + SCHEMA_WAIT_S
    while True:
        problem = read()
        if not problem or not problem.endswith(PARTIAL):
            return problem
        if time.monotonic() >= end:
            return problem[:-len(PARTIAL)]
        time.sleep(0.25)


def _sqlite_schema_problem(con: sqlite3.Connection) -> str | None:
    objects = con.execute("SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view', 'trigger') "
                          "AND name NOT LIKE 'sqlite_%'").fetchall()
    return _schema_problem({n for t, n in objects if t == "table"}, {n for t, n in objects if t != "table"},
                           lambda name: {row[1] for row in con.execute(f'PRAGMA table_info("{name}")')})


def check_server_schema(url: str, wait: float | None = None) -> bool:
    """Before Optuna creates its tables in a database server's database: it is empty or exactly an Optuna
    study's, as an SQLite file must be (its default schema; read only). True when it holds Optuna's tables."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, **engine_kwargs(url, wait))
    seen: set[str] = set()

    def read() -> str | None:
        tables, views, columns = dburl.read_schema(engine)
        seen.clear()
        seen.update(tables)
        return _schema_problem(tables, views, columns)

    try:
        problem = _settled(read)
    finally:
        engine.dispose()
    if problem:
        raise UsageError(f"database {redact(url)} {problem}; optkit does not write into it: give another "
                         "storage (--storage), a database of its own")
    return "studies" in seen


def check_storage_file(url: str) -> None:
    """Before any work: an existing SQLite file (however its URL names it) is used only when it is empty or
    exactly an Optuna study's database. optkit never adds its tables to someone's own database."""
    if not is_sqlite(url):
        return
    path = storage_file(url)
    if path is None:
        return
    hint = ("give another -o or storage (--storage)" if path.name.endswith(STUDY_SUFFIX)
            else "give another storage (--storage)")
    if not dburl.has_sqlite_data(path, "the tune study file", hint):
        return

    def read() -> str | None:
        con = sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro", uri=True)
        try:
            return _sqlite_schema_problem(con)
        finally:
            con.close()

    try:
        problem = _settled(read)
    except sqlite3.Error as e:
        raise UsageError(f"cannot read the tune study file {path}: {first_line(e)}") from None
    if problem:
        raise UsageError(f"{path} {problem}; optkit does not write into it: {hint}")


def open_storage(url: str, stale_callback=None, wait: float = 20.0, create: bool = True):
    """An Optuna storage: a database URL (sqlite:///file.db, postgresql://..., mysql://...) or journal:PATH (a
    journal file several processes can share). A database gets Optuna's heartbeat (workers.HEARTBEAT_S, GRACE_S):
    `stale_callback(study, trial)` hears of each trial failed because its worker went silent. A database server
    that does not accept a connection yet is tried again for up to `wait` seconds (connection_retries). Without
    `create`, a server database that holds no Optuna tables is a UsageError (a reader writes nothing there)."""
    import optuna

    try:
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend

            path = url[len("journal:"):]
            if not path or not Path(path).parent.is_dir():
                raise UsageError(f"journal storage {url!r}: the folder of {path or '(no path)'} does not exist")
            if os.path.exists(path) and not Path(path).is_file():  # a FIFO blocked Optuna's read for ever
                raise UsageError(f"journal storage {path} exists and is not a regular file; give another storage "
                                 "(--storage)")
            try:
                return optuna.storages.JournalStorage(JournalFileBackend(path))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise UsageError(f"{path} is not an Optuna journal file") from None
        if "://" not in url:
            raise UsageError(f"cannot read storage {url!r}: give a database URL (sqlite:///tune.db, "
                             "postgresql://user@host/db) or journal:PATH")
        if is_sqlite(url):  # an SQLite file was checked before any work
            return _rdb(url, stale_callback)

        def connect():
            if not check_server_schema(url, wait) and not create:
                raise UsageError(f"no study in tune storage {redact(url)}: the database holds none (no Optuna "
                                 "tables); start a study there with optkit tune --storage")
            return _rdb(url, stale_callback, wait=wait)

        return connection_retries(url, connect, wait)
    except (UsageError, DependencyError):
        raise
    except ImportError as e:  # a missing database driver (optuna wraps sqlalchemy's ModuleNotFoundError)
        missing = getattr(e.__cause__, "name", None) or getattr(e, "name", None)
        package = DRIVERS.get(missing or "", missing)
        raise DependencyError(f"storage {url.split(':')[0]} needs its database driver"
                              + (f": pip install {package}" if package else f" ({first_line(e)[:120]})")) from None
    except Exception as e:  # noqa: BLE001 - sqlalchemy and drivers raise many kinds: the user's URL is wrong
        raise UsageError(f"cannot open tune storage {redact(url)}: {db_message(e)}") from None


def _rdb(url: str, stale_callback=None, attempts: int = 10, wait: float | None = None):
    """An RDB storage; workers starting together race to create its tables, so a clash is retried."""
    import optuna
    import sqlalchemy.exc

    def make():
        with warnings.catch_warnings():  # the heartbeat is "experimental" (there since Optuna 2.5)
            warnings.simplefilter("ignore")
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True, **engine_kwargs(url, wait)},
                                              heartbeat_interval=workers.HEARTBEAT_S,
                                              grace_period=workers.GRACE_S,
                                              heartbeat_stale_trial_callback=stale_callback)

    for i in range(attempts - 1):
        try:
            return make()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.ProgrammingError) as e:
            # SQLite: "locked", "UNIQUE"; PostgreSQL: "relation ... already exists" (ProgrammingError),
            # "duplicate key value" on its catalog (IntegrityError)
            if not any(w in str(e) for w in ("locked", "UNIQUE", "already exists", "duplicate key")):
                raise
            time.sleep(0.2 * (i + 1))
    return make()


def engine_kwargs(url: str, wait: float | None = None) -> dict[str, Any]:
    """A database server's connection bounded in time: its driver's connect_timeout (CONNECT_TIMEOUT_S) unless the
    URL sets one. A server that accepts TCP and never answers would otherwise hold a worker forever."""
    scheme = url.split(":", 1)[0].lower()
    if not scheme.startswith(("postgresql", "postgres", "mysql", "mariadb")) or "connect_timeout" in url:
        return {}
    timeout = CONNECT_TIMEOUT_S if wait is None else max(2, min(CONNECT_TIMEOUT_S, math.ceil(wait)))
    return {"connect_args": {"connect_timeout": timeout}}


def transient(e: BaseException) -> bool:
    """A database error that says the server is not there (yet): refused, timed out, starting or stopping, full.
    A wrong password, a missing database or role is not: trying again changes nothing."""
    import sqlalchemy.exc

    if not isinstance(e, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, ConnectionError,
                          TimeoutError)):
        return False
    text = str(getattr(e, "orig", None) or e)
    if re.search(r"password|authentication|does not exist|permission denied|access denied|no pg_hba", text, re.I):
        return False
    return bool(_TRANSIENT.search(text))


def connection_retries(url: str, connect: Callable[[], Any], wait: float):
    """`connect()` tried again while the server does not accept connections, with back-off (0.5 s doubling to
    4 s), for at most `wait` seconds (each try bounded by its connect_timeout); then a UsageError that states the
    limit, the tries and the server's last word."""
    start, tries, pause = time.monotonic(), 0, 0.5
    while True:
        tries += 1
        try:
            return connect()
        except Exception as e:  # noqa: BLE001 - sorted below: only a server that is not there is tried again
            if not transient(e):
                raise
            left = wait - (time.monotonic() - start)
            if left <= 0:
                raise UsageError(f"tune storage {redact(url)} did not accept a connection within {wait:g} s "
                                 f"({tries} tr{'ies' if tries > 1 else 'y'}, the last: {db_message(e)}); start the "
                                 "database server, or give storage_wait (--storage-wait) more seconds") from None
            log.info("tune storage %s: %s; trying again (%.0f s left)", redact(url), db_message(e), left)
            time.sleep(min(pause, left))
            pause = min(2 * pause, 4.0)


def side_files(path: Path) -> list[Path]:
    """A study file and the files SQLite (or a journal's lock) keeps beside it."""
    return [path, *(path.with_name(path.name + s) for s in ("-journal", "-wal", "-shm", ".lock"))]


def redact(url: str) -> str:
    """A storage URL fit to show: its password masked (core.text.redact_url)."""
    return redact_url(url)


def database_error(e: BaseException) -> BaseException | None:
    """The database's error under an Optuna storage error (SQLAlchemy's, or its driver's), following the chain
    (Optuna wraps a failed commit in its StorageInternalError); None when the error is not the database's."""
    try:
        import sqlalchemy.exc
    except ImportError:
        return None
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                          sqlalchemy.exc.DisconnectionError)) or (
                isinstance(e, sqlalchemy.exc.DBAPIError) and getattr(e, "connection_invalidated", False)):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None
