"""The Python API: what the command line does, through the same runner, with the same figures.

    report = optkit.run("recipes/quickstart.yaml")            # or a dict; reports under runs/ as `optkit run`
    report = optkit.run_pass("quantize.onnx-static", "model.onnx", "model.int8.onnx",
                             calibration="calib.npz", eval="eval.npz", metric="top1")
    report.stages[-1].measurements["latency_change"]          # the ratio against the input, with its interval

Both return the run's Report (optkit.report.schema). A gate that fails is in `report.gates` (`g.verdict`); the
API raises only for what the command line exits 2, 3 or 4 on (UsageError, PassError, DependencyError): an
argument of the wrong kind (None for a path, a file as the workspace) is a UsageError naming the argument.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optkit.core import preprocessor
from optkit.core.atomic import Input, Output, atomic_path, check_outputs, remove
from optkit.core.errors import UsageError
from optkit.core.formats import Format, detect_format
from optkit.measure.model import DataSpec
from optkit.onnx.io import copy_model
from optkit.passes import get_pass
from optkit.passes.convert.openvino import copy_ir
from optkit.passes.quantize.candidates import rejected_path
from optkit.pipeline.recipe import from_dict, load_recipe, one_stage_recipe
from optkit.pipeline.runner import RunOptions, execute
from optkit.report.schema import Report, Stage


def _path(name: str, value: Any, *, optional: bool = False) -> Path | None:
    """An argument that names a file: a str or os.PathLike (None where `optional`), else a UsageError."""
    if value is None and optional:
        return None
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes) and str(value).strip():
        if "\x00" in str(value):  # no file has one; os calls raise a bare ValueError on it
            raise UsageError(f"{name}: {str(value)!r:.80} holds a NUL character; no file's path has one")
        return Path(value)
    raise UsageError(f"{name}: give a path (a str or pathlib.Path), not {_shown(value)}")


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{name}: give True or False, not {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    return "None" if value is None else f"{type(value).__name__} {value!r:.60}"


def run(recipe: str | Path | dict, *, workspace: str | Path = "runs", cache: bool = True, resume: bool = True,
        baseline: str | Path | None = None) -> Report:
    """Run a recipe (a YAML file, or the same mapping as a dict) exactly as `optkit run` does."""
    if not isinstance(recipe, dict):
        _path("recipe", recipe)  # a YAML file, or the mapping itself
    workspace, baseline = _path("workspace", workspace), _path("baseline", baseline, optional=True)
    cache, resume = _flag("cache", cache), _flag("resume", resume)
    loaded = from_dict(recipe) if isinstance(recipe, dict) else load_recipe(recipe)
    opts = RunOptions(workspace=Path(workspace), use_cache=cache, resume=resume,
                      baseline=None if baseline is None else str(baseline),
                      command=f"optkit.run({str(recipe)!r})" if not isinstance(recipe, dict) else "optkit.run(dict)")
    return execute(loaded, opts).report


def run_pass(pass_name: str, model: str | Path, output: str | Path, *, weights: str | Path | None = None,
             calibration: str | Path | None = None, eval: str | Path | None = None, labels: str | Path | None = None,
             metric: str | None = None, train: str | Path | None = None, measure: dict[str, Any] | None = None,
             package: dict[str, Any] | list[dict[str, Any]] | None = None, **config: Any) -> Report:
    """One pass on `model`, written to `output`, measured against its input: the one-stage recipe a command's
    `--print-recipe` prints, run by the recipe runner in a scratch workspace. `config` is the pass's Config
    (the recipe's `config:`), `measure` the recipe's `measure:` section, `package` the recipe's `package:` entries
    (PackageConfig's options: {"to": "triton", "output": "repo", ...}), packaging the result."""
    if not isinstance(pass_name, str) or not pass_name:
        raise UsageError(f"pass_name: give a pass's name (optkit passes lists them), not {_shown(pass_name)}")
    given_output = output  # as given: a str's trailing '/' (a folder's spelling) is refused for a file
    model, output = _path("model", model), _path("output", output)
    weights, calibration, eval, labels, train = (
        _path(k, v, optional=True) for k, v in (("weights", weights), ("calibration", calibration), ("eval", eval),
                                                  ("labels", labels), ("train", train)))
    if metric is not None and not isinstance(metric, str):
        raise UsageError(f"metric: give a metric's name (top1, ...), not {_shown(metric)}")
    if measure is not None and not isinstance(measure, dict):
        raise UsageError(f"measure: give the recipe's measure section as a dict, not {_shown(measure)}")
    detect_format(model)  # what the model is comes first: a folder that is no model says so, not "inside an input"
    check_outputs({"output": given_output if isinstance(given_output, str) else output}, [Input("model", model), *(
        Input(k, v) for k, v in (("weights", weights), ("calibration", calibration), ("eval", eval),
                                 ("labels", labels), ("train", train)) if v is not None)])
    if metric is not None and eval is None:
        raise UsageError("metric needs evaluation data: give eval=PATH")
    if metric is not None and "metric" in get_pass(pass_name).Config.model_fields:
        # as the command's --metric: the pass judges its own budget (quantize's max_accuracy_drop) on it too
        config = {"metric": metric, **config}
    rec = one_stage_recipe(pass_name, str(model), config, weights=weights, metric=metric or "top1",
                           eval_data=None if eval is None else DataSpec(path=str(eval), labels=labels),
                           data={k: str(v) for k, v in (("calibration", calibration), ("train", train)) if v})
    rec["measure"].update(measure or {})  # measured as the command is (one_stage_recipe), then the caller's
    if package is not None:
        if not isinstance(package, (dict, list)):
            raise UsageError(f"package: give the recipe's package entries (a dict or a list of them), not "
                             f"{_shown(package)}")
        rec["package"] = [package] if isinstance(package, dict) else list(package)
    return run_one_stage(rec, output, command=f"optkit.run_pass({pass_name!r}, {str(model)!r})")


def run_one_stage(rec: dict, output: str | Path, *, command: str, input_last: bool = False,
                  keep: Callable[[Stage], None] | None = None, outputs: dict | list[Output] | None = None) -> Report:
    """Run a one-stage recipe in a scratch workspace and copy its result to `output`: what every single-stage
    command and run_pass do. A result a budget refuses is kept beside `output` (OUT.REJECTED.onnx). A stage whose
    product is not its model (tune's settings, profile's figures and trace) gives `keep` instead: it is called
    with the stage while the workspace is there, and the model (unchanged) is not copied. `outputs` names what
    the caller writes ({"-o": out, "--report": rep}; default {"output": output} without keep), checked with the
    recipe's steps before the stage runs; a list of core.atomic.Output for a folder)."""
    if outputs is None:
        outputs = {} if keep is not None else {"output": output}
    if isinstance(outputs, dict):
        outputs = [Output(k, v) for k, v in outputs.items() if v is not None]
    with tempfile.TemporaryDirectory(prefix="optkit-stage-") as scratch:
        opts = RunOptions(workspace=Path(scratch), use_cache=False, resume=False, command=command,
                          aside=rejected_path(Path(output)), input_last=input_last,
                          outputs=outputs)
        report = execute(from_dict(rec), opts).report
        stage = report.stages[-1]
        if keep is None:
            publish(Path(stage.output.path), Format(stage.output.format), Path(output))
            stage.output.path = str(output)
        else:
            keep(stage)
        report.run = None  # the scratch workspace is gone
    return report


def publish(src: Path, fmt: Format, dest: Path) -> None:
    """Copy a result out of the workspace to where the caller asked for it, atomically."""
    if fmt == Format.ONNX:  # external data included; its preprocessor folder beside it first, then the model
        record, made, folder = None, False, None
        if preprocessor.resolve(src) is not None:  # most models have none: nothing beside them to write
            folder = preprocessor.folder_beside(dest)
            made = not folder.exists()
            record = preprocessor.carry(src, dest)
        try:
            copy_model(src, dest, edit=lambda proto: preprocessor.stamp(proto, record))
        except BaseException:
            if made and record is not None:
                remove(folder)
            raise
    elif fmt == Format.OPENVINO_IR:
        copy_ir(src, dest)
    elif src.is_dir():
        raise UsageError(f"the result is a folder ({fmt.value}); run a recipe to keep it in its workspace")
    else:
        with atomic_path(dest) as tmp:
            shutil.copyfile(src, tmp)
