"""Issue 39, class 3: the files one command writes for another (best.json, CAPACITY.json, split.json, a package's
lineage and version index) each have one contract (optkit/contracts), written by its writer and read through it,
tied to the model it describes: a reader refuses another model's file (exit 2, one line naming the file, the key and
both sha256 prefixes), through the real commands. Everything optkit writes is strict JSON (one writer,
core/strictjson.py); a flag is finite and bounded by its reader's bound when parsed (exit 2); a hand-edited NaN,
Infinity or value past its bound is exit 2 naming the key."""
from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import onnx
import pytest
from test_package import best_json

from optkit.contracts import base, best, capacity, index, lineage, split
from optkit.core import strictjson
from optkit.core.errors import PassError, UsageError

from conftest import ROOT, SAMPLES, one_error_line, run_cli

CNN = SAMPLES / "torch_cnn.onnx"
PREFIX = re.compile(r"[0-9a-f]{12}\.\.\.")


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(r, *words: str) -> str:
    """Exit 2, one line holding `words` and two sha256 prefixes."""
    line = one_error_line(r)
    assert r.rc == 2, r.err
    assert all(w in line for w in words) and len(PREFIX.findall(line)) == 2, line
    return line


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The CNN tuned (a real best.json), its CAPACITY.json, another model (the CNN with another producer name: other
    bytes, same graph), and two split folders of two models (the CNN behind two preprocessings)."""
    d = tmp_path_factory.mktemp("contracts")
    shutil.copyfile(CNN, d / "cnn.onnx")
    proto = onnx.load(str(CNN))
    proto.producer_name = "another"
    onnx.save(proto, str(d / "other.onnx"))
    r = run_cli("tune", "cnn.onnx", "--objective", "throughput", "--trials", "2", "--trial-seconds", "0.3",
                "--confirm", "1", "--slo", "p99<=50ms", "--space", "runtime=onnxruntime", "-o", "best.json", cwd=d)
    assert r.rc == 0, r.err
    r = run_cli("capacity", "best.json", "--peak", "100", "-o", "CAPACITY.json", cwd=d)
    assert r.rc == 0, r.err
    for name, resize in (("a", 8), ("b", 9)):
        spec = f"{{color: gray, resize: {resize}, center_crop: 8}}"
        r = run_cli("preprocess", "cnn.onnx", "-o", f"u8{name}.onnx", "--preprocess", spec, cwd=d)
        assert r.rc == 0, r.err
        r = run_cli("split", f"u8{name}.onnx", "-o", f"split{name}", cwd=d)
        assert r.rc == 0, r.err
    return d


@pytest.fixture
def work(made, tmp_path) -> Path:
    for p in made.iterdir():
        (shutil.copytree if p.is_dir() else shutil.copyfile)(p, tmp_path / p.name)
    return tmp_path


# ------------------------------------------------------------------ writer -> reader, one model each

def test_each_contract_round_trips_from_its_writer_to_its_reader(work):
    r = run_cli("package", "cnn.onnx", "--to", "triton", "-o", "repo", "--tuned", "best.json",
                "--manifests", "kserve", "--capacity", "CAPACITY.json", cwd=work, timeout=180)
    assert r.rc == 0, r.err
    cases = [(work / "best.json", best.BestFile, sha(work / "cnn.onnx"), "model_sha256"),
             (work / "CAPACITY.json", capacity.CapacityFile, sha(work / "cnn.onnx"), "model_sha256"),
             (work / "splita" / "split.json", split.SplitFile, sha(work / "u8a.onnx"), "model_sha256"),
             (work / "repo" / "cnn" / "1" / "optkit-package.json", lineage.Lineage, sha(work / "cnn.onnx"),
              "model.sha256"),
             (work / "repo" / "cnn" / "optkit-versions.json", index.VersionIndex, sha(work / "cnn.onnx"),
              "versions.0.model_sha256")]
    for path, model, model_sha, key in cases:
        raw = path.read_text()
        data, doc = base.load(path, model, "hint")
        assert base.text(doc) == raw, path          # the file is its model's serialization, byte for byte
        node = data
        for k in key.split("."):
            node = node[int(k)] if isinstance(node, list) else node[k]
        assert node == model_sha, (path, key)       # each records the model it describes
    assert json.loads((work / "splita" / "split.json").read_text())["schema"] == split.SCHEMA == 3
    assert json.loads((work / "CAPACITY.json").read_text())["schema"] == capacity.SCHEMA == 2


# ------------------------------------------------------------------ another model's file is refused

def test_package_refuses_another_models_capacity_and_tuned(work):
    before = files(work)
    r = run_cli("package", "other.onnx", "--to", "triton", "-o", "repo", "--manifests", "kserve", "--capacity",
                "CAPACITY.json", cwd=work, timeout=180)
    refused(r, "--capacity CAPACITY.json", "key model_sha256", "another model", "other.onnx")
    r = run_cli("package", "other.onnx", "--to", "triton", "-o", "repo", "--tuned", "best.json", cwd=work,
                timeout=180)
    refused(r, "--tuned best.json", "key model_sha256", "another model", "other.onnx")
    assert files(work) == before


def test_a_recipe_package_refuses_another_models_capacity(work):
    """A recipe's `package:` entry reads CAPACITY.json through the same check as the command."""
    import yaml

    rec = {"version": 1, "name": "c", "model": {"path": "other.onnx"}, "stages": [{"pass": "simplify.onnx"}],
           "measure": {"latency": False},
           "package": [{"to": "triton", "output": "repo", "manifests": "kserve", "capacity": "CAPACITY.json"}]}
    (work / "recipe.yaml").write_text(yaml.safe_dump(rec))
    r = run_cli("run", "recipe.yaml", "--workspace", "runs", cwd=work, timeout=300)
    refused(r, "--capacity", "CAPACITY.json", "key model_sha256")
    assert not (work / "repo").exists()


