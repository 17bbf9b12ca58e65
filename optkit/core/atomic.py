"""Nothing half-written, nothing destroyed: outputs are regular files built next to their destination and
renamed into place; an output that is a folder, a device, a link or an input of the same command is refused.

The one guard that says so before any work is `check_outputs` (`check_steps` over the steps of a recipe, each
declaring what it reads and writes with `paths()`): every output against every input (the same file through
links, hard links and relative paths; inside an input folder; a folder output holding an input where it writes)
and against every other output. Config fields that name files carry a `PathRole`, so a step built from a config
declares them without a list to keep.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Literal, Protocol

from optkit.core import interrupts
from optkit.core.artifact import external_data_files
from optkit.core.errors import UsageError
from optkit.core.formats import MODEL_SUFFIXES, split_factory

_UMASK = os.umask(0)
os.umask(_UMASK)
_NAME_MAX = 255


@dataclass(frozen=True)
class Input:
    """A file or folder a step reads, under the name the user gave it (a flag, a recipe key)."""
    key: str
    path: str | os.PathLike


@dataclass(frozen=True)
class Output:
    """A file (or, with folder, a folder) a step writes, under the name the user gave it."""
    key: str
    path: str | os.PathLike
    folder: bool = False
    # a folder: whether what lies at this path inside it may be replaced (None: anything in it may be)
    replaces: Callable[[PurePath], bool] | None = None


def adding_folder(key: str, path: str | os.PathLike | None) -> Output:
    """A folder optkit only adds new files to (TensorBoard's event files, a profiler's log): an input may lie in
    it, but it may not be an input, nor lie inside an input folder."""
    return Output(key, path, folder=True, replaces=lambda rel: False)


@dataclass(frozen=True)
class PathRole:
    """Marks a config field that names a file: `Annotated[str | None, PathRole("output")]`. `names` turns the
    value into the path it names (None: no file, e.g. 'auto' or a database server's URL)."""
    role: Literal["input", "output", "folder"]
    names: Callable[[str], str | os.PathLike | None] | None = None
    adds_only: bool = False  # a folder optkit only adds new files to (TensorBoard's event files)


class Step(Protocol):
    """One step of a run (the recipe's model and data, a pass stage, a package entry, capacity, ...)."""

    def paths(self) -> tuple[list[Input], list[Output]]:
        """What it reads and what it writes."""


def declared_paths(config, key: Callable[[str], str]) -> tuple[list[Input], list[Output]]:
    """The files a pydantic config names in its PathRole fields; `key(field)` is what the user calls each."""
    inputs: list[Input] = []
    outputs: list[Output] = []
    for name, info in type(config).model_fields.items():
        for role in (m for m in info.metadata if isinstance(m, PathRole)):
            value = getattr(config, name)
            path = role.names(value) if role.names and value else value
            if path is None or str(path) == "":
                continue
            if role.role == "input":
                inputs.append(Input(key(name), path))
            elif role.adds_only:
                outputs.append(adding_folder(key(name), path))
            else:
                outputs.append(Output(key(name), path, folder=role.role == "folder"))
    return inputs, outputs


def python_file(spec: str | None) -> str | None:
    """The file a `file.py:function` spec (a metric, a factory) names; None for a built-in or a module name."""
    factory = split_factory(spec) if spec else None
    return factory[0] if factory and factory[0].endswith(".py") else None


def check_steps(steps: Iterable[Step], outputs: Iterable[Output] = (), inputs: Iterable[Input] = (),
                own: Iterable[Output] = ()) -> None:
    """The plan-time guard of a run: what every step writes (and `outputs`, the caller's own) against what
    every step reads (and `inputs`), and outside `own`: folders the run keeps for itself (the workspace's stage
    cache, the recipe's run folders), where nothing the user names may be written."""
    ins, outs = list(inputs), list(outputs)
    for step in steps:
        i, o = step.paths()
        ins += i
        outs += o
    check_outputs(outs, ins)
    for out, folder in itertools.product(_as_outputs(outs), own):
        _against_output(out, folder)


def check_output_path(dest: str | os.PathLike, *, inputs: Iterable = (), what: str = "output") -> Path:
    """Fail early (exit 2, nothing touched) unless `dest` is a new or existing regular file we may replace.

    Refused: an existing folder, device, FIFO, socket or symbolic link; a missing or non-writable parent
    folder; a name too long for the file system; and any of `inputs` (the same file through links too, or a
    file inside an input folder).
    """
    _no_nul(what, dest)
    if str(dest).endswith(("/", os.sep)):  # Path() drops the slash that says "a folder"
        raise UsageError(f"{what} {str(dest)!r} ends with '/', which names a folder; name the file to write")
    dest = Path(dest)
    if str(dest) in ("", ".", "..") or dest.name in ("", ".", ".."):
        raise UsageError(f"{what} {str(dest)!r} is a folder, not a file name; name the file to write")
    if dest.name.lower() in MODEL_SUFFIXES:  # a hidden file with no suffix: no command could tell its format
        raise UsageError(f"{what} {str(dest)!r} is a suffix with no name; name the file to write (model{dest.name})")
    if len(os.fsencode(dest.name)) > _NAME_MAX:
        raise UsageError(f"{what} file name is {len(os.fsencode(dest.name))} bytes long; the limit is {_NAME_MAX}")
    parent = dest.parent
    if not parent.exists():
        raise UsageError(f"{what} folder {parent} does not exist; create it first")
    if not parent.is_dir():
        raise UsageError(f"{what} {dest}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{what} folder {parent} is not writable")
    if dest.is_symlink():
        raise UsageError(f"{what} {dest} is a symbolic link; name the real file instead")
    if dest.exists():
        mode = dest.stat().st_mode
        if stat.S_ISDIR(mode):
            raise UsageError(f"{what} {dest} is an existing folder; optkit writes files only, name a file in it")
        if not stat.S_ISREG(mode):
            raise UsageError(f"{what} {dest} exists and is not a regular file (a device, FIFO or socket)")
    out = Output(what, dest)
    for src in _as_inputs(inputs):
        _against_input(out, src)
    return dest


def check_output_folder(dest: str | os.PathLike, *, what: str = "output") -> Path:
    """A folder optkit creates or writes into: not a link, and not an existing file, device or FIFO."""
    _no_nul(what, dest)
    dest = Path(dest)
    if str(dest).strip() == "":
        raise UsageError(f"{what}: give a folder")
    if dest.is_symlink():
        raise UsageError(f"{what} {dest} is a symbolic link; name the real folder instead")
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{what} {dest} exists and is not a folder; name a new folder or one optkit wrote")
    return dest


def check_outputs(outputs: dict[str, str | os.PathLike | None] | Iterable[Output],
                  inputs: dict[str, str | os.PathLike | None] | Iterable = ()) -> None:
    """Before any work: each output may be written (check_output_path, or check_output_folder for a folder),
    none is an input (`inputs`: Input objects, {name: path} or plain paths), and no two are the same.
    `outputs` is a list of Output, or {flag: path} for files (None: not asked for)."""
    outs = _as_outputs(outputs)
    ins = _as_inputs(inputs)
    for inp in ins:
        _no_nul(inp.key or "input", inp.path)
    for out in outs:
        if out.folder:
            check_output_folder(out.path, what=out.key)
        else:
            check_output_path(out.path, what=out.key)
        for src in ins:
            _against_input(out, src)
    for a, b in itertools.combinations(outs, 2):
        _against_output(a, b)
        _against_output(b, a)


def _no_nul(key: str, path) -> None:
    """No file's path holds a NUL character (a recipe's "\\0", a Python string): exit 2 naming the key, not the
    ValueError every os call raises on it."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else ""
    if isinstance(text, str) and "\x00" in text:
        raise UsageError(f"{key}: {text!r:.80} holds a NUL character; no file's path has one")


def _as_outputs(outputs) -> list[Output]:
    if isinstance(outputs, dict):
        return [Output(k, v) for k, v in outputs.items() if v is not None]
    return [o for o in outputs if o is not None and o.path is not None]


def _as_inputs(inputs) -> list[Input]:
    if isinstance(inputs, dict):
        return [Input(k, v) for k, v in inputs.items() if v is not None]
    return [i if isinstance(i, Input) else Input("", i) for i in inputs if i is not None]


def _against_input(out: Output, inp: Input) -> None:
    for src in _files_of(inp, out):
        named = f"{inp.key} {src}" if inp.key else src
        if same_file(Path(out.path), src):
            raise UsageError(f"{out.key} {out.path} is also an input of this command ({named}); optkit never "
                             "writes its inputs: choose another path")
        if Path(src).is_dir() and _inside(out.path, src) is not None:
            raise UsageError(f"{out.key} {out.path} is inside an input folder of this command ({named}); write it "
                             "outside that folder")
        rel = _inside(src, out.path) if out.folder else None
        if rel is not None and (out.replaces is None or out.replaces(rel)):
            raise UsageError(f"{out.key} {out.path} holds an input of this command ({named}) where optkit writes; "
                             "choose another folder")


def _against_output(a: Output, b: Output) -> None:
    """a is not b, and a does not lie where folder b writes."""
    if same_file(Path(a.path), b.path):
        raise UsageError(f"{a.key} and {b.key} name the same {'folder' if a.folder else 'file'} {a.path}; give "
                         "each its own path")
    rel = _inside(a.path, b.path) if b.folder else None
    if rel is not None and (b.replaces is None or b.replaces(rel)):
        raise UsageError(f"{a.key} {a.path} is inside {b.key} {b.path}, which optkit writes; give each its own "
                         "place")


def _files_of(inp: Input, out: Output) -> list[str]:
    """The paths an input stands for: itself, a factory's file, an ONNX model's external data files (looked up
    only when the output exists in the model's folder: where they must be)."""
    src = str(inp.path)
    files = [src]
    if not Path(src).exists() and python_file(src):
        files = [python_file(src)]
    elif src.endswith(".onnx") and Path(src).is_file() and Path(out.path).exists() \
            and _inside(out.path, Path(src).parent) is not None:
        with contextlib.suppress(UsageError):  # a missing data file is the model loader's own error
            files += [str(p) for _, p in external_data_files(src)]
    return files


def _inside(path, folder) -> PurePath | None:
    """path's place inside folder (through links), or None when it is not strictly inside."""
    try:
        rel = PurePath(os.path.realpath(path)).relative_to(os.path.realpath(folder))
    except ValueError:
        return None
    return rel if rel.parts else None


def same_file(dest: str | os.PathLike, src) -> bool:
    """The same file (hard links and symbolic links followed, relative paths resolved; a factory's file)."""
    dest, src = Path(dest), str(src)
    factory = split_factory(src)
    if factory and not Path(src).exists():
        src = factory[0]
    try:
        if dest.exists() and Path(src).exists() and os.path.samefile(dest, src):
            return True
    except OSError:
        pass
    return os.path.realpath(dest) == os.path.realpath(src)


def check_side_output(dest: str | os.PathLike, *, ours: Callable[[Path], bool], inputs: Iterable = (),
                      what: str = "output") -> Path:
    """check_output_path for a file optkit writes without being asked for it by name (a model kept aside, a
    study database): it may replace an existing file only when `ours(dest)` recognises optkit's own."""
    dest = check_output_path(dest, inputs=inputs, what=what)
    if dest.exists() and not ours(dest):
        raise UsageError(f"{what} would be written to {dest}, which exists and was not written by optkit; "
                         "move it away or choose another output name")
    return dest


def tmp_prefix(dest: Path) -> str:
    """The name prefix of a temporary beside `dest`, cut so that it stays a legal name when dest's is."""
    return f".{dest.name[:200]}.tmp-"


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; rename it onto `dest` only if the block succeeds.

    A file replaces an existing regular file; a folder (directory=True) is only ever created, never replaces.
    The temporary is removed on every exit path, interrupts included.
    """
    dest = Path(dest)
    check_output_path(dest)
    if directory and dest.exists():
        raise UsageError(f"{dest} already exists; optkit does not replace folders")
    prefix = tmp_prefix(dest)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=dest.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=dest.parent, suffix=dest.suffix[:20])
        os.close(fd)
        tmp = Path(name)
        normal_mode(tmp)
    try:
        yield tmp
        interrupts.check()  # a library may have swallowed Ctrl-C: never commit a result after one
        if directory:
            commit_folder(tmp, dest)  # never replaces a folder that appeared meanwhile
        else:
            check_output_path(dest)  # it may have become a folder or link while we worked
            os.replace(tmp, dest)
    finally:
        remove(tmp)


def stage_folder(dest: str | os.PathLike, prefix: str | None = None) -> Path:
    """A new, empty folder beside `dest` to build it in (with the permissions the user's umask gives: a server may
    read it as another user), named as optkit's temporaries are (`prefix`: the caller's own naming, one that
    records its owner). commit_folder moves it into place; the caller removes it on every exit path."""
    dest = Path(dest)
    tmp = Path(tempfile.mkdtemp(prefix=prefix or tmp_prefix(dest), dir=dest.parent))
    normal_mode(tmp)
    return tmp


def commit_folder(staged: Path, dest: str | os.PathLike, *, ours: Callable[[Path], bool] | None = None,
                  last: str | None = None) -> None:
    """The one way a folder optkit built comes into place (an atomic_path folder, a split's parts, a package
    version): `staged`, built beside `dest` (stage_folder), renamed onto a new `dest`. An existing `dest` is replaced
    only when `ours(dest)` recognises it as optkit's own (else exit 2, nothing touched; without `ours` a folder is
    never replaced): its entries are replaced by the staged ones and those the staged folder lacks are removed,
    `last` (the file that makes the folder a result: split.json, a preprocessor's marker) removed first and renamed
    in last, so a half-done replacement never looks like a result. The folder itself stays, so a lock held on it
    (core.locks) still guards it. The caller holds its own lock and checks; Ctrl-C or SIGTERM during the renames is
    raised once they are done."""
    dest = Path(dest)
    interrupts.check()  # never commit a result after an interrupt a library swallowed
    if not os.path.lexists(dest):
        os.rename(staged, dest)
        return
    if ours is None or dest.is_symlink() or not dest.is_dir() or not ours(dest):
        raise UsageError(f"{dest} exists and is not a folder optkit wrote; move it away or choose another output "
                         "(nothing was written)")
    names = sorted(p.name for p in staged.iterdir())
    with interrupts.deferred():
        if last is not None:
            with contextlib.suppress(FileNotFoundError):
                (dest / last).unlink()
        for name in names:
            if name != last:
                if (dest / name).is_dir() and not (dest / name).is_symlink():
                    remove(dest / name)
                os.replace(staged / name, dest / name)
        for old in dest.iterdir():
            if old.name not in names:
                remove(old)
        if last is not None and last in names:
            os.replace(staged / last, dest / last)


def normal_mode(path: Path) -> None:
    """The permissions the user's umask gives a new file or folder: mkstemp makes 0600 files and mkdtemp 0700
    folders, which a result (or a package a server reads as another user) must not keep."""
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~_UMASK)


def remove(path: Path) -> None:
    """Remove a temporary file or folder of our own; missing is fine."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def write_text(dest: str | os.PathLike, text: str) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)
