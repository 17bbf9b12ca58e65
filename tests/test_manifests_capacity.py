"""Issue 33, part 4: `optkit package --manifests ... --capacity CAPACITY.json` puts replicas, autoscaling and resources
in each manifest's own fields. Every manifest (and every standard piece inside a custom resource) loads into the
`kubernetes` client's typed models with nothing dropped, and survives the YAML round trip; a bad CAPACITY.json is
exit 2, one line naming the key, nothing written.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import SAMPLES, one_error_line, run_cli

pytestmark = pytest.mark.usefixtures("fresh_home_and_tmp")
kubernetes = pytest.importorskip("kubernetes", reason="pip install kubernetes (the test extra)")

CNN = "cnn.onnx"

CNN_SHA256 = hashlib.sha256((SAMPLES / "torch_cnn.onnx").read_bytes()).hexdigest()
CAPACITY = {
    "schema": 2, "model": CNN, "model_sha256": CNN_SHA256, "slo": {"p99_ms": 50.0},
    "per_replica": {"throughput_per_s": 120.5, "throughput_source": "bench --url report.json (c=4)", "p99_ms": 31.2,
                    "cpu_cores": 1.0, "cpu_per_1000_samples_s": 8.1, "memory_mb": 210.0, "source": "report.json"},
    "headroom": 0.2,
    "replicas": {"min": 2, "max": 8, "peak": 6},
    "resources": {"requests": {"cpu": "1000m", "memory": "256Mi"}, "limits": {"cpu": "2000m", "memory": "512Mi"}},
    "autoscaling": {"metric": "cpu", "target_utilization": 0.6, "target_rps_per_replica": 72.3, "tolerance": 0.1,
                    "scale_down_stabilization_s": 300, "scale_up_stabilization_s": 0, "startup_s": 30},
    "schedule": [{"start": "0 8 * * 1-5", "end": "0 18 * * 1-5", "desired_replicas": 5, "timezone": "UTC"},
                 {"start": "30 12 13 7 *", "end": "0 16 13 7 *", "desired_replicas": 8, "timezone": "UTC"}],
    "replay": {"reactive": {"slo_minutes": 3, "replica_hours": 101.5}},
}


def _api():
    from kubernetes.client import ApiClient

    return ApiClient()


def typed(data: dict, klass: str):
    """`data` as the client's typed model `klass`; its serialization must give `data` back (a key the model does not
    know, or a value of the wrong type, is dropped or changed by the client: caught here)."""
    api = _api()
    obj = api._ApiClient__deserialize(copy.deepcopy(data), klass)
    assert type(obj).__name__ == klass
    back = api.sanitize_for_serialization(obj)
    assert back == data, (klass, data, back)
    return obj


def write_capacity(folder: Path, doc: dict | str, name: str = "CAPACITY.json") -> Path:
    p = folder / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


@pytest.fixture
def work(tmp_path) -> Path:
    shutil.copyfile(SAMPLES / "torch_cnn.onnx", tmp_path / CNN)
    return tmp_path


def package(work: Path, cap: dict, kinds: str = "kserve,seldon,kubedl") -> dict[str, dict]:
    write_capacity(work, cap)
    r = run_cli("package", CNN, "--to", "triton", "-o", "repo", "--manifests", kinds, "--capacity", "CAPACITY.json",
                cwd=work, timeout=180)
    assert r.rc == 0, r.err
    folder = work / "repo" / "cnn" / "1" / "manifests"
    docs = {}
    for p in sorted(folder.glob("*.yaml")):
        text = p.read_text()
        doc = yaml.safe_load(text)
        assert yaml.safe_load(yaml.safe_dump(doc, sort_keys=False)) == doc  # the YAML round trip
        docs[p.stem] = doc
    lineage = json.loads((work / "repo" / "cnn" / "1" / "optkit-package.json").read_text())
    docs["_notes"] = lineage.get("notes", [])
    docs["_out"] = r.out + r.err
    return docs


def hpa_of_scaled_object(so: dict) -> dict:
    """The HorizontalPodAutoscaler (autoscaling/v2) KEDA makes of a ScaledObject's cpu trigger and behaviour."""
    spec = so["spec"]
    cpu = next(t for t in spec["triggers"] if t["type"] == "cpu")
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": spec["advanced"]["horizontalPodAutoscalerConfig"]["name"]},
            "spec": {"scaleTargetRef": spec["scaleTargetRef"], "minReplicas": spec["minReplicaCount"],
                     "maxReplicas": spec["maxReplicaCount"],
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                         "type": "Utilization", "averageUtilization": int(cpu["metadata"]["value"])}}}],
                     "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]}}


