"""Tiny ONNX passes for testing the pipeline, cache, resume and gates without the real passes.

Imported by tests (in-process) and by `run_cli_with_testpasses` (a CLI subprocess that imports this first).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from optkit.core.atomic import atomic_path
from optkit.core.formats import Format
from optkit.core.registry import Pass, PassConfig, register

HERE = Path(__file__).resolve().parent


class CopyConfig(PassConfig):
    marker: str | None = None         # append a line to this file every time the pass really runs
    fail_if_exists: str | None = None  # raise (exit 3) while this file exists: an interrupted run


def _mark(config) -> None:
    if config.marker:
        with open(config.marker, "a") as f:
            f.write("ran\n")


@register
class TestCopy(Pass):
    name = "test.copy"
    summary = "copy an ONNX model through onnx (tests)"
    accepts = (Format.ONNX,)
    produces = Format.ONNX
    Config = CopyConfig

    def run(self, artifact, config, ctx):
        import onnx

        from optkit.core.errors import PassError

        if config.fail_if_exists and Path(config.fail_if_exists).exists():
            raise PassError(f"test.copy: told to fail while {config.fail_if_exists} exists")
        _mark(config)
        model = onnx.load(artifact.path)
        with atomic_path(ctx.output) as tmp:
            onnx.save(model, str(tmp))
        ctx.note("copied")
        return artifact.derive(ctx.output, Format.ONNX, self.name, config.model_dump())


class ScaleConfig(PassConfig):
    factor: float = 1.0
    marker: str | None = None


@register
class TestScale(Pass):
    name = "test.scale"
    summary = "multiply every float initializer by a factor (tests)"
    accepts = (Format.ONNX,)
    produces = Format.ONNX
    Config = ScaleConfig

    def run(self, artifact, config, ctx):
        import numpy as np
        import onnx
        from onnx import numpy_helper

        _mark(config)
        model = onnx.load(artifact.path)
        for init in model.graph.initializer:
            arr = numpy_helper.to_array(init)
            if arr.dtype == np.float32:
                init.CopyFrom(numpy_helper.from_array((arr * config.factor).astype(np.float32), init.name))
        with atomic_path(ctx.output) as tmp:
            onnx.save(model, str(tmp))
        ctx.measurements["test_calibration_samples"] = len(ctx.data["calibration"]) if "calibration" in ctx.data else 0
        return artifact.derive(ctx.output, Format.ONNX, self.name, config.model_dump())


@register
class TestKerasOnly(Pass):
    name = "test.keras-only"
    summary = "accepts only Keras models (tests the format chain check)"
    accepts = (Format.KERAS,)
    produces = Format.TFLITE

    def run(self, artifact, config, ctx):  # pragma: no cover - never reached in tests
        raise NotImplementedError


def run_cli(*args, cwd=None, timeout: float = 600):
    """`python -m optkit ARGS` with these test passes registered first."""
    from conftest import Result

    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import _testpasses; from optkit.cli.main import main; "
            "sys.argv = ['optkit'] + sys.argv[1:]; main()")
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or HERE.parent, timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    return Result(proc.returncode, proc.stdout, proc.stderr)
