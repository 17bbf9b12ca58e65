"""Recipes: one YAML file describes a whole optimization (model, data, stages, measurement, gates).

Loading is strict: a typo or a wrong type is a one-line error that names the file, the YAML line and the
key (`recipes/x.yaml:12: stages[1].config.bits: unknown option`). `validation.validate` then checks everything that
can be checked before any work starts: files exist, passes exist and are installed, pass configs, that
each stage accepts the previous stage's format, and that every gate is on a figure the recipe measures.
Paths in a recipe are relative to the recipe file.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic import ValidationError as PydanticValidationError

from optkit.capacity.config import CapacityConfig
from optkit.core import hub, strictjson
from optkit.core.errors import UsageError
from optkit.core.formats import split_factory
from optkit.core.registry import config_message
from optkit.core.shapes import MAX_DIM, MAX_ELEMENTS
from optkit.measure.datasets import Preprocess
from optkit.measure.model import MeasureSettings
from optkit.onnx.session import OrtSettings
from optkit.package.config import PackageConfig
from optkit.pipeline.kinds import CAPACITY
from optkit.pipeline.yamlsafe import yaml_with_lines

RECIPE_VERSION = 1
MAX_RECIPE_BYTES = 1 << 20     # a recipe is a page of YAML; anything this big is a mistake or an attack
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


def _folder_name(v: str | None, what: str) -> str | None:
    """A recipe or stage name becomes a folder name: keep it to one plain path component."""
    if v is not None and not _NAME.fullmatch(v):
        raise ValueError(f"{what} {v!r} must be 1-100 of A-Z a-z 0-9 . _ - and not start with '.' "
                         "(it names a folder in the workspace)")
    return v


def _max_threads() -> int:
    return max(64, 4 * (os.cpu_count() or 1))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    path: str = Field(description="Model file, SavedModel folder, or file.py:make_model factory.")
    weights: str | None = Field(default=None, description="State dict for a factory (weights_only=True).")
    signature: str | None = Field(default=None, description="SavedModel signature.")


class DataItem(_Strict):
    path: str
    labels: str | None = None
    preprocess: Preprocess | None = None
    max_samples: int | None = Field(default=None, ge=1)
    columns: str | None = Field(default=None, description="Text data: which column plays which role, "
                                "e.g. text=5,text_pair=6,label=4 (positions from 0, or header names).")
    truncation: bool = Field(default=True, description="Text data: rows over the model's limit are truncated "
                             "and counted; false: such a row is an error.")


class EvalData(DataItem):
    metric: str | None = Field(default="top1", description="top1 (accuracy), top5, f1, spearman, pearson, "
                               "exact_match, mse, mae, cosine or module:function; null: no metric (the data feeds "
                               "fidelity and timing)")


class DataSection(_Strict):
    calibration: DataItem | None = None
    eval: EvalData | None = None
    train: DataItem | None = None


class StageSpec(_Strict):
    pass_name: str = Field(alias="pass")
    name: str | None = None
    from_: str | None = Field(default=None, alias="from", description="Input: `input` or an earlier stage's "
                              "name (default: the previous stage). Lets one recipe try variants side by side.")
    config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v == "input":
            raise ValueError("'input' names the recipe's model (`from: input`); give the stage another name")
        return _folder_name(v, "stage name")


class MeasureSection(_Strict):
    runtime: Literal["onnxruntime", "openvino"] | None = Field(
        default=None, description="The runtime of ONNX stages: onnxruntime (default) or openvino (an OpenVINO IR "
                                  "stage runs on openvino whatever this says).")
    provider: str = "cpu"
    threads: int | None = Field(default=1, ge=1, le=_max_threads())
    batch: int = Field(default=1, ge=1, le=65536)
    warmup: int = Field(default=10, ge=0, le=100_000)
    runs: int = Field(default=50, ge=1, le=1_000_000, description="Timed runs per trial.")
    trials: int = Field(default=5, ge=1, le=100, description="Latency trials (noise and confidence interval).")
    latency: bool | Literal["paired"] = Field(
        default=True, description="true: each stage timed on its own (trials x runs), and against the input call "
                                  "by call; paired: only the call-by-call timing against the input, each model's "
                                  "latency its half of it (what single-stage commands do); false: no timing.")
    normalize: bool = Field(default=True, description="Also time a fixed reference workload in the same run.")
    shapes: dict[str, list[int]] = Field(default_factory=dict)
    values: dict[str, float] = Field(default_factory=dict, description="What scalar inputs are fed without data "
                                                                       "(e.g. sr: 16000).")
    check_outputs: list[str] = Field(default_factory=list, description="The outputs fidelity judges (default: all).")
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Seeds data subsets, inputs and calibration.")
    concurrency: int | None = Field(default=None, ge=1, le=256, description="Also time this many requests in "
                                                                           "flight (throughput under load).")
    sessions: Literal["shared", "per-thread"] = Field(default="shared", description="Under concurrency: one "
                                                                                     "session, or one per thread.")
    session: OrtSettings = Field(default_factory=OrtSettings, description="onnxruntime session options (ONNX "
                                                                            "models), e.g. from `optkit tune`.")

    @field_validator("threads", "batch", "warmup", "runs", "trials", "seed", "concurrency", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML `true` would count as 1
            raise ValueError(f"{str(v).lower()} is not a count; write a number")
        return v

    @field_validator("values")
    @classmethod
    def _values(cls, v: dict[str, float]) -> dict[str, float]:
        for name, value in v.items():
            if isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"value of {name!r} must be a finite number, not {value}")
        return v

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, v: dict[str, list[int]]) -> dict[str, list[int]]:
        for name, dims in v.items():
            if not dims or len(dims) > 16 or any(d < 1 or d > MAX_DIM for d in dims):
                raise ValueError(f"shape of {name!r} must be 1 to 16 dims, each 1-{MAX_DIM}, not {dims}")
            n = 1
            for d in dims:
                n *= d
            if n > MAX_ELEMENTS:
                raise ValueError(f"shape of {name!r} {dims} has {n:,} elements; at most {MAX_ELEMENTS:,} per input")
        return v


class GateSpec(_Strict):
    metric: str
    stage: str | None = None          # default: the last stage
    op: Literal["<=", "<", ">=", ">"] | None = None
    # a NaN or infinite threshold means nothing (every comparison with NaN is false)
    value: float | None = Field(default=None, allow_inf_nan=False)
    max: float | None = Field(default=None, allow_inf_nan=False)
    min: float | None = Field(default=None, allow_inf_nan=False)


class Recipe(_Strict):
    version: int = RECIPE_VERSION
    name: str | None = None
    description: str | None = None
    model: ModelSpec | None = Field(default=None, description="The model the stages start from (none: a recipe "
                                                               "whose stages need none, capacity.plan on its figures).")
    data: DataSection = Field(default_factory=DataSection)
    stages: list[StageSpec] = Field(default_factory=list)
    measure: MeasureSection = Field(default_factory=MeasureSection)
    gates: list[Union[str, GateSpec]] = Field(default_factory=list)
    baseline: str | None = Field(default=None, description="A report.json for the baseline gates.")
    package: list[PackageConfig] = Field(default_factory=list, description="Package the last (or a named) stage's "
                                                                          "model when every gate passed.")
    capacity: CapacityConfig | None = Field(default=None, description="Replicas and autoscaling from this run's "
                                                                     "figures (optkit capacity's options): a "
                                                                     "capacity.plan stage run last, named capacity.")

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != RECIPE_VERSION:
            raise ValueError(f"this optkit reads recipe version {RECIPE_VERSION}, not {v}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return _folder_name(v, "recipe name")


# ---------------------------------------------------------------- loading with line numbers

@dataclass
class LoadedRecipe:
    recipe: Recipe
    path: Path | None                      # the YAML file (None for a recipe built in code)
    raw: dict[str, Any]
    lines: dict[tuple, int] = field(default_factory=dict)   # key path -> 1-based line

    @property
    def base(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    @property
    def name(self) -> str:
        if self.recipe.name:
            return self.recipe.name
        # from the file name: made a plain folder name (`my recipe.yaml` -> `my_recipe`)
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", self.path.stem if self.path else "").lstrip(".")[:100]
        return stem or "recipe"

    def where(self, loc: tuple) -> str:
        """`file:line: key.path` for an error at `loc` (the nearest known line)."""
        loc = tuple(loc)
        line = None
        for n in range(len(loc), -1, -1):
            if loc[:n] in self.lines:
                line = self.lines[loc[:n]]
                break
        file = str(self.path) if self.path else "recipe"
        key = _dotted(loc)
        return f"{file}:{line}: {key}" if line else f"{file}: {key}"

    def resolve(self, p: str | None) -> str | None:
        """A recipe path, resolved relative to the recipe file (factories keep their :attr)."""
        if p is None:
            return None

        factory = split_factory(p)
        if factory and factory[0].endswith(".py") and not Path(p).exists():
            target, attr = factory
            return f"{self._abs(target)}:{attr}"
        if factory and not factory[0].endswith(".py"):
            return p  # pkg.mod:make_model
        return self._abs(p)

    @property
    def model_path(self) -> str | None:
        """The model's path, resolved as every recipe path is; a Hugging Face Hub id (org/name) that is no path
        here stays one (Artifact.load finds it in the local cache). Only the model may be a Hub id: an output
        `dir/file.html` is a path. None: a recipe without a model."""
        if self.recipe.model is None:
            return None
        p = self.recipe.model.path
        return p if hub.is_hub_id(p) and not (self.base / p).exists() else self.resolve(p)

    def _abs(self, p: str) -> str:
        q = Path(p).expanduser()
        out = str(q if q.is_absolute() else (self.base / q))
        # a trailing '/' says "a folder": kept, so a file output spelled so is refused as the command line's is
        return out + "/" if p.endswith("/") and not out.endswith("/") else out

    def sha256(self) -> str:
        return hashlib.sha256(strictjson.dumps(self.raw, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def stages(self) -> list[StageSpec]:
        """The stages as they run: `stages:`, then the `capacity:` section as a capacity.plan stage."""
        extra = [] if self.recipe.capacity is None else [StageSpec(
            pass_name=CAPACITY, name="capacity", config=self.recipe.capacity.model_dump(exclude_unset=True))]
        return [*self.recipe.stages, *extra]

    def config_loc(self, i: int) -> tuple:
        """Where stage i's config is in the recipe (the `capacity:` section is its own config)."""
        return ("stages", i, "config") if i < len(self.recipe.stages) else ("capacity",)

    def stage_loc(self, i: int, key: str) -> tuple:
        return ("stages", i, key) if i < len(self.recipe.stages) else ("capacity",)

    def stage_names(self) -> list[str]:
        names, seen = [], set()
        for i, st in enumerate(self.stages):
            base = st.name or st.pass_name.split(".")[0]
            name = base if base not in seen else f"{base}-{i + 1}"
            seen.add(name)
            names.append(name)
        return names


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "recipe"


