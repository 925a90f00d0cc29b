"""The demo's configuration, shared by the parent, the workers and the views,
and the parent's own (synchronous) client of the server or cluster."""

from __future__ import annotations

from dataclasses import dataclass

import redis

# One hold: (lock index, fencing token, wait started, acquired, work done), ns.
Record = tuple[int, int, int, int, int]

TICK = 0.25  # how often workers report, seconds
WINDOW = 2.0  # live figures cover the last this many seconds


@dataclass(frozen=True, slots=True)
class Config:
    url: str
    prefix: str
    processes: int
    tasks: int
    locks: int
    duration: float
    uvloop: bool
    use_lock: bool
    cluster: bool = False
    """The server is a Redis Cluster / Valkey Cluster node (the demo's own
    clients are then ``RedisCluster``; aiolock's Clients find out by themselves)."""

    def lock_name(self, i: int) -> str:
        return f"lock-{i}"

    def data_key(self, i: int, what: str) -> str:
        # Demo data lives under the same prefix, so one SCAN (per node) cleans up
        # everything; the lock's name as hash tag puts a lock's data in one
        # cluster slot (the lock's own), so one pipeline reaches one node.
        return f"{self.prefix}:data:{{{self.lock_name(i)}}}:{what}"


#: The parent's client: of the one server, or of the whole cluster.
Admin = redis.Redis | redis.RedisCluster


def is_cluster(url: str) -> bool:
    """Whether the server at ``url`` is a cluster node (one ``INFO cluster``;
    a user not allowed INFO is taken for standalone, as aiolock's Client does)."""
    probe = redis.Redis.from_url(url, client_name="aiolock-demo-monitor")
    try:
        try:
            return bool(probe.info("cluster").get("cluster_enabled"))
        except redis.exceptions.NoPermissionError:
            return False
    finally:
        probe.close()


def make_admin(cfg: Config) -> Admin:
    if cfg.cluster:
        return redis.RedisCluster.from_url(cfg.url, client_name="aiolock-demo-monitor")
    return redis.Redis.from_url(cfg.url, client_name="aiolock-demo-monitor")


def masters(admin: Admin) -> list[redis.Redis]:
    """A client of each master (the one server, standalone): where the keys are."""
    if isinstance(admin, redis.RedisCluster):
        return [node.redis_connection for node in admin.get_primaries()]  # type: ignore[no-untyped-call]
    return [admin]


def nodes(admin: Admin) -> list[redis.Redis]:
    """A client of every node, replicas too (the one server, standalone)."""
    if isinstance(admin, redis.RedisCluster):
        return [node.redis_connection for node in admin.get_nodes()]  # type: ignore[no-untyped-call]
    return [admin]
