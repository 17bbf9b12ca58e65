"""`optkit split`: cut an ONNX model into pre (CPU) / core (GPU) / post (CPU) parts where the fewest bytes cross.

    doc = split_model(Path("det.onnx"), Path("det_split"), provider="tensorrt", cuts="auto", dims={"batch": 1})

`doc` is what DIR/split.json holds (its contract: optkit/contracts/split.py): the model's sha256, the parts with
their file, sha256, device, why, op counts, inputs and outputs (wired by tensor name), the cuts with the tensors
and bytes crossing each, and the naive cut's bytes. A model with nothing to split (no GPU work, or all of it in
one part) gets a document with no parts and `nothing_to_split` saying why; nothing is written then.

`cuts="preprocess"` cuts a model with `optkit.preprocess` metadata exactly at that metadata's boundary (pre = the
preprocessing, core = the model; post only where placement needs one): the cut `optkit package` serves a model
with preprocessing in its graph at, so there is one way of cutting in the project.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

from optkit.core.atomic import remove, stage_folder
from optkit.core.errors import UsageError
from optkit.core.formats import folder_problem
from optkit.core.shapes import LADDERS, dim_kind
from optkit.core.text import first_line
from optkit.measure.images import client_images
from optkit.measure.inputs import probe, synthesize
from optkit.onnx import io as onnx_io
from optkit.onnx.graph import all_nodes, subgraphs
from optkit.onnx.session import ort_session, spec_of, with_hints
from optkit.split import cuts as C
from optkit.split import graph as G
from optkit.split import write
from optkit.split.graph import parse_dims
from optkit.split.placement import CPU, EITHER, GPU, PROVIDERS, Place, place
from optkit.split.write import META_KEY, extract, part_io, run_plain

SCHEMA = write.SCHEMA   # 3: the split model's sha256 too (optkit/contracts/split.py)
PREPROCESS = "preprocess"
MAX_SAMPLE_BYTES = 1 << 30   # synthesized sample inputs of one call, all inputs together


def split_model(model: Path, out_dir: Path, provider: str = "tensorrt", cuts="auto", dims=None, *,
                data=None, on_wait=None) -> dict:
    """Split `model` into the parts its placement needs, check the chain bit-exact on onnxruntime CPU, write
    DIR/{pre,core,post}.onnx and DIR/split.json (only the parts needed, all or nothing), and return the document.
    UsageError (exit 2) for bad input, ValidationError (exit 3, nothing written) when the chain differs.
    `dims` maps dynamic dim names to sizes ({"batch": 1} or ["batch=1"]); `data` is an .npz of sample inputs
    (one array per input name), or an image folder for a model with optkit.preprocess metadata, that the chain is
    checked on instead of synthesized ones and that sizes the dynamic dims `dims` does not name.
    Two runs into one DIR: the commit holds DIR's lock (its parent's while DIR is new) and checks DIR again under
    it; a second run waits for the first (`on_wait()` is called when it starts waiting), then replaces its output."""

    model, out_dir = Path(model), Path(out_dir)
    if not model.exists():
        raise UsageError(f"model {model} does not exist")
    write.check_out_dir(out_dir, model)
    plan = _plan(model, provider, cuts, dims, data)
    doc = plan["doc"]
    if not doc["parts"]:
        return doc
    tmp = stage_folder(out_dir)
    try:
        parts = []
        for part in doc["parts"]:
            data = plan["models"][part["name"]].SerializeToString()
            (tmp / part["file"]).write_bytes(data)
            written = (tmp / part["file"]).read_bytes()
            part["sha256"] = hashlib.sha256(written).hexdigest()
            parts.append((written, [o["name"] for o in part["outputs"]]))
        doc["check"] = write.check_chain(plan["source"], parts, plan["feeds"], [o["name"] for o in doc["outputs"]])
        write.write_doc(tmp, doc)
        write.commit(tmp, out_dir, model, on_wait)
    finally:
        remove(tmp)
    return doc


def plan_split(model: Path, provider: str = "tensorrt", cuts="auto", dims=None, *, data=None) -> dict:
    """The split.json document without writing anything (parts not checked)."""
    return _plan(Path(model), provider, cuts, dims, data)["doc"]


def check_model(model: Path) -> None:
    """Exit 2 unless `model` is an ONNX file (the one format split reads)."""
    if not model.exists():
        raise UsageError(f"model {model} does not exist")
    if model.is_dir() and not (model / "saved_model.pb").exists():
        raise UsageError(f"optkit split reads ONNX models (.onnx): {folder_problem(model)}")
    if model.is_dir() or model.suffix.lower() != ".onnx":
        how = "give the ONNX model it was converted from" if model.suffix.lower() == ".xml" else \
            "convert it first: optkit convert"
        raise UsageError(f"optkit split reads ONNX models (.onnx); {model} is not one ({how})")


def _cut_names(cuts) -> tuple[list[str] | None, bool]:
    """(the node names to cut at, or None for the automatic cut; whether to cut at the preprocessing boundary)."""
    at_preprocess = cuts == PREPROCESS or cuts == [PREPROCESS]
    names = None if cuts in (None, "auto") or cuts == ["auto"] or at_preprocess else (
        [cuts] if isinstance(cuts, str) else list(cuts))
    if names is not None and (not names or "auto" in names):
        raise UsageError("--cut takes auto or node names, not both")
    return names, at_preprocess


def _plan(model: Path, provider: str, cuts, dims, data=None) -> dict:
    """The split, phase by phase: the model read and its sample inputs, each node placed, the cut chosen, the
    parts extracted, the document."""
    if provider not in PROVIDERS:
        raise UsageError(f"unknown --provider {provider!r}; choose {', '.join(PROVIDERS)}")
    check_model(model)
    names, at_preprocess = _cut_names(cuts)
    onnx_model = onnx_io.load(model)
    source = model.read_bytes()
    graph = G.build(onnx_model)
    feeds, data_doc, assumed = _samples(model, source, onnx_model, graph, dims, data)
    _observe(graph, source, feeds)
    pre_nodes = _preprocess_nodes(onnx_model, graph, model)
    lay = C.layout(graph, _places(onnx_model, graph, provider, pre_nodes))
    picks = _picks(onnx_model, graph, names, lay) if names is not None else None
    if at_preprocess:
        if not pre_nodes:
            raise UsageError(f"{model} has no {META_KEY} metadata (written by optkit preprocess), so there is no "
                             "preprocessing boundary to cut at; use --cut auto or node names")
        picks = _boundary(onnx_model, graph)
    base = {"schema": SCHEMA, "model": model.name, "model_sha256": hashlib.sha256(source).hexdigest(),
            "provider": provider,
            "inputs": [_io(graph, t) for t in graph.inputs], "outputs": [_io(graph, t) for t in graph.outputs]}
    if data_doc is not None:
        base["data"] = data_doc
    if lay is None or provider == "cpu":
        why = ("--provider cpu runs everything on the CPU" if provider == "cpu" else
               f"no op is meant for the GPU under {provider} (no compute-heavy op it supports)")
        return {"doc": {**base, "parts": [], "cuts": [], "naive_cut_bytes_per_sample": None,
                        "nothing_to_split": why, "dims": assumed}}
    places = lay.places
    naive = C.naive(graph, lay)
    levels = C.auto(graph, lay, pre_nodes) if picks is None else C.named(graph, lay, picks)
    used = sorted(set(levels))
    if used == [C.CORE]:
        doc = {**base, "parts": [], "cuts": [], "naive_cut_bytes_per_sample": C.gpu_bytes(graph, naive),
               "nothing_to_split": f"every op can run on the GPU under {provider}: the whole model is the core",
               "dims": assumed}
        return {"doc": doc}
    parts, models = _parts(graph, levels, used, places, pre_nodes, provider)
    doc = {**base, "parts": parts, "cuts": _crossing(graph, levels),
           "naive_cut_bytes_per_sample": C.gpu_bytes(graph, naive), "gpu_bytes_per_sample": C.gpu_bytes(graph, levels),
           "cut": "auto" if picks is None else PREPROCESS if at_preprocess else "named",
           "dims": assumed,
           "cpu_nodes": [{"node": graph.nodes[i].name, "op": graph.nodes[i].op_type,
                          "part": C.PART_NAMES[levels[i]], "why": places[i].why}
                         for i in range(graph.n) if places[i].kind == CPU][:50]}
    if pre_nodes:
        doc["preprocess_boundary_bytes_per_sample"] = _preprocess_bytes(onnx_model, graph)
    return {"doc": doc, "models": models, "source": source, "feeds": feeds}


def _places(onnx_model, graph, provider: str, pre_nodes: set[int]) -> list[Place]:
    """Where each node may run under `provider` (a model-local function: wherever the cut puts it)."""
    functions = {(f.domain, f.name) for f in onnx_model.functions}
    return [Place(EITHER, f"{node.domain}.{node.op_type}: a model-local function: placed by the cut")
            if (node.domain or "", node.op_type) in functions else place(node, provider, i in pre_nodes)
            for i, node in enumerate(graph.nodes)]


def _parts(graph, levels: list[int], used: list[int], places, pre_nodes: set[int],
           provider: str) -> tuple[list[dict], dict]:
    """Each part's entry in split.json and its model."""
    parts, models = [], {}
    for lv in used:
        meta = bool(pre_nodes) and lv == C.PRE and pre_nodes <= {i for i, x in enumerate(levels) if x == lv}
        m, ins, outs = extract(graph, levels, lv, meta)
        idx = part_io(graph, levels, lv)[0]
        name = C.PART_NAMES[lv]
        models[name] = m
        parts.append({"name": name, "file": f"{name}.onnx", "device": "gpu" if lv == C.CORE else "cpu",
                      "why": _why(graph, idx, places, lv, provider),
                      "ops": dict(Counter(graph.nodes[i].op_type for i in idx).most_common()),
                      "inputs": [_io(graph, t) for t in ins], "outputs": [_io(graph, t) for t in outs]})
    return parts, models


