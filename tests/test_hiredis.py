"""hiredis is a hard dependency: no untested pure-Python parsing path.

aiolock parses every reply with hiredis (``aiolock/_hiredis.py``). An
install without it must fail at import with a message that says how to fix
it, not fall back to code that no test runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hiredis

import aiolock._core.transport.resp
import aiolock._core.waiting.wire

ROOT = Path(__file__).resolve().parent.parent

# ``sys.modules[name] = None`` makes ``import name`` raise ImportError.
_WITHOUT_HIREDIS = """
import sys
sys.modules["hiredis"] = None
try:
    import aiolock
except ImportError as exc:
    print("ImportError:", exc)
else:
    print("imported")
"""


def test_import_without_hiredis_fails_and_says_what_to_install() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_HIREDIS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    out = proc.stdout.strip()
    assert out.startswith("ImportError: aiolock needs hiredis"), out
    assert "pip install 'redis[hiredis]'" in out


def test_connections_parse_with_hiredis() -> None:
    assert aiolock._core.transport.resp.hiredis is hiredis
    assert aiolock._core.waiting.wire.hiredis is hiredis
