"""`optkit capacity`'s options, declared once (as PackageConfig is): the command's flags are derived from it into
cli/flagspec.py CAPACITY by `python -m optkit.cli.derive`, and a recipe's `capacity:` section can read the same
model. Every number is finite, and each bound of a figure CAPACITY.json carries is that file's reader's own
(optkit/contracts/capacity.py): the command never writes a file `optkit package --capacity` refuses."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from optkit.contracts import capacity as contract
from optkit.contracts.base import MAX_CORES, MAX_MIB, MAX_MS, MAX_THROUGHPUT
from optkit.core.errors import UsageError
from optkit.core.registry import cli, key_and_flag

MAX_LEAD_S = 86_400
MAX_SLO_MINUTES = 366 * 1440       # a year of minutes: the longest history


class CapacityConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    output: str = Field(description="CAPACITY.json to write: replicas, requests, autoscaling, schedule and the "
                                    "replay (read by `optkit package --capacity`).",
                        json_schema_extra=cli("--output", short="-o"))
    peak: float | None = Field(default=None, gt=0, le=MAX_THROUGHPUT,
                               description="Peak request rate (requests/s), instead of a history.",
                               json_schema_extra=cli("--peak"))
    history: str | None = Field(default=None, description="Traffic history: CSV of timestamp,requests_per_s (ISO "
                                                          "8601 or epoch seconds) or a Prometheus range-query JSON; "
                                                          "at most 64 MB, 2,000,000 rows and 366 days from its first "
                                                          "to its last sample plus that sample's interval.",
                                json_schema_extra=cli("--history"))
    html: str | None = Field(default=None, description="Also write an HTML page: traffic, capacity and replicas "
                                                       "over time, SLO minutes marked.",
                             json_schema_extra=cli("--html"))
    headroom: float = Field(default=0.2, ge=0, le=contract.MAX_HEADROOM,
                            description="Spare capacity over the load when sizing (0.2: 20%).",
                            json_schema_extra=cli("--headroom"))
    min_replicas: int = Field(default=1, ge=1, le=contract.MAX_REPLICAS, description="Fewest replicas.",
                              json_schema_extra=cli("--min-replicas"))
    max_replicas: int = Field(default=100, ge=1, le=contract.MAX_REPLICAS,
                              description="Most replicas; a rate that needs more is exit 2.",
                              json_schema_extra=cli("--max-replicas"))
    startup_s: int = Field(default=60, ge=0, le=contract.MAX_WINDOW_S,
                           description="Seconds a new pod takes before it serves.", json_schema_extra=cli("--startup"))
    lead_s: int = Field(default=120, ge=0, le=MAX_LEAD_S, description="Seconds before a predicted surge (beyond the "
                                                                      "start-up) the schedule raises the minimum.",
                        json_schema_extra=cli("--lead"))
    max_slo_minutes: int = Field(default=0, ge=0, le=MAX_SLO_MINUTES,
                                 description="Minutes over the SLO the chosen target may allow in the replay.",
                                 json_schema_extra=cli("--max-slo-minutes"))
    tolerance: float = Field(default=0.1, ge=0, lt=contract.MAX_TOLERANCE,
                             description="HPA tolerance (its default 0.1).", json_schema_extra=cli("--tolerance"))
    down_window_s: int = Field(default=300, ge=0, le=contract.MAX_WINDOW_S,
                               description="HPA scale-down stabilisation window, seconds (its default 300).",
                               json_schema_extra=cli("--scale-down-window"))
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


def build(values: dict) -> CapacityConfig:
    try:
        cfg = CapacityConfig(**values)
    except PydanticValidationError as e:
        err = e.errors(include_url=False)[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        raise UsageError(f"{key_and_flag(CapacityConfig, key) if key else 'capacity'}: "
                         f"{err['msg'].removeprefix('Value error, ')}") from None
    if (cfg.peak is None) == (cfg.history is None):
        raise UsageError("give one of --peak RATE or --history FILE")
    if cfg.min_replicas > cfg.max_replicas:
        raise UsageError(f"--min-replicas {cfg.min_replicas} is above --max-replicas {cfg.max_replicas}")
    return cfg


class RecipeCapacity(CapacityConfig):
    """A recipe's `capacity:` section: `optkit capacity`'s options (paths relative to the recipe), and the
    per-replica figures: a file as the command takes, or by default this run's own tune stage (its best
    setting), else this run's report (its last stage timed with a throughput: measure.concurrency)."""
    figures: str | None = Field(default=None, description="Per-replica figures: a best.json, a report.json or an "
                                                          "optkit-package.json (default: this run's tune stage, "
                                                          "else its report).")
