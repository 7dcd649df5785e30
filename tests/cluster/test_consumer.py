"""The consumer helper, `client.consume(...)`, against a real 4-node cluster.

Every test records what it pushed and what the consumer handled, and a checker states
the verdict (lost = 0, duplicates counted). Releases are told apart from expiries by
leasing with a long visibility (30 s): a message visible again within a second or two
was released by the consumer, not requeued by the lease monitor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import unique, wait_until
from zdmq import Client
from zdmq.client.consumer import DEFAULT_PREFETCH, STREAM_FLOOR, Consumer, Outcome
from zdmq.errors import QueueNotFound
from zdmq.local import LocalCluster
from zdmq.models import ReceivedMessage

LONG_S = 30.0  # a lease that never runs out during a test: only a release frees it
REPO = Path(__file__).resolve().parents[2]


class HandlerFailed(Exception):
    """What the always-failing handler raises."""


@dataclass
class Verdict:
    lost: list[str] = field(default_factory=list)  # pushed, never handled nor left behind
    duplicates: int = 0  # deliveries beyond the first of the same id
    unknown: list[str] = field(default_factory=list)  # handled, but never pushed
    corrupted: list[str] = field(default_factory=list)  # handled with another body

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.unknown or self.corrupted)


def check(pushed: dict[str, bytes], *seen: Iterable[tuple[str, bytes]]) -> Verdict:
    """Compares every message seen (handled, or found left in a queue) with those pushed."""
    v = Verdict()
    counts: Counter[str] = Counter()
    for part in seen:
        for mid, body in part:
            counts[mid] += 1
            if mid not in pushed:
                v.unknown.append(mid)
            elif pushed[mid] != body:
                v.corrupted.append(mid)
    v.lost = sorted(set(pushed) - set(counts))
    v.duplicates = sum(n - 1 for n in counts.values())
    return v


async def push_bodies(client: Client, queue: str, n: int) -> dict[str, bytes]:
    bodies = [f"{queue}/{i}".encode() for i in range(n)]
    ids = await client.push_many(queue, bodies)
    return dict(zip(ids, bodies, strict=True))


async def receive_all(client: Client, queue: str, n: int, within_s: float) -> list[ReceivedMessage]:
    """Leases (for LONG_S) the `n` messages expected to be visible now; fails the test
    if they do not all turn up within `within_s` (far shorter than any lease)."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + within_s
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} visible in {within_s}s"
        got += await client.receive(queue, min(n - len(got), 100), visibility_s=LONG_S)
    assert await client.receive(queue, 100, visibility_s=LONG_S) == []
    return got


def pairs(msgs: Iterable[ReceivedMessage]) -> list[tuple[str, bytes]]:
    return [(m.id, m.body) for m in msgs]


# ---- handler mode ---------------------------------------------------------------------
async def test_a_burst_handler_consumer_handles_each_of_200_messages_once_and_empties_the_queue(
    client: Client,
) -> None:
    q = unique("drain")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, 200)
    handled: list[tuple[str, bytes]] = []

    async def handle(msg: ReceivedMessage) -> None:
        handled.append((msg.id, msg.body))

    consumer = client.consume(q, handle, concurrency=8, burst=True, wait_s=0)
    async with asyncio.timeout(30):
        outcomes = [o async for o in consumer]

    assert check(pushed, handled) == Verdict()
    assert len(outcomes) == 200
    assert all(o.acked and o.error is None and o.code is None for o in outcomes)
    assert sorted(o.message.id for o in outcomes) == sorted(pushed)
    assert (consumer.received, consumer.acked, consumer.nacked) == (200, 200, 0)
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight, stats.delayed) == (0, 0, 0)


