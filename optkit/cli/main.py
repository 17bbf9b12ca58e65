"""The `optkit` command. Thin: each command parses flags, calls the library and renders."""
from __future__ import annotations

import atexit
import logging
import os
import signal
import sys

import typer

from optkit.cli import common, metavars, version
from optkit.core import phases, trust
from optkit.core.errors import OptkitError, exit_codes_line

# Flags of the root command that may also be written after the sub-command (`optkit inspect M --trust-code`).
GLOBAL_FLAGS = ("--debug", "--trust-code", "-v", "-vv", "--verbose")

class LazyGroup(typer.core.TyperGroup):
    """The root group: a command's module is imported when that command is invoked (or its --help asked for);
    `optkit --help` lists the commands from cli/commandspec.py (generated), importing none of them."""

    def list_commands(self, ctx) -> list[str]:
        return [name for name, _ in _command_table()] + [n for n in self.commands if n not in _command_names()]

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in self.commands:
            module = _MODULE_OF.get(cmd_name)
            if module is not None:
                _load(self, module)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx, formatter) -> None:
        from typer._click.utils import make_default_short_help

        rows = list(_command_table())
        rows += [(n, c.get_short_help_str()) for n, c in self.commands.items() if n not in _command_names()]
        if rows:
            limit = formatter.width - 6 - max(len(n) for n, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(n, make_default_short_help(text, limit)) for n, text in rows])


def _command_table() -> list[tuple[str, str]]:
    from optkit.cli import commandspec

    return [(name, text) for name, text in getattr(commandspec, "COMMANDS", []) if name in _MODULE_OF]


def _command_names() -> set[str]:
    return {name for name, _ in _command_table()}


def _load(group, module: str) -> None:
    """Import one command module and add what it registers to the root group."""
    import importlib

    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    importlib.import_module(f"optkit.cli.{module}").register(sub)
    for name, cmd in typer.main.get_group(sub).commands.items():
        metavars.conventional(cmd)
        group.commands.setdefault(name, cmd)


app = typer.Typer(
    cls=LazyGroup,
    name="optkit",
    help="Optimize trained models (export to ONNX, simplify, quantize, prune, TensorRT) and measure every step.\n\n"
         + exit_codes_line(),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(ctx, value: bool) -> None:
    """--version: eager, so it answers before a command is asked for; -v (eager too, hoisted first) counts."""
    if value:
        sys.stdout.write(version.text(ctx.params.get("verbose", 0)) + "\n")
        raise typer.Exit(0)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks, debug logging and third-party log "
                                                            "output."),
          verbose: int = typer.Option(0, "-v", "--verbose", count=True, is_eager=True,
                                      help="Log what optkit does (passes, stages, cache, measurements); -vv for "
                                           "debug detail."),
          _version: bool = typer.Option(False, "--version", is_eager=True, expose_value=False,
                                        callback=_print_version,
                                        help="Print optkit's version and exit (with -v: each runtime's too)."),
          trust_code: bool = typer.Option(False, "--trust-code",
                                          help="Allow loading models that run their own code (pickled whole "
                                               "models, Keras Lambda layers).")) -> None:
    common.STATE.debug = debug
    common.STATE.verbose = verbose
    if trust_code:
        trust.allow()


# Command modules in help order; each has register(app). Frameworks are imported inside the commands.
COMMANDS = ("inspect", "bench", "eval", "passes", "convert", "simplify", "preprocess", "quantize", "prune", "qat",
            "tflite", "trt", "tune", "profile", "split", "package", "capacity", "run", "gate", "report", "recipe")


def _modules() -> dict[str, str]:
    """Command name -> the module that registers it (from the generated table; a module missing from this
    checkout registers nothing)."""
    import importlib.util

    try:
        from optkit.cli import commandspec
    except ImportError:  # before the first `python -m optkit.cli.derive`
        return {name: name for name in COMMANDS}
    table = getattr(commandspec, "COMMAND_MODULES", None) or {name: name for name in COMMANDS}  # before the first derive
    return {name: module for name, module in table.items()
            if importlib.util.find_spec(f"optkit.cli.{module}") is not None}


_MODULE_OF = _modules()


def _fast_help(argv: list[str]) -> bool:
    """`optkit [COMMAND...] --help` printed without parsing options: typer's parser imports pydantic (~0.2 s).

    Only a plain chain of command names before --help takes this path; anything else parses normally.
    """
    if not argv or argv[-1] != "--help" or any(w.startswith("-") for w in argv[:-1]):
        return False
    cmd = typer.main.get_command(app)
    ctx = cmd.context_class(cmd, info_name="optkit")
    for word in argv[:-1]:
        try:
            sub = cmd.get_command(ctx, word) if hasattr(cmd, "get_command") else None
        except OptkitError:  # a command that does not load (a plugin's): the normal path says so in one line
            return False
        if sub is None:
            return False
        cmd, ctx = sub, sub.context_class(sub, info_name=word, parent=ctx)
    sys.stdout.write(cmd.get_help(ctx) + "\n")
    return True


def hoist_global_flags(argv: list[str]) -> list[str]:
    """Move the root's flags in front of the sub-command, wherever the user wrote them (not after `--`)."""
    end = argv.index("--") if "--" in argv else len(argv)
    flags = [a for a in argv[:end] if a in GLOBAL_FLAGS]
    return flags + [a for a in argv[:end] if a not in GLOBAL_FLAGS] + argv[end:]


# options whose value may be left out, and the value that then stands for it: `optkit tune --storage URL --study
# NAME --report` reads a study (typer has no option with an optional value)
OPTIONAL_VALUES = {("tune", "--report"): "-"}


def optional_values(argv: list[str]) -> list[str]:
    """`--report` given without a value (last, or before another option) gets the value that stands for none."""
    end = argv.index("--") if "--" in argv else len(argv)
    command = next((a for a in argv[:end] if not a.startswith("-")), None)
    out = list(argv)
    for (name, option), value in OPTIONAL_VALUES.items():
        if name != command:
            continue
        for i in reversed(range(end)):
            if out[i] == option and (i + 1 >= end or (out[i + 1].startswith("-") and out[i + 1] != "-")):
                out.insert(i + 1, value)
    return out


def main() -> None:
    argv = optional_values(hoist_global_flags(sys.argv[1:]))
    if _fast_help(argv):
        sys.exit(0)
    verbose = sum(2 if a == "-vv" else 1 for a in argv if a in ("-v", "-vv", "--verbose"))
    common.quiet_third_parties(debug="--debug" in argv, verbose=verbose)
    code = common.run_app(app, argv)
    if verbose and phases.lapped():  # where the wall time went, adding up to it
        logging.getLogger("optkit.cli").info("phase times: %s", phases.line("report and exit"))
    # the verdict is given: a signal still pending, or raised again while the interpreter shuts down, must not
    # turn the exit code into a death by that signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_now(code)


def _exit_now(code: int) -> None:
    """Exit with `code` after the atexit handlers, skipping the interpreter's own ending.

    That ending tears down every module, which takes seconds once onnxruntime, sympy (onnxruntime's shape
    inference) or a framework is loaded, after the command's work and its `-v` phase times are done: nothing in it
    is optkit's (its threads are daemons, its files closed, logging flushed by its atexit handler). Also, CPython
    remembers a KeyboardInterrupt raised inside exec() of a string (dataclasses and namedtuple build
    their methods so, at import) even when it was caught, and under `python -m` ends the process by SIGINT
    (-2) instead of the code given; a fresh-clone CI run saw it after 'error: interrupted'.
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
