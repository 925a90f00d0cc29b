"""OpenTelemetry metrics to Prometheus: how long a FastAPI app waits for its locks.

aiolock records its metrics with OpenTelemetry's *global* meter provider
(README "Metrics and traces"); this app sets one up, with OpenTelemetry's
Prometheus exporter, and serves prometheus_client's ``/metrics``. The lock
``order:<id>`` is one per order, so its name is never a label as is: the
``lock_label`` function maps it to "order" (a bounded set of labels).

* ``POST /orders/{id}/pay`` waits its turn (``async with lock``): ten
  concurrent payments of one order take turns, and
  ``aiolock_lock_wait_duration_seconds`` shows how long each waited.
* ``GET /metrics``: every series, aiolock's among them, e.g.
  ``aiolock_lock_wait_duration_seconds_bucket{aiolock_lock_kind="lock",
  aiolock_lock_name="order",aiolock_lock_outcome="acquired",le="0.1"}``.

Run it (needs ``python -m pip install -e '.[examples,otel]'`` and a server at
``$REDIS_URL``, default ``redis://localhost:6379/0``; with none, prefix the
command with ``aiolock run``)::

    python examples/otel_prometheus.py            # starts the app, sends it requests, exits
    python examples/otel_prometheus.py --serve    # serves http://127.0.0.1:8000 until Ctrl-C
    uvicorn examples.otel_prometheus:app          # the usual way (one process: see below)

With several worker processes, each has its own registry: use
prometheus_client's multiprocess mode, or export with OTLP to a collector.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from prometheus_client import make_asgi_app

import aiolock

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")

# Once per process, at start-up: the global meter provider, read by the
# Prometheus exporter into prometheus_client's default registry. (aiolock
# Clients made before this line record too: they use the global provider.)
metrics.set_meter_provider(
    MeterProvider(
        resource=Resource.create({SERVICE_NAME: "shop"}),
        metric_readers=[PrometheusMetricReader()],
    )
)

#: The lock names' prefixes that become the ``aiolock_lock_name`` label.
LABELS = frozenset({"order", "customer"})


def lock_label(name: str) -> str | None:
    """``order:<id>`` -> "order": one series per kind of lock, not one per order."""
    prefix = name.partition(":")[0]
    return prefix if prefix in LABELS else None


def create_app(redis_url: str = REDIS_URL) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with aiolock.Client.from_url(
            redis_url, prefix="shop", lock_label=lock_label
        ) as locks:
            yield {"locks": locks}

    app = FastAPI(title="aiolock + OpenTelemetry example", lifespan=lifespan)

    @app.post("/orders/{order_id}/pay")
    async def pay(order_id: int, request: Request) -> dict[str, Any]:
        locks: aiolock.Client = request.state.locks
        async with locks.lock(f"order:{order_id}") as lease:
            await asyncio.sleep(0.02)  # stands for the payment provider
            return {"order": order_id, "fencing_token": lease.fencing_token}

    # prometheus_client's exposition, OpenTelemetry's metrics in it.
    app.mount("/metrics", make_asgi_app())
    return app


app = create_app()


# --------------------------------------------------------------------------- running this file


async def self_demo() -> None:
    """Start the app on a free port, send it concurrent payments, print aiolock's metrics."""
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
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", follow_redirects=True
        ) as http:
            print(f"app on http://127.0.0.1:{port}, using Redis at {REDIS_URL}")
            replies = await asyncio.gather(*(http.post(f"/orders/{order}/pay") for _ in range(10)))
            print(f"10 concurrent POST /orders/{order}/pay: {[r.status_code for r in replies]}")
            exposition = (await http.get("/metrics")).text
            print("GET /metrics, aiolock's series:")
            for line in exposition.splitlines():
                if line.startswith("aiolock_"):
                    print(f"  {line}")
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
        print(f"then: curl http://127.0.0.1:{args.port}/metrics")
        uvicorn.run(app, host="127.0.0.1", port=args.port)
    else:
        asyncio.run(self_demo())


if __name__ == "__main__":
    main()
