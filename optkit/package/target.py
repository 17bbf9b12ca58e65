"""A package target: one serving system's way of writing a version, checking what it wrote, switching the served
version (rollback / promote) and saying what it cannot express. Targets register by name, as runtimes do:

    register_target("triton", "optkit.package.targets.triton:TritonTarget")

The built-in ones are registered in optkit/package/targets/__init__.py; a plugin registers its own with the same
line in its module, installed under the entry-point group `optkit.package_targets` (the object loaded is the
Target class) or named in OPTKIT_PLUGINS (core.plugins). A target owns its options: its `Config` (pydantic, a
`core.registry.cli(...)` per field, as a pass's) becomes `optkit package` flags and `package:` recipe keys beside
the shared ones (package.config.PackageConfig). Two targets declaring one flag or key must mean the same by it:
otherwise the second registration is a UsageError naming both. build.py, manage.py, repo.py and manifests.py
call the Target interface and never branch on a target's name.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as PydanticValidationError

from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.core.fieldspec import field_spec
from optkit.core.formats import Format
from optkit.core.plugins import load_env_plugins
from optkit.core.registry import config_message, flag_of
from optkit.package import lineage
from optkit.package import preprocessor as carried
from optkit.package.config import PackageConfig

ENTRY_POINTS = "optkit.package_targets"
# a target's name is written into every index and typed after --to: a word, no path, no space
NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,39}")
# flags `optkit package` has besides PackageConfig's (a target may not declare them)
COMMAND_FLAGS = frozenset({"--json", "--help", "-h"})


class TargetConfig(BaseModel):
    """Base of a target's own options: an unknown key is an error, a number is finite. Every field has a default
    (a package needs none of them) and, to be a flag, `json_schema_extra=cli("--flag")`; the module declaring it
    imports no framework (`optkit package --help` reads it)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


