"""Parse a config.pbtxt with Triton's ModelConfig (tritonclient's model_config_pb2) and print what it holds.

Runs in any Python that has tritonclient (it imports nothing else of optkit), so the tests can check with
the interpreter of a tool folder too:  python triton_check.py A.pbtxt [B.pbtxt ...]  -> one JSON line per file on
stdout, exit 1 with the parse error of the first that fails.
"""
from __future__ import annotations

import json
import sys


def parse(text: str) -> dict:
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
    return json_format.MessageToDict(cfg, preserving_proto_field_name=True)


def parse_if_installed(text: str) -> dict | None:
    """parse(text) where tritonclient is installed; None where it is not (a parse error raises)."""
    try:
        from tritonclient.grpc import model_config_pb2  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed (or broken): nothing to check with
        return None
    return parse(text)


def unavailable() -> str:
    """Why parse_if_installed cannot check in this Python (a clause of the note `optkit package` prints)."""
    import importlib.util

    installed = importlib.util.find_spec("tritonclient") is not None
    why = "tritonclient does not import in optkit's Python" if installed else "tritonclient is not installed in " \
        "optkit's Python"
    try:
        from google.protobuf import __version__ as protobuf
    except Exception:  # noqa: BLE001 - no protobuf at all: tritonclient would bring its own
        return why
    if int(protobuf.split(".")[0]) >= 7:  # tritonclient's model_config_pb2 needs protobuf<7
        why += f" (tritonclient needs protobuf<7 and this environment has {protobuf}: give it a venv of its own)"
    return why


if __name__ == "__main__":
    for name in sys.argv[1:]:
        try:
            with open(name, encoding="utf-8") as f:
                out = parse(f.read())
        except Exception as e:  # the one line the caller shows
            print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(1)
        print(json.dumps(out, allow_nan=False))
