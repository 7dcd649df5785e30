"""The Python half of `loadtest/run_locust.sh`: the cluster, the CPU accounts, the summary.

    locust_report.py cluster --dir D --nodes 4 --durability fsync --state D/cluster.json
            [--restart S]
        Starts a `LocalCluster.ephemeral` in D (ports the kernel picks, no race), writes
        the state file (config path, node pids) once every node printed READY, prints
        `READY <config>`, and runs until SIGTERM or until its parent (the script) dies;
        then it stops the nodes. A node that exits stops the rest, or with --restart is
        started again S seconds later (its new pid in the state file). It runs in a
        session of its own, so a Ctrl-C in the terminal reaches Locust (which then writes
        its reports) but not the nodes.
    locust_report.py run --state D/cluster.json --cpu OUT/cpu.json
            [--metrics OUT/metrics.json [--kill-leader S]] -- locust ARGS...
        Reads the nodes' CPU time from /proc/<pid>/stat, runs Locust as its child, reads
        the nodes' CPU again after Locust exits, and takes Locust's CPU time (the master
        and the worker processes it reaped) from wait4's resource usage; samples both
        every 0.25 s (cpu_samples.json) so the summary can cut out the window in which
        requests ran; reads the nodes' message counters (/v1/health) before and after.
        Writes cpu.json. With --metrics, checks the nodes' /metrics as Locust runs and
        after (loadtest/metrics_watch.py), kills a leader S s in with --kill-leader, and
        exits 3 when Locust passed and those checks did not.
    locust_report.py summary --csv OUT/locust [--cpu OUT/cpu.json] [--json OUT/summary.json]
        Reads OUT/locust.json (Locust's --json-file: final, where the CSV may miss the last
        second) and OUT/locust_failures.csv; prints requests/s, failures, p50/p99 per
        operation and the CPU of both sides per request.

cpu.json holds two accounts: `whole_run`, from before Locust started to after it exited
(Locust's start-up and shutdown, about a second of its CPU, included; the nodes idle
then), and `during_requests`, from the first request to the last, cut out of the samples:
the per-request and per-message figures use that one.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import csv
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

TICKS_S = os.sysconf("SC_CLK_TCK")
METRICS_FAILED = 3  # `run`'s status when Locust passed and the metrics checks did not


# ---- CPU time from /proc ----------------------------------------------------------------
def cpu_user_sys_s(pid: int) -> tuple[float, float] | None:
    """User and system CPU seconds of a live process (all its threads), None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return utime / TICKS_S, stime / TICKS_S


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process, None if it is gone."""
    us = cpu_user_sys_s(pid)
    return us[0] + us[1] if us is not None else None


# ---- the nodes' own message counters -----------------------------------------------------
COUNTED = ("pushed", "popped", "received", "acked")


def message_counters(urls: dict[str, str]) -> dict[str, int] | None:
    """The nodes' message counters (GET /v1/health), summed; None if a node did not answer."""
    total = dict.fromkeys(COUNTED, 0)
    for url in urls.values():
        try:
            with urllib.request.urlopen(f"{url}/v1/health", timeout=10) as reply:
                counters = json.loads(reply.read())["counters"]
        except (OSError, ValueError, KeyError):
            return None
        for k in COUNTED:
            total[k] += int(counters.get(k, 0))
    return total


def save_metrics(urls: dict[str, str], out: Path) -> None:
    """Each node's Prometheus metrics (GET /metrics) as the run left them, in
    `out/metrics-<node>.prom`; a node that does not answer is left out."""
    for node, url in urls.items():
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
                (out / f"metrics-{node}.prom").write_bytes(reply.read())
        except OSError:
            continue


# ---- cluster ----------------------------------------------------------------------------
def cmd_cluster(args: argparse.Namespace) -> int:
    from zdmq.local import LocalCluster

    # Out of the terminal's process group: Ctrl-C is for Locust only. (EPERM: already a
    # group leader, as when started by hand from an interactive shell; then it stays.)
    with contextlib.suppress(PermissionError):
        os.setsid()
    parent = os.getppid()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = LocalCluster.ephemeral(
        args.dir, nodes=args.nodes, replication=args.replication, durability=args.durability
    )
    status = 0
    try:
        cluster.start(timeout_s=60)
        state = {
            "config": str(cluster.config_path),
            "durability": args.durability,
            "nodes": {n.node_id: n.pid for n in cluster.nodes.values()},
            "urls": {i: cluster.config.node(i).url for i in cluster.nodes},
            "helper_pid": os.getpid(),
        }
        tmp = Path(args.state).with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.rename(args.state)
        print(f"READY {cluster.config_path}", flush=True)
        died: dict[str, float] = {}  # node -> when it was first seen gone (--restart)
        while not stop.wait(0.5):
            if os.getppid() != parent:
                print("cluster: the script is gone; stopping the nodes", file=sys.stderr)
                break
            dead = [n.node_id for n in cluster.nodes.values() if not n.running]
            if dead and args.restart is not None:
                # As systemd's Restart=always with RestartSec: start it again a while
                # later, and say its new pid.
                now = time.monotonic()
                for node in dead:
                    since = died.setdefault(node, now)
                    if now - since >= args.restart:
                        print(f"cluster: node {node} exited; starting it again", file=sys.stderr)
                        cluster.start_node(node)
                        del died[node]
                state["nodes"] = {n.node_id: n.pid for n in cluster.nodes.values()}
                tmp.write_text(json.dumps(state, indent=2))
                tmp.rename(args.state)
            elif dead:
                print(f"cluster: node(s) {dead} exited; stopping the rest", file=sys.stderr)
                status = 1
                break
    except (RuntimeError, TimeoutError) as e:
        print(f"cluster: {e}", file=sys.stderr)
        status = 1
    finally:
        cluster.close()
    return status


