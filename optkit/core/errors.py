"""The error hierarchy. Every error carries its exit code and a one-line message."""
from __future__ import annotations

EXIT_OK = 0
EXIT_GATE = 1
EXIT_USAGE = 2
EXIT_PASS = 3
EXIT_DEPENDENCY = 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class OptkitError(Exception):
    """Base class: `str(err)` is the one line shown to the user."""

    exit_code = EXIT_PASS

    def __init__(self, message: str, *, details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or {}

    def __reduce__(self):  # keep the subclass and details across process boundaries
        return (_rebuild, (type(self), self.message, self.details))


def _rebuild(cls, message, details):
    return cls(message, details=details)


class UsageError(OptkitError):
    """Bad flags, a bad recipe, or a bad input file (exit 2)."""

    exit_code = EXIT_USAGE


class PassError(OptkitError):
    """A pass, a measurement or its validation failed (exit 3)."""

    exit_code = EXIT_PASS


class ValidationError(PassError):
    """A pass output moved past its tolerance (exit 3)."""


class DependencyError(OptkitError):
    """A missing optional extra or missing hardware (exit 4)."""

    exit_code = EXIT_DEPENDENCY


class GateFailed(OptkitError):
    """One or more gates failed (exit 1)."""

    exit_code = EXIT_GATE


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every cleanup path runs (exit 143)."""
