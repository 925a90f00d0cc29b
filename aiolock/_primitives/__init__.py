"""The lock family, each over the engine of ``aiolock._core``.

``KINDS``: every kind of primitive, as Redis tells them apart under a name
(see ``aiolock/_core/kinds.py``), each declared next to its class. This list
is the one registration: a new primitive adds its ``KIND`` here, nothing
else (the operator commands and the checks read it). The order is the order
in which kinds of one anchor claim it: the first claim wins.
"""

from .._core.kinds import Registry
from . import fair, latch, lock, redlock_kind, rwlock, semaphore

__all__ = ["KINDS"]

KINDS = Registry(
    lock.KIND,  # AsyncLock, SpinLock, MultiLock's parts (the main hash's default)
    fair.KIND,
    rwlock.KIND,
    semaphore.KIND,
    latch.KIND,
    redlock_kind.KIND,
)
