"""This CPU's int8 kernels against float, per op type and shape class, learnt once per machine and cached, and the
settings of a quantize search they say cannot win.

The table: tiny ONNX graphs (two Conv or MatMul layers of one shape class each) built with onnx.helper, quantized
by onnxruntime's own quantizers the way the search builds candidates (dynamic; static QDQ and QOperator with uint8
and int8 activations), each timed against its float graph on one thread, call by call, interleaved; a ratio per
class and variant (time / float time, below 1: int8 is faster). A few seconds, once: the table is kept in the
per-user cache folder (core.cachedir: $OPTKIT_CACHE_DIR, else $XDG_CACHE_HOME/optkit, else ~/.cache/optkit) as
kernels-<key>.json, keyed by the onnxruntime version and the CPU (model name, architecture, the ISA flags the
int8 kernels choose by). A file read back is input: one that is not a regular file, too large, of another
schema or key, or with a value outside its bounds (NaN, huge, wrong type) is ignored and measured again.

`prune(strategy, space, model, table)` splits a strategy's settings into those worth building and those skipped,
each with its reason (the search records them in settings["skipped"]).
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
from dataclasses import dataclass, field, replace
from hashlib import sha256
from pathlib import Path
from typing import Any

import numpy as np

from optkit.core import strictjson
from optkit.core.cachedir import NoCacheDir, cache_dir
from optkit.onnx import session as onnx_session
from optkit.passes.quantize.candidates import Settings

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
DOT_PRODUCT = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")  # int8 dot products that do not saturate
SLOWER = 1.10        # dynamic Conv this much slower than float, or a block with float layers than all-int8, loses
LOSES = 1.25         # a static format and activation type this much slower than the best pair loses (wider: the
                     # pairs are often within 10% of each other, and the table is measured once, maybe under load)
FASTER = 0.90        # int8 this much faster than float: keeping those layers float cannot win
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
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
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


# ------------------------------------------------------------ what the table says about a model's settings
def layer_classes(model) -> dict[str, list[tuple[str, str, float]]]:
    """{"Conv" | "MatMul": [(node name, shape class, weight)]} for the layers with a constant weight; the weight
    is the layer's multiply-adds per call as far as the shapes are known (unknown dims count 1)."""
    g = model.graph
    inits = {i.name: list(i.dims) for i in g.initializer}
    shapes = {}
    for vi in [*g.value_info, *g.output]:
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims]
    out: dict[str, list[tuple[str, str, float]]] = {"Conv": [], "MatMul": []}
    for n in g.node:
        w = inits.get(n.input[1]) if len(n.input) > 1 else None
        if n.op_type == "Conv" and w is not None and len(w) >= 3:
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            cout, cin_g, k = w[0], w[1], int(np.prod(w[2:]))
            if cin_g <= 4:
                cls = ("dwconv_small" if cout <= 128 else "dwconv_large") if group > 1 else "conv_stem"
            elif k == 1:
                cls = "conv1x1_small" if max(cin_g, cout) <= 96 else "conv1x1_large"
            else:
                cls = "conv3x3_small" if max(cin_g, cout) <= 64 else "conv3x3_large"
            spatial = int(np.prod(shapes.get(n.output[0], [1, 1])[2:]))
            out["Conv"].append((n.name, cls, float(np.prod(w)) * spatial))
        elif n.op_type in ("MatMul", "Gemm") and w is not None and len(w) == 2:
            shape = shapes.get(n.output[0])
            rows = int(np.prod(shape[:-1])) if shape else 1
            cls = "gemv" if shape and rows <= 1 else ("matmul_small" if w[0] * w[1] <= 256 * 256 else "matmul_large")
            out["MatMul"].append((n.name, cls, float(np.prod(w)) * rows))
    return out


def estimate(layers: list[tuple[str, str, float]], ratios: dict, variant: str) -> float | None:
    """The layers' time in `variant` / their float time, each layer as its shape class runs in the table."""
    total = sum(w for _, _, w in layers)
    if not layers or total <= 0:
        return None
    return sum(w * ratios[cls][variant] for _, cls, w in layers) / total


def static_variant(settings: Settings) -> str:
    return f"{'qdq' if settings.format == 'qdq' else 'qop'}_{'u8' if settings.activation_type == 'uint8' else 's8'}"


