"""The lock family, each over the engine of ``aiolock._core``.

``KINDS``: every kind of primitive, as Redis tells them apart under a name
(see ``aiolock/_core/protocol/kinds.py``), each declared once in its ``<name>_kind``
module beside its class's module: data and a pure reader, so that the
operator commands read them without importing the primitives' runtime (an
import-linter contract keeps it so). This list is the one registration: a
new primitive adds its ``KIND`` here, nothing else. The order is the order in
which kinds of one anchor claim it: the first claim wins.
"""

from .._core.protocol.kinds import Registry
from . import (
    election_kind,
    fair_kind,
    latch_kind,
    lock_kind,
    redlock_kind,
    rwlock_kind,
    semaphore_kind,
    singleflight_kind,
)

__all__ = ["KINDS"]

KINDS = Registry(
    lock_kind.KIND,  # AsyncLock, SpinLock, MultiLock's parts (the main hash's default)
    fair_kind.KIND,
    rwlock_kind.KIND,
    semaphore_kind.KIND,
    latch_kind.KIND,
    redlock_kind.KIND,
    singleflight_kind.KIND,
    election_kind.KIND,
)
