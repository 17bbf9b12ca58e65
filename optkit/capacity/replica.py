"""The figures of one replica: what it serves at the latency objective, its CPU and its memory, read from a tune
best.json, a report (`bench --concurrency` or `bench --url`) or a package version's lineage. Every file goes
through its contract or schema (exit 2 naming the file and key); a lineage is read in its version folder, whose
files must be the ones it records. The throughput used is the LOWER end of its 95% band where the file carries
one, and `throughput_source` says which figure it is: a figure carries its noise. `model_sha256` is the model
the figures are for (CAPACITY.json records it; None only for a served model)."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optkit.contracts import base, lineage
from optkit.contracts import best as best_contract
from optkit.contracts.base import MAX_CORES, MAX_MS, MAX_THROUGHPUT
from optkit.core.errors import UsageError
from optkit.report.schema import Report

MAX_FILE = base.MAX_FILE_BYTES
SHA256_RE = re.compile(r"[0-9a-f]{64}")


@dataclass
class PerReplica:
    throughput_per_s: float            # what the plan uses: the low end of the band where there is one
    throughput_source: str
    p99_ms: float | None = None
    cpu_cores: float | None = None     # CPU a replica uses at that throughput (cpu per 1,000 samples x rate)
    cpu_per_1000_samples_s: float | None = None
    memory_mb: float | None = None
    source: str = ""
    model: str | None = None
    model_sha256: str | None = None    # the model the figures are for (None: a served model, bench --url)
    slo_p99_ms: float | None = None    # the objective the figures were measured against, where the file says
    threads: int | None = None
    request_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_contract(self) -> dict[str, Any]:
        keys = ("throughput_per_s", "throughput_source", "p99_ms", "cpu_cores", "cpu_per_1000_samples_s",
                "memory_mb", "source")
        d = asdict(self)
        out = {k: d[k] for k in keys}
        out["request_bytes"] = self.request_bytes
        return out


def _finite(value, where: str, key: str, *, positive: bool = False, most: float | None = None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (positive and value == 0):
        raise UsageError(f"{where}: key {key} is {str(value)[:40]}, not a {'positive' if positive else 'non-negative'} "
                         "finite number; give the file optkit wrote, unedited")
    if most is not None and value > most:
        raise UsageError(f"{where}: key {key} is {value:g}, over {most:g}: not one replica's figure; give the file "
                         "optkit wrote, unedited")
    return float(value)


def _band(where: str, key: str, band, point: float) -> float | None:
    """The lower end of a 95% band [low, high] of `point`; a band reversed, or whose low end is over twice the
    figure it is the band of, is forged (the figure itself may sit outside: a band of trials vs the whole run)."""
    if not isinstance(band, (list, tuple)) or len(band) != 2:
        return None
    b0 = band[0]
    if isinstance(b0, (int, float)) and not isinstance(b0, bool) and math.isfinite(b0) and b0 < 0:
        b0 = 0.0   # a normal interval of a noisy rate crosses zero: it reaches 0/s (older tune files wrote it so)
    low = _finite(b0, where, f"{key}.0", most=MAX_THROUGHPUT)
    high = _finite(band[1], where, f"{key}.1", most=MAX_THROUGHPUT * 10)   # None: unbounded above (noisy)
    if low is None:
        return None
    if (high is not None and low > high) or low > 2 * point:
        raise UsageError(f"{where}: key {key} is [{low:g}, {high:g}], not a band of its figure {point:g}; "
                         "give the file optkit wrote, unedited")
    return low


def _cores(cpu_1k: float | None, thr: float, where: str, key: str) -> float | None:
    if cpu_1k is None:
        return None
    cores = cpu_1k * thr / 1000
    if cores > MAX_CORES:
        raise UsageError(f"{where}: key {key} {cpu_1k:g} CPU s per 1,000 samples at {thr:,.1f}/s is {cores:,.4g} "
                         f"cores, over {MAX_CORES}: not one replica's; give the file optkit wrote, unedited")
    return cores


def load(path: str | Path) -> PerReplica:
    """The per-replica figures from FILE: best.json (optkit tune -o), a report.json, optkit-package.json or a
    package version folder holding it."""
    p = Path(path)
    if p.is_dir() and (p / lineage.FILE).is_file():
        p = p / lineage.FILE
    if not p.exists():
        raise UsageError(f"{path} does not exist; give a tune best.json, a bench report.json or a package's "
                         f"{lineage.FILE}")
    hint = f"give a best.json, a report.json or an {lineage.FILE}"
    doc = base.parse(base.read_bytes(p, MAX_FILE, links=True, hint=hint), p, hint)
    if isinstance(doc, dict) and doc.get("schema") == "optkit-package/1":
        return _from_lineage(p)
    if isinstance(doc, dict) and "stages" in doc and "schema_version" in doc:
        return _from_report(p)
    if isinstance(doc, dict) and "best" in doc:
        return _from_best(p)
    raise UsageError(f"{p} is none of a tune best.json (key best), a report.json (key stages) or an "
                     f"{lineage.FILE} (schema optkit-package/1)")


def _slo_p99(slos: list, where: str = "") -> float | None:
    """'p99<=20ms' (tune's --slo, bounded by best.json's contract) as 20.0."""
    try:
        return best_contract.slo_p99_ms(list(slos or []))
    except ValueError as e:
        raise UsageError(f"{where}: key slo: {e}; give the file optkit wrote, unedited (or --slo-p99 MS)") from None


def _tuned(figures: dict, confirmed: dict | None, setting: dict, where: str, source: str) -> PerReplica:
    thr = _finite(figures.get("throughput_per_s"), where, "best.figures.throughput_per_s", positive=True,
                  most=MAX_THROUGHPUT)
    if thr is None:
        raise UsageError(f"{where}: key best.figures.throughput_per_s is missing; tune with --objective "
                         "throughput so the best setting has a throughput at the objective")
    if confirmed and confirmed.get("figure") == "throughput_per_s":
        mean = _finite(confirmed.get("mean"), where, "best.confirmed.mean", positive=True, most=MAX_THROUGHPUT)
        low = _band(where, "best.confirmed.ci95", confirmed.get("ci95"), mean)
        rounds = confirmed.get("rounds")
        if low:
            used = low
            text = (f"lower end of the 95% band of tune's confirmation ({rounds or '?'} rounds): {used:,.1f}/s "
                    f"(mean {mean:,.1f}/s)")
        else:
            used = thr
            text = (f"tune's best trial: {thr:,.1f}/s; the 95% band of its confirmation reaches 0/s (too noisy to "
                    "size on): the point figure is used; confirm with more rounds (tune --confirm)")
    else:
        used = thr
        text = (f"tune's best trial: {thr:,.1f}/s; no 95% band (tune --confirm 0, or the objective was not "
                "throughput): the point figure is used, its noise unknown")
    cpu_1k = _finite(figures.get("cpu_s_per_1k"), where, "best.figures.cpu_s_per_1k")
    mem = _finite(figures.get("memory_mb"), where, "best.figures.memory_mb", most=2 ** 24)
    return PerReplica(throughput_per_s=used, throughput_source=text,
                      p99_ms=_finite(figures.get("p99_ms"), where, "best.figures.p99_ms", most=MAX_MS),
                      cpu_per_1000_samples_s=cpu_1k, cpu_cores=_cores(cpu_1k, used, where, "best.figures.cpu_s_per_1k"),
                      memory_mb=mem, source=source, threads=setting.get("threads"))


def _from_best(p: Path) -> PerReplica:
    data = best_contract.read(p)
    r = _from_tuned(data, str(p), f"tune best.json {p.name}")
    r.model_sha256 = best_contract.recorded_sha256(data)
    if r.model_sha256 is None:
        raise UsageError(f"{p}: key model_sha256: missing, and its model {data.get('model')!r} is not here to check: "
                         "the figures cannot be tied to their model; tune the model again with `optkit tune`")
    return r


def _from_tuned(data: dict, where: str, what: str) -> PerReplica:
    best = data["best"]
    r = _tuned(best.get("figures") or {}, best.get("confirmed"), best["setting"], where,
               f"{what} (setting: {best.get('label') or 'unlabelled'})")
    r.model, r.slo_p99_ms = data.get("model"), _slo_p99(data.get("slo"), where)
    return r


def from_tune_result(result: dict, where: str, model: str, model_sha256: str) -> PerReplica:
    """A recipe's tune stage result (its `measurements.tune`: the object tune writes to best.json) for `model`,
    checked by best.json's contract, without a file between."""
    data, _ = best_contract.of_result(result, model, model_sha256, where)
    r = _from_tuned(data, where, where)
    r.model_sha256 = model_sha256
    return r


