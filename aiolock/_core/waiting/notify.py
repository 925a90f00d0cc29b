"""How a waiting task learns that it may try again: the three notify modes.

Every primitive waits the same way (see ``listener``): register, make sure
the registration is live, try, and if that failed park until woken or until
a bound (the holder's TTL, the caller's deadline) passes, then try again. A
*Waiter* is one task's registration; the mode decides what wakes it. In
``pubsub`` and ``list`` mode the task parks on a `Channel`, in its
`ParkingLot` (``_parking``, the one local wait queue):

``pubsub`` (default)
    The Client's one listener connection, one reference-counted channel per
    name. A release publishes on the name's channel.

``list``
    For proxies and managed services that disable pub/sub: a release also
    pushes onto the name's signal list (``<prefix>:{<name>}:signal``, capped
    at 16 items and expiring after 10 s), and the Client runs at most one
    BLPOP loop, on its own connection, per name it waits on. An item pushed
    while nobody blocks stays in the list, so no release is missed between
    a try and the next BLPOP. A wake-up popped by a BLPOP that was being
    cancelled can be lost, so a list-mode waiter also retries by itself at
    least once a second (``ListWaiter.PARK_MAX``).

``poll``
    No notification at all: exponential backoff with jitter, capped, and
    never past the caller's deadline. The spin lock always waits this way.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..capabilities import STANDALONE, Capabilities
from ..errors import ClientClosedError, InvalidArgumentError
from ..outage import Outage
from ..transport.connection import CommandConnection
from ..transport.redis_compat import ConnectionFactory
from ..validate import check_seconds
from .channel import Channel, Subscriber

__all__ = ["Backoff", "ListWaiter", "PollWaiter", "PubSubWaiter", "SignalHub", "Waiter"]

log = logging.getLogger("aiolock.connection")


class Waiter(Protocol):
    async def ready(self, bound: float | None) -> None:
        """Return once a release from now on is sure to wake ``wait`` (at most ``bound`` s)."""

    async def wait(self, timeout: float | None) -> bool:
        """Park until woken (True) or ``timeout`` passed (False)."""

    def close(self, *, linger: bool = False) -> None:
        """Unregister (idempotent); ``linger``: the wait succeeded (see Listener)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter: ``initial * factor**k``, at most ``maximum``.

    Each delay is scaled by a random factor in ``[1 - jitter, 1]``. Callers
    cut every delay to the time left before their deadline.
    """

    initial: float = 0.005
    factor: float = 2.0
    maximum: float = 0.5
    jitter: float = 0.2

    def __post_init__(self) -> None:
        check_seconds(self.initial, "backoff initial", allow_zero=False)
        check_seconds(self.maximum, "backoff maximum", allow_zero=False)
        if not (isinstance(self.factor, int | float) and 1.0 <= self.factor <= 100.0):
            raise InvalidArgumentError(f"backoff factor must be in [1, 100], got {self.factor!r}")
        if not (isinstance(self.jitter, int | float) and 0.0 <= self.jitter <= 1.0):
            raise InvalidArgumentError(f"backoff jitter must be in [0, 1], got {self.jitter!r}")
        if self.maximum < self.initial:
            raise InvalidArgumentError("backoff maximum must be at least its initial delay")

    def delay(self, attempt: int) -> float:
        base = min(self.maximum, self.initial * self.factor ** min(attempt, 64))
        if self.jitter:
            base *= 1.0 - self.jitter * random.random()
        return base


class PubSubWaiter:
    __slots__ = ("_channel", "_listener")

    def __init__(self, listener: Subscriber, channel: bytes) -> None:
        self._listener = listener
        self._channel: Channel | None = listener.register(channel)

    async def ready(self, bound: float | None) -> None:
        if self._channel is not None:
            await self._channel.confirmed(bound)

    async def wait(self, timeout: float | None) -> bool:
        assert self._channel is not None
        return await self._channel.wait(timeout)

    def close(self, *, linger: bool = False) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            self._listener.unregister(channel, linger=linger)


class PollWaiter:
    __slots__ = ("_attempt", "_backoff")

    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self._attempt = 0

    async def ready(self, bound: float | None) -> None:
        return None

    async def wait(self, timeout: float | None) -> bool:
        delay = self._backoff.delay(self._attempt)
        self._attempt += 1
        if timeout is not None:
            delay = min(delay, timeout)
        await asyncio.sleep(max(delay, 0.0))
        return False

    def close(self, *, linger: bool = False) -> None:
        return None


class _Signal:
    __slots__ = ("channel", "conn", "task")

    def __init__(self, key: bytes) -> None:
        self.channel = Channel(key)
        self.task: asyncio.Task[None] | None = None
        self.conn: CommandConnection | None = None  # its BLPOP connection, once made


class SignalHub:
    """The ``list`` mode's BLPOP loops: at most one per waited name per Client,
    each on a command connection of its own."""

    BLOCK = 5  # seconds per BLPOP; the loop goes on while anyone waits

    def __init__(
        self,
        factory: ConnectionFactory,
        *,
        command_timeout: float = 10.0,
        factory_for: Callable[[bytes], ConnectionFactory] | None = None,
        on_failure: Callable[[], None] | None = None,
        capabilities: Capabilities = STANDALONE,
    ) -> None:
        # factory_for (cluster mode): the connections to the master of a
        # key's slot, asked again after each failed BLPOP (a failover, a move).
        self._factory = factory
        self._factory_for = factory_for
        self._on_failure = on_failure
        self._capabilities = capabilities  # (READONLY may drop the connection: CommandConnection)
        # A BLPOP answers within BLOCK seconds (nil if nothing came): a connection
        # silent for command_timeout more is gone.
        self._command_timeout = self.BLOCK + command_timeout
        self._signals: dict[bytes, _Signal] = {}
        self._closed = False
        self.connects = 0
        # One outage of all the BLPOP connections (one line each way, not one
        # per waited name), and one run of BLPOPs failing otherwise (refused).
        self._outage = Outage()
        self._refused = Outage()

    @property
    def active(self) -> int:
        return len(self._signals)

    def register(self, key: bytes) -> Channel:
        if self._closed:
            raise ClientClosedError("the aiolock Client is closed")
        signal = self._signals.get(key)
        if signal is None:
            signal = self._signals[key] = _Signal(key)
            signal.task = asyncio.get_running_loop().create_task(
                self._pump(key, signal),
                name=f"aiolock-blpop-{key.decode(errors='replace')}",
            )
        signal.channel.refs += 1
        return signal.channel

    def unregister(self, channel: Channel) -> None:
        channel.refs -= 1
        if channel.refs > 0:
            return
        signal = self._signals.get(channel.name)
        if signal is not None and signal.channel is channel:
            del self._signals[channel.name]
            if signal.task is not None:
                signal.task.cancel()

    async def _pump(self, key: bytes, signal: _Signal) -> None:
        channel = signal.channel

        def connected() -> tuple[()]:
            self.connects += 1
            channel.wake_all()  # pushes may have been missed while away
            return ()

        factory_for = self._factory_for
        factory = self._factory if factory_for is None else factory_for(key)
        conn = signal.conn = CommandConnection(
            factory,
            command_timeout=self._command_timeout,
            on_connect=connected,
            redirects=factory_for is not None,
            capabilities=self._capabilities,
            role="BLPOP",
            outage=self._outage,
        )
        dialer = conn.dialer
        try:
            while True:
                await dialer.pause()
                try:
                    # Connects (again) if need be: a failed connect fails the call.
                    reply = await conn.call(b"BLPOP", key, self.BLOCK)
                except Exception as exc:
                    # A lost connection, or one that could not be made, is
                    # logged by its dialer (once per outage); anything else here.
                    if not dialer.outage.ongoing and self._refused.failed():
                        log.warning("BLPOP on %r failed (%s); retrying", key, exc)
                    dialer.failed()
                    if self._on_failure is not None:
                        self._on_failure()  # cluster mode: refresh the slot map
                    if factory_for is not None and factory_for(key) is not factory:
                        # Cluster mode: the key's slot has another master now.
                        await conn.aclose()
                        factory = factory_for(key)
                        conn = signal.conn = CommandConnection(
                            factory,
                            command_timeout=self._command_timeout,
                            on_connect=connected,
                            redirects=True,
                            role="BLPOP",
                            outage=self._outage,
                        )
                        conn.dialer.failed()
                        dialer = conn.dialer
                    continue
                dialer.proven()
                self._refused.ended_logged(
                    log, "BLPOP answered again after %.1f s; it failed %d times"
                )
                if reply:
                    channel.wake(reply[1])
        finally:
            await conn.aclose()

    def reset(self, reason: str) -> None:
        """Drop every BLPOP connection as if it were lost (they reconnect)."""
        for signal in self._signals.values():
            if signal.conn is not None:
                signal.conn.reset(reason)

    async def aclose(self) -> None:
        self._closed = True
        signals, self._signals = self._signals, {}
        tasks = []
        for signal in signals.values():
            signal.channel.close()
            if signal.task is not None:
                signal.task.cancel()
                tasks.append(signal.task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class ListWaiter:
    __slots__ = ("_channel", "_hub")

    #: The longest a list-mode waiter parks before it tries again by itself.
    PARK_MAX = 1.0

    def __init__(self, hub: SignalHub, key: bytes) -> None:
        self._hub = hub
        self._channel: Channel | None = hub.register(key)

    async def ready(self, bound: float | None) -> None:
        return None  # pushes persist in the list: nothing is missed before BLPOP runs

    async def wait(self, timeout: float | None) -> bool:
        # A BLPOP cancelled in flight (its loop stops when the last waiter of
        # a name leaves) may have popped a wake-up that nobody then sees: so
        # in list mode a waiter also re-checks at least every PARK_MAX seconds.
        assert self._channel is not None
        bound = self.PARK_MAX if timeout is None else min(timeout, self.PARK_MAX)
        return await self._channel.wait(bound)

    def close(self, *, linger: bool = False) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            self._hub.unregister(channel)
