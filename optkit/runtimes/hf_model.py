"""A Hugging Face folder as a torch module with the inputs and outputs transformers names: its task (from
config.json's `architectures` and sentence-transformers' modules.json, or given), the model loaded safely
(local files only, weights_only, float32, custom code only with --trust-code), and its tokenizer checked.

Tasks and their outputs:
  feature-extraction      last_hidden_state
  sentence-embeddings     token_embeddings, sentence_embedding (pooled, Dense, normalised as sentence-transformers does)
  text-classification     logits (one sentence or a pair)
  token-classification    logits
  question-answering      start_logits, end_logits
  image-classification    logits (pixel_values in)
  text-generation         logits (a causal LM, no cache)
Text inputs: input_ids, attention_mask, and token_type_ids where the model takes them and has more than one
token type; batch and sequence dynamic.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path

from optkit.core import hffolder, hub, trust
from optkit.core.errors import DependencyError, UsageError
from optkit.core.registry import require_extra
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line

TASKS = {
    "feature-extraction": ("AutoModel", ("last_hidden_state",)),
    "sentence-embeddings": ("AutoModel", ("token_embeddings", "sentence_embedding")),
    "text-classification": ("AutoModelForSequenceClassification", ("logits",)),
    "token-classification": ("AutoModelForTokenClassification", ("logits",)),
    "question-answering": ("AutoModelForQuestionAnswering", ("start_logits", "end_logits")),
    "image-classification": ("AutoModelForImageClassification", ("logits",)),
    "text-generation": ("AutoModelForCausalLM", ("logits",)),
}
_ARCH_TASKS = (("ForSequenceClassification", "text-classification"), ("ForTokenClassification", "token-classification"),
               ("ForQuestionAnswering", "question-answering"), ("ForImageClassification", "image-classification"),
               ("ForCausalLM", "text-generation"), ("LMHeadModel", "text-generation"), ("Model", "feature-extraction"))
ST_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
POOLING = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
                   "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
_ACTIVATIONS = {"Identity": "Identity", "Tanh": "Tanh", "ReLU": "ReLU", "GELU": "GELU", "Sigmoid": "Sigmoid"}
SUPPORTED = ", ".join(TASKS)


@dataclass
class Spec:
    """What optkit reads from a folder before loading anything."""

    folder: Path                 # the model folder (a Hub snapshot or the user's)
    inner: Path                  # where config.json and the weights are (sentence-transformers: 0_Transformer/)
    task: str
    config: dict
    pooling: tuple[str, ...] = ()
    dense: list[dict] = field(default_factory=list)   # {"folder", "activation"}
    normalize: bool = False
    source_dtype: str = "float32"

    @property
    def outputs(self) -> tuple[str, ...]:
        return TASKS[self.task][1]

    @property
    def image(self) -> bool:
        return self.task == "image-classification"


def describe(folder: str | Path, task: str | None = None) -> Spec:
    """The folder checked (config, weights, links, custom code) and its task; exit 2 naming what is wrong."""
    folder = Path(folder)
    inner = hffolder.transformer_folder(folder)
    cfg = hffolder.config(inner)
    hffolder.weight_files(inner)
    code = hffolder.remote_code(folder)
    if code:
        trust.require(f"{code} names custom modelling code (auto_map), and loading it")
    mods = hffolder.modules(folder)
    if task is not None and task not in TASKS:
        raise UsageError(f"task (--task) {task!r} is not one optkit exports; tasks: {SUPPORTED}")
    detected = _task_of(folder, cfg, mods)
    spec = Spec(folder=folder, inner=inner, task=task or detected, config=cfg,
                source_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"))
    if spec.task == "sentence-embeddings":
        _sentence_modules(spec, mods)
    return spec


def _task_of(folder: Path, cfg: dict, mods: list[dict]) -> str:
    if mods:
        return "sentence-embeddings"
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise UsageError(f"{folder / 'config.json'}: architectures is not a list of class names")
    if not archs:
        return "feature-extraction"
    for suffix, task in _ARCH_TASKS:
        if archs[0].endswith(suffix):
            return task
    raise UsageError(f"{folder / 'config.json'} names architecture {archs[0]}, which is none of the tasks optkit "
                     f"exports ({SUPPORTED}); give --task (feature-extraction exports its encoder's hidden states)")


def _sentence_modules(spec: Spec, mods: list[dict]) -> None:
    """Pooling, Dense and Normalize from modules.json (a plain folder asked for sentence embeddings gets what
    sentence-transformers gives one: mean pooling)."""
    folder = spec.folder
    if not mods:
        spec.pooling = ("mean",)
        return
    for m in mods:
        kind = m["type"].rsplit(".", 1)[-1]
        if not m["type"].startswith("sentence_transformers.") or kind not in ST_MODULES:
            raise UsageError(f"{folder / hffolder.MODULES} names module {m['type']}, which optkit does not export "
                             f"(it exports {', '.join(ST_MODULES)}); --task feature-extraction exports the transformer "
                             "alone")
        sub = folder / str(m.get("path") or "")
        if kind == "Pooling":
            spec.pooling = _pooling_modes(sub / "config.json", folder)
        elif kind == "Dense":
            dcfg = hffolder.read_json(sub / "config.json", folder)
            act = str(dcfg.get("activation_function") or "torch.nn.modules.activation.Tanh").rsplit(".", 1)[-1]
            if act not in _ACTIVATIONS:
                raise UsageError(f"{sub / 'config.json'}: activation {dcfg.get('activation_function')} is not one "
                                 f"optkit exports ({', '.join(_ACTIVATIONS)})")
            spec.dense.append({"folder": sub, "activation": act, "config": dcfg})
        elif kind == "Normalize":
            spec.normalize = True
    if not spec.pooling:
        raise UsageError(f"{folder / hffolder.MODULES} has no Pooling module; --task feature-extraction exports the "
                         "token embeddings")


def _pooling_modes(file: Path, folder: Path) -> tuple[str, ...]:
    cfg = hffolder.read_json(file, folder) if file.is_file() else {}
    if not isinstance(cfg, dict):
        raise UsageError(f"{file} is not a pooling configuration")
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = tuple(m for k, m in _LEGACY_POOLING.items() if cfg.get(k))
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    if cfg.get("include_prompt") is False:
        raise UsageError(f"{file}: include_prompt false (pooling that leaves out a prompt) is not exported by optkit")
    bad = [m for m in modes if m not in POOLING]
    if bad or not modes:
        raise UsageError(f"{file}: pooling {bad[0] if bad else 'none'} is not one optkit exports ({', '.join(POOLING)})")
    return modes


# ------------------------------------------------------------------------------------------------ loading


def import_transformers():
    """transformers, imported offline (no download, no telemetry)."""
    require_extra("hf", "reading a Hugging Face model")
    hub.offline()
    try:
        import transformers
    except ImportError:
        raise DependencyError("reading a Hugging Face model needs the 'hf' extra: pip install 'optkit[hf]'") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


def load(spec: Spec):
    """The torch module (eval mode, float32) whose forward takes the task's inputs, in order, and returns its
    outputs; and the input names."""
    import torch

    transformers = import_transformers()
    auto = getattr(transformers, TASKS[spec.task][0])
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if spec.config.get("model_type") not in CONFIG_MAPPING_NAMES and not spec.config.get("auto_map"):
        raise UsageError(f"{spec.inner / 'config.json'}: model_type {spec.config.get('model_type')!r} is not one "
                         f"transformers {transformers.__version__} knows, so optkit cannot export it; tasks optkit "
                         f"exports: {SUPPORTED}")
    try:
        model, info = auto.from_pretrained(str(spec.inner), local_files_only=True, trust_remote_code=trust.trusted(),
                                           dtype=torch.float32, output_loading_info=True, weights_only=True)
    except (ValueError, KeyError) as e:
        msg = first_line(e)
        if "Unrecognized" in msg or "model_type" in msg or isinstance(e, KeyError):
            raise UsageError(f"{spec.inner / 'config.json'}: model_type {spec.config.get('model_type')!r} has no "
                             f"{spec.task} model in transformers {transformers.__version__}; tasks optkit exports: "
                             f"{SUPPORTED}") from None
        raise UsageError(f"cannot load {spec.inner} as {spec.task}: {msg}") from None
    except OSError as e:
        raise UsageError(f"cannot load {spec.inner}: {first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - a damaged checkpoint raises anything
        raise UsageError(f"cannot load {spec.inner}: {type(e).__name__}: {first_line(e)}") from None
    missing = [k for k in info.get("missing_keys", ()) if not (spec.task in ("feature-extraction", "sentence-embeddings")
                                                               and k.startswith("pooler."))]
    if missing:
        raise UsageError(f"{spec.inner}'s weights lack {', '.join(sorted(missing)[:3])}"
                         f"{' ...' if len(missing) > 3 else ''}: the model was not saved with a {spec.task} head; "
                         "give the --task it was trained for")
    model = model.float().eval()
    names = input_names(spec, model)
    dense = [_dense(d) for d in spec.dense]
    return task_module(model, spec, names, dense).eval(), names


def input_names(spec: Spec, model) -> list[str]:
    params = inspect.signature(model.forward).parameters
    if spec.image or ("pixel_values" in params and "input_ids" not in params):
        return ["pixel_values"]
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in params and int(getattr(model.config, "type_vocab_size", 0) or 0) > 1 \
            and spec.task != "text-generation":
        names.append("token_type_ids")
    return names


def _dense(d: dict):
    import torch

    cfg = d["config"]
    layer = torch.nn.Linear(int(cfg["in_features"]), int(cfg["out_features"]), bias=bool(cfg.get("bias", True)))
    sub = d["folder"]
    if (sub / "model.safetensors").is_file():
        from safetensors.torch import load_file

        hffolder.check_weights(sub.parent, sub / "model.safetensors")
        state = load_file(str(sub / "model.safetensors"))
    elif (sub / "pytorch_model.bin").is_file():
        state = torch.load(str(hffolder.inside(sub.parent, sub / "pytorch_model.bin")), map_location="cpu",
                           weights_only=True)
    else:
        raise UsageError(f"{sub} has no weights (model.safetensors or pytorch_model.bin) for its Dense module")
    state = {k.removeprefix("linear."): v for k, v in state.items()}
    try:
        layer.load_state_dict(state)
    except RuntimeError as e:
        raise UsageError(f"{sub}: the Dense weights do not match its config.json: {first_line(e)}") from None
    return torch.nn.Sequential(layer, getattr(torch.nn, _ACTIVATIONS[d["activation"]])()).float().eval()


def tokenizer(spec: Spec):
    """The model's own tokenizer, checked against its vocabulary (exit 2 when missing or not this model's)."""
    transformers = import_transformers()
    where = next((f for f in (spec.folder, spec.inner) if any((f / n).is_file() for n in hffolder.TOKENIZER_FILES)),
                 None)
    if where is None:
        raise UsageError(f"{spec.folder} has no tokenizer ({', '.join(hffolder.TOKENIZER_FILES[:5])}, ...); copy the "
                         "model's tokenizer files into it")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(where), local_files_only=True,
                                                         trust_remote_code=trust.trusted())
    except Exception as e:  # noqa: BLE001 - a damaged tokenizer file raises anything
        raise UsageError(f"cannot load the tokenizer in {where}: {type(e).__name__}: {first_line(e)}") from None
    vocab = int(spec.config.get("vocab_size") or 0)
    top = max(tok.get_vocab().values(), default=-1)
    if vocab and top >= vocab:
        raise UsageError(f"the tokenizer in {where} gives ids up to {top}, but {spec.inner / 'config.json'} has "
                         f"vocab_size {vocab}: it is not this model's tokenizer; copy the model's own tokenizer files")
    return tok


def task_module(model, spec: Spec, names: list[str], dense: list):
    """The model with the task's inputs (positional, in `names` order) and outputs (a tensor or a tuple)."""
    text, image = _module_class()
    return (image if names == ["pixel_values"] else text)(model, spec, names, dense)


