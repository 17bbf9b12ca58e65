"""Which version a package serves (rollback / promote) and what a repository holds (inspect)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from optkit.contracts import lineage as lineage_contract
from optkit.contracts.base import same_model
from optkit.core.errors import PassError, UsageError
from optkit.core.text import redact_config
from optkit.package import lineage, repo
from optkit.package.target import get_target, own_options, target_options


def serve_version(model_dir: str, version: str | None = None, tag: str | None = None,
                  **options: Any) -> dict[str, Any]:
    """Serve version N (or the one tagged T): the target switches what its server loads (Target.serve), the
    index records it; no version is deleted. `options`: the target's own that its serve-version takes
    (Target.serve_options); another target's is refused by name. Returns what changed. Runs under the model
    folder's lock, as packaging does."""
    d = Path(model_dir)
    with repo.serving(d) as index:  # read and checked again under the lock: nothing foreign, no link
        number = repo.resolve_version(index, version, tag)
        recorded = _version_lineage(d, index, number)
        lineage_contract.verify_files(d / str(number), recorded)
        target = get_target(index["target"], f"{d / repo.INDEX}: key target:")
        opts = target_options(target, own_options(target, options, serving=True))
        served = target.serve(d, index, number, recorded, opts)
        before, replace, out_registry = served.before, dict(served.replace), served.record
        parts = {d.parent / p for p in index.get("parts", [])}  # model folders its versions own (Target.models)
        for path in replace:  # a target replaces its own model-level files (and its parts'), nothing else
            if not (isinstance(path, Path) and (path.parent == d or path.parent in parts)
                    and path.name in target.model_files):
                raise PassError(f"package target {target.name!r} asked to replace {path}, which is not one of its "
                                f"model_files in {d} (nothing was changed)")
        index["served"] = number
        index["history"].append({"time": repo.now(), "served": number, "before": before, "why": "serve-version"})
        replace[d / repo.INDEX] = repo.index_text(index)
        for path, text in replace.items():
            repo.replace_text(path, text)
    tagged = next((v.get("tag") for v in index["versions"] if v["version"] == number), None)
    return {"model": str(d), "target": index["target"], "served": number, "tag": tagged, "before": before,
            "versions": [v["version"] for v in index["versions"]], "registry": out_registry}


def _version_lineage(d: Path, index: dict, number: int) -> dict:
    """Version N's lineage, read through its contract, and it is this version's (name, number, and the model the
    index records for it), else exit 2."""
    path = d / str(number) / lineage.LINEAGE_FILE
    data, _ = lineage_contract.read(path)
    name = index["name"]
    if data["name"] != name or data["version"] != number:
        raise UsageError(f"{path}: key {'name' if data['name'] != name else 'version'}: "
                         f"not this version's ({name} {number}); {lineage.HINT}")
    entry = next(v for v in index["versions"] if v["version"] == number)
    same_model(path, "model.sha256", data["model"]["sha256"], entry["model_sha256"],
               f"the model {d / repo.INDEX} records for version {number}", lineage.HINT)
    return data


def is_package(path: str) -> bool:
    """A folder optkit package made: a version (its lineage file), a model (its index) or a repository of them."""
    p = Path(path)
    if not p.is_dir():
        return False
    if (p / lineage.LINEAGE_FILE).is_file() or (p / repo.INDEX).is_file():
        return True
    return any((d / repo.INDEX).is_file() for d in p.iterdir() if d.is_dir())


def inspect(path: str) -> dict[str, Any]:
    """A repository, a model folder or a version folder: its models, versions, tags, what is served, and each
    version's lineage summary."""
    return redact_config(_inspect(path))  # a hand-edited file's password is not shown either


def _inspect(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"{path} is not a folder; give a package repository, REPO/NAME or REPO/NAME/N")
    if (p / lineage.LINEAGE_FILE).is_file():
        return {"version": _lineage(p)}
    if (p / repo.INDEX).is_file():
        return {"models": [_model(p)]}
    models = [_model(d) for d in sorted(p.iterdir()) if d.is_dir() and (d / repo.INDEX).is_file()]
    if not models:
        raise UsageError(f"{path} holds no package optkit made (no {repo.INDEX} in it or its folders)")
    return {"models": models}


def _model(d: Path) -> dict[str, Any]:
    index = repo.load_index(d)
    versions = []
    for v in index["versions"]:
        vdir = d / str(v["version"])
        versions.append({**v, "served": v["version"] == index.get("served"),
                         "lineage": _lineage(vdir) if (vdir / lineage.LINEAGE_FILE).is_file() else None})
    return {"name": index["name"], "path": str(d), "target": index["target"], "served": index.get("served"),
            "versions": versions, "history": index.get("history", [])}


def _lineage(vdir: Path) -> dict[str, Any]:
    data, _ = lineage_contract.read(vdir / lineage.LINEAGE_FILE)
    measured = data["measured"]
    lat, acc, size, mem = (measured.get(k) or {} for k in ("latency", "accuracy", "size", "memory"))
    return {"path": str(vdir), "source": data["source"], "model_sha256": data["model"]["sha256"],
            "passes": [s.get("pass") or s["stage"] for s in data["passes"]],
            "tuned": data["tuned"]["label"], "created": data["created"], "confirmed": data["tuned"].get("confirmed"),
            "p50_ms": lat.get("p50_ms"), "p50_ci95_pct": lat.get("ci95_pct"),
            "accuracy": {k: v for k, v in acc.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
            "size_bytes": size.get("bytes"), "peak_mb": mem.get("peak_rss_mb") or mem.get("peak_mb"),
            "notes": data["notes"]}