def _crossing(graph, levels: list[int]) -> list[dict]:
    """The tensors crossing each cut, with their bytes per sample."""
    cut_list = []
    for (src, dst) in ((C.PRE, C.CORE), (C.CORE, C.POST), (C.PRE, C.POST)):
        tensors = [t for t, a, b in C.crossings(graph, levels) if a == src and b == dst]
        if tensors:
            rows = [{**_io(graph, t), "bytes_per_sample": _nbytes(graph, t)} for t in tensors]
            total = sum(r["bytes_per_sample"] or 0 for r in rows)
            cut_list.append({"from": C.PART_NAMES[src], "to": C.PART_NAMES[dst], "tensors": rows,
                             "bytes_per_sample": total})
    return cut_list


def _nbytes(graph, name: str) -> int | None:
    info = graph.info.get(name)
    return info.nbytes() if info else None


def _io(graph, name: str) -> dict:
    info = graph.info.get(name)
    return {"name": name, "dtype": info.dtype if info else None,
            "shape": list(info.shape) if info and info.shape is not None else None}


def _why(graph, idx, places, level, provider) -> str:

    counts = Counter()
    for i in idx:
        p = places[i]
        key = p.why if p.kind == CPU else p.why.split(":", 1)[1].strip() if ":" in p.why else p.why
        counts[(p.kind, key)] += 1
    order = (CPU, GPU, "either") if level != 1 else (GPU, "either", CPU)
    rows = sorted(counts.items(), key=lambda kv: (order.index(kv[0][0]), -kv[1]))
    text = "; ".join(f"{n} node{'s' if n > 1 else ''}: {why}" if kind != CPU else why for (kind, why), n in rows[:4])
    if level != 1 and not any(k == CPU for k, _ in counts):
        text = "light ops the cut puts on the CPU (fewer bytes cross): " + text
    return text


