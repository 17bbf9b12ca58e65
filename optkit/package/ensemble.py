"""A model in parts, as a package reads it: `optkit split`'s folder (DIR/split.json and its part files) or an ONNX
model with preprocessing in its graph (metadata `optkit.preprocess`, cut at the preprocessing boundary into a CPU
`pre` part and the `core`). Either becomes a Plan: the parts in order, each with its file, device and signature,
wired by tensor name; a target serves it as an ensemble (Triton: one model per part and an ensemble model).

split.json is input like any file optkit reads back: its contract (optkit/contracts/split.py), and every problem
is one line naming the file and the key (exit 2) before anything is written: a corrupt file, a part file missing
or not the one recorded (sha256), a part whose inputs or outputs are not its graph's, a tensor no part produces.
Schema 3 (what `optkit split` writes) records the split model's sha256 (the plan's `model_sha256`: a tune or
capacity of that model is taken for the parts) and each part's; schema 2 each part's; schema 1 (split as first
landed) is read with a note that its parts were not checked. A model with preprocessing is cut by optkit.split
itself (cuts="preprocess"): one way of cutting.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optkit.contracts import base
from optkit.contracts import split as contract
from optkit.contracts.split import TensorSpec
from optkit.core.errors import UsageError
from optkit.package.signature import DTYPES, Signature, Tensor, signature_of
from optkit.split import PREPROCESS, split_model

SPLIT_FILE = contract.FILE
PREPROCESS_KEY = "optkit.preprocess"
ROLES = contract.PART_NAMES
HINT = contract.HINT
# ONNX type names (as split.json may spell a dtype) -> numpy's
_ONNX_NAMES = {"float": "float32", "double": "float64", "float16": "float16", "bfloat16": "bfloat16", "bool": "bool",
               "string": "object", **{n: n for _, n in DTYPES.values()}}

@dataclass
class Part:
    role: str                   # pre, core, post
    path: Path
    device: str                 # cpu, gpu (the split's intent; --gpu decides where the core runs)
    sha256: str
    sig: Signature
    why: str = ""
    ops: dict[str, int] = field(default_factory=dict)


@dataclass
class Plan:
    kind: str                   # "split" (a split folder) or "preprocess" (a model with preprocessing in its graph)
    source: Path                # split.json, or the model
    source_sha256: str
    inputs: list[Tensor]        # the ensemble's: the original model's inputs and outputs, as the parts have them
    outputs: list[Tensor]
    parts: list[Part]
    cuts: list[dict]
    batchable: bool
    notes: list[str] = field(default_factory=list)
    tmp: Path | None = None     # a folder of parts cut here (removed by the caller)
    model_sha256: str | None = None  # the model that was split (None: a split.json before schema 3)

    @property
    def core(self) -> Part:
        return next(p for p in self.parts if p.role == "core")

    def record(self) -> dict[str, Any]:
        """What the lineage keeps of the split (the parts' own files are listed per part by the target)."""
        return {"kind": self.kind, "source": str(self.source), "source_sha256": self.source_sha256,
                **({"model_sha256": self.model_sha256} if self.model_sha256 else {}),
                "parts": [{"name": p.role, "file": p.path.name, "sha256": p.sha256, "device": p.device,
                           "why": p.why, "ops": p.ops} for p in self.parts],
                "cuts": self.cuts}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_json(model: str | Path) -> Path | None:
    """DIR/split.json when `model` names a split folder or its split.json; None for anything else."""
    p = Path(model)
    if p.is_dir():
        return p / SPLIT_FILE if (p / SPLIT_FILE).exists() or (p / SPLIT_FILE).is_symlink() else None
    return p if p.name == SPLIT_FILE else None


def preprocess_meta(proto) -> dict | None:
    """The model's `optkit.preprocess` metadata, or None."""
    for prop in proto.metadata_props:
        if prop.key == PREPROCESS_KEY:
            return {"text": prop.value}
    return None


def detect(model: str | Path) -> Plan | None:
    """The model as parts, or None for a plain model (packaged as one). A split folder without split.json is
    exit 2 (a folder is not a model)."""
    p = Path(model)
    found = split_json(p)
    if found is not None:
        return read_split(found)
    if p.is_dir():
        raise UsageError(f"{model} is a folder without {SPLIT_FILE}; give an ONNX model or a folder `optkit split` "
                         "wrote")
    if p.suffix.lower() != ".onnx" or not p.is_file():
        return None
    import onnx

    try:
        proto = onnx.load(str(p), load_external_data=False)
    except Exception:  # noqa: BLE001 - the plain path reports an unreadable model in its own words
        return None
    meta = preprocess_meta(proto)
    return None if meta is None else cut_preprocess(p, meta["text"])


# ------------------------------------------------------------------ split.json

def read_split(path: Path) -> Plan:
    if not (path.exists() or path.is_symlink()):
        raise UsageError(f"{path} does not exist; give a folder `optkit split` wrote (it holds {SPLIT_FILE})")
    _, doc = base.load(path, contract.SplitFile, HINT, links=True)
    return _split_plan(doc, path.parent, str(path), path, sha256_of(path))


def from_split(doc: dict, folder: Path, where: str) -> Plan:
    """The plan of a split a recipe's split stage made (its split.json document, in memory: no file read back)
    whose parts are in `folder`, checked as read_split checks a file."""
    model = base.validate(doc, contract.SplitFile, where, HINT)
    text = base.text(model)
    return _split_plan(model, folder, where, folder / SPLIT_FILE, hashlib.sha256(text.encode()).hexdigest())


def _split_plan(doc: contract.SplitFile, folder: Path, where: str, source: Path, digest: str) -> Plan:
    roles = [p.name for p in doc.parts]
    if len(set(roles)) != len(roles) or roles != sorted(roles, key=ROLES.index):
        raise UsageError(f"{where}: key parts: {roles} is not pre, core, post in order, each once; {HINT}")
    if "core" not in roles:
        raise UsageError(f"{where}: key parts: no core part; {HINT}")
    parts = []
    for i, spec in enumerate(doc.parts):
        key = f"parts.{i}"
        f = folder / spec.file
        if Path(spec.file).is_absolute() or ".." in Path(spec.file).parts or f.parent.resolve() != folder.resolve():
            raise UsageError(f"{where}: key {key}.file: {spec.file!r} is not a file of the split folder; {HINT}")
        if f.is_symlink() or not f.is_file():
            raise UsageError(f"{where}: key {key}.file: {f} is missing (or not a regular file); {HINT}")
        digest = sha256_of(f)
        if spec.sha256 is not None and spec.sha256 != digest:
            raise UsageError(f"{where}: key {key}.sha256: {f.name} is not the file the split wrote (its sha256 is "
                             f"{digest[:12]}..., recorded {spec.sha256[:12]}...); {HINT}")
        sig = _part_signature(f, where, key)
        for role, declared, have in (("inputs", spec.inputs, sig.inputs), ("outputs", spec.outputs, sig.outputs)):
            _match(declared, have, where, f"{key}.{role}", f.name)
        parts.append(Part(spec.name, f, spec.device, digest, sig, spec.why, dict(spec.ops)))
    inputs, outputs = _wire(parts, [t.name for t in doc.inputs], [t.name for t in doc.outputs], where)
    for role, declared, have in (("inputs", doc.inputs, inputs), ("outputs", doc.outputs, outputs)):
        _match(declared, have, where, role, "the parts")
    plan = _plan("split", source, digest, inputs, outputs, parts, [c.model_dump(by_alias=True) for c in doc.cuts])
    plan.model_sha256 = doc.model_sha256
    if doc.schema_ == 1 and any(spec.sha256 is None for spec in doc.parts):
        plan.notes.append(f"{source.name} is schema 1 (before parts carried a sha256): its part files are packaged "
                          "as found; split the model again to have them checked")
    return plan


def _part_signature(f: Path, where: str, key: str) -> Signature:
    import onnx

    try:
        proto = onnx.load(str(f), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf's errors: one line
        raise UsageError(f"{where}: key {key}.file: {f.name} is not a readable ONNX model ({type(e).__name__}); "
                         f"{HINT}") from None
    try:
        return signature_of(proto, f)
    except UsageError as e:
        raise UsageError(f"{where}: key {key}.file: {e.message}") from None


def _dtype(name: str) -> str | None:
    n = name.lower()
    return _ONNX_NAMES.get(n) or (n if n in _ONNX_NAMES.values() else None)


def _match(declared: list[TensorSpec], have: list[Tensor], where: str, key: str, what: str) -> None:
    """The declared tensors are the graph's: the same names in order, dtypes, ranks and fixed dims."""
    names = [t.name for t in declared]
    if names != [t.name for t in have]:
        raise UsageError(f"{where}: key {key}: {names} are not the {key.rsplit('.', 1)[-1]} of {what} "
                         f"({[t.name for t in have]}); {HINT}")
    for i, (d, t) in enumerate(zip(declared, have)):
        if _dtype(d.dtype) != t.numpy_dtype:
            raise UsageError(f"{where}: key {key}.{i}.dtype: {d.dtype!r}, but {what} has {t.numpy_dtype} for "
                             f"{t.name!r}; {HINT}")
        fixed = [s if isinstance(s, int) and s > 0 else -1 for s in d.shape]
        if len(fixed) != len(t.dims) or any(a != -1 and b != -1 and a != b for a, b in zip(fixed, t.dims)):
            raise UsageError(f"{where}: key {key}.{i}.shape: {d.shape} does not fit {t.name!r} of {what} "
                             f"({t.dims}, -1 dynamic); {HINT}")


def _wire(parts: list[Part], inputs: list[str], outputs: list[str], where: str) -> tuple[list[Tensor], list[Tensor]]:
    """Each part's inputs are original inputs or earlier parts' outputs; every original output is produced; no
    tensor is produced twice. Returns the ensemble's inputs and outputs as the parts have them."""
    known: dict[str, Tensor] = {}
    first_use: dict[str, Tensor] = {}
    for i, part in enumerate(parts):
        for t in part.sig.inputs:
            if t.name in known:
                if known[t.name].elem_type != t.elem_type:
                    raise UsageError(f"{where}: key parts.{i}.inputs: {t.name!r} is {t.numpy_dtype} here but "
                                     f"{known[t.name].numpy_dtype} where it is made; {HINT}")
                continue
            if t.name not in inputs:
                raise UsageError(f"{where}: key parts.{i}.inputs: {t.name!r} is neither an input of the model nor "
                                 f"an output of an earlier part (no part produces it); {HINT}")
            first_use.setdefault(t.name, t)
        for t in part.sig.outputs:
            if t.name in known or t.name in inputs:
                raise UsageError(f"{where}: key parts.{i}.outputs: {t.name!r} is produced twice; {HINT}")
            known[t.name] = t
    missing = [n for n in inputs if n not in first_use]
    if missing:
        raise UsageError(f"{where}: key inputs: {missing[0]!r} is an input of the model that no part takes; {HINT}")
    absent = [n for n in outputs if n not in known]
    if absent:
        raise UsageError(f"{where}: key outputs: {absent[0]!r} is an output of the model that no part produces "
                         f"({HINT})")
    return [first_use[n] for n in inputs], [known[n] for n in outputs]


def _plan(kind, source, digest, inputs, outputs, parts, cuts, tmp=None) -> Plan:
    every = [t for p in parts for t in p.sig.inputs + p.sig.outputs]
    batchable = all(t.dims and t.dims[0] == -1 for t in every)
    notes = [] if batchable else ["the parts are served without batching (max_batch_size 0): a part's first dim "
                                  "is not a dynamic batch axis in every input and output"]
    return Plan(kind, source, digest, inputs, outputs, parts, cuts, batchable, notes, tmp)


# ------------------------------------------------------------------ a model with preprocessing in its graph

def cut_preprocess(model: Path, meta_text: str) -> Plan | None:
    """pre (the preprocessing, on the CPU) + core (+ post where placement needs one), cut by `optkit split` at the
    metadata's boundary (split_model(cuts="preprocess"): the same parts, checks and split.json as `optkit split
    --cut` at those nodes), written to a temporary folder the caller removes. None when the split finds nothing
    to split (the model is then packaged as one)."""
    where = f"{model}: metadata {PREPROCESS_KEY}"
    try:
        meta = json.loads(meta_text)
        if not isinstance(meta, dict) or not isinstance(meta.get("input"), str) or \
                not isinstance(meta.get("outputs"), list) or not meta["outputs"]:
            raise TypeError
    except (ValueError, TypeError):
        raise UsageError(f"{where}: not {{\"input\": name, \"outputs\": [tensor names], ...}}; run `optkit "
                         "preprocess` again") from None
    tmp = Path(tempfile.mkdtemp(prefix="optkit-cut-"))
    try:
        doc = split_model(model, tmp / "split", provider="tensorrt", cuts=PREPROCESS)
        if not doc["parts"]:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        plan = from_split(doc, tmp / "split", where)  # the document split returned: no file read back
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    plan.kind, plan.source, plan.source_sha256, plan.tmp = "preprocess", model, sha256_of(model), tmp
    return plan
