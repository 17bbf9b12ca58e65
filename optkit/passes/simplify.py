"""ONNX simplification: onnxslim, then onnxruntime's portable offline optimizations (or onnxsim instead).

The result must compute the same outputs (within `tolerance`) and may not grow past `max_growth` times the
input's size (constant folding can multiply it); otherwise the pass tries the safer variants and, when none fits,
fails with exit 3 saying why.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field

from optkit.core.artifact import Artifact
from optkit.core.atomic import atomic_path
from optkit.core.batching import count, stack_samples, trim
from optkit.core.errors import DependencyError, PassError, UsageError, ValidationError
from optkit.core.formats import Format
from optkit.core.registry import MAX_SAMPLES, Pass, PassConfig, PassContext, cli, register
from optkit.core.shapes import format_shape
from optkit.core.text import first_line
from optkit.measure.fidelity import refuse_nonfinite_reference
from optkit.measure.inputs import probe, synthesize
from optkit.onnx import graph
from optkit.onnx import io as onnx_io
from optkit.onnx import session as onnx_session
from optkit.runtimes.onnx import PROVIDERS

# Bytes a result may grow by whatever --max-growth says: a tiny model's file grows by its opset imports, names
# and metadata alone (164 -> 367 bytes through onnxruntime), which is no materialized tensor.
GROWTH_SLACK = 4096


class SimplifyConfig(PassConfig):
    engine: Literal["onnxslim", "onnxsim"] = Field(default="onnxslim", description="onnxslim or onnxsim.",
                                                   json_schema_extra=cli("--engine"))
    ort_optimize: bool = Field(default=True, description="onnxruntime offline optimizations after the engine.",
                               json_schema_extra=cli("--no-ort", sets=False,
                                                     help="Skip onnxruntime's offline optimizations."))
    # target a provider: allows its fused ops (not portable)
    provider: Optional[str] = Field(default=None, description="Allow this provider's fused ops (cpu, cuda): not "
                                                              "portable.",
                                    json_schema_extra=cli("--target-provider"))
    max_growth: float = Field(default=1.5, gt=0, le=1000, description="Refuse results larger than this many times the input.",
                              json_schema_extra=cli("--max-growth", group="budgets"))
    # max |diff| allowed, scaled by max(1, |reference|)
    tolerance: float = Field(default=1e-5, ge=0, le=1000, description="Max output difference allowed (scaled by "
                                                             "max(1, |reference|)).",
                             json_schema_extra=cli("--tolerance", group="budgets"))
    check_samples: int = Field(default=8, ge=1, le=MAX_SAMPLES, description="Inputs the outputs are compared on.",
                               json_schema_extra=cli("--check-samples", group="evaluation"))


@register
class SimplifyOnnx(Pass):
    name = "simplify.onnx"
    summary = "onnxslim + onnxruntime offline optimizations (portable ONNX), checked for equal outputs"
    accepts = (Format.ONNX,)
    produces = Format.ONNX
    extra = "simplify"
    Config = SimplifyConfig

    def run(self, artifact: Artifact, config: SimplifyConfig, ctx: PassContext) -> Artifact:
        model = onnx_io.load(artifact.path)
        before = graph.op_counts(model)
        size_in = artifact.size_bytes()
        tmp = Path(tempfile.mkdtemp(prefix="optkit-simplify-"))
        try:
            run, ref, n_inputs = _reference(artifact, ctx, config)
            tried = []
            for label, path in _variants(artifact, config, tmp, ctx):
                m = onnx_io.load(path)
                size = path.stat().st_size
                entry = {"variant": label, "bytes": size, "growth": size / size_in,
                         "nodes": sum(graph.op_counts(m).values())}
                tried.append(entry)
                if size > config.max_growth * size_in and size - size_in > GROWTH_SLACK:
                    entry["rejected"] = f"grew the file {size / size_in:.2f}x"
                    continue
                try:
                    out = run(onnx_session.session(path))
                except Exception as e:  # noqa: BLE001  a variant onnxruntime cannot load or run is no candidate
                    entry["rejected"] = e.message if isinstance(e, UsageError) else first_line(e)[:200]
                    continue
                err = _max_scaled_error(ref, out)
                entry["max_scaled_error"] = err
                if err > config.tolerance:
                    entry["rejected"] = f"outputs moved by {err:.3g} (tolerance {config.tolerance:g})"
                    continue
                after = graph.op_counts(m)
                ctx.measurements["simplify"] = {
                    "variant": label, "nodes_before": sum(before.values()), "nodes_after": sum(after.values()),
                    "ops_before": before, "ops_after": after, "bytes_before": size_in, "bytes_after": size,
                    "max_scaled_error": err, "tried": tried}
                ctx.note(f"{label}: nodes {sum(before.values())} -> {sum(after.values())} "
                         f"({_op_delta(before, after)}); size {size_in:,} -> {size:,} bytes; outputs equal "
                         f"within {err:.2g} on {n_inputs} inputs")
                with atomic_path(ctx.output) as out_tmp:
                    shutil.copyfile(path, out_tmp)
                return artifact.derive(ctx.output, Format.ONNX, self.name, config.model_dump(mode="json"))
            ctx.measurements["simplify"] = {"tried": tried}
            grown = [t for t in tried if "grew" in t.get("rejected", "")]
            if grown and len(grown) == len(tried):
                worst = min(grown, key=lambda t: t["growth"])
                raise ValidationError(
                    f"simplification would grow the model {worst['growth']:.2f}x (from {size_in:,} to "
                    f"{worst['bytes']:,} bytes), past max_growth (--max-growth) {config.max_growth:g}: constant folding "
                    "materialized large tensors; nothing was written (raise max_growth / --max-growth to accept it)",
                    details={"tried": tried})
            reasons = "; ".join(f"{t['variant']}: {t['rejected']}" for t in tried)
            raise ValidationError(f"no simplified model kept the outputs and size: {reasons}; nothing was written",
                                  details={"tried": tried})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _reference(artifact, ctx, config):
    """(run, the parent's outputs, how many inputs): `run(session)` gives a session's outputs on the check inputs.

    Data runs in batches along its sample axis where the model has one; synthesized inputs are whole calls,
    one per check sample, so models without a batch axis (scalars, states, shape tensors) run as they are.
    """
    sess = onnx_session.session(artifact.path)
    specs = onnx_session.input_specs(sess)
    names = [o.name for o in sess.get_outputs()]
    data = ctx.data.get("eval") or ctx.data.get("calibration")
    if data is not None:
        feeds = trim(specs, data.subset(config.check_samples, ctx.seed).bind(specs))
    else:  # one whole call per sample: models without a batch axis run as they are
        shapes, how = probe(specs, lambda f: sess.run(names, f), ctx.shapes, ctx.values, ctx.seed)
        if how in ("probed", "from the dim names"):
            ctx.note("synthesized inputs shaped " + ", ".join(f"{k} {format_shape(v)}" for k, v in shapes.items())
                     + f" ({how})")
        feeds = stack_samples([synthesize(specs, shapes, 1, ctx.seed + i, ctx.values)
                               for i in range(config.check_samples)])
    n = count(feeds) if specs else 1  # a model without inputs runs once

    def run(session):
        return onnx_session.run_all(session, feeds, names)

    try:
        ref = run(sess)
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001  onnxruntime refuses the inputs: the model needs real ones
        given = "the given data" if data is not None else "synthesized inputs"
        raise UsageError(f"{artifact.path} does not run on {given}: {first_line(e)[:200]}; "
                         "give inputs it accepts as data (data.eval / --data; shapes / --shape for dynamic dims)") from None
    refuse_nonfinite_reference(artifact.path, ref, names, specs, feeds,
                               data.source if data is not None else "synthesized inputs")
    return run, ref, n


def _variants(artifact, config, tmp: Path, ctx):
    """Candidate simplifications, best first: engine + ort, engine alone, (onnxslim without folding).
    When the engine fails on a graph, onnxruntime's optimizations run on the model alone."""
    engine_out: Optional[Path] = tmp / "engine.onnx"
    label, engine_error = config.engine, ""
    try:
        if config.engine == "onnxslim":
            import onnxslim

            model = onnxslim.slim(onnx_io.load(artifact.path))
        else:
            try:
                import onnxsim  # imports torch: only when chosen
            except ImportError:
                raise DependencyError("engine onnxsim is not installed: pip install onnxsim") from None
            model, ok = onnxsim.simplify(onnx_io.load(artifact.path))
            if not ok:
                raise PassError("onnxsim could not validate its simplified model")
        onnx_io.save(model, engine_out)
    except (UsageError, DependencyError):
        raise
    except Exception as e:  # noqa: BLE001  the engine's bug on this graph: carry on without it
        engine_error = (e.message if isinstance(e, PassError) else first_line(e))[:160]
        ctx.note(f"{config.engine} failed on this graph ({engine_error}); tried onnxruntime's optimizations alone")
        engine_out = None
    candidates = []
    if config.ort_optimize:
        ort_out = tmp / "ort.onnx"
        try:
            _ort_offline(engine_out or Path(artifact.path), ort_out, config.provider)
            n_ort = sum(graph.op_counts(onnx_io.load(ort_out)).values())
            n_eng = sum(graph.op_counts(onnx_io.load(engine_out or artifact.path)).values())
            if n_ort <= n_eng:  # never more nodes than the engine alone
                candidates.append((f"{label} + onnxruntime" if engine_out else "onnxruntime", ort_out))
        except Exception as e:  # noqa: BLE001
            ctx.note(f"onnxruntime offline optimization skipped: {first_line(e)[:120]}")
    if engine_out:
        candidates.append((label, engine_out))
    if not candidates:
        raise PassError(f"neither {config.engine} ({engine_error or 'no result'}) nor onnxruntime could simplify "
                        f"{artifact.path}")
    yield from candidates
    if config.engine == "onnxslim" and engine_out:
        import onnxslim

        nofold = tmp / "nofold.onnx"
        onnx_io.save(onnxslim.slim(onnx_io.load(artifact.path), no_constant_folding=True), nofold)
        yield "onnxslim (no constant folding)", nofold


def _ort_offline(src: Path, dest: Path, provider: Optional[str]) -> None:
    """onnxruntime's offline optimizations saved as ONNX: basic level (standard ops only) unless a provider
    is targeted (extended level, which adds onnxruntime-specific fused ops)."""
    onnx_session.ort_session(src, optimization="extended" if provider else "basic", optimized_path=dest,
                             providers=PROVIDERS.get(provider or "cpu", PROVIDERS["cpu"]))
    m = onnx_io.load(dest)
    if not provider:  # standard domains, and whatever the input used already
        source = onnx_io.load(src, external_data=False)
        portable = {"", "ai.onnx", "ai.onnx.ml"} | {n.domain for n in source.graph.node}
        bad = sorted({n.domain for n in m.graph.node if n.domain not in portable})
        if bad:
            raise PassError(f"onnxruntime added non-portable ops ({', '.join(bad)})")
    onnx_io.save(m, dest)


def _max_scaled_error(ref, out) -> float:
    """The largest output difference, scaled by each output's magnitude; inf when anything else differs
    (count, shape, dtype kind, non-float values, or where the NaN and Inf values sit)."""
    import numpy as np

    worst = 0.0
    if len(ref) != len(out):
        return float("inf")
    for a, b in zip(ref, out):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype.kind != b.dtype.kind:
            return float("inf")
        if a.size == 0:
            continue
        if a.dtype.kind not in "fc":
            if not np.array_equal(a, b):
                return float("inf")
            continue
        a, b = a.astype(np.float64), b.astype(np.float64)
        finite = np.isfinite(a)
        if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite], equal_nan=True):
            return float("inf")
        if finite.any():
            scale = max(1.0, float(np.abs(a[finite]).max()))
            worst = max(worst, float(np.abs(a[finite] - b[finite]).max()) / scale)
    return worst


def _op_delta(before: dict, after: dict) -> str:
    parts = []
    for op in sorted(set(before) | set(after)):
        a, b = before.get(op, 0), after.get(op, 0)
        if a != b:
            parts.append(f"{op} {a}->{b}")
    return ", ".join(parts) or "same ops"
