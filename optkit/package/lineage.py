"""The lineage a package carries (`optkit-package.json` beside the model, MLflow `metadata`): where the model
came from, the passes that made it and what each wrote, what was measured with its noise, the tuned setting
and its confirmation, the machine and the time. Its contract is optkit/contracts/lineage.py: `text` writes it
through the model; the contract's `read` validates it and `verify_files` checks a version folder is the one it
describes."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optkit
from optkit.contracts import base
from optkit.contracts import lineage as contract
from optkit.core.artifact import path_sha256
from optkit.core.errors import UsageError
from optkit.report.schema import library_versions, machine_info

LINEAGE_FILE = contract.FILE
REPORT_FILE = "optkit-report.json"
SCHEMA = contract.SCHEMA
HINT = contract.HINT
# measurement groups carried into the lineage (the rest stays in the report beside it)
FIGURES = ("size", "latency", "latency_change", "accuracy", "fidelity", "memory")


def chain_from_report(report, model_sha256: str) -> tuple[list[dict], dict[str, Any], str | None]:
    """(the passes up to the stage that wrote this model, that stage's figures, the source's path and sha256)."""
    stages = list(report.stages)
    idx = next((i for i in range(len(stages) - 1, -1, -1) if stages[i].output.sha256 == model_sha256), None)
    if idx is None:
        raise UsageError(f"--report {report.command or 'report'}: no stage of it wrote this model (sha256 "
                         f"{model_sha256[:12]}...); give the report of the run that made it")
    chain = []
    for s in stages[:idx + 1]:
        chain.append({"stage": s.name, "pass": s.pass_name, "config": s.config,
                      "input": s.input.model_dump() if s.input else None, "output": s.output.model_dump(),
                      "duration_s": s.duration_s, "cached": s.cached})
    figures = {k: v for k, v in stages[idx].measurements.items() if k in FIGURES}
    first = stages[0].input or stages[0].output
    return chain, figures, first


def build_lineage(*, artifact, target: str, name: str, version: int, tag: str | None, tuned, report,
                  report_path: str | None, files: dict[str, str], mapping: list[dict], notes: list[str],
                  split: dict | None = None, preprocessor: dict | None = None) -> dict:
    chain, figures, source = [], {}, None
    if report is not None:
        # a model in parts: the report's stages made the model it was split from
        chain, figures, first = chain_from_report(report, (split or {}).get("model_sha256") or artifact.sha256)
        source = {"path": first.path, "sha256": first.sha256, "format": first.format}
    out = {
        "schema": SCHEMA,
        "optkit": optkit.__version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "target": target, "name": name, "version": version, "tag": tag,
        "model": {"path": str(artifact.path), "sha256": artifact.sha256, "format": artifact.format.value},
        "source": source or {"path": str(artifact.path), "sha256": artifact.sha256,
                             "format": artifact.format.value},
        "passes": chain,
        "report": {"path": report_path, "command": report.command, "created": report.created} if report else None,
        "measured": figures,
        "tuned": {"source": tuned.source, "label": tuned.label, "setting": tuned.setting,
                  "objective": tuned.objective, "figures": tuned.figures, "confirmed": tuned.confirmed},
        "mapping": mapping,
        "notes": notes,
        "files": files,
        "machine": machine_info(),
        "versions": library_versions(),
    }
    if preprocessor is not None:  # its tokenizer folder in the version, and the Hugging Face folder it came from
        out["preprocessor"] = preprocessor
    if split is not None:  # a model in parts: the split, and each part model's files (serve-version checks them)
        out["split"] = split
    return out


def file_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): path_sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in (LINEAGE_FILE,)}


def text(data: dict) -> str:
    """The lineage file as written: validated by its contract (exit 3 if a reader would refuse it)."""
    return base.text(contract.document(data))
