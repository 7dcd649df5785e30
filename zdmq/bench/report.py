"""Medians over runs, the printed tables, and the zdmq / peer ratios.

`format_tables` is what `zdmq bench` prints: a table per workload, then its ratios.
`doc_tables` is the same rows for docs/benchmarks.md, the ratios as columns of each
table, and `summary_table` the one-line-per-system table the README opens with.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from typing import Any

__all__ = ["COLUMNS", "doc_tables", "format_tables", "medians", "ratio_rows", "summary_table"]

Row = dict[str, Any]
_KEY = ("system", "durability", "workload", "variant")

# workload -> [(metric, header, format)]; the first metric is the one ratios compare.
COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "sequential": [
        ("push_rate", "push/s", ",.0f"),
        ("push_p50_ms", "p50 ms", ".2f"),
        ("push_p99_ms", "p99 ms", ".2f"),
        ("push_cpu_us", "srv µs/msg", ".0f"),
        ("recv_rate", "recv+ack/s", ",.0f"),
        ("recv_p50_ms", "p50 ms", ".2f"),
        ("recv_p99_ms", "p99 ms", ".2f"),
        ("recv_cpu_us", "srv µs/msg", ".0f"),
    ],
    "throughput": [
        ("rate", "msgs/s through", ",.0f"),
        ("push_rate", "push/s", ",.0f"),
        ("recv_rate", "recv+ack/s", ",.0f"),
        ("cpu_us", "srv µs/msg", ".1f"),
        ("client_cpu_s", "client CPU s", ".1f"),
        ("server_cpu_s", "server CPU s", ".1f"),
    ],
    "latency": [
        ("p50_ms", "p50 ms", ".2f"),
        ("p99_ms", "p99 ms", ".2f"),
        ("mean_ms", "mean ms", ".2f"),
        ("cpu_us", "srv µs/msg", ".0f"),
    ],
    "sizes": [
        ("rate", "msgs/s (1+1 batched)", ",.0f"),
        ("mb_s", "MiB/s", ",.1f"),
        ("seq_push_rate", "seq push/s", ",.0f"),
        ("seq_push_p50_ms", "p50 ms", ".2f"),
        ("cpu_us", "srv µs/msg", ".0f"),
    ],
    "floor": [
        ("push_rate", "calls/s", ",.0f"),
        ("push_p50_ms", "p50 ms", ".3f"),
        ("push_p99_ms", "p99 ms", ".3f"),
        ("push_cpu_us", "srv µs/call", ".0f"),
    ],
    "scale": [
        ("push_rate", "push/s", ",.0f"),
        ("push_p99_ms", "push p99 ms", ".2f"),
        ("push_cpu_us", "push srv µs", ".0f"),
        ("recv_rate", "recv+ack/s", ",.0f"),
        ("recv_p99_ms", "recv p99 ms", ".2f"),
        ("recv_cpu_us", "recv srv µs", ".0f"),
        ("rate", "batched msgs/s", ",.0f"),
        ("cpu_us", "srv µs/msg", ".1f"),
        ("rss_mb", "RSS MB", ".0f"),
        ("idle_core_pct", "idle % core", ".1f"),
    ],
}
# The metrics whose zdmq / peer ratio `doc_tables` shows as a column of its own.
RATIO_METRICS: dict[str, tuple[str, ...]] = {
    "sequential": ("push_rate", "recv_rate"),
    "throughput": ("rate",),
    "latency": ("p50_ms", "p99_ms"),
    "sizes": ("rate", "seq_push_rate"),
}
# Latency-like metrics: smaller is better, so the ratio is peer / zdmq.
_LOWER_IS_BETTER = ("_ms", "cpu_us")
TITLES = {
    "sequential": "sequential: one at a time, each push waits for its confirm; then receive+ack "
    "one at a time",
    "throughput": "throughput: producers and consumers at once, batched and pipelined",
    "latency": "latency: push to delivery at a fixed rate",
    "sizes": "sizes: 100 B to 1 MiB, one at a time and 1+1 batched",
    "floor": "floor: what one durable call costs on this machine without zdmq (no peers)",
    "scale": "scale: depth, queue count, node count and idle cost (zdmq alone)",
}


def medians(runs: list[list[Row]]) -> list[Row]:
    """One row per (system, durability, workload, variant): the median of each metric
    over the runs, with `runs` and each metric's raw values under `samples`."""
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    order: list[tuple[Any, ...]] = []
    for run in runs:
        for row in run:
            key = tuple(row[k] for k in _KEY)
            if key not in groups:
                order.append(key)
            groups[key].append(row)
    out = []
    for key in order:
        rows = groups[key]
        merged: Row = dict(zip(_KEY, key, strict=True))
        merged["runs"] = len(rows)
        samples: dict[str, list[Any]] = {}
        for metric in rows[0]:
            if metric in _KEY:
                continue
            values = [r.get(metric) for r in rows]
            nums = [v for v in values if isinstance(v, int | float) and not math.isnan(v)]
            if nums and len(nums) == len(values):
                merged[metric] = statistics.median(nums)
                samples[metric] = values
            else:
                merged[metric] = values[0]
        merged["samples"] = samples
        out.append(merged)
    return out


