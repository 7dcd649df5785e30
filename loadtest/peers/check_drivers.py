"""Checks every peer driver against the Driver contract, on the peers peers.sh started.

    .venv/bin/python loadtest/peers/check_drivers.py [--peers-json PATH] [--only NAME ...]

For each row of peer_specs(peers.json):
1. reset; push 1,000 unique bodies (200 with push, 800 with push_batch of 100);
2. receive + ack them from 2 concurrent drivers; every body must come back exactly once,
   and afterwards the queue must be empty (the system's own count, not just a dry receive);
   on a replicated row (nats r3, rabbitmq quorum r3) the queue must, while it holds the
   messages, have all its replicas on distinct servers, each in sync (the system's own
   view: JetStream's stream and consumer info; `rabbitmqctl list_queues` through peers.sh);
3. redelivery: a message received and never acked, by a consumer whose connection then
   closes, must come back to another consumer (Redis lists: it stays in the dead consumer's
   processing list; that is reported, not faked);
4. a sanity rate: push one at a time for 2 s.
Talks only to 127.0.0.1, is bounded in count and time, and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

from peer_drivers import NatsDriver, RabbitMQDriver, RedisDriver, peer_specs  # noqa: E402

from zdmq.bench.driver import Driver, SystemSpec, open_driver  # noqa: E402

N_MESSAGES = 1000
N_SINGLE = 200
BATCH = 100
RECEIVE_MAX = 50
DRAIN_LIMIT_S = 60.0
REDELIVERY_LIMIT_S = 15.0
RATE_S = 2.0
REPLICA_SYNC_LIMIT_S = 10.0
DEPTH_SETTLE_LIMIT_S = 5.0
# short redelivery timers for the redelivery check only
FAST_REDELIVERY = {"ack_wait_s": 1.0, "claim_idle_s": 0.5}


async def depth(d: Driver) -> dict[str, int]:
    """What the system itself says is left in the queue (ready + in flight)."""
    if isinstance(d, RabbitMQDriver):
        ch = await d._conn.channel()
        q = await ch.declare_queue(d.queue, passive=True)
        ready = q.declaration_result.message_count
        await ch.close()
        return {"ready": ready}
    if isinstance(d, RedisDriver):
        r = d._r
        if d.mode == "list":
            procs = [k async for k in r.scan_iter(match=f"zdmq:{d.queue}:processing:*")]
            in_flight = sum([await r.llen(k) for k in procs])
            return {"ready": await r.llen(d.list_key), "processing": in_flight}
        pending = await r.xpending(d.stream_key, d.GROUP)
        return {"xlen": await r.xlen(d.stream_key), "pending": pending["pending"]}
    if isinstance(d, NatsDriver):
        info = await d._js.stream_info(d.stream)
        ci = await d._js.consumer_info(d.stream, d.DURABLE)
        return {"messages": info.state.messages, "ack_pending": ci.num_ack_pending}
    raise TypeError(type(d))


def wanted_replicas(spec: SystemSpec) -> int:
    return int(spec.options.get("replicas") or spec.options.get("quorum_size") or 1)


async def replica_sets(d: Driver, peers_dir: Path) -> dict[str, tuple[list[str], list[str]]]:
    """What holds the queue, as the system reports it: per replica set, its servers and
    those of them in sync (NATS: the stream's and its consumer's; RabbitMQ: the queue's)."""
    if isinstance(d, NatsDriver):
        sets = {}
        for what, info in (
            ("stream", await d._js.stream_info(d.stream)),
            ("consumer", await d._js.consumer_info(d.stream, d.DURABLE)),
        ):
            cluster = info.cluster
            if cluster is None or cluster.leader is None:
                sets[what] = ([], [])
                continue
            others = cluster.replicas or []
            sets[what] = (
                [cluster.leader, *(r.name for r in others)],
                [cluster.leader, *(r.name for r in others if r.current)],
            )
        return sets
    if isinstance(d, RabbitMQDriver):
        proc = await asyncio.create_subprocess_exec(
            str(HERE / "peers.sh"),
            *("rabbitmqctl", "list_queues", "name", "members", "online"),
            *("--formatter", "json"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PEERS_DIR": str(peers_dir)},
        )
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        if proc.returncode != 0:
            raise RuntimeError(f"rabbitmqctl list_queues: {err.decode().strip()[-300:]}")
        rows = [r for r in json.loads(out) if r.get("name") == d.queue]
        return {"queue": (list(rows[0]["members"]), list(rows[0]["online"])) if rows else ([], [])}
    raise TypeError(type(d))


async def check_replicas(
    d: Driver, spec: SystemSpec, peers_dir: Path, limit_s: float = REPLICA_SYNC_LIMIT_S
) -> list[str]:
    """Problems unless every replica set of d's queue is `spec`'s replica count of distinct
    servers, all in sync (NATS: current; RabbitMQ: online), within limit_s."""
    want = wanted_replicas(spec)
    deadline = time.monotonic() + limit_s
    while True:  # a follower may still be catching up right after the pushes
        sets = await replica_sets(d, peers_dir)
        bad = {
            what: (held, current)
            for what, (held, current) in sets.items()
            if not len(set(held)) == len(held) == len(set(current)) == want
        }
        if not bad:
            for what, (held, _) in sets.items():
                print(f"  replicas: the {what} is on {want} servers, all in sync: {sorted(held)}")
            return []
        if time.monotonic() > deadline:
            return [
                f"replicas: the {what} should be on {want} servers, all in sync; it is on "
                f"{held}, in sync {current}"
                for what, (held, current) in bad.items()
            ]
        await asyncio.sleep(0.5)


async def settled_depth(d: Driver, limit_s: float = DEPTH_SETTLE_LIMIT_S) -> dict[str, int]:
    """depth() once it reads empty, or after limit_s. On a replicated NATS stream an ack is
    applied by the consumer's replicas before ack_sync returns, but the stream's replicas
    drop the message a moment later, so its count lags the acks."""
    deadline = time.monotonic() + limit_s
    while True:
        left = await depth(d)
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.1)


async def drop(d: Driver) -> None:
    """Removes the check's queue from the server."""
    if isinstance(d, RabbitMQDriver):
        if d._consume_channel is not None:  # else the broker cancels it, and aio-pika logs
            await d._consume_channel.close()
            d._consume_channel = None
        await d._channel.queue_delete(d.queue)
    elif isinstance(d, RedisDriver):
        procs = [k async for k in d._r.scan_iter(match=f"zdmq:{d.queue}:processing:*")]
        await d._r.delete(d.list_key, d.stream_key, *procs)
    elif isinstance(d, NatsDriver):
        await d._js.delete_stream(d.stream)


async def opened(spec: SystemSpec, queue: str) -> Driver:
    d = open_driver(spec, queue)
    await d.open()
    return d


async def check_once_each(spec: SystemSpec, queue: str, peers_dir: Path) -> list[str]:
    problems = []
    admin = await opened(spec, queue)
    await admin.reset()
    run = uuid.uuid4().hex[:8]
    bodies = [f"{run}-{i:06d}-{time.time_ns()}".encode() for i in range(N_MESSAGES)]
    for b in bodies[:N_SINGLE]:
        await admin.push(b)
    for i in range(N_SINGLE, N_MESSAGES, BATCH):
        await admin.push_batch(bodies[i : i + BATCH])
    if wanted_replicas(spec) > 1:
        problems += await check_replicas(admin, spec, peers_dir)

    seen: collections.Counter[bytes] = collections.Counter()
    deadline = time.monotonic() + DRAIN_LIMIT_S

    async def consume(d: Driver) -> None:
        while sum(seen.values()) < N_MESSAGES and time.monotonic() < deadline:
            got = await d.receive(RECEIVE_MAX, wait_s=0.2)
            seen.update(b for b, _ in got)
            await d.ack([t for _, t in got])

    consumers = [await opened(spec, queue) for _ in range(2)]
    await asyncio.gather(*(consume(d) for d in consumers))
    # anything more now is a duplicate (or a stray)
    extra = await asyncio.gather(*(d.receive(RECEIVE_MAX, wait_s=0.5) for d in consumers))
    for got, d in zip(extra, consumers, strict=True):
        seen.update(b for b, _ in got)
        await d.ack([t for _, t in got])
    for d in consumers:
        await d.close()

    missing = [b for b in bodies if seen[b] == 0]
    dups = {b: c for b, c in seen.items() if c > 1}
    strays = [b for b in seen if b not in set(bodies)]
    if missing:
        problems.append(f"{len(missing)} of {N_MESSAGES} never came back, e.g. {missing[:2]}")
    if dups:
        problems.append(f"{len(dups)} came back more than once, e.g. {list(dups.items())[:2]}")
    if strays:
        problems.append(f"{len(strays)} bodies that were never pushed")
    left = await settled_depth(admin)
    if any(left.values()):
        problems.append(f"queue not empty at the end: {left}")
    print(f"  once each: {len(seen)} distinct of {N_MESSAGES}, depth after {left}")
    await drop(admin)
    await admin.close()
    return problems


async def check_redelivery(spec: SystemSpec, queue: str) -> list[str]:
    spec = replace(spec, options={**spec.options, **FAST_REDELIVERY})
    admin = await opened(spec, queue)
    await admin.reset()
    body = f"redeliver-{uuid.uuid4().hex}".encode()
    await admin.push(body)
    a = await opened(spec, queue)
    got = await a.receive(1, wait_s=2.0)
    if [b for b, _ in got] != [body]:
        await a.close()
        await admin.close()
        return [f"redelivery: first receive got {got!r}"]
    await a.close()  # never acked
    b = await opened(spec, queue)
    t0 = time.monotonic()
    again: list[Any] = []
    if isinstance(b, RedisDriver) and b.mode == "list":
        again = await b.receive(1, wait_s=1.0)
        left = await depth(admin)
        await b.close()
        await drop(admin)
        await admin.close()
        if again:
            return [f"redis list: unexpected redelivery {again!r}"]
        print(
            f"  redelivery: none (by design): the message stays in the dead consumer's "
            f"processing list {left}; the reliable-list pattern needs a reaper"
        )
        return []
    while not again and time.monotonic() - t0 < REDELIVERY_LIMIT_S:
        again = await b.receive(1, wait_s=0.5)
    dt = time.monotonic() - t0
    problems = []
    if [x for x, _ in again] != [body]:
        problems.append(f"redelivery: no redelivery within {REDELIVERY_LIMIT_S}s ({again!r})")
    else:
        await b.ack([t for _, t in again])
        print(f"  redelivery: back after {dt:.2f} s to a second consumer, acked")
        left = await settled_depth(admin)
        if any(left.values()):
            problems.append(f"redelivery: queue not empty after ack: {left}")
    await b.close()
    await drop(admin)
    await admin.close()
    return problems


async def push_rate(spec: SystemSpec, queue: str) -> float:
    d = await opened(spec, queue)
    await d.reset()
    n = 0
    t0 = time.monotonic()
    while (dt := time.monotonic() - t0) < RATE_S:
        await d.push(b"r" * 100 + str(n).encode())
        n += 1
    await drop(d)
    await d.close()
    return n / dt


async def check_spec(spec: SystemSpec, peers_dir: Path) -> list[str]:
    print(f"{spec.name}  [{spec.durability}]  {spec.options}")
    queue = f"check-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    problems = await check_once_each(spec, queue, peers_dir)
    problems += await check_redelivery(spec, queue + "-r")
    rate = await push_rate(spec, queue + "-rate")
    print(f"  push one at a time: {rate:,.0f} msgs/s (rough, shared 2-core machine)")
    return problems


async def check_all(specs: list[SystemSpec], peers_dir: Path) -> int:
    failed = {}
    for spec in specs:
        try:
            problems = await asyncio.wait_for(check_spec(spec, peers_dir), 180)
        except Exception as e:  # report and go on with the next system
            problems = [f"{type(e).__name__}: {e}"]
        for p in problems:
            print(f"  FAIL {p}")
        if problems:
            failed[spec.name] = problems
    print(f"{len(specs) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main() -> int:
    default_json = Path(os.environ.get("PEERS_DIR", "/tmp/zdmq-peers")) / "peers.json"
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers-json", default=str(default_json))
    ap.add_argument("--only", nargs="*", help="row names to check (default all)")
    args = ap.parse_args()
    specs = peer_specs(args.peers_json)
    if args.only:
        specs = [s for s in specs if s.name in args.only]
    if not specs:
        print(f"no running peers in {args.peers_json}: run loadtest/peers/peers.sh start")
        return 1
    return asyncio.run(check_all(specs, Path(args.peers_json).resolve().parent))


if __name__ == "__main__":
    sys.exit(main())
