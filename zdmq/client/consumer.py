"""The consumer loop: leases, handlers, acks, heartbeats and a graceful shutdown.

Two ways to use it, both `async for`:

    # 1. With a handler: `concurrency` handlers run at once; each message is acked when
    #    its handler returns and nacked with exponential backoff when it raises. The
    #    loop yields an `Outcome` per settled message.
    async for outcome in client.consume("jobs", handle, concurrency=8):
        ...

    # 2. Without one: the loop body is the handler. A message is acked when the body
    #    asks for the next one (the ack is sent in the background); `consumer.nack(msg)`
    #    releases it instead. Up to `prefetch` messages (100) are leased ahead, sent by
    #    the nodes on a stream each as they are pushed (or received, `stream=False`).
    async for msg in client.consume("jobs"):
        ...

Acks go through an `AckBatcher`: one ack call at a time per consumer, and every ack
that comes in while it runs goes in the next one, so a fast consumer pays one round trip
and one commit per batch rather than per message (client-side group commit). A handler's
`Outcome` and `consumer.ack` still wait until their ack is committed; the body-mode ack
when the body moves on does not (as Kafka's auto-commit and RabbitMQ's `basic.ack`), and
the shutdown waits for every ack queued. An ack that never lands leaves its message to
come back after its lease: at-least-once holds.

Every message the consumer holds (leased ahead, or being handled) has its lease
extended every `visibility_s / 3` seconds, so a slow handler never loses its lease and
never causes a duplicate. On `stop()`, SIGTERM/SIGINT (with `handle_signals=True`), a
`break` or the cancellation of the task that iterates, it stops receiving, lets running
handlers finish (up to `shutdown_timeout_s`) and settles them, and releases (nacks
without delay) every message it leased but did not start, so they are redelivered at
once rather than after their visibility timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zdmq.client.stream import NodeStream
from zdmq.errors import NodeUnavailable, ZdmqError
from zdmq.models import ReceivedMessage

if TYPE_CHECKING:
    from zdmq.client.client import Client

__all__ = ["DEFAULT_PREFETCH", "AckBatcher", "Consumer", "Handler", "Outcome"]

log = logging.getLogger("zdmq.consumer")

Handler = Callable[[ReceivedMessage], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one message ended in a handler consumer."""

    message: ReceivedMessage
    acked: bool  # the handler returned and the ack took effect
    error: BaseException | None = None  # what the handler raised (then it was nacked)
    code: str | None = None  # why the ack or nack did not take effect (e.g. lease_expired)


