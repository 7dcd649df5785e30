"""A/B of one-at-a-time pushes between two zdmq source trees, interleaved block by block.

    .venv/bin/python loadtest/push_ab.py --a /tmp/ab/base --b . [--durability fsync]
        [--clients shared|own] [--blocks 30] [--block 200] [--warmup 1500]

Starts two one-node clusters (`LocalCluster.ephemeral`), node A running the zdmq source
tree `--a` and node B the tree `--b` (each started with PYTHONPATH set to its tree), and
pushes 100-byte bodies one at a time with `Client.push`, each waiting for its reply, in
blocks that alternate A, B, A, B... Both sides live through the same minutes of a shared
machine, so load that comes and goes hits both alike; runs made one after the other
(`profile_push.py` on each tree in turn) do not have that.

- `--clients shared` (the default): one client in this process, the zdmq first on the
  import path, pushes to both nodes: node-side changes only.
- `--clients own`: each side's pushes come from a client process of its own tree (the
  whole stack, client and node, of A against that of B); it also reports client CPU.

Prints, per side: pushes/s (1 / mean latency, as `zdmq bench` counts it), p50 and p99
latency, the node's user+system CPU per push (from /proc, over all blocks) and, with own
clients, the client's; then the per-block differences B - A of p50 and mean latency
(median, range, and in how many blocks B was lower). `--warmup` pushes go to each node
first, untimed (1,500: past the first WAL checkpoint, so both nodes are in their steady
state; 0 to measure nodes fresh from their start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zdmq.bench.workloads import cpu_seconds, percentile
from zdmq.client import Client
from zdmq.local import LocalCluster

QUEUE = "push-ab"

# A client process of one tree: pushes `n` on each line "n" it reads, answers with one
# JSON line (the latencies and its own CPU seconds), stops on "q".
_CLIENT = """
import asyncio, json, sys, time
from zdmq.bench.workloads import run_uvloop
from zdmq.client import Client

BODY = b"x" * 100

async def main(config):
    async with Client.from_config(config) as c:
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line or line.strip() == "q":
                return
            n = int(line)
            lat = []
            c0 = time.process_time()
            for _ in range(n):
                t = time.perf_counter()
                await c.push(sys.argv[2], BODY)
                lat.append(time.perf_counter() - t)
            print(json.dumps({"lat": lat, "cpu": time.process_time() - c0}), flush=True)

