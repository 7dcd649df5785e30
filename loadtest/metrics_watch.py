"""The nodes' Prometheus metrics under load: `run_locust.sh` checks them as Locust runs.

    loadtest/run_locust.sh --replication 3 -t 20s --kill-leader 8 --routing zerohop
    # or against a cluster that runs already (no kill), while a load runs on it:
    .venv/bin/python loadtest/metrics_watch.py --config cluster.yaml --seconds 30

Every `interval_s` while Locust runs, every node's `GET /metrics` is read and parsed with
prometheus-client's own parser. Checked, and written to metrics.json:

- `scrapes`: every answer parsed (`parse_errors` 0); a node answered every time, but the
  killed node between its kill and its restart;
- `moved`: the counters of every node moved during the run (the HTTP requests of clients,
  and the messages pushed, cluster-wide);
- `kill` (with `kill_after_s`): that far into the run the node leading the most replica
  groups is killed with SIGKILL (the cluster helper starts it again 3 s later, as systemd's
  `Restart=always` would); then the other members of each group it led are read every
  0.1 s until all of them counted a leader change, one of them an election, and exactly
  one leads. The time that took is checked against the election timeout (a follower
  campaigns 1 to 2 election timeouts after the last heartbeat) plus one scrape interval;
- `depth`: after Locust stops, every queue's depth and in-flight gauges equal its stats
  endpoint (`GET /v1/queues/{queue}`): a node reports the queues of the groups it leads,
  so its gauge is the sum of the depth of those groups; retried for up to 15 s while
  leaders settle.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from zdmq.server.replicas import ELECTION_TICKS, TICK_S

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

ELECTION_TIMEOUT_S = 2 * ELECTION_TICKS * TICK_S
KILL_POLL_S = 0.1
SETTLE_S = 15.0


class ParseError(Exception):
    """A node answered /metrics with something prometheus-client's parser refuses."""


