"""Validation before any work: everything a recipe says that can be checked before a stage runs (files exist,
passes and stage kinds exist and are installed, their configs, each stage accepts what the stage before gives,
every gate is on a figure the recipe measures), each error one line naming the recipe's line and key."""
from __future__ import annotations

from pathlib import Path

from optkit.core.atomic import declared_paths
from optkit.core.errors import DependencyError, UsageError
from optkit.core.formats import detect_format
from optkit.core.registry import ConfigError, build_config, check_accepts
from optkit.measure.model import check_sharing
from optkit.passes import get_pass
from optkit.pipeline.gates import check_gates_plan, parse_gates
from optkit.pipeline.recipe import LoadedRecipe, StageSpec


def check_passes(loaded: LoadedRecipe, allow_missing: bool = False) -> list:
    """Resolve each stage's pass and config; check the chain of formats. Returns [(cls, config), ...]."""
    formats = {"input": _model_format(loaded)}
    fmt = formats["input"]
    out = []
    names = loaded.stage_names()
    for i, st in enumerate(loaded.stages):
        prev = "the model" if i == 0 else f"stage {names[i - 1]!r}"
        if st.from_ is not None:
            if st.from_ not in formats:
                raise UsageError(f"{loaded.where(('stages', i, 'from'))}: no earlier stage named {st.from_!r}; "
                                 f"choose one of {', '.join(formats)}")
            fmt = formats[st.from_]
            prev = "the model" if st.from_ == "input" else f"stage {st.from_!r}"
        cls, cfg = _stage_config(loaded, i, st)
        loc = loaded.stage_loc(i, "pass")
        if fmt is None and not cls.runs_without_model(cfg):
            raise UsageError(f"{loaded.where(loc)}: {cls.name} needs a model, and the recipe has none (model: path)")
        if fmt is not None:
            try:
                check_accepts(cls, fmt)
            except UsageError:
                raise UsageError(f"{loaded.where(loc)}: {cls.name} accepts {', '.join(f.value for f in cls.accepts)}, "
                                 f"but {prev} gives {fmt.value}") from None
        missing = cls.missing()
        if missing and not allow_missing:
            raise DependencyError(f"{loaded.where(loc)}: pass {cls.name} is unavailable here: {missing}")
        out.append((cls, cfg))
        fmt = fmt if cls.passes_through else cls.produces
        formats[names[i]] = fmt
    for i, fmt in enumerate(formats.values()):  # measured under load: refused now, not after the stages before
        if fmt is None:
            continue
        try:
            check_sharing(fmt, loaded.recipe.measure)
        except UsageError as e:
            where = "the model" if i == 0 else f"stage {names[i - 1]!r}"
            raise UsageError(f"{loaded.where(('measure', 'sessions'))}: {where} gives {fmt.value}: {e.message}") \
                from None
    return out


def _model_format(loaded: LoadedRecipe):
    """The model's format (None: the recipe has no model, which only stages that need none may run on)."""
    r = loaded.recipe
    if r.model is None:
        if r.data.calibration or r.data.eval or r.data.train or r.package or r.gates or r.baseline:
            raise UsageError(f"{loaded.where(('model',))}: missing; data, gates, a baseline and package: entries "
                             "need a model (model: path)")
        return None
    try:
        fmt = detect_format(loaded.model_path)
    except UsageError as e:
        raise UsageError(f"{loaded.where(('model', 'path'))}: {e.message}") from None
    if r.model.weights and not Path(loaded.resolve(r.model.weights)).is_file():
        raise UsageError(f"{loaded.where(('model', 'weights'))}: weights file {r.model.weights} not found")
    return fmt


def _stage_config(loaded: LoadedRecipe, i: int, st: StageSpec):
    """(the pass or stage kind, its built Config): a stage kind's files resolved relative to the recipe, those it
    reads there (exit 2 naming the key), and its own checks (pipeline/kinds.py)."""
    try:
        cls = get_pass(st.pass_name)
    except UsageError as e:
        raise UsageError(f"{loaded.where(loaded.stage_loc(i, 'pass'))}: {e.message}") from None
    try:
        cfg = build_config(cls, st.config, unknown="unknown key")
        if cls.recipe_paths:
            cfg = _recipe_paths(loaded, i, cfg, st.config)
            cls.check(cfg)
    except ConfigError as e:
        raise UsageError(f"{loaded.where((*loaded.config_loc(i), *e.loc))}: {e.detail} (pass {cls.name})") from None
    return cls, cfg


def _recipe_paths(loaded: LoadedRecipe, i: int, cfg, given: dict):
    """The Config with each file it names resolved relative to the recipe; a file it reads must be there."""
    inputs, outputs = declared_paths(cfg, lambda key: key)
    resolved = {f.key: loaded.resolve(str(f.path)) for f in (*inputs, *outputs)}
    for f in inputs:
        if not Path(resolved[f.key]).exists():
            raise ConfigError("recipe", (f.key,), f"{given.get(f.key, f.path)} does not exist (paths are relative to "
                                                 "the recipe file)")
    return cfg.model_copy(update=resolved)


def check_files(loaded: LoadedRecipe) -> None:
    r = loaded.recipe
    for key in ("calibration", "eval", "train"):
        item = getattr(r.data, key)
        if item is None:
            continue
        if not Path(loaded.resolve(item.path)).exists():
            raise UsageError(f"{loaded.where(('data', key, 'path'))}: data {item.path} not found "
                             f"(paths are relative to the recipe file)")
        if item.labels and not Path(loaded.resolve(item.labels)).exists():
            raise UsageError(f"{loaded.where(('data', key, 'labels'))}: labels {item.labels} not found")
    if r.baseline and not Path(loaded.resolve(r.baseline)).is_file():
        raise UsageError(f"{loaded.where(('baseline',))}: baseline report {r.baseline} not found")


def validate(loaded: LoadedRecipe, *, baseline: str | None = None, allow_missing: bool = False) -> list:
    """Everything that can be checked before work starts; returns the resolved passes.

    With allow_missing (dry runs), a pass whose extra is not installed here is not an error.
    """

    if not loaded.stages:
        raise UsageError(f"{loaded.where(('stages',))}: the recipe has no stages")
    resolved = check_passes(loaded, allow_missing=allow_missing)
    check_files(loaded)
    names = loaded.stage_names()
    gates = []
    for i, g in enumerate(loaded.recipe.gates):
        try:
            gates.append(parse_gates([g])[0])
        except UsageError as e:
            raise UsageError(f"{loaded.where(('gates', i))}: {e.message}") from None
    measured = measured_figures(loaded)
    for i, g in enumerate(gates):
        try:
            check_gates_plan([g], stages=["input", *names], measured=measured,
                             has_baseline=bool(baseline or loaded.recipe.baseline))
        except UsageError as e:
            raise UsageError(f"{loaded.where(('gates', i))}: {e.message}") from None
    return resolved


def measured_figures(loaded: LoadedRecipe) -> set[str]:
    r = loaded.recipe
    figures = {"size", "memory"}
    if r.measure.latency or r.measure.concurrency:
        figures.add("throughput")
    if r.measure.latency:
        figures.add("latency")
        if r.measure.normalize and r.measure.latency is True:
            figures.add("normalized")
    if r.data.eval is not None and r.data.eval.metric:
        figures.add("accuracy")
    figures.add("fidelity")
    return figures
