"""Triton: a model in parts (package/ensemble.py's Plan) as an ensemble. Each part is a Triton model of its own,
`<repo>/<name>.<part>/` (config.pbtxt serving version N, `N/model.onnx` and its config), and `<repo>/<name>/` is
the ensemble model (`platform: "ensemble"`): the original inputs and outputs, and `ensemble_scheduling` steps
calling each part at version N with input_map/output_map wiring them by tensor name. Triton's ensemble scheduler
(in the server core) runs the steps, each on its own instance group: pre and post on KIND_CPU, the core on
KIND_GPU with --gpu (its TensorRT accelerator when the tuned provider is tensorrt), KIND_CPU otherwise. The tuned
setting is the core's; pre and post take its batch size (an ensemble batches no more than its parts) and as many
CPU instances as it has requests in flight. The part folders belong to the ensemble's index (`parts`): they
carry no index of their own, and serve-version switches them with it.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from optkit.core.errors import PassError, UsageError
from optkit.package import schemas
from optkit.package.pbtxt import Ident
from optkit.package.signature import Signature, warmup_dims
from optkit.package.target import Job
from optkit.package.tuned import DEFAULTS, Tuned

ENSEMBLE = "ensemble"


def part_model(name: str, role: str) -> str:
    return f"{name}.{role}"


def check_names(name: str, plan) -> list[str]:
    """The part models' names (exit 2 when the ensemble's name leaves no room for them)."""
    names = [part_model(name, p.role) for p in plan.parts]
    if any(not schemas.NAME_RE.fullmatch(n) for n in names):
        raise UsageError(f"--name {name!r}: its parts are named {names[0]!r} and so on, over 128 characters; give "
                         "a shorter --name")
    return names


def part_tuned(core: Tuned) -> Tuned:
    """pre/post: the CPU, the core's batch size, one instance per request the core has in flight, onnxruntime's
    own threads and optimisations (no tune figure is theirs)."""
    setting = {**DEFAULTS, "session": dict(DEFAULTS["session"]), "provider": "cpu",
               "batch": int(core.get("batch") or 1), "concurrency": int(core.get("concurrency") or 1),
               "sessions": "per-thread"}
    return Tuned(setting=setting, label="pre/post: the core's batch and concurrency, on the CPU")


def prepare(job: Job, plan, scalars_of) -> None:
    """Before anything is written: names, warm-up dims of each part, what cannot be expressed."""
    names = check_names(job.name, plan)
    batching = plan.batchable and int(job.tuned.get("batch") or 1) > 0
    warm: dict[str, dict | None] = {}
    originals = {t.name for t in plan.inputs}
    for part, model in zip(plan.parts, names):
        sig = Signature(part.sig.inputs, part.sig.outputs, plan.batchable)
        if any(scalars_of(sig)):
            raise UsageError(f"{part.path.name}: a scalar input or output in a part of a split model; a part "
                             "serves tensors with a batch axis here (split the model elsewhere)")
        try:
            warm[model], notes = warmup_dims(sig, batching, job.shapes, job.config.data)
            job.notes.extend(f"{part.role}: {n}" for n in notes)
        except UsageError:
            if any(t.name in originals for t in sig.inputs):
                raise
            warm[model] = None
            job.notes.append(f"{part.role}: no model_warmup (its inputs' dynamic dims are known only once the "
                             "earlier part ran)")
    job.notes.extend(plan.notes)
    job.state.update(plan=plan, part_names=names, warmup=warm)


def write(job: Job, root: Path, vdir: Path, number: int, build_config, dumps, delay: int,
          gpu: bool) -> dict[str, str]:
    """The part models under `root` (root/<part>/<N>/) and the ensemble's config in `vdir`; the part models'
    model-level files go to job.model_level. Returns the ensemble's model-level files."""
    plan, names = job.state["plan"], job.state["part_names"]
    configs, part_level, part_rows = {}, {}, []
    max_batch = None
    for part, model in zip(plan.parts, names):
        core = part.role == "core"
        tuned = job.tuned if core else part_tuned(job.tuned)
        sig = Signature(part.sig.inputs, part.sig.outputs, plan.batchable)
        cfg = build_config(model, sig, tuned, job.state["warmup"][model], number, queue_delay_us=delay,
                           gpu=gpu and core)
        if core:
            job.mapping[:] = cfg.mapping
            job.notes.extend(cfg.notes)
            max_batch = cfg.max_batch_size
            if part.device == "gpu" and not gpu and (tuned.get("provider") or "cpu") == "cpu":
                job.notes.append("core: on KIND_CPU; the split meant it for the GPU: give --gpu (and a tune on "
                                 "tensorrt for its TensorRT accelerator) where the server has one")
        else:
            part_rows.extend({**row, "setting": f"{part.role}: {row['setting']}"} for row in cfg.mapping
                             if row["setting"] in ("batch", "concurrency", "provider"))
        pdir = root / model / str(number)
        pdir.mkdir(parents=True)
        shutil.copyfile(part.path, pdir / "model.onnx")
        (pdir / "config.pbtxt").write_text(cfg.text, encoding="utf-8")
        configs[model] = cfg.config
        part_level[model] = {"config.pbtxt": cfg.text}
    job.mapping.extend(part_rows)
    ens = ensemble_config(job.name, plan, names, number, max_batch or 0)
    text = dumps(ens)
    (vdir / "config.pbtxt").write_text(text, encoding="utf-8")
    job.model_level.update(part_level)
    job.state.update(config=ens, part_configs=configs)
    job.notes.append(f"an ensemble of {len(names)} models ({', '.join(names)}), each called at version {number}; "
                     f"pre/post on KIND_CPU, the core on {core_kind(configs[names[[p.role for p in plan.parts].index('core')]])}")
    return {"config.pbtxt": text}