@dataclass
class Job:
    """What a target gets for one version: the inputs, checked, and what the package says about them. A target
    adds its mapping rows (tuned setting -> the field written) and notes (what it cannot express)."""
    model: str
    config: Any                        # package.config.PackageConfig: what every target shares
    options: Any                       # the target's own Config
    artifact: Any = None               # core.artifact.Artifact: the model file packaged (set by Target.open)
    named: str | None = None           # the path a default --name comes from (Target.open; else MODEL)
    made_from: str | None = None       # sha256 of the model this one was made from: its tune and capacity count
    sig: Any = None                    # package.signature.Signature (read from an ONNX model unless open set it)
    externals: list = field(default_factory=list)  # (location, file) of the ONNX external data
    name: str = ""
    tag: str | None = None
    tuned: Any = None                  # package.tuned.Tuned
    shapes: dict = field(default_factory=dict)
    report: Any = None
    measured: dict = field(default_factory=dict)
    mapping: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)   # the target's own, between open and write
    models: list[str] = field(default_factory=list)       # model folders written beside NAME (Target.models)
    root: Path | None = None           # the staged repository: each of those models' version N goes in root/<m>/<N>
    model_level: dict[str, dict[str, str]] = field(default_factory=dict)  # their model-level files (model_files)
    split: dict[str, Any] | None = None  # the lineage's record of a model in parts (build adds each model's files)
    temporaries: list[Path] = field(default_factory=list)  # removed once the package is made, or failed
    handed: dict[str, Any] = field(default_factory=dict)  # what a recipe's run made, in memory: a split "plan", ...
    preprocessor: Any = None           # package.preprocessor.Carried: the model's tokenizer folder, checked

    def lineage(self, number: int, files: dict[str, str]) -> dict[str, Any]:
        return lineage.build_lineage(artifact=self.artifact, target=self.config.to, name=self.name, version=number,
                                     tag=self.tag, tuned=self.tuned, report=self.report,
                                     report_path=self.config.report, files=files, mapping=self.mapping,
                                     notes=self.notes, split=self.split,
                                     preprocessor=carried.lineage_entry(self.preprocessor))


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
    Config: ClassVar[type[BaseModel]] = TargetConfig  # its own options: flags of `optkit package`, recipe keys
    accepts: ClassVar[tuple[Format, ...]] = (Format.ONNX,)  # the model formats it packages
    serve_options: ClassVar[dict[str, str]] = {}  # Config keys serve-version takes too: key -> what they do there
    model_files: ClassVar[frozenset[str]] = frozenset()  # files it keeps in REPO/NAME beside the index
    manifest_format: ClassVar[str] = ""           # the model format deployment manifests name
    manifest_runtime: ClassVar[str | None] = None  # KServe's serving runtime, where it needs one named
    manifest_level: ClassVar[str] = "version"     # what a cluster reads: "repository", or a "version" folder

    def check(self, config, options) -> None:
        """Before anything is read or written: what this target cannot do with these options (UsageError)."""

    def open(self, job: Job) -> None:
        """What MODEL is to this target: set job.artifact (the model file packaged; its format must be one of
        `accepts`), and where it differs job.named, job.made_from, job.sig. Default: the file itself."""
        try:
            job.artifact = Artifact.load(job.model)
        except UsageError as e:
            if not Path(job.model).is_dir():
                raise
            raise UsageError(f"--to {self.name} packages one model: {e.message}") from None

    def models(self, job: Job) -> list[str]:
        """Model folders each version also writes beside REPO/NAME (named after job.name), owned by NAME's index
        and switched with it; write_version puts version N of each in job.root/<model>/<N>/."""
        return []

    def outputs(self, options, key) -> list:
        """What it writes besides the repository (core.atomic.Output; `key(option)` names the option)."""
        return []

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

    def serve(self, model_dir: Path, index: dict, number: int, recorded: dict, options) -> Served:
        """Serve version `number` (its lineage `recorded`, its files verified), with the options serve-version
        was given (its Config): what changes besides the index."""
        return Served(before=index.get("served"))

    def serves_with(self, job: Job) -> dict[str, Any] | None:
        """Where the version is OpenVINO IR: the settings OpenVINO Model Server gets in the manifests (threads,
        concurrency, batch, the openvino version that wrote the IR); None (the default): the target's own server."""
        return None

    def manifest_uris(self, base_uri: str, name: str, version: int) -> tuple[str, str]:
        """(KServe's storageUri, Seldon's storageUri) for a version."""
        version_uri = f"{base_uri}/{name}/{version}"
        if self.manifest_level == "repository":
            return base_uri, f"{base_uri}/{name}"
        return version_uri, version_uri


_TARGETS: dict[str, str | type[Target]] = {}
_CHECKED: set[str] = set()  # targets whose options were compared with every target registered at the time
_loaded = False


