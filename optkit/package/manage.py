"""Which version a package serves (rollback / promote) and what a repository holds (inspect)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optkit.core.errors import UsageError
from optkit.package import lineage, repo


def serve_version(model_dir: str, version: str | None = None, tag: str | None = None,
                  registry: str | None = None) -> dict[str, Any]:
    """Serve version N (or the one tagged T): Triton's config.pbtxt gets that version's own config with
    `version_policy: specific`, the index records it; no version is deleted. Returns what changed."""
    d = Path(model_dir)
    index = repo.load_index(d)
    repo.check_repo(d.parent, d.name, index["target"])  # nothing foreign in it
    number = repo.resolve_version(index, version, tag)
    before = index.get("served")
    replace = {}
    if index["target"] == "triton":
        from optkit.package.triton import served_version

        current = (d / "config.pbtxt").read_text(encoding="utf-8")
        before = served_version(current) or before
        own = d / str(number) / "config.pbtxt"
        if not own.is_file():
            raise UsageError(f"{own} is missing; version {number} cannot be served")
        replace[d / "config.pbtxt"] = own.read_text(encoding="utf-8")
    out_registry = None
    if index["target"] == "mlflow":
        from optkit.package import registry as reg

        where = reg.uri(registry)
        if where:
            entry = next(v for v in index["versions"] if v["version"] == number)
            known = (entry.get("registry") or {}).get("version") if (entry.get("registry") or {}).get("uri") == where \
                else None
            now_served, was = reg.point_alias(where, index["name"], d / str(number), number, entry.get("tag"), known)
            entry["registry"] = {"uri": where, "version": now_served, "alias": reg.ALIAS}
            out_registry = {"uri": where, "alias": reg.ALIAS, "version": now_served, "before": was}
    elif registry:
        raise UsageError("--registry is for MLflow packages (a Triton repository serves by version_policy)")
    index["served"] = number
    index["history"].append({"time": repo.now(), "served": number, "before": before, "why": "serve-version"})
    replace[d / repo.INDEX] = repo.index_text(index)
    for path, text in replace.items():
        tmp = path.with_name(f".{path.name}.tmp-serve")
        try:
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
        finally:
            if tmp.exists():
                tmp.unlink()
    tagged = next((v.get("tag") for v in index["versions"] if v["version"] == number), None)
    return {"model": str(d), "target": index["target"], "served": number, "tag": tagged, "before": before,
            "versions": [v["version"] for v in index["versions"]], "registry": out_registry}


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
    try:
        data = json.loads((vdir / lineage.LINEAGE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"{vdir / lineage.LINEAGE_FILE}: unreadable ({type(e).__name__}: {e})") from None
    measured = data.get("measured") or {}
    lat, acc, size, mem = (measured.get(k) or {} for k in ("latency", "accuracy", "size", "memory"))
    return {"path": str(vdir), "source": data.get("source"), "model_sha256": (data.get("model") or {}).get("sha256"),
            "passes": [s.get("pass") or s.get("stage") for s in data.get("passes") or []],
            "tuned": (data.get("tuned") or {}).get("label"), "created": data.get("created"),
            "confirmed": (data.get("tuned") or {}).get("confirmed"),
            "p50_ms": lat.get("p50_ms"), "p50_ci95_pct": lat.get("ci95_pct"), "accuracy": {k: v for k, v in acc.items() if isinstance(v, (int, float))},
            "size_bytes": size.get("bytes"), "peak_mb": mem.get("peak_rss_mb") or mem.get("peak_mb"),
            "notes": data.get("notes", [])}
