"""`run_locust.sh` checks the nodes' /metrics under its Locust run: on 4 nodes with three
copies, every scrape parses, the counters move, a leader killed mid-run shows up as a
leader change and an election within the election timeout, and after the run the depth
and in-flight gauges equal every queue's stats (loadtest/metrics_watch.py).

Skipped when locust is not installed (it is in the `load` extra).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "loadtest"))
import metrics_watch  # noqa: E402  (loadtest/ is a folder of scripts, not a package)

SCRIPT = ROOT / "loadtest" / "run_locust.sh"
LOCUST = Path(sys.executable).parent / "locust"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None or not LOCUST.exists(),
    reason="locust is not installed (pip install -e '.[load]')",
)


def run_locust(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable, "LOCUST": str(LOCUST), "TMPDIR": str(tmp_path)}
    run = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(out), "--processes", "1", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    return run, out


def test_a_locust_run_with_a_leader_killed_passes_the_metrics_checks(tmp_path: Path) -> None:
    args = ["--nodes", "4", "--replication", "3", "-u", "4", "-r", "4", "-t", "12s"]
    args += ["--kill-leader", "4", "--queues", "2", "--routing", "zerohop"]
    args += ["--mix", "push=2,recv_ack=2,push_batch=1,pop=1", "--batch-size", "20"]
    run, out = run_locust(tmp_path, *args)
    log = (out / "locust.log").read_text() if (out / "locust.log").exists() else ""
    # Calls in flight to the killed node fail (Locust exits 1); the metrics checks must not.
    assert run.returncode in (0, 1), f"{run.stdout}\n{run.stderr}\n{log[-4000:]}"
    report = json.loads((out / "metrics.json").read_text())
    assert report["passed"], json.dumps(report["failed"], indent=1) + "\n" + log[-3000:]

    nodes = ("n1", "n2", "n3", "n4")
    assert set(report["scrapes"]) == set(nodes)
    assert all(report["scrapes"][n]["ok"] >= 5 for n in nodes), report["scrapes"]
    assert all(report["scrapes"][n]["parse_errors"] == 0 for n in nodes)
    assert all(report["moved"][n] for n in nodes) and report["pushed_counted"] > 0
    kill = report["kill"]
    assert kill["node"] in nodes and kill["groups"]
    for group in kill["groups"]:
        assert kill["seen_after_s"][group] <= kill["limit_s"], kill
    queues = report["depth"]["queues"]
    assert set(queues) == {"lq-0", "lq-1"}
    # The run left messages behind, and the gauges say the same as the stats.
    assert sum(sum(q["stats_depth"].values()) for q in queues.values()) > 0, queues
    for q in queues.values():
        assert sum(q["gauges"].values()) == sum(q["stats_depth"].values()), q
    # The killed node was started again and serves: it answered the last scrapes.
    state = json.loads((out / "cluster.json").read_text())
    assert state["nodes"][kill["node"]] != kill["pid"]
    assert "metrics checks: passed" in run.stdout, run.stdout


def test_a_run_without_copies_passes_the_checks_and_a_kill_without_copies_is_refused(
    tmp_path: Path,
) -> None:
    args = ["--nodes", "1", "-u", "2", "-r", "2", "-t", "3s", "--mix", "push=1,recv_ack=1"]
    run, out = run_locust(tmp_path, *args)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((out / "metrics.json").read_text())
    assert report["passed"] and report["kill"] is None, report
    assert report["depth"]["queues"]["lq-0"]["gauges"]["n1"] >= 0
    refused = subprocess.run(
        ["bash", str(SCRIPT), "--nodes", "1", "--kill-leader", "2"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2 and "--replication 2" in refused.stderr


# The checks themselves, on samples made up here: each must fail on what it looks for.
def _samples(**series: float) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for key, v in series.items():
        name, _, label = key.partition("__")
        labels = tuple(sorted(dict([label.split("_", 1)]).items())) if label else ()
        out[(name, labels)] = v
    return out


def test_the_depth_check_sums_the_groups_a_node_leads_and_catches_a_wrong_gauge() -> None:
    stats = {"q": {"depth": {"n1": 3, "n2": 4}, "in_flight": 2}}
    n1 = _samples(zdmq_queue_messages__queue_q=7, zdmq_queue_in_flight__queue_q=2)
    n2 = _samples()
    ok = metrics_watch.compare_depths(stats, {"n1": "n1", "n2": "n1"}, {"n1": n1, "n2": n2})
    assert ok["mismatches"] == []
    # The same gauges, with n2 leading its own group again: n1 reports too many.
    moved = metrics_watch.compare_depths(stats, {"n1": "n1", "n2": "n2"}, {"n1": n1, "n2": n2})
    assert [m.split(":")[0] for m in moved["mismatches"]] == ["q"]
    flight = _samples(zdmq_queue_messages__queue_q=7, zdmq_queue_in_flight__queue_q=1)
    short = metrics_watch.compare_depths(stats, {"n1": "n1", "n2": "n1"}, {"n1": flight, "n2": n2})
    assert ["in-flight" in m for m in short["mismatches"]] == [True]
    assert metrics_watch.compare_depths({}, {}, {"n1": n1})["mismatches"]


def test_the_kill_check_wants_a_change_on_every_member_an_election_and_one_leader() -> None:
    before = {n: _samples() for n in ("n2", "n3")}
    changed = {"zdmq_raft_leader_changes_total__group_n1": 1.0}
    n2 = _samples(**changed, zdmq_raft_elections_total__group_n1=1, zdmq_raft_leader__group_n1=1)
    n3 = _samples(**changed)
    assert metrics_watch.replaced("n1", ["n2", "n3"], before, {"n2": n2, "n3": n3})
    no_change = _samples()
    assert not metrics_watch.replaced("n1", ["n2", "n3"], before, {"n2": n2, "n3": no_change})
    no_election = _samples(**changed, zdmq_raft_leader__group_n1=1)
    assert not metrics_watch.replaced("n1", ["n2", "n3"], before, {"n2": no_election, "n3": n3})
    two = _samples(**changed, zdmq_raft_leader__group_n1=1)
    assert not metrics_watch.replaced("n1", ["n2", "n3"], before, {"n2": n2, "n3": two})
    assert not metrics_watch.replaced("n1", ["n2", "n3"], before, {"n2": n2})  # n3 silent


def test_the_counters_moved_check_compares_one_process_first_and_last() -> None:
    route = "zdmq_http_requests_total__route_/v1/queues/{queue}/messages"
    first = _samples(**{route: 5})
    assert metrics_watch.moved([(1, first, _samples(**{route: 9}))])
    assert not metrics_watch.moved([(1, first, first)])
    # A restart's new process starts from 0: only its own first and last scrapes count.
    assert not metrics_watch.moved([(1, first, first), (2, _samples(), _samples())])
    # The watcher's own reads do not count as a move.
    watching = _samples(**{route: 5, "zdmq_http_requests_total__route_/metrics": 7})
    assert not metrics_watch.moved([(1, first, watching)])
