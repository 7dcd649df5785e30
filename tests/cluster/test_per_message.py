"""Per-message delivery options on real nodes: priority, deadline / ttl_s, delay_s,
attributes, min_priority, and cancel (replicated, through a leader kill)."""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.cluster.support import id_owned_by, placement_of
from tests.cluster.test_replication import (  # noqa: F401 - the fixture is used by name
    _trust_the_session_ca,
    health,
    replicated,
)
from tests.helpers import unique, wait_until
from zdmq import Client, MessageLeased, MessageNotFound, ZdmqError
from zdmq.local import LocalCluster
from zdmq.routing import group_members


async def test_a_node_delivers_by_priority_then_deadline_then_arrival(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """1,000 messages on one node, random priorities, some deadlines (a few about to pass),
    some delayed: pops take them priority first, then earliest deadline, then arrival;
    the expired ones are never delivered and are counted; min_priority filters."""
    cluster = make_cluster(nodes=1, replication=1)
    rng = random.Random(7)
    q = unique("prio")
    now = time.time()
    expected: list[tuple[int, float, int, str]] = []  # (-priority, deadline, arrival, id)
    soon: set[str] = set()
    async with Client.from_config(cluster.config_path) as c:
        await c.create_queue(q)
        for start in range(0, 1000, 100):  # ten batches: arrival is the push order
            prios = [rng.choice([0, 0, 0, 1, 4, 9]) for _ in range(100)]
            deadlines: list[float | None] = []
            for _ in range(100):
                roll = rng.random()
                deadlines.append(
                    now + 1.5 if roll < 0.05 else now + rng.uniform(60, 600) if roll < 0.3 else None
                )
            attrs = [{"n": str(start + i)} for i in range(100)]
            ids = await c.push_many(
                q,
                [f"m{start + i}" for i in range(100)],
                priority=prios,
                deadline=deadlines,
                attributes=attrs,
            )
            for i, (mid, p, d) in enumerate(zip(ids, prios, deadlines, strict=True)):
                if d == now + 1.5:
                    soon.add(mid)
                else:
                    expected.append((-p, d or float("inf"), start + i, mid))
        delayed = await c.push(q, b"later", priority=9, delay_s=1.0)
        stats = await c.stats(q)
        assert (stats.messages, stats.delayed) == (1001, 1)
        await asyncio.sleep(2.0)  # the soon ones pass their deadline; the delay ends
        expected.sort()
        got: list[str] = []
        bodies: dict[str, tuple[bytes, dict[str, str], int]] = {}
        while batch := await c.pop_many(q, 100, min_priority=4):
            got += [m.id for m in batch]
            bodies.update({m.id: (m.body, m.attributes, m.priority) for m in batch})
        # The delayed message (priority 9, no deadline) became ready after every push: it
        # comes last of priority 9.
        want_top = [k[3] for k in expected if k[0] == -9] + [delayed]
        want_top += [k[3] for k in expected if k[0] == -4]
        assert got == want_top
        rest: list[str] = []
        while batch := await c.pop_many(q, 100):
            rest += [m.id for m in batch]
            bodies.update({m.id: (m.body, m.attributes, m.priority) for m in batch})
        assert rest == [k[3] for k in expected if -k[0] < 4]
        assert not soon & set(got + rest), "a message past its deadline was delivered"
        stats = await c.stats(q)
        assert (stats.messages, stats.expired) == (0, len(soon))
        for key in expected[:50]:
            body, attrs, prio = bodies[key[3]]
            assert (attrs, prio) == ({"n": body.decode()[1:]}, -key[0])


async def test_a_push_with_a_deadline_and_a_ttl_expires_at_the_earlier(
    cluster4: LocalCluster, http: aiohttp.ClientSession, client: Client
) -> None:
    q = unique("opts")
    await client.create_queue(q)
    url = cluster4.config.nodes[0].url + f"/v1/queues/{q}"
    headers = {"zdmq-ttl-s": "0.001", "zdmq-deadline": str(time.time() + 3600)}
    async with http.post(url + "/messages", data=b"gone", headers=headers) as r:
        assert r.status == 201, await r.text()
    batch = {"messages": [{"body": "kept", "ttl_s": 3600, "deadline": time.time() + 1800}]}
    async with http.post(url + "/batch", json=batch) as r:
        assert r.status == 201, await r.text()

    async def expired() -> bool:  # dropped by its node's housekeeping (once a second)
        return (await client.stats(q)).expired == 1

    await wait_until(expired, timeout_s=10, what="the message with a ttl of 1 ms expired")
    assert [m.body for m in await client.pop_many(q, 10)] == [b"kept"]


async def test_pushes_with_bad_options_are_refused_with_their_codes(
    cluster4: LocalCluster, http: aiohttp.ClientSession, client: Client
) -> None:
    q = unique("opts")
    await client.create_queue(q)
    url = cluster4.config.nodes[0].url + f"/v1/queues/{q}"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"body": "x", "priority": 10}, "bad_request"),
        ({"body": "x", "priority": True}, "bad_request"),
        ({"body": "x", "ttl_s": 0, "deadline": time.time() + 5}, "bad_request"),
        ({"body": "x", "delay_s": 901}, "bad_request"),
        ({"body": "x", "attributes": {"k": 1}}, "invalid_attributes"),
        ({"body": "x", "attributes": {"": "v"}}, "invalid_attributes"),
        ({"body": "x", "attributes": {"k" * 129: "v"}}, "invalid_attributes"),
        ({"body": "x", "attributes": {"k": "v" * 1025}}, "invalid_attributes"),
        ({"body": "x", "attributes": {f"k{i}": "v" for i in range(17)}}, "invalid_attributes"),
    ]
    for item, code in cases:
        async with http.post(url + "/batch", json={"messages": [item]}) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (400, code), item
    headers = {"zdmq-ttl-s": "soon", "zdmq-deadline": str(time.time() + 5)}
    async with http.post(url + "/messages", data=b"x", headers=headers) as r:
        assert r.status == 400
    async with http.post(url + "/messages", data=b"x", headers={"zdmq-attributes": "[1]"}) as r:
        assert (r.status, (await r.json())["error"]["code"]) == (400, "invalid_attributes")
    async with http.post(url + "/pop", params={"min_priority": "10"}) as r:
        assert r.status == 400
    assert (await client.stats(q)).messages == 0  # nothing refused was stored
    # A single push by headers, to a node that forwards it to the id's owner, popped raw:
    # its priority and attributes (non-ASCII ones as JSON escapes) come back as headers.
    placement = placement_of(cluster4)
    mid = id_owned_by(placement, cluster4.config.node_ids[1])
    attrs = '{"a":"b","k\\u00e9":"\\u2713"}'
    headers = {"zdmq-id": mid, "zdmq-priority": "3", "zdmq-ttl-s": "60", "zdmq-attributes": attrs}
    async with http.post(url + "/messages", data=b"x", headers=headers) as r:
        assert r.status == 201, await r.text()
    async with http.post(url + "/pop", params={"min_priority": "3"}) as r:
        assert r.status == 200
        assert (r.headers["zdmq-id"], r.headers["zdmq-priority"]) == (mid, "3")
        assert r.headers["zdmq-attributes"] == attrs
    await client.push(q, b"y", attributes={"ké": "✓"}, priority=1)
    [m] = await client.pop_many(q, 10)
    assert (m.body, m.attributes, m.priority) == (b"y", {"ké": "✓"}, 1)


