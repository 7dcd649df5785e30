"""One local SparkSession per test module (local[2,2]: two cores, and a failed task is
retried once), the `zdmq` data source registered, and helpers to read a queue's state.
All of them run on one JVM, which this process starts once."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from zdmq.local import LocalCluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark_workers() -> None:
    """Spark's Python workers import the test modules' functions (a test's transform) by
    name: they need the repository on their path, and this interpreter. Set before this
    process starts Spark's JVM (once: later sessions reuse it), whose workers inherit them."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.environ["PYSPARK_PYTHON"] = sys.executable


@pytest.fixture(scope="module")
def spark(spark_workers: None) -> Iterator[Any]:
    import zdmq.spark

    session = zdmq.spark.session(
        "local[2,2]",
        app_name="zdmq-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"},
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def cluster(cluster4: LocalCluster) -> LocalCluster:
    return cluster4
