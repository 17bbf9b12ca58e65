"""Distributed fine-tuning on this CPU machine: two local worker processes, compared with one process.

TensorFlow: `--strategy multi-worker` with TF_CONFIG (MultiWorkerMirroredStrategy over gRPC on localhost), and
`--strategy mirrored` over two logical CPU devices. PyTorch: `--strategy ddp` launched by torchrun (gloo).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _digits import digits_train

from conftest import ROOT

pytestmark = pytest.mark.slow
NOISE = 0.015  # top-1 on 497 eval samples: a 2-worker run may differ from 1 process by a few samples


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _env(**extra) -> dict:
    return {**os.environ, "OPTKIT_ISOLATE": "0", "COLUMNS": "200", **extra}


def _report(text: str) -> dict:
    return json.loads(text[text.index("{"):text.rindex("}") + 1])


def test_tf_multi_worker_matches_single_process(samples, tmp_path):
    pytest.importorskip("tensorflow_model_optimization")
    from optkit.core.artifact import Artifact
    from optkit.measure.datasets import load_dataset
    from optkit.pipeline.stage import run_pass

    train = digits_train(tmp_path, "nhwc", n=600)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = [sys.executable, "-m", "optkit", "prune", str(samples / "keras_cnn.keras"), "-o", str(out_dir / "p.keras"),
            "--train", str(train), "--eval-data", str(samples / "digits_eval_nhwc.npz"), "--epochs", "3",
            "--strategy", "multi-worker", "--json"]
    workers = [f"localhost:{p}" for p in _ports(2)]
    procs = []
    for i in range(2):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        procs.append(subprocess.Popen(args, cwd=ROOT, env=_env(TF_CONFIG=tf_config), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    assert "the chief writes" in outs[1][0]
    assert sorted(f.name for f in out_dir.iterdir()) == ["p.keras"]  # the worker wrote nothing
    stage = _report(outs[0][0])["stages"][-1]["measurements"]
    assert stage["finetune"]["replicas"] == 2 and stage["finetune"]["strategy"] == "multi-worker"
    assert stage["sparsity"]["overall_pruned"] == pytest.approx(0.5, abs=0.01)

    single = run_pass(Artifact.load(samples / "keras_cnn.keras"), "prune.keras", {"epochs": 3},
                      tmp_path / "single.keras", data={"train": load_dataset(train),
                                                       "eval": load_dataset(samples / "digits_eval_nhwc.npz")})
    one = single.ctx.measurements["finetune"]["top1_after"]
    assert abs(stage["accuracy"]["top1"] - one) <= NOISE, (stage["accuracy"]["top1"], one)
    assert abs(stage["finetune"]["loss"][-1] - single.ctx.measurements["finetune"]["loss"][-1]) < 0.05


def test_tf_mirrored_over_two_cpu_replicas(samples, tmp_path):
    pytest.importorskip("tensorflow_model_optimization")
    train = digits_train(tmp_path, "nhwc", n=300)
    code = f"""
import json
from optkit.core.artifact import Artifact
from optkit.pipeline.stage import run_pass
from optkit.measure.datasets import load_dataset
r = run_pass(Artifact.load({str(samples / 'keras_cnn.keras')!r}), "qat.keras",
             {{"epochs": 1, "strategy": "mirrored", "max_accuracy_drop": None}}, {str(tmp_path / 'q.h5')!r},
             data={{"train": load_dataset({str(train)!r})}})
print(json.dumps(r.ctx.measurements["qat"]))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(OPTKIT_CPU_REPLICAS="2"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    qat = json.loads(proc.stdout.strip().splitlines()[-1])
    assert qat["replicas"] == 2 and qat["strategy"] == "mirrored"
    assert (tmp_path / "q.h5").exists()


def test_torch_ddp_under_torchrun_matches_single_process(samples, tmp_path):
    pytest.importorskip("torch_pruning")
    from optkit.core.artifact import Artifact
    from optkit.measure.datasets import load_dataset
    from optkit.pipeline.stage import run_pass

    train = digits_train(tmp_path, "nchw")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", "2", "--master-port", str(_ports(1)[0]), "-m", "optkit", "prune",
           f"{samples}/torch_cnn.py:make_model", "-o", str(out_dir / "p.pt2"), "--train", str(train),
           "--eval-data", str(samples / "digits_eval_nchw.npz"), "--epochs", "3", "--strategy", "ddp", "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the chief writes" in proc.stdout
    assert sorted(f.name for f in out_dir.iterdir()) == ["p.pt2"]
    stage = _report(proc.stdout)["stages"][-1]["measurements"]
    assert stage["finetune"]["world_size"] == 2

    single = run_pass(Artifact.load(f"{samples}/torch_cnn.py:make_model"), "prune.torch", {"epochs": 3},
                      tmp_path / "single.pt2", data={"train": load_dataset(train),
                                                     "eval": load_dataset(samples / "digits_eval_nchw.npz")})
    assert stage["pruning"]["parameters_after"] == single.ctx.measurements["pruning"]["parameters_after"]
    one = single.ctx.measurements["finetune"]["top1_after"]
    assert abs(stage["accuracy"]["top1"] - one) <= NOISE, (stage["accuracy"]["top1"], one)


def test_ddp_without_torchrun_is_a_usage_error(cli, samples, tmp_path):
    train = digits_train(tmp_path, "nchw", n=64)
    r = cli("prune", f"{samples}/torch_cnn.py:make_model", "-o", tmp_path / "p.pt2", "--train", train,
            "--strategy", "ddp", "--epochs", "1")
    assert r.rc == 2 and "torchrun" in r.err.strip().splitlines()[-1]
    r = cli("prune", f"{samples}/torch_cnn.py:make_model", "-o", tmp_path / "p.pt2", "--train", train,
            "--strategy", "mirrored")
    assert r.rc == 2 and "TensorFlow" in r.err.strip().splitlines()[-1]
    assert not (tmp_path / "p.pt2").exists()


def _tiny_net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


def _ddp_worker(rank: int, world: int, port: int, x, y, out: str) -> None:
    import torch

    from optkit.passes.training.finetune import FinetuneConfig, torch_fit

    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    model = _tiny_net()
    torch_fit(model, x, y, FinetuneConfig(epochs=2, batch_size=10, strategy="ddp", learning_rate=0.01), seed=0)
    if rank == 0:
        torch.save(model.state_dict(), out)


def test_ddp_shards_uneven_batches_without_dropping_samples(tmp_path, monkeypatch):
    """3 ranks, global batch 10, 53 samples (batches of 10 split 4/3/3, a last batch of 3 split 1/1/1): the
    weights after two epochs equal a single-process run's, so no sample is dropped or weighted differently."""
    import numpy as np
    import torch
    import torch.multiprocessing as mp

    from optkit.passes.training.finetune import FinetuneConfig, torch_fit

    rng = np.random.default_rng(0)
    x = rng.standard_normal((53, 64)).astype(np.float32)
    y = rng.integers(0, 10, 53).astype(np.int64)
    mp.spawn(_ddp_worker, args=(3, _ports(1)[0], x, y, str(tmp_path / "ddp.pt")), nprocs=3, join=True)

    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    model = _tiny_net()
    torch_fit(model, x, y, FinetuneConfig(epochs=2, batch_size=10, learning_rate=0.01), seed=0)
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    for name, w in model.state_dict().items():
        assert torch.allclose(w, ddp[name], atol=1e-5), (name, (w - ddp[name]).abs().max())
