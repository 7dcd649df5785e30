"""The scale workload in its quick mode: real node processes, tiny sizes.

Checks the shape of what `python -m zdmq.bench.scale` reports (one row per depth,
queue count, cluster size and idle queue count, with rates, latencies, server CPU, idle
CPU and RSS), not its numbers: on a shared 2-core machine only their signs and rough
sizes are stable.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from zdmq.bench.report import format_tables
from zdmq.bench.scale import ScaleKnobs, main, rss_mb


def _positive(row: dict[str, object], metric: str) -> bool:
    v = row.get(metric)
    return isinstance(v, int | float) and not math.isnan(v) and v > 0


def test_rss_of_a_process_that_is_gone_is_nan_and_of_this_one_is_plausible() -> None:
    assert 5 < rss_mb(os.getpid()) < 4096
    assert math.isnan(rss_mb(2**22 + 12345))  # above any pid_max Linux hands out


def test_empty_parts_are_skipped_and_the_idle_queue_counts_come_from_the_flag(
    tmp_path: Path,
) -> None:
    argv = ["--quick", "--depths", "--queues", "--nodes", "--idle-queues", "--out", str(tmp_path)]
    assert main(argv) == 0  # every part skipped: no cluster starts
    (written,) = tmp_path.glob("scale-*.json")
    doc = json.loads(written.read_text())
    assert doc["rows"] == [] and doc["knobs"]["idle_queues"] == []
    assert ScaleKnobs().idle_queues == (1, 10_000) and ScaleKnobs.quick().idle_queues == (1, 20)


@pytest.mark.timeout(240)
def test_quick_scale_run_reports_every_depth_queue_count_cluster_size_and_idle_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (written,) = tmp_path.glob("scale-*.json")
    rows = json.loads(written.read_text())["rows"]
    k = ScaleKnobs.quick()

    assert [r["variant"] for r in rows] == [
        *(f"depth {'0' if d == 0 else f'{d // 1000}k'}" for d in k.depths),
        *(
            f"{q:,} queue{'s' if q > 1 else ''}" + (f", {held} held each" if held else "")
            for q in k.queue_counts
            for held in k.queue_resident
        ),
        *(f"{n} node{'s' if n > 1 else ''}" for n in k.node_counts),
        *(f"idle, {q} queue{'s' if q > 1 else ''}" for q in k.idle_queues),
    ]
    for r in rows:
        assert r["workload"] == "scale" and r["durability"] == "fsync"
        # A Python node holds tens of MB; a tiny run adds little to that.
        assert 10 < r["rss_idle_mb"] <= r["rss_mb"] + 5 < 500, r
        if r["variant"].startswith("idle"):
            continue
        for metric in ("push_rate", "push_p99_ms", "recv_rate", "recv_p99_ms"):
            assert _positive(r, metric), (r["variant"], metric, r.get(metric))
        # Server CPU comes in 10 ms ticks: a tiny phase may round down to none.
        assert r["cpu_us"] >= 0 and r["push_cpu_us"] >= 0 and r["recv_cpu_us"] >= 0, r
        if "queue" not in r["variant"]:
            assert _positive(r, "rate"), (r["variant"], r.get("rate"))
    idle = [r for r in rows if r["variant"].startswith("idle")]
    assert [r["queues"] for r in idle] == list(k.idle_queues)
    for r in idle:
        assert r["system"] == f"zdmq {k.idle_nodes} nodes fsync", r
        assert r["idle_s"] >= k.idle_s, r
        # Node CPU comes in 10 ms ticks: 1 s of an idle cluster may round down to none;
        # it cannot be more than all the nodes running flat out.
        assert 0 <= r["idle_core_pct"] <= 100 * k.idle_nodes, r
        assert r["idle_core_pct"] == pytest.approx(100 * r["idle_cpu_s"] / r["idle_s"]), r
        assert "push_rate" not in r and "rate" not in r, r
    depth = {r["depth"] for r in rows if r["variant"].startswith("depth")}
    assert depth == set(k.depths)  # the prefill put exactly that many in the queue
    assert "scale: depth, queue count" in out and "memory: idle node" in out
    assert "target" not in out
    table = format_tables(rows)
    assert table.startswith("scale: depth, queue count") and "idle % core" in table
