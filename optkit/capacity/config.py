"""Capacity's options, declared once: `Scaling`, the HPA's own settings (the replay's rule, hpa.HPA, reads them
from here), and `CapacityConfig`, everything `optkit capacity` and a recipe's `capacity.plan` stage (or its
`capacity:` section) take. The command's flags are derived from it into cli/flagspec.py by `python -m
optkit.cli.derive`. Every number is finite, and each bound of a figure CAPACITY.json carries is that file's
reader's own (optkit/contracts/capacity.py): the command never writes a file `optkit package --capacity` refuses."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator
from pydantic import ValidationError as PydanticValidationError

from optkit.contracts import capacity as contract
from optkit.contracts.base import MAX_CORES, MAX_MIB, MAX_MS, MAX_THROUGHPUT
from optkit.core.atomic import PathRole
from optkit.core.errors import UsageError
from optkit.core.registry import PassConfig, cli, key_and_flag

MAX_LEAD_S = 86_400
MAX_SLO_MINUTES = 366 * 1440       # a year of minutes: the longest history


class Sources(PassConfig):
    """What the plan reads and writes (first in `optkit capacity --help`)."""

    output: Annotated[str, PathRole("output")] = Field(
        description="CAPACITY.json to write: replicas, requests, autoscaling, schedule and the replay (read by "
                    "`optkit package --capacity`).", json_schema_extra=cli("--output", short="-o"))
    peak: float | None = Field(default=None, gt=0, le=MAX_THROUGHPUT,
                               description="Peak request rate (requests/s), instead of a history.",
                               json_schema_extra=cli("--peak"))
    history: Annotated[str | None, PathRole("input")] = Field(
        default=None, description="Traffic history: CSV of timestamp,requests_per_s (ISO 8601 or epoch seconds) or a "
                                  "Prometheus range-query JSON; at most 64 MB, 2,000,000 rows and 366 days from its "
                                  "first to its last sample plus that sample's interval.",
        json_schema_extra=cli("--history"))
    html: Annotated[str | None, PathRole("output")] = Field(
        default=None, description="Also write an HTML page: traffic, capacity and replicas over time, SLO minutes "
                                  "marked.", json_schema_extra=cli("--html"))


class Scaling(PassConfig):
    """The HorizontalPodAutoscaler's settings the replay follows (hpa.HPA) and CAPACITY.json records."""

    min_replicas: int = Field(default=1, ge=1, le=contract.MAX_REPLICAS, description="Fewest replicas.",
                              json_schema_extra=cli("--min-replicas"))
    max_replicas: int = Field(default=100, ge=1, le=contract.MAX_REPLICAS,
                              description="Most replicas; a rate that needs more is exit 2.",
                              json_schema_extra=cli("--max-replicas"))
    startup_s: int = Field(default=60, ge=0, le=contract.MAX_WINDOW_S,
                           description="Seconds a new pod takes before it serves.", json_schema_extra=cli("--startup"))
    tolerance: float = Field(default=0.1, ge=0, lt=contract.MAX_TOLERANCE,
                             description="HPA tolerance (its default 0.1).", json_schema_extra=cli("--tolerance"))
    down_window_s: int = Field(default=300, ge=0, le=contract.MAX_WINDOW_S,
                               description="HPA scale-down stabilisation window, seconds (its default 300).",
                               json_schema_extra=cli("--scale-down-window"))

    @model_validator(mode="after")
    def _order(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"--min-replicas {self.min_replicas} is above --max-replicas {self.max_replicas}")
        return self


class CapacityConfig(Scaling, Sources):
    """`optkit capacity`'s options and a `capacity.plan` stage's config (paths in a recipe are relative to it)."""

    headroom: float = Field(default=0.2, ge=0, le=contract.MAX_HEADROOM,
                            description="Spare capacity over the load when sizing (0.2: 20%).",
                            json_schema_extra=cli("--headroom"))
    lead_s: int = Field(default=120, ge=0, le=MAX_LEAD_S, description="Seconds before a predicted surge (beyond the "
                                                                      "start-up) the schedule raises the minimum.",
                        json_schema_extra=cli("--lead"))
    max_slo_minutes: int = Field(default=0, ge=0, le=MAX_SLO_MINUTES,
                                 description="Minutes over the SLO the chosen target may allow in the replay.",
                                 json_schema_extra=cli("--max-slo-minutes"))
    slo_p99_ms: float | None = Field(default=None, gt=0, le=MAX_MS,
                                     description="Latency objective, p99 in ms (default: tune's --slo).",
                                     json_schema_extra=cli("--slo-p99"))
    cpu_cores: float | None = Field(default=None, gt=0, le=MAX_CORES,
                                    description="CPU cores a replica uses at its throughput, where the figures carry "
                                                "none (bench --url).", json_schema_extra=cli("--cpu"))
    memory_mb: float | None = Field(default=None, gt=0, le=MAX_MIB,
                                    description="Memory of one replica's container, MB (default: the model's "
                                                "measured peak).", json_schema_extra=cli("--memory-mb"))
    forecast: bool = Field(default=True, description="Forecast the history and replay its schedule "
                                                     "(--no-forecast: reactive scaling only).",
                           json_schema_extra=cli("--no-forecast", sets=False,
                                                 help="Reactive scaling only: no forecast, no schedule."))
    figures: Annotated[str | None, PathRole("input")] = Field(
        default=None, description="Per-replica figures: a tune best.json, a report.json or an optkit-package.json "
                                  "(default in a recipe: the tune stage before it, else the run's report).",
        json_schema_extra=cli(recipe_only="the command's FIGURES argument"))

    @model_validator(mode="after")
    def _traffic(self):
        if (self.peak is None) == (self.history is None):
            raise ValueError("give one of --peak RATE or --history FILE")
        return self


def build(values: dict) -> CapacityConfig:
    """The options as the command and a recipe's `capacity:` section give them; exit 2 naming the key and flag."""
    try:
        return CapacityConfig(**values)
    except PydanticValidationError as e:
        err = e.errors(include_url=False)[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        raise UsageError(f"{key_and_flag(CapacityConfig, key) + ': ' if key else ''}"
                         f"{err['msg'].removeprefix('Value error, ')}") from None
