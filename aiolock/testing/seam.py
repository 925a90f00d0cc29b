"""The testing seam: what a test may ask of a Client beyond its public API.

aiolock's own tests (and a user's, at their own risk) observe a Client's
machinery through these functions instead of reaching into
``client._engine``: when the engine is reshaped, this module changes and the
tests do not. Nothing here is exported from ``aiolock``; nothing here is
needed to use the library; no stability is promised beyond this
repository's tests. Prefer the public observers first:
``client.statistics()`` (``command_connects``, ``pubsub_connects``,
``waiting``, ``holds`` ...) and ``lock.statistics()``.

The helpers, by what tests wait for:

* the watchdog: ``watchdog_rounds`` and ``watchdog_calls`` (counters that
  only grow), ``renew_now`` (one renewal round at once), ``watched``;
* connections: ``connection_epoch`` (bumped each time the Client sees its
  command connection lost and re-made), ``command_lane``/``renewal_lane``
  (the lanes commands and renewals travel on, to hold replies or count what
  was sent), ``acked_lane`` (``replicas=N``);
* waiting: ``listener_channels`` (channel -> its local subscription, with
  ``is_confirmed``, ``parked``, ``refs``), ``listener``;
* state: ``local_states`` (lock key -> the Client's local state of it),
  ``peek_state``, ``verifier``, ``retention_ms`` (the TTL every fence and
  marker key gets);
* scripts: ``run_script`` (one script call, routed as the primitives' are);
* anything else: ``engine``, the escape hatch. A test that needs it says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._client import Client

__all__ = [
    "acked_lane",
    "command_lane",
    "connection_epoch",
    "engine",
    "listener",
    "listener_channels",
    "local_states",
    "observer",
    "peek_state",
    "renew_now",
    "renewal_lane",
    "retention_ms",
    "run_script",
    "verifier",
    "watchdog",
    "watchdog_calls",
    "watchdog_rounds",
    "watched",
]


def engine(client: Client) -> Any:
    """The Client's engine: the escape hatch for what no helper below covers."""
    return client._engine


# -- the watchdog ------------------------------------------------------------------------


def watchdog(client: Client) -> Any:
    """The Client's one watchdog (renews every lease taken without ``lease=``)."""
    return client._engine.watchdog


def watchdog_rounds(client: Client) -> int:
    """Renewal rounds the watchdog has run so far (only grows)."""
    rounds: int = client._engine.watchdog.rounds
    return rounds


def watchdog_calls(client: Client) -> int:
    """Renewal script calls the watchdog has sent so far (only grows)."""
    calls: int = client._engine.watchdog.calls
    return calls


async def renew_now(client: Client) -> bool:
    """Run one renewal round now; True when every renewal was answered."""
    done: bool = await client._engine.watchdog.renew_all()
    return done


def watched(client: Client) -> list[Any]:
    """What the watchdog renews right now."""
    return list(client._engine.watchdog.items())


# -- connections -------------------------------------------------------------------------


def connection_epoch(client: Client) -> int:
    """Bumped each time the Client finds its command connection lost and made
    anew: a hold confirmed in the current epoch was seen since the last loss."""
    epoch: int = client._engine.epoch
    return epoch


def command_lane(client: Client) -> Any:
    """The lane the primitives' commands travel on (``in_flight``, ``connects``)."""
    return client._engine.mux


def renewal_lane(client: Client) -> Any:
    """The lane the watchdog's renewals travel on."""
    return client._engine.renew_mux


def acked_lane(client: Client) -> Any:
    """The acknowledged lane of a ``replicas=N`` Client (None otherwise)."""
    return client._engine.acked_lane


# -- waiting -----------------------------------------------------------------------------


def listener(client: Client) -> Any:
    """The Client's pub/sub listener (one connection, or one per cluster node)."""
    return client._engine.listener


def listener_channels(client: Client) -> Mapping[bytes, Any]:
    """Each channel the listener holds -> its subscription (``is_confirmed``,
    ``parked``: tasks parked on it, ``refs``)."""
    channels: Mapping[bytes, Any] = client._engine.listener.channels
    return channels


# -- state -------------------------------------------------------------------------------


def local_states(client: Client) -> Mapping[str, Any]:
    """Lock key -> the Client's local state of it (empty when nothing is held
    or awaited)."""
    states: Mapping[str, Any] = client._engine.states
    return states


def peek_state(client: Client, key: str) -> Any:
    """The Client's local state of lock ``key``, or None."""
    return client._engine.peek_state(key)


def verifier(client: Client) -> Any:
    """The check of the Client's holds after its connection came back (or None)."""
    return client._engine.verifier


def retention_ms(client: Client) -> int:
    """The TTL (ms) of every key that outlives a hold: fences, markers."""
    retention: int = client._engine.retention_ms
    return retention


def observer(client: Client) -> Any:
    """The Client's statistics and telemetry sink."""
    return client._engine.observer


# -- scripts -----------------------------------------------------------------------------


async def run_script(client: Client, script: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """One call of the packaged script ``script`` (its file name without
    ``.lua``), on the node that keeps ``keys``; returns the raw reply."""
    return await client._engine.eval(script, tuple(keys), tuple(args))
