"""The settings of a quantize search that this CPU's int8 kernel table (kernels.py) says cannot win: skipped, each
with its reason (recorded in settings["skipped"]), and built only when none of the others meets the budgets.

`split_space(mode, space, model, table)` splits a strategy's settings into those worth building and those skipped;
`slow_convs_lose` says when keeping small-channel convs float cannot be faster; `worth_retrying` which skipped
settings may still meet a budget the tried ones missed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from optkit.core.text import first_line
from optkit.passes.quantize import kernels
from optkit.passes.quantize.candidates import Settings

log = logging.getLogger("optkit.passes.quantize.search")

DOT_PRODUCT = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")  # int8 dot products that do not saturate
SLOWER = 1.10        # dynamic Conv this much slower than float, or a block with float layers than all-int8, loses
LOSES = 1.25         # a static format and activation type this much slower than the best pair loses (wider: the
                     # pairs are often within 10% of each other, and the table is measured once, maybe under load)
FASTER = 0.90        # int8 this much faster than float: keeping those layers float cannot win

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


@dataclass
class Split:
    """What the kernel table made of a search space: the settings to build, those held back, the table."""

    build: list[Settings]
    held: list[Settings]
    table: kernels.Table | None = None


def split_space(mode: str, space: list[Settings], model, settings: dict) -> Split:
    """The search space split by this CPU's kernel table (measured once and cached: kernels.load_table), the
    skipped ones recorded in settings["skipped"] and the table in settings["kernel_table"]. Without a table
    (it cannot be measured here), everything is built."""
    try:
        table = kernels.load_table()
    except Exception as e:  # noqa: BLE001 - the table only saves time: without it, everything is built
        log.info("kernel table unavailable (%s): every setting is built", first_line(e))
        return Split(space, [])
    settings["kernel_table"] = {"cached": table.cached, "path": str(table.path) if table.path else None,
                                "seconds": round(table.seconds, 3)}
    keep, skipped = prune(mode, space, model, table.ratios, table.key["cpu"]["flags"])
    for s, why in skipped:
        label = s.label() + (f" {'+'.join(s.op_types)}" if s.op_types else "")
        settings.setdefault("skipped", []).append({"variant": label, "why": why, "rule": "kernels"})
        log.info("skipped %s: %s", s.label(), why)
    return Split(keep, [s for s, _ in skipped], table)
