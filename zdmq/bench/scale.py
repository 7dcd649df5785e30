"""The `scale` workload: does an operation cost the same at any depth, queue count and
cluster size? What does a node hold in memory, and what does an idle cluster cost?

    zdmq bench --workloads scale        or        python -m zdmq.bench.scale [--quick]

    depth    one 1-node cluster, one queue filled step by step to each depth (0, 10k,
             100k, 1M messages of 100 B, pushed in batches of 1000 by several clients
             at once); at each depth: the node's RSS, seq push and seq receive+ack
             (one client, one at a time: rate, p99) and 1+1 batched throughput. The
             consumers take as many as the phase pushed, the oldest first, so the
             depth stays where the prefill put it.
    queues   1, 100, 1,000, 10,000 queues created (concurrently) on a 1-node and a
             4-node cluster; one client process with 32 calls in flight pushes, then
             receives + acks, one message per call, round robin over the queues; the
             nodes' RSS after creating them. Measured twice: with the queues empty
             before the phase, then with 16 messages held in each (see
             `queue_count_rows` for why).
    nodes    1, 2, 4, 8 node clusters: the sequential workload with 1 client (seq push,
             seq receive+ack) and the throughput workload (4+4 batched), as `suite`
             runs them.
    idle     a fresh 4-node cluster holding 1, then 10,000 queues of 4 messages each
             (so most nodes hold a UUID queue of most of them), left alone: the CPU
             its nodes use while no client calls.

Rows have the suite's shape (system, durability, workload "scale", variant) and these
metrics, where present:
    push_rate, push_p99_ms, push_cpu_us      one-at-a-time pushes
    recv_rate, recv_p99_ms, recv_cpu_us      one-at-a-time receive + ack
    rate                                     batched msgs/s through (depth, nodes)
    cpu_us                                   server CPU µs per message of the row's
                                             throughput phase: the batched one for depth
                                             and nodes; push + receive+ack together
                                             (a message's whole life) for queues
    rss_mb                                   the largest node's VmRSS (MiB) after the
                                             prefill (depth), after creating and filling
                                             the queues (queues), after the workloads
                                             (nodes), at the end of the idle window (idle)
    rss_idle_mb                              the same node's VmRSS when it had just started
    idle_core_pct                            idle: CPU (user + system) of all the nodes
                                             over the idle window, as % of one core
`zdmq bench` calls `workload_scale(ScaleKnobs())` once per run, on zdmq alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from zdmq.bench.driver import SystemSpec
from zdmq.bench.report import format_tables, medians
from zdmq.bench.suite import Knobs, Row, workload_sequential, workload_throughput
from zdmq.bench.workloads import (
    cpu_seconds,
    make_body,
    percentile,
    reset_queue,
    run_phase,
    run_uvloop,
)
from zdmq.client import Client

__all__ = [
    "ScaleKnobs",
    "depth_rows",
    "idle_rows",
    "main",
    "memory_summary",
    "node_count_rows",
    "queue_count_rows",
    "rss_mb",
    "workload_scale",
]


@dataclass(frozen=True)
class ScaleKnobs:
    """Sizes of the scale workload; `quick()` is for smoke runs and tests."""

    depths: tuple[int, ...] = (0, 10_000, 100_000, 1_000_000)
    queue_counts: tuple[int, ...] = (1, 100, 1_000, 10_000)
    queue_nodes: tuple[int, ...] = (1, 4)  # cluster sizes the queue counts run on
    node_counts: tuple[int, ...] = (1, 2, 4, 8)
    durability: str = "fsync"
    replication: int = 1
    size: int = 100
    seq_n: int = 5_000  # one-at-a-time pushes (and receive+acks) per measurement
    batched_n: int = 20_000  # depth: messages through the 1+1 batched phase
    batch: int = 100
    inflight: int = 4  # batches in flight per batched client
    prefill_batch: int = 1_000
    prefill_clients: int = 2
    prefill_inflight: int = 4
    queue_msgs: int = 20_000  # queues: pushes, then receive+acks, over all queues
    queue_inflight: int = 32
    # queues: messages kept in every queue while measuring; 0 = the queues start empty
    queue_resident: tuple[int, ...] = (0, 16)
    nodes_b_messages: int = 50_000  # nodes: the throughput workload, messages in all
    idle_queues: tuple[int, ...] = (1, 10_000)  # idle: queue counts; () skips the part
    idle_nodes: int = 4
    idle_per_queue: int = 4  # idle: messages pushed into each queue before the window
    idle_settle_s: float = 6.0  # idle: wait after the pushes, before the window
    idle_s: float = 10.0  # idle: seconds measured

    @classmethod
    def quick(cls) -> ScaleKnobs:
        return cls(
            depths=(0, 2_000),
            queue_counts=(1, 20),
            queue_nodes=(1,),
            node_counts=(2,),
            seq_n=100,
            batched_n=1_000,
            batch=50,
            inflight=2,
            prefill_batch=500,
            queue_msgs=400,
            queue_resident=(0, 4),
            queue_inflight=8,
            nodes_b_messages=1_000,
            idle_queues=(1, 20),
            idle_settle_s=0.5,
            idle_s=1.0,
        )


# ---- measuring ----------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    """The process's resident set (VmRSS) in MiB; nan if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return float("nan")