async def test_handlers_slower_than_the_visibility_timeout_cause_no_duplicates_as_leases_extend(
    client: Client,
) -> None:
    q = unique("slow")
    await client.create_queue(q, visibility_timeout_s=0.6)
    pushed = await push_bodies(client, q, 8)
    handled: list[tuple[str, bytes]] = []

    async def handle(msg: ReceivedMessage) -> None:
        await asyncio.sleep(1.5)  # this test is about a handler outliving its lease
        handled.append((msg.id, msg.body))

    consumer = client.consume(q, handle, concurrency=4, visibility_s=0.6, burst=True, wait_s=0)
    async with asyncio.timeout(30):
        outcomes = [o async for o in consumer]

    # Without extension each lease ends at 0.6 s, the late acks fail as lease_expired
    # and the burst consumer handles the requeued messages a second time.
    assert check(pushed, handled) == Verdict()
    assert [o.code for o in outcomes if o.code is not None] == []
    assert len(outcomes) == 8 and all(o.acked for o in outcomes)
    assert consumer.extended > 0
    assert consumer.lost_leases == 0
    assert (consumer.received, consumer.acked) == (8, 8)
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight) == (0, 0)


async def test_a_handler_that_always_fails_sends_each_message_to_the_dlq_after_exactly_3_deliveries(
    client: Client,
) -> None:
    n = 12
    dlq = unique("dlq")
    await client.create_queue(dlq)
    q = unique("failing")
    await client.create_queue(q, max_receives=3, dead_letter_queue=dlq)
    pushed = await push_bodies(client, q, n)
    deliveries: dict[str, list[int]] = {mid: [] for mid in pushed}

    async def handle(msg: ReceivedMessage) -> None:
        deliveries[msg.id].append(msg.receive_count)
        raise HandlerFailed(msg.id)

    # Not burst: between failures a message is delayed (backoff), and a burst consumer
    # would take the momentarily empty queue for a drained one. The long poll wakes
    # when a delayed message becomes visible.
    consumer = client.consume(q, handle, concurrency=4, wait_s=2, backoff_s=0.01)
    outcomes: list[Outcome] = []
    async with asyncio.timeout(30):
        async for o in consumer:
            outcomes.append(o)
            if len(outcomes) == 3 * n:
                consumer.stop()

    assert deliveries == {mid: [1, 2, 3] for mid in pushed}
    assert len(outcomes) == 3 * n
    for o in outcomes:
        assert not o.acked
        assert isinstance(o.error, HandlerFailed) and o.error.args == (o.message.id,)
        assert o.code is None  # the nack (or the move to the DLQ) took effect
    assert (consumer.acked, consumer.nacked) == (0, 3 * n)

    source = await client.stats(q)
    assert (source.messages, source.in_flight, source.delayed) == (0, 0, 0)
    assert source.dead_lettered == n
    assert (await client.stats(dlq)).messages == n
    in_dlq: list[tuple[str, bytes]] = []
    while got := await client.pop_many(dlq, 100):
        in_dlq += [(m.id, m.body) for m in got]
    assert check(pushed, in_dlq) == Verdict()  # same ids, same bodies, each once


# ---- body mode ------------------------------------------------------------------------
async def test_in_body_mode_a_message_is_acked_when_the_body_moves_on_and_a_nack_brings_it_back(
    client: Client,
) -> None:
    q = unique("body")
    await client.create_queue(q, visibility_timeout_s=LONG_S)
    pushed = await push_bodies(client, q, 12)
    seen: list[ReceivedMessage] = []
    nacked: ReceivedMessage | None = None

    consumer: Consumer = client.consume(q, prefetch=4, burst=True, wait_s=0)
    async with asyncio.timeout(30):
        async for msg in consumer:
            # The message before this one was acked (in the background) once the body moved
            # on from it, while the loop still runs: not at the shutdown.
            expect = len(seen) - (nacked is not None)

            async def previous_acked(expect: int = expect) -> bool:
                return consumer.acked == expect

            await wait_until(previous_acked, timeout_s=5, what=f"{expect} acks")
            seen.append(msg)
            if nacked is None:
                nacked = msg
                assert await consumer.nack(msg)

    assert nacked is not None
    again = [m for m in seen if m.id == nacked.id]
    assert [m.receive_count for m in again] == [1, 2]  # released, then delivered again
    assert all(m.receive_count == 1 for m in seen if m.id != nacked.id)
    once = [(m.id, m.body) for m in seen if m is not nacked]
    assert check(pushed, once) == Verdict()
    assert (consumer.acked, consumer.nacked) == (12, 1)
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight) == (0, 0)


