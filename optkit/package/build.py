"""Make one package version: check every input and the repository first, build the version in a temporary
folder beside its destination, and rename it into place (nothing half-written, nothing replaced)."""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from optkit.core.atomic import normal_mode, remove
from optkit.core.errors import UsageError
from optkit.package import lineage, repo, schemas
from optkit.package.signature import read_signature, signature_of, warmup_dims
from optkit.package.tuned import defaults, load_tuned

TARGETS = ("triton", "mlflow")


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


def package(model: str, *, target: str, output: str, tuned_path: str | None = None, name: str | None = None,
            version: str = "auto", tag: str | None = None, report_path: str | None = None,
            data: str | None = None, shapes: dict | None = None, queue_delay_us: int | None = None,
            manifests: str | None = None, storage_uri: str | None = None, memory_margin: float | None = None,
            registry: str | None = None) -> Result:
    from optkit.core.artifact import Artifact, external_data_files
    from optkit.core.formats import Format

    if target not in TARGETS:
        raise UsageError(f"--to {target!r}: choose triton or mlflow")
    if target == "mlflow":
        from optkit.core.registry import require_extra

        require_extra("serve", "optkit package --to mlflow")
        from optkit.package import registry as reg

        if reg.uri(registry):  # before anything is written: a database of someone else's is refused (exit 2)
            reg.check(reg.uri(registry))
    elif registry:
        raise UsageError("--registry is for --to mlflow (a Triton repository serves by version_policy)")
    if not Path(model).exists():
        raise UsageError(f"model {model} does not exist")
    artifact = Artifact.load(model)
    if artifact.format != Format.ONNX:
        raise UsageError(f"{model} is {artifact.format.value}; package takes an ONNX model: convert it first "
                         f"(optkit convert {model} -o model.onnx)")
    if name is None:  # from the file name, made a legal model name; a --name given is checked as it is
        import re

        name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(model).stem).lstrip("._-")[:128] or "model"
        name = f"m{name}" if name.isdigit() else name
    name = repo.check_name(name)
    tag = repo.check_tag(tag)
    from optkit.package import manifests as mf

    kinds = mf.parse_kinds(manifests)
    if kinds and storage_uri:
        mf.check_storage_uri(storage_uri)
    margin = mf.MARGIN if memory_margin is None else memory_margin
    if not 0 <= margin <= 10:
        raise UsageError(f"--memory-margin {memory_margin}: give a fraction between 0 and 10 (0.5 = 50%)")
    out = Path(output)
    for other in (model, tuned_path, report_path, data):
        if other and Path(other).exists() and (out.resolve() == Path(other).resolve()
                                               or out.resolve() in Path(other).resolve().parents):
            raise UsageError(f"-o {output} is or holds an input of this command ({other}); choose another folder")
    repo.next_version(repo.check_repo(out, name, target), version, tag)  # refused early; chosen under the lock
    externals = external_data_files(model)
    sig = read_signature(model)
    tuned = load_tuned(tuned_path, artifact.sha256, model) if tuned_path else defaults()
    report = _load_report(report_path) if report_path else None
    measured = lineage.chain_from_report(report, artifact.sha256)[1] if report is not None else {}  # else exit 2
    if report is not None:
        schemas.check_measured(measured, f"--report {report_path}")
    notes = [] if tuned_path else ["no --tuned: default settings (1 CPU instance, batch 1, onnxruntime's own "
                                   "threads and optimisations); run `optkit tune` for measured ones"]

    lifted, warm = None, {}
    if target == "triton":
        from optkit.package import scalars

        if any(scalars.scalars(sig)):
            lifted, lift_notes = scalars.lift(model, sig)
            sig, notes = signature_of(lifted, model), notes + lift_notes
        cfg_probe = int(tuned.get("batch") or 1) if sig.batchable else 0
        warm, warm_notes = warmup_dims(sig, cfg_probe > 0, shapes or {}, data)
        notes = notes + warm_notes
    else:
        from optkit.package import mlflow as mlf

        opts, providers, mapping, mnotes = mlf.settings(tuned, sig.batchable)
        notes = notes + mnotes

    with repo.writing(out, name, target) as index:  # the version is chosen and written under the model's lock
        number = repo.next_version(index, version, tag)
        if target == "triton":
            from optkit.package import triton

            cfg = triton.build_config(name, sig, tuned, warm, number, queue_delay_us=triton.QUEUE_DELAY_US
                                      if queue_delay_us is None else queue_delay_us)
            parsed = triton.schema_check(cfg.text)
            mapping, notes = cfg.mapping, notes + cfg.notes
            notes.append("config.pbtxt parsed with Triton's ModelConfig (tritonclient)" if parsed is not None else
                         "config.pbtxt not checked against Triton's ModelConfig: pip install tritonclient to check "
                         "it")
        docs = {}
        if kinds:
            uri, uri_notes = mf.base_uri(storage_uri, out)
            peak, peak_source = mf.peak_memory_mb(measured, tuned.figures)
            docs, man_notes = mf.build(kinds, target=target, name=name, version=number, tag=tag, base_uri=uri,
                                       peak_mb=peak, peak_source=peak_source, margin=margin,
                                       threads=tuned.get("threads"), gpu=(tuned.get("provider") or "cpu") != "cpu",
                                       local_dir=(out / name / str(number)).resolve())
            docs = {kind: mf.render(kind, doc) for kind, doc in docs.items()}
            notes = notes + man_notes + uri_notes
        served_before, files_before = _write(
            out, name, number, index, target=target, model=model, lifted=lifted, externals=externals,
            cfg_text=cfg.text if target == "triton" else None, report=report, artifact=artifact, tuned=tuned,
            report_path=report_path, mapping=mapping, notes=notes, docs=docs, tag=tag,
            mlflow_args=(sig, opts, providers) if target == "mlflow" else None)
        _register(registry, target, out / name, name, number, tag, notes)
    return Result(target=target, repo=str(out), name=name, version=number, path=str(out / name / str(number)),
                  served_before=served_before, files=files_before, mapping=mapping, notes=notes, tag=tag)


