"""Quantization side by side: the naive onnxruntime call vs optkit, in one run.

    .venv/bin/python benchmarks/quantize.py                     # every section, in one run (~30 min on 2 cores)
    .venv/bin/python benchmarks/quantize.py --only encoders      # MiniLM- and BERT-base-sized encoders, dynamic
    .venv/bin/python benchmarks/quantize.py --only efficientnet  # EfficientNet-Lite1 static (25/75 and 100/900) and
                                                                 # dynamic
    .venv/bin/python benchmarks/quantize.py --only transformer   # one section (mnist, cnn, transformer)

Prints size ratio, accuracy drop (or cosine) and latency ratio at batch 1 and 32 (p50 vs the FP32 parent, one
thread, best of 3 interleaved optkit.measure calls: the machine may be shared) for each. optkit runs with
--allow-slower so a slower result is still shown (the CLI exits 3 on it by default). mnist.onnx fixes batch 1.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from optkit.measure.latency import bands

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
REAL = ROOT.parent / "shared" / "realcases"


def figures(model: Path, parent: Path, data: str | None, metric: str | None):
    from optkit.core.artifact import Artifact
    from optkit.measure.model import DataSpec, MeasureSettings, measure

    spec = DataSpec(path=data) if data else None
    s = MeasureSettings(warmup=20, runs=200, threads=1)
    p = measure(Artifact.load(parent), s, data=spec, metric=metric)
    q = measure(Artifact.load(model), s, data=spec, metric=metric, reference=Artifact.load(parent))
    row = {"size": q["size"]["bytes"] / p["size"]["bytes"], "cosine": q["fidelity"]["cosine"],
           "agreement": q["fidelity"].get("top1_agreement")}
    for batch in (1, 32):  # interleaved rounds, best p50 each (the machine is shared)
        bs = MeasureSettings(warmup=10, runs=100 if batch == 1 else 20, threads=1, batch=batch)
        try:
            tp, tq = [], []
            for _ in range(3):
                tp.append(measure(Artifact.load(parent), bs)["latency"]["p50_ms"])
                tq.append(measure(Artifact.load(model), bs)["latency"]["p50_ms"])
            row[f"lat{batch}"] = min(tq) / min(tp)
        except Exception:  # a fixed-batch-1 model (mnist.onnx) cannot run batch 32
            row[f"lat{batch}"] = None
    if metric:
        row["drop_pt"] = 100 * (p["accuracy"][metric] - q["accuracy"][metric])
    return row


def optkit(*args) -> None:
    r = subprocess.run([sys.executable, "-m", "optkit", "quantize", *map(str, args), "--json"],
                       capture_output=True, text=True)
    if r.returncode:
        print(f"  optkit failed: {r.stderr.strip().splitlines()[-1]}")


def efficientnet(tmp: Path) -> None:
    """Static INT8 of a real ImageNet model: onnxruntime's own single calls beside optkit's search, in one run
    (top-1 on the 75 evaluation images: one image is 1.33 points, so agreement with FP32 and cosine are shown
    too); then the search's phases and every candidate it built, and the techniques of the slower tier."""
    import time

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = REAL / "efficientnet_lite1.onnx"
    from _imagenet import imagenet100_split

    calib, ev = imagenet100_split(tmp)
    cx = np.load(calib)["inputs"]
    print("EfficientNet-Lite1 (efficientnet_lite1.onnx; 25 ImageNet images calibrate, 75 others evaluate)")

    class R(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"inputs": a[None]} for a in cx)

        def get_next(self):
            return next(self.it, None)

    pre = tmp / "pre.onnx"
    quant_pre_process(str(model), str(pre))
    u8 = QuantType.QUInt8
    calls = {"onnxruntime default quantize_static": {},
             "onnxruntime QDQ u8 per-channel": {"per_channel": True, "activation_type": u8},
             "onnxruntime QOp u8 per-channel": {"per_channel": True, "activation_type": u8,
                                                 "quant_format": QuantFormat.QOperator},
             "onnxruntime QDQ u8 per-channel reduce_range": {"per_channel": True, "activation_type": u8,
                                                             "reduce_range": True}}
    for label, kw in calls.items():
        out = tmp / f"ort_{len(kw)}_{kw.get('reduce_range', 0)}_{'quant_format' in kw}.onnx"
        t0 = time.perf_counter()
        quantize_static(str(pre), str(out), R(), **kw)
        took = time.perf_counter() - t0
        show(f"{label} ({took:.0f} s)", figures(out, model, str(ev), "top1"))
    # 75 images cannot bound a 0.3-point drop at the default 95% confidence: the measured drop is judged here
    runs = {"optkit --max-accuracy-drop 0.003": ["--max-accuracy-drop", "0.003", "--budget-confidence", "0.5"],
            "optkit --max-fidelity-loss 0.003": ["--max-fidelity-loss", "0.003"]}
    for label, budget in runs.items():
        search(label, model, calib, ev, budget, tmp)
    from _imagenet import imagenet100_views

    print("  the search's cost at scale: 100 calibration images, 900 evaluation views (9 crops of each image)")
    search("optkit --max-accuracy-drop 0.01", model, *imagenet100_views(tmp), ["--max-accuracy-drop", "0.01"], tmp,
           table=False)
    print("  dynamic INT8 (no calibration): onnxruntime's one-line call beside optkit's search")
    from onnxruntime.quantization import quantize_dynamic

    out = tmp / "ort_dynamic.onnx"
    t0 = time.perf_counter()
    quantize_dynamic(str(pre), str(out), per_channel=True)
    show(f"onnxruntime quantize_dynamic(pc) ({time.perf_counter() - t0:.0f} s)", figures(out, model, str(ev), "top1"))
    search("optkit --mode dynamic", model, calib, ev, ["--mode", "dynamic"], tmp, table=False)


