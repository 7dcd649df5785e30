"""Moves under load: a 4-node cluster grown to 6 nodes and shrunk back to 4 while
producers and consumers run.

A local cluster with `replication: 3` (fsync) stores `--preload` messages of `--size`
bytes in one queue (they move with their groups). Then, on another queue, `--producers`
push batches of 100 and `--consumers` receive and ack batches of 100 (the throughput
workload, one batch in flight each), and one probe per replica group pushes one message
at a time into that group (dedup ids chosen so the message lands there). The phases:
`before` (4 nodes, `--steady-s`), `grow` (n5 and n6 added; until the moves are done),
`after` (6 nodes, `--steady-s`), `shrink` (n5 and n6 removed; until done). Per phase:
msgs/s pushed and through (acked), push-batch latency p50 / p99; per group, its longest
wait for an acknowledged probe push during the moves (a group's cut-over: its leader
handed over, a member added or removed), as p50 / p99 / max over the groups; the moves,
the state bytes pulled as snapshots and their rate against the throttle. At the end every
acknowledged message must come out (nothing lost).

The cluster compacts its Raft logs early (`replication_log_entries: 200`), so a new
member is caught up by a snapshot as in a cluster that has run for a while, not by the
whole log.

    python -m zdmq.bench.elastic [--preload 50000] [--size 1024] [--out elastic.json]
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
from zdmq.cli_status import moves_active
from zdmq.cluster_map import initial_map
from zdmq.hashing import Placement
from zdmq.local import LocalCluster
from zdmq.models import dedup_message_id

__all__ = ["main", "measure"]

BATCH = 100
THROTTLE = 64 << 20


@dataclass
class Phase:
    name: str
    started: float = 0.0
    ended: float = 0.0
    pushed: int = 0
    through: int = 0
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    moves: list[dict[str, Any]] = field(default_factory=list)
    #: per group: its longest wait for an acknowledged probe push in this phase
    pauses: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        took = max(self.ended - self.started, 1e-9)
        pulled = sum(int(m.get("bytes") or 0) for m in self.moves)
        pulling_s = sum(
            float(m["elapsed_s"]) for m in self.moves if int(m.get("snapshot_size") or 0)
        )
        pauses = sorted(self.pauses.values())
        return {
            "phase": self.name,
            "seconds": round(took, 2),
            "pushed_per_s": round(self.pushed / took, 1),
            "through_per_s": round(self.through / took, 1),
            "push_batch_p50_ms": _ms(self.latencies, 0.50),
            "push_batch_p99_ms": _ms(self.latencies, 0.99),
            "failed_calls": self.failures,
            "moves": len(self.moves),
            "snapshot_mib": round(pulled / (1 << 20), 1),
            "moves_mib_per_s": round(pulled / (1 << 20) / pulling_s, 1) if pulling_s else 0.0,
            "pause_p50_s": _rank(pauses, 0.50),
            "pause_p99_s": _rank(pauses, 0.99),
            "pause_max_s": round(pauses[-1], 3) if pauses else 0.0,
        }


def _rank(values: list[float], q: float) -> float:
    return round(values[min(len(values) - 1, int(q * len(values)))], 3) if values else 0.0


def _ms(values: list[float], q: float) -> float:
    return round(1000 * _rank(sorted(values), q), 1)


async def _idle(client: Client, timeout_s: float = 900.0) -> None:
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < 2:  # idle twice in a row: a change not yet planned is not done
        try:
            m = await client.moves()
            idle = not moves_active(m)
            quiet = quiet + 1 if idle else 0
        except ZdmqError:
            quiet = 0  # the home group electing: asked again
        if time.monotonic() > deadline:
            raise RuntimeError("the moves did not finish")
        await asyncio.sleep(0.2)


def _probe_ids(cluster: LocalCluster, queue: str, per_group: int) -> dict[str, list[str]]:
    """Dedup ids whose messages land in each group."""
    cfg = cluster.config
    groups = initial_map(cfg).groups
    placement = Placement(groups, cfg.partitions, cfg.replication)
    out: dict[str, list[str]] = {g: [] for g in groups}
    i = 0
    while any(len(v) < per_group for v in out.values()):
        d = f"probe-{i}"
        owner = placement.owner(dedup_message_id(queue, d))
        if len(out[owner]) < per_group:
            out[owner].append(d)
        i += 1
    return out


async def measure(
    directory: Path,
    *,
    preload: int,
    size: int,
    producers: int,
    consumers: int,
    steady_s: float,
) -> dict[str, Any]:
    cluster = LocalCluster.ephemeral(
        directory,
        nodes=4,
        replication=3,
        durability="fsync",
        move_bytes_per_s=THROTTLE,
        replication_log_entries=200,
    )
    cluster.start()
    try:
        addresses = {n: cluster.joining(n) for n in ("n5", "n6")}
        for n in addresses:
            cluster.start_node(n)
        body = b"x" * size
        queue, stored, probes = "live", "stored", "probe"
        probe_ids = _probe_ids(cluster, probes, 20_000)
        async with Client.from_config(cluster.config_path) as client:
            for q in (queue, stored, probes):
                await client.create_queue(q, visibility_timeout_s=60)
            preloaded: set[str] = set()
            for i in range(0, preload, 500):
                preloaded.update(await client.push_many(stored, [body] * min(500, preload - i)))
            phase = Phase("before")
            phases = [phase]
            acked: set[str] = set()
            received: set[str] = set()
            probed: set[str] = set()
            stop = asyncio.Event()

            async def produce() -> None:
                while not stop.is_set():
                    p, started = phase, time.monotonic()
                    try:
                        ids = await client.push_many(queue, [body] * BATCH)
                    except ZdmqError:
                        p.failures += 1
                        continue
                    p.latencies.append(time.monotonic() - started)
                    p.pushed += len(ids)
                    acked.update(ids)

            async def consume() -> None:
                while not stop.is_set():
                    try:
                        got = await client.receive(queue, max_messages=BATCH, wait_s=0.5)
                        if got:
                            await client.ack(queue, [m.receipt for m in got])
                            received.update(m.id for m in got)
                            phase.through += len(got)
                    except ZdmqError:
                        phase.failures += 1
                        await asyncio.sleep(0.05)

            async def probe(group: str, ids: list[str]) -> None:
                last_ok = time.monotonic()
                for d in ids:
                    if stop.is_set():
                        return
                    p = phase
                    try:
                        probed.add(await client.push(probes, b"p", dedup_id=d))
                    except ZdmqError:
                        continue
                    now = time.monotonic()
                    p.pauses[group] = max(p.pauses.get(group, 0.0), now - last_ok)
                    last_ok = now

            tasks = [asyncio.create_task(produce()) for _ in range(producers)]
            tasks += [asyncio.create_task(consume()) for _ in range(consumers)]
            tasks += [asyncio.create_task(probe(g, ids)) for g, ids in probe_ids.items()]
            phase.started = time.monotonic()
            await asyncio.sleep(steady_s)
            phase.ended = time.monotonic()

            async def grow() -> None:
                for n, a in addresses.items():
                    await client.add_node(n, a)

            async def shrink() -> None:
                for n in addresses:
                    await client.remove_node(n)

            async def steady() -> None:
                await asyncio.sleep(steady_s)

            for name, change in (("grow", grow), ("after", steady), ("shrink", shrink)):
                phase = Phase(name, started=time.monotonic())
                phases.append(phase)
                before = await client.moves()
                await change()
                if name != "after":
                    await _idle(client)
                moves = await client.moves()
                done = moves["moves_done"] - before["moves_done"]
                phase.moves = moves["done"][-done:] if done > 0 else []
                phase.ended = time.monotonic()
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Whatever is left: every acknowledged push must come out.
            while batch := await client.receive(queue, max_messages=BATCH):
                await client.ack(queue, [m.receipt for m in batch])
                received.update(m.id for m in batch)
            kept: set[str] = set()
            for q, into in ((stored, kept), (probes, kept)):
                while popped := await client.pop_many(q, 500):
                    into.update(m.id for m in popped)
        lost = (acked - received) | ((preloaded | probed) - kept)
        return {
            "preload": preload,
            "size": size,
            "producers": producers,
            "consumers": consumers,
            "throttle_mib_per_s": THROTTLE >> 20,
            "phases": [p.summary() for p in phases],
            "acknowledged": len(acked) + len(preloaded) + len(probed),
            "lost": len(lost),
        }
    finally:
        cluster.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m zdmq.bench.elastic", description=__doc__)
    ap.add_argument("--preload", type=int, default=50_000, help="messages stored before")
    ap.add_argument("--size", type=int, default=1024, help="message bytes")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--steady-s", type=float, default=10.0, help="seconds before and after")
    ap.add_argument("--out", type=Path, help="write the result as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zdmq-elastic-") as d:
        result = asyncio.run(
            measure(
                Path(d),
                preload=args.preload,
                size=args.size,
                producers=args.producers,
                consumers=args.consumers,
                steady_s=args.steady_s,
            )
        )
    for p in result["phases"]:
        print(
            f"{p['phase']:7} {p['seconds']:6.1f}s  pushed {p['pushed_per_s']:8.1f}/s  "
            f"through {p['through_per_s']:8.1f}/s  batch p50 {p['push_batch_p50_ms']} ms "
            f"p99 {p['push_batch_p99_ms']} ms  failed {p['failed_calls']}  "
            f"moves {p['moves']}  {p['snapshot_mib']} MiB at {p['moves_mib_per_s']} MiB/s  "
            f"pause p50 {p['pause_p50_s']} s p99 {p['pause_p99_s']} s max {p['pause_max_s']} s"
        )
    print(f"acknowledged {result['acknowledged']}, lost {result['lost']}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