# ------------------------------------------------------------------ what each manifest carries

def test_schedule_gives_kserve_a_keda_scaled_object_and_seldon_its_replicas(work):
    docs = package(work, CAPACITY)
    assert set(docs) - {"_notes", "_out"} == {"kserve", "kserve-keda", "seldon", "kubedl"}
    isvc = docs["kserve"]
    pred = isvc["spec"]["predictor"]
    assert (pred["minReplicas"], pred["maxReplicas"]) == (2, 8)
    ann = isvc["metadata"]["annotations"]
    assert ann["serving.kserve.io/autoscalerClass"] == "external"  # KServe makes no HPA: KEDA's owns the Deployment
    assert ann["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert "scaleMetric" not in pred
    res = typed(pred["model"]["resources"], "V1ResourceRequirements")
    assert res.requests == {"cpu": "1000m", "memory": "256Mi"} and res.limits == {"cpu": "2000m", "memory": "512Mi"}

    so = docs["kserve-keda"]
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "cnn-predictor"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 8)
    crons = [t["metadata"] for t in spec["triggers"] if t["type"] == "cron"]
    assert crons == [{"timezone": "UTC", "start": "0 8 * * 1-5", "end": "0 18 * * 1-5", "desiredReplicas": "5"},
                     {"timezone": "UTC", "start": "30 12 13 7 *", "end": "0 16 13 7 *", "desiredReplicas": "8"}]
    assert all(isinstance(v, str) for c in crons for v in c.values())  # KEDA's trigger metadata is map[string]string
    cpu = [t for t in spec["triggers"] if t["type"] == "cpu"]
    assert cpu == [{"type": "cpu", "metricType": "Utilization", "metadata": {"value": "60"}}]
    behavior = typed(spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
                     "V2HorizontalPodAutoscalerBehavior")
    assert behavior.scale_down.stabilization_window_seconds == 300
    assert behavior.scale_up.stabilization_window_seconds == 0
    hpa = typed(hpa_of_scaled_object(so), "V2HorizontalPodAutoscaler")
    assert hpa.spec.metrics[0].resource.target.average_utilization == 60
    typed(spec["scaleTargetRef"], "V2CrossVersionObjectReference")
    typed({"name": so["metadata"]["name"], "labels": so["metadata"]["labels"]}, "V1ObjectMeta")

    seldon = docs["seldon"]["spec"]
    assert (seldon["replicas"], seldon["minReplicas"], seldon["maxReplicas"]) == (2, 2, 8)
    assert seldon["memory"] == "256Mi"  # the capacity's request wins over the package's own (none measured here)
    assert "replicas" not in json.dumps(docs["kubedl"]["spec"])  # a ModelVersion has no replicas: said instead
    notes = " ".join(docs["_notes"])
    assert "KubeDL" in notes and "autoScale 2-8" in notes
    assert "resources from CAPACITY.json" in notes and "startup_s 30" in notes
    for kind in ("kserve", "kserve-keda", "seldon", "kubedl"):
        typed(docs[kind]["metadata"], "V1ObjectMeta")