def search(label: str, model: Path, calib: Path, ev: Path, budget: list[str], tmp: Path, table: bool = True) -> None:
    """One optkit quantize run: its figures beside onnxruntime's, its phases, and (table) every candidate."""
    import json
    import time

    out = tmp / f"optkit_{budget[0][2:]}_{ev.stem}.onnx"
    t0 = time.perf_counter()
    data = ["--eval-data", str(ev)] if "dynamic" in budget else ["--calibration-data", str(calib), "--eval-data", str(ev)]
    r = subprocess.run([sys.executable, "-m", "optkit", "quantize", str(model), "-o", str(out), *data, "--metric",
                        "top1", *budget, "--allow-slower", "--json"],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode:
        print(f"  {label}: failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        return
    show(f"{label} ({wall:.0f} s)", figures(out, model, str(ev), "top1"))
    stage = json.loads(r.stdout)["stages"][1]
    q = stage["measurements"]["quantize"]
    print(f"    pass {stage['duration_s']:.1f} s: " + ", ".join(f"{k} {v:.1f} s" for k, v in q["phases_s"].items())
          + f"; {len(q['candidates'])} candidates")
    for c in q["candidates"] if table else []:
        f = c.get("fidelity") or {}
        lat = f"{c['latency_ratio']:.2f}x" if c.get("latency_ratio") else "-"
        print(f"      {'*' if c['chosen'] else ' '} {c['variant']:<24} float nodes {len(c['float_nodes']):>2}  "
              f"top-1 {c.get('accuracy', float('nan')):.3f}  agreement {f.get('top1_agreement', float('nan')):.3f}  "
              f"cosine {f.get('cosine', float('nan')):.4f}  latency {lat}"
              + ("  screened out" if c.get("screened_out") else "") + (f"  {c['error'][:60]}" if c.get("error") else ""))


def show(name, row):
    extra = f"top1 drop {row['drop_pt']:+.2f} pt" if "drop_pt" in row else ""
    if row.get("agreement") is not None:
        extra += f"  agreement {row['agreement']:.3f}"
    lat = "  ".join(f"lat b{b} " + (f"{row[f'lat{b}']:.2f}x" if row.get(f"lat{b}") else "n/a  ") for b in (1, 32))
    print(f"  {name:<34} size {row['size']:.3f}x  {lat}  cosine {row['cosine']:.5f}  {extra}")


def encoders(tmp: Path, sizes=("minilm", "bert-base")) -> None:
    """Dynamic INT8 of two BERT-style sentence encoders (tests/_encoders.py: a transformers config, seeded weights,
    a 30,522-token table; real sentence pairs): onnxruntime's one-line calls beside optkit, in one run. Size vs
    FP32, p50 latency at batch 1 on one thread at sequence 16 and 128 (interleaved rounds, plain onnxruntime on
    the written files), cosine to FP32 over every pair (padding masked, optkit.measure's figure), wall time."""
    import time

    import onnx
    from _encoders import encoder, pairs
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    cache = Path(tempfile.gettempdir()) / "optkit-bench-cache"
    data = {seq: tmp / f"pairs{seq}.npz" for seq in (16, 128)}
    for seq, path in data.items():
        np.savez(path, **pairs(seq))
    for size in sizes:
        model = encoder(size, cache)
        print(f"{size} encoder ({model.stat().st_size / 1e6:.0f} MB FP32; {len(np.load(data[16])['input_ids'])} "
              "sentence pairs)")
        rows: dict[str, tuple[Path | None, float, str]] = {}

        def ort(label, fn, out):
            t0 = time.perf_counter()
            try:
                fn(out)
                rows[label] = (out, time.perf_counter() - t0, "")
            except Exception as e:  # noqa: BLE001 - the one-line call may fail on this graph: say so
                rows[label] = (None, time.perf_counter() - t0, str(e).strip().splitlines()[-1][:110])

        ort("quantize_dynamic(per_channel=True)", lambda o: quantize_dynamic(str(model), str(o), per_channel=True),
            tmp / f"{size}_ort.onnx")

        def pre_then_quantize(o):
            pre = tmp / f"{size}_pre.onnx"
            quant_pre_process(str(model), str(pre), skip_symbolic_shape=True)
            quantize_dynamic(str(pre), str(o), per_channel=True,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})

        ort("quant_pre_process + quantize_dynamic(pc)", pre_then_quantize, tmp / f"{size}_ort_pre.onnx")
        for label, extra in (("optkit before (tables float, unfused)", ["--exclude-op", "Gather", "--no-fusion"]),
                             ("optkit quantize --mode dynamic", [])):
            out = tmp / f"{size}_optkit_{len(extra)}.onnx"
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "optkit", "quantize", str(model), "-o", str(out), "--mode",
                                "dynamic", "--eval-data", str(data[16]), "--allow-slower", "--json", *extra],
                               capture_output=True, text=True)
            took = time.perf_counter() - t0
            why = "" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1][:110]
            rows[label] = (out if not why else None, took, why)
            if not why:
                import json

                q = json.loads(r.stdout)["stages"][-1]["measurements"]["quantize"]
                chosen = next(c["variant"] for c in q["candidates"] if c["chosen"])
                rows[label] = (out, took, f"chose {chosen}; {len(q['candidates'])} candidates, " + ", ".join(
                    f"{k} {v:.0f} s" for k, v in q["phases_s"].items()))
        encoder_table(model, rows, data)