async def test_a_fast_body_consumer_acks_in_batches_and_every_ack_is_committed_at_the_end(
    client: Client,
) -> None:
    q = unique("batched")
    await client.create_queue(q, visibility_timeout_s=LONG_S)
    pushed = await push_bodies(client, q, 300)
    seen: list[tuple[str, bytes]] = []

    consumer: Consumer = client.consume(q, prefetch=100, burst=True, wait_s=0)
    async with asyncio.timeout(30):
        async for msg in consumer:
            seen.append((msg.id, msg.body))

    assert check(pushed, seen) == Verdict()
    assert consumer.acked == 300
    # Acks that come in while one ack call runs go together in the next call.
    assert consumer.ack_batches <= 300 // 10, consumer.ack_batches
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight) == (0, 0)


async def test_a_handler_consumer_takes_its_next_message_while_the_last_ones_ack_commits(
    client: Client,
) -> None:
    """With one handler at a time (the default), a message's ack is on its way while the
    next one is handled: the acks go in batches, and each Outcome still comes once its
    ack has committed."""
    q = unique("handled")
    await client.create_queue(q, visibility_timeout_s=LONG_S)
    pushed = await push_bodies(client, q, 300)
    seen: list[tuple[str, bytes]] = []

    async def handle(msg: ReceivedMessage) -> None:
        seen.append((msg.id, msg.body))

    outcomes: list[Outcome] = []
    consumer: Consumer = client.consume(q, handle)
    async with asyncio.timeout(30):
        async for o in consumer:
            outcomes.append(o)
            if len(outcomes) == 300:
                consumer.stop()
    assert check(pushed, seen) == Verdict()
    assert all(o.acked and o.code is None for o in outcomes)
    assert sorted(o.message.id for o in outcomes) == sorted(pushed)
    # One ack call a message, were each handler waiting for its own ack.
    assert consumer.ack_batches <= 300 // 5, consumer.ack_batches
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight) == (0, 0)


async def test_raising_in_the_body_releases_the_message_in_hand_and_the_prefetched_ones_at_once(
    client: Client,
) -> None:
    q = unique("raise")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, 10)
    consumer = client.consume(q, prefetch=4, visibility_s=LONG_S, burst=True, wait_s=0)
    in_hand: ReceivedMessage | None = None

    async def prefetched() -> bool:
        return consumer.received == 4  # the message in hand and 3 leased ahead

    with pytest.raises(HandlerFailed):
        async with asyncio.timeout(30):
            async for msg in consumer:
                in_hand = msg
                await wait_until(prefetched, timeout_s=5, what="4 leased messages")
                raise HandlerFailed(msg.id)

    assert in_hand is not None
    assert consumer.acked == 0

    async def all_visible() -> bool:
        s = await client.stats(q)
        return (s.messages, s.in_flight, s.delayed) == (10, 0, 0)

    # Leased for 30 s: visible again within seconds only because they were released.
    await wait_until(all_visible, timeout_s=3, what="the 4 leased messages released")
    assert consumer.nacked == 4
    again = await receive_all(client, q, 10, within_s=2)
    assert check(pushed, pairs(again)) == Verdict()
    counts = Counter(m.receive_count for m in again)
    assert counts == {2: 4, 1: 6}
    assert {m.id: m.receive_count for m in again}[in_hand.id] == 2


async def test_stopping_a_body_consumer_ends_the_loop_after_the_message_in_hand_releasing_the_rest(
    client: Client,
) -> None:
    q = unique("bodystop")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, 10)
    consumer = client.consume(q, prefetch=4, visibility_s=LONG_S, burst=True, wait_s=0)
    yielded: list[ReceivedMessage] = []

    async def prefetched() -> bool:
        return consumer.received == 4

    async with asyncio.timeout(30):
        async for msg in consumer:
            yielded.append(msg)
            if len(yielded) == 1:
                await wait_until(prefetched, timeout_s=5, what="4 leased messages")
                consumer.stop()

    # The message in hand is finished (acked); the 3 leased ahead were never started,
    # so they are released, not handed to the body after stop().
    assert [m.id for m in yielded] == [yielded[0].id], f"{len(yielded) - 1} yielded after stop"
    assert (consumer.received, consumer.acked, consumer.nacked) == (4, 1, 3)
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight, stats.delayed) == (9, 0, 0)
    left = await receive_all(client, q, 9, within_s=2)
    assert check(pushed, pairs(yielded), pairs(left)) == Verdict()