# ---- run Locust, account CPU ------------------------------------------------------------
def descendants(pid: int) -> list[int]:
    """pid and every process below it (Locust's workers are forked children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            with contextlib.suppress(OSError):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
    return found


def cmd_run(args: argparse.Namespace) -> int:
    state = json.loads(Path(args.state).read_text())
    nodes: dict[str, int] = state["nodes"]
    argv = args.locust
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise SystemExit("run: give the locust command after --")
    counted_before = message_counters(state["urls"])
    before = {n: cpu_user_sys_s(pid) for n, pid in nodes.items()}
    watch = None
    if args.metrics:
        from metrics_watch import MetricsWatch, state_file

        urls, pids = state_file(Path(args.state))
        watch = MetricsWatch(urls, pids, args.metrics_interval, args.kill_leader)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv)
    if watch is not None:
        watch.start()
    # Ctrl-C belongs to Locust: it stops the users and writes its reports; wait for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A CPU timeline of every node and Locust process, so that the summary can cut out
    # the window in which requests ran (Locust's start-up and shutdown left out).
    times: list[float] = []
    node_cpu: dict[str, list[float | None]] = {n: [] for n in nodes}
    locust_cpu: dict[int, list[float | None]] = {}
    while True:
        pid, wstatus, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        now = time.time()  # epoch seconds, as Locust stamps its statistics
        times.append(now)
        for n, npid in nodes.items():
            node_cpu[n].append(cpu_s(npid))
        for lpid in descendants(proc.pid):
            series = locust_cpu.setdefault(lpid, [None] * (len(times) - 1))
            series.append(cpu_s(lpid))
        for series in locust_cpu.values():
            if len(series) < len(times):
                series.append(None)
        time.sleep(args.sample_s)
    proc.returncode = os.waitstatus_to_exitcode(wstatus)
    wall_s = time.monotonic() - t0
    if watch is not None:
        from metrics_watch import print_report

        metrics = watch.finish()
        Path(args.metrics).write_text(json.dumps(metrics, indent=2) + "\n")
        print_report(metrics)
    after = {n: cpu_user_sys_s(pid) for n, pid in nodes.items()}
    counted_after = message_counters(state["urls"])
    save_metrics(state["urls"], Path(args.cpu).parent)
    messages = None
    if counted_before is not None and counted_after is not None:
        messages = {k: counted_after[k] - counted_before[k] for k in COUNTED}
    per_node: dict[str, float | None] = {}
    user_s = sys_s = 0.0
    for n in nodes:
        b, a = before[n], after[n]
        if a is None or b is None:
            per_node[n] = None
            continue
        per_node[n] = round(a[0] + a[1] - b[0] - b[1], 3)
        user_s += a[0] - b[0]
        sys_s += a[1] - b[1]
    report = {
        "durability": state.get("durability"),
        "cores": os.cpu_count(),
        "locust_exit_code": proc.returncode,
        # Messages the nodes counted while Locust ran (None: a node did not answer).
        "messages": messages,
        # Before Locust started to after it exited: its start-up and shutdown included.
        "whole_run": {
            "wall_s": round(wall_s, 3),
            "zdmq_cpu_s": round(sum(v for v in per_node.values() if v is not None), 3),
            "zdmq_user_s": round(user_s, 3),
            "zdmq_sys_s": round(sys_s, 3),
            "zdmq_cpu_s_per_node": per_node,
            "zdmq_nodes_gone": [n for n, v in per_node.items() if v is None],
            # wait4: the master and the workers it reaped.
            "locust_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "locust_user_s": round(usage.ru_utime, 3),
            "locust_sys_s": round(usage.ru_stime, 3),
        },
    }
    samples = {
        "time": times,
        "nodes": node_cpu,
        "locust": {str(k): v for k, v in locust_cpu.items()},
    }
    Path(args.cpu).write_text(json.dumps(report, indent=2) + "\n")
    samples_path(args.cpu).write_text(json.dumps(samples) + "\n")
    if watch is not None and not metrics["passed"] and proc.returncode == 0:
        return METRICS_FAILED
    return proc.returncode


def _cpu_at(times: list[float], series: list[float | None], t: float) -> float | None:
    """A process's CPU seconds at time t, interpolated between samples."""
    pts = [(x, v) for x, v in zip(times, series, strict=True) if v is not None]
    if not pts:
        return None
    if t <= pts[0][0]:
        return pts[0][1]
    if t >= pts[-1][0]:
        return pts[-1][1]
    i = bisect.bisect_right([x for x, _ in pts], t)
    (x0, v0), (x1, v1) = pts[i - 1], pts[i]
    return v0 + (v1 - v0) * (t - x0) / (x1 - x0)


