"""Push-to-delivery through `client.consume` on the shipped layout (4 nodes, three copies).

One producer process pushes one message at a time at a fixed rate (each push its own task,
so a slow confirm does not hold the next tick back); one consumer process iterates
`client.consume(queue, prefetch=P)` (streams, its default; `stream=False` for the receive
transport), in its loop body or, with `--handler`, in a handler (one at a time, the
default `concurrency`), and records, for each message,
when it reached the loop body minus when the producer made it (the body carries its send
time, CLOCK_MONOTONIC, shared by the processes of this host). A run kept up when every
message arrived within the run plus 2 s.

    python -m zdmq.bench.consume --rates 200 500 --prefetch 100 1 --transports receive stream

prints a row per rate, transport and prefetch: p50, p99 and max in ms, the messages
delivered, the producer's p50 from a push to its confirm, and the servers' CPU (user +
system, every server process) per message delivered (`receive`: long-polled receives;
`stream`: a stream to every node).

The peers that `loadtest/peers/peers.sh start` left running (`--peers`, default
$PEERS_DIR/peers.json when it exists; `--only` picks rows by name) run the same producer
and the same clock through their bench drivers, in the same run: the producer awaits
each confirm, and the consumer is the driver's own (RabbitMQ: a basic.consume with
`prefetch` as its basic.qos; NATS: fetches of up to `prefetch` from a pull consumer),
acking what it received before it takes more.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from zdmq import Client
from zdmq.bench.driver import SystemSpec, open_driver
from zdmq.bench.workloads import cpu_seconds, make_body, percentile, sent_at
from zdmq.local import LocalCluster
from zdmq.models import ReceivedMessage

_CTX = mp.get_context("spawn")


#: zdmq's own cluster (its cluster.yaml), or a peer's bench row
Target = str | SystemSpec


async def _paced(push: Any, rate: float, n: int, go: Any) -> list[float]:
    """Pushes n bodies at `rate`, each its own task, so a slow confirm holds no tick back;
    returns each push's time to its confirm, in ms."""
    go.wait()
    t0 = time.monotonic()
    tasks = []

    async def one(body: bytes) -> float:
        start = time.monotonic()
        await push(body)
        return (time.monotonic() - start) * 1e3

    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(make_body(48, 0, i))))
    return list(await asyncio.gather(*tasks))


def _produce(target: Target, queue: str, rate: float, n: int, go: Any, out: Any) -> None:
    async def main() -> list[float]:
        if isinstance(target, SystemSpec):
            driver = open_driver(target, queue)
            await driver.open()
            try:
                return await _paced(driver.push, rate, n, go)
            finally:
                await driver.close()
        async with Client.from_config(target) as c:
            return await _paced(lambda body: c.push(queue, body), rate, n, go)

    out.put(sorted(asyncio.run(main())))


async def _drive_peer(
    spec: SystemSpec, queue: str, prefetch: int, n: int, out: Any, lat: list[float]
) -> None:
    spec = replace(spec, options={**spec.options, "prefetch": prefetch})
    driver = open_driver(spec, queue)
    await driver.open()
    try:
        await driver.receive(1, 0.0)  # its consumer is set up before the producer starts
        out.put("ready")
        while len(lat) < n:
            got = await driver.receive(prefetch, 1.0)
            now = time.monotonic()
            lat.extend((now - sent_at(body)) * 1e3 for body, _ in got)
            await driver.ack([token for _, token in got])
    finally:
        await driver.close()


def _consume(
    target: Target,
    queue: str,
    prefetch: int,
    stream: bool,
    handler: bool,
    n: int,
    limit_s: float,
    out: Any,
) -> None:
    async def main() -> list[float]:
        lat: list[float] = []
        if isinstance(target, SystemSpec):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit_s):
                    await _drive_peer(target, queue, prefetch, n, out, lat)
            return lat
        async with Client.from_config(target) as c:

            async def handle(msg: ReceivedMessage) -> None:
                lat.append((time.monotonic() - sent_at(msg.body)) * 1e3)
                if len(lat) >= n:
                    consumer.stop()

            if handler:
                consumer = c.consume(queue, handle, prefetch=prefetch, stream=stream)
            else:
                consumer = c.consume(queue, prefetch=prefetch, stream=stream)
            out.put("ready")
            try:
                async with asyncio.timeout(limit_s):
                    async for item in consumer:
                        if not handler:
                            await handle(item)
            except TimeoutError:
                pass
        return lat

    out.put(asyncio.run(main()))


