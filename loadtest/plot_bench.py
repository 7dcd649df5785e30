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
import re
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


_COSTS = [
    ("push_cpu_us", "push, one at a time"),
    ("recv_cpu_us", "receive+ack, one at a time"),
    ("cpu_us", "batched, 4+4"),
]


def _cost_lines(ax: Any, rows: list[Row], xs: list[Any], xlabel: str) -> None:
    """One line per kind of operation: its server CPU per message at each x."""
    for metric, label in _COSTS:
        ax.plot(xs, [r.get(metric) for r in rows], "o-", label=label)
    ax.set_xlabel(xlabel)


def _scale_chart(rows: list[Row], path: Path) -> Path:
    """Server CPU per message against queue depth, queue count and node count: a flat
    line is an operation whose cost does not grow with that size."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    depth = [r for r in rows if r["variant"].startswith("depth ")]
    xs = [r["variant"].removeprefix("depth ") for r in depth]
    _cost_lines(axes[0], depth, xs, "messages in the queue (1 node)")
    count_rows = [
        r for r in rows if re.fullmatch(r"[\d,]+ queues?(, \d+ held each)?", r["variant"])
    ]
    series: dict[str, list[tuple[int, float]]] = {}
    for r in count_rows:
        n = int(r["variant"].split(" ")[0].replace(",", ""))
        held = "held" in r["variant"]
        cluster = r["system"].removeprefix("zdmq").removesuffix("fsync").strip() or "1 node"
        name = f"{cluster}, {'16 held per queue' if held else 'empty before'}"
        series.setdefault(name, []).append((n, r["cpu_us"]))
    for name, points in series.items():
        points.sort()
        axes[1].plot([n for n, _ in points], [c for _, c in points], "o-", label=name)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("queues (a message's push + receive + ack)")
    nodes = [r for r in rows if re.fullmatch(r"\d+ nodes?", r["variant"])]
    _cost_lines(axes[2], nodes, [int(r["variant"].split()[0]) for r in nodes], "nodes")
    for ax in axes:
        ax.set_ylabel("server CPU µs per message")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    idle = [r for r in rows if r["variant"].startswith("idle")]
    note = "; ".join(f"{r['variant']}: {r['idle_core_pct']:.1f} % of a core" for r in idle)
    fig.suptitle("scale (zdmq alone)" + (f"; {note}" if note else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    ]
    scale = [r for r in rows if r["workload"] == "scale"]
    if scale:
        written.append(_scale_chart(scale, out / f"{stem}-scale.png"))
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
    for table in (summary_table(rows), doc_tables(rows)):
        if table:
            print()
            print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
