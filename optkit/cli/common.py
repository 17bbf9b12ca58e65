"""What every command shares: error handling and exit codes, signals, output, shared options."""
from __future__ import annotations

import errno
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from optkit.cli import options
from optkit.core import interrupts, logs
from optkit.core.artifact import Artifact
from optkit.core.atomic import check_output_path, check_outputs, python_file
from optkit.core.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_PASS,
    EXIT_TERMINATED,
    EXIT_USAGE,
    OptkitError,
)
from optkit.core.text import first_line, printable, redact_url


@dataclass
class _State:
    debug: bool = False
    verbose: int = 0  # -v count: what the console adds to its short story
    after_interrupt: str = "nothing was written"  # what an interrupted command leaves behind


STATE = _State()

# errno values that mean the user's path or file system is at fault, not optkit
_USER_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG,
                errno.EROFS, errno.ENOSPC, errno.EEXIST, errno.ELOOP, errno.EDQUOT, errno.EXDEV, errno.ENOTEMPTY}


def quiet_third_parties(debug: bool, verbose: int = 0) -> None:
    """Set optkit's logging from -v/--debug, and keep TensorFlow, onnxruntime and Python warnings off stderr
    unless --debug (children inherit it)."""
    logs.configure(verbose=verbose, debug=debug)
    if debug:
        return
    for key, value in (("TF_CPP_MIN_LOG_LEVEL", "3"), ("GLOG_minloglevel", "3"), ("GRPC_VERBOSITY", "ERROR"),
                       ("PYTHONWARNINGS", "ignore")):
        os.environ.setdefault(key, value)
    warnings.simplefilter("ignore")
    logging.basicConfig(level=logging.CRITICAL)  # libraries log tracebacks at ERROR for failures we report


def run_app(app, argv: Optional[list[str]] = None) -> int:
    """Run the typer app and turn every outcome into an exit code and at most one error line."""
    interrupts.install()
    try:
        rv = app(args=argv, standalone_mode=False)
        if (isinstance(rv, int) and rv) or interrupts.received:  # typer turns KeyboardInterrupt into 130
            return _interrupted()
        return 0
    except OptkitError as e:
        if interrupts.received:  # the error came from the interrupt (a child stopped by it): report that
            return _interrupted()
        if STATE.debug:
            traceback.print_exc()
            if "traceback" in e.details:
                print(e.details["traceback"], file=sys.stderr)
        return _fail(in_flags(e.message, argv or sys.argv[1:]), e.exit_code)
    except KeyboardInterrupt:
        return _interrupted()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    except BrokenPipeError:
        # the reader went away (`optkit ... | head`): not an error of ours, and not a gate verdict
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as e:
        if e.errno not in _USER_ERRNOS:
            return _internal(e)
        if STATE.debug:
            traceback.print_exc()
        where = f"{e.filename}: " if e.filename else ""
        return _fail(f"{where}{e.strerror or e}", EXIT_USAGE)
    except Exception as e:  # click usage errors (typer vendors click in newer releases) and internal errors
        if type(e).__name__ == "Abort":
            return _interrupted()
        if type(e).__name__ == "NoArgsIsHelpError":  # `optkit` or `optkit report` alone: the help is the answer
            e.show()
            return e.exit_code
        if hasattr(e, "format_message") and isinstance(getattr(e, "exit_code", None), int):
            return _fail(_usage_line(e), e.exit_code)
        return _internal(e)


MAX_ERROR_CHARS = 2000
# a single-stage command's data flags become a one-stage recipe's data items, whose errors name their key
_RECIPE_DATA = re.compile(r"recipe: data\.(calibration|eval|train)\.(path|labels|preprocess): ")
# its model and its one stage: the MODEL argument and the command itself, which the user typed
_RECIPE_OWN = re.compile(r"recipe: (model\.path|stages\[0\]\.pass): ")
# its measure: section: the measurement flags (--seed, --threads, ...)
_RECIPE_MEASURE = re.compile(r"recipe: measure\.(\w+): ")


