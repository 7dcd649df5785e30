"""At-least-once delivery on real 4-node clusters: leases, re-delivery, dead letters,
idempotent pushes and long polls (docs/design.md §10 and §11).

Most tests share the module's `cluster4` with unique queue names; a test that kills or
restarts a node builds its own with `make_cluster`. Sleeps appear only where a test is
about time passing (a lease or a retention period running out), and are kept short.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

from tests.cluster.support import id_owned_by, placement_of, queue_owned_by
from tests.helpers import unique, wait_until
from zdmq import Client
from zdmq.local import LocalCluster
from zdmq.models import ReceivedMessage, dedup_message_id

T = TypeVar("T")

# A consumer that leases every message of a queue and then hangs without acking: it
# prints one JSON line when it holds them all (the test's cue to kill -9 it).
_HOLDING_CONSUMER = """
import asyncio, json, sys, time
from zdmq import Client

async def main(config, queue, n, visibility_s):
    held = {}
    async with Client.from_config(config) as c:
        leased_at = time.time()
        while len(held) < n:
            for m in await c.receive(queue, 100, visibility_s=visibility_s, wait_s=1):
                assert m.id not in held and m.receive_count == 1, (m.id, m.receive_count)
                held[m.id] = m.body.decode()
        took_s = time.time() - leased_at
        print(json.dumps({"leased_at": leased_at, "took_s": took_s, "held": held}), flush=True)
        await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
