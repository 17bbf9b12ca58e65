"""Fine-tuning data for the pruning / QAT tests: the digits train split the sample models were trained on.

sample_models/ ships only the calibration and evaluation splits; this rebuilds the 1200-sample train split
with the same stratified, seeded split as sample_models/build.py.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def digits_train(folder: Path, layout: str, n: int | None = None) -> Path:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    path = Path(folder) / f"digits_train_{layout}{n or ''}.npz"
    if path.exists():
        return path
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 8, 8)
    y = d.target.astype(np.int64)
    x_rest, _, y_rest, _ = train_test_split(x, y, test_size=497, stratify=y, random_state=0)
    x_train, _, y_train, _ = train_test_split(x_rest, y_rest, test_size=100, stratify=y_rest, random_state=0)
    if n:
        x_train, y_train = x_train[:n], y_train[:n]
    x_train = x_train[:, None] if layout == "nchw" else x_train[..., None]
    np.savez(path, input=np.ascontiguousarray(x_train), labels=y_train)
    return path
