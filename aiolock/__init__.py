"""aiolock: asyncio-native distributed locks on Redis and Valkey.

General layout
--------------
* ``_client``: the Client, one per event loop. It owns the only shared
  resources: one multiplexed command connection (``_connection``) and a
  second one for the watchdog's renewals, one pub/sub listener task
  (``_listener``), one watchdog task (``_watchdog``) and the Lua scripts
  (``_scripts`` and ``scripts/*.lua``, one file per operation).
* ``_primitive``: what every primitive shares: the try-then-park loop
  (``compete``) and the ``async with`` / decorator protocol.
* ``_notify``: the three ways a waiter is woken (pub/sub, BLPOP, polling).
* ``_core/parking``: ``ParkingLot``, the one local wait queue every primitive
  parks on (local FIFOs, fair lock tickets, the listener's channels).
* ``_lock`` and its siblings: the primitives, thin objects of a name plus a
  protocol.
* ``_lease``: holds (an ownership in Redis) and Leases (one per acquire).
* ``_errors``, ``_validate``, ``_owner``: the error types, argument checks
  and the ``<client id>:<task serial>`` owner identity.

Only the names below are public; everything in a ``_module`` is private.
"""

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
from ._core.errors import ServerRefusedError as ServerRefusedError
from ._core.errors import ServerUnavailableError as ServerUnavailableError
from ._core.errors import WrongEventLoopError as WrongEventLoopError
from ._core.errors import WrongTypeError as WrongTypeError
from ._core.lease import Lease as Lease
from ._core.notify import Backoff as Backoff
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
from ._primitives.spin import SpinLock as SpinLock

__all__ = [
    "AiolockError",
    "AsyncLock",
    "AsyncioRequiredError",
    "Backoff",
    "Client",
    "ClientClosedError",
    "ClientStatistics",
    "ConnectionFailedError",
    "FairLock",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "Latch",
    "Lease",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "LockUpgradeError",
    "MultiLease",
    "MultiLock",
    "Permit",
    "ReadLock",
    "ReadWriteLock",
    "Semaphore",
    "ServerRefusedError",
    "ServerUnavailableError",
    "SpinLock",
    "WriteLock",
    "WrongEventLoopError",
    "WrongTypeError",
]

__version__ = "0.1.0"
