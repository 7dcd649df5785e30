"""Topics and broadcast on real nodes: every publish reaches every subscription once.

A publish goes to the leader of the group that owns the topic's name, which stores a
copy in each subscribed queue before it replies. These tests count what each
subscription holds after draining it: exactly the publishes made after it subscribed,
each once, also when a publish is retried with its dedup id, and, with three copies of
everything, while a node is killed.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import aiohttp
import pytest

from tests.cluster.support import error_code
from tests.helpers import unique
from zdmq import (
    Client,
    QueueNotFound,
    SubscriptionNotFound,
    TopicExists,
    TopicNotFound,
    ZdmqError,
)
from zdmq.local import LocalCluster


async def drain(c: Client, queue: str) -> list[tuple[str, bytes]]:
    """Every message of `queue`, popped: (id, body)."""
    got: list[tuple[str, bytes]] = []
    while batch := await c.pop_many(queue, 100):
        got += [(m.id, m.body) for m in batch]
    return got


async def publish_range(c: Client, topic: str, lo: int, hi: int, batch: int = 500) -> None:
    """Publishes m<lo> .. m<hi-1>, each with its body as its dedup id, in batches."""
    for start in range(lo, hi, batch):
        keys = [f"m{i}" for i in range(start, min(hi, start + batch))]
        got = await c.publish_many(topic, [k.encode() for k in keys], dedup_ids=keys)
        assert got.messages == len(keys)


async def fan_out_once_each(c: Client, n: int) -> None:
    """Two subscriptions from the start, a third half way; a retried batch and a retried
    single publish; then each subscription holds exactly its publishes, once each."""
    topic, early, late = unique("t"), [unique("a"), unique("b")], unique("c")
    await c.create_topic(topic)
    for q in early:
        assert await c.subscribe(topic, q) is True  # creates the queue
    await publish_range(c, topic, 0, n // 2)
    assert await c.subscribe(topic, late) is True
    await publish_range(c, topic, n // 2, n)
    # A retried batch and a retried single publish store nothing new.
    keys = [f"m{i}" for i in range(n - 100, n)]
    again = await c.publish_many(topic, [k.encode() for k in keys], dedup_ids=keys)
    assert again.count == 3 and set(again.duplicates.values()) == {100}
    one = await c.publish(topic, b"m0", dedup_id="m0")
    assert one.duplicates == {early[0]: 1, early[1]: 1, late: 0}  # late subscribed after m0
    for q, want in [(early[0], range(n)), (early[1], range(n)), (late, range(n // 2, n))]:
        got = await drain(c, q)
        bodies = sorted(b.decode() for _, b in got)
        ids = {mid for mid, _ in got}
        expected = [f"m{i}" for i in want]
        if q == late:
            expected.append("m0")  # the retried single publish reached it first
        assert len(ids) == len(got), f"{q}: a copy was handed out twice"
        assert bodies == sorted(expected), f"{q}: {len(got)} copies, not {len(expected)}"


async def test_a_topic_with_three_subscriptions_delivers_10000_publishes_once_to_each(
    cluster4: LocalCluster, client: Client
) -> None:
    await fan_out_once_each(client, 10_000)


async def test_fan_out_with_three_copies_of_everything(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(nodes=4, replication=3)
    async with Client.from_config(cluster.config_path) as c:
        await fan_out_once_each(c, 1_000)


async def test_topic_calls_through_every_node_with_their_statuses_and_errors(
    cluster4: LocalCluster, http: aiohttp.ClientSession, client: Client
) -> None:
    urls = [cluster4.config.node(n).url for n in cluster4.nodes]
    topic = unique("t")
    await client.create_queue(topic)  # a queue of the same name: another namespace
    async with http.put(f"{urls[0]}/v1/topics/{topic}") as r:
        assert r.status == 201, await r.text()
    for url in urls:
        async with http.put(f"{url}/v1/topics/{topic}") as r:
            assert (r.status, await error_code(r)) == (409, "topic_exists")
        async with http.get(f"{url}/v1/topics/{topic}") as r:
            assert r.status == 200 and (await r.json())["subscriptions"] == []
        async with http.get(f"{url}/v1/topics") as r:
            assert topic in (await r.json())["topics"]
        # No subscriptions: a publish stores nothing and says so.
        async with http.post(f"{url}/v1/topics/{topic}/messages", data=b"x") as r:
            assert r.status == 200
            assert (await r.json())["count"] == 0
    with pytest.raises(TopicExists):
        await client.create_topic(topic)
    missing = unique("t")
    async with http.post(f"{urls[1]}/v1/topics/{missing}/messages", data=b"x") as r:
        assert (r.status, await error_code(r)) == (404, "topic_not_found")
    async with http.post(f"{urls[1]}/v1/topics/{topic}/subscriptions", json={"q": 1}) as r:
        assert (r.status, await error_code(r)) == (400, "bad_request")
    async with http.post(f"{urls[2]}/v1/topics/{topic}/messages", headers={"zdmq-id": "x"}) as r:
        assert (r.status, await error_code(r)) == (400, "bad_request")

    # Subscribe through any node: an existing queue, and a new one with settings.
    existing, fresh = unique("q"), unique("q")
    await client.create_queue(existing)
    body = {"queue": existing}
    async with http.post(f"{urls[3]}/v1/topics/{topic}/subscriptions", json=body) as r:
        assert r.status == 201
        assert (await r.json())["queue_created"] is False
    async with http.post(f"{urls[1]}/v1/topics/{topic}/subscriptions", json=body) as r:
        assert r.status == 200 and (await r.json())["subscribed"] is False
    body = {"queue": fresh, "settings": {"visibility_timeout_s": 5}}
    async with http.post(f"{urls[2]}/v1/topics/{topic}/subscriptions", json=body) as r:
        assert r.status == 201 and (await r.json())["queue_created"] is True
    assert (await client.stats(fresh)).queue == fresh
    assert await client.subscriptions(topic) == [existing, fresh]
    async with http.post(
        f"{urls[0]}/v1/topics/{topic}/messages",
        data=b"hello",
        headers={"Content-Type": "text/plain", "zdmq-dedup-id": "d1"},
    ) as r:
        assert r.status == 201
        j = await r.json()
        assert j["count"] == 2 and set(j["queues"]) == {existing, fresh}
    async with http.post(
        f"{urls[1]}/v1/topics/{topic}/batch",
        json={"messages": [{"body": "a"}, {"body": "b", "dedup_id": "d2"}]},
    ) as r:
        assert r.status == 201 and (await r.json())["messages"] == 2
    got = await drain(client, existing)
    assert sorted(b for _, b in got) == [b"a", b"b", b"hello"]
    assert await drain(client, topic) == []  # the queue named like the topic got nothing

    # Unsubscribe purges the pending copies; the queue stays.
    assert await client.unsubscribe(topic, fresh) == 3
    assert (await client.stats(fresh)).messages == 0
    with pytest.raises(SubscriptionNotFound):
        await client.unsubscribe(topic, fresh)
    published = await client.publish(topic, b"only one")
    assert published.count == 1 and list(published.ids) == [existing]

    # A subscribed queue deleted meanwhile is skipped and named.
    await client.delete_queue(existing)
    published = await client.publish(topic, b"to nobody")
    assert (published.count, published.missing) == (0, (existing,))

    await client.delete_topic(topic)
    with pytest.raises(TopicNotFound):
        await client.subscriptions(topic)
    assert topic not in await client.list_topics()
    assert topic in await client.list_queues()


async def test_broadcast_stores_one_copy_per_queue_or_none_if_a_queue_is_missing(
    cluster4: LocalCluster, http: aiohttp.ClientSession, client: Client
) -> None:
    qs = [unique("b") for _ in range(3)]
    for q in qs:
        await client.create_queue(q)
    nowhere = unique("none")
    with pytest.raises(QueueNotFound):
        await client.broadcast([*qs, nowhere], b"x")
    for q in qs:
        assert (await client.stats(q)).messages == 0
    got = await client.broadcast(qs, b"hi", content_type="text/plain", dedup_id="k")
    assert got.count == 3
    again = await client.broadcast(qs, b"hi", content_type="text/plain", dedup_id="k")
    assert set(again.duplicates.values()) == {1}
    for q in qs:
        [(mid, body)] = await drain(client, q)
        assert body == b"hi" and mid == got.ids[q][0]
    url = cluster4.config.nodes[0].url
    for payload in (
        {"queues": []},
        {"queues": [qs[0]], "body": "x", "colour": "red"},
        {"body": "x"},
    ):
        async with http.post(f"{url}/v1/broadcast", json=payload) as r:
            assert r.status == 400, payload
    # A queue named twice gets one copy.
    async with http.post(f"{url}/v1/broadcast", json={"queues": [qs[0], qs[0]], "body": "x"}) as r:
        assert r.status == 201, await r.text()
        assert (await r.json())["count"] == 1
    assert (await client.stats(qs[0])).messages == 1


async def test_a_copy_over_a_subscribed_queues_size_limit_is_413_and_stores_nothing(
    cluster4: LocalCluster, http: aiohttp.ClientSession, client: Client
) -> None:
    topic, small, big = unique("size"), unique("small"), unique("big")
    await client.create_topic(topic)
    await client.create_queue(small, max_message_bytes=4)
    await client.subscribe(topic, small)
    await client.subscribe(topic, big)
    url = cluster4.config.nodes[2].url
    async with http.post(f"{url}/v1/topics/{topic}/messages", data=b"12345") as r:
        assert r.status == 413, await r.text()
        error = (await r.json())["error"]
        assert error["code"] == "message_too_large" and small in error["message"]
    async with http.post(
        f"{url}/v1/broadcast", json={"queues": [big, small], "body": "12345"}
    ) as r:
        assert r.status == 413, await r.text()
    assert (await client.stats(big)).messages == 0
    async with http.post(f"{url}/v1/topics/{topic}/messages", data=b"1234") as r:
        assert r.status == 201, await r.text()
    assert [(await client.stats(q)).messages for q in (small, big)] == [1, 1]


async def test_copies_keep_the_priority_delay_and_attributes_of_what_was_published(
    cluster4: LocalCluster, http: aiohttp.ClientSession, client: Client
) -> None:
    topic, sub = unique("opts"), unique("opts-q")
    await client.create_topic(topic)
    await client.subscribe(topic, sub)
    url = cluster4.config.nodes[1].url
    headers = {"zdmq-priority": "7", "zdmq-attributes": '{"kind":"alert"}'}
    async with http.post(f"{url}/v1/topics/{topic}/messages", data=b"one", headers=headers) as r:
        assert r.status == 201, await r.text()
    batch = {"messages": [{"body": "later", "delay_s": 60}, {"body": "two", "priority": 3}]}
    async with http.post(f"{url}/v1/topics/{topic}/batch", json=batch) as r:
        assert r.status == 201, await r.text()
    got = {}
    while batch := await client.pop_many(sub, 10):
        got.update((m.body, m) for m in batch)
    assert got[b"one"].priority == 7 and got[b"one"].attributes == {"kind": "alert"}
    assert got[b"two"].priority == 3
    assert b"later" not in got  # delayed a minute
    assert (await client.stats(sub)).delayed == 1


@pytest.mark.main_pass_only  # replication 3 of its own; tests/fault/test_topics.py too
async def test_every_acknowledged_publish_reaches_every_subscription_across_a_kill(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    await publish_across_a_kill(make_cluster, run_s=8.0)


@pytest.mark.slow
async def test_every_acknowledged_publish_reaches_every_subscription_across_kills_long(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    await publish_across_a_kill(make_cluster, run_s=10.0, rounds=3)


async def publish_across_a_kill(
    make_cluster: Callable[..., LocalCluster], run_s: float, rounds: int = 1
) -> None:
    """Publishers run while a node is killed (kill -9) and restarted; a publish that
    failed is retried with its dedup id until acknowledged or the run ends. At the end
    each subscription holds every acknowledged publish (none lost) and no copy twice."""
    # A node gives up on a peer that does not answer within 1 s (a killed node's port stays
    # bound here, so calls to it time out rather than being refused).
    cluster = make_cluster(nodes=4, replication=3, request_timeout_s=1.0)
    topic, subs = unique("t"), [unique("s") for _ in range(3)]
    acked: set[str] = set()
    acked_at: list[float] = []
    stop = asyncio.Event()
    async with Client.from_config(cluster.config_path, timeout_s=3) as c:
        await c.create_topic(topic)
        for q in subs:
            await c.subscribe(topic, q)

        async def publisher(k: int) -> None:
            i = 0
            while not stop.is_set():
                i += 1
                key = f"{k}/{i}"
                while not stop.is_set():
                    try:
                        await c.publish(topic, key.encode(), dedup_id=key)
                    except ZdmqError:
                        await asyncio.sleep(0.05)
                        continue
                    acked.add(key)
                    acked_at.append(time.monotonic())
                    break

        tasks = [asyncio.create_task(publisher(k)) for k in range(4)]
        for victim in ["n2", "n1", "n3"][:rounds]:
            await asyncio.sleep(1.0)
            cluster.kill(victim)  # leads its own group, follows two others
            killed_at = time.monotonic()
            before = len(acked)
            await asyncio.sleep(run_s)
            assert len(acked) > before, "no publish was acknowledged while a node was down"
            await asyncio.to_thread(cluster.start_node, victim)
            assert time.monotonic() - killed_at >= run_s
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks)
        assert acked
        gaps = [b - a for a, b in itertools.pairwise(acked_at)]
        print(f"{len(acked)} publishes acknowledged; longest pause {max(gaps):.2f}s")
        for q in subs:
            got = await drain(c, q)
            bodies = [b.decode() for _, b in got]
            assert len(set(bodies)) == len(bodies), f"{q}: a publish stored twice"
            lost = acked - set(bodies)
            assert not lost, f"{q}: {len(lost)} acknowledged publish(es) lost"
