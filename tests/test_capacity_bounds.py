"""optkit capacity's traffic history is bounded before the work and the work is linear in it (issue 39, W9 and W10):
a two-row history 183 days apart is held by one forward fill (it took one np.roll pass per minute held: 154 s), a
history of 6M rows or samples is refused at its bound without being read whole, a folder is one line naming it.
Peak memory is asserted (a bound, not a timing); times are in the closing note, not here."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml
from test_capacity import MIDNIGHT, best  # noqa: F401 - the module's real tune best.json

from optkit.capacity import forecast, traffic

from conftest import SAMPLES, one_error_line, run_cli

DAY = 86_400


def test_two_rows_183_days_apart_are_held_for_their_interval(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text(f"{MIDNIGHT},100\n{MIDNIGHT + 183 * DAY},200\n")
    tr = traffic.load(path)
    assert tr.minutes == 366 * 1440 == traffic.MAX_MINUTES            # each row held for its 183 days
    assert (tr.rates[:183 * 1440] == 100).all() and (tr.rates[183 * 1440:] == 200).all() and not tr.repairs
    assert tr.row_of_minute[183 * 1440 - 1] == 1 and tr.row_of_minute[-1] == 2
    why = forecast.forecast(tr.rates, tr.start, 100.0, 0.2, 60, 60, 1, 100)
    assert isinstance(why, str) and why.startswith("no forecast: the rate changes 1 time in the")
    # one more day is past the bound: exit 2 before any work
    path.write_text(f"{MIDNIGHT},100\n{MIDNIGHT + 184 * DAY},200\n")
    with pytest.raises(traffic.UsageError, match="spans 368 days; optkit replays at most 366 days"):
        traffic.load(path)


def test_a_missing_sample_is_a_gap_not_held_past_its_interval(tmp_path):
    """Hourly samples with hour 2 missing: hour 1 holds for its 60 minutes, then the gap is filled linearly to
    hour 3 (the pass-per-minute hold also held the copies it had made, for up to 1,770 minutes)."""
    path = tmp_path / "h.csv"
    path.write_text("".join(f"{MIDNIGHT + 3600 * h},{v}\n" for h, v in ((0, 10), (1, 20), (3, 80), (4, 80))))
    tr = traffic.load(path)
    assert tr.minutes == 5 * 60
    assert (tr.rates[:60] == 10).all() and (tr.rates[60:120] == 20).all() and (tr.rates[180:] == 80).all()
    assert np.allclose(tr.rates[120:180], np.interp(np.arange(120, 180), [119, 180], [20, 80]))
    assert tr.repairs and tr.repairs[0].startswith("60 missing minutes in 1 gaps")


def test_two_rows_183_days_apart_through_the_command(tmp_path, best):  # noqa: F811
    path = tmp_path / "h.csv"
    path.write_text("2023-01-01T00:00:00Z,100\n2023-07-03T00:00:00Z,200\n")
    out = tmp_path / "CAPACITY.json"
    r = run_cli("capacity", best, "--history", path, "-o", out)
    assert r.rc == 0, r.err
    c = json.loads(out.read_text())
    assert c["replay"]["minutes"] == 366 * 1440
    assert any("no forecast: the rate changes 1 time" in n for n in c["notes"]), c["notes"]


def _peak_rss_mb(path) -> tuple[str, float]:
    """traffic.load(path) in a child: (its one-line UsageError, its peak resident memory in MB, Linux's VmHWM)."""
    code = textwrap.dedent(f"""
        from optkit.core.errors import UsageError
        from optkit.capacity import traffic
        try:
            traffic.load({str(path)!r})
            line = ""
        except UsageError as e:
            line = str(e)
        print(line)
        hwm = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:"))  # this image's own peak
        print(int(hwm.split()[1]) / 1024)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    line, mb = out.strip().splitlines()
    return line, float(mb)


def test_six_million_rows_are_refused_at_the_bound_not_read_whole(tmp_path):
    """A 60 MB CSV of 6M rows (under the 64 MB file bound): before, split into 6M lines and 2M tuples (990 MB
    peak); now read line by line into compact arrays and refused at row 2,000,001. A Prometheus answer of 4.2M
    samples (59 MB): before, parsed whole (700 MB); now counted before it is parsed."""
    csv = tmp_path / "rows.csv"
    with csv.open("w") as f:
        for k in range(0, 6_000_000, 100_000):
            f.write("".join(f"{1_000_000 + i},1\n" for i in range(k, k + 100_000)))
    line, mb = _peak_rss_mb(csv)
    assert f"{csv} has over 2,000,000 rows" in line and mb < 500, (line, mb)
    prom = tmp_path / "prom.json"
    with prom.open("w") as f:
        f.write('{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[')
        for k in range(0, 4_200_000, 100_000):
            f.write(("," if k else "") + ",".join(f'[{1_000_000 + i},"1"]' for i in range(k, k + 100_000)))
        f.write("]}]}}")
    line, mb = _peak_rss_mb(prom)
    assert f"{prom} has over 2,000,000 samples" in line and mb < 400, (line, mb)


def test_a_folder_as_history_is_one_line_naming_it_on_every_entry_point(tmp_path, best):  # noqa: F811
    import optkit
    from optkit.core.errors import UsageError

    folder = tmp_path / "traffic"
    folder.mkdir()
    out = tmp_path / "CAPACITY.json"
    r = run_cli("capacity", best, "--history", folder, "-o", out)
    line = one_error_line(r)
    assert r.rc == 2 and f"{folder} is a folder, not a file; give a CSV" in line and "Is a directory" not in line
    assert not out.exists()
    r = run_cli("capacity", folder, "--peak", "10", "-o", out)     # the figures argument reads the same way
    assert r.rc == 2 and f"{folder} is a folder, not a file; give a best.json" in one_error_line(r)
    rec = {"version": 1, "name": "cap", "model": {"path": str(SAMPLES / "torch_cnn.onnx")},
           "stages": [{"pass": "quantize.onnx-fp16"}], "measure": {"latency": False},
           "capacity": {"figures": str(best), "history": str(folder), "output": str(out)}}
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(rec))
    r = run_cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 2 and "capacity.history" in one_error_line(r) and "is a folder, not a file" in one_error_line(r)
    with pytest.raises(UsageError, match="is a folder, not a file"):
        optkit.run(rec, workspace=tmp_path / "runs")
    assert not out.exists()
