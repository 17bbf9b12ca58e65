"""optkit capacity: the HPA rule against a hand-computed trace, the target search, the forecast's schedule against
reactive scaling on a surge, figures from a real best.json and bench report, bad traffic input, the HTML page."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from optkit.capacity import hpa, plan, replica, traffic
from optkit.capacity.config import CapacityConfig, Scaling
from optkit.core.errors import UsageError

from conftest import SAMPLES, one_error_line, run_cli

CNN = SAMPLES / "torch_cnn.onnx"
MIDNIGHT = 1_700_006_400  # 2023-11-15 00:00 UTC


# ------------------------------------------------------------------ the HPA rule, by hand

def test_hpa_rule_against_a_hand_computed_trace():
    """10/s per replica, target 0.5 (5/s each), tolerance 0.1, scale-down window 300 s, start-up 60 s.

    m0-1  load 10: ready 2, ratio 1.0                         -> 2
    m2    load 10.4: ratio 1.04, within the tolerance          -> 2 (ceil(2 x 1.04) = 3 without it)
    m3    load 40: ratio 4 -> ceil(2 x 4) = 8 (cap max(2n, n+4) x4 per minute: 48); 6 pods start, serve from m5
    m4    8 pods, 2 ready: over; not-ready at 0%: 40/80/0.5 = 1.0 -> no change
    m5-6  8 ready, load 40: ratio 1.0
    m7-10 load 10: desired 2, but the max over the window (this and the 4 before) is still 8
    m11   the window holds only 2s                             -> 2 from m12
    """
    load = np.array([10, 10, 10.4, 40, 40, 40, 40, 10, 10, 10, 10, 10, 10, 10], float)
    r = hpa.replay(load, 10.0, hpa.HPA(target=0.5, scaling=Scaling(tolerance=0.1, down_window_s=300, startup_s=60)))
    assert r.replicas.tolist() == [2, 2, 2, 2, 8, 8, 8, 8, 8, 8, 8, 8, 2, 2]
    assert r.ready.tolist() == [2, 2, 2, 2, 2, 8, 8, 8, 8, 8, 8, 8, 2, 2]
    assert np.flatnonzero(r.over).tolist() == [3, 4]
    assert r.summary() == {"slo_minutes": 2, "replica_hours": round(sum(r.replicas) / 60, 2), "peak_replicas": 8}
    assert r.utilisation[3] == pytest.approx(2.0) and r.utilisation[5] == pytest.approx(0.5)
    # no tolerance: m2 scales to 3; no start-up: the new pods serve from m4, one minute over
    assert hpa.replay(load, 10.0, hpa.HPA(target=0.5, scaling=Scaling(tolerance=0.0))).replicas[3] == 3
    assert hpa.replay(load, 10.0, hpa.HPA(target=0.5, scaling=Scaling(startup_s=0))).over.sum() == 1
    # no stabilisation window: down to 2 right after the surge
    assert hpa.replay(load, 10.0, hpa.HPA(target=0.5, scaling=Scaling(down_window_s=0))).replicas[8] == 2


def test_scale_up_policy_and_bounds():
    h = hpa.HPA(target=0.5, max_replicas=100)
    assert h.up_limit(1) == 40                # 1 -> 5 (+4 beats +100%) -> 10 -> 20 -> 40: four 15 s periods
    assert h.up_limit(2) == 48                # 2 -> 6 -> 12 -> 24 -> 48
    load = np.array([5, 5000, 5000, 5000], float)
    r = hpa.replay(load, 10.0, h)             # wants 1000: the policy caps the minute at 40, then max replicas
    assert r.replicas.tolist() == [1, 1, 40, 100]
    assert hpa.replay(load, 10.0, hpa.HPA(target=0.5, max_replicas=30)).replicas.tolist() == [1, 1, 30, 30]


# ------------------------------------------------------------------ the plan and its search

def _surge(days=6, base=100.0, surge=6.0):
    m = np.arange(days * 1440)
    tod = m % 1440
    rate = base * (1 + 0.5 * np.sin(2 * np.pi * (tod - 360) / 1440))
    rate = np.where((tod >= 540) & (tod < 600), rate * surge, rate)       # 09:00-10:00 UTC, every day
    return rate * (1 + 0.03 * np.random.default_rng(0).standard_normal(len(m)))


def _write_csv(path, rates, start=MIDNIGHT, iso=False):
    with open(path, "w") as f:
        f.write("timestamp,requests_per_s\n")
        for i, v in enumerate(rates):
            t = start + 60 * i
            stamp = np.datetime_as_string(np.datetime64(t, "s")) + "Z" if iso else str(t)
            f.write(f"{stamp},{v:.4f}\n")
    return path


def _cfg(**values) -> CapacityConfig:
    return CapacityConfig(output="CAPACITY.json", peak=1.0, **values)


def _per(thr=50.0):
    return replica.PerReplica(throughput_per_s=thr, throughput_source="test", cpu_cores=0.5,
                              cpu_per_1000_samples_s=10.0, memory_mb=100.0, source="test")


def test_the_chosen_target_meets_the_slo_in_the_replay_with_the_fewest_replica_hours():
    rates = _surge(days=2, surge=1.0)          # no surge: reactive scaling can meet the SLO
    tr = traffic.Traffic(rates=rates, start=MIDNIGHT, source="t")
    p = plan.make_plan(_per(), tr, _cfg(forecast=False))
    s = p.strategies["reactive"]
    assert s.replay.summary()["slo_minutes"] == 0
    again = hpa.replay(rates, 50.0, hpa.HPA(target=s.target, max_replicas=s.max_replicas))
    assert again.summary() == s.replay.summary()
    meeting = [row for row in p.searched["reactive"] if row["slo_minutes"] == 0]
    assert s.replay.summary()["replica_hours"] == min(row["replica_hours"] for row in meeting)
    c = p.to_contract()
    assert c["autoscaling"]["target_utilization"] == s.target and c["schedule"] == []


def test_forecast_beats_reactive_on_a_surge_and_fixed_costs_the_most():
    tr = traffic.Traffic(rates=_surge(), start=MIDNIGHT, source="t")
    p = plan.make_plan(_per(), tr, _cfg())
    got = {k: v.replay.summary() for k, v in p.strategies.items()}
    assert got["forecast"]["slo_minutes"] < got["reactive"]["slo_minutes"]
    assert got["forecast"]["slo_minutes"] == 0
    assert got["fixed"]["replica_hours"] > max(got["reactive"]["replica_hours"], got["forecast"]["replica_hours"])
    c = p.to_contract()
    assert c["autoscaling"]["strategy"] == "forecast" and c["schedule"]
    surge = [e for e in c["schedule"] if e["desired_replicas"] == max(x["desired_replicas"] for x in c["schedule"])]
    assert surge[0]["start"] == "57 8 * * *" and surge[0]["timezone"] == "UTC"  # 09:00 less start-up + lead (3 min)
    assert c["replay"]["minutes"] == 2 * 1440 and "fitted on 4 days" in c["replay"]["forecast"]["method"]


# ------------------------------------------------------------------ real figures, the CLI, the contract

@pytest.fixture(scope="module")
def best(tmp_path_factory):
    path = tmp_path_factory.mktemp("cap") / "best.json"
    r = run_cli("tune", CNN, "--objective", "throughput", "--trials", "2", "--trial-seconds", "0.3",
                "--confirm", "1", "--slo", "p99<=50ms", "-o", path)
    assert r.rc == 0, r.err
    return path


def test_capacity_from_a_real_best_json_with_a_surge(best, tmp_path):
    tuned = json.loads(best.read_text())
    low = tuned["best"]["confirmed"]["ci95"][0]
    csv = _write_csv(tmp_path / "traffic.csv", _surge() * (3 * low / 100), iso=True)
    out, page = tmp_path / "CAPACITY.json", tmp_path / "capacity.html"
    r = run_cli("capacity", best, "--history", csv, "-o", out, "--html", page)
    assert r.rc == 0, r.err
    c = json.loads(out.read_text())
    assert c["schema"] == 2 and c["model"] == tuned["model"] and c["slo"] == {"p99_ms": 50.0}
    assert c["model_sha256"] == tuned["model_sha256"]
    per = c["per_replica"]
    assert per["throughput_per_s"] == pytest.approx(low) and "lower end of the 95% band" in per["throughput_source"]
    assert per["cpu_per_1000_samples_s"] == tuned["best"]["figures"]["cpu_s_per_1k"]
    assert per["memory_mb"] == tuned["best"]["figures"]["memory_mb"]
    assert c["resources"]["requests"]["cpu"].endswith("m") and c["resources"]["requests"]["memory"].endswith("Mi")
    assert c["autoscaling"]["metric"] == "cpu" and 0.3 <= c["autoscaling"]["target_utilization"] <= 0.95
    assert c["autoscaling"]["tolerance"] == 0.1 and c["autoscaling"]["scale_down_stabilization_s"] == 300
    assert set(c["replay"]["strategies"]) == {"fixed", "reactive", "forecast"}
    s = c["replay"]["strategies"]
    assert s["forecast"]["slo_minutes"] < s["reactive"]["slo_minutes"]
    assert s["fixed"]["replica_hours"] > s["forecast"]["replica_hours"]
    assert c["replicas"]["min"] == 1 and c["replicas"]["peak"] <= c["replicas"]["max"]
    assert all(set(e) >= {"start", "end", "desired_replicas", "timezone"} for e in c["schedule"])
    text = " ".join(r.out.split())
    assert "fixed for the peak" in text and "reactive HPA" in text and "SLO minutes" in text
    assert "<svg" in page.read_text() and "over the SLO" in page.read_text()


def test_capacity_from_a_real_bench_report(tmp_path):
    rep = tmp_path / "report.json"
    r = run_cli("bench", CNN, "--concurrency", "2", "--warmup", "3", "--runs", "30", "--report", rep)
    assert r.rc == 0, r.err
    load = json.loads(rep.read_text())["stages"][0]["measurements"]["concurrency"]
    out = tmp_path / "CAPACITY.json"
    r = run_cli("capacity", rep, "--peak", str(load["ci95"]["throughput_per_s"][0] * 4.5), "-o", out, "--json")
    assert r.rc == 0, r.err
    c = json.loads(out.read_text())
    assert json.loads(r.out) == c
    assert c["per_replica"]["throughput_per_s"] == pytest.approx(load["ci95"]["throughput_per_s"][0])
    assert "under load, 2 requests in flight" in c["per_replica"]["throughput_source"]
    assert c["replicas"]["fixed_for_peak"] == math.ceil(4.5 * 1.2 - 1e-9) == 6
    assert c["per_replica"]["cpu_cores"] is None and c["autoscaling"]["metric"] == "rps"
    assert c["resources"]["requests"]["cpu"] is None and c["resources"]["requests"]["memory"].endswith("Mi")
    # the user's --cpu / --memory-mb are the figures used, the metric follows, and each says it is the user's
    r = run_cli("capacity", rep, "--peak", str(load["ci95"]["throughput_per_s"][0] * 4.5), "-o", out,
                "--cpu", "1.5", "--memory-mb", "300")
    assert r.rc == 0, r.err
    c = json.loads(out.read_text())
    assert c["autoscaling"]["metric"] == "cpu" and c["per_replica"]["cpu_cores"] == 1.5
    assert c["per_replica"]["cpu_source"].startswith("stated by the user (--cpu)")
    assert c["per_replica"]["memory_mb"] == 300 and "--memory-mb" in c["per_replica"]["memory_source"]
    assert c["resources"]["requests"]["cpu"] == "1500m" and not any("served figures" in n for n in c["notes"])
    from optkit.contracts import base, capacity
    assert base.load(out, capacity.CapacityFile, capacity.HINT)[1].autoscaling.metric == "cpu"


# ------------------------------------------------------------------ bad input

def test_gaps_are_filled_and_counted(tmp_path):
    rows = [(MIDNIGHT + 60 * i, 10.0 + i) for i in range(10) if i not in (3, 4, 7)]
    path = tmp_path / "gaps.csv"
    path.write_text("".join(f"{t},{v}\n" for t, v in rows))
    tr = traffic.load(path)
    assert tr.minutes == 10 and tr.rates[3] == pytest.approx(13.0) and tr.rates[7] == pytest.approx(17.0)
    assert tr.repairs and tr.repairs[0].startswith("3 missing minutes in 2 gaps")


@pytest.mark.parametrize("body, words", [
    ("", "is empty"),
    ("timestamp,rate\n", "holds no rows"),
    ("1700000000,5\n1700000060,-3\n", "row 2: rate -3 is negative"),
    ("1700000000,5\n1700000060,nan\n", "row 2: rate is nan"),
    ("1700000000,5\n1700000060,abc\n", "row 2: rate 'abc' is not a number"),
    ("1700000060,5\n1700000000,6\n", "row 2: timestamp is before row 1's"),
    ("1700000000,5\n1700000000,6\n", "row 2: timestamp repeats row 1's"),
    ("2023-11-15T00:00:00Z,5\nyesterday,6\n", "row 2: timestamp 'yesterday' is neither ISO 8601"),
    ('{"status":"success","data":{"resultType":"vector","result":[]}}', "not 'matrix'"),
    ('{"status":"success","data":{"resultType":"matrix","result":[{"values":[[1700000000,"1"],'
     '[1700000060,"NaN"]]}]}}', "values.1: rate is nan"),
])
def test_bad_history_is_exit_2_one_line_naming_the_file_and_row(tmp_path, best, body, words):
    path = tmp_path / ("h.json" if body.startswith("{") else "h.csv")
    path.write_text(body)
    out = tmp_path / "CAPACITY.json"
    r = run_cli("capacity", best, "--history", path, "-o", out)
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert str(path) in line and words in line, line
    assert not out.exists()


def test_a_rate_no_replica_count_serves_and_a_huge_file(tmp_path, best, monkeypatch):
    low = json.loads(best.read_text())["best"]["confirmed"]["ci95"][0]
    path = tmp_path / "h.csv"
    path.write_text(f"{MIDNIGHT},1\n{MIDNIGHT + 60},{low * 50}\n")
    r = run_cli("capacity", best, "--history", path, "--max-replicas", "10", "-o", tmp_path / "c.json")
    assert r.rc == 2 and "row 2" in one_error_line(r) and "over --max-replicas 10" in one_error_line(r)
    monkeypatch.setattr(traffic, "MAX_BYTES", 16)
    with pytest.raises(UsageError, match="is over"):
        traffic.load(path)
    r = run_cli("capacity", best, "-o", tmp_path / "c.json")
    assert r.rc == 2 and "--peak RATE or --history FILE" in one_error_line(r)


def test_prometheus_range_query(tmp_path):
    values = [[MIDNIGHT + 60 * i, str(5.0 + i)] for i in range(5)]
    path = tmp_path / "prom.json"
    path.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix",
                                                              "result": [{"metric": {}, "values": values}]}}))
    tr = traffic.load(path)
    assert tr.rates.tolist() == [5.0, 6.0, 7.0, 8.0, 9.0] and tr.start == MIDNIGHT


# ------------------------------------------------------------------ the page

def test_html_fits_1280_pixels(tmp_path):
    from test_report_html import layout

    from optkit.capacity.pictures import to_html

    p = plan.make_plan(_per(), traffic.Traffic(rates=_surge(), start=MIDNIGHT, source="t"), _cfg())
    m = layout(to_html(p), tmp_path)
    assert m["scrollWidth"] <= 1280, m["scrollWidth"]


# ------------------------------------------------------------------ hostile input: exit 2 in one line, or a stated repair

def _rows(n, step=60, rate=lambda i: 10 + i % 7):
    return "".join(f"{MIDNIGHT + step * i},{rate(i)}\n" for i in range(n))


@pytest.mark.parametrize("body, minutes, note", [
    ("\ufefftimestamp,requests_per_s\n" + _rows(30), 30, None),                              # BOM
    ("timestamp,requests_per_s\r\n" + _rows(30).replace("\n", "\r\n"), 30, None),          # CRLF
    ("timestamp,host,requests_per_s\n" + "".join(f"{MIDNIGHT + 60 * i},web{i},{i}\n" for i in range(5)), 5,
     "the rate is column 3 ('requests_per_s'), the others are ignored"),
    ("time,errors,rps\n" + "".join(f"{MIDNIGHT + 60 * i},7,{i}\n" for i in range(5)), 5, "column 3 ('rps')"),
    ("horodatage,requêtes_par_seconde\n" + _rows(5), 5, "header 'horodatage,requêtes_par_seconde' read as "
                                                       "timestamp,requests_per_s"),
    ("".join(f"2023-11-15T00:{i:02d}:00\n".replace("\n", f",{i}\n") for i in range(5)), 5,
     "no time zone: read as UTC"),
    ("".join(f"2023-11-05T01:{i:02d}:00-04:00,1\n" for i in range(0, 60, 10))
     + "".join(f"2023-11-05T01:{i:02d}:00-05:00,1\n" for i in range(0, 60, 10)), 120,
     "UTC offsets -05:00, -04:00 converted to UTC"),
    (_rows(600, step=5), 50, "resampled: 600 samples every 5 s averaged into 50 minutes"),
    (_rows(48, step=3600), 48 * 60, "resampled: one sample every 3600 s, each held for its 60 minutes"),
    (f"{MIDNIGHT},10\n", 1, "the history is one row"),
    (_rows(60, rate=lambda i: 0), 60, "the traffic is zero throughout"),
])
def test_hostile_history_is_read_with_its_repair_stated(tmp_path, body, minutes, note):
    path = tmp_path / "h.csv"
    path.write_text(body, encoding="utf-8", newline="")
    tr = traffic.load(path)
    assert tr.minutes == minutes
    if note:
        assert any(note in n for n in tr.notes), tr.notes
        p = plan.make_plan(_per(), tr, _cfg(forecast=False))
        assert any(note in n for n in p.to_contract()["notes"])   # in CAPACITY.json, not only in memory


def test_hourly_samples_hold_for_their_hour_and_a_timezone_offset_is_converted(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("2023-11-15T01:00:00+01:00,5\n2023-11-15T02:00:00+01:00,9\n")
    tr = traffic.load(path)
    assert tr.start == MIDNIGHT and tr.rates.tolist() == [5.0] * 60 + [9.0] * 60


@pytest.mark.parametrize("body, words", [
    ("".join(f"{MIDNIGHT + 60 * i},{i},7\n" for i in range(5)), "3 columns and no header naming the rate"),
    ("time,a,b\n" + "".join(f"{MIDNIGHT + 60 * i},{i},7\n" for i in range(5)), "no column named as the rate"),
    ("t,rate\n1700006400,1\n1700006460,1,2\n", "row 3: 3 columns where the rows before have 2"),
    ("2023-11-15T00:00:00Z,1\n2023-11-15T00:01:00,1\n", "some timestamps carry a time zone and some do not"),
    ("2023-11-05T01:50:00,1\n2023-11-05T01:00:00,1\n", "daylight-saving change"),
    ("2023-11-05T01:00:00,1\n2023-11-05T01:00:00,1\n", "row 2: timestamp repeats row 1's; one rate per time; local"),
    (f"{MIDNIGHT * 1000},1\n", "epoch milliseconds? give seconds"),
    (f"{MIDNIGHT};1\n", "one column"),
    (f"{MIDNIGHT},1e12\n", "rate 1e+12 is over 1e+09"),
    ('{"status":"success","data":{"resultType":"matrix","result":[{"values":[[1700006400,"1"]]},'
     '{"values":[[1700006400,"1"]]}]}}', "holds 2 series; sum them"),
    ('{"status":"success","data":{"resultType":"matrix","result":[{"values":[[true,"1"]]}]}}',
     "timestamp true is not a number"),
])
def test_hostile_history_is_one_line(tmp_path, body, words):
    path = tmp_path / ("h.json" if body.startswith("{") else "h.csv")
    path.write_text(body)
    with pytest.raises(UsageError) as e:
        traffic.load(path)
    assert words in e.value.message and "\n" not in e.value.message, e.value.message


@pytest.mark.parametrize("mutate, words", [
    (lambda b: b["best"]["figures"].update(throughput_per_s=float("nan")), "finite number"),
    (lambda b: b["best"]["figures"].update(throughput_per_s=-5), "greater than or equal to 0"),
    (lambda b: b["best"]["figures"].update(throughput_per_s=0), "is 0, not a positive finite number"),
    (lambda b: b["best"]["figures"].update(throughput_per_s=1e300),
     "key best.figures.throughput_per_s: Input should be less than or equal to 1000000000"),
    (lambda b: b["best"]["figures"].update(cpu_s_per_1k=1e300), "over 1024: not one replica's"),
    (lambda b: b["best"]["confirmed"].update(ci95=[1e300, 1e301]), "ci95.0 is 1e+300, over 1e+09"),
    (lambda b: b["best"]["confirmed"].update(ci95=[1e8, 2e8]), "not a band of its figure"),
    (lambda b: b.update(slo=["p99<=1e400ms"]), "key slo: SLO 'p99<=1e400ms': the limit must be a finite positive"),
    (lambda b: b.update(slo=["p99<=1e300ms"]), "key slo: SLO 'p99<=1e300ms': the limit must be a finite positive"),
    (lambda b: b.update(slo=["p99<=0ms"]), "key slo: SLO 'p99<=0ms'"),
])
def test_forged_best_json_is_one_line(tmp_path, best, mutate, words):
    data = json.loads(best.read_text())
    mutate(data)
    path = tmp_path / "best.json"
    path.write_text(json.dumps(data))
    r = run_cli("capacity", path, "--peak", "100", "-o", tmp_path / "c.json")
    assert r.rc == 2 and words in one_error_line(r), r.err
    assert not (tmp_path / "c.json").exists()


def test_forged_bench_report_and_a_band_that_reaches_zero(tmp_path):
    rep = tmp_path / "report.json"
    r = run_cli("bench", CNN, "--concurrency", "2", "--warmup", "3", "--runs", "30", "--report", rep)
    assert r.rc == 0, r.err
    data = json.loads(rep.read_text())
    g = data["stages"][0]["measurements"]["concurrency"]
    g["throughput_per_s"] = 0
    del g["ci95"]["throughput_per_s"]
    rep.write_text(json.dumps(data))
    r = run_cli("capacity", rep, "--peak", "100", "-o", tmp_path / "c.json")
    assert r.rc == 2 and "concurrency.throughput_per_s is 0, not a positive" in one_error_line(r), r.err
    g["throughput_per_s"], g["ci95"]["throughput_per_s"] = 1000.0, [0.0, 2000.0]
    rep.write_text(json.dumps(data))
    per = replica.load(rep)
    assert per.throughput_per_s == 1000.0 and "its 95% band reaches 0/s (too noisy to size on)" in \
        per.throughput_source
    g["ci95"]["throughput_per_s"] = [400.0, None]           # too noisy to bound from above: the low end is used
    rep.write_text(json.dumps(data))
    assert replica.load(rep).throughput_per_s == 400.0


def test_a_tune_band_that_crosses_zero_reaches_0(best, tmp_path):
    """The normal interval of a noisy rate may cross zero (tune's best.json wrote one under load before its band
    was taken on the rounds' logs): read as reaching 0/s, too noisy to size on, not refused as forged."""
    data = json.loads(best.read_text())
    confirmed = data["best"]["confirmed"]
    confirmed["ci95"] = [-12902.9, confirmed["mean"] * 2]
    path = tmp_path / "best.json"
    path.write_text(json.dumps(data))
    assert "reaches 0/s (too noisy to size on)" in replica.load(path).throughput_source


@pytest.mark.parametrize("flags, rc, words", [
    (["--headroom", "0"], 0, None), (["--headroom", "4"], 0, None), (["--headroom", "-0.1"], 2, "--headroom"),
    (["--startup", "0"], 0, None), (["--startup", "3600"], 0, None), (["--startup", "3601"], 2, "--startup"),
    (["--max-replicas", "0"], 2, "--max-replicas"), (["--max-replicas", "10001"], 2, "--max-replicas"),
    (["--min-replicas", "5", "--max-replicas", "4"], 2, "--min-replicas 5 is above --max-replicas 4"),
    (["--peak", "nan"], 2, "--peak"), (["--peak", "1e9", "--max-replicas", "10000"], 2, "over --max-replicas"),
])
def test_option_edges(tmp_path, best, flags, rc, words):
    args = flags if "--peak" in flags else ["--peak", "100", *flags]
    r = run_cli("capacity", best, *args, "-o", tmp_path / "c.json")
    assert r.rc == rc, r.err
    if words:
        assert words in one_error_line(r)


# ------------------------------------------------------------------ a recipe's `capacity:` section

def _recipe(tmp_path, capacity, stages=None):
    import yaml

    rec = {"version": 1, "name": "cap", "model": {"path": str(CNN)},
           "stages": stages or [{"pass": "quantize.onnx-fp16"}], "measure": {"latency": False},
           "capacity": capacity}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(rec, sort_keys=False))
    return path


