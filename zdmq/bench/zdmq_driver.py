"""zdmq through its own async client: zero-hop pushes, receive + ack for at-least-once."""

from __future__ import annotations

from typing import Any

from zdmq.bench.driver import Driver, Received
from zdmq.client import Client
from zdmq.errors import QueueExists

__all__ = ["ZdmqDriver"]


class ZdmqDriver(Driver):
    """Options: `config` (a cluster.yaml path) or `urls` (a list of node urls)."""

    client: Client

    async def open(self) -> None:
        opts = self.spec.options
        if "config" in opts:
            self.client = Client.from_config(opts["config"])
        else:
            self.client = Client(list(opts["urls"]))
        await self.client.open()

    async def close(self) -> None:
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
        got = await self.client.receive(self.queue, max_messages, wait_s=wait_s)
        return [(m.body, m.receipt) for m in got]

    async def ack(self, tokens: list[Any]) -> None:
        result = await self.client.ack(self.queue, tokens)
        if not result.ok:
            raise RuntimeError(f"zdmq ack failed: {result.failed}")
