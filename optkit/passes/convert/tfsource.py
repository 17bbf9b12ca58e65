"""What the TensorFlow converters share: the source model as its framework runs it (Reference), and tf2onnx run
quietly, its failures as one line."""
from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings

from optkit.core.errors import PassError
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line


class Reference:
    """The source model as the framework runs it: named inputs -> list of outputs in ONNX output order."""

    def __init__(self, specs: list[TensorSpec], run, batch: int | None = None, steps: dict | None = None,
                 source: str = "TensorFlow", depths: dict | None = None, plain=None):
        self.specs = specs
        self.run = run
        self.batch = batch
        self.steps = steps or {}   # output name -> quantization step (int8 outputs exposed as real values)
        self.source = source
        self.depths = depths or {}   # output name -> requantizations on the longest path from an input
        self.plain = plain   # plain tf2onnx's conversion run like `run` (same feeds and outputs), or None


@contextlib.contextmanager
def quiet():
    buf = io.StringIO()
    loggers = [logging.getLogger(n) for n in ("tf2onnx", "tensorflow", "absl")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def tf2onnx_error(e: BaseException, what: str) -> PassError:
    text = str(e)
    m = re.search(r"(?:op|Op)\s*\[?(?P<node>[\w/:.]*)\s*:\s*(?P<op>\w+)\]?\s*is not supported", text)
    if m:
        return PassError(f"tf2onnx cannot convert op {m['op']} (node {m['node']!r}) in {what}")
    return PassError(f"tf2onnx failed on {what}: {type(e).__name__}: {first_line(e)}")