run_uvloop(main(sys.argv[1]))
"""


def _start(tree: Path, directory: str, durability: str) -> LocalCluster:
    """A one-node cluster whose node imports zdmq from `tree`."""
    cluster = LocalCluster.ephemeral(directory, nodes=1, replication=1, durability=durability)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)  # the node process inherits this environment
    try:
        cluster.start()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    return cluster


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _Pusher:
    """Runs blocks of pushes against one node: in this process, or in a client process
    of the side's own tree."""

    def __init__(self, config: Path, tree: Path | None) -> None:
        self.config = config
        self.proc: subprocess.Popen[str] | None = None
        self.client: Client | None = None
        self.loop = _new_loop()
        self.client = Client.from_config(config)
        self.loop.run_until_complete(self.client.open())
        self.loop.run_until_complete(self.client.create_queue(QUEUE))
        if tree is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CLIENT, str(config), QUEUE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(tree)},
            )

    def block(self, n: int) -> tuple[list[float], float]:
        """n pushes, one at a time: their latencies and the client's CPU seconds."""
        if self.proc is not None:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(f"{n}\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the client process ended")
            got = json.loads(line)
            return got["lat"], got["cpu"]
        return self.loop.run_until_complete(self._block(n))

    async def _block(self, n: int) -> tuple[list[float], float]:
        assert self.client is not None
        body = b"x" * 100
        lat = []
        c0 = time.process_time()
        for _ in range(n):
            t = time.perf_counter()
            await self.client.push(QUEUE, body)
            lat.append(time.perf_counter() - t)
        return lat, time.process_time() - c0

    def close(self) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("q\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.client is not None:
            self.loop.run_until_complete(self.client.close())
        self.loop.close()


def _run(args: argparse.Namespace, pushers: list[_Pusher], pids: list[int]) -> list[Any]:
    sides: list[dict[str, list[float]]] = [
        {"lat": [], "cpu": [], "cli": [], "block_p50": [], "block_mean": []} for _ in pushers
    ]
    for p in pushers:
        if args.warmup:
            p.block(args.warmup)
    for _ in range(args.blocks):
        for side, p, pid in zip(sides, pushers, pids, strict=True):
            cpu0 = cpu_seconds([pid])
            lat, cli = p.block(args.block)
            side["cpu"].append((cpu_seconds([pid]) - cpu0) / len(lat))
            side["cli"].append(cli / len(lat))
            side["lat"] += lat
            side["block_p50"].append(statistics.median(lat))
            side["block_mean"].append(statistics.fmean(lat))
    return sides


def _diff(name: str, a: list[float], b: list[float], scale: float, unit: str) -> str:
    d = sorted((y - x) * scale for x, y in zip(a, b, strict=True))
    return (
        f"| {name} | {statistics.median(d):+.1f} {unit} | {d[0]:+.1f} .. {d[-1]:+.1f} | "
        f"{sum(x < 0 for x in d)} of {len(d)} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="source tree of side A (the base)")
    ap.add_argument("--b", type=Path, required=True, help="source tree of side B")
    ap.add_argument("--durability", choices=("fsync", "os", "memory"), default="fsync")
    ap.add_argument("--clients", choices=("shared", "own"), default="shared")
    ap.add_argument("--blocks", type=int, default=30, help="blocks per side")
    ap.add_argument("--block", type=int, default=200, help="pushes per block")
    ap.add_argument("--warmup", type=int, default=1500, help="untimed pushes per node first")
    args = ap.parse_args()
    if not 1 <= args.blocks <= 1000 or not 1 <= args.block <= 10_000 or args.warmup < 0:
        raise SystemExit("--blocks must be in 1..1000, --block in 1..10,000, --warmup >= 0")
    trees = [args.a.resolve(), args.b.resolve()]
    for t in trees:
        if not (t / "zdmq" / "server" / "__main__.py").exists():
            raise SystemExit(f"{t} is not a zdmq source tree")
    with tempfile.TemporaryDirectory(prefix="zdmq-push-ab-") as tmp:
        clusters = [
            _start(t, os.path.join(tmp, side), args.durability)
            for side, t in zip("ab", trees, strict=True)
        ]
        pushers: list[_Pusher] = []
        try:
            pids = [next(iter(c.nodes.values())).pid or 0 for c in clusters]
            for c, t in zip(clusters, trees, strict=True):
                pushers.append(_Pusher(c.config_path, t if args.clients == "own" else None))
            sides = _run(args, pushers, pids)
        finally:
            for p in pushers:
                p.close()
            for c in clusters:
                c.close()
    n = args.blocks * args.block
    print(
        f"durability {args.durability}; {args.blocks} blocks of {args.block} pushes per side; "
        f"clients {args.clients}"
    )
    print("| side | tree | push/s | p50 ms | p99 ms | node CPU µs/push | client CPU µs/push |")
    print("|---|---|---|---|---|---|---|")
    for name, t, s in zip("AB", trees, sides, strict=True):
        lat = sorted(s["lat"])
        cli = f"{statistics.fmean(s['cli']) * 1e6:.0f}" if args.clients == "own" else "-"
        print(
            f"| {name} | {t} | {n / sum(lat):,.0f} | {percentile(lat, 0.5) * 1e3:.3f} | "
            f"{percentile(lat, 0.99) * 1e3:.3f} | {statistics.fmean(s['cpu']) * 1e6:.0f} "
            f"| {cli} |"
        )
    a, b = sides
    print("\n| per block, B - A | median | range | blocks where B is lower |")
    print("|---|---|---|---|")
    print(_diff("p50", a["block_p50"], b["block_p50"], 1e6, "µs"))
    print(_diff("mean", a["block_mean"], b["block_mean"], 1e6, "µs"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
