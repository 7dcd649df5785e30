"""zdmq through its own async client: zero-hop pushes, receive + ack for at-least-once."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from zdmq.bench.driver import Driver, Received
from zdmq.client import Client
from zdmq.client.consumer import AckBatcher
from zdmq.errors import QueueExists
from zdmq.models import ReceivedMessage

__all__ = ["ZdmqDriver"]


class ZdmqDriver(Driver):
    """Options: `config` (a cluster.yaml path) or `urls` (a list of node urls), and
    `prefetch` (default 0).

    With `prefetch` > 0 it receives as `client.consume` does: up to `prefetch`
    messages leased per call and handed out from a buffer, and `ack` queues the ack on
    an `AckBatcher` (one ack call in flight, the rest batched behind it) without waiting
    for it; `settle` releases what is still buffered and waits until every ack is
    committed.
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
        self._buffer: list[ReceivedMessage] = []
        self._acks = AckBatcher(self.client, self.queue)
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
        else:
            if not self._buffer:
                self._buffer = await self.client.receive(
                    self.queue, min(self.prefetch, 100), wait_s=wait_s
                )
                self._buffer.reverse()  # handed out from the end, in arrival order
            got = [self._buffer.pop() for _ in range(min(max_messages, len(self._buffer)))]
        return [(m.body, m.receipt) for m in got]

    async def ack(self, tokens: list[Any]) -> None:
        if self.prefetch:
            for receipt in tokens:
                self._acks.add(receipt).add_done_callback(functools.partial(self._note, receipt))
            return
        result = await self.client.ack(self.queue, tokens)
        if not result.ok:
            raise RuntimeError(f"zdmq ack failed: {result.failed}")

    def _note(self, receipt: str, fut: asyncio.Future[str | None]) -> None:
        code = "cancelled" if fut.cancelled() else fut.result()
        if code is not None:
            self._failed[receipt] = code

    async def settle(self) -> None:
        if self._buffer:  # leased ahead, never handed out: back to the queue at once
            unused, self._buffer = self._buffer, []
            await self.client.nack(self.queue, [m.receipt for m in unused])
        await self._acks.flush()
        if self._failed:
            failed, self._failed = self._failed, {}
            codes = sorted(set(failed.values()))
            raise RuntimeError(f"zdmq ack failed for {len(failed)} message(s): {codes}")
