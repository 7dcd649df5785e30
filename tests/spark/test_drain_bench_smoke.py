"""loadtest/spark_drain_bench.py end to end at a tiny size: its own 4-node cluster, the
plain client's drain and the Spark drain of the same number of messages, a JSON result.

The script's `main` runs in this process, with the arguments a user gives it, so that its
SparkSession starts on the JVM the Spark tests share rather than on a JVM of its own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.spark


def test_drain_bench_drains_every_message_both_ways_and_writes_its_result(
    tmp_path: Path, spark_workers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location(
        "spark_drain_bench", ROOT / "loadtest" / "spark_drain_bench.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--messages", "300", "--runs", "1", "--durability", "os", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    assert "ratio spark/client" in capsys.readouterr().out
    [path] = tmp_path.glob("spark-drain-*.json")
    doc = json.loads(path.read_text())
    # Each drain asserted it got all 300 messages before it recorded a rate.
    assert len(doc["samples"]["client"]) == len(doc["samples"]["spark"]) == 1
    assert doc["median"]["client"] > 0 and doc["median"]["spark"] > 0
