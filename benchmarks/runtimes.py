"""(Not named openvino.py: the script's folder is first on sys.path, and would shadow the package.)
OpenVINO beside onnxruntime, in one run (issue 42): FP32 on each runtime, optkit's INT8 for each runtime, the
one-line onnxruntime calls and NNCF's, for EfficientNet-Lite1 and all-MiniLM-L6-v2 at 16 and 64 tokens.

    .venv/bin/python benchmarks/runtimes.py [--only cnn|encoder] [--nncf /work/bench-venvs/nncf/bin/python] [--work DIR]

Latency: every (file, runtime) timed against onnxruntime's FP32 call by call, interleaved, in one child process
(measure.paired with per-model runtimes: batch 1, one thread, 5 trials), the ratio with its 95% interval.
Accuracy: EfficientNet-Lite1 top-1 on 900 ImageNet views (9 crops of the 100 images of ../shared/realcases/
imagenet100, as benchmarks/quantize.py takes them; calibration on the 100 centre crops); MiniLM Spearman on the
STS-B test pairs (tests/data/sts-test.csv). NNCF runs in a venv of its own (not an optkit dependency): nncf.quantize
on the OpenVINO model, its one-line call (model_type TRANSFORMER for the encoder). The CPU's flags are printed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
REAL = ROOT.parent / "shared" / "realcases"
STS = ROOT / "tests" / "data" / "sts-test.csv"
COLUMNS = "text=5,text_pair=6,label=4"
BOTH = ("onnxruntime", "openvino")

NNCF_CNN = r'''
import sys
sys.modules["openvino_telemetry"] = None  # NNCF's and OpenVINO's usage reports off, as optkit does (core/telemetry.py)
import numpy as np, nncf, openvino as ov
model = ov.Core().read_model(sys.argv[1])
x = np.load(sys.argv[2])["inputs"]
q = nncf.quantize(model, nncf.Dataset([x[i:i + 1] for i in range(len(x))]), subset_size=len(x))
ov.save_model(q, sys.argv[3], compress_to_fp16=False)
'''
NNCF_TEXT = r'''
import sys
sys.modules["openvino_telemetry"] = None
import json, numpy as np, nncf, openvino as ov
model = ov.Core().read_model(sys.argv[1])
calls = [{k: np.array(v, dtype=np.int64) for k, v in c.items()} for c in json.load(open(sys.argv[2]))]
q = nncf.quantize(model, nncf.Dataset(calls), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calls))
ov.save_model(q, sys.argv[3], compress_to_fp16=False)
'''


def cpu() -> str:
    flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")), "?")
    have = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "avx_vnni") if f in flags.split()]
    return f"{name}, {' '.join(have)}"


def sh(*args, py=sys.executable) -> dict | None:
    r = subprocess.run([py, *map(str, args)], capture_output=True, text=True)
    if r.returncode:
        print(f"  failed ({' '.join(map(str, args[:4]))}...): {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        return None
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return {}


def optkit(*args) -> dict | None:
    return sh("-m", "optkit", *args, "--json")


def readable(rows: list[tuple[str, Path, str]]) -> list[tuple[str, Path, str]]:
    """The (label, file, runtime) rows whose runtime opens the file; the others are said and left out."""
    from optkit.core.artifact import Artifact
    from optkit.core.errors import OptkitError
    from optkit.measure.model import MeasureSettings

    kept = []
    for label, f, runtime in rows:
        try:
            MeasureSettings(threads=1, runtime=runtime).open(Artifact.load(f)).close()
            kept.append((label, f, runtime))
        except OptkitError as e:
            print(f"  {label} / {runtime}: {runtime} cannot run it ({str(e).splitlines()[0][:160]}); left out")
    return kept


def timed(parent: Path, rows: list[tuple[str, Path, str]], feeds: dict) -> dict:
    """Each (label, file, runtime) against onnxruntime's FP32 `parent`, call by call, in one process."""
    from optkit.core.artifact import Artifact
    from optkit.measure.model import MeasureSettings
    from optkit.measure.paired import paired_latencies

    res = paired_latencies(Artifact.load(parent), [Artifact.load(f) for _, f, _ in rows],
                           MeasureSettings(threads=1, warmup=10, runs=200), trials=5, data=feeds,
                           limit_s=20.0 * len(rows), race=False, runtimes=("onnxruntime", *(r for _, _, r in rows)))
    return {label: r for (label, _, _), r in zip(rows, res)}