def test_a_split_folder_is_its_own_models(work):
    """split.json records the split model's sha256 and each part's: another split's split.json in the folder is
    refused naming the key and both sha256; the split model's own tune and capacity are taken for the parts, another
    model's are refused."""
    shutil.copyfile(work / "splitb" / "split.json", work / "splita" / "split.json")
    r = run_cli("package", "splita", "--to", "triton", "-o", "repo", cwd=work, timeout=180)
    refused(r, "split.json", "key parts.0.sha256")
    assert not (work / "repo").exists()
    source = work / "u8b.onnx"
    best_json(work / "source_best.json", source)
    r = run_cli("package", "splitb", "--to", "triton", "-o", "repo", "--tuned", "best.json", cwd=work, timeout=180)
    refused(r, "--tuned best.json", "key model_sha256", "another model")
    r = run_cli("package", "splitb", "--to", "triton", "-o", "repo", "--tuned", "source_best.json", "--shape",
                "image=1x16x16x1", cwd=work, timeout=180)
    assert r.rc == 0, r.err
    lin = json.loads((work / "repo" / "splitb" / "1" / "optkit-package.json").read_text())
    assert lin["tuned"]["label"] == "test setting" and lin["split"]["model_sha256"] == sha(source)
    # CAPACITY.json of the split model is taken for its parts; the CNN's is another model's
    r = run_cli("capacity", "source_best.json", "--peak", "100", "-o", "source_capacity.json", cwd=work)
    assert r.rc == 0, r.err
    for cap, rc in (("source_capacity.json", 0), ("CAPACITY.json", 2)):
        r = run_cli("package", "splitb", "--to", "triton", "-o", "repo", "--manifests", "kserve", "--capacity", cap,
                    "--shape", "image=1x16x16x1", cwd=work, timeout=180)
        if rc:
            refused(r, f"--capacity {cap}", "key model_sha256", "another model")
        else:
            assert r.rc == 0, r.err


def test_capacity_reads_a_lineage_only_in_the_version_folder_it_describes(work):
    r = run_cli("package", "cnn.onnx", "--to", "triton", "-o", "repo", "--tuned", "best.json", cwd=work)
    assert r.rc == 0, r.err
    r = run_cli("package", "other.onnx", "--to", "triton", "-o", "repo", "--name", "cnn", cwd=work)
    assert r.rc == 0, r.err
    v1, v2 = work / "repo" / "cnn" / "1", work / "repo" / "cnn" / "2"
    r = run_cli("capacity", v1, "--peak", "100", "-o", "c1.json", cwd=work)
    assert r.rc == 0, r.err
    assert json.loads((work / "c1.json").read_text())["model_sha256"] == sha(work / "cnn.onnx")
    # version 1's lineage in version 2's folder: another version's
    (v2 / "optkit-package.json").write_bytes((v1 / "optkit-package.json").read_bytes())
    r = run_cli("capacity", v2, "--peak", "100", "-o", "c2.json", cwd=work)
    assert r.rc == 2 and "key version: 1, not this folder's (2)" in one_error_line(r), r.err
    # version 1's folder with version 2's model file: the lineage describes another model than the one beside it
    shutil.copyfile(v2 / "model.onnx", v1 / "model.onnx")
    r = run_cli("capacity", v1, "--peak", "100", "-o", "c2.json", cwd=work)
    refused(r, "optkit-package.json", "key files.model.onnx", "another model's")
    # a lineage copied out of its folder describes files that are not there
    shutil.copyfile(v2 / "optkit-package.json", work / "lineage.json")
    r = run_cli("capacity", "lineage.json", "--peak", "100", "-o", "c2.json", cwd=work)
    assert r.rc == 2 and "give REPO/NAME/N" in one_error_line(r), r.err
    assert not (work / "c2.json").exists()


