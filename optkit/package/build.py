"""Make one package version: check every input and the repository first, build the version in a temporary
folder beside its destination, and rename it into place (nothing half-written, nothing replaced)."""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from optkit.contracts import base
from optkit.contracts import capacity as capacity_contract
from optkit.core.artifact import external_data_files
from optkit.core.atomic import Input, Output, check_outputs, normal_mode, remove
from optkit.core.errors import OptkitError, PassError, UsageError
from optkit.core.formats import Format
from optkit.core.registry import key_and_flag
from optkit.core.shapes import parse_shapes
from optkit.measure.size import measure_size
from optkit.package import lineage, repo, schemas
from optkit.package import manifests as mf
from optkit.package import preprocessor as carried
from optkit.package.config import PackageConfig
from optkit.package.signature import read_signature
from optkit.package.target import Job, Target, get_target, own_options, target_options
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
            shapes: dict | None = None, report: Report | None = None, plan=None,
            capacity: capacity_contract.CapacityFile | None = None, **options) -> Result:
    """Package `model` for `config.to`: the options as a PackageConfig, a dict of them, or keyword arguments
    (`package("m.onnx", to="triton", output="repo", tag="v1")`; a target's own options beside them). `tuned` is
    a Tuned setting already read (a recipe's tune stage; config.tuned reads best.json instead); `shapes` are dims
    already parsed ({name: dims}). What a recipe's run made is handed over in memory, not read back from its files:
    `report` (config.report names where it is), `plan` (a split stage's parts: package.ensemble.Plan), `capacity`
    (a capacity stage's CAPACITY.json, at config.capacity)."""
    if config is None:
        config = {_OLD_NAMES.get(k, k): v for k, v in options.items()}
    elif options:
        raise UsageError(f"package(): give the options in config or as keywords, not both ({', '.join(options)})")
    cfg = config if isinstance(config, PackageConfig) else PackageConfig.of(dict(config))
    target, opts = resolve(cfg)
    target.check(cfg, opts)
    if not Path(model).exists():
        raise UsageError(f"model {model} does not exist")
    job = Job(model=model, config=cfg, options=opts, report=report,
              handed={k: v for k, v in (("plan", plan), ("capacity", capacity)) if v is not None})
    try:
        target.open(job)  # what MODEL is to this target (one model, or one in parts)
        _accepted(model, target, job.artifact)
        job.preprocessor = carried.find(model)  # missing or changed since the model was written: exit 2
        kinds, capacity = _inputs(job, target, tuned, shapes)
        return _make(job, target, kinds, capacity)
    finally:
        for tmp in job.temporaries:
            remove(tmp)


def _accepted(model: str, target: Target, artifact) -> None:
    """The model is in a format the target packages, else exit 2 naming those and how to convert."""
    if artifact.format in target.accepts:
        return
    others = [f.value for f in target.accepts if f != Format.ONNX]
    if Format.ONNX in target.accepts:  # ONNX first: what `optkit convert` writes
        what = "an ONNX model"
        how = f"convert it first (optkit convert {model} -o model.onnx)" + (
            f"; it takes {' or '.join(others)} too" if others else "")
    else:
        kinds = " or ".join(others)
        what, how = f"{'an' if kinds[:1] in 'AEIOUaeiou' else 'a'} {kinds} model", "convert it first"
    if artifact.format == Format.OPENVINO_IR:  # nothing converts IR back
        how = "package the ONNX model it was converted from (--to triton serves OpenVINO IR)"
    raise UsageError(f"{model} is {artifact.format.value}; a {target.name} package takes {what}: {how}")


def _inputs(job: Job, target: Target, tuned: Tuned | None, shapes: dict | None) -> tuple[list[str], object]:
    """Everything read and checked before the repository lock (the repository too); then the target's
    prepare. Returns (the manifest kinds, the capacity read)."""
    cfg, artifact, model = job.config, job.artifact, job.model
    job.name = repo.check_name(cfg.name if cfg.name is not None else _name_from(job.named or model))  # as given
    job.tag = repo.check_tag(cfg.tag)
    kinds = mf.parse_kinds(cfg.manifests)
    if kinds and cfg.storage_uri:
        mf.check_storage_uri(cfg.storage_uri)
    capacity, capacity_notes = None, []
    if cfg.capacity is not None:
        if not kinds:
            raise UsageError(f"--capacity {cfg.capacity}: give --manifests kserve,seldon,kubedl too (the capacity "
                             "goes into the deployment manifests)")
        capacity = _capacity(cfg.capacity, artifact, job.made_from, capacity_notes, job.handed.get("capacity"))
    check_outputs(outputs(cfg, job.name, lambda k: _named(target, k)),
                  [Input("MODEL", model),
                   *(Input(key_and_flag(PackageConfig, k), getattr(cfg, k)) for k in INPUTS if getattr(cfg, k))])
    job.models = list(target.models(job))
    repo.next_version(repo.precheck(Path(cfg.output), job.name, target.name, job.models), cfg.version,
                      job.tag)  # chosen again under the lock
    if job.sig is None and artifact.format == Format.ONNX:
        job.externals, job.sig = external_data_files(model), read_signature(model)
    given = tuned is not None or bool(cfg.tuned)
    if tuned is None:
        tuned = load_tuned(cfg.tuned, artifact.sha256, str(artifact.path), job.made_from) if cfg.tuned \
            else defaults()
    job.tuned = tuned
    if job.report is None and cfg.report:
        job.report = Report.load(cfg.report)
    if job.report is not None:  # a model in parts: the report is of the model they were split from
        job.measured = lineage.chain_from_report(job.report, job.made_from or artifact.sha256)[1]  # else exit 2
        schemas.check_measured(job.measured, f"--report {cfg.report}")
    job.notes[:0] = capacity_notes + ([] if given else [
        "no --tuned: default settings (1 CPU instance, batch 1, onnxruntime's own threads and optimisations); run "
        "`optkit tune` for measured ones"])
    job.shapes = {**(shapes or {}), **parse_shapes(cfg.shape or None)}
    target.prepare(job)
    return kinds, capacity