def samples_path(cpu_path: str | Path) -> Path:
    return Path(cpu_path).with_name("cpu_samples.json")


def cpu_window(smp: dict[str, Any], start: float, end: float, requests: int) -> dict[str, Any]:
    """CPU seconds of the nodes and of Locust between two epoch times, and per request."""

    def used(series: list[float | None]) -> float:
        a, b = _cpu_at(smp["time"], series, start), _cpu_at(smp["time"], series, end)
        return b - a if a is not None and b is not None else 0.0

    nodes = {n: round(used(v), 3) for n, v in smp["nodes"].items()}
    procs = {p: round(used(v), 3) for p, v in smp["locust"].items()}
    span = max(end - start, 1e-9)
    zdmq, locust = sum(nodes.values()), sum(procs.values())
    per_req = 1e6 / requests if requests else 0.0
    return {
        "span_s": round(span, 3),
        "zdmq_cpu_s": round(zdmq, 3),
        "zdmq_cores": round(zdmq / span, 3),
        "zdmq_cpu_us_per_request": round(zdmq * per_req, 1),
        "zdmq_cpu_s_per_node": nodes,
        "locust_cpu_s": round(locust, 3),
        "locust_cores": round(locust / span, 3),
        "locust_cpu_us_per_request": round(locust * per_req, 1),
        "locust_cpu_s_per_process": procs,
    }


# ---- summary ----------------------------------------------------------------------------
# Locust rewrites its _stats.csv once a second, so the CSV can miss the last second of a
# run; the --json-file it writes at shutdown holds every request: the summary reads that.
def percentile(hist: dict[float, int], total: int, p: float) -> float:
    """The response time (ms, Locust's rounded buckets) under which a fraction p of calls fell."""
    if not total:
        return 0.0
    need = max(1, math.ceil(total * p))
    seen = 0
    for ms in sorted(hist):
        seen += hist[ms]
        if seen >= need:
            return ms
    return max(hist)


def _span_s(rows: list[dict[str, Any]]) -> float:
    ends = [r["last_request_timestamp"] for r in rows if r["last_request_timestamp"]]
    return max(ends) - min(r["start_time"] for r in rows) if ends else 0.0


def _entry(name: str, rows: list[dict[str, Any]], span: float) -> dict[str, Any]:
    hist: Counter[float] = Counter()
    for r in rows:
        hist.update({float(k): int(v) for k, v in r["response_times"].items()})
    n = sum(int(r["num_requests"]) for r in rows)
    return {
        "name": name,
        "requests": n,
        "failures": sum(int(r["num_failures"]) for r in rows),
        "rps": n / span if span > 0 else 0.0,
        "mean_ms": sum(r["total_response_time"] for r in rows) / n if n else 0.0,
        "p50_ms": percentile(hist, n, 0.50),
        "p99_ms": percentile(hist, n, 0.99),
        "max_ms": max((r["max_response_time"] for r in rows), default=0.0),
    }


def read_failures(prefix: str) -> list[dict[str, str]]:
    path = Path(f"{prefix}_failures.csv")
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def summarize(prefix: str, cpu_path: str | None) -> dict[str, Any]:
    """Per operation and in total: requests, failures, req/s, p50/p99; CPU per request.

    With `cpu_path`, the CPU of the window in which requests ran is added to cpu.json
    (`during_requests`) and to the summary."""
    rows: list[dict[str, Any]] = json.loads(Path(f"{prefix}.json").read_text())
    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r)
    # Every rate is over the whole run's span, so the operations' rates add up to the total.
    span = _span_s(rows)
    ops = [_entry(name, by_name[name], span) for name in sorted(by_name)]
    total = _entry("Aggregated", rows, span)
    out: dict[str, Any] = {"operations": ops, "total": total, "span_s": round(span, 3)}
    if cpu_path and Path(cpu_path).exists() and rows:
        cpu = json.loads(Path(cpu_path).read_text())
        samples = json.loads(samples_path(cpu_path).read_text())
        start = min(r["start_time"] for r in rows)
        window = cpu_window(samples, start, start + span, total["requests"])
        if cpu.get("messages") and cpu["messages"]["pushed"]:
            pushed = cpu["messages"]["pushed"]
            window["zdmq_cpu_us_per_message_pushed"] = round(window["zdmq_cpu_s"] / pushed * 1e6, 1)
        cpu["during_requests"] = window
        Path(cpu_path).write_text(json.dumps(cpu, indent=2) + "\n")
        out["cpu"] = cpu
    out["failure_kinds"] = [
        {"name": f["Name"], "error": f["Error"], "occurrences": int(f["Occurrences"] or 0)}
        for f in read_failures(prefix)
    ]
    return out


