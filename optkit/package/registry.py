"""An MLflow model registry, when one is configured (`--registry URI` or MLFLOW_REGISTRY_URI): each MLflow package
version is registered (source: its folder) and the alias `served` points at the version optkit serves, so
`models:/NAME@served` follows packaging and serve-version. No registry: the index alone records it.

A registry that is a database (sqlite:///, postgresql://, mysql://, mssql://) is read before MLflow touches it
(check): it must be empty or hold MLflow's tables and nothing else, as MLflow creates 30-odd tables in it. Its
URI is shown and stored without its password (shown)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from optkit.core import dburl
from optkit.core.errors import DependencyError, OptkitError, PassError, UsageError
from optkit.core.logs import debugging
from optkit.core.text import redact, redact_url

ALIAS = "served"
DATABASES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "mssql")  # MLflow's SQLAlchemy stores
CONNECT_TIMEOUT_S = 10  # one connection to a database server (its driver's connect_timeout)
_checked: set[str] = set()


def uri(given: str | None) -> str | None:
    return given or os.environ.get("MLFLOW_REGISTRY_URI") or None


def shown(registry: str) -> str:
    """The registry URI as optkit prints and stores it: no password."""
    return redact_url(registry)


def _scheme(registry: str) -> str:
    return registry.split(":", 1)[0].split("+", 1)[0].strip().lower() if "://" in registry else ""


def check(registry: str) -> None:
    """Before anything is written: a database registry is empty or MLflow's own (UsageError else; a wrong
    password, a server that does not answer or a missing database too, at once). A file store or an MLflow
    server (http, https, databricks) is MLflow's to judge."""
    if registry in _checked:
        return
    if _file_store(registry) and not _file_store_allowed():
        raise UsageError(f"registry {shown(registry)} names a folder, MLflow's file store, which this MLflow refuses "
                         "(maintenance mode); give sqlite:///FILE.db, postgresql://... or an MLflow server URL "
                         "(or set MLFLOW_ALLOW_FILE_STORE=true)")
    if _scheme(registry) in ("http", "https"):
        _check_reachable(registry)
    if _scheme(registry) not in DATABASES:
        return
    if _scheme(registry) == "sqlite":
        _check_sqlite(registry)
    else:
        _check_server(registry)
    _checked.add(registry)


def _check_reachable(registry: str) -> None:
    """An MLflow server answers at all (any HTTP status; no redirect followed): else exit 2 before a version is
    written, instead of a version on disk that the registry never heard of."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(registry)
    kind = http.client.HTTPSConnection if parts.scheme.lower() == "https" else http.client.HTTPConnection
    try:
        conn = kind(parts.hostname or "", parts.port, timeout=CONNECT_TIMEOUT_S)
        try:
            conn.request("GET", (parts.path.rstrip("/") or "") + "/health")
            conn.getresponse().read(1024)
        finally:
            conn.close()
    except (OSError, ValueError, http.client.HTTPException) as e:
        raise UsageError(f"cannot reach the registry {shown(registry)} ({redact(dburl.db_message(e), registry)}); "
                         "start the MLflow server or give another --registry (nothing was written)") from None


def _file_store(registry: str) -> bool:
    """A registry MLflow keeps in a folder: a path or a file:// URI (`databricks`, `databricks-uc` and `uc`, with
    or without a profile, are no paths)."""
    if "://" in registry:
        return _scheme(registry) == "file"
    return registry.split(":", 1)[0].strip().lower() not in ("databricks", "databricks-uc", "uc")


def _file_store_allowed() -> bool:
    """MLflow's own switch for its file store (MLFLOW_ALLOW_FILE_STORE), read as MLflow reads it."""
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:  # an MLflow without the switch takes a file store
        return True
    try:
        return bool(MLFLOW_ALLOW_FILE_STORE.get())
    except Exception:  # noqa: BLE001 - a value MLflow cannot read: MLflow will say so
        return True


def _check_sqlite(registry: str) -> None:
    path = dburl.sqlite_file(registry, "registry")
    if path is None:  # in memory
        return
    if not os.path.lexists(path):  # MLflow creates it; the folder must be there (MLflow would make it)
        if not path.parent.is_dir():
            raise UsageError(f"registry {shown(registry)}: the folder {path.parent} does not exist; create it or "
                             "give another --registry")
        return
    if not dburl.has_sqlite_data(path, "the registry", "give another --registry"):
        return
    try:
        problem = _problem(dburl.sqlite_readonly_engine(path))
    except Exception as e:  # noqa: BLE001 - sqlite3's DatabaseError (a damaged file) and SQLAlchemy's wrappers
        raise UsageError(f"cannot read the registry {path}: {dburl.db_message(e)}") from None
    if problem:
        raise UsageError(f"registry {path} {problem}; optkit does not write into it: give another --registry, "
                         "a database of its own")