def load_recipe(path: str | Path) -> LoadedRecipe:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"recipe {p} not found")
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_RECIPE_BYTES + 1)
        if len(raw) > MAX_RECIPE_BYTES:
            raise UsageError(f"recipe {p} is over {MAX_RECIPE_BYTES} bytes; a recipe is a page of YAML")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read recipe {p}: {e}") from None
    data, lines = yaml_with_lines(text, str(p))
    return from_dict(data, path=p, lines=lines)


def from_dict(data: Any, *, path: Path | None = None, lines: dict | None = None) -> LoadedRecipe:
    source = str(path) if path else "recipe"
    if not isinstance(data, dict):
        raise UsageError(f"{source}: a recipe is a YAML mapping with at least `model:` "
                         "(run `optkit recipe new` for a starter)")
    loaded = LoadedRecipe(recipe=None, path=path, raw=data, lines=lines or {})  # type: ignore[arg-type]
    try:
        loaded.recipe = Recipe.model_validate(data)
    except PydanticValidationError as e:
        err = _first_error(e)
        raise UsageError(f"{loaded.where(err[0])}: {err[1]}") from None
    return loaded


def _first_error(e: PydanticValidationError) -> tuple[tuple, str]:
    errs = e.errors()
    # a gate may be a string or a mapping: pydantic reports both branches; prefer the mapping's complaint
    err = errs[0]
    if "str" in err["loc"]:
        err = next((x for x in errs if "GateSpec" in x["loc"] and x["loc"][:2] == err["loc"][:2]), err)
    loc = tuple(p for p in err["loc"] if p not in ("str", "GateSpec"))
    # the key path is in the YAML (`pass`), not the Python attribute name
    loc = tuple({"pass_name": "pass", "from_": "from"}.get(p, p) for p in loc)
    return loc, config_message(err, unknown="unknown key")


