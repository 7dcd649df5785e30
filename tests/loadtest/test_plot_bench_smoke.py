"""loadtest/plot_bench.py on the JSON `zdmq bench` writes: a chart per workload present,
the floor chart beside zdmq's one-at-a-time push, the summary and the workload tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]


def _row(system: str, durability: str, workload: str, variant: str, **m: float) -> dict:
    return {
        "system": system,
        "durability": durability,
        "workload": workload,
        "variant": variant,
        **m,
    }


def test_plot_bench_draws_each_workload_and_prints_its_tables(tmp_path: Path) -> None:
    rows = [
        _row(
            "zdmq fsync",
            "fsync",
            "sequential",
            "1 client",
            push_rate=2500.0,
            push_p50_ms=0.38,
            push_cpu_us=90.0,
            recv_rate=990.0,
            recv_cpu_us=120.0,
        ),
        _row(
            "redis list always",
            "fsync",
            "sequential",
            "1 client",
            push_rate=2400.0,
            push_p50_ms=0.40,
            push_cpu_us=20.0,
            recv_rate=1200.0,
            recv_cpu_us=30.0,
        ),
        _row("zdmq fsync", "fsync", "throughput", "4+4", rate=30000.0, cpu_us=26.0),
        _row("redis list always", "fsync", "throughput", "4+4", rate=31000.0, cpu_us=5.0),
        _row(
            "floor: sqlite commit",
            "fsync",
            "floor",
            "1 client",
            push_rate=7000.0,
            push_p50_ms=0.13,
            push_cpu_us=20.0,
        ),
    ]
    costs = {"push_cpu_us": 300.0, "recv_cpu_us": 700.0, "cpu_us": 50.0}
    rows += [
        _row("zdmq fsync", "fsync", "scale", "depth 0", depth=0, **costs),
        _row("zdmq fsync", "fsync", "scale", "depth 10k", depth=10_000, **costs),
        _row("zdmq fsync", "fsync", "scale", "1 queue", push_rate=6000.0, cpu_us=510.0),
        _row("zdmq 4 nodes fsync", "fsync", "scale", "10,000 queues, 16 held each", cpu_us=900.0),
        _row("zdmq fsync", "fsync", "scale", "1 node", **costs),
        _row("zdmq 4 nodes fsync", "fsync", "scale", "4 nodes", **costs),
        _row("zdmq 4 nodes fsync", "fsync", "scale", "idle, 1 queue", idle_core_pct=1.8),
    ]
    data = tmp_path / "bench-x.json"
    data.write_text(json.dumps({"rows": rows}))
    out = tmp_path / "img"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "loadtest" / "plot_bench.py"),
            str(data),
            "--out",
            str(out),
            "--stem",
            "t",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["t-floor.png", "t-scale.png", "t-sequential.png", "t-throughput.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    # The summary: one line per system, the throughput ratio last (30000 / 31000).
    assert "| redis list always | yes | 2,400 (0.40) | 1,200 | 31,000 (5) | - / - | - | 0.97 |" in (
        proc.stdout
    )
    # The workload tables: zdmq ÷ row as columns, push/s 2500 / 2400, recv 990 / 1200.
    assert "| 20 | 1,200 | - | - | 30 | 1.04 | 0.82 |" in proc.stdout
    # Scale has its table too (the chart plots CPU per message against each size).
    assert "| zdmq 4 nodes fsync | fsync | idle, 1 queue |" in proc.stdout
