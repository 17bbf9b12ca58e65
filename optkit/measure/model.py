"""One entry point that measures an artifact: size, latency, accuracy and fidelity, in an isolated process."""
from __future__ import annotations

import logging
import math
import os
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from optkit.core.artifact import Artifact
from optkit.core.batching import call_as_samples, first_call
from optkit.core.errors import OptkitError, UsageError
from optkit.core.isolate import run_isolated
from optkit.core.registry import MAX_BATCH
from optkit.core.text import first_line
from optkit.measure import memory
from optkit.measure.accuracy import compute, metric_rows, run_over
from optkit.measure.concurrency import measure_concurrency
from optkit.measure.datasets import load_dataset
from optkit.measure.fidelity import attention_mask, compare_outputs, refuse_nonfinite_reference
from optkit.measure.inputs import probe, synthesize
from optkit.measure.latency import measure_latency
from optkit.measure.size import measure_size
from optkit.measure.text import TextOptions
from optkit.measure.textmetrics import BOOTSTRAP, paired_bootstrap
from optkit.onnx.session import OrtSettings
from optkit.runtimes.base import open_session, session_class, warm_runtime

log = logging.getLogger(__name__)

MAX_THREADS_FLOOR = 64    # a recipe written for a big machine still runs on a 2-CPU runner


def max_threads() -> int:
    """The most threads a session here is given: 4x the CPUs, at least MAX_THREADS_FLOOR."""
    return max(MAX_THREADS_FLOOR, 4 * (os.cpu_count() or 1))
MAX_WARMUP = 100_000
MAX_RUNS = 1_000_000
MAX_DURATION_S = 3600.0
MAX_CONCURRENCY = 256
NOT_THREAD_SAFE = ("tflite", "tensorrt", "openvino")  # one interpreter / execution context / infer request per thread


class MeasureSettings(BaseModel):
    """How to measure: runtime provider, threads, batch, warm-up and runs (or a duration).

    Bounds (so a typo cannot hang a run): threads 1..max(64, 4x the CPUs), batch 1..65536, warmup
    0..100,000, runs 1..1,000,000, duration finite, over 0 and at most 3600 s. Out of bounds is a UsageError
    naming the command-line option (exit 2), not a pydantic ValidationError."""

    model_config = ConfigDict(extra="forbid")   # duration and values: finite and bounded, each naming its flag
    runtime: str | None = None   # --runtime: onnxruntime or openvino for ONNX models (None: the format's default)
    provider: str = "cpu"
    threads: int | None = None
    batch: int = 1
    warmup: int = 10
    runs: int = 100
    duration: float | None = None
    shapes: dict[str, list[int]] = Field(default_factory=dict)
    values: dict[str, float] = Field(default_factory=dict)   # --value: what scalar inputs are fed
    check_outputs: list[str] = Field(default_factory=list)   # --check-output: the outputs fidelity judges
    seed: int = 0
    session: OrtSettings = Field(default_factory=OrtSettings)  # onnxruntime session options (ONNX models)
    concurrency: int | None = None     # also time N requests in flight from N threads (measure.concurrency)
    sessions: Literal["shared", "per-thread"] = "shared"    # under concurrency: one session, or one per thread

    @model_validator(mode="after")
    def _bounds(self) -> MeasureSettings:
        # UsageError is not a ValueError, so pydantic lets it through unwrapped
        cpus, most = os.cpu_count() or 1, max_threads()
        if self.threads is not None and not 1 <= self.threads <= most:
            raise UsageError(f"--threads {self.threads} is out of range: give 1 to {most} (4x the {cpus} CPUs "
                             f"here, at least {MAX_THREADS_FLOOR})")
        for option, value, lo, hi in (("--batch", self.batch, 1, MAX_BATCH), ("--warmup", self.warmup, 0, MAX_WARMUP),
                                      ("--runs", self.runs, 1, MAX_RUNS)):
            if not lo <= value <= hi:
                raise UsageError(f"{option} {value} is out of range: give {lo} to {hi:,}")
        if self.concurrency is not None and not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise UsageError(f"--concurrency {self.concurrency} is out of range: give 1 to {MAX_CONCURRENCY} "
                             "requests in flight")
        if self.duration is not None and not (math.isfinite(self.duration) and 0 < self.duration <= MAX_DURATION_S):
            raise UsageError(f"--duration {self.duration:g} is out of range: give seconds over 0 and at most "
                             f"{MAX_DURATION_S:g}")
        return self

    def open(self, artifact: Artifact):
        """A session for `artifact` with these settings (runtime, provider, threads, onnxruntime options)."""
        return open_session(artifact, provider=self.provider, threads=self.threads, ort_settings=self.session,
                            runtime=self.runtime)


