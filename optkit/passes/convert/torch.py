"""convert.torch: PyTorch -> ONNX through torch.onnx (dynamo by default, TorchScript exporter as fallback)."""
from __future__ import annotations

import contextlib
import io
import re
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from optkit.core.artifact import Artifact
from optkit.core.batching import count, run_batched
from optkit.core.errors import OptkitError, PassError, UsageError, ValidationError
from optkit.core.formats import Format
from optkit.core.registry import PassContext, require_extra
from optkit.core.shapes import TensorSpec, check_unused
from optkit.core.text import first_line
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx.io import Staging
from optkit.onnx.session import ort_session, spec_of
from optkit.passes.convert.common import check_model, choose_opset, unsupported_nodes, validate, validation_feeds
from optkit.runtimes.torch import (
    example_from_program,
    flatten,
    forward_names,
    load_program,
    load_torch_model,
    load_weights,
)

PASS = "convert.torch"


def convert_torch(artifact: Artifact, config, ctx: PassContext) -> Artifact:
    require_extra("torch", "convert.torch")
    import torch

    model, examples, names = load_model(artifact, config)
    specs, tensors = input_specs(artifact, examples, names, ctx)
    asked = parse_dynamic(config.dynamic, specs)
    if config.static_batch and any(d.get(0) == "batch" for d in asked.values()):
        raise UsageError("static_batch (--static-batch) fixes the batch axis that dynamic: [batch] (--dynamic batch) "
                         "makes dynamic; give one of them")
    defaulted = {} if config.static_batch else {s.name: {0: "batch"} for s in specs
                                                  if s.shape and 0 not in asked.get(s.name, {})}
    try:
        with torch.inference_mode():
            sample_out = flatten(_call(model, tensors))
    except Exception as e:  # noqa: BLE001 - user code
        raise UsageError(f"the model fails on inputs of shape "
                         f"{', '.join(str(list(t.shape)) for t in tensors)}: {type(e).__name__}: {first_line(e)}"
                         ) from None
    out_names = ["output"] if len(sample_out) == 1 else [f"output_{i}" for i in range(len(sample_out))]
    export_obj = model
    if artifact.format == Format.TORCH_EXPORT:
        export_obj = artifact.meta.pop("_program", None) or model
    with Staging(ctx.output) as stage:
        # the batch axis is dynamic unless --static-batch; a model whose first axis cannot vary (it does not
        # export that way, or the export does not run or match at batch 1) keeps it fixed, with a note
        tries = [{s.name: {**asked.get(s.name, {}), **defaulted.get(s.name, {})} for s in specs
                  if s.name in asked or s.name in defaulted}] if defaulted else []
        tries.append(asked)
        for i, dynamic in enumerate(tries):
            grown = tuple(_grow_dynamic(t, dynamic.get(s.name, {})) for s, t in zip(specs, tensors))
            last = i == len(tries) - 1
            attempt = config if last or config.exporter != "dynamo" else config.model_copy(update={"fallback": False})
            try:
                used, figures = _export_with_opset_retry(export_obj, model, grown, specs, out_names, dynamic,
                                                         attempt, stage, ctx, names, batch_check=not last)
                break
            except OptkitError as e:
                if last:
                    raise
                ctx.note(f"the batch axis stays fixed: with a dynamic batch, {first_line(e)}; --static-batch "
                         "skips this try")
        ctx.measurements["validation"] = figures
        stage.commit()
    artifact.meta.setdefault("input_names", names)
    return artifact.derive(ctx.output, Format.ONNX, PASS, config.model_dump(mode="json"),
                           exporter=used, opset=figures["opset"], input_names=names, output_names=out_names)


