"""The package repository on disk: `<repo>/<name>/<N>/` version folders, kept for rollback, and
`<repo>/<name>/optkit-versions.json`, the index of what optkit wrote there (versions, tags, which is served).

optkit writes only into a repository it made: a folder that holds anything else is refused before any work.
A new version is built in a temporary folder beside its destination and renamed into place; an existing
version folder is never replaced or removed.

Several packagers (and serve-version) may work on one repository at once: each holds an exclusive flock on the
model folder (on the repository folder while the model is new, on its parent while the repository is) from its
check to its index write, and reads the index again under it. A flock dies with its process, so a killed holder
blocks nobody; the temporary folder it leaves carries its host and pid in its name and is cleared by the next
holder once that process is gone.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any

from optkit.contracts import base
from optkit.contracts import index as contract
from optkit.core.atomic import Output, commit_folder, normal_mode, remove
from optkit.core.errors import UsageError
from optkit.core.locks import lock_folder
from optkit.package import schemas
from optkit.package.target import choices, get_target, target_names

INDEX = contract.FILE
SCHEMA = contract.SCHEMA
NAME_RE = schemas.NAME_RE
TAG_RE = schemas.TAG_RE
# optkit's temporaries: `.<dest>.tmp-<host>-<pid>-<random>` (folders being built, small files being replaced)
TEMP_RE = re.compile(r"\.(?P<dest>.+)\.tmp-(?P<host>[0-9a-f]{8})-(?P<pid>\d{1,10})-[A-Za-z0-9_]+")
OLD_TEMP_RE = re.compile(r"\.(.+)\.tmp-[A-Za-z0-9_]+")  # an optkit before this one: no owner recorded


def output(key: str, repo: str | os.PathLike, name: str) -> Output:
    """The repository as an output (core.atomic.check_outputs): optkit writes only the model's folder (and its
    ensemble parts', NAME.pre ...), and never inside a version folder already there (a version is never
    replaced): an input may lie in one (a version's model packaged again), not where the index, config.pbtxt or
    a new version are written."""
    def replaces(rel: PurePath) -> bool:
        top = rel.parts[0]
        if top != name and not top.startswith(f"{name}."):
            return False
        return not (len(rel.parts) > 1 and rel.parts[1].isascii() and rel.parts[1].isdigit())
    return Output(key, repo, folder=True, replaces=replaces)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name) or name.isdigit():
        raise UsageError(f"--name {_shown(name)}: use letters, digits, '_', '.', '-' (not all digits), at most 128")
    return name


def check_tag(tag: str | None) -> str | None:
    if tag is not None and not TAG_RE.fullmatch(tag):
        raise UsageError(f"--tag {_shown(tag)}: use letters, digits and '_', '.', '+', '-' (e.g. v1.1)")
    return tag


def parse_version(asked: str) -> int:
    """--version N: ASCII digits, 1 to 2**31-1 (Triton takes int64; a package keeps to int32 for every tool)."""
    digits = asked.lstrip("0") or "0"  # int() refuses a string of over 4,300 digits: '000...1' too
    if not (asked.isascii() and asked.isdigit()) or len(digits) > 10 or not 1 <= int(digits) <= base.MAX_VERSION:
        raise UsageError(f"--version {_shown(asked)}: give auto or a whole number from 1 to {base.MAX_VERSION}")
    return int(digits)


def _shown(value: str) -> str:
    """A value the user gave, for an error line: quoted, escaped, at most ~60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_index(model_dir: Path) -> dict[str, Any]:
    p = model_dir / INDEX
    if not p.exists() and not p.is_symlink():
        raise UsageError(f"{model_dir} is not a model optkit packaged (no {INDEX}); name REPO/NAME")
    index = base.load(p, contract.VersionIndex, contract.HINT)[0]
    if index["target"] not in target_names():  # a target no module here registers (a plugin not loaded, an edit)
        raise UsageError(f"{p}: key target: {index['target']!r} is not a package target here (choose "
                         f"{choices(target_names())}; a plugin's is named in OPTKIT_PLUGINS)")
    return index


# ------------------------------------------------------------------ temporaries and their owners

def host_id() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def temp_prefix(dest: Path) -> str:
    """The name prefix of a temporary beside `dest`: its owner (host, pid) is in the name."""
    return f".{dest.name[:180]}.tmp-{host_id()}-{os.getpid()}-"


def temp_path(dest: Path) -> Path:
    return dest.with_name(temp_prefix(dest) + "x")


def _owner_alive(entry: Path, pid: int) -> bool:
    """The process that made `entry` still runs (a pid reused by a younger process is not it)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return proc.create_time() <= entry.lstat().st_mtime + 1
    except (psutil.NoSuchProcess, FileNotFoundError):
        return False
    except psutil.Error:
        return True  # cannot tell: leave it


def is_temp(entry: Path) -> bool:
    return TEMP_RE.fullmatch(entry.name) is not None and not entry.is_symlink() and (entry.is_dir() or
                                                                                     entry.is_file())


def is_stale(entry: Path) -> bool:
    """An optkit temporary whose owner, on this host, is gone (killed midway)."""
    m = TEMP_RE.fullmatch(entry.name)
    return bool(m) and m["host"] == host_id() and not _owner_alive(entry, int(m["pid"]))


def sweep(folder: Path, dest_name: str | None = None) -> None:
    """Remove optkit's stale temporaries in `folder` (those for `dest_name` only, when given). Under the lock."""
    for entry in folder.iterdir():
        m = TEMP_RE.fullmatch(entry.name)
        if m and (dest_name is None or m["dest"] == dest_name[:180]) and is_temp(entry) and is_stale(entry):
            remove(entry)


def _old_temp(folder: Path, entry: Path) -> UsageError:
    return UsageError(f"{folder} holds {entry.name!r}, the temporary folder of an optkit package run that was killed "
                      "(an older optkit, which recorded no owner); remove it (nothing was written)")


# ------------------------------------------------------------------ what a repository may hold

def check_repo(repo: Path, name: str, target: str, *, clean: bool = False,
               parts: list[str] | tuple[str, ...] = ()) -> dict[str, Any] | None:
    """Refuse (exit 2) a repository holding what optkit did not create; the model's index, or None when new.
    `clean` (under the lock): clear optkit's stale temporaries first. `parts`: the model folders an ensemble
    `name` writes beside its own (none may be another model; each may be one of its own parts)."""
    if repo.is_symlink():
        raise UsageError(f"{repo} is a symbolic link; a package holds no links (a server would follow it): name "
                         "the repository folder itself")
    if repo.exists() and not repo.is_dir():
        raise UsageError(f"-o {repo} exists and is not a folder; name a new or optkit-made repository folder")
    if not repo.exists():
        if not repo.parent.is_dir():
            raise UsageError(f"-o {repo}: {repo.parent} " + ("is not a folder; choose another -o" if
                             os.path.lexists(repo.parent) else "does not exist; create it first"))
        if not os.access(repo.parent, os.W_OK | os.X_OK):
            raise UsageError(f"-o {repo}: folder {repo.parent} is not writable")
        return None
    if not os.access(repo, os.W_OK | os.X_OK):
        raise UsageError(f"-o {repo} is not writable")
    if clean:
        sweep(repo)
    for entry in sorted(repo.iterdir()):
        if is_temp(entry):
            continue
        if entry.is_symlink() or (entry / INDEX).is_symlink():
            link = entry if entry.is_symlink() else entry / INDEX
            raise UsageError(f"{link} is a symbolic link; a package holds no links (a server would follow it): "
                             "remove it (nothing was written)")
        if entry.is_dir() and not (entry / INDEX).exists() and _part_of(repo, entry, clean) is not None:
            continue
        if not entry.is_dir() or not (entry / INDEX).is_file():
            if OLD_TEMP_RE.fullmatch(entry.name) and entry.is_dir():
                raise _old_temp(repo, entry)
            raise UsageError(f"-o {repo} holds {entry.name!r}, which optkit did not create; give a new folder or "
                             "one optkit packaged into (nothing was written)")
    model_dir = repo / name
    for part in parts:
        if (repo / part / INDEX).is_file():
            raise UsageError(f"{repo / part} is a model of its own; the parts of ensemble {name} are named "
                             f"{name}.pre, {name}.core, {name}.post: give another --name")
    owner = _part_of(repo, model_dir, False) if model_dir.is_dir() and not (model_dir / INDEX).exists() else None
    if owner is not None:
        raise UsageError(f"{model_dir} is a part of ensemble {owner['name']}; give another --name")
    if not model_dir.exists():
        return None
    index = load_index(model_dir)
    if index["target"] != target:
        raise UsageError(f"{model_dir} is a {index['target']} package, not {target}; choose another -o or --name")
    if clean:
        sweep(model_dir)
    known = {str(v["version"]) for v in index["versions"]}
    model_level = {INDEX, *get_target(target, "target").model_files}  # what the target keeps beside the index
    for entry in sorted(model_dir.iterdir()):
        if entry.name in model_level and entry.is_file() and not entry.is_symlink():
            continue
        if entry.name in known and entry.is_dir() and not entry.is_symlink():
            _no_links(entry)
            continue
        if is_temp(entry):
            continue
        if entry.is_symlink():
            raise UsageError(f"{entry} is a symbolic link; a package holds no links (a server would follow it): "
                             "remove it (nothing was written)")
        if OLD_TEMP_RE.fullmatch(entry.name) and entry.is_dir():
            raise _old_temp(model_dir, entry)
        if entry.name.isascii() and entry.name.isdigit() and (entry / "optkit-package.json").is_file():
            raise UsageError(f"{model_dir} holds version folder {entry.name!r}, which {INDEX} does not list (a "
                             "packager killed as it finished?); move it away (nothing was written)")
        raise UsageError(f"{model_dir} holds {entry.name!r}, which optkit did not create; move it away "
                         "(nothing was written)")
    return index


def _part_of(repo: Path, entry: Path, clean: bool) -> dict[str, Any] | None:
    """The index of the ensemble whose part model folder `entry` is (REPO/<name>.<part>, listed in its index's
    parts), once its contents are what optkit writes there (config.pbtxt, version folders of the ensemble's
    versions); None when no ensemble claims it."""
    owner_dir = repo / entry.name.rpartition(".")[0]
    if "." not in entry.name or not (owner_dir / INDEX).is_file() or owner_dir.is_symlink():
        return None
    owner = load_index(owner_dir)
    if entry.name not in owner.get("parts", []):
        return None
    if clean:
        sweep(entry)
    known = {str(v["version"]) for v in owner["versions"]}
    model_level = get_target(owner["target"], "target").model_files
    for p in sorted(entry.iterdir()):
        if p.name in model_level and p.is_file() and not p.is_symlink():
            continue
        if p.name in known and p.is_dir() and not p.is_symlink():
            _no_links(p)
            continue
        if is_temp(p):
            continue
        if p.name.isascii() and p.name.isdigit() and p.is_dir() and not p.is_symlink():
            raise UsageError(f"{entry} holds version folder {p.name!r}, which {owner_dir / INDEX} does not list (a "
                             "packager killed as it finished?); move it away (nothing was written)")
        raise UsageError(f"{entry} (a part of ensemble {owner['name']}) holds {p.name!r}, which optkit did not "
                         "create; move it away (nothing was written)")
    return owner


def _no_links(vdir: Path) -> None:
    """A version folder holds folders and regular files only: no link (a server would serve what it points at),
    no FIFO or device."""
    for root, dirs, files in os.walk(vdir):
        for n in dirs + files:
            p = Path(root) / n
            if p.is_symlink():
                raise UsageError(f"{p} is a symbolic link; a package holds no links (a server would follow it): "
                                 "remove it (nothing was written)")
            if n in files and not p.is_file():
                raise UsageError(f"{p} is not a regular file (a FIFO, socket or device); remove it "
                                 "(nothing was written)")


# ------------------------------------------------------------------ locks

def _lock(folder: Path) -> int:
    """An fd holding an exclusive flock on `folder` itself (no lock file: nothing is written for it)."""
    return lock_folder(folder)


def _acquire(repo: Path, name: str, whole: bool = False) -> int:
    """The lock guarding `repo/name`: the model folder's, else the repository's, else its parent's (while the
    folder below it is new: whoever creates it holds the level above). `whole`: the repository's (an ensemble
    writes several model folders)."""
    if not repo.exists():
        fd = _lock(repo.parent)
        if not repo.exists():
            return fd
        os.close(fd)
    fd = _lock(repo)
    if whole or not (repo / name).exists():
        return fd
    try:
        return _lock(repo / name)
    finally:
        os.close(fd)


def precheck(repo: Path, name: str, target: str, parts: list[str] | tuple[str, ...] = ()) -> dict[str, Any] | None:
    """check_repo before any work, without holding the lock; a refusal is confirmed under the lock, since an
    unlocked look can catch another packager between renaming its version in and writing the index (a version
    folder the index does not list yet)."""
    try:
        return check_repo(repo, name, target, parts=parts)
    except UsageError:
        if repo.is_symlink() or not repo.is_dir():
            raise
    fd = _acquire(repo, name)
    try:
        return check_repo(repo, name, target, parts=parts)
    finally:
        os.close(fd)


@contextlib.contextmanager
def writing(repo: Path, name: str, target: str, parts: list[str] | tuple[str, ...] = ()) -> Iterator[dict[str, Any] | None]:
    """Hold the lock of `repo/name` and yield its index read again under it (None when new). The repository
    is checked first (precheck), so a folder optkit did not make is refused before anything happens."""
    precheck(repo, name, target, parts)
    fd = _acquire(repo, name, bool(parts))
    # an ensemble holds the repository (its part folders) and its model folder (serve-version's lock) both
    model_fd = _lock(repo / name) if parts and (repo / name).is_dir() and not (repo / name).is_symlink() else None
    try:
        if not repo.exists():
            sweep(repo.parent, repo.name)
        yield check_repo(repo, name, target, clean=True, parts=parts)
    finally:
        if model_fd is not None:
            os.close(model_fd)
        os.close(fd)


@contextlib.contextmanager
def serving(model_dir: Path) -> Iterator[dict[str, Any]]:
    """Hold the model folder's lock (as a packager does) and yield its index, read and checked under it."""
    load_index(model_dir)
    if model_dir.is_symlink():
        raise UsageError(f"{model_dir} is a symbolic link; name the model folder itself")
    fd = _lock(model_dir)
    try:
        index = load_index(model_dir)
        check_repo(model_dir.parent, model_dir.name, index["target"], clean=True)
        yield index
    finally:
        os.close(fd)


# ------------------------------------------------------------------ versions

def next_version(index: dict | None, asked: str, tag: str | None) -> int:
    versions = (index or {}).get("versions", [])
    have = sorted(v["version"] for v in versions)
    same = next((v["version"] for v in versions if tag and v.get("tag") == tag), None)
    if same is not None:
        raise UsageError(f"--tag {tag} is already version {same}; tags are unique")
    if asked == "auto":
        if have and have[-1] >= base.MAX_VERSION:
            raise UsageError(f"version {have[-1]} is the last a package takes; give --version N for a free number")
        return (have[-1] + 1) if have else 1
    number = parse_version(asked)
    if number in have:
        raise UsageError(f"version {number} exists; optkit never overwrites a version: use --version auto "
                         f"(next: {(have[-1] + 1)}) or another number")
    return number


def new_index(target: str, name: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "target": target, "name": name, "versions": [], "served": None, "history": []}


def add_version(index: dict, version: int, tag: str | None, model_sha256: str, label: str) -> dict:
    before = index.get("served")
    index["versions"].append({"version": version, "tag": tag, "created": now(), "model_sha256": model_sha256,
                              "tuned": label})
    index["versions"].sort(key=lambda v: v["version"])
    index["served"] = version
    index["history"].append({"time": now(), "served": version, "before": before, "why": "packaged"})
    return index


def resolve_version(index: dict, version: str | None, tag: str | None) -> int:
    if (version is None) == (tag is None):
        raise UsageError("give exactly one of --version N or --tag T")
    number = parse_version(version) if version is not None else None
    check_tag(tag)
    for v in index["versions"]:
        if (tag is not None and v.get("tag") == tag) or (number is not None and v["version"] == number):
            return v["version"]
    have = ", ".join(f"{v['version']}" + (f" ({v['tag']})" if v.get("tag") else "") for v in index["versions"])
    raise UsageError(f"no version {'tagged ' + tag if tag else number} in this package; it has {have}")


def index_text(index: dict) -> str:
    """The index file as written: validated by its contract (exit 3 if a reader would refuse it)."""
    return base.text(contract.document(index))


def replace_text(path: Path, text: str) -> None:
    """Write `text` beside `path` (a temporary named after its owner) and rename it onto `path`."""
    fd, name = tempfile.mkstemp(prefix=temp_prefix(path), dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        normal_mode(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def commit(staged: Path, dest: Path, replace: dict[Path, str]) -> None:
    """Rename the staged folder onto `dest` (core.atomic.commit_folder: a version folder is never replaced), then
    each small file onto its place."""
    commit_folder(staged, dest)
    for path, text in replace.items():
        replace_text(path, text)


def commit_index(model_dir: Path, index: dict) -> None:
    replace_text(model_dir / INDEX, index_text(index))