# ---- stopping ------------------------------------------------------------------------
async def test_stop_lets_running_handlers_finish_and_ack_then_receives_nothing_more(
    client: Client,
) -> None:
    q = unique("stop")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, 20)
    started: list[tuple[str, bytes]] = []
    finished: list[tuple[str, bytes]] = []
    go = asyncio.Event()

    async def handle(msg: ReceivedMessage) -> None:
        started.append((msg.id, msg.body))
        await go.wait()
        finished.append((msg.id, msg.body))

    consumer = client.consume(q, handle, concurrency=4, prefetch=4, visibility_s=LONG_S, wait_s=1)
    outcomes: list[Outcome] = []

    async def run() -> None:
        async for o in consumer:
            outcomes.append(o)

    async with asyncio.timeout(30):
        task = asyncio.create_task(run())

        async def four_running() -> bool:
            return len(started) == 4

        await wait_until(four_running, timeout_s=5, what="4 handlers running")
        receives = client.calls["receive"].ops
        consumer.stop()
        go.set()  # the running handlers finish only after stop()
        await task

    assert finished == started and len(finished) == 4
    assert len(outcomes) == 4 and all(o.acked and o.code is None for o in outcomes)
    assert client.calls["receive"].ops == receives  # no receive after stop
    assert (consumer.received, consumer.acked) == (4, 4)
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight, stats.delayed) == (16, 0, 0)
    left = await receive_all(client, q, 16, within_s=2)
    assert check(pushed, finished, pairs(left)) == Verdict()


async def test_cancelling_the_iterating_task_finishes_and_acks_running_handlers_and_releases_rest(
    client: Client,
) -> None:
    q = unique("cancel")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, 12)
    started: list[tuple[str, bytes]] = []
    finished: list[tuple[str, bytes]] = []
    go = asyncio.Event()

    async def handle(msg: ReceivedMessage) -> None:
        started.append((msg.id, msg.body))
        await go.wait()
        finished.append((msg.id, msg.body))

    consumer = client.consume(
        q,
        handle,
        concurrency=4,
        prefetch=4,
        visibility_s=LONG_S,
        shutdown_timeout_s=5,
        burst=True,
        wait_s=0,
    )

    async def run() -> None:
        async for _ in consumer:
            pass

    async with asyncio.timeout(30):
        task = asyncio.create_task(run())

        async def four_running() -> bool:
            return len(started) == 4

        await wait_until(four_running, timeout_s=5, what="4 handlers running")
        task.cancel()
        # The handlers are still blocked when the task is cancelled; they finish later.
        asyncio.get_running_loop().call_later(0.2, go.set)
        with pytest.raises(asyncio.CancelledError):
            await task

    assert finished == started and len(finished) == 4
    assert (consumer.received, consumer.acked) == (4, 4)
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight, stats.delayed) == (8, 0, 0)
    left = await receive_all(client, q, 8, within_s=2)
    assert check(pushed, finished, pairs(left)) == Verdict()


