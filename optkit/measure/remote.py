"""Figures of a model served over the KServe v2 HTTP protocol (`optkit bench --url`): the latency and
concurrency loops of an in-process model, run over runtimes.kserve.RemoteSession.

Time: each check request is bounded by kserve.CHECK_TIMEOUT_S and each inference by kserve.REQUEST_TIMEOUT_S,
whole (a server sending a byte at a time gets no longer); each timing loop (warm-up, timed runs) stops after
LOOP_LIMIT_S or --duration, whichever is longer, and says so (`time_limited`), as the local loops do after an
hour; and all requests of a bench together have `bench_deadline_s(settings)`, past which the bench fails with
one line (exit 2) naming the server and that deadline.
"""
from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np

from optkit.core.errors import OptkitError, UsageError
from optkit.measure.concurrency import measure_concurrency
from optkit.measure.latency import measure_latency
from optkit.measure.model import latency_feeds, synthesized
from optkit.runtimes.kserve import CHECK_TIMEOUT_S, REQUEST_TIMEOUT_S, RemoteSession

LOOP_LIMIT_S = 120.0   # a warm-up or timed loop over HTTP, unless --duration asks for longer
CHECKS = 4             # requests before timing: server ready, server metadata, model ready, model metadata


class _Fatal(BaseException):
    """Stops probing input shapes (measure.inputs.probe tries the next shape on any Exception)."""


def loop_limit_s(settings) -> float:
    return max(LOOP_LIMIT_S, settings.duration or 0.0)


def bench_deadline_s(settings) -> float:
    """All requests of a bench --url: the checks, the first inference, and for each timing (one call at a time,
    then under --concurrency) its warm-up and timed loops, each with one inference that may start just before
    the loop's limit."""
    phases = 2 if settings.concurrency else 1
    return CHECKS * CHECK_TIMEOUT_S + REQUEST_TIMEOUT_S + phases * 2 * (loop_limit_s(settings) + REQUEST_TIMEOUT_S)


def _synthesized(session: RemoteSession, settings, synthesized) -> tuple[dict, dict]:
    """measure.model.synthesized over HTTP: a shape the server refuses (a 4xx answer) tries the next rung, but a
    failing server or model (5xx, a lost connection, an answer unlike the model's metadata) stops at once with
    its own line."""
    def run(feeds):
        try:
            return session.run(feeds)
        except OptkitError as e:
            if not (isinstance(e, UsageError) and 400 <= e.details.get("status", 0) < 500):
                raise _Fatal(e) from None
            raise

    probing = copy.copy(session)
    probing.run = run
    try:
        return synthesized(probing, settings)
    except _Fatal as fatal:
        raise fatal.args[0] from None


def measure_remote(url: str, settings, data=None) -> dict[str, Any]:
    """Figures of the model served at `url`, of the same kind and shape as measure.model.measure's: latency
    (p50/p90/p99 with their 95% bands, mean, std, throughput) one call at a time, and with
    settings.concurrency the figures under load, one connection per thread. `settings` is a MeasureSettings
    (provider, threads, sessions and onnxruntime options do not apply: the server owns them); `data` a DataSpec.
    """
    total = bench_deadline_s(settings)
    session = RemoteSession.open_url(url, deadline=time.monotonic() + total, deadline_s=total)
    limit = loop_limit_s(settings)
    try:
        result: dict[str, Any] = {"served": session.describe()}
        if data is None:
            feeds, result["inputs"] = _synthesized(session, settings, synthesized)
        else:
            ds = data.load().subset(data.max_samples, settings.seed)
            feeds = latency_feeds(session.inputs, ds.bind(session.inputs, stream=True), settings.batch, ds.source)
            result["inputs"] = {"source": ds.source, "samples": len(ds),
                                "shapes": {k: list(np.shape(v)) for k, v in feeds.items()}, "dims": "from the data"}
        session.check_feeds(feeds)
        session.run(feeds)  # the server refuses these inputs: one line, before any timing
        result["request"] = session.request_bytes(feeds)  # what each timed call sends
        result["latency"] = measure_latency(session, feeds, warmup=settings.warmup, runs=settings.runs,
                                            duration=settings.duration, batch=settings.batch, limit_s=limit)
        if settings.concurrency:
            session.connections(settings.concurrency)
            load = measure_concurrency([session], feeds, concurrency=settings.concurrency, warmup=settings.warmup,
                                       runs=settings.runs, duration=settings.duration, batch=settings.batch,
                                       limit_s=limit)
            # the server owns its sessions; optkit holds one connection per request in flight
            result["concurrency"] = load | {"sessions": None, "connections": settings.concurrency}
        result["io"] = {"inputs": [s.to_dict() for s in session.inputs],
                        "outputs": [s.to_dict() for s in session.outputs], "runtime": session.runtime}
        return result
    finally:
        session.close()
