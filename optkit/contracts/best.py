"""best.json: `optkit tune -o`'s result for one model (its sha256), read by `optkit package --tuned` and
`optkit capacity`. The tune command writes `document(...)`; a recipe hands the same object over without a file
between (`of_result`). Tune's other keys (ties, trials, the study...) are kept, each number finite.

A service-level objective (`p99<=20ms`, `throughput>=200`) is read here, once, for tune's --slo and for every
reader of the file: its limit is bounded as its readers bound the figure (MAX_MS, MAX_THROUGHPUT).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from optkit.contracts.base import MAX_MS, MAX_THROUGHPUT, Label, MiB, Ms, Open, Sha256, Strict, build, load, validate
from optkit.core.artifact import Artifact

HINT = "give the JSON `optkit tune -o` wrote, unedited"

# ------------------------------------------------------------------ service-level objectives

SLO_FIGURES = {"p50": "p50_ms", "p90": "p90_ms", "p99": "p99_ms", "throughput": "throughput_per_s"}
_SLO_RE = re.compile(r"^\s*(p50|p90|p99|throughput)\s*(<=|<|>=|>)\s*(\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+)\s*"
                     r"(ms|s|us|/s)?\s*$", re.I)


def parse_slo(text: str) -> tuple[str, str, float]:
    """'p99<=20ms' -> ("p99", "<=", 20.0): the figure, the comparison and the limit in ms (latency) or samples/s;
    ValueError with what is wrong otherwise."""
    m = _SLO_RE.match(text)
    if not m:
        raise ValueError(f"cannot read SLO {text!r}; write it as p50|p90|p99<=MILLISECONDS ms or "
                         "throughput>=SAMPLES/s, e.g. 'p99<=20ms'")
    what, op, value, unit = m[1].lower(), m[2], float(m[3]), (m[4] or "").lower()
    if (what == "throughput") != (unit in ("", "/s")) and unit:
        raise ValueError(f"SLO {text!r}: {what} is in " + ("samples/s" if what == "throughput" else "ms, s or us"))
    if what == "throughput" and op in ("<", "<=") or what != "throughput" and op in (">", ">="):
        raise ValueError(f"SLO {text!r} asks for {'less throughput' if what == 'throughput' else 'more latency'}; "
                         "write p99<=X ms or throughput>=Y")
    limit = value * {"s": 1e3, "us": 1e-3}.get(unit, 1.0)
    most, unit_name = (MAX_THROUGHPUT, "samples/s") if what == "throughput" else (MAX_MS, "ms")
    if not math.isfinite(limit) or limit <= 0 or limit > most:
        raise ValueError(f"SLO {text!r}: the limit must be a finite positive number of at most {most:g} {unit_name}")
    return what, op, limit


def slo_p99_ms(slos: list[str]) -> float | None:
    """The p99 limit in ms of the first `p99<=...` SLO, or None."""
    for s in slos:
        what, op, limit = parse_slo(s)
        if what == "p99":
            return limit
    return None


# ------------------------------------------------------------------ the file

class SessionSetting(Strict):
    """onnxruntime session options, as optkit.onnx.session.OrtSettings (what tune searches)."""

    inter_op_threads: Annotated[int, Field(ge=1, le=256)] | None = None
    execution_mode: Literal["sequential", "parallel"] | None = None
    graph_optimization: Literal["disable", "basic", "extended", "all"] | None = None
    cpu_mem_arena: bool | None = None
    mem_pattern: bool | None = None


class TunedSetting(Strict):
    """A serving setting, as optkit.measure.serving.Setting (what tune writes under best.setting)."""

    runtime: Literal["onnxruntime", "openvino"] = "onnxruntime"
    provider: Literal["cpu", "cuda", "tensorrt"] = "cpu"
    threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    batch: Annotated[int, Field(ge=1, le=65536)] = 1
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 1
    sessions: Literal["shared", "per-thread"] = "shared"
    session: SessionSetting = Field(default_factory=SessionSetting)

    @model_validator(mode="after")
    def _openvino_on_the_cpu(self):
        if self.runtime == "openvino" and self.provider != "cpu":  # tune never measures that: it runs on the CPU
            raise ValueError(f"runtime openvino runs on provider cpu, not {self.provider}")
        return self


class TunedFigures(Open):
    """A setting's measured figures; memory_mb (peak RSS) sizes the manifests' memory request."""

    memory_mb: MiB | None = None
    load_mb: MiB | None = None
    p50_ms: Ms | None = None
    p90_ms: Ms | None = None
    p99_ms: Ms | None = None
    throughput_per_s: Annotated[float, Field(ge=0, le=MAX_THROUGHPUT)] | None = None


class Confirmed(Strict):
    figure: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.]{1,64}$")]
    mean: float
    ci95: Annotated[list[float], Field(min_length=2, max_length=2)]
    rounds: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    values: Annotated[list[float], Field(max_length=1000)] | None = None   # each round's figure

    @model_validator(mode="after")
    def _band(self):
        if self.ci95[0] > self.ci95[1]:
            raise ValueError(f"ci95: its low end {self.ci95[0]} is above its high end {self.ci95[1]}")
        return self


class Best(Strict):
    setting: TunedSetting
    label: Label = ""
    figures: TunedFigures = Field(default_factory=TunedFigures)
    trial: Annotated[int, Field(ge=0)] | None = None
    confirmed: Confirmed | None = None
    confirmed_by: Any = None


class BestFile(Open):
    """best.json: the model it was tuned for (path as given, and its sha256) and the best setting. An older file
    has no model_sha256 (package checks its model by path then)."""

    model: str | None = None
    model_sha256: Sha256 | None = None
    objective: list[Literal["throughput", "latency", "cost"]] = Field(default_factory=list)
    slo: list[str] = Field(default_factory=list)
    best: Best

    @field_validator("slo")
    @classmethod
    def _slo(cls, v: list[str]) -> list[str]:
        for s in v:
            parse_slo(s)
        return v


def document(model: str, model_sha256: str, result: dict) -> BestFile:
    """best.json for `model` from tune's result (its `trials` left out): exit 3 if a reader would refuse it."""
    return build(BestFile, {"model": model, "model_sha256": model_sha256,
                            **{k: v for k, v in result.items() if k != "trials"}}, "best.json")


def of_result(result: dict, model: str, model_sha256: str, where: str) -> tuple[dict, BestFile]:
    """A recipe's tune stage result (its `measurements.tune`, the object best.json holds) as the file's reader
    sees it, without a file between; exit 2 naming `where` and the key."""
    data = {"model": model, "model_sha256": model_sha256, **{k: v for k, v in result.items() if k != "trials"}}
    return data, validate(data, BestFile, where, "run the recipe's tune stage again")


def read(path: str | Path) -> dict:
    """best.json (a file the user named: a link to it is read) through its model; exit 2 naming file and key."""
    return load(Path(path), BestFile, HINT, links=True)[0]


def recorded_sha256(data: dict) -> str | None:
    """The sha256 of the model best.json was tuned for: its model_sha256, or for an older file (which names its
    model by path only) that file's, where it is here to check."""
    sha = data.get("model_sha256")
    if sha is None:
        named = data.get("model")
        try:
            sha = Artifact.load(named).sha256 if named and Path(named).exists() else None
        except Exception:  # noqa: BLE001 - an unreadable model names nothing
            sha = None
    return sha
