"""The connection URLs the README documents, against real servers: a password,
an ACL user limited to the Client's prefix, TLS (``rediss://``).

Each test makes every one of a Client's connections do its job: the command
connection (acquire, release), the pub/sub connection (a waiter woken by a
release) and the watchdog's own connection (renewals of a short lease).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from aiolock import Client
from aiolock.testing import seam
from tests.core_util import assert_clean, eventually
from tests.servers import LOOPBACK, ServerKind, ServerProcess, binary_for, find_free_port

#: Short enough that the watchdog renews within the test, long enough for a loaded machine.
LEASE = 3.0


async def exercise(url: str, prefix: str = "app") -> None:
    """A contended lock through every connection of two Clients on ``url``."""
    async with (
        Client.from_url(url, prefix=prefix, lease=LEASE) as holder,
        Client.from_url(url, prefix=prefix, lease=LEASE) as waiter,
    ):
        held = await holder.lock("k").acquire()
        task = asyncio.create_task(waiter.lock("k").acquire())
        await eventually(lambda: waiter.statistics().waiting == 1, what="the waiter to park")
        # Two renewals: the watchdog's connection works (a failed one marks the hold lost).
        await eventually(
            lambda: seam.watchdog_rounds(holder) >= 2,
            timeout=3 * LEASE + 10,
            what="two watchdog rounds",
        )
        assert not held.lost
        await held.release()
        lease = await asyncio.wait_for(task, 3 * LEASE + 10)
        assert not lease.lost and lease.fencing_token > held.fencing_token
        await lease.release()
        # The holder's pub/sub link is its eviction channel (a force release tells it).
        assert holder.statistics().pubsub_connects == 1
        assert waiter.statistics().pubsub_connects == 1
        await assert_clean(holder, waiter)


async def test_password_in_url(fresh_server: ServerProcess) -> None:
    """``redis://:password@host`` and ``redis://default:password@host`` (requirepass)."""
    fresh_server.execute("CONFIG", "SET", "requirepass", "s3cr%t")
    address = f"{fresh_server.host}:{fresh_server.port}"
    await exercise(f"redis://:s3cr%25t@{address}/0")  # percent-encoded in the URL
    await exercise(f"redis://default:s3cr%25t@{address}/0")


async def test_acl_user_in_url(fresh_server: ServerProcess) -> None:
    """The README's ACL line: a user allowed only the Client's prefix, keys and channels."""
    fresh_server.execute(
        "ACL", "SETUSER", "locker", "on", ">s3cret", "~app:*", "&app:*", "+@all", "-@dangerous"
    )
    fresh_server.execute("ACL", "SETUSER", "default", "off")  # no fallback to `default`
    await exercise(f"redis://locker:s3cret@{fresh_server.host}:{fresh_server.port}/0")


def _self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not on PATH: cannot make a certificate for the TLS test")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", f"subjectAltName=IP:{LOOPBACK},DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.mark.parametrize("kind", ["redis", "valkey"])
async def test_tls_url(kind: ServerKind, tmp_path: Path) -> None:
    """``rediss://``: certificate checked against a CA file, or not checked at all."""
    binary = binary_for(kind)
    if binary is None:
        pytest.skip(f"no {kind}-server binary")
    cert, key = _self_signed_certificate(tmp_path)
    tls_port = find_free_port()
    tls_args = (
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
    )  # fmt: skip
    server = ServerProcess(kind, binary, extra_args=tls_args)
    try:
        try:
            server.start()
        except RuntimeError:
            log = server.log_tail()
            if "Failed finding TLS support" in log or "not compiled with TLS" in log:
                pytest.skip(f"this {kind}-server was built without TLS: {log.splitlines()[-1]}")
            raise
        await exercise(f"rediss://{LOOPBACK}:{tls_port}/0?ssl_ca_certs={cert}")
        await exercise(f"rediss://{LOOPBACK}:{tls_port}/0?ssl_cert_reqs=none")
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["redis", "valkey"])
async def test_unix_socket_url_with_password(kind: ServerKind, tmp_path: Path) -> None:
    """``unix://:password@/path/to/redis.sock?db=0``."""
    binary = binary_for(kind)
    if binary is None:
        pytest.skip(f"no {kind}-server binary")
    sock = tmp_path / "r.sock"
    server = ServerProcess(kind, binary, extra_args=("--unixsocket", str(sock)))
    try:
        server.start()
        server.execute("CONFIG", "SET", "requirepass", "s3cret")
        await exercise(f"unix://:s3cret@{sock}?db=0")
    finally:
        server.stop()
