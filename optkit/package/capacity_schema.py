"""CAPACITY.json as `optkit package --capacity` reads it: the per-replica figures, replicas, resources and autoscaling
`optkit capacity` wrote, turned into each manifest's own fields (package/manifests.py).

It is user input like every file optkit reads back (anyone may have edited it): strict types, finite numbers,
bounds, min <= max, requests <= limits, cron expressions of five plain fields. The keys package copies into a
manifest (resources, schedule windows) take nothing else; the sections it reads figures from (per_replica, replicas,
autoscaling, slo, replay) may carry more figures of `optkit capacity`'s own (replicas.fixed_for_peak,
autoscaling.strategy, per_replica.request_bytes...), each a finite number or plain value. A bad one is exit 2, one line
naming the file and the key, before anything is written. The contract (schema 1):

    {"schema": 1, "model": str|null, "slo": {"p99_ms": float|null},
     "per_replica": {"throughput_per_s", "throughput_source", "p99_ms", "cpu_cores", "cpu_per_1000_samples_s",
                     "memory_mb", "source"},
     "headroom": float, "replicas": {"min", "max", "peak"},
     "resources": {"requests": {"cpu": "<n>m", "memory": "<n>Mi"}, "limits": {...}},
     "autoscaling": {"metric": "cpu"|"rps", "target_utilization", "target_rps_per_replica", "tolerance",
                     "scale_down_stabilization_s", "scale_up_stabilization_s", "startup_s"},
     "schedule": [{"start": "<cron>", "end": "<cron>", "desired_replicas": int, "timezone": "UTC"}],
     "replay": {...}}
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from optkit.core.errors import UsageError
from optkit.package import schemas
from optkit.package.schemas import MAX_MIB, MiB, Ms, Open, Strict

MAX_REPLICAS = 10_000              # far past any one model's fleet; KEDA and the HPA take int32
MAX_MILLICORES = 1_024_000         # 1,024 cores
MAX_WINDOW_S = 3600                # the HPA's own bound on a stabilization window
HINT = "give the CAPACITY.json `optkit capacity` wrote, unedited"

Replicas = Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
Text = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]{0,512}$")]
CPU = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,9}m$")]
Memory = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,9}Mi$")]
# a cron field: digits, names (MON, JAN), * / , - and ?; five of them, space-separated (KEDA's cron scaler)
CRON_RE = re.compile(r"^[0-9A-Za-z*/,?-]{1,64}( [0-9A-Za-z*/,?-]{1,64}){4}$")
TZ_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_+-]{0,30}(/[A-Za-z0-9_+-]{1,30}){0,2}$")


class Slo(Open):
    p99_ms: Annotated[float, Field(gt=0, le=schemas.MAX_MS)] | None = None


class PerReplica(Open):
    throughput_per_s: Annotated[float, Field(gt=0, le=1e9)]
    throughput_source: Text
    p99_ms: Ms | None = None
    cpu_cores: Annotated[float, Field(gt=0, le=1024)] | None = None
    cpu_per_1000_samples_s: Annotated[float, Field(ge=0, le=1e9)] | None = None
    memory_mb: MiB | None = None
    source: Text


class ReplicaCounts(Open):
    min: Replicas
    max: Replicas
    peak: Replicas

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
            raise ValueError(f"{v} is over {MAX_MILLICORES}m (1,024 cores)")
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
    target_rps_per_replica: Annotated[float, Field(gt=0, le=1e9)]
    tolerance: Annotated[float, Field(ge=0, lt=1)] = 0.1
    scale_down_stabilization_s: Annotated[int, Field(ge=0, le=MAX_WINDOW_S)]
    scale_up_stabilization_s: Annotated[int, Field(ge=0, le=MAX_WINDOW_S)]
    startup_s: Annotated[int, Field(ge=0, le=86_400)]


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

    schema_: Literal[1] = Field(alias="schema")
    model: Text | None = None
    slo: Slo = Field(default_factory=Slo)
    per_replica: PerReplica
    headroom: Annotated[float, Field(ge=0, le=10)]
    replicas: ReplicaCounts
    resources: Resources = Field(default_factory=Resources)
    autoscaling: Autoscaling
    schedule: Annotated[list[Window], Field(max_length=1000)] = Field(default_factory=list)
    replay: dict[str, Any] = Field(default_factory=dict)

    @field_validator("replay")
    @classmethod
    def _finite_replay(cls, v):
        schemas._finite(v, "replay")
        return v

    @model_validator(mode="after")
    def _schedule_within_max(self):
        for i, w in enumerate(self.schedule):
            if w.desired_replicas > self.replicas.max:
                raise ValueError(f"schedule.{i}.desired_replicas {w.desired_replicas} is above replicas.max "
                                 f"{self.replicas.max}")
        return self


def load(path: str | Path) -> CapacityFile:
    """The validated CAPACITY.json (a file the user named: a link to it is read); exit 2 naming file and key."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise UsageError(f"--capacity {path} does not exist; write it with `optkit capacity ... -o {p.name}`")
    return schemas.load(p, CapacityFile, HINT, links=True)[1]  # type: ignore[return-value]
