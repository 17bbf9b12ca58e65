"""A package target: one serving system's way of writing a version, checking what it wrote, switching the served
version (rollback / promote) and saying what it cannot express. Targets register by name, as runtimes do:

    register_target("triton", "optkit.package.targets.triton:TritonTarget")

The built-in ones are registered in optkit/package/targets/__init__.py; a plugin registers its own with the same
line in its module, installed under the entry-point group `optkit.package_targets` (the object loaded is the
Target class) or named in OPTKIT_PLUGINS (core.plugins). build.py, manage.py, repo.py and manifests.py call the
Target interface and never branch on a target's name.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

from optkit.core.errors import UsageError
from optkit.core.plugins import load_env_plugins
from optkit.package import lineage

ENTRY_POINTS = "optkit.package_targets"
# a target's name is written into every index and typed after --to: a word, no path, no space
NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,39}")


@dataclass
class Job:
    """What every target gets for one version: the inputs, checked, and what the package says about them. A
    target adds its mapping rows (tuned setting -> the field written) and notes (what it cannot express)."""
    model: str
    artifact: Any                      # core.artifact.Artifact
    config: Any                        # package.config.PackageConfig
    name: str
    tag: str | None
    tuned: Any                         # package.tuned.Tuned
    sig: Any                           # package.signature.Signature
    externals: list                    # (location, file) of the ONNX external data
    shapes: dict
    report: Any = None
    measured: dict = field(default_factory=dict)
    mapping: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)   # the target's own, between prepare and write
    plan: Any = None                   # package.ensemble.Plan: a model in parts (a target with `ensembles` only)
    parts_root: Any = None             # Path: where write_version puts the part models (REPO-like, staged)
    split: dict[str, Any] | None = None  # the lineage's record of the parts (the plan's, and each part's files)

    def lineage(self, number: int, files: dict[str, str]) -> dict[str, Any]:
        return lineage.build_lineage(artifact=self.artifact, target=self.config.to, name=self.name, version=number,
                                     tag=self.tag, tuned=self.tuned, report=self.report,
                                     report_path=self.config.report, files=files, mapping=self.mapping,
                                     notes=self.notes, split=self.split)


@dataclass
class Served:
    """What serve-version changes: files replaced at the model level, the version served before, and the
    target's own record (a registry alias moved)."""
    replace: dict[Path, str] = field(default_factory=dict)
    before: int | None = None
    record: dict[str, Any] | None = None


class Target:
    """Subclass, set `name`, and implement write_version; the rest has defaults that do nothing."""
    name: ClassVar[str] = ""
    describe: ClassVar[str] = ""                  # one line for --help and errors
    options: ClassVar[tuple[str, ...]] = ()       # PackageConfig keys only this target takes (others refuse them)
    model_files: ClassVar[frozenset[str]] = frozenset()  # files it keeps in REPO/NAME beside the index
    manifest_format: ClassVar[str] = ""           # the model format deployment manifests name
    manifest_runtime: ClassVar[str | None] = None  # KServe's serving runtime, where it needs one named
    manifest_level: ClassVar[str] = "version"     # what a cluster reads: "repository", or a "version" folder
    ensembles: ClassVar[bool] = False             # serves a model in parts (job.plan): writes part models too

    def check(self, config) -> None:
        """Before anything is read or written: what this target cannot do with these options (UsageError)."""

    def prepare(self, job: Job) -> None:
        """Before the repository lock: turn the tuned settings into this target's fields (job.mapping, notes)."""

    def write_version(self, job: Job, vdir: Path, number: int) -> dict[str, str]:
        """Write version `number` into the (new, empty) folder vdir. Returns the files it keeps at the model
        level (REPO/NAME/<file>: text), e.g. the served config."""
        raise NotImplementedError

    def validate(self, job: Job, vdir: Path) -> None:
        """Check what write_version wrote (read it back); raise PassError when it is not what was meant."""

    def after_commit(self, job: Job, model_dir: Path, number: int) -> None:
        """Under the lock, once the version is in place (a registry to tell)."""

    def serve(self, model_dir: Path, index: dict, number: int, recorded: dict, registry: str | None) -> Served:
        """Serve version `number` (its lineage `recorded`, its files verified): what changes besides the index."""
        return Served(before=index.get("served"))

    def manifest_uris(self, base_uri: str, name: str, version: int) -> tuple[str, str]:
        """(KServe's storageUri, Seldon's storageUri) for a version."""
        version_uri = f"{base_uri}/{name}/{version}"
        if self.manifest_level == "repository":
            return base_uri, f"{base_uri}/{name}"
        return version_uri, version_uri


