"""The `tune.onnx` pass: the search (search.Tuner) as a recipe stage. The model passes through unchanged
(onnx.io.copy_model); the result goes in the stage's measurements under "tune", and the runner measures the
stage served the way it chose. The study is kept beside the stage (storage.stage_study_path)."""
from __future__ import annotations

from optkit.core.artifact import Artifact
from optkit.core.formats import Format
from optkit.core.registry import Pass, PassContext, register
from optkit.measure.model import MeasureSettings
from optkit.onnx.io import copy_model
from optkit.passes.tune.config import TuneConfig, short
from optkit.passes.tune.search import Tuner
from optkit.passes.tune.storage import stage_study_path


@register
class TuneOnnx(Pass):
    name = "tune.onnx"
    summary = "Serving settings (threads, batch, concurrency, session options) found by Bayesian search"
    accepts = (Format.ONNX,)
    produces = Format.ONNX
    extra = "tune"
    Config = TuneConfig

    def run(self, artifact: Artifact, config: TuneConfig, ctx: PassContext) -> Artifact:
        data = ctx.data.get("eval")  # real samples to time, when the recipe has them
        settings = MeasureSettings(shapes=ctx.shapes, values=ctx.values, seed=ctx.seed)
        tuner = Tuner(artifact, config, settings=settings, data=data, default_storage=stage_study_path(ctx),
                      notes=ctx.notes)
        try:
            result = tuner.run()
        except KeyboardInterrupt as e:
            e.kept = tuner.kept  # what an interrupted command leaves to resume from (cli/tune.py says it)
            raise
        ctx.measurements["tune"] = result
        ctx.note(f"tuned for {', '.join(config.objective)}: {result['best']['label']} "
                 f"({short(result['best']['figures'])})")
        copy_model(artifact.path, ctx.output)
        return Artifact.load(str(ctx.output))
