"""`zdmq bench`: the benchmark workloads on zdmq and, when they run, on its peers.

    zdmq bench                       # the shipped layout: 4 nodes, three copies, fsync;
                                     # every workload but scale
    zdmq bench --nodes 1 4 --replication 1 --durability fsync os --runs 3   # one copy
    zdmq bench --nodes 1 4                                    # 1 node; 4 nodes, three copies
    zdmq bench --peers /tmp/zdmq-peers/peers.json   # + every peer loadtest/peers started
    zdmq bench --config cluster.yaml     # a cluster that is already running
    zdmq bench --workloads scale         # zdmq alone: depth, queue count, node count, idle

Each run goes through every system and workload in turn; with `--runs 3` the table
shows medians and the JSON keeps every sample. A peer that is not running is named and
skipped, never fatal.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from zdmq.bench.driver import SystemSpec
from zdmq.bench.report import format_tables, medians, ratio_rows
from zdmq.bench.suite import WORKLOADS, Knobs, Row

__all__ = ["main", "peer_systems", "zdmq_systems"]

ZDMQ_DRIVER = "zdmq.bench.zdmq_driver:ZdmqDriver"
# Every workload, by what it measures. The first four run on every system; `floor` and
# `scale` run once per run, on no peer.
ABOUT = {
    "sequential": "one call at a time: pushes that each wait for their confirm, then "
    "receive+ack (1 and 4 clients)",
    "throughput": "4 producers and 4 consumers at once, batches of 100, 4 in flight each",
    "latency": "push-to-delivery p50 and p99 at 1,000 messages/s",
    "sizes": "100 B, 10 KiB and 1 MiB messages: one at a time, and 1+1 batched",
    "floor": "this machine without zdmq: one fsynced SQLite commit, a bare HTTP round trip, "
    "both together",
    "scale": "zdmq alone: queue depth up to 1M, up to 10k queues, 1 to 8 nodes, idle cost, "
    "memory (about 10 min)",
}
PER_SYSTEM = tuple(WORKLOADS)
DEFAULT_WORKLOADS = (*PER_SYSTEM, "floor")
PREFETCH = 100  # the consumer rows' prefetch (client.consume's default)


@contextlib.contextmanager
def zdmq_systems(
    nodes: list[int], durabilities: list[str], replication: int | list[int] = 1
) -> Iterator[list[SystemSpec]]:
    """Starts one local cluster per (nodes, durability, replication) and yields a spec
    for each; a replicated one is named with its copies (`zdmq 4 nodes fsync r3`), and
    compared with the replicated peers (report.py)."""
    from zdmq.local import LocalCluster

    replications = [replication] if isinstance(replication, int) else replication
    with contextlib.ExitStack() as stack:
        specs = []
        for n, durability, r in itertools.product(nodes, durabilities, replications):
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="zdmq-bench-"))
            cluster = stack.enter_context(
                LocalCluster.ephemeral(tmp, nodes=n, durability=durability, replication=r)
            )
            cluster.start()
            pids = tuple(p.pid for p in cluster.nodes.values() if p.pid is not None)
            name = "zdmq" if n == 1 else f"zdmq {n} nodes"
            copies = f" r{r}" if r > 1 else ""
            specs.append(
                SystemSpec(
                    name=f"{name} {durability}{copies}",
                    driver=ZDMQ_DRIVER,
                    durability=durability,
                    options={"config": str(cluster.config_path)},
                    server_pids=pids,
                    note=(
                        f"{n} node{'s' if n > 1 else ''}, durability: {durability}, "
                        f"replication: {r}"
                    ),
                )
            )
            specs.append(
                SystemSpec(
                    name=f"{name} {durability}{copies} consumer",
                    driver=ZDMQ_DRIVER,
                    durability=durability,
                    options={"config": str(cluster.config_path), "prefetch": PREFETCH},
                    server_pids=pids,
                    note=(
                        f"the same cluster through client.consume: prefetch {PREFETCH} over "
                        "streams, acks batched in the background and all committed before "
                        "the phase ends (as RabbitMQ's consumer: prefetch, acks not awaited)"
                    ),
                    workloads=("sequential",),
                )
            )
        yield specs


def peer_systems(peers_json: Path) -> tuple[list[SystemSpec], list[str]]:
    """The peers `loadtest/peers/peers.sh start` wrote down, and a line per problem."""
    if not peers_json.exists():
        return [], [f"no peers: {peers_json} does not exist (run loadtest/peers/peers.sh start)"]
    folder = str(peers_json.parent.resolve())
    here = Path(__file__).resolve().parents[2] / "loadtest" / "peers"
    for p in (str(here), folder):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        peer_drivers = importlib.import_module("peer_drivers")
    except ImportError as e:
        return [], [f"no peers: cannot import loadtest/peers/peer_drivers ({e})"]
    specs: list[SystemSpec] = peer_drivers.peer_specs(peers_json)
    alive = []
    notes = []
    for s in specs:
        if all(_alive(pid) for pid in s.server_pids):
            alive.append(s)
        else:
            notes.append(f"skipped {s.name}: its server is not running")
    return alive, notes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def machine() -> dict[str, Any]:
    import sqlite3

    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
    }


def run(
    systems: list[SystemSpec],
    workloads: list[str],
    knobs: Knobs,
    runs: int,
    *,
    durabilities: tuple[str, ...] = ("fsync",),
    log: Any = print,
    after_run: Any = None,
) -> list[Row]:
    """Every system through every workload, `runs` times, then the workloads that run
    once (floor, per durability; scale); medians per row. `after_run` gets the medians
    so far after each run (a long run keeps what it measured)."""
    all_runs: list[list[Row]] = []
    for i in range(runs):
        rows: list[Row] = []
        for spec in systems:
            for w in workloads:
                if w not in WORKLOADS or (spec.workloads is not None and w not in spec.workloads):
                    continue
                rows += _timed(
                    f"run {i + 1}/{runs}: {spec.name} ({w})", log, WORKLOADS[w], spec, knobs
                )
        if "floor" in workloads:
            from zdmq.bench.floor import workload_floor

            for d in durabilities:
                rows += _timed(f"run {i + 1}/{runs}: floor {d}", log, workload_floor, knobs, d)
        if "scale" in workloads:
            from zdmq.bench.scale import ScaleKnobs, workload_scale

            scale = ScaleKnobs.quick() if knobs == Knobs.quick() else ScaleKnobs()
            rows += _timed(f"run {i + 1}/{runs}: scale", log, workload_scale, scale)
        all_runs.append(rows)
        if after_run is not None:
            after_run(medians(all_runs))
    return medians(all_runs)


def _timed(label: str, log: Any, fn: Any, *args: Any) -> list[Row]:
    """One workload's rows; a failure is logged and gives none (one broken system must
    not sink the others)."""
    t0 = time.monotonic()
    try:
        got: list[Row] = fn(*args)
    except Exception as e:
        log(f"{label}: FAILED: {e}")
        return []
    log(f"{label} {time.monotonic() - t0:.1f}s")
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="zdmq bench",
        description=__doc__.split("\n")[0],
        epilog="workloads:\n" + "\n".join(f"  {name:<11} {about}" for name, about in ABOUT.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--workloads",
        nargs="+",
        default=list(DEFAULT_WORKLOADS),
        metavar="NAME",
        help=f"workloads to run, or 'all' (default: {' '.join(DEFAULT_WORKLOADS)})",
    )
    ap.add_argument("--runs", type=int, default=1, help="runs; tables show medians")
    ap.add_argument(
        "--nodes",
        type=int,
        nargs="+",
        default=[4],
        help="cluster sizes to start (default: 4, as the shipped cluster.yaml)",
    )
    ap.add_argument("--durability", nargs="+", default=["fsync"], choices=["fsync", "os"])
    ap.add_argument(
        "--replication",
        type=int,
        nargs="+",
        help="copies of each message; several values start one cluster each (e.g. 1 3; "
        "default: 3 on 3 nodes or more, as the shipped cluster.yaml, else 1)",
    )
    ap.add_argument("--config", help="bench this running cluster instead of starting one")
    ap.add_argument(
        "--peers",
        type=Path,
        help="peers.json from loadtest/peers/peers.sh start (default: $PEERS_DIR or "
        "/tmp/zdmq-peers, if it exists); --peers none for zdmq alone",
    )
    ap.add_argument("--only", nargs="+", help="only systems whose name contains one of these")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--seq-n", type=int, help="sequential: messages per client")
    ap.add_argument("--seq-clients", type=int, nargs="+", help="sequential: client counts")
    ap.add_argument("--messages", type=int, help="throughput: messages in all")
    ap.add_argument("--latency-rate", type=float, help="latency: messages per second")
    ap.add_argument("--latency-seconds", type=float, help="latency: seconds")
    ap.add_argument("--sizes", type=int, nargs="+", help="sizes: message sizes in bytes")
    ap.add_argument("--floor-n", type=int, help="floor: calls per row")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results"), help="JSON folder")
    args = ap.parse_args(argv)

    workloads = list(ABOUT) if args.workloads == ["all"] else args.workloads
    bad = [w for w in workloads if w not in ABOUT]
    if bad:
        ap.error(f"unknown workloads {', '.join(bad)}: choose from {', '.join(ABOUT)} or all")
    knobs = Knobs.quick() if args.quick else Knobs()
    changes = {
        "seq_n": args.seq_n,
        "seq_clients": tuple(args.seq_clients) if args.seq_clients else None,
        "messages": args.messages,
        "latency_rate": args.latency_rate,
        "latency_seconds": args.latency_seconds,
        "sizes": tuple(args.sizes) if args.sizes else None,
        "floor_n": args.floor_n,
    }
    knobs = replace(knobs, **{k: v for k, v in changes.items() if v is not None})

    with contextlib.ExitStack() as stack:
        if args.config:
            systems = [
                SystemSpec(
                    name="zdmq",
                    driver=ZDMQ_DRIVER,
                    durability=_config_durability(args.config),
                    options={"config": args.config},
                    note=f"running cluster from {args.config} (server CPU not measured)",
                )
            ]
        else:
            print(f"bench: starting zdmq clusters: nodes {args.nodes}, {args.durability}")
            if args.replication is not None:
                systems = stack.enter_context(
                    zdmq_systems(args.nodes, args.durability, args.replication)
                )
            else:  # the shipped layout's three copies where the nodes allow
                systems = []
                for n in args.nodes:
                    copies = 3 if n >= 3 else 1
                    systems += stack.enter_context(zdmq_systems([n], args.durability, copies))
        peers_json = args.peers
        if peers_json is None:
            default = Path(os.environ.get("PEERS_DIR", "/tmp/zdmq-peers")) / "peers.json"
            peers_json = default if default.exists() else None
        if peers_json is not None and str(peers_json) != "none":
            peers, notes = peer_systems(peers_json)
            for n in notes:
                print(f"bench: {n}")
            systems += peers
        else:
            print("bench: no peers (start them with loadtest/peers/peers.sh start)")
        if args.only:
            systems = [s for s in systems if any(o in s.name for o in args.only)]
        print("bench: systems: " + ", ".join(s.name for s in systems))
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        path = args.out / f"bench-{stamp}.json"
        argv_used = ["zdmq", "bench", *(argv if argv is not None else sys.argv[2:])]

        def save(rows: list[Row]) -> None:
            doc = {
                "machine": machine(),
                "argv": argv_used,
                "knobs": knobs.__dict__,
                "systems": [
                    {"name": s.name, "durability": s.durability, "note": s.note} for s in systems
                ],
                "rows": rows,
                "ratios": ratio_rows(rows),
            }
            path.write_text(json.dumps(doc, indent=1, default=str))

        rows = run(
            systems,
            workloads,
            knobs,
            args.runs,
            durabilities=tuple(args.durability),
            after_run=save,
        )

    print()
    print(format_tables(rows))
    print(f"\nbench: wrote {path}")
    return 0


def _config_durability(path: str) -> str:
    from zdmq.config import ClusterConfig

    return ClusterConfig.load(path).durability
