"""Workload (e), scale, in its quick mode: real node processes, tiny sizes.

Checks the shape of what `python -m zdmq.bench.scale` reports (one row per depth,
queue count and cluster size, with rates, latencies, server CPU and RSS), not its
numbers: on a shared 2-core machine only their signs and rough sizes are stable.
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


@pytest.mark.timeout(180)
def test_quick_scale_run_reports_every_depth_queue_count_and_cluster_size(
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
    ]
    for r in rows:
        assert r["workload"] == "e" and r["durability"] == "fsync"
        for metric in ("push_rate", "push_p99_ms", "recv_rate", "recv_p99_ms"):
            assert _positive(r, metric), (r["variant"], metric, r.get(metric))
        # Server CPU comes in 10 ms ticks: a tiny phase may round down to none.
        assert r["cpu_us"] >= 0 and r["push_cpu_us"] >= 0 and r["recv_cpu_us"] >= 0, r
        if "queue" not in r["variant"]:
            assert _positive(r, "rate"), (r["variant"], r.get("rate"))
        # A Python node holds tens of MB; a tiny run adds little to that.
        assert 10 < r["rss_idle_mb"] <= r["rss_mb"] + 5 < 500, r
    depth = {r["depth"] for r in rows if r["variant"].startswith("depth")}
    assert depth == set(k.depths)  # the prefill put exactly that many in the queue
    assert "(e) scale" in out and "memory: idle node" in out
    assert format_tables(rows).startswith("(e) scale")
