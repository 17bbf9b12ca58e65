"""PyTorch: TorchScript (.pt), ExportedProgram (.pt2) and Python factories (file.py:make_model)."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

from optkit.core import logs, tmp, trust
from optkit.core.artifact import Artifact
from optkit.core.errors import UsageError
from optkit.core.formats import Format, split_factory
from optkit.core.registry import require_extra
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.runtimes.base import Session


def load_factory(spec: str):
    """Import `file.py:attr` or `pkg.mod:attr` and return (attr, its module). Runs user code: the user named it."""
    target, attr = split_factory(spec)
    try:
        if target.endswith(".py"):
            path = Path(target).resolve()
            name = f"optkit_user_{path.stem}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            sys.path.insert(0, str(path.parent))
            try:
                mod_spec.loader.exec_module(module)
            finally:
                sys.path.remove(str(path.parent))
        else:
            module = importlib.import_module(target)
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"importing {target} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise UsageError(f"{target} has no callable {attr!r}")
    return fn, module


def load_torch_model(artifact: Artifact):
    """The torch.nn.Module (eval mode) behind a torch artifact, and its example inputs if it declares any."""
    require_extra("torch", "loading a PyTorch model")
    tmp.own_tempdir()  # torch's compilers cache in $TMPDIR (torchinductor_<user>): keep that in optkit's folder
    import torch

    examples = None
    if artifact.format == Format.TORCHSCRIPT:
        try:
            model = torch.jit.load(artifact.path, map_location="cpu")
        except Exception as e:
            raise UsageError(f"cannot load {artifact.path} as TorchScript: {first_line(e)}") from None
    elif artifact.format == Format.TORCH_EXPORT:
        ep = load_program(artifact.path)
        model = ep.module()
        examples = example_from_program(ep)
    else:
        factory, module = load_factory(artifact.path)
        try:
            model = factory()
        except Exception as e:
            raise UsageError(f"model factory {artifact.path} raised {type(e).__name__}: {e}") from None
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"model factory {artifact.path} returned {type(model).__name__}, not a torch.nn.Module")
        weights = artifact.meta.get("weights")
        if weights:
            load_weights(model, weights)
        ex = getattr(module, "example_inputs", None)
        examples = tuple(ex()) if callable(ex) else None
    if hasattr(model, "eval") and artifact.format != Format.TORCH_EXPORT:
        model.eval()
    return model, examples


def load_program(path: str):
    """torch.export.load without pickle: unless the user trusts the file, torch.load is forced to weights_only."""
    import pickle

    tmp.own_tempdir()
    import torch

    try:
        with _weights_only_unless_trusted(), logs.quieted("torch.export", "torch._export"):
            return torch.export.load(path)
    except pickle.UnpicklingError:
        trust.require(f"{path} holds pickled Python objects, and loading them")
        raise  # unreachable: require raised
    except Exception as e:  # noqa: BLE001  a truncated or foreign file raises anything
        raise UsageError(f"cannot load {path} as a torch.export program: {first_line(e)}") from None


@contextlib.contextmanager
def _weights_only_unless_trusted():
    # torch.export.load falls back to torch.load(weights_only=False), which runs code from the file; this
    # environment variable makes every torch.load in the block weights_only, whatever the call site says
    keys = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    saved = {k: os.environ.pop(k, None) for k in keys}
    if not trust.trusted():
        os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        for k in keys:
            os.environ.pop(k, None)
            if saved[k] is not None:
                os.environ[k] = saved[k]


def load_weights(model, weights: str) -> None:
    import pickle

    import torch

    if not Path(weights).is_file():
        raise UsageError(f"weights file {weights} not found")
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        trust.require(f"{weights} holds a pickled whole model, not a state dict, and unpickling it")
        state = _unpickle(weights)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"cannot read weights {weights}: {first_line(e)}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise UsageError(f"{weights} does not hold a state dict")
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        parts = []
        if result.missing_keys:
            parts.append(f"missing {', '.join(result.missing_keys[:3])}" + ("..." if len(result.missing_keys) > 3 else ""))
        if result.unexpected_keys:
            parts.append(f"unexpected {', '.join(result.unexpected_keys[:3])}"
                         + ("..." if len(result.unexpected_keys) > 3 else ""))
        raise UsageError(f"weights {weights} do not match the model: {'; '.join(parts)}")


def _unpickle(weights: str) -> dict:
    import torch

    try:
        obj = torch.load(weights, map_location="cpu", weights_only=False)  # the user passed --trust-code
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"cannot unpickle {weights}: {type(e).__name__}: {first_line(e)}") from None
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict()
    if not isinstance(obj, dict):
        raise UsageError(f"{weights} holds a {type(obj).__name__}, neither a model nor a state dict")
    return obj


def example_from_program(ep):
    specs = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    vals = []
    for s in specs:
        node = next(n for n in ep.graph.nodes if n.name == s.arg.name)
        fake = node.meta.get("val")
        if fake is None:
            return None
        vals.append(fake)
    return tuple(vals)


def _torch_dtype_name(dt) -> str:
    import torch

    return str(dt).replace("torch.", "") if dt != torch.bool else "bool"


class TorchSession(Session):
    runtime = "torch"

    @classmethod
    def warm(cls, fmt: Format | None = None) -> None:
        """torch, its first kernel, and for a saved program what loading one imports (torch.export.load pulls in
        dynamo and inductor, ~100 MiB, the first time): a tiny program of the same kind, saved and loaded."""
        folder = tmp.own_tempdir()
        import torch

        torch.zeros(1) + 1
        if fmt not in (Format.TORCH_EXPORT, Format.TORCHSCRIPT):
            return
        tiny, x, path = torch.nn.Linear(2, 2).eval(), torch.zeros(1, 2), folder / f"optkit-warm{os.getpid()}"
        try:
            with logs.quieted("torch._dynamo", "torch._export", "torch.export"):
                if fmt == Format.TORCH_EXPORT:
                    torch.export.save(torch.export.export(tiny, (x,)), str(path))
                    torch.export.load(str(path)).module()(x)
                else:
                    torch.jit.save(torch.jit.script(tiny), str(path))
                    torch.jit.load(str(path))(x)
        finally:
            path.unlink(missing_ok=True)

    def __init__(self, artifact: Artifact, threads: int | None = None, shapes: dict | None = None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.threads = threads or torch.get_num_threads()
        self.model, examples = load_torch_model(artifact)
        self.inputs = _input_specs(artifact, examples, self.model)
        if self.inputs is None:
            raise UsageError(
                f"{artifact.path} does not say what inputs it takes; define example_inputs() next to the factory"
                " or give --shape NAME=DIMS"
            )
        self.outputs = []  # filled on first run
        self._torch = torch

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        args = [torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in self.inputs]
        with torch.inference_mode():
            out = self.model(*args)
        flat = flatten(out)
        if not self.outputs:
            self.outputs = [TensorSpec(f"output_{i}" if len(flat) > 1 else "output", list(t.shape),
                                       _torch_dtype_name(t.dtype)) for i, t in enumerate(flat)]
        return [t.detach().cpu().numpy() for t in flat]

    def op_histogram(self) -> dict[str, int]:
        """Leaf module types (factories, TorchScript) or aten ops (ExportedProgram)."""
        from collections import Counter

        graph = getattr(self.model, "graph", None)
        if graph is not None and hasattr(graph, "nodes") and callable(getattr(graph, "find_nodes", None)):
            return dict(Counter(str(n.target).split(".")[-2] if "." in str(n.target) else str(n.target)
                                for n in graph.nodes if n.op == "call_function").most_common())
        leaves = [m for m in self.model.modules() if not list(m.children())]
        return dict(Counter(getattr(m, "original_name", type(m).__name__) for m in leaves).most_common())

    def state_dict_bytes(self) -> int:
        import io

        buf = io.BytesIO()
        self._torch.save(self.model.state_dict(), buf)
        return buf.tell()

    def parameter_count(self) -> int | None:
        params = getattr(self.model, "parameters", None)
        return sum(p.numel() for p in params()) if params else None


def flatten(out) -> list:
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flatten(o)]
    if isinstance(out, dict):
        return [t for v in out.values() for t in flatten(v)]
    return [out]


def forward_names(model, n: int | None = None) -> list[str]:
    """The names of the tensors forward() takes, as the user wrote them (`def forward(self, inputs)` ->
    ["inputs"]): from a TorchScript schema or the Python signature (an ExportedProgram's module keeps it).
    With n (the number of example inputs), exactly n names; without, the arguments without a default.
    "input" / "input_i" where the signature says nothing usable."""
    import inspect

    names: list[str] = []
    schema = getattr(getattr(model, "forward", None), "schema", None)
    if schema is not None:  # TorchScript
        names = [a.name for a in schema.arguments[1:]]
    else:
        try:
            params = inspect.signature(model.forward).parameters.values()
            names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                     and (n is not None or p.default is p.empty)]
        except (TypeError, ValueError):
            names = []
    if n is not None:
        names = names[:n]
        if len(names) < n:
            names = ["input" if n == 1 else f"input_{i}" for i in range(n)]
    return names or ["input"]


def _input_specs(artifact: Artifact, examples, model=None) -> list[TensorSpec] | None:
    if artifact.format == Format.TORCH_EXPORT and examples is not None:
        names = _input_names(artifact, model, len(examples))
        ep_specs = []
        for i, t in enumerate(examples):
            shape = [int(d) if str(d).isdigit() else None for d in t.shape]
            ep_specs.append(TensorSpec(names[i], shape, _torch_dtype_name(t.dtype)))
        return ep_specs
    if examples is not None:
        names = _input_names(artifact, model, len(examples))
        return [TensorSpec(names[i], [None, *list(t.shape)[1:]], _torch_dtype_name(t.dtype))
                for i, t in enumerate(examples)]
    # The number of inputs is known, their shapes are not (shape None: --shape or data must give them).
    n = _arity(model)
    if not n:
        return None
    names = _input_names(artifact, model, n)
    shapes = artifact.meta.get("input_shapes") or {}
    return [TensorSpec(name, shapes.get(name, shapes.get("") if n == 1 else None), "float32") for name in names]


def _arity(model) -> int:
    """How many tensors forward() takes: from the TorchScript graph, or the Python signature."""
    import inspect

    graph = getattr(model, "graph", None)
    if graph is not None and hasattr(graph, "inputs"):
        return len(list(graph.inputs())) - 1  # minus `self`
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)


def _input_names(artifact: Artifact, model, n: int) -> list[str]:
    """The names the inputs go by: those recorded with the artifact, else forward()'s argument names (the
    names convert.torch gives the ONNX inputs, so --shape NAME=... means the same input on both sides)."""
    names = artifact.meta.get("input_names")
    if names and len(names) == n:
        return list(names)
    return forward_names(model, n) if model is not None else ["input" if n == 1 else f"input_{i}" for i in range(n)]