def _export_with_opset_retry(export_obj, model, tensors, specs, out_names, dynamic, config, stage, ctx, names,
                             batch_check: bool):
    try:
        return _export_and_validate(export_obj, model, tensors, specs, out_names, dynamic, config, stage, ctx,
                                    names, batch_check)
    except _RuntimeFailure as e:
        if config.opset is not None:
            raise PassError(str(e)) from None
        # onnxruntime may not run every op of the newest opset (e.g. opset 23 Attention with broadcast masks)
        retry = config.model_copy(update={"opset": e.opset - 1})
        try:
            used, figures = _export_and_validate(export_obj, model, tensors, specs, out_names, dynamic, retry,
                                                 stage, ctx, names, batch_check)
        except _RuntimeFailure as again:
            raise PassError(str(again)) from None
        ctx.note(f"onnxruntime could not run the opset {e.opset} export ({e.detail}); exported at opset "
                 f"{e.opset - 1}")
        return used, figures


class _RuntimeFailure(Exception):
    def __init__(self, opset: int, detail: str):
        super().__init__(f"onnxruntime cannot run the exported model (opset {opset}): {detail}")
        self.opset = opset
        self.detail = detail


def _export_and_validate(export_obj, model, tensors, specs, out_names, dynamic, config, stage, ctx, names,
                         batch_check: bool = False):

    used = export_module(export_obj, model, tensors, specs, out_names, dynamic, config, stage.model, ctx)
    proto = onnx_io.load(stage.model, external_data=False)
    bad = unsupported_nodes(proto)
    if bad:
        domain, op, node = bad[0]
        raise PassError(f"the exported model contains op {domain + '::' if domain else ''}{op} (node {node!r}) "
                        "that is not a standard ONNX operator; onnxruntime cannot run it")
    stage.finalize(config.external_data, ctx)
    check_model(stage.model)
    opset = graph.opset(proto)  # finalize() re-saves the same graph: its opset is unchanged
    try:
        figures = _validate(model, names, stage.model, specs, config, ctx, batch_check)
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime errors
        detail = re.sub(r"\s+", " ", first_line(e))
        m = re.search(r"running (\w+) node\. Name:'([^']+)'", detail)
        raise _RuntimeFailure(opset, f"{m[1]} node {m[2]!r}" if m else detail[:200]) from None
    figures["exporter"] = used
    figures["opset"] = opset
    return used, figures


# ------------------------------------------------------------------------------------------------ loading


def load_model(artifact: Artifact, config):
    """(module in eval mode, example inputs or None, input names)."""

    weights = artifact.meta.get("weights")
    if weights and artifact.format != Format.TORCH_MODULE:
        raise UsageError(f"weights (--weights) applies to a factory (file.py:make_model); {artifact.path} already "
                         f"holds weights")
    bare = replace(artifact, meta={k: v for k, v in artifact.meta.items() if k != "weights"})
    if artifact.format == Format.TORCH_EXPORT:
        program = load_program(artifact.path)
        artifact.meta["_program"] = program

        examples = example_from_program(program)
        examples = tuple(_real(t) for t in examples) if examples else None
        names = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        return program.module(), examples, names
    model, examples = load_torch_model(bare)
    if weights:
        load_weights(model, weights)
    names = forward_names(model, len(examples) if examples else None)
    return model, examples, names


def _real(t):
    import torch

    if getattr(t, "fake_mode", None) is not None or type(t).__name__ == "FakeTensor":
        shape = [int(d) if str(d).isdigit() else 2 for d in t.shape]
        return torch.zeros(shape, dtype=t.dtype)
    return t