# A system that keeps copies on several servers: `zdmq 4 nodes fsync r3`, `nats r3 sync always`.
_REPLICATED = re.compile(r" r[2-9]\b")


def _zdmq_ref(rows: list[Row], row: Row) -> Row | None:
    """The zdmq row a peer row is compared with: same workload, variant and durability,
    and replicated (` r3` in the name) if the peer is; the first zdmq system listed (the
    single node) if there are several."""
    replicated = _REPLICATED.search(row["system"]) is not None
    for r in rows:
        if (
            r["system"].startswith("zdmq")
            and (_REPLICATED.search(r["system"]) is not None) == replicated
            and r["workload"] == row["workload"]
            and r["variant"] == row["variant"]
            and r["durability"] == row["durability"]
        ):
            return r
    return None


def ratio_rows(rows: list[Row]) -> list[Row]:
    """For every peer row: zdmq / peer on each metric (for latencies and CPU: peer /
    zdmq), so that > 1 always means zdmq is ahead."""
    out = []
    for row in rows:
        if row["system"].startswith("zdmq"):
            continue
        ref = _zdmq_ref(rows, row)
        if ref is None:
            continue
        ratios: Row = {k: row[k] for k in _KEY}
        ratios["zdmq_system"] = ref["system"]
        for metric, _, _ in COLUMNS.get(row["workload"], []):
            a, b = ref.get(metric), row.get(metric)
            if not (isinstance(a, int | float) and isinstance(b, int | float)) or not a or not b:
                continue
            lower = metric.endswith(_LOWER_IS_BETTER)
            ratios[metric] = (b / a) if lower else (a / b)
        out.append(ratios)
    return out


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int | float):
        return format(value, spec)
    return str(value)


def format_tables(rows: list[Row], *, markdown: bool = False) -> str:
    """One table per workload (rows in the order they ran), then the ratio table."""
    parts = []
    ratios = ratio_rows(rows)
    for workload, cols in COLUMNS.items():
        mine = [r for r in rows if r["workload"] == workload]
        if not mine:
            continue
        head = ["system", "durability", "variant", *(h for _, h, _ in cols)]
        body = [
            [r["system"], r["durability"], r["variant"], *(_fmt(r.get(m), f) for m, _, f in cols)]
            for r in mine
        ]
        parts.append(_table(TITLES[workload], head, body, markdown))
        rmine = [r for r in ratios if r["workload"] == workload]
        if rmine:
            rhead = ["zdmq / peer", "durability", "variant", *(h for _, h, _ in cols)]
            rbody = [
                [
                    f"{r['zdmq_system']} / {r['system']}",
                    r["durability"],
                    r["variant"],
                    *(_fmt(r.get(m), ".2f") for m, _, _ in cols),
                ]
                for r in rmine
            ]
            parts.append(_table("ratios (> 1: zdmq ahead)", rhead, rbody, markdown))
    return "\n\n".join(parts)