def _write(out: Path, name: str, number: int, index: dict | None, *, target: str, model: str, lifted, externals,
           cfg_text: str | None, report, artifact, tuned, report_path, mapping, notes, docs, tag,
           mlflow_args) -> tuple[int | None, dict[str, str]]:
    """Build the version aside and rename it into place (under the lock). The highest level that does not
    exist yet is built whole in a temporary folder beside it. Returns (the version served before, file hashes)."""
    model_dir = out / name
    dest = out if not out.exists() else model_dir if not model_dir.exists() else model_dir / str(number)
    staged = Path(tempfile.mkdtemp(prefix=repo.temp_prefix(dest), dir=dest.parent))
    try:
        normal_mode(staged)  # a server may run as another user
        vdir = staged / name / str(number) if dest == out else staged / str(number) if dest == model_dir else staged
        vdir.mkdir(parents=True, exist_ok=True)
        if target == "triton":
            if lifted is not None:
                import onnx

                onnx.save(lifted, str(vdir / "model.onnx"))
            else:
                shutil.copyfile(model, vdir / "model.onnx")
            for location, f in externals:
                (vdir / location).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, vdir / location)
            (vdir / "config.pbtxt").write_text(cfg_text, encoding="utf-8")
        report_obj = report if report is not None else _size_report(artifact)
        if target == "mlflow":
            from optkit.package import mlflow as mlf

            sig, opts, providers = mlflow_args
            meta_lineage = lineage.build_lineage(
                artifact=artifact, target=target, name=name, version=number, tag=tag, tuned=tuned, report=report,
                report_path=report_path, files={}, mapping=mapping, notes=notes)
            mlf.write(vdir, model, bool(externals), sig, opts, providers, {"optkit": meta_lineage})
        (vdir / lineage.REPORT_FILE).write_text(report_obj.to_json(), encoding="utf-8")
        if docs:
            (vdir / "manifests").mkdir()
            for kind, text in docs.items():
                (vdir / "manifests" / f"{kind}.yaml").write_text(text, encoding="utf-8")
        files = lineage.file_hashes(vdir)
        lin = lineage.build_lineage(artifact=artifact, target=target, name=name, version=number, tag=tag,
                                    tuned=tuned, report=report, report_path=report_path, files=files,
                                    mapping=mapping, notes=notes)
        (vdir / lineage.LINEAGE_FILE).write_text(json.dumps(lin, indent=2, default=str) + "\n", encoding="utf-8")
        index = index or repo.new_index(target, name)
        served_before = index.get("served")
        repo.add_version(index, number, tag, artifact.sha256, tuned.label)
        replace = {}
        if dest == model_dir / str(number):
            replace = {model_dir / repo.INDEX: repo.index_text(index)}
            if target == "triton":
                replace[model_dir / "config.pbtxt"] = cfg_text
        else:
            top = vdir.parent
            (top / repo.INDEX).write_text(repo.index_text(index), encoding="utf-8")
            if target == "triton":
                (top / "config.pbtxt").write_text(cfg_text, encoding="utf-8")
        repo.commit(staged, dest, replace)
    finally:
        remove(staged)
    return served_before, files


def _register(registry: str | None, target: str, model_dir: Path, name: str, number: int, tag: str | None,
              notes: list[str]) -> None:
    """MLflow: register the new version where a registry is configured (under the lock: the index changes)."""
    from optkit.package import registry as reg

    where = reg.uri(registry) if target == "mlflow" else None
    if not where:
        return
    number_in_registry = reg.register(where, name, model_dir / str(number), number, tag)
    index = repo.load_index(model_dir)
    for v in index["versions"]:
        if v["version"] == number:
            v["registry"] = {"uri": reg.shown(where), "version": number_in_registry, "alias": reg.ALIAS}
    repo.commit_index(model_dir, index)
    notes.append(f"registered in {reg.shown(where)} as {name} version {number_in_registry}, alias {reg.ALIAS} "
                 f"(models:/{name}@{reg.ALIAS})")


def _load_report(path: str):
    from optkit.report.schema import Report

    return Report.load(path)


def _size_report(artifact):
    """The package's own one-stage report when no --report was given: the model and its size."""
    from optkit.measure.size import measure_size
    from optkit.report.schema import ArtifactRef, Report, Stage

    ref = ArtifactRef(path=str(artifact.path), format=artifact.format.value, sha256=artifact.sha256)
    return Report(command="optkit package", stages=[Stage(name="package", output=ref,
                                                          measurements={"size": measure_size(artifact)})])
