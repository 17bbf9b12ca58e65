"""The tuned serving settings a package carries: from `optkit tune`'s best.json, checked to be for this model.

Without best.json the defaults below are used, and the package says so (they are stated, not guessed).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.package import schemas

# What a package gets without --tuned: one CPU instance, onnxruntime's own thread pools and optimisations,
# batch 1, no dynamic batching.
DEFAULTS = {"provider": "cpu", "threads": None, "batch": 1, "concurrency": 1, "sessions": "shared",
            "session": {"inter_op_threads": None, "execution_mode": "sequential", "graph_optimization": "all",
                        "cpu_mem_arena": True, "mem_pattern": True}}


@dataclass
class Tuned:
    setting: dict[str, Any]
    source: str | None = None            # the best.json path, None for the defaults
    label: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    confirmed: dict[str, Any] | None = None
    objective: list[str] = field(default_factory=list)

    @property
    def session(self) -> dict[str, Any]:
        return {**DEFAULTS["session"], **(self.setting.get("session") or {})}

    def get(self, key: str):
        return self.setting.get(key, DEFAULTS.get(key))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def defaults() -> Tuned:
    return Tuned(setting=json.loads(json.dumps(DEFAULTS)), label="defaults (no --tuned)")


def load_tuned(path: str | Path, model_sha256: str, model_path: str) -> Tuned:
    """best.json from `optkit tune`, for this model (its sha256), else exit 2; every value the package uses is
    checked (types, bounds, finite numbers, no unknown setting) by its schema."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise UsageError(f"--tuned {path} does not exist")
    data, _ = schemas.load_tuned(p)
    sha = data.get("model_sha256")
    if sha is None:  # an older best.json names its model by path only: that file must be this model
        named = data.get("model")
        try:
            sha = Artifact.load(named).sha256 if named and Path(named).exists() else None
        except Exception:
            sha = None
        if sha is None:
            raise UsageError(f"--tuned {path} has no model_sha256 and its model {named!r} is not here to check; "
                             "tune this model again with `optkit tune`")
    if sha != model_sha256:
        raise UsageError(f"--tuned {path} was made for another model (sha256 {sha[:12]}..., "
                         f"{data.get('model')}), not {model_path} ({model_sha256[:12]}...); tune this model")
    best = data["best"]
    return Tuned(setting=best["setting"], source=str(path), label=best.get("label", ""),
                 figures=best.get("figures") or {}, confirmed=best.get("confirmed"),
                 objective=list(data.get("objective") or []))


def from_result(result: dict[str, Any], where: str) -> Tuned:
    """The tune stage's result (its `measurements.tune`, as a recipe run holds it) as the package's setting:
    checked by best.json's schema (it is the same object tune writes to best.json), without a file between."""
    data = {k: v for k, v in result.items() if k != "trials"}
    schemas.validate(data, schemas.TunedFile, where, "run the recipe's tune stage again")
    best = data["best"]
    return Tuned(setting=best["setting"], source=where, label=best.get("label", ""),
                 figures=best.get("figures") or {}, confirmed=best.get("confirmed"),
                 objective=list(data.get("objective") or []))
