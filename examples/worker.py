"""A queue worker: every replica sees the same jobs, and each job runs exactly once.

Picture a batch that every replica of a service finds (say, the invoices due
today, listed by a cron on every host). Each worker walks the list and, for
each job:

1. claims it with ``try_acquire(wait=..., lease=...)``: ``None`` means another
   worker is on it, so move on. The lease is fixed (no watchdog): a worker that
   hangs gives the job back after ``JOB_LEASE`` seconds, with no heartbeat code;
2. under the lock, checks the job's *done* marker: the lock stops two workers
   running a job at the same time, the marker stops a finished job running again;
3. runs it inside ``async with lock:``, a re-entry of the hold it already has (no
   round trip) that cancels the work and raises ``LockLostError`` if the lease
   is lost;
4. commits the result and the done marker in one fenced write: Redis refuses it
   if a newer fencing token has written to the job since.

When ``LockLostError`` arrives the lease ran out (the job was slower than its
lease, or the process was paused) and another worker may already be running
the job. So: stop, commit nothing, don't retry the release (there is nothing to
release), log it, and leave the job to whoever holds it now. The job is not
marked done, so it is not lost: someone runs it again. Jobs must be safe to
*start* twice; the fenced commit makes sure they *finish* once.

Run it (a server at ``$REDIS_URL``, default ``redis://localhost:6379/0``; with
none, prefix the command with ``aiolock run``)::

    python examples/worker.py            # 3 workers (3 Clients, as if 3 processes), 12 jobs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import secrets
import time

from redis.asyncio import Redis

import aiolock

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
JOB_LEASE = 1.0  # seconds a worker may take per job before its claim expires
CLAIM_WAIT = 0.1  # how long to wait for a busy job before moving on

# Write the result only if no newer fencing token has written to this job.
# KEYS[1] the job's hash; ARGV[1] our fencing token; ARGV[2] worker; ARGV[3] result.
# Returns 1 if committed, 0 if refused (a newer token wrote).
FENCED_COMMIT = """
local last = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
if tonumber(ARGV[1]) < last then return 0 end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'done_by', ARGV[2], 'result', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'commits', 1)
redis.call('EXPIRE', KEYS[1], 3600)
return 1
"""


class Worker:
    def __init__(self, name: str, batch: str, jobs: list[int], stall: int | None) -> None:
        # jobs: the order this worker walks the list in.
        self.name = name
        self.batch = batch
        self.jobs = jobs
        self.stall = stall  # a job this worker will hang on (to show a lost lease)
        self.db = Redis.from_url(REDIS_URL, decode_responses=True)
        self.locks = aiolock.Client(self.db, prefix="example-worker")
        self.commit = self.db.register_script(FENCED_COMMIT)

    def job_key(self, job: int) -> str:
        return f"example-worker:{self.batch}:job:{job}"

    async def run(self) -> None:
        async with self.locks:
            pending = list(self.jobs)
            while pending:
                for job in pending:
                    await self.handle(job)
                done = [j for j in pending if await self.db.hexists(self.job_key(j), "done_by")]
                pending = [j for j in pending if j not in done]
        await self.db.aclose()

    async def handle(self, job: int) -> None:
        lock = self.locks.lock(f"{self.batch}:job:{job}")
        lease = await lock.try_acquire(wait=CLAIM_WAIT, lease=JOB_LEASE)
        if lease is None:
            return  # another worker has claimed it
        try:
            if await self.db.hexists(self.job_key(job), "done_by"):
                return  # finished by someone else before we claimed it
            await self.db.hincrby(self.job_key(job), "starts", 1)
            async with lock:  # re-entry: cancels this block if the lease is lost
                result = await self.work(job)
                committed = await self.commit(
                    keys=[self.job_key(job)], args=[lease.fencing_token, self.name, result]
                )
            if committed:
                print(f"{self.name}  job {job:2}  done      (fencing token {lease.fencing_token})")
            else:
                print(f"{self.name}  job {job:2}  REFUSED   a newer token committed first")
        except aiolock.LockLostError:
            print(
                f"{self.name}  job {job:2}  LOST      its {JOB_LEASE:g} s lease ran out: "
                "nothing committed, the job is left for another worker"
            )
        finally:
            # After a loss there is nothing to release: release() says so with
            # LockNotOwnedError, which is expected here.
            with contextlib.suppress(aiolock.LockNotOwnedError):
                await lease.release()

    async def work(self, job: int) -> str:
        if job == self.stall:
            self.stall = None
            await asyncio.sleep(JOB_LEASE * 3)  # hangs: the lease runs out meanwhile
        await asyncio.sleep(random.uniform(0.01, 0.05))
        return f"invoice {job} sent"


async def main(workers: int, jobs: int) -> int:
    batch = f"batch-{secrets.token_hex(3)}"
    job_ids = list(range(1, jobs + 1))
    stall = random.choice(job_ids)
    names = [f"worker-{chr(ord('a') + i)}" for i in range(workers)]
    print(
        f"{workers} workers, {jobs} jobs, lease {JOB_LEASE:g} s per job; "
        f"{names[0]} will hang on job {stall}"
    )
    started = time.monotonic()
    crew = []
    for i, name in enumerate(names):
        others = random.sample([j for j in job_ids if j != stall], jobs - 1)
        # For the show: worker-a starts with the job it will hang on; the
        # others reach that job last, after its lease has run out.
        order = [stall, *others] if i == 0 else [*others, stall]
        crew.append(Worker(name, batch, order, stall if i == 0 else None))
    await asyncio.gather(*(w.run() for w in crew))

    db = Redis.from_url(REDIS_URL, decode_responses=True)
    async with db:
        rows = [await db.hgetall(f"example-worker:{batch}:job:{j}") for j in job_ids]
        await db.delete(*(f"example-worker:{batch}:job:{j}" for j in job_ids))
    commits = [int(r.get("commits", 0)) for r in rows]
    starts = [int(r.get("starts", 0)) for r in rows]
    ok = all(c == 1 for c in commits)
    print(
        f"\n{jobs} jobs in {time.monotonic() - started:.1f} s: committed exactly once each: "
        f"{'yes' if ok else 'NO'}; started {sum(starts)} times (a lost lease means a re-run)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="aiolock example: exactly-once jobs")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=12)
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.workers, args.jobs)))
