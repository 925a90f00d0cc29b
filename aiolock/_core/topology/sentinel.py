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
* asks a Sentinel for the master (its config epoch and address, below)
  every ``interval`` (the watchdog's round, at most 2 s) on a command
  connection (to the next Sentinel after a failure);

and calls ``on_switch(reason)`` when the master named differs from the one
it knew. The Engine then drops every connection it has and verifies every
hold on the new master. A connect that lands on a master the watch saw
replaced is refused (``SentinelService.expect``): a lagging Sentinel may
still name the old master to redis-py's pool, and it answers ROLE master.

The watch moves forward only, by the Sentinels' config epoch (each
failover raises it): Sentinels learn of a switch at different times (about
0.1 s apart here), and one that lags still names the old master. So every
answer is a pair: the ``config-epoch`` of ``SENTINEL MASTER``, then the
address of ``get-master-addr-by-name``, pipelined in that order (a switch
in between pairs the new address with the old epoch, never the reverse);
one with a lower epoch than the largest seen, or the same epoch and
another address, is ignored. (``get-master-addr-by-name``, not ``SENTINEL
MASTER``'s own address: the failover's leader raises the epoch when the
replica accepts its promotion and names it from then on, while ``SENTINEL
MASTER`` shows the old address until the failover ends.) A
``+switch-master`` event carries no epoch: it makes the watch ask every
Sentinel at once (the sender has the new epoch) and take each answer as it
comes. The retirement of old masters (``expect``) is epoch-ordered too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import (
    AiolockError,
    ConnectionFailedError,
    InvalidArgumentError,
    ServerRefusedError,
    UnsupportedServerError,
    clause,
)
from ..futures import stop
from ..transport.connection import CommandConnection
from ..transport.redis_compat import Connection, SentinelService
from ..waiting.listener import Listener

__all__ = ["SWITCH_CHANNEL", "SentinelWatch"]

log = logging.getLogger("aiolock.sentinel")

#: The Sentinels' event of a master change: "<service> <old ip> <old port> <new ip> <new port>".
SWITCH_CHANNEL = b"+switch-master"
#: The longest time between two questions to the Sentinels.
MAX_INTERVAL = 2.0

Address = tuple[str, int]


