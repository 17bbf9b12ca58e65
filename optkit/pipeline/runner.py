"""Running a recipe: every stage validated first, then run (cached, resumable), measured, gated, reported."""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optkit.core import phases
from optkit.core.artifact import Artifact
from optkit.core.atomic import declared_paths
from optkit.core.errors import UsageError
from optkit.core.formats import Format, detect_format
from optkit.core.registry import PassContext, build_config
from optkit.core.text import redact_config
from optkit.measure.model import DataSpec, MeasureSettings, measure
from optkit.measure.paired import change_against
from optkit.measure.serving import Setting
from optkit.measure.text import is_text_data, text_tokenizer
from optkit.measure.trials import latency_trials
from optkit.onnx.session import OrtSettings
from optkit.package.recipe import check_specs, package_run
from optkit.pipeline.gates import evaluate, gates_of_recipe
from optkit.pipeline.stage import StageResult, run_pass
from optkit.pipeline.steps import guard
from optkit.pipeline.validation import validate
from optkit.pipeline.workspace import Progress, Workspace
from optkit.report.build import input_stage, pass_stage
from optkit.report.schema import Report
from optkit.runtimes.base import takes

log = logging.getLogger(__name__)

EXTENSIONS = {"onnx": "model.onnx", "tflite": "model.tflite", "keras": "model.keras", "tf-savedmodel": "model_savedmodel",
              "torchscript": "model.pt", "torch-export": "model.pt2", "trt-engine": "model.engine", "openvino-ir": "model.xml"}


NO_DATA: dict[str, Any] = {"datasets": {}, "specs": {}}  # a model that takes other inputs than the recipe's data


def stage_output_name(fmt) -> str:
    return EXTENSIONS.get(getattr(fmt, "value", str(fmt)), "model")


@dataclass
class RunOptions:
    workspace: Path = Path("runs")
    use_cache: bool = True
    resume: bool = True
    baseline: str | None = None
    command: str = ""
    progress: Any = None
    aside: Path | None = None   # where a result refused by a budget is kept (a command's: beside its -o)
    input_last: bool = False    # measure the input after the stages (a distributed job's chief: its workers wait)
    outputs: list = field(default_factory=list)  # core.atomic.Output: what the caller writes (a command's -o)


@dataclass
class RunOutcome:
    report: Any            # optkit.report.schema.Report
    run_dir: Path
    gate_results: list = field(default_factory=list)
    packages: list = field(default_factory=list)   # optkit.package.build.Result, one per `package:` entry
    package_note: str | None = None

    @property
    def failed_gates(self) -> list:
        return [g for g in self.gate_results if not g.passed]


def plan(loaded, baseline: str | None = None) -> list[dict[str, Any]]:
    """Validate a recipe (nothing runs) and return its plan: one row per stage."""

    resolved = validate(loaded, baseline=baseline, allow_missing=True)
    guard(loaded, resolved, baseline=baseline)
    if loaded.recipe.package:
        check_specs(loaded)
    fmt = detect_format(loaded.model_path).value if loaded.recipe.model is not None else None
    rows = [] if fmt is None else [{"stage": "00-input", "pass": "-", "from": "-", "accepts": "-", "format": fmt,
                                    "config": {}, "available": True, "missing": None}]
    formats = {"input": fmt}
    names = loaded.stage_names()
    for i, ((cls, cfg), name) in enumerate(zip(resolved, names), start=1):
        spec = loaded.stages[i - 1]
        fmt = formats[spec.from_] if spec.from_ is not None else fmt
        fmt = fmt if cls.passes_through else cls.produces.value
        formats[name] = fmt
        rows.append({"stage": f"{i:02d}-{name}", "pass": cls.name,
                     "from": spec.from_ or (names[i - 2] if i > 1 else "input"),
                     "accepts": "any" if set(cls.accepts) == set(Format) else ", ".join(f.value for f in cls.accepts),
                     "format": fmt or "-",
                     "config": cfg.model_dump(mode="json", exclude_defaults=True),
                     "available": cls.missing() is None, "missing": cls.missing()})
    return rows


@dataclass
class _Run:
    """One run, phase to phase: what was checked before any stage, then the stages as they complete."""
    loaded: Any
    opts: RunOptions
    resolved: list
    data: dict
    source: Artifact | None    # None: a recipe without a model (its stages need none)
    progress: Any
    baseline: Any = None
    ws: Any = None
    run: Any = None
    stages: list = field(default_factory=list)
    input_latency: dict | None = None
    fields: dict = field(default_factory=dict)     # the report's fields stages filled (capacity.plan's section)

    @property
    def measures(self) -> bool:
        """Whether any stage is measured (else the input is not either: split and capacity alone time nothing)."""
        return any(cls.measured for cls, _ in self.resolved)


