"""Running one pass: its config validated, its output written atomically. Commands and recipes use this."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from optkit.core.artifact import Artifact
from optkit.core.atomic import check_output_path
from optkit.core.errors import DependencyError, PassError, UsageError
from optkit.core.registry import Pass, PassContext, get_pass

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


def build_config(cls: type[Pass], config: dict[str, Any], unknown: str = "unknown option"):
    """Validate a pass config; a typo or a wrong type is a usage error naming the key. ConfigError carries
    the key's path, so a recipe can point at its line."""
    try:
        return cls.Config(**config)
    except PydanticValidationError as e:
        err = e.errors()[0]
        raise ConfigError(cls.name, tuple(err["loc"]), config_message(err, unknown)) from None


class ConfigError(UsageError):
    def __init__(self, pass_name: str, loc: tuple, message: str):
        self.pass_name, self.loc, self.detail = pass_name, loc, message
        super().__init__(f"{pass_name}: {'.'.join(str(p) for p in loc) or 'config'}: {message}")


def config_message(err: dict, unknown: str = "unknown option") -> str:
    """pydantic's error, as one plain phrase."""
    if err["type"] == "extra_forbidden":
        return unknown
    if err["type"] == "missing":
        return "missing (required)"
    msg = err["msg"].removeprefix("Value error, ")
    return msg[0].lower() + msg[1:] if msg and not msg[1:2].isupper() else msg  # an acronym (SLO) stays


def check_pass(cls: type[Pass], fmt, where: str = "") -> None:
    """The pass is installed here (exit 4) and accepts `fmt` (exit 2); `where` names what gives that format."""
    missing = cls.missing()
    if missing:
        raise DependencyError(f"pass {cls.name} is unavailable here: {missing}")
    check_accepts(cls, fmt, where)


def check_accepts(cls: type[Pass], fmt, where: str = "") -> None:
    if fmt not in cls.accepts:
        raise UsageError(f"pass {cls.name} accepts {', '.join(f.value for f in cls.accepts)}, "
                         f"not {fmt.value}" + (f" ({where})" if where else ""))


def run_pass(artifact: Artifact, pass_name: str, config: dict[str, Any], output: str | Path,
             **ctx_fields: Any) -> StageResult:
    """Run one pass on `artifact`, writing `output` atomically; the input is never overwritten."""
    cls = get_pass(pass_name)
    cfg = build_config(cls, config)
    check_pass(cls, artifact.format, artifact.path)
    output = check_output_path(output, inputs=(artifact.path, artifact.meta.get("weights")))
    ctx = PassContext(output=output, **ctx_fields)
    log.info("pass %s: %s -> %s", pass_name, artifact.path, output)
    log.debug("pass %s config: %s", pass_name, cfg.model_dump(mode="json"))
    start = time.perf_counter()
    result = cls().run(artifact, cfg, ctx)
    log.info("pass %s done in %.1f s", pass_name, time.perf_counter() - start)
    if not Path(result.path).exists():
        raise PassError(f"pass {pass_name} reported {result.path} but wrote nothing")
    return StageResult(name=pass_name, pass_name=pass_name, input=artifact, output=result,
                       config=cfg.model_dump(mode="json"), duration_s=time.perf_counter() - start, ctx=ctx)
