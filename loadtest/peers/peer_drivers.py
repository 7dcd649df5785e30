"""Drivers for the benchmark's peers (RabbitMQ, Redis, NATS JetStream) and their table rows.

A peer that is a cluster (nats-r3, rabbitmq-quorum3) lists every server's port in peers.json
(`ports`) and every server's pid (`pids`), so its rows' server CPU is the sum over all of them.

Each class implements `zdmq.bench.driver.Driver` the way a careful user of that system would
build an at-least-once work queue with it; each docstring says where the system cannot keep
the Driver contract to the letter. `peer_specs(peers.json)` turns what `peers.sh start` left
running into `SystemSpec` rows. Import with this folder on sys.path (`SystemSpec.sys_path`).
It never starts or stops a server: peers.sh does that. Each driver imports its client
library when it opens, so a machine with only some of the clients can still use the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from zdmq.bench.driver import Driver, Received, SystemSpec

__all__ = ["NatsDriver", "RabbitMQDriver", "RedisDriver", "peer_specs"]

HERE = str(Path(__file__).resolve().parent)
CONFIRM_TIMEOUT_S = 60.0  # a push or ack that waits longer than this raises


def _consumer_name() -> str:
    """Unique per driver instance: host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------- RabbitMQ


class RabbitMQDriver(Driver):
    """RabbitMQ through aio-pika: a durable queue, persistent messages, publisher confirms.

    Options: `host`, `port`, `user`/`password` (guest), `queue_type` ("classic" or "quorum"),
    `prefetch` (basic.qos per consumer, default 256); for a cluster, `ports` (every node's
    AMQP port on `host`) and `quorum_size` (x-quorum-initial-group-size: how many nodes
    hold each quorum queue).

    - On a cluster each driver connects to one node picked at random (the next on refusal),
      as clients behind a load balancer would: clients spread over the nodes, and a node
      that does not lead the queue forwards to the one that does.

    - push publishes one persistent message (delivery_mode 2, mandatory, so an unroutable
      message raises instead of being confirmed) and awaits its publisher confirm. The broker
      confirms a persistent message on a durable queue once it is on disk: classic queues
      (v1, 3.10's default) after the message store / queue index fsync, quorum queues after
      the Raft WAL fsync; both group many messages into one fsync under load.
    - push_batch publishes all and awaits all their confirms (pipelined on one channel).
    - receive starts, on first use, a consumer on a channel of its own (manual acks,
      prefetch) that feeds an asyncio.Queue; it returns what is buffered, waiting up to
      wait_s for the first message. A driver that only pushes never consumes.
    - ack settles with basic.ack: one `multiple=True` ack of the highest tag when the tokens
      are exactly everything delivered up to it, else one ack per tag. AMQP 0-9-1 has no
      confirm for acks: ack returns once the frames are written to the socket, not once the
      broker has applied (let alone fsynced) them. If the connection drops before the broker
      reads them, those messages are delivered again: at-least-once holds, "durable before
      return" does not.
    - Unacked messages come back (redelivered flag) when the consumer's channel or
      connection closes.
    """

    def __init__(self, spec: SystemSpec, queue: str) -> None:
        super().__init__(spec, queue)
        opts = spec.options
        self.queue_type = str(opts.get("queue_type", "classic"))
        if self.queue_type not in ("classic", "quorum"):
            raise ValueError(f"queue_type must be classic or quorum, not {self.queue_type!r}")
        self.prefetch = int(opts.get("prefetch", 256))
        self.quorum_size = opts.get("quorum_size")
        if self.quorum_size is not None and self.queue_type != "quorum":
            raise ValueError("quorum_size is for quorum queues")
        self.node_port: int | None = None  # the node this driver is connected to
        self._make_message: Any = None  # aio_pika.Message, bound in open()
        self._persistent: Any = None
        self._conn: Any = None
        self._channel: Any = None
        self._consume_channel: Any = None
        self._underlay: Any = None  # the consume channel's aiormq channel, for basic.ack
        self._consume_lock = asyncio.Lock()
        self._buffer: asyncio.Queue[Any] = asyncio.Queue()
        self._delivered: set[int] = set()  # tags handed to the caller, not yet acked

    async def open(self) -> None:
        import aio_pika

        opts = self.spec.options
        self._make_message = aio_pika.Message
        self._persistent = aio_pika.DeliveryMode.PERSISTENT
        ports = [int(p) for p in opts.get("ports") or [opts.get("port", 5672)]]
        first = random.randrange(len(ports))
        for i, port in enumerate(ports[first:] + ports[:first]):
            try:
                self._conn = await aio_pika.connect(
                    host=opts.get("host", "127.0.0.1"),
                    port=port,
                    login=opts.get("user", "guest"),
                    password=opts.get("password", "guest"),
                )
            except OSError:  # refused, or no AMQP there
                if i == len(ports) - 1:
                    raise
                continue
            self.node_port = port
            break
        self._channel = await self._conn.channel(publisher_confirms=True, on_return_raises=True)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    def _arguments(self) -> dict[str, Any]:
        if self.queue_type != "quorum":
            return {}
        if self.quorum_size is None:
            return {"x-queue-type": "quorum"}
        return {"x-queue-type": "quorum", "x-quorum-initial-group-size": int(self.quorum_size)}

    async def reset(self) -> None:
        await self._channel.queue_delete(self.queue)
        await self._channel.declare_queue(self.queue, durable=True, arguments=self._arguments())

    def _message(self, body: bytes) -> Any:
        return self._make_message(body, delivery_mode=self._persistent)

    async def push(self, body: bytes) -> None:
        await asyncio.wait_for(
            self._channel.default_exchange.publish(
                self._message(body), routing_key=self.queue, mandatory=True
            ),
            CONFIRM_TIMEOUT_S,
        )

    async def push_batch(self, bodies: list[bytes]) -> None:
        exchange = self._channel.default_exchange
        publishes = [
            exchange.publish(self._message(b), routing_key=self.queue, mandatory=True)
            for b in bodies
        ]
        await asyncio.wait_for(asyncio.gather(*publishes), CONFIRM_TIMEOUT_S)

    async def _start_consumer(self) -> None:
        async with self._consume_lock:
            if self._consume_channel is not None:
                return
            channel = await self._conn.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=self.prefetch)
            queue = await channel.declare_queue(
                self.queue, durable=True, arguments=self._arguments(), passive=True
            )
            await queue.consume(self._on_message, no_ack=False)
            self._underlay = await channel.get_underlay_channel()
            self._consume_channel = channel

    async def _on_message(self, message: Any) -> None:
        self._buffer.put_nowait(message)

    async def receive(self, max_messages: int, wait_s: float = 0.0) -> list[Received]:
        if self._consume_channel is None:
            await self._start_consumer()
        out: list[Received] = []
        if self._buffer.empty():
            if wait_s > 0:
                # asyncio.timeout, not wait_for: on a timeout the message stays queued
                try:
                    async with asyncio.timeout(wait_s):
                        first = await self._buffer.get()
                except TimeoutError:
                    return []
                out.append((first.body, first.delivery_tag))
            else:
                await asyncio.sleep(0)  # let frames already read reach the buffer
        while len(out) < max_messages and not self._buffer.empty():
            m = self._buffer.get_nowait()
            out.append((m.body, m.delivery_tag))
        self._delivered.update(tag for _, tag in out)
        return out

    async def ack(self, tokens: list[Any]) -> None:
        if not tokens:
            return
        tags = set(tokens)
        top = max(tags)
        # Tags still in the buffer are all above any delivered one (deliveries come in
        # order), so a multiple ack up to `top` settles exactly the delivered tags <= top.
        if all(t in tags for t in self._delivered if t <= top):
            await self._underlay.basic_ack(top, multiple=True)
        else:
            for t in sorted(tags):
                await self._underlay.basic_ack(t)
        self._delivered -= tags


