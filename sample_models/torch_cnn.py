"""Small PyTorch CNN for the 8x8 digits sample (NCHW input [N, 1, 8, 8] -> logits [N, 10]).

`make_model()` returns the trained model (weights from `torch_cnn_state.pt`
next to this file, loaded with ``weights_only=True``) in eval mode; pass
``weights=None`` for an untrained one.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

STATE_PATH = Path(__file__).with_name("torch_cnn_state.pt")


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
            nn.Linear(64, 10),
        )

    # The argument is named `input` so exported graphs (torch.export, ONNX)
    # call their input `input`, like every other sample model.
    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return self.classifier(self.features(input))


def make_model(weights: str | Path | None = STATE_PATH) -> DigitsCNN:
    """Return a DigitsCNN in eval mode, with `weights` loaded when that file exists."""
    model = DigitsCNN()
    if weights is not None and Path(weights).exists():
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval()


def example_inputs() -> tuple[torch.Tensor]:
    return (torch.zeros(1, 1, 8, 8, dtype=torch.float32),)