def register_target(name: str, where: str | type[Target]) -> None:
    """Register a target by name: "module:Class" (imported when first used) or the class itself. A name that is
    no plain word, or one another module registered already (a built-in's), is a UsageError: a plugin cannot
    take over `--to triton` unseen; so is a class whose options clash with another target's."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise UsageError(f"package target name {name!r}: use lowercase letters, digits, '_' and '-' (a letter "
                         "first, at most 40)")
    if not (isinstance(where, str) and ":" in where) and not (isinstance(where, type) and issubclass(where, Target)):
        raise UsageError(f"package target {name!r}: register a Target subclass or 'module:Class', not {where!r}")
    if name in _TARGETS and not _same(_TARGETS[name], where):
        raise UsageError(f"package target {name!r} is registered already ({_where(_TARGETS[name])}); a plugin "
                         "takes a name of its own")
    if isinstance(where, type):
        _check_options(name, where)
        _CHECKED.add(name)
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


def _class(name: str) -> type[Target]:
    """The registered class (a "module:Class" imported now), held to the interface; else a UsageError."""
    where = _TARGETS[name]
    if isinstance(where, str):
        module, _, attr = where.partition(":")
        try:
            where = getattr(importlib.import_module(module), attr)
        except Exception as e:  # noqa: BLE001 - a plugin's module that does not import: one line
            raise UsageError(f"package target {name!r} ({_TARGETS[name]}) does not load: {_one_line(e)}") from None
        if not (isinstance(where, type) and issubclass(where, Target)):
            raise UsageError(f"package target {name!r} is not a Target class ({where!r})")
        _TARGETS[name] = where
    if where.name and where.name != name:
        raise UsageError(f"package target {name!r}: its class says name {where.name!r}; register it by that name")
    bad = sorted(f for f in where.model_files if not model_file_ok(f))
    if bad:
        raise UsageError(f"package target {name!r}: model_files {bad[0]!r} is not a plain file name of its own "
                         "(no path, no dot first, no number, no optkit- name)")
    return where


def _checked(name: str) -> type[Target]:
    """The class, its options compared with every other target's (once)."""
    cls = _class(name)
    if name not in _CHECKED:
        _check_options(name, cls)
        _CHECKED.add(name)
    return cls


def get_target(name: str, flag: str = "--to") -> Target:
    """The target registered as `name`, else exit 2 naming the choices."""
    names = target_names()
    if not isinstance(name, str) or name not in _TARGETS:
        raise UsageError(f"{flag} {name!r}: choose {choices(names)}")
    cls = _checked(name)
    try:
        target = cls()
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


# ------------------------------------------------------------------ each target's own options

def _loadable() -> dict[str, type[Target]]:
    """Every registered target that loads, its options checked (one that does not load offers none: it is
    refused where it is named; a clash of options is raised)."""
    out = {}
    for n in target_names():
        try:
            _class(n)
        except UsageError:
            continue
        out[n] = _checked(n)
    return out


def _takes(cls: type[Target], key: str, serving: bool) -> bool:
    return key in (cls.serve_options if serving else cls.Config.model_fields)


def takers(key: str, serving: bool = False) -> list[str]:
    """The targets whose Config has `key` (`serving`: those whose serve-version takes it)."""
    return [n for n, cls in _loadable().items() if _takes(cls, key, serving)]


def flag_named(key: str, names: list[str]) -> str:
    """`key (--flag)` as the first of those targets declares it (the same in all: checked at registration)."""
    cls = _class(names[0]) if names else None
    flag = flag_of(cls.Config, key) if cls is not None else None
    return f"{key} ({flag})" if flag else key


def option_specs() -> dict[str, list[dict[str, Any]]]:
    """Each target's options as the CLI derives a Config's fields (core.fieldspec), by target name."""
    return {n: _specs(cls) for n, cls in _loadable().items()}


def _specs(cls: type[Target]) -> list[dict[str, Any]]:
    return [field_spec(k, f) for k, f in cls.Config.model_fields.items()]


def target_options(target: Target, given: dict[str, Any]):
    """The target's Config from the options given for it; a bad one is one UsageError line naming the key and
    its flag, as PackageConfig's are."""
    try:
        return target.Config(**given)
    except PydanticValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "options"
        flag = flag_of(target.Config, str(err["loc"][0])) if err["loc"] else None
        named = f"{key} ({flag})" if flag else key
        raise UsageError(f"{named}: {config_message(err)} (--to {target.name})") from None


def own_options(target: Target, given: dict[str, Any], serving: bool = False) -> dict[str, Any]:
    """The options given that are the target's (`serving`: those its serve-version takes); another target's
    option (not None) is refused naming the targets that take it, one no target takes as unknown."""
    own = {}
    for key, value in sorted(given.items()):
        if _takes(type(target), key, serving):
            own[key] = value
            continue
        others = takers(key, serving)
        if not others:
            keys = ", ".join(sorted(target.serve_options if serving else target.Config.model_fields)) or "none"
            raise UsageError(f"{key}: unknown option (--to {target.name} takes the shared ones and: {keys})")
        if value is not None:
            raise UsageError(f"{flag_named(key, others)} is for --to {choices(others)}"
                             f"{' packages' if serving else ''}, not {target.name}")
    return own


