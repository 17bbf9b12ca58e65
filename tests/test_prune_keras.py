"""prune.keras: TF-MOT magnitude pruning with fine-tuning on real data (real TF, TF-MOT; no mocks)."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest
from _digits import digits_train

from conftest import no_result_files, one_error_line

pytest.importorskip("tensorflow_model_optimization")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


@pytest.fixture(scope="module")
def data(samples, tmp_path_factory):
    from optkit.measure.datasets import load_dataset

    folder = tmp_path_factory.mktemp("digits")
    return {"train": load_dataset(digits_train(folder, "nhwc")),
            "eval": load_dataset(samples / "digits_eval_nhwc.npz")}


def _prune(samples, out, config, data):
    from optkit.core.artifact import Artifact
    from optkit.pipeline.stage import run_pass

    return run_pass(Artifact.load(samples / "keras_cnn.keras"), "prune.keras", config, out, data=data)


def test_polynomial_50_percent_sparsity_keeps_accuracy(samples, data, tmp_path):
    from optkit.core.artifact import Artifact
    from optkit.runtimes.tf import load_keras

    src = Artifact.load(samples / "keras_cnn.keras").sha256
    out = tmp_path / "pruned.keras"
    result = _prune(samples, out, {"sparsity": 0.5, "epochs": 2}, data)
    m = result.ctx.measurements
    layers = m["sparsity"]["layers"]
    assert set(m["sparsity"]["pruned_layers"]) == {"conv2d", "conv2d_1", "conv2d_2", "dense", "logits"}
    for name in m["sparsity"]["pruned_layers"]:
        assert layers[name]["sparsity"] == pytest.approx(0.5, abs=0.01), (name, layers[name])
    assert m["finetune"]["top1_after"] >= m["finetune"]["top1_before"] - 0.01  # target: drop <= 1 pt
    # the wrappers are stripped: a plain Keras model with plain layer names
    model = load_keras(str(out))
    assert [type(layer).__name__ for layer in model.layers if "Prune" in type(layer).__name__] == []
    kernel = model.get_layer("dense").kernel.numpy()
    assert (kernel == 0).mean() == pytest.approx(0.5, abs=0.01)
    # sparsity shows in bytes once compressed
    before = len(gzip.compress((samples / "keras_cnn.keras").read_bytes(), 9))
    after = len(gzip.compress(out.read_bytes(), 9))
    assert after <= 0.62 * before, (after, before)  # ~0.60x: gzip on float32 at 50% random sparsity
    # TFLite's sparse encoding drops the zeros from the file itself; the model computes the same
    from optkit.pipeline.stage import run_pass

    sizes = {}
    for sparse in (False, True):
        t = tmp_path / f"pruned_{sparse}.tflite"
        r = run_pass(Artifact.load(out), "tflite.export", {"sparse": sparse}, t, data=data)
        assert r.ctx.measurements["conversion_fidelity"]["cosine"] > 0.99999
        sizes[sparse] = t.stat().st_size
    assert sizes[True] < 0.8 * sizes[False], sizes  # ~0.74x measured
    # the input model is untouched
    assert Artifact.load(samples / "keras_cnn.keras").sha256 == src
    assert "polynomial schedule" in result.ctx.notes[0]


def test_m_by_n_constant_schedule_and_exclude(samples, data, tmp_path):
    out = tmp_path / "mbyn.h5"
    result = _prune(samples, out, {"m_by_n": [2, 4], "schedule": "constant", "exclude": ["logits"], "epochs": 1},
                    data)
    layers = result.ctx.measurements["sparsity"]["layers"]
    assert "logits" not in result.ctx.measurements["sparsity"]["pruned_layers"]
    assert layers["logits"]["sparsity"] < 0.05
    from optkit.runtimes.tf import load_keras

    kernel = load_keras(str(out)).get_layer("dense").kernel.numpy()  # [in, out]: 2 zeros in every 4 along `in`
    groups = kernel.T.reshape(kernel.shape[1], -1, 4)
    assert ((groups == 0).sum(-1) >= 2).all()


def test_block_sparsity_on_chosen_layers(samples, data, tmp_path):
    out = tmp_path / "block.keras"
    result = _prune(samples, out, {"sparsity": 0.5, "block_size": [1, 4], "layers": ["dense"], "epochs": 1,
                                   "frequency": 5}, data)
    s = result.ctx.measurements["sparsity"]
    assert s["pruned_layers"] == ["dense"]
    assert s["layers"]["conv2d"]["sparsity"] < 0.05
    from optkit.runtimes.tf import load_keras

    kernel = load_keras(str(out)).get_layer("dense").kernel.numpy()
    blocks = kernel.reshape(kernel.shape[0], -1, 4)
    zero_blocks = (blocks == 0).all(-1)
    assert zero_blocks.mean() == pytest.approx(0.5, abs=0.03)


def test_unsupported_layer_is_named_and_can_be_skipped(data, tmp_path):
    import tf_keras

    from optkit.core.artifact import Artifact
    from optkit.core.errors import UsageError
    from optkit.pipeline.stage import run_pass

    inp = tf_keras.Input((8, 8, 1), name="input")
    h = tf_keras.layers.Conv2D(4, 3, padding="same", name="conv")(inp)  # named: Keras numbers unnamed layers
    h = tf_keras.layers.PReLU(name="act")(h)                              # per process, so the order of tests shows
    h = tf_keras.layers.Flatten()(h)
    out = tf_keras.layers.Dense(10, name="logits")(h)
    path = tmp_path / "prelu.keras"
    tf_keras.Model(inp, out).save(path)
    with pytest.raises(UsageError, match=r"cannot prune layer 'act' \(PReLU\).*--exclude act"):
        run_pass(Artifact.load(path), "prune.keras", {"epochs": 1, "max_accuracy_drop": None},
                 tmp_path / "o.keras", data=data)
    assert not (tmp_path / "o.keras").exists()
    result = run_pass(Artifact.load(path), "prune.keras",
                      {"epochs": 1, "skip_unsupported": True, "max_accuracy_drop": None, "schedule": "constant"},
                      tmp_path / "o.keras", data=data)
    assert "act" in result.ctx.warnings[0]
    assert result.ctx.measurements["sparsity"]["pruned_layers"] == ["conv", "logits"]


def test_wrong_shape_data_is_a_usage_error(samples, tmp_path):
    from optkit.core.errors import UsageError
    from optkit.measure.datasets import load_dataset

    bad = tmp_path / "flat.npz"
    np.savez(bad, input=np.zeros((32, 64), np.float32), labels=np.zeros(32, np.int64))
    with pytest.raises(UsageError, match=r"per-sample shape \[64\].*\[8,8,1\]"):
        _prune(samples, tmp_path / "o.keras", {"epochs": 1}, {"train": load_dataset(bad)})
    assert no_result_files(tmp_path) == ["flat.npz"]


def test_cli_bad_sparsity_and_missing_data(cli, samples, tmp_path):
    r = cli("prune", samples / "keras_cnn.keras", "-o", tmp_path / "o.keras", "--sparsity", "1.5",
            "--train", samples / "digits_eval_nhwc.npz")
    assert r.rc == 2
    assert "sparsity must be between 0 and 1" in one_error_line(r)
    r = cli("prune", samples / "keras_cnn.keras", "-o", tmp_path / "o.keras", "--sparsity", "0")
    assert r.rc == 2 and "sparsity" in one_error_line(r)
    r = cli("prune", samples / "torch_cnn.onnx", "-o", tmp_path / "o.onnx", "--train", samples / "digits_eval_nhwc.npz")
    assert r.rc == 2 and "prune the source model" in one_error_line(r)
    assert no_result_files(tmp_path) == []


@pytest.mark.slow
def test_cli_unsupported_layer_exit_2_nothing_written(cli, tmp_path, samples):
    import tf_keras

    inp = tf_keras.Input((8, 8, 1), name="input")
    h = tf_keras.layers.Flatten()(inp)
    h = tf_keras.layers.Dense(16)(h)
    h = tf_keras.layers.PReLU(name="act")(h)
    out = tf_keras.layers.Dense(10, name="logits")(h)
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    tf_keras.Model(inp, out).save(model_dir / "prelu.keras")
    outdir = tmp_path / "out"
    outdir.mkdir()
    r = cli("prune", model_dir / "prelu.keras", "-o", outdir / "p.keras", "--train", samples / "digits_eval_nhwc.npz")
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert "'act' (PReLU)" in line and "--exclude act" in line and "--skip-unsupported" in line
    assert no_result_files(outdir) == []
