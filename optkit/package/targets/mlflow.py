"""An MLflow model (`mlflow.onnx` flavor) for a package version: the tuned onnxruntime options in the flavor's
providers and session options, TensorSpec signatures from the graph (an inferred one breaks predict) and the
lineage in `metadata`. What MLflow's MLmodel cannot express is said, with what was written instead."""
from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import Field

from optkit.core.atomic import Output
from optkit.core.dburl import is_sqlite, sqlite_file
from optkit.core.errors import PassError, UsageError
from optkit.core.registry import cli, require_extra
from optkit.package import registry as reg
from optkit.package import repo
from optkit.package.signature import Signature
from optkit.package.target import Job, Served, Target, TargetConfig
from optkit.package.tuned import Tuned

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
             "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]}
# optkit's graph_optimization -> onnxruntime.GraphOptimizationLevel values MLflow's loader passes on
GRAPH_LEVEL = {"disable": 0, "basic": 1, "extended": 2, "all": 99}


def settings(tuned: Tuned, batchable: bool) -> tuple[dict, list[str], list[dict], list[str]]:
    """(session options, providers, mapping rows, notes) for the flavor."""
    s, mapping, notes = tuned.session, [], []
    provider = tuned.get("provider") or "cpu"
    providers = PROVIDERS.get(provider, PROVIDERS["cpu"])
    mapping.append({"setting": "provider", "value": provider, "field": "flavors.onnx.providers",
                    "written": providers})
    opts: dict = {}
    if tuned.get("threads"):
        opts["intra_op_num_threads"] = int(tuned.get("threads"))
        mapping.append({"setting": "threads", "value": tuned.get("threads"),
                        "field": "onnx_session_options.intra_op_num_threads", "written": opts["intra_op_num_threads"]})
    mode = s.get("execution_mode") or "sequential"
    opts["execution_mode"] = mode
    mapping.append({"setting": "session.execution_mode", "value": mode,
                    "field": "onnx_session_options.execution_mode", "written": mode})
    if mode == "parallel" and s.get("inter_op_threads"):
        opts["inter_op_num_threads"] = int(s["inter_op_threads"])
        mapping.append({"setting": "session.inter_op_threads", "value": s["inter_op_threads"],
                        "field": "onnx_session_options.inter_op_num_threads", "written": opts["inter_op_num_threads"]})
    level = s.get("graph_optimization") or "all"
    opts["graph_optimization_level"] = GRAPH_LEVEL[level]
    mapping.append({"setting": "session.graph_optimization", "value": level,
                    "field": "onnx_session_options.graph_optimization_level", "written": GRAPH_LEVEL[level]})
    if level == "disable":
        notes.append("graph_optimization disable cannot be expressed: MLflow's loader applies "
                     "graph_optimization_level only when it is not 0; wrote 0, which loads as onnxruntime's "
                     "default (all)")
    for key, what in (("cpu_mem_arena", "enable_cpu_mem_arena"), ("mem_pattern", "enable_mem_pattern")):
        value = s.get(key, True)
        mapping.append({"setting": f"session.{key}", "value": value, "field": None, "written": None})
        if value is False:
            notes.append(f"{key} off cannot be expressed: MLflow's onnx flavor has no {what}; not written "
                         "(onnxruntime's default: on)")
    for key in ("batch", "concurrency", "sessions"):
        value = tuned.get(key)
        mapping.append({"setting": key, "value": value, "field": None, "written": None})
    if int(tuned.get("batch") or 1) > 1 or int(tuned.get("concurrency") or 1) > 1:
        notes.append(f"batch {tuned.get('batch')}, {tuned.get('concurrency')} in flight "
                     f"({tuned.get('sessions')} sessions) cannot be expressed in an MLmodel: MLflow runs each "
                     "request as sent; batch on the client and set the server's workers (kept in metadata)")
    return opts, providers, mapping, notes


