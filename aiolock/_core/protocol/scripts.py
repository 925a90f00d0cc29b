"""The Lua scripts, one ``.lua`` file per operation under ``aiolock/scripts``.

Each file starts with its contract: KEYS, ARGV and the return value. A line
``--@include _x.lua`` is replaced by that file's text (once per script: a
snippet that two others include appears once), so a snippet shared by
several scripts (the fencing counter) is written once. Script objects belong
to one Client; how they are loaded, run and recovered when a server lost them
is the script runner's business alone (runner.py).

A script builds no key or channel name: it gets every key it touches in
KEYS and every channel in ARGV, and a name that depends on a client id it
finds in Redis as a template in ARGV (the part before the id). All of them
come from aiolock/_core/protocol/keys.py.

A refused command changes nothing: every script that writes checks the type
of each key it may write, on any path, before its first write (``_types.lua``)
and fails with a ``WRONGTYPE aiolock: key <key> holds a ...`` error when one
holds a value of another type (Redis keeps the writes a script made before an
error). An acquire script also checks the keys that the release and the
wake-ups of its primitive will write, so a cycle is refused at its start,
never half done (a refused release would leave the hold). On the plain
lock's hot path the checks cost no TYPE per key: typed reads that precede
every write, and one EXISTS for the keys only waiters bring into being.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..errors import WrongTypeError

__all__ = [
    "ALLOW_OOM",
    "CROSS_SLOT",
    "NODE",
    "NO_WRITES",
    "RENEWALS",
    "Script",
    "load_scripts",
    "node_call",
    "refused",
    "script_names",
]


def _runner_tags(name: str) -> frozenset[str]:
    """What a script's header tells the runner: its ``--@runner`` line's words
    (``renewal``, ``cross-slot``, ``no-writes``, ``allow-oom``). The runner
    names no primitive: a script declares what it needs."""
    text = resources.files("aiolock").joinpath("scripts", f"{name}.lua").read_text("utf-8")
    for line in text.splitlines():
        if line.startswith("--@runner "):
            return frozenset(w for w in line.split("(", 1)[0].split()[1:])
    return frozenset()


def _tagged(tag: str) -> frozenset[str]:
    return frozenset(name for name in script_names() if tag in _runner_tags(name))


#: The suffix of a renewal script's node form (cluster mode): ``"renew@node"``.
NODE = "@node"
# The node form's preamble: KEYS[1] (declared: it routes the call), ARGV[1] =
# the number n of keys in all, ARGV[2..n] the other keys (undeclared), then the
# script's own ARGV. The script's text reads KEYS_ and ARGV_ instead.
_NODE_PREAMBLE = """\
local KEYS_, ARGV_ = {KEYS[1]}, {}
do
    local n = tonumber(ARGV[1])
    for i = 2, n do KEYS_[i] = ARGV[i] end
    for i = n + 1, #ARGV do ARGV_[i - n] = ARGV[i] end