def in_flags(message: str, argv: list[str]) -> str:
    """An error about a one-stage recipe's item, in the words of the command line that made it: "recipe:
    data.eval.path: ..." is "--data: ..." (or --eval-data, --calibration-data, --train-data, --labels,
    --preprocess: the flag the user typed); "recipe: model.path: ..." is the MODEL, and every path is shown as
    typed, not as the recipe resolved it; a recipe's own errors (`optkit run`) keep their file and key."""
    if not argv or argv[0] == "run":
        return message
    own = _RECIPE_OWN.match(message)
    message = _as_typed(message[own.end():] if own is not None else message, argv)
    measure = _RECIPE_MEASURE.match(message)
    if measure is not None:
        flag = "--" + measure.group(1).replace("_", "-")
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            return f"{flag}: {message[measure.end():]}"
    m = _RECIPE_DATA.match(message)
    if m is None:
        return message
    key, field = m.groups()
    flags = {"path": [f"--{key}-data", "--data"], "labels": ["--labels"], "preprocess": ["--preprocess"]}[field]
    typed = next((f for f in flags if any(a == f or a.startswith(f + "=") for a in argv)), None)
    return message if typed is None else f"{typed}: {message[m.end():]}"


def _as_typed(message: str, argv: list[str]) -> str:
    """`message` with a path the recipe made absolute written back as the user typed it."""
    for arg in argv:
        if arg and not arg.startswith("-") and not os.path.isabs(arg) and "\x00" not in arg:
            for resolved in (str(Path.cwd() / arg), os.path.join(os.getcwd(), arg), os.path.abspath(arg)):
                message = message.replace(resolved, arg)
    return message


def _fail(message: str, code: int) -> int:
    text = printable(redact_url(" ".join(str(message).split()))) or "failed"  # no password, whoever raised
    if len(text) > MAX_ERROR_CHARS:  # a name read from a file (10 MB of it, say) is still one readable line
        cut = len(text) - MAX_ERROR_CHARS
        text = f"{text[:MAX_ERROR_CHARS * 3 // 4]} [... {cut:,} characters left out ...] {text[-MAX_ERROR_CHARS // 4:]}"
    try:
        print(f"error: {text}", file=sys.stderr)
    except (BrokenPipeError, OSError):
        pass
    return code


def _internal(e: BaseException) -> int:
    if STATE.debug:
        traceback.print_exc()
    if interrupts.received:  # Ctrl-C inside a C extension's import surfaces as ImportError: it is still Ctrl-C
        return _interrupted()
    first = first_line(e) if str(e).strip() else ""
    return _fail(f"internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback)", EXIT_PASS)


def _interrupted() -> int:
    if interrupts.received == "SIGTERM":
        return _fail(f"terminated (SIGTERM); {STATE.after_interrupt}", EXIT_TERMINATED)
    return _fail(f"interrupted (Ctrl-C); {STATE.after_interrupt}", EXIT_INTERRUPTED)


def _usage_line(e) -> str:
    """A click usage error as one line, with where to look for help."""
    msg = e.format_message()
    ctx = getattr(e, "ctx", None)
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None and ctx.command_path else ""
    return msg[:1].lower() + msg[1:] + hint


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain about the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def guard_outputs(outputs: dict | Iterable, inputs: dict | Iterable = ()) -> None:
    """Before any work, the guard recipes and the Python API use too (core.atomic.check_outputs): every output
    is a new or regular file (never a folder, a device or a link), or a folder where one is written (an Output
    with folder=True), none is an input of the same command or inside an input folder, no two are the same.
    `outputs` maps the flag to its path, e.g. {"-o": out, "--report": rep}; `inputs` the flag (or MODEL) to
    its path, e.g. {"MODEL": model, "--data": data} (None: not given)."""
    check_outputs(outputs, inputs)


# the shared options that name a file a command reads (options.OPTIONS); --metric may name a file.py:function
INPUT_OPTIONS = ("data", "calibration_data", "train", "weights", "eval_data", "labels", "baseline")


def inputs_of(shared: options.Shared, own: dict) -> dict:
    """What a command reads, by flag, for guard_outputs: its own ({"MODEL": model, "--reference": ref}) and every
    shared option it was given that names a file."""
    given = {options.OPTIONS[k].flags[0]: getattr(shared, k) for k in INPUT_OPTIONS}
    return {**own, **given, "--metric": python_file(shared.metric)}


