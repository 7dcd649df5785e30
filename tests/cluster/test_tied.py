"""Tied messages on real nodes: copies in several queues of which one is delivered (the
first to win its claim), a cancel before any delivery, and competing consumers."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import aiohttp

from tests.helpers import unique, wait_until
from zdmq import Client, ZdmqError
from zdmq.local import LocalCluster


async def _empty(client: Client, queues: list[str]) -> bool:
    return all([(await client.stats(q)).messages == 0 for q in queues])


async def test_one_copy_of_a_tie_is_delivered_and_the_others_go(client: Client) -> None:
    queues = [unique("tied") for _ in range(3)]
    for q in queues:
        await client.create_queue(q)
    token, ids = await client.push_tied(queues, "job 1", attributes={"k": "v"})
    assert set(ids) == set(queues) and len(set(ids.values())) == 3
    [m] = await client.receive(queues[1], max_messages=10)
    assert (m.id, m.text(), m.attributes) == (ids[queues[1]], "job 1", {"k": "v"})
    # The other copies are cancelled; a receive that meets one before drops it.
    for q in (queues[0], queues[2]):
        assert await client.receive(q, max_messages=10) == []
    await client.ack(queues[1], [m.receipt])
    await wait_until(lambda: _empty(client, queues), timeout_s=10, what="every copy gone")
    assert await client.cancel_tied(token) == ids[queues[1]]  # it names the delivered copy


async def test_a_cancelled_tie_leaves_nothing_to_deliver(client: Client) -> None:
    queues = [unique("tied") for _ in range(3)]
    for q in queues:
        await client.create_queue(q)
    token, _ = await client.push_tied(queues, "never")
    assert await client.cancel_tied(token) is None
    for q in queues:
        assert await client.receive(q, max_messages=10) == []
        assert await client.pop_many(q, 10) == []
    assert await _empty(client, queues)
    try:
        await client.cancel_tied("no-such-tie")
    except ZdmqError as e:
        assert e.code == "tie_not_found"
    else:
        raise AssertionError("a cancel of an unknown tie succeeded")


async def test_a_retried_tie_with_its_token_stores_no_copy_twice(client: Client) -> None:
    queues = [unique("tied") for _ in range(2)]
    for q in queues:
        await client.create_queue(q)
    first = await client.push_tied(queues, "once", token="retry-1")
    assert await client.push_tied(queues, "once", token="retry-1") == first
    assert sum([(await client.stats(q)).messages for q in queues]) == 2


async def test_rest_refuses_bad_ties(cluster4: LocalCluster, http: aiohttp.ClientSession) -> None:
    url = cluster4.config.node(cluster4.config.node_ids[0]).url
    q = unique("tied")
    async with http.put(f"{url}/v1/queues/{q}", json={}) as r:
        assert r.status == 201
    bad = [
        {},
        {"messages": []},
        {"messages": [{"queue": q, "body": "a", "colour": "red"}]},
        {"messages": [{"queue": q, "body": "a", "id": "6f1c2a52-3f0b-4b7e-9a52-7a646d712d31"}]},
        {"messages": [{"queue": q, "body": "a"}], "token": "no spaces"},
        {"messages": [{"queue": "bad name", "body": "a"}]},
    ]
    for payload in bad:
        async with http.post(f"{url}/v1/tied", json=payload) as r:
            assert r.status == 400, (payload, await r.text())
            assert "error" in await r.json()
    async with http.post(
        f"{url}/v1/tied", json={"messages": [{"queue": unique("missing"), "body": "a"}]}
    ) as r:
        assert r.status == 404, await r.text()
    fifo = unique("fifo")
    async with http.put(f"{url}/v1/queues/{fifo}", json={"fifo": True}) as r:
        assert r.status == 201
    copies = [{"queue": q, "body": "a"}, {"queue": fifo, "body": "a"}]
    async with http.post(f"{url}/v1/tied", json={"messages": copies}) as r:
        assert r.status == 409, await r.text()  # a copy has no group: nothing stored
        assert (await r.json())["error"]["code"] == "fifo_conflict"
    async with http.get(f"{url}/v1/queues/{q}") as r:
        assert (await r.json())["messages"] == 0
    async with http.delete(f"{url}/v1/tied/nothing-here") as r:
        assert r.status == 404
        assert (await r.json())["error"]["code"] == "tie_not_found"


async def test_two_copies_of_a_tie_in_one_queue_deliver_one(client: Client) -> None:
    q = unique("tied")
    await client.create_queue(q)
    await client.push_tied([q, q], "job")
    assert (await client.stats(q)).messages == 2
    got = []

    async def drained() -> bool:
        got.extend(await client.pop_many(q, 10))
        return (await client.stats(q)).messages == 0

    await wait_until(drained, timeout_s=10, what="both copies met")
    assert [m.text() for m in got] == ["job"]


async def test_competing_consumers_process_each_tied_message_once(client: Client) -> None:
    """1,000 messages each tied across 3 queues, one consumer per queue (receive, ack):
    each message is processed once (at least 99% of them; never more than 3 times)."""
    queues = [unique("tied") for _ in range(3)]
    for q in queues:
        await client.create_queue(q, visibility_timeout_s=30)
    trials = 1000
    sem = asyncio.Semaphore(32)

    async def tie(n: int) -> None:
        async with sem:
            await client.push_tied(queues, f"trial {n}")

    started = time.monotonic()
    await asyncio.gather(*(tie(n) for n in range(trials)))
    pushed_s = time.monotonic() - started
    processed: Counter[str] = Counter()
    done = asyncio.Event()

    async def consume(q: str) -> None:
        while not done.is_set():
            got = await client.receive(q, max_messages=10, wait_s=0.2)
            if got:
                processed.update(m.text() for m in got)
                await client.ack(q, [m.receipt for m in got])
            if len(processed) >= trials:
                done.set()

    consumers = [asyncio.create_task(consume(q)) for q in queues]
    try:
        await asyncio.wait_for(done.wait(), 60)
    finally:
        done.set()
        await asyncio.gather(*consumers)
    took = time.monotonic() - started - pushed_s
    once = sum(1 for n in range(trials) if processed[f"trial {n}"] == 1)
    print(f"tied: {trials} ties pushed in {pushed_s:.1f}s, consumed in {took:.1f}s; {once} once")
    assert max(processed.values()) <= 3
    assert once >= 0.99 * trials, Counter(processed.values())
    await wait_until(lambda: _empty(client, queues), timeout_s=20, what="every copy gone")