_MODULE = None


def _module_class():
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    import torch

    class HFTaskModule(torch.nn.Module):
        def __init__(self, model, spec: Spec, names: list[str], dense: list):
            super().__init__()
            self.model = model
            self.task = spec.task
            self.names = list(names)
            self.pooling = spec.pooling
            self.dense = torch.nn.ModuleList(dense)
            self.normalize = spec.normalize

        # named arguments, as the inputs are named: the dynamo exporter maps the dynamic axes by these names
        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kw = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kw["token_type_ids"] = token_type_ids
            if self.task == "text-generation":
                kw["use_cache"] = False
            out = self.model(**kw, return_dict=True)
            if self.task == "feature-extraction":
                return out.last_hidden_state
            if self.task == "sentence-embeddings":
                h = out.last_hidden_state
                emb = pool(h, attention_mask, self.pooling)
                for layer in self.dense:
                    emb = layer(emb)
                if self.normalize:
                    emb = torch.nn.functional.normalize(emb, p=2, dim=-1)
                return h, emb
            if self.task == "question-answering":
                return out.start_logits, out.end_logits
            return out.logits

    class HFImageModule(torch.nn.Module):
        def __init__(self, model, spec: Spec, names: list[str], dense: list):
            super().__init__()
            self.model = model
            self.task = spec.task
            self.names = list(names)

        def forward(self, pixel_values):
            out = self.model(pixel_values=pixel_values, return_dict=True)
            return out.last_hidden_state if self.task == "feature-extraction" else out.logits

    _MODULE = (HFTaskModule, HFImageModule)
    return _MODULE


