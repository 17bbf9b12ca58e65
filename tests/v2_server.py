"""A real KServe v2 server for tests/test_bench_url.py: NVIDIA PyTriton (Triton Inference Server with its Python
backend) serving an ONNX model through onnxruntime on the CPU, on 127.0.0.1 only.

    tools/triton/.venv/bin/python tests/v2_server.py MODEL.onnx

Models: `cnn` (MODEL.onnx, its first input and output; the batch dim is Triton's), `spare` (the same, for a test
to unload) and `broken` (every request fails, as a model that raises does). Prints `READY <http port> <token>`
(the triton-access-token header of the repository API: load, unload) once all are ready, and stops when its stdin closes (the test ends, or dies) or after 300 s whatever happens.

Runs in the Triton tool folder tools/triton/.venv (tools/triton/requirements.txt, made by .ci/run; the one the
package's Triton tests use): PyTriton's tritonclient needs protobuf < 7, which TensorFlow's pin rules out in
optkit's environment. Started by tests/test_bench_url.py with tests/_triton.py's env() (LD_LIBRARY_PATH).
Not a test module: pytest collects test_*.py only.
"""
from __future__ import annotations

import secrets
import socket
import sys
import threading

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

LIFETIME_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(model_path: str) -> None:
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    inp, out = sess.get_inputs()[0], sess.get_outputs()[0]

    @batch
    def infer(**inputs):
        return {out.name: sess.run([out.name], {inp.name: inputs[inp.name]})[0]}

    @batch
    def broken(**inputs):
        raise ValueError("this model always fails (a test of error responses)")

    def dims(shape):
        return tuple(d if isinstance(d, int) else -1 for d in shape[1:])

    tensors = {"inputs": [Tensor(name=inp.name, dtype=np.float32, shape=dims(inp.shape))],
               "outputs": [Tensor(name=out.name, dtype=np.float32, shape=dims(out.shape))]}
    port = free_port()
    config = TritonConfig(http_address="127.0.0.1", http_port=port, allow_grpc=False, allow_metrics=False,
                          exit_timeout_secs=1)
    token = secrets.token_urlsafe(16)  # Triton's model-repository API (load, unload) asks for it
    with Triton(config=config, security_config=TritonSecurityConfig(access_token=token)) as triton:
        for name, fn in (("cnn", infer), ("spare", infer), ("broken", broken)):
            triton.bind(model_name=name, infer_func=fn, config=ModelConfig(max_batch_size=64), **tensors)
        triton.run()
        print(f"READY {port} {token}", flush=True)
        done = threading.Event()
        threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
        done.wait(LIFETIME_S)


if __name__ == "__main__":
    main(sys.argv[1])