def input_specs(artifact: Artifact, examples, names: list[str], ctx: PassContext):
    """TensorSpecs (dim 0 dynamic) and concrete export tensors, from examples, --shape or the data."""
    import torch

    check_unused(ctx.shapes, names)
    data = ctx.data.get("eval") or ctx.data.get("calibration")
    gen = torch.Generator().manual_seed(ctx.seed)
    specs, tensors = [], []
    for i, name in enumerate(names):
        ex = examples[i] if examples and i < len(examples) else None
        override = ctx.shapes.get(name, ctx.shapes.get("") if len(names) == 1 else None)
        dtype = ex.dtype if ex is not None else torch.float32
        if override is not None:
            shape = list(override)
        elif ex is not None:
            shape = list(ex.shape)
        elif data is not None and (name in data.arrays or (len(names) == 1 and "" in data.arrays)):
            arr = data.arrays.get(name, data.arrays.get(""))
            shape = [1, *arr.shape[1:]]
            if np.issubdtype(arr.dtype, np.integer):
                dtype = torch.int64
        else:
            raise UsageError(f"{artifact.path} does not say what input {name!r} looks like: give shapes "
                             f"(--shape {name}=DIMS) or data (--data), or define example_inputs() next to the factory")
        if ex is not None and list(ex.shape) == shape and override is None:
            t = ex.detach().clone()
        elif dtype.is_floating_point:
            t = torch.rand(shape, generator=gen, dtype=torch.float32).to(dtype)
        elif dtype == torch.bool:
            t = torch.ones(shape, dtype=torch.bool)
        else:
            t = torch.zeros(shape, dtype=dtype)
        tensors.append(t)
        specs.append(TensorSpec(name, list(shape), str(dtype).replace("torch.", "")))
    return specs, tuple(tensors)


def parse_dynamic(items: list[str], specs: list[TensorSpec]) -> dict[str, dict[int, str]]:
    """'batch' (dim 0 of every input) or NAME:DIM[=LABEL] / *:DIM[=LABEL] -> {input: {dim: label}}."""
    names = [s.name for s in specs]
    ranks = {s.name: len(s.shape) for s in specs}
    axes: dict[str, dict[int, str]] = {}
    for item in items:
        item = item.strip()
        if item == "batch":
            for n in names:
                axes.setdefault(n, {})[0] = "batch"
            continue
        m = re.fullmatch(r"(?P<name>[^:=]+):(?P<dim>-?\d+)(?:=(?P<label>\w+))?", item)
        if not m:
            raise UsageError(f"bad dynamic (--dynamic) {item!r}: write 'batch' or NAME:DIM[=LABEL] (e.g. input_ids:1=seq)")
        targets = names if m["name"] == "*" else [m["name"]]
        for n in targets:
            if n not in ranks:
                raise UsageError(f"dynamic (--dynamic) names input {n!r}, but the model's inputs are {', '.join(names)}")
            dim = int(m["dim"]) % ranks[n] if ranks[n] else 0
            if not 0 <= int(m["dim"]) + (ranks[n] if int(m["dim"]) < 0 else 0) < ranks[n]:
                raise UsageError(f"dynamic (--dynamic) {item!r}: input {n!r} has {ranks[n]} dims")
            axes.setdefault(n, {})[dim] = m["label"] or ("batch" if dim == 0 else f"{n}_dim{dim}")
    return axes


def _grow_dynamic(t, dims: dict[int, str]):
    """torch.export specializes dims of size 0 or 1: export with 2 where a dynamic dim has size 1."""
    for d in dims:
        if t.shape[d] == 1:
            t = t.repeat_interleave(2, dim=d) if t.dtype.is_floating_point else t.expand(
                *[2 if i == d else -1 for i in range(t.dim())]).clone()
    return t


def _is_script(model) -> bool:
    import torch

    return isinstance(model, torch.jit.ScriptModule)


def _call(model, tensors):
    return model(*tensors)


# ------------------------------------------------------------------------------------------------ export


def export_module(export_obj, model, tensors, specs, out_names, dynamic, config, dest: Path, ctx: PassContext) -> str:
    """Export with the chosen exporter (_export_with), then write residual Adds into LayerNorms as Sum
    (graph.residual_sums: onnxruntime would otherwise fuse them into a kernel that rounds further from torch).
    Returns the exporter used."""
    used = _export_with(export_obj, model, tensors, specs, out_names, dynamic, config, dest, ctx)
    proto = onnx_io.load(dest, external_data=False)
    if graph.residual_sums(proto):
        onnx_io.save(proto, dest)
    return used


