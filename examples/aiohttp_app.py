"""aiohttp: one lock per order, the aiolock Client in the app's cleanup context.

The same shape as ``fastapi_app.py``:

* ``POST /orders/{id}/pay`` waits its turn (``async with lock``), so ten
  concurrent payments of one order charge the card once, in every worker
  process and on every host that shares the Redis.
* ``POST /orders/{id}/refund`` does not wait: if another request holds the
  order, ``try_acquire()`` returns None and the client gets 409 Conflict.

Run it (needs ``python -m pip install -e '.[examples]'`` and a server at
``$REDIS_URL``, default ``redis://localhost:6379/0``; with none, prefix the
command with ``aiolock run``)::

    python examples/aiohttp_app.py            # starts the app, sends it requests, exits
    python examples/aiohttp_app.py --serve    # serves http://127.0.0.1:8080 until Ctrl-C
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections.abc import AsyncIterator

from aiohttp import web
from redis.asyncio import Redis

import aiolock

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")

LOCKS = web.AppKey("locks", aiolock.Client)
DB = web.AppKey("db", Redis)
routes = web.RouteTableDef()


def create_app(redis_url: str = REDIS_URL) -> web.Application:
    async def redis_and_locks(app: web.Application) -> AsyncIterator[None]:
        # Before the yield: start-up. After it: clean-up, when the app stops.
        # One aiolock Client per process (per event loop): it opens at most
        # three connections of its own however many requests wait for locks
        # (commands; pub/sub once a request waits; the watchdog's renewals once
        # a hold outlives lease / 3: README "Connections"), besides `db`'s pool.
        db = Redis.from_url(redis_url, decode_responses=True)
        async with aiolock.Client(db, prefix="shop") as locks:
            app[DB] = db
            app[LOCKS] = locks
            yield
        await db.aclose()

    app = web.Application()
    app.cleanup_ctx.append(redis_and_locks)
    app.add_routes(routes)
    return app


async def charge_card(order_id: int) -> None:
    await asyncio.sleep(0.05)  # stands for a payment provider: slow, and not idempotent


async def refund_card(order_id: int) -> None:
    await asyncio.sleep(0.2)


@routes.post("/orders/{order_id:\\d+}/pay")
async def pay(request: web.Request) -> web.Response:
    order_id = int(request.match_info["order_id"])
    locks, db = request.app[LOCKS], request.app[DB]
    # Wait for our turn on this order; other orders are not held up.
    async with locks.lock(f"order:{order_id}") as lease:
        key = f"shop:order:{order_id}"
        if await db.hget(key, "status") == "paid":
            return web.json_response({"order": order_id, "status": "already paid"})
        await charge_card(order_id)
        async with db.pipeline(transaction=True) as tx:
            tx.hset(key, mapping={"status": "paid", "fencing_token": lease.fencing_token})
            tx.hincrby(key, "charges", 1)
            tx.expire(key, 3600)
            await tx.execute()
        return web.json_response(
            {"order": order_id, "status": "paid", "fencing_token": lease.fencing_token}
        )


@routes.post("/orders/{order_id:\\d+}/refund")
async def refund(request: web.Request) -> web.Response:
    order_id = int(request.match_info["order_id"])
    locks, db = request.app[LOCKS], request.app[DB]
    # Don't queue behind another request for the same order: say so at once.
    lease = await locks.lock(f"order:{order_id}").try_acquire()
    if lease is None:
        return web.json_response({"detail": f"order {order_id} is busy, try again"}, status=409)
    try:
        key = f"shop:order:{order_id}"
        if await db.hget(key, "status") != "paid":
            return web.json_response({"order": order_id, "status": "not paid"})
        await refund_card(order_id)
        await db.hset(key, "status", "refunded")
        return web.json_response({"order": order_id, "status": "refunded"})
    finally:
        await lease.release()


# --------------------------------------------------------------------------- running this file


async def self_demo() -> None:
    """Start the app on a free port, send it concurrent requests, print what happened."""
    import aiohttp

    runner = web.AppRunner(create_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    order = random.randrange(1_000_000)
    try:
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(base) as http:
            print(f"app on {base}, using Redis at {REDIS_URL}")

            async def post(path: str) -> tuple[int, object]:
                async with http.post(path) as reply:
                    return reply.status, await reply.json()

            print(f"10 concurrent POST /orders/{order}/pay:")
            replies = await asyncio.gather(*(post(f"/orders/{order}/pay") for _ in range(10)))
            for status, body in replies:
                print(f"  {status} {body}")
            paid = sum(body["status"] == "paid" for _, body in replies)  # type: ignore[index]
            print(f"  -> the card was charged {paid} time(s)")
            print(f"2 concurrent POST /orders/{order}/refund:")
            replies = await asyncio.gather(*(post(f"/orders/{order}/refund") for _ in "ab"))
            for status, body in sorted(replies, key=lambda r: r[0]):
                print(f"  {status} {body}")
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help="serve until Ctrl-C")
    parser.add_argument("--port", type=int, default=8080, help="with --serve; default 8080")
    args = parser.parse_args()
    if args.serve:
        print(f"try: curl -X POST http://127.0.0.1:{args.port}/orders/42/pay")
        web.run_app(create_app(), host="127.0.0.1", port=args.port)
    else:
        asyncio.run(self_demo())


if __name__ == "__main__":
    main()
