"""Each pass's options are declared once, in its Config (description, bounds, default, and the CLI flag through
core.registry.cli); the commands derive their flags from it through the generated optkit/cli/flagspec.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from optkit.cli import commandspec, flags, options
from optkit.core.registry import cli_meta
from optkit.passes import all_passes

from conftest import ROOT

# The command each pass's flags are derived for (@flags.pass_options), and the pass spec it derives from.
DERIVED = {"quantize": ("quantize.onnx",), "simplify": ("simplify.onnx",), "tflite": ("tflite.export",),
           "qat": ("qat.keras",), "prune": ("prune.keras", "prune.torch"), "convert": ("convert.torch", "convert.tf"),
           "trt build": ("tensorrt.build",), "tune": ("tune.onnx",),
           "profile": ("profile.onnx",)}
NOT_YET: dict[str, str] = {}  # passes whose commands still declare their flags by hand (none left)
# the real passes: tests' own (tests/_testpasses.py, registered by whichever test module imports it first in a
# worker) have no flags to derive
PASSES = sorted(n for n, cls in all_passes().items() if cls.__module__ != "_testpasses")


@pytest.mark.parametrize("name", PASSES)
def test_every_config_field_has_a_flag_or_says_why_not(name):
    if name in NOT_YET:
        pytest.xfail(NOT_YET[name])
    config = all_passes()[name].Config
    missing = [k for k, f in config.model_fields.items() if not cli_meta(f)]
    assert not missing, f"{name}: fields without cli(flag=...) or cli(recipe_only=<reason>): {missing}"
    flags_seen: dict[str, str] = {}
    for key, f in config.model_fields.items():
        meta = cli_meta(f)
        if meta.get("recipe_only"):
            assert len(meta["recipe_only"]) > 5, f"{name}.{key}: say why it is recipe-only"
            continue
        assert re.fullmatch(r"--[a-z][a-z0-9-]*", meta["flag"]), (name, key, meta["flag"])
        assert meta["flag"] not in flags_seen, f"{name}: {meta['flag']} for both {flags_seen[meta['flag']]} and {key}"
        flags_seen[meta["flag"]] = key
        assert f.description or meta.get("help"), f"{name}.{key}: no description"
        assert meta.get("group", "") in flags.GROUP_ORDER, (name, key, meta.get("group"))


def test_not_yet_lists_only_real_passes():
    assert set(NOT_YET) <= set(PASSES)


def test_flagspec_is_up_to_date():
    """Regenerate with `python -m optkit.cli.derive` after changing a Config or a command's help. Checked in a
    fresh interpreter: this one holds the test passes other tests register."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "optkit.cli.derive", "--check"], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr


def _command(name):
    import typer

    from optkit.cli import main

    cmd = typer.main.get_group(main.app)
    for part in name.split():  # "trt build": a group's command
        cmd = cmd.get_command(None, part)
    return cmd


@pytest.mark.parametrize("command, pass_name", [(c, p) for c, names in sorted(DERIVED.items()) for p in names])
def test_derived_flags_default_to_the_configs_default(command, pass_name):
    """Every derived flag is 'not given' (None) by default, so the Config's default holds; the default its help
    shows is the Config's (the first pass's, for a flag two passes share); and every flagged Config field has its
    option on the command."""
    config = all_passes()[pass_name].Config
    cmd = _command(command)
    options = {opt: p for p in cmd.params for opt in p.opts}
    for key, f in config.model_fields.items():
        meta = cli_meta(f)
        if meta.get("recipe_only"):
            continue
        p = options.get(meta["flag"])
        assert p is not None, f"optkit {command} has no {meta['flag']} for {key}"
        assert p.default is None, f"{meta['flag']}: default {p.default!r}; a derived flag defaults to not given"
        dflt = f.get_default(call_default_factory=True)
        assert flags.default(pass_name, key) == dflt
        shown = re.search(r"\(default: ([^)]*)\)", p.help or "")
        if shown and pass_name == DERIVED[command][0] and "sets" not in meta and f.annotation is not bool and "default" not in (f.description or ""):
            assert shown.group(1) == str(dflt), f"{meta['flag']} shows default {shown.group(1)}, the Config's is {dflt}"


