"""optkit: optimize trained models and prove what it did.

The Python API does what the CLI does: `optkit.run(recipe)` and `optkit.run_pass(name, model, output, ...)` go
through the recipe runner (optkit.pipeline.api). Names are imported lazily so `import optkit` stays light.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# optkit sends nothing over the network: every dependency's telemetry is off before it is imported
from optkit.core.telemetry import switch_off as _switch_off  # noqa: E402

_switch_off()

_EXPORTS = {
    "Artifact": "optkit.core.artifact",
    "Format": "optkit.core.formats",
    "detect_format": "optkit.core.formats",
    "Pass": "optkit.core.registry",
    "PassConfig": "optkit.core.registry",
    "PassContext": "optkit.core.registry",
    "register": "optkit.core.registry",
    "all_passes": "optkit.passes",
    "get_pass": "optkit.passes",
    "OptkitError": "optkit.core.errors",
    "UsageError": "optkit.core.errors",
    "PassError": "optkit.core.errors",
    "ValidationError": "optkit.core.errors",
    "DependencyError": "optkit.core.errors",
    "GateFailed": "optkit.core.errors",
    "open_session": "optkit.runtimes.base",
    "measure": "optkit.measure.model",
    "MeasureSettings": "optkit.measure.model",
    "DataSpec": "optkit.measure.model",
    "load_dataset": "optkit.measure.datasets",
    "inspect_model": "optkit.measure.inspect",
    "Report": "optkit.report.schema",
    "run": "optkit.pipeline.api",
    "run_pass": "optkit.pipeline.api",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'optkit' has no attribute {name!r}")