# ------------------------------------------------------------------------------------- Redis


class RedisDriver(Driver):
    """Redis through redis.asyncio, as a list or as a stream (option `mode`).

    Options: `host`, `port`, `mode` ("list" or "stream"), `claim_idle_s` (stream: how long a
    message stays pending before another consumer may claim it, default 30).
    Durability is the server's: with `appendfsync always` Redis writes and fsyncs the AOF
    before it sends the replies of the commands it ran in that event-loop pass (one fsync
    covers every client's writes in the pass); with `everysec` a second of writes can go.

    mode "list" (the reliable-queue pattern):
    - push = LPUSH; push_batch = one LPUSH with every body (one command, one AOF write).
    - receive = LMOVE queue -> this consumer's processing list, up to n in one pipeline; if
      none, one BLMOVE that waits up to wait_s. Token = the body.
    - ack = LREM processing -1 body per token, pipelined (from the tail: the oldest first).
    - A message received and never acked stays in the dead consumer's processing list. It
      does NOT come back by itself: the pattern needs a reaper that moves a dead consumer's
      processing list back to the queue. This driver has none, so the list rows are
      at-least-once only with that reaper, which no benchmark runs.

    mode "stream" (a consumer group):
    - push = XADD; push_batch = XADDs in one pipeline.
    - receive = XREADGROUP GROUP g <this consumer> COUNT n [BLOCK wait_s] >; and, at most
      every claim_idle_s / 2, first XAUTOCLAIM of entries pending longer than claim_idle_s
      (how a Redis consumer takes over a dead one's messages). Token = the entry id.
    - ack = XACK + XDEL in one pipeline: XACK settles the entry, XDEL removes it, so the
      stream holds only what is not done, as a queue would (an XACK alone leaves every entry
      in the stream until trimmed).
    Keys: `zdmq:{queue}` (list), `zdmq:{queue}:processing:{consumer}`, `zdmq:{queue}:stream`.
    """

    GROUP = "zdmq"

    def __init__(self, spec: SystemSpec, queue: str) -> None:
        super().__init__(spec, queue)
        opts = spec.options
        self.mode = str(opts.get("mode", "list"))
        if self.mode not in ("list", "stream"):
            raise ValueError(f"mode must be list or stream, not {self.mode!r}")
        self.claim_idle_s = float(opts.get("claim_idle_s", 30.0))
        self.consumer = _consumer_name()
        self.list_key = f"zdmq:{queue}"
        self.processing_key = f"zdmq:{queue}:processing:{self.consumer}"
        self.stream_key = f"zdmq:{queue}:stream"
        self._next_claim = 0.0
        self._claim_cursor = "0-0"
        self._r: Any = None

    async def open(self) -> None:
        import redis.asyncio as aredis

        opts = self.spec.options
        self._r = aredis.Redis(host=opts.get("host", "127.0.0.1"), port=int(opts.get("port", 6379)))
        await self._r.ping()

    async def close(self) -> None:
        if self._r is not None:
            await self._r.aclose()
            self._r = None

    async def reset(self) -> None:
        stale = [k async for k in self._r.scan_iter(match=f"zdmq:{self.queue}:processing:*")]
        await self._r.delete(self.list_key, self.stream_key, *stale)
        if self.mode == "stream":
            await self._r.xgroup_create(self.stream_key, self.GROUP, id="0", mkstream=True)

    async def push(self, body: bytes) -> None:
        if self.mode == "list":
            await self._r.lpush(self.list_key, body)
        else:
            await self._r.xadd(self.stream_key, {"b": body})

    async def push_batch(self, bodies: list[bytes]) -> None:
        if not bodies:
            return
        if self.mode == "list":
            await self._r.lpush(self.list_key, *bodies)
            return
        pipe = self._r.pipeline(transaction=False)
        for b in bodies:
            pipe.xadd(self.stream_key, {"b": b})
        await pipe.execute()

    async def receive(self, max_messages: int, wait_s: float = 0.0) -> list[Received]:
        if self.mode == "list":
            return await self._receive_list(max_messages, wait_s)
        return await self._receive_stream(max_messages, wait_s)

    async def _lmove_many(self, n: int) -> list[bytes]:
        pipe = self._r.pipeline(transaction=False)
        for _ in range(n):
            pipe.lmove(self.list_key, self.processing_key, "RIGHT", "LEFT")
        return [b for b in await pipe.execute() if b is not None]

    async def _receive_list(self, n: int, wait_s: float) -> list[Received]:
        got = await self._lmove_many(n)
        if not got and wait_s > 0:
            first = await self._r.blmove(
                self.list_key, self.processing_key, wait_s, "RIGHT", "LEFT"
            )
            if first is None:
                return []
            got = [first]
            if n > 1:
                got += await self._lmove_many(n - 1)
        return [(b, b) for b in got]

    async def _receive_stream(self, n: int, wait_s: float) -> list[Received]:
        now = time.monotonic()
        if now >= self._next_claim:
            self._next_claim = now + self.claim_idle_s / 2
            cursor, claimed, *_ = await self._r.xautoclaim(
                self.stream_key,
                self.GROUP,
                self.consumer,
                int(self.claim_idle_s * 1000),
                start_id=self._claim_cursor,
                count=n,
            )
            self._claim_cursor = cursor.decode() if isinstance(cursor, bytes) else cursor
            out = [(fields[b"b"], mid) for mid, fields in claimed if fields]
            if out:
                return out
        block = max(1, int(wait_s * 1000)) if wait_s > 0 else None
        res = await self._r.xreadgroup(
            self.GROUP, self.consumer, {self.stream_key: ">"}, count=n, block=block
        )
        if not res:
            return []
        _key, entries = res[0]
        return [(fields[b"b"], mid) for mid, fields in entries]

    async def ack(self, tokens: list[Any]) -> None:
        if not tokens:
            return
        pipe = self._r.pipeline(transaction=False)
        if self.mode == "list":
            for body in tokens:
                pipe.lrem(self.processing_key, -1, body)
        else:
            pipe.xack(self.stream_key, self.GROUP, *tokens)
            pipe.xdel(self.stream_key, *tokens)
        await pipe.execute()