def _config_epoch(info: Any) -> int:
    """The ``config-epoch`` of a ``SENTINEL MASTER`` reply (RESP2 flat pairs or
    RESP3 map); -1 if absent (then every answer counts)."""
    if isinstance(info, list):
        info = dict(zip(info[::2], info[1::2], strict=False))
    if isinstance(info, dict):
        value = info.get(b"config-epoch", info.get("config-epoch"))
        if value is not None:
            return int(value)
    return -1


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
        #: The largest config epoch a Sentinel answered with (None before the first answer).
        self.epoch: int | None = None
        #: Answers ignored as stale (a lagging Sentinel; for tests and statistics).
        self.stale = 0
        self._command_timeout = min(command_timeout, 2.0)
        #: Switches seen (for tests and statistics).
        self.switches = 0
        self._lane = CommandConnection(
            self._rotate, command_timeout=self._command_timeout, role="Sentinel", log=log
        )
        self._listener = Listener(
            self._rotate,
            on_reset=self.check_soon,
            health_interval=2.0,
            role="Sentinel pub/sub",
            logger=log,
        )
        self._task: asyncio.Task[None] | None = None
        self._checks: set[asyncio.Task[Any]] = set()
        #: The connections ``_ask_all`` opened and has not closed yet: ``aclose``
        #: closes those that a cancelled ``_ask_all`` left open.
        self._asking: set[CommandConnection] = set()
        self._closed = False

    def _rotate(self) -> Connection:
        """A connection to the next Sentinel (each reconnect tries another)."""
        factory = self._factories[self._next % len(self._factories)]
        self._next += 1
        return factory()

    async def _ask(self, conn: CommandConnection) -> tuple[int, Address] | None:
        """One Sentinel's answer on ``conn``: (config epoch, master address), or
        None if it does not know the service. The epoch is asked first (see
        the module)."""
        name = self.service.name.encode()
        # Pipelined: one round trip, answered in this order.
        replies = await asyncio.gather(
            conn.submit(b"SENTINEL", b"MASTER", name),
            conn.submit(b"SENTINEL", b"get-master-addr-by-name", name),
            return_exceptions=True,
        )
        info: Any = replies[0]
        reply: Any = replies[1]
        try:
            for item in replies:
                if isinstance(item, BaseException):
                    raise item
        except ServerRefusedError as exc:
            if "no such master" in str(exc).lower():
                return None
            raise UnsupportedServerError(
                f"the server at one of {self.service.addresses} refused SENTINEL MASTER or "
                f"get-master-addr-by-name ({exc}): is it a Sentinel, and may this user "
                "run SENTINEL commands?"
            ) from exc.__cause__ or exc
        if reply is None:
            return None
        host, port = reply[0], reply[1]
        address = (host.decode() if isinstance(host, bytes) else str(host), int(port))
        return (_config_epoch(info), address)

    async def master(self) -> tuple[int, Address] | None:
        """(config epoch, master address) as a Sentinel names them, asking the
        Sentinels in turn until one answers; None if the one that answered
        does not know the service. ConnectionFailedError if none answers."""
        last: Exception | None = None
        for _ in range(len(self._factories)):
            try:
                return await self._ask(self._lane)
            except ConnectionFailedError as exc:
                last = exc
                self._lane.reset("asking the next Sentinel")
        assert last is not None
        raise ConnectionFailedError(
            f"no Sentinel of service {self.service.name!r} answered at "
            f"{self.service.addresses} ({clause(last.__cause__ or last)}). Check that they "
            "are up and reachable; aiolock tries again on the next command."
        ) from last.__cause__ or last

    async def start(self) -> None:
        """Check that the Sentinels know the service (the master's address is
        recorded), then watch. InvalidArgumentError if they do not know it."""
        answer = await self.master()
        if answer is None:
            raise InvalidArgumentError(
                f"the Sentinels at {self.service.addresses} monitor no service named "
                f"{self.service.name!r}: check the service name given to "
                "Client.from_sentinel or Sentinel.master_for (SENTINEL MASTERS on a "
                "Sentinel lists the names it monitors)"
            )
        self.epoch, self.known = answer
        self.service.expect(answer[1], answer[0])
        channel = self._listener.register(SWITCH_CHANNEL)
        channel.handler = self._message
        self._listener.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aiolock-sentinel")

    def _message(self, message: bytes) -> None:
        parts = message.split()
        if len(parts) == 5 and parts[0].decode(errors="replace") == self.service.name:
            # No epoch in the event: ask every Sentinel (the sender has it).
            if (parts[3].decode(), int(parts[4])) != self.known:
                self.ask_all_soon()
        elif len(parts) != 5:  # a resubscription's wake-up: a switch may have been missed
            self.check_soon()

    def check_soon(self) -> None:
        """Ask the Sentinels for the master now, in the background."""
        self._background(self._check())

    def ask_all_soon(self) -> None:
        """Ask every Sentinel for the master now, in the background (as a
        ``+switch-master`` naming another master does)."""
        self._background(self._ask_all())

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _check(self) -> None:
        try:
            answer = await self.master()
        except AiolockError as exc:
            log.info("cannot ask the Sentinels for the master (%s)", exc)
            return
        if answer is not None:
            self.compare(*answer, "a Sentinel names")

    async def _ask_all(self) -> None:
        """Ask every Sentinel at once (one connection each, closed after);
        each answer is compared as it comes (a silent Sentinel delays none)."""
        conns = [
            # (quiet: a Sentinel that does not answer is logged below)
            CommandConnection(f, command_timeout=self._command_timeout, log=None)
            for f in self._factories
        ]

        async def ask(conn: CommandConnection) -> None:
            try:
                answer = await asyncio.wait_for(self._ask(conn), self._command_timeout)
            except (AiolockError, TimeoutError) as exc:
                log.info("a Sentinel did not say which master it names (%s)", exc)
                return
            if answer is not None:
                self.compare(*answer, "the Sentinels announced")

        self._asking.update(conns)
        try:
            await asyncio.gather(*(ask(c) for c in conns))
        finally:
            # Each forgotten once closed: if aclose() cancels this task while
            # it closes one, aclose() closes the rest (they stayed open, and
            # were found unclosed at garbage collection, after the loop).
            for conn in conns:
                await conn.aclose()
                self._asking.discard(conn)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._check()

    def compare(self, epoch: int, address: Address, how: str) -> None:
        """A Sentinel named ``address`` the master at config epoch ``epoch``:
        ignored if the epoch is below the largest seen, or equal to it with
        another address (a lagging Sentinel); else a switch if it is not the
        master known so far. (A connect to a master replaced is refused: see
        ``SentinelService.expect``.)"""
        if self._closed:
            return
        if (
            epoch >= 0
            and self.epoch is not None
            and (epoch < self.epoch or (epoch == self.epoch and address != self.known))
        ):
            self.stale += 1
            log.debug(
                "a Sentinel names %s:%d at config epoch %d, behind epoch %d: ignored",
                address[0],
                address[1],
                epoch,
                self.epoch,
            )
            return
        if self.epoch is None or epoch > self.epoch:
            self.epoch = epoch
        known, self.known = self.known, address
        self.service.expect(address, epoch)
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
        # What an _ask_all cancelled while it closed its connections left open.
        for conn in list(self._asking):
            await conn.aclose()
            self._asking.discard(conn)
        await self._listener.aclose()
        await self._lane.aclose()
