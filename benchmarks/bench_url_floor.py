"""The floor of `optkit bench --url`: its own cost per request, against a v2 server that answers at once.

A canned KServe v2 server (asyncio, one process, the sample CNN's metadata, a fixed 10-float answer) runs beside
`optkit bench --url` at 1, 2 and 4 requests in flight. What it prints is what the client and the loopback cost
on this machine: a served model whose p50 sits near it, or whose throughput nears it, is measuring the client.
Run: python benchmarks/bench_url_floor.py [--duration 3] [--concurrency 1 2 4]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

META = json.dumps({"name": "m", "versions": ["1"], "platform": "canned",
                   "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}],
                   "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]}).encode()
INFER = json.dumps({"model_name": "m", "outputs": [{"name": "logits", "datatype": "FP32", "shape": [1, 10],
                                                    "data": [0.5] * 10}]}).encode()


def _answer(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while line := await reader.readline():
            path = line.decode().split(" ")[1]
            length = 0
            while (header := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            body = (INFER if path.endswith("/infer") else b"" if path.endswith("/ready")
                    else b'{"name":"canned","version":"0","extensions":[]}' if path == "/v2" else META)
            writer.write(_answer(body))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    writer.close()


def serve(port: int) -> None:
    async def main() -> None:
        async with await asyncio.start_server(_handle, "127.0.0.1", port):
            await asyncio.sleep(3600)
    asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        for _ in range(50):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.1)
        print(f"{'in flight':>9} {'p50 ms':>8} {'p99 ms':>8} {'requests/s':>11}   (one at a time: p50, requests/s)")
        for n in args.concurrency:
            out = subprocess.run([sys.executable, "-m", "optkit", "bench", "--url", f"http://127.0.0.1:{port}/v2/models/m",
                                  "--concurrency", str(n), "--duration", str(args.duration), "--json"],
                                 capture_output=True, text=True, cwd=ROOT, check=True).stdout
            m = json.loads(out)["stages"][0]["measurements"]
            load, lat = m["concurrency"], m["latency"]
            print(f"{n:>9} {load['p50_ms']:>8.3f} {load['p99_ms']:>8.3f} {load['throughput_per_s']:>11,.0f}   "
                  f"({lat['p50_ms']:.3f} ms, {lat['throughput_per_s']:,.0f}/s)")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
