"""Outputs are never inputs, on every entry point (issue 39, class 2; W2: a recipe's `capacity: {output, html}`
overwrote the recipe's model, its traffic history or the recipe file, exit 0, and a link or device output was
refused only after the stages ran).

One plan-time guard (core.atomic.check_outputs, over the steps' `paths()`: pipeline.steps) serves every command,
`optkit run` (and --dry-run), `optkit.run(dict)` and `optkit.run_pass`. Each case asserts exit 2 (UsageError in
Python), the one line naming the flag or recipe key and both paths, and that the folder is byte for byte as it was:
the input unchanged, no run folder, no stage, no partial file.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from test_hostile import snapshot

from conftest import one_error_line

CNN, EVAL, CALIB = "torch_cnn.onnx", "digits_eval_nchw.npz", "digits_calib_nchw.npz"


@pytest.fixture
def work(tmp_path, samples):
    """Copies of a model and its data, a labels file, a traffic history, figures and a report: every kind of
    input a run reads, in a folder the test can compare before and after."""
    for name in (CNN, EVAL, CALIB):
        (tmp_path / name).write_bytes((samples / name).read_bytes())
    (tmp_path / "labels.csv").write_text("file,label\n")
    (tmp_path / "traffic.csv").write_text("timestamp,requests_per_s\n1700000000,5\n1700000060,6\n")
    (tmp_path / "best.json").write_text("{}\n")
    (tmp_path / "report.json").write_text("{}\n")
    (tmp_path / "sub").mkdir()
    return tmp_path


def refused(cli, work, *args, words: tuple[str, ...]) -> str:
    before = snapshot(work)
    r = cli(*args, cwd=work)
    line = one_error_line(r)
    assert r.rc == 2, (args, r.rc, r.err)
    for w in words:
        assert w in line, (args, w, line)
    assert snapshot(work) == before, f"{args} changed the folder"
    return line


def _hard_link(work: Path, name: str) -> str:
    os.link(work / name, work / f"hard-{name}")
    return f"hard-{name}"


def _sym_link(work: Path, name: str) -> str:
    (work / f"sym-{name}").symlink_to(name)
    return f"sym-{name}"


def _fifo(work: Path) -> str:
    os.mkfifo(work / "pipe")
    return "pipe"


def _folder(work: Path) -> str:
    (work / "folder").mkdir()
    (work / "folder" / "keep.txt").write_text("precious")
    return "folder"


# how each kind of hostile output is made in the work folder, and the words its refusal says
KINDS = {
    "the model": (lambda w: CNN, "is also an input"),
    "the data": (lambda w: EVAL, "is also an input"),
    "a hard link to the model": (lambda w: _hard_link(w, CNN), "is also an input"),
    "the model by another path": (lambda w: f"sub/../{CNN}", "is also an input"),
    "a symlink to the model": (lambda w: _sym_link(w, CNN), "symbolic link"),
    "a device": (lambda w: "/dev/null", "not a regular file"),
    "a FIFO": (_fifo, "not a regular file"),
    "an existing folder": (_folder, "existing folder"),
}


# ------------------------------------------------------------------ every command that writes a file

# command -> (argv with OUT where the output goes, the input the output is made to be, the words of the refusal)
COMMANDS = {
    "convert": (["convert", CNN, "-o", "OUT"], CNN, ("-o", "MODEL")),
    "simplify": (["simplify", CNN, "-o", "OUT"], CNN, ("-o", "MODEL")),
    "simplify --data": (["simplify", CNN, "-o", "OUT", "--data", EVAL], EVAL, ("-o", "--data")),
    "preprocess": (["preprocess", CNN, "-o", "OUT", "--preprocess", "{resize: 8}"], CNN, ("-o", "MODEL")),
    "quantize": (["quantize", CNN, "--mode", "dynamic", "-o", "OUT"], CNN, ("-o", "MODEL")),
    "quantize --calibration-data": (["quantize", CNN, "--calibration-data", CALIB, "-o", "OUT"], CALIB,
                                    ("-o", "--calibration-data")),
    "quantize --labels": (["quantize", CNN, "--mode", "dynamic", "--eval-data", EVAL, "--labels", "labels.csv",
                           "-o", "OUT"], "labels.csv", ("-o", "--labels")),
    "quantize --report": (["quantize", CNN, "--mode", "dynamic", "-o", "q.onnx", "--report", "OUT"], CNN,
                          ("--report", "MODEL")),
    "prune": (["prune", CNN, "-o", "OUT", "--train", EVAL], EVAL, ("-o", "--train")),
    "qat": (["qat", CNN, "-o", "OUT", "--train", EVAL], CNN, ("-o", "MODEL")),
    "tflite": (["tflite", CNN, "-o", "OUT", "--calib", CALIB], CALIB, ("-o", "--calib")),
    "trt build": (["trt", "build", CNN, "-o", "OUT"], CNN, ("-o", "MODEL")),
    "trt build --timing-cache": (["trt", "build", CNN, "-o", "e.engine", "--timing-cache", "OUT"], CNN,
                                 ("--timing-cache", "MODEL")),
    "tune": (["tune", CNN, "-o", "OUT"], CNN, ("-o", "MODEL")),
    "tune --data": (["tune", CNN, "--data", EVAL, "-o", "best.json", "--report", "OUT"], EVAL,
                    ("--report", "--data")),
    "profile --trace": (["profile", CNN, "--trace", "OUT"], CNN, ("--trace", "MODEL")),
    "capacity -o": (["capacity", "best.json", "--peak", "100", "-o", "OUT"], "best.json", ("-o", "FIGURES")),
    "capacity --html": (["capacity", "best.json", "--history", "traffic.csv", "-o", "c.json", "--html", "OUT"],
                        "traffic.csv", ("--html", "--history")),
    "report render": (["report", "render", "report.json", "--format", "md", "-o", "OUT"], "report.json",
                      ("-o", "REPORT")),
    "gate --junit": (["gate", "report.json", "size_mb <= 5", "--junit", "OUT"], "report.json", ("--junit", "REPORT")),
    "gate --baseline": (["gate", "report.json", "size_mb <= 5", "--baseline", "best.json", "--markdown", "OUT"],
                        "best.json", ("--markdown", "--baseline")),
    "bench --report": (["bench", CNN, "--runs", "3", "--report", "OUT"], CNN, ("--report", "MODEL")),
    "eval --report": (["eval", CNN, "--data", EVAL, "--report", "OUT"], EVAL, ("--report", "--data")),
    "eval --reference": (["eval", CNN, "--data", EVAL, "--reference", "ref.onnx", "--report", "OUT"], "ref.onnx",
                         ("--report", "--reference")),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_an_input_as_its_output_through_a_hard_link(cli, work, command):
    argv, target, words = COMMANDS[command]
    if not (work / target).exists():
        (work / target).write_bytes((work / CNN).read_bytes())
    out = _hard_link(work, target)
    line = refused(cli, work, *[out if a == "OUT" else a for a in argv], words=("is also an input", out, *words))
    assert target in line, line


@pytest.mark.parametrize("kind", ["a symlink to the model", "a device", "a FIFO", "an existing folder",
                                  "the model by another path"])
@pytest.mark.parametrize("command", ["simplify", "capacity -o", "report render", "tune"])
def test_commands_refuse_every_kind_of_output_that_is_not_theirs(cli, work, command, kind):
    argv, target, _ = COMMANDS[command]
    if kind == "the model by another path":  # the command's own input, by another path
        out, words = f"sub/../{target}", "is also an input"
    else:
        make, words = KINDS[kind]
        out = make(work)
    refused(cli, work, *[out if a == "OUT" else a for a in argv], words=(words,))


def test_recipe_new_refuses_a_folder_a_device_and_a_link(cli, work):
    for make, words in (KINDS["an existing folder"], KINDS["a device"], KINDS["a symlink to the model"]):
        refused(cli, work, "recipe", "new", make(work), "--force", words=(words,))


def test_split_refuses_a_folder_output_that_is_or_holds_or_lies_in_an_input(cli, work, samples):
    (work / "sm").mkdir()
    refused(cli, work, "split", CNN, "-o", CNN, words=("-o", "exists and is not a folder"))
    refused(cli, work, "split", CNN, "-o", ".", words=("-o", "holds an input", "MODEL"))
    refused(cli, work, "split", CNN, "-o", _sym_link(work, "sm"), words=("-o", "symbolic link"))
    images = work / "images"
    images.mkdir()
    refused(cli, work, "split", CNN, "-o", "images/parts", "--data", "images",
            words=("-o images/parts is inside an input folder", "--data images"))


def test_convert_refuses_an_output_inside_the_savedmodel_it_reads(cli, work, samples):
    import shutil

    shutil.copytree(samples / "keras_cnn_savedmodel", work / "sm")
    refused(cli, work, "convert", "sm", "-o", "sm/model.onnx", words=("-o sm/model.onnx is inside", "MODEL sm"))


def test_profile_logdir_and_prune_tensorboard_are_folders_that_are_never_an_input(cli, work):
    (work / "images").mkdir()
    refused(cli, work, "profile", CNN, "--data", "images", "--logdir", "images",
            words=("--logdir images is also an input", "--data images"))
    refused(cli, work, "profile", CNN, "--logdir", CNN, words=("--logdir", "exists and is not a folder"))
    refused(cli, work, "prune", CNN, "-o", "p.keras", "--train", "images", "--tensorboard", "images/tb",
            words=("--tensorboard images/tb is inside an input folder", "--train images"))


def test_package_repository_never_replaces_an_input_but_may_hold_an_old_version(cli, work):
    """The repository's model folder holds the model: the index and config.pbtxt written there could replace it.
    A version folder already there is never rewritten: its model may be packaged again (as version 2)."""
    (work / "repo" / "cnn").mkdir(parents=True)
    (work / "repo" / "cnn" / "m.onnx").write_bytes((work / CNN).read_bytes())
    refused(cli, work, "package", "repo/cnn/m.onnx", "--to", "triton", "-o", "repo", "--name", "cnn",
            words=("output (--output) repo holds an input", "MODEL repo/cnn/m.onnx"))
    (work / "repo" / "cnn" / "m.onnx").unlink()
    (work / "repo" / "cnn").rmdir()
    r = cli("package", CNN, "--to", "triton", "-o", "repo", "--name", "cnn", cwd=work)
    assert r.rc == 0, r.err
    v1 = snapshot(work / "repo" / "cnn" / "1")
    r = cli("package", "repo/cnn/1/model.onnx", "--to", "triton", "-o", "repo", "--name", "cnn", cwd=work)
    assert r.rc == 0, r.err
    assert (work / "repo" / "cnn" / "2" / "model.onnx").read_bytes() == (work / CNN).read_bytes()
    assert snapshot(work / "repo" / "cnn" / "1") == v1
    refused(cli, work, "package", CNN, "--to", "triton", "-o", "repo", "--name", "cnn",
            "--tuned", "repo/cnn/optkit-versions.json", words=("holds an input", "tuned (--tuned)"))


# ------------------------------------------------------------------ recipes: optkit run and --dry-run

def _recipe(work: Path, **sections) -> Path:
    rec = {"version": 1, "name": "guard", "model": {"path": CNN},
           "data": {"eval": {"path": EVAL, "labels": "labels.csv", "metric": None}},
           "stages": [{"pass": "quantize.onnx-fp16"}], "measure": {"latency": False}, **sections}
    path = work / "recipe.yaml"
    path.write_text(yaml.safe_dump(rec, sort_keys=False))
    return path


# capacity.output made to be ...: (the path, the words of the refusal)
RECIPE_KINDS = {
    **{k: v for k, v in KINDS.items()},
    "the labels": (lambda w: "labels.csv", "data.eval.labels"),
    "the traffic history": (lambda w: "traffic.csv", "capacity.history"),
    "the figures": (lambda w: "best.json", "capacity.figures"),
    "the recipe file": (lambda w: "recipe.yaml", "the recipe file"),
    "the html page": (lambda w: "c.html", "name the same file"),
}


@pytest.mark.parametrize("kind", sorted(RECIPE_KINDS))
def test_recipe_capacity_output_is_refused_before_any_stage(cli, work, kind):
    """W2: the recipe's capacity.output as its own model, data, labels, history, figures or file, or a link, a
    device, a FIFO, a folder: exit 2 naming the recipe line, before any stage (no run folder)."""
    make, words = RECIPE_KINDS[kind]
    recipe = _recipe(work, capacity={"figures": "best.json", "history": "traffic.csv", "output": make(work),
                                     "html": "c.html"})
    refused(cli, work, "run", str(recipe), "--workspace", "runs",
            words=(f"{recipe}:", "capacity.output", words))
    assert not (work / "runs").exists()


def test_recipe_capacity_html_and_dry_run(cli, work):
    recipe = _recipe(work, capacity={"peak": 100, "output": "c.json", "html": "labels.csv"})
    refused(cli, work, "run", str(recipe), "--dry-run", words=(f"{recipe}:", "capacity.html", "is also an input",
                                                               "data.eval.labels"))
    recipe = _recipe(work, capacity={"peak": 100, "output": CNN})
    refused(cli, work, "run", str(recipe), "--dry-run", "--json", words=("capacity.output", "model.path"))
    (work / "runs").mkdir()
    recipe = _recipe(work, capacity={"peak": 100, "output": "runs"})  # a folder where a file is written
    refused(cli, work, "run", str(recipe), "--workspace", "runs", words=("capacity.output", "existing folder"))


def test_recipe_package_output_never_replaces_an_input(cli, work):
    (work / "repo" / "guard").mkdir(parents=True)
    (work / "repo" / "guard" / "m.onnx").write_bytes((work / CNN).read_bytes())
    recipe = _recipe(work, package=[{"to": "triton", "output": "repo"}])
    recipe.write_text(recipe.read_text().replace(f"path: {CNN}", "path: repo/guard/m.onnx"))
    refused(cli, work, "run", str(recipe), "--workspace", "runs", words=("package[0].output", "holds an input",
                                                                         "model.path"))
    recipe = _recipe(work, package=[{"to": "triton", "output": "repo2"}], capacity={"peak": 100, "output":
                                                                                   "repo2/guard/c.json"})
    (work / "repo2" / "guard").mkdir(parents=True)
    refused(cli, work, "run", str(recipe), "--dry-run", words=("capacity.output", "is inside", "package[0].output"))


@pytest.mark.parametrize("stage, words", [
    ({"pass": "tune.onnx", "config": {"storage": f"journal:{CNN}"}}, "stages[0].config.storage"),
    ({"pass": "tensorrt.build", "config": {"timing_cache": EVAL}}, "stages[0].config.timing_cache"),
    ({"pass": "quantize.onnx-dynamic", "config": {"metric": "m.py:f"}}, "is also an input"),
])
def test_recipe_stage_config_files_are_checked_in_the_plan(cli, work, stage, words):
    """A pass Config's file fields (PathRole) are the stage's outputs or inputs: refused in --dry-run."""
    if stage["config"].get("metric"):
        (work / "m.py").write_text("def f(a, b):\n    return 0.0\n")
        recipe = _recipe(work, stages=[stage], capacity={"peak": 100, "output": "m.py"})
    else:
        recipe = _recipe(work, stages=[stage])
    refused(cli, work, "run", str(recipe), "--dry-run", words=(f"{recipe}:", words))


# ------------------------------------------------------------------ the Python API: optkit.run(dict), run_pass

def _api_refuses(work: Path, call, *words: str) -> str:
    from optkit.core.errors import UsageError

    before = snapshot(work)
    with pytest.raises(UsageError) as e:
        call()
    assert snapshot(work) == before
    for w in words:
        assert w in e.value.message, (w, e.value.message)
    assert "\n" not in e.value.message
    return e.value.message


@pytest.mark.parametrize("kind", sorted(RECIPE_KINDS))
def test_optkit_run_dict_refuses_capacity_outputs_like_the_command(work, kind):
    import optkit

    make, words = RECIPE_KINDS[kind]
    _recipe(work)  # the recipe file exists, as an input only when run from it
    out = make(work)
    rec = yaml.safe_load((work / "recipe.yaml").read_text())
    rec["model"]["path"] = str(work / CNN)
    rec["data"]["eval"].update(path=str(work / EVAL), labels=str(work / "labels.csv"))
    rec["capacity"] = {"figures": str(work / "best.json"), "history": str(work / "traffic.csv"),
                       "output": out if out.startswith("/") else str(work / out), "html": str(work / "c.html")}
    if kind == "the recipe file":
        rec["capacity"]["output"] = str(work / "recipe.yaml")
        (work / "recipe.yaml").write_text(yaml.safe_dump(rec))
        _api_refuses(work, lambda: optkit.run(work / "recipe.yaml", workspace=work / "runs"), "the recipe file")
        return
    _api_refuses(work, lambda: optkit.run(rec, workspace=work / "runs"), "capacity.output", words)
    assert not (work / "runs").exists()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_run_pass_refuses_every_kind_of_output(work, kind):
    import optkit

    make, words = KINDS[kind]
    out = make(work)
    _api_refuses(work, lambda: optkit.run_pass("quantize.onnx-fp16", work / CNN, out if out.startswith("/")
                                               else work / out, eval=work / EVAL, metric="top1"), "output", words)


@pytest.mark.parametrize("arg", ["calibration", "eval", "labels", "train", "weights"])
def test_run_pass_refuses_each_named_input_as_output(work, arg):
    import optkit

    given = {"calibration": CALIB, "eval": EVAL, "labels": "labels.csv", "train": EVAL, "weights": "best.json"}
    kwargs = {arg: work / given[arg]}
    if arg == "labels":
        kwargs["eval"] = work / EVAL
    _api_refuses(work, lambda: optkit.run_pass("quantize.onnx-fp16", work / CNN, work / given[arg], **kwargs),
                 f"output {work / given[arg]} is also an input", f"{arg} {work / given[arg]}")


def test_run_pass_package_output_is_checked_before_the_stage(work):
    import optkit

    (work / "repo" / "recipe").mkdir(parents=True)
    (work / "repo" / "recipe" / "m.onnx").write_bytes((work / CNN).read_bytes())
    _api_refuses(work, lambda: optkit.run_pass("quantize.onnx-fp16", work / "repo" / "recipe" / "m.onnx",
                                               work / "q.onnx", package={"to": "triton", "output": str(work / "repo")}),
                 "package[0].output", "holds an input", "model.path")
    _api_refuses(work, lambda: optkit.run_pass("quantize.onnx-fp16", work / CNN, work / "q.onnx",
                                               package={"to": "triton", "output": str(work / CNN)}),
                 "package[0].output", "is not a folder")


# ------------------------------------------------------------------ the guard itself, and its coverage by construction

def test_the_repository_output_replaces_only_the_model_folders_outside_their_versions(tmp_path):
    from optkit.core.atomic import Input, check_outputs
    from optkit.core.errors import UsageError
    from optkit.package import repo

    out = repo.output("-o", tmp_path, "cnn")
    for ok in ("cnn/1/model.onnx", "cnn/12/report.json", "other/config.pbtxt", "cnnx/m.onnx"):
        check_outputs([out], [Input("MODEL", tmp_path / ok)])
    for bad in ("cnn/optkit-versions.json", "cnn/config.pbtxt", "cnn", "cnn.pre/config.pbtxt", "cnn/new/m.onnx"):
        with pytest.raises(UsageError, match="holds an input"):
            check_outputs([out], [Input("MODEL", tmp_path / bad)])


def test_onnx_external_data_and_a_factory_file_are_inputs_too(tmp_path, samples):
    import onnx

    from optkit.core.atomic import check_outputs
    from optkit.core.errors import UsageError

    model = onnx.load(str(samples / CNN))
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.weights",
              size_threshold=0)
    with pytest.raises(UsageError, match=r"is also an input of this command \(MODEL .*m.weights\)"):
        check_outputs({"-o": tmp_path / "m.weights"}, {"MODEL": tmp_path / "m.onnx"})
    (tmp_path / "f.py").write_text("def make_model():\n    pass\n")
    with pytest.raises(UsageError, match="is also an input"):
        check_outputs({"-o": tmp_path / "f.py"}, {"MODEL": f"{tmp_path / 'f.py'}:make_model"})


FILE_WORDS = re.compile(r"\b(file|folder|path|storage|cache)\b", re.I)
NOT_FILES = {  # fields whose description says one of FILE_WORDS but which name no file
    "compact": "smaller files",
    "max_top1_changes": "the PIL path's top-1",
    "study": "a study's name in the storage",
}


def test_every_pass_config_field_that_names_a_file_declares_it():
    """A pass stage's files are its Config's PathRole fields (pipeline.steps.PassStage): a new field that names a
    file is declared where it is written, or the guard would not see it."""
    from optkit.core.atomic import PathRole
    from optkit.passes import all_passes, get_pass

    undeclared = set()
    for name in all_passes():
        for field, info in get_pass(name).Config.model_fields.items():
            marked = any(isinstance(m, PathRole) for m in info.metadata)
            if FILE_WORDS.search(info.description or "") and not marked and field not in NOT_FILES:
                undeclared.add(f"{name}: {field}")
    assert undeclared == set()


def test_every_recipe_section_that_names_files_is_a_step(tmp_path):
    """Every file a recipe names comes out of some step's paths(): the model and data (Source), the stages'
    configs, each package entry (every PackageConfig file field), capacity (every file field)."""
    from optkit.capacity.config import CapacityConfig
    from optkit.core.atomic import python_file
    from optkit.core.registry import build_config
    from optkit.package.config import PackageConfig
    from optkit.package.target import get_target, target_names
    from optkit.passes import get_pass
    from optkit.pipeline.recipe import Recipe, from_dict
    from optkit.pipeline.steps import steps_of

    no_files = {"version", "name", "description", "measure", "gates", "stages"}  # stages: the test above
    not_package_files = {"report": "refused in a recipe (its own run's report)", "name": "the file's stem",
                         "shape": "dims, or the data's"}
    not_capacity_files = {"peak": "instead of a history", "cpu_cores": "a figure", "forecast": "of the history"}

    def file_fields(config) -> set[str]:
        return {k for k, f in config.model_fields.items()
                if re.search(r"file|folder|\.json|registry|data", f.description or "")}

    package_files = file_fields(PackageConfig) - set(not_package_files)
    target_files = {n: file_fields(get_target(n).Config) for n in target_names()}  # each target's own options
    capacity_files = {k for k, f in CapacityConfig.model_fields.items()
                      if re.search(r"\b(file|folder|history|figures)\b|\.json|HTML", f.description or "")} \
        - set(not_capacity_files)
    assert {"output", "tuned", "data", "capacity"} <= package_files and "registry" in target_files["mlflow"]
    assert {"output", "history", "html", "figures"} <= capacity_files
    rec = {"version": 1, "model": {"path": "m.onnx", "weights": "w.pt"}, "baseline": "b.json",
           "data": {k: {"path": f"{k}.npz", "labels": f"{k}.csv"} for k in ("calibration", "eval", "train")},
           "stages": [{"pass": "simplify.onnx"}],
           "package": [{"to": n, **{k: f"sqlite:///p-{k}.db" if k == "registry" else f"p-{k}"
                                       for k in package_files | own}} for n, own in target_files.items()],
           "capacity": {k: f"c-{k}" for k in capacity_files}}
    rec["data"]["eval"]["metric"] = "metric.py:f"
    assert set(Recipe.model_fields) - no_files == {"model", "data", "baseline", "package", "capacity"}
    loaded = from_dict(rec, path=tmp_path / "r.yaml")
    named = set()
    # the stages' built Configs (the `capacity:` section is the last stage: capacity.plan)
    configs = [build_config(get_pass(st.pass_name), st.config) for st in loaded.stages]
    assert [st.pass_name for st in loaded.stages] == ["simplify.onnx", "capacity.plan"]
    for step in steps_of(loaded, configs):
        ins, outs = step.paths()
        named |= {Path(str(p.path)).name for p in [*ins, *outs]}
    expected = {"r.yaml", "m.onnx", "w.pt", "b.json", "metric.py", *(f"{k}.npz" for k in rec["data"]),
                *(f"{k}.csv" for k in rec["data"]), *(f"p-{k}" for k in package_files),
                *(f"p-{k}" for own in target_files.values() for k in own - {"registry"}), "p-registry.db", *(f"c-{k}" for k in capacity_files)}
    assert python_file("metric.py:f") == "metric.py"
    assert expected - named == set()
