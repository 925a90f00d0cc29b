"""Every Redis key and pub/sub channel name of every primitive, built here only.

A primitive named ``<name>`` under the Client's ``<prefix>`` keeps its main
value at ``<prefix>:{<name>}`` and everything else at that name plus a suffix
after the closing brace (``<prefix>:{<name>}:fence``, channel
``<prefix>:{<name>}:ch``, ...). The braces are the primitive's one hash tag:
all its keys and channels map to one Redis Cluster slot, so one script may
touch them all. These strings are what the data in Redis is found by: a
version that wrote them differently would not see the locks of the one
before, so they never change (tests/test_keys.py pins every one).

Each kind of primitive gets one small frozen description (``LockKeys``,
``FairKeys``, ``RWKeys``, ``SemaphoreKeys``, ``LatchKeys``, ``RedlockKeys``), built once per
primitive object from (prefix, name) by ``<Kind>.of(prefix, name)``. It also
holds the tuples of KEYS its scripts take, built once, since every call sends
them.

How the Lua scripts (aiolock/scripts) get their names: a script builds no
name. Every key it reads or writes is passed in KEYS (Redis Cluster routes by
them and requires them declared), and every channel it publishes on in ARGV.
One kind of name cannot be passed whole: the channel (or, in list mode, the
signal list) of one particular Client, when which Client it is only becomes
known inside the script (the waiter it pops from a queue). For those the
script gets a *template* in ARGV, the part before the client id (the
``*_prefix`` names below; no suffix follows the id), and appends the id it
found: ``template .. client_id``. The same template builds the name the
Client listens on (``wait_channel(client_id)`` and friends), so both ends
agree by construction. The fair lock's list-mode signal list is the one key
built this way: it carries the primitive's hash tag, so it lives in the same
slot as the declared keys (see scripts/_fair_queue.lua).

What each key holds, and which kind writes it, is declared once per kind
(``KindSpec.parts`` in the kind's module, aiolock/_core/protocol/kinds.py): the
key classes here take their suffixes from the constants below, as do those
declarations. A new primitive may keep its key class in its own module
(subclassing ``Keys``); this module then does not change.

Some names are local only: ``local`` is the key of a primitive's shared
state in the Engine's state map (never sent to Redis), kept apart per kind so
that, say, a fair lock and a read-write lock of one name never share state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

__all__ = [
    "FairKeys",
    "LatchKeys",
    "LockKeys",
    "RWKeys",
    "RedlockKeys",
    "SemaphoreKeys",
    "lost_prefix",
    "main_key",
]


# The suffixes after a main key of the keys that hold state: named once here,
# used by the key classes below and by each kind's declared layout (its
# ``KindSpec.parts``, aiolock/_core/protocol/kinds.py), which the CLI reads. Wake-up
# lists, ``:signal``, ``:wsignal`` and a fair lock's ``:sig:<client id>``,
# carry no state.
FENCE = ":fence"  # fencing counter: t last issued, r last released, b wait bound
WAITING = ":wq"  # lock: waiting tasks; rw lock: waiting writers
QUEUE = ":q"  # fair lock: the FIFO queue and Clients' liveness
READERS_PARKED = ":rq"  # rw lock: Clients with parked readers
RELEASED_TOKENS = ":rel"  # rw lock: recently released tokens
HOLDERS = ":h"  # semaphore: holders
RELEASED = ":r"  # semaphore: recently released
REDLOCK = ":rl"  # Redlock: the lock key
REDLOCK_FENCE = ":rl:fence"  # Redlock: this master's fence counter


def main_key(prefix: str, name: str) -> str:
    """The main key of primitive ``name``: ``<prefix>:{<name>}`` (its hash tag is ``{<name>}``)."""
    return f"{prefix}:{{{name}}}"


def lost_prefix(prefix: str, tag: str | None = None) -> str:
    """The template of a Client's eviction channel (``+ client id``): where a
    force release tells a holder's Client that its hold was deleted (see
    scripts/_evict.lua and _core/holds/evict.py). Standalone: ``<prefix>:lost:``,
    one channel per Client. Cluster mode (``tag``: a hash tag of the evicted
    name's slot, so that the script's SPUBLISH stays in its slot):
    ``<prefix>:{<tag>}:lost:``, one channel per Client and slot."""
    return f"{prefix}:lost:" if tag is None else f"{prefix}:{{{tag}}}:lost:"


@dataclass(frozen=True, slots=True)
class Keys:
    """What every primitive has: its main key and how its waiters are woken.

    ``channel``: the pub/sub channel of the name's wake-ups (bytes, as the
    listener keeps channel names); ``signal``: the list its list-mode waiters
    BLPOP (see notify.py).
    """

    main: str
    channel: bytes
    signal: str

    @classmethod
    def of(cls, prefix: str, name: str) -> Keys:
        main = main_key(prefix, name)
        return cls(main=main, channel=f"{main}:ch".encode(), signal=f"{main}:signal")


@dataclass(frozen=True, slots=True)
class LockKeys(Keys):
    """AsyncLock and SpinLock (one lock when they share a name), MultiLock's parts.

    ``fence``: the fencing counter; ``wq``: the waiting set of targeted
    wake-ups (scripts/_wake.lua); ``wait_prefix``: the template of a Client's
    own channel of this lock, ``wait_channel(client id)``.
    ``acquire``: KEYS of acquire.lua; ``free``: KEYS of every script that
    frees the lock (release, handoff, unwait, force_release: scripts/_free.lua);
    ``multi``: this lock's KEYS in multi_acquire.lua.
    """

    fence: str
    wq: str
    wait_prefix: str
    acquire: tuple[str, str, str, str]
    free: tuple[str, str, str, str]
    multi: tuple[str, str, str, str]

    @classmethod
    def of(cls, prefix: str, name: str) -> LockKeys:
        return cls.rooted(main_key(prefix, name))

    @classmethod
    def rooted(cls, main: str, **more: Any) -> Self:
        """The lock's layout under the main key ``main`` (a subclass's own
        fields in ``more``: an election is a lock rooted elsewhere)."""
        fence, wq, signal = main + FENCE, main + WAITING, f"{main}:signal"
        return cls(
            main=main,
            channel=f"{main}:ch".encode(),
            signal=signal,
            fence=fence,
            wq=wq,
            wait_prefix=f"{main}:w:",
            acquire=(main, fence, wq, signal),
            free=(main, fence, signal, wq),
            multi=(main, fence, wq, signal),
            **more,
        )

    def wait_channel(self, client_id: str) -> bytes:
        """The channel on which Client ``client_id`` is told of grants and wake-ups."""
        return f"{self.wait_prefix}{client_id}".encode()


@dataclass(frozen=True, slots=True)
class FairKeys(Keys):
    """FairLock. Its hold lives at ``main`` like AsyncLock's (one name, one lock).

    ``queue``: the FIFO queue (scripts/_fair_queue.lua); ``channel_prefix`` /
    ``signal_prefix``: templates of one Client's channel / list-mode signal
    list (``client_channel(cid)``, ``client_signal(cid)``); ``templates``:
    both, as the scripts take them in ARGV; ``all``: KEYS of the fair_* scripts.
    """

    fence: str
    queue: str
    channel_prefix: str
    signal_prefix: str
    local: str
    all: tuple[str, str, str]
    templates: tuple[str, str]

    @classmethod
    def of(cls, prefix: str, name: str) -> FairKeys:
        main = main_key(prefix, name)
        fence, queue = main + FENCE, main + QUEUE
        channel_prefix, signal_prefix = f"{main}:ch:", f"{main}:sig:"
        return cls(
            main=main,
            channel=f"{main}:ch".encode(),
            signal=f"{main}:signal",
            fence=fence,
            queue=queue,
            channel_prefix=channel_prefix,
            signal_prefix=signal_prefix,
            local=f"{main}:fair",
            all=(main, fence, queue),
            templates=(channel_prefix, signal_prefix),
        )

    def client_channel(self, client_id: str) -> bytes:
        """The channel on which Client ``client_id`` hears that a waiter of its got the lock."""
        return f"{self.channel_prefix}{client_id}".encode()

    def client_signal(self, client_id: str) -> bytes:
        """The list-mode counterpart of ``client_channel``: a list Client ``client_id`` BLPOPs."""
        return f"{self.signal_prefix}{client_id}".encode()


@dataclass(frozen=True, slots=True)
class RWKeys(Keys):
    """ReadWriteLock (layout: scripts/_rw_common.lua).

    ``channel`` / ``signal`` wake readers ("*"), ``wchannel`` / ``wsignal``
    writers ("1"). ``rel``: recently released tokens; ``wq``: waiting
    writers; ``rq``: Clients with parked readers. The tuples are the KEYS of
    the rw_* scripts, which take the channels in ARGV (the acquires take every
    key, to check the types of those their releases and wake-ups write).
    """

    fence: str
    rel: str
    wq: str
    rq: str
    wchannel: bytes
    wsignal: str
    local: str
    acquire_read: tuple[str, str, str, str, str, str, str]
    acquire_write: tuple[str, str, str, str, str, str, str]
    release_read: tuple[str, str, str]
    release_write: tuple[str, str, str, str, str, str]
    unwait: tuple[str, str, str, str, str]
    force_release: tuple[str, str, str, str, str, str]

    @classmethod
    def of(cls, prefix: str, name: str) -> RWKeys:
        main = main_key(prefix, name)
        fence, rel, wq, rq = (
            main + FENCE,
            main + RELEASED_TOKENS,
            main + WAITING,
            main + READERS_PARKED,
        )
        signal, wsignal = f"{main}:signal", f"{main}:wsignal"
        channel, wchannel = f"{main}:ch".encode(), f"{main}:wch".encode()
        return cls(
            main=main,
            channel=channel,
            signal=signal,
            fence=fence,
            rel=rel,
            wq=wq,
            rq=rq,
            wchannel=wchannel,
            wsignal=wsignal,
            local=f"{main}:rw",
            acquire_read=(main, fence, wq, rq, rel, signal, wsignal),
            acquire_write=(main, fence, wq, rq, rel, signal, wsignal),
            release_read=(main, rel, wsignal),
            release_write=(main, rel, wq, rq, signal, wsignal),
            unwait=(wq, main, rq, signal, wsignal),
            force_release=(main, wq, rq, signal, wsignal, fence),
        )


@dataclass(frozen=True, slots=True)
class SemaphoreKeys(Keys):
    """Semaphore (layout: scripts/_sem.lua): ``holders``, ``released``, ``fence``.

    The tuples are the KEYS of the sem_* scripts (``state``: sem_state and
    sem_set_permits; ``force_release``: sem_force_release).
    """

    holders: str
    released: str
    fence: str
    local: str
    acquire: tuple[str, str, str, str, str]
    release: tuple[str, str, str, str]
    state: tuple[str, str, str]
    force_release: tuple[str, str, str, str]

    @classmethod
    def of(cls, prefix: str, name: str) -> SemaphoreKeys:
        main = main_key(prefix, name)
        holders, released = main + HOLDERS, main + RELEASED
        fence, signal = main + FENCE, f"{main}:signal"
        return cls(
            main=main,
            channel=f"{main}:ch".encode(),
            signal=signal,
            holders=holders,
            released=released,
            fence=fence,
            local=f"{main}:sem",
            acquire=(main, holders, fence, signal, released),
            release=(main, holders, released, signal),
            state=(main, holders, signal),
            force_release=(main, holders, signal, fence),
        )


@dataclass(frozen=True, slots=True)
class LatchKeys(Keys):
    """Latch: one hash (``main``) and its wake-ups. ``down``: KEYS of latch_down
    and latch_set (which checks the signal list its count-down will write)."""

    down: tuple[str, str]
    local: str

    @classmethod
    def of(cls, prefix: str, name: str) -> LatchKeys:
        main = main_key(prefix, name)
        signal = f"{main}:signal"
        return cls(
            main=main,
            channel=f"{main}:ch".encode(),
            signal=signal,
            down=(main, signal),
            local=f"{main}:latch",
        )


@dataclass(frozen=True, slots=True)
class RedlockKeys:
    """A Redlock lock's names on one master (aiolock/_redlock.py).

    Apart from AsyncLock's (``<main>:rl...``): a Redlock lock and a plain lock
    of one name are two different locks. ``lock``: the lock key (a string
    value, the holder's attempt); ``fence``: the fencing counter;
    ``channel``: where a release wakes waiters. ``generation`` and
    ``roster``: one per master and prefix, outside any hash tag (Redlock
    needs standalone masters): the master's generation marker and the
    founding generations (see the fencing rule in aiolock/_redlock.py).
    ``acquire``: KEYS of redlock_acquire.lua; ``write_back``: KEYS of
    redlock_fence.lua.
    """

    lock: str
    fence: str
    channel: bytes
    generation: str
    roster: str
    acquire: tuple[str, str, str, str]
    write_back: tuple[str, str, str]

    @classmethod
    def of(cls, prefix: str, name: str) -> RedlockKeys:
        main = main_key(prefix, name)
        lock, fence = main + REDLOCK, main + REDLOCK_FENCE
        generation, roster = f"{prefix}:redlock:gen", f"{prefix}:redlock:roster"
        return cls(
            lock=lock,
            fence=fence,
            channel=f"{main}:rl:ch".encode(),
            generation=generation,
            roster=roster,
            acquire=(lock, fence, generation, roster),
            write_back=(fence, generation, roster),
        )