def prune(mode: str, space: list[Settings], model, ratios: dict,
          flags=()) -> tuple[list[Settings], list[tuple[Settings, str]]]:
    """(the settings worth building, [(a setting skipped, why)]). Dynamic: the settings that quantize Conv when
    ConvInteger runs SLOWER than float Conv for this model's convs and a setting keeping Conv float is in the
    space. Static: a format and activation type whose kernels, for this model's Conv and MatMul/Gemm layers, run
    LOSES times slower than the best pair's; of two format twins (QDQ and QOperator of one activation type: the
    same numbers) the QOperator one unless it runs FASTER than the QDQ one (then the QDQ one). Both:
    reduce_range where the CPU's int8 dot products do not saturate (`flags`, the table's key: DOT_PRODUCT) and
    the same setting without it is in the space: 7-bit weights only avoid the u8 x s8 saturation of older CPUs,
    so here they run on the same kernels with coarser weights. Nothing is skipped that would leave the space
    empty."""
    layers = layer_classes(model)
    skipped: list[tuple[Settings, str]] = []
    dot = sorted(set(flags) & set(DOT_PRODUCT))
    if dot:
        plain = {replace(s, reduce_range=False) for s in space if not s.reduce_range}
        skipped += [(s, f"reduce_range: this CPU's int8 dot products ({', '.join(dot)}) do not saturate, so 7-bit "
                        "weights run on the same kernels, only coarser (kernel table key)")
                    for s in space if s.reduce_range and replace(s, reduce_range=False) in plain]
    if mode == "dynamic":
        conv = estimate(layers["Conv"], ratios, "dynamic")
        with_conv = [s for s in space if s.op_types is not None and "Conv" in s.op_types]
        if conv is not None and conv >= SLOWER and len(with_conv) < len(space):
            why = (f"ConvInteger runs {conv:.2f}x the time of float Conv on this CPU for this model's "
                   f"{len(layers['Conv'])} convs (kernel table); the settings keeping Conv float are built")
            skipped += [(s, why) for s in with_conv if all(s is not t for t, _ in skipped)]
    elif mode == "static":
        anchors = layers["Conv"] + layers["MatMul"]
        pairs = {static_variant(s) for s in space if s.format}
        est = {v: estimate(anchors, ratios, v) for v in pairs}
        if len(pairs) > 1 and None not in est.values():
            best = min(est, key=est.get)
            losers = {v for v, e in est.items() if e > LOSES * est[best]}
            names = {"qdq_u8": "QDQ u8", "qdq_s8": "QDQ s8", "qop_u8": "QOp u8", "qop_s8": "QOp s8"}
            why = {v: f"{names[v]} kernels run this model's {len(anchors)} Conv/MatMul layers at {est[v]:.2f}x float "
                      f"time on this CPU, {names[best]} at {est[best]:.2f}x (kernel table)" for v in losers}
            for act in ("u8", "s8"):  # format twins: the same numbers; the other is built only if clearly faster
                qdq, qop = f"qdq_{act}", f"qop_{act}"
                if qdq in est and qop in est and not {qdq, qop} & losers:
                    twin, other = (qdq, qop) if est[qop] < FASTER * est[qdq] else (qop, qdq)
                    losers.add(twin)
                    why[twin] = (f"{names[twin]} computes the same numbers as {names[other]}, and its kernels are not "
                                 f"clearly faster here ({est[twin]:.2f}x float time against {est[other]:.2f}x for this "
                                 "model's layers, kernel table)")
            for s in space:
                v = static_variant(s) if s.format else None
                if v in losers and all(s is not t for t, _ in skipped):
                    skipped.append((s, why[v]))
    held = {id(s) for s, _ in skipped}
    if len(held) >= len(space):
        return space, []
    return [s for s in space if id(s) not in held], skipped


def slow_convs_lose(model, nodes: list[str], settings: Settings, ratios: dict) -> str | None:
    """Why keeping the small-channel convs `nodes` float cannot win with these (static) settings, or None when it
    might: their int8 kernels run FASTER than float here, or a MobileNet block with its depthwise convs float
    (between int8 layers: the conversions around them included) takes SLOWER times the all-int8 block's time."""
    v = static_variant(settings)
    layers = [x for x in layer_classes(model)["Conv"] if x[0] in set(nodes)]
    est = estimate(layers, ratios, v)
    if est is not None and est <= FASTER:
        return (f"the {len(layers)} small-channel convs run at {est:.2f}x float time in int8 on this CPU (kernel "
                "table): keeping them float cannot be faster")
    block = ratios.get("mbconv", {})
    if f"{v}_dwfloat" in block and block[f"{v}_dwfloat"] >= SLOWER * block[v]:
        return (f"a MobileNet block with its depthwise convs float runs at {block[f'{v}_dwfloat'] / block[v]:.2f}x "
                "the time of the all-int8 block on this CPU (kernel table: the conversions around float layers "
                "cost more than their int8 kernels lose)")
    return None


def worth_retrying(held: list[Settings], tried: list) -> list[Settings]:
    """The skipped settings that might meet the budgets where every tried candidate missed them: all but those
    whose numbers a tried candidate already computed (the other format: QDQ and QOperator compute the same
    numbers). Reduce-range ones are retried: their coarser weights give other outputs, which may meet a budget
    (on 75 ImageNet images a reduce-range model lost no image where the full-range one lost one)."""
    def same_numbers(s: Settings) -> Settings:
        return replace(s, format="qdq") if s.format else s

    done = {same_numbers(c.settings) for c in tried if c.fidelity is not None}
    return [s for s in held if same_numbers(s) not in done]
