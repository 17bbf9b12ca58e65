"""Databases a user names for a dependency to write into (a tune study's Optuna storage, an MLflow registry):
the file an SQLite URL really opens, a database library's error as one line, and what a database holds, read
before the dependency creates its tables, so that optkit never adds them to someone's own database."""
from __future__ import annotations

import os
import re
import urllib.parse
import warnings
from collections.abc import Callable
from pathlib import Path

from optkit.core.errors import DependencyError, UsageError
from optkit.core.text import first_line, redact_url

SQLITE_MAGIC = b"SQLite format 3\x00"
# module a database URL needs -> the pip package
DRIVERS = {"MySQLdb": "mysqlclient", "psycopg2": "psycopg2-binary", "pymysql": "PyMySQL",
           "psycopg": "'optkit[tune-db]' (psycopg 3)", "cx_Oracle": "oracledb", "pyodbc": "pyodbc"}


def is_sqlite(url: str) -> bool:
    return url.split(":", 1)[0].strip().lower().startswith("sqlite") if ":" in url else False


def sqlite_file(url: str, what: str) -> Path | None:
    """The file an SQLite URL opens, resolved as SQLAlchemy and SQLite resolve it (relative or absolute, query
    strings, `sqlite+pysqlite://`, URI filenames `file:...?...&uri=true`); None for a database in memory. A URL
    whose file cannot be told is refused (UsageError naming `what`, e.g. "tune storage")."""
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
    except ImportError:
        raise DependencyError(f"an SQLite {what} needs SQLAlchemy: pip install sqlalchemy") from None
    except Exception as e:  # noqa: BLE001 - sqlalchemy's ArgumentError and friends: the URL is malformed
        raise UsageError(f"cannot read {what} {redact_url(url)} ({db_message(e)}); write sqlite:///FILE.db"
                         ) from None
    if u.drivername not in ("sqlite", "sqlite+pysqlite"):
        raise UsageError(f"{what} {redact_url(url)}: optkit opens SQLite through sqlite:/// (pysqlite) only; "
                         "write sqlite:///FILE.db")
    try:
        with warnings.catch_warnings():  # a query argument the driver ignores: SQLAlchemy warns, the file stands
            warnings.simplefilter("ignore")
            args, kwargs = u.get_dialect()().create_connect_args(u)
    except Exception as e:  # noqa: BLE001 - what SQLAlchemy cannot turn into a connection, nothing can
        raise UsageError(f"cannot read {what} {redact_url(url)} ({db_message(e)}); write sqlite:///FILE.db"
                         ) from None
    name = str(args[0]) if args else ""
    if kwargs.get("uri") and name.startswith("file:"):
        return _uri_file(name, url, what)
    return None if name in ("", ":memory:") else Path(name).absolute()


def _uri_file(name: str, url: str, what: str) -> Path | None:
    """The file of an SQLite URI filename (https://sqlite.org/uri.html): file:PATH or file://[localhost]/PATH,
    percent-escapes decoded, the query and fragment apart; None for a database in memory."""
    rest = name[len("file:"):].partition("#")[0]
    path, _, query = rest.partition("?")
    params = {k.lower(): v for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True)}
    if path.startswith("//"):
        host, _, tail = path[2:].partition("/")
        if host not in ("", "localhost"):
            raise UsageError(f"{what} {redact_url(url)}: the SQLite URI names host {host!r}; SQLite opens local "
                             "files only: write sqlite:///FILE.db")
        path = "/" + tail
    path = urllib.parse.unquote(path)
    if params.get("mode", "").lower() == "memory" or params.get("vfs", "").lower() == "memdb" or \
            path in ("", ":memory:"):
        return None
    return Path(path).absolute()


def has_sqlite_data(path: Path, what: str, hint: str) -> bool:
    """Whether the SQLite file at `path` holds a database to read (a missing or empty file holds none, and SQLite
    makes an empty one a database); a path that is no regular file, or not SQLite, is exit 2 (`what`: "the
    registry", "the tune study file"; `hint`: what to do)."""
    if not os.path.lexists(path):
        return False
    if not path.is_file():
        raise UsageError(f"{what} {path} exists and is not a regular file; {hint}")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if head and head != SQLITE_MAGIC:
        raise UsageError(f"{what} {path} exists and is not an SQLite database; {hint}")
    return bool(head)


def db_message(e: BaseException) -> str:
    """A database library's error as one line: the driver's own message, without SQLAlchemy's statement and
    background link, and with no password in it."""
    inner = getattr(e, "orig", None)
    text = first_line(inner) if isinstance(inner, BaseException) else first_line(e)
    text = re.sub(r"^\([\w.]+\)\s*", "", text)
    text = re.split(r"\s*\[SQL:|\s*\(Background on this error", text)[0]
    return redact_url(text.strip()[:200]) or type(e).__name__


def shown(names: list[str]) -> str:
    """A few names, and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def foreign(tables: set[str], others: set[str], columns: Callable[[str], set[str]],
            schema: dict[str, set[str] | None], owner: str, what: str, older: bool = False) -> str | None:
    """What in a database (its tables, its views and triggers, a table's columns) is not `owner`'s `schema`
    (table -> its columns, None: not known): tables of its own, or a table of the owner's name with other columns
    (`older`: a subset of the owner's columns is an older version of the owner's schema, fine). None: nothing."""
    strange = sorted(others | (tables - set(schema)))
    if strange:
        return f"is a database with tables of its own ({shown(strange)}), not {what}"
    for name in sorted(tables):
        expected, found = schema[name], columns(name)
        if expected is not None and not (found == expected or older and found and found <= expected):
            return f"has a table {name!r} whose columns are not {owner}'s, not {what}"
    return None


def read_schema(engine) -> tuple[set[str], set[str], Callable[[str], set[str]]]:
    """(tables, views, columns of a table) of a database, through SQLAlchemy's inspector (reads only)."""
    import sqlalchemy

    inspector = sqlalchemy.inspect(engine)
    tables, views = set(inspector.get_table_names()), set(inspector.get_view_names())
    return tables, views, lambda name: {c["name"] for c in inspector.get_columns(name)}


def sqlite_readonly_engine(path: Path):
    """An SQLAlchemy engine on an existing SQLite file that can neither write it nor create it."""
    import sqlite3

    import sqlalchemy

    uri = f"file:{urllib.parse.quote(str(Path(path).resolve()))}?mode=ro"
    return sqlalchemy.create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True),
                                    poolclass=sqlalchemy.pool.NullPool)
