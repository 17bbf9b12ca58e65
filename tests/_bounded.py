"""Helpers of the bounded-work tests (issue 39, class 1): a small image model of EfficientNet-Lite1's input size,
images whose header declares more pixels than their file holds, and the memory of a served model's processes."""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

SPEC = "{resize: 272, resample: bicubic, center_crop: 240, mean: 127, std: 128, scale: 1}"


def image_model(path: Path, side: int = 240, classes: int = 10) -> Path:
    """A float [batch,3,side,side] -> [batch,classes] CNN (strided conv, relu, global pool, gemm), seeded weights:
    the input EfficientNet-Lite1 takes, without ../shared."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.1, (8, 3, 8, 8)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.normal(0, 0.5, (classes, 8)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["input", "w"], ["conv"], strides=[8, 8]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
             helper.make_node("Flatten", ["pool"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "bounded", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                               ["batch", 3, side, side])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
                              [w, fc])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose header declares width x height RGB pixels and whose data is one empty compressed block: a few
    dozen bytes that a decoder would make width*height*3 bytes of."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b""))
                     + chunk(b"IEND", b""))
    return path


def png_solid(path: Path, width: int, height: int, rgb=(200, 30, 60)) -> Path:
    """A real PNG of width x height pixels of one colour, compressed row by row (a 12500x12000 one is 462 KB and
    is written without holding its 450 MB of pixels)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    z = zlib.compressobj(9)
    data = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


def group_memory(pgid: int) -> dict[int, tuple[int, int]]:
    """{pid: (VmRSS, VmHWM) in bytes} of the live processes of process group `pgid` (a server and the backend
    stubs it starts), from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            status = Path(f"/proc/{entry}/status").read_text().splitlines()
        except (OSError, ValueError, IndexError):
            continue
        kb = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in status if line.startswith(("VmRSS",
                                                                                                      "VmHWM"))}
        out[int(entry)] = (kb.get("VmRSS", 0), kb.get("VmHWM", 0))
    return out
