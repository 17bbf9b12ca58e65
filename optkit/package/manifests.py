"""Deployment manifests on top of a package: a KServe InferenceService, a Seldon Core v2 Model and a KubeDL
ModelVersion, written beside the version (`<N>/manifests/*.yaml`). Nothing here talks to a cluster.

The memory request is the measured peak (the report's memory.peak_mb, else the tuned setting's memory_mb)
plus a stated margin, rounded up to a MiB; without a measured peak none is written, and the package says so.

With a CAPACITY.json (`--capacity`, written by `optkit capacity`) each manifest carries the replicas and
autoscaling in its own fields (see `apply_capacity`), and the capacity's resources win over the package's own
measured memory and thread count wherever the capacity states them (the package's notes say which came from where).
"""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

from optkit.core.errors import PassError, UsageError
from optkit.core.text import redact_url
from optkit.package import manifests_ovms

KINDS = ("kserve", "seldon", "kubedl")
MARGIN = 0.5
# the keys each manifest must hold (dotted paths), checked after a YAML round trip
REQUIRED = {
    "kserve": ["apiVersion", "kind", "metadata.name", "spec.predictor.model.modelFormat.name",
               "spec.predictor.model.protocolVersion", "spec.predictor.model.storageUri"],
    "seldon": ["apiVersion", "kind", "metadata.name", "spec.storageUri", "spec.requirements"],
    "kubedl": ["apiVersion", "kind", "metadata.name", "spec.modelName", "spec.createdBy", "spec.storage"],
    "kserve-ovms": ["apiVersion", "kind", "metadata.name", "spec.supportedModelFormats", "spec.containers"],
    "kserve-keda": ["apiVersion", "kind", "metadata.name", "spec.scaleTargetRef.name", "spec.minReplicaCount",
                    "spec.maxReplicaCount", "spec.triggers"],
}
# the HPA's own defaults (kube-controller-manager): a capacity asking for others needs an autoscaler that takes them
HPA_DEFAULT_TOLERANCE = 0.1
HPA_DEFAULT_SCALE_DOWN_S = 300
HPA_DEFAULT_SCALE_UP_S = 0
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
    """A Kubernetes object name (DNS-1123: at most 63 lowercase letters, digits and '-', a letter or digit at each
    end). A longer name is cut and ends in a digest of the whole, so two models alike in their first 63
    characters get two objects (the cut alone made one, and could end in '-', which Kubernetes refuses)."""
    full = _K8S_NAME.sub("-", name.lower()).strip("-") or "model"
    return full if len(full) <= 63 else f"{full[:56].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:6]}"


def build(kinds: list[str], *, target, name: str, version: int, tag: str | None, base_uri: str,
          peak_mb: float | None, peak_source: str, margin: float, threads: int | None, gpu: bool,
          local_dir: Path, capacity=None, capacity_path: str | None = None,
          ovms: dict | None = None) -> tuple[dict, list]:
    """{kind: manifest dict}, notes. `target` (a package.target.Target) says the model format, KServe's runtime
    and which folder a cluster reads; `capacity` (a contracts.capacity.CapacityFile) adds replicas and autoscaling;
    `ovms` (the version is OpenVINO IR: Target.serves_with's settings) makes KServe's predictor OpenVINO Model
    Server with its ServingRuntime beside it (kserve-ovms), and Seldon's requirement openvino."""
    notes = []
    resources: dict[str, Any] = {}
    memory = None
    if peak_mb is not None:
        memory = f"{math.ceil(peak_mb * (1 + margin))}Mi"
        # OVMS runs the requests in flight as streams of one model: their threads together
        cores = (threads or 1) * (ovms["concurrency"] if ovms else 1)
        resources = {"requests": {"memory": memory, "cpu": str(cores)}, "limits": {"memory": memory}}
        notes.append(f"memory request {memory}: the measured peak {peak_mb:.1f} MiB ({peak_source}) plus a "
                     f"{margin:.0%} margin (--memory-margin)")
    elif capacity is None or not capacity.resources.requests.memory:
        notes.append("no measured memory (give --report or --tuned): the manifests carry no memory request")
    if capacity is not None:
        resources, memory = capacity_resources(resources, capacity, capacity_path or "CAPACITY.json", notes)
    if gpu:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = "1"
    k8s = k8s_name(name)
    labels = {"app.kubernetes.io/managed-by": "optkit", "optkit/version": str(version)}
    if tag:
        labels["optkit/tag"] = k8s_name(tag)
    out: dict[str, dict] = {}
    fmt = "openvino" if ovms else target.manifest_format
    kserve_uri, seldon_uri = target.manifest_uris(base_uri, name, version)
    if "kserve" in kinds and ovms:
        model = manifests_ovms.predictor_model(k8s, f"{base_uri}/{name}", version, ovms["threads"],
                                               ovms["concurrency"], ovms["batch"], notes)
        out["kserve-ovms"] = manifests_ovms.serving_runtime(k8s, labels, ovms["openvino"])
    elif "kserve" in kinds:
        model = {"modelFormat": {"name": fmt}, "protocolVersion": "v2", "storageUri": kserve_uri}
        if target.manifest_runtime:
            model["runtime"] = target.manifest_runtime
    if "kserve" in kinds:
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
    if capacity is not None:
        apply_capacity(out, capacity, capacity_path or "CAPACITY.json", k8s, labels, notes)
    return out, notes


