"""This CPU's int8 kernels against float, per op type and shape class, learnt once per machine and cached (what the
table says of a model's settings: skip.py).

The table: tiny ONNX graphs (two Conv or MatMul layers of one shape class each) built with onnx.helper, quantized
by onnxruntime's own quantizers the way the search builds candidates (dynamic; static QDQ and QOperator with uint8
and int8 activations), each timed against its float graph on one thread, call by call, interleaved; a ratio per
class and variant (time / float time, below 1: int8 is faster). A few seconds, once: the table is kept in the
per-user cache folder (core.cachedir: $OPTKIT_CACHE_DIR, else $XDG_CACHE_HOME/optkit, else ~/.cache/optkit) as
kernels-<key>.json, keyed by the onnxruntime version and the CPU (model name, architecture, the ISA flags the
int8 kernels choose by). A file read back is input: one that is not the user's own and private (core.cachedir:
owned by another user, writable by group or others), not a regular file, too large, of another schema or key, or
with a value outside its bounds (NaN, huge, wrong type) is ignored and measured again; a cache folder that is not
the user's own and private is not written (the table is used for that run only), and the folder made is 0700.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import stat
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core import strictjson
from optkit.core.cachedir import NoCacheDir, cache_dir, private_folder, trusted
from optkit.onnx import session as onnx_session

log = logging.getLogger("optkit.passes.quantize.search")

SCHEMA = 2
MAX_BYTES = 64 * 1024            # a table is about 2 kB; anything larger is not ours
RATIO_BOUNDS = (1e-3, 1e3)       # a ratio outside these is not a measurement
FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16", "amx_tile", "asimd",
         "asimddp", "i8mm", "sve")   # what onnxruntime's int8 kernels (MLAS) dispatch on

# shape classes: (kind, in channels, out channels, kernel, group, spatial) for Conv; (kind, rows, k, n) for MatMul
CLASSES: dict[str, tuple] = {
    "conv3x3_small": ("conv", 32, 32, 3, 1, 28),
    "conv3x3_large": ("conv", 128, 128, 3, 1, 14),
    "conv1x1_small": ("conv", 48, 48, 1, 1, 28),
    "conv1x1_large": ("conv", 256, 256, 1, 1, 14),
    "dwconv_small": ("conv", 96, 96, 3, 96, 28),
    "dwconv_large": ("conv", 384, 384, 3, 384, 14),
    "conv_stem": ("conv", 3, 32, 3, 1, 56),
    "matmul_small": ("matmul", 32, 128, 128),
    "matmul_large": ("matmul", 32, 512, 512),
    "gemv": ("matmul", 1, 512, 512),
    # a MobileNet block (1x1 expand, depthwise 3x3, 1x1 project) x2, also timed with its depthwise convs kept float
    "mbconv": ("mbconv", 32, 96, 28),
}
VARIANTS = ("dynamic", "qdq_u8", "qdq_s8", "qop_u8", "qop_s8")  # each against "float"
STATIC = VARIANTS[1:]
EXTRA = {"mbconv": tuple(f"{v}_dwfloat" for v in STATIC)}    # the block with its depthwise convs float


def variants_of(cls: str) -> tuple[str, ...]:
    return VARIANTS + EXTRA.get(cls, ())
ROUNDS, ROUND_LIMIT_S = 30, 0.5   # interleaved calls per class at most, and seconds per class


@dataclass
class Table:
    ratios: dict[str, dict[str, float]]      # class -> variant -> time / float time
    key: dict[str, Any] = field(default_factory=dict)
    cached: bool = False                     # read from the cache (else measured now)
    seconds: float = 0.0                     # spent measuring or reading it
    path: Path | None = None

    def ratio(self, cls: str, variant: str) -> float | None:
        return self.ratios.get(cls, {}).get(variant)


# ------------------------------------------------------------ the key and the cache file
def cpu_identity() -> dict[str, Any]:
    """The CPU as the int8 kernels see it: model name, architecture, the ISA flags they dispatch on."""
    name, flags = "", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "CPU part") and not name:
                name = v.strip()
            elif k in ("flags", "Features") and not flags:
                flags = set(v.split())
    name = name or platform.processor()
    return {"model": name[:200], "arch": platform.machine(), "flags": sorted(f for f in FLAGS if f in flags)}


def table_key() -> dict[str, Any]:
    import onnxruntime

    return {"onnxruntime": onnxruntime.__version__, "cpu": cpu_identity(), "schema": SCHEMA}


def cache_path(key: dict[str, Any]) -> Path:
    digest = sha256(strictjson.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"kernels-{digest}.json"


def read_cached(path: Path, key: dict[str, Any]) -> dict[str, dict[str, float]] | None:
    """The ratios of a cache file, or None (and why, at -v) when it is missing, not a regular file, too large, not
    JSON, of another key or schema, or holds anything but known classes and variants with finite ratios in
    RATIO_BOUNDS."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None  # missing, or a symbolic link (O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return _bad(path, "not a regular file of at most 64 kB")
        if not trusted(path, "kernel table", st):  # a table decides which settings are built: only the user's own
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _bad(path, "not JSON")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("key") != key:
        return _bad(path, "another schema or key")
    ratios = doc.get("ratios")
    if not isinstance(ratios, dict) or set(ratios) != set(CLASSES):
        return _bad(path, "classes missing or unknown")
    for cls, row in ratios.items():
        if not isinstance(row, dict) or set(row) != set(variants_of(cls)):
            return _bad(path, f"{cls}: variants missing or unknown")
        for v in row.values():
            if type(v) not in (int, float) or not math.isfinite(v) or not RATIO_BOUNDS[0] <= v <= RATIO_BOUNDS[1]:
                return _bad(path, f"{cls}: a ratio out of bounds")
    return {cls: {v: float(r) for v, r in row.items()} for cls, row in ratios.items()}


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a ratio")


