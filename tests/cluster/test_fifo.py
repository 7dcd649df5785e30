"""FIFO queues on real nodes: groups delivered in push order one message at a time, over
REST and through the client, dedup ids and content-based dedup, and the 400s."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp

from tests.helpers import unique
from zdmq import Client, FifoConflict
from zdmq.hashing import Placement
from zdmq.local import LocalCluster
from zdmq.models import group_key


def _placement(cluster: LocalCluster) -> Placement:
    cfg = cluster.config
    return Placement(cfg.node_ids, cfg.partitions, cfg.replication)


async def test_groups_go_in_push_order_one_at_a_time_and_land_on_their_owner(
    cluster4: LocalCluster, client: Client
) -> None:
    q = unique("fifo")
    await client.create_queue(q, fifo=True, visibility_timeout_s=30)
    placement = _placement(cluster4)
    groups = [f"g{i}" for i in range(6)]
    pushed: dict[str, list[str]] = {g: [] for g in groups}
    for n in range(5):
        for g in groups:
            mid = await client.push(q, f"{g}-{n}", group=g)
            assert placement.owner(mid) == placement.owner(group_key(q, g))
            pushed[g].append(mid)
    # A receive takes from one node: receive until every group's head is out.
    got = []
    for _ in range(20):
        got += await client.receive(q, max_messages=10)
        if len(got) >= len(groups):
            break
    assert sorted(m.id for m in got) == sorted(pushed[g][0] for g in groups)
    assert {m.group for m in got} == set(groups)
    assert await client.receive(q, max_messages=10) == []  # every group is in flight
    # Ack two, nack one: the acked groups go on, the nacked one redelivers its head.
    by_group = {m.group: m for m in got}
    await client.ack(q, [by_group["g0"].receipt, by_group["g1"].receipt])
    await client.nack(q, [by_group["g2"].receipt])
    again = []
    for _ in range(20):
        again += await client.receive(q, max_messages=10)
        if len(again) >= 3:
            break
    assert sorted(m.id for m in again) == sorted(
        [pushed["g0"][1], pushed["g1"][1], pushed["g2"][0]]
    )
    await client.ack(q, [m.receipt for m in again] + [by_group[g].receipt for g in groups[3:]])
    # Drain the rest with receive + ack: each group's messages in push order.
    seen: dict[str, list[str]] = {g: [pushed[g][0]] for g in groups}
    for m in again:
        if m.id != pushed["g2"][0]:
            seen[m.group or ""].append(m.id)
    for _ in range(20):
        batch = await client.receive(q, max_messages=10)
        if not batch:
            break
        for m in batch:
            seen[m.group or ""].append(m.id)
        await client.ack(q, [m.receipt for m in batch])
    assert seen == pushed
    assert (await client.stats(q)).messages == 0


async def test_rest_pushes_need_a_group_on_a_fifo_queue_and_refuse_one_elsewhere(
    cluster4: LocalCluster, http: aiohttp.ClientSession, client_ssl: ssl.SSLContext | None
) -> None:
    base = cluster4.config.node(cluster4.config.node_ids[0]).url
    q, plain = unique("fifo"), unique("plain")
    async with http.put(f"{base}/v1/queues/{q}", json={"fifo": True}) as r:
        assert r.status == 201, await r.text()
        assert (await r.json())["settings"]["fifo"] is True
    async with http.put(f"{base}/v1/queues/{plain}", json={}) as r:
        assert r.status == 201
    # 409 where the queue's kind refuses a well-formed push, 400 for a malformed group.
    cases = [
        (q, {}, 409, "needs a group"),
        (q, {"zdmq-message-group": "a", "zdmq-priority": "3"}, 409, "no priority"),
        (q, {"zdmq-message-group": "a", "zdmq-delay-s": "5"}, 409, "no priority"),
        (
            q,
            {"zdmq-message-group": "a", "zdmq-id": "6f1c2a52-3f0b-4b7e-9a52-7a646d712d31"},
            409,
            "not an id",
        ),
        (q, {"zdmq-message-group": ""}, 400, "group"),
        (q, {"zdmq-message-group": "x" * 129}, 400, "group"),
        (plain, {"zdmq-message-group": "a"}, 409, "not a FIFO queue"),
    ]
    for queue, headers, status, says in cases:
        for node in cluster4.config.node_ids:  # through every node: the same answer
            url = cluster4.config.node(node).url
            async with http.post(
                f"{url}/v1/queues/{queue}/messages",
                data=b"x",
                headers={"Content-Type": "text/plain", **headers},
            ) as r:
                body = await r.json()
                assert r.status == status, (headers, body)
                assert body["error"]["code"] == (
                    "fifo_conflict" if status == 409 else "bad_request"
                )
                assert says in body["error"]["message"], (headers, body)
    async with http.post(
        f"{base}/v1/queues/{q}/batch",
        json={"messages": [{"body": "a", "group": "g"}, {"body": "b"}]},
    ) as r:
        assert r.status == 409
        assert "give a group" in (await r.json())["error"]["message"]
    # Nothing of the refused pushes was stored.
    async with http.get(f"{base}/v1/queues/{q}") as r:
        assert (await r.json())["messages"] == 0


async def test_dedup_ids_and_content_based_dedup_store_a_message_once_in_the_window(
    cluster4: LocalCluster, client: Client, http: aiohttp.ClientSession
) -> None:
    q, c = unique("fifo"), unique("cbd")
    await client.create_queue(q, fifo=True)
    await client.create_queue(c, fifo=True, content_based_dedup=True)
    first = await client.push(q, "one", group="g", dedup_id="order-1")
    assert await client.push(q, "one again", group="g", dedup_id="order-1") == first
    a = await client.push(c, "same body", group="g")
    assert await client.push(c, "same body", group="g") == a  # the body's hash
    b = await client.push(c, "other body", group="g")
    assert b != a
    ids = await client.push_many(c, ["same body", "third", "third"], groups="g")
    assert ids[0] == a and ids[1] == ids[2]
    got = []
    for _ in range(6):
        batch = await client.receive(c, max_messages=10)
        got += [m.text() for m in batch]
        if batch:
            await client.ack(c, [m.receipt for m in batch])
    assert got == ["same body", "other body", "third"]
    [m] = await client.receive(q, max_messages=10)
    assert (m.id, m.text()) == (first, "one")
    # REST: a single push answers 201 then 200 (a repeat), with the id.
    base = cluster4.config.node(cluster4.config.node_ids[-1]).url
    headers = {"Content-Type": "text/plain", "zdmq-message-group": "h", "zdmq-dedup-id": "d"}
    async with http.post(f"{base}/v1/queues/{q}/messages", data=b"x", headers=headers) as r:
        assert r.status == 201
        mid = (await r.json())["id"]
    async with http.post(f"{base}/v1/queues/{q}/messages", data=b"x", headers=headers) as r:
        assert r.status == 200
        assert await r.json() == {"id": mid, "duplicate": True}


async def test_pops_take_group_heads_and_a_pushed_batch_keeps_its_order(client: Client) -> None:
    q = unique("fifo")
    await client.create_queue(q, fifo=True)
    bodies = [f"m{i}" for i in range(40)]
    groups = [f"g{i % 4}" for i in range(40)]
    await client.push_many(q, bodies, groups=groups)
    seen: dict[str, list[str]] = {}
    for _ in range(40):
        got = await client.pop_many(q, 7)
        if not got:
            break
        for m in got:
            seen.setdefault(m.group or "", []).append(m.text())
    assert seen == {f"g{k}": [f"m{i}" for i in range(k, 40, 4)] for k in range(4)}


async def test_a_fifo_queue_refuses_priority_through_the_client(client: Client) -> None:
    q = unique("fifo")
    await client.create_queue(q, fifo=True)
    try:
        await client.push(q, "x", group="g", priority=2)
    except FifoConflict as e:
        assert "no priority" in e.message
    else:
        raise AssertionError("a FIFO push with a priority was stored")
    await asyncio.sleep(0)
