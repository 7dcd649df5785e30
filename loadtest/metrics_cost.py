"""What Prometheus metrics, request ids and JSON logs cost: workload (b) with them on and
off, in the same run.

    .venv/bin/python loadtest/metrics_cost.py [--rounds 8] [--messages 300000]
        [--clusters 1x1 4x1 4x3] [--out DIR]

A cluster is NODESxREPLICATION: `4x3` is the default cluster.yaml's shape. Each round runs
`zdmq bench --workloads throughput --durability fsync --peers none --runs 1` on a fresh
cluster of each shape twice: "on" with `ZDMQ_METRICS=on` (the default) and
`ZDMQ_LOG_FORMAT=json` in the nodes' environment, "off" with `ZDMQ_METRICS=off` (no metrics
kept, no request ids) and the text log format; the order alternates from round to round so
that a drift of the machine falls on both. Printed: per
cluster, the median rate and node CPU per message of each mode, and the median and range
of the per-round ratios on ÷ off (a ratio of 0.95 is a 5% cost). Every bench JSON is kept in --out.

Run it on an otherwise idle machine: on 2 cores, anything else running moves the rate
of identical runs by more than the cost measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("on", "off")
ENV = {
    "on": {"ZDMQ_METRICS": "on", "ZDMQ_LOG_FORMAT": "json"},
    "off": {"ZDMQ_METRICS": "off", "ZDMQ_LOG_FORMAT": "text"},
}


def bench(mode: str, shape: str, messages: int, out: Path) -> dict[str, dict[str, float]]:
    """One `zdmq bench` throughput run with metrics `mode` on a cluster of `shape`: its
    rows by system name."""
    nodes, replication = shape.split("x")
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "zdmq.cli", "bench", "--workloads", "throughput"]
    cmd += ["--durability", "fsync", "--peers", "none", "--runs", "1"]
    cmd += ["--messages", str(messages), "--out", str(out)]
    cmd += ["--nodes", nodes, "--replication", replication]
    env = {**os.environ, **ENV[mode]}
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    (report,) = out.glob("bench-*.json")
    rows = json.loads(report.read_text())["rows"]
    return {
        r["system"]: {"rate": r["rate"], "cpu_us": r["cpu_us"]}
        for r in rows
        if r["workload"] == "throughput"
    }


def table(runs: list[dict[str, dict[str, dict[str, float]]]]) -> str:
    """Markdown: per system, medians of each mode and of the per-round ratios."""
    lines = [
        "| 4+4 batched, fsync | msgs/s, on | msgs/s, off | on ÷ off (range) "
        "| node CPU µs/msg, on | off | on ÷ off |",
        "|---|---|---|---|---|---|---|",
    ]
    for system in runs[0]["on"]:
        on = [r["on"][system] for r in runs]
        off = [r["off"][system] for r in runs]
        rate_ratios = [a["rate"] / b["rate"] for a, b in zip(on, off, strict=True)]
        cpu_ratios = [a["cpu_us"] / b["cpu_us"] for a, b in zip(on, off, strict=True)]
        med = statistics.median
        lines.append(
            f"| {system} | {med(x['rate'] for x in on):,.0f} | {med(x['rate'] for x in off):,.0f}"
            f" | {med(rate_ratios):.3f} ({min(rate_ratios):.2f}-{max(rate_ratios):.2f})"
            f" | {med(x['cpu_us'] for x in on):.1f} | {med(x['cpu_us'] for x in off):.1f}"
            f" | {med(cpu_ratios):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="rounds of one run each way")
    p.add_argument("--messages", type=int, default=300_000, help="messages a run moves")
    p.add_argument(
        "--clusters", nargs="+", default=["1x1", "4x1", "4x3"], help="NODESxREPLICATION each"
    )
    p.add_argument("--out", type=Path, help="folder for every run's JSON (default: a temp dir)")
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="zdmq-metrics-cost-"))
    runs: list[dict[str, dict[str, dict[str, float]]]] = []
    for i in range(args.rounds):
        order = MODES if i % 2 == 0 else MODES[::-1]
        result: dict[str, dict[str, dict[str, float]]] = {mode: {} for mode in MODES}
        for shape in args.clusters:
            for mode in order:
                run = out / f"round{i + 1}-{shape}-{mode}"
                result[mode].update(bench(mode, shape, args.messages, run))
        runs.append(result)
        print(
            f"round {i + 1}/{args.rounds}: "
            + ", ".join(
                f"{s} {result['on'][s]['rate']:,.0f} on / {result['off'][s]['rate']:,.0f} off"
                for s in result["on"]
            ),
            flush=True,
        )
    summary = table(runs)
    (out / "summary.md").write_text(summary + "\n")
    (out / "runs.json").write_text(json.dumps(runs, indent=1))
    print(f"\n{summary}\n\nruns kept in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
