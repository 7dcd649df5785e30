"""A node keeps freed memory for the next large body while busy, and gives it back to
the kernel once idle (zdmq/server/heap.py); a TLS node frees each closed connection."""

from __future__ import annotations

import shutil
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import make_ca_and_cert, rss_kib, unique, wait_until
from zdmq import Client
from zdmq.local import LocalCluster
from zdmq.server.heap import Heap

MIB = 1 << 20


def _rss_mb(pid: int) -> float:
    return rss_kib(pid) / 1024


async def _releases(http: aiohttp.ClientSession, url: str, ca: ssl.SSLContext | None = None) -> int:
    async with http.get(url + "/v1/health", ssl=ca if ca is not None else True) as r:
        return int((await r.json())["counters"].get("heap_releases", 0))


@pytest.mark.skipif(not Heap().tunable, reason="glibc's malloc only")
async def test_memory_freed_by_large_bodies_goes_back_to_the_kernel_once_the_node_is_idle(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = make_cluster(nodes=1, durability="memory", limits={"max_message_bytes": 2 * MIB})
    [node] = cluster.nodes.values()
    assert node.pid is not None
    url = cluster.config.node("n1").url
    q = unique()
    async with Client.from_config(cluster.config_path) as c:
        await c.create_queue(q)
        await c.push(q, b"warm-up")
        assert await c.pop(q) is not None
        await wait_until(lambda: _at_least(_releases(http, url), 1), what="the warm-up's release")
        before = _rss_mb(node.pid)
        body = b"m" * (2 * MIB - 64)
        for _ in range(6):  # 48 MiB in and out, 4 bodies a call
            await c.push_many(q, [body] * 4)
            got = await c.pop_many(q, 4)
            assert [m.body for m in got] == [body] * 4
        released = await _releases(http, url)
        # Busy: the freed bodies stay in the process for the next ones.
        busy = _rss_mb(node.pid)
        # Idle now: within a housekeeping round or two the node gives the memory back.
        await wait_until(
            lambda: _at_least(_releases(http, url), released + 1), what="a heap release"
        )
        after = _rss_mb(node.pid)
    rss = f"RSS {before:.1f} MB before the bodies, {busy:.1f} busy, {after:.1f} idle"
    assert busy > before + 8, rss
    # Over TLS the node keeps a few MB more once it has carried large bodies (OpenSSL's
    # state and the allocator's high-water; it does not grow with more traffic, as the
    # next test shows).
    assert after < before + (6 if cluster.config.tls else 4), rss


@pytest.mark.skipif(not Heap().tunable, reason="glibc's malloc only")
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
@pytest.mark.main_pass_only  # one node with TLS of its own in every pass
async def test_a_tls_node_frees_each_closed_connection_and_its_buffers(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # Four clients one after another, each moving 48 MiB through its own connections and
    # closing them: the node's memory once idle stays level instead of keeping every
    # closed connection's TLS buffers (about 14 MB a client when it did).
    cluster = make_cluster(
        nodes=1,
        durability="memory",
        limits={"max_message_bytes": 2 * MIB},
        tls=make_ca_and_cert(tmp_path),
    )
    [node] = cluster.nodes.values()
    assert node.pid is not None
    url = cluster.config.node("n1").url
    ca = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    q, body, idle = unique(), b"m" * (2 * MIB - 64), []
    for i in range(4):
        async with Client.from_config(cluster.config_path) as c:
            if i == 0:
                await c.create_queue(q)
            for _ in range(6):
                await c.push_many(q, [body] * 4)
                assert len(await c.pop_many(q, 4)) == 4
        released = await _releases(http, url, ca)
        await wait_until(
            lambda r=released: _at_least(_releases(http, url, ca), r + 1), what="a heap release"
        )
        idle.append(_rss_mb(node.pid))
    assert idle[-1] < idle[0] + 6, f"RSS once idle after each client: {idle}"


async def _at_least(count: Awaitable[int], n: int) -> bool:
    return await count >= n