def _sizes(model, dims, arrays: dict | None = None, data=None) -> tuple[dict[str, int], dict]:
    """The size of every dynamic input dim: from `dims` (NAME=SIZE), else from the sample data's shapes
    (`arrays`, one per input), else assumed by its name (batch 1, images 224...); returns ({key: size},
    {"given": {...}, "data": {...}, "assumed": {...}}). A --dim the data contradicts is exit 2."""

    given = parse_dims(dims) if isinstance(dims, (list, tuple)) else dict(dims or {})
    for k, v in given.items():
        if not isinstance(v, int) or v <= 0:
            raise UsageError(f"--dim {k}={v}: SIZE must be a positive integer")
    init = {t.name for t in model.graph.initializer}
    known, assumed, from_data, seen = set(), {}, {}, {}
    sizes = dict(given)
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]
        arr = None if arrays is None else arrays.get(vi.name)
        for k, d in enumerate(shape):
            if isinstance(d, int) and d > 0:
                continue
            key = d or f"{vi.name}:{k}"
            known.add(key)
            if arr is not None and arr.ndim == len(shape):
                size = int(arr.shape[k])
                if key in seen and seen[key][0] != size:
                    raise UsageError(f"--data {data}: dim {key} is {seen[key][0]} in array {seen[key][1]!r} and "
                                     f"{size} in array {vi.name!r}; give arrays that agree")
                seen.setdefault(key, (size, vi.name))
                if key in given and given[key] != size:
                    raise UsageError(f"--dim {key}={given[key]} contradicts --data {data}: array {vi.name!r} has "
                                     f"{key}={size} (axis {k}); drop the --dim or give data of that size")
                if key not in given and size > 0:
                    sizes[key] = from_data[key] = size
            if key not in sizes:
                sizes[key] = LADDERS[dim_kind(shape, k)][0]
                assumed[key] = sizes[key]
    unknown = sorted(set(given) - known)
    if unknown:
        raise UsageError(f"--dim {unknown[0]}: the model's inputs have no dynamic dim of that name "
                         f"({', '.join(sorted(known)) or 'all dims are fixed'})")
    return sizes, {"given": given, "data": from_data, "assumed": assumed}


