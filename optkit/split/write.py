"""The parts as ONNX models, the chain check, and the output folder (written whole or not at all)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from optkit.contracts import base
from optkit.contracts import split as contract
from optkit.core.atomic import commit_folder
from optkit.core.errors import OptkitError, UsageError, ValidationError
from optkit.core.locks import locked_output
from optkit.onnx.session import ort_session
from optkit.split.cuts import PART_NAMES
from optkit.split.graph import Graph

PART_FILES = tuple(f"{p}.onnx" for p in PART_NAMES)
DOC = contract.FILE
SCHEMA = contract.SCHEMA
META_KEY = "optkit.preprocess"


def part_io(graph: Graph, levels: list[int], part: int) -> tuple[list[int], list[str], list[str]]:
    """(node indices, input tensors, output tensors) of one part, wired by tensor name."""
    idx = [i for i, lv in enumerate(levels) if lv == part]
    produced = {o for i in idx for o in graph.nodes[i].output if o}
    inputs: list[str] = []
    for i in idx:
        for t in graph.reads[i]:
            if t not in produced and not graph.is_const(t) and t not in inputs:
                inputs.append(t)
    ordered = [t for t in graph.inputs if t in inputs]
    inputs = ordered + [t for t in inputs if t not in ordered]
    outputs = [t for t in graph.outputs if t in produced]
    for i in idx:
        for t in graph.nodes[i].output:
            if t and t not in outputs and any(levels[r] != part for r in graph.readers.get(t, ())):
                outputs.append(t)
    return idx, inputs, outputs


def _value_info(graph: Graph, name: str):
    from onnx import helper

    info = graph.info.get(name)
    if info is None or info.elem is None:
        raise ValidationError(f"the type of tensor {name!r} could not be inferred, so it cannot be a part's input "
                              "or output; cut elsewhere")
    shape = None if info.shape is None else [d if isinstance(d, int) else (d or None) for d in info.shape]
    return helper.make_tensor_value_info(name, info.elem, shape)


def extract(graph: Graph, levels: list[int], part: int, keep_meta: bool):
    """One part as a model: its nodes, the Constant nodes and initializers they read, the model's opsets and
    functions; inputs and outputs keep their names."""
    import onnx
    from onnx import helper

    src = graph.model
    idx, inputs, outputs = part_io(graph, levels, part)
    reads = {t for i in idx for t in graph.reads[i]}
    nodes = [graph.constants[t] for t in graph.constants if t in reads] + [graph.nodes[i] for i in idx]
    inits = [t for t in src.graph.initializer if t.name in reads]
    sparse = [t for t in src.graph.sparse_initializer if t.values.name in reads]
    g = helper.make_graph(nodes, f"{src.graph.name or 'model'}_{PART_NAMES[part]}",
                          [_value_info(graph, t) for t in inputs], [_value_info(graph, t) for t in outputs],
                          initializer=inits, sparse_initializer=sparse)
    model = helper.make_model(g, opset_imports=list(src.opset_import), functions=list(src.functions))
    model.ir_version = src.ir_version
    model.producer_name, model.producer_version = src.producer_name, src.producer_version
    model.domain, model.model_version = src.domain, src.model_version
    for prop in src.metadata_props:
        if prop.key != META_KEY or keep_meta:
            model.metadata_props.add(key=prop.key, value=prop.value)
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - the checker raises several types
        raise ValidationError(f"the {PART_NAMES[part]} part is not a valid ONNX model: {str(e).splitlines()[0]}") from None
    return model, inputs, outputs


def run_plain(model_bytes: bytes, feeds: dict, names: list[str]) -> list[np.ndarray]:
    """onnxruntime on the CPU, graph optimizations off, one thread: the same kernels on the same values give the
    same bits, whichever part a node is in."""
    sess = ort_session(model_bytes, threads=1, optimize=False)
    wanted = {i.name for i in sess.get_inputs()}
    return sess.run(names, {k: v for k, v in feeds.items() if k in wanted})


def check_chain(original: bytes, parts: list[tuple[bytes, list[str]]], feeds: dict, outputs: list[str]) -> dict:
    """Run the original and the chain of parts on `feeds`; every output must be bit-exact equal (exit 3)."""
    want = dict(zip(outputs, run_plain(original, feeds, outputs)))
    env = dict(feeds)
    for data, names in parts:
        env.update(zip(names, run_plain(data, env, names)))
    for name in outputs:
        a, b = want[name], env.get(name)
        if b is None:
            raise ValidationError(f"the chain of parts does not produce output {name!r}")
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValidationError(f"output {name!r} of the chain is {b.dtype}{list(b.shape)}, the original's "
                                  f"{a.dtype}{list(a.shape)}; nothing written")
        same = (a == b) | ((a != a) & (b != b)) if a.dtype.kind == "f" else a == b
        if not np.all(same):
            bad = int(np.size(same) - np.count_nonzero(same))
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.dtype.kind in "fiub" else 0
            raise ValidationError(f"output {name!r} of the chain differs from the original's in {bad} of "
                                  f"{np.size(same)} values (max abs {diff:.3g}); nothing written")
    return {"samples": 1, "outputs": len(outputs), "bit_exact": True,
            "runtime": "onnxruntime CPU, graph optimizations off"}


# -- the output folder ------------------------------------------------------------------------------------------
def write_doc(folder: Path, doc: dict) -> None:
    """FOLDER/split.json through its contract (exit 3 if a reader would refuse what split computed)."""
    (folder / DOC).write_text(base.text(contract.document(doc)), encoding="utf-8")


def split_output_problem(path: Path) -> str | None:
    """Why `path` is not a complete folder optkit split wrote, or None when it is one: a split.json its contract
    reads, listing its parts, each part file there (a regular file, sha256 as recorded from schema 2), nothing
    else."""
    import hashlib

    try:
        entries = list(path.iterdir())
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    names = {p.name for p in entries}
    if DOC not in names:
        return f"has no {DOC}"
    if (path / DOC).is_symlink():
        return f"holds a {DOC} that is a symbolic link"
    try:
        doc = base.load(path / DOC, contract.SplitFile, contract.HINT)[1]
    except OptkitError as e:
        said = e.message.removeprefix(f"{path / DOC}: ").removesuffix(f"; {contract.HINT}")
        return f"has a {DOC} its contract refuses: {said[:200]}"
    listed = [p.file for p in doc.parts]
    if not all(f in PART_FILES for f in listed) or len(set(listed)) != len(listed):
        return f"has a {DOC} whose parts' files are not {', '.join(PART_FILES)}, each once"
    extra = sorted(names - set(listed) - {DOC})
    if extra:
        return f"holds {extra[0][:80]!r}, which its {DOC} does not list"
    for part, name in zip(doc.parts, listed):
        f = path / name
        if name not in names:
            return f"lacks {name}, which its {DOC} lists"
        if f.is_symlink() or not f.is_file():
            return f"holds {name} that is not a regular file"
        if part.sha256 is not None:
            digest = hashlib.sha256()
            try:
                with open(f, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(block)
            except OSError as e:
                return f"holds {name} that cannot be read ({e.strerror or e})"
            if part.sha256 != digest.hexdigest():
                return f"holds {name} whose sha256 is not the one its {DOC} records"
    return None


def is_split_output(path: Path) -> bool:
    """A complete folder optkit split wrote (split_output_problem finds nothing)."""
    return split_output_problem(path) is None


def check_out_dir(out_dir: Path, model: Path) -> None:
    """Exit 2 before any work (and again under the lock, before the commit) unless DIR is new, empty, or a
    complete previous split output, and does not hold the model."""
    if out_dir.is_symlink():
        raise UsageError(f"output folder {out_dir} is a symbolic link; name the real folder")
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"output {out_dir} exists and is not a folder; optkit split writes a folder of parts")
    parent = out_dir.parent
    if not parent.is_dir():
        raise UsageError(f"output folder's parent {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"output folder's parent {parent} is not writable")
    with contextlib.suppress(OSError):
        if Path(os.path.realpath(model)).parent == Path(os.path.realpath(out_dir)):
            raise UsageError(f"output folder {out_dir} holds the input model {model}; choose another folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        problem = split_output_problem(out_dir)
        if problem is not None:
            raise UsageError(f"output folder {out_dir} is not empty and is not a previous optkit split output (it "
                             f"{problem}); nothing in it is overwritten: choose a new or empty folder")


def commit(tmp: Path, out_dir: Path, model: Path, on_wait=None) -> None:
    """The staged parts into DIR (core.atomic.commit_folder), under DIR's lock (its parent's while DIR is new), DIR
    checked again under it: a second run waits for the first (`on_wait()` when it starts waiting), then replaces its
    output."""
    with locked_output(out_dir, on_wait):
        check_out_dir(out_dir, model)   # again under the lock: another run may have written it since
        commit_folder(tmp, out_dir, ours=ours, last=DOC)


def ours(path: Path) -> bool:
    """What a split may replace: an empty folder, or a complete previous split output (core.atomic.commit_folder
    replaces it entry by entry, split.json last)."""
    return not any(path.iterdir()) or is_split_output(path)
