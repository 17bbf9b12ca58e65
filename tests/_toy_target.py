"""A package target written as a third party would: one module and one registration line. It writes the model
and a JSON manifest (toy.json) into the version folder and keeps `served.json` (the served version) beside the
index. tests/test_package_targets.py loads it in child processes with OPTKIT_PLUGINS=_toy_target."""
from __future__ import annotations

import json
import shutil

from optkit.core.errors import UsageError
from optkit.package.target import Served, Target, register_target


class ToyTarget(Target):
    name = "toy"
    describe = "a folder with the model and a JSON manifest"
    model_files = frozenset({"served.json"})
    manifest_format = "onnx"

    def check(self, config) -> None:
        if config.manifests:
            raise UsageError("--manifests: a toy package has no deployment manifests")

    def write_version(self, job, vdir, number):
        shutil.copyfile(job.model, vdir / "model.onnx")
        batch = int(job.tuned.get("batch") or 1)
        job.mapping[:] = [{"setting": "batch", "value": batch, "field": "toy.json batch", "written": batch}]
        (vdir / "toy.json").write_text(json.dumps({"name": job.name, "version": number, "batch": batch,
                                                   "tuned": job.tuned.label}))
        return {"served.json": json.dumps({"served": number})}

    def validate(self, job, vdir) -> None:
        json.loads((vdir / "toy.json").read_text())

    def serve(self, model_dir, index, number, recorded, registry):
        return Served(replace={model_dir / "served.json": json.dumps({"served": number})},
                      before=index.get("served"))


register_target("toy", ToyTarget)