def _declared(name: str, cls: type[Target]) -> dict[str, dict[str, Any]]:
    """The target's options by key, each held to what an option of `optkit package` must be."""
    config = getattr(cls, "Config", None)
    if not (isinstance(config, type) and issubclass(config, BaseModel)):
        raise UsageError(f"package target {name!r}: its Config is not a pydantic model ({config!r})")
    shared = {s["key"]: s for s in (field_spec(k, f) for k, f in PackageConfig.model_fields.items())}
    taken = {f for s in shared.values() for f in (s.get("flag"), s.get("short")) if f} | COMMAND_FLAGS
    out = {}
    for key, f in config.model_fields.items():
        spec = field_spec(key, f)
        flags = [x for x in (spec.get("flag"), spec.get("short"), spec.get("secondary")) if x]
        if key in shared or set(flags) & taken:
            flag = next((x for x in flags if x in taken), spec.get("flag"))
            raise UsageError(f"package target {name!r}: option {key} ({flag}) is one `optkit package` has for every "
                             "target; take another key and flag")
        if spec["required"]:
            raise UsageError(f"package target {name!r}: option {key} has no default; a target's options are "
                             "optional (a package is made without them)")
        if spec.get("group"):
            raise UsageError(f"package target {name!r}: option {key}: a target's options are shown under the "
                             "target (no group)")
        _bounded(name, key, spec)
        out[key] = spec
    return out


def _check_options(name: str, cls: type[Target]) -> None:
    """Two targets declaring one key or flag declare it identically (the same type, help, default, bounds):
    one option shared deliberately. Otherwise a UsageError naming both."""
    mine = _declared(name, cls)
    for other in list(_TARGETS):
        if other == name:
            continue
        try:
            theirs = _declared(other, _class(other))
        except UsageError:  # a target that does not load is refused where it is named
            continue
        for key, spec in mine.items():
            clash = next((s for s in theirs.values() if (s["key"] == key or _flags(s) & _flags(spec)) and s != spec),
                         None)
            if clash is not None:
                what = next((k for k in ("key", "flag", "type", "help", "default", "min", "max", "sets")
                             if clash.get(k) != spec.get(k)), "declaration")
                raise UsageError(
                    f"package targets {other!r} ({_where(_TARGETS[other])}) and {name!r} ({_where(cls)}) both "
                    f"declare {spec.get('flag') or key} ({key}) with different meanings ({what}: "
                    f"{clash.get(what)!r} vs {spec.get(what)!r}); declare one shared option identically, or name "
                    "yours differently")


def _bounded(name: str, key: str, spec: dict[str, Any]) -> None:
    """A target's number has both bounds (as every figure a package records has: a flag is exit 2 past them, never
    a manifest holding 10**30), and its default lies within them (pydantic does not check a default)."""
    if spec["type"] not in ("int", "float"):
        return
    low, high = spec.get("min", spec.get("min_open")), spec.get("max", spec.get("max_open"))
    if low is None or high is None:
        raise UsageError(f"package target {name!r}: option {key} is a number without "
                         f"{'a lower' if low is None else 'an upper'} bound; give it ge= and le= (Field)")
    default = spec.get("default")
    if isinstance(default, (int, float)) and not isinstance(default, bool) and not low <= default <= high:
        raise UsageError(f"package target {name!r}: option {key}'s default {default!r} is outside its bounds "
                         f"[{low}, {high}]")


def _flags(spec: dict[str, Any]) -> set[str]:
    return {x for x in (spec.get("flag"), spec.get("short"), spec.get("secondary")) if x}