def _fits_memory(graph, dims: dict) -> None:
    """Exit 2 before synthesizing sample inputs that would not fit in memory (--dim height=1048576 width=...): the
    chain check runs the model and every part on them."""
    total = sum(graph.info[t].nbytes() or 0 for t in graph.inputs if graph.info.get(t) is not None)
    if total > MAX_SAMPLE_BYTES:
        chosen = {**dims.get("assumed", {}), **dims.get("given", {})}
        raise UsageError(f"the sample inputs at the chosen dims ({', '.join(f'{k}={v}' for k, v in chosen.items())}) "
                         f"take {total / (1 << 30):.1f} GiB, over the {MAX_SAMPLE_BYTES >> 30} GiB the chain check "
                         "runs on; give smaller --dim sizes")


def _samples(model: Path, source: bytes, onnx_model, graph, dims, data) -> tuple[dict, dict | None, dict]:
    """The sample inputs the chain is checked on, with the graph's shapes inferred at the chosen dims: --data's
    arrays, else synthesized at the --dim sizes and, for the dims nobody set, sizes probed as every command probes
    them. Returns (feeds, the data's document or None, the dims document)."""
    arrays, data_doc = (None, None) if data is None else _load_data(Path(data), graph, onnx_model, model)
    sizes, dims_doc = _sizes(onnx_model, dims, arrays, data)
    G.infer(graph, sizes)
    if data is not None:
        return _data_feeds(arrays, Path(data), graph), data_doc, dims_doc
    _fits_memory(graph, dims_doc)
    try:
        sess = ort_session(source, optimize=False)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"cannot load {model} with onnxruntime: {first_line(e)}") from None
    if dims_doc["assumed"]:
        probed = _probe(sess, model, sizes, dims_doc)
        if probed != sizes:
            G.infer(graph, probed)
            _fits_memory(graph, dims_doc)
    return _feeds(sess, model, graph), None, dims_doc


def _probe(sess, path: Path, sizes: dict[str, int], dims_doc: dict) -> dict[str, int]:
    """`sizes` with the dims nobody set (dims_doc["assumed"], updated) climbed on measure.inputs' ladders until
    onnxruntime runs the model; exit 2 naming the --dim to set when no rung runs."""
    open_keys = dims_doc["assumed"]
    specs = with_hints([spec_of(i) for i in sess.get_inputs()], path)
    keys = {s.name: [None if isinstance(d, int) and d > 0 else (d or f"{s.name}:{k}") for k, d in enumerate(s.shape)]
            for s in specs if s.shape is not None}
    fixed = [s if s.name not in keys else replace(s, shape=[
        d if key is None or key in open_keys else sizes.get(key, d) for key, d in zip(keys[s.name], s.shape)])
        for s in specs]
    climbed = [key for name, row in keys.items() for k, key in enumerate(row)
               if key in open_keys and dim_kind(next(s.shape for s in specs if s.name == name), k) != "batch"]
    advice = " ".join(f"--dim {k}=SIZE" for k in dict.fromkeys(climbed or open_keys))
    shapes, _ = probe(fixed, lambda f: sess.run(None, f), advice=f"set them with {advice} (or give --data)")
    probed = dict(sizes)
    for name, row in keys.items():
        for k, key in enumerate(row):
            if key in open_keys and name in shapes:
                probed[key] = int(shapes[name][k])
    dims_doc["assumed"] = {k: probed[k] for k in open_keys}
    return probed