def _bad(path: Path, why: str) -> None:
    log.info("kernel table %s ignored (%s); measuring again", path, why)
    return None


def write_cached(path: Path, key: dict[str, Any], ratios: dict[str, dict[str, float]]) -> bool:
    """Write the table atomically (a temporary file renamed over the old one, a link replaced, never followed);
    False when the cache folder cannot be written (the table is then used for this run only)."""
    doc = {"schema": SCHEMA, "key": key, "created": time.time(), "ratios": ratios}
    try:
        private_folder(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)  # 0600, whatever the umask
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(strictjson.dumps(doc, indent=1, sort_keys=True))
            with contextlib.suppress(FileNotFoundError):  # only our own file or a link is replaced, never a
                mode = os.lstat(path).st_mode                 # folder, FIFO, socket or device at the cache path
                if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                    raise OSError(f"{path} is not a regular file; left as it is")
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except OSError as e:
        log.info("kernel table not cached (%s)", e)
        return False
    return True


def load_table(measure=None) -> Table:
    """The cached table for this onnxruntime and CPU, else measured now (`measure`: () -> ratios, for tests) and
    cached."""
    start = time.perf_counter()
    key = table_key()
    try:
        path: Path | None = cache_path(key)
    except NoCacheDir as e:
        log.info("kernel table not cached (%s)", e)
        path = None
    ratios = read_cached(path, key) if path is not None else None
    cached = ratios is not None
    if ratios is None:
        ratios = (measure or measure_ratios)()
        if path is not None and write_cached(path, key, ratios):
            log.info("kernel table measured and cached in %s", path)
    else:  # said at -v: a table read back decides which settings are built (delete the file to measure again)
        log.info("kernel table read from %s (delete it to measure again)", path)
    return Table(ratios, key, cached, time.perf_counter() - start, path)


