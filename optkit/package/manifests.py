"""Deployment manifests on top of a package: a KServe InferenceService, a Seldon Core v2 Model and a KubeDL
ModelVersion, written beside the version (`<N>/manifests/*.yaml`). Nothing here talks to a cluster.

The memory request is the measured peak (the report's memory.peak_mb, else the tuned setting's memory_mb)
plus a stated margin, rounded up to a MiB; without a measured peak none is written, and the package says so.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from optkit.core.errors import PassError, UsageError
from optkit.core.text import redact_url

KINDS = ("kserve", "seldon", "kubedl")
MARGIN = 0.5
# the keys each manifest must hold (dotted paths), checked after a YAML round trip
REQUIRED = {
    "kserve": ["apiVersion", "kind", "metadata.name", "spec.predictor.model.modelFormat.name",
               "spec.predictor.model.protocolVersion", "spec.predictor.model.storageUri"],
    "seldon": ["apiVersion", "kind", "metadata.name", "spec.storageUri", "spec.requirements"],
    "kubedl": ["apiVersion", "kind", "metadata.name", "spec.modelName", "spec.createdBy", "spec.storage"],
}
_K8S_NAME = re.compile(r"[^a-z0-9-]+")


def parse_kinds(text: str | None) -> list[str]:
    if not text:
        return []
    kinds = [k.strip().lower() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise UsageError(f"--manifests {text!r}: choose from {', '.join(KINDS)} (comma-separated)")
    return list(dict.fromkeys(kinds))


def peak_memory_mb(measured: dict, tuned_figures: dict) -> tuple[float | None, str]:
    mem = (measured or {}).get("memory") or {}
    if isinstance(mem.get("peak_mb"), (int, float)):
        return float(mem["peak_mb"]) + float(mem.get("baseline_mb") or 0), "the report's memory.peak_mb + baseline_mb"
    if isinstance((tuned_figures or {}).get("memory_mb"), (int, float)):
        return float(tuned_figures["memory_mb"]), "the tuned setting's memory_mb (peak RSS)"
    return None, ""


def k8s_name(name: str) -> str:
    return _K8S_NAME.sub("-", name.lower()).strip("-")[:63] or "model"


def build(kinds: list[str], *, target, name: str, version: int, tag: str | None, base_uri: str,
          peak_mb: float | None, peak_source: str, margin: float, threads: int | None, gpu: bool,
          local_dir: Path) -> tuple[dict, list]:
    """{kind: manifest dict}, notes. `target` (a package.target.Target) says the model format, KServe's runtime
    and which folder a cluster reads."""
    notes = []
    resources: dict[str, Any] = {}
    memory = None
    if peak_mb is not None:
        memory = f"{math.ceil(peak_mb * (1 + margin))}Mi"
        resources = {"requests": {"memory": memory, "cpu": str(threads or 1)}, "limits": {"memory": memory}}
        notes.append(f"memory request {memory}: the measured peak {peak_mb:.1f} MiB ({peak_source}) plus a "
                     f"{margin:.0%} margin (--memory-margin)")
    else:
        notes.append("no measured memory (give --report or --tuned): the manifests carry no memory request")
    if gpu:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = "1"
    k8s = k8s_name(name)
    labels = {"app.kubernetes.io/managed-by": "optkit", "optkit/version": str(version)}
    if tag:
        labels["optkit/tag"] = k8s_name(tag)
    out: dict[str, dict] = {}
    fmt = target.manifest_format
    kserve_uri, seldon_uri = target.manifest_uris(base_uri, name, version)
    if "kserve" in kinds:
        model = {"modelFormat": {"name": fmt}, "protocolVersion": "v2", "storageUri": kserve_uri}
        if target.manifest_runtime:
            model["runtime"] = target.manifest_runtime
        if resources:
            model["resources"] = resources
        out["kserve"] = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                         "metadata": {"name": k8s, "labels": labels}, "spec": {"predictor": {"model": model}}}
    if "seldon" in kinds:
        spec: dict[str, Any] = {"storageUri": seldon_uri, "requirements": [fmt]}
        if memory:
            spec["memory"] = memory
        out["seldon"] = {"apiVersion": "mlops.seldon.io/v1alpha1", "kind": "Model",
                         "metadata": {"name": k8s, "labels": labels}, "spec": spec}
    if "kubedl" in kinds:
        out["kubedl"] = {"apiVersion": "model.kubedl.io/v1alpha1", "kind": "ModelVersion",
                         "metadata": {"name": f"{k8s}-v{version}", "labels": labels},
                         "spec": {"modelName": k8s, "createdBy": "optkit",
                                  "storage": {"localStorage": {"path": str(local_dir), "mountPath": "/models"}}}}
        notes.append(f"KubeDL ModelVersion storage: localStorage {local_dir} (KubeDL reads local, NFS or EFS "
                     "storage; edit it for yours)")
    return out, notes


def check(kind: str, doc: Any) -> None:
    """The manifest holds every required key (after a YAML round trip); else exit 3 (optkit's bug)."""
    for dotted in REQUIRED[kind]:
        node = doc
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise PassError(f"the {kind} manifest lacks {dotted}")
            node = node[part]


def render(kind: str, doc: dict) -> str:
    import yaml

    text = yaml.safe_dump(doc, sort_keys=False)
    check(kind, yaml.safe_load(text))
    return text


def base_uri(given: str | None, repo: Path) -> tuple[str, list[str]]:
    """The repository's URI as a server reads it: --storage-uri, else this machine's path (said)."""
    if given:
        return check_storage_uri(given).rstrip("/"), []
    local = repo.resolve()
    return f"file://{local}", [f"storageUri is this machine's path file://{local}: upload the repository and give "
                               "--storage-uri s3://... (or gs://, pvc://) for a cluster"]


def check_storage_uri(given: str) -> str:
    """--storage-uri goes into every manifest as written, with the model's name after it: a URL with no
    credential in it (a cluster takes those from a Secret), no query or fragment (the name would land inside
    them), no space or control character (exit 2 otherwise)."""
    import urllib.parse

    bare = re.split(r"[?#]", given, maxsplit=1)[0]
    shown = redact_url(bare) + ("?..." if bare != given else "")  # a query may hold a signature: not shown
    try:
        parts = urllib.parse.urlsplit(given)
    except ValueError as e:
        raise UsageError(f"--storage-uri {shown!r} is not a URL ({e}); give s3://BUCKET/PATH, gs://... or pvc://..."
                         ) from None
    if redact_url(given) != given or "@" in parts.netloc:
        raise UsageError(f"--storage-uri {shown!r} carries a credential, which would be written into every "
                         "manifest; give the URI without it (the cluster reads credentials from a Secret)")
    if not parts.scheme or not parts.netloc or parts.query or parts.fragment or "?" in given or "#" in given \
            or any(c.isspace() or not c.isprintable() for c in given):
        raise UsageError(f"--storage-uri {shown!r}: give SCHEME://BUCKET/PATH (s3://, gs://, pvc://...) with no "
                         "query, fragment or space")
    return given