def execute(loaded, opts: RunOptions | None = None) -> RunOutcome:
    """Run a recipe: validate everything first, then each stage (cached, resumable), measure, gate, report; then
    package what the gates let through."""
    opts = opts or RunOptions()
    phases.lap("start-up")
    st = _prepare(loaded, opts)
    _preload()
    phases.lap("checks and data")
    st.ws = Workspace(Path(opts.workspace), loaded.name)
    st.run = st.ws.open_run(loaded, resume=opts.resume)
    try:
        report = _run_stages(st)
        st.run.finish(report)
    except BaseException as e:
        st.run.abort("interrupted" if isinstance(e, KeyboardInterrupt) else "failed")  # SIGTERM's Terminated too
        with contextlib.suppress(Exception):
            getattr(st.progress, "abort", lambda: None)()
        raise
    finally:
        st.run.release()
    st.progress.end_run(st.run)
    outcome = RunOutcome(report=report, run_dir=st.run.path, gate_results=list(report.gates))
    if loaded.recipe.package and outcome.failed_gates:
        outcome.package_note = "not packaged: a gate failed"
    elif loaded.recipe.package:
        outcome.packages = package_run(loaded, report, st.run.path)
    return outcome


def _prepare(loaded, opts: RunOptions) -> _Run:
    """Everything checked before any stage (exit 2 now, nothing written): the recipe, every step's outputs against
    every input, the package entries, the baseline, the data, the model."""
    r = loaded.recipe
    resolved = validate(loaded, baseline=opts.baseline)
    guard(loaded, resolved, baseline=opts.baseline, outputs=opts.outputs,  # outputs are never inputs: exit 2 now
          workspace=opts.workspace)
    if r.package:
        check_specs(loaded)  # a repository optkit may not write into fails the run before any stage
    baseline_path = opts.baseline or loaded.resolve(r.baseline)
    source = None
    if r.model is not None:
        meta = {}
        if r.measure.shapes and detect_format(loaded.model_path) == Format.TORCH_MODULE:  # no declared shapes
            meta["input_shapes"] = dict(r.measure.shapes)  # "" (unnamed): the single input
        source = Artifact.load(loaded.model_path, weights=loaded.resolve(r.model.weights),
                               signature=r.model.signature, **meta)
    return _Run(loaded=loaded, opts=opts, resolved=resolved, data=_load_data(loaded), source=source,
                progress=opts.progress or Progress(quiet=True),
                baseline=Report.load(baseline_path) if baseline_path else None)


def _run_stages(st: _Run) -> Report:
    """The input (measured as the stages need), each stage in order, the report with its gates."""
    loaded, r, opts = st.loaded, st.loaded.recipe, st.opts
    st.progress.start_run(st.run, len(st.resolved) + 1)  # the stages and the input (stage 0)
    if st.source is not None and not opts.input_last:
        st.stages.append(_input(st))
    current, before = st.source, "input"
    outputs = {"input": st.source}
    takes = {"input": True}  # whether a model still takes the recipe's inputs (preprocess.onnx changes them)
    for i, ((cls, cfg), name) in enumerate(zip(st.resolved, loaded.stage_names()), start=1):
        spec = loaded.stages[i - 1]
        if spec.from_ is not None:
            current = outputs[spec.from_]
        stage, out = _stage(st, i, name, cls, cfg, current, takes[spec.from_ or before])
        st.stages.append(stage)
        current = outputs[name] = out if st.source is not None else None
        takes[name], before = takes[spec.from_ or before] and cls.keeps_inputs, name
    if st.source is not None and opts.input_last:
        st.stages.insert(0, _input(st))
    if st.source is not None and st.measures and r.measure.latency == "paired" \
            and "latency" not in st.stages[0].measurements:
        st.stages[0].measurements["latency"] = st.input_latency or measure(
            st.source, _settings_for(loaded, st.source), data=st.data["specs"].get("eval"))["latency"]
    report = Report(command=opts.command or f"optkit run {loaded.path or ''}".strip(), recipe=loaded.raw,
                    stages=st.stages, run=st.run.info(), **st.fields)
    gates = gates_of_recipe(loaded)
    if gates:
        report.gates = evaluate(report, gates, st.baseline)
    return report


