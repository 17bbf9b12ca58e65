"""Make one package version: check every input and the repository first, build the version in a temporary
folder beside its destination, and rename it into place (nothing half-written, nothing replaced)."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from optkit.contracts import base
from optkit.contracts import capacity as capacity_contract
from optkit.core import interrupts
from optkit.core.artifact import Artifact, external_data_files
from optkit.core.atomic import Input, Output, check_outputs, normal_mode, remove
from optkit.core.dburl import is_sqlite, sqlite_file
from optkit.core.errors import OptkitError, PassError, UsageError
from optkit.core.formats import Format
from optkit.core.registry import key_and_flag
from optkit.core.shapes import parse_shapes
from optkit.measure.size import measure_size
from optkit.package import ensemble, lineage, repo, schemas
from optkit.package import manifests as mf
from optkit.package.config import PackageConfig
from optkit.package.signature import Signature, read_signature
from optkit.package.target import Job, Target, choices, get_target, takers
from optkit.package.tuned import Tuned, defaults, load_tuned
from optkit.report.schema import ArtifactRef, Report, Stage


@dataclass
class Result:
    target: str
    repo: str
    name: str
    version: int
    path: str
    served_before: int | None
    files: dict[str, str] = field(default_factory=dict)
    mapping: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tag: str | None = None


INPUTS = ("tuned", "report", "data", "capacity")  # the PackageConfig keys that name files a package reads

# the keyword names package() took before PackageConfig, and the config key each is
_OLD_NAMES = {"target": "to", "tuned_path": "tuned", "report_path": "report"}


def package(model: str, config: PackageConfig | dict | None = None, *, tuned: Tuned | None = None,
            shapes: dict | None = None, report: Report | None = None, plan: ensemble.Plan | None = None,
            capacity: capacity_contract.CapacityFile | None = None, **options) -> Result:
    """Package `model` for `config.to`: the options as a PackageConfig, a dict of them, or keyword arguments
    (`package("m.onnx", to="triton", output="repo", tag="v1")`). `tuned` is a Tuned setting already read (a
    recipe's tune stage; config.tuned reads best.json instead); `shapes` are dims already parsed ({name: dims}).
    What a recipe's run made is handed over in memory, not read back from its files: `report` (config.report names
    where it is), `plan` (a split stage's parts), `capacity` (a capacity stage's CAPACITY.json, at config.capacity)."""
    if config is None:
        config = {_OLD_NAMES.get(k, k): v for k, v in options.items()}
    elif options:
        raise UsageError(f"package(): give the options in config or as keywords, not both ({', '.join(options)})")
    cfg = config if isinstance(config, PackageConfig) else PackageConfig.of(dict(config))
    target = check_options(cfg)
    if not Path(model).exists():
        raise UsageError(f"model {model} does not exist")
    plan = plan if plan is not None else ensemble.detect(model)  # a split folder, a model with preprocessing: parts
    try:
        return _package(model, cfg, target, plan, tuned, shapes, report, capacity)
    finally:
        if plan is not None and plan.tmp is not None:
            remove(plan.tmp)


def _package(model: str, cfg: PackageConfig, target: Target, plan, tuned: Tuned | None,
             shapes: dict | None, report: Report | None = None, given_capacity=None) -> Result:
    if plan is not None and not target.ensembles:
        raise UsageError(f"{model} is a model in parts ({', '.join(p.role for p in plan.parts)}); --to "
                         f"{target.name} packages one model: use --to triton (an ensemble), or package one part file")
    artifact = Artifact.load(model if plan is None or plan.kind == "preprocess" else plan.core.path)
    if artifact.format != Format.ONNX:
        raise UsageError(f"{model} is {artifact.format.value}; package takes an ONNX model: convert it first "
                         f"(optkit convert {model} -o model.onnx)")
    named = model if plan is None or plan.kind == "preprocess" else str(plan.source.parent)
    name = repo.check_name(cfg.name if cfg.name is not None else _name_from(named))  # a --name given: as it is
    tag = repo.check_tag(cfg.tag)
    kinds = mf.parse_kinds(cfg.manifests)
    if kinds and cfg.storage_uri:
        mf.check_storage_uri(cfg.storage_uri)
    capacity, capacity_notes = None, []
    if cfg.capacity is not None:
        if not kinds:
            raise UsageError(f"--capacity {cfg.capacity}: give --manifests kserve,seldon,kubedl too (the capacity "
                             "goes into the deployment manifests)")
        capacity = _capacity(cfg.capacity, artifact, plan, capacity_notes, given_capacity)
    margin = mf.MARGIN if cfg.memory_margin is None else cfg.memory_margin  # bounded by PackageConfig
    out = Path(cfg.output)
    check_outputs(outputs(cfg, name, lambda k: key_and_flag(PackageConfig, k)),
                  [Input("MODEL", model),
                   *(Input(key_and_flag(PackageConfig, k), getattr(cfg, k)) for k in INPUTS if getattr(cfg, k))])
    part_names = [f"{name}.{p.role}" for p in plan.parts] if plan is not None else []
    repo.next_version(repo.precheck(out, name, target.name, part_names), cfg.version, tag)  # chosen under lock
    if plan is None:
        externals = external_data_files(model)
        sig = read_signature(model)
    else:
        externals = []
        for p in plan.parts:
            if external_data_files(p.path):
                raise UsageError(f"{p.path}: its weights are in external data files; a part of an ensemble is "
                                 "packaged as one file here (save it with its weights inside)")
        sig = Signature(plan.inputs, plan.outputs, plan.batchable)
    given = tuned is not None or bool(cfg.tuned)
    if tuned is None:
        tuned = _tuned(cfg.tuned, artifact, plan) if cfg.tuned else defaults()
    report = report if report is not None else Report.load(cfg.report) if cfg.report else None
    made = plan.model_sha256 if plan is not None and plan.model_sha256 else artifact.sha256  # parts: their model's
    measured = lineage.chain_from_report(report, made)[1] if report is not None else {}  # else exit 2
    if report is not None:
        schemas.check_measured(measured, f"--report {cfg.report}")
    notes = capacity_notes + ([] if given else [
        "no --tuned: default settings (1 CPU instance, batch 1, onnxruntime's own threads and optimisations); run "
        "`optkit tune` for measured ones"])
    job = Job(model=model, artifact=artifact, config=cfg, name=name, tag=tag, tuned=tuned, sig=sig,
              externals=externals, shapes={**(shapes or {}), **parse_shapes(cfg.shape or None)}, report=report,
              measured=measured, notes=notes, plan=plan)
    target.prepare(job)

    with repo.writing(out, name, target.name, part_names) as index:  # the version is chosen and written under the model's lock
        number = repo.next_version(index, cfg.version, tag)
        docs = {}
        if kinds:
            uri, uri_notes = mf.base_uri(cfg.storage_uri, out)
            peak, peak_source = mf.peak_memory_mb(measured, tuned.figures)
            docs, man_notes = mf.build(kinds, target=target, name=name, version=number, tag=tag, base_uri=uri,
                                       peak_mb=peak, peak_source=peak_source, margin=margin,
                                       threads=tuned.get("threads"), gpu=(tuned.get("provider") or "cpu") != "cpu",
                                       local_dir=(out / name / str(number)).resolve(), capacity=capacity,
                                       capacity_path=cfg.capacity)
            docs = {kind: mf.render(kind, doc) for kind, doc in docs.items()}
            job.notes.extend(man_notes + uri_notes)
        write = _write if plan is None else _write_parts
        served_before, files_before = write(out, number, index, target, job, docs)
        target.after_commit(job, out / name, number)
    return Result(target=target.name, repo=str(out), name=name, version=number, path=str(out / name / str(number)),
                  served_before=served_before, files=files_before, mapping=job.mapping, notes=job.notes, tag=tag)


def _tuned(path: str, artifact, plan) -> Tuned:
    """best.json for this model; for a model in parts, a tune of the core part (the tuned setting is the core's)
    or of the model it was split from (its sha256 as split.json records it)."""
    return load_tuned(path, artifact.sha256, str(artifact.path), plan.model_sha256 if plan is not None else None)


def _capacity(path: str, artifact, plan, notes: list[str], given=None):
    """CAPACITY.json (a file the user named: a link to it is read; `given`: its document already read, a recipe's
    capacity stage's) through its contract, for this model (or, for a model in parts, the model it was split
    from), else exit 2 naming the file and the key."""
    p = Path(path)
    if given is None and not p.exists() and not p.is_symlink():
        raise UsageError(f"--capacity {path} does not exist; write it with `optkit capacity ... -o {p.name}`")
    cap = given if given is not None else base.load(p, capacity_contract.CapacityFile, capacity_contract.HINT,
                                                    links=True)[1]
    if cap.model_sha256 is None:  # the contract allows it for a served model only (bench --url: its URL)
        notes.append(f"--capacity {path}: its figures are of a served model ({cap.model}, bench --url), which has "
                     f"no file to check: not checked to be {artifact.path}")
    elif plan is None or cap.model_sha256 != plan.model_sha256:
        base.same_model(f"--capacity {path}", "model_sha256", cap.model_sha256, artifact.sha256,
                        str(artifact.path), capacity_contract.FIX)
    return cap


def outputs(cfg: PackageConfig, name: str, key: Callable[[str], str]) -> list[Output]:
    """What packaging writes (core.atomic.check_outputs): the repository (only the model's folders), and an
    SQLite model registry's file; `key(option)` is what the user calls each."""
    out = [repo.output(key("output"), cfg.output, name)]
    registry = sqlite_file(cfg.registry, "MLflow registry") if cfg.registry and is_sqlite(cfg.registry) else None
    if registry is not None:
        out.append(Output(key("registry"), registry))
    return out


def check_options(cfg: PackageConfig, flag: str = "--to") -> Target:
    """The target, once it took these options: another target's option is refused by name, then the target's own
    check (before anything is read or written; a recipe's package: entries before any stage runs)."""
    target = get_target(cfg.to, flag)
    for key in sorted(cfg.model_fields_set - set(target.options)):
        others = takers(key)
        if others and getattr(cfg, key) is not None:
            raise UsageError(f"{key_and_flag(PackageConfig, key)} is for --to {choices(others)}, not {target.name}")
    target.check(cfg)
    return target


def _name_from(model: str) -> str:
    """A legal model name from the file's name: other characters become '_'."""
    stem = Path(model).stem
    name = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in stem).lstrip("._-")[:128]
    name = name or "model"
    return f"m{name}" if name.isdigit() else name


def _write(out: Path, number: int, index: dict | None, target: Target, job: Job,
           docs: dict[str, str]) -> tuple[int | None, dict[str, str]]:
    """Build the version aside and rename it into place (under the lock). The highest level that does not
    exist yet is built whole in a temporary folder beside it. Returns (the version served before, file hashes)."""
    name = job.name
    model_dir = out / name
    dest = out if not out.exists() else model_dir if not model_dir.exists() else model_dir / str(number)
    staged = Path(tempfile.mkdtemp(prefix=repo.temp_prefix(dest), dir=dest.parent))
    try:
        normal_mode(staged)  # a server may run as another user
        vdir = staged / name / str(number) if dest == out else staged / str(number) if dest == model_dir else staged
        vdir.mkdir(parents=True, exist_ok=True)
        model_level = _target_wrote(target, job, vdir, number)
        _write_report_and_manifests(vdir, job, docs)
        files = lineage.file_hashes(vdir)
        lin = job.lineage(number, files)
        (vdir / lineage.LINEAGE_FILE).write_text(lineage.text(lin), encoding="utf-8")
        index = index or repo.new_index(target.name, name)
        served_before = index.get("served")
        repo.add_version(index, number, job.tag, job.artifact.sha256, job.tuned.label)
        replace = {}
        if dest == model_dir / str(number):
            replace = {model_dir / repo.INDEX: repo.index_text(index)}
            replace.update({model_dir / f: text for f, text in model_level.items()})
        else:
            top = vdir.parent
            (top / repo.INDEX).write_text(repo.index_text(index), encoding="utf-8")
            for f, text in model_level.items():
                (top / f).write_text(text, encoding="utf-8")
        repo.commit(staged, dest, replace)
    finally:
        remove(staged)
    return served_before, files


def _write_parts(out: Path, number: int, index: dict | None, target: Target, job: Job,
                 docs: dict[str, str]) -> tuple[int | None, dict[str, str]]:
    """_write for a model in parts: the ensemble's version and each part model's version N are built in one
    temporary folder (laid out as a repository) and renamed into place, the parts first and the index last; a new
    repository is renamed into place whole."""
    name, parts = job.name, job.state.get("part_names") or []
    new_repo = not out.exists()
    staged = Path(tempfile.mkdtemp(prefix=repo.temp_prefix(out if new_repo else out / name),
                                   dir=out.parent if new_repo else out))
    try:
        normal_mode(staged)
        vdir = staged / name / str(number)
        vdir.mkdir(parents=True)
        job.parts_root = staged
        model_level = _target_wrote(target, job, vdir, number)
        part_level = job.state.get("part_level") or {}
        for model in parts:
            _only_files(target, staged / model)
            if set(part_level.get(model, {})) - set(target.model_files):
                raise PassError(f"package target {target.name!r} wrote model-level files of {model} that are not "
                                "its model_files")
        _write_report_and_manifests(vdir, job, docs)
        job.split = {**job.plan.record(),
                     "models": {m: lineage.file_hashes(staged / m / str(number)) for m in parts}}
        files = lineage.file_hashes(vdir)
        (vdir / lineage.LINEAGE_FILE).write_text(lineage.text(job.lineage(number, files)), encoding="utf-8")
        index = index or repo.new_index(target.name, name)
        served_before = index.get("served")
        repo.add_version(index, number, job.tag, job.artifact.sha256, job.tuned.label)
        index["parts"] = sorted({*index.get("parts", []), *parts})
        levels = {**{m: part_level.get(m, {}) for m in parts}, name: {**model_level, repo.INDEX: repo.index_text(index)}}
        if new_repo:
            for model, files_at in levels.items():
                for f, text in files_at.items():
                    (staged / model / f).write_text(text, encoding="utf-8")
            repo.commit(staged, out, {})
        else:
            interrupts.check()
            for model, files_at in levels.items():  # the parts, then the ensemble; its index last
                if not (out / model).exists():
                    for f, text in files_at.items():
                        (staged / model / f).write_text(text, encoding="utf-8")
                    os.rename(staged / model, out / model)
                else:
                    os.rename(staged / model / str(number), out / model / str(number))
                    for f in sorted(files_at, key=lambda f: f == repo.INDEX):
                        repo.replace_text(out / model / f, files_at[f])
    finally:
        remove(staged)
    return served_before, files


def _only_files(target: Target, folder: Path) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_symlink() or not (p.is_dir() or p.is_file()):
            raise PassError(f"package target {target.name!r} wrote {p}, a link or special file; a version holds "
                            "regular files only (nothing was written)")


def _target_wrote(target: Target, job: Job, vdir: Path, number: int) -> dict[str, str]:
    """write_version and validate, held to what a target may write: regular files and folders inside vdir (no
    link, FIFO or device), and model-level files it names in model_files only (never the index, never a path
    outside the model folder). Any failure of the target's own code is one PassError line (exit 3)."""
    try:
        model_level = target.write_version(job, vdir, number)
        target.validate(job, vdir)
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001 - a target's own bug (a plugin's), shown as one line
        raise PassError(f"package target {target.name!r} failed writing version {number}: {type(e).__name__}: "
                        f"{(str(e).splitlines() or [''])[0][:200]}") from e
    if not isinstance(model_level, dict):
        raise PassError(f"package target {target.name!r}: write_version returned {type(model_level).__name__}, "
                        "not a dict of its model_files")
    for f, text in model_level.items():
        if f not in target.model_files or not isinstance(text, str):
            raise PassError(f"package target {target.name!r} wrote model-level file {f!r}, which is not one of its "
                            f"model_files ({', '.join(sorted(target.model_files)) or 'none'}) or not text")
    for p in sorted(vdir.rglob("*")):
        if p.is_symlink() or not (p.is_dir() or p.is_file()):
            raise PassError(f"package target {target.name!r} wrote {p.relative_to(vdir)}, a link or special file; "
                            "a version holds regular files only (nothing was written)")
    return model_level


def _write_report_and_manifests(vdir: Path, job, docs: dict) -> None:
    """The version's report (the job's, else a size-only one) and its manifests/<kind>.yaml."""
    report_obj = job.report if job.report is not None else _size_report(job.artifact)
    (vdir / lineage.REPORT_FILE).write_text(report_obj.to_json(), encoding="utf-8")
    if docs:
        (vdir / "manifests").mkdir()
        for kind, text in docs.items():
            (vdir / "manifests" / f"{kind}.yaml").write_text(text, encoding="utf-8")


def _size_report(artifact):
    """The package's own one-stage report when no --report was given: the model and its size."""
    ref = ArtifactRef(path=str(artifact.path), format=artifact.format.value, sha256=artifact.sha256)
    return Report(command="optkit package", stages=[Stage(name="package", output=ref,
                                                          measurements={"size": measure_size(artifact)})])
