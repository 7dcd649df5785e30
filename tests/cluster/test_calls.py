"""Calls per operation on a real 8-node cluster: ZDMQ's 1-call push and 1-to-3-call pop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from tests.cluster.support import id_owned_by, placement_of
from tests.helpers import unique
from zdmq import Client
from zdmq.local import LocalCluster

PUSHED = 4_000
POPPED = 2_000


@pytest.fixture(scope="module")
def cluster8(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.ephemeral(tmp_path_factory.mktemp("cluster8"), nodes=8)
    try:
        yield c.start()
    finally:
        c.close()


async def test_a_fresh_client_pops_a_lone_message_in_at_most_three_calls_wherever_it_lives(
    cluster8: LocalCluster, http: aiohttp.ClientSession
) -> None:
    placement = placement_of(cluster8)
    for node_id in cluster8.config.node_ids:
        q = unique("lone")
        url = cluster8.config.node(node_id).url
        async with http.put(f"{url}/v1/queues/{q}") as r:
            assert r.status == 201
        mid = id_owned_by(placement, node_id)
        async with http.post(
            f"{url}/v1/queues/{q}/messages", data=b"only one", headers={"zdmq-id": mid}
        ) as r:
            assert r.status == 201

        async with Client.from_config(cluster8.config_path) as fresh:
            m = await fresh.pop(q)
            assert m is not None and (m.id, m.body) == (mid, b"only one")
            assert fresh.calls["pop"].ops == 1
            assert 1 <= fresh.calls["pop"].calls <= 3, (node_id, fresh.calls["pop"])


async def test_pushes_take_one_call_and_pops_average_at_most_1_1_calls_with_every_node_full(
    cluster8: LocalCluster,
) -> None:
    q = unique("calls")
    async with Client.from_config(cluster8.config_path) as c:
        await c.create_queue(q)
        pushed: set[str] = set()
        for i in range(0, PUSHED, 200):
            ids = await asyncio.gather(*(c.push(q, f"m{j}") for j in range(i, i + 200)))
            pushed.update(ids)
        assert len(pushed) == PUSHED
        assert c.calls["push"].ops == PUSHED
        assert c.calls["push"].calls == PUSHED  # exactly one call per push

        stats = await c.stats(q)
        assert set(stats.depth) == set(c.nodes)

        popped: set[str] = set()
        for _ in range(POPPED):
            m = await c.pop(q)
            assert m is not None
            assert m.id in pushed and m.id not in popped
            popped.add(m.id)
        assert c.calls["pop"].ops == POPPED
        assert c.calls["pop"].calls_per_op <= 1.1, c.calls["pop"]
