"""The package repository on disk: `<repo>/<name>/<N>/` version folders, kept for rollback, and
`<repo>/<name>/optkit-versions.json`, the index of what optkit wrote there (versions, tags, which is served).

optkit writes only into a repository it made: a folder that holds anything else is refused before any work.
A new version is built in a temporary folder beside its destination and renamed into place; an existing
version folder is never replaced or removed.
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from optkit.core.errors import UsageError

INDEX = "optkit-versions.json"
SCHEMA = "optkit-versions/1"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
MODEL_LEVEL = {"triton": {INDEX, "config.pbtxt"}, "mlflow": {INDEX}}


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def check_name(name: str) -> str:
    if not NAME_RE.match(name) or name.isdigit():
        raise UsageError(f"--name {name!r}: use letters, digits, '_', '.', '-' (not all digits), at most 128")
    return name


def check_tag(tag: str | None) -> str | None:
    if tag is not None and not TAG_RE.match(tag):
        raise UsageError(f"--tag {tag!r}: use letters, digits and '_', '.', '+', '-' (e.g. v1.1)")
    return tag


def load_index(model_dir: Path) -> dict[str, Any]:
    p = model_dir / INDEX
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{model_dir} is not a model optkit packaged (no {INDEX}); name REPO/NAME") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{p}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("versions"), list):
        raise UsageError(f"{p} is not an optkit version index ({SCHEMA})")
    return data


def check_repo(repo: Path, name: str, target: str) -> dict[str, Any] | None:
    """Refuse (exit 2) a repository holding what optkit did not create; the model's index, or None when new."""
    if repo.is_symlink() or (repo.exists() and not repo.is_dir()):
        raise UsageError(f"-o {repo} exists and is not a folder; name a new or optkit-made repository folder")
    if not repo.exists():
        if not repo.parent.is_dir():
            raise UsageError(f"-o {repo}: its parent folder {repo.parent} does not exist; create it first")
        if not os.access(repo.parent, os.W_OK | os.X_OK):
            raise UsageError(f"-o {repo}: folder {repo.parent} is not writable")
        return None
    if not os.access(repo, os.W_OK | os.X_OK):
        raise UsageError(f"-o {repo} is not writable")
    for entry in sorted(repo.iterdir()):
        if entry.is_symlink() or not entry.is_dir() or not (entry / INDEX).is_file():
            raise UsageError(f"-o {repo} holds {entry.name!r}, which optkit did not create; give a new folder or "
                             "one optkit packaged into (nothing was written)")
    model_dir = repo / name
    if not model_dir.exists():
        return None
    index = load_index(model_dir)
    if index.get("target") != target:
        raise UsageError(f"{model_dir} is a {index.get('target')} package, not {target}; choose another -o or --name")
    known = {str(v["version"]) for v in index["versions"]}
    for entry in sorted(model_dir.iterdir()):
        if entry.name in MODEL_LEVEL[target] and entry.is_file() and not entry.is_symlink():
            continue
        if entry.name in known and entry.is_dir() and not entry.is_symlink():
            continue
        raise UsageError(f"{model_dir} holds {entry.name!r}, which optkit did not create; move it away "
                         "(nothing was written)")
    return index


def next_version(index: dict | None, asked: str, tag: str | None) -> int:
    have = sorted(int(v["version"]) for v in (index or {}).get("versions", []))
    if tag and any(v.get("tag") == tag for v in (index or {}).get("versions", [])):
        raise UsageError(f"--tag {tag} is already version "
                         f"{next(v['version'] for v in index['versions'] if v.get('tag') == tag)}; tags are unique")
    if asked == "auto":
        return (have[-1] + 1) if have else 1
    if not asked.isdigit() or int(asked) < 1 or int(asked) > 2 ** 31:
        raise UsageError(f"--version {asked!r}: give auto or a positive integer")
    if int(asked) in have:
        raise UsageError(f"version {asked} exists; optkit never overwrites a version: use --version auto "
                         f"(next: {(have[-1] + 1)}) or another number")
    return int(asked)


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
    for v in index["versions"]:
        if (tag is not None and v.get("tag") == tag) or (version is not None and str(v["version"]) == str(version)):
            return int(v["version"])
    have = ", ".join(f"{v['version']}" + (f" ({v['tag']})" if v.get("tag") else "") for v in index["versions"])
    raise UsageError(f"no version {'tagged ' + tag if tag else version} in this package; it has {have}")


def index_text(index: dict) -> str:
    return json.dumps(index, indent=2) + "\n"


def commit(staged: Path, dest: Path, replace: dict[Path, str]) -> None:
    """Rename the staged folder onto `dest` (never replacing one), then each small file onto its place."""
    from optkit.core import interrupts

    interrupts.check()
    os.rename(staged, dest)
    for path, text in replace.items():
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()


def commit_index(model_dir: Path, index: dict) -> None:
    tmp = model_dir / f".{INDEX}.tmp-{os.getpid()}"
    try:
        tmp.write_text(index_text(index), encoding="utf-8")
        os.replace(tmp, model_dir / INDEX)
    finally:
        if tmp.exists():
            tmp.unlink()
