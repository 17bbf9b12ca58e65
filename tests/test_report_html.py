"""Reports: the self-contained HTML page (checked in headless Chromium when present), Markdown, JUnit XML,
`optkit report compare` and `optkit report render`."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from optkit.pipeline.gates import evaluate, parse_gates
from optkit.report.html import to_html
from optkit.report.junit import to_junit
from optkit.report.render import to_markdown
from optkit.report.schema import ArtifactRef, Report, Stage

from conftest import one_error_line


def stage(name, pass_name, size, p50, ci, acc, fmt="onnx"):
    return Stage(name=name, pass_name=pass_name, output=ArtifactRef(path=f"{name}.{fmt}", format=fmt, sha256=name * 4),
                 duration_s=1.25, notes=[f"{name} note <b>escaped</b>"] if pass_name else [],
                 measurements={"size": {"bytes": size, "parameters": 47_530},
                               "latency": {"p50_ms": p50, "p90_ms": p50 * 1.3, "p99_ms": p50 * 2, "ci95_pct": ci,
                                           "trials": 5},
                               "accuracy": {"metric": "top1", "top1": acc}})


def sample_report() -> Report:
    r = Report(command="optkit run recipes/quickstart.yaml", run={"run_id": "20250101-000000"},
               stages=[stage("input", None, 206_500, 0.052, 3.1, 0.9738),
                       stage("simplify", "simplify.onnx", 205_900, 0.047, 2.5, 0.9738),
                       stage("int8", "quantize.onnx-static", 62_000, 0.031, 4.0, 0.9718)])
    r.gates = evaluate(r, parse_gates(["size_ratio <= 0.35", "accuracy_drop <= 0.01", "speedup >= 2"]))
    return r


def test_html_is_self_contained_with_table_plots_and_gates():
    html = to_html(sample_report())
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "<script" not in html and "<link" not in html and "@import" not in html
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls          # the SVG namespace is a name, not a fetch
    assert html.count("<svg") == 4                              # size, latency, accuracy, accuracy vs latency
    assert "Accuracy vs latency (marker area: size)" in html
    for words in ("simplify", "int8", "62.0 KB", "0.9718", "±4%", "1 of 3 gates failed", "speedup &gt;= 2",
                  "FAIL", "&lt;b&gt;escaped&lt;/b&gt;"):
        assert words in html, words
    assert "<b>escaped</b>" not in html


def test_markdown_and_junit():
    r = sample_report()
    md = to_markdown(r)
    assert "| int8 |" in md and "**1 of 3 gates failed**" in md and ":x: FAIL" in md
    xml = to_junit(r)
    root = ET.fromstring(xml)
    cases = root.findall(".//testcase")
    assert [c.get("name") for c in cases] == ["size_ratio <= 0.35", "accuracy_drop <= 0.01", "speedup >= 2"]
    assert [c.find("failure") is not None for c in cases] == [False, False, True]
    assert root.find("testsuite").get("failures") == "1"


def test_compare_and_render_commands(cli, tmp_path):
    a = sample_report()
    b = sample_report()
    b.stages[2].measurements["size"]["bytes"] = 70_000
    b.stages[2].measurements["latency"]["p50_ms"] = 0.045
    b.stages[2].measurements["accuracy"]["top1"] = 0.9678
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    r = cli("report", "compare", tmp_path / "a.json", tmp_path / "b.json", "--json")
    assert r.rc == 0, r.err
    rows = {x["stage"]: x for x in json.loads(r.out)}
    assert rows["int8"]["size_b"] == 70_000 and rows["int8"]["p50_b"] == 0.045
    md = cli("report", "compare", tmp_path / "a.json", tmp_path / "b.json", "--markdown")
    assert "+12.9%" in md.out and "+45.2%" in md.out and "-0.0040" in md.out
    assert "(within noise)" in md.out                            # unchanged stages: 0% within their noise
    table = cli("report", "compare", tmp_path / "a.json", tmp_path / "b.json")
    assert table.rc == 0 and "size Δ" in table.out
    for fmt, check in (("html", "<svg"), ("md", "| stage |"), ("junit", "<testsuites")):
        out = tmp_path / f"r.{fmt}"
        rr = cli("report", "render", tmp_path / "a.json", "--format", fmt, "-o", out)
        assert rr.rc == 0 and check in out.read_text(), rr.err
    bad = cli("report", "compare", tmp_path / "a.json", tmp_path / "missing.json")
    assert bad.rc == 2 and "not found" in one_error_line(bad)
    (tmp_path / "junk.json").write_text("{\"stages\": 3}")
    bad = cli("report", "compare", tmp_path / "a.json", tmp_path / "junk.json")
    assert bad.rc == 2 and "junk.json" in one_error_line(bad)


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(html_path: Path, png: Path, width=1200, height=1500) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    profile = png.parent / "chromium-profile"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
           f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={png}",
           html_path.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert png.exists() and png.stat().st_size > 10_000, proc.stderr[-2000:]


# measures the page as a 1280-pixel window lays it out: its width, and the box of every text of every plot
MEASURE = """<script>
const texts = [...document.querySelectorAll("svg")].map((svg, i) => [...svg.querySelectorAll("text")].map(t => {
  const b = t.getBoundingClientRect(); return [i, t.textContent, b.left, b.top, b.right, b.bottom]; })).flat();
