"""CAPACITY.json: what `optkit capacity` worked out (per-replica figures, replicas, resources, autoscaling, the
forecast's schedule, the replay) for one model, written by capacity/plan.py and read by `optkit package
--capacity` into each manifest's own fields (package/manifests.py).

Schema 2 records the sha256 of the model the figures were measured on (`model_sha256`; null only for a served
model, `bench --url`, whose `model` is its URL): package refuses another model's file. Schema 1 (before it did)
is refused with the command that writes it again.

It is user input like every file optkit reads back: strict types, finite numbers, bounds, min <= max, requests <=
limits, cron expressions of five plain fields. The bounds are the capacity command's flags' own (`--slo-p99`,
`--headroom`, `--tolerance`, `--min/--max-replicas`, windows, `--cpu`, `--memory-mb`: capacity/config.py
declares them from here), so the command never writes a file package refuses. The sections package reads figures
from keep other keys of `optkit capacity`'s own, each a finite number or plain value.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from optkit.contracts.base import (
    MAX_CORES,
    MAX_MIB,
    MAX_MS,
    MAX_THROUGHPUT,
    MiB,
    Ms,
    Open,
    Sha256,
    Strict,
    Text,
    finite,
)

SCHEMA = 2
HINT = "give the CAPACITY.json `optkit capacity` wrote, unedited"
FIX = "write it for this model: optkit capacity FIGURES (a tune best.json, report or lineage of this model) -o FILE"

# the bounds of `optkit capacity`'s flags, which are this file's
MAX_REPLICAS = 10_000              # far past any one model's fleet; KEDA and the HPA take int32
MAX_MILLICORES = int(MAX_CORES * 1000)
MAX_WINDOW_S = 3600                # the HPA's own bound on a stabilization window; a pod's start-up too
MAX_HEADROOM = 4.0                 # spare capacity over the load: 400%
MAX_TOLERANCE = 1.0                # the HPA tolerance, below 1 (exclusive)

Replicas = Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
CPU = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,9}m$")]
Memory = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,9}Mi$")]
SloMs = Annotated[float, Field(gt=0, le=MAX_MS)]
# a cron field: digits, names (MON, JAN), * / , - and ?; five of them, space-separated (KEDA's cron scaler)
CRON_RE = re.compile(r"^[0-9A-Za-z*/,?-]{1,64}( [0-9A-Za-z*/,?-]{1,64}){4}$")
TZ_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_+-]{0,30}(/[A-Za-z0-9_+-]{1,30}){0,2}$")
URL_RE = re.compile(r"^https?://")


class Slo(Open):
    p99_ms: SloMs | None = None


class PerReplica(Open):
    throughput_per_s: Annotated[float, Field(gt=0, le=MAX_THROUGHPUT)]
    throughput_source: Text
    p99_ms: Ms | None = None
    cpu_cores: Annotated[float, Field(gt=0, le=MAX_CORES)] | None = None
    cpu_per_1000_samples_s: Annotated[float, Field(ge=0, le=1e9)] | None = None
    memory_mb: MiB | None = None
    source: Text
    cpu_source: Text | None = None
    memory_source: Text | None = None
    request_bytes: Annotated[int, Field(ge=0)] | None = None


class ReplicaCounts(Open):
    min: Replicas
    max: Replicas
    peak: Replicas
    needed_at_peak: Annotated[int, Field(ge=0)] | None = None
    fixed_for_peak: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _order(self):
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class Quantities(Strict):
    cpu: CPU | None = None
    memory: Memory | None = None

    @field_validator("cpu")
    @classmethod
    def _cores(cls, v):
        if v is not None and int(v[:-1]) > MAX_MILLICORES:
            raise ValueError(f"{v} is over {MAX_MILLICORES}m ({MAX_CORES:,} cores)")
        return v

    @field_validator("memory")
    @classmethod
    def _mib(cls, v):
        if v is not None and int(v[:-2]) > MAX_MIB:
            raise ValueError(f"{v} is over {int(MAX_MIB)}Mi (16 TiB)")
        return v


class Resources(Strict):
    requests: Quantities = Field(default_factory=Quantities)
    limits: Quantities = Field(default_factory=Quantities)

    @model_validator(mode="after")
    def _requests_within_limits(self):
        for key, unit in (("cpu", "m"), ("memory", "Mi")):
            req, lim = getattr(self.requests, key), getattr(self.limits, key)
            if req and lim and int(req[:-len(unit)]) > int(lim[:-len(unit)]):
                raise ValueError(f"requests.{key} {req} is above limits.{key} {lim} (Kubernetes refuses it)")
        return self


class Autoscaling(Open):
    metric: Literal["cpu", "rps"]
    target_utilization: Annotated[float, Field(gt=0, le=1)]
    target_rps_per_replica: Annotated[float, Field(gt=0, le=MAX_THROUGHPUT)]
    tolerance: Annotated[float, Field(ge=0, lt=MAX_TOLERANCE)] = 0.1
    scale_down_stabilization_s: Annotated[int, Field(ge=0, le=MAX_WINDOW_S)]
    scale_up_stabilization_s: Annotated[int, Field(ge=0, le=MAX_WINDOW_S)]
    startup_s: Annotated[int, Field(ge=0, le=MAX_WINDOW_S)]
    strategy: Literal["reactive", "forecast"] | None = None


class Window(Strict):
    start: str
    end: str
    desired_replicas: Replicas
    timezone: str = "UTC"

    @field_validator("start", "end")
    @classmethod
    def _cron(cls, v):
        if not CRON_RE.match(v):
            raise ValueError("not a cron expression of five fields (minute hour day month weekday)")
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v):
        if not TZ_RE.match(v):
            raise ValueError("not an IANA time zone name (UTC, Europe/Berlin)")
        return v


class CapacityFile(Open):
    """The sections package reads, strict; other top-level keys (and replay) are kept with finite numbers."""

    schema_: Literal[2] = Field(alias="schema")
    model: Text | None = None
    model_sha256: Sha256 | None
    slo: Slo = Field(default_factory=Slo)
    per_replica: PerReplica
    headroom: Annotated[float, Field(ge=0, le=MAX_HEADROOM)]
    replicas: ReplicaCounts
    resources: Resources = Field(default_factory=Resources)
    autoscaling: Autoscaling
    schedule: Annotated[list[Window], Field(max_length=1000)] = Field(default_factory=list)
    replay: dict[str, Any] = Field(default_factory=dict)
    notes: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list)

    @field_validator("schema_", mode="before")
    @classmethod
    def _schema(cls, v):
        if v == 1:
            raise ValueError("schema 1 is a CAPACITY.json written before it recorded its model's sha256; write it "
                             "again with `optkit capacity`")
        return v

    @field_validator("replay")
    @classmethod
    def _finite_replay(cls, v):
        finite(v, "replay")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.model_sha256 is None and not URL_RE.match(self.model or ""):
            raise ValueError("key model_sha256: null, but the figures are not of a served model (model is not a URL); "
                             "write it again with `optkit capacity`")
        for i, w in enumerate(self.schedule):
            if w.desired_replicas > self.replicas.max:
                raise ValueError(f"key schedule.{i}.desired_replicas {w.desired_replicas} is above replicas.max "
                                 f"{self.replicas.max}")
        return self
