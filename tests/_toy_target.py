"""A package target written as a third party would: one module and one registration line, touching no file of
optkit. It writes the model and a JSON manifest (toy.json) into the version folder and keeps `served.json` (the
served version) beside the index. Its own options, `--toy-batch N` and `--toy-note TEXT` (recipe keys toy_batch,
toy_note), come from its Config as pass options do. tests/test_package_targets.py loads it in child processes
with OPTKIT_PLUGINS=_toy_target."""
from __future__ import annotations

import json
import shutil

from pydantic import Field

from optkit.core.errors import UsageError
from optkit.core.registry import cli
from optkit.package.target import Served, Target, TargetConfig, register_target


class ToyOptions(TargetConfig):
    toy_batch: int | None = Field(default=None, ge=1, le=4096, description="Toy: the batch it records (default: "
                                                                          "the tuned batch).",
                                  json_schema_extra=cli("--toy-batch"))
    toy_note: str | None = Field(default=None, max_length=200, description="Toy: a note it records.",
                                 json_schema_extra=cli("--toy-note"))


class ToyTarget(Target):
    name = "toy"
    describe = "a folder with the model and a JSON manifest"
    Config = ToyOptions
    model_files = frozenset({"served.json"})
    manifest_format = "onnx"

    def check(self, config, options) -> None:
        if config.manifests:
            raise UsageError("--manifests: a toy package has no deployment manifests")

    def write_version(self, job, vdir, number):
        shutil.copyfile(job.model, vdir / "model.onnx")
        batch = job.options.toy_batch or int(job.tuned.get("batch") or 1)
        job.mapping[:] = [{"setting": "batch", "value": batch, "field": "toy.json batch", "written": batch}]
        (vdir / "toy.json").write_text(json.dumps({"name": job.name, "version": number, "batch": batch,
                                                   "note": job.options.toy_note, "tuned": job.tuned.label}))
        return {"served.json": json.dumps({"served": number})}

    def validate(self, job, vdir) -> None:
        json.loads((vdir / "toy.json").read_text())

    def serve(self, model_dir, index, number, recorded, options):
        return Served(replace={model_dir / "served.json": json.dumps({"served": number})},
                      before=index.get("served"))


register_target("toy", ToyTarget)
