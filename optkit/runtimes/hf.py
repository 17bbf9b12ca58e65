"""A Hugging Face folder run through torch (transformers, and sentence-transformers' pooling as optkit exports it):
what `optkit eval`, `bench` and `inspect` measure an `hf` model with, so "equal to transformers" is one eval
away. Its inputs and outputs are the ones convert.hf gives the ONNX file."""
from __future__ import annotations

import numpy as np

from optkit.core import tmp
from optkit.core.artifact import Artifact
from optkit.core.formats import Format
from optkit.runtimes import hf_model
from optkit.runtimes.base import Session


class HFSession(Session):
    runtime = "torch (transformers)"

    @classmethod
    def warm(cls, fmt: Format | None = None) -> None:
        tmp.own_tempdir()
        import torch

        hf_model.import_transformers()
        torch.zeros(1) + 1

    def __init__(self, artifact: Artifact, threads: int | None = None):
        tmp.own_tempdir()
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.threads = threads or torch.get_num_threads()
        self.spec = hf_model.describe(artifact.path, artifact.meta.get("task"))
        self.model, names = hf_model.load(self.spec)
        size = hf_model.image_size(self.spec) if names == ["pixel_values"] else None
        self.inputs = hf_model.input_specs(self.spec, names, size)
        self.outputs = hf_model.output_specs(self.spec, self.model.model)
        self._torch = torch

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        args = [torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in self.inputs]
        with torch.inference_mode():
            out = self.model(*args)
        out = out if isinstance(out, tuple) else (out,)
        return [t.detach().float().cpu().numpy() for t in out]

    def op_histogram(self) -> dict[str, int]:
        from collections import Counter

        leaves = [m for m in self.model.modules() if not list(m.children()) and type(m).__name__ != "ModuleList"]
        return dict(Counter(type(m).__name__ for m in leaves).most_common())

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())
