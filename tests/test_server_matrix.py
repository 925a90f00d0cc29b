"""The server matrix beyond the contract suite's runs (tests/test_contract.py
runs every contract on Redis 6.2 and Valkey 9.1 too): what Redis 6.2 lacks is
refused clearly, at first use, naming the version."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aiolock import Client, UnsupportedServerError
from tests.cluster_servers import ClusterProcess
from tests.conftest import kind_and_binary, require_cluster_mode


@pytest.fixture
def redis62_cluster() -> Iterator[ClusterProcess]:
    require_cluster_mode()
    cluster = ClusterProcess(*kind_and_binary("redis-6.2"), node_timeout_ms=5000)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_a_redis_6_2_cluster_is_refused_at_first_use_naming_the_version(
    redis62_cluster: ClusterProcess,
) -> None:
    """A Cluster needs sharded pub/sub (Redis 7.0): the first command says so,
    and nothing is written."""
    async with Client.from_url(redis62_cluster.url, cluster=True) as client:
        lock = client.lock("x")
        with pytest.raises(UnsupportedServerError, match=r"6\.2.*needs Redis 7\.0") as info:
            await lock.acquire()
        assert "Redis 7.0" in str(info.value)
    for node in redis62_cluster.masters():
        assert node.execute("DBSIZE") == 0