def test_recipe_and_command_give_the_same_capacity_json(tmp_path, best):
    from optkit.report.schema import Report

    csv = _write_csv(tmp_path / "traffic.csv", _surge(days=4) * 40, iso=True)
    opts = {"headroom": 0.3, "startup_s": 90, "slo_p99_ms": 40, "cpu_cores": 1.5}
    recipe = _recipe(tmp_path, {"figures": str(best), "history": "traffic.csv", "output": "rc/CAPACITY.json",
                                "html": "rc/capacity.html", **opts})
    (tmp_path / "rc").mkdir()
    r = run_cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 0, r.err
    cli = tmp_path / "CLI.json"
    r = run_cli("capacity", best, "--history", csv, "-o", cli, "--headroom", "0.3", "--startup", "90",
                "--slo-p99", "40", "--cpu", "1.5")
    assert r.rc == 0, r.err
    assert (tmp_path / "rc" / "CAPACITY.json").read_bytes() == cli.read_bytes()
    # the Python API: the same recipe as a dict, through optkit.run
    import yaml

    import optkit

    rec = yaml.safe_load(recipe.read_text())
    rec["capacity"].update(history=str(csv), output=str(tmp_path / "api.json"), html=None)
    report = optkit.run(rec, workspace=tmp_path / "runs-api")
    assert (tmp_path / "api.json").read_bytes() == cli.read_bytes()
    # the run's report carries the section and its HTML report shows every strategy's SLO minutes
    run_dir = next((tmp_path / "runs" / "cap").iterdir())
    saved = Report.load(run_dir / "report.json")
    assert saved.capacity is not None and set(saved.capacity.strategies) == {"fixed", "reactive", "forecast"}
    assert report.capacity.chosen == saved.capacity.chosen
    page = (run_dir / "report.html").read_text()
    assert "<h2>Capacity</h2>" in page and page.count("min</text>") >= 2 * 3   # a lane per strategy, two charts
    assert "capacity.html" in page
    from test_report_html import layout

    m = layout(page, tmp_path)
    assert m["scrollWidth"] <= 1280, m["scrollWidth"]