def _export_with(export_obj, model, tensors, specs, out_names, dynamic, config, dest: Path, ctx: PassContext) -> str:
    """Export with the chosen exporter; dynamo failures fall back to the TorchScript exporter. Returns the one used."""
    from torch.onnx import _constants

    if config.exporter == "dynamo" and _is_script(model):
        ctx.note("TorchScript models go through the TorchScript exporter (the dynamo exporter cannot take a "
                 "ScriptModule)")
    elif config.exporter == "dynamo":
        opset = choose_opset(config.opset, _constants.ONNX_MAX_OPSET, "the dynamo exporter")
        try:
            _export_dynamo(export_obj, tensors, specs, out_names, dynamic, opset, dest)
            return "dynamo"
        except OptkitError:
            raise
        except Exception as e:  # noqa: BLE001 - the exporter raises many types
            dynamo_error = _describe_export_error(e)
            if not config.fallback:
                raise PassError(f"the dynamo exporter failed: {dynamo_error}") from None
        try:
            opset = choose_opset(min(config.opset or 99, _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET)
                                 if config.opset else None,
                                 _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET, "the TorchScript exporter")
            _export_legacy(model, tensors, specs, out_names, dynamic, opset, dest)
        except OptkitError:
            raise
        except Exception as e:  # noqa: BLE001
            raise PassError(f"export failed: the dynamo exporter: {dynamo_error}; the TorchScript exporter "
                            f"(fallback): {_describe_export_error(e)}") from None
        ctx.note(f"the dynamo exporter failed ({dynamo_error}); exported with the TorchScript exporter instead")
        return "legacy (fallback)"
    opset = choose_opset(config.opset, _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET, "the TorchScript exporter")
    try:
        _export_legacy(model, tensors, specs, out_names, dynamic, opset, dest)
    except OptkitError:
        raise
    except Exception as e:  # noqa: BLE001
        raise PassError(f"the TorchScript exporter failed: {_describe_export_error(e)}") from None
    return "legacy"


@contextlib.contextmanager
def _quiet():
    import logging

    levels = {}
    for name in ("torch.onnx", "torch.export", "torch._dynamo", "torch._export", "onnxscript", "torch.fx"):
        levels[name] = logging.getLogger(name).level
        logging.getLogger(name).setLevel(logging.ERROR)
    buf = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _export_dynamo(export_obj, tensors, specs, out_names, dynamic, opset, dest: Path) -> None:
    import torch

    in_names = [s.name for s in specs]
    with _quiet():
        program = torch.onnx.export(
            export_obj, tensors, None, dynamo=True, opset_version=opset, input_names=in_names,
            output_names=out_names, dynamic_axes=dynamic or None, external_data=False, optimize=True,
            report=False, verify=False,
        )
        _without_traces(program.model)
        program.save(str(dest), external_data=False) if _size_ok(program) else program.save(str(dest),
                                                                                             external_data=True)


def _without_traces(model) -> None:
    """Drop what the dynamo exporter records on every node (the Python stack trace with this machine's file
    paths, the FX node, the module hierarchy): about 1 KB a node, more than a small model's weights, and the
    same model exported from another checkout would differ in bytes."""
    graphs = [model.graph, *model.functions.values()]
    for g in graphs:
        for node in g.all_nodes():
            node.metadata_props.clear()


def _size_ok(program) -> bool:
    try:
        total = sum(v.const_value.nbytes for v in program.model.graph.initializers.values()
                    if v.const_value is not None)
    except Exception:  # noqa: BLE001
        return True
    return total < 1.8 * 1024 ** 3


