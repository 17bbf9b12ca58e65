"""Memory: what loading a model added to the measuring process, and its peak above the baseline while it runs.

Resident memory (RSS) is sampled by a background thread every 10 ms (psutil), so peaks inside
a run are seen; the figures are in MiB above the RSS before the model was loaded.
"""
from __future__ import annotations

import threading

MIB = 2 ** 20
INTERVAL_S = 0.01  # often enough for a runtime's arena growth; rarely enough not to disturb the timing


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class PeakRSS:
    """`with PeakRSS() as peak: ...` then `peak.peak_bytes` (the highest RSS seen inside the block)."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        proc = psutil.Process()
        while True:
            self.peak_bytes = max(self.peak_bytes, proc.memory_info().rss)
            if self._stop.wait(INTERVAL_S):
                return

    def __enter__(self) -> PeakRSS:
        self.peak_bytes = rss_bytes()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (what runs after this is not the model's own: a reference model loaded to compare)."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self.peak_bytes = max(self.peak_bytes, rss_bytes())

    def __exit__(self, *exc) -> None:
        self.stop()


def figures(baseline: int, loaded: int, peak: int) -> dict:
    """The report's memory figures from RSS readings: before loading, after loading, and the peak."""
    return {"load_mb": max(0, loaded - baseline) / MIB, "peak_mb": max(0, peak - baseline) / MIB,
            "baseline_mb": baseline / MIB}
