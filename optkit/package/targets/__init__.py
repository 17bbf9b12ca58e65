"""The built-in package targets: one module each, registered here by name (imported when first used).
A new target is one module with a `Target` subclass (optkit.package.target) and one line below."""
from optkit.package.target import register_target

register_target("triton", "optkit.package.targets.triton:TritonTarget")
register_target("mlflow", "optkit.package.targets.mlflow:MLflowTarget")