def test_only_given_flags_reach_the_config(cli, samples, tmp_path):
    """No flag: the recipe's stage config is empty (the Config's defaults hold); flags land under the Config's keys."""
    import yaml

    model = samples / "torch_cnn.onnx"
    r = cli("quantize", model, "-o", tmp_path / "q.onnx", "--print-recipe")
    assert r.rc == 0, r.err
    assert yaml.safe_load(r.out)["stages"][0] == {"pass": "quantize.onnx-static", "config": {}}
    r = cli("quantize", model, "-o", tmp_path / "q.onnx", "--print-recipe", "--mode", "dynamic", "--per-tensor",
            "--no-latency-search", "--include-op", "Conv", "--include-op", "Gemm", "--time-budget", "30",
            "--no-fusion", "--metric", "top1")
    assert r.rc == 0, r.err
    stage = yaml.safe_load(r.out)["stages"][0]
    assert stage["pass"] == "quantize.onnx-dynamic"
    assert stage["config"] == {"per_channel": False, "latency_search": False, "op_types_include": ["Conv", "Gemm"],
                               "time_budget": 30.0, "fusion": False, "metric": "top1"}
    r = cli("simplify", model, "-o", tmp_path / "s.onnx", "--print-recipe", "--no-ort", "--max-growth", "2")
    assert r.rc == 0, r.err
    assert yaml.safe_load(r.out)["stages"][0]["config"] == {"ort_optimize": False, "max_growth": 2.0}


def test_pass_errors_name_the_key_and_the_flag(cli, samples, tmp_path):
    r = cli("quantize", samples / "torch_cnn.onnx", "-o", tmp_path / "q.onnx", "--calibration-data",
            samples / "digits_calib_nchw.npz", "--max-accuracy-drop", "0.01")
    assert r.rc == 2
    assert "max_accuracy_drop (--max-accuracy-drop) needs a metric (metric / --metric, e.g. top1)" in r.err
    r = cli("quantize", samples / "torch_cnn.onnx", "-o", tmp_path / "q.onnx", "--max-size-ratio", "0", "--print-recipe")
    assert r.rc == 2 and "max_size_ratio (--max-size-ratio): input should be greater than 0" in r.err


@pytest.mark.parametrize("args, key", [
    (["--mode", "static", "--no-fusion"], "fusion (--no-fusion): applies to mode dynamic only, not static"),
    (["--mode", "int4", "--no-fusion"], "fusion (--no-fusion): applies to mode dynamic only, not int4"),
    (["--mode", "fp16", "--full-search"], "full_search (--full-search): applies to mode static or dynamic only"),
    (["--mode", "int4", "--full-search"], "full_search (--full-search): applies to mode static or dynamic only"),
    (["--mode", "dynamic", "--full-search", "--no-latency-search"], "full_search (--full-search): builds every"),
    (["--mode", "static", "--target", "tensorrt", "--full-search"], "full_search (--full-search): target tensorrt"),
    (["--mode", "dynamic", "--format", "qdq"], "format (--format): applies to mode static only, not dynamic"),
    (["--mode", "fp16", "--block-size", "64"], "block_size (--block-size): applies to mode int4 only, not fp16"),
    (["--block-size", "64"], "block_size (--block-size): applies to mode int4 only, not static"),
    (["--mode", "int4", "--fp16-io"], "keep_io_types (--keep-io-types): applies to mode fp16 only, not int4"),
    (["--mode", "fp16", "--allow-slower"], "allow_slower (--allow-slower): applies to mode static or dynamic"),
    (["--mode", "dynamic", "--synthetic-calibration"], "synthetic_calibration (--synthetic-calibration): applies"),
])
def test_a_setting_its_mode_would_ignore_is_refused_naming_it(cli, samples, tmp_path, args, key):
    r = cli("quantize", samples / "torch_cnn.onnx", "-o", tmp_path / "q.onnx", "--print-recipe", *args)
    assert r.rc == 2 and key in r.err and len(r.err.strip().splitlines()) == 1, (r.rc, r.err)
    assert not (tmp_path / "q.onnx").exists()