const out = document.createElement("pre"); out.id = "measured";
out.textContent = JSON.stringify({scrollWidth: document.documentElement.scrollWidth, innerWidth: innerWidth, texts});
document.body.appendChild(out);
</script>"""


def layout(html: str, tmp_path: Path, width: int = 1280) -> dict:
    """The page laid out in headless Chromium at `width` x 900: {scrollWidth, innerWidth, texts: [[svg, text,
    left, top, right, bottom]]}; skips where Chromium is not installed."""
    browser = chromium()
    if browser is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    page = tmp_path / "measured.html"
    page.write_text(html.replace("</body>", MEASURE + "</body>"))
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--window-size={width},900", "--dump-dom",
           page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    import html as htmllib

    return json.loads(htmllib.unescape(found.group(1)))


def overlapping(texts: list) -> list:
    """Pairs of texts of one plot whose boxes intersect (by more than half a pixel: antialiasing)."""
    return [(a[1], b[1]) for k, a in enumerate(texts) for b in texts[k + 1:]
            if a[0] == b[0] and a[2] + 0.5 < b[4] and b[2] + 0.5 < a[4] and a[3] + 0.5 < b[5] and b[3] + 0.5 < a[5]]


def crowded_report() -> Report:
    """The quickstart's report as a user saw it: three stages of one accuracy at nearly one latency (their labels
    fell on each other), long stage and pass names, paired changes, and a gate with a long detail."""
    r = sample_report()
    for s, p50 in zip(r.stages, (0.019, 0.0191, 0.0211)):
        s.measurements["latency"].update(p50_ms=p50, throughput_per_s=1e3 / p50, p90_ms=p50 * 1.2)
        s.measurements["accuracy"]["top1"] = 0.9738
    r.stages[1].measurements["latency_change"] = {"ratio": 1.0, "ratio_ci95": [0.99, 1.01], "significant": False}
    r.stages[2].measurements["latency_change"] = {"ratio": 1.11, "ratio_ci95": [1.06, 1.15], "significant": True}
    r.stages[2].name = "int8-static-quantized-with-a-long-name"
    r.stages[2].pass_name = "quantize.onnx-static-with-a-plugin-suffix"
    for s in r.stages:
        s.measurements["memory"] = {"peak_mb": 12.5, "load_mb": 3.25}
        s.measurements["fidelity"] = {"cosine": 0.99995, "top1_agreement": 1.0, "max_abs_error": 3.2}
    r.gates = evaluate(r, parse_gates(["size_ratio <= 0.35", "accuracy_drop <= 0.01", "speedup >= 2",
                                       "latency_p90_ms <= 0.02"]))
    return r


def test_html_fits_a_1280_pixel_window_and_no_plot_labels_overlap(tmp_path):
    m = layout(to_html(crowded_report()), tmp_path)
    assert m["innerWidth"] == 1280, m["innerWidth"]
    assert m["scrollWidth"] <= 1280, m["scrollWidth"]
    assert len({t[0] for t in m["texts"]}) == 4                     # every plot was laid out
    assert overlapping(m["texts"]) == []


def test_latency_cells_tell_the_paired_story():
    """The user's report: int8 timed 1.11x slower against the input, while its own trials (measured apart) had a
    lower p50 and a higher throughput. Its p50, p90, samples/s and speedup cells all come from the paired ratio;
    simplify, inside the noise, reads "same" in all of them."""
    from optkit.report.table import stage_rows

    r = crowded_report()
    r.stages[2].measurements["latency"].update(p50_ms=0.018, throughput_per_s=55_000.0)   # the stage's own trials
    base, simplify, int8 = stage_rows(r)
    assert [simplify[c] for c in ("p50 ms", "p90 ms", "speedup", "samples/s")] == ["same"] * 4
    assert int8["speedup"] == "0.90x" and int8["p50 ms"] == f"{0.019 * 1.11:.3f}"
    assert int8["p90 ms"] == f"{0.019 * 1.2 * 1.11:.3f}"
    assert float(int8["samples/s"].replace(",", "")) == pytest.approx(1e3 / 0.019 / 1.11, abs=0.1)
    assert "paired ratio" in to_markdown(r) and "paired ratio" in to_html(r)


def test_scatter_labels_of_one_point_do_not_overlap():
    """Stages at one latency and one accuracy: each label takes its own line, with a leader line."""
    from optkit.report.html import CHAR_PX, LABEL_PX, place_labels

    names = ("input", "simplify", "int8", "fp16")
    placed = place_labels([(100.0, 100.0, 8.0, name) for name in names], (56, 14, 500, 256))
    boxes = [(x if a == "start" else x - len(n) * CHAR_PX, y - LABEL_PX, x + len(n) * CHAR_PX if a == "start" else x, y)
             for n, (x, y, a, _) in zip(names, placed)]
    assert not any(p[0] < q[2] and q[0] < p[2] and p[1] < q[3] and q[1] < p[3]
                   for k, p in enumerate(boxes) for q in boxes[k + 1:]), boxes
    assert all(56 <= b[0] and b[2] <= 500 for b in boxes)
    assert all(lead == (abs(y - LABEL_PX * 0.35 - 100.0) > 0.01) for _, y, _, lead in placed)  # moved: a leader


def test_html_renders_in_headless_chromium(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(to_html(sample_report()))
    png = Path(os.environ.get("OPTKIT_SCREENSHOT", tmp_path / "report.png"))
    screenshot(page, png)
    # not blank: many distinct colours (bars, markers, banner) in the picture
    from PIL import Image

    im = Image.open(png).convert("RGB")
    colours = im.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50


# ---------------------------------------------------------------- the typed view of a stage's figures

def figures_stage(measurements: dict, name: str = "q") -> Stage:
    return Stage(name=name, output=ArtifactRef(path=f"{name}.onnx", format="onnx", sha256=name),
                 measurements=measurements)


def test_stage_figures_gives_every_figure_typed_and_none_when_absent():
    import math

    from optkit.report.figures import LatencyChange, Normalisation, StageFigures

    lat = {"p50_ms": 0.5, "p90_ms": 0.6, "p99_ms": 0.9, "mean_ms": 0.55, "std_ms": 0.1, "runs": 250, "batch": 1,
           "threads": 1, "throughput_per_s": 1800.0, "trials": 5, "trial_p50_ms": [0.5, 0.51, None], "ci95_pct": 2.0,
           "low_ms": 0.45, "trial_low_ms": [0.45, 0.46], "low_ci95_pct": 1.0, "normalized": 1.2,
           "trial_normalized": [1.2, 1.21], "normalized_ci95_pct": None, "reference": "onnxruntime MLP 1x256",
           "references": {"mlp1x256": {"normalized": 1.2, "trial_normalized": [1.2, 1.21], "ci95_pct": 0.5,
                                       "bytes": 262144}}}
    f = StageFigures.of(figures_stage({
        "size": {"bytes": 50_000, "gzip_bytes": 42_000, "parameters": 47_544, "sparsity": 0.01},
        "latency": lat, "latency_change": {"ratio": 0.8, "ratio_ci95": [0.7, 0.9], "significant": True, "trials": 5},
        "accuracy": {"metric": "top1", "top1": 0.97, "top5": 0.999, "samples": 497},
        "fidelity": {"cosine": 0.9999, "top1_agreement": None, "max_abs_error": None, "mean_abs_error": 0.01,
                     "outputs": {"logits": {"cosine": 0.9999, "max_abs_error": 3.2, "checked": True},
                                 "aux": {"cosine": 0.5, "checked": False}}},
    }))
    assert f.measured == {"size", "latency", "accuracy", "fidelity"}
    assert (f.size_bytes, f.gzip_bytes, f.parameters, f.initializer_bytes) == (50_000, 42_000, 47_544, None)
    assert isinstance(f.size_bytes, int) and f.size_mb == 0.05              # numbers keep their type
    assert (f.p50_ms, f.p90_ms, f.p99_ms, f.runs, f.threads, f.trials) == (0.5, 0.6, 0.9, 250, 1, 5)
    assert f.trial_p50_ms[:2] == (0.5, 0.51) and math.isnan(f.trial_p50_ms[2])   # a null trial: NaN
    assert f.normalized_ci95_pct is None                                      # null interval: one trial, none
    assert f.normalisations == {"mlp1x256": Normalisation(1.2, (1.2, 1.21), 0.5, None, 262144)}
    assert f.latency_change == LatencyChange(0.8, (0.7, 0.9), True, 5)
    assert (f.metric, f.accuracy, f.scores) == ("top1", 0.97, {"top1": 0.97, "top5": 0.999})
    assert f.cosine == 0.9999 and f.fidelity_loss == pytest.approx(1e-4)
    assert f.top1_agreement is None and f.max_abs_error == math.inf          # null: not applicable / infinite error
    assert list(f.outputs) == ["logits", "aux"] and f.outputs["logits"].max_abs_error == 3.2
    assert not f.outputs["aux"].checked
    empty = StageFigures.of(figures_stage({}))
    assert empty == StageFigures.of(None) == StageFigures()
    assert (empty.size_bytes, empty.size_mb, empty.p50_ms, empty.accuracy, empty.cosine, empty.fidelity_loss,
            empty.latency_change, empty.metric) == (None,) * 8
    assert empty.normalisations == {} and empty.measured == frozenset()


def test_stage_figures_null_is_nan_and_a_wrong_type_is_absent_or_strict():
    import math

    from optkit.core.errors import UsageError
    from optkit.report.figures import StageFigures, finite

    s = figures_stage({"size": {"bytes": None}, "latency": {"p50_ms": None, "ci95_pct": None, "normalized": 0.9,
                                                            "normalized_ci95_pct": 3.0},
                       "accuracy": {"metric": "top1", "top1": None}, "fidelity": {"cosine": None}})
    f = StageFigures.of(s)
    assert all(math.isnan(v) for v in (f.size_bytes, f.p50_ms, f.accuracy, f.cosine, f.fidelity_loss))
    assert f.ci95_pct is None and finite(f.p50_ms) is None and finite(2) == 2 and finite(True) is None
    # an older report: one reference, keyed by its description (none here)
    assert f.normalisations[None].normalized == 0.9 and f.normalisations[None].ci95_pct == 3.0
    wrong = figures_stage({"size": {"bytes": "big"}, "latency": {"p50_ms": 1.0, "trial_p50_ms": ["x"]},
                           "accuracy": {"metric": ["top1"]}, "fidelity": [1]})
    f = StageFigures.of(wrong)
    assert (f.size_bytes, f.trial_p50_ms, f.metric, f.accuracy, f.cosine, f.p50_ms) == (None,) * 5 + (1.0,)
    with pytest.raises(UsageError, match=r"stage 'q': figure size.bytes is 'big', not a number"):
        StageFigures.of(figures_stage({"size": {"bytes": "big"}}), strict=True)
    with pytest.raises(UsageError, match=r"figure accuracy.metric is \['top1'\], not a metric's name"):
        StageFigures.of(figures_stage({"accuracy": {"metric": ["top1"]}}), strict=True)
    with pytest.raises(UsageError, match=r"figure latency.trial_p50_ms is \['x'\], not a list of numbers"):
        StageFigures.of(figures_stage({"latency": {"trial_p50_ms": ["x"]}}), strict=True)
    with pytest.raises(UsageError, match="figures fidelity are list, not an object"):
        StageFigures.of(figures_stage({"fidelity": [1]}), strict=True)


# A report as optkit wrote it before trials, normalised latency, per-output fidelity and latency_change.
OLD_REPORT = {
    "schema_version": "1.0", "tool": "optkit", "created": "2025-06-01T10:00:00+00:00",
    "command": "optkit run recipes/quickstart.yaml", "machine": {"processor": "x86_64", "cpu_count": 4},
    "versions": {"optkit": "0.1.0"}, "recipe": {"gates": ["size_ratio <= 0.35"]}, "run": {"run_id": "old"},
    "stages": [
        {"name": "input", "pass": None, "output": {"path": "m.onnx", "format": "onnx", "sha256": "a" * 64},
         "measurements": {"size": {"bytes": 206515, "size_mb": 0.206515, "parameters": 47532},
                          "latency": {"p50_ms": 0.052, "p90_ms": 0.06, "p99_ms": 0.09, "mean_ms": 0.055,
                                      "std_ms": 0.01, "runs": 100, "batch": 1, "throughput_per_s": 18000.0},
                          "accuracy": {"top1": 0.9738, "metric": "top1"}}},
        {"name": "int8", "pass": "quantize.onnx-static",
         "input": {"path": "m.onnx", "format": "onnx", "sha256": "a" * 64},
         "output": {"path": "q.onnx", "format": "onnx", "sha256": "b" * 64}, "config": {"calibration_method": "minmax"},
         "duration_s": 2.5, "notes": ["static INT8"],
         "measurements": {"size": {"bytes": 62000, "size_mb": 0.062, "parameters": 47544},
                          "latency": {"p50_ms": 0.031, "p90_ms": 0.04, "p99_ms": 0.05, "mean_ms": 0.033,
                                      "std_ms": 0.005, "runs": 100, "batch": 1, "throughput_per_s": 30000.0},
                          "accuracy": {"top1": 0.9718, "metric": "top1"},
                          "fidelity": {"max_abs_error": 3.2, "mean_abs_error": 0.07, "cosine": 0.99995}}},
    ],
    "gates": [{"gate": "size_ratio <= 0.35", "metric": "size_ratio", "stage": "int8", "value": 0.3002,
               "threshold": 0.35, "op": "<=", "passed": True, "margin": 0.0498, "detail": "input -> int8"}],
}


def test_an_older_report_loads_renders_compares_and_gates(cli, tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps(OLD_REPORT))
    rep = Report.load(old)
    assert "| int8 | onnx | 62.0 KB | 0.30 | 47,544 | 0.031 | 0.040 | 1.68x | 30,000.0 | 0.9718 | 0.99995 | 3.2 |" in \
        to_markdown(rep)
    html = to_html(rep)
    assert html.count("<svg") == 4 and "62.0 KB" in html
    sample_report().save(tmp_path / "new.json")
    rows = json.loads(cli("report", "compare", old, tmp_path / "new.json", "--json").out)
    assert rows[1] == {"stage": "int8", "size_a": 62000, "size_b": 62000, "p50_a": 0.031, "p50_b": 0.031,
                       "accuracy_a": 0.9718, "accuracy_b": 0.9718, "latency_noise_pct": 4.0}
    for fmt in ("console", "md", "html", "junit", "json"):
        r = cli("report", "render", old, "--format", fmt)
        assert r.rc == 0 and "Traceback" not in r.err, (fmt, r.err)
    # the stored gates; and the old report as a baseline: its raw p50 carries no noise band, so a latency gate
    # against it cannot be judged (never a silent pass); its size still can
    assert cli("gate", old).rc == 0
    r = cli("gate", tmp_path / "new.json", "latency_regression_pct <= 10", "size_growth_pct <= 0",
            "--baseline", old, "--json")
    assert r.rc == 1, r.err
    latency, size = json.loads(r.out)
    assert latency["verdict"] == "cannot judge" and "carries no noise band" in latency["detail"]
    assert size["passed"] and size["value"] == pytest.approx(0.0) and size["detail"].startswith("0.062 MB -> 0.062 MB")


def test_renderers_and_gates_read_figures_only_through_the_typed_view():
    """table, compare, html, render, junit and gates never index a stage's measurements themselves."""
    root = Path(__file__).resolve().parents[1] / "optkit"
    for rel in ("report/table.py", "report/compare.py", "report/html.py", "report/render.py", "report/junit.py",
                "pipeline/gates.py"):
        text = (root / rel).read_text()
        assert ".measurements" not in text and '["latency"]' not in text and "get(\"size\")" not in text, rel
