"""The run workspace, the stage cache and progress display.

Layout:
    runs/<recipe>/<run-id>/run.json                 status: running, complete, failed, interrupted
    runs/<recipe>/<run-id>/NN-<stage>/              the stage's model and its report.json
    runs/<recipe>/<run-id>/report.{json,md,html}, junit.xml
    runs/<recipe>/latest -> <run-id>
    runs/.cache/<key>/                              a pass output, keyed by (input sha256, pass, config,
                                                    data, seed, optkit and library versions)
A stage is built in `.NN-<stage>.partial/` and renamed into place when complete, so a stage folder that
exists is a complete stage; an interrupted run resumes from the last one.

The stage cache is used only when it is the user's own and private (core.cachedir): runs/.cache is made 0700, and
one owned by another user or writable by group or others is neither read nor written (said at -v and in the stage's
notes); an entry is reused only when its folder and every file in it are the user's own and private (its entries
are written 0700 / 0600), else it is dropped and the stage computed again.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optkit
from optkit.core import strictjson
from optkit.core.artifact import Artifact, config_key, content_sha256, path_sha256
from optkit.core.atomic import atomic_path, normal_mode, remove, write_text
from optkit.core.cachedir import PRIVATE_DIR, PRIVATE_FILE, private_folder, trusted
from optkit.core.errors import UsageError
from optkit.core.formats import Format
from optkit.core.readback import read_regular
from optkit.report.html import to_html
from optkit.report.junit import to_junit
from optkit.report.render import to_markdown
from optkit.report.schema import Stage, library_versions

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Workspace:
    def __init__(self, root: Path, recipe_name: str):
        self.root = Path(root)
        self.recipe_dir = self.root / recipe_name
        self.cache_dir = self.root / ".cache"
        # recipe names are checked when the recipe loads; this guards every other caller
        base, inside = os.path.abspath(self.root), os.path.abspath(self.recipe_dir)
        if os.path.dirname(inside) != base or recipe_name.startswith("."):
            raise UsageError(f"recipe name {recipe_name!r} is not a plain folder name inside {self.root}; "
                             "use letters, digits, '.', '_' and '-'")
        _check_root(self.root)

    # ------------------------------------------------------------ runs
    def open_run(self, loaded, *, resume: bool = True) -> Run:
        """Resume the last run of this recipe when it was interrupted and no live process holds it, else start one.

        Each run folder is locked (flock on the folder itself) for the life of the process running it, so two
        concurrent `optkit run`s never share a folder; the kernel drops the lock when the process dies.
        """
        self.recipe_dir.mkdir(parents=True, exist_ok=True)
        if os.path.realpath(self.recipe_dir) != os.path.join(os.path.realpath(self.root), self.recipe_dir.name):
            raise UsageError(f"{self.recipe_dir} is a link out of the workspace {self.root}; remove it")
        sha = loaded.sha256()
        if resume:
            last = self._latest_run()
            lock = _try_lock(last) if last is not None else None
            if lock is not None:
                info = _read_json(last / "run.json")
                if info and info.get("status") != "complete" and info.get("recipe_sha256") == sha:
                    run = Run(last, info, lock)
                    run.resumed = True
                    run.set_status("running")
                    return run
                os.close(lock)
        run_id = datetime.now().strftime("%Y%m%d-%H%M%S")
        path, n = self.recipe_dir / run_id, 1
        while True:  # mkdir is the exclusive claim: a folder another process made first is never shared
            try:
                path.mkdir()
                break
            except FileExistsError:
                n += 1
                path = self.recipe_dir / f"{run_id}-{n}"
        lock = _try_lock(path)
        info = {"run_id": path.name, "recipe": str(loaded.path) if loaded.path else None, "recipe_sha256": sha,
                "status": "running", "started": _now(), "pid": os.getpid()}
        run = Run(path, info, lock)
        run.set_status("running")
        _point_latest(self.recipe_dir, path.name)  # only now, locked and with run.json, may others see it
        return run

    def _latest_run(self) -> Path | None:
        link = self.recipe_dir / "latest"
        if link.is_symlink():
            target = os.readlink(link)
            path = self.recipe_dir / target
            if os.sep not in target and not target.startswith(".") and (path / "run.json").is_file():
                return path
        return None

    # ------------------------------------------------------------ cache
    def cache_key(self, artifact, pass_name: str, config: dict, data: dict, measure, files=()) -> str:
        """The stage's identity: its input, pass, config, the recipe's data and the files its config reads
        (`files`: core.atomic.Input, a split's sample data...), each by content, and the versions."""
        fingerprints = {}
        for key, spec in sorted(data.get("specs", {}).items()):
            fingerprints[key] = [_file_sha(spec.path), _file_sha(spec.labels) if spec.labels else None,
                                 spec.preprocess, spec.max_samples]
        for f in files:
            if Path(f.path).exists():
                fingerprints[f"config.{f.key}"] = _file_sha(str(f.path))
        return config_key("optkit-stage-v1", artifact.sha256, pass_name, config, fingerprints, measure.seed,
                          measure.shapes, optkit.__version__, library_versions(), sys.version_info[:2])

    @contextlib.contextmanager
    def cache_lock(self, key: str) -> Iterator[None]:
        """Hold the cache key across processes while it is looked up, computed and stored: a second run
        computing the same stage waits, then reuses the first one's result."""
        import fcntl

        if self._cache_refused():
            yield  # the cache is not used: nothing to hold
            return
        fd = os.open(self.cache_dir / f"{key[:32]}.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                     PRIVATE_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def cache_get(self, key: str, dest: Path, notes: list | None = None) -> dict | None:
        """Copy a cached output into `dest`; None when not cached.

        The entry is checked first: its entry.json must be well formed, its files plain files and folders (no
        links, nothing outside the entry), and its model must still have the sha256 recorded when it was
        stored. Anything else (a damaged, truncated or edited entry) is dropped, a note says so, and the stage
        is computed again.
        """

        refused = self._cache_refused()
        if refused:
            if notes is not None:
                notes.append(f"stage cache not used: {refused}")
            return None
        entry_dir = self.cache_dir / key[:32]
        if not entry_dir.exists() and not entry_dir.is_symlink():
            return None
        entry = _read_json(entry_dir / "entry.json") if trusted(entry_dir, "stage cache entry") else None
        checked = _checked_entry(entry, entry_dir, key)
        if checked is None:
            remove(entry_dir)
            if notes is not None:
                notes.append(f"cache entry {key[:12]} was damaged or no longer matched its sha256 and was "
                             "dropped; recomputed")
            return None
        fmt, rel = checked
        shutil.copytree(entry_dir / "files", dest, dirs_exist_ok=True)
        for p in (dest, *dest.rglob("*")):  # the cache's private modes are not a result's
            normal_mode(p)
        a = entry["artifact"]
        art = Artifact(path=str(dest / rel), format=fmt, sha256=a["sha256"],
                       parent=a.get("parent"), produced_by=a.get("produced_by"), config=a.get("config") or {},
                       meta=a.get("meta") or {})
        return {**entry, "artifact": art}

    def cache_put(self, key: str, src: Path, result) -> None:
        """Store a pass output (everything in the stage folder so far) in the cache, atomically.

        The cache holds copies, not hard links: a link would let an edit of a run's output change the cache.
        """

        art = result.output
        try:
            rel = Path(art.path).resolve().relative_to(Path(src).resolve())
        except ValueError:
            return  # the pass wrote outside its stage folder: not cacheable
        if self._cache_refused():
            return
        dest = self.cache_dir / key[:32]
        remove(dest)  # a stale or damaged entry (the caller holds the key's lock)
        a = art.to_dict()
        a["path"] = str(rel)
        entry = {"key": key, "created": _now(), "pass": result.pass_name, "artifact": a,
                 "notes": list(result.ctx.notes), "brief": list(result.ctx.brief),
                 "warnings": list(result.ctx.warnings),
                 "measurements": _jsonable(result.ctx.measurements), "duration_s": result.duration_s}
        with atomic_path(dest, directory=True) as tmp:
            shutil.copytree(src, tmp / "files")
            (tmp / "entry.json").write_text(strictjson.dumps(entry, indent=2, default=str))
            for p in tmp.rglob("*"):
                os.chmod(p, PRIVATE_DIR if p.is_dir() else PRIVATE_FILE)

    def _cache_refused(self) -> str | None:
        """Why the stage cache folder is not used (None when it is the user's own and private; made 0700 when
        missing): it is neither read nor written then."""
        try:
            private_folder(self.cache_dir)
        except OSError as e:
            log.info("stage cache not used (%s)", e)
            return str(e)
        return None


class Run:
    """One run folder."""

    def __init__(self, path: Path, info: dict, lock: int | None = None):
        self.path = path
        self._info = info
        self._lock = lock  # fd holding flock on the folder for as long as this process runs it
        self.resumed = False

    @property
    def run_id(self) -> str:
        return self.path.name

    def info(self) -> dict:
        return {"run_id": self.run_id, "dir": str(self.path), "resumed": self.resumed,
                "recipe": self._info.get("recipe"), "recipe_sha256": self._info.get("recipe_sha256")}

    def set_status(self, status: str) -> None:
        self._info["status"] = status
        self._info["updated"] = _now()
        write_text(self.path / "run.json", strictjson.dumps(self._info, indent=2) + "\n")

    def stage_dir(self, i: int, name: str) -> Path:
        return self.path / f"{i:02d}-{name}"

    def completed_stage(self, i: int, name: str, *, expect_input: str | None, expect_output: str | None = None):
        """(Stage, Artifact) of a stage completed earlier in this run, when it still matches; else (None, None)."""

        d = self.stage_dir(i, name)
        f = d / "report.json"
        if not f.is_file():
            if d.exists():
                remove(d)
            return None, None
        raw = _read_small(f)
        try:
            if raw is None:
                raise ValueError(f"{f} is not a readable report")
            stage = Stage.model_validate_json(raw)
        except (ValueError, RecursionError):
            remove(d)
            return None, None
        ok = (expect_input is None or (stage.input is not None and stage.input.sha256 == expect_input))
        ok = ok and (expect_output is None or stage.output.sha256 == expect_output)
        if not ok or not Path(stage.output.path).exists() or (expect_output is None and not _unchanged(stage.output)):
            remove(d)
            return None, None
        o = stage.output
        art = Artifact(path=o.path, format=Format(o.format), sha256=o.sha256, parent=o.parent,
                       produced_by=o.produced_by, config=stage.config)
        return stage, art

    @contextlib.contextmanager
    def building(self, i: int, name: str) -> Iterator[Path]:
        """A fresh `.NN-name.partial/` folder, renamed to `NN-name/` when the block succeeds."""
        final = self.stage_dir(i, name)
        tmp = self.path / f".{final.name}.partial"
        remove(tmp)
        tmp.mkdir()
        try:
            yield tmp
            if final.exists():
                remove(final)
            os.replace(tmp, final)
        except BaseException:
            remove(tmp)
            raise

    def write_stage(self, folder: Path, stage) -> None:
        write_text(folder / "report.json", strictjson.dumps(stage, indent=2, nulls=True) + "\n")

    def finish(self, report) -> None:
        report.save(self.path / "report.json")
        write_text(self.path / "report.md", to_markdown(report))
        write_text(self.path / "report.html", to_html(report))
        write_text(self.path / "junit.xml", to_junit(report))
        self._info["finished"] = _now()
        self.set_status("complete")

    def abort(self, status: str) -> None:
        """Record why the run stopped. Written directly (not through atomic_path, which refuses to commit
        anything after Ctrl-C): run.json is bookkeeping, not a result, and must not keep saying `running`."""
        self._info["status"] = status
        self._info["updated"] = _now()
        dest = self.path / "run.json"
        tmp = self.path / f".run.json.tmp-{os.getpid()}"
        with contextlib.suppress(Exception):
            try:
                tmp.write_text(strictjson.dumps(self._info, indent=2) + "\n")
                os.replace(tmp, dest)
            finally:
                remove(tmp)

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _check_root(root: Path) -> None:
    """The workspace is a folder, or a path whose nearest existing part is one (it is created then)."""
    for part in (root, *root.absolute().parents):
        if part.is_dir():
            return
        if os.path.lexists(part):
            what = "" if part == root else f": {part} "
            raise UsageError(f"workspace {root}{what or ' '}is not a folder; give a folder for runs (default runs/)")


def _try_lock(folder: Path) -> int | None:
    """An fd holding an exclusive flock on `folder`, or None when another process holds it."""
    import fcntl

    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _point_latest(folder: Path, target: str) -> None:
    link = folder / "latest"
    tmp = folder / f".latest.tmp-{os.getpid()}"
    with contextlib.suppress(OSError):
        remove(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, link)


def _unchanged(ref) -> bool:
    """Whether an output still has the sha256 its stage recorded (a resumed run must give the same result)."""

    try:
        return content_sha256(ref.path, Format(ref.format)) == ref.sha256
    except Exception:
        return False


def _checked_entry(entry: Any, entry_dir: Path, key: str):
    """(format, relative model path) of a cache entry that is whole and unchanged, else None."""

    try:
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        a = entry.get("artifact")
        if not isinstance(a, dict) or not isinstance(a.get("sha256"), str) or not isinstance(a.get("path"), str):
            return None
        if not isinstance(a.get("config") or {}, dict) or not isinstance(a.get("meta") or {}, dict):
            return None
        if not (isinstance(entry.get("duration_s"), (int, float)) and isinstance(entry.get("created"), str)
                and isinstance(entry.get("measurements"), dict)
                and all(isinstance(entry.get(k), list) and all(isinstance(x, str) for x in entry[k])
                        for k in ("notes", "warnings"))):
            return None
        fmt = Format(a["format"])
        rel = os.path.normpath(a["path"])
        if os.path.isabs(rel) or rel in (".", "..") or rel.startswith(".." + os.sep):
            return None  # the model must lie inside the entry
        files = entry_dir / "files"
        if files.is_symlink() or not files.is_dir():
            return None
        for p in (entry_dir / "entry.json", files, *files.rglob("*")):  # copies only: a link would bring in
            if p.is_symlink() or not (p.is_file() or p.is_dir()):      # whatever it points at
                return None
            if not trusted(p, "stage cache file"):
                return None
        cached = files / rel
        if not cached.exists() or content_sha256(cached, fmt) != a["sha256"]:
            return None
        return fmt, rel
    except Exception:  # an unreadable or damaged entry is a miss, never an error
        return None


_MAX_STATE_BYTES = 64 << 20  # run.json, entry.json and a stage's report.json are a few KB


def _read_small(p: Path) -> bytes | None:
    """The bytes of a regular file of at most _MAX_STATE_BYTES; None for anything else (a FIFO, which would
    block the open, a device, a folder, a huge or unreadable file): the workspace's own files read back."""
    try:
        return read_regular(p, _MAX_STATE_BYTES)
    except (OSError, UsageError):
        return None


def _read_json(p: Path) -> dict | None:
    """A JSON object from the workspace's bookkeeping, or None when it is not one (damaged, edited, too deep)."""
    raw = _read_small(p)
    if raw is None:
        return None
    try:
        data = strictjson.loads(raw)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _file_sha(path: str | None) -> str | None:
    if not path:
        return None

    return path_sha256(path)


def _jsonable(obj: Any) -> Any:
    """A stage's measurements as its report.json holds them (a non-finite figure is null, as in every report)."""
    return json.loads(strictjson.dumps(obj, default=str, nulls=True))


class Progress:
    """Stage-by-stage progress on stderr: a line per stage, and a spinner for long steps on a terminal.

    Markup is off and styles are Text spans: recipe names, paths and notes print as written, so a folder
    named `w[/b]` or `x[bold]` is neither styled nor a rich MarkupError.
    """

    def __init__(self, quiet: bool = False):
        from rich.console import Console

        self.quiet = quiet
        self.console = Console(stderr=True, highlight=False, markup=False, emoji=False)
        self._status = None
        self._t0 = 0.0
        self._total = 0
        self._label = ""

    @staticmethod
    def _text(*parts):
        """A rich Text from plain strings and (string, style) pairs; nothing in them is parsed as markup."""
        from rich.text import Text

        out = Text()
        for part in parts:
            if isinstance(part, tuple):
                out.append(part[0], style=part[1])
            else:
                out.append(part)
        return out

    def start_run(self, run: Run, total: int) -> None:
        self._total = total
        if not self.quiet:
            what = "resuming" if run.resumed else "run"
            self.console.print(self._text((what, "bold"), f" {run.path}"))

    def stage_start(self, i: int, name: str, pass_name: str) -> None:
        self._t0 = time.perf_counter()
        self._label = f"[{i}/{self._total - 1}] {name}" + (f" ({pass_name})" if pass_name != "-" else "")
        if not self.quiet and not self.console.is_terminal:
            self.console.print(self._text(f"  - {self._label} ..."))
        if not self.quiet and self.console.is_terminal:
            self._status = self.console.status(self._text(self._label))
            self._status.start()

    def step(self, text: str) -> None:
        if self._status is not None:
            self._status.update(self._text(f"{self._label}: {text}  ",
                                           (f"{time.perf_counter() - self._t0:.0f}s", "dim")))

    def stage_done(self, i: int, name: str, *, cached: bool = False, resumed: bool = False,
                   seconds: float | None = None) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if self.quiet:
            return
        total = time.perf_counter() - self._t0 if self._t0 else 0.0
        label = self._label if not resumed else f"[{i}/{self._total - 1}] {name}"
        how = "resumed" if resumed else ("cached" if cached else "done")
        took = "" if resumed else f" {total:.1f}s"
        self.console.print(self._text("  ", ("✓", "green"), f" {label} ", (f"{how}{took}", "dim")))
        self._t0 = 0.0

    def abort(self) -> None:
        """Stop the spinner (a failed or interrupted stage), so the error line is the last thing printed."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def end_run(self, run: Run) -> None:
        if not self.quiet:
            self.console.print(self._text(f"reports in {run.path}/ (report.md, report.html, junit.xml)"))