end
"""
_KEYS_ARGV = re.compile(r"\b(KEYS|ARGV)\b")


@functools.cache
def _source(filename: str) -> str:
    return _expand(filename, set())


def _cluster_source(name: str, source: str) -> str:
    """A script's cluster-mode text: every ``PUBLISH`` is a sharded ``SPUBLISH``.

    In a cluster a classic PUBLISH is broadcast to every node but counts only
    the receivers connected to the node that ran it, and aiolock grants a lock
    to a waiting Client when PUBLISH reports a receiver: with classic pub/sub
    that could grant a hold Redis never recorded. SPUBLISH counts the
    subscribers of the slot's own shard, where each Client listens
    (SSUBSCRIBE on the slot's master). The ``CROSS_SLOT`` scripts also get
    the ``allow-cross-slot-keys`` flag (Redis 7.0+, Valkey 7.2+): keys they
    access without declaring them may lie on other slots of the node.
    """
    text = source.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")
    if name in CROSS_SLOT:
        text = "#!lua flags=allow-cross-slot-keys\n" + text
    return text


#: What a script's PUBLISH becomes where scripts may not publish (see
#: ``_unpublished_source``): a function that reaches nobody.
_UNPUBLISHED = "local function aiolock_unpublished() return 0 end\n"
_PUBLISH_CALL = re.compile(r"redis\.call\('S?PUBLISH',\s*")
#: The capability probe (topology/probe.py): it asks whether a script may
#: PUBLISH, so it always runs as written.
PROBE = "probe"


def _unpublished_source(source: str) -> str:
    """A script's text for a server that refuses ``PUBLISH`` (and
    ``SPUBLISH``) inside scripts (Alibaba Tair's cluster, a server whose
    command is renamed away): every publish reaches nobody (0 receivers).

    So a release never grants a lock to a waiting Client in its own script
    (a grant needs a receiver: ``_wake.lua``) and only wakes waiters through
    the signal lists (``notify="list"``; the Client refuses ``"pubsub"``
    there). A force release's word to the holder's Client (``_evict.lua``)
    is not sent either: that Client learns of the loss at its next renewal.
    The helper goes after a ``#!lua`` line, which must stay the first.
    """
    text = _PUBLISH_CALL.sub("aiolock_unpublished(", source)
    if text.startswith("#!"):
        first, _, rest = text.partition("\n")
        return first + "\n" + _UNPUBLISHED + rest
    return _UNPUBLISHED + text


def _node_source(source: str) -> str:
    """A renewal script's node form, from its cluster text: the same script
    over keys of many slots of one node, of which only the first is declared
    (see ``_NODE_PREAMBLE`` and ``node_call``).

    A key it touches that this node does not serve (its slot moved, or is
    migrating and the key is gone already) fails the whole call ("Script
    attempted to access a non local key"), never reads as missing: the caller
    splits the batch then (holds/lifecycle.py). It must never run after an ``ASKING``:
    a key of a slot this node imports would then read as missing.
    """
    flag, _, body = source.partition("\n")
    return flag + "\n" + _NODE_PREAMBLE + _KEYS_ARGV.sub(r"\1_", body)


def node_call(keys: list[Any], args: list[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The KEYS and ARGV of a node-form call (``name + NODE``) for ``keys`` and
    the script's own ``args``: the first key declared, the rest in ARGV."""
    return (keys[0],), (len(keys), *keys[1:], *args)


def _expand(filename: str, included: set[str]) -> str:
    text = resources.files("aiolock").joinpath("scripts", filename).read_text("utf-8")
    lines = []
    for line in text.splitlines():
        if line.startswith("--@include "):
            snippet = line.split(None, 1)[1].strip()
            if snippet not in included:
                included.add(snippet)
                lines.append(_expand(snippet, included))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its name, source and SHA1 (what the runner sends)."""

    name: str
    source: str
    sha: str

    @classmethod
    def from_file(cls, name: str, cluster: bool = False) -> Script:
        source = _source(f"{name}.lua")
        if cluster:
            source = _cluster_source(name, source)
        return cls(name, source, _sha(source))

    def unpublished(self) -> Script:
        """This script for a server that refuses PUBLISH in scripts
        (``_unpublished_source``); the probe stays as it is."""
        if self.name == PROBE:
            return self
        source = _unpublished_source(self.source)
        return Script(self.name, source, _sha(source))


def script_names() -> list[str]:
    """Every operation under aiolock/scripts (files starting with _ are snippets)."""
    folder = resources.files("aiolock").joinpath("scripts")
    return sorted(
        entry.name[: -len(".lua")]
        for entry in folder.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    )


#: The watchdog's batch scripts (``--@runner renewal``): one key per renewed
#: item (of many names), the same per-item result. In cluster mode each also
#: has a *node form* (``name + NODE``, see ``_node_source``) that renews the
#: items of many slots of one node in one call.
RENEWALS = _tagged("renewal")
#: Scripts that take keys of many names (the renewals, and ``--@runner
#: cross-slot``). In cluster mode they run with the ``allow-cross-slot-keys``
#: flag. Note what the flag allows: a script may *access* keys of other slots
#: of its node that it did not declare; its declared KEYS must still share one
#: slot (else CROSSSLOT, flag or not). So a call that spans slots declares one
#: key and passes the others in ARGV (the renewals' node form).
CROSS_SLOT = RENEWALS | _tagged("cross-slot")
#: Scripts that only read (``--@runner no-writes``): as Redis Functions
#: (functions.py) they are flagged ``no-writes``; their EVAL text is unchanged.
NO_WRITES = _tagged("no-writes")
#: Scripts that free or keep a hold (``--@runner allow-oom``: releases, renewals,
#: leaving a queue): as Redis Functions they are flagged ``allow-oom``, so that
#: they run while the server is out of memory, as their EVAL text does (Redis
#: refuses a flagged script as a whole under OOM, an EVAL script only at a
#: write that adds memory before its first write).
ALLOW_OOM = _tagged("allow-oom")


def load_scripts(
    *names: str, cluster: bool = False, publish: bool = True
) -> dict[str, Script]:
    """Fresh Script objects for one Client (all of them when no name is given);
    ``cluster``: their cluster-mode text (see ``_cluster_source``);
    ``publish=False``: their unpublished variant (``_unpublished_source``),
    for a server that refuses PUBLISH inside scripts."""
    scripts = {name: Script.from_file(name, cluster) for name in names or script_names()}
    if cluster:
        for name in RENEWALS & scripts.keys():
            source = _node_source(scripts[name].source)
            scripts[name + NODE] = Script(name + NODE, source, _sha(source))
    if not publish:
        scripts = {name: script.unpublished() for name, script in scripts.items()}
    return scripts


def _sha(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8")).hexdigest()


def refused(exc: BaseException) -> bool:
    """Whether Redis refused a script (or a command) with WRONGTYPE: a key
    holds a value of another type than aiolock keeps there. Scripts check
    their keys' types before their first write, so nothing changed."""
    return isinstance(exc, WrongTypeError)
