"""Sentinel mode: following the master that the Sentinels name.

A Client on ``Sentinel(...).master_for(service)`` (or
``Client.from_sentinel``) connects every connection through redis-py's
Sentinel-managed pool, which asks the Sentinels for the master's address
on each connect; ``redis_compat.connect`` then checks the server's ROLE
(``dialer`` tries again soon while it is not a master), and a ``READONLY``
reply drops the command connection (``connection``). That covers a master
that dies or is demoted.

It does not cover the trap measured on a manual ``SENTINEL FAILOVER``: the
old master stays a writable master, without replicas, for seconds after the
Sentinels switched to the new one, and a Client still connected to it would
go on granting locks there. So the ``SentinelWatch`` of the Engine:

* subscribes to ``+switch-master`` on one Sentinel (a ``Listener`` whose
  every reconnect goes to the next Sentinel: a lost Sentinel fails over to
  another, and a reconnect asks the master's address again, since a switch
  may have been missed meanwhile);
* asks ``SENTINEL get-master-addr-by-name`` every ``interval`` (the
  watchdog's round, at most 2 s) on a command connection to a Sentinel
  (the next one after a failure);

and calls ``on_switch(reason)`` when the master named differs from the one
it knew. The Engine then drops every connection it has and verifies every
hold on the new master. Every connect meanwhile is refused unless it lands
on the master the watch knows (``SentinelService.expect``): a lagging
Sentinel may still name the old master, which answers ROLE master.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import AbstractConnection

from .connection import CommandConnection
from .errors import (
    AiolockError,
    ConnectionFailedError,
    InvalidArgumentError,
    ServerRefusedError,
    UnsupportedServerError,
)
from .futures import stop
from .listener import Listener
from .redis_compat import SentinelService

__all__ = ["SWITCH_CHANNEL", "SentinelWatch"]

log = logging.getLogger("aiolock")

#: The Sentinels' event of a master change: "<service> <old ip> <old port> <new ip> <new port>".
SWITCH_CHANNEL = b"+switch-master"
#: The longest time between two questions to the Sentinels.
MAX_INTERVAL = 2.0

Address = tuple[str, int]


class SentinelWatch:
    """Watches the Sentinels of one service for a change of master (see the module)."""

    def __init__(
        self,
        service: SentinelService,
        *,
        client_name: str,
        command_timeout: float,
        interval: float,
        on_switch: Callable[[str], None],
    ) -> None:
        self.service = service
        self._factories = service.factories(client_name)
        self._next = 0
        self._on_switch = on_switch
        self.interval = min(interval, MAX_INTERVAL)
        #: The master's address as last named by a Sentinel (None before the first answer).
        self.known: Address | None = None
        #: Switches seen (for tests and statistics).
        self.switches = 0
        self._lane = CommandConnection(self._rotate, command_timeout=min(command_timeout, 2.0))
        self._listener = Listener(self._rotate, on_reset=self.check_soon, health_interval=2.0)
        self._task: asyncio.Task[None] | None = None
        self._checks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def _rotate(self) -> AbstractConnection:
        """A connection to the next Sentinel (each reconnect tries another)."""
        factory = self._factories[self._next % len(self._factories)]
        self._next += 1
        return factory()

    async def master(self) -> Address | None:
        """The master's address as a Sentinel names it, asking the Sentinels in
        turn until one answers; None if the one that answered does not know
        the service. ConnectionFailedError if none answers."""
        last: Exception | None = None
        for _ in range(len(self._factories)):
            try:
                reply = await self._lane.call(
                    b"SENTINEL", b"get-master-addr-by-name", self.service.name.encode()
                )
            except ConnectionFailedError as exc:
                last = exc
                self._lane.reset("asking the next Sentinel")
                continue
            except ServerRefusedError as exc:
                raise UnsupportedServerError(
                    f"the server at one of {self.service.addresses} refused SENTINEL "
                    f"get-master-addr-by-name ({exc}): is it a Sentinel, and may this user "
                    "run SENTINEL commands?"
                ) from exc
            if reply is None:
                return None
            host, port = reply[0], reply[1]
            return (host.decode() if isinstance(host, bytes) else str(host), int(port))
        assert last is not None
        raise ConnectionFailedError(
            f"no Sentinel of service {self.service.name!r} answered at "
            f"{self.service.addresses} ({last}). Check that they are up and reachable; "
            "aiolock tries again on the next command."
        ) from last

    async def start(self) -> None:
        """Check that the Sentinels know the service (the master's address is
        recorded), then watch. InvalidArgumentError if they do not know it."""
        address = await self.master()
        if address is None:
            raise InvalidArgumentError(
                f"the Sentinels at {self.service.addresses} monitor no service named "
                f"{self.service.name!r}: check the service name given to "
                "Client.from_sentinel or Sentinel.master_for (SENTINEL MASTERS on a "
                "Sentinel lists the names it monitors)"
            )
        self.known = address
        self.service.expect(address)
        channel = self._listener.register(SWITCH_CHANNEL)
        channel.handler = self._message
        self._listener.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aiolock-sentinel")

    def _message(self, message: bytes) -> None:
        parts = message.split()
        if len(parts) == 5 and parts[0].decode(errors="replace") == self.service.name:
            self.compare((parts[3].decode(), int(parts[4])), "the Sentinels announced")
        elif len(parts) != 5:  # a resubscription's wake-up: a switch may have been missed
            self.check_soon()

    def check_soon(self) -> None:
        """Ask the Sentinels for the master now, in the background."""
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._check())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _check(self) -> None:
        try:
            address = await self.master()
        except AiolockError as exc:
            log.info("aiolock: cannot ask the Sentinels for the master (%s)", exc)
            return
        if address is not None:
            self.compare(address, "a Sentinel names")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._check()

    def compare(self, address: Address, how: str) -> None:
        """A Sentinel named ``address`` the master: a switch if it is not the
        master known so far. (A connect is refused unless it lands on the
        master known: see ``SentinelService.expect``.)"""
        if self._closed:
            return
        known, self.known = self.known, address
        self.service.expect(address)
        if address != known:
            self.switches += 1
            was = f"{known[0]}:{known[1]}" if known is not None else "unknown"
            self._on_switch(
                f"{how} {address[0]}:{address[1]} the master of {self.service.name!r} "
                f"(it was {was})"
            )

    async def aclose(self) -> None:
        self._closed = True
        await stop(self._task)
        for task in list(self._checks):
            task.cancel()
        if self._checks:
            await asyncio.gather(*self._checks, return_exceptions=True)
        await self._listener.aclose()
        await self._lane.aclose()