def test_a_recipe_field_its_mode_would_ignore_is_refused_and_defaults_pass(cli, samples, tmp_path):
    import yaml

    for config, ok in (({"fusion": False}, False), ({"full_search": True}, False), ({"fusion": True}, True),
                       ({"full_search": False, "block_size": 32}, True)):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(yaml.safe_dump({"version": 1, "name": "r", "model": {"path": str(samples / "torch_cnn.onnx")},
                                          "stages": [{"pass": "quantize.onnx-fp16", "config": config}]}))
        r = cli("run", recipe, "--dry-run", "--workspace", tmp_path / "runs")
        assert (r.rc == 0) == ok, (config, r.rc, r.err)
        if not ok:
            assert "applies to mode" in r.err and next(iter(config)) in r.err and "Traceback" not in r.err


def test_one_data_help_text():
    """--data means the same everywhere it is taken: one help text (cli/options.py)."""
    import typer

    from optkit.cli import main, options

    group = typer.main.get_group(main.app)
    texts = {}
    for name in group.list_commands(None):
        cmd = group.get_command(None, name)
        for sub in getattr(cmd, "commands", {}).values() or [cmd]:
            for p in sub.params:
                if "--data" in getattr(p, "opts", ()):
                    texts[f"{name} {sub.name}"] = p.help
    assert len(texts) >= 5 and set(texts.values()) == {options.DATA_HELP}, texts