def _make(job: Job, target: Target, kinds: list[str], capacity) -> Result:
    """Under the model's lock: the version number chosen, the manifests, the version written and committed."""
    cfg, name, tag = job.config, job.name, job.tag
    out = Path(cfg.output)
    margin = mf.MARGIN if cfg.memory_margin is None else cfg.memory_margin  # bounded by PackageConfig
    with repo.writing(out, name, target.name, job.models) as index:
        number = repo.next_version(index, cfg.version, tag)
        docs = {}
        if kinds:
            uri, uri_notes = mf.base_uri(cfg.storage_uri, out)
            peak, peak_source = mf.peak_memory_mb(job.measured, job.tuned.figures)
            docs, man_notes = mf.build(kinds, target=target, name=name, version=number, tag=tag, base_uri=uri,
                                       peak_mb=peak, peak_source=peak_source, margin=margin,
                                       threads=job.tuned.get("threads"),
                                       gpu=(job.tuned.get("provider") or "cpu") != "cpu",
                                       local_dir=(out / name / str(number)).resolve(), capacity=capacity,
                                       capacity_path=cfg.capacity, ovms=target.serves_with(job))
            docs = {kind: mf.render(kind, doc) for kind, doc in docs.items()}
            job.notes.extend(man_notes + uri_notes)
        served_before, files = _write(out, number, index, target, job, docs)
        target.after_commit(job, out / name, number)
    return Result(target=target.name, repo=str(out), name=name, version=number, path=str(out / name / str(number)),
                  served_before=served_before, files=files, mapping=job.mapping, notes=job.notes, tag=tag)


def _capacity(path: str, artifact, made_from: str | None, notes: list[str], given=None):
    """CAPACITY.json (a file the user named: a link to it is read; `given`: its document already made, a recipe's
    capacity stage's) through its contract, for this model (or the model it was made from: a split's), else exit 2
    naming the file and the key."""
    p = Path(path)
    if given is None and not p.exists() and not p.is_symlink():
        raise UsageError(f"--capacity {path} does not exist; write it with `optkit capacity ... -o {p.name}`")
    cap = given if given is not None else base.load(p, capacity_contract.CapacityFile, capacity_contract.HINT,
                                                    links=True)[1]
    if cap.model_sha256 is None:  # the contract allows it for a served model only (bench --url: its URL)
        notes.append(f"--capacity {path}: its figures are of a served model ({cap.model}, bench --url), which has "
                     f"no file to check: not checked to be {artifact.path}")
    elif cap.model_sha256 != made_from:
        base.same_model(f"--capacity {path}", "model_sha256", cap.model_sha256, artifact.sha256,
                        str(artifact.path), capacity_contract.FIX)
    return cap


def _named(target: Target, key: str) -> str:
    """How an error names an option, shared or the target's: `key (--flag)`."""
    return key_and_flag(target.Config if key in target.Config.model_fields else PackageConfig, key)


def outputs(cfg: PackageConfig, name: str, key: Callable[[str], str]) -> list[Output]:
    """What packaging writes (core.atomic.check_outputs): the repository (only the model's folders), and what
    the target writes besides (Target.outputs); `key(option)` is what the user calls each."""
    out = [repo.output(key("output"), cfg.output, name)]
    try:
        target, opts = resolve(cfg)
    except UsageError:  # refused by check_options, in its own words (a recipe's paths are listed before that)
        return out
    return out + list(target.outputs(opts, key))


def resolve(cfg: PackageConfig, flag: str = "--to") -> tuple[Target, object]:
    """The target and its own options (its Config) from the keys given beside the shared ones; another target's
    option is refused naming the targets that take it (before anything is read or written)."""
    target = get_target(cfg.to, flag)
    return target, target_options(target, own_options(target, cfg.target_options))


