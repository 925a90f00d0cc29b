"""hiredis is a hard dependency: no untested pure-Python parsing path.

aiolock parses every reply with hiredis (``aiolock/_hiredis.py``). An
install without it must fail at import with a message that says how to fix
it, not fall back to code that no test runs.
"""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from pathlib import Path

import hiredis
import pytest

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


def test_commands_are_packed_by_hiredis_and_odd_arguments_by_the_python_loop() -> None:
    """Every command is encoded by hiredis' C encoder; an argument it refuses
    (an int subclass such as an IntEnum) is encoded by pack's Python loop to
    the same bytes, and one nobody can send (a bool, None) is a TypeError
    naming its type."""
    from aiolock._core.transport.resp import pack

    class Level(enum.IntEnum):
        HIGH = 7

    command = (b"EVALSHA", b"ab" * 20, 2, "k:{n}", "k:{n}:f", 30000, 1.5, b"", "\u00e9")
    assert pack(command) == hiredis.pack_command(command)
    with pytest.raises(TypeError):
        hiredis.pack_command((b"SET", "k", Level.HIGH))
    assert pack((b"SET", "k", Level.HIGH)) == hiredis.pack_command((b"SET", "k", 7))
    for refused in (True, None):
        with pytest.raises(TypeError, match=type(refused).__name__):
            pack((b"SET", "k", refused))