def scrape(url: str, timeout_s: float = 5.0) -> Samples:
    """Every sample of one node's /metrics; OSError if it does not answer."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as reply:
        text = reply.read().decode()
    out: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    except ValueError as e:
        raise ParseError(str(e)) from e
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def get_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return json.loads(reply.read())


def healths(urls: dict[str, str]) -> dict[str, dict[str, Any]]:
    """GET /v1/health of every node that answers."""
    out = {}
    for node, url in urls.items():
        try:
            out[node] = get_json(f"{url}/v1/health")
        except (OSError, ValueError):
            continue
    return out


def leaders(seen: dict[str, dict[str, Any]]) -> dict[str, str]:
    """group -> the node that says it leads it, from the nodes' healths (a group
    without one is left out)."""
    return {
        g: node
        for node, h in seen.items()
        for g, s in (h.get("groups") or {}).items()
        if s.get("role") == "leader"
    }


class MetricsWatch(threading.Thread):
    """Reads every node's /metrics until `stop()`; `finish()` checks the depths and
    returns the report."""

    def __init__(
        self,
        urls: dict[str, str],
        pids: Callable[[], dict[str, int]],
        interval_s: float = 1.0,
        kill_after_s: float | None = None,
    ) -> None:
        """`urls`: node -> base URL; `pids`: node -> the pid of its process now (read
        again at every scrape: a restarted node's counters start again from 0)."""
        super().__init__(name="metrics-watch", daemon=True)
        self.urls = urls
        self.pids = pids
        self.interval_s = interval_s
        self.kill_after_s = kill_after_s
        self._halt = threading.Event()
        self.scrapes = {n: {"ok": 0, "unreachable": 0, "parse_errors": 0} for n in self.urls}
        self.errors: list[str] = []
        # node -> (pid, first samples, last samples) of the process now running there
        self.spans: dict[str, list[tuple[int, Samples, Samples]]] = {n: [] for n in self.urls}
        self.kill: dict[str, Any] | None = None
        self.started = time.monotonic()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                tick = time.monotonic()
                self._scrape_all()
                due = self.kill_after_s is not None and self.kill is None
                if due and tick - self.started >= (self.kill_after_s or 0.0):
                    self._kill_a_leader()
                self._halt.wait(max(0.0, self.interval_s - (time.monotonic() - tick)))
        except Exception as e:  # the report says so, rather than a thread dying unseen
            self.errors.append(f"the watch stopped: {type(e).__name__}: {e}")
            if self.kill_after_s is not None and self.kill is None:
                self.kill = {"error": f"no kill: the watch stopped ({e})"}

    def _scrape_all(self) -> None:
        pids = self.pids()
        for node, url in self.urls.items():
            try:
                samples = scrape(url)
            except ParseError as e:
                self.scrapes[node]["parse_errors"] += 1
                self.errors.append(f"{node}: /metrics did not parse: {e}")
                continue
            except OSError:
                self.scrapes[node]["unreachable"] += 1
                continue
            self.scrapes[node]["ok"] += 1
            spans = self.spans[node]
            if spans and spans[-1][0] == pids[node]:
                pid, first, _ = spans[-1]
                spans[-1] = (pid, first, samples)
            else:
                spans.append((pids[node], samples, samples))

    def _kill_a_leader(self) -> None:
        health = healths(self.urls)
        led = leaders(health)
        if not led:
            self.kill = {"error": "no group had a leader to kill"}
            return
        counts: dict[str, int] = {}
        for node in led.values():
            counts[node] = counts.get(node, 0) + 1
        victim = max(sorted(counts), key=lambda n: counts[n])
        groups = sorted(g for g, n in led.items() if n == victim)
        members = {
            g: sorted(n for n, h in health.items() if g in (h.get("groups") or {})) for g in groups
        }
        others = {g: [n for n in ms if n != victim] for g, ms in members.items()}
        watched = sorted({n for ns in others.values() for n in ns})
        before = {n: scrape(self.urls[n]) for n in watched}
        pid = self.pids()[victim]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        seen: dict[str, float] = {}
        while len(seen) < len(groups) and time.monotonic() - killed < SETTLE_S:
            now = {}
            for n in watched:
                try:
                    now[n] = scrape(self.urls[n], timeout_s=1.0)
                except OSError:
                    continue
            for g in groups:
                if g not in seen and replaced(g, others[g], before, now):
                    seen[g] = round(time.monotonic() - killed, 3)
            time.sleep(KILL_POLL_S)
        self.kill = {
            "node": victim,
            "pid": pid,
            "groups": groups,
            "members": members,
            "seen_after_s": seen,
            "limit_s": ELECTION_TIMEOUT_S + self.interval_s,
        }

    def finish(self) -> dict[str, Any]:
        """After Locust stopped: the depth check, then the report."""
        self.stop()
        self.join()
        self._scrape_all()
        depth = self._depth_check()
        failed = list(self.errors)
        for node, n in self.scrapes.items():
            killed = self.kill is not None and self.kill.get("node") == node
            if n["unreachable"] and not killed:
                failed.append(f"{node}: /metrics did not answer {n['unreachable']} time(s)")
            if not n["ok"]:
                failed.append(f"{node}: no /metrics answer at all")
        went = {node: moved(spans) for node, spans in self.spans.items()}
        failed += [
            f"{n}: its client request counters did not move" for n, m in went.items() if not m
        ]
        pushed = sum(
            total(spans[-1][2], "zdmq_messages_pushed_total")
            - total(spans[-1][1], "zdmq_messages_pushed_total")
            for spans in self.spans.values()
            if spans
        )
        if pushed <= 0:
            failed.append("zdmq_messages_pushed_total did not move on any node")
        if self.kill_after_s is not None:
            k = self.kill
            if k is None:
                failed.append("the run ended before the kill was due")
            elif "error" in k:
                failed.append(k["error"])
            else:
                for g in k["groups"]:
                    at = k["seen_after_s"].get(g)
                    if at is None:
                        failed.append(f"group {g}: no leader change and election seen")
                    elif at > k["limit_s"]:
                        failed.append(f"group {g}: seen after {at} s, over {k['limit_s']} s")
        failed += depth["mismatches"]
        return {
            "interval_s": self.interval_s,
            "election_timeout_s": ELECTION_TIMEOUT_S,
            "scrapes": self.scrapes,
            "moved": went,
            "pushed_counted": pushed,
            "kill": self.kill,
            "depth": depth,
            "failed": failed,
            "passed": not failed,
        }

    def _depth_check(self) -> dict[str, Any]:
        deadline = time.monotonic() + SETTLE_S
        while True:
            result = self._compare_depths()
            if not result["mismatches"] or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def _compare_depths(self) -> dict[str, Any]:
        any_url = next(iter(self.urls.values()))
        led = leaders(healths(self.urls))
        samples = {}
        for node, url in self.urls.items():
            try:
                samples[node] = scrape(url)
            except OSError as e:
                return {"queues": {}, "mismatches": [f"{node}: /metrics: {e}"]}
        try:
            queues = get_json(f"{any_url}/v1/queues")["queues"]
            stats = {q: get_json(f"{any_url}/v1/queues/{q}") for q in queues}
        except (OSError, ValueError, KeyError) as e:
            return {"queues": {}, "mismatches": [f"stats: {e}"]}
        return compare_depths(stats, led, samples)


def compare_depths(
    stats: dict[str, dict[str, Any]], led: dict[str, str], samples: dict[str, Samples]
) -> dict[str, Any]:
    """Each queue's depth gauges against its stats: a node's gauge is the sum of the
    depth of the groups it leads (`led`: group -> leader); in-flight gauges add up to the
    stats' in flight. A group without a known leader is taken to lead itself."""
    report: dict[str, Any] = {}
    mismatches = []
    for q, s in stats.items():
        want = dict.fromkeys(samples, 0)
        for g, d in s["depth"].items():
            leader = led.get(g, g)
            want[leader] = want.get(leader, 0) + d
        got = {n: total(samples[n], "zdmq_queue_messages", queue=q) for n in samples}
        flight = sum(total(samples[n], "zdmq_queue_in_flight", queue=q) for n in samples)
        report[q] = {
            "stats_depth": s["depth"],
            "leaders": {g: led.get(g) for g in s["depth"]},
            "gauges": got,
            "stats_in_flight": s["in_flight"],
            "in_flight_gauges": flight,
        }
        if got != want:
            mismatches.append(f"{q}: depth gauges {got} against the stats' {want}")
        if flight != s["in_flight"]:
            mismatches.append(f"{q}: in-flight gauges {flight} against {s['in_flight']}")
    if not stats:
        mismatches.append("no queue to compare")
    return {"queues": report, "mismatches": mismatches}


def replaced(
    group: str, members: list[str], before: dict[str, Samples], now: dict[str, Samples]
) -> bool:
    """Every surviving member counted a leader change of `group`, one an election, and
    exactly one leads it."""
    if any(n not in now for n in members):
        return False

    def grew(name: str, n: str) -> float:
        return total(now[n], name, group=group) - total(before[n], name, group=group)

    changed = all(grew("zdmq_raft_leader_changes_total", n) > 0 for n in members)
    elected = sum(grew("zdmq_raft_elections_total", n) for n in members) >= 1
    leads = sum(total(now[n], "zdmq_raft_leader", group=group) for n in members)
    return changed and elected and leads == 1


def client_requests(samples: Samples) -> float:
    """HTTP requests of clients: not the reads of /metrics and /v1/health, nor the
    nodes' calls to each other."""
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "zdmq_http_requests_total"
        and not _watching_or_internal(dict(labels).get("route", ""))
    )