async def test_leaving_a_body_consumer_while_a_receive_reply_is_unread_releases_what_it_leased(
    client: Client,
) -> None:
    # The body leaves the loop after a receive was sent and its reply has reached the
    # socket, but before the consumer has read it: the node has already leased those
    # messages, so the consumer must read that reply and release them, not drop the
    # call (which would leave them invisible until their LONG_S lease runs out). How
    # many loop turns the reply takes to be read varies, so the rounds block the loop
    # 0, 1, 2, ... turns after the receive was sent.
    n = 150
    q = unique("unread")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, n)
    handled: list[tuple[str, bytes]] = []

    async with asyncio.timeout(60):
        for turns in range(12):
            consumer = client.consume(q, prefetch=2, visibility_s=LONG_S, wait_s=1)
            async with contextlib.aclosing(aiter(consumer)) as messages:
                async for msg in messages:
                    sent = client.calls["receive"].calls
                    for _ in range(100):
                        if client.calls["receive"].calls > sent:
                            break
                        await asyncio.sleep(0)
                    if client.calls["receive"].calls == sent:
                        handled.append((msg.id, msg.body))
                        continue
                    # A receive went out while this body ran (moving on from the previous
                    # message made room). After a few more loop turns, the node answers
                    # it while this loop is blocked, then the body leaves (releasing the
                    # message in hand) before the reply is read.
                    for _ in range(turns):
                        await asyncio.sleep(0)
                    time.sleep(0.05)  # noqa: ASYNC251  (blocking the loop is the point)
                    break

    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight, stats.delayed) == (n - len(handled), 0, 0)
    left = await receive_all(client, q, n - len(handled), within_s=2)
    assert check(pushed, handled, pairs(left)) == Verdict()


CONSUMER_SCRIPT = textwrap.dedent(
    """
    import asyncio
    import sys

    from zdmq import Client


    async def main(config: str, queue: str, out: str) -> None:
        async with Client.from_config(config) as client:

            async def handle(msg):
                await asyncio.sleep(0.5)
                with open(out, "a") as f:
                    f.write(msg.id + "\\n")

            consumer = client.consume(
                queue, handle, concurrency=4, visibility_s=30, wait_s=1, handle_signals=True
            )
            failed = 0
            async for outcome in consumer:
                failed += not outcome.acked
            print(f"stopped acked={consumer.acked} failed={failed}", flush=True)


    asyncio.run(main(*sys.argv[1:]))
    """
)


async def test_sigterm_stops_a_consumer_process_that_acks_what_it_handled_and_releases_the_rest(
    client: Client, cluster4: LocalCluster, tmp_path: Path
) -> None:
    n = 40
    q = unique("sigterm")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, n)
    script = tmp_path / "consume.py"
    script.write_text(CONSUMER_SCRIPT)
    out = tmp_path / "handled.txt"
    out.touch()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        str(cluster4.config_path),
        q,
        str(out),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:

        async def some_handled() -> bool:
            assert proc.returncode is None, "the consumer process exited early"
            return len(out.read_text().split()) >= 4

        await wait_until(some_handled, timeout_s=15, what="the first handled messages")
        proc.send_signal(signal.SIGTERM)  # this PID only
        # It must exit by itself: no kill, only a bound on the wait.
        out_b, err_b = await asyncio.wait_for(proc.communicate(), 15)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stdout, stderr = out_b.decode(), err_b.decode()

    assert proc.returncode == 0, stderr
    handled_ids = out.read_text().split()
    assert f"stopped acked={len(handled_ids)} failed=0" in stdout, stdout + stderr
    assert len(handled_ids) < n  # it stopped mid-run
    # Everything else is visible right away: released, not waiting out a 30 s lease.
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight, stats.delayed) == (n - len(handled_ids), 0, 0)
    left = await receive_all(client, q, n - len(handled_ids), within_s=2)
    handled = [(mid, pushed.get(mid, b"")) for mid in handled_ids]
    assert check(pushed, handled, pairs(left)) == Verdict()


# ---- long polling ----------------------------------------------------------------------
async def test_a_waiting_consumer_picks_up_a_message_pushed_after_it_started_well_within_a_second(
    client: Client, cluster4: LocalCluster
) -> None:
    q = unique("poll")
    await client.create_queue(q)
    picked: asyncio.Future[tuple[float, ReceivedMessage, int]] = (
        asyncio.get_running_loop().create_future()
    )
    async with Client.from_config(cluster4.config_path) as own:

        async def handle(msg: ReceivedMessage) -> None:
            if not picked.done():
                picked.set_result((time.monotonic(), msg, own.calls["receive"].ops))

        consumer = own.consume(q, handle, prefetch=1, visibility_s=LONG_S, wait_s=5)

        async def run() -> None:
            async for _ in consumer:
                pass

        async with asyncio.timeout(30):
            task = asyncio.create_task(run())

            async def long_polling() -> bool:
                # The first try, the metadata list (empty), then the long poll itself.
                return own.calls["receive"].calls >= 3

            await wait_until(long_polling, timeout_s=5, what="the consumer's long poll")
            pushed_at = time.monotonic()
            mid = await client.push(q, b"late")
            picked_at, msg, receive_ops = await asyncio.wait_for(picked, 5)
            consumer.stop()
            await task

    assert (msg.id, msg.body) == (mid, b"late")
    assert receive_ops == 1  # the first receive, woken by the push, not a later one
    assert picked_at - pushed_at < 0.5, f"picked up {picked_at - pushed_at:.3f}s after the push"
    assert consumer.acked == 1
    assert (await client.stats(q)).messages == 0


