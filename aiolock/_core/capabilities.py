"""What a deployment's server(s) can do, as aiolock relies on it.

A ``Capabilities`` describes the server(s) behind one Client. The deployment
(deployment.py) that meets a server sets it; the parts that behave
differently read the one field that matters to them (the connections read
``follows_master``: what a ``READONLY`` reply means). A quirk of a
Redis-compatible server is a new field here, its default the behaviour of
Redis, read where the quirk matters: no mode flag is passed around.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["STANDALONE", "Capabilities"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What aiolock may rely on from the server(s) of one deployment.

    Read where the difference matters, and nowhere else: a new quirk of a
    Redis-compatible server is a new field here (with its default the
    behaviour of Redis), set by the deployment that meets it.
    """

    #: Keys live on several masters by hash slot: a script touches one slot,
    #: pub/sub is sharded (SPUBLISH), renewals are batched per master.
    sharded: bool = False
    #: A ``READONLY`` reply means the master was demoted by a failover: the
    #: command fails as retryable and its connection is dropped, so that the
    #: next one asks the Sentinels for the master.
    follows_master: bool = False


STANDALONE = Capabilities()
