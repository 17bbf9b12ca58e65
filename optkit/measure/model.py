"""One entry point that measures an artifact: size, latency, accuracy and fidelity, in an isolated process."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from optkit.core.artifact import Artifact
from optkit.core.isolate import run_isolated


class MeasureSettings(BaseModel):
    """How to measure: runtime provider, threads, batch, warm-up and runs (or a duration)."""

    model_config = ConfigDict(extra="forbid")
    provider: str = "cpu"
    threads: int | None = Field(default=None, ge=1)
    batch: int = Field(default=1, ge=1)
    warmup: int = Field(default=10, ge=0)
    runs: int = Field(default=100, ge=1)
    duration: float | None = Field(default=None, gt=0)
    shapes: dict[str, list[int]] = Field(default_factory=dict)
    seed: int = 0


class DataSpec(BaseModel):
    """Where labelled or input data comes from."""

    model_config = ConfigDict(extra="forbid")
    path: str
    labels: str | None = None             # IDX labels file, when not beside the images
    preprocess: dict[str, Any] | None = None
    max_samples: int | None = Field(default=None, ge=1)


def measure(artifact: Artifact, settings: MeasureSettings | None = None, *, latency: bool = True,
            data: DataSpec | None = None, metric: str | None = None, reference: Artifact | None = None) -> dict:
    """Measure `artifact` in a child process (a crashing runtime becomes an exit-3 error)."""
    settings = settings or MeasureSettings()
    return run_isolated(_measure, artifact, settings, latency, data, metric, reference,
                        what=f"measuring {artifact.path}")


def _measure(artifact: Artifact, settings: MeasureSettings, latency: bool, data: DataSpec | None,
             metric: str | None, reference: Artifact | None) -> dict:
    from optkit.measure.accuracy import compute, run_over
    from optkit.measure.datasets import load_dataset
    from optkit.measure.fidelity import compare_outputs
    from optkit.measure.inputs import synthesize
    from optkit.measure.latency import measure_latency
    from optkit.measure.size import measure_size
    from optkit.runtimes.base import open_session

    result: dict[str, Any] = {"size": measure_size(artifact)}
    session = open_session(artifact, provider=settings.provider, threads=settings.threads)
    count = getattr(session, "parameter_count", None)
    if "parameters" not in result["size"] and count is not None:
        result["size"]["parameters"] = count()
    if not result["size"]["bytes"] and hasattr(session, "state_dict_bytes"):
        # a factory without a weights file has nothing on disk: count what its state dict would take
        result["size"]["bytes"] = session.state_dict_bytes()
        result["size"]["size_mb"] = result["size"]["bytes"] / 1e6
        result["size"]["bytes_from"] = "state dict"
    feeds = synthesize(session.inputs, settings.shapes, batch=settings.batch, seed=settings.seed)
    eval_feeds, labels, ds = feeds, None, None
    if data is not None:
        ds = load_dataset(data.path, data.preprocess, data.labels).subset(data.max_samples, settings.seed)
        eval_feeds, labels = ds.bind(session.inputs), ds.labels
        feeds = {k: v[:settings.batch] for k, v in eval_feeds.items()}  # time real samples
    session.check_feeds(feeds)
    if latency:
        result["latency"] = measure_latency(session, feeds, warmup=settings.warmup, runs=settings.runs,
                                            duration=settings.duration, batch=settings.batch)
    outputs = run_over(session, eval_feeds, batch=64) if (metric or reference) else None
    result["io"] = {"inputs": [s.to_dict() for s in session.inputs],
                    "outputs": [s.to_dict() for s in session.outputs], "runtime": session.runtime}
    if metric:
        result["accuracy"] = {**compute(metric, outputs, labels), "metric": metric, "samples": len(labels)}
    if reference is not None:
        ref_session = open_session(reference, provider="cpu")
        ref_feeds = ds.bind(ref_session.inputs) if ds is not None else dict(
            zip([s.name for s in ref_session.inputs], eval_feeds.values()))
        ref_out = run_over(ref_session, ref_feeds, batch=64)
        result["fidelity"] = {**compare_outputs(ref_out, outputs, [s.name for s in session.outputs]),
                              "reference": reference.path, "samples": len(outputs[0])}
    session.close()
    return result
