"""aiolock: asyncio-native distributed locks on Redis and Valkey.

General layout
--------------
* ``_client``: the Client, one per event loop. It owns the only shared
  resources: one multiplexed command connection (``_connection``) and a
  second one for the watchdog's renewals, one pub/sub listener task
  (``_listener``, also home of the wait queue every primitive parks on),
  one watchdog task (``_watchdog``) and the Lua scripts
  (``_scripts`` and ``scripts/*.lua``, one file per operation).
* ``_primitive``: what every primitive shares: the try-then-park loop
  (``compete``) and the ``async with`` / decorator protocol.
* ``_notify``: the three ways a waiter is woken (pub/sub, BLPOP, polling).
* ``_lock`` and its siblings: the primitives, thin objects of a name plus a
  protocol.
* ``_lease``: holds (an ownership in Redis) and Leases (one per acquire).
* ``_errors``, ``_validate``, ``_owner``: the error types, argument checks
  and the ``<client id>:<task serial>`` owner identity.

Only the names below are public; everything in a ``_module`` is private.
"""

from ._client import Client as Client
from ._client import ClientStatistics as ClientStatistics
from ._errors import AiolockError as AiolockError
from ._errors import AsyncioRequiredError as AsyncioRequiredError
from ._errors import ClientClosedError as ClientClosedError
from ._errors import ConnectionFailedError as ConnectionFailedError
from ._errors import InvalidArgumentError as InvalidArgumentError
from ._errors import InvalidArgumentTypeError as InvalidArgumentTypeError
from ._errors import LockLostError as LockLostError
from ._errors import LockNotOwnedError as LockNotOwnedError
from ._errors import LockTimeoutError as LockTimeoutError
from ._errors import LockUpgradeError as LockUpgradeError
from ._errors import ServerRefusedError as ServerRefusedError
from ._errors import ServerUnavailableError as ServerUnavailableError
from ._errors import WrongEventLoopError as WrongEventLoopError
from ._errors import WrongTypeError as WrongTypeError
from ._fair import FairLock as FairLock
from ._latch import Latch as Latch
from ._lease import Lease as Lease
from ._lock import AsyncLock as AsyncLock
from ._multi import MultiLease as MultiLease
from ._multi import MultiLock as MultiLock
from ._notify import Backoff as Backoff
from ._rwlock import ReadLock as ReadLock
from ._rwlock import ReadWriteLock as ReadWriteLock
from ._rwlock import WriteLock as WriteLock
from ._semaphore import Permit as Permit
from ._semaphore import Semaphore as Semaphore
from ._spin import SpinLock as SpinLock

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
