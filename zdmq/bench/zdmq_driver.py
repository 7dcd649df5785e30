"""zdmq through its own async client: zero-hop pushes, receive + ack for at-least-once."""

from __future__ import annotations

import asyncio
from typing import Any

from zdmq.bench.driver import Driver, Received
from zdmq.client import Client
from zdmq.client.consumer import Consumer
from zdmq.errors import QueueExists
from zdmq.models import ReceivedMessage

__all__ = ["ZdmqDriver"]


class ZdmqDriver(Driver):
    """Options: `config` (a cluster.yaml path) or `urls` (a list of node urls), and
    `prefetch` (default 0).

    With `prefetch` > 0 it is `client.consume(queue, handler, prefetch=P,
    concurrency=P)` with its defaults (streams to every node): the handler hands each
    message to `receive` and returns when `ack` names it, and the consumer acks it then
    (batched, on its stream) without `ack` waiting; `settle` waits until every ack is
    committed, stops the consumer and releases what it held and `receive` did not hand
    out.
    """

    client: Client

    async def open(self) -> None:
        opts = self.spec.options
        if "config" in opts:
            self.client = Client.from_config(opts["config"])
        else:
            self.client = Client(list(opts["urls"]))
        await self.client.open()
        self.prefetch = int(opts.get("prefetch", 0))
        self._consumer: Consumer | None = None
        self._outcomes: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[ReceivedMessage] = asyncio.Queue()
        self._handed: dict[str, asyncio.Future[None]] = {}  # receipt -> its handler's go
        self._acked = 0  # acks asked for, and their outcomes heard
        self._settled = 0
        self._all_settled = asyncio.Event()
        self._failed: dict[str, str] = {}

    async def close(self) -> None:
        await self.settle()
        await self.client.close()

    async def reset(self) -> None:
        try:
            await self.client.create_queue(self.queue)
        except QueueExists:
            await self.client.delete_queue(self.queue)
            await self.client.create_queue(self.queue)

    async def push(self, body: bytes) -> None:
        await self.client.push(self.queue, body)

    async def push_batch(self, bodies: list[bytes]) -> None:
        await self.client.push_many(self.queue, bodies)

    async def receive(self, max_messages: int, wait_s: float = 0.0) -> list[Received]:
        if not self.prefetch:
            got = await self.client.receive(self.queue, max_messages, wait_s=wait_s)
            return [(m.body, m.receipt) for m in got]
        if self._consumer is None:
            self._start_consumer()
        inbox = self._inbox
        out: list[Received] = []
        if inbox.empty():
            if wait_s <= 0:
                return []
            try:
                async with asyncio.timeout(wait_s):
                    first = await inbox.get()
            except TimeoutError:
                return []
            out.append((first.body, first.receipt))
        while len(out) < max_messages and not inbox.empty():
            m = inbox.get_nowait()
            out.append((m.body, m.receipt))
        return out

    def _start_consumer(self) -> None:
        loop = asyncio.get_running_loop()

        async def handle(msg: ReceivedMessage) -> None:
            go = self._handed[msg.receipt] = loop.create_future()
            self._inbox.put_nowait(msg)
            await go  # the ack (set) or the stop (an exception: nacked, no delay)

        self._consumer = self.client.consume(
            self.queue, handle, prefetch=self.prefetch, concurrency=self.prefetch, backoff_s=0.0
        )
        self._outcomes = asyncio.create_task(self._hear(self._consumer))

    async def _hear(self, consumer: Consumer) -> None:
        async for o in consumer:
            if o.error is not None:
                continue  # released at the stop: not one of the acks
            if not o.acked:
                self._failed[o.message.receipt] = o.code or "not acked"
            self._settled += 1
            if self._settled >= self._acked:
                self._all_settled.set()

    async def ack(self, tokens: list[Any]) -> None:
        if self.prefetch:
            for receipt in tokens:
                go = self._handed.pop(receipt, None)
                if go is None:
                    raise RuntimeError(f"zdmq ack of a message not handed out: {receipt}")
                self._acked += 1
                self._all_settled.clear()
                go.set_result(None)
            return
        result = await self.client.ack(self.queue, tokens)
        if not result.ok:
            raise RuntimeError(f"zdmq ack failed: {result.failed}")

    async def settle(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        if self._settled < self._acked:
            await self._all_settled.wait()
        consumer.stop()
        for go in self._handed.values():  # leased, never handed out: back at once
            if not go.done():
                go.set_exception(_Unused())
        self._handed.clear()
        self._inbox = asyncio.Queue()
        assert self._outcomes is not None
        await self._outcomes
        if self._failed:
            failed, self._failed = self._failed, {}
            codes = sorted(set(failed.values()))
            raise RuntimeError(f"zdmq ack failed for {len(failed)} message(s): {codes}")


class _Unused(Exception):
    """A message the consumer leased that the workload never took (released)."""
