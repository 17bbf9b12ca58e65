"""--debug: optkit's own logging at DEBUG, and third-party log lines let through.

The switch is also an environment variable so that measurement children (which may be spawned) inherit it.
"""
from __future__ import annotations

import logging
import os

ENV = "OPTKIT_DEBUG"


def debugging() -> bool:
    return os.environ.get(ENV) == "1"


def enable_debug() -> None:
    os.environ[ENV] = "1"
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("optkit").setLevel(logging.DEBUG)