def _table(title: str, head: list[str], body: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(head) + " |"]
        lines.append("|" + "|".join("---" for _ in head) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = [title]
    lines.append(
        "  ".join(
            h.rjust(w) if i > 2 else h.ljust(w)
            for i, (h, w) in enumerate(zip(head, widths, strict=True))
        )
    )
    for row in body:
        lines.append(
            "  ".join(
                c.rjust(w) if i > 2 else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(lines)


def doc_tables(rows: list[Row]) -> str:
    """One markdown table per workload: every row's metrics, then a `zdmq ÷` column for
    each of the workload's RATIO_METRICS (> 1: zdmq ahead; empty on zdmq's own rows)."""
    ratios = {tuple(r[k] for k in _KEY): r for r in ratio_rows(rows)}
    parts = []
    for workload, cols in COLUMNS.items():
        mine = [r for r in rows if r["workload"] == workload]
        if not mine:
            continue
        headers = dict((m, h) for m, h, _ in cols)
        extra = RATIO_METRICS.get(workload, ())
        head = ["system", "durability", "variant", *(h for _, h, _ in cols)]
        head += [f"zdmq ÷ row, {headers[m]}" for m in extra]
        body = []
        for r in mine:
            line = [r["system"], r["durability"], r["variant"]]
            line += [_fmt(r.get(m), f) for m, _, f in cols]
            ratio = ratios.get(tuple(r[k] for k in _KEY), {})
            line += [_fmt(ratio.get(m), ".2f") if m in ratio else "" for m in extra]
            body.append(line)
        parts.append(_table(TITLES[workload], head, body, True))
    return "\n\n".join(parts)


def summary_table(rows: list[Row]) -> str:
    """One markdown line per system: one-at-a-time push (1 client) and receive+ack, the
    throughput workload with its server CPU per message, latency p50/p99, 1 MiB
    messages; the last column is the throughput ratio zdmq ÷ system (same durability).
    Empty when no row is of those workloads."""
    systems = list(dict.fromkeys(r["system"] for r in rows if r["workload"] in RATIO_METRICS))
    ratios = [r for r in ratio_rows(rows) if r["workload"] == "throughput"]

    def get(system: str, workload: str, variant: str | None, metric: str) -> Any:
        """`metric` of the system's first row of `workload` (and `variant`, if given)."""
        return next(
            (
                r.get(metric)
                for r in rows
                if r["system"] == system
                and r["workload"] == workload
                and variant in (None, r["variant"])
            ),
            None,
        )

    if not systems:
        return ""
    head = [
        "system",
        "fsync before confirm",
        "push/s one at a time (p50 ms)",
        "receive+ack/s one at a time",
        "msgs/s through, batched (server µs/msg)",
        "delivery p50 / p99 ms",
        "1 MiB msgs: MiB/s",
        "zdmq ÷ system, msgs/s through",
    ]
    body = []
    for system in systems:
        durability = next(r["durability"] for r in rows if r["system"] == system)
        ratio = next((r.get("rate") for r in ratios if r["system"] == system), None)
        body.append(
            [
                system,
                "yes" if durability == "fsync" else "no",
                f"{_fmt(get(system, 'sequential', '1 client', 'push_rate'), ',.0f')} "
                f"({_fmt(get(system, 'sequential', '1 client', 'push_p50_ms'), '.2f')})",
                _fmt(get(system, "sequential", "1 client", "recv_rate"), ",.0f"),
                f"{_fmt(get(system, 'throughput', None, 'rate'), ',.0f')} "
                f"({_fmt(get(system, 'throughput', None, 'cpu_us'), '.0f')})",
                f"{_fmt(get(system, 'latency', None, 'p50_ms'), '.2f')} / "
                f"{_fmt(get(system, 'latency', None, 'p99_ms'), '.2f')}",
                _fmt(get(system, "sizes", "1 MiB", "mb_s"), ",.1f"),
                _fmt(ratio, ".2f") if ratio is not None else "",
            ]
        )
    return _table("every system, one run", head, body, True)