_TARGETS: dict[str, str | type[Target]] = {}
_loaded = False


def register_target(name: str, where: str | type[Target]) -> None:
    """Register a target by name: "module:Class" (imported when first used) or the class itself. A name that is
    no plain word, or one another module registered already (a built-in's), is a UsageError: a plugin cannot
    take over `--to triton` unseen."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise UsageError(f"package target name {name!r}: use lowercase letters, digits, '_' and '-' (a letter "
                         "first, at most 40)")
    if not (isinstance(where, str) and ":" in where) and not (isinstance(where, type) and issubclass(where, Target)):
        raise UsageError(f"package target {name!r}: register a Target subclass or 'module:Class', not {where!r}")
    if name in _TARGETS and not _same(_TARGETS[name], where):
        raise UsageError(f"package target {name!r} is registered already ({_where(_TARGETS[name])}); a plugin "
                         "takes a name of its own")
    _TARGETS[name] = where


def _where(where: str | type) -> str:
    return where if isinstance(where, str) else f"{where.__module__}:{where.__qualname__}"


def _same(a: str | type, b: str | type) -> bool:
    """The same registration again (a module imported twice, or its string and its class once imported)."""
    return a is b or _where(a) == _where(b)


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        importlib.import_module("optkit.package.targets")
        for ep in entry_points(group=ENTRY_POINTS):
            try:
                obj = ep.load()
            except Exception as e:  # noqa: BLE001 - an installed plugin's own failure, shown as one line
                raise UsageError(f"package target plugin {ep.name!r} ({ep.value}) does not load: {_one_line(e)}; "
                                 "fix or uninstall it") from None
            if isinstance(obj, type) and issubclass(obj, Target):
                register_target(obj.name or ep.name, obj)
    load_env_plugins()


def target_names() -> list[str]:
    """Every registered target, built-in first."""
    _load()
    return list(_TARGETS)


def choices(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def get_target(name: str, flag: str = "--to") -> Target:
    """The target registered as `name`, else exit 2 naming the choices."""
    names = target_names()
    if not isinstance(name, str) or name not in _TARGETS:
        raise UsageError(f"{flag} {name!r}: choose {choices(names)}")
    where = _TARGETS[name]
    if isinstance(where, str):
        module, _, attr = where.partition(":")
        try:
            where = getattr(importlib.import_module(module), attr)
        except Exception as e:  # noqa: BLE001 - a plugin's module that does not import: one line
            raise UsageError(f"package target {name!r} ({_TARGETS[name]}) does not load: {_one_line(e)}") from None
        _TARGETS[name] = where
    if not (isinstance(where, type) and issubclass(where, Target)):
        raise UsageError(f"package target {name!r} is not a Target class ({where!r})")
    if where.name and where.name != name:
        raise UsageError(f"package target {name!r}: its class says name {where.name!r}; register it by that name")
    bad = sorted(f for f in where.model_files if not model_file_ok(f))
    if bad:
        raise UsageError(f"package target {name!r}: model_files {bad[0]!r} is not a plain file name of its own "
                         "(no path, no dot first, no number, no optkit- name)")
    try:
        target = where()
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"package target {name!r} cannot be made: {_one_line(e)}") from None
    target.name = name  # type: ignore[misc]  # an entry point's class may leave it to the entry's name
    return target


def model_file_ok(f: object) -> bool:
    """A file a target may keep beside the index: a plain name, not a version's (digits), not a temporary's or a
    hidden one (a dot first), not optkit's own (optkit-versions.json and the version files)."""
    return (isinstance(f, str) and 0 < len(f) <= 100 and f.isprintable() and not f.startswith((".", "optkit-"))
            and not any(c in f for c in "/\\") and not f.isdigit())


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def takers(key: str) -> list[str]:
    """The targets that take a target-specific option."""
    out = []
    for n in target_names():
        try:
            if key in get_target(n).options:
                out.append(n)
        except UsageError:  # a plugin's target that does not load takes nothing (it is refused where named)
            continue
    return out