def metric(model: Path, runtime: str, data: list[str]) -> float | None:
    r = optkit("eval", model, "--runtime", runtime, "--threads", "2", *data)
    if not r:
        return None
    acc = r["stages"][-1]["measurements"]["accuracy"]
    return acc[acc["metric"]]


def table(title: str, rows: list[tuple[str, Path, str]], times: dict, scores: dict, what: str) -> None:
    print(f"\n{title}")
    print(f"| file | runtime | latency vs onnxruntime FP32 (95% CI) | p50 ms | {what} |")
    print("|---|---|---|---|---|")
    for label, _, runtime in rows:
        t = times.get(label)
        lat = f"{t['ratio']:.3f}x ({t['ratio_ci95'][0]:.3f}-{t['ratio_ci95'][1]:.3f})" if t else "-"
        p50 = f"{t['after']['p50_ms']:.3f}" if t else "-"
        s = scores.get(label)
        print(f"| {label} | {runtime} | {lat} | {p50} | {'-' if s is None else f'{s:.4f}'} |")
    base = next(iter(times.values()), None)
    if base:
        print(f"(onnxruntime FP32 p50 {base['before']['p50_ms']:.3f} ms, batch 1, one thread)")


def cnn(tmp: Path, nncf_py: str | None) -> None:
    from _imagenet import imagenet100_views
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = REAL / "efficientnet_lite1.onnx"
    calib, ev = imagenet100_views(tmp)
    cx = np.load(calib)["inputs"]
    data = ["--data", str(ev), "--metric", "top1"]
    files: list[tuple[str, Path, str]] = [("FP32", model, "onnxruntime"), ("FP32", model, "openvino")]
    budget = ["--mode", "static", "--calibration-data", calib, "--eval-data", ev, "--metric", "top1",
              "--max-accuracy-drop", "0.01", "--allow-slower"]
    for runtime in BOTH:
        out = tmp / f"optkit_{runtime}.onnx"
        if out.exists() or optkit("quantize", model, "-o", out, *budget, "--runtime", runtime) is not None:
            files += [(f"optkit INT8 for {runtime}", out, r) for r in BOTH]

    class R(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"inputs": a[None]} for a in cx)

        def get_next(self):
            return next(self.it, None)

    pre = tmp / "pre.onnx"
    quant_pre_process(str(model), str(pre))
    u8 = QuantType.QUInt8
    for label, kw in {"onnxruntime quantize_static()": {},
                      "onnxruntime quantize_static(QDQ, u8, per_channel)": {"per_channel": True, "activation_type": u8},
                      "onnxruntime quantize_static(QOperator, u8, per_channel)": {
                          "per_channel": True, "activation_type": u8, "quant_format": QuantFormat.QOperator}}.items():
        out = tmp / f"ort_{len(files)}.onnx"
        if not out.exists():
            quantize_static(str(pre), str(out), R(), **kw)
        files += [(label, out, r) for r in BOTH]
    if nncf_py:
        out = tmp / "nncf.xml"
        script = tmp / "nncf_cnn.py"
        script.write_text(NNCF_CNN)
        if out.exists() or sh(script, model, calib, out, py=nncf_py) is not None:
            files.append(("NNCF nncf.quantize()", out, "openvino"))
    files = readable(files)
    feeds = {"inputs": np.load(ev)["inputs"][:1]}
    children = [(f"{label} / {runtime}", f, runtime) for label, f, runtime in files[1:]]
    times = timed(model, children, feeds)
    scores = {f"{label} / {runtime}": metric(f, runtime, data) for label, f, runtime in files}
    times = {f"{files[0][0]} / onnxruntime": {"ratio": 1.0, "ratio_ci95": [1.0, 1.0],
                                             "after": next(iter(times.values()))["before"],
                                             "before": next(iter(times.values()))["before"]}, **times}
    rows = [(f"{label} / {runtime}", f, runtime) for label, f, runtime in files]
    table("EfficientNet-Lite1 (900 ImageNet views; top-1)", rows, times, scores, "top-1")


