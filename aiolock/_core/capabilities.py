"""What a deployment's server(s) can do, as aiolock relies on it.

A ``Capabilities`` describes the server(s) behind one Client. The deployment
(deployment.py) that meets a server sets its mode's fields (``sharded``,
``follows_master``); the capability probe (topology/probe.py) fills in the
rest when the Client first settles, and again after a Sentinel failover:
what answers (``server``), and what it allows. The parts that behave
differently read the one field that matters to them (the connections read
``follows_master``: what a ``READONLY`` reply means; the scripts are chosen
by ``publish_in_scripts``). A quirk of a Redis-compatible server is a new
field here, its default the behaviour of Redis, read where the quirk
matters: no mode flag is passed around.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["STANDALONE", "Capabilities"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What aiolock may rely on from the server(s) of one deployment.

    Read where the difference matters, and nowhere else: a new quirk of a
    Redis-compatible server is a new field here (with its default the
    behaviour of Redis), set by the deployment or the probe that meets it.
    A fact the probe could not learn (``INFO`` refused by the ACL) is None.
    """

    #: Keys live on several masters by hash slot: a script touches one slot,
    #: pub/sub is sharded (SPUBLISH), renewals are batched per master.
    sharded: bool = False
    #: A ``READONLY`` reply means the master was demoted by a failover: the
    #: command fails as retryable and its connection is dropped, so that the
    #: next one asks the Sentinels for the master.
    follows_master: bool = False
    #: The probe ran (the fields below are what it found).
    probed: bool = False
    #: What answered, for messages: "Redis 7.0.15", "Valkey 8.1.8",
    #: "Dragonfly 1.21.0", or "the server" when ``INFO`` was refused.
    server: str = "the server"
    #: The server's kind ("redis", "valkey", "dragonfly", "keydb", "garnet",
    #: or the name its ``INFO`` gives) and its ``(major, minor)`` version.
    kind: str | None = None
    version: tuple[int, int] | None = None
    #: A script may ``PUBLISH`` (``SPUBLISH`` in a cluster). Some managed
    #: services refuse it (Alibaba Tair's cluster): scripts then run in their
    #: unpublished variant (scripts.py), and waiters wait on signal lists.
    publish_in_scripts: bool = True
    #: Why a script's ``PUBLISH`` was refused (the server's words), if it was.
    publish_refusal: str | None = None
    #: Redis Functions (``FCALL``): Redis 7.0+, Valkey; None: not known.
    functions: bool | None = None
    #: Sharded pub/sub (``SSUBSCRIBE``, ``SPUBLISH``): as Functions.
    sharded_pubsub: bool | None = None
    #: ``WAIT`` answers (probed only when ``replicas=N`` needs it); None: not asked.
    wait: bool | None = None


STANDALONE = Capabilities()