def check_options(cfg: PackageConfig, flag: str = "--to") -> Target:
    """The target, once it took these options: resolve, then the target's own check (a recipe's package:
    entries before any stage runs)."""
    target, opts = resolve(cfg, flag)
    target.check(cfg, opts)
    return target


def _name_from(model: str) -> str:
    """A legal model name from the file's name: other characters become '_'."""
    stem = Path(model).stem
    name = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in stem).lstrip("._-")[:128]
    name = name or "model"
    return f"m{name}" if name.isdigit() else name


def _write(out: Path, number: int, index: dict | None, target: Target, job: Job,
           docs: dict[str, str]) -> tuple[int | None, dict[str, str]]:
    """Build the version aside, laid out as a repository (REPO/NAME/N, and N of each model the target writes
    beside it), and rename it into place under the lock: a new repository whole; else each model's new folder,
    or its version folder and then its model-level files, the other models first and NAME's index last.
    Returns (the version served before, the version's file hashes)."""
    name = job.name
    new_repo = not out.exists()
    staged = Path(tempfile.mkdtemp(prefix=repo.temp_prefix(out if new_repo else out / name),
                                   dir=out.parent if new_repo else out))
    try:
        normal_mode(staged)  # a server may run as another user
        vdir = staged / name / str(number)
        vdir.mkdir(parents=True)
        job.root = staged
        model_level = _target_wrote(target, job, vdir, number)
        levels = _others_wrote(target, job, staged, number)
        _write_report_and_manifests(vdir, job, docs)
        if job.models:  # the lineage lists each model's files too (serve-version checks them)
            job.split = {**(job.split or {}), "models": {m: lineage.file_hashes(staged / m / str(number))
                                                         for m in job.models}}
        files = lineage.file_hashes(vdir)
        (vdir / lineage.LINEAGE_FILE).write_text(lineage.text(job.lineage(number, files)), encoding="utf-8")
        index = index or repo.new_index(target.name, name)
        served_before = index.get("served")
        repo.add_version(index, number, job.tag, job.artifact.sha256, job.tuned.label)
        if job.models:
            index["parts"] = sorted({*index.get("parts", []), *job.models})
        levels[name] = {**model_level, repo.INDEX: repo.index_text(index)}
        _commit(out, staged, number, levels, new_repo)
    finally:
        remove(staged)
    return served_before, files


def _commit(out: Path, staged: Path, number: int, levels: dict[str, dict[str, str]], new_repo: bool) -> None:
    """Rename what was staged into place; `levels`: each model's model-level files, NAME (its index) last."""
    if new_repo:
        for model, files_at in levels.items():
            for f, text in files_at.items():
                (staged / model / f).write_text(text, encoding="utf-8")
        repo.commit(staged, out, {})
        return
    for model, files_at in levels.items():
        if not (out / model).exists():
            for f, text in files_at.items():
                (staged / model / f).write_text(text, encoding="utf-8")
            repo.commit(staged / model, out / model, {})
        else:
            repo.commit(staged / model / str(number), out / model / str(number),
                        {out / model / f: files_at[f] for f in sorted(files_at, key=lambda f: f == repo.INDEX)})


def _others_wrote(target: Target, job: Job, staged: Path, number: int) -> dict[str, dict[str, str]]:
    """The models the target wrote beside NAME: the ones it declared (Target.models), each version N only, of
    regular files, with model-level files of its model_files only. Returns those files by model."""
    wrote = sorted(p.name for p in staged.iterdir() if p.name != job.name)
    if wrote != sorted(job.models):
        raise PassError(f"package target {target.name!r} wrote model folders {wrote}, not the ones it declared "
                        f"({sorted(job.models)}) (nothing was written)")
    levels = {}
    for model in job.models:
        inside = sorted(p.name for p in (staged / model).iterdir())
        files_at = job.model_level.get(model) or {}
        if inside != [str(number)] or any(f not in target.model_files or not isinstance(t, str)
                                           for f, t in files_at.items()):
            raise PassError(f"package target {target.name!r} wrote {model} otherwise than as version {number} and "
                            "its model_files (nothing was written)")
        _only_files(target, staged / model)
        levels[model] = files_at
    return levels


def _only_files(target: Target, folder: Path) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_symlink() or not (p.is_dir() or p.is_file()):
            raise PassError(f"package target {target.name!r} wrote {p.relative_to(folder)}, a link or special file; "
                            "a version holds regular files only (nothing was written)")


def _target_wrote(target: Target, job: Job, vdir: Path, number: int) -> dict[str, str]:
    """write_version and validate, held to what a target may write: regular files and folders inside vdir (no
    link, FIFO or device), and model-level files it names in model_files only (never the index, never a path
    outside the model folder). Any failure of the target's own code is one PassError line (exit 3)."""
    try:
        model_level = target.write_version(job, vdir, number)
        if job.preprocessor is not None:
            carried.write(job.preprocessor, vdir)
        target.validate(job, vdir)
        if job.preprocessor is not None:
            carried.check(job.preprocessor, vdir)
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
    _only_files(target, vdir)
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
