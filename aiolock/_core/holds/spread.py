"""Cluster mode: one renewal batch over many slots of one node, and what to do
when a slot moves or migrates under it.

A script's declared keys must all lie in one slot (CROSSSLOT otherwise, with
or without the ``allow-cross-slot-keys`` flag, which only lets a script
*access* undeclared keys of other slots of its node). So the watchdog's batch
for one node (``Engine.shard`` groups them) is sent in the renewal script's
*node form* (scripts.py: its first key declared, the others in ARGV), straight
to that node's connection, following no redirection: a node form must never
run after ``ASKING`` (a key of a slot the node imports would read as missing).

The node answers for each key it serves; a key it does not serve (its slot
moved, or is migrating and the key has left) fails the whole call ("non
local key"), so a key never reads as gone because of where it is. Then
(``slot_trouble``) the batch is split, and no hold is lost for it:

1. if it met MOVED (the map is stale: a failover, a finished migration),
   the slot map is refreshed and the items regrouped by node, one node-form
   call each (one call more per node); else (a migration under way: the
   map is right) straight to 2;
2. a part refused (again) is cut in halves at slot boundaries, each half one
   node-form call, down to a single slot;
3. a single slot's items go in one call with their keys declared, straight
   to its node (Redis then answers TRYAGAIN if a migration split the slot's
   keys, ASK if they all left);
4. refused again, one call per item on the renewal lane (``ClusterMux``),
   which follows MOVED and ASK for each key: a single key is never TRYAGAIN.

A slot migrating under a batch of 2,000 items over 1,000 slots costs about
2 log2(1,000) = 20 calls more, not 1,000. Errors of another kind (a lost
connection, CLUSTERDOWN, a timeout) are the result of the items of the part
that met them (the watchdog retries them until their expiry), and make the
slot map refresh in the background, since the node may be gone for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

from ..protocol.scripts import NODE, node_call
from ..protocol.slots import slot_of
from ..topology.cluster import Topology
from ..topology.mux import ClusterMux
from ..transport.connection import Lane

__all__ = ["SpreadEngine", "renew_spread", "slot_trouble"]

#: Error codes of a refused renewal call that say some key's slot is not
#: (only) where the call was sent.
_SLOT_CODES = frozenset({"MOVED", "ASK", "TRYAGAIN", "CROSSSLOT"})


def slot_trouble(exc: BaseException) -> bool:
    """Whether a renewal call failed because a key's slot moved or is migrating:
    a redirection (MOVED, ASK), a multi-key call on a slot whose keys a
    migration split (TRYAGAIN), keys of several slots (CROSSSLOT), or a node
    form that touched a key its node does not serve ("non local key"). The
    call renewed nothing that is not renewed again when it is re-sent.
    CLUSTERDOWN is not one: the cluster as a whole cannot serve, and
    splitting would only multiply the calls (the watchdog retries the batch).
    """
    return getattr(exc, "code", None) in _SLOT_CODES or "non local key" in str(exc)


class SpreadEngine(Protocol):
    """What a spread renewal needs of its engine (``Engine``, structurally)."""

    @property
    def renew_mux(self) -> Lane: ...

    @property
    def topology(self) -> Topology | None: ...

    def shard(self, key: Any) -> Hashable: ...

    async def eval(
        self, name: str, keys: tuple[Any, ...], args: tuple[Any, ...], *, mux: Lane
    ) -> Any: ...


async def renew_spread(
    engine: SpreadEngine, script: str, items: Sequence[Any], ms: int
) -> list[Any]:
    """Renew ``items`` (renewables of one node, by the map: keys of many slots)
    for ``ms`` milliseconds with the renewal script ``script``; one result per
    item: 1 (renewed), 0 (gone) or the exception that failed its part."""
    return await _Spread(engine, script, items, ms).run()


class _Spread:
    """One spread renewal (see the module docstring); the split parts are
    lists of indices into ``items``, their results put in ``results``."""

    __slots__ = ("engine", "items", "ms", "mux", "results", "script", "stale")

    def __init__(self, engine: SpreadEngine, script: str, items: Sequence[Any], ms: int) -> None:
        self.engine = engine
        self.script = script
        self.items = items
        self.ms = ms
        mux = engine.renew_mux
        assert isinstance(mux, ClusterMux) and engine.topology is not None
        self.mux = mux
        self.results: list[Any] = []
        #: A node-form call met MOVED: the slot map is stale.
        self.stale = False

    async def run(self) -> list[Any]:
        items = self.items
        reply = await self._node_form(items)
        if reply is not None:
            return reply
        topology = self.engine.topology
        assert topology is not None
        self.results = [None] * len(items)
        whole = list(range(len(items)))
        if not self.stale:
            # A migration under way (ASK, TRYAGAIN, a key gone from a slot):
            # the map is right, split now. (A finished one shows at the end
            # of the split: the renewal lane follows MOVED for a key and
            # corrects the map.)
            await self._split(whole)
            return self.results
        # MOVED: the map is stale (a failover, a finished migration).
        try:
            await topology.refresh()
        except Exception as exc:
            return [exc] * len(items)
        by_node: dict[Hashable, list[int]] = {}
        for i in whole:
            by_node.setdefault(self.engine.shard(items[i].renew_key), []).append(i)
        await asyncio.gather(*(self._regrouped(part) for part in by_node.values()))
        return self.results

    def _put(self, part: list[int], reply: Sequence[Any]) -> None:
        for i, result in zip(part, reply, strict=True):
            self.results[i] = result

    async def _regrouped(self, part: list[int]) -> None:
        """One node's part after the refresh: one call, or split by slot."""
        reply = await self._node_form([self.items[i] for i in part])
        if reply is not None:
            self._put(part, reply)
            return
        await self._split(part)

    async def _split(self, part: list[int]) -> None:
        """The items ``part``, by slot, in halves (see ``_halves``)."""
        runs: dict[int, list[int]] = {}
        for i in part:
            runs.setdefault(slot_of(self.items[i].renew_key), []).append(i)
        await self._halves(list(runs.values()))

    async def _halves(self, runs: list[list[int]]) -> None:
        """``runs`` (one list of indices per slot): one call per half, or split on."""
        if len(runs) == 1:
            await self._slot(runs[0])
            return
        half = len(runs) // 2
        await asyncio.gather(self._half(runs[:half]), self._half(runs[half:]))

    async def _half(self, runs: list[list[int]]) -> None:
        if len(runs) > 1:
            part = [i for run in runs for i in run]
            reply = await self._node_form([self.items[i] for i in part])
            if reply is not None:
                self._put(part, reply)
                return
        await self._halves(runs)

    async def _node_form(self, items: Sequence[Any]) -> list[Any] | None:
        """One node-form call for ``items`` to the node serving the first one's
        slot: its results, or another error for each item. None if it was
        refused for a slot reason or no node serves that slot: split it."""
        engine = self.engine
        node = engine.shard(items[0].renew_key)
        if node is None:
            return None
        keys = [item.renew_key for item in items]
        args: list[Any] = [self.ms]
        for item in items:
            args.extend(item.renew_args)
        node_keys, node_args = node_call(keys, args)
        try:
            reply = await engine.eval(
                self.script + NODE, node_keys, node_args, mux=self.mux.connection(str(node))
            )
        except Exception as exc:
            if slot_trouble(exc):
                self.stale = self.stale or getattr(exc, "code", None) == "MOVED"
                return None
            assert engine.topology is not None
            engine.topology.refresh_soon()  # the node may be gone for good (a failover)
            return [exc] * len(items)
        return list(reply)

    async def _slot(self, part: list[int]) -> None:
        """The items ``part`` of one slot: one call with their keys declared,
        straight to the slot's node; refused for a slot reason, one call per
        item on the renewal lane (following MOVED and ASK)."""
        engine, items, ms = self.engine, self.items, self.ms
        node = engine.shard(items[part[0]].renew_key)
        if len(part) > 1 and node is not None:
            keys = tuple(items[i].renew_key for i in part)
            args: list[Any] = [ms]
            for i in part:
                args.extend(items[i].renew_args)
            try:
                reply = await engine.eval(
                    self.script, keys, tuple(args), mux=self.mux.connection(str(node))
                )
            except Exception as exc:
                if not slot_trouble(exc):
                    self._put(part, [exc] * len(part))
                    return
            else:
                self._put(part, reply)
                return
        replies = await asyncio.gather(
            *(
                engine.eval(
                    self.script, (items[i].renew_key,), (ms, *items[i].renew_args), mux=self.mux
                )
                for i in part
            ),
            return_exceptions=True,
        )
        self._put(part, [r if isinstance(r, BaseException) else r[0] for r in replies])