def test_serve_version_refuses_a_lineage_of_another_model_than_the_index_records(work):
    for model in ("cnn.onnx", "other.onnx"):
        r = run_cli("package", model, "--to", "triton", "-o", "repo", "--name", "cnn", cwd=work)
        assert r.rc == 0, r.err
    d = work / "repo" / "cnn"
    doc = json.loads((d / "optkit-versions.json").read_text())
    doc["versions"][0]["model_sha256"] = doc["versions"][1]["model_sha256"]
    (d / "optkit-versions.json").write_text(json.dumps(doc))
    before = files(work / "repo")
    r = run_cli("package", "serve-version", d, "--version", "1", cwd=work)
    refused(r, "optkit-package.json", "key model.sha256", "another model")
    assert files(work / "repo") == before


# ------------------------------------------------------------------ flags: finite, and bounded as their readers are

@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "-inf", "Infinity"])
def test_capacity_slo_p99_past_its_readers_bound_is_exit_2(work, value):
    r = run_cli("capacity", "best.json", "--peak", "100", "--slo-p99", value, "-o", "c.json", cwd=work)
    assert r.rc == 2 and "--slo-p99" in one_error_line(r), r.err
    assert not (work / "c.json").exists()


@pytest.mark.parametrize("args, said", [
    (("capacity", "best.json", "--peak", "inf", "-o", "c.json"), "--peak"),
    (("capacity", "best.json", "--peak", "100", "--headroom", "nan", "-o", "c.json"), "--headroom"),
    (("capacity", "best.json", "--peak", "100", "--tolerance", "inf", "-o", "c.json"), "--tolerance"),
    (("capacity", "best.json", "--peak", "100", "--tolerance", "1", "-o", "c.json"), "--tolerance"),  # reader: < 1
    (("capacity", "best.json", "--peak", "100", "--cpu", "nan", "-o", "c.json"), "--cpu"),
    (("capacity", "best.json", "--peak", "100", "--memory-mb", "inf", "-o", "c.json"), "--memory-mb"),
    (("package", "cnn.onnx", "--to", "triton", "-o", "c.json", "--memory-margin", "nan"), "--memory-margin"),
    (("package", "cnn.onnx", "--to", "triton", "-o", "c.json", "--memory-margin", "inf"), "--memory-margin"),
    (("tune", "cnn.onnx", "--slo", "p99<=1e300ms", "-o", "c.json"), "SLO 'p99<=1e300ms'"),
    (("tune", "cnn.onnx", "--slo", "throughput>=1e300", "-o", "c.json"), "SLO 'throughput>=1e300'"),
    (("quantize", "cnn.onnx", "-o", "c.json", "--max-latency-ratio", "inf", "--print-recipe"), "--max-latency-ratio"),
    (("quantize", "cnn.onnx", "-o", "c.json", "--max-fidelity-loss", "nan", "--print-recipe"), "--max-fidelity-loss"),
    (("simplify", "cnn.onnx", "-o", "c.json", "--tolerance", "inf", "--print-recipe"), "--tolerance"),
    (("simplify", "cnn.onnx", "-o", "c.json", "--max-growth", "1e300", "--print-recipe"), "--max-growth"),
], ids=lambda a: " ".join(a[:1] + a[-3:]) if isinstance(a, tuple) else "")
def test_a_non_finite_or_unbounded_flag_is_exit_2(work, args, said):
    r = run_cli(*args, cwd=work, timeout=120)
    assert r.rc == 2 and said in one_error_line(r), r.err
    assert not (work / "c.json").exists()


