"""A master and a replica whose replication stream runs through a stallable proxy.

``ReplicatedPair(kind)`` (a sync context manager, usable from a session
fixture, a test or a benchmark):

* ``.master`` and ``.replica``: ``ServerProcess``es (no persistence);
* ``.proxy``: a ``TcpProxy`` to the master, run on an event loop of its own
  in a background thread, through which the replica replicates;
* ``stall()`` / ``resume()``: black-hole the replication stream (the replica
  stays connected, nothing reaches it, its acknowledgements stop) and let it
  flow again (the bytes held are delivered: no resync);
* ``wait_in_sync()``: a test write on the master acknowledged by the replica
  (``WAIT 1``): a replica fresh from a full sync says ``online`` before it
  applies writes, for up to a second;
* ``promote()``: SIGKILL the master and make the replica a master
  (``REPLICAOF NO ONE``); the pair is then spent (``restart()`` makes a fresh
  one: master restarted empty, the replica following it again).

Everything is synchronous (plain redis-py admin connections, the proxy's
loop in its thread), so it can be driven from inside a test's event loop
between awaits, or from a benchmark script.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, Self, TypeVar

from tests.servers import LOOPBACK, ServerKind, ServerProcess, TcpProxy, server_binary

__all__ = ["ReplicatedPair"]

T = TypeVar("T")


class ReplicatedPair:
    """A master, and a replica of it through a ``TcpProxy`` (see the module docstring)."""

    def __init__(self, kind: ServerKind, binary: str | None = None) -> None:
        exe = server_binary(kind, binary)
        self.kind = kind
        self.binary = exe
        # No 5 s wait for more replicas before a full sync starts.
        self.master = ServerProcess(kind, exe, extra_args=("--repl-diskless-sync-delay", "0"))
        # repl-timeout: a stalled stream must not make either side drop the link
        # during a test (the default, 60 s, is already longer than any test).
        self.replica = ServerProcess(kind, exe, extra_args=("--repl-timeout", "60"))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.proxy: TcpProxy | None = None
        self.stalled = False

    # -- life cycle --------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="replication-proxy")
        self._thread.daemon = True
        self._thread.start()
        self._follow()

    def _follow(self) -> None:
        """A new proxy to the (current) master; the replica follows it through it."""
        old = self.proxy
        if old is not None:
            self._run(old.aclose)
        proxy = self.proxy = TcpProxy.to(self.master)
        self._run(proxy.start)
        self.stalled = False
        self.replica.execute("REPLICAOF", LOOPBACK, proxy.port)
        self.wait_in_sync()

    def stop(self) -> None:
        if self.proxy is not None and self._loop is not None:
            self._run(self.proxy.aclose)
        self.proxy = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(5)
            self._loop.close()
            self._loop = None
        self.master.stop()
        self.replica.stop()

    def restart(self) -> None:
        """A fresh pair after ``promote()`` (or to start over): the master
        (re)started empty, the replica emptied and following it again."""
        if not self.master.running:
            self.master.start()
        self.master.flushall()
        self._follow()

    # -- faults ------------------------------------------------------------------------

    def stall(self) -> None:
        """Black-hole the replication stream: the replica receives nothing and
        acknowledges nothing until ``resume()``."""
        assert self.proxy is not None
        self._call(self.proxy.blackhole)
        self.stalled = True

    def resume(self) -> None:
        """Let the stream flow again (what was held is delivered)."""
        assert self.proxy is not None
        self._call(self.proxy.restore)
        self.stalled = False

    def promote(self) -> None:
        """SIGKILL the master, then make the replica a master (``REPLICAOF NO ONE``)."""
        self.master.kill()
        self.replica.execute("REPLICAOF", "NO", "ONE")

    def wait_in_sync(self, timeout: float = 10.0) -> None:
        """Until a write on the master is acknowledged by the replica (``WAIT 1``)."""
        deadline = time.monotonic() + timeout
        with self.master.admin_client() as admin:
            while True:
                admin.set("replicated-pair:probe", str(time.monotonic()))
                if int(admin.execute_command("WAIT", 1, 100)) >= 1:
                    admin.delete("replicated-pair:probe")
                    if int(admin.execute_command("WAIT", 1, 1000)) >= 1:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the replica did not catch up within {timeout} s; replica log:\n"
                        f"{self.replica.log_tail()}"
                    )

    def wait_calls(self) -> int:
        """WAIT (and WAITAOF) commands the master has run so far (INFO commandstats)."""
        stats = self.master.info("commandstats")
        return sum(
            int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_wait", "cmdstat_waitaof")
        )

    # -- the proxy's loop ---------------------------------------------------------------

    def _run(self, coro_fn: Callable[[], Any]) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro_fn(), self._loop).result(10)

    def _call(self, fn: Callable[[], T]) -> T:
        assert self._loop is not None

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)  # type: ignore[no-any-return]
