"""Run a measurement in a child process, so a runtime that aborts cannot take optkit down.

The child's temporary files: the parent makes a folder for it (its $TMPDIR, tempfile's folder and the caches
of core.tmp.CACHES) and removes it once the child is gone, on every exit path, even when the child had to be
killed. A child asked to stop (SIGTERM: the parent was interrupted) unwinds, so its own `finally` blocks and
temporary folders run their cleanup, and exits by SIGTERM without reporting; the parent waits up to
STOP_GRACE_S for it, then kills it.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from optkit.core import interrupts, logs, tmp
from optkit.core.errors import OptkitError, PassError, Terminated
from optkit.core.text import first_line

log = logging.getLogger(__name__)

_HEAVY = ("torch", "tensorflow")
_PRELOAD = ("optkit.cli.main", "optkit.measure.model", "optkit.measure.paired", "optkit.measure.trials",
            "optkit.measure.inspect", "onnxruntime")
_SOCKET_FOLDER_MAX = 88  # with "/listener-XXXXXXXX" it fits a Unix socket's 107 bytes
STOP_GRACE_S = 5.0  # how long a child asked to stop (SIGTERM) may take to clean up before it is killed


class TimedOut(PassError):
    """The child did not answer within run_isolated's `timeout` and was stopped."""


def run_isolated(fn: Callable[..., Any], *args: Any, what: str, timeout: float | None = None, **kwargs: Any) -> Any:
    """Call fn(*args, **kwargs) in a child process and return its result.

    A child that dies (segfault, abort, out of memory) becomes a PassError (exit 3) naming `what`; one that has
    not answered after `timeout` seconds is stopped (TimedOut, a PassError). Set OPTKIT_ISOLATE=0 to run
    in-process (debugging; no timeout).
    """
    if os.environ.get("OPTKIT_ISOLATE", "1") == "0":
        return fn(*args, **kwargs)
    folder = tmp.make("optkit-child-")
    try:
        status, payload = _call(_context(), fn, args, kwargs, folder, what, timeout)
    finally:
        tmp.remove(folder)  # the child is gone: what it left in its temporary folder goes too
    if status == "ok":
        return payload
    if isinstance(payload, OptkitError):
        raise payload
    message, tb = payload
    err = PassError(f"{what} failed: {message}")
    err.details["traceback"] = tb
    raise err


def _context():
    """fork is fast and safe while no framework with its own threads is loaded. Once one is, children come from a
    forkserver: a clean process, started once, that never imports torch or TensorFlow and forks each child with
    optkit's measurement modules already imported (spawn paid that start-up, a second or more, per child)."""
    if not any(m in sys.modules for m in _HEAVY):
        return mp.get_context("fork")
    # the server's socket goes in this process's own temporary folder, removed with it at exit (multiprocessing
    # would make a folder of its own beside it and remove it after ours is gone); a socket path is at most 107
    # bytes (bytes, not characters: a folder named in a non-ASCII script is longer than it looks): under a deep
    # $TMPDIR, spawn as before
    config = mp.current_process()._config
    folder = config.get("tempdir") or str(tmp.own_tempdir())  # one multiprocessing already made is used as it is
    if len(os.fsencode(folder)) > _SOCKET_FOLDER_MAX:
        return mp.get_context("spawn")
    config["tempdir"] = folder
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOAD))  # no effect once the server runs; an import that fails is skipped
    return ctx


def _call(ctx, fn, args, kwargs, folder, what: str, timeout: float | None):
    recv, send = ctx.Pipe(duplex=False)
    # the environment as it is now: a forkserver's children would get the one it had when it started
    proc = ctx.Process(target=_child, args=(send, fn, args, kwargs, str(folder), dict(os.environ)), daemon=True)
    proc.start()
    log.debug("%s: child %s (%s)", what, proc.pid, ctx.get_start_method())
    send.close()
    try:
        if timeout is not None and not recv.poll(max(0.0, timeout)):
            _stop(proc)
            raise TimedOut(f"{what} did not finish within {timeout:.1f} s")
        status, payload = recv.recv()
    except EOFError:
        proc.join()
        interrupts.check()  # the child died of the same Ctrl-C or SIGTERM as the parent: that is the story
        raise PassError(f"the runtime crashed while {what} ({_describe(proc.exitcode)}); "
                        "the model is probably malformed or unsupported") from None
    except TimedOut:
        raise
    except BaseException:  # Ctrl-C or SIGTERM in the parent: stop the child too, then go on unwinding
        _stop(proc)
        raise
    proc.join()
    return status, payload


def _stop(proc) -> None:
    proc.terminate()
    proc.join(STOP_GRACE_S)
    if proc.is_alive():
        proc.kill()
        proc.join()


class _Stopped(Terminated):
    """SIGTERM in the child: unwind (cleanup runs), then exit by the signal without reporting."""


_stopping = False  # the child got SIGTERM


def _on_sigterm(signum, frame):
    global _stopping
    _stopping = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one must not interrupt the cleanup
    raise _Stopped()


def _unraisable(info) -> None:
    """SIGTERM that landed in a garbage-collection callback or a __del__, where Python cannot raise: no traceback
    on stderr; the signal is sent again a moment later from a thread (not from here, where it would land in this
    hook), so the stop happens in the code that runs next."""
    if isinstance(info.exc_value, _Stopped):
        signal.signal(signal.SIGTERM, _on_sigterm)
        main = threading.main_thread().ident
        threading.Timer(0.05, signal.pthread_kill, (main, signal.SIGTERM)).start()
        return
    sys.__unraisablehook__(info)


def _child(send, fn, args, kwargs, folder: str, environ: dict[str, str]) -> None:
    # the parent decides about interrupts: a terminal's Ctrl-C reaches the whole process group; SIGTERM (the
    # parent stopping it, or a kill of the group) unwinds the call, so its `finally` blocks and temporary
    # folders clean up, and the child then ends by SIGTERM without a word
    global _stopping
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.unraisablehook = _unraisable
        os.environ.clear()
        os.environ.update(environ)
        tmp.point_to(folder)
        logs.configure_from_env()
        try:
            result = ("ok", fn(*args, **kwargs))
        except OptkitError as e:
            result = ("err", e)
        except BaseException as e:  # anything else crosses as text: it may not pickle
            result = ("exc", (f"{type(e).__name__}: {first_line(e)}" if str(e).strip() else type(e).__name__,
                              traceback.format_exc()))
        if not _stopping:
            send.send(result)
    except KeyboardInterrupt:  # _Stopped outside fn (or SIGTERM before our handler was set)
        _stopping = True
    except (BrokenPipeError, OSError):
        pass  # the parent is gone (interrupted): nobody to tell
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # nothing of ours left to clean: the parent removes `folder`
    try:
        send.close()
    except OSError:
        pass
    if _stopping:
        os.kill(os.getpid(), signal.SIGTERM)  # as SIGTERM would have ended it: the parent sees EOF, code -15


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