def _from_lineage(p: Path) -> PerReplica:
    data, _ = lineage.read(p)
    folder = p.parent
    if folder.name.isdigit() and int(folder.name) != data["version"]:
        raise UsageError(f"{p}: key version: {data['version']}, not this folder's ({folder.name}): the lineage of "
                         f"another version; {lineage.HINT}")
    # the figures are of the model beside the lineage, as it records it
    lineage.verify_files(folder, data, "a lineage is read in the version folder it describes: give REPO/NAME/N")
    tuned = data["tuned"]
    if tuned.get("source") is None:
        raise UsageError(f"{p}: the package was made without --tuned (key tuned.source is null): it carries no "
                         "measured throughput; tune the model, or give a bench report")
    r = _tuned(tuned.get("figures") or {}, tuned.get("confirmed"), tuned["setting"], str(p),
               f"package lineage {p} (version {data['version']} of {data['name']}, tuned: {tuned['label']})")
    peak = ((data.get("measured") or {}).get("memory") or {}).get("peak_mb")
    if r.memory_mb is None and peak is not None:
        r.memory_mb = _finite(peak, str(p), "measured.memory.peak_mb")
    r.model, r.model_sha256 = data["model"]["path"], data["model"]["sha256"]
    return r


def _from_report(p: Path) -> PerReplica:
    return from_report(Report.load(p), str(p), p.name)


