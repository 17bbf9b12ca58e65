"""Where to cut: every node gets a part, pre (0, CPU), core (1, GPU) or post (2, CPU), with no edge going back.

The figure a cut is judged by is the bytes crossing between CPU and GPU per sample: every tensor that enters core
(a model input or a pre output that a core node reads) and every tensor that leaves it (read by post, or a model
output), each counted once, at the concrete shapes. Constants and initializers never cross: each part holds its own.

- naive: everything the provider runs is on the GPU; the cut falls right after the last supported op on each path
  (the core as large as placement allows).
- auto: the fewest bytes crossing among the cuts that respect placement: two minimum cuts, one between pre and core
  over the nodes upstream of the GPU work, one between core and post downstream of it; a tie keeps light ops on the
  GPU (preprocessing on the CPU).
- named: the outputs of the nodes a user names are the cut points.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from optkit.core.errors import UsageError
from optkit.split.graph import Graph
from optkit.split.placement import CPU, EITHER, GPU, Place

PRE, CORE, POST = 0, 1, 2
PART_NAMES = ("pre", "core", "post")
_INF = float("inf")
UNKNOWN_BYTES = 1 << 40  # a tensor whose size cannot be inferred is not worth crossing


@dataclass
class Layout:
    """The forced structure: what must be core, upstream or downstream of it, and what must be pre or post."""
    places: list[Place]
    core: set[int] = field(default_factory=set)      # GPU work and what lies between it
    up: set[int] = field(default_factory=set)        # ancestors of core
    down: set[int] = field(default_factory=set)      # descendants of core
    rest: set[int] = field(default_factory=set)      # neither: CPU, in post
    pre: set[int] = field(default_factory=set)       # forced pre (CPU ops upstream of core and their ancestors)
    post: set[int] = field(default_factory=set)      # forced post


def layout(graph: Graph, places: list[Place]) -> Layout | None:
    """The forced parts; None when nothing is meant for the GPU (nothing to split)."""
    places = list(places)
    while True:
        gpu = {i for i, p in enumerate(places) if p.kind == GPU}
        if not gpu:
            return None
        core = gpu | (graph.descendants(gpu) & graph.ancestors(gpu))
        stuck = sorted(i for i in core if places[i].kind == CPU)
        if not stuck:
            break
        # a CPU-only node between GPU work: three parts cannot hold it, so the work after it stays on the CPU
        first = graph.nodes[stuck[0]]
        for i in graph.descendants(stuck) - set(stuck):
            if places[i].kind == GPU:
                places[i] = Place(EITHER, f"{places[i].why.split(':')[0]}: after {first.op_type} "
                                          f"{first.name or '(unnamed)'}, which must run on the CPU: three parts put "
                                          "it on the CPU")
    up = graph.ancestors(core) - core
    down = graph.descendants(core) - core
    rest = set(range(graph.n)) - core - up - down
    pre = graph.ancestors({i for i in up if places[i].kind == CPU})
    # a node on neither side of the GPU work runs on the CPU, in post, and so does everything that reads it
    post = graph.descendants({i for i in down if places[i].kind == CPU} | rest)
    return Layout(places, core, up, down, rest, pre, post)


def naive(graph: Graph, lay: Layout) -> list[int]:
    levels = [CORE] * graph.n
    for i in lay.pre:
        levels[i] = PRE
    for i in lay.post | lay.rest:
        levels[i] = POST
    return levels


def auto(graph: Graph, lay: Layout, preprocess: set[int]) -> list[int]:
    levels = naive(graph, lay)
    weight = graph.n * 2 + 2          # bytes first; the node count only breaks ties
    pre = _solve_pre(graph, lay, preprocess, weight)
    for i in lay.up:
        levels[i] = PRE if i in pre else CORE
    post = _solve_post(graph, lay, levels, weight)
    for i in lay.down:
        levels[i] = POST if i in post else CORE
    return levels


def _bytes(graph: Graph, name: str) -> int:
    info = graph.info.get(name)
    b = info.nbytes() if info else None
    return UNKNOWN_BYTES if b is None else b


def _solve_pre(graph: Graph, lay: Layout, preprocess: set[int], weight: int) -> set[int]:
    """Source side = pre. The nodes of `lay.up`; core is the sink."""
    flow = _Flow()
    s, t = "s", "t"
    up = lay.up
    for i in up:
        if i in lay.pre:
            flow.add(s, i, _INF)
        elif i in preprocess:
            flow.add(s, i, 1)        # preprocessing prefers the CPU
        else:
            flow.add(i, t, 1)        # light work prefers the GPU
        for j in graph.pred(i):
            if j in up:
                flow.add(i, j, _INF)  # a pre node's producers are pre
    tensors = set(graph.inputs) | {o for i in up for o in graph.nodes[i].output if o}
    for name in tensors:
        readers = [r for r in graph.readers.get(name, ()) if r in up or r in lay.core]
        if not readers:
            continue
        aux = ("x", name)
        flow.add(graph.producer.get(name, s) if name in graph.producer else s, aux, _bytes(graph, name) * weight)
        for r in readers:
            flow.add(aux, r if r in up else t, _INF)
    return {v for v in flow.source_side(s, t) if isinstance(v, int)}


def _solve_post(graph: Graph, lay: Layout, levels: list[int], weight: int) -> set[int]:
    """Source side = core (everything on the GPU so far); sink = post. The nodes of `lay.down`."""
    flow = _Flow()
    s, t = "s", "t"
    down = lay.down
    outputs = set(graph.outputs)
    for i in down:
        if i in lay.post:
            flow.add(i, t, _INF)
        else:
            flow.add(s, i, 1)        # light work prefers the GPU
        for j in graph.succ(i):
            if j in down:
                flow.add(j, i, _INF)  # a post node's readers are post
    for name in set(graph.inputs) | set(graph.producer):
        p = graph.producer.get(name)
        readers = [r for r in graph.readers.get(name, ()) if r in down]
        on_gpu = p is not None and (p in down or levels[p] == CORE)
        aux = ("x", name)
        if on_gpu:
            if not readers and name not in outputs:
                continue
            flow.add(p if p in down else s, aux, _bytes(graph, name) * weight)
            for r in readers:
                flow.add(aux, r, _INF)
            if name in outputs or any(r not in down and levels[r] == POST for r in graph.readers.get(name, ())):
                flow.add(aux, t, _INF)
        elif readers:                # on the CPU (a model input, a pre output): costs if a core node reads it
            for r in readers:
                flow.add(r, aux, _INF)
            flow.add(aux, t, _bytes(graph, name) * weight)
    return set(down) - {v for v in flow.source_side(s, t) if isinstance(v, int)}


def refusal(graph: Graph, lay: Layout | None, picks: list[int]) -> str | None:
    """Why `named` refuses these cut points, or None when it takes them (or there is nothing to split): a message
    suggests a cut only when this says it would be taken."""
    if lay is None:
        return None
    try:
        named(graph, lay, picks, suggest=False)
    except UsageError as e:
        return str(e)
    return None


def named(graph: Graph, lay: Layout, picks: list[int], suggest: bool = True) -> list[int]:
    """The parts when the outputs of the nodes `picks` are the cut points (UsageError when they cannot be; with
    `suggest`, one naming another node only where that cut would be taken)."""
    levels = naive(graph, lay)
    ups = [i for i in picks if i in lay.up]
    downs = [i for i in picks if i in lay.core or i in lay.down]
    for i in picks:
        if i in lay.rest:
            raise UsageError(f"--cut {_label(graph, i)} does not separate the graph: no GPU work is upstream or "
                             "downstream of it")
    if ups:
        pre = lay.pre | graph.ancestors(ups)
        for i in lay.up:
            levels[i] = PRE if i in pre else CORE
    if downs:
        post = lay.post | (graph.descendants(downs) - set(downs))
        bad = sorted(post & lay.core)
        if bad:
            raise UsageError(f"--cut {_label(graph, downs[0])} does not separate the graph: {_label(graph, bad[0])} "
                             "after it must run on the GPU; cut after the last GPU op (or name a later node)")
        mid = sorted(set(downs) & lay.post)
        if mid:
            raise UsageError(f"--cut {_label(graph, mid[0])}: it comes after a node that must run on the CPU, so "
                             "its outputs cannot leave the GPU part; cut before that node")
        for i in lay.down:
            levels[i] = POST if i in post else CORE
    for i in range(graph.n):
        back = sorted(j for j in graph.pred(i) if levels[j] > levels[i])
        if back:
            raise UsageError(f"--cut {' '.join(_label(graph, k) for k in picks)}: these cut points overlap: "
                             f"{_label(graph, i)} would run in {PART_NAMES[levels[i]]} but reads "
                             f"{_label(graph, back[0])} in {PART_NAMES[levels[back[0]]]}, after it; name one node per "
                             "path (or use --cut auto)")
    for boundary, chosen in ((PRE, ups), (CORE, downs)):
        if not chosen:
            continue
        allowed = {o for i in chosen for o in graph.nodes[i].output}
        for name, src, dst in crossings(graph, levels):
            if src == boundary and dst == boundary + 1 and name not in allowed:
                who = graph.producer.get(name)
                also = who is not None and graph.nodes[who].name and suggest and (
                    refusal(graph, lay, list(picks) + [who]) is None)
                raise UsageError(f"--cut {' '.join(_label(graph, i) for i in chosen)} does not separate the graph: "
                                 f"tensor {name!r}" + (f" from {_label(graph, who)}" if who is not None else "")
                                 + f" also crosses from {PART_NAMES[src]} to {PART_NAMES[dst]}; "
                                 + ("name that node too" if also else "name other nodes or use --cut auto"))
    return levels


def _label(graph: Graph, i: int) -> str:
    node = graph.nodes[i]
    return f"{node.name or '(unnamed)'} ({node.op_type})"


def crossings(graph: Graph, levels: list[int]) -> list[tuple[str, int, int]]:
    """(tensor, from part, to part) for every node output read by a later part (each pair once)."""
    out = []
    for name, p in graph.producer.items():
        dsts = sorted({levels[r] for r in graph.readers.get(name, ()) if levels[r] != levels[p]})
        for d in dsts:
            if d < levels[p]:
                raise AssertionError(f"tensor {name} flows back from {PART_NAMES[levels[p]]} to {PART_NAMES[d]}")
            out.append((name, levels[p], d))
    return sorted(out, key=lambda x: (x[1], x[2], x[0]))


def gpu_bytes(graph: Graph, levels: list[int]) -> int | None:
    """Bytes per call entering or leaving core (model inputs and outputs included), each tensor once."""
    total, unknown = 0, False
    names: set[str] = set()
    for name in graph.inputs:
        if any(levels[r] == CORE for r in graph.readers.get(name, ())):
            names.add(name)
    for name, p in graph.producer.items():
        readers = graph.readers.get(name, ())
        if levels[p] == CORE and (name in graph.outputs or any(levels[r] != CORE for r in readers)):
            names.add(name)
        elif levels[p] != CORE and any(levels[r] == CORE for r in readers):
            names.add(name)
    for name in names:
        info = graph.info.get(name)
        b = info.nbytes() if info else None
        unknown |= b is None
        total += b or 0
    return None if unknown else total


class _Flow:
    """Dinic's maximum flow on a small graph with hashable vertices; source_side gives the minimum cut."""

    def __init__(self):
        self.adj: dict = {}

    def add(self, u, v, cap) -> None:
        if u == v or cap == 0:
            return
        a = [v, cap, None]
        b = [u, 0, a]
        a[2] = b
        self.adj.setdefault(u, []).append(a)
        self.adj.setdefault(v, []).append(b)

    def _levels(self, s, t):
        level = {s: 0}
        q = deque([s])
        while q:
            u = q.popleft()
            for v, cap, _ in self.adj.get(u, ()):
                if cap > 0 and v not in level:
                    level[v] = level[u] + 1
                    q.append(v)
        return level if t in level else None

    def _push(self, s, t, level, it) -> float:
        # iterative DFS for one augmenting path in the level graph
        path, u = [], s
        while True:
            if u == t:
                f = min(e[1] for e in path)
                for e in path:
                    e[1] -= f
                    e[2][1] += f
                return f
            edges = self.adj.get(u, ())
            while it[u] < len(edges):
                e = edges[it[u]]
                if e[1] > 0 and level.get(e[0]) == level[u] + 1:
                    break
                it[u] += 1
            else:
                if not path:
                    return 0
                level[u] = -1      # dead end
                e = path.pop()
                u = e[2][0]
                it[u] += 1
                continue
            path.append(edges[it[u]])
            u = edges[it[u]][0]

    def source_side(self, s, t) -> set:
        if s in self.adj and t in self.adj:
            while (level := self._levels(s, t)) is not None:
                it = {u: 0 for u in self.adj}
                while True:
                    f = self._push(s, t, level, it)
                    if not f:
                        break
                    if f == _INF:
                        raise AssertionError("unbounded cut: placement leaves no valid split")
        seen, q = {s}, deque([s])
        while q:
            u = q.popleft()
            for v, cap, _ in self.adj.get(u, ()):
                if cap > 0 and v not in seen:
                    seen.add(v)
                    q.append(v)
        return seen