# -------------------------------------------------------------------------------------- NATS


class NatsDriver(Driver):
    """NATS JetStream through nats-py: a file-storage work-queue stream, one durable pull
    consumer with explicit acks shared by every driver of the queue.

    Options: `host`, `port`, `ack_wait_s` (redelivery delay of an unacked message, default
    30), `max_ack_pending` (default 65536); for a cluster, `ports` (every server's client
    port on `host`) and `replicas` (the stream's num_replicas, default 1; its consumer has as
    many).
    - On a cluster nats-py connects to one of the servers at random, so clients spread over
      them; a server that leads neither the stream nor the consumer forwards to the one that
      does. With replicas > 1 the PubAck comes once a majority of the stream's replicas have
      stored the message, and an ack is applied once a majority of the consumer's have.
    - push = js.publish, which waits for the PubAck. The PubAck comes once the stream has
      stored the message in its file store; the fsync is another matter (see the row's
      durability): nats-server 2.9 fsyncs on a timer, 2.10+ with `sync_interval: always`
      before the PubAck.
    - push_batch = js.publish_async for each (pipelined on one connection, nats-py bounds
      how many are pending) and awaits every PubAck.
    - receive = fetch(n) on a pull subscription bound to the durable; it waits up to wait_s
      (at least 10 ms: nats-py needs a positive timeout) and returns [] on timeout.
    - ack = msg.ack_sync() for each token, concurrently: ack_sync is a request that returns
      once the server has processed the ack (a plain ack() is fire-and-forget). With the
      work-queue retention the acked message is then removed from the stream.
    - An unacked message comes back ack_wait_s after its delivery, whether or not the
      consumer is still alive: closing the connection does not return it any sooner.
    """

    DURABLE = "zdmq"
    MIN_FETCH_WAIT_S = 0.01

    def __init__(self, spec: SystemSpec, queue: str) -> None:
        super().__init__(spec, queue)
        opts = spec.options
        safe = re.sub(r"[^A-Za-z0-9_-]", "_", queue)
        self.stream = f"ZDMQ_{safe}"
        self.subject = f"zdmq.{safe}"
        self.ack_wait_s = float(opts.get("ack_wait_s", 30.0))
        self.max_ack_pending = int(opts.get("max_ack_pending", 65536))
        self.replicas = int(opts.get("replicas", 1))
        self._nc: Any = None
        self._js: Any = None
        self._psub: Any = None

    async def open(self) -> None:
        import nats

        opts = self.spec.options
        host = opts.get("host", "127.0.0.1")
        ports = opts.get("ports") or [opts.get("port", 4222)]
        urls = [f"nats://{host}:{int(p)}" for p in ports]
        self._nc = await nats.connect(urls, allow_reconnect=False, connect_timeout=5)
        self._js = self._nc.jetstream(timeout=CONFIRM_TIMEOUT_S)

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()
            self._nc = None

    async def reset(self) -> None:
        from nats.js import api
        from nats.js.errors import NotFoundError

        with contextlib.suppress(NotFoundError):
            await self._js.delete_stream(self.stream)
        await self._js.add_stream(
            api.StreamConfig(
                name=self.stream,
                subjects=[self.subject],
                storage=api.StorageType.FILE,
                retention=api.RetentionPolicy.WORK_QUEUE,
                num_replicas=self.replicas,
            )
        )
        await self._js.add_consumer(
            self.stream,
            api.ConsumerConfig(
                durable_name=self.DURABLE,
                ack_policy=api.AckPolicy.EXPLICIT,
                ack_wait=self.ack_wait_s,
                max_ack_pending=self.max_ack_pending,
                num_replicas=self.replicas,
            ),
        )

    async def push(self, body: bytes) -> None:
        await self._js.publish(self.subject, body)

    async def push_batch(self, bodies: list[bytes]) -> None:
        futures = [await self._js.publish_async(self.subject, b) for b in bodies]
        await asyncio.wait_for(asyncio.gather(*futures), CONFIRM_TIMEOUT_S)

    async def receive(self, max_messages: int, wait_s: float = 0.0) -> list[Received]:
        import nats.errors

        if self._psub is None:
            self._psub = await self._js.pull_subscribe_bind(
                durable=self.DURABLE, stream=self.stream
            )
        try:
            msgs = await self._psub.fetch(
                batch=max_messages, timeout=max(wait_s, self.MIN_FETCH_WAIT_S)
            )
        except (nats.errors.TimeoutError, TimeoutError):
            return []
        return [(m.data, m) for m in msgs]

    async def ack(self, tokens: list[Any]) -> None:
        await asyncio.gather(*(m.ack_sync(timeout=CONFIRM_TIMEOUT_S) for m in tokens))


