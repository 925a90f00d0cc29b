"""Managed-service rules, checked by reading the scripts (issue 23): every
script declares the keys it touches in KEYS, none runs without a key, and
none builds a key name.

ElastiCache Serverless refuses a script with no declared key, and one that
touches a key it did not declare; Dragonfly (by default) too; Upstash's
``allow-key-locking`` locks only the declared keys. A key a script computes
(``KEYS[1] .. ':x'``, a name from ARGV or from data) breaks all three, and
in a Cluster may lie on another slot. Channels are not keys: a script may
PUBLISH to a channel named in ARGV, or to one built from a template in ARGV
and a client id (aiolock/_core/protocol/scripts.py).

The one exception is cluster-only and generated, not written: a renewal's
*node form* (``_node_source``) declares one key and renews keys of other
slots of the same node with the ``allow-cross-slot-keys`` flag, one call per
node instead of one per slot. The scripts as written (checked here) and
every standalone call declare every key.
"""

from __future__ import annotations

import re

from aiolock._core.protocol.scripts import load_scripts, script_names

#: Commands a script calls whose first argument is not a key.
NOT_KEYED = frozenset({"PUBLISH", "SPUBLISH", "TIME", "INFO"})

_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'\s*(?:,\s*([^,)]+(?:\([^)]*\))?))?")


def _calls(source: str) -> list[tuple[str, str]]:
    code = "\n".join(line.split("--", 1)[0] for line in source.splitlines())
    return [(m.group(1).upper(), (m.group(2) or "").strip()) for m in _CALL.finditer(code)]


def _problem(command: str, key: str) -> str | None:
    """Why the first argument of a keyed command is not a declared key, or None."""
    if command in NOT_KEYED:
        return None
    if not key:
        return "no key"
    if ".." in key or "'" in key or '"' in key:
        return "a computed key name"
    if "ARGV" in key:
        return "a key from ARGV"
    return None


def test_the_check_can_fail() -> None:
    calls = _calls(
        "redis.call('DEL', KEYS[1] .. ':x')\nredis.call('GET', ARGV[1])\n"
        "redis.call('SET', 'k', 1)\nredis.call('PUBLISH', ARGV[2] .. cid, 'm')"
    )
    assert [_problem(c, k) for c, k in calls] == [
        "a computed key name",
        "a key from ARGV",
        "a computed key name",
        None,
    ]


def test_every_script_declares_a_key_and_touches_only_declared_keys() -> None:
    wrong: dict[str, object] = {}
    for name, script in load_scripts(*script_names()).items():
        # KEYS[1], or KEYS[i] for a batch: a batch call is never sent empty.
        if not re.search(r"^--\s+KEYS\[", script.source, re.M):
            wrong[name] = "its header declares no KEYS"
        problems = [(c, k, p) for c, k in _calls(script.source) if (p := _problem(c, k))]
        if problems:
            wrong[name] = problems
    assert len(script_names()) > 30
    assert not wrong, wrong
