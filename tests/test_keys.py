"""Every key and channel name of every primitive, pinned (aiolock/_core/protocol/keys.py).

These strings are how a Client finds what another Client (maybe of an older
version) wrote: changing one makes two versions disagree about who holds a
lock. So each is spelled out here in full. All of a primitive's names share
one hash tag (one Redis Cluster slot), and the Lua scripts build none.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from importlib import resources
from typing import Any

import pytest

from aiolock import Client
from aiolock._core.protocol.keys import (
    FairKeys,
    LatchKeys,
    LockKeys,
    RWKeys,
    SemaphoreKeys,
    main_key,
)
from aiolock._primitives import KINDS

CID = "0123456789abcdef0123456789abcdef"


def _names(keys: Any) -> dict[str, Any]:
    return {f.name: getattr(keys, f.name) for f in dataclasses.fields(keys)}


def test_main_key() -> None:
    assert main_key("aiolock", "orders:17") == "aiolock:{orders:17}"
    assert main_key("app", "x") == "app:{x}"


def test_lock_names() -> None:
    keys = LockKeys.of("p", "n")
    assert _names(keys) == {
        "main": "p:{n}",
        "channel": b"p:{n}:ch",
        "signal": "p:{n}:signal",
        "fence": "p:{n}:fence",
        "wq": "p:{n}:wq",
        "wait_prefix": "p:{n}:w:",
        "acquire": ("p:{n}", "p:{n}:fence", "p:{n}:wq", "p:{n}:signal"),
        "free": ("p:{n}", "p:{n}:fence", "p:{n}:signal", "p:{n}:wq"),
        "multi": ("p:{n}", "p:{n}:fence", "p:{n}:wq", "p:{n}:signal"),
    }
    assert keys.wait_channel(CID) == f"p:{{n}}:w:{CID}".encode()


def test_fair_names() -> None:
    keys = FairKeys.of("p", "n")
    assert _names(keys) == {
        "main": "p:{n}",
        "channel": b"p:{n}:ch",
        "signal": "p:{n}:signal",
        "fence": "p:{n}:fence",
        "queue": "p:{n}:q",
        "channel_prefix": "p:{n}:ch:",
        "signal_prefix": "p:{n}:sig:",
        "local": "p:{n}:fair",
        "all": ("p:{n}", "p:{n}:fence", "p:{n}:q"),
        "templates": ("p:{n}:ch:", "p:{n}:sig:"),
    }
    assert keys.client_channel(CID) == f"p:{{n}}:ch:{CID}".encode()
    assert keys.client_signal(CID) == f"p:{{n}}:sig:{CID}".encode()


def test_rw_names() -> None:
    keys = RWKeys.of("p", "n")
    assert _names(keys) == {
        "main": "p:{n}",
        "channel": b"p:{n}:ch",
        "signal": "p:{n}:signal",
        "fence": "p:{n}:fence",
        "rel": "p:{n}:rel",
        "wq": "p:{n}:wq",
        "rq": "p:{n}:rq",
        "wchannel": b"p:{n}:wch",
        "wsignal": "p:{n}:wsignal",
        "local": "p:{n}:rw",
        "acquire_read": (
            "p:{n}",
            "p:{n}:fence",
            "p:{n}:wq",
            "p:{n}:rq",
            "p:{n}:rel",
            "p:{n}:signal",
            "p:{n}:wsignal",
        ),
        "acquire_write": (
            "p:{n}",
            "p:{n}:fence",
            "p:{n}:wq",
            "p:{n}:rq",
            "p:{n}:rel",
            "p:{n}:signal",
            "p:{n}:wsignal",
        ),
        "release_read": ("p:{n}", "p:{n}:rel", "p:{n}:wsignal"),
        "release_write": (
            "p:{n}",
            "p:{n}:rel",
            "p:{n}:wq",
            "p:{n}:rq",
            "p:{n}:signal",
            "p:{n}:wsignal",
        ),
        "unwait": ("p:{n}:wq", "p:{n}", "p:{n}:rq", "p:{n}:signal", "p:{n}:wsignal"),
        "force_release": (
            "p:{n}",
            "p:{n}:wq",
            "p:{n}:rq",
            "p:{n}:signal",
            "p:{n}:wsignal",
            "p:{n}:fence",
        ),
    }


def test_semaphore_names() -> None:
    keys = SemaphoreKeys.of("p", "n")
    assert _names(keys) == {
        "main": "p:{n}",
        "channel": b"p:{n}:ch",
        "signal": "p:{n}:signal",
        "holders": "p:{n}:h",
        "released": "p:{n}:r",
        "fence": "p:{n}:fence",
        "local": "p:{n}:sem",
        "acquire": ("p:{n}", "p:{n}:h", "p:{n}:fence", "p:{n}:signal", "p:{n}:r"),
        "release": ("p:{n}", "p:{n}:h", "p:{n}:r", "p:{n}:signal"),
        "state": ("p:{n}", "p:{n}:h", "p:{n}:signal"),
        "force_release": ("p:{n}", "p:{n}:h", "p:{n}:signal", "p:{n}:fence"),
    }


def test_latch_names() -> None:
    keys = LatchKeys.of("p", "n")
    assert _names(keys) == {
        "main": "p:{n}",
        "channel": b"p:{n}:ch",
        "signal": "p:{n}:signal",
        "down": ("p:{n}", "p:{n}:signal"),
        "local": "p:{n}:latch",
    }


@pytest.mark.parametrize("kind", [LockKeys, FairKeys, RWKeys, SemaphoreKeys, LatchKeys])
@pytest.mark.parametrize("name", ["n", "user:42", "a b", "x}y", "{"])
def test_one_hash_tag_per_primitive(kind: type[LockKeys], name: str) -> None:
    """Every name of a primitive starts with its main key, whose hash tag is
    {<name>} (Redis hashes the text between the first "{" and the next "}"),
    and adds its suffix after that, so all land in one cluster slot."""
    prefix = "aiolock"
    keys = kind.of(prefix, name)
    main = f"{prefix}:{{{name}}}"
    assert keys.main == main
    tag = main[main.index("{") + 1 :]
    tag = tag[: tag.index("}")]

    def slot_text(value: str) -> str:
        start = value.index("{")
        end = value.index("}", start + 1)
        return value[start + 1 : end]

    found = []
    for value in _names(keys).values():
        for item in value if isinstance(value, tuple) else (value,):
            text = item.decode() if isinstance(item, bytes) else str(item)
            assert text.startswith(main)
            assert slot_text(text) == tag
            found.append(text)
    assert found


def test_primitives_use_them() -> None:
    client = Client.from_url("redis://127.0.0.1:1/0", prefix="pp")
    engine = client._engine
    assert client.lock("n")._names == LockKeys.of("pp", "n")
    assert client.lock("n")._wait_channel == LockKeys.of("pp", "n").wait_channel(engine.id)
    assert client.spin_lock("n")._names == LockKeys.of("pp", "n")
    assert client.fair_lock("n")._names == FairKeys.of("pp", "n")
    assert client.rw_lock("n")._names == RWKeys.of("pp", "n")
    assert client.semaphore("n", 2)._names == SemaphoreKeys.of("pp", "n")
    assert client.latch("n", 1)._names == LatchKeys.of("pp", "n")


def test_scripts_build_no_name() -> None:
    """A script gets every name in KEYS or ARGV (a per-Client name as a
    template, keys.py): no script appends a name's suffix itself."""
    folder = resources.files("aiolock").joinpath("scripts")
    for entry in folder.iterdir():
        if not entry.name.endswith(".lua"):
            continue
        code = "\n".join(line.split("--", 1)[0] for line in entry.read_text("utf-8").splitlines())
        assert not re.search(r"\.\.\s*['\"]:", code), entry.name
        assert not re.search(r"['\"]:[a-z]+:?['\"]\s*\.\.", code), entry.name