def run(
    target: LocalCluster | SystemSpec,
    rate: float,
    prefetch: int,
    seconds: float,
    transport: str = "receive",
    handler: bool = False,
) -> dict[str, Any]:
    """One row: `target` is zdmq's cluster (consumed by `transport`, in the loop body or
    by a handler) or a peer's row."""
    n = int(rate * seconds)
    queue = f"lat-{int(rate)}-{prefetch}-{time.monotonic_ns()}"
    where: Target = target if isinstance(target, SystemSpec) else str(target.config_path)
    if isinstance(target, SystemSpec):
        pids = list(target.server_pids)
    else:
        pids = [p.pid for p in target.nodes.values() if p.pid is not None]
    asyncio.run(_create(where, queue))
    out = _CTX.Queue()
    go = _CTX.Event()
    stream = transport == "stream"
    consumer = _CTX.Process(
        target=_consume, args=(where, queue, prefetch, stream, handler, n, seconds + 10, out)
    )
    confirms = _CTX.Queue()
    producer = _CTX.Process(target=_produce, args=(where, queue, rate, n, go, confirms))
    consumer.start()
    producer.start()
    assert out.get(timeout=60) == "ready"
    time.sleep(1.0)  # the consumer's first receive is waiting
    cpu0 = cpu_seconds(pids)
    go.set()
    lat: list[float] = sorted(out.get(timeout=seconds + 60))
    cpu = cpu_seconds(pids) - cpu0
    push: list[float] = confirms.get(timeout=60)
    producer.join()
    consumer.join()
    return {
        "rate": rate,
        "prefetch": prefetch,
        "transport": transport,
        "delivered": len(lat),
        "sent": n,
        "p50": percentile(lat, 0.5),
        "p99": percentile(lat, 0.99),
        "max": max(lat, default=float("nan")),
        "push_p50": percentile(push, 0.5),
        "cpu_us": cpu * 1e6 / max(len(lat), 1),
    }


async def _create(where: Target, queue: str) -> None:
    """Creates the queue empty, on zdmq or on the peer."""
    if isinstance(where, SystemSpec):
        driver = open_driver(where, queue)
        await driver.open()
        try:
            await driver.reset()
        finally:
            await driver.close()
        return
    async with Client.from_config(where) as c:
        await c.create_queue(queue)


def _peers(path: str | None) -> list[SystemSpec]:
    """The running peers' rows (`path` "none": none)."""
    from zdmq.bench.runner import peer_systems

    if path == "none":
        return []
    default = Path(os.environ.get("PEERS_DIR", "/tmp/zdmq-peers")) / "peers.json"
    json_path = Path(path) if path else default
    if not json_path.exists():
        print(f"consume: no peers ({json_path} does not exist)")
        return []
    specs, notes = peer_systems(json_path)
    for note in notes:
        print(f"consume: {note}")
    return specs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[200.0, 500.0])
    ap.add_argument("--prefetch", type=int, nargs="+", default=[100, 1])
    ap.add_argument("--transports", nargs="+", choices=["receive", "stream"], default=["stream"])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--replication", type=int, default=3)
    ap.add_argument(
        "--handler",
        action="store_true",
        help="zdmq's consumer with a handler (one at a time, the default) instead of the loop body",
    )
    ap.add_argument("--peers", help="peers.json of the running peers, or none")
    ap.add_argument("--only", nargs="+", help="only peer rows whose name contains one of these")
    args = ap.parse_args()
    peers = [s for s in _peers(args.peers) if not args.only or any(o in s.name for o in args.only)]
    with tempfile.TemporaryDirectory(prefix="zdmq-consume-") as tmp:
        cluster = LocalCluster.ephemeral(
            Path(tmp), nodes=args.nodes, replication=args.replication
        ).start()
        name = f"zdmq {args.nodes} nodes r{args.replication}"
        rows: list[tuple[str, LocalCluster | SystemSpec, str]] = [
            (name, cluster, t) for t in args.transports
        ]
        rows += [(s.name, s, "its consumer") for s in peers]
        try:
            print(
                "| rate/s | system | transport | prefetch | delivered | p50 ms | p99 ms | max ms "
                "| push p50 ms | server CPU µs/msg |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|")
            for rate in args.rates:
                for system, target, transport in rows:
                    for prefetch in args.prefetch:
                        r = run(target, rate, prefetch, args.seconds, transport, args.handler)
                        print(
                            f"| {r['rate']:g} | {system} | {transport} | {r['prefetch']} | "
                            f"{r['delivered']}/{r['sent']} | {r['p50']:.1f} | {r['p99']:.1f} | "
                            f"{r['max']:.1f} | {r['push_p50']:.1f} | {r['cpu_us']:.0f} |",
                            flush=True,
                        )
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