# ---------------------------------------------------------------- one-stage recipes and the starter

def one_stage_recipe(pass_name: str, model: str | None, config: dict, *, settings=None, weights: str | None = None,
                     signature: str | None = None, eval_data=None, metric: str | None = None,
                     data: dict | None = None) -> dict:
    """The recipe a single-stage command is equivalent to (paths made absolute). `data` maps calibration/train
    (and eval, when `eval_data` does not give it) to a path, a recipe data item or a loaded Dataset; `eval_data`
    is a DataSpec measured with `metric` (None: no metric, the data feeds fidelity and timing)."""
    def ab(p):
        if p is None:
            return None
        f = split_factory(str(p))
        if f and f[0].endswith(".py") and not Path(str(p)).exists():
            return f"{Path(f[0]).resolve()}:{f[1]}"
        return str(Path(p).resolve()) if Path(str(p)).exists() else str(p)

    def item(spec) -> dict[str, Any]:
        if isinstance(spec, (str, Path)):
            out = {"path": spec}
        elif hasattr(spec, "source"):  # a loaded Dataset: only its path is known
            out = {"path": spec.source}
        else:  # a DataSpec or a recipe data item as a dict
            out = dict(spec) if isinstance(spec, dict) else spec.model_dump()
        out["path"] = ab(str(out["path"]))
        if out.get("labels"):
            out["labels"] = ab(str(out["labels"]))
        return {k: v for k, v in out.items() if v is not None}

    if model is None:  # a stage that needs no model (capacity.plan on its figures): the stage alone
        return {"version": RECIPE_VERSION, "stages": [{"pass": pass_name, "config": config or {}}]}
    rec: dict[str, Any] = {"version": RECIPE_VERSION, "model": {"path": ab(model)}}
    if weights:
        rec["model"]["weights"] = ab(weights)
    if signature:
        rec["model"]["signature"] = signature
    d: dict[str, Any] = {key: item(spec) for key, spec in (data or {}).items() if spec is not None}
    if eval_data is not None:
        d["eval"] = item(eval_data)
    if "eval" in d:
        d["eval"]["metric"] = metric
    if d:
        rec["data"] = d
    rec["stages"] = [{"pass": pass_name, "config": config or {}}]
    settings = settings if settings is not None else MeasureSettings()
    m = settings.model_dump(exclude_defaults=True, exclude={"duration"})
    # a command's measurement: all cores, 100 runs, and each model timed once, against the other, call by call
    rec["measure"] = {"latency": "paired", "trials": 1, "normalize": False, "threads": settings.threads,
                      "runs": settings.runs, **m}
    return rec


