"""The wall time a user (or a CI) waits for a quantize search and the quickstart, cold and warm (issue 42 item 5):

    .venv/bin/python benchmarks/search_wall.py                         # this checkout
    .venv/bin/python benchmarks/search_wall.py --checkout /other/tree  # another (e.g. main) with the same venv

Each command runs as `python -m optkit -v ...` in a fresh folder with a fresh per-user cache (cold: the int8
kernel table is measured), then again with that cache (warm); the wall time is the process's, and the phase-time
line `-v` ends with is printed beside it. Models: the PP-OCRv4 recognizer from the rapidocr wheel (dynamic, no
data), EfficientNet-Lite1 static on ../shared/realcases/imagenet100 (its 100 images calibrate; 9 crops of each,
900 views of the same images, evaluate: for timing, not for accuracy claims; tests/_imagenet.py), and
recipes/quickstart.yaml; the two quantize commands also with `--threads 1`, where the search's race (batch 1, one
thread) is the stage's timing. Run it alone on the machine: the figures are wall times.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
REAL = HERE.parent / "shared" / "realcases"


def ocr_model() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("rapidocr_onnxruntime is not installed (pip install rapidocr_onnxruntime)")
    return Path(spec.submodule_search_locations[0]) / "models" / "ch_PP-OCRv4_rec_infer.onnx"


def run(checkout: Path, args: list[str], cache: Path, cwd: Path) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "OPTKIT_CACHE_DIR": str(cache), "COLUMNS": "100"}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "optkit", "-v", *args], capture_output=True, text=True, cwd=cwd,
                       env=env)
    wall = time.perf_counter() - t0
    phases = [line.split("phase times: ", 1)[1] for line in r.stderr.splitlines() if "phase times: " in line]
    search = [line.split("quantize search: ", 1)[1] for line in r.stderr.splitlines() if "quantize search: " in line]
    said = phases[0] if phases else (search[0] if search else (r.stderr.strip().splitlines() or ["?"])[-1][:160])
    return wall, r.returncode, said


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkout", type=Path, default=HERE)
    ap.add_argument("--only", choices=("ocr", "lite1", "ocr-threads1", "lite1-threads1", "quickstart"))
    a = ap.parse_args()
    sys.path.insert(0, str(HERE / "tests"))
    from _imagenet import imagenet100_views

    work = Path(tempfile.mkdtemp(prefix="optkit-search-wall-"))
    calib, ev = imagenet100_views(work)
    ocr = ["quantize", str(ocr_model()), "-o", "q.onnx", "--mode", "dynamic"]
    lite1 = ["quantize", str(REAL / "efficientnet_lite1.onnx"), "-o", "q.onnx", "--calibration-data", str(calib),
             "--eval-data", str(ev), "--metric", "top1", "--max-accuracy-drop", "0.01"]
    cases = {"ocr": ocr, "lite1": lite1, "ocr-threads1": [*ocr, "--threads", "1"],
             "lite1-threads1": [*lite1, "--threads", "1"],
             "quickstart": ["run", str(a.checkout / "recipes" / "quickstart.yaml"), "--workspace", "runs"]}
    print(f"checkout {a.checkout}; {os.cpu_count()} CPUs")
    for name, args in cases.items():
        if a.only and name != a.only:
            continue
        cache = Path(tempfile.mkdtemp(prefix="cache-", dir=work))
        for state in ("cold", "warm"):
            cwd = Path(tempfile.mkdtemp(prefix=f"{name}-{state}-", dir=work))
            wall, rc, said = run(a.checkout, args, cache, cwd)
            print(f"{name:10s} {state}: {wall:5.1f} s wall, exit {rc}; {said}", flush=True)


if __name__ == "__main__":
    main()
