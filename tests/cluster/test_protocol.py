"""The ZDMQ protocol through the Python client on a real 4-node fsync cluster.

Exactly-once round trips at volume, even placement, a stale metadata cache, and queue
deletion across every node.
"""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest

from tests.cluster.support import ids_owned_by, placement_of
from tests.helpers import unique
from zdmq import Client, Message, QueueNotFound
from zdmq.local import LocalCluster

TOTAL = 10_000
PLAIN_PUSHES = 400


def _bodies(n: int) -> list[bytes]:
    # 100 bytes each: an index tag, then random bytes (unique and mostly not UTF-8).
    return [i.to_bytes(4, "big") + os.urandom(96) for i in range(n)]


async def test_ten_thousand_messages_come_back_exactly_once_and_evenly_spread(
    client: Client, cluster4: LocalCluster
) -> None:
    q = unique("bulk")
    await client.create_queue(q)
    bodies = _bodies(TOTAL)
    sent: dict[str, bytes] = {}

    # A push_many's fresh messages share one node, drawn at random per batch: the spread
    # is even over many batches (960 of 10 here: a node's share varies by about 1.3 %).
    batched = bodies[: TOTAL - PLAIN_PUSHES]
    for i in range(0, len(batched), 10):
        chunk = batched[i : i + 10]
        sent.update(zip(await client.push_many(q, chunk), chunk, strict=True))
    plain = bodies[TOTAL - PLAIN_PUSHES :]
    for i in range(0, len(plain), 100):
        chunk = plain[i : i + 100]
        ids = await asyncio.gather(*(client.push(q, b) for b in chunk))
        sent.update(zip(ids, chunk, strict=True))
    assert len(sent) == TOTAL
    assert client.calls["push"].calls == client.calls["push"].ops == PLAIN_PUSHES

    stats = await client.stats(q)
    assert stats.messages == TOTAL
    assert set(stats.depth) == set(client.nodes)
    for node_id, depth in stats.depth.items():
        assert 0.20 * TOTAL <= depth <= 0.30 * TOTAL, (node_id, stats.depth)

    popped: list[Message] = []
    for _ in range(200):
        m = await client.pop(q)
        assert m is not None
        popped.append(m)

    # The rest by four consumers at once, each with its own client.
    async def consume() -> list[Message]:
        got: list[Message] = []
        async with Client.from_config(cluster4.config_path) as c:
            while batch := await c.pop_many(q, 250):
                got.extend(batch)
        return got

    for got in await asyncio.gather(*(consume() for _ in range(4))):
        popped.extend(got)
    assert await client.pop(q) is None

    ids = [m.id for m in popped]
    assert len(ids) == len(set(ids)) == TOTAL
    assert {m.id: m.body for m in popped} == sent
    assert (await client.stats(q)).messages == 0


async def test_a_stale_metadata_cache_still_finds_every_remaining_message(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    placement = placement_of(cluster4)
    nodes = list(cluster4.config.node_ids)
    cached_node, others = nodes[0], nodes[1:]
    url = cluster4.config.node(nodes[0]).url
    q = unique("stale")

    async def push_batch(ids: list[str], tag: bytes) -> dict[str, bytes]:
        bodies = {mid: tag + mid.encode() for mid in ids}
        wire = [{"id": mid, "body": b.decode(), "encoding": "utf-8"} for mid, b in bodies.items()]
        async with http.post(f"{url}/v1/queues/{q}/batch", json={"messages": wire}) as r:
            assert r.status == 201, await r.text()
        return bodies

    # A long TTL: client A never refreshes its cache on its own during the test.
    async with (
        Client.from_config(cluster4.config_path, metadata_ttl_s=3600) as a,
        Client.from_config(cluster4.config_path) as b,
    ):
        await b.create_queue(q)
        first = await push_batch(ids_owned_by(placement, [cached_node], 5), b"first:")
        assert await a.metadata(q) == [cached_node]
        m = await a.pop(q)
        assert m is not None and m.id in first
        assert a.calls["pop"].calls == 1  # straight to the cached node

        # B pushes more, all on the other nodes, and drains the cached node.
        later = await push_batch(ids_owned_by(placement, others, 30), b"later:")
        async with http.post(
            f"{url}/v1/queues/{q}/pop", params={"max": "100"}, headers={"zdmq-route": "local"}
        ) as r:
            drained = {x["id"] for x in (await r.json())["messages"]}
        assert drained == set(first) - {m.id}

        got: list[Message] = []
        while (m := await a.pop(q)) is not None:
            got.append(m)
        assert sorted(x.id for x in got) == sorted(later)
        assert {x.id: x.body for x in got} == later
        assert await b.pop(q) is None


async def test_deleting_a_queue_removes_its_messages_on_every_node(
    client: Client, cluster4: LocalCluster
) -> None:
    q = unique("del")
    await client.create_queue(q)
    # Single pushes (a push_many's fresh messages would share one node).
    await asyncio.gather(*(client.push(q, f"old {i}") for i in range(400)))
    before = await client.stats(q)
    assert set(before.depth) == set(client.nodes)

    await client.delete_queue(q)
    with pytest.raises(QueueNotFound):
        await client.pop(q)
    with pytest.raises(QueueNotFound):
        await client.stats(q)
    await client.create_queue(q)

    after = await client.stats(q)
    assert after.messages == 0
    assert after.depth == {}
    assert await client.metadata(q) == []
    assert await client.pop(q) is None
    assert await client.pop_many(q, 100) == []

    # The re-created queue works and holds only what is pushed into it now.
    new_id = await client.push(q, "new")
    m = await client.pop(q)
    assert m is not None and (m.id, m.body) == (new_id, b"new")
    assert await client.pop(q) is None


async def test_messages_pushed_while_consumers_pop_are_each_delivered_exactly_once(
    cluster4: LocalCluster,
) -> None:
    # Nodes empty and refill all the time here, so UUID queues are dropped and
    # re-registered under concurrent pushes: no message may be stranded or doubled.
    q = unique("churn")
    producers_done = asyncio.Event()
    pushed: dict[str, bytes] = {}

    async def produce(tag: int) -> None:
        async with Client.from_config(cluster4.config_path) as c:
            for i in range(60):
                bodies = [f"{tag}:{i}:{j}".encode() for j in range(10)]
                if i % 2:
                    ids = list(await asyncio.gather(*(c.push(q, b) for b in bodies)))
                else:
                    ids = await c.push_many(q, bodies)
                pushed.update(zip(ids, bodies, strict=True))

    async def consume() -> list[Message]:
        got: list[Message] = []
        async with Client.from_config(cluster4.config_path) as c:
            while True:
                done = producers_done.is_set()
                batch = await c.pop_many(q, 7)
                got.extend(batch)
                if not batch and done:
                    return got

    async with Client.from_config(cluster4.config_path) as admin:
        await admin.create_queue(q)
        consumers = [asyncio.create_task(consume()) for _ in range(3)]
        await asyncio.gather(*(produce(t) for t in range(2)))
        producers_done.set()
        delivered = [m for got in await asyncio.gather(*consumers) for m in got]
        assert await admin.pop(q) is None
        assert (await admin.stats(q)).messages == 0

    ids = [m.id for m in delivered]
    assert len(pushed) == 1_200
    assert len(ids) == len(set(ids)), "a message was delivered twice"
    assert {m.id: m.body for m in delivered} == pushed
