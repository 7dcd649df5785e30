"""Push-to-delivery through `client.consume` on the shipped layout (4 nodes, three copies).

One producer process pushes one message at a time at a fixed rate (each push its own task,
so a slow confirm does not hold the next tick back); one consumer process iterates
`client.consume(queue, prefetch=P)` (with `stream=True` for the stream transport) and
records, for each message,
when it reached the loop body minus when the producer made it (the body carries its send
time, CLOCK_MONOTONIC, shared by the processes of this host). A run kept up when every
message arrived within the run plus 2 s.

    python -m zdmq.bench.consume --rates 200 500 --prefetch 100 1 --transports receive stream

prints a row per rate, transport and prefetch: p50, p99 and max in ms, and the messages
delivered (`receive`: long-polled receives; `stream`: a stream to every node).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import tempfile
import time
from pathlib import Path
from typing import Any

from zdmq import Client
from zdmq.bench.workloads import make_body, percentile, sent_at
from zdmq.local import LocalCluster

_CTX = mp.get_context("spawn")


def _produce(config: str, queue: str, rate: float, n: int, go: Any) -> None:
    async def main() -> None:
        async with Client.from_config(config) as c:
            go.wait()
            t0 = time.monotonic()
            tasks = []
            for i in range(n):
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(c.push(queue, make_body(48, 0, i))))
            await asyncio.gather(*tasks)

    asyncio.run(main())


def _consume(
    config: str, queue: str, prefetch: int, stream: bool, n: int, limit_s: float, out: Any
) -> None:
    async def main() -> list[float]:
        lat: list[float] = []
        async with Client.from_config(config) as c:
            consumer = c.consume(queue, prefetch=prefetch, stream=stream)
            out.put("ready")
            try:
                async with asyncio.timeout(limit_s):
                    async for msg in consumer:
                        lat.append((time.monotonic() - sent_at(msg.body)) * 1e3)
                        if len(lat) >= n:
                            consumer.stop()
            except TimeoutError:
                pass
        return lat

    out.put(asyncio.run(main()))


def run(
    cluster: LocalCluster, rate: float, prefetch: int, seconds: float, transport: str = "receive"
) -> dict[str, Any]:
    n = int(rate * seconds)
    queue = f"lat-{int(rate)}-{prefetch}-{time.monotonic_ns()}"

    async def create() -> None:
        async with Client.from_config(cluster.config_path) as c:
            await c.create_queue(queue)

    asyncio.run(create())
    out = _CTX.Queue()
    go = _CTX.Event()
    config = str(cluster.config_path)
    stream = transport == "stream"
    consumer = _CTX.Process(
        target=_consume, args=(config, queue, prefetch, stream, n, seconds + 10, out)
    )
    producer = _CTX.Process(target=_produce, args=(config, queue, rate, n, go))
    consumer.start()
    producer.start()
    assert out.get(timeout=60) == "ready"
    time.sleep(1.0)  # the consumer's first receive is waiting
    go.set()
    lat: list[float] = sorted(out.get(timeout=seconds + 60))
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
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[200.0, 500.0])
    ap.add_argument("--prefetch", type=int, nargs="+", default=[100, 1])
    ap.add_argument("--transports", nargs="+", choices=["receive", "stream"], default=["stream"])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--replication", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zdmq-consume-") as tmp:
        cluster = LocalCluster.ephemeral(
            Path(tmp), nodes=args.nodes, replication=args.replication
        ).start()
        try:
            print("| rate/s | transport | prefetch | delivered | p50 ms | p99 ms | max ms |")
            print("|---|---|---|---|---|---|---|")
            for rate in args.rates:
                for transport in args.transports:
                    for prefetch in args.prefetch:
                        r = run(cluster, rate, prefetch, args.seconds, transport)
                        print(
                            f"| {r['rate']:g} | {transport} | {r['prefetch']} | "
                            f"{r['delivered']}/{r['sent']} | {r['p50']:.1f} | {r['p99']:.1f} | "
                            f"{r['max']:.1f} |",
                            flush=True,
                        )
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
