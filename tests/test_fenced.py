"""Fenced writes: ``client.fenced_set(key, value, token)`` and the README's SQL recipes.

The rule: a write is accepted unless its token is lower than the newest token
the key accepted (equal is accepted). The value is a plain string at ``key``;
the fence at ``client.fence_key(key)``, in the same cluster slot, with the
value's TTL.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

import aiolock
from aiolock import Client, InvalidArgumentError, InvalidArgumentTypeError, WrongTypeError
from aiolock.testing import expire

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
#: An address nobody serves: a call that reached for Redis would fail with
#: ConnectionFailedError, not with the argument error the test expects.
NOWHERE = "redis://127.0.0.1:1/0"


@pytest.fixture
async def redis(url: str) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(url)
    try:
        yield r
    finally:
        await r.aclose()


async def test_lower_refused_equal_and_higher_accepted(
    client: Client, redis: aioredis.Redis
) -> None:
    fence = client.fence_key("doc")
    assert await client.fenced_set("doc", "v10", 10) is True
    assert await client.fenced_set("doc", "v9", 9) is False
    assert await redis.get("doc") == b"v10" and await redis.get(fence) == b"10"
    assert await client.fenced_set("doc", "v10 again", 10) is True  # equal: accepted
    assert await client.fenced_set("doc", b"v11", 11) is True
    assert await client.fenced_set("doc", "v0", 0) is False
    assert await redis.get("doc") == b"v11" and await redis.get(fence) == b"11"
    # No TTL asked: neither expires.
    assert await redis.pttl("doc") == -1 and await redis.pttl(fence) == -1
    # Compared exactly, not as floats: 2**63 - 2 is lower than 2**63 - 1.
    top = 2**63 - 1
    assert await client.fenced_set("doc", "top", top) is True
    assert await client.fenced_set("doc", "below", top - 1) is False
    assert await redis.get("doc") == b"top"


async def test_the_fence_lives_as_long_as_the_value(client: Client, redis: aioredis.Redis) -> None:
    """``ttl=``: value and fence expire together; a refused write touches
    neither; a write without ``ttl`` makes both persistent again."""
    fence = client.fence_key(b"cache")
    assert await client.fenced_set(b"cache", "a", 5, ttl=300) is True
    value_ttl, fence_ttl = await redis.pttl(b"cache"), await redis.pttl(fence)
    assert 0 < value_ttl <= 300_000 and 0 < fence_ttl <= 300_000
    assert await client.fenced_set(b"cache", "b", 4) is False
    assert await redis.pttl(b"cache") > 0 and await redis.pttl(fence) > 0
    assert await client.fenced_set(b"cache", "c", 6) is True
    assert await redis.pttl(b"cache") == -1 and await redis.pttl(fence) == -1
    # A value deleted by hand leaves its fence: a stale writer cannot bring it back.
    await redis.delete(b"cache")
    assert await client.fenced_set(b"cache", "stale", 5) is False
    assert await redis.exists(b"cache") == 0


async def test_concurrent_writers(client: Client, make_client: Any, url: str) -> None:
    """Writers racing on three Clients: the newest token's value is what
    stays. The second asks ``replicas=1`` of a server without replicas
    (acquisitions only are acknowledged: a fenced write is not held up); the
    third runs the script as a Redis Function (``scripting="functions"``)."""
    acked = await make_client(replicas=1, replica_timeout=0.1)
    functions = await make_client(scripting="functions")
    clients = [client, acked, functions]
    results = await asyncio.gather(
        *(clients[t % 3].fenced_set("race", f"v{t}", t) for t in range(40, 0, -1))
    )
    assert results[0] is True  # the highest token always wins (nothing is above it)
    r = aioredis.Redis.from_url(url)
    try:
        assert await r.get("race") == b"v40"
        assert await r.get(client.fence_key("race")) == b"40"
        assert "_fenced_set" in str(await r.function_list())  # (the library is loaded)
    finally:
        await r.aclose()


def test_fence_key_is_in_the_key_slot() -> None:
    """Whatever the key looks like (a hash tag of its own, braces that make
    none, bytes), its fence is in its cluster slot (redis-py's key_slot)."""
    client = Client.from_url(NOWHERE, prefix="pp")
    keys: list[Any] = [
        "plain", "user:{42}:profile", "{}", "a}b{c", "}{", "{a", "x{}y{z}", "ünï",
        b"\xff\x00bytes", b"{tag}rest", *(f"k{n}" for n in range(200)),
    ]  # fmt: skip
    for key in keys:
        fence = client.fence_key(key)
        assert type(fence) is type(key)
        assert key_slot(fence if isinstance(fence, bytes) else fence.encode()) == key_slot(
            key if isinstance(key, bytes) else key.encode()
        ), key
        assert re.match(rb"pp:fenced:\{[@-O]{4}\}:", fence if isinstance(fence, bytes) else
                        fence.encode())  # fmt: skip
    assert len({client.fence_key(k) for k in keys}) == len(keys)


#: Bad arguments, the error each raises and words of its message.
BAD_INPUT: list[tuple[tuple[Any, ...], type[Exception], str]] = [
    (("", "v", 1), InvalidArgumentError, "non-empty"),
    ((b"", "v", 1), InvalidArgumentError, "non-empty"),
    ((1, "v", 1), InvalidArgumentTypeError, "key must be a str or bytes"),
    (("k", 1, 1), InvalidArgumentTypeError, "value must be a str or bytes"),
    (("k", None, 1), InvalidArgumentTypeError, "value must be a str or bytes"),
    (("k", "v", -1), InvalidArgumentError, "token must be an int from 0"),
    (("k", "v", 2**63), InvalidArgumentError, "token must be an int from 0"),
    (("k", "v", True), InvalidArgumentTypeError, "token must be an int"),
    (("k", "v", 1.0), InvalidArgumentTypeError, "token must be an int"),
    (("k", "v", "1"), InvalidArgumentTypeError, "token must be an int"),
]


async def test_bad_input_is_refused_before_any_round_trip() -> None:
    """On a Client of an address nobody serves: a check that came after a
    round trip would raise ConnectionFailedError instead."""
    client = Client.from_url(NOWHERE)
    for args, error, words in BAD_INPUT:
        with pytest.raises(error, match=words):
            await client.fenced_set(*args)
    with pytest.raises(InvalidArgumentError, match="ttl"):
        await client.fenced_set("k", "v", 1, ttl=0)
    with pytest.raises(InvalidArgumentTypeError, match="ttl"):
        await client.fenced_set("k", "v", 1, ttl="1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="key"):
        client.fence_key(None)  # type: ignore[arg-type]
    assert client.statistics().command_connects == 0
    await client.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        await client.fenced_set("k", "v", 1)


async def test_a_key_of_another_type_is_refused_unchanged(
    client: Client, redis: aioredis.Redis
) -> None:
    await redis.hset("h", "f", "x")
    with pytest.raises(WrongTypeError) as caught:
        await client.fenced_set("h", "v", 1)
    assert caught.value.__cause__ is not None
    assert await redis.exists(client.fence_key("h")) == 0 and await redis.type("h") == b"hash"
    await redis.rpush(client.fence_key("s"), "x")
    with pytest.raises(WrongTypeError):
        await client.fenced_set("s", "v", 1)
    assert await redis.exists("s") == 0


async def test_cancelled_then_retried_with_the_same_token(
    client: Client, redis: aioredis.Redis
) -> None:
    """Cancelled on the wire, the write happened or not (all or nothing); the
    retry with the same token is accepted either way."""
    assert await client.fenced_set("c", "old", 1)
    task = asyncio.create_task(client.fenced_set("c", "new", 2))
    await asyncio.sleep(0)  # the script is sent
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await redis.get("c") in (b"old", b"new")
    assert await client.fenced_set("c", "new", 2) is True
    assert await redis.get("c") == b"new"


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
async def test_on_a_cluster(cluster_url: str) -> None:
    """Keys of many slots, with and without hash tags: each call runs on the
    key's node (a fence in another slot would fail with CROSSSLOT)."""
    async with Client.from_url(cluster_url) as client:
        keys = ["a", "b", "c", "user:{7}:x", "user:{7}:y", "a}b", b"\x00bin"]
        for key in keys:
            assert await client.fenced_set(key, "one", 5) is True
            assert await client.fenced_set(key, "two", 4) is False
            assert await client.fenced_set(key, "three", 6, ttl=60) is True
        rc = aioredis.RedisCluster.from_url(cluster_url)
        try:
            for key in keys:
                assert await rc.get(key) == b"three"
        finally:
            await rc.aclose()


# -- the README's recipes ------------------------------------------------------------------


def recipe(title: str) -> dict[str, Any]:
    """Run the Python block under the README heading ``title``; its names."""
    match = re.search(rf"^#### {re.escape(title)}\n(.*?)(?=^#|\Z)", README, re.M | re.S)
    assert match, f"README has no '#### {title}'"
    blocks = re.findall(r"```python\n(.*?)```", match.group(1), re.S)
    assert len(blocks) == 1, title
    names: dict[str, Any] = {}
    exec(blocks[0], names)
    return names


async def test_recipe_fence_column(client: Client, other_client: Client) -> None:
    """Kleppmann's paused client with two competing holders of a real lock:
    A's lease expires, B takes the lock and writes (the row, and a value with
    ``fenced_set``); A's late writes with its older token are refused."""
    names = recipe("A fence column")
    db = sqlite3.connect(":memory:")
    names["create"](db)
    db.execute("INSERT INTO documents (id, body) VALUES (1, 'first')")
    write = names["write_document"]
    a = await client.lock("document:1").acquire()
    assert write(db, 1, "by A", a.fencing_token)
    await expire(a)  # A pauses past its lease
    async with other_client.lock("document:1") as b:
        assert b.fencing_token > a.fencing_token
        assert write(db, 1, "by B", b.fencing_token)
        assert write(db, 1, "by B again", b.fencing_token)  # the same holder
        assert await other_client.fenced_set("document:1:title", "B", b.fencing_token)
    assert not write(db, 1, "late A", a.fencing_token)
    assert not await client.fenced_set("document:1:title", "A", a.fencing_token)
    assert a.lost
    with pytest.raises(aiolock.LockNotOwnedError):
        await a.release()
    assert db.execute("SELECT body, fence FROM documents").fetchall() == [
        ("by B again", b.fencing_token)
    ]


async def test_recipe_version_column(client: Client, other_client: Client) -> None:
    names = recipe("A version column (read, modify, write)")
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER, version INTEGER)")
    db.execute("INSERT INTO accounts VALUES (1, 100, 0)")
    add = names["add_to_balance"]
    a = await client.lock("account:1").acquire()
    seen_by_a = db.execute("SELECT balance, version FROM accounts").fetchone()
    await expire(a)  # A pauses, with what it read, past its lease
    async with other_client.lock("account:1") as b:
        seen = db.execute("SELECT balance, version FROM accounts").fetchone()
        assert add(db, 1, seen, 10, b.fencing_token)
    assert not add(db, 1, seen_by_a, 1, a.fencing_token)
    assert db.execute("SELECT balance, version FROM accounts").fetchone() == (
        110,
        b.fencing_token,
    )