class AckBatcher:
    """Coalesces acks of one queue: at most one ack call in flight, and everything
    queued meanwhile goes in the next call (the client splits it per node and batch).

    `add(receipt)` returns a future of the ack's verdict: None once the ack is
    committed, else its error code (`lease_expired`, `node_unavailable`, ...).
    """

    def __init__(
        self,
        client: Client,
        queue: str,
        send: Callable[[list[str]], Awaitable[dict[str, str]]] | None = None,
    ) -> None:
        """`send(receipts)` acks a batch and returns the failed receipts with their
        codes (default: `client.ack`)."""
        self.client = client
        self.queue = queue
        self._send = send or self._rest
        self._pending: dict[str, asyncio.Future[str | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.calls = 0

    def add(self, receipt: str) -> asyncio.Future[str | None]:
        fut = self._pending.get(receipt)
        if fut is None:
            fut = self._pending[receipt] = asyncio.get_running_loop().create_future()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="zdmq-acks")
        return fut

    async def _rest(self, receipts: list[str]) -> dict[str, str]:
        return (await self.client.ack(self.queue, receipts)).failed

    async def flush(self) -> None:
        """Returns once every ack queued so far has its verdict."""
        while self._task is not None:
            await asyncio.wait({self._task})

    async def _run(self) -> None:
        batch: dict[str, asyncio.Future[str | None]] = {}
        try:
            while self._pending:
                batch, self._pending = self._pending, {}
                self.calls += 1
                try:
                    codes = await self._send(list(batch))
                except ZdmqError as e:
                    codes = dict.fromkeys(batch, e.code)
                except Exception as e:  # a closed client, say: these acks are lost
                    log.warning("acking %d message(s) failed: %r", len(batch), e)
                    codes = dict.fromkeys(batch, type(e).__name__)
                for receipt, fut in batch.items():
                    if not fut.done():
                        fut.set_result(codes.get(receipt))
        finally:
            self._task = None
            for fut in (*batch.values(), *self._pending.values()):
                fut.cancel()  # only those without a verdict: cancelled, nothing sends them
            self._pending.clear()


_DONE: Any = object()
# Messages a consumer holds at most by default: leased ahead of its handlers, so that one
# consumer keeps up with a producer pushing one at a time (at most this many messages of
# the queue's max_message_bytes in memory).
DEFAULT_PREFETCH = 100
# A consumer that does not long-poll pauses this long after an empty receive.
EMPTY_PAUSE_S = 0.1
# On stop, how long a receive already sent may take to reply before it is cut off.
STOP_GRACE_S = 1.0
# Stream mode: the first pause before a stream that ended or could not open is opened
# again, doubled at each failure in a row up to the second.
STREAM_RETRY_S = 0.2
STREAM_RETRY_MAX_S = 2.0
# Stream mode: the least credit of each node's share of `prefetch`; a consumer whose
# prefetch gives less receives instead.
STREAM_FLOOR = 2
# Stream mode: how often the credit is looked at (and moved to the streams short of
# it), and how long a stream that delivers nothing is taken for idle.
BALANCE_S = 0.05
IDLE_S = 0.25


def credit_shares(prefetch: int, streams: int) -> list[int]:
    """`prefetch` split among `streams` as evenly as whole credits go."""
    base, extra = divmod(prefetch, streams)
    return [base + (1 if i < extra else 0) for i in range(streams)]


class Consumer:
    def __init__(
        self,
        client: Client,
        queue: str,
        handler: Handler | None = None,
        *,
        concurrency: int = 1,
        prefetch: int = DEFAULT_PREFETCH,
        visibility_s: float | None = None,
        wait_s: float = 20.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 300.0,
        shutdown_timeout_s: float = 30.0,
        burst: bool = False,
        handle_signals: bool = False,
        min_priority: int = 0,
        stream: bool = True,
    ) -> None:
        """
        concurrency          handlers at once (with a handler)
        prefetch             messages held at most, leased ahead of the handlers or the loop
                               body (at least `concurrency`): a consumer keeps up with a
                               producer as RabbitMQ clients do with basic.qos; 1 shares long
                               jobs evenly among consumers
        visibility_s         lease length; default: the queue's visibility timeout
        wait_s               long-poll wait of each receive (0..20)
        backoff_s            a failed message is nacked with delay backoff_s * 2**(receives-1),
        max_backoff_s          at most max_backoff_s
        shutdown_timeout_s   how long running handlers may take to finish on stop
        burst                stop once a receive finds the queue empty (drain and exit)
        handle_signals       stop gracefully on SIGTERM and SIGINT
        min_priority         receive only messages of this priority or more (0..9)
        stream               (default) hold a stream to every node (docs/api.md,
                               "Streams"): each node sends its messages as soon as they
                               are pushed, within credit that adds up to `prefetch` and
                               moves to the nodes that have messages, and acks go back
                               on the stream; False, a burst consumer, or one whose
                               prefetch is under 2 a node receives instead
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        self.client = client
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.prefetch = max(prefetch, concurrency)
        self.visibility_s = visibility_s
        self.wait_s = wait_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.burst = burst
        self.handle_signals = handle_signals
        self.min_priority = min_priority
        self._stopping = asyncio.Event()
        self._held: dict[str, ReceivedMessage] = {}  # receipt -> message, until settled
        self._ready: asyncio.Queue[ReceivedMessage] = asyncio.Queue()
        self._room = asyncio.Event()
        self._drained = False
        self._stopped_at: float | None = None
        self._error: ZdmqError | None = None  # what ended the receive loop for good
        self._stream_asked = stream
        self.stream = False  # decided when the loop starts (it needs the cluster map)
        # Stream mode: the stream each held message came from, the credit owed to each
        # stream for messages settled since the last grant, and the open streams.
        self._origin: dict[str, NodeStream] = {}
        self._owed: dict[NodeStream, int] = {}
        self._granting = False
        self._streams: dict[str, NodeStream] = {}
        self._acked_from: dict[str, NodeStream] = {}  # acks queued: the stream to send on
        self._acks = AckBatcher(client, queue, self._send_acks)
        self._acking: set[asyncio.Future[Outcome]] = set()  # handlers' acks on their way
        self.received = 0
        self.acked = 0
        self.nacked = 0
        self.extended = 0
        self.lost_leases = 0

    # ---- control ---------------------------------------------------------------------
    def stop(self) -> None:
        """Stop receiving; running handlers finish, unstarted messages are released."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def ack_batches(self) -> int:
        """Ack calls sent so far (each settles every ack queued while the last one ran)."""
        return self._acks.calls

    async def ack(self, msg: ReceivedMessage) -> bool:
        """Acks a message now (body mode) and waits until the ack is committed; False
        when it did not take effect (its lease had already ended, say)."""
        # Shielded: a caller that gives up does not withdraw an ack already queued.
        return await asyncio.shield(self._ack(msg)) is None

    def _ack(self, msg: ReceivedMessage) -> asyncio.Future[str | None]:
        """Queues the ack of a message this consumer holds: its verdict, once sent."""
        origin = self._let_go(msg.receipt)
        if origin is not None:
            self._acked_from[msg.receipt] = origin
        fut = self._acks.add(msg.receipt)
        fut.add_done_callback(self._count_ack)
        return fut

    def _count_ack(self, fut: asyncio.Future[str | None]) -> None:
        code = "cancelled" if fut.cancelled() else fut.result()
        if code is None:
            self.acked += 1
        else:  # the lease runs out and the message comes back
            log.warning("an ack on %s did not take effect: %s", self.queue, code)

    async def nack(self, msg: ReceivedMessage, delay_s: float = 0.0) -> bool:
        """Releases a message now (body mode): visible again after `delay_s`."""
        self._let_go(msg.receipt)
        result = await self.client.nack(self.queue, msg.receipt, delay_s=delay_s)
        self.nacked += result.done
        return result.ok

    def _let_go(self, receipt: str) -> NodeStream | None:
        """A held message is settled (or being settled): room for another, and in stream
        mode a credit back to the stream it came from (granted with the others of this
        moment, in one frame per stream)."""
        self._held.pop(receipt, None)
        self._room.set()
        origin = self._origin.pop(receipt, None)
        if origin is not None and origin.closed:
            # Its node's stream now, if it was opened again (else the credit is counted
            # in when it opens: what it holds at its start).
            origin = self._streams.get(origin.node_id)
        if origin is not None and not origin.closed and not self.stopping:
            # (A stopping consumer grants nothing: what it lets go is not replaced.)
            self._owed[origin] = self._owed.get(origin, 0) + 1
            if not self._granting:
                self._granting = True
                asyncio.get_running_loop().call_soon(self._grant_owed)
        return origin

    def _grant_owed(self) -> None:
        self._granting = False
        owed, self._owed = self._owed, {}
        for stream, n in owed.items():
            stream.grant(n)

    def backoff(self, msg: ReceivedMessage) -> float:
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (msg.receive_count - 1)))

    # ---- the loop --------------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[Any]:
        return self._run()

    async def _run(self) -> AsyncIterator[Any]:
        if self.visibility_s is None:
            settings = await self.client.queue_settings(self.queue)
            self.visibility_s = settings.visibility_timeout_s
        self.stream = self._streams_wanted()
        receiving = self._stream_loop() if self.stream else self._receive_loop()
        tasks = [
            asyncio.create_task(receiving, name="zdmq-consumer-receive"),
            asyncio.create_task(self._heartbeat_loop(), name="zdmq-consumer-heartbeat"),
        ]
        workers: list[asyncio.Task[None]] = []
        outcomes: asyncio.Queue[Any] = asyncio.Queue()
        if self.handler is not None:
            workers = [
                asyncio.create_task(self._work(outcomes), name=f"zdmq-consumer-{i}")
                for i in range(self.concurrency)
            ]
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if self.handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.stop)
        try:
            if self.handler is not None:
                watcher = asyncio.create_task(self._end_when_workers_finish(workers, outcomes))
                tasks.append(watcher)
                while (item := await outcomes.get()) is not _DONE:
                    yield item
            else:
                while (msg := await self._next_message()) is not None:
                    yield msg
                    if msg.receipt in self._held:
                        self._ack(msg)  # the body finished with it: acked in the background
            if self._error is not None:
                raise self._error
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self._shutdown(tasks, workers)

    async def _next_message(self) -> ReceivedMessage | None:
        """Body mode: the next leased message, or None once stopped or drained."""
        while True:
            if self.stopping:
                return None  # what is leased ahead is released by the shutdown
            if not self._ready.empty():
                msg = self._ready.get_nowait()
                return None if msg is _DONE else msg
            if self._drained and not self._held:
                return None
            getter = asyncio.ensure_future(self._ready.get())
            stop = asyncio.ensure_future(self._stopping.wait())
            done, _ = await asyncio.wait({getter, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if getter in done:
                msg = getter.result()
                return None if msg is _DONE else msg
            getter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await getter

    async def _receive_loop(self) -> None:
        assert self.visibility_s is not None
        while not self.stopping:
            room = self.prefetch - len(self._held)
            if room <= 0:
                self._room.clear()
                await self._wait_or_stop(self._room.wait())
                continue
            try:
                msgs = await self.client.receive(
                    self.queue,
                    min(room, 100),
                    visibility_s=self.visibility_s,
                    wait_s=0.0 if self.burst else self.wait_s,
                    min_priority=self.min_priority,
                )
            except ZdmqError as e:
                if not e.retriable:
                    # For good (the queue was deleted, say): the loop ends with this error.
                    self._error = e
                    self.stop()
                    return
                log.warning("receive from %s failed, retrying: %s", self.queue, e)
                await self._wait_or_stop(asyncio.sleep(1.0))
                continue
            self.received += len(msgs)
            for msg in msgs:
                self._held[msg.receipt] = msg
                self._ready.put_nowait(msg)
            if not msgs and self.burst:
                self._drained = True
                if self.handler is None:
                    # Wake a body waiting for a message that will not come.
                    self._ready.put_nowait(_DONE)
                return
            if not msgs and self.wait_s < EMPTY_PAUSE_S:
                # No long poll to pace us: do not spin on an empty queue.
                await self._wait_or_stop(asyncio.sleep(EMPTY_PAUSE_S))

    async def _stream_loop(self) -> None:
        """Stream mode: a stream to every node of the cluster map, each holding an equal
        share of `prefetch` as credit, reopened when it ends."""
        nodes = self.client.node_ids
        shares = credit_shares(self.prefetch, len(nodes))
        runners = [
            asyncio.create_task(self._run_stream(n, c)) for n, c in zip(nodes, shares, strict=True)
        ]
        runners.append(asyncio.create_task(self._balance_loop(), name="zdmq-consumer-balance"))
        try:
            await self._stopping.wait()
        finally:
            for r in runners:
                r.cancel()
            await asyncio.gather(*runners, return_exceptions=True)
            # The streams stay open until the shutdown's acks have landed on them.

    async def _run_stream(self, node: str, credit: int) -> None:
        assert self.visibility_s is not None
        pause = STREAM_RETRY_S
        first = True
        while not self.stopping:
            if not first:
                # Opened again: what `prefetch` leaves, less what is held and what the
                # other streams hold (the balancer moves credit to it if it needs some).
                others = sum(s.credit for s in self._streams.values() if not s.closed)
                credit = max(0, self.prefetch - len(self._held) - others)
            first = False
            try:
                stream = await self.client.open_stream(
                    node,
                    self.queue,
                    credit=credit,
                    visibility_s=self.visibility_s,
                    min_priority=self.min_priority,
                )
            except ZdmqError as e:
                if not e.retriable and not isinstance(e, NodeUnavailable):
                    self._error = e  # for good: the queue does not exist, no right to it
                    self.stop()
                    return
                log.info("stream to %s for %s not opened, retrying: %s", node, self.queue, e)
                await self._wait_or_stop(asyncio.sleep(pause))
                pause = min(pause * 2, STREAM_RETRY_MAX_S)
                continue
            pause = STREAM_RETRY_S
            self._streams[node] = stream
            while (batch := await stream.deliveries.get()) is not None:
                self.received += len(batch)
                for msg in batch:
                    self._held[msg.receipt] = msg
                    self._origin[msg.receipt] = stream
                    self._ready.put_nowait(msg)
            reason = stream.close_reason
            if reason is not None and not reason.retriable and reason.status < 500:
                self._error = reason  # the node refused the stream for good
                self.stop()
                return
            log.info("stream to %s for %s ended, reopening: %s", node, self.queue, reason)
            await self._wait_or_stop(asyncio.sleep(pause))

    async def _balance_loop(self) -> None:
        """Stream mode: moves credit to where messages are. Pushed messages may all land
        on one node (a batch goes to one group), while the others hold their shares
        idle. A stream that is short of credit (under STREAM_FLOOR: it spent what it
        had) gets credit drained from the others: one that delivered nothing for
        IDLE_S keeps STREAM_FLOOR, one that is busy keeps an even share; what is
        drained beyond what the short ones need goes to those that delivered lately.
        The credit of all the streams, and what the consumer holds, stay within
        `prefetch`: credit is only ever moved."""
        while not self.stopping:
            await asyncio.sleep(BALANCE_S)
            open_ = [s for s in self._streams.values() if not s.closed]
            short = [s for s in open_ if s.credit < STREAM_FLOOR]
            if len(open_) < 2 or not short:
                continue
            now = time.monotonic()
            hungry = [s for s in short if now - s.last_delivery < IDLE_S]
            even = max(self.prefetch // len(open_), STREAM_FLOOR)
            want = sum(STREAM_FLOOR - s.credit for s in short)
            pool = 0
            for s in open_:
                keep = STREAM_FLOOR if now - s.last_delivery >= IDLE_S else even
                if s in short or s.credit <= keep:
                    continue
                try:
                    n = await s.drain()
                except NodeUnavailable:
                    continue
                spare = max(n - keep, 0)
                give = spare if hungry else min(spare, max(want - pool, 0))
                s.grant(n - give)
                pool += give
            for s in short:
                top = min(pool, STREAM_FLOOR - s.credit)
                if top > 0 and not s.closed:
                    s.grant(top)
                    pool -= top
            targets = [s for s in hungry if not s.closed] or [s for s in open_ if not s.closed]
            if pool and targets:
                for s, n in zip(targets, credit_shares(pool, len(targets)), strict=True):
                    s.grant(n)

    def _streams_wanted(self) -> bool:
        """Stream mode when asked for, unless `burst`, or a prefetch too small to give
        every node a credit of STREAM_FLOOR (the split would lease more than `prefetch`)."""
        if not self._stream_asked or self.burst:
            return False
        if self.prefetch < STREAM_FLOOR * len(self.client.node_ids):
            log.info(
                "%s: prefetch %d is under %d a node: receiving rather than streaming",
                self.queue,
                self.prefetch,
                STREAM_FLOOR,
            )
            return False
        return True

    async def _send_acks(self, receipts: list[str]) -> dict[str, str]:
        if not self.stream:
            return (await self.client.ack(self.queue, receipts)).failed
        return await self._ack_on_streams(receipts)

    async def _ack_on_streams(self, receipts: list[str]) -> dict[str, str]:
        """Stream mode's acks: each on the stream its message came from (the node that
        leased it settles it there), REST for those whose stream has ended."""
        by_stream: dict[NodeStream | None, list[str]] = {}
        for r in receipts:
            s = self._acked_from.pop(r, None)
            by_stream.setdefault(s if s is not None and not s.closed else None, []).append(r)
        failed: dict[str, str] = {}

        async def on(s: NodeStream | None, part: list[str]) -> None:
            if s is not None:
                try:
                    failed.update((await s.settle("ack", part))[1])
                    return
                except NodeUnavailable:
                    pass  # the stream ended meanwhile: an ack twice is harmless
            failed.update((await self.client.ack(self.queue, part)).failed)

        await asyncio.gather(*(on(s, p) for s, p in by_stream.items()))
        return failed

    async def _wait_or_stop(self, aw: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        for t in (task, stop):
            t.cancel()

    async def _heartbeat_loop(self) -> None:
        """Extends every held lease well before it runs out."""
        assert self.visibility_s is not None
        interval = max(self.visibility_s / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            receipts = list(self._held)
            if not receipts:
                continue
            try:
                result = await self.client.extend(self.queue, receipts, self.visibility_s)
            except ZdmqError as e:
                log.warning("extending %d lease(s) failed: %s", len(receipts), e)
                continue
            self.extended += result.done
            for receipt, code in result.failed.items():
                if code == "lease_expired":
                    # Too late: the message is someone else's now; do not settle it.
                    self.lost_leases += 1
                    log.warning("lease %s ran out before it could be extended", receipt)

    async def _work(self, outcomes: asyncio.Queue[Any]) -> None:
        assert self.handler is not None
        while True:
            msg = await self._ready.get()
            if msg is _DONE:
                return
            try:
                await self.handler(msg)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                outcomes.put_nowait(await self._settle(msg, e))
            else:
                # The next message does not wait for this one's ack to commit: the acks
                # of a handler's messages go in batches behind each other, and each
                # Outcome comes once its ack has committed.
                acking = asyncio.ensure_future(self._settle(msg, None))
                self._acking.add(acking)
                acking.add_done_callback(functools.partial(self._acked_out, msg, outcomes))

    def _acked_out(
        self, msg: ReceivedMessage, outcomes: asyncio.Queue[Any], acking: asyncio.Future[Outcome]
    ) -> None:
        self._acking.discard(acking)
        if acking.cancelled() or acking.exception() is not None:
            outcomes.put_nowait(Outcome(msg, False, None, "cancelled"))
        else:
            outcomes.put_nowait(acking.result())

    async def _settle(self, msg: ReceivedMessage, error: BaseException | None) -> Outcome:
        if error is None:
            code = await asyncio.shield(self._ack(msg))
            return Outcome(msg, code is None, None, code)
        self._let_go(msg.receipt)
        try:
            result = await self.client.nack(self.queue, msg.receipt, delay_s=self.backoff(msg))
        except ZdmqError as e:
            # The lease runs out and the message comes back: at-least-once holds.
            return Outcome(msg, False, error, e.code)
        self.nacked += result.done
        return Outcome(msg, False, error, result.failed.get(msg.receipt))

    async def _end_when_workers_finish(
        self, workers: list[asyncio.Task[None]], outcomes: asyncio.Queue[Any]
    ) -> None:
        """Handler mode: once stopped (or drained), let workers finish, then end the loop."""
        while not self.stopping:
            if self._drained and not self._held:
                break
            await self._wait_or_stop(asyncio.sleep(0.05))
        await self._release_unstarted()
        for _ in workers:
            self._ready.put_nowait(_DONE)
        await asyncio.wait(workers, timeout=self._shutdown_left())
        if self._acking:  # the Outcomes of the acks on their way come first
            await asyncio.wait(list(self._acking), timeout=max(self._shutdown_left(), 1.0))
        outcomes.put_nowait(_DONE)

    def _shutdown_left(self) -> float:
        """What is left of `shutdown_timeout_s` since the stop (all of it if not stopped)."""
        if self._stopped_at is None:
            return self.shutdown_timeout_s
        return max(self.shutdown_timeout_s - (time.monotonic() - self._stopped_at), 0.0)

    def _undelivered(self) -> list[ReceivedMessage]:
        """Stream mode, stopping: what the streams brought that the loop did not take."""
        out: list[ReceivedMessage] = []
        for s in self._streams.values():
            while not s.deliveries.empty():
                out += s.deliveries.get_nowait() or []
        self.received += len(out)  # received, then released at once
        return out

    async def _release_unstarted(self) -> None:
        unstarted: list[ReceivedMessage] = []
        while not self._ready.empty():
            msg = self._ready.get_nowait()
            if msg is not _DONE:
                unstarted.append(msg)
        await self._release(unstarted)

    async def _release(self, msgs: list[ReceivedMessage]) -> None:
        for msg in msgs:
            self._let_go(msg.receipt)
        if msgs:
            with contextlib.suppress(ZdmqError):
                result = await self.client.nack(self.queue, [m.receipt for m in msgs])
                self.nacked += result.done

    async def _shutdown(
        self, tasks: list[asyncio.Task[Any]], workers: list[asyncio.Task[None]]
    ) -> None:
        self.stop()
        # The receive loop sends nothing more, but a receive already sent may have leased
        # messages on the node whose reply is still on its way: dropping the call would
        # leave them invisible until their lease ran out. So its reply is awaited (for a
        # moment: a long poll still waiting is cut off, and a node whose caller went
        # away leases nothing) and what it brought is released below with the rest.
        receiving = tasks[0]
        if not receiving.done():
            await asyncio.wait([receiving], timeout=min(STOP_GRACE_S, self._shutdown_left()))
        receiving.cancel()
        await self._release_unstarted()
        await self._release(self._undelivered())
        if workers:
            pending = [w for w in workers if not w.done()]
            for _ in pending:
                self._ready.put_nowait(_DONE)
            if pending:
                await asyncio.wait(pending, timeout=self._shutdown_left())
            for w in workers:
                w.cancel()
        # Body mode: whatever is still held (the message in hand included) goes back,
        # and the acks queued in the background land before the loop ends.
        await self._release(list(self._held.values()))
        await self._acks.flush()
        await asyncio.gather(*(s.close() for s in self._streams.values()))
        for t in tasks + workers:
            t.cancel()
        await asyncio.gather(*tasks, *workers, return_exceptions=True)
