"""Workload (b) on one node, timed and optionally profiled: issue 4's target 2.

    .venv/bin/python loadtest/profile_batch.py [--durability fsync|os|memory]
        [--messages 100000] [--producers 4] [--consumers 4] [--batch 100] [--inflight 4]
        [--runs 3] [--profile] [--mode cpu|wall] [--rate 1000] [--top 40] [--out DIR]

Starts a fresh one-node cluster (`LocalCluster.ephemeral`, in a temporary folder) per
run and runs `zdmq bench`'s workload (b) against it, with its own phase runner
(`zdmq.bench.workloads.run_phase`, the zdmq driver): producers `push_many` batches of
100-byte messages while consumers `receive` batches and `ack` them, every client a
process of its own with `--inflight` batches in flight. Prints msgs/s through (consumed
over the phase's wall time, as the suite does), push/s, recv+ack/s, the node's CPU
(user+system, from /proc) per message through, and the clients' CPU.

With `--profile`, py-spy samples the node during the last run and the script prints its
heaviest functions (see profile_push.py for the modes). The raw collapsed stacks stay
in `--out` for flame graphs.

Runs against whichever zdmq is first on the import path, so `PYTHONPATH=/other/tree`
measures another checkout with the same script (the node and client processes inherit it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_push import _start_spy, _stop_spy, run_and_tabulate, summarize

from zdmq.bench.driver import SystemSpec
from zdmq.bench.workloads import reset_queue, run_phase
from zdmq.local import LocalCluster

DRIVER = "zdmq.bench.zdmq_driver:ZdmqDriver"


def _storage(url: str) -> dict[str, int]:
    """The node's storage counters (commits; rows served from the cache of recent pushes,
    and read back from the database, where the node reports them)."""
    with urllib.request.urlopen(url + "/v1/health", timeout=10) as reply:
        return {k: int(v) for k, v in json.load(reply)["storage"].items()}


def run_once(args: argparse.Namespace, profile: bool, out: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="zdmq-profile-") as tmp:
        cluster = LocalCluster.ephemeral(tmp, nodes=1, durability=args.durability)
        with cluster:
            node = next(iter(cluster.nodes.values()))
            assert node.pid is not None
            spec = SystemSpec(
                name=f"zdmq {args.durability}",
                driver=DRIVER,
                durability=args.durability,
                options={"config": str(cluster.config_path)},
                server_pids=(node.pid,),
            )
            queue = f"profile-batch-{uuid.uuid4().hex[:8]}"
            reset_queue(spec, queue)
            per = args.messages // args.producers
            total = per * args.producers
            url = cluster.config.nodes[0].url
            before = _storage(url)
            io_before = _io(node.pid)
            spy = None
            if profile:
                spy = _start_spy(node.pid, out / "node.raw", args.rate, args.mode)
                time.sleep(0.5)  # py-spy attaches before the phase starts
            try:
                ph = run_phase(
                    spec,
                    queue,
                    [
                        (
                            "produce_batched",
                            args.producers,
                            {"n": per, "size": 100, "batch": args.batch, "inflight": args.inflight},
                        ),
                        (
                            "consume_batched",
                            args.consumers,
                            {
                                "total": total,
                                "batch": args.batch,
                                "inflight": args.inflight,
                                "timeout_s": 300.0,
                            },
                        ),
                    ],
                    timeout_s=300.0,
                )
            finally:
                if spy is not None:
                    _stop_spy(spy)
            after = _storage(url)
            io_after = _io(node.pid)
    prod, cons = ph.role("produce_batched"), ph.role("consume_batched")
    if cons["msgs"] < total:
        raise SystemExit(f"pushed {total} but consumed {cons['msgs']}")
    return {
        "rate": cons["msgs"] / max(ph.wall_s, 1e-9),
        "push": prod["rate"],
        "recv": cons["rate"],
        "srv_us": ph.server_cpu_s / cons["msgs"] * 1e6,
        "cli_s": prod["client_cpu_s"] + cons["client_cpu_s"],
        "srv_s": ph.server_cpu_s,
        "commits": (after["commits"] - before["commits"]) / cons["msgs"] * 100,
        "cached": _share(after, before),
        "reads": (io_after["syscr"] - io_before["syscr"]) / cons["msgs"] * 100,
        "writes": (io_after["syscw"] - io_before["syscw"]) / cons["msgs"] * 100,
    }


def _io(pid: int) -> dict[str, int]:
    """The node's read and write system calls so far (socket sends and receives
    included), from /proc/PID/io."""
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def _share(after: dict[str, int], before: dict[str, int]) -> float:
    """The share of delivered rows served from the node's cache (-1: not reported)."""
    if "rows_cached" not in after:
        return -1.0
    hits = after["rows_cached"] - before["rows_cached"]
    misses = after["rows_read"] - before["rows_read"]
    return hits / max(hits + misses, 1)


def _pct(share: float) -> str:
    return "-" if share < 0 else f"{100 * share:.0f} %"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--durability", choices=("fsync", "os", "memory"), default="fsync")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--inflight", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="py-spy the node in the last run")
    ap.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    ap.add_argument("--mode", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/profile_batch"))
    args = ap.parse_args()
    if not 1_000 <= args.messages <= 2_000_000 or not 1 <= args.runs <= 20:
        raise SystemExit("--messages must be in 1,000..2,000,000 and --runs in 1..20")
    if not (1 <= args.producers <= 16 and 1 <= args.consumers <= 16 and 1 <= args.batch <= 100):
        raise SystemExit("--producers/--consumers in 1..16, --batch in 1..100")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"zdmq from {Path(sys.modules['zdmq'].__file__ or '').parent}")
    print(
        f"durability {args.durability}, {args.producers}+{args.consumers} clients, "
        f"batches of {args.batch}, {args.inflight} in flight each, {args.messages:,} messages"
    )
    print(
        "| run | msgs/s through | push/s | recv+ack/s | node CPU µs/msg | node CPU s "
        "| clients CPU s | commits per 100 msgs | rows from cache "
        "| node reads / writes per 100 msgs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")

    def cells(r: dict[str, float]) -> str:
        return (
            f"{r['rate']:,.0f} | {r['push']:,.0f} | {r['recv']:,.0f} | {r['srv_us']:.1f} "
            f"| {r['srv_s']:.2f} | {r['cli_s']:.2f} | {r['commits']:.1f} | {_pct(r['cached'])} "
            f"| {r['reads']:.1f} / {r['writes']:.1f} |"
        )

    run_and_tabulate(
        args.runs,
        bool(args.profile),
        lambda p: run_once(args, bool(p), args.out),
        cells,
    )
    if args.profile:
        print()
        print(summarize(args.out / "node.raw", args.top, args.mode), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
