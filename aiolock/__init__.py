"""aiolock: asyncio-native distributed locks on Redis and Valkey.

General layout
--------------
Each layer imports only the ones below it (``lint-imports`` checks it; the
map, with the life of one ``acquire``, is ARCHITECTURE.md):

* ``_client``: ``Client``, the public facade, one per event loop. It checks
  the options, makes the Engine and hands out primitives.
* ``_primitives``: the lock family (``lock``, ``fair``, ``rwlock``,
  ``semaphore``, ``spin``, ``multi``, ``latch``) over one small base
  (``base``: the try-then-park loop ``compete`` and the ``async with`` /
  decorator protocol). A primitive is a name, its keys and its protocol.
* ``_core``: the engine below them. ``engine`` runs a script for a key
  (routing), keeps every hold alive and every local state; below it the
  one watchdog, the one pub/sub listener, the waiters (``notify``), the one
  local wait queue (``parking``), holds and leases (``lease``), every key
  and channel name (``keys``), the scripts (``scripts`` and
  ``scripts/*.lua``, one file per operation), the connections
  (``connection``, ``dialer``, and ``redis_compat``, the one place that
  touches redis-py's internals), and the basics (``errors``, ``validate``,
  ``futures``, ``owner``).
* ``_redlock``: ``Redlock``, one lock over several Clients (independent
  masters), above ``_client`` since it composes Clients.
* Logging: every module logs on a child of the ``aiolock`` logger
  (``aiolock.lease``, ``aiolock.lock``, ``aiolock.listener``,
  ``aiolock.watchdog``, ``aiolock.connection``, ``aiolock.cluster``,
  ``aiolock.sentinel``, ``aiolock.redlock``); the README's "Operating
  aiolock" lists every line an operator may see.
* ``cli``: the ``aiolock`` command, the demo and the embedded server; the
  library never imports it.

Only the names below are public; everything in a ``_module`` is private.
"""

import logging as _logging

from ._client import Client as Client
from ._client import ClientStatistics as ClientStatistics
from ._core.errors import AiolockError as AiolockError
from ._core.errors import AsyncioRequiredError as AsyncioRequiredError
from ._core.errors import ClientClosedError as ClientClosedError
from ._core.errors import ConnectionFailedError as ConnectionFailedError
from ._core.errors import InvalidArgumentError as InvalidArgumentError
from ._core.errors import InvalidArgumentTypeError as InvalidArgumentTypeError
from ._core.errors import LockLostError as LockLostError
from ._core.errors import LockNotOwnedError as LockNotOwnedError
from ._core.errors import LockTimeoutError as LockTimeoutError
from ._core.errors import LockUpgradeError as LockUpgradeError
from ._core.errors import ReplicationError as ReplicationError
from ._core.errors import ServerRefusedError as ServerRefusedError
from ._core.errors import ServerUnavailableError as ServerUnavailableError
from ._core.errors import SharedCallError as SharedCallError
from ._core.errors import UnshareableResultError as UnshareableResultError
from ._core.errors import UnsupportedServerError as UnsupportedServerError
from ._core.errors import WrongEventLoopError as WrongEventLoopError
from ._core.errors import WrongTypeError as WrongTypeError
from ._core.holds.lease import Lease as Lease
from ._core.options import LockStatistics as LockStatistics
from ._core.waiting.notify import Backoff as Backoff
from ._primitives.election import Election as Election
from ._primitives.election import Leader as Leader
from ._primitives.election import Term as Term
from ._primitives.fair import FairLock as FairLock
from ._primitives.latch import Latch as Latch
from ._primitives.lock import AsyncLock as AsyncLock
from ._primitives.multi import MultiLease as MultiLease
from ._primitives.multi import MultiLock as MultiLock
from ._primitives.rwlock import ReadLock as ReadLock
from ._primitives.rwlock import ReadWriteLock as ReadWriteLock
from ._primitives.rwlock import WriteLock as WriteLock
from ._primitives.semaphore import Permit as Permit
from ._primitives.semaphore import Semaphore as Semaphore
from ._primitives.singleflight import JSONSerializer as JSONSerializer
from ._primitives.singleflight import Serializer as Serializer
from ._primitives.singleflight import Singleflight as Singleflight
from ._primitives.spin import SpinLock as SpinLock
from ._redlock import Redlock as Redlock
from ._redlock import RedlockLock as RedlockLock

__all__ = [
    "AiolockError",
    "AsyncLock",
    "AsyncioRequiredError",
    "Backoff",
    "Client",
    "ClientClosedError",
    "ClientStatistics",
    "ConnectionFailedError",
    "Election",
    "FairLock",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "JSONSerializer",
    "Latch",
    "Leader",
    "Lease",
    "LockLostError",
    "LockNotOwnedError",
    "LockStatistics",
    "LockTimeoutError",
    "LockUpgradeError",
    "MultiLease",
    "MultiLock",
    "Permit",
    "ReadLock",
    "ReadWriteLock",
    "Redlock",
    "RedlockLock",
    "ReplicationError",
    "Semaphore",
    "Serializer",
    "ServerRefusedError",
    "ServerUnavailableError",
    "SharedCallError",
    "Singleflight",
    "SpinLock",
    "Term",
    "UnshareableResultError",
    "UnsupportedServerError",
    "WriteLock",
    "WrongEventLoopError",
    "WrongTypeError",
]

__version__ = "0.1.0"

# A library never decides where its log lines go: without any logging
# configured, nothing is printed (not even logging's last-resort WARNINGs).
_logging.getLogger("aiolock").addHandler(_logging.NullHandler())