def _export_legacy(model, tensors, specs, out_names, dynamic, opset, dest: Path) -> None:
    import torch

    in_names = [s.name for s in specs]
    axes = dict(dynamic)
    if any(0 in d and d[0] == "batch" for d in dynamic.values()):
        for n in out_names:
            axes[n] = {0: "batch"}
    with _quiet():
        torch.onnx.export(model, tensors, str(dest), dynamo=False, opset_version=opset, input_names=in_names,
                          output_names=out_names, dynamic_axes=axes or None, do_constant_folding=True)


_OP = re.compile(r"(?:aten|prim|[A-Za-z_]\w*)(?:::|\.)[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")


def _describe_export_error(e: BaseException) -> str:
    """One line naming the op (and node) the exporter could not handle, when the message says so."""
    full = _ANSI.sub("", str(e))
    cause = e.__cause__ or e.__context__
    while cause is not None:
        full += "\n" + _ANSI.sub("", str(cause))
        cause = cause.__cause__ or cause.__context__
    op = None
    m = re.search(r"(?:OpOverload\(op=|operator\s|namespace\s)['\"]?(?P<op>\w+(?:::|\.)\w+(?:\.\w+)?)", full)
    if m:
        op = m["op"]
    node = None
    n = re.search(r"(?:node|Node)\s+['`\"]?(?P<node>%?[\w.]+)['`\"]?", full)
    if n:
        node = n["node"]
    if op is None:
        m = re.search(r"No (?:decompositions|ONNX function)[^\n]*?for\s+(?P<op>[\w:.]+)", full)
        op = m["op"] if m else None
    if op:
        return f"unsupported op {op}" + (f" at node {node}" if node else "") + f" ({type(e).__name__})"
    summary = re.search(r"## Exception summary\s*\n\s*(?P<line>[^\n]+)", full)
    if summary:
        return _ANSI.sub("", summary["line"]).strip()
    return f"{type(e).__name__}: {_ANSI.sub('', first_line(e))}"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ------------------------------------------------------------------------------------------------ validation


def _validate(model, names, onnx_path: Path, specs, config, ctx: PassContext, batch_check: bool = False) -> dict:
    """Source and ONNX on the validation inputs; with batch_check (a batch axis made dynamic by default), the
    ONNX model also runs the first samples one at a time, which must match too."""
    import torch

    sess = ort_session(onnx_path)
    onnx_inputs = [spec_of(i) for i in sess.get_inputs()]
    onnx_outputs = [spec_of(o) for o in sess.get_outputs()]
    feed_specs = []
    for s, o in zip(specs, onnx_inputs):
        shape = [d if isinstance(d, int) else None for d in (o.shape or s.shape)]
        feed_specs.append(TensorSpec(o.name, shape, o.dtype))
    feeds, labels, where = validation_feeds(ctx, feed_specs, config)

    def run_torch(f):
        args = [torch.from_numpy(np.ascontiguousarray(f[s.name])) for s in feed_specs]
        with torch.inference_mode():
            return [t.detach().cpu().numpy() for t in flatten(_call(model, args))]

    try:
        ref = run_batched(run_torch, feed_specs, feeds)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"the model fails on the validation inputs: {type(e).__name__}: {first_line(e)}") from None
    out = run_batched(lambda f: sess.run(None, f), feed_specs, feeds)
    out_names = [o.name for o in onnx_outputs]
    figures = validate(ref, out, out_names, [str(r.dtype) for r in ref], config, "PyTorch", labels)
    if batch_check:
        k = min(2, count(feeds))
        head = {n: v[:k] for n, v in feeds.items()}
        single = run_batched(lambda f: sess.run(None, f), feed_specs, head, 1)
        try:
            validate([r[:k] for r in ref], single, out_names, [str(r.dtype) for r in ref], config, "PyTorch")
        except ValidationError as e:
            raise ValidationError(f"at batch 1, {first_line(e)}") from None
    figures["inputs"] = where
    return figures
