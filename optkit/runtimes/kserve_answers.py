"""What a KServe v2 server may answer, as schemas (pydantic, strict types): its server and model metadata and
an inference response, and an output's JSON data read as its datatype. Everything a server says is input: an
answer that does not fit is one UsageError line naming the key."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from optkit.core.errors import UsageError
from optkit.core.shapes import TensorSpec
from optkit.core.text import printable
from optkit.runtimes.kserve_http import said

MAX_JSON_VALUES = 1 << 24   # input values sent as JSON text (binary tensors carry up to MAX_ELEMENTS)
MAX_RANK = 64               # numpy's

# KServe v2 datatypes -> numpy dtype names (BYTES: strings, fed as object arrays like onnxruntime's)
V2_DTYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64", "BYTES": "string"}
NUMPY_TO_V2 = {v: k for k, v in V2_DTYPES.items()} | {"object": "BYTES", "str": "BYTES"}



# ---------------------------------------------------------------------- what a v2 server may answer
V2Type = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
                 "FP64", "BYTES", "BF16"]
Name = Annotated[str, Field(min_length=1, max_length=1024)]


class _Answer(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class TensorMetadata(_Answer):
    name: Name
    datatype: V2Type
    shape: Annotated[list[Annotated[int, Field(ge=-1)]], Field(max_length=MAX_RANK)]


class ModelMetadata(_Answer):
    """v2 model metadata: GET /v2/models/NAME[/versions/V]."""
    name: Name
    inputs: Annotated[list[TensorMetadata], Field(max_length=4096)]
    outputs: Annotated[list[TensorMetadata], Field(max_length=4096)]


class ServerMetadata(_Answer):
    """v2 server metadata: GET /v2."""
    name: Optional[str] = None
    version: Optional[str] = None
    extensions: list[str] = []


class _Parameters(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    binary_data_size: Optional[Annotated[int, Field(ge=0)]] = None


class OutputTensor(_Answer):
    name: Name
    datatype: V2Type
    shape: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_RANK)]
    data: Optional[list] = None
    parameters: Optional[_Parameters] = None


class InferResponse(_Answer):
    """a v2 inference response: POST /v2/models/NAME/infer (its JSON part)."""
    model_name: Name
    model_version: Optional[str] = None
    outputs: list[OutputTensor]


def parse(schema: type[_Answer], body: bytes, where: str):
    """`body` read as `schema`; anything else is one UsageError line naming `where` and the key."""
    try:
        return schema.model_validate_json(body)   # JSON NaN and Infinity read as floats, as json.loads reads them
    except ValidationError as e:
        err = e.errors()[0]
        what = f"{where} is not {schema.__doc__.split(':')[0]}"
        if not err["loc"]:   # not JSON, or not an object
            if "recursion limit" in str(err.get("msg", "")):
                raise UsageError(f"{what} (a JSON object): it nests lists or objects deeper than any v2 answer "
                                 "(the JSON parser's recursion limit)") from None
            raise UsageError(f"{what} (a JSON object){said(body)}") from None
        key = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"{what}: {printable(key)[:120]}: {err['msg']}") from None


def tensor_spec(t: TensorMetadata) -> TensorSpec:
    shape = [d if d > 0 else None for d in t.shape]
    return TensorSpec(t.name, shape, V2_DTYPES.get(t.datatype, t.datatype))


# JSON data of each datatype: the kinds of numpy array it may read as (np.array of the data, unconverted)
_KINDS = {"BOOL": "b", "BYTES": "U", "FP16": "fiu", "FP32": "fiu", "FP64": "fiu", "BF16": "fiu"}


def json_values(t: OutputTensor, where: str) -> np.ndarray:
    """An output's JSON data (flat, or nested row-major lists) as an array of its datatype; data that is not of
    that type (strings, null, objects for a number; ragged lists; a number out of an integer type's range) is a
    UsageError naming the key."""
    if t.data is None:
        raise UsageError(f"{where}: missing (no data and no binary_data_size); it is not a KServe v2 answer")
    try:
        arr = np.array(t.data)
    except (ValueError, RecursionError):
        raise UsageError(f"{where}: ragged lists; it is not a KServe v2 answer") from None
    kinds = _KINDS.get(t.datatype, "iu")
    ok = arr.size == 0 or arr.dtype.kind in kinds
    if ok and arr.size and t.datatype in V2_DTYPES and kinds == "iu":
        info = np.iinfo(V2_DTYPES[t.datatype])
        ok = info.min <= arr.min() and arr.max() <= info.max
    if not ok:
        raise UsageError(f"{where}: not {t.datatype} values (read as {arr.dtype}); it is not a KServe v2 answer")
    if t.datatype == "BYTES":
        return arr.astype(object).ravel()
    return arr.astype(V2_DTYPES.get(t.datatype, "float32")).ravel()