class DataSpec(BaseModel):
    """Where labelled or input data comes from, and how text data is read (measure.text)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    path: str
    labels: str | None = None             # IDX labels file, when not beside the images
    preprocess: dict[str, Any] | None = None
    max_samples: int | None = None       # 0 or less is refused when the data is loaded (UsageError)
    columns: str | None = None           # text data: --columns text=5,text_pair=6,label=4
    truncation: bool = True              # text data: rows over the model's limit truncated (counted), else exit 2
    tokenizer: str | None = None         # text data: the tokenizer folder (default: the measured model's own)

    def load(self, model: str | None = None, metric: str | None = None):
        """The data set (not yet cut to max_samples); text data tokenized by the tokenizer named, else `model`'s."""
        text = TextOptions.of(self.columns, truncation=self.truncation, metric=metric, tokenizer=self.tokenizer)
        return load_dataset(self.path, self.preprocess, self.labels, model=model, text=text)


def synthesized(session, settings: MeasureSettings) -> tuple[dict, dict]:
    """One call's synthesized feeds for `session`, dims the user did not set probed (measure.inputs.probe),
    and how they were shaped (for the report)."""
    shapes, how = probe(session.inputs, session.run, settings.shapes, settings.values, settings.seed)
    feeds = synthesize(session.inputs, shapes, batch=settings.batch, seed=settings.seed, values=settings.values)
    return feeds, {"source": "synthesized", "shapes": {k: list(np.shape(v)) for k, v in feeds.items()},
                   "dims": how}


def latency_feeds(specs: list, bound: dict, batch: int, source: str) -> dict:
    """The first call's feeds from bound data, to time; fewer samples than the batch is a usage error."""
    n = len(next(iter(bound.values())))
    if n < batch:
        raise UsageError(f"--batch {batch} is more than the {n} samples in {source}; give a smaller --batch "
                         "or more data")
    return first_call(specs, bound, batch)


def measure(artifact: Artifact, settings: MeasureSettings | None = None, *, latency: bool = True,
            data: DataSpec | None = None, metric: str | None = None, reference: Artifact | None = None) -> dict:
    """Measure `artifact` in a child process (a crashing runtime becomes an exit-3 error)."""
    settings = settings or MeasureSettings()
    check_sharing(artifact.format, settings)
    log.info("measuring %s (latency %s, data %s, reference %s)", artifact.path, latency,
             data.path if data else None, reference.path if reference else None)
    return run_isolated(_measure, artifact, settings, latency, data, metric, reference,
                        what=f"measuring {artifact.path}")


def _measure(artifact: Artifact, settings: MeasureSettings, latency: bool, data: DataSpec | None,
             metric: str | None, reference: Artifact | None) -> dict:
    result: dict[str, Any] = {"size": measure_size(artifact)}
    warm_runtime(artifact.format, settings.runtime)  # the runtime's own start-up is not the model's memory
    baseline = memory.rss_bytes()
    session = settings.open(artifact)
    loaded = memory.rss_bytes()
    with memory.PeakRSS() as peak:
        _run_measurements(result, artifact, session, settings, latency, data, metric, reference, peak)
    result["memory"] = memory.figures(baseline, loaded, peak.peak_bytes)
    result["runtime"] = session.describe()
    session.close()
    return result


