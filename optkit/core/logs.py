"""Logging: optkit's modules log to `logging.getLogger(__name__)` under the "optkit" logger.

Nothing shows by default. `-v` shows INFO (what optkit is doing: passes, stages, cache, measurements), `--debug`
shows DEBUG, tracebacks and the third-party log lines optkit otherwise keeps off stderr. The level travels to
measurement children (which may be spawned) in OPTKIT_LOG_LEVEL, which the flags set.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys

ENV = "OPTKIT_LOG_LEVEL"
_HANDLER_NAME = "optkit-stderr"


def configure(verbose: int = 0, debug: bool = False) -> None:
    """Set optkit's log level from the command-line flags (for this process and its children). Without a
    flag nothing is logged: the user reads optkit's report and its one-line errors, nothing else."""
    if not (verbose or debug):
        os.environ.pop(ENV, None)
        logger = logging.getLogger("optkit")
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
        return
    level = logging.DEBUG if debug or verbose >= 2 else logging.INFO
    os.environ[ENV] = logging.getLevelName(level)
    if debug:
        logging.basicConfig(level=logging.WARNING)  # third-party loggers: their warnings show too
    _apply(level)


def configure_from_env() -> None:
    """In a child process: the level its parent's flags chose."""
    name = os.environ.get(ENV)
    if name in ("DEBUG", "INFO"):
        _apply(logging.getLevelName(name))


def debugging() -> bool:
    return os.environ.get(ENV) == "DEBUG"


def _apply(level: int) -> None:
    logger = logging.getLogger("optkit")
    logger.setLevel(level)
    if not any(h.get_name() == _HANDLER_NAME for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter("optkit: %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


@contextlib.contextmanager
def quieted(*names: str, level: int = logging.CRITICAL):
    """Loggers of a library that logs what optkit says itself (tracebacks around its own fallbacks, every
    fusion it makes) raised to `level` for the block; their levels restored after."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, old in zip(loggers, levels):
            lg.setLevel(old)