def print_summary(s: dict[str, Any]) -> None:
    print(f"{'operation':<20}{'requests':>10}{'fails':>8}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for e in [*s["operations"], s["total"]]:
        print(
            f"{e['name']:<20}{e['requests']:>10}{e['failures']:>8}{e['rps']:>10.1f}"
            f"{e['p50_ms']:>9.1f}{e['p99_ms']:>9.1f}"
        )
    cpu = s.get("cpu")
    if cpu:
        w, whole = cpu["during_requests"], cpu["whole_run"]
        print(
            f"CPU while requests ran ({w['span_s']:.1f} s, {cpu['cores']} cores, "
            f"{cpu['durability']}): zdmq nodes {w['zdmq_cpu_s']:.2f} s = {w['zdmq_cores']:.2f} "
            f"cores, {w['zdmq_cpu_us_per_request']:.0f} µs/request; locust "
            f"{w['locust_cpu_s']:.2f} s = {w['locust_cores']:.2f} cores, "
            f"{w['locust_cpu_us_per_request']:.0f} µs/request"
        )
        msgs = cpu.get("messages")
        if msgs:
            rates = ", ".join(f"{k} {v} ({v / w['span_s']:.0f}/s)" for k, v in msgs.items())
            print(f"  messages the nodes counted: {rates}")
            if "zdmq_cpu_us_per_message_pushed" in w:
                print(
                    f"  zdmq CPU per message pushed: {w['zdmq_cpu_us_per_message_pushed']:.0f} µs"
                )
        per_node = ", ".join(f"{n} {v:.2f}" for n, v in w["zdmq_cpu_s_per_node"].items())
        print(f"  zdmq CPU s per node: {per_node}")
        print(
            f"whole run ({whole['wall_s']:.1f} s, Locust start-up and shutdown included): "
            f"zdmq {whole['zdmq_cpu_s']:.2f} s (user {whole['zdmq_user_s']:.2f}, "
            f"system {whole['zdmq_sys_s']:.2f}), locust {whole['locust_cpu_s']:.2f} s "
            f"(user {whole['locust_user_s']:.2f}, system {whole['locust_sys_s']:.2f})"
        )
        if whole["zdmq_nodes_gone"]:
            print(f"WARNING: node(s) {whole['zdmq_nodes_gone']} exited during the run")
    for f in s["failure_kinds"][:10]:
        print(f"failure: {f['name']}: {f['occurrences']}x {f['error'][:200]}")


def cmd_summary(args: argparse.Namespace) -> int:
    s = summarize(args.csv, args.cpu)
    print_summary(s)
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("cluster", help="run a local cluster until SIGTERM")
    p.add_argument("--dir", required=True)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--replication", type=int, default=1)
    p.add_argument("--durability", choices=("fsync", "os", "memory"), default="fsync")
    p.add_argument("--state", required=True, help="where to write the config path and pids")
    p.add_argument(
        "--restart", type=float, metavar="S", help="start a node that exits again, S s later"
    )
    p = sub.add_parser("run", help="run locust, account the CPU of it and of the nodes")
    p.add_argument("--state", required=True)
    p.add_argument("--cpu", required=True, help="cpu.json to write")
    p.add_argument("--sample-s", type=float, default=0.25, help="CPU sampling interval")
    p.add_argument("--metrics", help="check the nodes' /metrics as Locust runs; write here")
    p.add_argument("--metrics-interval", type=float, default=1.0, help="seconds between reads")
    p.add_argument(
        "--kill-leader",
        type=float,
        metavar="S",
        help="S seconds in, SIGKILL the node leading the most replica groups (--metrics)",
    )
    p.add_argument("locust", nargs=argparse.REMAINDER)
    p = sub.add_parser("summary", help="print the summary of a run")
    p.add_argument("--csv", required=True, help="the --csv/--json-file prefix given to locust")
    p.add_argument("--cpu", help="cpu.json of the run")
    p.add_argument("--json", help="also write the summary here")
    args = ap.parse_args(argv)
    return {"cluster": cmd_cluster, "run": cmd_run, "summary": cmd_summary}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
