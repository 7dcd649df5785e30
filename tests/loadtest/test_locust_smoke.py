"""Smoke test of the Locust load test: run_locust.sh end to end, 3 s, 2 users, each routing.

Skipped when locust is not installed (CI installs `.[dev]`; locust is in the `load` extra).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "loadtest" / "run_locust.sh"
LOCUST = Path(sys.executable).parent / "locust"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None or not LOCUST.exists(),
    reason="locust is not installed (pip install -e '.[load]')",
)

MIX = "push=2,pop=1,recv_ack=1,push_batch=1,pop_batch=1"
# One stats row (at least) per operation the mix runs; an empty pop counts as a pop.
OPERATIONS = {
    "push": ("push",),
    "push_batch": ("push_batch",),
    "pop": ("pop", "pop (empty)"),
    "pop_batch": ("pop_batch", "pop_batch (empty)"),
    "receive": ("receive",),
    "ack": ("ack",),
}


@pytest.mark.parametrize("routing", ["any", "zerohop"])
def test_run_locust_drives_every_operation_of_the_mix_without_failures(
    tmp_path: Path, routing: str
) -> None:
    out = tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable, "LOCUST": str(LOCUST), "TMPDIR": str(tmp_path)}
    args = ["--nodes", "2", "-u", "2", "-r", "2", "-t", "3s", "--processes", "1"]
    args += ["--out", str(out), "--mix", MIX, "--batch-size", "20", "--routing", routing]
    run = subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    log = (out / "locust.log").read_text() if (out / "locust.log").exists() else ""
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{log[-3000:]}"

    # Locust's CSV, rewritten once a second (it may miss the run's last second), and its
    # final statistics (--json-file, written at shutdown).
    with open(out / "locust_stats.csv", newline="") as f:
        csv_rows = {r["Name"]: r for r in csv.DictReader(f)}
    assert "Aggregated" in csv_rows
    assert all(int(r["Failure Count"]) == 0 for r in csv_rows.values()), csv_rows
    final = json.loads((out / "locust.json").read_text())
    counts = {e["name"]: e["num_requests"] for e in final}
    for op, names in OPERATIONS.items():
        assert sum(counts.get(n, 0) for n in names) > 0, f"no {op} requests in {counts}"
    assert sum(e["num_failures"] for e in final) == 0, final
    if routing == "zerohop":
        assert counts.get("metadata", 0) > 0

    cpu = json.loads((out / "cpu.json").read_text())
    during = cpu["during_requests"]
    assert during["zdmq_cpu_s"] > 0 and during["locust_cpu_s"] > 0
    assert not cpu["whole_run"]["zdmq_nodes_gone"]
    assert cpu["messages"]["pushed"] >= counts["push"] > 0  # as the nodes counted them
    # Every node's /metrics as the run left it parses, and counted the pushes too.
    pushed = 0.0
    for node in ("n1", "n2"):
        text = (out / f"metrics-{node}.prom").read_text()
        for family in text_string_to_metric_families(text):
            pushed += sum(s.value for s in family.samples if s.name == "zdmq_messages_pushed_total")
    assert pushed >= counts["push"]
    assert (out / "report.html").stat().st_size > 0
    assert "Aggregated" in run.stdout
    # The script stopped every node it started.
    state = json.loads((out / "cluster.json").read_text())
    for pid in state["nodes"].values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
