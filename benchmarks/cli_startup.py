"""How long `optkit --help` and each command's --help take (target: median under 0.4 s), and that no framework loads.

Run: python benchmarks/cli_startup.py [--runs 10]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

FRAMEWORKS = {"torch", "tensorflow", "tf2onnx", "onnxsim", "onnxslim", "tf_keras", "tensorrt"}


def time_command(args: list[str], runs: int) -> tuple[float, set[str]]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "optkit", *args], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "optkit", *args], capture_output=True, text=True)
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    return statistics.median(times), loaded & FRAMEWORKS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    from optkit.cli.main import COMMANDS

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    bare = time.perf_counter() - t0
    print(f"{'command':<24}{'median s':>10}  frameworks imported   (bare python: {bare:.3f} s)")
    worst = 0.0
    for args in [["--help"], *[[c, "--help"] for c in COMMANDS]]:
        try:
            median, loaded = time_command(args, runs)
        except subprocess.CalledProcessError:
            continue  # command not present in this build
        worst = max(worst, median)
        print(f"{' '.join(args):<24}{median:>10.3f}  {', '.join(sorted(loaded)) or 'none'}")
    print(f"slowest median {worst:.3f} s; target < 0.400 s: {'met' if worst < 0.4 else 'MISSED'}")


if __name__ == "__main__":
    main()