def _stage(st: _Run, i: int, name: str, cls, cfg, current, takes_inputs: bool = True):
    """One stage: resumed when this run completed it earlier, else computed (from the cache where it may be) and
    measured, unless its kind passes its model through unmeasured. `takes_inputs`: its input model still takes the
    recipe's inputs (else neither it nor its result gets the recipe's data, nor is compared with the recipe's model).
    Returns (its report entry, its model)."""
    data = st.data if takes_inputs else NO_DATA
    ws, run, progress, r = st.ws, st.run, st.progress, st.loaded.recipe
    config = cfg.model_dump(mode="json")
    if cls.cached:
        done, art = run.completed_stage(i, name, expect_input=current.sha256)
        if done is not None:
            progress.stage_done(i, name, resumed=True)
            done.notes.append("resumed: completed earlier in this run")
            return done, art
    progress.stage_start(i, name, cls.name)
    key = ws.cache_key(current, cls.name, config, st.data, r.measure, files=declared_paths(cfg, str)[0]) \
        if cls.cached and st.opts.use_cache else None
    with run.building(i, name) as tmp:
        final_dir = run.stage_dir(i, name)
        with ws.cache_lock(key) if key else contextlib.nullcontext():
            # a result refused by a budget is kept in the run folder, which outlives the failed stage
            aside = st.opts.aside or run.path / f"{final_dir.name}.REJECTED.onnx"
            given = config if cls.recipe_paths else st.loaded.stages[i - 1].config  # its files resolved, or as given
            timing = _timing(st, current) if cls.measured and takes_inputs and cls.keeps_inputs else None
            result = _compute_stage(st, key, tmp, name, cls, current, given, aside, data, timing)
            phases.lap(f"{name} pass")
        out = result.output = _relocate(result.output, tmp, final_dir)
        if cls.measured:
            keeps = takes_inputs and cls.keeps_inputs  # else the result takes other inputs: measured on its own
            stage, before = _measure_stage(st.loaded, _relocate(out, final_dir, tmp), result,
                                           data if keeps else NO_DATA, progress, name=name,
                                           reference=st.source if keeps else None)
            st.input_latency = st.input_latency or before
            phases.lap(f"{name} measured")
        else:
            stage = pass_stage(result, {})
        stage.output.path = str(out.path)
        st.fields.update(result.ctx.report_fields)
        run.write_stage(tmp, stage)
    progress.stage_done(i, name, cached=result.cached, seconds=result.duration_s)
    return stage, out


def _input(st: _Run):
    """Stage 0: the input model, measured as it is (or as measured earlier in this run); nothing measured when no
    stage is (split and capacity alone time nothing)."""
    run, progress, source = st.run, st.progress, st.source
    stage0, _ = run.completed_stage(0, "input", expect_input=None, expect_output=source.sha256)
    if stage0 is not None:
        progress.stage_done(0, "input", resumed=True)
        return stage0
    progress.stage_start(0, "input", "-")
    with run.building(0, "input") as tmp:
        if st.measures:
            stage0, _ = _measure_stage(st.loaded, source, None, st.data, progress, name="input")
        else:
            stage0 = input_stage(source, {})
        run.write_stage(tmp, stage0)
    phases.lap("input measured")
    progress.stage_done(0, "input")
    return stage0


def _timing(st: _Run, parent):
    """How the stage's result will be timed against `parent` (settings, eval data), when that is the comparison a
    pass's search makes anyway (quantize's race: the CPU at batch 1 on one thread) and `parent` is the model the
    stage is compared with (the run's input): the pass's paired timing of its result, made so, is the stage's figure
    (PassContext.timing). None otherwise: the stage is timed once, after the pass. One thread only: sessions of
    several threads each, interleaved in a race of five models, spin against each other on a busy machine."""
    r = st.loaded.recipe
    if not r.measure.latency or st.source is None or parent.sha256 != st.source.sha256:
        return None
    settings = _settings_for(st.loaded, parent)
    same = settings.provider == "cpu" and settings.threads == 1 and settings.batch == 1
    return (settings, st.data["specs"].get("eval")) if same else None


