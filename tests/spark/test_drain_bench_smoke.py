"""loadtest/spark_drain_bench.py end to end at a tiny size: its own 4-node cluster, the
plain client's drain and the Spark drain of the same number of messages, a JSON result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.spark


def test_drain_bench_drains_every_message_both_ways_and_writes_its_result(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "loadtest" / "spark_drain_bench.py"),
            "--messages",
            "300",
            "--runs",
            "1",
            "--durability",
            "os",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ratio spark/client" in proc.stdout
    [path] = tmp_path.glob("spark-drain-*.json")
    doc = json.loads(path.read_text())
    # Each drain asserted it got all 300 messages before it recorded a rate.
    assert len(doc["samples"]["client"]) == len(doc["samples"]["spark"]) == 1
    assert doc["median"]["client"] > 0 and doc["median"]["spark"] > 0