def test_recipe_capacity_from_its_own_tune_stage(tmp_path):
    recipe = _recipe(tmp_path, {"peak": 5000, "output": "CAPACITY.json"},
                     stages=[{"pass": "tune.onnx", "config": {"objective": ["throughput"], "trials": 2,
                                                              "trial_seconds": 0.3, "confirm": 1}}])
    r = run_cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 0, r.err
    c = json.loads((tmp_path / "CAPACITY.json").read_text())
    assert "stage tune (tune.onnx)" in c["per_replica"]["source"]
    assert "lower end of the 95% band" in c["per_replica"]["throughput_source"]


@pytest.mark.parametrize("capacity, words", [
    ({"peak": 100, "output": "c.json", "headrom": 0.3}, "capacity.headrom: unknown key"),
    ({"peak": 100, "output": "c.json", "headroom": -1}, "capacity.headroom"),
    ({"output": "c.json"}, "capacity: give one of --peak RATE or --history FILE"),
    ({"history": "missing.csv", "output": "c.json"}, "capacity.history: missing.csv does not exist"),
    ({"history": "bad.csv", "output": "c.json"}, "capacity.history: "),
])
def test_recipe_capacity_typos_are_exit_2_naming_the_line(tmp_path, capacity, words):
    (tmp_path / "bad.csv").write_text("1700000000,5\n1700000060,-3\n")
    recipe = _recipe(tmp_path, capacity)
    r = run_cli("run", recipe, "--workspace", tmp_path / "runs")
    assert r.rc == 2, r.err
    line = one_error_line(r)
    assert f"{recipe}:" in line and words in line, line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("report.json"))
