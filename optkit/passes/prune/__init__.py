"""Pruning with fine-tuning: `prune.keras` (TF-MOT magnitude pruning) and `prune.torch` (global L1 or channel
pruning with Torch-Pruning). Both fine-tune on ctx.data["train"], never touch the input model, and write the
result atomically. Frameworks are imported inside `run`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.errors import DependencyError, PassError, UsageError, ValidationError
from optkit.core.formats import Format
from optkit.core.registry import Pass, PassContext, cli, register
from optkit.core.shapes import TensorSpec
from optkit.core.text import first_line
from optkit.passes.training.distributed import check_strategy, make_tf_strategy
from optkit.passes.training.finetune import (
    FinetuneConfig,
    check_accuracy,
    check_labels,
    check_tensorboard,
    eval_arrays,
    keras_fit,
    keras_predict,
    steps_per_epoch,
    top1,
    torch_fit,
    torch_predict,
    train_arrays,
)
from optkit.passes.training.keras import (
    check_keras_output,
    check_layer_names,
    keras_specs,
    layer_sparsity,
    load_tf_keras,
    output_classes,
    overall,
    private_copy,
    save_keras,
    weighted_layers,
)
from optkit.runtimes.torch import load_program, load_torch_model


class PruneConfig(FinetuneConfig):
    """What both prune passes take: how much to prune, where, and the fine-tuning (FinetuneConfig)."""

    # Keras: final fraction of zero weights per pruned layer; torch: share of weights zeroed (unstructured, global
    # L1) or of channels removed (channels)
    sparsity: float = Field(default=0.5, description="Share of weights (or channels) to remove, in (0, 1).",
                            json_schema_extra=cli("--sparsity"))
    # prune only these (default: every Conv / Dense / Linear)
    layers: list[str] | None = Field(default=None, description="Prune only these layers (comma list).",
                                     json_schema_extra=cli("--layers"))
    # never prune these (torch: nor the output layer)
    exclude: list[str] = Field(default_factory=list, description="Never prune these layers.",
                               json_schema_extra=cli("--exclude"))

    @field_validator("sparsity")
    @classmethod
    def _sparsity(cls, v: float) -> float:
        if not 0 < v < 1:
            raise ValueError(f"sparsity must be between 0 and 1 (exclusive), got {v}")
        return v


# =============================================================================================== Keras
class KerasPruneConfig(PruneConfig):
    min_epochs = 1                                        # the schedule prunes while training
    schedule: Literal["constant", "polynomial"] = Field(default="polynomial", description="Keras: polynomial or "
                                                                                         "constant.",
                                                        json_schema_extra=cli("--schedule"))
    initial_sparsity: float = Field(default=0.0, ge=0, lt=1, description="polynomial: the sparsity it starts from.",
                                    json_schema_extra=cli(recipe_only="schedule detail, rarely changed"))
    # polynomial: reach the target after this share of steps
    end_fraction: float = Field(default=0.6, gt=0, le=1,
                                description="polynomial: reach the target after this share of the steps.",
                                json_schema_extra=cli(recipe_only="schedule detail, rarely changed"))
    # steps between mask updates (default: from the data)
    frequency: int | None = Field(default=None, ge=1, le=10_000_000, description="Keras: steps between mask updates (default: from "
                                                                  "the data).", json_schema_extra=cli("--frequency"))
    # block sparsity, e.g. [1, 4]
    block_size: tuple[int, int] | None = Field(default=None, description="Keras: block sparsity, e.g. 1x4.",
                                               json_schema_extra=cli("--block-size", kind="str"))
    block_pooling: Literal["AVG", "MAX"] = Field(default="AVG", description="Block sparsity: how a block is scored.",
                                                 json_schema_extra=cli(recipe_only="block sparsity detail"))
    # M zeros in every N weights, e.g. [2, 4] (2:4)
    m_by_n: tuple[int, int] | None = Field(default=None, description="Keras: M zeros in every N weights, e.g. 2:4.",
                                           json_schema_extra=cli("--m-by-n", kind="str"))
    skip_unsupported: bool = Field(default=False, description="Keras: skip layers TF-MOT cannot prune instead of "
                                                              "failing.", json_schema_extra=cli("--skip-unsupported"))

    @field_validator("m_by_n")
    @classmethod
    def _mbyn(cls, v):
        if v is not None and not (0 < v[0] < v[1]):
            raise ValueError(f"m_by_n must be M,N with 0 < M < N (e.g. 2,4), got {list(v)}")
        return v


def _pruning_schedule(cfg: KerasPruneConfig, total_steps: int, steps_epoch: int):
    """A TF-MOT schedule whose mask updates fit the data: frequency from steps per epoch, not TF-MOT's 100."""
    import tensorflow_model_optimization as tfmot

    freq = cfg.frequency or max(1, min(steps_epoch // 4, total_steps // 8) or 1)
    if cfg.schedule == "constant":
        return tfmot.sparsity.keras.ConstantSparsity(cfg.sparsity, begin_step=0, frequency=freq), freq, 0
    # the last mask update must land on end_step: (end_step - begin_step) % frequency == 0
    end = max(freq, int(total_steps * cfg.end_fraction) // freq * freq)
    if end >= total_steps:
        end = max(0, (total_steps - 1) // freq * freq)
    if end == 0:
        return tfmot.sparsity.keras.ConstantSparsity(cfg.sparsity, begin_step=0, frequency=freq), freq, 0
    return tfmot.sparsity.keras.PolynomialDecay(
        initial_sparsity=cfg.initial_sparsity, final_sparsity=cfg.sparsity, begin_step=0, end_step=end,
        frequency=freq), freq, end


def _kernel_shape(layer) -> list | None:
    w = next((w for w in layer.weights if "kernel" in w.name), None)
    return list(w.shape) if w is not None else None


def _select_keras_layers(model, cfg: KerasPruneConfig, ctx: PassContext) -> list[str]:
    from tensorflow_model_optimization.python.core.sparsity.keras.prunable_layer import PrunableLayer
    from tensorflow_model_optimization.python.core.sparsity.keras.prune_registry import PruneRegistry

    check_layer_names(model, list(cfg.layers or []), "layers (--layers)")
    check_layer_names(model, cfg.exclude, "exclude (--exclude)")
    chosen = [layer for layer in (weighted_layers(model) if cfg.layers is None else
                                  [model.get_layer(n) for n in cfg.layers]) if layer.name not in cfg.exclude]
    selected, skipped = [], []
    for layer in chosen:
        if hasattr(layer, "layers"):
            raise UsageError(f"layer {layer.name!r} is a nested model, which TF-MOT cannot prune as one layer; "
                             f"skip it with exclude (--exclude {layer.name}) or flatten the model")
        if isinstance(layer, PrunableLayer) or PruneRegistry.supports(layer):
            selected.append(layer.name)
        elif cfg.skip_unsupported:
            skipped.append(layer.name)
        else:
            raise UsageError(f"TF-MOT cannot prune layer {layer.name!r} ({type(layer).__name__}); skip it with "
                             f"exclude (--exclude {layer.name}), or skip_unsupported (--skip-unsupported) to skip every such layer")
    if skipped:
        ctx.warn(f"not pruned (TF-MOT cannot prune them): {', '.join(skipped)}")
    if cfg.m_by_n is not None:
        import tf_keras

        bad = [n for n in selected if not isinstance(model.get_layer(n), (tf_keras.layers.Conv2D, tf_keras.layers.Dense))]
        if bad:
            raise UsageError(f"m-by-n sparsity applies to Conv2D and Dense layers; exclude {', '.join(bad)}")
        n = cfg.m_by_n[1]  # M-of-N groups run along the input channels, which must fill whole groups
        narrow = [name for name in selected if (_kernel_shape(model.get_layer(name)) or [0, 0])[-2] % n]
        if narrow:
            ctx.warn(f"not pruned ({cfg.m_by_n[0]}:{n} needs input channels in multiples of {n}): {', '.join(narrow)}")
            selected = [name for name in selected if name not in narrow]
    if not selected:
        raise UsageError("no layer left to prune (check layers / --layers and exclude / --exclude)")
    return selected


@register
class KerasPrune(Pass):
    name = "prune.keras"
    summary = "TF-MOT magnitude pruning (constant/polynomial, block, m-by-n) with fine-tuning; wrappers stripped"
    accepts = (Format.KERAS,)
    produces = Format.KERAS
    extra = "tfmot"
    Config = KerasPruneConfig

    def run(self, artifact: Artifact, config: KerasPruneConfig, ctx: PassContext) -> Artifact:
        check_tensorboard(config.tensorboard)
        check_strategy(config.strategy, "tf")
        check_keras_output(ctx.output, self.name)
        strategy = make_tf_strategy(config.strategy)  # first: multi-worker must start before other TF work
        import tensorflow_model_optimization as tfmot
        import tf_keras

        original = load_tf_keras(artifact.path)
        specs = keras_specs(original)
        x, y = train_arrays(ctx, specs, what=self.name)
        check_labels(y, output_classes(original), ctx.data["train"].source)
        selected = _select_keras_layers(original, config, ctx)
        held = eval_arrays(ctx, specs)
        before = top1(keras_predict(original, held[0]), held[1]) if held else None

        spe = steps_per_epoch(len(x), config.batch_size)
        total = spe * config.epochs
        schedule, freq, end = _pruning_schedule(config, total, spe)
        params = {"pruning_schedule": schedule}
        if config.block_size is not None:
            params.update(block_size=tuple(config.block_size), block_pooling_type=config.block_pooling)
        if config.m_by_n is not None:
            params["sparsity_m_by_n"] = tuple(config.m_by_n)

        blocks_2d_only = config.block_size is not None and tuple(config.block_size) != (1, 1)
        unblocked = [n for n in selected if blocks_2d_only and len(_kernel_shape(original.get_layer(n)) or []) != 2] \
            if blocks_2d_only else []
        if unblocked:  # TF-MOT blocks only 2-D kernels (Dense): other layers get element-wise pruning
            ctx.note(f"block sparsity applies to 2-D kernels; pruned element-wise: {', '.join(unblocked)}")

        def wrap(layer):
            if layer.name in selected:
                own = {k: v for k, v in params.items() if k not in ("block_size", "block_pooling_type")} \
                    if layer.name in unblocked else params
                try:
                    return tfmot.sparsity.keras.prune_low_magnitude(layer, **own)
                except ValueError as e:
                    raise UsageError(f"TF-MOT cannot prune layer {layer.name!r} ({type(layer).__name__}) with these "
                                     f"settings: {first_line(e)}; skip it with exclude (--exclude {layer.name})") from None
            return layer

        with strategy.scope():
            work = private_copy(original)  # prune_low_magnitude changes the model it wraps: never the input
            model = tf_keras.models.clone_model(work, clone_function=wrap)
        history = keras_fit(model, x, y, config, strategy, seed=ctx.seed,
                            callbacks=[tfmot.sparsity.keras.UpdatePruningStep()])
        stripped = tfmot.sparsity.keras.strip_pruning(model)

        per_layer = layer_sparsity(stripped)
        want = config.m_by_n[0] / config.m_by_n[1] if config.m_by_n else config.sparsity  # m zeros in n
        short = {n: per_layer[n]["sparsity"] for n in selected if n in per_layer
                 and per_layer[n]["sparsity"] < want - 0.02 - (0.05 if config.block_size else 0)}
        if short:
            worst = min(short, key=short.get)
            raise ValidationError(
                f"pruning did not reach {want:.0%} sparsity: layer {worst!r} is at {short[worst]:.1%} after "
                f"{total} steps (mask updates every {freq}); train longer (epochs / --epochs) or set frequency (--frequency) lower")
        after = top1(keras_predict(stripped, held[0]), held[1]) if held else None
        ctx.measurements["sparsity"] = {
            "target": want, "pruned_layers": selected, "overall_pruned": overall(per_layer, selected),
            "overall": overall(per_layer), "layers": per_layer,
        }
        ctx.measurements["finetune"] = {"epochs": config.epochs, "steps": total, "loss": history.get("loss"),
                                        "strategy": config.strategy,
                                        "replicas": int(strategy.num_replicas_in_sync)}
        ctx.note(f"{config.schedule} schedule to {want:.0%}: mask update every {freq} steps"
                 + (f", target reached at step {end}" if end else "") + f" of {total}")
        check_accuracy(ctx, before, after, config.max_accuracy_drop, self.name)
        save_keras(stripped, ctx.output)
        return artifact.derive(ctx.output, Format.KERAS, self.name, config.model_dump(mode="json"))


# ============================================================================================= PyTorch
class TorchPruneConfig(PruneConfig):
    method: Literal["unstructured", "channels"] = Field(
        default="channels", description="torch: channels (removes them) or unstructured (global L1).",
        json_schema_extra=cli("--method"))
    # channels: keep counts a multiple of this
    round_to: int | None = Field(default=None, ge=1, le=65536, description="torch channels: multiple of this.",
                                 json_schema_extra=cli("--round-to"))
    # saved program vs in-memory model, max abs difference
    max_error: float = Field(default=1e-4, gt=0, le=1e9, description="Saved program vs the model in memory: max abs "
                                                             "difference.",
                             json_schema_extra=cli(recipe_only="the export check's tolerance; not a user trade-off"))


def _torch_example(artifact: Artifact, examples, ctx: PassContext):
    import torch

    if examples:
        if len(examples) != 1:
            raise UsageError(f"prune.torch handles single-input models; {artifact.path} takes {len(examples)} inputs")
        ex = examples[0]
        return torch.zeros((2, *ex.shape[1:]), dtype=ex.dtype)
    shape = ctx.shapes.get("") or ctx.shapes.get("input") or (next(iter(ctx.shapes.values())) if len(ctx.shapes) == 1 else None)
    if shape is None:
        raise UsageError(f"{artifact.path} does not say what input it takes; define example_inputs() beside the "
                         "factory or give shapes (--shape input=1x3x224x224)")
    return torch.zeros((2, *shape[1:]), dtype=torch.float32)


def _prunable_modules(model, cfg: TorchPruneConfig, out_width: int):
    import torch

    named = dict(model.named_modules())
    for option, names in (("layers (--layers)", cfg.layers or []), ("exclude (--exclude)", cfg.exclude)):
        unknown = [n for n in names if n not in named]
        if unknown:
            raise UsageError(f"{option} names module(s) {', '.join(unknown)} that the model does not have; its "
                             f"Conv/Linear modules are {', '.join(n for n, m in named.items() if _is_layer(m))}")
    layers = [(n, m) for n, m in named.items() if _is_layer(m)]
    if not layers:
        raise UsageError("the model has no Conv or Linear layers to prune")
    # the layer that produces the model's output keeps its width (the last Conv/Linear of that width)
    output_layer = next((n for n, m in reversed(layers) if _out_width(m) == out_width), layers[-1][0])
    chosen = [(n, m) for n, m in layers if (cfg.layers is None or n in cfg.layers) and n not in cfg.exclude]
    return chosen, output_layer, named, torch


def _is_layer(m) -> bool:
    import torch

    return isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear))


def _out_width(m) -> int:
    return m.out_features if hasattr(m, "out_features") else m.out_channels


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _unstructured(model, chosen, cfg: TorchPruneConfig):
    from torch.nn.utils import prune

    params = [(m, "weight") for _, m in chosen]
    if not params:
        raise UsageError("no layer left to prune (check layers / --layers and exclude / --exclude)")
    prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=cfg.sparsity)
    return params


def _make_permanent(params) -> None:
    from torch.nn.utils import prune

    for module, name in params:
        prune.remove(module, name)


def _channels(model, example, chosen, output_layer, named, cfg: TorchPruneConfig, ctx: PassContext):
    import torch

    try:
        import torch_pruning as tp
    except ImportError:

        raise DependencyError("channel pruning needs Torch-Pruning: pip install torch-pruning") from None
    chosen_ids = {id(m) for _, m in chosen if _ != output_layer}
    ignored = [m for n, m in named.items() if _is_layer(m) and id(m) not in chosen_ids]
    if not chosen_ids:
        raise UsageError("no layer left to prune: only the output layer was chosen, and it keeps its width")
    out_before = model(example).shape
    try:
        pruner = tp.pruner.MetaPruner(
            model, example, importance=tp.importance.GroupMagnitudeImportance(p=1), pruning_ratio=cfg.sparsity,
            ignored_layers=ignored, round_to=cfg.round_to, global_pruning=False)
        pruner.step()
    except Exception as e:
        raise PassError(f"cannot prune the channels of this model consistently: Torch-Pruning failed on its graph "
                        f"({type(e).__name__}: {first_line(e)}); exclude the "
                        "layers involved with exclude (--exclude), or use method: unstructured (--method unstructured)") from None
    try:
        with torch.no_grad():
            out_after = model(example).shape
    except Exception as e:
        raise PassError(f"cannot prune the channels of this model consistently: after removing channels its forward "
                        f"fails ({type(e).__name__}: {first_line(e)}); the code probably hard-codes "
                        "a channel count (e.g. a reshape); exclude those layers with exclude (--exclude), or use "
                        "method: unstructured (--method unstructured)") from None
    if out_after != out_before:
        raise PassError(f"channel pruning changed the output shape from {list(out_before)} to {list(out_after)}; "
                        "exclude the output layers with exclude (--exclude)")
    widths = {n: _out_width(m) for n, m in named.items() if _is_layer(m)}
    return widths


def _export(model, example, output: Path, fmt: Format, check, max_error: float) -> None:
    """Save, load the saved program back and compare it with the in-memory model before it takes the name."""
    import numpy as np
    import torch

    with atomic_path(output) as tmp:
        try:
            if fmt == Format.TORCH_EXPORT:
                batch = torch.export.Dim("batch", min=1)
                ep = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
                torch.export.save(ep, str(tmp))
            else:
                torch.jit.save(torch.jit.trace(model, (example,)), str(tmp))
        except Exception as e:
            raise PassError(f"cannot save the pruned model as {fmt.value}: {type(e).__name__}: "
                            f"{first_line(e)}") from None
        saved = load_program(str(tmp)).module() if fmt == Format.TORCH_EXPORT else torch.jit.load(str(tmp))
        with torch.no_grad():
            want, got = model(check).numpy(), saved(check).numpy()
        err = float(np.abs(want - got).max())
        if err > max_error:
            raise ValidationError(f"the saved {fmt.value} program differs from the pruned model by {err:.3g} "
                                  f"(max_error {max_error:g})")


@register
class TorchPrune(Pass):
    name = "prune.torch"
    summary = "PyTorch global L1 pruning or channel removal (Torch-Pruning) with fine-tuning -> .pt2 / .pt"
    accepts = (Format.TORCH_MODULE,)
    produces = Format.TORCH_EXPORT
    extra = "torch"
    Config = TorchPruneConfig

    def run(self, artifact: Artifact, config: TorchPruneConfig, ctx: PassContext) -> Artifact:
        import torch

        check_tensorboard(config.tensorboard)
        check_strategy(config.strategy, "torch")
        suffix = Path(ctx.output).suffix.lower()
        fmts = {".pt2": Format.TORCH_EXPORT, ".pt": Format.TORCHSCRIPT}
        if suffix not in fmts:
            raise UsageError(f"{self.name} writes a torch.export program (.pt2) or TorchScript (.pt); "
                             f"give the output one of those names, not {Path(ctx.output).name}")
        fmt = fmts[suffix]
        torch.manual_seed(ctx.seed)
        model, examples = load_torch_model(artifact)  # a fresh instance from the factory: the input is untouched
        example = _torch_example(artifact, examples, ctx)
        specs = [TensorSpec("input", [None, *example.shape[1:]], str(example.dtype).replace("torch.", ""))]
        data = train_arrays(ctx, specs, what=self.name, required=config.epochs > 0)
        with torch.no_grad():
            out = model(example)
        if out.ndim != 2:
            raise UsageError(f"{self.name} fine-tunes classifiers with output [N, classes]; this one gives "
                             f"{list(out.shape)}")
        if data is not None:
            check_labels(data[1], out.shape[1], ctx.data["train"].source)
        held = eval_arrays(ctx, specs)
        before = top1(torch_predict(model, held[0]), held[1]) if held else None
        params_before = _count(model)

        chosen, output_layer, named, _ = _prunable_modules(model, config, out.shape[1])
        masks, widths = None, None
        if config.method == "unstructured":
            masks = _unstructured(model, chosen, config)
        else:
            widths_before = {n: _out_width(m) for n, m in named.items() if _is_layer(m)}
            widths = _channels(model, example, chosen, output_layer, named, config, ctx)
            widths = {n: {"before": widths_before[n], "after": w} for n, w in widths.items()}
        history = torch_fit(model, *data, config, seed=ctx.seed) if data is not None and config.epochs else {}
        if masks:
            _make_permanent(masks)
        model.eval()

        per_layer = {}
        for n, m in model.named_modules():
            if _is_layer(m):
                w = m.weight.detach()
                per_layer[n] = {"weights": int(w.numel()), "zeros": int((w == 0).sum()),
                                "sparsity": float((w == 0).float().mean())}
        zeros = sum(v["zeros"] for v in per_layer.values())
        total = sum(v["weights"] for v in per_layer.values())
        ctx.measurements["pruning"] = {
            "method": config.method, "target": config.sparsity, "parameters_before": params_before,
            "parameters_after": _count(model), "parameter_ratio": _count(model) / params_before,
            "weight_sparsity": zeros / total if total else 0.0, "layers": per_layer,
            **({"channels": widths} if widths else {}), "output_layer_kept": output_layer,
        }
        if history:
            ctx.measurements["finetune"] = {"epochs": config.epochs, "loss": history["loss"],
                                            "strategy": config.strategy, "world_size": history["world_size"]}
        after = top1(torch_predict(model, held[0]), held[1]) if held else None
        check_accuracy(ctx, before, after, config.max_accuracy_drop, self.name)

        check = torch.from_numpy(held[0][:16]) if held else example
        _export(model, example, ctx.output, fmt, check, config.max_error)
        return artifact.derive(ctx.output, fmt, self.name, config.model_dump(mode="json"), input_names=["input"])