def to_yaml(rec: dict) -> str:
    import yaml

    return yaml.safe_dump(rec, sort_keys=False, default_flow_style=False)


STARTER = """\
# optkit recipe (version 1). Run:  optkit run {path}
# Check it without running anything:  optkit run {path} --dry-run
# Paths are relative to this file.
version: 1
name: {name}                  # the workspace folder: runs/{name}/<run-id>/

model:
  path: model.onnx            # .onnx, .keras/.h5, SavedModel folder, .tflite, .pt/.pt2, or file.py:make_model
  # weights: state.pt         # state dict for a file.py:make_model factory (loaded with weights_only=True)

data:
  calibration:                # samples for static quantization (.npz, image folder or IDX)
    path: calib.npz
    # max_samples: 100
  eval:                       # labelled data for accuracy (npz keys: the input name(s) and `labels`)
    path: eval.npz
    metric: top1              # top1, top5, mse, mae, cosine, or module:function
    # preprocess: {{resize: 256, center_crop: 224, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}
  # train: {{path: train.npz}} # fine-tuning data (pruning, QAT)

stages:                       # run in order; `optkit passes` lists them with their options
  - pass: simplify.onnx
  - pass: quantize.onnx-static
    config: {{}}

measure:
  # runtime: openvino         # ONNX stages on onnxruntime (default) or OpenVINO
  provider: cpu               # cpu, cuda, tensorrt (ONNX models on onnxruntime)
  threads: 1
  batch: 1
  warmup: 10
  runs: 50                    # timed runs per trial
  trials: 5                   # repeated trials give the noise (95% confidence interval)
  normalize: true             # also time a fixed reference workload: machine-normalised latency

gates:                        # the build fails (exit 1) when one is not met
  - size_ratio <= 0.35        # output size / input size
  - accuracy_drop <= 0.01     # first stage's accuracy minus the last stage's
  # - latency_p90_ms <= 5
  # - speedup >= 1.2
  # - latency_regression_pct <= 10   # against `baseline:` or `--baseline REPORT.json`
# baseline: runs/{name}/baseline/report.json
"""