def console():
    """The stdout console. Markup is off, so user text (file names, shapes like [batch,3]) prints as it is;
    style with rich Text objects or the style= argument instead."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich exits 1 here, which reads as "gate failed"
            raise BrokenPipeError()

        def render_str(self, text: str, **kwargs):  # every str printed or put in a table: names are untrusted
            return super().render_str(printable(text), **kwargs)

    return _Console(stderr=False, highlight=False, markup=False)


def print_json(text: str) -> None:
    sys.stdout.write(text.rstrip() + "\n")


def load_artifact(model: str, weights: Optional[str] = None, signature: Optional[str] = None, **meta):
    return Artifact.load(model, weights=weights, signature=signature, **meta)


def measure_and_report(artifact, settings, *, command: str, report_path: Optional[str], as_json: bool,
                       **measure_kwargs) -> None:
    """Measure one artifact, wrap it as a one-stage report, print it (table or JSON), save it if asked."""
    from optkit.measure.model import measure
    from optkit.report.build import input_stage
    from optkit.report.schema import Report

    if report_path:
        check_output_path(report_path)
    stage = input_stage(artifact, measure(artifact, settings, **measure_kwargs), name="model")
    stage.config = settings.model_dump(exclude_defaults=True)
    emit(Report(command=command, stages=[stage]), report_path, as_json)


def measure_url_and_report(url: str, settings, *, command: str, data, report_path: Optional[str],
                           as_json: bool) -> None:
    """Measure the model served at `url` (KServe v2), wrap it as a one-stage report like measure_and_report's,
    print it, save it if asked."""
    from optkit.measure.remote import measure_remote
    from optkit.report.build import inputs_note
    from optkit.report.schema import ArtifactRef, Report, Stage

    if report_path:
        check_output_path(report_path)
    measurements = measure_remote(url, settings, data)
    shown = redact_url(url)  # a password in the URL is never stored or printed
    stage = Stage(name="served", output=ArtifactRef(path=shown, format="kserve-v2", sha256=""),
                  measurements=measurements, notes=inputs_note(measurements))
    stage.config = settings.model_dump(exclude_defaults=True) | {"url": shown}
    emit(Report(command=command, stages=[stage]), report_path, as_json)


def emit(report, report_path: Optional[str], as_json: bool) -> None:
    """Save the report if asked, then print it as JSON or as tables."""
    from optkit.report.render import to_console

    if report_path:
        report.save(report_path)
    if as_json:
        print_json(report.to_json())
    else:
        to_console(report, console(), verbose=bool(STATE.verbose))


def run_single_stage(pass_name: str, model: str, output: str, config: dict, *, command: str, settings,
                     weights: Optional[str] = None, eval_data=None, metric: Optional[str] = None,
                     report_path: Optional[str] = None, as_json: bool = False, signature: Optional[str] = None,
                     data: Optional[dict] = None, print_recipe: bool = False, input_last: bool = False,
                     then: Optional[list] = None):
    """Every single-stage command: build the one-stage recipe, run it through the recipe runner, report.

    `data` maps calibration/train (and eval, for a pass that takes data but measures none) to a path or a
    recipe data item; `eval_data` is what the input and output are measured on, with `metric`. With
    print_recipe (the commands' --print-recipe), print that recipe and run nothing. `then`: stages run after the
    pass on its result (quantize -o NAME.xml: convert.openvino), the last one's model written to `output`.
    """
    from optkit.cli import onestage
    from optkit.core.registry import build_config
    from optkit.passes import get_pass
    from optkit.pipeline.api import run_one_stage
    from optkit.pipeline.recipe import one_stage_recipe

    cfg = build_config(get_pass(pass_name), config)
    rec = one_stage_recipe(pass_name, model, cfg.model_dump(mode="json", exclude_defaults=True), settings=settings,
                           weights=weights, signature=signature, eval_data=eval_data, metric=metric, data=data)
    rec["stages"] += list(then or [])
    if print_recipe:
        onestage.show(rec)
        return None
    report = run_one_stage(rec, output, command=command, input_last=input_last,
                           outputs={"-o": output, "--report": report_path})
    emit(report, report_path, as_json)
    return report
