"""The Engine's commands: every script and plain command a primitive sends, routed by key.

``Commands`` is a base class of the ``Engine`` (its methods are the Engine's
own: no call frame more on the acquire and release paths): the deployment
settled once, on first use (``_settle``: find out the mode, discover the
cluster, start watching the Sentinels); a command routed to the lane that
serves its key (``_route``); the scripts run through the runner
(protocol/runner.py); idempotent clean-ups retried in the background
(``retry``, ``clean_up``, ``spawn``). The attributes it reads are the Engine's
(made in ``Engine.__init__``), declared here for the type checker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Hashable
from typing import Any

from .errors import TRANSIENT
from .protocol.runner import ScriptRunner
from .protocol.scripts import Script
from .topology.cluster import Topology
from .topology.deployment import Capabilities, Deployment
from .transport.connection import Lane, Orphan

__all__ = ["Commands"]

log = logging.getLogger("aiolock.lock")


class Commands:
    """What the Engine sends to Redis, and when it may (see the module docstring)."""

    # The Engine's (Engine.__init__ makes them).
    closed: bool
    runner: ScriptRunner
    deployment: Deployment
    mux: Lane
    background: set[asyncio.Task[Any]]
    _settling: asyncio.Task[None] | None
    _settled: bool

    # -- Redis, routed by key ------------------------------------------------------------------

    def _route(self, key: Any) -> Lane:
        """The command lane that serves ``key``: standalone, the one command
        connection; in cluster mode the ``ClusterMux``, which sends each
        command to the master of its key's slot (topology/mux.py).

        The only place that picks a connection for a primitive's command.
        """
        return self.mux

    def shard(self, key: Any) -> Hashable:
        """Which server serves ``key``: in cluster mode the name (``host:port``)
        of the master of its slot by the current slot map (None while no
        master serves it), standalone None (one server). Calls of keys of one
        shard may share a batch (the watchdog's renewals)."""
        return self.deployment.shard(key)

    async def call(self, key: Any, *command: Any) -> Any:
        """Send a plain command about ``key`` (its first argument after the name)
        and return the reply, e.g. ``call(key, b"PTTL", key)``."""
        if not self._settled:
            await self._settle()
        return await self._route(key).call(*command)

    # -- the deployment: standalone, Sentinel or Cluster ---------------------------------------

    @property
    def cluster(self) -> bool | None:
        """True in cluster mode, False standalone, None until the first use finds out."""
        return self.deployment.cluster

    @property
    def topology(self) -> Topology | None:
        """The cluster's slot map (cluster mode, once discovered), else None."""
        return self.deployment.topology

    @property
    def capabilities(self) -> Capabilities:
        """What the server(s) can do, as the deployment describes it."""
        return self.deployment.capabilities

    async def is_cluster(self) -> bool:
        """True in cluster mode, False standalone; on first use it finds out
        (as the first command does: see ``_settle``). Sends nothing once known."""
        if not self._settled:
            await self._settle()
        return bool(self.deployment.cluster)

    async def _settle(self) -> None:
        """Settle the deployment (find out the mode, discover the cluster,
        start watching the Sentinels), once: every command waits for it on
        first use. Fails like a command if the server cannot be reached; the
        next command tries again."""
        task = self._settling
        # A task that is done: it failed (the next command tries again), or it
        # succeeded and the Client was told to settle again (``reprobe``).
        if task is None or task.done():
            task = self._settling = asyncio.get_running_loop().create_task(
                self._set_mode(), name="aiolock-settle"
            )
        await asyncio.shield(task)

    async def _set_mode(self) -> None:
        """(The Engine's: it settles the deployment on itself, as its ``Wiring``.)"""
        raise NotImplementedError

    # -- scripts (the runner, runner.py) ------------------------------------------------------

    @property
    def scripts(self) -> dict[str, Script]:
        """The Client's scripts by name (their text and SHA1: the runner's)."""
        return self.runner.scripts

    @scripts.setter
    def scripts(self, scripts: dict[str, Script]) -> None:
        self.runner.use(scripts)

    def submit_script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]
    ) -> asyncio.Future[Any]:
        """Send a script for ``keys[0]`` now; the future gets its reply."""
        if not self._settled:
            return asyncio.ensure_future(self.eval(name, keys, args))
        return self.runner.submit(name, keys, args)

    def send_script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], callback: Orphan
    ) -> None:
        """Send a script for ``keys[0]``; ``callback(reply, error)`` runs from the reply's parse.

        It must not raise: an exception is logged, and the callback is given
        no second call. (A script the server lost is loaded and sent again
        once by the runner first.)
        """

        def guarded(reply: Any, error: BaseException | None) -> None:
            try:
                callback(reply, error)
            except Exception:
                log.exception("reply handler of the script %r failed", name)

        if not self._settled:  # (only before the first command: see _settle)
            fut = asyncio.ensure_future(self.eval(name, keys, args))
            fut.add_done_callback(
                lambda f: (
                    guarded(None, f.exception())
                    if f.exception() is not None
                    else guarded(f.result(), None)
                )
            )
            return
        self.runner.send(name, keys, args, callback)  # (it logs a handler's exception)

    def eval(
        self,
        name: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        orphan: Any = None,
        mux: Lane | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Run a script for ``keys[0]`` (``ScriptRunner.eval``: a script the
        server lost is loaded and run again once); await it for the reply.
        ``orphan(reply, error)`` runs if the caller gives up before the reply
        (see ``undo``); ``mux`` is the watchdog's own lane.

        Every acquisition passes here with its ``orphan``: with ``replicas`` (or
        ``wait_aof``) it runs on the acknowledged lane (replication.py) and
        returns only once the replicas acknowledged it; else it was undone by
        ``orphan`` and ReplicationError is raised.

        (Once the mode is known, the runner's own coroutine: no frame more on
        every acquire.)
        """
        if not self._settled:
            return self._settle_then_eval(name, keys, args, orphan, mux)
        return self.runner.eval(name, keys, args, orphan, mux)

    async def _settle_then_eval(
        self,
        name: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        orphan: Any,
        mux: Lane | None,
    ) -> Any:
        await self._settle()
        return await self.runner.eval(name, keys, args, orphan, mux)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task %s failed: %r", task.get_name(), task.exception())

    async def retry(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], attempts: int = 5
    ) -> Any:
        """Run an idempotent script, retrying transient errors with backoff."""
        delay = 0.05
        for attempt in range(attempts):
            try:
                return await self.eval(name, keys, args)
            except TRANSIENT:
                if attempt == attempts - 1 or self.closed:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def clean_up(self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]) -> None:
        """Run an idempotent clean-up script in the background (``retry``, spawned)."""
        self.spawn(self.retry(name, keys, args))
