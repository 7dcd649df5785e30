"""Moves under load: a node added to a loaded cluster, then removed, while clients push
and receive.

A 4-node local cluster with `replication: 3` (fsync) stores `--preload` messages of
`--size` bytes in one queue (they move with their groups); then, on another queue,
`--pushers` clients push one message at a time and `--receivers` receive and ack, while
a fifth node joins (`add_node`, replicas move to it until the load is even) and, once
the moves are done, leaves again (`remove_node`). Measured per phase (before, grow,
shrink): the moves and their time, the state bytes the new node received (its group
files), push throughput, push latency p50 / p99 / max, and the longest wait of any push
stream for an acknowledgement (a group's cut-over shows there). At the end every
acknowledged push must have been received (nothing lost).

    python -m zdmq.bench.elastic [--preload 20000] [--size 1024] [--out elastic.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zdmq import Client, ZdmqError
from zdmq.local import LocalCluster

__all__ = ["main", "measure"]


@dataclass
class Phase:
    name: str
    started: float = 0.0
    ended: float = 0.0
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    longest_wait_s: float = 0.0
    moves: int = 0

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        took = max(self.ended - self.started, 1e-9)

        def q(p: float) -> float:
            return round(1000 * lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else 0.0

        return {
            "phase": self.name,
            "seconds": round(took, 2),
            "pushes": len(lat),
            "pushes_per_s": round(len(lat) / took, 1),
            "push_p50_ms": q(0.50),
            "push_p99_ms": q(0.99),
            "push_max_ms": round(1000 * lat[-1], 1) if lat else 0.0,
            "failed_pushes": self.failures,
            "longest_wait_s": round(self.longest_wait_s, 3),
            "moves": self.moves,
        }


async def _idle(client: Client, timeout_s: float = 600.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            moves = await client.moves()
            if moves["current"] is None and not moves["pending_steps"] and not moves["leaving"]:
                return moves
        except ZdmqError:
            pass  # the home group electing: asked again
        if time.monotonic() > deadline:
            raise RuntimeError("the moves did not finish")
        await asyncio.sleep(0.2)


async def measure(
    directory: Path, *, preload: int, size: int, pushers: int, receivers: int, settle_s: float
) -> dict[str, Any]:
    cluster = LocalCluster.ephemeral(
        directory, nodes=4, replication=3, durability="fsync", move_bytes_per_s=64 << 20
    )
    cluster.start()
    try:
        address = cluster.joining("n5")
        cluster.start_node("n5")
        body = b"x" * size
        async with Client.from_config(cluster.config_path) as client:
            # The stored messages move with their groups; the live ones flow meanwhile.
            queue, stored = "live", "stored"
            await client.create_queue(queue, visibility_timeout_s=60)
            await client.create_queue(stored)
            preloaded: set[str] = set()
            for i in range(0, preload, 500):
                preloaded.update(await client.push_many(stored, [body] * min(500, preload - i)))
            phase = Phase("before")
            phases = [phase]
            acked: set[str] = set()
            received: list[str] = []
            stop = asyncio.Event()

            async def push_stream() -> None:
                last_ok = time.monotonic()
                while not stop.is_set():
                    p = phase
                    started = time.monotonic()
                    try:
                        acked.add(await client.push(queue, body))
                    except ZdmqError:
                        p.failures += 1
                        continue
                    now = time.monotonic()
                    p.latencies.append(now - started)
                    p.longest_wait_s = max(p.longest_wait_s, now - last_ok)
                    last_ok = now

            async def receive_stream() -> None:
                while not stop.is_set():
                    try:
                        got = await client.receive(queue, max_messages=10, wait_s=1.0)
                        if got:
                            await client.ack(queue, [m.receipt for m in got])
                            received.extend(m.id for m in got)
                    except ZdmqError:
                        await asyncio.sleep(0.1)

            tasks = [asyncio.create_task(push_stream()) for _ in range(pushers)]
            tasks += [asyncio.create_task(receive_stream()) for _ in range(receivers)]
            phase.started = time.monotonic()
            await asyncio.sleep(settle_s)
            phase.ended = time.monotonic()

            for name, change in (
                ("grow", lambda: client.add_node("n5", address)),
                ("shrink", lambda: client.remove_node("n5")),
            ):
                phase = Phase(name, started=time.monotonic())
                phases.append(phase)
                before = (await client.moves())["moves_done"]
                await change()
                moves = await _idle(client)
                phase.ended = time.monotonic()
                phase.moves = moves["moves_done"] - before
                if name == "grow":
                    files = cluster.config.node_data_dir("n5").glob("group-*")
                    grown_bytes = sum(f.stat().st_size for f in files)
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Whatever is left: every acknowledged push must come out.
            while batch := await client.receive(queue, max_messages=100):
                await client.ack(queue, [m.receipt for m in batch])
                received.extend(m.id for m in batch)
            kept: set[str] = set()
            while popped := await client.pop_many(stored, 500):
                kept.update(m.id for m in popped)
        lost = (acked - set(received)) | (preloaded - kept)
        return {
            "preload": preload,
            "size": size,
            "pushers": pushers,
            "receivers": receivers,
            "phases": [p.summary() for p in phases],
            "bytes_to_new_node": grown_bytes,
            "acknowledged": len(acked) + len(preloaded),
            "lost": len(lost),
        }
    finally:
        cluster.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m zdmq.bench.elastic", description=__doc__)
    ap.add_argument("--preload", type=int, default=20_000, help="messages before the moves")
    ap.add_argument("--size", type=int, default=1024, help="message bytes")
    ap.add_argument("--pushers", type=int, default=4)
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--settle-s", type=float, default=5.0, help="seconds of load before")
    ap.add_argument("--out", type=Path, help="write the result as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zdmq-elastic-") as d:
        result = asyncio.run(
            measure(
                Path(d),
                preload=args.preload,
                size=args.size,
                pushers=args.pushers,
                receivers=args.receivers,
                settle_s=args.settle_s,
            )
        )
    for p in result["phases"]:
        print(
            f"{p['phase']:7} {p['seconds']:7.1f}s {p['moves']:2} moves  "
            f"{p['pushes_per_s']:7.1f} push/s  p50 {p['push_p50_ms']} ms  "
            f"p99 {p['push_p99_ms']} ms  max {p['push_max_ms']} ms  "
            f"longest wait {p['longest_wait_s']} s  failed {p['failed_pushes']}"
        )
    mib = result["bytes_to_new_node"] / (1 << 20)
    print(f"state copied to the new node: {mib:.1f} MiB; acknowledged {result['acknowledged']}")
    print(f"lost: {result['lost']}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