# ------------------------------------------------------------ the micro-benchmarks
def measure_ratios(classes: dict[str, tuple] | None = None) -> dict[str, dict[str, float]]:
    """Every class's graphs, float and quantized (VARIANTS), timed interleaved on one thread: median time /
    median float time."""
    classes = classes or CLASSES
    with tempfile.TemporaryDirectory(prefix="optkit-kernels-") as tmp:
        work = Path(tmp)
        models = {"float": work / "float.onnx", "extra": work / "extra.onnx"}
        extra = {c: classes[c] for c in EXTRA if c in classes}  # the classes timed with some layers float
        _save(_float_graph(classes), models["float"])
        _save(_float_graph(extra), models["extra"])
        for variant in VARIANTS:
            models[variant] = work / f"{variant}.onnx"
            _quantize(models["float"], models[variant], variant, classes)
        for variant in dict.fromkeys(v for c in extra for v in EXTRA[c]):
            models[variant] = work / f"{variant}.onnx"
            _quantize(models["extra"], models[variant], variant.removesuffix("_dwfloat"), extra,
                      [f"dw{b}_{c}" for c in extra for b in range(2)])
        loaded = {v: _load(p) for v, p in models.items()}
        out = {}
        for cls in classes:
            sessions = {v: onnx_session.ort_session(_branch(loaded[v], cls).SerializeToString(), threads=1)
                        for v in ("float", *variants_of(cls))}
            out[cls] = _time_class(sessions, _feed(classes[cls]))
    return out


def _time_class(sessions: dict, feed: dict) -> dict[str, float]:
    times: dict[str, list[float]] = {v: [] for v in sessions}
    order = list(sessions)
    for s in sessions.values():
        s.run(None, feed)
    start = time.perf_counter()
    for r in range(ROUNDS):
        for v in order[r % len(order):] + order[:r % len(order)]:
            t = time.perf_counter()
            sessions[v].run(None, feed)
            times[v].append(time.perf_counter() - t)
        if r >= 4 and time.perf_counter() - start > ROUND_LIMIT_S:
            break
    base = statistics.median(times["float"])
    return {v: round(min(max(statistics.median(times[v]) / base, RATIO_BOUNDS[0]), RATIO_BOUNDS[1]), 4)
            for v in sessions if v != "float"}