def encoder_table(model: Path, rows: dict, data: dict) -> None:
    """One interleaved timing run of FP32 and every file written, at each sequence length; then one line each."""
    import time

    import onnxruntime as rt

    from optkit.core.artifact import Artifact
    from optkit.measure.model import DataSpec, MeasureSettings, measure

    files = {"FP32": model, **{k: v[0] for k, v in rows.items() if v[0] is not None}}
    opts = rt.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sessions = {k: rt.InferenceSession(str(f), opts, providers=["CPUExecutionProvider"]) for k, f in files.items()}
    lat: dict[tuple[str, int], float] = {}
    for seq, path in data.items():
        feeds = {k: v[:1] for k, v in np.load(path).items()}
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for sess in sessions.values():
            for _ in range(5):
                sess.run(None, feeds)
        for _ in range(150 if seq == 16 else 40):
            for k, sess in sessions.items():
                t0 = time.perf_counter()
                sess.run(None, feeds)
                times[k].append(time.perf_counter() - t0)
        for k in sessions:   # each round's ratio to the FP32 call beside it: its median and 95% band
            r = np.asarray(times[k]) / np.asarray(times["FP32"])
            lat[(k, seq)] = (float(np.median(r)), *bands(r)["p50_ms"])
            lat[("p50", seq)] = float(np.median(times["FP32"]))
    settings = MeasureSettings(threads=1)
    for label, (out, took, why) in rows.items():
        if out is None:
            print(f"  {label:<40} FAILED ({took:.1f} s): {why}")
            continue
        cos = measure(Artifact.load(out), settings, latency=False, data=DataSpec(path=str(data[16])),
                      reference=Artifact.load(model))["fidelity"]["cosine"]
        ratios = "  ".join(f"lat s{seq} {lat[(label, seq)][0]:.2f}x ({lat[(label, seq)][1]:.2f}-{lat[(label, seq)][2]:.2f})"
                           for seq in data)
        print(f"  {label:<40} size {out.stat().st_size / model.stat().st_size:.3f}x  {ratios}  cosine {cos:.4f}  "
              f"({took:.1f} s{'; ' + why if why else ''})")
    print("  FP32 p50: " + ", ".join(f"s{seq} {lat[('p50', seq)] * 1e3:.2f} ms" for seq in data)
          + "; latency: the median of each round's ratio to the FP32 call beside it (95% band)")