def capacity_resources(own: dict, capacity, where: str, notes: list) -> tuple[dict, str | None]:
    """The resources the manifests carry: the capacity's requests and limits wherever it states them (they size
    the replicas the capacity counted), else the package's own (memory from the measured peak, cpu from threads).
    Returns (resources, the memory request)."""
    out = {part: dict(own.get(part) or {}) for part in ("requests", "limits")}
    said = []
    for part in ("requests", "limits"):
        stated = getattr(capacity.resources, part)
        for key in ("cpu", "memory"):
            value = getattr(stated, key)
            if value is None:
                continue
            mine = out[part].get(key)
            out[part][key] = value
            said.append(f"{part}.{key} {value}" + (f" (the package's own: {mine})" if mine and mine != value else ""))
    if said:
        notes.append(f"resources from {where}: {', '.join(said)}; the rest from the package's own figures")
    else:
        notes.append(f"{where} states no resources: the package's own figures size them")
    resources = {part: v for part, v in out.items() if v}
    return resources, (resources.get("requests") or {}).get("memory")


def apply_capacity(out: dict[str, dict], capacity, where: str, k8s: str, labels: dict, notes: list) -> None:
    """Replicas and autoscaling in each manifest's own fields.

    KServe: the predictor's minReplicas/maxReplicas always. A cpu target with no schedule and the HPA's default
    stabilization windows goes in KServe's own scaleMetric/scaleTarget (RawDeployment, autoscalerClass hpa: KServe
    makes the HPA). A schedule or other windows need an autoscaler KServe's fields cannot describe: KServe
    documents KEDA for RawDeployment, and its own KEDA class takes no cron trigger, so the InferenceService says
    autoscalerClass external (KServe makes no autoscaler) and a KEDA ScaledObject beside it (kserve-keda.yaml)
    scales the predictor Deployment on cpu plus one cron trigger per schedule window, with the HPA behaviour
    (stabilization windows) KEDA passes on. An rps target is Knative's (Serverless mode, KPA): no schedule there.
    Seldon Core v2: Model spec.replicas (the minimum, to start), minReplicas, maxReplicas, memory. KubeDL: the
    ModelVersion carries no replicas (see the note)."""
    a, r = capacity.autoscaling, capacity.replicas
    sched = capacity.schedule
    notes.append(f"replicas and autoscaling from {where}: min {r.min}, max {r.max} (peak {r.peak}), {a.metric} "
                 + (f"target {a.target_utilization:.0%} of the cpu request" if a.metric == "cpu" else
                    f"target {a.target_rps_per_replica:g} requests/s per replica")
                 + (f", {len(sched)} scheduled window(s)" if sched else ""))
    default_windows = (a.scale_down_stabilization_s == HPA_DEFAULT_SCALE_DOWN_S
                       and a.scale_up_stabilization_s == HPA_DEFAULT_SCALE_UP_S)
    if a.tolerance != HPA_DEFAULT_TOLERANCE:
        notes.append(f"autoscaling.tolerance {a.tolerance:g} is not the HPA's default 0.1, which is cluster-wide "
                     "(kube-controller-manager --horizontal-pod-autoscaler-tolerance): the manifests cannot set it")
    notes.append(f"autoscaling.startup_s {a.startup_s}: the replay's pod start-up time; no manifest field sets it "
                 "(a readiness probe on the server decides when a replica takes traffic)")
    if "kserve" in out:
        doc = out["kserve"]
        pred = doc["spec"]["predictor"]
        pred["minReplicas"], pred["maxReplicas"] = r.min, r.max
        ann = doc["metadata"].setdefault("annotations", {})
        if a.metric == "rps":
            ann["serving.kserve.io/deploymentMode"] = "Serverless"
            pred["scaleMetric"], pred["scaleTarget"] = "rps", max(1, round(a.target_rps_per_replica))
            notes.append("KServe: rps scaling is Knative's (Serverless mode, scaleMetric rps); Knative's autoscaler "
                         "takes no stabilization windows as the HPA does"
                         + (f" and no schedule: the {len(sched)} scheduled window(s) are not in the KServe manifest"
                            if sched else ""))
        elif sched or not default_windows:
            ann["serving.kserve.io/deploymentMode"] = "RawDeployment"
            ann["serving.kserve.io/autoscalerClass"] = "external"
            out["kserve-keda"] = keda_scaled_object(capacity, k8s, labels)
            why = "the schedule needs" if sched else "stabilization windows other than the HPA's defaults need"
            notes.append(f"KServe: {why} KEDA: kserve-keda.yaml scales Deployment {k8s}-predictor (KServe's "
                         "RawDeployment name) on cpu and cron; the InferenceService says autoscalerClass external, so "
                         "KServe makes no HPA of its own")
        else:
            ann["serving.kserve.io/deploymentMode"] = "RawDeployment"
            ann["serving.kserve.io/autoscalerClass"] = "hpa"
            pred["scaleMetric"], pred["scaleTarget"] = "cpu", max(1, round(a.target_utilization * 100))
    if "seldon" in out:
        spec = out["seldon"]["spec"]
        spec["replicas"], spec["minReplicas"], spec["maxReplicas"] = r.min, r.min, r.max
        notes.append("Seldon Core v2: Model replicas/minReplicas/maxReplicas; Seldon scales models itself between "
                     "them (or an HPA on the model's infer_rps metric): no cpu target, schedule or stabilization "
                     "window in a Model, and cpu requests belong to the Server, not the Model")
    if "kubedl" in out:
        notes.append("KubeDL: a ModelVersion holds no replicas; KubeDL's Inference predictor takes replicas and "
                     "autoScale min/max (with an HPA it references) but no metric target, schedule or windows: give "
                     f"it replicas {r.min}, autoScale {r.min}-{r.max} from {where}")


def keda_scaled_object(capacity, k8s: str, labels: dict) -> dict:
    """A KEDA ScaledObject (keda.sh/v1alpha1) for KServe's RawDeployment predictor: a cpu trigger at the target
    utilization, a cron trigger per schedule window, and the HPA behaviour (stabilization windows)."""
    a, r = capacity.autoscaling, capacity.replicas
    triggers: list[dict[str, Any]] = [{"type": "cpu", "metricType": "Utilization",
                                       "metadata": {"value": str(max(1, round(a.target_utilization * 100)))}}]
    for w in capacity.schedule:
        triggers.append({"type": "cron", "metadata": {"timezone": w.timezone, "start": w.start, "end": w.end,
                                                      "desiredReplicas": str(w.desired_replicas)}})
    behavior = {"scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_s},
                "scaleUp": {"stabilizationWindowSeconds": a.scale_up_stabilization_s}}
    name = f"{k8s}-predictor"  # the Deployment KServe makes for a RawDeployment predictor
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": name, "labels": labels},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                     "minReplicaCount": r.min, "maxReplicaCount": r.max,
                     "advanced": {"horizontalPodAutoscalerConfig": {"name": name, "behavior": behavior}},
                     "triggers": triggers}}


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