# ---- errors and limits ---------------------------------------------------------------
async def test_a_receive_that_fails_for_good_ends_the_loop_with_that_error_instead_of_hanging(
    client: Client,
) -> None:
    q = unique("never-created")
    handled: list[str] = []

    async def handle(msg: ReceivedMessage) -> None:
        handled.append(msg.id)

    # visibility_s given: the consumer does not read the queue's settings first, so its
    # first call to the missing queue is a receive.
    consumer = client.consume(q, handle, visibility_s=LONG_S, burst=True, wait_s=0)
    with pytest.raises(QueueNotFound):
        async with asyncio.timeout(5):
            async for _ in consumer:
                pass
    assert handled == []


async def test_a_handler_outliving_shutdown_timeout_is_cancelled_after_it_and_its_message_released(
    client: Client,
) -> None:
    q = unique("stuck")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, 1)
    running = asyncio.Event()
    cancelled: list[str] = []

    async def handle(msg: ReceivedMessage) -> None:
        running.set()
        try:
            await asyncio.Event().wait()  # never finishes by itself
        except asyncio.CancelledError:
            cancelled.append(msg.id)
            raise

    timeout_s = 0.5
    consumer = client.consume(
        q, handle, visibility_s=LONG_S, shutdown_timeout_s=timeout_s, burst=True, wait_s=0
    )
    outcomes: list[Outcome] = []

    async def run() -> None:
        async for o in consumer:
            outcomes.append(o)

    async with asyncio.timeout(30):
        task = asyncio.create_task(run())
        await running.wait()
        stopped_at = time.monotonic()
        consumer.stop()
        await task
    took_s = time.monotonic() - stopped_at

    assert cancelled == list(pushed)
    assert outcomes == [] and consumer.acked == 0 and consumer.nacked == 1
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight) == (1, 0)  # released, not leased for 30 s
    left = await receive_all(client, q, 1, within_s=2)
    assert check(pushed, pairs(left)) == Verdict()
    # One shutdown_timeout_s for the handler, plus a few calls; not two of them.
    assert took_s < timeout_s + 0.3, f"stop took {took_s:.2f}s with shutdown_timeout_s=0.5"


@pytest.mark.parametrize("stream", [True, False], ids=["streams", "receives"])
async def test_a_consumer_with_no_options_leases_ahead_up_to_its_prefetch_and_releases_the_rest(
    client: Client, stream: bool
) -> None:
    """As RabbitMQ clients prefetch: a consumer made with no options (streams) or one
    that receives holds up to DEFAULT_PREFETCH messages while its body works on one, so
    it keeps up with a producer pushing one at a time; what it did not start goes back
    at once when it stops. Over streams, a node with nothing more to send keeps
    STREAM_FLOOR of its credit, so the consumer may hold a little less."""
    q = unique("prefetch")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, DEFAULT_PREFETCH + 50)
    options = {} if stream else {"stream": False}
    consumer = client.consume(q, visibility_s=LONG_S, **options)
    assert consumer.prefetch == DEFAULT_PREFETCH and consumer.concurrency == 1
    least = DEFAULT_PREFETCH - (STREAM_FLOOR * (len(client.node_ids) - 1) if stream else 0)
    most = 0

    async def prefetched() -> bool:
        nonlocal most
        most = max(most, len(consumer._held))
        return len(consumer._held) >= least

    async with asyncio.timeout(30):
        async for _ in consumer:
            await wait_until(prefetched, timeout_s=10, what="the prefetch leased")
            await asyncio.sleep(0.3)  # (more would come now, were the prefetch not kept)
            await prefetched()
            consumer.stop()  # the message in hand is acked, the others released
    assert consumer.stream == stream
    assert least <= most <= DEFAULT_PREFETCH, most
    assert consumer.acked == 1 and consumer.nacked == consumer.received - 1
    assert least <= consumer.received <= DEFAULT_PREFETCH
    left = await receive_all(client, q, len(pushed) - 1, within_s=5)
    assert len(left) == len(pushed) - 1
    with pytest.raises(ValueError, match="prefetch"):
        client.consume(q, prefetch=0)