def test_no_schedule_and_default_windows_use_kserve_own_hpa_fields(work):
    cap = copy.deepcopy(CAPACITY)
    cap["schedule"] = []
    docs = package(work, cap, "kserve")
    assert "kserve-keda" not in docs
    isvc = docs["kserve"]
    pred = isvc["spec"]["predictor"]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "hpa"
    assert (pred["scaleMetric"], pred["scaleTarget"], pred["minReplicas"], pred["maxReplicas"]) == ("cpu", 60, 2, 8)
    # the HPA KServe makes of these fields loads into the typed model
    typed({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "cnn-predictor"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "cnn-predictor"},
                    "minReplicas": pred["minReplicas"], "maxReplicas": pred["maxReplicas"],
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                        "type": "Utilization", "averageUtilization": pred["scaleTarget"]}}}]}},
          "V2HorizontalPodAutoscaler")


def test_windows_other_than_the_hpa_defaults_need_keda_even_without_a_schedule(work):
    cap = copy.deepcopy(CAPACITY)
    cap["schedule"] = []
    cap["autoscaling"]["scale_down_stabilization_s"] = 600
    docs = package(work, cap, "kserve")
    so = docs["kserve-keda"]
    assert [t["type"] for t in so["spec"]["triggers"]] == ["cpu"]
    typed(hpa_of_scaled_object(so), "V2HorizontalPodAutoscaler")
    assert "stabilization windows other than the HPA's defaults" in " ".join(docs["_notes"])


