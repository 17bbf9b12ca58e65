"""The stage kinds a recipe runs besides the passes of optkit/passes: `split.onnx` (optkit/split/stage.py) and
`capacity.plan` (optkit/capacity/stage.py). Each is a Pass with its Config, registered here (the layers they live
in sit above passes), so a recipe names it as it names a pass, the runner runs it as every stage (validated before
any stage, guarded by its paths(), reported, cached and resumed where its class says so: `measured`, `cached`,
`passes_through`), and its command's flags are derived from its Config. A new kind is a Pass subclass in the
package it belongs to and its line in KINDS."""
from __future__ import annotations

from optkit.capacity.stage import CapacityPlan
from optkit.core.registry import register
from optkit.split.stage import SplitOnnx

KINDS = (SplitOnnx, CapacityPlan)

for _kind in KINDS:
    register(_kind)

CAPACITY = CapacityPlan.name   # a recipe's `capacity:` section runs as this stage, last (LoadedRecipe.stages)
SPLIT = SplitOnnx.name