def from_report(rep: Report, where: str, name: str | None = None) -> PerReplica:
    """The figures of a report (a file read through Report.load)."""
    return from_stages(rep.stages, rep.command, where, name)


def from_stages(all_stages: list, command: str, where: str, name: str | None = None) -> PerReplica:
    """The figures of a report's stages (a file's, or a run's own stages so far, in memory): its last stage timed
    with a throughput."""
    p = where
    name = name or where
    stages = [s for s in all_stages if isinstance(s.measurements, dict)
              and any(isinstance(s.measurements.get(g), dict) and s.measurements[g].get("throughput_per_s") is not None
                      for g in ("concurrency", "latency"))]
    if not stages:
        raise UsageError(f"{p}: no stage has a throughput (measurements.concurrency or measurements.latency); "
                         "give the report of `optkit bench --url URL --concurrency N --report FILE` (a recipe: "
                         "a tune stage, measure.concurrency, or capacity.figures)")
    stage = stages[-1]
    m = stage.measurements
    group = "concurrency" if isinstance(m.get("concurrency"), dict) \
        and m["concurrency"].get("throughput_per_s") is not None else "latency"
    g = m[group]
    key = f"stages.{all_stages.index(stage)}.measurements.{group}"
    thr = _finite(g.get("throughput_per_s"), str(p), f"{key}.throughput_per_s", positive=True, most=MAX_THROUGHPUT)
    band = (g.get("ci95") or {}).get("throughput_per_s") if isinstance(g.get("ci95"), dict) else None
    low = _band(str(p), f"{key}.ci95.throughput_per_s", band, thr) if band is not None else None
    load_text = (f"under load, {g.get('concurrency')} requests in flight" if group == "concurrency"
                 else "one request at a time (no --concurrency: the throughput under load was not measured)")
    if low is not None and low > 0:
        used, text = low, (f"lower end of the 95% band of {stage.name!r}'s throughput {load_text}: {low:,.1f}/s "
                           f"(measured {thr:,.1f}/s)")
    elif low is not None:
        used, text = thr, (f"{stage.name!r}'s throughput {load_text}: {thr:,.1f}/s; its 95% band reaches 0/s (too "
                           "noisy to size on): the measured figure is used; measure longer (bench --duration)")
    else:
        used, text = thr, f"{stage.name!r}'s throughput {load_text}: {thr:,.1f}/s; no 95% band in the report"
    mem = m.get("memory") if isinstance(m.get("memory"), dict) else {}
    req = m.get("request") if isinstance(m.get("request"), dict) else {}
    served = isinstance(m.get("served"), dict)
    r = PerReplica(throughput_per_s=used, throughput_source=text,
                   p99_ms=_finite(g.get("p99_ms"), str(p), f"{key}.p99_ms", most=MAX_MS),
                   memory_mb=_finite(mem.get("peak_mb"), str(p), "measurements.memory.peak_mb", most=2 ** 24),
                   source=f"{'bench --url' if served else command or 'report'} report {name} "
                          f"(stage {stage.name!r})",
                   model=stage.output.path if stage.output else None,
                   model_sha256=stage.output.sha256 if SHA256_RE.fullmatch(stage.output.sha256) else None)
    if r.model_sha256 is None and not served:
        raise UsageError(f"{p}: key {key.rsplit('.measurements', 1)[0]}.output.sha256: not a sha256, so the figures "
                         "cannot be tied to their model; give the report optkit wrote")
    if req.get("body_bytes") is not None:
        r.request_bytes = int(_finite(req.get("body_bytes"), str(p), "measurements.request.body_bytes"))
    if served:
        r.notes.append("served figures (bench --url): the server's CPU and memory are not in the report; give "
                       "--cpu and --memory-mb for the requests, or the autoscaling metric is requests per second")
    return r
