"""Fine-tuning on the user's labelled data, for the passes that need it (pruning, quantization-aware training).

Keras models train with `model.fit` under a tf.distribute strategy; PyTorch models with a plain loop, wrapped in
DistributedDataParallel when launched by torchrun. Both are seeded, so two runs give the same weights where the
framework allows. Frameworks are imported inside the functions.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from optkit.core.atomic import PathRole
from optkit.core.errors import DependencyError, UsageError, ValidationError
from optkit.core.registry import MAX_BATCH, PassConfig, cli
from optkit.passes.training.distributed import init_torch_ddp, is_chief
from optkit.runtimes.tf import import_tf

Optimizer = Literal["adam", "sgd", "rmsprop", "adamw"]


class FinetuneConfig(PassConfig):
    """Fine-tuning options shared by the passes that train (flat, so recipes stay simple): `optkit prune` and
    `optkit qat` take them (cli.options). A pass adds its own fields and, where it
    differs, its own default (QAT's smaller learning rate) or `min_epochs`."""

    min_epochs: ClassVar[int] = 0   # 1 for a pass that cannot skip training (Keras pruning schedules, QAT)

    epochs: int = Field(default=2, ge=0, le=100_000, description="Fine-tuning epochs.", json_schema_extra=cli("--epochs"))
    # global batch (split across replicas / workers)
    batch_size: int = Field(default=32, ge=1, le=MAX_BATCH, description="Global batch size, split over replicas and workers.",
                            json_schema_extra=cli("--batch-size"))
    learning_rate: float = Field(default=1e-3, gt=0, le=10, description="Learning rate.",
                                 json_schema_extra=cli("--learning-rate"))
    optimizer: Optimizer = Field(default="adam", description="adam, adamw, sgd or rmsprop.",
                                 json_schema_extra=cli("--optimizer"))
    strategy: Literal["none", "mirrored", "multi-worker", "ddp"] = Field(
        default="none", description="none; Keras: mirrored (local devices) or multi-worker (TF_CONFIG); torch: ddp "
                                    "(torchrun).", json_schema_extra=cli("--strategy"))
    # fail (exit 3) past this top-1 drop
    max_accuracy_drop: float | None = Field(
        default=0.05, ge=0, le=1, description="Fail (exit 3) when fine-tuned top-1 falls more than this (0.05 = 5 pt); "
                                              "null disables.",
        json_schema_extra=cli("--max-accuracy-drop", group="budgets", negative_is_none=True,
                              help="Fail (exit 3) when fine-tuned top-1 falls more than this (default 0.05 = 5 pt); "
                                   "-1 disables."))
    # a folder: the fine-tuning curves (loss, accuracy per epoch) as TensorBoard logs
    tensorboard: Annotated[str | None, PathRole("folder", adds_only=True)] = Field(default=None, description="Write the fine-tuning curves (loss, accuracy per "
                                                              "epoch) to this folder for TensorBoard.",
                                    json_schema_extra=cli("--tensorboard", group="measurement"))

    @field_validator("epochs")
    @classmethod
    def _min_epochs(cls, v: int) -> int:
        if v < cls.min_epochs:
            raise ValueError(f"input should be greater than or equal to {cls.min_epochs} (this pass trains)")
        return v


TENSORBOARD_HINT = "pip install tensorboard"


def check_tensorboard(folder: str | None) -> None:
    """Before any work: --tensorboard needs the tensorboard package and a folder (created when missing; optkit
    only adds event files to it)."""
    if folder is None:
        return
    if importlib.util.find_spec("tensorboard") is None:
        raise DependencyError(f"tensorboard (--tensorboard) needs the tensorboard package, which is not installed: {TENSORBOARD_HINT}")
    if Path(folder).exists() and not Path(folder).is_dir():
        raise UsageError(f"tensorboard (--tensorboard) {folder} is a file; give a folder for the event files")


def train_arrays(ctx, specs, *, what: str, required: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """The fine-tuning data (ctx.data["train"]) bound to the model's single input, with integer labels."""
    ds = ctx.data.get("train")
    if ds is None:
        if required:
            raise UsageError(f"{what} fine-tunes on labelled data: give it as data.train / --train DATA (.npz "
                             "with 'labels', or an image folder), or set epochs (--epochs) to 0")
        return None
    if len(specs) != 1:
        raise UsageError(f"{what} fine-tunes single-input models; this one has {len(specs)} inputs")
    if ds.labels is None:
        raise UsageError(f"fine-tuning data {ds.source} has no labels (add a 'labels' array)")
    x = ds.bind(specs)[specs[0].name]
    y = np.asarray(ds.labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        if y.ndim == 1 and np.allclose(y, np.round(y)):
            y = y.astype(np.int64)
        else:
            raise UsageError(f"labels in {ds.source} must be one integer class per sample, got shape {list(y.shape)} "
                             f"of {y.dtype}")
    return np.ascontiguousarray(x), y.astype(np.int64)


def check_labels(y: np.ndarray, classes: int, source: str) -> None:
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise UsageError(f"labels in {source} run from {y.min()} to {y.max()} but the model has {classes} outputs")


def eval_arrays(ctx, specs) -> tuple[np.ndarray, np.ndarray] | None:
    """Labelled data to check accuracy before and after fine-tuning: eval data, else the training data."""
    for key in ("eval", "train"):
        ds = ctx.data.get(key)
        if ds is not None and ds.labels is not None and len(specs) == 1:
            return ds.bind(specs)[specs[0].name], np.asarray(ds.labels).astype(np.int64)
    return None


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((np.asarray(logits).reshape(len(logits), -1).argmax(1) == labels).mean())


def check_accuracy(ctx, before: float | None, after: float | None, max_drop: float | None, what: str) -> None:
    """Record top-1 before/after; fail when fine-tuning left the model much worse than it started."""
    if before is None or after is None:
        return
    ctx.measurements.setdefault("finetune", {}).update({"top1_before": before, "top1_after": after})
    if max_drop is not None and before - after > max_drop:
        raise ValidationError(
            f"{what}: top-1 fell from {before:.4f} to {after:.4f} ({(before - after) * 100:.1f} pt, more than "
            f"max_accuracy_drop {max_drop * 100:.1f} pt); train longer (epochs / --epochs), lower the sparsity, or raise "
            "max_accuracy_drop (--max-accuracy-drop)")


def steps_per_epoch(n: int, batch: int) -> int:
    return max(1, math.ceil(n / batch))


# ----------------------------------------------------------------------------------------------- Keras
def keras_optimizer(cfg: FinetuneConfig):
    import tf_keras

    opts = {"adam": tf_keras.optimizers.Adam, "sgd": tf_keras.optimizers.SGD,
            "rmsprop": tf_keras.optimizers.RMSprop, "adamw": tf_keras.optimizers.AdamW}
    return opts[cfg.optimizer](learning_rate=cfg.learning_rate)


def keras_from_logits(model) -> bool:
    """False when the model ends in a softmax (it outputs probabilities), else True."""
    import tf_keras

    last = model.layers[-1]
    act = getattr(last, "activation", None)
    if act is tf_keras.activations.softmax or isinstance(last, tf_keras.layers.Softmax):
        return False
    return True


def keras_fit(model, x: np.ndarray, y: np.ndarray, cfg: FinetuneConfig, strategy, *, seed: int,
              callbacks: list | None = None) -> dict[str, Any]:
    """Compile (inside the strategy scope) and fit; returns the history."""
    import tensorflow as tf
    import tf_keras

    with strategy.scope():
        model.compile(optimizer=keras_optimizer(cfg),
                      loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=keras_from_logits(model)),
                      metrics=["accuracy"])
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    data = data.batch(cfg.batch_size)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.experimental_deterministic = True
    data = data.with_options(options)
    callbacks = list(callbacks or [])
    if cfg.tensorboard and is_chief():  # epoch_loss and epoch_accuracy under <folder>/train
        check_tensorboard(cfg.tensorboard)
        callbacks.append(tf_keras.callbacks.TensorBoard(log_dir=cfg.tensorboard, write_graph=False, profile_batch=0))
    hist = model.fit(data, epochs=cfg.epochs, callbacks=callbacks, verbose=0)
    return {k: [float(v) for v in vals] for k, vals in hist.history.items()}


def keras_predict(model, x: np.ndarray, batch: int = 256) -> np.ndarray:
    """Logits in-process, without the strategy machinery (no collectives)."""
    outs = [np.asarray(model(x[i:i + batch], training=False)) for i in range(0, len(x), batch)]
    return np.concatenate(outs, axis=0)


# --------------------------------------------------------------------------------------------- PyTorch
def torch_optimizer(cfg: FinetuneConfig, params):
    import torch

    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.learning_rate, momentum=0.9)
    opts = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop}
    return opts[cfg.optimizer](params, lr=cfg.learning_rate)


