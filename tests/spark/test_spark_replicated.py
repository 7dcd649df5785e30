"""The Spark source against replica groups: 4 real nodes with `replication: 3`.

A read partition is a replica group (its id is its preferred leader's node id); its lease
calls go to the group's leader wherever it is, so a node that is down costs the read
nothing: another member of each of its groups leads them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import zdmq
from tests.helpers import unique, wait_until
from zdmq import _http
from zdmq.cli_status import moves_active
from zdmq.local import LocalCluster

pytestmark = pytest.mark.spark


async def _push_all(cfg: Path, queue: str, n: int) -> set[str]:
    async with zdmq.Client.from_config(cfg) as c:
        await c.create_queue(queue)
        ids: set[str] = set()
        for start in range(0, n, 100):
            ids.update(await c.push_many(queue, [b"m%d" % i for i in range(start, start + 100)]))
        return ids


async def _led_elsewhere(cluster: LocalCluster, group: str) -> bool:
    """Whether a live member of `group` reports another node as its leader."""
    pool = _http.HttpPool(timeout_s=2.0, ssl_context=cluster.config.client_ssl())
    try:
        for node in cluster.config.node_ids:
            if node == group:
                continue
            try:
                url = cluster.config.node(node).url + "/v1/health"
                h = (await _http.call(pool, "GET", url)).json()
            except zdmq.ZdmqError:
                continue
            leader = h.get("groups", {}).get(group, {}).get("leader")
            if leader not in (None, group):
                return True
        return False
    finally:
        await pool.close()


def test_batch_read_with_a_node_down_reads_every_message_from_its_groups_new_leaders(
    spark: Any, make_cluster: Callable[..., LocalCluster]
) -> None:
    # A dead node answers nothing (the cluster keeps its port): each call to it waits out
    # the request timeout before the call moves on to another member.
    cluster = make_cluster(nodes=4, replication=3, request_timeout_s=1.0)
    q = unique("read-r3")
    pushed = asyncio.run(_push_all(cluster.config_path, q, 2000))
    victim = cluster.config.node_ids[1]
    cluster.kill(victim)
    asyncio.run(wait_until(lambda: _led_elsewhere(cluster, victim), timeout_s=15, what="failover"))
    rows = (
        spark.read.format("zdmq")
        .option("config", str(cluster.config_path))
        .option("queue", q)
        .option("wait_s", "1")
        .load()
        .select("id", "node")
        .collect()
    )
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids))
    assert set(ids) == pushed
    # The down node's group was read all the same, from its new leader.
    assert victim in {r.node for r in rows}


def test_a_read_after_a_node_is_replaced_follows_the_new_map(
    spark: Any, make_cluster: Callable[..., LocalCluster]
) -> None:
    """A job whose layout comes from cluster.yaml, written before a node was replaced by
    a new host at another address, reads every message: its calls follow the epoch of
    the replies to the new map. So does a job that reads the map from a node (`urls`)."""
    cluster = make_cluster(nodes=4, replication=3, request_timeout_s=1.0)
    q = unique("read-moved")
    pushed = asyncio.run(_push_all(cluster.config_path, q, 2000))

    def read(option: str, value: str, limit: int) -> list[str]:
        rows = (
            spark.read.format("zdmq")
            .option(option, value)
            .option("queue", q)
            .option("max_messages", str(limit))
            .option("wait_s", "1")
            .load()
            .select("id")
            .collect()
        )
        return [r.id for r in rows]

    first = read("config", str(cluster.config_path), 800)

    async def replace() -> None:
        cluster.kill("n2")
        cluster.release_port("n2")  # its old address answers nothing now
        address = cluster.joining("n6")
        cluster.start_node("n6")
        async with zdmq.Client.from_config(cluster.config_path) as c:
            await c.replace_node("n2", "n6", address)

            async def idle() -> bool:
                return not moves_active(await c.moves())

            await wait_until(idle, timeout_s=120, what="n6 in n2's place")

    asyncio.run(replace())
    second = read("config", str(cluster.config_path), 800)
    third = read("urls", cluster.url("n6"), 4000)  # the new node; the rest (shares per group)
    ids = first + second + third
    assert len(ids) == len(set(ids)), "a message was read twice"
    assert set(ids) == pushed
