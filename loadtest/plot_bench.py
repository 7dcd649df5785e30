"""Charts and tables for docs/benchmarks.md from the JSON `zdmq bench` writes.

    .venv/bin/python loadtest/plot_bench.py loadtest/results/bench-XXXX.json [more.json ...] \
        --out docs/img --stem bench

One PNG per workload present in the files: bars per system, hatched where the system
does not flush to disk before it confirms, with the server CPU per message written on
each bar (the clients share the 2 cores, so a rate alone can hide who did the work).
Also prints the markdown tables for the docs: one line per system (the README's table),
then one table per workload with the zdmq ÷ peer ratios as columns.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zdmq.bench.report import doc_tables, summary_table

Row = dict[str, Any]
ZDMQ = "#1f6feb"
PEER = "#8b949e"


def _bars(ax: Any, rows: list[Row], metric: str, label: str, cpu: str | None) -> None:
    names = [f"{r['system']}\n{r['variant']}" for r in rows]
    values = [r.get(metric) or 0.0 for r in rows]
    colors = [ZDMQ if r["system"].startswith("zdmq") else PEER for r in rows]
    hatches = ["" if r["durability"] == "fsync" else "//" for r in rows]
    bars = ax.bar(range(len(rows)), values, color=colors, edgecolor="black", linewidth=0.5)
    for bar, hatch in zip(bars, hatches, strict=True):
        bar.set_hatch(hatch)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(label)
    if cpu:
        for bar, r in zip(bars, rows, strict=True):
            v = r.get(cpu)
            if isinstance(v, int | float):
                ax.annotate(
                    f"{v:.0f}µs",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=6,
                )
    ax.grid(axis="y", alpha=0.3)


def plot(rows: list[Row], out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    charts: list[tuple[str, list[tuple[str, str, str | None]], str]] = [
        (
            "sequential",
            [
                ("push_rate", "pushes/s, one at a time", "push_cpu_us"),
                ("recv_rate", "receive+ack/s, one at a time", "recv_cpu_us"),
            ],
            "sequential: one at a time (µs: server CPU per message; hatched: no fsync "
            "before confirm)",
        ),
        (
            "throughput",
            [("rate", "messages/s through, producers + consumers", "cpu_us")],
            "throughput (µs: server CPU per message; hatched: no fsync before confirm)",
        ),
        (
            "latency",
            [("p50_ms", "push-to-delivery p50 ms", None), ("p99_ms", "p99 ms", None)],
            "latency at a fixed rate (lower is better)",
        ),
        ("sizes", [("mb_s", "MiB/s, 1 producer + 1 consumer", "cpu_us")], "message sizes"),
        (
            "floor",
            [("push_rate", "calls/s, one at a time", "push_cpu_us")],
            "floor: one durable call without zdmq, beside zdmq's one-at-a-time push",
        ),
        (
            "scale",
            [
                ("push_rate", "pushes/s", None),
                ("recv_rate", "receive+ack/s", None),
                ("rate", "batched msgs/s", "cpu_us"),
            ],
            "scale (zdmq alone)",
        ),
    ]
    for workload, panels, title in charts:
        mine = [r for r in rows if r["workload"] == workload]
        if not mine:
            continue
        if workload == "floor":  # beside what zdmq's own one-at-a-time push does
            mine += [
                r
                for r in rows
                if r["workload"] == "sequential"
                and r["variant"] == "1 client"
                and r["system"].startswith("zdmq")
                and not r["system"].endswith("consumer")
            ]
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.8), squeeze=False)
        for ax, (metric, label, cpu) in zip(axes[0], panels, strict=True):
            _bars(ax, mine, metric, label, cpu)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        path = out / f"{stem}-{workload}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    ap.add_argument("--stem", default="bench")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    for f in args.files:
        rows += json.loads(f.read_text())["rows"]
    for p in plot(rows, args.out, args.stem):
        print(f"wrote {p}")
    print()
    print(summary_table(rows))
    print()
    print(doc_tables(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