@pytest.mark.parametrize("args", [["--help"], ["quantize", "--help"]])
def test_help_is_fast(args):
    """`optkit --help` imports no command module and `optkit quantize --help` only its own, no pydantic (the
    flags come from the generated flagspec). What that costs in seconds is benchmarks/cli_startup.py's figure: a
    timed bound here failed on busy machines."""
    code = ("import sys; from optkit.cli import main\n"
            f"sys.argv = ['optkit', *{args!r}]\n"
            "try:\n    main.main()\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sorted(sys.modules)), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "Usage: optkit" in proc.stdout, proc.stderr
    imported = set(proc.stderr.split())
    commands = {m for m in imported if m.startswith("optkit.cli.") and m.rsplit(".", 1)[-1] in commandspec.COMMAND_MODULES}
    assert commands == ({"optkit.cli.quantize"} if args[0] == "quantize" else set())
    assert not {m for m in imported if m.split(".")[0] == "pydantic" or m.startswith("optkit.passes")}
    # -X importtime: the root module's own import (which used to import every command module)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "optkit", *args], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0 and "| optkit.cli.main" in proc.stderr


# --- shared option groups (cli/options.py, @flags.groups) -----------------------------------------------------------

OPTION_BUDGET = 40  # `typer.Option(` calls over optkit/cli: shared options are data, built by one constructor
# a flag a shared option has that means something else in this command, and why
OWN_MEANING = {
    ("convert", "--runs"): "50 by default: a conversion times the source and the ONNX model",
    ("profile", "--runs"): "profiled calls (profile.onnx's Config)",
    ("tune", "--report"): "with no file, prints a study's report",
    ("trt build", "--shape"): "a TensorRT optimization profile, MIN:OPT:MAX (tensorrt.build's Config)",
    ("trt check", "--shape"): "the build's --shape",
    ("split", "--provider"): "where the core part runs: tensorrt by default (split.onnx's Config)",
    ("package", "--report"): "an input: the report of the run that made the model",
    ("package", "--shape"): "the dims of the server's warm-up",
}


def test_typer_options_are_few():
    counts = {p.name: p.read_text().count("typer.Option(") for p in sorted((ROOT / "optkit" / "cli").glob("*.py"))}
    assert sum(counts.values()) <= OPTION_BUDGET, counts


def _leaf_commands():
    import typer

    from optkit.cli import main

    def walk(cmd, name):
        if hasattr(cmd, "list_commands"):
            for sub in cmd.list_commands(None):
                yield from walk(cmd.get_command(None, sub), f"{name} {sub}".strip())
        else:
            yield name, cmd

    return list(walk(typer.main.get_command(main.app), ""))


def test_shared_flags_have_one_help_text_everywhere():
    """--eval-data, --threads, --shape, --report, --json, ... : the same help in every command that offers them."""
    declared: dict[str, set[str]] = {}
    for o in options.OPTIONS.values():
        declared.setdefault(o.flags[0], set()).add(o.help)
    assert all(len(texts) == 1 for texts in declared.values()), declared
    seen: dict[str, dict[str, str]] = {}
    for name, cmd in _leaf_commands():
        for p in cmd.params:
            for flag in getattr(p, "opts", ()):
                if flag in declared and not any(name.startswith(c) and f == flag for c, f in OWN_MEANING):
                    seen.setdefault(flag, {})[name] = p.help
    for flag in ("--data", "--eval-data", "--threads", "--shape", "--value", "--report", "--json", "--print-recipe",
                 "--metric", "--weights", "--provider", "--baseline"):
        assert len(seen.get(flag, {})) >= 2, f"{flag} offered by {sorted(seen.get(flag, {}))} only"
    wrong = {(cmd, flag): text for flag, by in seen.items() for cmd, text in by.items() if {text} != declared[flag]}
    assert not wrong, wrong


def test_shared_defaults_are_the_options_defaults():
    """A command that did not include an option gets Shared's default: it must be the option's own."""
    import dataclasses

    fields = {f.name: f.default for f in dataclasses.fields(options.Shared)}
    for key, o in options.OPTIONS.items():
        assert o.param in fields, f"options.Shared has no field {o.param} for {key}"
        if o.default is not ...:
            if key == "metric_optional":
                continue  # trt build's --metric: none unless given (eval, fine-tuning: top1)
            assert fields[o.param] == o.default, (key, fields[o.param], o.default)
    assert set(fields) == {o.param for o in options.OPTIONS.values()}


def test_groups_stack_with_pass_options_in_either_order():
    import typer
    from typer.testing import CliRunner


    def body(model: str = typer.Argument(...), *, config: dict, shared: options.Shared):
        print(sorted(config.items()), shared.eval_data, shared.threads, shared.as_json, shared.shape)

    orders = [flags.pass_options("simplify.onnx")(flags.groups("eval_data", "measure", "json")(body)),
              flags.groups("eval_data", "measure", "json")(flags.pass_options("simplify.onnx")(body))]
    helps = []
    for cmd in orders:
        app = typer.Typer()
        app.command("x")(cmd)
        app.command("y")(lambda: None)
        r = CliRunner().invoke(app, ["x", "m.onnx", "--eval-data", "e.npz", "--threads", "2", "--no-ort", "--json",
                                     "--shape", "a=1x2"])
        assert r.exit_code == 0, r.output
        assert r.output.strip() == "[('ort_optimize', False)] e.npz 2 True ['a=1x2']"
        helps.append(CliRunner().invoke(app, ["x", "--help"]).output)
    assert helps[0] == helps[1]
    text = helps[0]
    # sections: the pass's own, then evaluation (shared first), measurement, output
    assert text.index("--no-ort") < text.index("--eval-data") < text.index("--threads") < text.index("--json")


def test_groups_refuse_a_clash_and_a_missing_shared():
    import typer


    def clash(threads: int = typer.Option(1, "--n"), *, shared: options.Shared):
        pass

    def no_shared(model: str = typer.Argument(...)):
        pass

    with pytest.raises(TypeError, match="clash"):
        flags.groups("measure")(clash)
    with pytest.raises(TypeError, match="shared"):
        flags.groups("json")(no_shared)
    with pytest.raises(KeyError, match="no shared option group"):
        flags.groups("nonsense")