def core_kind(config: dict) -> str:
    return str(config["instance_group"][0]["kind"])


def ensemble_config(name: str, plan, names: list[str], version: int, max_batch: int) -> dict[str, Any]:
    batching = max_batch > 0

    def tensor(t) -> dict[str, Any]:
        dims = t.dims[1:] if batching else list(t.dims)
        return {"name": t.name, "data_type": Ident(t.triton_type),
                **({"dims": dims} if dims else {"dims": [1], "reshape": {"shape": []}})}

    steps = [{"model_name": model, "model_version": version,
              "input_map": {t.name: t.name for t in part.sig.inputs},
              "output_map": {t.name: t.name for t in part.sig.outputs}} for part, model in zip(plan.parts, names)]
    return {"name": name, "platform": ENSEMBLE, "max_batch_size": max_batch,
            "version_policy": {"specific": {"versions": [version]}},
            "input": [tensor(t) for t in plan.inputs], "output": [tensor(t) for t in plan.outputs],
            "ensemble_scheduling": {"step": steps}}


def check_wiring(config: dict, part_configs: dict[str, dict], where: str) -> None:
    """What Triton checks when it loads an ensemble, before a server does: every step names a part at a version
    it serves; each step's inputs are ensemble inputs or earlier steps' outputs of the same type and dims; every
    ensemble output is produced once; no part batches less than the ensemble. Else PassError (optkit's bug)."""
    def fail(msg: str) -> PassError:
        return PassError(f"{where}: {msg} (the ensemble optkit built is inconsistent; nothing was written)")

    have = {t["name"]: (t["data_type"], list(t["dims"])) for t in config["input"]}
    mb = config["max_batch_size"]
    for i, step in enumerate(config["ensemble_scheduling"]["step"]):
        part = part_configs.get(step["model_name"])
        if part is None:
            raise fail(f"step {i} calls {step['model_name']!r}, which is not one of its parts")
        if step["model_version"] not in part["version_policy"]["specific"]["versions"]:
            raise fail(f"step {i} calls version {step['model_version']} of {step['model_name']}, which it does "
                       "not serve")
        if (mb > 0) != (part["max_batch_size"] > 0) or part["max_batch_size"] < mb:
            raise fail(f"{step['model_name']} batches {part['max_batch_size']}, the ensemble {mb}")
        ins = {t["name"]: (t["data_type"], list(t["dims"])) for t in part["input"]}
        outs = {t["name"]: (t["data_type"], list(t["dims"])) for t in part["output"]}
        if set(step["input_map"]) != set(ins) or set(step["output_map"]) != set(outs):
            raise fail(f"step {i}'s maps are not {step['model_name']}'s inputs and outputs")
        for key, tensor in step["input_map"].items():
            if tensor not in have:
                raise fail(f"step {i} reads {tensor!r}, which no input or earlier step gives")
            if not _fits(have[tensor], ins[key]):
                raise fail(f"step {i} reads {tensor!r} as {ins[key]}, given as {have[tensor]}")
        for key, tensor in step["output_map"].items():
            if tensor in have:
                raise fail(f"step {i} writes {tensor!r}, which is written already")
            have[tensor] = outs[key]
    for t in config["output"]:
        if t["name"] not in have or not _fits(have[t["name"]], (t["data_type"], list(t["dims"]))):
            raise fail(f"output {t['name']!r} is not produced as declared")


def _fits(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(x == y or -1 in (x, y) for x, y in zip(a[1], b[1]))