def _watching_or_internal(route: str) -> bool:
    return route in ("/metrics", "/v1/health") or route.startswith("/v1/internal/")


def moved(spans: list[tuple[int, Samples, Samples]]) -> bool:
    """Some process of the node counted more client requests at its last scrape than at
    its first."""
    return any(client_requests(last) > client_requests(first) for _, first, last in spans)


def print_report(report: dict[str, Any], out: Callable[[str], None] = print) -> None:
    s = report["scrapes"]
    ok = sum(n["ok"] for n in s.values())
    out(f"metrics: {ok} scrapes parsed, every {report['interval_s']:g} s, of {len(s)} nodes")
    k = report.get("kill")
    if k and "error" not in k:
        seen = ", ".join(f"group {g} {t:.2f} s" for g, t in sorted(k["seen_after_s"].items()))
        out(
            f"  killed {k['node']} (pid {k['pid']}), leader of {', '.join(k['groups'])}: "
            f"leader change and election seen after {seen or 'never'} "
            f"(limit {k['limit_s']:g} s)"
        )
    queues = report["depth"]["queues"]
    if queues:
        out(f"  depth and in-flight gauges against the stats of {len(queues)} queue(s)")
    for f in report["failed"]:
        out(f"  FAILED: {f}")
    out(f"  metrics checks: {'passed' if report['passed'] else 'FAILED'}")


def state_file(path: Path) -> tuple[dict[str, str], Callable[[], dict[str, int]]]:
    """The urls, and the pids as they are now, of the cluster `run_locust.sh` started."""

    def pids() -> dict[str, int]:
        nodes: dict[str, int] = json.loads(path.read_text())["nodes"]
        return nodes

    urls: dict[str, str] = json.loads(path.read_text())["urls"]
    return urls, pids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="the running cluster's cluster.yaml")
    p.add_argument("--seconds", type=float, default=30.0, help="how long to watch")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    p.add_argument("--out", type=Path, help="also write the report here (JSON)")
    args = p.parse_args(argv)
    from zdmq.config import ClusterConfig

    config = ClusterConfig.load(args.config)
    if config.tls is not None or config.auth.client_tokens is not None:
        raise SystemExit("metrics_watch.py reads plain HTTP without a token")
    urls = {n: config.node(n).url for n in config.node_ids}
    watch = MetricsWatch(urls, lambda: dict.fromkeys(urls, 0), args.interval)
    watch.start()
    time.sleep(args.seconds)
    report = watch.finish()
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
