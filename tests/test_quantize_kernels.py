"""quantize's kernel table (optkit/passes/quantize/kernels.py): measured once per onnxruntime version and CPU, cached
under $OPTKIT_CACHE_DIR (a folder of each test's own here), re-measured when the key changes or the file is bad,
and the settings it says cannot win skipped (and recorded) unless full_search asks for them. Decisions are tested
on injected tables: which kernel is faster on this machine is never asserted."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from optkit.passes.quantize import kernels, skip
from optkit.passes.quantize.config import QuantizeConfig
from optkit.passes.quantize.engine import Dynamic, Static


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("OPTKIT_CACHE_DIR", str(d))
    return d


def _ratios(**over) -> dict:
    """A table: every class and variant at 1.0 but those given as {class: {variant: ratio}}."""
    table = {c: {v: 1.0 for v in kernels.variants_of(c)} for c in kernels.CLASSES}
    for cls, row in over.items():
        table[cls].update(row)
    return table


class Counting:
    def __init__(self, ratios=None):
        self.calls, self.ratios = 0, ratios or _ratios()

    def __call__(self):
        self.calls += 1
        return self.ratios


# ------------------------------------------------------------------ the real micro-benchmark, its structure only

def test_the_real_table_is_measured_once_then_read_back(cache):
    first = kernels.load_table()
    assert not first.cached and first.path.parent == cache and first.path.is_file()
    assert set(first.ratios) == set(kernels.CLASSES)
    for cls, row in first.ratios.items():
        assert set(row) == set(kernels.variants_of(cls)) and set(kernels.VARIANTS) <= set(row)
        assert all(math.isfinite(r) and kernels.RATIO_BOUNDS[0] <= r <= kernels.RATIO_BOUNDS[1] for r in row.values())
    doc = json.loads(first.path.read_text())
    assert doc["schema"] == kernels.SCHEMA and doc["key"] == kernels.table_key()
    assert set(doc["key"]) == {"onnxruntime", "cpu", "schema"} and {"model", "arch", "flags"} <= set(doc["key"]["cpu"])
    mtime = first.path.stat().st_mtime_ns
    never = Counting()
    again = kernels.load_table(never)
    assert again.cached and never.calls == 0 and again.ratios == first.ratios
    assert first.path.stat().st_mtime_ns == mtime
    assert [p.name for p in cache.iterdir()] == [first.path.name]  # no temporary file left


def test_the_cache_folder_follows_xdg_when_optkit_cache_dir_is_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("OPTKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    counting = Counting()
    table = kernels.load_table(counting)
    assert table.path.parent == tmp_path / "xdg" / "optkit" and table.path.is_file() and counting.calls == 1


# ------------------------------------------------------------------ the key and a bad cache file: measured again

def test_a_changed_onnxruntime_version_or_cpu_measures_again(cache, monkeypatch):
    key = kernels.table_key()
    counting = Counting()
    kernels.load_table(counting)
    kernels.load_table(counting)
    assert counting.calls == 1
    for changed in ({**key, "onnxruntime": "0.0.1"},
                    {**key, "cpu": {**key["cpu"], "flags": [*key["cpu"]["flags"], "amx_new"]}},
                    {**key, "cpu": {**key["cpu"], "model": "another CPU"}}):
        monkeypatch.setattr(kernels, "table_key", lambda changed=changed: changed)
        before = counting.calls
        assert not kernels.load_table(counting).cached and counting.calls == before + 1
        assert kernels.load_table(counting).cached and counting.calls == before + 1


def test_a_file_of_another_key_at_the_same_path_is_not_trusted(cache):
    key = kernels.table_key()
    path = kernels.cache_path(key)
    kernels.write_cached(path, {**key, "onnxruntime": "9.9"}, _ratios())
    counting = Counting()
    assert not kernels.load_table(counting).cached and counting.calls == 1


def _hostile_docs(key) -> dict[str, str]:
    good = {"schema": kernels.SCHEMA, "key": key, "created": 0, "ratios": _ratios()}

    def doc(**over):
        return json.dumps({**good, **over})

    def ratio(value):
        return json.dumps({**good, "ratios": _ratios(conv3x3_small={"dynamic": value})})

    missing = _ratios()
    del missing["gemv"]
    return {
        "not json": "{not json",
        "binary": "\x00\xff\xfe",
        "empty": "",
        "a list": "[1, 2, 3]",
        "another schema": doc(schema=kernels.SCHEMA + 1),
        "no key": doc(key=None),
        "ratios a string": doc(ratios="fast"),
        "a class missing": doc(ratios=missing),
        "an unknown class": doc(ratios={**_ratios(), "evil": {v: 1.0 for v in kernels.VARIANTS}}),
        "a variant missing": doc(ratios={**_ratios(), "gemv": {"dynamic": 1.0}}),
        "NaN": ratio(float("nan")),
        "Infinity": ratio(float("inf")),
        "huge": ratio(1e308),
        "huge int": json.dumps(good).replace('"dynamic": 1.0', '"dynamic": ' + "9" * 5000, 1),
        "zero": ratio(0.0),
        "negative": ratio(-1.0),
        "a string ratio": ratio("1.0"),
        "a bool ratio": ratio(True),
        "a null ratio": ratio(None),
        "a list ratio": ratio([1.0]),
        "deep": "[" * 100000 + "]" * 100000,
        "too large": json.dumps({**good, "pad": "x" * (kernels.MAX_BYTES + 10)}),
    }


@pytest.mark.parametrize("name", list(_hostile_docs({"k": 1})))
def test_a_corrupt_or_hostile_cache_file_is_measured_again_never_trusted(cache, name):
    key = kernels.table_key()
    path = kernels.cache_path(key)
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(_hostile_docs(key)[name], encoding="utf-8", errors="surrogateescape")
    counting = Counting(_ratios(gemv={"dynamic": 0.5}))
    table = kernels.load_table(counting)
    assert not table.cached and counting.calls == 1 and table.ratios["gemv"]["dynamic"] == 0.5
    assert kernels.read_cached(path, key) == counting.ratios  # rewritten whole
    assert kernels.load_table(counting).cached and counting.calls == 1


def test_a_symlinked_cache_file_is_not_followed_nor_written_through(cache, tmp_path):
    key = kernels.table_key()
    path = kernels.cache_path(key)
    cache.mkdir(parents=True)
    target = tmp_path / "elsewhere.json"
    kernels.write_cached(target, key, _ratios(gemv={"dynamic": 0.01}))  # a valid table, but not ours
    before = target.read_bytes()
    os.symlink(target, path)
    counting = Counting()
    table = kernels.load_table(counting)
    assert not table.cached and counting.calls == 1 and table.ratios["gemv"]["dynamic"] == 1.0
    assert target.read_bytes() == before  # the link's target untouched
    assert path.is_file() and not path.is_symlink()  # the link replaced by our own file


@pytest.mark.parametrize("what", ["folder", "fifo", "unwritable"])
def test_a_cache_path_that_cannot_be_read_or_written_never_crashes(cache, what):
    key = kernels.table_key()
    path = kernels.cache_path(key)
    cache.mkdir(parents=True)
    if what == "folder":
        path.mkdir()
    elif what == "fifo":
        os.mkfifo(path)
    else:
        cache.chmod(0o500)
    try:
        counting = Counting()
        table = kernels.load_table(counting)
        assert not table.cached and counting.calls == 1 and table.ratios == counting.ratios
    finally:
        cache.chmod(0o700)


# ------------------------------------------------------------------ the decisions, on injected tables

def _model(tmp_path: Path, convs=2, matmul=True, depthwise=False):
    """x [1, 16, 8, 8] -> Conv (16 -> 16, 3x3) x convs [-> depthwise Conv] -> flatten -> MatMul [1024 -> 10]."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(convs):
        inits.append(numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        prev = f"c{i}"
    if depthwise:
        inits.append(numpy_helper.from_array(rng.standard_normal((16, 1, 3, 3)).astype(np.float32), "wd"))
        nodes.append(helper.make_node("Conv", [prev, "wd"], ["cd"], name="dw", pads=[1, 1, 1, 1], group=16))
        prev = "cd"
    out = prev
    if matmul:
        inits.append(numpy_helper.from_array(np.array([1, 1024], np.int64), "shape"))
        inits.append(numpy_helper.from_array(rng.standard_normal((1024, 10)).astype(np.float32), "wm"))
        nodes += [helper.make_node("Reshape", [prev, "shape"], ["flat"], name="flatten"),
                  helper.make_node("MatMul", ["flat", "wm"], ["y"], name="fc")]
        out = "y"
    shape = [1, 10] if matmul else [1, 16, 8, 8]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _dynamic_space(tmp_path, present=("Conv", "MatMul")):
    strategy = Dynamic(QuantizeConfig(mode="dynamic"), tmp_path)
    strategy.present = set(present)
    return strategy.space()


def test_dynamic_skips_the_conv_tier_where_convinteger_loses(tmp_path):
    space = _dynamic_space(tmp_path)
    slow = _ratios(conv3x3_small={"dynamic": 4.0})
    keep, skipped = skip.prune("dynamic", space, _model(tmp_path), slow)
    assert keep and all("Conv" not in s.op_types for s in keep)
    assert {s for s, _ in skipped} == {s for s in space if "Conv" in s.op_types}
    assert all("ConvInteger runs 4.00x" in why and "kernel table" in why for _, why in skipped)
    # where ConvInteger does not lose, or nothing else would be left, nothing is skipped
    assert skip.prune("dynamic", space, _model(tmp_path), _ratios(conv3x3_small={"dynamic": 0.8}))[1] == []
    conv_only = _dynamic_space(tmp_path, present=("Conv",))
    assert skip.prune("dynamic", conv_only, _model(tmp_path, matmul=False), slow) == (conv_only, [])


def test_reduce_range_is_skipped_only_where_dot_products_do_not_saturate(tmp_path):
    space = _dynamic_space(tmp_path, present=("MatMul",))
    assert skip.prune("dynamic", space, _model(tmp_path), _ratios(), flags=["avx2"])[1] == []
    keep, skipped = skip.prune("dynamic", space, _model(tmp_path), _ratios(), flags=["avx2", "avx512_vnni"])
    assert keep == [s for s in space if not s.reduce_range] and all(s.reduce_range for s, _ in skipped)
    assert "avx512_vnni" in skipped[0][1]
    only_rr = Dynamic(QuantizeConfig(mode="dynamic", reduce_range=True), tmp_path)
    only_rr.present = {"MatMul"}
    assert skip.prune("dynamic", only_rr.space(), _model(tmp_path), _ratios(), flags=["amx_int8"])[1] == []


def test_static_skips_the_format_and_activation_type_that_lose(tmp_path):
    space = Static(QuantizeConfig(mode="static"), tmp_path).space()
    slow = _ratios(**{c: {"qop_s8": 6.0, "qdq_u8": 0.5, "qdq_s8": 0.5, "qop_u8": 0.5}
                      for c in ("conv3x3_small", "gemv")})
    keep, skipped = skip.prune("static", space, _model(tmp_path), slow)
    why = {(s.format, s.activation_type): w for s, w in skipped}
    assert set(why) == {("qoperator", "int8"), ("qoperator", "uint8")}
    assert {(s.format, s.activation_type) for s in keep} == {("qdq", "uint8"), ("qdq", "int8")}
    assert "QOp s8 kernels run" in why["qoperator", "int8"] and "kernel table" in why["qoperator", "int8"]
    assert "the same numbers as QDQ u8" in why["qoperator", "uint8"]  # a format twin, not clearly faster
    # a QOperator twin clearly faster: the QDQ one is skipped instead
    fast_qop = _ratios(**{c: {"qop_u8": 0.3, "qdq_u8": 0.5, "qdq_s8": 0.3, "qop_s8": 6.0}
                          for c in ("conv3x3_small", "gemv")})
    skipped = skip.prune("static", space, _model(tmp_path), fast_qop)[1]
    assert {(s.format, s.activation_type) for s, _ in skipped} == {("qoperator", "int8"), ("qdq", "uint8")}
    # a format the user fixed is never compared with another
    assert skip.prune("static", Static(QuantizeConfig(mode="static", format="qdq"), tmp_path).space(),
                         _model(tmp_path), _ratios())[1] == []
    one = Static(QuantizeConfig(mode="static", format="qoperator", activation_type="int8"), tmp_path).space()
    assert skip.prune("static", one, _model(tmp_path), slow)[1] == []


def test_keeping_small_convs_float_is_skipped_only_where_their_int8_kernels_win(tmp_path):
    model = _model(tmp_path, depthwise=True)
    setting = Static(QuantizeConfig(mode="static"), tmp_path).space()[0]
    why = skip.slow_convs_lose(model, ["dw"], setting, _ratios(dwconv_small={"qdq_u8": 0.5}))
    assert why and "0.50x float" in why
    assert skip.slow_convs_lose(model, ["dw"], setting, _ratios(dwconv_small={"qdq_u8": 1.3})) is None
    # a MobileNet block with its depthwise convs float clearly slower than all-int8: the variant cannot win either
    block = _ratios(dwconv_small={"qdq_u8": 1.3}, mbconv={"qdq_u8": 0.8, "qdq_u8_dwfloat": 1.2})
    assert "1.50x the time of the all-int8 block" in skip.slow_convs_lose(model, ["dw"], setting, block)
    block = _ratios(dwconv_small={"qdq_u8": 1.3}, mbconv={"qdq_u8": 0.8, "qdq_u8_dwfloat": 0.6})
    assert skip.slow_convs_lose(model, ["dw"], setting, block) is None


def test_layer_classes_name_the_shape_classes(tmp_path):
    layers = skip.layer_classes(_model(tmp_path, depthwise=True))
    assert [(n, c) for n, c, _ in layers["Conv"]] == [("conv0", "conv3x3_small"), ("conv1", "conv3x3_small"),
                                                       ("dw", "dwconv_small")]
    assert [(n, c) for n, c, _ in layers["MatMul"]] == [("fc", "gemv")]  # one row a call


# ------------------------------------------------------------------ the search: skipped, recorded, forced

def _write_table(ratios) -> None:
    key = kernels.table_key()
    assert kernels.write_cached(kernels.cache_path(key), key, ratios)


def _quantize(cli, tmp_path, model, *extra):
    out = tmp_path / "q.onnx"
    r = cli("quantize", model, "-o", out, "--mode", "dynamic", "--allow-slower", "--json", "-v", *extra)
    assert r.rc == 0, r.err[-2000:]
    rep = json.loads(r.out)
    return rep["stages"][1]["measurements"]["quantize"], r.err


def test_the_search_skips_what_the_table_says_cannot_win_and_full_search_builds_it(cli, cache, tmp_path):
    from optkit.onnx import io as onnx_io

    model = tmp_path / "m.onnx"
    onnx_io.save(_model(tmp_path, convs=3), model)
    _write_table(_ratios(conv3x3_small={"dynamic": 5.0}))
    q, err = _quantize(cli, tmp_path, model, "--per-channel", "--no-reduce-range")
    assert [c["op_types"] for c in q["candidates"]] == [["MatMul"]]  # the Conv tier was not built
    skipped = [s for s in q["settings"]["skipped"] if s["rule"] == "kernels"]
    assert len(skipped) == 1 and "ConvInteger runs 5.00x" in skipped[0]["why"]
    assert q["settings"]["kernel_table"]["cached"] is True and "kernels" in q["phases_s"]
    assert "kernel table" in err and "(cached)" in err and "1 skipped" in err
    q, _ = _quantize(cli, tmp_path, model, "--per-channel", "--no-reduce-range", "--full-search")
    assert sorted(map(sorted, (c["op_types"] for c in q["candidates"]))) == [["Conv", "MatMul"], ["MatMul"]]
    assert "skipped" not in q["settings"] and "kernel_table" not in q["settings"]


def test_only_skips_that_might_meet_the_budget_are_retried(tmp_path):
    from optkit.passes.quantize.candidates import Candidate

    space = Static(QuantizeConfig(mode="static"), tmp_path).space()
    tried = [Candidate(index=i, settings=s, path=tmp_path / f"c{i}.onnx", fidelity={"loss": 1.0})
             for i, s in enumerate(space) if s.format == "qdq" and s.activation_type == "uint8" and not s.reduce_range]
    held = [s for s in space if s not in {c.settings for c in tried}]
    retry = skip.worth_retrying(held, tried)
    # QOp u8 without reduce-range (the same numbers as the tried QDQ u8) is not retried; reduce-range ones are
    assert all(s.reduce_range for s in retry if s.activation_type == "uint8")
    assert {(s.format, s.activation_type, bool(s.reduce_range)) for s in retry} == {
        (f, a, rr) for f in ("qdq", "qoperator") for a in ("uint8", "int8") for rr in (False, True)} - {
        ("qdq", "uint8", False), ("qoperator", "uint8", False)}


# ------------------------------------------------------------------ where the cache folder is: never the cwd or /

@pytest.mark.parametrize("env", [{"XDG_CACHE_HOME": "relative-xdg"}, {"HOME": ""}, {"HOME": "relative-home"},
                                 {"HOME": "/"}])
def test_a_relative_or_empty_cache_location_is_never_the_cwd_nor_the_root(tmp_path, monkeypatch, env):
    from optkit.core.cachedir import NoCacheDir, cache_dir

    monkeypatch.delenv("OPTKIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    try:
        where = cache_dir()
    except NoCacheDir:
        return
    assert where.is_absolute() and work not in where.parents and where != Path("/.cache/optkit")


def test_a_relative_xdg_cache_home_is_ignored_and_nothing_lands_in_the_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("OPTKIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-xdg")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    table = kernels.load_table(Counting())
    assert table.path.parent == tmp_path / "home" / ".cache" / "optkit" and table.path.is_file()
    assert list(work.iterdir()) == []


def test_no_home_at_all_measures_without_caching(tmp_path, monkeypatch):
    from optkit.core import cachedir

    monkeypatch.delenv("OPTKIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "relative")
    monkeypatch.setattr(cachedir, "_home", lambda: None)  # no passwd entry either (a uid of a bare container)
    monkeypatch.chdir(tmp_path)
    counting = Counting()
    table = kernels.load_table(counting)
    assert not table.cached and table.path is None and counting.calls == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("what", ["fifo", "socket"])
def test_a_special_file_at_the_cache_path_is_left_as_it_is(cache, what, monkeypatch):
    import socket

    key = kernels.table_key()
    path = kernels.cache_path(key)
    cache.mkdir(parents=True)
    if what == "fifo":
        os.mkfifo(path)
    else:
        s = socket.socket(socket.AF_UNIX)
        monkeypatch.chdir(cache)   # bound by its name: a CI runner's tmp_path is past AF_UNIX's 108 bytes
        s.bind(path.name)
    counting = Counting()
    table = kernels.load_table(counting)
    assert not table.cached and counting.calls == 1 and table.ratios == counting.ratios
    import stat as st

    mode = os.lstat(path).st_mode
    assert (st.S_ISFIFO(mode) if what == "fifo" else st.S_ISSOCK(mode))  # not replaced by our file
    assert [p.name for p in cache.iterdir()] == [path.name]  # and no temporary file left


def test_a_table_read_back_names_its_file_at_verbose(cache, caplog):
    counting = Counting()
    kernels.load_table(counting)
    with caplog.at_level("INFO", logger="optkit.passes.quantize.search"):
        table = kernels.load_table(counting)
    assert table.cached and str(table.path) in caplog.text and "read from" in caplog.text
