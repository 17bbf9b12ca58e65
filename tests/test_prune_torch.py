"""prune.torch: global L1 and channel pruning (Torch-Pruning) with fine-tuning, then onward to ONNX."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
from _digits import digits_train

from conftest import no_result_files, one_error_line

torch = pytest.importorskip("torch")
pytest.importorskip("torch_pruning")


@pytest.fixture(scope="module")
def train_npz(tmp_path_factory):
    return digits_train(tmp_path_factory.mktemp("digits"), "nchw")


@pytest.fixture(scope="module")
def data(samples, train_npz):
    from optkit.measure.datasets import load_dataset

    return {"train": load_dataset(train_npz), "eval": load_dataset(samples / "digits_eval_nchw.npz")}


def _source(samples):
    from optkit.core.artifact import Artifact

    return Artifact.load(f"{samples}/torch_cnn.py:make_model")


def test_channel_pruning_shrinks_model_and_converts_to_onnx(samples, data, tmp_path):
    from optkit.core.artifact import Artifact
    from optkit.core.formats import Format
    from optkit.measure.size import onnx_parameters
    from optkit.pipeline.stage import run_pass
    from optkit.runtimes.base import open_session

    state = (samples / "torch_cnn_state.pt").read_bytes()
    result = run_pass(_source(samples), "prune.torch", {"method": "channels", "sparsity": 0.5, "epochs": 4},
                      tmp_path / "pruned.pt2", data=data)
    p = result.ctx.measurements["pruning"]
    assert p["parameter_ratio"] <= 0.35, p
    assert p["channels"]["features.0"] == {"before": 16, "after": 8}
    assert p["channels"]["classifier.3"] == {"before": 10, "after": 10}  # the output layer keeps its width
    f = result.ctx.measurements["finetune"]
    assert f["top1_after"] >= f["top1_before"] - 0.03
    assert result.output.format == Format.TORCH_EXPORT
    assert (samples / "torch_cnn_state.pt").read_bytes() == state

    session = open_session(Artifact.load(tmp_path / "pruned.pt2"))
    eval_x = data["eval"].arrays["input"][:64]
    assert session.run({"input": eval_x})[0].shape == (64, 10)
    assert session.run({"input": eval_x[:3]})[0].shape == (3, 10)  # dynamic batch

    onnx_out = run_pass(result.output, "convert.torch", {}, tmp_path / "pruned.onnx")
    assert onnx_parameters(onnx_out.output.path)["parameters"] <= p["parameters_after"] + 16  # + shape constants


def test_unstructured_global_l1_is_permanent(samples, data, tmp_path):
    from optkit.pipeline.stage import run_pass

    result = run_pass(_source(samples), "prune.torch",
                      {"method": "unstructured", "sparsity": 0.6, "epochs": 1, "exclude": ["features.0"]},
                      tmp_path / "sparse.pt", data=data)
    p = result.ctx.measurements["pruning"]
    assert p["parameter_ratio"] == 1.0
    assert p["layers"]["features.0"]["sparsity"] == 0.0
    ts = torch.jit.load(str(tmp_path / "sparse.pt"))
    names = [n for n, _ in ts.named_parameters()]
    assert not any(n.endswith("_orig") for n in names)  # masks made permanent, no reparametrization left
    weights = torch.cat([w.flatten() for n, w in ts.named_parameters() if n.endswith("weight") and
                         not n.startswith("features.0")])
    assert float((weights == 0).float().mean()) == pytest.approx(0.6, abs=0.02)


def test_bad_options_and_data(samples, data, tmp_path):
    from optkit.core.errors import UsageError
    from optkit.measure.datasets import load_dataset
    from optkit.pipeline.stage import run_pass

    with pytest.raises(UsageError, match=r"\.pt2.*\.pt"):
        run_pass(_source(samples), "prune.torch", {"epochs": 1}, tmp_path / "o.onnx", data=data)
    with pytest.raises(UsageError, match="features.99"):
        run_pass(_source(samples), "prune.torch", {"epochs": 0, "exclude": ["features.99"]}, tmp_path / "o.pt2",
                 data=data)
    flat = tmp_path / "flat.npz"
    np.savez(flat, input=np.zeros((16, 64), np.float32), labels=np.zeros(16, np.int64))
    with pytest.raises(UsageError, match=r"per-sample shape \[64\]"):
        run_pass(_source(samples), "prune.torch", {"epochs": 1}, tmp_path / "o.pt2",
                 data={"train": load_dataset(flat)})
    labels = tmp_path / "labels.npz"
    np.savez(labels, input=np.zeros((16, 1, 8, 8), np.float32), labels=np.full(16, 12, np.int64))
    with pytest.raises(UsageError, match="10 outputs"):
        run_pass(_source(samples), "prune.torch", {"epochs": 1}, tmp_path / "o.pt2",
                 data={"train": load_dataset(labels)})
    assert sorted(no_result_files(tmp_path)) == ["flat.npz", "labels.npz"]


HARDCODED = textwrap.dedent('''
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
            self.fc = nn.Linear(16 * 8 * 8, 10)

        def forward(self, input):
            x = torch.relu(self.conv2(torch.relu(self.conv1(input))))
            return self.fc(x.reshape(-1, 1024))   # hard-codes 16 channels

    def make_model():
        torch.manual_seed(0)
        return Net().eval()

    def example_inputs():
        return (torch.zeros(1, 1, 8, 8),)
''')


def test_cli_inconsistent_channels_exit_3_nothing_written(cli, samples, train_npz, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "hard.py").write_text(HARDCODED)
    out = tmp_path / "out"
    out.mkdir()
    r = cli("prune", f"{src}/hard.py:make_model", "-o", out / "p.pt2", "--train", train_npz, "--epochs", "1")
    assert r.rc == 3, r.err
    line = one_error_line(r)
    assert "cannot prune the channels of this model consistently" in line and "--method unstructured" in line
    assert no_result_files(out) == []


def test_finetunes_on_an_image_folder(samples, tmp_path):
    from PIL import Image

    from optkit.measure.datasets import load_dataset
    from optkit.pipeline.stage import run_pass

    z = np.load(samples / "digits_eval_nchw.npz")
    for i, (x, y) in enumerate(zip(z["input"][:120], z["labels"][:120])):
        folder = tmp_path / "imgs" / str(y)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((x[0] * 255).astype(np.uint8), mode="L").save(folder / f"{i}.png")
    train = load_dataset(tmp_path / "imgs", {"color": "gray", "layout": "nchw"})
    assert train.arrays[""].shape == (120, 1, 8, 8)
    result = run_pass(_source(samples), "prune.torch", {"method": "unstructured", "epochs": 1,
                                                        "max_accuracy_drop": None},
                      tmp_path / "p.pt2", data={"train": train})
    assert result.ctx.measurements["pruning"]["weight_sparsity"] == pytest.approx(0.5, abs=0.01)
    assert "top1_after" in result.ctx.measurements["finetune"]
