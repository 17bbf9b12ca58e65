"""Running one pass: its config validated, its output written atomically. Commands, recipes and the Python API
use this."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optkit.core import preprocessor
from optkit.core.artifact import Artifact, content_sha256
from optkit.core.atomic import check_output_path
from optkit.core.errors import PassError
from optkit.core.registry import PassContext, build_config, check_pass
from optkit.core.text import redact_config
from optkit.passes import get_pass

log = logging.getLogger(__name__)


@dataclass
class StageResult:
    name: str
    pass_name: str
    input: Artifact
    output: Artifact
    config: dict[str, Any]
    duration_s: float
    ctx: PassContext
    cached: bool = False
    measurements: dict[str, Any] = field(default_factory=dict)


def run_pass(artifact: Artifact | None, pass_name: str, config: dict[str, Any], output: str | Path,
             **ctx_fields: Any) -> StageResult:
    """Run one pass on `artifact`, writing `output` atomically; the input is never overwritten. A stage kind that
    passes its model through returns `artifact` itself; one that runs without a model (artifact None) returns the
    record of the file it wrote."""
    cls = get_pass(pass_name)
    cfg = build_config(cls, config)
    if artifact is not None:  # None: a stage that runs without a model (capacity.plan on its figures)
        check_pass(cls, artifact.format, artifact.path)
    output = check_output_path(output, inputs=(artifact.path, artifact.meta.get("weights")) if artifact else ())
    ctx = PassContext(output=output, **ctx_fields)
    log.info("pass %s: %s -> %s", pass_name, artifact.path if artifact else "(no model)", output)
    log.debug("pass %s config: %s", pass_name, redact_config(cfg.model_dump(mode="json")))
    start = time.perf_counter()
    result = cls().run(artifact, cfg, ctx)
    log.info("pass %s done in %.1f s", pass_name, time.perf_counter() - start)
    if not Path(result.path).exists():
        raise PassError(f"pass {pass_name} reported {result.path} but wrote nothing")
    if result is not artifact and artifact is not None and preprocessor.inherit(artifact.path, result.path):
        # the tokenizer travels with the model (a stage that passes its model through changes nothing)
        result.sha256 = content_sha256(result.path, result.format)
    return StageResult(name=pass_name, pass_name=pass_name, input=artifact, output=result,
                       config=redact_config(cfg.model_dump(mode="json")), duration_s=time.perf_counter() - start,
                       ctx=ctx)
