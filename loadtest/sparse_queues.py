"""Sparse queues on several nodes: what the metadata lists cost per message.

Workload (e)'s worst queue-count row, with the calls between nodes counted: a fresh cluster
of `--nodes` nodes, `--queues` empty queues, then `--messages` one-message pushes (one
client, 32 calls in flight, message i on queue i mod queues), then as many receive+acks.
With more queues than messages per node, almost every push is the first message of its
queue on its node: it registers with the queue's metadata owner first, tells the owner the
queue has visible messages, and the node unregisters once the receives empty it again.

Prints, per run, the rates, the nodes' CPU per message, and the registrations, ready
notices and unregistrations the nodes made beside the calls that carried them (their
`/v1/health` counters, summed over the nodes).

    .venv/bin/python loadtest/sparse_queues.py [--nodes 4] [--queues 10000]
        [--messages 20000] [--runs 1]

Runs against whichever zdmq is first on the import path (PYTHONPATH=/other/tree measures
another checkout).
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from collections import Counter
from dataclasses import replace

from zdmq.bench.driver import SystemSpec
from zdmq.bench.scale import ScaleKnobs, _cpu_us, _create_queues, _spread, _system
from zdmq.bench.workloads import run_uvloop
from zdmq.config import ClusterConfig

# What the nodes made (registrations, ready notices to other nodes, unregistrations) and
# the calls that carried them.
_COUNTED = (
    "registrations",
    "registration_calls",
    "ready_notices",
    "ready_calls",
    "unregistrations",
    "unregistration_calls",
)


def _counters(spec: SystemSpec) -> Counter[str]:
    config = ClusterConfig.load(spec.options["config"])
    total: Counter[str] = Counter()
    for node in config.nodes:
        with urllib.request.urlopen(node.url + "/v1/health", timeout=10) as reply:
            counters = json.load(reply)["counters"]
        total.update({k: int(counters.get(k, 0)) for k in _COUNTED})
    return total


def run_once(nodes: int, queues: int, messages: int) -> dict[str, float]:
    knobs = replace(ScaleKnobs(), queue_msgs=messages)
    with _system(nodes, knobs) as spec:
        names = [f"sparse-q{i:06d}" for i in range(queues)]
        run_uvloop(_create_queues(spec, names, knobs.queue_inflight))
        c0 = _counters(spec)
        push = run_uvloop(_spread(spec, names, messages, knobs, "push"))
        c1 = _counters(spec)
        recv = run_uvloop(_spread(spec, names, messages, knobs, "recv"))
        c2 = _counters(spec)
    return {
        "push_rate": push["rate"],
        "push_cpu_us": _cpu_us(push["cpu_s"], messages),
        "recv_rate": recv["rate"],
        "recv_cpu_us": _cpu_us(recv["cpu_s"], messages),
        **{f"push_{k}": float((c1 - c0)[k]) for k in _COUNTED},
        **{f"recv_{k}": float((c2 - c1)[k]) for k in _COUNTED},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    print(f"{args.nodes} nodes, {args.queues:,} queues, {args.messages:,} messages")
    print(
        "| run | push/s | push µs/msg | recv+ack/s | recv µs/msg "
        "| registrations (calls) | ready notices (calls) | unregistrations (calls) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for i in range(args.runs):
        r = run_once(args.nodes, args.queues, args.messages)
        # Unregistrations happen during the receives, or after a grace (counted when due).
        unreg = r["push_unregistrations"] + r["recv_unregistrations"]
        unreg_calls = r["push_unregistration_calls"] + r["recv_unregistration_calls"]
        print(
            f"| {i + 1} | {r['push_rate']:,.0f} | {r['push_cpu_us']:.0f} "
            f"| {r['recv_rate']:,.0f} | {r['recv_cpu_us']:.0f} "
            f"| {r['push_registrations']:,.0f} ({r['push_registration_calls']:,.0f}) "
            f"| {r['push_ready_notices'] + r['recv_ready_notices']:,.0f} "
            f"({r['push_ready_calls'] + r['recv_ready_calls']:,.0f}) "
            f"| {unreg:,.0f} ({unreg_calls:,.0f}) |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
