"""`zdmq bench` end to end on real node processes, and the arithmetic of its report.

The peers are not started here (CI installs none): their drivers are checked by
loadtest/peers/check_drivers.py against real servers. These tests check that the
harness moves every message it claims to, measures server CPU, and that medians and
ratios say what they should.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from zdmq import Client
from zdmq.bench.driver import SystemSpec
from zdmq.bench.report import doc_tables, format_tables, medians, ratio_rows
from zdmq.bench.runner import main as bench_main
from zdmq.bench.runner import zdmq_systems
from zdmq.bench.suite import Knobs, workload_sequential, workload_throughput
from zdmq.bench.workloads import body_key, cpu_seconds, make_body, sent_at

TINY = Knobs(
    seq_n=60,
    seq_clients=(1, 2),
    producers=2,
    consumers=2,
    messages=3000,
    batch=20,
    inflight=2,
    latency_rate=100.0,
    latency_seconds=0.5,
    sizes=(100, 4096),
    size_bytes=64 * 1024,
    size_max=40,
    floor_n=50,
)


def test_bodies_are_unique_sized_and_carry_their_send_time() -> None:
    a, b = make_body(100, 3, 7), make_body(100, 3, 8)
    assert len(a) == len(b) == 100
    assert body_key(a) == (3, 7) and body_key(b) == (3, 8)
    assert 0 <= sent_at(b) - sent_at(a) < 1.0
    assert len(make_body(10, 0, 0)) == 16  # the header is never cut


def test_server_cpu_is_read_from_proc_and_a_gone_pid_counts_zero() -> None:
    import os

    before = cpu_seconds([os.getpid()])
    sum(i * i for i in range(300_000))
    assert cpu_seconds([os.getpid()]) > before
    assert cpu_seconds([2**22 + 12345]) == 0.0


def test_sequential_and_throughput_move_every_message_through_a_real_node() -> None:
    with zdmq_systems([1], ["os"]) as [spec, consumer]:
        rows = workload_sequential(spec, TINY) + workload_throughput(spec, TINY)
        # The consumer row: client.consume over streams, acks in the background, all
        # committed (and what one client leased ahead released for the other) before the
        # phase ends.
        c1, c2 = workload_sequential(consumer, TINY)
        assert consumer.workloads == ("sequential",) and consumer.options["prefetch"] > 1
        assert c1["recv_rate"] > 0 and c2["recv_rate"] > 0
        assert asyncio.run(_left(spec)) == (0, 0)
    a1, a2, b = rows
    assert (a1["variant"], a2["variant"], b["variant"]) == ("1 client", "2 clients", "2+2")
    for row in (a1, a2):
        assert row["push_rate"] > 0 and row["recv_rate"] > 0
        assert 0 < row["push_p50_ms"] <= row["push_p99_ms"]
        # CPU time comes in 10 ms ticks: a phase this short may read 0.
        assert row["push_cpu_us"] >= 0 and row["recv_cpu_us"] >= 0
    # 3,000 messages through the node cost it measurably more than one tick.
    assert b["rate"] > 0 and b["server_cpu_s"] > 0 and b["cpu_us"] > 0


async def _left(spec: SystemSpec) -> tuple[int, int]:
    """Messages and leases left in every queue of the cluster (each phase made its own)."""
    async with Client.from_config(spec.options["config"]) as c:
        stats = [await c.stats(q) for q in await c.list_queues()]
    return sum(s.messages for s in stats), sum(s.in_flight for s in stats)


def test_zdmq_bench_quick_prints_tables_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        bench_main(
            [
                "--quick",
                "--peers",
                "none",
                "--nodes",
                "1",
                "--replication",
                "1",
                "--durability",
                "os",
                "--workloads",
                "latency",
                "sizes",
                "floor",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "latency: push to delivery" in out and "sizes: 100 B to 1 MiB" in out
    assert "floor: what one durable call costs" in out
    [path] = tmp_path.glob("bench-*.json")
    doc = json.loads(path.read_text())
    rows = doc["rows"]
    assert {r["workload"] for r in rows} == {"latency", "sizes", "floor"}
    assert [r["variant"] for r in rows if r["workload"] == "sizes"] == ["100 B", "10 KiB"]
    assert all(r["system"] == "zdmq os" for r in rows if r["workload"] != "floor")
    floor = [r for r in rows if r["workload"] == "floor"]
    assert floor and all(r["system"].startswith("floor: ") and r["push_rate"] > 0 for r in floor)
    c = next(r for r in rows if r["workload"] == "latency")
    assert 0 < c["p50_ms"] <= c["p99_ms"]


def test_bench_help_names_every_workload_by_what_it_measures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        bench_main(["--help"])
    out = capsys.readouterr().out
    for name in ("sequential", "throughput", "latency", "sizes", "floor", "scale"):
        assert f"  {name} " in out


def test_bench_refuses_an_unknown_workload(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bench_main(["--workloads", "b", "--peers", "none"])
    assert e.value.code == 2
    assert "unknown workloads b" in capsys.readouterr().err


def _row(system: str, durability: str, rate: float, p50: float) -> dict[str, object]:
    return {
        "system": system,
        "durability": durability,
        "workload": "sequential",
        "variant": "1 client",
        "push_rate": rate,
        "push_p50_ms": p50,
    }


def test_medians_take_the_middle_run_and_keep_every_sample() -> None:
    runs = [
        [_row("zdmq fsync", "fsync", r, p)]
        for r, p in ((1000.0, 0.5), (3000.0, 0.1), (2000.0, 0.3))
    ]
    [m] = medians(runs)
    assert m["runs"] == 3
    assert m["push_rate"] == 2000.0 and m["push_p50_ms"] == 0.3
    assert m["samples"]["push_rate"] == [1000.0, 3000.0, 2000.0]


def test_ratios_compare_like_durability_and_say_above_one_when_zdmq_is_ahead() -> None:
    rows = medians(
        [
            [
                _row("zdmq fsync", "fsync", 2000.0, 0.4),
                _row("zdmq os", "os", 4000.0, 0.2),
                _row("redis list always", "fsync", 1000.0, 0.8),
                _row("redis list everysec", "os", 8000.0, 0.1),
            ]
        ]
    )
    ratios = {r["system"]: r for r in ratio_rows(rows)}
    always, everysec = ratios["redis list always"], ratios["redis list everysec"]
    assert always["zdmq_system"] == "zdmq fsync" and everysec["zdmq_system"] == "zdmq os"
    assert always["push_rate"] == pytest.approx(2.0)  # zdmq twice as fast
    assert always["push_p50_ms"] == pytest.approx(2.0)  # and half the latency
    assert everysec["push_rate"] == pytest.approx(0.5)
    assert everysec["push_p50_ms"] == pytest.approx(0.5)
    table = format_tables(rows, markdown=True)
    assert "| zdmq fsync / redis list always | fsync | 1 client | 2.00 | 2.00 |" in table
    # The docs' tables carry the same ratios as columns, empty on zdmq's own rows.
    doc = doc_tables(rows).splitlines()
    assert doc[2].endswith("| zdmq ÷ row, push/s | zdmq ÷ row, recv+ack/s |")
    [zdmq_line] = [line for line in doc if line.startswith("| zdmq fsync |")]
    [redis_line] = [line for line in doc if line.startswith("| redis list everysec |")]
    assert zdmq_line.endswith("|  |  |") and redis_line.endswith("| 0.50 |  |")


def test_replicated_peers_are_compared_with_the_replicated_zdmq_and_single_ones_with_one_copy() -> (
    None
):
    rows = medians(
        [
            [
                _row("zdmq 4 nodes fsync", "fsync", 4000.0, 0.4),
                _row("zdmq 4 nodes fsync r3", "fsync", 1000.0, 1.0),
                _row("nats r3 sync always", "fsync", 500.0, 2.0),
                _row("rabbitmq quorum r3", "fsync", 250.0, 4.0),
                _row("redis list always", "fsync", 2000.0, 0.8),
            ]
        ]
    )
    ratios = {r["system"]: r for r in ratio_rows(rows)}
    assert ratios["nats r3 sync always"]["zdmq_system"] == "zdmq 4 nodes fsync r3"
    assert ratios["rabbitmq quorum r3"]["push_rate"] == pytest.approx(4.0)
    assert ratios["redis list always"]["zdmq_system"] == "zdmq 4 nodes fsync"
    assert ratios["redis list always"]["push_rate"] == pytest.approx(2.0)


def test_a_spec_names_its_driver_by_import_path_and_pickles() -> None:
    import pickle

    spec = SystemSpec("x", "zdmq.bench.zdmq_driver:ZdmqDriver", "os", {"urls": ["http://h:1"]})
    assert pickle.loads(pickle.dumps(spec)) == spec
