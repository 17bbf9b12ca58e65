"""`optkit --version`: optkit's version from the installed metadata and, with -v, each runtime's, read from the
metadata too: no framework is imported."""
from __future__ import annotations

# runtime -> the distributions that install it (the first one installed is reported)
RUNTIMES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
    "openvino": ("openvino",),
    "torch": ("torch",),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-intel"),
    "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"),
}


def installed(*distributions: str) -> str | None:
    """The version of the first of these distributions that is installed, else None."""
    from importlib.metadata import PackageNotFoundError, version

    for name in distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def text(verbose: int = 0) -> str:
    """`optkit X.Y.Z`, and with verbose one line a runtime: its version or "not installed"."""
    from optkit import __version__

    lines = [f"optkit {installed('optkit') or __version__}"]
    if verbose:
        width = max(map(len, RUNTIMES))
        lines += [f"{name:<{width}}  {installed(*dists) or 'not installed'}" for name, dists in RUNTIMES.items()]
    return "\n".join(lines)
