"""split.json: `optkit split`'s account of a model cut into parts (DIR/split.json beside DIR/{pre,core,post}.onnx),
written by optkit/split/write.py and read by `optkit package` (package/ensemble.py) and by split itself (is a
folder a previous split output?).

Schema 3 records the sha256 of the model that was split (`model_sha256`): a package of the folder takes the
tuned settings and capacity of that model, checked by it. Schema 2 (before) records each part's sha256 and is
read as it was; schema 1 (split as first landed) is read with a note that its parts were not checked.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from optkit.contracts.base import Open, Sha256, build

SCHEMA = 3
FILE = "split.json"
HINT = "write it again with `optkit split MODEL -o DIR`"
PART_NAMES = ("pre", "core", "post")

Dim = Annotated[int, Field(ge=-1)] | str | None


class TensorSpec(Open):
    name: str = Field(min_length=1)
    dtype: str
    shape: list[Dim]


class CutTensor(TensorSpec):
    bytes_per_sample: Annotated[int, Field(ge=0)] | None = None


class PartSpec(Open):
    name: Literal["pre", "core", "post"]
    file: str = Field(min_length=1)
    device: Literal["cpu", "gpu"]
    why: str = ""
    ops: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    sha256: Sha256 | None = None


class Cut(Open):
    from_: str = Field(alias="from")
    to: str
    tensors: list[CutTensor]
    bytes_per_sample: Annotated[int, Field(ge=0)] | None = None


class SplitFile(Open):
    schema_: Literal[1, 2, 3] = Field(alias="schema")   # 2: each part's sha256; 3: the model's too
    model: str
    model_sha256: Sha256 | None = None
    provider: str | None = None
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    parts: list[PartSpec] = Field(min_length=2, max_length=3)
    cuts: list[Cut] = Field(default_factory=list)
    naive_cut_bytes_per_sample: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _recorded(self):
        if self.schema_ >= 3 and self.model_sha256 is None:
            raise ValueError(f"key model_sha256: missing (split.json schema {self.schema_} records the split model's "
                             "sha256)")
        if self.schema_ >= 2:
            for i, part in enumerate(self.parts):
                if part.sha256 is None:
                    raise ValueError(f"key parts.{i}.sha256: missing (split.json schema {self.schema_} records each "
                                     "part's sha256)")
        return self


def document(doc: dict) -> SplitFile:
    """split.json as `optkit split` writes it (schema 3, every sha256 set): exit 3 if a reader would refuse it."""
    return build(SplitFile, doc, FILE)
