"""Consumers' streams (`GET /v1/queues/{queue}/stream`, a WebSocket) against a real cluster:
credit bounds what a node leases ahead, every message reaches one stream of the ones held to
every node, settles travel back on the stream, and refusals come as typed errors."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.helpers import unique, wait_until
from zdmq import Client
from zdmq.client.stream import NodeStream
from zdmq.errors import BadRequest, QueueNotFound, UpgradeRequired
from zdmq.local import LocalCluster
from zdmq.models import ReceivedMessage


async def open_all(client: Client, queue: str, credit: int, **kw: float) -> list[NodeStream]:
    return [await client.open_stream(n, queue, credit=credit, **kw) for n in client.node_ids]


async def collect(
    streams: list[NodeStream], want: int, timeout_s: float = 10.0, quiet_s: float | None = None
) -> list[tuple[NodeStream, ReceivedMessage]]:
    """What the streams deliver until `want` messages came, the time is up, or (with
    `quiet_s`) nothing more came for that long."""
    got: list[tuple[NodeStream, ReceivedMessage]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        waits = {asyncio.ensure_future(s.deliveries.get()): s for s in streams}
        wait_s = deadline - time.monotonic()
        if quiet_s is not None:
            wait_s = min(wait_s, quiet_s)
        done, pending = await asyncio.wait(
            waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
        )
        for p in pending:
            p.cancel()
        if not done:
            break
        for d in done:
            batch = d.result()
            assert batch is not None, f"{waits[d].node_id} closed: {waits[d].close_reason}"
            got += [(waits[d], m) for m in batch]
    return got


async def test_streams_to_every_node_deliver_each_message_once_within_their_credit(
    client: Client,
) -> None:
    q = unique("stream")
    await client.create_queue(q, visibility_timeout_s=60)
    streams = await open_all(client, q, credit=3)
    try:
        ids = set(await client.push_many(q, [b"m%d" % i for i in range(40)]))
        first = await collect(streams, 40, timeout_s=5.0, quiet_s=0.5)
        per_stream = {s.node_id: sum(1 for t, _ in first if t is s) for s in streams}
        # Each stream holds 3 credits: 12 at most are out before any is granted again.
        assert len(first) <= 3 * len(streams), per_stream
        assert all(n <= 3 for n in per_stream.values()), per_stream
        got = list(first)
        while len(got) < 40:
            for s in streams:
                s.grant(3)
            more = await collect(streams, 40 - len(got), timeout_s=10.0, quiet_s=0.5)
            assert more, f"nothing more after granting credit; {len(got)} of 40"
            got += more
        assert sorted(m.id for _, m in got) == sorted(ids)
        assert all(m.receive_count == 1 for _, m in got)
        # Acks on the stream each message came from (any node settles any receipt).
        for s in streams:
            mine = [m.receipt for t, m in got if t is s]
            if mine:
                assert await s.settle("ack", mine) == (len(mine), {})
        stats = await client.stats(q)
        assert stats.messages == 0 and stats.in_flight == 0, stats
    finally:
        for s in streams:
            await s.close()


async def test_a_stream_wakes_on_a_push_and_settles_nack_and_extend(client: Client) -> None:
    q = unique("stream")
    await client.create_queue(q, visibility_timeout_s=60)
    streams = await open_all(client, q, credit=10, visibility_s=30.0)
    try:
        await asyncio.sleep(0.3)  # every stream waits on an empty queue
        mid = await client.push(q, b"late")
        (s, m), *_ = await collect(streams, 1)
        assert m.id == mid and m.body == b"late"
        done, failed = await s.settle("extend", [m.receipt, "not-a-receipt"], 60.0)
        assert (done, failed) == (1, {"not-a-receipt": "invalid_receipt"})
        assert await s.settle("nack", [m.receipt]) == (1, {})
        # Released, it comes again at once, on whichever stream, a second time.
        (s2, again), *_ = await collect(streams, 1)
        assert again.id == mid and again.receive_count == 2
        assert await s2.settle("ack", [m.receipt]) == (0, {m.receipt: "lease_expired"})
        assert await s2.settle("ack", [again.receipt]) == (1, {})
    finally:
        for s in streams:
            await s.close()


async def test_a_drained_stream_sends_nothing_until_it_is_granted_credit_again(
    client: Client,
) -> None:
    q = unique("drain")
    await client.create_queue(q)
    streams = await open_all(client, q, credit=10)
    try:
        await asyncio.sleep(0.3)  # every stream waits on an empty queue
        assert [await s.drain() for s in streams] == [10] * len(streams)
        assert all(s.credit == 0 for s in streams)
        assert [await s.drain() for s in streams] == [0] * len(streams)  # nothing left
        ids = set(await client.push_many(q, [b"a", b"b", b"c"]))
        assert await collect(streams, 1, timeout_s=1.0) == []
        for s in streams:
            s.grant(3)  # (a batch is stored on one node)
        got = await collect(streams, 3, timeout_s=5.0, quiet_s=1.0)
        assert {m.id for _, m in got} == ids
        assert all(s.credit >= 0 for s in streams)
        assert sum(s.credit for s in streams) == 3 * len(streams) - 3
        for s in streams:
            mine = [m.receipt for t, m in got if t is s]
            if mine:
                assert await s.settle("ack", mine) == (len(mine), {})
    finally:
        for s in streams:
            await s.close()


async def test_what_a_closed_stream_held_comes_back_after_its_lease(client: Client) -> None:
    q = unique("stream")
    await client.create_queue(q)
    streams = await open_all(client, q, credit=50, visibility_s=1.0)
    ids = set(await client.push_many(q, [b"x"] * 10))
    got = await collect(streams, 10)
    assert {m.id for _, m in got} == ids
    for s in streams:
        await s.close()
    # Nobody acked: every lease runs out and the messages are there to receive again.
    again: list[ReceivedMessage] = []

    async def all_back() -> bool:
        again.extend(await client.receive(q, 10, wait_s=1.0))
        return {m.id for m in again} == ids

    await wait_until(all_back, timeout_s=15, what="every message back after its lease")
    await client.ack(q, [m.receipt for m in again])


async def test_refusals_come_as_typed_errors(
    client: Client, cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    node = client.node_ids[0]
    with pytest.raises(QueueNotFound):
        await client.open_stream(node, unique("missing"), credit=1)
    q = unique("stream")
    await client.create_queue(q)
    url = cluster4.config.node(node).url
    async with http.get(f"{url}/v1/queues/{q}/stream") as r:
        assert r.status == 426 and r.headers["Upgrade"] == "websocket"
        assert (await r.json())["error"]["code"] == UpgradeRequired.code
    async with http.get(f"{url}/v1/queues/{q}/stream?credit=-1") as r:
        assert r.status == 400
    # A frame that is not the protocol ends the stream with 4400 and says why.
    s = await client.open_stream(node, q, credit=1)
    s._send(b"Z")
    assert await asyncio.wait_for(s.deliveries.get(), 5) is None
    assert isinstance(s.close_reason, BadRequest), s.close_reason
    assert "unknown frame kind" in str(s.close_reason)
    with pytest.raises(ValueError):
        await client.open_stream(node, q, credit=10_001)