def _compute_stage(st: _Run, key: str | None, tmp: Path, name: str, cls, current, config: dict,
                   aside: Path, data: dict, timing=None) -> StageResult:
    """A stage's pass output in `tmp`: from the cache when a verified entry exists (`key`: None when the stage is
    not cached), else computed (and stored)."""
    ws, r = st.ws, st.loaded.recipe
    cache_notes: list[str] = []
    hit = ws.cache_get(key, tmp, cache_notes) if key else None
    log.info("stage %s: cache %s", name, ("hit" if hit else "miss") + f" (key {key[:12]})" if key else "off")
    if hit is not None:
        result = StageResult(name=name, pass_name=cls.name, input=current, output=hit["artifact"],
                             config=redact_config(build_config(cls, config).model_dump(mode="json")),
                             duration_s=hit["duration_s"],
                             ctx=PassContext(output=tmp / stage_output_name(cls.produces),
                                             notes=list(hit["notes"]), warnings=list(hit["warnings"]),
                                             brief=_cached_brief(hit),
                                             measurements=dict(hit["measurements"])),
                             cached=True)
        result.ctx.note(f"reused from the cache (key {key[:12]}, computed {hit['created']})")
        return result
    st.progress.step(f"running {cls.name}" + _long_hint(cls.name))
    result = run_pass(current, cls.name, config, tmp / stage_output_name(cls.produces),
                      shapes=r.measure.shapes, values=r.measure.values, seed=r.measure.seed,
                      data=data["datasets"], aside=aside, earlier=list(st.stages), timing=timing)
    result.name = name
    if key:
        ws.cache_put(key, tmp, result)
    result.ctx.notes.extend(cache_notes)  # after storing: the note is about this run only
    return result


def _cached_brief(hit: dict) -> list[str]:
    """The cached stage's brief note: one of its notes (an entry written before briefs were kept has none)."""
    brief = hit.get("brief")
    return [n for n in brief if n in hit["notes"]][:1] if isinstance(brief, list) else []


def _preload() -> None:
    """Import onnx and onnxruntime once here, so each forked measurement child does not pay for it."""
    import importlib
    import sys

    if any(m in sys.modules for m in ("torch", "tensorflow")):
        return  # measurements will spawn, not fork: nothing to gain
    for mod in ("onnx", "onnxruntime", "optkit.measure.size", "optkit.measure.accuracy", "optkit.measure.fidelity",
                "optkit.measure.inputs", "optkit.measure.latency", "optkit.runtimes.onnx"):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass


def _long_hint(pass_name: str) -> str:
    if "static" in pass_name or "int4" in pass_name:
        return " (calibration)"
    if pass_name.startswith(("prune.", "qat.")):
        return " (fine-tuning)"
    if pass_name.startswith("tensorrt."):
        return " (building the engine)"
    return ""


def _relocate(art, src_dir: Path, dst_dir: Path):
    """The same artifact with its path moved from src_dir to dst_dir (when it lies inside src_dir)."""
    import dataclasses

    try:
        rel = Path(art.path).resolve().relative_to(Path(src_dir).resolve())
    except ValueError:
        return art
    return dataclasses.replace(art, path=str(Path(dst_dir) / rel))


def _load_data(loaded) -> dict[str, Any]:
    """Datasets for the passes (loaded before any work, so a bad file fails early) and DataSpecs to measure."""

    r = loaded.recipe
    datasets, specs = {}, {}
    for key in ("calibration", "eval", "train"):
        item = getattr(r.data, key)
        if item is None:
            continue
        path, labels = loaded.resolve(item.path), loaded.resolve(item.labels)
        pre = item.preprocess.model_dump() if item.preprocess else None
        spec = DataSpec(path=path, labels=labels, preprocess=pre, max_samples=item.max_samples, columns=item.columns,
                        truncation=item.truncation)
        try:
            if is_text_data(Path(path)):  # every stage's figures come from the same rows, tokenized once the same way
                spec.tokenizer = str(text_tokenizer(loaded.model_path, path))
            ds = spec.load(loaded.model_path, item.metric if key == "eval" else None).subset(
                item.max_samples, r.measure.seed)
        except UsageError as e:
            raise UsageError(f"{loaded.where(('data', key, 'path'))}: {e.message}") from None
        if key == "eval" and ds.labels is None and item.metric in ("top1", "top5"):
            raise UsageError(f"{loaded.where(('data', key, 'path'))}: {item.path} has no labels for metric "
                             f"{item.metric}")
        datasets[key] = ds
        specs[key] = spec
    return {"datasets": datasets, "specs": specs}


def measure_settings(section):
    return MeasureSettings(runtime=section.runtime, provider=section.provider, threads=section.threads, batch=section.batch,
                           warmup=section.warmup, runs=section.runs, shapes=section.shapes, values=section.values,
                           check_outputs=section.check_outputs, seed=section.seed, session=section.session,
                           concurrency=section.concurrency, sessions=section.sessions)