def write(vdir: Path, model_path: str, has_external: bool, sig: Signature, opts: dict, providers: list[str],
          metadata: dict) -> None:
    """Save the MLflow model into the (empty, existing) folder vdir."""
    import mlflow
    import mlflow.onnx
    import numpy as np
    import onnx
    import onnxruntime
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    for t in sig.inputs + sig.outputs:
        if t.numpy_dtype == "bfloat16":
            raise UsageError(f"{t.name!r} is bfloat16, which MLflow's TensorSpec (numpy) cannot describe; package it "
                             "for Triton (TYPE_BF16) or cast it to float32 in the model")

    def spec(tensors):
        return Schema([TensorSpec(np.dtype(t.numpy_dtype), tuple(t.dims), t.name) for t in tensors])

    signature = ModelSignature(inputs=spec(sig.inputs), outputs=spec(sig.outputs))
    staged = vdir / ".mlflow"
    mlflow.onnx.save_model(
        onnx.load(model_path), str(staged), signature=signature, onnx_execution_providers=providers,
        onnx_session_options=opts, metadata=metadata, save_as_external_data=has_external,
        pip_requirements=[f"onnx=={onnx.__version__}", f"onnxruntime=={onnxruntime.__version__}",
                          f"mlflow-skinny=={mlflow.__version__}"])
    for entry in staged.iterdir():
        shutil.move(str(entry), str(vdir / entry.name))
    staged.rmdir()


class MLflowOptions(TargetConfig):
    registry: str | None = Field(default=None, description="MLflow: also register the version in this model "
                                                           "registry (default: MLFLOW_REGISTRY_URI) and point the "
                                                           "alias 'served' at it.",
                                 json_schema_extra=cli("--registry"))


class MLflowTarget(Target):
    name = "mlflow"
    describe = "an MLflow model (the onnx flavor), optionally registered in a model registry"
    Config = MLflowOptions
    serve_options = {"registry": "MLflow: move the alias 'served' in this model registry (default: "
                                 "MLFLOW_REGISTRY_URI)."}
    manifest_format = "mlflow"

    def check(self, config, options) -> None:
        require_extra("serve", "optkit package --to mlflow")
        if reg.uri(options.registry):  # before anything is written: a database of someone else's is refused
            reg.check(reg.uri(options.registry))

    def outputs(self, options, key) -> list[Output]:
        """An SQLite registry's file is written too (never one of the inputs)."""
        if options.registry and is_sqlite(options.registry):
            return [Output(key("registry"), sqlite_file(options.registry, "MLflow registry"))]
        return []

    def prepare(self, job: Job) -> None:
        opts, providers, mapping, notes = settings(job.tuned, job.sig.batchable)
        job.state.update(opts=opts, providers=providers)
        job.mapping[:] = mapping
        job.notes.extend(notes)
        if job.tuned.get("runtime") == "openvino":
            job.notes.append(f"--tuned {job.tuned.source} picked openvino; MLflow's onnx flavor runs onnxruntime: its "
                             "figures were measured on openvino, not on what this package serves (--to triton "
                             "--backend openvino serves OpenVINO)")

    def write_version(self, job: Job, vdir: Path, number: int) -> dict[str, str]:
        write(vdir, job.model, bool(job.externals), job.sig, job.state["opts"], job.state["providers"],
              {"optkit": job.lineage(number, {})})
        return {}

    def validate(self, job: Job, vdir: Path) -> None:
        if not (vdir / "MLmodel").is_file():
            raise PassError(f"{vdir} holds no MLmodel after mlflow.onnx.save_model")

    def after_commit(self, job: Job, model_dir: Path, number: int) -> None:
        """Register the new version where a registry is configured (under the lock: the index changes)."""
        where = reg.uri(job.options.registry)
        if not where:
            return
        number_in_registry = reg.register(where, job.name, model_dir / str(number), number, job.tag)
        index = repo.load_index(model_dir)
        for v in index["versions"]:
            if v["version"] == number:
                v["registry"] = {"uri": reg.shown(where), "version": number_in_registry, "alias": reg.ALIAS}
        repo.commit_index(model_dir, index)
        job.notes.append(f"registered in {reg.shown(where)} as {job.name} version {number_in_registry}, alias "
                         f"{reg.ALIAS} (models:/{job.name}@{reg.ALIAS})")

    def serve(self, model_dir: Path, index: dict, number: int, recorded: dict, options) -> Served:
        out = Served(before=index.get("served"))
        where = reg.uri(options.registry)
        if where:
            entry = next(v for v in index["versions"] if v["version"] == number)
            rec = entry.get("registry") or {}
            known = rec.get("version") if rec.get("uri") in (where, reg.shown(where)) else None
            now_served, was = reg.point_alias(where, index["name"], model_dir / str(number), number,
                                              entry.get("tag"), known)
            entry["registry"] = {"uri": reg.shown(where), "version": now_served, "alias": reg.ALIAS}
            out.record = {"uri": reg.shown(where), "alias": reg.ALIAS, "version": now_served, "before": was}
        return out
