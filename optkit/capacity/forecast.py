"""A seasonal forecast of the traffic and the schedule it gives: statsmodels' Holt-Winters (ExponentialSmoothing,
additive season: daily, or weekly once the fit has two weeks) fitted on the history's first whole days and
predicting the rest, on 15-minute buckets (each the bucket's highest minute: a surge is what matters). The
prediction, per slot of the season, sets a floor of replicas (with the headroom), raised ahead of each predicted
surge by the start-up time plus a lead; the floor is written as KEDA cron-scaler entries (start, end,
desiredReplicas, UTC) and replayed with the HPA on the held-out part, which the model never saw."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np

from optkit.core.errors import DependencyError

BUCKET_MIN = 15
DAY_MIN, WEEK_MIN = 1440, 10080
MIN_FIT_DAYS = 2
MAX_ENTRIES = 48


@dataclass
class Forecast:
    split: int                       # the first minute of the held-out part
    predicted: np.ndarray            # per minute of the held-out part: the predicted bucket rate
    floor: np.ndarray                # per minute of the held-out part: the schedule's desired replicas
    schedule: list[dict]
    method: str
    error_pct: float                 # weighted absolute error of the buckets, % of the actual
    notes: list[str] = field(default_factory=list)


def split_of(minutes: int, start: int) -> int | None:
    """The minute the held-out part starts: after the first two thirds of the whole days; None when the history
    is shorter than MIN_FIT_DAYS + 1 days."""
    first_day = (-(start // 60)) % DAY_MIN          # minutes to the first UTC midnight
    days = (minutes - first_day) // DAY_MIN
    fit_days = max(MIN_FIT_DAYS, (2 * days) // 3)
    if days < MIN_FIT_DAYS + 1 or fit_days >= days:
        return None
    return first_day + fit_days * DAY_MIN


def forecast(rates: np.ndarray, start: int, throughput: float, headroom: float, startup_s: int, lead_s: int,
             min_replicas: int, max_replicas: int) -> Forecast | str:
    """The forecast and its schedule, or why there is none (a line)."""
    split = split_of(len(rates), start)
    if split is None:
        return (f"no forecast: the history holds {len(rates) / DAY_MIN:.1f} days; a daily season needs "
                f"{MIN_FIT_DAYS} whole days to fit and one more to check it on")
    try:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing
    except ImportError:
        raise DependencyError("the forecast needs statsmodels: pip install 'optkit[capacity]'") from None
    first_day = (-(start // 60)) % DAY_MIN
    fit = rates[first_day:split]
    held = rates[split:]
    changes = int(np.count_nonzero(np.diff(fit)))
    if changes < len(fit) // DAY_MIN:  # samples coarser than a day (each held for its interval), or a flat rate
        return (f"no forecast: the rate changes {changes} time{'s' if changes != 1 else ''} in the "
                f"{len(fit) // DAY_MIN} days a forecast would fit on: no daily season to fit (samples coarser than "
                "a day, or a flat rate)")
    fit_b = _buckets(fit)
    season_min = WEEK_MIN if len(fit) >= 2 * WEEK_MIN else DAY_MIN
    period = season_min // BUCKET_MIN
    horizon = math.ceil(len(held) / BUCKET_MIN)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ExponentialSmoothing(fit_b, trend=None, seasonal="add", seasonal_periods=period,
                                     initialization_method="estimated").fit()
        pred_b = np.clip(np.asarray(model.forecast(horizon), float), 0, None)
    method = (f"Holt-Winters (statsmodels ExponentialSmoothing, additive {'weekly' if period * BUCKET_MIN == WEEK_MIN else 'daily'} "
              f"season) on {BUCKET_MIN}-min buckets (each its highest minute), fitted on {len(fit) // DAY_MIN} days, "
              f"predicting the last {len(held) / DAY_MIN:.1f}")
    actual_b = _buckets(held)
    k = min(len(actual_b), len(pred_b))
    err = float(np.abs(pred_b[:k] - actual_b[:k]).sum() / max(actual_b[:k].sum(), 1e-12) * 100)
    # the floor per slot of the season: the highest prediction that falls on the slot, with the headroom
    slots = np.zeros(period, dtype=np.int64)
    split_abs = start // 60 + split            # absolute minute (UTC epoch minutes) of the held-out part
    for b, rate in enumerate(pred_b):
        slot = ((split_abs + b * BUCKET_MIN) % season_min) // BUCKET_MIN
        want = min(max_replicas, max(1, math.ceil(rate * (1 + headroom) / throughput - 1e-9)))
        slots[slot] = max(slots[slot], want)
    windows = _windows(slots, min_replicas)
    lead_min = math.ceil((startup_s + lead_s) / 60)
    season_floor = np.zeros(season_min, dtype=np.int64)
    schedule = []
    for a, b, desired in windows:
        s_min, e_min = a * BUCKET_MIN - lead_min, b * BUCKET_MIN
        idx = np.arange(s_min, e_min) % season_min
        season_floor[idx] = np.maximum(season_floor[idx], desired)
        schedule.append({"start": _cron(s_min, season_min), "end": _cron(e_min, season_min),
                         "desired_replicas": int(desired), "timezone": "UTC"})
    abs_minutes = (split_abs + np.arange(len(held))) % season_min
    floor = season_floor[abs_minutes]
    predicted = np.repeat(pred_b, BUCKET_MIN)[:len(held)]
    notes = [f"schedule: {len(schedule)} KEDA cron entries raising the minimum {lead_min} min ahead of each "
             f"predicted surge (start-up {startup_s} s + lead {lead_s} s)"]
    return Forecast(split=split, predicted=predicted, floor=floor, schedule=schedule, method=method,
                    error_pct=err, notes=notes)


def _buckets(x: np.ndarray) -> np.ndarray:
    n = len(x) // BUCKET_MIN * BUCKET_MIN
    out = x[:n].reshape(-1, BUCKET_MIN).max(axis=1)
    if len(x) > n:
        out = np.append(out, x[n:].max())
    return out


def _windows(slots: np.ndarray, base: int) -> list[tuple[int, int, int]]:
    """Runs of slots above `base` as (first slot, end slot, desired = the run's highest), a run broken where the
    count changes by more than a tolerance that widens until there are at most MAX_ENTRIES."""
    for tol in (0.1, 0.2, 0.35, 0.5, 1.0, math.inf):
        out: list[list[int]] = []
        for s, v in enumerate(slots.tolist()):
            if v <= base:
                continue
            if out and out[-1][1] == s and max(v, out[-1][2]) <= (1 + tol) * min(v, out[-1][3]):
                out[-1][1] = s + 1
                out[-1][2] = max(out[-1][2], v)
                out[-1][3] = min(out[-1][3], v)
            else:
                out.append([s, s + 1, v, v])
        if len(out) <= MAX_ENTRIES:
            break
    return [(a, b, hi) for a, b, hi, _ in out]


def _cron(minute: int, season_min: int) -> str:
    """A minute of the season (from Thursday 00:00 UTC for a week: the epoch's weekday) as a cron expression."""
    minute %= season_min
    t = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=minute)
    if season_min == DAY_MIN:
        return f"{t.minute} {t.hour} * * *"
    return f"{t.minute} {t.hour} * * {t.isoweekday() % 7}"
