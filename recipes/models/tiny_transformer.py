"""A small transformer encoder classifier for the 8x8 digits (8 tokens of 8 features); seeded weights.

Used by recipes/transformer-int8-int4.yaml. `make_model()` returns the module; input `input` [N,1,8,8].
"""
import torch
from torch import nn


class TinyTransformer(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2, classes: int = 10):
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.pos = nn.Parameter(torch.randn(1, 8, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, input):  # noqa: A002 (the ONNX input is named `input`, like the data)
        tokens = input.reshape(input.shape[0], 8, 8)
        h = self.encoder(self.embed(tokens) + self.pos)
        return self.head(h.mean(dim=1))


def make_model():
    torch.manual_seed(0)
    return TinyTransformer().eval()


def example_inputs():
    return (torch.zeros(1, 1, 8, 8),)
