"""Shared fixtures: paths to the sample models and real cases, and a way to run the real CLI."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
REALCASES = ROOT.parent / "shared" / "realcases"

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# the per-user cache (quantize's kernel table, the TensorRT timing cache) is the suite's own, never the real one
_CACHE = tempfile.mkdtemp(prefix="optkit-test-cache-")
os.environ["OPTKIT_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)


def pytest_configure(config):
    """Byte-compile optkit once, before the workers start: the suite starts thousands of `python -m optkit` processes, and
    where PYTHONDONTWRITEBYTECODE is set (as on our CI machines) each one compiled optkit's modules from source,
    ~0.1 s apiece. A .pyc in __pycache__ is read even under that variable."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        import compileall

        compileall.compile_dir(str(ROOT / "optkit"), quiet=1)


@dataclass
class Result:
    rc: int
    out: str
    err: str


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> Result:
    """Run `python -m optkit ARGS` as a user would; returns exit code, stdout and stderr."""
    proc = subprocess.run([sys.executable, "-m", "optkit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES


@pytest.fixture(scope="session")
def realcases() -> Path:
    if not (REALCASES / "mnist.onnx").exists():
        pytest.skip("../shared/realcases is not present")
    return REALCASES


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server on 127.0.0.1 for the whole session (tests/_postgres.py), always stopped; each
    test module uses databases of its own names on it."""
    from _postgres import Postgres, why_not

    missing = why_not()
    if missing:
        pytest.skip(f"no PostgreSQL server: {missing}")
    server = Postgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def sample_bench_report(tmp_path_factory) -> dict:
    """A real `optkit bench --report` of the sample CNN (100 runs), made once: the report a gate reads, as a user
    has it. Tests edit copies of it."""
    import json

    path = tmp_path_factory.mktemp("bench") / "bench.json"
    r = run_cli("bench", SAMPLES / "torch_cnn.onnx", "--runs", "100", "--report", path)
    assert r.rc == 0, r.err
    return json.loads(path.read_text())


def one_error_line(result: Result) -> str:
    """The single error line a failing command prints (no traceback)."""
    lines = [line for line in result.err.strip().splitlines() if line.strip()]
    assert "Traceback" not in result.err, result.err
    assert lines and lines[-1].startswith("error: "), result.err
    return lines[-1]


def no_result_files(folder: Path) -> list[str]:
    """Files in `folder` (recursively) — used to check that a failed run left nothing behind."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def fresh_home_and_tmp(tmp_path_factory, monkeypatch):
    """Every command of the test runs with a HOME and a TMPDIR of its own, which must be as empty afterwards as
    before: optkit writes only what it was asked to (onnxruntime's `.ses` session-id file aside)."""
    tmp_path_factory.getbasetemp()  # pytest's own folders stay where they are
    home, tmp = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("tmpdir")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(tmp))
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "OPTKIT_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    yield home, tmp
    left = sorted(str(p) for d in (home, tmp) for p in d.rglob("*") if p.name != ".ses")
    assert left == [], f"left in HOME or TMPDIR: {left[:5]}"


@pytest.fixture(scope="module")
def preprocessed(tmp_path_factory, samples):
    """The sample CNN behind uint8 preprocessing (`optkit preprocess`, a gray 8x8 spec): input image [batch,
    height, width, 1], dynamic height and width; split gives a pre and a core part."""
    out = tmp_path_factory.mktemp("pre") / "cnn_u8.onnx"
    r = run_cli("preprocess", samples / "torch_cnn.onnx", "-o", out, "--preprocess",
                "{color: gray, resize: 8, center_crop: 8}")
    assert r.rc == 0, r.err
    return out