TR = {"vocab": 64, "d_model": 256, "layers": 4, "heads": 4, "seq": 32, "steps": 60, "batch": 16, "lr": 1e-3}


def trained_transformer(cache: Path) -> tuple[Path, float]:
    """A token-classification transformer encoder (embedding, learned positions, 4 post-norm layers, linear
    head) trained briefly on CPU (seeded, fixed step count) to copy integer sequences, so its embedding,
    attention and MLP weights have moved off their init. Exported with the legacy exporter at opset 17 (no
    ONNX Attention op). Cached under `cache`; returns (path, token accuracy on a held-out batch)."""
    import json

    out, meta = cache / "tr_trained.onnx", cache / "tr_trained.json"
    key = json.dumps(TR, sort_keys=True)
    if out.exists() and meta.exists() and json.loads(meta.read_text()).get("key") == key:
        return out, json.loads(meta.read_text())["accuracy"]
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(2)
    v, d, s = TR["vocab"], TR["d_model"], TR["seq"]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(v, d)
            self.pos = nn.Parameter(torch.randn(1, s, d) * 0.02)
            layer = nn.TransformerEncoderLayer(d, TR["heads"], 4 * d, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, TR["layers"], enable_nested_tensor=False)
            self.head = nn.Linear(d, v)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens) + self.pos))

    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=TR["lr"])
    g = torch.Generator().manual_seed(0)
    for _ in range(TR["steps"]):
        x = torch.randint(0, v, (TR["batch"], s), generator=g)
        loss = nn.functional.cross_entropy(net(x).reshape(-1, v), x.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        x = torch.randint(0, v, (64, s), generator=g)
        acc = float((net(x).argmax(-1) == x).float().mean())
        torch.backends.mha.set_fastpath_enabled(False)  # the fused fast path does not export
        cache.mkdir(parents=True, exist_ok=True)
        torch.onnx.export(net, (x[:2],), str(out), input_names=["tokens"], output_names=["logits"],
                          dynamic_axes={"tokens": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
                          dynamo=False)
    meta.write_text(json.dumps({"key": key, "accuracy": acc}))
    return out, acc


def main() -> None:
    import argparse

    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import CalibrationDataReader, quantize_dynamic, quantize_static

    from optkit.measure.datasets import load_dataset

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("encoders", "efficientnet", "mnist", "cnn", "transformer"),
                    help="run one section")
    only = ap.parse_args().only
    tmp = Path(tempfile.mkdtemp(prefix="optkit-bench-"))
    if only in (None, "encoders"):
        encoders(tmp)
    if only in (None, "efficientnet"):
        if (REAL / "efficientnet_lite1.onnx").exists():
            efficientnet(tmp)
        else:
            print(f"EfficientNet-Lite1: no {REAL / 'efficientnet_lite1.onnx'} here, skipped")
    if (REAL / "mnist.onnx").exists() and only in (None, "mnist"):
        images = str(REAL / "t10k-images-idx3-ubyte.gz")
        print("MNIST (mnist.onnx, 10k test images; calibration 256 images)")
        x = load_dataset(images).subset(256, 0).arrays[""].reshape(-1, 1, 1, 28, 28)

        class R(CalibrationDataReader):
            def __init__(self):
                self.it = iter({"Input3": a} for a in x)

            def get_next(self):
                return next(self.it, None)

        m13 = tmp / "mnist13.onnx"  # the naive call needs opset >= 10 too; give it the same upgrade
        m = version_converter.convert_version(onnx.load(REAL / "mnist.onnx"), 13)
        onnx.save(m, m13)
        naive = tmp / "naive.onnx"
        quantize_static(str(m13), str(naive), R())
        show("naive quantize_static", figures(naive, REAL / "mnist.onnx", images, "top1"))
        for label, extra in (("optkit static (latency search)", []), ("optkit static --format qoperator",
                                                                    ["--format", "qoperator"])):
            out = tmp / f"ok_{len(extra)}.onnx"
            optkit(REAL / "mnist.onnx", "-o", out, "--calibration-data", images, "--eval-data", images,
                   "--max-samples", "500", "--allow-slower", *extra)
            if out.exists():
                show(label, figures(out, REAL / "mnist.onnx", images, "top1"))

    samples = ROOT / "sample_models"
    if (samples / "torch_cnn.onnx").exists() and only in (None, "cnn"):
        print("sample CNN (torch_cnn.onnx, digits eval set)")
        ev, cal = str(samples / "digits_eval_nchw.npz"), samples / "digits_calib_nchw.npz"
        xs = np.load(cal)["input"]

        class S(CalibrationDataReader):
            def __init__(self):
                self.it = iter({"input": xs[i:i + 1]} for i in range(len(xs)))

            def get_next(self):
                return next(self.it, None)

        naive = tmp / "cnn_naive.onnx"
        quantize_static(str(samples / "torch_cnn.onnx"), str(naive), S())
        show("naive quantize_static", figures(naive, samples / "torch_cnn.onnx", ev, "top1"))
        out = tmp / "cnn_ok.onnx"
        optkit(samples / "torch_cnn.onnx", "-o", out, "--calibration-data", cal, "--eval-data", ev, "--allow-slower")
        show("optkit static", figures(out, samples / "torch_cnn.onnx", ev, "top1"))

    if only not in (None, "transformer"):
        return
    cache = Path(tempfile.gettempdir()) / "optkit-bench-cache"
    tr, acc = trained_transformer(cache)
    print(f"transformer encoder (vocab {TR['vocab']}, d_model {TR['d_model']}, {TR['layers']} layers, seq "
          f"{TR['seq']}; trained {TR['steps']} steps to copy tokens, held-out token accuracy {acc:.3f})")
    np.savez(tmp / "tr.npz", tokens=np.random.default_rng(0).integers(0, TR["vocab"], (64, TR["seq"])))
    naive = tmp / "tr_naive.onnx"
    quantize_dynamic(str(tr), str(naive))
    show("naive quantize_dynamic", figures(naive, tr, str(tmp / "tr.npz"), None))
    for label, mode, extra in (("optkit dynamic", "dynamic", []), ("optkit int4 (block 32, default)", "int4", []),
                               ("optkit int4 --block-size 128", "int4", ["--block-size", "128"])):
        out = tmp / f"tr_{mode}_{len(extra)}.onnx"
        optkit(tr, "-o", out, "--mode", mode, "--eval-data", tmp / "tr.npz", *extra)
        if out.exists():
            show(label, figures(out, tr, str(tmp / "tr.npz"), None))

if __name__ == "__main__":
    main()