def _settings_for(loaded, art):
    """The recipe's measurement settings, as they apply to this artifact's format."""
    settings = measure_settings(loaded.recipe.measure)
    if not takes(art.format, settings.runtime):  # the recipe's runtime serves the stages of the formats it reads
        settings = settings.model_copy(update={"runtime": None})
    if art.format not in (Format.ONNX, Format.TRT_ENGINE):  # onnxruntime's options apply to ONNX stages
        settings = settings.model_copy(update={"provider": "cpu", "session": OrtSettings()})
    elif art.format == Format.TRT_ENGINE:
        settings = settings.model_copy(update={"session": OrtSettings()})
    return settings


def _timed_by_the_pass(result, reference) -> dict | None:
    """The pass's paired timing of its result against `reference`, made as the run times a stage (PassContext.timing):
    one timing per figure. None for a cached result (timed now) or one timed otherwise."""
    timed = result.ctx.timed
    if result.cached or not timed or timed.get("parent") != reference.sha256:
        return None
    log.info("stage %s: latency against the input from the pass's own paired timing (%s trials), not timed again",
             result.name, timed["latency_change"]["trials"])
    return timed


def _measure_stage(loaded, art, result, data, progress, *, name: str, reference=None):
    """The stage's report entry, and (measure.latency: paired) the input's latency from its paired timing."""
    r = loaded.recipe
    ignored = None
    if r.measure.session != OrtSettings() and art.format != Format.ONNX:
        ignored = f"measure.session (onnxruntime's options) does not apply to {art.format.value}: not used here"
    settings = _settings_for(loaded, art)
    tuned = result.ctx.measurements.get("tune") if result is not None else None
    if tuned:  # a tune stage is measured (and gated) served the way it chose
        settings = Setting(**tuned["best"]["setting"]).settings(settings)
    ev = data["specs"].get("eval")
    metric = r.data.eval.metric if ev is not None else None
    progress.step("measuring size" + (f", {metric}" if metric else "") + (", fidelity" if reference else ""))
    change, before = None, None
    figures = measure(art, settings, latency=False, data=ev, metric=metric, reference=reference)
    if r.measure.latency is True:
        progress.step(f"benchmarking latency: {r.measure.trials} trials x {r.measure.runs} runs"
                      + (" + reference workload" if r.measure.normalize else ""))
        figures["latency"] = latency_trials(art, settings, trials=r.measure.trials, normalize=r.measure.normalize,
                                            data=ev)
    # a result that takes other inputs (reference None) is not timed: no figure would compare with the input's
    if r.measure.latency and result is not None and reference is not None:
        change = _timed_by_the_pass(result, reference)
        if change is None:
            progress.step("timing against the input, call by call")
            change = change_against(reference, art, settings, data=ev)
        if change is not None:  # the speedup against the input: timed call by call, as commands do
            figures["latency_change"] = change["latency_change"]
            before = change["before"]
            if r.measure.latency == "paired":
                figures["latency"] = change["after"]
        elif r.measure.latency == "paired":  # the two cannot run in one process: each timed on its own
            figures["latency"] = measure(art, settings, data=ev)["latency"]
    if result is None:
        stage = input_stage(art, figures, name=name)
    else:
        stage = pass_stage(result, figures)
    if change is not None:
        # the one latency figure of the stage: a pass's own timing (quantize's search race) is labelled as such
        stage.notes.append(change["note"] + " (against the input, timed call by call: the figure the tables use)")
        stage.brief = [*stage.brief[:1], change["note"]]  # the same figure, said short
    if ignored:
        stage.notes.append(ignored)
    other = _other_runtime(stage, figures)
    if other:
        stage.warnings.append(other)
    return stage, before


def _other_runtime(stage, figures: dict) -> str | None:
    """A file made for one runtime (quantize's `runtime`) measured slower than its input on another says so."""
    made_for = (stage.config or {}).get("runtime")
    ran_on = (figures.get("runtime") or {}).get("name")
    change = figures.get("latency_change") or {}
    if not made_for or not ran_on or made_for == ran_on or not change.get("significant") \
            or change.get("ratio", 0) <= 1:
        return None
    return (f"this file was made for {made_for} and is {change['ratio']:.2f}x slower than its input on {ran_on}, "
            f"where it was measured: serve it on {made_for} (measure.runtime / --runtime {made_for})")