def test_rps_target_is_knative_and_the_schedule_it_cannot_carry_is_said(work):
    cap = copy.deepcopy(CAPACITY)
    cap["autoscaling"]["metric"] = "rps"
    docs = package(work, cap, "kserve")
    pred = docs["kserve"]["spec"]["predictor"]
    assert docs["kserve"]["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Serverless"
    assert (pred["scaleMetric"], pred["scaleTarget"]) == ("rps", 72)
    assert "kserve-keda" not in docs
    assert "2 scheduled window(s) are not in the KServe manifest" in " ".join(docs["_notes"])


def test_capacity_resources_win_over_the_measured_memory_and_say_so(work):
    """The package's own memory request (measured peak + margin) is replaced by the capacity's, and the note names
    both; a capacity stating no resources leaves the package's own."""
    best = {"model": CNN, "objective": ["throughput"],
            "best": {"setting": {"provider": "cpu", "threads": 2, "batch": 4, "concurrency": 1}, "label": "t",
                     "figures": {"throughput_per_s": 900.0, "memory_mb": 100.0}, "trial": 0}}
    from optkit.core.artifact import Artifact

    best["model_sha256"] = Artifact.load(str(work / CNN)).sha256
    (work / "best.json").write_text(json.dumps(best))
    write_capacity(work, CAPACITY)
    r = run_cli("package", CNN, "--to", "triton", "-o", "repo", "--tuned", "best.json", "--manifests", "kserve",
                "--capacity", "CAPACITY.json", cwd=work, timeout=180)
    assert r.rc == 0, r.err
    isvc = yaml.safe_load((work / "repo" / "cnn" / "1" / "manifests" / "kserve.yaml").read_text())
    assert isvc["spec"]["predictor"]["model"]["resources"]["requests"] == {"memory": "256Mi", "cpu": "1000m"}
    assert "requests.memory 256Mi (the package's own: 150Mi)" in " ".join((r.out + r.err).split())

    cap = copy.deepcopy(CAPACITY)
    cap["resources"] = {"requests": {}, "limits": {}}
    write_capacity(work, cap)
    r = run_cli("package", CNN, "--to", "triton", "-o", "repo2", "--tuned", "best.json", "--manifests", "kserve",
                "--capacity", "CAPACITY.json", cwd=work, timeout=180)
    assert r.rc == 0, r.err
    isvc = yaml.safe_load((work / "repo2" / "cnn" / "1" / "manifests" / "kserve.yaml").read_text())
    res = typed(isvc["spec"]["predictor"]["model"]["resources"], "V1ResourceRequirements")
    assert res.requests == {"memory": "150Mi", "cpu": "2"}


# ------------------------------------------------------------------ CAPACITY.json is hostile input

def _set(path: str, value):
    def change(doc):
        node = doc
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if value is _DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
        return doc
    return change


_DELETE = object()

BAD = {
    "schema-1": (_set("schema", 1), "key schema: schema 1 is a CAPACITY.json written before it recorded its model"),
    "schema-3": (_set("schema", 3), "key schema"),
    "sha256-missing": (_set("model_sha256", _DELETE), "key model_sha256"),
    "sha256-null": (_set("model_sha256", None), "key model_sha256: null, but the figures are not of a served model"),
    "sha256-short": (_set("model_sha256", "abc"), "key model_sha256"),
    "slo-inf": (_set("slo.p99_ms", math.inf), "key slo.p99_ms"),
    "slo-past-bound": (_set("slo.p99_ms", 1e300), "key slo.p99_ms"),
    "tolerance-1": (_set("autoscaling.tolerance", 1.0), "key autoscaling.tolerance"),
    "notes-nan": (_set("notes", [math.nan]), "key notes.0"),
    "schema-missing": (_set("schema", _DELETE), "key schema"),
    "min-above-max": (_set("replicas.min", 9), "key replicas: min 9 is above max 8"),
    "min-zero": (_set("replicas.min", 0), "key replicas.min"),
    "max-huge": (_set("replicas.max", 10 ** 12), "key replicas.max"),
    "max-float": (_set("replicas.max", 8.0), "key replicas.max"),
    "max-bool": (_set("replicas.max", True), "key replicas.max"),
    "peak-text": (_set("replicas.peak", "6"), "key replicas.peak"),
    "throughput-nan": (_set("per_replica.throughput_per_s", math.nan), "key per_replica.throughput_per_s"),
    "throughput-inf": (_set("per_replica.throughput_per_s", math.inf), "key per_replica.throughput_per_s"),
    "throughput-zero": (_set("per_replica.throughput_per_s", 0.0), "key per_replica.throughput_per_s"),
    "memory-huge": (_set("per_replica.memory_mb", 1e300), "key per_replica.memory_mb"),
    "headroom-negative": (_set("headroom", -0.5), "key headroom"),
    "utilization-above-1": (_set("autoscaling.target_utilization", 60), "key autoscaling.target_utilization"),
    "metric-unknown": (_set("autoscaling.metric", "gpu"), "key autoscaling.metric"),
    "window-huge": (_set("autoscaling.scale_down_stabilization_s", 10 ** 9),
                    "key autoscaling.scale_down_stabilization_s"),
    "cpu-no-unit": (_set("resources.requests.cpu", "1"), "key resources.requests.cpu"),
    "cpu-huge": (_set("resources.limits.cpu", "9999999999m"), "key resources.limits.cpu"),
    "memory-gi": (_set("resources.requests.memory", "1Gi"), "key resources.requests.memory"),
    "memory-injection": (_set("resources.requests.memory", "256Mi\n  evil: 1"), "key resources.requests.memory"),
    "requests-above-limits": (_set("resources.requests.memory", "1024Mi"), "requests.memory 1024Mi is above limits"),
    "cron-four-fields": (_set("schedule.0.start", "0 8 * *"), "key schedule.0.start"),
    "cron-injection": (_set("schedule.0.end", "0 18 * * 1-5\"; rm"), "key schedule.0.end"),
    "desired-above-max": (_set("schedule.0.desired_replicas", 50), "schedule.0.desired_replicas 50 is above"),
    "timezone-bad": (_set("schedule.0.timezone", "../../etc/passwd"), "key schedule.0.timezone"),
    "schedule-unknown-key": (_set("schedule.0.weekday", "mon"), "key schedule.0.weekday"),
    "replicas-extra-nan": (_set("replicas.fixed_for_peak", math.nan), "key replicas.fixed_for_peak"),
    "replicas-other-nan": (_set("replicas.other", math.nan), "key replicas: other is nan"),
    "resources-unknown-key": (_set("resources.requests.gpu", "1"), "key resources.requests.gpu"),
    "replay-nan": (_set("replay.reactive.slo_minutes", math.nan), "replay.reactive.slo_minutes"),
    "per-replica-missing": (_set("per_replica", _DELETE), "key per_replica"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_capacity_is_refused_naming_the_key(case):
    from optkit.contracts import base, capacity
    from optkit.core.errors import UsageError

    change, expected = BAD[case]
    doc = change(copy.deepcopy(CAPACITY))
    data = json.loads(json.dumps(doc))  # NaN and Infinity as JSON's literals, as some tools write them
    with pytest.raises(UsageError) as e:
        base.validate(data, capacity.CapacityFile, "CAPACITY.json", capacity.HINT)
    line = e.value.message
    assert "\n" not in line and line.startswith("CAPACITY.json: ") and expected in line, line


def test_the_figures_optkit_capacity_adds_are_read():
    """`optkit capacity` (branch i33-capacity) writes a few figures more than the contract names, and resources it
    has no figure for as null: read, and the null ones left to the package's own."""
    from optkit.contracts import base, capacity

    doc = copy.deepcopy(CAPACITY)
    doc["replicas"].update(needed_at_peak=6, fixed_for_peak=7)
    doc["autoscaling"]["strategy"] = "forecast"
    doc["per_replica"]["request_bytes"] = 3136
    doc["resources"] = {"requests": {"cpu": None, "memory": "256Mi"}, "limits": {"cpu": None, "memory": "512Mi"}}
    doc["notes"] = ["per-replica throughput: bench --url"]
    cap = base.validate(doc, capacity.CapacityFile, "CAPACITY.json", capacity.HINT)
    assert cap.resources.requests.cpu is None and cap.replicas.max == 8


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else "dir" for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("content,expected", [
    (None, "key replicas: min 9 is above max 8"),
    (json.dumps(CAPACITY).replace('"min": 2', '"min": NaN'), "key replicas.min"),
    ("[1, 2]", "CAPACITY.json: Input should be"),
    ("{not json", "not JSON"),
], ids=["min-above-max", "nan-literal", "list", "not-json"])
def test_the_command_exits_2_with_one_line_and_writes_nothing(work, content, expected):
    bad = copy.deepcopy(CAPACITY)
    bad["replicas"]["min"] = 9
    write_capacity(work, content if content is not None else bad)
    before = snapshot(work)
    r = run_cli("package", CNN, "--to", "triton", "-o", "repo", "--manifests", "kserve,seldon", "--capacity",
                "CAPACITY.json", cwd=work, timeout=180)
    line = one_error_line(r)
    assert r.rc == 2, (r.rc, r.err)
    assert "CAPACITY.json" in line and expected in line and "internal error" not in line, line
    assert snapshot(work) == before and not (work / "repo").exists()


def test_capacity_needs_manifests_and_an_existing_regular_file(work):
    write_capacity(work, CAPACITY)
    r = run_cli("package", CNN, "--to", "triton", "-o", "repo", "--capacity", "CAPACITY.json", cwd=work)
    assert r.rc == 2 and "give --manifests" in one_error_line(r)
    r = run_cli("package", CNN, "--to", "triton", "-o", "repo", "--manifests", "kserve", "--capacity", "none.json",
                cwd=work)
    assert r.rc == 2 and "does not exist" in one_error_line(r)
    os.mkfifo(work / "fifo.json")
    r = run_cli("package", CNN, "--to", "triton", "-o", "repo", "--manifests", "kserve", "--capacity", "fifo.json",
                cwd=work, timeout=60)
    assert r.rc == 2 and "not a regular file" in one_error_line(r)
    assert not (work / "repo").exists()
