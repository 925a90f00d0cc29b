"""Redlock: one lock over several independent Redis masters, with fencing tokens.

``Redlock([client_a, client_b, client_c], drift=0.01)`` composes Clients (one
per master, same event loop); ``redlock.lock(name)`` is a ``RedlockLock``
with the ``AsyncLock`` API. It sits above ``_client`` (it takes Clients) and
below ``cli``. Its parts, each on the one below:

* ``lock``: ``Redlock`` (checks its Clients, makes locks) and
  ``RedlockLock``, a primitive built from the shared base
  (``_primitives/base.py``: ``HeldByTask``; ``_primitives/compete.py``: ``compete``;
  ``Hold``/``Lease``).
* ``quorum``: ``QuorumEngine``, Redlock's engine over the masters' Engines.
  It offers what the shared machinery uses of an Engine (``Contender``,
  ``HoldEngine``, ``Renewer``): a plain ``Watchdog`` renews its holds.
* ``attempt``: one acquisition attempt (the acquire round, the write-back).
* ``fencing``: the fencing rule, pure (no I/O), with its proof sketch.
* ``calls``: the one quorum call (a call per master, gathered), and the
  errors of a decision too few masters answered to take.

Waiting: a waiter parks on the name's channel on every master (each Client's
one listener, pub/sub whatever the Client's notify mode): any release or
undo publishes there, and every wait is bounded by the holder's TTL, as
everywhere in aiolock.
"""

from .attempt import ATTEMPT_LIMIT, MASTER_TIMEOUT
from .lock import Redlock, RedlockLock, quorum_of
from .quorum import CLOCK_SLACK, UNDO_WAIT, QuorumEngine

__all__ = [
    "ATTEMPT_LIMIT",
    "CLOCK_SLACK",
    "MASTER_TIMEOUT",
    "UNDO_WAIT",
    "QuorumEngine",
    "Redlock",
    "RedlockLock",
    "quorum_of",
]