def encoder(tmp: Path, nncf_py: str | None) -> None:
    from _hf_models import minilm
    from onnxruntime.quantization import quantize_dynamic
    from transformers import AutoTokenizer

    folder = minilm()
    model = tmp / "minilm.onnx"
    if not model.exists() and optkit("convert", folder, "-o", model) is None:
        return
    tok = AutoTokenizer.from_pretrained(tmp / "minilm.preprocessor")
    rows = [r.split("\t") for r in STS.read_text(encoding="utf-8").splitlines()]
    data = ["--data", str(STS), "--metric", "spearman", "--columns", COLUMNS]
    files: list[tuple[str, Path, str]] = [("FP32", model, "onnxruntime"), ("FP32", model, "openvino")]
    out = tmp / "optkit_ort.onnx"
    if out.exists() or optkit("quantize", model, "-o", out, "--mode", "dynamic", "--eval-data", STS, "--columns", COLUMNS,
              "--metric", "spearman", "--max-accuracy-drop", "0.005", "--allow-slower") is not None:
        files += [("optkit INT8 for onnxruntime (dynamic)", out, r) for r in BOTH]
    out = tmp / "optkit_ov.onnx"
    if out.exists() or optkit("quantize", model, "-o", out, "--mode", "static", "--runtime", "openvino", "--calibration-data", STS,
              "--calibration-size", "128", "--eval-data", STS, "--columns", COLUMNS, "--metric", "spearman",
              "--max-accuracy-drop", "0.005", "--allow-slower") is not None:
        files += [("optkit INT8 for openvino (static)", out, r) for r in BOTH]
    out = tmp / "ort_dynamic.onnx"
    try:
        quantize_dynamic(str(model), str(out), per_channel=True)
        files += [("onnxruntime quantize_dynamic(per_channel=True)", out, r) for r in BOTH]
        import onnxruntime as ort
        ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - the default op types turn this export's Attention into QAttention
        print(f"  quantize_dynamic(per_channel=True) with its default op types: {str(e).splitlines()[0][:120]}; "
              "op_types_to_quantize=['MatMul'] instead")
        files = [f for f in files if f[1] != out]
        quantize_dynamic(str(model), str(out), per_channel=True, op_types_to_quantize=["MatMul"])
        files += [("onnxruntime quantize_dynamic(per_channel=True, MatMul)", out, r) for r in BOTH]
    if nncf_py:
        calls = [{k: v.tolist() for k, v in tok(r[5], r[6], truncation=True, max_length=128,
                                                 return_tensors="np").items()} for r in rows[:128]]
        (tmp / "calls.json").write_text(json.dumps(calls))
        script = tmp / "nncf_text.py"
        script.write_text(NNCF_TEXT)
        out = tmp / "nncf_minilm.xml"
        if out.exists() or sh(script, model, tmp / "calls.json", out, py=nncf_py) is not None:
            files.append(("NNCF nncf.quantize(TRANSFORMER)", out, "openvino"))
    files = readable(files)
    scores = {f"{label} / {runtime}": metric(f, runtime, data) for label, f, runtime in files}
    for length in (16, 64):
        t = tok([rows[0][5]], padding="max_length", truncation=True, max_length=length, return_tensors="np")
        feeds = {k: t[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
        children = [(f"{label} / {runtime}", f, runtime) for label, f, runtime in files[1:]]
        times = timed(model, children, feeds)
        first = next(iter(times.values()))["before"]
        times = {"FP32 / onnxruntime": {"ratio": 1.0, "ratio_ci95": [1.0, 1.0], "after": first, "before": first},
                 **times}
        table(f"all-MiniLM-L6-v2, {length} tokens (STS-B test Spearman)",
              [(f"{label} / {runtime}", f, runtime) for label, f, runtime in files], times, scores, "Spearman")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["cnn", "encoder"])
    ap.add_argument("--nncf", default="/work/bench-venvs/nncf/bin/python")
    ap.add_argument("--work", type=Path, help="a folder that keeps the files between runs (a file there is reused)")
    args = ap.parse_args()
    nncf_py = args.nncf if Path(args.nncf).exists() else None
    print(f"CPU: {cpu()}; NNCF: {nncf_py or 'not installed (rows left out)'}")
    with tempfile.TemporaryDirectory(prefix="optkit-bench-ov-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.only in (None, "cnn"):
            cnn(work, nncf_py)
        if args.only in (None, "encoder"):
            encoder(work, nncf_py)


if __name__ == "__main__":
    main()
