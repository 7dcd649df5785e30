"""The consumer loop: leases, handlers, acks, heartbeats and a graceful shutdown.

Two ways to use it, both `async for`:

    # 1. With a handler: `concurrency` handlers run at once; each message is acked when
    #    its handler returns and nacked with exponential backoff when it raises. The
    #    loop yields an `Outcome` per settled message.
    async for outcome in client.consume("jobs", handle, concurrency=8):
        ...

    # 2. Without one: the loop body is the handler. A message is acked when the body
    #    asks for the next one (the ack is sent in the background); `consumer.nack(msg)`
    #    releases it instead. Up to `prefetch` messages (100) are leased ahead.
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
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zdmq.errors import ZdmqError
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

    def __init__(self, client: Client, queue: str) -> None:
        self.client = client
        self.queue = queue
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
                    result = await self.client.ack(self.queue, list(batch))
                    codes = result.failed
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
        self._acks = AckBatcher(client, queue)
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
        self._held.pop(msg.receipt, None)
        self._room.set()
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
        self._held.pop(msg.receipt, None)
        self._room.set()
        result = await self.client.nack(self.queue, msg.receipt, delay_s=delay_s)
        self.nacked += result.done
        return result.ok

    def backoff(self, msg: ReceivedMessage) -> float:
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (msg.receive_count - 1)))

    # ---- the loop --------------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[Any]:
        return self._run()

    async def _run(self) -> AsyncIterator[Any]:
        if self.visibility_s is None:
            settings = await self.client.queue_settings(self.queue)
            self.visibility_s = settings.visibility_timeout_s
        tasks = [
            asyncio.create_task(self._receive_loop(), name="zdmq-consumer-receive"),
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
                outcomes.put_nowait(await self._settle(msg, None))

    async def _settle(self, msg: ReceivedMessage, error: BaseException | None) -> Outcome:
        if error is None:
            code = await asyncio.shield(self._ack(msg))
            return Outcome(msg, code is None, None, code)
        self._held.pop(msg.receipt, None)
        self._room.set()
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
        outcomes.put_nowait(_DONE)

    def _shutdown_left(self) -> float:
        """What is left of `shutdown_timeout_s` since the stop (all of it if not stopped)."""
        if self._stopped_at is None:
            return self.shutdown_timeout_s
        return max(self.shutdown_timeout_s - (time.monotonic() - self._stopped_at), 0.0)

    async def _release_unstarted(self) -> None:
        unstarted: list[ReceivedMessage] = []
        while not self._ready.empty():
            msg = self._ready.get_nowait()
            if msg is not _DONE:
                unstarted.append(msg)
        await self._release(unstarted)

    async def _release(self, msgs: list[ReceivedMessage]) -> None:
        for msg in msgs:
            self._held.pop(msg.receipt, None)
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
        for t in tasks + workers:
            t.cancel()
        await asyncio.gather(*tasks, *workers, return_exceptions=True)
