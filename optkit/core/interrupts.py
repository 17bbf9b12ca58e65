"""Ctrl-C and SIGTERM: raised as exceptions in the main thread, and remembered.

Some libraries swallow KeyboardInterrupt in a broad `except`; remembering the signal lets `check()` raise it
again before anything is renamed into place, so an interrupted command never leaves a result behind.
"""
from __future__ import annotations

import signal

from optkit.core.errors import Terminated

received: str | None = None


def _on_sigint(signum, frame):
    global received
    received = "SIGINT"
    raise KeyboardInterrupt()


def _on_sigterm(signum, frame):
    global received
    received = "SIGTERM"
    raise Terminated()


def install() -> None:
    """Handle SIGINT (unless the shell told us to ignore it) and SIGTERM in this process."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, _on_sigterm)


def check() -> None:
    """Raise the remembered interrupt, if one came."""
    if received == "SIGTERM":
        raise Terminated()
    if received == "SIGINT":
        raise KeyboardInterrupt()
