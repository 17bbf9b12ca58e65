"""KServe manifests for OpenVINO Model Server (OVMS), for a version packaged as OpenVINO IR (`--backend openvino`):
a ServingRuntime running the image openvino/model_server, and the InferenceService whose predictor it serves.

OVMS reads a model folder holding numbered version folders with model.xml + model.bin in them, which is the
package's own layout (REPO/NAME/N/model.xml): the storageUri is the model folder, mounted at /mnt/models, and
--model_version_policy serves this version only. It answers KServe's protocol v2 on its REST port (and gRPC v2).
The tuned settings become its --plugin_config (OpenVINO CPU properties) and --nireq: optkit measures each request
in flight on its own compiled model with one stream and `threads` threads, which one OVMS model expresses as one
stream per request in flight (NUM_STREAMS = concurrency, INFERENCE_NUM_THREADS = threads x concurrency).
OVMS is not on PyPI, so nothing here is served by a test: the manifests are checked for structure only."""
from __future__ import annotations

import hashlib
from typing import Any

from optkit.core import strictjson
from optkit.runtimes.openvino import compile_settings

IMAGE = "openvino/model_server"
FORMAT = "openvino_ir"        # KServe's model format name for OpenVINO IR
REST_PORT, GRPC_PORT = 8080, 8001
MOUNT = "/mnt/models"         # where KServe's storage initializer puts the storageUri's content


def plugin_config(threads: int | None, concurrency: int) -> dict[str, str]:
    """OVMS's --plugin_config: optkit's OpenVINO settings, one stream per request in flight."""
    cfg = compile_settings(threads * concurrency if threads else None)
    cfg["NUM_STREAMS"] = str(concurrency)
    return cfg


def runtime_name(k8s: str) -> str:
    """The ServingRuntime's name: the model's with '-ovms' (a longer one cut, and set apart by a digest of the whole)."""
    if len(k8s) <= 58:
        return f"{k8s}-ovms"
    return f"{k8s[:51].rstrip('-')}-{hashlib.sha256(k8s.encode()).hexdigest()[:6]}-ovms"


def serving_runtime(k8s: str, labels: dict, openvino_version: str) -> dict[str, Any]:
    """A namespaced ServingRuntime (serving.kserve.io/v1alpha1) for this model's InferenceService: the server,
    its ports and where the model is; the model's own settings are the InferenceService's args."""
    tag = ".".join(openvino_version.split(".")[:2])
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime",
            "metadata": {"name": runtime_name(k8s), "labels": labels},
            "spec": {"supportedModelFormats": [{"name": FORMAT, "autoSelect": False}],
                     "protocolVersions": ["v2", "grpc-v2"], "multiModel": False,
                     "containers": [{"name": "kserve-container", "image": f"{IMAGE}:{tag}",
                                     "args": ["--model_name={{.Name}}", f"--model_path={MOUNT}",
                                              f"--port={GRPC_PORT}", f"--rest_port={REST_PORT}",
                                              "--grpc_bind_address=0.0.0.0", "--rest_bind_address=0.0.0.0",
                                              "--target_device=CPU", "--file_system_poll_wait_seconds=0"],
                                     "ports": [{"containerPort": REST_PORT, "protocol": "TCP"}]}]}}


def predictor_model(k8s: str, storage_uri: str, version: int, threads: int | None, concurrency: int,
                    batch: int, notes: list[str]) -> dict[str, Any]:
    """The InferenceService's spec.predictor.model (resources are added by the caller)."""
    cfg = plugin_config(threads, concurrency)
    notes.append(f"OVMS (kserve-ovms.yaml's ServingRuntime; its image tag is the OpenVINO release that wrote the IR): "
                 "--plugin_config "
                 f"{_compact(cfg)} and --nireq {concurrency}: one stream per request in "
                 f"flight, as tune measured {concurrency} in flight" + (f" with {threads} thread(s) each" if threads
                                                                        else ""))
    if batch > 1:
        notes.append(f"OVMS does not batch separate requests: clients send batches of {batch} (the tuned batch; the "
                     "IR takes any batch size its dims allow)")
    notes.append(f"OVMS serves version {version} only (--model_version_policy); storageUri is the model folder, "
                 "whose numbered folders OVMS reads as versions")
    return {"modelFormat": {"name": FORMAT}, "protocolVersion": "v2", "runtime": runtime_name(k8s),
            "storageUri": storage_uri,
            "args": [f"--plugin_config={_compact(cfg)}", f"--nireq={concurrency}",
                     f"--model_version_policy={_compact({'specific': {'versions': [version]}})}"]}


def _compact(value) -> str:
    return strictjson.dumps(value, separators=(",", ":"))