def torch_fit(model, x: np.ndarray, y: np.ndarray, cfg: FinetuneConfig, *, seed: int) -> dict[str, Any]:
    """Train `model` in place; under torchrun (strategy ddp) it is wrapped in DistributedDataParallel.

    The global batch is cfg.batch_size, split over the ranks (no sample dropped), so an N-process run takes
    the same optimizer steps on the same samples, with the same gradients, as a 1-process run.
    """
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    rank, world, device = 0, 1, torch.device("cpu")
    ddp = cfg.strategy == "ddp"
    if ddp:
        rank, world, device = init_torch_ddp()
    model.to(device).train()
    net = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(seed)
    writer = torch_writer(cfg.tensorboard) if cfg.tensorboard and rank == 0 else None
    losses, accuracies = [], []
    for epoch in range(cfg.epochs):
        order = torch.randperm(len(xt), generator=gen)  # same order on every rank (same seed)
        total, count, correct = 0.0, 0, 0
        for start in range(0, len(order), cfg.batch_size):
            batch = order[start:start + cfg.batch_size]
            mine = torch.tensor_split(batch, world)[rank]  # every sample of the global batch, on some rank
            weight = 1.0
            if len(mine) == 0:  # fewer samples than ranks: this rank still joins the step, adding nothing
                mine, weight = batch[:1], 0.0
            xb, yb = xt[mine].to(device), yt[mine].to(device)
            opt.zero_grad(set_to_none=True)
            # DDP averages gradients over the ranks; scaling each rank's summed loss by world / len(batch)
            # makes that average the gradient of the global batch's mean loss, whatever the shard sizes
            logits = net(xb)
            summed = F.cross_entropy(logits, yb, reduction="sum") * weight
            (summed * (world / len(batch))).backward()
            opt.step()
            total += summed.item()
            count += len(mine) if weight else 0
            correct += int((logits.argmax(1) == yb).sum()) if weight else 0
        losses.append(total / max(count, 1))
        accuracies.append(correct / max(count, 1))
        if writer is not None:  # the tags and folder the Keras callback uses
            writer.add_scalar("epoch_loss", losses[-1], epoch)
            writer.add_scalar("epoch_accuracy", accuracies[-1], epoch)
    if writer is not None:
        writer.close()
    model.eval().to("cpu")
    if ddp:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()  # from here on every rank works alone (export, checks)
    return {"loss": losses, "accuracy": accuracies, "world_size": world}


def torch_writer(folder: str):
    """torch's SummaryWriter on <folder>/train (as the Keras callback lays it out)."""
    check_tensorboard(folder)
    if importlib.util.find_spec("tensorflow") is not None:
        import_tf()  # tensorboard imports TensorFlow where it is installed: the legacy Keras, and quietly
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise DependencyError(f"tensorboard (--tensorboard) cannot import torch.utils.tensorboard ({e}): {TENSORBOARD_HINT}") from None
    return SummaryWriter(log_dir=str(Path(folder) / "train"))


def torch_predict(model, x: np.ndarray, batch: int = 256) -> np.ndarray:
    import torch

    with torch.no_grad():
        return np.concatenate([model(torch.from_numpy(x[i:i + batch])).numpy() for i in range(0, len(x), batch)])
