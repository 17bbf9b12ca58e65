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
    for words in ("simplify", "int8", "62.0 KB", "0.9718", "±4.0%", "1 of 3 gates failed", "speedup &gt;= 2",
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
