"""Every dependency's telemetry off, before the dependency is imported (optkit/__init__.py calls switch_off, so
any entry point gets it, and child processes inherit the environment). optkit sends nothing over the network."""
from __future__ import annotations

import os
import sys

# what each library reads, found in their sources
OFF = {
    # onnxruntime's Linux builds start Microsoft's telemetry (a session file in $TMPDIR, a device id under
    # ~/.cache, look-ups of the collector's host) at import; only this variable, set before, stops it
    "ORT_DISABLE_TELEMETRY": "1",
    # MLflow 3 sends usage events to its host and writes ~/.config/mlflow/telemetry.json (mlflow.telemetry)
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # the common opt-out (consoledonottrack.com); MLflow reads it as "true"
    "DO_NOT_TRACK": "true",
    # TensorFlow turns its runtime uptime metric on by default (tensorflow/__init__.py)
    "ENABLE_RUNTIME_UPTIME_TELEMETRY": "0",
    # Hugging Face Hub (transformers, datasets, optimum), Gradio: when a user's environment has them
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
}


def switch_off() -> None:
    """Set OFF in the environment (a variable the user set is theirs: 0 opts back in); a library imported
    before optkit is told too, where it can be."""
    for name, value in OFF.items():
        os.environ.setdefault(name, value)
    # OpenVINO's converter (ov.convert_model) and NNCF report usage through openvino_telemetry, which has no
    # variable to opt out: without a consent file it sends and writes a client id under ~/intel. Both fall back to
    # their own no-op stub when the module cannot be imported, so it is made unimportable (unless already loaded)
    sys.modules.setdefault("openvino_telemetry", None)
    if "onnxruntime" in sys.modules:
        sys.modules["onnxruntime"].disable_telemetry_events()
    client = sys.modules.get("mlflow.telemetry.client")
    if client is not None:
        try:
            client.set_telemetry_client()  # reads the environment again: no client
        except Exception:  # noqa: BLE001 - MLflow's private API moved: its variable still holds for children
            pass
