"""A node keeps freed memory for the next large body while busy, and gives it back to
the kernel once idle (zdmq/server/heap.py)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable

import pytest

from tests.helpers import unique, wait_until
from zdmq import Client
from zdmq.local import LocalCluster
from zdmq.server.heap import Heap

MIB = 1 << 20


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _releases(url: str) -> int:
    with urllib.request.urlopen(url + "/v1/health", timeout=10) as r:
        return int(json.load(r)["counters"].get("heap_releases", 0))


@pytest.mark.skipif(not Heap().tunable, reason="glibc's malloc only")
async def test_memory_freed_by_large_bodies_goes_back_to_the_kernel_once_the_node_is_idle(
    make_cluster: Callable[..., LocalCluster],
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
        await wait_until(lambda: _async(_releases(url) >= 1), what="the warm-up's release")
        before = _rss_mb(node.pid)
        body = b"m" * (2 * MIB - 64)
        for _ in range(6):  # 48 MiB in and out, 4 bodies a call
            await c.push_many(q, [body] * 4)
            got = await c.pop_many(q, 4)
            assert [m.body for m in got] == [body] * 4
        released = _releases(url)
        # Busy: the freed bodies stay in the process for the next ones.
        busy = _rss_mb(node.pid)
        # Idle now: within a housekeeping round or two the node gives the memory back.
        await wait_until(lambda: _async(_releases(url) > released), what="a heap release")
        after = _rss_mb(node.pid)
    rss = f"RSS {before:.1f} MB before the bodies, {busy:.1f} busy, {after:.1f} idle"
    assert busy > before + 8, rss
    assert after < before + 4, rss


async def _async(value: bool) -> bool:
    return value