# ------------------------------------------------------------------------------------- specs

# peer name in peers.json -> its rows: (row name, driver class, extra options, note)
_ROWS: dict[str, list[tuple[str, str, dict[str, Any], str]]] = {
    "rabbitmq": [
        (
            "rabbitmq classic",
            "RabbitMQDriver",
            {"queue_type": "classic"},
            "durable classic queue (v1), persistent msgs, publisher confirms; acks unconfirmed",
        ),
        (
            "rabbitmq quorum",
            "RabbitMQDriver",
            {"queue_type": "quorum"},
            "quorum queue (1 node, Raft WAL fsync), publisher confirms; acks unconfirmed",
        ),
    ],
    "redis-always": [
        (
            "redis list always",
            "RedisDriver",
            {"mode": "list"},
            "LPUSH/LMOVE/LREM, AOF appendfsync always; unacked msgs need a reaper",
        ),
        (
            "redis stream always",
            "RedisDriver",
            {"mode": "stream"},
            "XADD/XREADGROUP/XACK+XDEL, AOF appendfsync always",
        ),
    ],
    "redis-everysec": [
        (
            "redis list everysec",
            "RedisDriver",
            {"mode": "list"},
            "LPUSH/LMOVE/LREM, AOF appendfsync everysec (up to ~1 s lost on crash)",
        ),
        (
            "redis stream everysec",
            "RedisDriver",
            {"mode": "stream"},
            "XADD/XREADGROUP/XACK+XDEL, AOF appendfsync everysec",
        ),
    ],
    "nats": [
        (
            "nats",
            "NatsDriver",
            {},
            "JetStream file store, default sync (fsync on a timer, not per message)",
        ),
    ],
    "rabbitmq-quorum3": [
        (
            "rabbitmq quorum r3",
            "RabbitMQDriver",
            {"queue_type": "quorum", "quorum_size": 3},
            "quorum queue on 3 nodes (Raft, WAL fsync on each), publisher confirms once a "
            "majority has it; clients spread over the nodes; acks unconfirmed",
        ),
    ],
    "nats-r3": [
        (
            "nats r3 sync always",
            "NatsDriver",
            {"replicas": 3},
            "JetStream R3 stream and consumer on 3 servers, sync_interval always; PubAck once "
            "a majority stored it; clients spread over the servers",
        ),
    ],
    "nats-sync": [
        (
            "nats sync always",
            "NatsDriver",
            {},
            "JetStream file store, sync_interval always (fsync before PubAck)",
        ),
    ],
}


def peer_specs(peers_json_path: str | os.PathLike[str]) -> list[SystemSpec]:
    """The SystemSpec rows of every peer that peers.json lists as running."""
    data = json.loads(Path(peers_json_path).read_text())
    specs = []
    for peer in data["peers"]:
        for row, cls, extra, note in _ROWS.get(peer["name"], []):
            specs.append(
                SystemSpec(
                    name=row,
                    driver=f"peer_drivers:{cls}",
                    durability=peer["durability"],
                    options={
                        "host": peer["host"],
                        "port": peer["port"],
                        **({"ports": peer["ports"]} if "ports" in peer else {}),
                        **extra,
                    },
                    server_pids=tuple(peer["pids"]),
                    sys_path=(HERE,),
                    note=f"{note}; {peer['version']}",
                )
            )
    return specs
