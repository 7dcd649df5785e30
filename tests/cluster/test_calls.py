"""Calls per operation on a real 8-node cluster: ZDMQ's 1-call push and 1-to-3-call pop."""

from __future__ import annotations

import asyncio
from collections import Counter
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
def cluster8(
    tmp_path_factory: pytest.TempPathFactory, tls: dict[str, str]
) -> Iterator[LocalCluster]:
    c = LocalCluster.ephemeral(
        tmp_path_factory.mktemp("cluster8"), nodes=8, **({"tls": tls} if tls else {})
    )
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


async def test_a_push_many_of_fresh_messages_is_one_call_to_one_node_and_batches_spread(
    cluster8: LocalCluster,
) -> None:
    placement = placement_of(cluster8)
    q = unique("batches")
    batches: Counter[str] = Counter()
    async with Client.from_config(cluster8.config_path) as c:
        await c.create_queue(q)
        for i in range(80):
            ids = await c.push_many(q, [f"m{i}-{j}" for j in range(50)])
            owners = {placement.owner(mid) for mid in ids}
            assert len(owners) == 1, owners
            batches[owners.pop()] += 1
        assert c.calls["push_many"].ops == c.calls["push_many"].calls == 80
        depth = (await c.stats(q)).depth
    # Each batch's node is drawn at random: about 10 batches a node (sd 3).
    assert len(batches) >= 6 and max(batches.values()) <= 25, batches
    assert {n: d for n, d in depth.items() if d} == {n: 50 * k for n, k in batches.items()}


async def test_a_rest_batch_without_ids_is_stored_on_one_node_whichever_node_takes_it(
    cluster8: LocalCluster, http: aiohttp.ClientSession
) -> None:
    placement = placement_of(cluster8)
    q = unique("restbatch")
    first = cluster8.config.nodes[0].url
    async with http.put(f"{first}/v1/queues/{q}") as r:
        assert r.status == 201
    fresh = [{"body": f"m{j}"} for j in range(20)]
    owners: set[str] = set()
    for node in cluster8.config.nodes:
        for k in range(3):
            dedup = [{"body": "d", "dedup_id": f"{node.id}-{k}-{j}"} for j in range(2)]
            async with http.post(
                f"{node.url}/v1/queues/{q}/batch", json={"messages": [*fresh, *dedup]}
            ) as r:
                assert r.status == 201, await r.text()
                ids = (await r.json())["ids"]
            batch_owners = {placement.owner(mid) for mid in ids[:20]}
            assert len(batch_owners) == 1, batch_owners
            owners |= batch_owners
    assert len(owners) >= 3, owners  # 24 batches on 8 nodes, each node drawn at random
    async with Client.from_config(cluster8.config_path) as c:
        assert (await c.stats(q)).messages == 24 * 22