def test_a_recipes_non_finite_capacity_key_is_exit_2_before_any_stage(work):
    import yaml

    import optkit

    rec = {"version": 1, "name": "c", "model": {"path": "cnn.onnx"}, "stages": [{"pass": "simplify.onnx"}],
           "capacity": {"figures": "best.json", "peak": 100, "output": "c.json", "slo_p99_ms": float("inf")}}
    (work / "recipe.yaml").write_text(yaml.safe_dump(rec))
    r = run_cli("run", "recipe.yaml", "--workspace", "runs", cwd=work)
    assert r.rc == 2 and "slo_p99_ms" in one_error_line(r), r.err
    assert not (work / "c.json").exists() and not list(work.glob("runs/c/*/01-*"))   # no stage ran
    rec["capacity"]["slo_p99_ms"] = 1e300
    rec["model"]["path"] = str(work / "cnn.onnx")
    rec["capacity"].update(figures=str(work / "best.json"), output=str(work / "c.json"))
    with pytest.raises(UsageError, match="slo_p99_ms"):
        optkit.run(rec, workspace=work / "runs")
    assert not (work / "c.json").exists()


def _config_classes() -> dict[str, type]:
    from pydantic import BaseModel

    import optkit.pipeline.recipe as recipe
    from optkit.capacity.config import CapacityConfig
    from optkit.measure.model import DataSpec, MeasureSettings
    from optkit.measure.preprocess import Preprocess
    from optkit.measure.serving import Setting
    from optkit.onnx.session import OrtSettings
    from optkit.package.config import PackageConfig
    from optkit.package.target import get_target, target_names
    from optkit.passes import all_passes

    found = {f"pass {name}": cls.Config for name, cls in all_passes().items() if cls.__module__ != "_testpasses"}
    found.update({c.__name__: c for c in (PackageConfig, CapacityConfig, MeasureSettings, DataSpec,
                                          Preprocess, Setting, OrtSettings)})
    found.update({f"target {n}": get_target(n).Config for n in target_names()})  # a package target's own options
    found.update({f"recipe.{n}": c for n, c in vars(recipe).items() if isinstance(c, type)
                  and issubclass(c, BaseModel) and c.__module__ == recipe.__name__})
    return found


# A float that may be any finite number: a gate's threshold (the report that carries it takes any finite figure),
# and a detector's score threshold, bounded by the head it follows (passes/preprocess: W7) rather than a constant.
UNBOUNDED = {("recipe.GateSpec", "value"), ("recipe.GateSpec", "max"), ("recipe.GateSpec", "min"),
             ("pass preprocess.onnx", "score_threshold")}


def test_every_float_of_every_config_is_finite_and_bounded():
    """Every Config a flag or recipe key is read into (passes, package, capacity, measure settings, gates): NaN and
    infinity are refused, and so is 1e300 (a bound), but for the few named in UNBOUNDED."""
    loose = []
    for label, cls in sorted(_config_classes().items()):
        for key, field in cls.model_fields.items():
            if "float" not in repr(field.annotation):
                continue
            for value in (math.inf, -math.inf, math.nan) + (() if (label, key) in UNBOUNDED else (1e300,)):
                try:
                    cls.__pydantic_validator__.validate_assignment(cls.model_construct(), key, value)
                except (ValueError, UsageError):
                    continue
                loose.append(f"{label}.{key} takes {value}")
    assert loose == []


# ------------------------------------------------------------------ a hand-edited file: exit 2 naming the key

def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))          # Python writes NaN and Infinity as JSON's non-standard literals


# (file, a key holding a figure, the command reading the file)
EDITED = [
    ("best.json", "best.figures.p99_ms", ("package", "cnn.onnx", "--to", "triton", "-o", "out", "--tuned",
                                          "best.json")),
    ("CAPACITY.json", "slo.p99_ms", ("package", "cnn.onnx", "--to", "triton", "-o", "out", "--manifests", "kserve",
                                     "--capacity", "CAPACITY.json")),
    ("splita/split.json", "cuts.0.bytes_per_sample", ("package", "splita", "--to", "triton", "-o", "out")),
    ("repo/cnn/1/optkit-package.json", "tuned.figures.p99_ms", ("capacity", "repo/cnn/1", "--peak", "100", "-o",
                                                                "out")),
    ("repo/cnn/optkit-versions.json", "versions.0.version", ("package", "inspect", "repo")),
]


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e300], ids=["nan", "inf", "past-the-bound"])
def test_a_hand_edited_contract_file_is_exit_2_naming_the_key(work, value):
    r = run_cli("package", "cnn.onnx", "--to", "triton", "-o", "repo", "--tuned", "best.json", cwd=work)
    assert r.rc == 0, r.err
    for name, key, command in EDITED:
        path = work / name
        saved = path.read_bytes()
        doc = json.loads(saved)
        *parents, last = key.split(".")
        node = doc
        for k in parents:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[last] = value
        path.write_text(json.dumps(doc))      # Python writes NaN and Infinity as JSON's non-standard literals
        r = run_cli(*command, cwd=work, timeout=180)
        line = one_error_line(r)
        assert r.rc == 2 and f"{Path(name).name}: key {key}:" in line, (name, r.err)
        if not math.isfinite(value):
            assert f"{value} is not a finite number (optkit writes strict JSON)" in line, line
        assert not (work / "out").exists()
        path.write_bytes(saved)


