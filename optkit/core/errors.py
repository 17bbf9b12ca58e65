"""The error hierarchy. Every error carries its exit code and a one-line message."""
from __future__ import annotations

EXIT_OK = 0
EXIT_GATE = 1
EXIT_USAGE = 2
EXIT_PASS = 3
EXIT_DEPENDENCY = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
EXIT_TERMINATED = 143

# Every exit code, once: `optkit --help`, the README and docs/ci.md show this list (tests/test_docs.py checks
# the pages' tables are exit_code_table()). (code, a few words for --help, the sentence for the docs)
EXIT_CODES = (
    (EXIT_OK, "ok", "ok: every stage ran and every gate passed"),
    (EXIT_GATE, "gate failed", "a gate failed, or cannot be judged because its figure's noise straddles the threshold "
                               "(the reports are still written)"),
    (EXIT_USAGE, "bad usage or input", "bad usage or input (a missing file, a corrupt model, a wrong shape, a recipe "
                                       "typo): one `error:` line naming the flag, file or YAML line, before any work"),
    (EXIT_PASS, "a pass or its validation failed", "a pass or its validation failed (outputs moved past tolerance), "
                                                   "or the runtime crashed; nothing half-written is left"),
    (EXIT_DEPENDENCY, "missing dependency or hardware", "a missing optional dependency or hardware (e.g. TensorRT "
                                                        "without a GPU); the message names the install command"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)", "interrupted by Ctrl-C (SIGINT); the next `optkit run` of the same "
                                               "recipe resumes from the last complete stage"),
    (EXIT_BROKEN_PIPE, "stdout closed", "the reader of stdout went away (`optkit ... \\| head`): not an error, and "
                                        "never the gate code"),
    (EXIT_TERMINATED, "terminated (SIGTERM)", "terminated by SIGTERM (a CI job's timeout); as for 130"),
)


def exit_codes_line() -> str:
    """The list as one line, for `optkit --help`."""
    return "Exit codes: " + ", ".join(f"{code} {short}" for code, short, _ in EXIT_CODES) + "."


def exit_code_table() -> str:
    """The list as a Markdown table, as the README and docs/ci.md show it."""
    return "| code | meaning |\n|---:|---|\n" + "".join(f"| {code} | {long} |\n" for code, _, long in EXIT_CODES)


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