def pool(h, mask, modes: tuple[str, ...]):
    """sentence-transformers' Pooling over right- or left-padded token embeddings (its _forward_padded)."""
    import torch

    vectors = []
    for mode in modes:
        if mode == "cls":
            first = mask.to(torch.int32).argmax(dim=1)
            vectors.append(torch.gather(h, 1, first.view(-1, 1, 1).expand(-1, 1, h.shape[-1])).squeeze(1))
        elif mode == "max":
            m = mask.unsqueeze(-1).expand_as(h).to(h.dtype)
            vectors.append(h.masked_fill(m == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            m = mask.unsqueeze(-1).to(h.dtype)
            total = torch.clamp(m.sum(dim=1), min=1e-9)
            vectors.append((h * m).sum(dim=1) / (total if mode == "mean" else torch.sqrt(total)))
        elif mode == "weightedmean":
            m = mask.unsqueeze(-1).to(h.dtype)
            weights = torch.arange(1, h.shape[1] + 1, dtype=h.dtype).view(1, -1, 1)
            weights = weights - mask.to(torch.int32).argmax(dim=1).view(-1, 1, 1).to(h.dtype)
            wm = m * weights
            vectors.append((h * wm).sum(dim=1) / torch.clamp(wm.sum(dim=1), min=1e-9))
        else:  # lasttoken
            values, idx = mask.to(torch.int32).flip(1).max(1)
            idx = torch.where(values == 0, h.shape[1] - 1, idx)
            gather = (h.shape[1] - idx - 1).view(-1, 1, 1).expand(-1, 1, h.shape[-1])
            m = mask.unsqueeze(-1).expand_as(h).to(h.dtype)
            vectors.append(torch.gather(h * m, 1, gather).squeeze(1))
    return torch.cat(vectors, dim=-1)


def input_specs(spec: Spec, names: list[str], image_size: tuple[int, int] | None = None) -> list[TensorSpec]:
    """The inputs as optkit describes them: token ids bounded by the vocabulary, the mask a mask."""
    out = []
    for n in names:
        if n == "pixel_values":
            h, w = image_size or (224, 224)
            out.append(TensorSpec(n, ["batch", int(spec.config.get("num_channels", 3)), h, w], "float32"))
        elif n == "input_ids":
            out.append(TensorSpec(n, ["batch", "sequence"], "int64",
                                  value_range=(0, int(spec.config.get("vocab_size") or 2))))
        elif n == "token_type_ids":
            out.append(TensorSpec(n, ["batch", "sequence"], "int64",
                                  value_range=(0, int(spec.config.get("type_vocab_size") or 2))))
        else:
            out.append(TensorSpec(n, ["batch", "sequence"], "int64", mask=True))
    return out


def image_size(spec: Spec) -> tuple[int, int]:
    """The (height, width) the image processor gives (crop, else resize), else config.json's image_size."""
    file = next((f for f in (spec.folder / "preprocessor_config.json", spec.inner / "preprocessor_config.json")
                 if f.is_file()), None)
    cfg = hffolder.read_json(file, spec.folder) if file else {}
    for key in ("crop_size", "size"):
        v = cfg.get(key) if isinstance(cfg, dict) and (key != "crop_size" or cfg.get("do_center_crop")) else None
        if isinstance(v, dict) and "height" in v and "width" in v:
            return int(v["height"]), int(v["width"])
        if isinstance(v, dict) and "shortest_edge" in v and key == "size" and not cfg.get("do_center_crop"):
            return int(v["shortest_edge"]), int(v["shortest_edge"])
        if isinstance(v, int):
            return v, v
    size = spec.config.get("image_size", 224)
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def output_specs(spec: Spec, model) -> list[TensorSpec]:
    """The outputs with their axes: batch and sequence where they have them, the width from the model."""
    cfg = model.config
    labels = int(getattr(cfg, "num_labels", 0) or 0) or None
    hidden = int(getattr(cfg, "hidden_size", 0) or 0) or None
    shapes = {
        "feature-extraction": [["batch", "sequence", hidden]],
        "sentence-embeddings": [["batch", "sequence", hidden], ["batch", None]],
        "text-classification": [["batch", labels]],
        "token-classification": [["batch", "sequence", labels]],
        "question-answering": [["batch", "sequence"], ["batch", "sequence"]],
        "image-classification": [["batch", labels]],
        "text-generation": [["batch", "sequence", int(getattr(cfg, "vocab_size", 0) or 0) or None]],
    }[spec.task]
    return [TensorSpec(n, shape, "float32") for n, shape in zip(spec.outputs, shapes)]
