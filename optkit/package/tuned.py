"""The tuned serving settings a package carries: from `optkit tune`'s best.json (optkit/contracts/best.py),
checked to be for this model.

Without best.json the defaults below are used, and the package says so (they are stated, not guessed).
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optkit.contracts import base
from optkit.contracts import best as contract
from optkit.core.errors import UsageError

# What a package gets without --tuned: one CPU instance, onnxruntime's own thread pools and optimisations,
# batch 1, no dynamic batching.
DEFAULTS = {"runtime": "onnxruntime", "provider": "cpu", "threads": None, "batch": 1, "concurrency": 1, "sessions": "shared",
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
    return Tuned(setting=copy.deepcopy(DEFAULTS), label="defaults (no --tuned)")


def load_tuned(path: str | Path, model_sha256: str, model_path: str, split_from: str | None = None) -> Tuned:
    """best.json from `optkit tune`, for this model (its sha256; for a model in parts, the core part's or that of
    the model it was split from, `split_from`), else exit 2; every value the package uses is checked (types,
    bounds, finite numbers, no unknown setting) by its contract."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise UsageError(f"--tuned {path} does not exist")
    data = contract.read(p)
    recorded = contract.recorded_sha256(data)
    if split_from is None or recorded != split_from:
        base.same_model(f"--tuned {path}", "model_sha256", recorded, model_sha256, model_path,
                        "tune this model (optkit tune MODEL -o best.json)")
    return _tuned(data, str(path))


def from_result(result: dict[str, Any], where: str, model: str, model_sha256: str) -> Tuned:
    """The tune stage's result (its `measurements.tune`, as a recipe run holds it) as the package's setting:
    checked by best.json's contract (it is the same object tune writes to best.json), without a file between."""
    return _tuned(contract.of_result(result, model, model_sha256, where)[0], where)


def _tuned(data: dict, source: str) -> Tuned:
    best = data["best"]
    return Tuned(setting=best["setting"], source=source, label=best.get("label", ""),
                 figures=best.get("figures") or {}, confirmed=best.get("confirmed"),
                 objective=list(data.get("objective") or []))
