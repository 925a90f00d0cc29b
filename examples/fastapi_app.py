"""FastAPI: one lock per order, the aiolock Client from the app's lifespan.

* ``POST /orders/{id}/pay`` waits its turn (``async with lock``), so ten
  concurrent payments of one order charge the card once, in every worker
  process and on every host that shares the Redis.
* ``POST /orders/{id}/refund`` does not wait: if another request holds the
  order, ``try_acquire()`` returns None and the client gets 409 Conflict.

Run it (needs ``python -m pip install -e '.[examples]'`` and a server at
``$REDIS_URL``, default ``redis://localhost:6379/0``; with none, prefix the
command with ``aiolock run``)::

    python examples/fastapi_app.py            # starts the app, sends it requests, exits
    python examples/fastapi_app.py --serve    # serves http://127.0.0.1:8000 until Ctrl-C
    uvicorn examples.fastapi_app:app          # the usual way, any number of --workers
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypedDict

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from redis.asyncio import Redis

import aiolock

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")


class State(TypedDict):
    locks: aiolock.Client
    db: Redis


def create_app(redis_url: str = REDIS_URL) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[State]:
        # One aiolock Client per process (per event loop): it opens at most
        # three connections of its own however many requests wait for locks
        # (commands; pub/sub once a request waits; the watchdog's renewals once
        # a hold outlives lease / 3: README "Connections"), besides `db`'s pool.
        db = Redis.from_url(redis_url, decode_responses=True)
        async with aiolock.Client(db, prefix="shop") as locks:
            yield {"locks": locks, "db": db}
        await db.aclose()

    app = FastAPI(title="aiolock example", lifespan=lifespan)
    app.include_router(router)
    return app


# Dependencies: whatever the lifespan yielded is in request.state.
def get_locks(request: Request) -> aiolock.Client:
    locks: aiolock.Client = request.state.locks
    return locks


def get_db(request: Request) -> Redis:
    db: Redis = request.state.db
    return db


Locks = Annotated[aiolock.Client, Depends(get_locks)]
DB = Annotated[Redis, Depends(get_db)]
router = APIRouter()


async def charge_card(order_id: int) -> None:
    await asyncio.sleep(0.05)  # stands for a payment provider: slow, and not idempotent


async def refund_card(order_id: int) -> None:
    await asyncio.sleep(0.2)


@router.post("/orders/{order_id}/pay")
async def pay(order_id: int, locks: Locks, db: DB) -> dict[str, Any]:
    # Wait for our turn on this order; other orders are not held up.
    async with locks.lock(f"order:{order_id}") as lease:
        key = f"shop:order:{order_id}"
        if await db.hget(key, "status") == "paid":
            return {"order": order_id, "status": "already paid"}
        await charge_card(order_id)
        async with db.pipeline(transaction=True) as tx:
            tx.hset(key, mapping={"status": "paid", "fencing_token": lease.fencing_token})
            tx.hincrby(key, "charges", 1)
            tx.expire(key, 3600)
            await tx.execute()
        return {"order": order_id, "status": "paid", "fencing_token": lease.fencing_token}


@router.post("/orders/{order_id}/refund")
async def refund(order_id: int, locks: Locks, db: DB) -> dict[str, Any]:
    # Don't queue behind another request for the same order: say so at once.
    lease = await locks.lock(f"order:{order_id}").try_acquire()
    if lease is None:
        raise HTTPException(status_code=409, detail=f"order {order_id} is busy, try again")
    try:
        key = f"shop:order:{order_id}"
        if await db.hget(key, "status") != "paid":
            return {"order": order_id, "status": "not paid"}
        await refund_card(order_id)
        await db.hset(key, "status", "refunded")
        return {"order": order_id, "status": "refunded"}
    finally:
        await lease.release()


app = create_app()


# --------------------------------------------------------------------------- running this file


async def self_demo() -> None:
    """Start the app on a free port, send it concurrent requests, print what happened."""
    import httpx
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving  # startup failed (no Redis?): show why
            raise SystemExit("the app did not start")
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    order = random.randrange(1_000_000)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            print(f"app on http://127.0.0.1:{port}, using Redis at {REDIS_URL}")
            print(f"10 concurrent POST /orders/{order}/pay:")
            replies = await asyncio.gather(*(http.post(f"/orders/{order}/pay") for _ in range(10)))
            for reply in replies:
                print(f"  {reply.status_code} {reply.json()}")
            paid = sum(r.json()["status"] == "paid" for r in replies)
            print(f"  -> the card was charged {paid} time(s)")
            print(f"2 concurrent POST /orders/{order}/refund:")
            replies = await asyncio.gather(*(http.post(f"/orders/{order}/refund") for _ in "ab"))
            for reply in sorted(replies, key=lambda r: r.status_code):
                print(f"  {reply.status_code} {reply.json()}")
    finally:
        server.should_exit = True
        await serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help="serve until Ctrl-C")
    parser.add_argument("--port", type=int, default=8000, help="with --serve; default 8000")
    args = parser.parse_args()
    if args.serve:
        import uvicorn

        print(f"try: curl -X POST http://127.0.0.1:{args.port}/orders/42/pay")
        uvicorn.run(app, host="127.0.0.1", port=args.port)
    else:
        asyncio.run(self_demo())


if __name__ == "__main__":
    main()