def _check_server(registry: str) -> None:
    try:
        import sqlalchemy

        kwargs = {} if _scheme(registry) == "mssql" or "connect_timeout" in registry else \
            {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
        problem = _problem(sqlalchemy.create_engine(registry, poolclass=sqlalchemy.pool.NullPool, **kwargs))
    except ImportError as e:  # a missing database driver
        missing = getattr(e, "name", None) or ""
        raise DependencyError(f"registry {_scheme(registry)}:// needs its database driver: pip install "
                              f"{dburl.DRIVERS.get(missing, missing or 'its driver')}") from None
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001 - a wrong password, no such database, no server: the user's URI
        raise UsageError(f"cannot open the registry {shown(registry)}: {redact(dburl.db_message(e), registry)}"
                         ) from None
    if problem:
        raise UsageError(f"registry {shown(registry)} {problem}; optkit does not write into it: give another "
                         "--registry, a database of its own")


def _problem(engine) -> str | None:
    try:
        tables, views, columns = dburl.read_schema(engine)
        if not tables and not views:
            return None
        # older MLflow versions have fewer columns: MLflow itself asks for `mlflow db upgrade`
        return dburl.foreign(tables, views, columns, _mlflow_schema(), "MLflow", "an MLflow registry", older=True) \
            or _not_migrated_by_mlflow(engine, tables)
    finally:
        engine.dispose()


def _not_migrated_by_mlflow(engine, tables: set[str]) -> str | None:
    """A database whose tables only bear MLflow's names (a user's `tags (key, value)`: a subset of MLflow's
    columns, as an older MLflow's would be) is MLflow's only where alembic_version holds one of MLflow's own
    schema revisions; MLflow would add its tables to anything else."""
    import sqlalchemy

    if not tables:
        return None
    found: list[str] = []
    if "alembic_version" in tables:
        with engine.connect() as con:
            found = [str(r[0]) for r in con.execute(sqlalchemy.text("SELECT version_num FROM alembic_version"))]
    if len(found) != 1 or found[0] not in _mlflow_revisions():
        return (f"has tables named like MLflow's ({dburl.shown(sorted(tables))}) but no MLflow schema revision in "
                "alembic_version, so it is not an MLflow registry")
    return None


def _mlflow_revisions() -> set[str]:
    """The alembic revisions of MLflow's database schema (its db_migrations/versions scripts)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("mlflow.store.db_migrations")
    folder = Path(next(iter(spec.submodule_search_locations or []), "")) / "versions" if spec else None
    revisions: set[str] = set()
    for script in sorted(folder.glob("*.py")) if folder and folder.is_dir() else []:
        m = re.search(r"^revision\s*(?::\s*str\s*)?=\s*[\"']([0-9A-Za-z_]+)[\"']", script.read_text(encoding="utf-8"), re.M)
        if m:
            revisions.add(m[1])
    return revisions


def _mlflow_schema() -> dict[str, set[str] | None]:
    """MLflow's tables (tracking and registry: one schema, one alembic history) and their columns."""
    import importlib

    from mlflow.store.db.base_sql_model import Base

    for module in ("tracking", "model_registry", "workspace"):  # each registers its tables in Base
        importlib.import_module(f"mlflow.store.{module}.dbmodels.models")

    schema: dict[str, set[str] | None] = {name: {c.name for c in t.columns} for name, t in Base.metadata.tables.items()}
    return schema | {"alembic_version": {"version_num"}}


def _quiet() -> None:
    """MLflow's and alembic's INFO lines ("Creating initial MLflow database tables...") and MLflow's retries
    off: a registry that fails, fails at once, in optkit's one line. --debug shows their warnings."""
    level = logging.WARNING if debugging() else logging.ERROR
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(level)
    # an MLflow server that is down: one retry and 30 s a request, not 7 retries of 120 s (a user's own stand)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    try:
        import mlflow.store.db.utils as db_utils

        db_utils.MAX_RETRY_COUNT = 1  # it retries a failed connection 10 times over 100 s, whatever the cause
    except ImportError:
        pass


def _client(registry: str):
    check(registry)
    from mlflow import MlflowClient

    _quiet()
    return MlflowClient(tracking_uri=registry, registry_uri=registry)


def _refused(registry: str, e: BaseException) -> str:
    """An MLflow or database error as a part of one line, without the registry's password."""
    text = dburl.db_message(e) if getattr(e, "orig", None) is not None else (str(e).strip().splitlines() or [""])[0]
    return redact(f"{type(e).__name__}: {text}", registry)


def register(registry: str, name: str, version_dir: Path, number: int, tag: str | None) -> str:
    """Register the package version; point the alias at it. Returns the registry's version number."""
    try:
        client = _client(registry)
        from mlflow.exceptions import MlflowException

        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(name, tags={"managed-by": "optkit"})
        tags = {"optkit.version": str(number), **({"optkit.tag": tag} if tag else {})}
        mv = client.create_model_version(name, source=str(version_dir.resolve()), tags=tags)
        client.set_registered_model_alias(name, ALIAS, mv.version)
        return str(mv.version)
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001 - MLflow, SQLAlchemy and drivers raise many kinds
        raise PassError(f"version {number} is written at {version_dir}, but the registry {shown(registry)} "
                        f"refused it ({_refused(registry, e)}); fix the registry and run optkit package "
                        f"serve-version {version_dir.parent} --version {number} --registry ...") from None


def point_alias(registry: str, name: str, version_dir: Path, number: int, tag: str | None,
                known: str | None) -> tuple[str, str | None]:
    """Point `served` at the registry version of package version `number` (registering it when it is not yet).
    Returns (the registry version now served, the one served before or None)."""
    try:
        client = _client(registry)
        from mlflow.exceptions import MlflowException

        try:
            before = client.get_model_version_by_alias(name, ALIAS).version
        except MlflowException:
            before = None
        if known is None:
            return register(registry, name, version_dir, number, tag), before
        client.set_registered_model_alias(name, ALIAS, known)
        return known, before
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001 - MLflow, SQLAlchemy and drivers raise many kinds
        raise PassError(f"the registry {shown(registry)} refused the alias ({_refused(registry, e)})") from None