def _feeds(sess, path: Path, graph) -> dict:

    specs = with_hints([spec_of(i) for i in sess.get_inputs()], path)
    shapes = {s.name: graph.info[s.name].concrete for s in specs if graph.info.get(s.name) and
              graph.info[s.name].concrete is not None}
    return synthesize(specs, shapes=shapes)


def _load_data(path: Path, graph, onnx_model, model: Path) -> tuple[dict, dict]:
    """Sample inputs, one array per model input: an .npz (a lone array for a one-input model), or an image folder
    for a model whose input is a uint8 image (optkit.preprocess metadata): its first image as a client sends it,
    uint8 [1,H,W,C], no resize (the graph resizes)."""
    import zipfile

    import numpy as np

    if path.is_dir():
        return _folder_data(path, graph, onnx_model, model)
    if not path.is_file():
        raise UsageError(f"--data {path} does not exist; give an .npz (one array per input) or, for a model with "
                         "preprocessing in its graph, an image folder")
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("it is a single .npy array, not an .npz archive of named arrays")
        with z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise UsageError(f"cannot read --data {path} as .npz: {first_line(e)}") from None
    if len(graph.inputs) == 1 and len(arrays) == 1:
        arrays = {graph.inputs[0]: next(iter(arrays.values()))}
    missing = [n for n in graph.inputs if n not in arrays]
    if missing:
        raise UsageError(f"--data {path} has no array named {missing[0]!r} (an input of the model); it holds "
                         f"{', '.join(arrays) or 'nothing'}")
    return {n: arrays[n] for n in graph.inputs}, {"path": path.name, "kind": "npz"}


def _folder_data(path: Path, graph, onnx_model, model: Path) -> tuple[dict, dict]:
    raw = next((p.value for p in onnx_model.metadata_props if p.key == META_KEY), None)
    image = None
    with_meta = raw is not None
    if with_meta:
        try:
            meta = json.loads(raw)
            image = meta.get("input") if isinstance(meta, dict) else None
        except (ValueError, RecursionError):
            image = None
    vi = next((i for i in onnx_model.graph.input if i.name == image), None) if isinstance(image, str) else None
    dims = list(vi.type.tensor_type.shape.dim) if vi is not None else []
    if not with_meta or vi is None or vi.type.tensor_type.elem_type != 2 or len(dims) != 4:  # 2: uint8
        raise UsageError(f"--data {path} is an image folder, which feeds a model whose input is a uint8 image "
                         f"(preprocessing in its graph: optkit preprocess); {model.name} has "
                         f"{'no ' + META_KEY + ' metadata' if not with_meta else 'no such input'}: give an .npz with "
                         "one array per input")
    others = [n for n in graph.inputs if n != image]
    if others:
        raise UsageError(f"--data {path} is an image folder, but {model.name} has inputs besides the image "
                         f"{image!r} ({others[0]!r}); give an .npz with one array per input")
    images, count = client_images(path, gray=dims[3].HasField("dim_value") and dims[3].dim_value == 1)
    first, arr = images[0]
    return {image: arr}, {"path": path.name, "kind": "images", "image": str(first.relative_to(path)),
                          "images": count, "note": "the first image, uint8 as a client sends it (no resize)"}


def _data_feeds(arrays: dict, path: Path, graph) -> dict:
    """The sample inputs checked against the model's inputs at the chosen dims (dtype and shape)."""
    import numpy as np

    feeds = {}
    for name in graph.inputs:
        info, arr = graph.info.get(name), arrays[name]
        if info is not None and info.dtype and arr.dtype != np.dtype(info.dtype):
            raise UsageError(f"--data {path}: array {name!r} is {arr.dtype}, the model's input is {info.dtype}")
        if info is not None and info.concrete is not None and list(arr.shape) != info.concrete:
            raise UsageError(f"--data {path}: array {name!r} has shape {list(arr.shape)}, the model's input at the "
                             f"chosen dims is {info.concrete}; give data of the model's fixed sizes and rank")
        feeds[name] = arr
    return feeds