def _max_rss(spec: SystemSpec) -> float:
    return max(rss_mb(p) for p in spec.server_pids)


def _cpu_us(cpu_s: float, msgs: int) -> float:
    return cpu_s / msgs * 1e6 if msgs else float("nan")


def _row(spec: SystemSpec, variant: str, **metrics: Any) -> Row:
    return {
        "system": spec.name,
        "durability": spec.durability,
        "workload": "scale",
        "variant": variant,
        **metrics,
    }


def _count_label(n: int) -> str:
    for unit, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


@contextlib.contextmanager
def _system(nodes: int, k: ScaleKnobs) -> Iterator[SystemSpec]:
    """A fresh local cluster of `nodes` nodes, as the spec of one system."""
    # Imported here: the runner imports this module to run the scale workload.
    from zdmq.bench.runner import zdmq_systems

    with zdmq_systems([nodes], [k.durability], k.replication) as specs:
        yield specs[0]


def _client(spec: SystemSpec, **kw: Any) -> Client:
    return Client.from_config(spec.options["config"], **kw)


async def _depth_of(spec: SystemSpec, queue: str) -> int:
    async with _client(spec) as c:
        return (await c.stats(queue)).messages


# ---- depth --------------------------------------------------------------------------------


def _prefill(spec: SystemSpec, queue: str, n: int, k: ScaleKnobs) -> float:
    """Adds n messages to the queue in batches from several client processes; the rate."""
    clients = max(1, min(k.prefill_clients, n // k.prefill_batch))
    per, extra = divmod(n, clients)
    # Clients with the same role name merge into one result, whatever their sizes.
    roles = [
        (
            "produce_batched",
            1,
            {
                "n": per + (1 if i < extra else 0),
                "size": k.size,
                "batch": k.prefill_batch,
                "inflight": k.prefill_inflight,
            },
        )
        for i in range(clients)
    ]
    ph = run_phase(spec, queue, roles, timeout_s=1800.0)
    return ph.role("produce_batched")["rate"]


def depth_rows(k: ScaleKnobs, *, log: Any = print) -> list[Row]:
    """Seq push, seq receive+ack and 1+1 batched at each queue depth, on one node."""
    rows: list[Row] = []
    with _system(1, k) as spec:
        idle = _max_rss(spec)
        queue = f"scale-depth-{uuid.uuid4().hex[:8]}"
        reset_queue(spec, queue)
        depth = 0
        for target in sorted(k.depths):
            prefill_rate = float("nan")
            if target > depth:
                t0 = time.monotonic()
                prefill_rate = _prefill(spec, queue, target - depth, k)
                log(f"scale: prefilled to {target:,} in {time.monotonic() - t0:.1f}s")
            depth = run_uvloop(_depth_of(spec, queue))
            rss = _max_rss(spec)
            push = run_phase(spec, queue, [("push_seq", 1, {"n": k.seq_n, "size": k.size})])
            recv = run_phase(spec, queue, [("recv_ack_seq", 1, {"n": k.seq_n, "timeout_s": 300})])
            p, r = push.role("push_seq"), recv.role("recv_ack_seq")
            if r["msgs"] != p["msgs"]:
                raise RuntimeError(f"depth {target}: pushed {p['msgs']}, received {r['msgs']}")
            consume = {"total": k.batched_n, "batch": k.batch, "inflight": k.inflight}
            ph = run_phase(
                spec,
                queue,
                [
                    (
                        "produce_batched",
                        1,
                        {
                            "n": k.batched_n,
                            "size": k.size,
                            "batch": k.batch,
                            "inflight": k.inflight,
                        },
                    ),
                    ("consume_batched", 1, {**consume, "timeout_s": 600.0}),
                ],
            )
            cons = ph.role("consume_batched")
            if cons["msgs"] < k.batched_n:
                raise RuntimeError(f"depth {target}: consumed {cons['msgs']} of {k.batched_n}")
            # The batched consumer may take up to inflight * batch more than it pushed.
            depth_after = run_uvloop(_depth_of(spec, queue))
            rows.append(
                _row(
                    spec,
                    f"depth {_count_label(target)}",
                    depth=depth,
                    push_rate=p["rate"],
                    push_p99_ms=p["p99_ms"],
                    push_cpu_us=_cpu_us(push.server_cpu_s, p["msgs"]),
                    recv_rate=r["rate"],
                    recv_p99_ms=r["p99_ms"],
                    recv_cpu_us=_cpu_us(recv.server_cpu_s, r["msgs"]),
                    rate=cons["msgs"] / max(ph.wall_s, 1e-9),
                    cpu_us=_cpu_us(ph.server_cpu_s, cons["msgs"]),
                    rss_mb=rss,
                    rss_idle_mb=idle,
                    prefill_rate=prefill_rate,
                    depth_after=depth_after,
                )
            )
            depth = depth_after
            log(f"scale: depth {target:,} done (RSS {rss:.0f} MB, idle {idle:.0f} MB)")
    return rows


# ---- queue count --------------------------------------------------------------------------


async def _create_queues(spec: SystemSpec, names: list[str], inflight: int) -> None:
    async with _client(spec) as c:
        it = iter(names)

        async def worker() -> None:
            for name in it:
                await c.create_queue(name)

        await asyncio.gather(*(worker() for _ in range(inflight)))


async def _spread(
    spec: SystemSpec, queues: list[str], n: int, k: ScaleKnobs, op: str
) -> dict[str, Any]:
    """n one-message calls (`push`, or `recv`: receive 1 + ack it), `queue_inflight` at
    a time, message i on queue i mod len(queues): after a push phase each queue holds
    exactly what the receive phase then asks it for."""
    lat: list[float] = []
    empty = 0
    async with _client(spec) as c:
        it = iter(range(n))
        deadline = time.monotonic() + 600

        async def worker() -> None:
            nonlocal empty
            for i in it:
                q = queues[i % len(queues)]
                t = time.perf_counter()
                if op == "push":
                    await c.push(q, make_body(k.size, 0, i))
                else:
                    while not (got := await c.receive(q, 1)):
                        empty += 1  # a miss is part of this call's cost
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"queue {q}: no message to receive")
                    result = await c.ack(q, [m.receipt for m in got])
                    if not result.ok:
                        raise RuntimeError(f"ack failed: {result.failed}")
                lat.append(time.perf_counter() - t)

        t0 = time.monotonic()
        c0 = cpu_seconds(spec.server_pids)
        await asyncio.gather(*(worker() for _ in range(k.queue_inflight)))
        cpu = cpu_seconds(spec.server_pids) - c0
        wall = time.monotonic() - t0
        stats = c.calls["push" if op == "push" else "receive"]
    lat.sort()
    return {
        "rate": n / wall if wall > 0 else 0.0,
        "p99_ms": percentile(lat, 0.99) * 1e3,
        "p50_ms": percentile(lat, 0.50) * 1e3,
        "cpu_s": cpu,
        "calls_per_op": stats.calls_per_op,
        "empty": empty,
    }


async def _fill_queues(spec: SystemSpec, queues: list[str], each: int, k: ScaleKnobs) -> None:
    """Pushes `each` more messages into every queue (one batch per queue)."""
    async with _client(spec) as c:
        it = iter(queues)

        async def worker() -> None:
            for q in it:
                await c.push_many(q, [make_body(k.size, 1, i) for i in range(each)])

        await asyncio.gather(*(worker() for _ in range(k.queue_inflight)))


def _queues_label(count: int, resident: int) -> str:
    label = f"{count:,} queue{'s' if count > 1 else ''}"
    return f"{label}, {resident} held each" if resident else label


def queue_count_rows(k: ScaleKnobs, *, log: Any = print) -> list[Row]:
    """Push and receive+ack spread over 1 .. 10,000 queues, per cluster size.

    With `queue_resident` levels above 0 each queue count is measured again with that
    many messages kept in every queue: then no queue goes empty during the phases, so
    no node registers or unregisters its UUID queue with the metadata owner (which
    a push to an empty UUID queue, and a receive that empties one, cost on a
    multi-node cluster). The difference between the rows is that cost.
    """
    rows: list[Row] = []
    for nodes in k.queue_nodes:
        for count in sorted(k.queue_counts):
            # A fresh cluster per count, so that its RSS is that of `count` queues and not
            # the high-water mark of the phases before.
            with _system(nodes, k) as spec:
                idle = _max_rss(spec)
                queues = [f"scale-q{i:06d}" for i in range(count)]
                t0 = time.monotonic()
                run_uvloop(_create_queues(spec, queues, k.queue_inflight))
                create_rate = count / max(time.monotonic() - t0, 1e-9)
                held = 0
                for resident in sorted(k.queue_resident):
                    if resident > held:
                        run_uvloop(_fill_queues(spec, queues, resident - held, k))
                        held = resident
                    rss = _max_rss(spec)
                    n = k.queue_msgs
                    push = run_uvloop(_spread(spec, queues, n, k, "push"))
                    recv = run_uvloop(_spread(spec, queues, n, k, "recv"))
                    rows.append(
                        _row(
                            spec,
                            _queues_label(count, resident),
                            push_rate=push["rate"],
                            push_p99_ms=push["p99_ms"],
                            push_cpu_us=_cpu_us(push["cpu_s"], n),
                            recv_rate=recv["rate"],
                            recv_p99_ms=recv["p99_ms"],
                            recv_cpu_us=_cpu_us(recv["cpu_s"], n),
                            cpu_us=_cpu_us(push["cpu_s"] + recv["cpu_s"], n),
                            recv_calls_per_op=recv["calls_per_op"],
                            recv_empty=recv["empty"],
                            rss_mb=rss,
                            rss_idle_mb=idle,
                            create_rate=create_rate,
                        )
                    )
                    log(
                        f"scale: {_queues_label(count, resident)} on {nodes} "
                        f"node{'s' if nodes > 1 else ''} done (RSS {rss:.0f} MB)"
                    )
    return rows


# ---- node count ---------------------------------------------------------------------------


def node_count_rows(k: ScaleKnobs, *, log: Any = print) -> list[Row]:
    """The sequential workload with 1 client and the throughput workload on clusters
    of 1 .. 8 nodes."""
    rows: list[Row] = []
    knobs = replace(
        Knobs(),
        seq_n=k.seq_n,
        seq_clients=(1,),
        messages=k.nodes_b_messages,
        batch=k.batch,
        inflight=k.inflight,
        size=k.size,
    )
    for nodes in sorted(k.node_counts):
        with _system(nodes, k) as spec:
            idle = _max_rss(spec)
            a = workload_sequential(spec, knobs)[0]
            b = workload_throughput(spec, knobs)[0]
            rows.append(
                _row(
                    spec,
                    f"{nodes} node{'s' if nodes > 1 else ''}",
                    push_rate=a["push_rate"],
                    push_p99_ms=a["push_p99_ms"],
                    push_cpu_us=a["push_cpu_us"],
                    recv_rate=a["recv_rate"],
                    recv_p99_ms=a["recv_p99_ms"],
                    recv_cpu_us=a["recv_cpu_us"],
                    rate=b["rate"],
                    cpu_us=b["cpu_us"],
                    rss_mb=_max_rss(spec),
                    rss_idle_mb=idle,
                )
            )
            log(f"scale: {nodes} node{'s' if nodes > 1 else ''} done")
    return rows


# ---- idle ---------------------------------------------------------------------------------


def idle_rows(k: ScaleKnobs, *, log: Any = print) -> list[Row]:
    """What a cluster that holds queues costs while nobody calls it.

    For each count in `idle_queues`, a fresh cluster of `idle_nodes` nodes: create that
    many queues, push `idle_per_queue` messages into each (spread over the nodes, so
    most nodes hold a UUID queue of most of them), wait `idle_settle_s`, then read the
    nodes' CPU (user + system, all node processes, from /proc) over `idle_s` seconds in
    which no client calls. What it costs is the nodes' timers and background work per
    queue they hold."""
    rows: list[Row] = []
    for count in sorted(k.idle_queues):
        with _system(k.idle_nodes, k) as spec:
            started = _max_rss(spec)
            queues = [f"scale-idle-{i:06d}" for i in range(count)]
            run_uvloop(_create_queues(spec, queues, k.queue_inflight))
            if k.idle_per_queue > 0:
                run_uvloop(_fill_queues(spec, queues, k.idle_per_queue, k))
            time.sleep(k.idle_settle_s)
            c0, t0 = cpu_seconds(spec.server_pids), time.monotonic()
            time.sleep(k.idle_s)
            cpu, wall = cpu_seconds(spec.server_pids) - c0, time.monotonic() - t0
            rss = _max_rss(spec)
            label = f"idle, {_count_label(count)} queue{'s' if count > 1 else ''}"
            rows.append(
                _row(
                    spec,
                    label,
                    idle_core_pct=100 * cpu / wall,
                    idle_cpu_s=cpu,
                    idle_s=wall,
                    queues=count,
                    rss_mb=rss,
                    rss_idle_mb=started,
                )
            )
            log(
                f"scale: {label} on {k.idle_nodes} nodes: {100 * cpu / wall:.1f}% of a core "
                f"(RSS {rss:.0f} MB)"
            )
    return rows


# ---- all of it ----------------------------------------------------------------------------


def workload_scale(knobs: ScaleKnobs | None = None, *, log: Any = print) -> list[Row]:
    """Depth, queue count, node count and idle rows, in that order (a part whose sizes
    are empty is left out). Starts and stops clusters of its own."""
    k = knobs or ScaleKnobs()
    rows: list[Row] = []
    if k.depths:
        rows += depth_rows(k, log=log)
    if k.queue_counts and k.queue_nodes:
        rows += queue_count_rows(k, log=log)
    if k.node_counts:
        rows += node_count_rows(k, log=log)
    if k.idle_queues:
        rows += idle_rows(k, log=log)
    return rows


def memory_summary(rows: list[Row]) -> str:
    """What the nodes hold, in words: a node's RSS when it has just started, what each
    queue depth added to it, and the RSS of each queue count's largest node."""
    lines = []
    depth = [r for r in rows if r["variant"].startswith("depth ")]
    if depth:
        idle = depth[0]["rss_idle_mb"]
        lines.append(f"memory: idle node {idle:.1f} MB RSS")
        for r in depth:
            if not r["depth"]:
                continue
            added = r["rss_mb"] - idle
            lines.append(
                f"memory: {r['depth']:>9,} messages queued: {r['rss_mb']:.1f} MB RSS, "
                f"+{added:.1f} MB over idle ({added * 2**20 / r['depth']:.0f} B per message)"
            )
    for r in rows:
        if r["variant"].endswith(("queue", "queues")) or "held each" in r["variant"]:
            lines.append(
                f"memory: {r['system']}, {r['variant']}: {r['rss_mb']:.1f} MB RSS "
                f"({r['rss_idle_mb']:.1f} MB when started)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m zdmq.bench.scale", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--depths", type=int, nargs="*", help="queue depths; none: skip")
    ap.add_argument("--queues", type=int, nargs="*", help="queue counts; none: skip")
    ap.add_argument("--queue-nodes", type=int, nargs="+", help="cluster sizes for --queues")
    ap.add_argument(
        "--queue-resident", type=int, nargs="+", help="messages held per queue (0: empty)"
    )
    ap.add_argument("--nodes", type=int, nargs="*", help="cluster sizes; none: skip")
    ap.add_argument(
        "--idle-queues", type=int, nargs="*", help="queue counts of an idle cluster; none: skip"
    )
    ap.add_argument("--seq-n", type=int, help="one-at-a-time calls per measurement")
    ap.add_argument("--durability", choices=["fsync", "os"])
    ap.add_argument("--runs", type=int, default=1, help="runs; tables show medians")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results"), help="JSON folder")
    args = ap.parse_args(argv)

    k = ScaleKnobs.quick() if args.quick else ScaleKnobs()
    given: dict[str, Any] = {
        "depths": args.depths,
        "queue_counts": args.queues,
        "queue_nodes": args.queue_nodes,
        "queue_resident": args.queue_resident,
        "node_counts": args.nodes,
        "idle_queues": args.idle_queues,
        "seq_n": args.seq_n,
        "durability": args.durability,
    }
    changes: dict[str, Any] = {
        n: tuple(v) if isinstance(v, list) else v for n, v in given.items() if v is not None
    }
    k = replace(k, **changes)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    t0 = time.monotonic()
    runs: list[list[Row]] = []
    for i in range(args.runs):
        if args.runs > 1:
            print(f"\nscale: run {i + 1} of {args.runs}")
        runs.append(workload_scale(k))
    rows = medians(runs) if args.runs > 1 else runs[0]
    print()
    print(format_tables(rows))
    print()
    print(memory_summary(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    path = args.out / f"scale-{stamp}.json"
    from zdmq.bench.runner import machine

    doc = {
        "machine": machine(),
        "argv": ["python", "-m", "zdmq.bench.scale", *(argv if argv is not None else sys.argv[1:])],
        "knobs": asdict(k),
        "seconds": round(time.monotonic() - t0, 1),
        "rows": rows,
    }
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nscale: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
