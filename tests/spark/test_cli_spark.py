"""`zdmq spark drain` and the Spark part of `zdmq demo`, as a user runs them: the CLI's
`main` with a user's arguments, its output and exit code. The runs that start Spark call it
in this process, so that they start a SparkSession on local[2] on the JVM the Spark tests
share rather than a JVM each; the others run `python -m zdmq.cli` in a subprocess."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import zdmq
from tests.helpers import unique
from zdmq import cli
from zdmq.local import LocalCluster

pytestmark = pytest.mark.spark


def zdmq_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zdmq.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )


@pytest.fixture
def zdmq_here(
    spark_workers: None, capsys: pytest.CaptureFixture[str]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`zdmq *args` run by the CLI's `main` in this process: its exit code and output."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = cli.main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["zdmq", *args], code, out.out, out.err)

    return run


def test_spark_drain_command_writes_parquet_and_empties_the_queue(
    cluster4: LocalCluster, tmp_path: Path, zdmq_here: Callable[..., Any]
) -> None:
    q = unique("cli-drain")

    async def push() -> list[str]:
        async with zdmq.Client.from_config(cluster4.config_path) as c:
            await c.create_queue(q)
            return await c.push_many(q, [f"event {i}" for i in range(700)])

    ids = asyncio.run(push())
    out = tmp_path / "out"
    r = zdmq_here(
        "spark", "drain", "--config", str(cluster4.config_path), "--queue", q,
        "--out", str(out), "--master", "local[2]", "--decode", "utf-8",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert f"drained 700 messages of {q}" in r.stdout and "acked 700" in r.stdout
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    assert sorted(table.column("id").to_pylist()) == sorted(ids)
    assert set(table.column("body").to_pylist()) == {f"event {i}" for i in range(700)}

    async def left() -> int:
        async with zdmq.Client.from_config(cluster4.config_path) as c:
            return (await c.stats(q)).messages

    assert asyncio.run(left()) == 0


def test_spark_drain_of_a_missing_queue_fails_with_its_code(cluster4: LocalCluster) -> None:
    r = zdmq_cli(
        "spark", "drain", "--config", str(cluster4.config_path), "--queue", unique("none"),
        "--out", "/nonexistent/never-written", "--master", "local[1]",
    )  # fmt: skip
    assert r.returncode == 1 and "queue_not_found" in r.stderr


def test_demo_runs_the_spark_pipeline_and_checks_the_aggregate(
    cluster4: LocalCluster, tmp_path: Path, zdmq_here: Callable[..., Any]
) -> None:
    r = zdmq_here(
        "--config", str(cluster4.config_path), "demo", "--messages", "1500",
        "--master", "local[2]", "--out", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "lost=0 duplicates=0 corrupted=0 -> OK" in r.stdout
    assert "spark: drained 1500 messages" in r.stdout
    assert (
        "spark: aggregate matches what was pushed; 0 messages left in the queue -> OK" in r.stdout
    )
    assert (tmp_path / "per_user").is_dir() and (tmp_path / "events").is_dir()


def test_demo_without_the_spark_part_says_so_and_runs_the_rest(cluster4: LocalCluster) -> None:
    r = zdmq_cli("--config", str(cluster4.config_path), "demo", "--messages", "200", "--no-spark")
    assert r.returncode == 0 and "-> OK" in r.stdout and "spark:" not in r.stdout


def test_demo_without_java_says_how_to_get_it_and_runs_the_rest(cluster4: LocalCluster) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # no java on it
    r = zdmq_cli("--config", str(cluster4.config_path), "demo", "--messages", "200", env=env)
    assert r.returncode == 0 and "-> OK" in r.stdout, r.stdout + r.stderr
    assert "the Spark part is skipped" in r.stdout and "Java 17" in r.stdout
    asked = zdmq_cli("--config", str(cluster4.config_path), "demo", "--spark", env=env)
    assert asked.returncode == 2 and "Spark needs Java 17" in asked.stderr
