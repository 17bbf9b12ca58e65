"""The search space: its dimensions' choices (`default_space`, narrowed by the config's `space`), the first
settings a study measures (`starting_points`), the setting an Optuna trial asks for (`suggest`), every setting
(`grid`), and the onnxruntime pool threads a setting starts (`pool_threads`, capped per core: `check_pool`)."""
from __future__ import annotations

import itertools
import math
import os
from typing import Any

from optkit.core.errors import DependencyError, UsageError
from optkit.measure.serving import Setting
from optkit.onnx.session import OrtSettings
from optkit.passes.tune.config import TuneConfig, choice
from optkit.runtimes.openvino import import_openvino, read_model

BATCHES = (1, 2, 4, 8, 16, 32, 64)
POOL_PER_CORE = 2  # the threads a setting's sessions start may be at most this many per core


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pool_threads(setting: Setting) -> int:
    """The threads a setting's sessions start beside the threads that call them: per session, its intra-op
    threads but one (the caller runs one), and in parallel mode its inter-op threads but one. onnxruntime's
    pool threads spin while they wait, so more of them than the cores starve each other: 256 sessions of two
    threads on 2 cores take tens of seconds just to open."""
    n = setting.concurrency if setting.sessions == "per-thread" else 1
    each = (setting.threads or cores()) - 1
    if setting.session.execution_mode == "parallel":
        each += (setting.session.inter_op_threads or cores()) - 1
    return n * each


def pool_cap() -> int:
    return POOL_PER_CORE * cores()


def _least_pool(space: dict[str, list[Any]], fixed: dict[str, Any] | None = None) -> Setting:
    """The setting of the space (with `fixed` values) that starts the fewest pool threads."""
    fixed = fixed or {}

    def pick(name: str) -> Any:
        if name in fixed:
            return fixed[name]
        choices = space[name]
        if name == "execution_mode":
            return "sequential" if "sequential" in choices else choices[0]
        if name == "sessions":
            return "shared" if "shared" in choices else choices[0]
        if name in ("threads", "inter_op_threads", "concurrency"):
            return min(choices)
        return choices[0]

    return _setting(pick)


def check_pool(space: dict[str, list[Any]]) -> None:
    """Up front: a space whose every setting starts more pool threads than the cap is refused."""
    least = _least_pool(space)
    if pool_threads(least) > pool_cap():
        raise UsageError(f"every setting of this space starts more than {pool_cap()} onnxruntime pool threads on "
                         f"{cores()} cores (the fewest: {least.label()}, {pool_threads(least)} threads), which "
                         "starve each other; give space (--space) threads=1, sessions=shared or fewer in flight")

def default_space(cfg: TuneConfig, batchable: bool, providers: list[str],
                  no_batch: str | None = None, runtimes: list[str] | None = None) -> dict[str, list[Any]]:
    cpus = os.cpu_count() or 1
    threads = sorted({2 ** i for i in range(int(math.log2(cpus)) + 1)} | {cpus})
    single = cfg.objective == ["latency"]  # one request at a time: batch and concurrency stay 1
    space: dict[str, list[Any]] = {
        "runtime": runtimes or ["onnxruntime"],
        "provider": providers,
        "threads": threads,
        "execution_mode": ["sequential", "parallel"],
        "inter_op_threads": threads,
        "graph_optimization": ["disable", "basic", "extended", "all"],
        "batch": list(BATCHES) if batchable and not single else [1],
        "concurrency": [1] if single else sorted({2 ** i for i in range(int(math.log2(2 * cpus)) + 1)}),
        "sessions": ["shared", "per-thread"],
        "cpu_mem_arena": [True, False],
        "mem_pattern": [True, False],
    }
    for name, choices in cfg.space.items():  # checked by TuneConfig
        values = list(dict.fromkeys(choice(name, c) for c in choices))
        if name == "batch" and not batchable and values != [1]:
            raise UsageError(f"space (--space) batch cannot be searched: the model cannot batch ({no_batch or 'no batch axis'})")
        space[name] = values
    return space


def starting_points(space: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The first settings a study measures, before the sampler learns: onnxruntime's default (every core on
    one request), every core on the largest batch, and one single-threaded session per core at the largest
    and the smallest batch. Throughput optima on CPUs usually sit near one of them; the search refines."""
    def fit(want: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in want.items():
            choices = space.get(name, [])
            if len(choices) > 1:
                out[name] = min(choices, key=lambda c: abs(c - value)) if isinstance(value, int) and not \
                    isinstance(value, bool) else (value if value in choices else choices[0])
        return out

    cores, batches = max(space["threads"]), space["batch"]
    points = [{"threads": cores, "batch": min(batches), "concurrency": 1},
              {"runtime": "openvino", "threads": cores, "batch": min(batches), "concurrency": 1},
              {"threads": cores, "batch": max(batches), "concurrency": 1},
              {"threads": 1, "batch": max(batches), "concurrency": cores, "sessions": "per-thread"},
              {"threads": 1, "batch": min(batches), "concurrency": cores, "sessions": "per-thread"}]
    unique = []
    for p in map(fit, points):
        if p and p not in unique and pool_threads(_least_pool(space, p)) <= pool_cap():
            unique.append(p)
    return unique


def suggest(trial, space: dict[str, list[Any]]) -> Setting:
    """The setting an Optuna trial asks for; inter-op threads only in parallel mode, sessions only with more
    than one request in flight."""
    def pick(name: str) -> Any:
        choices = space[name]
        return choices[0] if len(choices) == 1 else trial.suggest_categorical(name, choices)

    return _setting(pick)


def grid(space: dict[str, list[Any]]) -> list[Setting]:
    """Every setting of the space (the same conditions as `suggest`): what an exhaustive search measures."""
    out, seen = [], set()
    names = list(space)
    for combo in itertools.product(*(space[n] for n in names)):
        values = dict(zip(names, combo))
        s = _setting(values.__getitem__)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def _setting(pick) -> Setting:
    mode = pick("execution_mode")
    concurrency = pick("concurrency")
    # OpenVINO: its own settings (optkit's, recorded), no onnxruntime session options; it runs on the CPU, so a GPU
    # provider is onnxruntime's; one infer request per thread (an OpenVINO session is not shared between threads)
    if pick("runtime") == "openvino" and pick("provider") == "cpu":
        return Setting(runtime="openvino", threads=pick("threads"), batch=pick("batch"), concurrency=concurrency,
                       sessions="per-thread" if concurrency > 1 else "shared")
    return Setting(provider=pick("provider"), threads=pick("threads"), batch=pick("batch"), concurrency=concurrency,
                   sessions=pick("sessions") if concurrency > 1 else "shared",
                   session=OrtSettings(execution_mode=mode,
                                       inter_op_threads=pick("inter_op_threads") if mode == "parallel" else None,
                                       graph_optimization=pick("graph_optimization"),
                                       cpu_mem_arena=pick("cpu_mem_arena"), mem_pattern=pick("mem_pattern")))

def runtimes_here(artifact) -> tuple[list[str], str | None]:
    """The runtimes tune measures: onnxruntime, and OpenVINO where it is installed, runs (x86-64) and reads the
    model; with why OpenVINO is left out."""
    try:
        read_model(import_openvino().Core(), artifact)
    except (DependencyError, UsageError) as e:
        return ["onnxruntime"], e.message
    return ["onnxruntime", "openvino"], None


def providers_here() -> list[str]:
    import onnxruntime as ort

    have = ort.get_available_providers()
    return ["cpu"] + [p for p, name in (("cuda", "CUDAExecutionProvider"), ("tensorrt", "TensorrtExecutionProvider"))
                      if name in have]
