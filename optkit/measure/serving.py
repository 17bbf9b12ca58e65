"""One serving setting of an ONNX model measured under load: onnxruntime session options, batch size, requests
in flight and how many sessions serve them. What `optkit tune` searches (passes/tune/) and its benchmark
grids over.

Each setting is measured in a child process of its own (memory is then the setting's: RSS above the child's
baseline), first briefly, so a setting that clearly misses a service-level objective stops there, then for the
trial's duration. Throughput is samples per second over the wall time; cost is the CPU time the process spent
per 1,000 samples (all threads), so a setting that burns cores for little gain costs more.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from optkit.core.artifact import Artifact
from optkit.core.formats import Format
from optkit.core.isolate import run_isolated
from optkit.measure import memory
from optkit.measure.concurrency import measure_concurrency
from optkit.measure.model import MeasureSettings
from optkit.onnx.session import OrtSettings, warm_onnxruntime
from optkit.runtimes.base import warm_runtime

PROBE_S = 0.25


class Setting(BaseModel):
    """Where a model is served from: what `optkit tune` chooses and a recipe's `measure:` section can set."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    runtime: Literal["onnxruntime", "openvino"] = "onnxruntime"   # OpenVINO: its settings, no session options
    provider: str = "cpu"
    threads: int | None = Field(default=None, ge=1)           # intra-op threads (None: onnxruntime's default)
    batch: int = Field(default=1, ge=1)
    concurrency: int = Field(default=1, ge=1)
    sessions: Literal["shared", "per-thread"] = "shared"
    session: OrtSettings = Field(default_factory=OrtSettings)

    def label(self) -> str:
        o = self.session
        parts = [f"threads {self.threads or 'default'}", f"batch {self.batch}", f"{self.concurrency} in flight"]
        if self.concurrency > 1:
            parts.append(f"{self.sessions} session{'s' if self.sessions == 'per-thread' else ''}")
        if o.execution_mode:
            parts.append(o.execution_mode + (f" x{o.inter_op_threads}" if o.inter_op_threads else ""))
        if o.graph_optimization:
            parts.append(f"opt {o.graph_optimization}")
        if o.cpu_mem_arena is False:
            parts.append("no arena")
        if o.mem_pattern is False:
            parts.append("no mem pattern")
        if self.provider != "cpu":
            parts.append(self.provider)
        if self.runtime != "onnxruntime":
            parts.insert(0, self.runtime)
        return ", ".join(parts)

    def recipe_measure(self) -> dict[str, Any]:
        """The recipe `measure:` keys that serve the model this way."""
        d: dict[str, Any] = {"provider": self.provider, "threads": self.threads, "batch": self.batch}
        if self.runtime != "onnxruntime":
            d = {"runtime": self.runtime, **d}
        if self.concurrency > 1:
            d.update(concurrency=self.concurrency, sessions=self.sessions)
        session = self.session.model_dump(exclude_none=True)
        if session:
            d["session"] = session
        return {k: v for k, v in d.items() if v is not None}

    def settings(self, base: MeasureSettings | None = None) -> MeasureSettings:
        base = base or MeasureSettings()
        return base.model_copy(update={"runtime": None if self.runtime == "onnxruntime" else self.runtime,
                                       "provider": self.provider, "threads": self.threads, "batch": self.batch,
                                       "concurrency": self.concurrency, "sessions": self.sessions,
                                       "session": self.session})


def batch_feeds(feeds: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """One call's feeds at batch 1 repeated along the first axis to `batch` samples."""
    return {k: np.concatenate([v] * batch, axis=0) if batch > 1 else v for k, v in feeds.items()}


def measure_setting(artifact: Artifact, setting: Setting, feeds: dict[str, np.ndarray], *, seconds: float,
                    hopeless: Callable[[dict], str | None] | None = None,
                    timeout: float | None = None) -> dict[str, Any]:
    """Figures of `setting` in a child process: throughput_per_s, p50/p90/p99_ms, memory_mb (peak RSS above
    the child's baseline), load_mb, cpu_s_per_1k (CPU seconds per 1,000 samples). With `hopeless` (figures of a
    short probe -> why it cannot meet the objective, or None), a hopeless setting stops after the probe and its
    figures carry "pruned": the reason. A child still busy after `timeout` seconds (its sessions' set-up
    included) is stopped: core.isolate.TimedOut."""
    return run_isolated(_measure, artifact, setting, feeds, seconds, hopeless, timeout=timeout,
                        what=f"measuring {artifact.path} at {setting.label()}")


def _measure(artifact: Artifact, setting: Setting, feeds: dict, seconds: float, hopeless) -> dict[str, Any]:
    settings = setting.settings()
    feeds = batch_feeds(feeds, setting.batch)
    warm_onnxruntime()  # the runtime's own start-up is not the setting's memory
    if setting.runtime != "onnxruntime":
        warm_runtime(Format(artifact.format), settings.runtime)
    baseline = memory.rss_bytes()
    sessions = [settings.open(artifact) for _ in range(setting.concurrency if setting.sessions == "per-thread"
                                                       else 1)]
    loaded = memory.rss_bytes()
    try:
        with memory.PeakRSS() as peak:
            result = _timed(sessions, feeds, setting, min(PROBE_S, seconds), warmup=3)
            why = hopeless(result) if hopeless else None
            if why:
                result["pruned"] = why
            else:
                result = _timed(sessions, feeds, setting, seconds, warmup=0)
    finally:
        for s in sessions:
            s.close()
    mem = memory.figures(baseline, loaded, peak.peak_bytes)
    return result | {"memory_mb": mem["peak_mb"], "load_mb": mem["load_mb"]}


def _timed(sessions: list, feeds: dict, setting: Setting, seconds: float, warmup: int) -> dict[str, Any]:
    cpu0 = time.process_time()
    r = measure_concurrency(sessions, feeds, concurrency=setting.concurrency, warmup=warmup, runs=1,
                            duration=seconds, batch=setting.batch)
    cpu = time.process_time() - cpu0
    samples = r["calls"] * setting.batch
    return {"throughput_per_s": r["throughput_per_s"], "p50_ms": r["p50_ms"], "p90_ms": r["p90_ms"],
            "p99_ms": r["p99_ms"], "calls": r["calls"], "seconds": r["wall_s"],
            "cpu_s_per_1k": 1e3 * cpu / samples if samples else None}
