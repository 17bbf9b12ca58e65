"""Ctrl-C and SIGTERM: raised as exceptions in the main thread, and remembered.

Some libraries swallow KeyboardInterrupt in a broad `except`; remembering the signal lets `check()` raise it
again before anything is renamed into place, so an interrupted command never leaves a result behind.

`deferred()` holds an interrupt while a block that must not be cut in half runs (a library's bookkeeping, a
database write): the signal is remembered and raised when the block ends.
"""
from __future__ import annotations

import contextlib
import signal

from optkit.core.errors import Terminated

received: str | None = None
_deferring = 0     # depth of deferred() blocks (the main thread's: signal handlers run there)
_pending = False   # a signal came inside a deferred() block


def _on_sigint(signum, frame):
    global received, _pending
    received = "SIGINT"
    if _deferring:
        _pending = True
        return
    raise KeyboardInterrupt()


def _on_sigterm(signum, frame):
    global received, _pending
    received = "SIGTERM"
    if _deferring:
        _pending = True
        return
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


@contextlib.contextmanager
def deferred():
    """Run the block whole: Ctrl-C or SIGTERM arriving inside it is raised when it ends (only with install()'s
    handlers; the interrupt wins over an exception the block raised)."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending:
            _pending = False
            check()