"""


async def _receive_all(
    c: Client, queue: str, n: int, *, visibility_s: float, timeout_s: float = 15.0
) -> dict[str, ReceivedMessage]:
    """Leases until `n` distinct messages are held, long polling while none is visible.

    A message received twice while collecting fails the test: its first lease was
    still running, so it must have stayed invisible.
    """
    held: dict[str, ReceivedMessage] = {}
    deadline = time.monotonic() + timeout_s
    while len(held) < n:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(held)} of {n} messages came back in {timeout_s}s"
        got = await c.receive(
            queue, 100, visibility_s=visibility_s, wait_s=min(1.0, max(remaining, 0.1))
        )
        for m in got:
            assert m.id not in held, f"{m.id} delivered twice while its lease ran"
            held[m.id] = m
    return held


async def _timed(aw: Awaitable[T]) -> tuple[T, float]:
    """The result of `aw` and the monotonic time it arrived."""
    result = await aw
    return result, time.monotonic()


async def _raw_push(
    http: aiohttp.ClientSession, url: str, queue: str, mid: str, body: bytes
) -> float:
    """Pushes `body` as message `mid` through `url`; returns when the reply arrived."""
    async with http.post(
        f"{url}/v1/queues/{queue}/messages", data=body, headers={"zdmq-id": mid}
    ) as r:
        assert r.status == 201, await r.text()
        arrived = time.monotonic()
        assert (await r.json())["id"] == mid
    return arrived


# ---- a consumer killed with leases held -------------------------------------------------------
async def test_every_message_a_kill_9ed_consumer_held_comes_back_after_the_visibility_timeout(
    cluster4: LocalCluster, client: Client
) -> None:
    q, n, visibility_s = unique("killed-consumer"), 1_000, 2.0
    await client.create_queue(q)
    bodies = [f"job-{i}" for i in range(n)]
    pushed = dict(zip(await client.push_many(q, bodies), bodies, strict=True))

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDING_CONSUMER,
        str(cluster4.config_path),
        q,
        str(n),
        str(visibility_s),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not line:
            assert proc.stderr is not None
            died = (await proc.stderr.read()).decode(errors="replace")
            raise AssertionError(f"the consumer died before holding every lease:\n{died}")
        report = json.loads(line)
        assert report["held"] == pushed
        assert report["took_s"] < visibility_s, report["took_s"]  # all held at once
        os.kill(proc.pid, signal.SIGKILL)  # only the consumer: a crash, no ack, no release
        assert await proc.wait() == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()

    again = await _receive_all(client, q, n, visibility_s=30, timeout_s=20)
    redelivered_at = time.time()
    # Every lease began after `leased_at`, so none can have ended before this.
    assert redelivered_at >= report["leased_at"] + visibility_s
    assert {mid: m.body.decode() for mid, m in again.items()} == pushed  # none lost
    assert {m.receive_count for m in again.values()} == {2}

    result = await client.ack(q, [m.receipt for m in again.values()])
    assert (result.done, result.failed) == (n, {})
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight, stats.delayed) == (0, 0, 0)
    assert await client.receive(q, 100) == []


# ---- late acks, re-delivery and extension ----------------------------------------------------
async def test_an_ack_after_the_lease_ran_out_reports_lease_expired_and_the_message_comes_back(
    client: Client,
) -> None:
    q = unique("late-ack")
    await client.create_queue(q)
    mid = await client.push(q, b"slow work")

    [first] = await client.receive(q, visibility_s=0.3)
    assert (first.id, first.body, first.receive_count) == (mid, b"slow work", 1)
    await asyncio.sleep(0.5)  # the handler outlasts its lease
    late = await client.ack(q, first.receipt)
    assert (late.done, late.failed) == (0, {first.receipt: "lease_expired"})

    [second] = await client.receive(q, visibility_s=30, wait_s=5)
    assert (second.id, second.body, second.receive_count) == (mid, b"slow work", 2)
    assert second.receipt != first.receipt
    # The stale receipt changes nothing, even now that someone else holds the message.
    assert (await client.ack(q, first.receipt)).failed == {first.receipt: "lease_expired"}
    assert (await client.nack(q, first.receipt)).failed == {first.receipt: "lease_expired"}
    assert (await client.stats(q)).in_flight == 1

    result = await client.ack(q, second.receipt)
    assert (result.done, result.failed) == (1, {})
    assert (await client.stats(q)).messages == 0
    # The first of ack / nack / expiry wins: a second ack of the same lease is a no-op.
    assert (await client.ack(q, second.receipt)).failed == {second.receipt: "lease_expired"}


async def test_an_extended_lease_outlives_its_first_deadline_and_then_acks(client: Client) -> None:
    q = unique("extend")
    await client.create_queue(q)
    mid = await client.push(q, b"long job")

    leased_at = time.time()
    [m] = await client.receive(q, visibility_s=0.5)
    assert m.id == mid
    extended = await client.extend(q, m.receipt, visibility_s=5)
    assert (extended.done, extended.failed) == (1, {})
    await asyncio.sleep(max(0.0, leased_at + 0.8 - time.time()))  # past the first deadline

    assert await client.receive(q, 10) == []  # still leased: nobody else sees it
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight) == (1, 1)
    result = await client.ack(q, m.receipt)
    assert (result.done, result.failed) == (1, {})
    assert (await client.stats(q)).messages == 0


# ---- dead-letter queues ---------------------------------------------------------------------
async def test_a_message_nacked_on_every_delivery_moves_to_the_dead_letter_queue_after_exactly_3(
    client: Client,
) -> None:
    q, dlq, n = unique("always-fails"), unique("always-fails-dlq"), 40
    await client.create_queue(dlq)
    settings = await client.create_queue(q, max_receives=3, dead_letter_queue=dlq)
    assert (settings.max_receives, settings.dead_letter_queue) == (3, dlq)
    bodies = [f"poison-{i}".encode() for i in range(n)]
    pushed = dict(zip(await client.push_many(q, bodies), bodies, strict=True))

    for delivery in (1, 2, 3):
        held = await _receive_all(client, q, n, visibility_s=30)
        assert set(held) == set(pushed)
        assert {m.receive_count for m in held.values()} == {delivery}
        result = await client.nack(q, [m.receipt for m in held.values()])
        assert (result.done, result.failed) == (n, {})
        if delivery < 3:  # still in the source queue, visible again
            stats = await client.stats(q)
            assert (stats.messages, stats.dead_lettered) == (n, 0)

    # No fourth delivery: every message is in the DLQ and nowhere else.
    assert await client.receive(q, 100) == []
    source, dead = await client.stats(q), await client.stats(dlq)
    assert (source.messages, source.in_flight, source.dead_lettered) == (0, 0, n)
    assert dead.messages == n

    moved = await _receive_all(client, dlq, n, visibility_s=30)
    assert {mid: m.body for mid, m in moved.items()} == pushed  # same ids, same bodies
    assert {m.receive_count for m in moved.values()} == {1}
    result = await client.ack(dlq, [m.receipt for m in moved.values()])
    assert (result.done, result.failed) == (n, {})
    source, dead = await client.stats(q), await client.stats(dlq)
    assert (source.messages, source.dead_lettered, dead.messages) == (0, 0, 0)


async def test_a_message_whose_leases_keep_expiring_moves_to_the_dead_letter_queue_too(
    client: Client,
) -> None:
    q, dlq, n = unique("never-acked"), unique("never-acked-dlq"), 5
    await client.create_queue(dlq)
    await client.create_queue(q, max_receives=2, dead_letter_queue=dlq)
    bodies = [f"lost-worker-{i}".encode() for i in range(n)]
    pushed = dict(zip(await client.push_many(q, bodies), bodies, strict=True))

    for delivery in (1, 2):
        held = await _receive_all(client, q, n, visibility_s=0.8)
        assert set(held) == set(pushed)
        assert {m.receive_count for m in held.values()} == {delivery}
        # No ack, no nack: the leases run out and the monitor decides.

    async def all_dead_lettered() -> bool:
        # Each node reports its held and its dead-lettered count in one look, and a
        # message never leaves its node: every message is in exactly one of the queues.
        source = await client.stats(q)
        assert source.messages + source.dead_lettered == n, source
        return (source.messages, source.dead_lettered) == (0, n)

    await wait_until(all_dead_lettered, timeout_s=10, what="expiry to dead-letter every message")
    assert (await client.stats(dlq)).messages == n
    assert await client.receive(q, 100) == []
    moved = await _receive_all(client, dlq, n, visibility_s=30)
    assert {mid: m.body for mid, m in moved.items()} == pushed
    assert {m.receive_count for m in moved.values()} == {1}
    assert (await client.ack(dlq, [m.receipt for m in moved.values()])).done == n


# ---- idempotent pushes ----------------------------------------------------------------------
async def test_a_push_retried_five_times_with_one_dedup_id_is_delivered_once(
    cluster4: LocalCluster, client: Client, http: aiohttp.ClientSession
) -> None:
    placement = placement_of(cluster4)
    q, other = unique("dedup"), unique("dedup-other")
    await client.create_queue(q)
    await client.create_queue(other)

    # The client: five retries, one id, the id derived from the dedup id.
    id1 = dedup_message_id(q, "order-1")
    assert [await client.push(q, b"first", dedup_id="order-1") for _ in range(5)] == [id1] * 5

    # Raw HTTP through a node that does not own the id: the push is forwarded.
    id2 = dedup_message_id(q, "order-2")
    via = next(n for n in cluster4.nodes if n != placement.owner(id2))
    url = cluster4.config.node(via).url
    replies = []
    for _ in range(5):
        async with http.post(
            f"{url}/v1/queues/{q}/messages", data=b"second", headers={"zdmq-dedup-id": "order-2"}
        ) as r:
            replies.append((r.status, await r.json()))
    assert replies[0] == (201, {"id": id2, "duplicate": False})
    assert replies[1:] == [(200, {"id": id2, "duplicate": True})] * 4

    # A batch is deduplicated against earlier pushes and within itself.
    id3 = dedup_message_id(q, "order-3")
    batch = {
        "messages": [
            {"body": "first again", "dedup_id": "order-1"},
            {"body": "second again", "dedup_id": "order-2"},
            {"body": "third", "dedup_id": "order-3"},
            {"body": "third again", "dedup_id": "order-3"},
        ]
    }
    async with http.post(f"{url}/v1/queues/{q}/batch", json=batch) as r:
        assert r.status == 201, await r.text()
        assert await r.json() == {"ids": [id1, id2, id3, id3], "duplicates": 3}
    id4 = dedup_message_id(q, "order-4")
    assert await client.push_many(q, [b"x", b"fourth"], dedup_ids=["order-1", "order-4"]) == [
        id1,
        id4,
    ]

    # The same dedup id in another queue is another message.
    other_id = await client.push(other, b"elsewhere", dedup_id="order-1")
    assert other_id != id1
    assert (await client.stats(other)).messages == 1

    delivered = []
    while batch_got := await client.pop_many(q, 100):
        delivered.extend(batch_got)
    assert sorted((m.id, m.body) for m in delivered) == sorted(
        [(id1, b"first"), (id2, b"second"), (id3, b"third"), (id4, b"fourth")]
    )
    # Still inside the window after delivery: a late retry stores nothing.
    async with http.post(
        f"{url}/v1/queues/{q}/messages", data=b"late retry", headers={"zdmq-dedup-id": "order-2"}
    ) as r:
        assert (r.status, await r.json()) == (200, {"id": id2, "duplicate": True})
    assert (await client.stats(q)).messages == 0
    [m] = await client.pop_many(other, 10)
    assert (m.id, m.body) == (other_id, b"elsewhere")


# ---- long polls -----------------------------------------------------------------------------
async def _long_poll_wakes_within_100_ms(
    cluster4: LocalCluster,
    client: Client,
    http: aiohttp.ClientSession,
    op: str,
    take: Callable[[str], Awaitable[list[tuple[str, bytes]]]],
) -> None:
    placement = placement_of(cluster4)
    for node_id in cluster4.nodes:
        # A fresh, empty queue whose metadata lives on n1: the push lands on the metadata
        # owner once and on another node three times.
        q = queue_owned_by(placement, "n1", prefix=f"wake-{op}")
        await client.create_queue(q)
        calls = client.calls[op].calls
        waiting = asyncio.create_task(_timed(take(q)))

        async def long_poll_sent(before: int = calls, task: asyncio.Task[object] = waiting) -> bool:
            # A guess, the metadata list, then the long poll on the metadata owner.
            assert not task.done(), task
            return client.calls[op].calls >= before + 3

        await wait_until(long_poll_sent, timeout_s=5, what=f"the {op} long poll")
        mid = id_owned_by(placement, node_id)
        pushed_at = await _raw_push(http, cluster4.config.node(node_id).url, q, mid, b"wake up")
        got, returned_at = await asyncio.wait_for(waiting, 10)
        assert got == [(mid, b"wake up")], node_id
        assert returned_at - pushed_at < 0.1, (node_id, returned_at - pushed_at)


async def test_a_waiting_receive_returns_within_100_ms_of_a_push_on_any_node(
    cluster4: LocalCluster, client: Client, http: aiohttp.ClientSession
) -> None:
    async def take(q: str) -> list[tuple[str, bytes]]:
        return [(m.id, m.body) for m in await client.receive(q, wait_s=10)]

    await _long_poll_wakes_within_100_ms(cluster4, client, http, "receive", take)


async def test_a_waiting_pop_returns_within_100_ms_of_a_push_on_any_node(
    cluster4: LocalCluster, client: Client, http: aiohttp.ClientSession
) -> None:
    async def take(q: str) -> list[tuple[str, bytes]]:
        m = await client.pop(q, wait_s=10)
        return [] if m is None else [(m.id, m.body)]

    await _long_poll_wakes_within_100_ms(cluster4, client, http, "pop", take)


async def test_a_raw_long_poll_through_a_node_that_is_not_the_metadata_owner_gets_the_message(
    cluster4: LocalCluster, client: Client, http: aiohttp.ClientSession
) -> None:
    placement = placement_of(cluster4)
    q = queue_owned_by(placement, "n1", prefix="curl-wait")
    await client.create_queue(q)
    entry, holder = cluster4.config.node("n2").url, "n3"

    async def curl() -> dict[str, Any]:
        async with http.post(
            f"{entry}/v1/queues/{q}/receive", params={"wait_s": "5", "visibility_s": "30"}
        ) as r:
            assert r.status == 200, await r.text()
            return dict(await r.json())

    waiting = asyncio.create_task(_timed(curl()))
    await asyncio.sleep(0.2)  # this test is about the wait: the poll is parked when the push lands
    assert not waiting.done()
    mid = id_owned_by(placement, holder)
    pushed_at = await _raw_push(http, cluster4.config.node(holder).url, q, mid, b"for curl")
    reply, returned_at = await asyncio.wait_for(waiting, 10)
    [m] = reply["messages"]
    assert (m["id"], m["body"], m["receive_count"]) == (mid, "for curl", 1)
    assert m["receipt"].startswith(mid + ".")
    assert returned_at - pushed_at < 0.5
    # The ack, like the poll, goes through n2: it forwards the receipt to the holder.
    async with http.post(f"{entry}/v1/queues/{q}/ack", json={"receipts": [m["receipt"]]}) as r:
        assert (r.status, await r.json()) == (200, {"acked": 1, "failed": []})
    assert (await client.stats(q)).messages == 0


async def test_a_receive_that_waits_on_an_empty_queue_returns_nothing_after_the_wait(
    client: Client,
) -> None:
    q = unique("empty-wait")
    await client.create_queue(q)
    started = time.monotonic()
    assert await client.receive(q, 10, wait_s=1) == []
    assert 0.9 <= time.monotonic() - started <= 3.0


# ---- leases across a node restart, queue settings ---------------------------------------------
async def test_leases_survive_kill_9_of_the_node_holding_the_leased_messages(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = make_cluster(nodes=4)
    placement = placement_of(cluster)
    holder, lease_s = "n2", 4.0
    q = queue_owned_by(placement, "n1", prefix="lease-restart")  # metadata stays up
    holder_url = cluster.config.node(holder).url
    async with Client.from_config(cluster.config_path) as c:
        await c.create_queue(q)
        ids = [id_owned_by(placement, holder) for _ in range(2)]
        for mid in ids:
            await _raw_push(http, holder_url, q, mid, mid.encode())
        leased_at = time.time()
        held = {m.id: m for m in await c.receive(q, 10, visibility_s=lease_s)}
        assert set(held) == set(ids)

    await asyncio.to_thread(cluster.kill, holder)
    await asyncio.to_thread(cluster.restart, holder)
    assert time.time() < leased_at + lease_s - 1, "the restart outlasted the leases"

    # A new client: the old one's connections to the holder died with it.
    async with Client.from_config(cluster.config_path) as c:
        assert await c.receive(q, 10) == []  # the leases came back from disk
        stats = await c.stats(q)
        assert (stats.messages, stats.in_flight) == (2, 2)
        acked, expiring = held[ids[0]], held[ids[1]]
        result = await c.ack(q, acked.receipt)  # a receipt from before the crash
        assert (result.done, result.failed) == (1, {})

        [again] = await c.receive(q, visibility_s=30, wait_s=lease_s + 5)
        assert time.time() >= leased_at + lease_s
        assert (again.id, again.body, again.receive_count) == (expiring.id, expiring.body, 2)
        assert (await c.ack(q, expiring.receipt)).failed == {expiring.receipt: "lease_expired"}
        assert (await c.ack(q, again.receipt)).done == 1
        assert (await c.stats(q)).messages == 0


async def test_receive_without_a_visibility_uses_the_queues_visibility_timeout(
    client: Client,
) -> None:
    q = unique("default-visibility")
    settings = await client.create_queue(q, visibility_timeout_s=1)
    assert settings.visibility_timeout_s == 1
    assert (await client.queue_settings(q)).visibility_timeout_s == 1
    mid = await client.push(q, b"default lease")

    leased_at = time.time()
    [first] = await client.receive(q)
    assert await client.receive(q) == []
    [again] = await client.receive(q, wait_s=5)
    waited_s = time.time() - leased_at
    assert 1.0 <= waited_s < 5.0  # the queue's 1 s, not the 30 s default
    assert (first.id, again.id, again.receive_count) == (mid, mid, 2)
    assert (await client.ack(q, again.receipt)).done == 1


async def test_messages_older_than_the_queues_retention_are_never_delivered_and_leave_stats(
    client: Client,
) -> None:
    received_q, idle_q = unique("retention-rx"), unique("retention-idle")
    for q in (received_q, idle_q):
        await client.create_queue(q, retention_s=1)
        await client.push_many(q, [f"stale-{i}" for i in range(8)])
    pushed_at = time.time()
    assert (await client.stats(idle_q)).messages == 8

    await asyncio.sleep(max(0.0, pushed_at + 1.2 - time.time()))  # retention runs out
    assert await client.receive(received_q, 100) == []
    assert await client.pop(received_q) is None
    fresh = await client.push(received_q, b"fresh")
    [m] = await client.receive(received_q, 100, wait_s=2)
    assert (m.id, m.body) == (fresh, b"fresh")
    assert (await client.ack(received_q, m.receipt)).done == 1
    assert (await client.stats(received_q)).messages == 0

    # Nobody touches the idle queue: the node's housekeeping drops them all the same.
    async def idle_emptied() -> bool:
        return (await client.stats(idle_q)).messages == 0

    await wait_until(idle_emptied, timeout_s=5, what="retention to drop the idle queue's messages")
    assert await client.receive(idle_q, 100) == []
