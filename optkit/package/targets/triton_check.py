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


if __name__ == "__main__":
    for name in sys.argv[1:]:
        try:
            with open(name, encoding="utf-8") as f:
                out = parse(f.read())
        except Exception as e:  # the one line the caller shows
            print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(1)
        print(json.dumps(out, allow_nan=False))