async def _member_counts(cluster: LocalCluster, group: str) -> list[int]:
    """Messages each member of `group` stores in it (its own copy of the group's state)."""
    members = group_members(cluster.config.node_ids, cluster.config.replication)[group]
    out = []
    for node in members:
        try:
            out.append(int((await health(cluster, node))["groups"][group]["messages"]))
        except (aiohttp.ClientError, KeyError, OSError):
            out.append(-1)
    return out


@pytest.mark.main_pass_only  # replication 3 of its own
async def test_a_cancelled_message_is_gone_on_every_replica_and_stays_gone_after_a_leader_kill(
    make_cluster: Callable[..., LocalCluster], client_ssl: ssl.SSLContext | None
) -> None:
    """Also: the group's next leader delivers another queue's messages in the order the
    killed one would have (priority, then deadline, then arrival)."""
    cluster = await replicated(make_cluster, "n1")
    q, ordered = unique("cancel"), unique("order")
    rng = random.Random(3)
    async with Client.from_config(cluster.config_path, timeout_s=3) as c:
        await c.create_queue(q)
        await c.create_queue(ordered)
        ids = await c.push_many(q, [b"a", b"b", b"c", b"d"])  # fresh ids: one group
        group = c.placement.owner(ids[0])
        assert {c.placement.owner(i) for i in ids} == {group}
        # 60 messages on that same group (ids drawn to hash there), in one JSON batch.
        now = time.time()
        items, keyed = [], []
        for n in range(60):
            mid = id_owned_by(c.placement, group)
            priority = rng.choice([0, 0, 3, 9])
            deadline = now + rng.uniform(300, 900) if rng.random() < 0.3 else None
            items.append({"id": mid, "body": str(n), "priority": priority, "deadline": deadline})
            keyed.append((-priority, deadline or float("inf"), n, mid))
        expected = [k[3] for k in sorted(keyed)]
        url = cluster.config.node(group).url + f"/v1/queues/{ordered}/batch"
        connector = aiohttp.TCPConnector(ssl=client_ssl if client_ssl is not None else True)
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.post(url, json={"messages": items}) as r,
        ):
            assert r.status == 201, await r.text()
        await wait_until(
            lambda: _has(cluster, group, 64), timeout_s=10, what="every member holds 64"
        )
        await c.cancel(q, ids[0])
        await wait_until(
            lambda: _has(cluster, group, 63), timeout_s=10, what="every member dropped it"
        )
        await c.cancel(q, ids[0])  # a repeat answers as the first did
        [leased] = await c.receive(q, 1, visibility_s=5)
        with pytest.raises(MessageLeased):
            await c.cancel(q, leased.id)
        with pytest.raises(MessageNotFound):
            await c.cancel(q, "00000000-0000-4000-8000-000000000000")
        # A node that does not own the id forwards the cancel to the group that does.
        other = next(n for n in cluster.config.node_ids if n != group)
        url = cluster.config.node(other).url + f"/v1/queues/{q}/messages/{ids[2]}"
        connector = aiohttp.TCPConnector(ssl=client_ssl if client_ssl is not None else True)
        async with aiohttp.ClientSession(connector=connector) as s, s.delete(url) as r:
            assert r.status == 204
        cluster.kill(group)  # the group's leader
        cluster.release_port(group)  # refused, as a crashed host's port would be
        got: set[str] = set()
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            try:
                batch = await c.receive(q, 10, visibility_s=30)
                if batch:
                    await c.ack(q, [m.receipt for m in batch])
                got |= {m.id for m in batch}
            except ZdmqError:
                await asyncio.sleep(0.2)
        # The leased one is back once its lease runs out, on the new leader; the cancelled
        # ones never come back.
        assert got == {ids[1], ids[3]} and leased.id == ids[1]
        popped: list[str] = []
        while batch := await c.pop_many(ordered, 7):
            popped += [m.id for m in batch]
        assert popped == expected


async def _has(cluster: LocalCluster, group: str, n: int) -> bool:
    return await _member_counts(cluster, group) == [n] * cluster.config.replication
