"""Consent to run a model's own code.

Loading a pickled whole model, a Keras Lambda layer or a torch.export file that falls back to pickle runs
code written by the model's author. optkit does that only after the user passed `--trust-code` (or called
`allow()` from Python). The consent is an environment variable so that measurement children inherit it.
Naming a Python factory (`file.py:make_model`) or a custom metric (`module:fn`) is consent by itself.
"""
from __future__ import annotations

import os

from optkit.core.errors import UsageError

ENV = "OPTKIT_TRUST_CODE"


def trusted() -> bool:
    return os.environ.get(ENV) == "1"


def allow(yes: bool = True) -> None:
    """Allow (or forbid again) loading formats that run the model's code, in this process and its children."""
    if yes:
        os.environ[ENV] = "1"
    else:
        os.environ.pop(ENV, None)


def require(what: str) -> None:
    """Raise a one-line UsageError (exit 2) unless the user consented; `what` says what would run code."""
    if not trusted():
        raise UsageError(f"{what} would run code from the file; rerun with --trust-code if you trust its author")