async def test_a_streaming_consumer_handles_each_message_once_and_acks_on_its_streams(
    client: Client,
) -> None:
    q = unique("streamed")
    await client.create_queue(q)
    pushed = await push_bodies(client, q, 150)
    handled: list[str] = []
    outcomes: list[Outcome] = []

    async def handle(msg: ReceivedMessage) -> None:
        handled.append(msg.id)

    receives, acks = client.calls["receive"].ops, client.calls["ack"].ops
    consumer = client.consume(q, handle, concurrency=8, prefetch=40, stream=True)
    async with asyncio.timeout(60):
        late: dict[str, bytes] = {}

        async def run() -> None:
            async for o in consumer:
                outcomes.append(o)
                if len(outcomes) == 150:  # what was there at the start: now push while waiting
                    late.update(await push_bodies(client, q, 50))
                if len(outcomes) == 200:
                    consumer.stop()

        await run()
    assert consumer.stream
    assert sorted(handled) == sorted([*pushed, *late])
    assert all(o.acked and o.code is None for o in outcomes)
    # Delivered by the nodes' streams, acked on them: no receive, no REST ack.
    assert client.calls["receive"].ops == receives
    assert client.calls["ack"].ops == acks
    assert consumer.received == 200 and consumer.acked == 200
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight) == (0, 0), stats


async def test_a_streaming_consumer_moves_its_credit_to_the_node_that_has_the_messages(
    client: Client,
) -> None:
    """A batch lands on one node: the credit the other streams hold idle is drained and
    granted to that node's stream, so every handler gets work; the consumer never holds
    more than its prefetch."""
    q = unique("onenode")
    await client.create_queue(q)
    await client.push_many(q, [f"m{i}".encode() for i in range(120)])
    depth = (await client.stats(q)).depth
    assert sorted(depth.values())[-1] == 120, depth  # one node has them all
    running, most, held_most = 0, 0, 0
    outcomes = 0
    holding: list[Consumer] = []

    async def handle(msg: ReceivedMessage) -> None:
        nonlocal running, most, held_most
        running += 1
        most = max(most, running)
        held_most = max(held_most, len(holding[0]._held))
        await asyncio.sleep(0.2)
        running -= 1

    consumer = client.consume(q, handle, concurrency=40, prefetch=40, stream=True)
    holding.append(consumer)
    async with asyncio.timeout(60):
        async for _ in consumer:
            outcomes += 1
            if outcomes == 120:
                consumer.stop()
    assert consumer.stream
    # An even split would give the busy node's stream 10 of the 40.
    assert most >= 30, most
    assert held_most <= 40, held_most
    stats = await client.stats(q)
    assert (stats.messages, stats.in_flight) == (0, 0), stats


async def test_a_streaming_consumer_with_a_small_prefetch_receives_instead(
    client: Client,
) -> None:
    q = unique("small")
    await client.create_queue(q)
    await client.push(q, b"one")
    receives = client.calls["receive"].ops
    # Under 2 credits a node: an even split would lease more than the prefetch.
    small = client.consume(q, prefetch=2 * STREAM_FLOOR - 1, stream=True, wait_s=1)
    async with asyncio.timeout(30):
        async for _ in small:
            small.stop()
    assert not small.stream and small.acked == 1
    assert client.calls["receive"].ops > receives