def _observe(graph, source: bytes, feeds: dict) -> None:
    """Concrete shapes of the tensors shape inference left open (data-dependent sizes), measured on the sample
    inputs."""
    import onnx
    from onnx import helper


    missing = [t for t in graph.producer if graph.info.get(t) is None or graph.info[t].concrete is None]
    if not missing:
        return
    model = onnx.load_from_string(source)
    have = {o.name for o in model.graph.output}
    for t in missing:
        info = graph.info.get(t)
        if t not in have and info is not None and info.elem:
            model.graph.output.append(helper.make_tensor_value_info(t, info.elem, None))
    names = [t for t in missing if graph.info.get(t) is not None and graph.info[t].elem]
    try:
        values = run_plain(model.SerializeToString(), feeds, names)
    except Exception:  # noqa: BLE001 - the chain check reports what fails; sizes stay unknown
        return
    for t, v in zip(names, values):
        graph.info[t].concrete = list(v.shape)
        graph.info[t].observed = True


def _preprocess_nodes(model, graph, path: Path) -> set[int]:
    """The nodes between the `optkit.preprocess` metadata's input and outputs (exit 2 on a malformed entry)."""

    raw = next((p.value for p in model.metadata_props if p.key == META_KEY), None)
    if raw is None:
        return set()
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        raise UsageError(f"{path}: metadata {META_KEY} is not JSON") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("input"), str) or not isinstance(
            meta.get("outputs"), list) or not all(isinstance(o, str) for o in meta["outputs"]):
        raise UsageError(f"{path}: metadata {META_KEY} must be {{\"input\": name, \"outputs\": [names], ...}}")
    if meta["input"] not in graph.inputs:
        raise UsageError(f"{path}: metadata {META_KEY}.input {meta['input']!r} is not an input of the model")
    bad = [o for o in meta["outputs"] if o not in graph.producer]
    if bad:
        raise UsageError(f"{path}: metadata {META_KEY}.outputs names {bad[0]!r}, which no node produces")
    start = set(graph.readers.get(meta["input"], ()))
    ends = {graph.producer[o] for o in meta["outputs"]}
    return graph.descendants(start) & graph.ancestors(ends) | ends


def _boundary(model, graph) -> list[int]:
    """The nodes producing the `optkit.preprocess` metadata's outputs: the cut points of cuts="preprocess"."""
    meta = json.loads(next(p.value for p in model.metadata_props if p.key == META_KEY))
    return sorted({graph.producer[o] for o in meta["outputs"]})


def _preprocess_bytes(model, graph) -> int | None:

    meta = json.loads(next(p.value for p in model.metadata_props if p.key == META_KEY))
    sizes = [_nbytes(graph, o) for o in meta["outputs"]]
    return None if None in sizes else sum(sizes)


def _picks(model, graph, names: list[str], lay) -> list[int]:
    """Node indices for --cut names (exit 2: empty, missing, a Constant, or inside a subgraph; a message names
    another node only where a cut there would be taken)."""

    index = {n.name: i for i, n in enumerate(graph.nodes) if n.name}
    consts = {n.name for n in graph.constants.values() if n.name}
    inner = {}
    for node in model.graph.node:
        for sub in subgraphs(node):
            for n in all_nodes(sub):
                if n.name:
                    inner.setdefault(n.name, node)
    unnamed = sum(1 for n in graph.nodes if not n.name)
    out = []
    for name in names:
        if name in index:
            out.append(index[name])
        elif not name.strip():
            raise UsageError(f"--cut {name!r}: a node name cannot be empty" + (
                f"; {unnamed} of the model's {graph.n} nodes have no name and cannot be cut at by name: use --cut auto"
                if unnamed else "; give a node's name or use --cut auto"))
        elif name in inner:
            parent = inner[name]
            where = f"a cut cannot go through a subgraph, cut at {parent.name} instead" if parent.name and (
                C.refusal(graph, lay, [index[parent.name]]) is None) else (
                f"a cut cannot go through a subgraph nor right after {parent.op_type} {parent.name or '(unnamed)'}; "
                "name another node or use --cut auto")
            raise UsageError(f"--cut {name}: the node lies inside a subgraph of {parent.op_type} "
                             f"{parent.name or '(unnamed)'}; {where}")
        elif name in consts:
            raise UsageError(f"--cut {name}: a Constant node is copied into every part that reads it; name another "
                             "node")
        else:
            raise UsageError(f"--cut {name}: no node of that name in the model (see the node names with optkit "
                             "split --json or a graph viewer)" + (
                                 f"; {unnamed} of its {graph.n} nodes have no name: use --cut auto for those"
                                 if unnamed else ""))
    return out
