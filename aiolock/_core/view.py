"""The primitives' view of the engine: everything a primitive may ask of it.

``EngineView`` is the typed contract between the primitives
(``aiolock/_primitives``) and whatever runs them: the ``Engine`` of one
Client satisfies it structurally (engine.py checks that under mypy), and
so must anything else a primitive runs on. A primitive names
``EngineView``, never ``Engine``: it sees no connection, lane, listener,
topology or deployment, so that none of those can grow a branch in a
primitive.

What is here, in groups (each method's docstring in engine.py and holds/lifecycle.py
has its contract):

* the Client's options and identity: ``prefix``, ``lease`` (and
  ``lease_ms``), ``retention_ms``, ``notify``, ``backoff``,
  ``command_timeout``, ``id``; ``grants_by_release`` (a capability: may a
  release script grant the lock to a waiter);
* the event loop: ``enter`` / ``enter_task`` / ``check_usable``, ``loop``,
  ``loop_time``, ``closed``, ``spawn``;
* owners and attempts: ``owner``, ``attempt_id``, ``epoch``;
* Redis, routed by key: ``eval`` / ``submit_script`` / ``send_script`` /
  ``retry`` / ``clean_up`` run a script for ``keys[0]``; ``call`` sends a
  plain command; ``is_cluster``; ``capabilities`` (what the server is and
  allows, once settled: topology/probe.py);
* holds: ``new_hold``, ``pass_on``, ``release_hold``, ``release_failed``,
  ``release_finished``, ``undo``; renewed items: ``renew`` / ``untrack`` /
  ``renewing``;
* waiting: ``waiter``, ``pubsub_waiter``, ``subscribed``, ``subscribe``,
  ``unsubscribe``; ``unreachable`` (the run of failed tries);
  ``evictions.template`` (where a force release is told);
* local state: ``state`` / ``peek_state`` / ``drop_state``; ``observer``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .capabilities import Capabilities
    from .holds.lease import Hold
    from .holds.undo import Call, OnReply, Undo
    from .holds.watchdog import Renewable
    from .observe.observer import Observer
    from .options import Notify
    from .outage import Outage
    from .waiting.channel import Channel
    from .waiting.notify import Backoff, Waiter

__all__ = ["EngineView", "Evictions"]

S = TypeVar("S")
A = TypeVar("A")
#: A reply handler: ``callback(reply, error)``, run from the reply's parse.
ReplyHandler = Callable[[Any, "BaseException | None"], None]


class Evictions(Protocol):
    """Where a force release of a key tells the holder's Client (evict.py)."""

    async def template(self, key: str) -> str: ...


class EngineView(Protocol):
    """What a primitive may ask of the engine it runs on (see the module docstring)."""

    # -- options and identity
    prefix: str
    lease: float
    lease_ms: int
    retention_ms: int
    notify: Notify
    backoff: Backoff
    command_timeout: float
    id: str
    grants_by_release: bool

    # -- the event loop
    loop: asyncio.AbstractEventLoop | None
    closed: bool

    def enter(self) -> asyncio.AbstractEventLoop: ...

    def enter_task(self) -> asyncio.Task[Any]: ...

    def check_usable(self) -> None: ...

    def loop_time(self) -> float: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    # -- owners and attempts
    epoch: int

    def owner(self, task: asyncio.Task[Any]) -> str: ...

    def attempt_id(self) -> int: ...

    # -- Redis, routed by key
    async def eval(
        self,
        name: str,
        keys: tuple[Any, ...],
        args: tuple[Any, ...],
        orphan: Any = None,
    ) -> Any: ...

    def submit_script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]
    ) -> asyncio.Future[Any]: ...

    def send_script(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], callback: ReplyHandler
    ) -> None: ...

    async def retry(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], attempts: int = 5
    ) -> Any: ...

    def clean_up(self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...]) -> None: ...

    async def call(self, key: Any, *command: Any) -> Any: ...

    async def is_cluster(self) -> bool: ...

    @property
    def capabilities(self) -> Capabilities: ...

    # -- holds and renewed items
    def new_hold(
        self,
        name: str,
        owner: str,
        token: int,
        task: asyncio.Task[Any] | None,
        lease: float | None,
        lease_s: float,
        sent: float,
        *,
        release: tuple[str, tuple[Any, ...], tuple[Any, ...]],
        renew: tuple[str, str, tuple[Any, ...]],
        on_detach: Callable[[Hold], None],
        on_release: Callable[[Hold], asyncio.Future[int]] | None = None,
        confirmed: int = -1,
        kind: str = "lock",
        handed_from: Hold | None = None,
    ) -> Hold: ...

    def pass_on(self, hold: Hold, task: asyncio.Task[Any]) -> Hold: ...

    def release_hold(self, hold: Hold) -> asyncio.Future[int]: ...

    def release_failed(
        self, hold: Hold, outcome: asyncio.Future[int], exc: BaseException
    ) -> None: ...

    def release_finished(self, hold: Hold, outcome: asyncio.Future[int], code: int) -> None: ...

    def undo(
        self,
        calls: tuple[Call, ...],
        on_reply: OnReply | None = None,
        *,
        while_open: bool = False,
    ) -> Undo: ...

    def renew(self, item: Renewable) -> None: ...

    untrack: Callable[[Renewable], None]

    def renewing(self, item: Renewable) -> bool: ...

    # -- waiting
    unreachable: Outage

    @property
    def evictions(self) -> Evictions: ...

    def waiter(self, channel: bytes, signal: str) -> Waiter: ...

    def pubsub_waiter(self, channel: bytes) -> Waiter: ...

    def subscribed(self, channel: bytes) -> Channel | None: ...

    def subscribe(self, channel: bytes, signal: bytes) -> Channel | None: ...

    def unsubscribe(self, channel: Channel) -> None: ...

    # -- local state and counts
    observer: Observer
    peek_state: Callable[[str], Any]

    def state(self, key: str, factory: Callable[[A], S], arg: A) -> S: ...

    def drop_state(self, key: str, state: object) -> None: ...