# ------------------------------------------------------------------ the one strict writer

def test_the_strict_writer_refuses_nan_and_infinity_naming_the_key():
    import numpy as np

    assert json.loads(strictjson.dumps({"a": [1.5, np.float32(2.0)], "p": Path("x")})) == {"a": [1.5, 2.0], "p": "x"}
    for bad, key in (({"a": {"b": [1.0, math.nan]}}, "a.b.1"), ({"x": np.float32("inf")}, "x"),
                     ([math.inf], "0")):
        with pytest.raises(PassError) as e:
            strictjson.dumps(bad)
        assert e.value.exit_code == 3 and f"at key {key}:" in e.value.message, e.value.message
    # a report's figures: not finite is null (report/figures.py reads null as unbounded), and only with nulls=True
    assert json.loads(strictjson.dumps({"max_abs_error": math.inf}, nulls=True)) == {"max_abs_error": None}


def test_a_document_its_reader_would_refuse_is_never_written():
    """The writer builds the document through its contract: a computed figure past a reader's bound is exit 3."""
    doc = json.loads(json.dumps({"schema": 2, "model": "m.onnx", "model_sha256": "0" * 64, "per_replica": {
        "throughput_per_s": 10.0, "throughput_source": "t", "source": "s"}, "headroom": 0.2,
        "replicas": {"min": 1, "max": 2, "peak": 1},
        "resources": {"requests": {"memory": "34Mi"}, "limits": {"memory": "14Mi"}},
        "autoscaling": {"metric": "rps", "target_utilization": 0.5, "target_rps_per_replica": 5.0,
                        "scale_down_stabilization_s": 300, "scale_up_stabilization_s": 0, "startup_s": 60}}))
    with pytest.raises(PassError, match="optkit computed a CAPACITY.json its readers would refuse"):
        base.build(capacity.CapacityFile, doc, "CAPACITY.json")
    doc["resources"]["limits"]["memory"] = "64Mi"
    base.build(capacity.CapacityFile, doc, "CAPACITY.json")
    # figures of a served model (bench --url) have no file: null only with the model's URL
    doc["model_sha256"] = None
    with pytest.raises(PassError, match="key model_sha256: null"):
        base.build(capacity.CapacityFile, doc, "CAPACITY.json")
    doc["model"] = "http://127.0.0.1:8000/v2/models/m"
    base.build(capacity.CapacityFile, doc, "CAPACITY.json")


def test_capacity_with_a_headroom_over_100_percent_writes_limits_at_least_its_requests(work):
    """--headroom 4 (its bound) sized the memory request 5x the peak and the limit 2x: a CAPACITY.json that
    package (and Kubernetes) refused. The limit is now never below the request."""
    r = run_cli("capacity", "best.json", "--peak", "100", "--headroom", "4", "-o", "c.json", cwd=work)
    assert r.rc == 0, r.err
    res = json.loads((work / "c.json").read_text())["resources"]
    assert int(res["limits"]["memory"][:-2]) >= int(res["requests"]["memory"][:-2])


# JSON is written by core/strictjson.py only. triton_check.py runs alone in a tool folder's Python (it imports
# nothing of optkit) and writes with allow_nan=False.
WRITERS_ALLOWED = {"optkit/core/strictjson.py", "optkit/package/targets/triton_check.py"}
WRITES_JSON = re.compile(r"\bjson\.dumps?\(|\.model_dump_json\(|\bdumps\(.*allow_nan=True")


def test_no_module_writes_json_but_through_the_strict_writer():
    found = sorted(f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "optkit").rglob("*.py")
                   for i, line in enumerate(p.read_text().splitlines(), 1)
                   if WRITES_JSON.search(line) and str(p.relative_to(ROOT)) not in WRITERS_ALLOWED)
    assert found == [], f"JSON written past core/strictjson.py: {found}"
    checker = (ROOT / "optkit/package/targets/triton_check.py").read_text()
    assert "allow_nan=False" in checker and "from optkit" not in checker and "import optkit" not in checker
