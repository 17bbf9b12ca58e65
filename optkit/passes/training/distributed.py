"""Distributed fine-tuning on the frameworks' own engines: tf.distribute and torch.distributed (DDP).

Nothing here launches processes: TensorFlow multi-worker jobs start one `optkit` process per machine with
TF_CONFIG set, and PyTorch jobs are started by `torchrun`, which sets RANK / WORLD_SIZE / MASTER_ADDR.
See docs/distributed.md.

Strategies (the `strategy` option of the fine-tuning passes):
  none          one process, the framework's default device placement
  mirrored      tf.distribute.MirroredStrategy over this machine's GPUs (or its CPU); OPTKIT_CPU_REPLICAS=N
                splits the CPU into N logical devices (for testing replica logic without GPUs)
  multi-worker  tf.distribute.MultiWorkerMirroredStrategy; TF_CONFIG describes the cluster
  ddp           torch.nn.parallel.DistributedDataParallel; launched by torchrun (gloo on CPU, nccl on CUDA)
"""
from __future__ import annotations

import json
import os
from typing import Literal

from optkit.core.errors import UsageError
from optkit.core.text import first_line
from optkit.runtimes.tf import import_tf

Strategy = Literal["none", "mirrored", "multi-worker", "ddp"]
TF_STRATEGIES = ("none", "mirrored", "multi-worker")
TORCH_STRATEGIES = ("none", "ddp")


def check_strategy(strategy: str, framework: str) -> None:
    allowed = TF_STRATEGIES if framework == "tf" else TORCH_STRATEGIES
    if strategy not in allowed:
        other = "PyTorch" if framework == "tf" else "TensorFlow"
        raise UsageError(f"strategy (--strategy) {strategy} is for {other} models; for this model use one of "
                         f"{', '.join(allowed)}")


# ------------------------------------------------------------------------------------------ TensorFlow
def tf_config() -> dict | None:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        cfg["cluster"], cfg["task"]["type"], int(cfg["task"]["index"])
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested too deep
        raise UsageError("TF_CONFIG is not valid JSON of the form "
                         '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}') from None
    return cfg


def tf_is_chief() -> bool:
    """Whether this process writes results in a TF multi-worker job (worker 0, or the 'chief' task)."""
    cfg = tf_config()
    if not cfg:
        return True
    task = cfg["task"]
    if "chief" in cfg["cluster"]:
        return task["type"] == "chief"
    return task["type"] == "worker" and int(task["index"]) == 0


def make_tf_strategy(strategy: str):
    """The tf.distribute strategy for `strategy`. Create it before any other TensorFlow work in the process."""

    tf = import_tf()
    if strategy == "none":
        return tf.distribute.get_strategy()  # the default (no-op) strategy
    if strategy == "mirrored":
        if tf.config.list_physical_devices("GPU"):  # physical: listing logical devices would fix the CPU split
            return tf.distribute.MirroredStrategy()
        replicas = int(os.environ.get("OPTKIT_CPU_REPLICAS", "1"))
        if replicas > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            try:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
            except RuntimeError:
                pass  # already initialised: use what is there
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices=cpus,
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    if strategy == "multi-worker":
        cfg = tf_config()
        if not cfg:
            raise UsageError("strategy (--strategy) multi-worker needs TF_CONFIG describing the cluster and this task; "
                             "see docs/distributed.md")
        try:
            return tf.distribute.MultiWorkerMirroredStrategy()
        except RuntimeError as e:
            raise UsageError(f"cannot start the multi-worker strategy: {first_line(e)} "
                             "(it must be created before TensorFlow runs anything in the process)") from None
    raise UsageError(f"unknown strategy {strategy!r} for TensorFlow; use none, mirrored or multi-worker")


# --------------------------------------------------------------------------------------------- PyTorch
def torch_env() -> dict | None:
    """RANK / WORLD_SIZE / LOCAL_RANK as set by torchrun, or None when not launched by it."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}


def torch_is_chief() -> bool:
    env = torch_env()
    return env is None or env["rank"] == 0


def is_chief() -> bool:
    """Whether this process writes the result (always true outside a distributed job)."""
    return tf_is_chief() and torch_is_chief()


def init_torch_ddp():
    """Join the torchrun job (gloo on CPU, nccl on CUDA); return (rank, world_size, device)."""
    import torch
    import torch.distributed as dist

    env = torch_env()
    if env is None:
        raise UsageError("strategy (--strategy) ddp runs under torchrun: torchrun --nproc-per-node N -m optkit prune ... "
                         "(see docs/distributed.md)")
    if not dist.is_available():
        raise UsageError("this PyTorch build has no torch.distributed")
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{env['local_rank']}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return dist.get_rank(), dist.get_world_size(), device
