"""The workloads that run on every system, each a sequence of phases, and their rows.

    sequential  n messages per client pushed one at a time, each waiting for its
                confirm; then received and acked one at a time (RDSQ's workload).
                1 and 4 clients.
    throughput  4 producers pushing batches (several in flight) while 4 consumers
                receive and ack batches; rate = messages through / time.
    latency     1 producer at a fixed moderate rate, 1 consumer; push-to-delivery
                p50 / p99.
    sizes       100 B, 10 KiB, 1 MiB: one-at-a-time pushes and 1+1 batched
                throughput at each size.

Every row carries the server CPU per message (µs of server user+system CPU while the
phase ran, over the messages it moved) beside its rate, and the clients' CPU, because
on 2 cores the Python clients, not the servers, are often what saturates.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zdmq.bench.driver import SystemSpec
from zdmq.bench.workloads import PhaseResult, reset_queue, run_phase

__all__ = [
    "WORKLOADS",
    "Knobs",
    "Row",
    "workload_latency",
    "workload_sequential",
    "workload_sizes",
    "workload_throughput",
]

Row = dict[str, Any]
KiB = 1024
MiB = 1024 * 1024


@dataclass(frozen=True)
class Knobs:
    """Sizes of every workload; `quick()` is for smoke runs and tests."""

    seq_n: int = 10_000  # sequential: messages per client
    seq_clients: tuple[int, ...] = (1, 4)  # sequential
    producers: int = 4  # throughput
    consumers: int = 4
    messages: int = 100_000  # throughput: in all
    batch: int = 100  # throughput and sizes
    inflight: int = 4  # batches in flight per client
    latency_rate: float = 1000.0  # latency: messages/s
    latency_seconds: float = 10.0
    sizes: tuple[int, ...] = (100, 10 * KiB, MiB)  # sizes
    size_bytes: int = 64 * MiB  # sizes: bytes moved per size (capped by size_max)
    size_max: int = 20_000
    size: int = 100
    floor_n: int = 3_000  # floor: one-at-a-time calls per row

    @classmethod
    def quick(cls) -> Knobs:
        return cls(
            seq_n=200,
            seq_clients=(1, 2),
            producers=2,
            consumers=2,
            messages=2000,
            batch=50,
            inflight=2,
            latency_rate=200.0,
            latency_seconds=1.0,
            sizes=(100, 10 * KiB),
            size_bytes=1 * MiB,
            size_max=500,
            floor_n=200,
        )


def _queue() -> str:
    return f"bench-{uuid.uuid4().hex[:10]}"


def _cpu_us(phase: PhaseResult, msgs: int) -> float:
    return phase.server_cpu_s / msgs * 1e6 if msgs else float("nan")


def _row(spec: SystemSpec, workload: str, variant: str, **metrics: Any) -> Row:
    return {
        "system": spec.name,
        "durability": spec.durability,
        "workload": workload,
        "variant": variant,
        **metrics,
    }


def workload_sequential(spec: SystemSpec, k: Knobs) -> list[Row]:
    rows = []
    for clients in k.seq_clients:
        q = _queue()
        reset_queue(spec, q)
        push = run_phase(spec, q, [("push_seq", clients, {"n": k.seq_n, "size": k.size})])
        recv = run_phase(spec, q, [("recv_ack_seq", clients, {"n": k.seq_n, "timeout_s": 300.0})])
        p, r = push.role("push_seq"), recv.role("recv_ack_seq")
        if r["msgs"] != p["msgs"]:
            raise RuntimeError(f"{spec.name}: pushed {p['msgs']} but received {r['msgs']}")
        rows.append(
            _row(
                spec,
                "sequential",
                f"{clients} client{'s' if clients > 1 else ''}",
                push_rate=p["rate"],
                push_p50_ms=p["p50_ms"],
                push_p99_ms=p["p99_ms"],
                push_cpu_us=_cpu_us(push, p["msgs"]),
                recv_rate=r["rate"],
                recv_p50_ms=r["p50_ms"],
                recv_p99_ms=r["p99_ms"],
                recv_cpu_us=_cpu_us(recv, r["msgs"]),
                client_cpu_s=p["client_cpu_s"] + r["client_cpu_s"],
            )
        )
    return rows


def _through(
    spec: SystemSpec, k: Knobs, producers: int, consumers: int, size: int, total: int, batch: int
) -> tuple[PhaseResult, dict[str, Any], dict[str, Any]]:
    q = _queue()
    reset_queue(spec, q)
    per = total // producers
    total = per * producers
    ph = run_phase(
        spec,
        q,
        [
            (
                "produce_batched",
                producers,
                {"n": per, "size": size, "batch": batch, "inflight": k.inflight},
            ),
            (
                "consume_batched",
                consumers,
                {"total": total, "batch": batch, "inflight": k.inflight, "timeout_s": 600.0},
            ),
        ],
    )
    prod, cons = ph.role("produce_batched"), ph.role("consume_batched")
    if cons["msgs"] < total:
        raise RuntimeError(f"{spec.name}: pushed {total} but consumed {cons['msgs']}")
    return ph, prod, cons


def workload_throughput(spec: SystemSpec, k: Knobs) -> list[Row]:
    ph, prod, cons = _through(spec, k, k.producers, k.consumers, k.size, k.messages, k.batch)
    # Messages through per second: from the first client's start to the last consume.
    span = max(ph.wall_s, 1e-9)
    return [
        _row(
            spec,
            "throughput",
            f"{k.producers}+{k.consumers}",
            rate=cons["msgs"] / span,
            push_rate=prod["rate"],
            recv_rate=cons["rate"],
            e2e_p50_ms=cons.get("p50_ms"),
            e2e_p99_ms=cons.get("p99_ms"),
            cpu_us=_cpu_us(ph, cons["msgs"]),
            client_cpu_s=prod["client_cpu_s"] + cons["client_cpu_s"],
            server_cpu_s=ph.server_cpu_s,
            wall_s=ph.wall_s,
        )
    ]


def workload_latency(spec: SystemSpec, k: Knobs) -> list[Row]:
    q = _queue()
    reset_queue(spec, q)
    n = int(k.latency_rate * k.latency_seconds)
    ph = run_phase(
        spec,
        q,
        [
            ("produce_paced", 1, {"rate": k.latency_rate, "n": n, "size": k.size}),
            ("consume_latency", 1, {"total": n, "batch": 10, "timeout_s": k.latency_seconds + 60}),
        ],
    )
    cons = ph.role("consume_latency")
    if cons["msgs"] < n:
        raise RuntimeError(f"{spec.name}: paced {n} but delivered {cons['msgs']}")
    return [
        _row(
            spec,
            "latency",
            f"{k.latency_rate:g}/s",
            p50_ms=cons["p50_ms"],
            p99_ms=cons["p99_ms"],
            mean_ms=cons["mean_ms"],
            cpu_us=_cpu_us(ph, n),
        )
    ]


def workload_sizes(spec: SystemSpec, k: Knobs) -> list[Row]:
    rows = []
    for size in k.sizes:
        count = max(20, min(k.size_max, k.size_bytes // size))
        batch = max(1, min(k.batch, (4 * MiB) // size))
        q = _queue()
        reset_queue(spec, q)
        seq = run_phase(spec, q, [("push_seq", 1, {"n": min(count, 2000), "size": size})])
        ph, _, cons = _through(spec, k, 1, 1, size, count, batch)
        s = seq.role("push_seq")
        rate = cons["msgs"] / max(ph.wall_s, 1e-9)
        rows.append(
            _row(
                spec,
                "sizes",
                _size_label(size),
                size=size,
                seq_push_rate=s["rate"],
                seq_push_p50_ms=s["p50_ms"],
                rate=rate,
                mb_s=rate * size / MiB,
                cpu_us=_cpu_us(ph, cons["msgs"]),
                batch=batch,
            )
        )
    return rows


def _size_label(size: int) -> str:
    if size >= MiB and size % MiB == 0:
        return f"{size // MiB} MiB"
    if size >= KiB and size % KiB == 0:
        return f"{size // KiB} KiB"
    return f"{size} B"


WORKLOADS: dict[str, Callable[[SystemSpec, Knobs], list[Row]]] = {
    "sequential": workload_sequential,
    "throughput": workload_throughput,
    "latency": workload_latency,
    "sizes": workload_sizes,
}
