"""Run a measurement in a child process, so a runtime that aborts cannot take optkit down."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

from optkit.core import logs
from optkit.core.errors import OptkitError, PassError
from optkit.core.text import first_line

log = logging.getLogger(__name__)

_HEAVY = ("torch", "tensorflow")


def run_isolated(fn: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
    """Call fn(*args, **kwargs) in a child process and return its result.

    A child that dies (segfault, abort, out of memory) becomes a PassError (exit 3) naming `what`.
    Set OPTKIT_ISOLATE=0 to run in-process (debugging).
    """
    if os.environ.get("OPTKIT_ISOLATE", "1") == "0":
        return fn(*args, **kwargs)
    # fork is fast and safe while no framework with its own threads is loaded; else spawn
    method = "spawn" if any(m in sys.modules for m in _HEAVY) else "fork"
    ctx = mp.get_context(method)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args, kwargs), daemon=True)
    proc.start()
    log.debug("%s: child %s (%s)", what, proc.pid, method)
    send.close()
    try:
        status, payload = recv.recv()
    except EOFError:
        proc.join()
        raise PassError(f"the runtime crashed while {what} ({_describe(proc.exitcode)}); "
                        "the model is probably malformed or unsupported") from None
    except BaseException:  # Ctrl-C or SIGTERM in the parent: stop the child too, then go on unwinding
        _stop(proc)
        raise
    proc.join()
    if status == "ok":
        return payload
    if isinstance(payload, OptkitError):
        raise payload
    message, tb = payload
    err = PassError(f"{what} failed: {message}")
    err.details["traceback"] = tb
    raise err


def _stop(proc) -> None:
    proc.terminate()
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _child(send, fn, args, kwargs) -> None:
    # the parent decides about interrupts: a terminal's Ctrl-C reaches the whole process group, and the
    # parent's SIGTERM handler (inherited through fork) must not make the child report an error
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    logs.configure_from_env()
    try:
        result = ("ok", fn(*args, **kwargs))
    except OptkitError as e:
        result = ("err", e)
    except BaseException as e:  # anything else crosses as text: it may not pickle
        result = ("exc", (f"{type(e).__name__}: {first_line(e)}" if str(e).strip() else type(e).__name__,
                          traceback.format_exc()))
    try:
        send.send(result)
        send.close()
    except (BrokenPipeError, OSError):
        pass  # the parent is gone (interrupted): nobody to tell


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