async def test_client_names_a_key_and_an_owner() -> None:
    """``client.key(name)`` and ``client.owner(task)`` are what the locks use."""
    client = Client.from_url("redis://127.0.0.1:1/0", prefix="pp")
    assert client.key("n") == "pp:{n}" == client.lock("n")._key
    task = asyncio.current_task()
    assert task is not None
    assert client.owner(task) == client._engine.owner(task)
    assert client.owner(task).startswith(f"{client.id}:")


def test_eviction_channel_names() -> None:
    """A force release's message to a holder's Client (scripts/_evict.lua):
    one channel per Client standalone, per Client and slot in cluster mode."""
    from aiolock._core.protocol.keys import lost_prefix

    assert lost_prefix("p") == "p:lost:"
    assert lost_prefix("p", "ABCD") == "p:{ABCD}:lost:"


#: Names that are no key holding state: wake-up lists, templates, local names.
NOT_STATE = {"signal", "wsignal", "local", "wait_prefix", "channel_prefix", "signal_prefix"}


def test_the_key_classes_build_the_declared_layout() -> None:
    """Every key a kind's key class (its spec's ``keys``) names that holds
    state is a part its spec declares (aiolock/_core/protocol/kinds.py), and
    the other way round: the layout
    the command line reads is the one the scripts are given."""
    main = main_key("p", "n")
    for spec in KINDS:
        assert spec.keys is not None, f"{spec.name}: no key class declared"
        keys = spec.keys("p", "n")
        named = {
            value[len(main) :]
            for field, value in _names(keys).items()
            if isinstance(value, str) and value.startswith(main) and field not in NOT_STATE
        }
        assert named == {part.suffix for part in spec.parts}, spec.name