def _float_graph(classes: dict[str, tuple]):
    """One graph holding every class as its own branch (input x_<class>, output y_<class>): quantized once per
    variant, then cut into one graph per class (`_branch`)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inputs, outputs, inits = [], [], [], []
    for cls, spec in classes.items():
        x, y = f"x_{cls}", f"y_{cls}"
        if spec[0] == "conv":
            _, cin, cout, k, group, hw = spec
            stride = 2 if cin <= 4 else 1
            layers = 1 if cin != cout else 2
            inputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, cin, hw, hw]))
            out_hw = hw // stride
            outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, cout, out_hw, out_hw]))
            prev = x
            for i in range(layers):
                w = rng.standard_normal((cout, cin // group, k, k)).astype(np.float32) * 0.1
                b = rng.standard_normal(cout).astype(np.float32) * 0.1
                inits += [numpy_helper.from_array(w, f"w{i}_{cls}"), numpy_helper.from_array(b, f"b{i}_{cls}")]
                conv = f"c{i}_{cls}"
                nodes.append(helper.make_node("Conv", [prev, f"w{i}_{cls}", f"b{i}_{cls}"], [conv], name=conv,
                                              kernel_shape=[k, k], pads=[k // 2] * 4, group=group,
                                              strides=[stride, stride]))
                last = i == layers - 1
                nodes.append(helper.make_node("Relu", [conv], [y if last else f"r{i}_{cls}"], name=f"relu{i}_{cls}"))
                prev = f"r{i}_{cls}"
        elif spec[0] == "mbconv":
            _, cin, mid, hw = spec
            inputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, cin, hw, hw]))
            outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, cin, hw, hw]))
            prev, layers = x, []
            for b in range(2):
                layers += [(f"pw{b}_{cls}", (mid, cin, 1, 1), 1, 0), (f"dw{b}_{cls}", (mid, 1, 3, 3), mid, 1),
                           (f"pj{b}_{cls}", (cin, mid, 1, 1), 1, 0)]
            for i, (name, shape, group, pad) in enumerate(layers):
                inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, f"w_{name}"))
                nodes.append(helper.make_node("Conv", [prev, f"w_{name}"], [name], name=name, group=group,
                                              pads=[pad] * 4))
                out = y if i == len(layers) - 1 else f"r_{name}"
                nodes.append(helper.make_node("Relu", [name], [out], name=f"relu_{name}"))
                prev = out
        else:
            _, rows, kk, n = spec
            inputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, [rows, kk]))
            outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, [rows, n]))
            prev = x
            for i in range(2):
                w = rng.standard_normal((kk if i == 0 else n, n)).astype(np.float32) * 0.05
                inits.append(numpy_helper.from_array(w, f"w{i}_{cls}"))
                mm = f"m{i}_{cls}"
                nodes.append(helper.make_node("MatMul", [prev, f"w{i}_{cls}"], [mm], name=mm))
                nodes.append(helper.make_node("Relu", [mm], [y if i == 1 else f"r{i}_{cls}"], name=f"relu{i}_{cls}"))
                prev = f"r{i}_{cls}"
    graph = helper.make_graph(nodes, "kernels", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _feed(spec: tuple) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    hw = {"conv": 5, "mbconv": 3}.get(spec[0])
    shape = [1, spec[1], spec[hw], spec[hw]] if hw else [spec[1], spec[2]]
    return {"x": rng.standard_normal(shape).astype(np.float32)}


def _quantize(src: Path, dest: Path, variant: str, classes: dict[str, tuple], exclude=()) -> None:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # onnxruntime's quantizers warn through the root logger (pre-processing, QOp s8)
    try:
        _quantize_quietly(src, dest, variant, classes, list(exclude))
    finally:
        root.setLevel(level)


def _quantize_quietly(src: Path, dest: Path, variant: str, classes: dict[str, tuple], exclude: list) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    with contextlib.redirect_stdout(sys.stderr):
        if variant == "dynamic":
            quantize_dynamic(str(src), str(dest), per_channel=True, weight_type=QuantType.QInt8,
                             extra_options={"MatMulConstBOnly": True})
            return
        fmt, act = variant.split("_")

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.left = 2

            def get_next(self):
                if not self.left:
                    return None
                self.left -= 1
                return {f"x_{c}": _feed(s)["x"] * (1 + self.left) for c, s in classes.items()}

        quantize_static(str(src), str(dest), Reader(), quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                        per_channel=fmt == "qdq", activation_type=QuantType.QUInt8 if act == "u8" else QuantType.QInt8,
                        weight_type=QuantType.QInt8, nodes_to_exclude=exclude,
                        extra_options={"QDQDisableWeightAdjustForInt32Bias": True, "WeightAdjustForInt32Bias": False})


def _branch(model, cls: str):
    """The part of `model` that computes y_<cls> from x_<cls> (input renamed x), as a model of its own."""
    from onnx import helper

    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    need, keep, stack = set(), [], [f"y_{cls}"]
    while stack:
        t = stack.pop()
        if t in need:
            continue
        need.add(t)
        n = producer.get(t)
        if n is not None and id(n) not in {id(k) for k in keep}:
            keep.append(n)
            stack.extend(i for i in n.input if i)
    nodes = []
    for n in g.node:  # in the graph's (topological) order
        if any(n is k for k in keep):
            c = type(n)()
            c.CopyFrom(n)
            c.input[:] = ["x" if i == f"x_{cls}" else i for i in c.input]
            nodes.append(c)
    x = next(i for i in g.input if i.name == f"x_{cls}")
    xi = type(x)()
    xi.CopyFrom(x)
    xi.name = "x"
    inits = [i for i in g.initializer if i.name in need]
    out = [o for o in g.output if o.name == f"y_{cls}"]
    graph = helper.make_graph(nodes, cls, [xi], out, inits)
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def _save(model, path: Path) -> None:
    path.write_bytes(model.SerializeToString())


def _load(path: Path):
    import onnx

    return onnx.load(str(path))