def _run_measurements(result: dict, artifact: Artifact, session, settings: MeasureSettings, latency: bool,
                      data: DataSpec | None, metric: str | None, reference: Artifact | None,
                      peak: memory.PeakRSS) -> None:
    count = getattr(session, "parameter_count", None)
    if "parameters" not in result["size"] and count is not None:
        result["size"]["parameters"] = count()
    if not result["size"]["bytes"] and hasattr(session, "state_dict_bytes"):
        # a factory without a weights file has nothing on disk: count what its state dict would take
        result["size"]["bytes"] = session.state_dict_bytes()
        result["size"]["size_mb"] = result["size"]["bytes"] / 1e6
        result["size"]["bytes_from"] = "state dict"
    eval_feeds, labels, ds, feeds = None, None, None, None
    if data is None:
        feeds, result["inputs"] = synthesized(session, settings)
        eval_feeds = call_as_samples(session.inputs, feeds)
    else:
        ds = data.load(artifact.path, metric).subset(data.max_samples, settings.seed)
        eval_feeds, labels = ds.bind(session.inputs, stream=True), ds.labels  # read a batch at a time
        # time real samples
        feeds = latency_feeds(session.inputs, eval_feeds, settings.batch, ds.source) if latency else \
            first_call(session.inputs, eval_feeds, settings.batch)
        result["inputs"] = {"source": ds.source, "samples": len(ds),
                            "shapes": {k: list(np.shape(v)) for k, v in feeds.items()}, "dims": "from the data",
                            **(ds.describe() if hasattr(ds, "describe") else {})}
    session.check_feeds(feeds)
    try:
        if latency:
            result["latency"] = measure_latency(session, feeds, warmup=settings.warmup, runs=settings.runs,
                                                duration=settings.duration, batch=settings.batch)
        if settings.concurrency:
            result["concurrency"] = _under_load(artifact, session, feeds, settings)
        outputs = run_over(session, eval_feeds, batch=64) if (metric or reference) else None
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001  the runtime refuses these inputs (values, shapes): the user's to fix
        source = ds.source if ds is not None else "synthesized inputs"
        raise UsageError(f"{artifact.path} does not run on {source}: {first_line(e)[:200]}; give inputs it "
                         "accepts with --data (and --shape for dynamic dims)") from None
    result["io"] = {"inputs": [s.to_dict() for s in session.inputs],
                    "outputs": [s.to_dict() for s in session.outputs], "runtime": session.runtime}
    if metric:
        names = [s.name for s in session.outputs]
        if reference is None:  # the model measured on its own: outputs that are NaN on this data are the data's
            refuse_nonfinite_reference(artifact.path, outputs[:1], names[:1], session.inputs, eval_feeds,
                                       ds.source if ds is not None else "synthesized inputs", data_only=True)
        result["accuracy"] = {**compute(metric, outputs, labels, names, ds.classes if ds is not None else None),
                              "metric": metric, "samples": len(labels)}
    if reference is not None:
        peak.stop()
        ref_session = open_session(reference, provider="cpu")
        ref_feeds = ds.bind(ref_session.inputs, stream=True) if ds is not None else dict(
            zip([s.name for s in ref_session.inputs], eval_feeds.values()))
        ref_out = run_over(ref_session, ref_feeds, batch=64)
        if metric and "accuracy" in result:
            result["accuracy"].update(drop_noise(metric, ref_out, outputs, labels))
        result["fidelity"] = {**compare_outputs(ref_out, outputs, [s.name for s in session.outputs],
                                                mask=attention_mask(session.inputs, eval_feeds,
                                                                    session.outputs),
                                                only=settings.check_outputs or None),
                              "reference": reference.path,
                              "samples": len(outputs[0]) if getattr(outputs[0], "ndim", 1) else 1}


def drop_noise(metric: str, ref_out: list, outputs: list, labels) -> dict:
    """For a metric with no per-sample loss (measure.textmetrics): the reference's figure and the 95% interval of
    its drop to this model's, from a paired bootstrap over the rows (fixed seed), which gates judge. {} else."""
    if labels is None:
        return {}
    ref_rows, rows = metric_rows(metric, ref_out, labels), metric_rows(metric, outputs, labels)
    if ref_rows is None or rows is None:
        return {}
    lo, hi = paired_bootstrap(ref_rows, rows)
    return {"reference_value": ref_rows.value(), "drop_ci95": [lo, hi], "drop_noise": "paired bootstrap over "
            f"{rows.n} rows, {BOOTSTRAP} resamples"}


def check_sharing(fmt, settings: MeasureSettings) -> None:
    """Before any work: the runtime asked for runs this format with these settings and is installed (exit 2, 4),
    and one whose sessions are not thread-safe is never shared by concurrent requests."""
    cls = session_class(fmt, settings.runtime)
    if settings.provider not in ("cpu", "auto") and not cls.takes_provider and settings.runtime is not None:
        raise UsageError(f"--provider {settings.provider} is onnxruntime's; --runtime {settings.runtime} runs on the "
                         "CPU: drop one of them")
    cls.available(fmt)
    runtime = cls.runtime
    if (settings.concurrency or 1) > 1 and settings.sessions == "shared" and runtime in NOT_THREAD_SAFE:
        raise UsageError(f"a {runtime} session cannot serve several requests at once (it is not "
                         "thread-safe): use --sessions per-thread (recipe: measure.sessions: per-thread)")


def _under_load(artifact: Artifact, session, feeds: dict, settings: MeasureSettings) -> dict:
    """Throughput and latency with settings.concurrency requests in flight (measure.concurrency)."""
    n = settings.concurrency  # sharing was checked before any work (measure)
    extra = [settings.open(artifact) for _ in range(n - 1)] if settings.sessions == "per-thread" else []
    try:
        return measure_concurrency([session, *extra], feeds, concurrency=n, warmup=settings.warmup,
                                   runs=settings.runs, duration=settings.duration, batch=settings.batch)
    finally:
        for s in extra:
            s.close()
