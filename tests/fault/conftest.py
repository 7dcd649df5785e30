"""The fault runs' seed: drawn per run (or taken from ZDMQ_FAULT_SEED), printed with the
command that replays the run; and the replicated runs' cluster."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from zdmq.local import LocalCluster

SEED = int(os.environ.get("ZDMQ_FAULT_SEED", random.randrange(1 << 30)))


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """This run's seed; prints it and a one-line command that runs the test with it again."""
    marks = " -m slow" if request.node.get_closest_marker("slow") else ""
    print(
        f"seed {SEED}; replay: ZDMQ_FAULT_SEED={SEED} .venv/bin/pytest -s{marks} "
        f"'{request.node.nodeid}'"
    )
    return SEED


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """The replicated runs' cluster: 4 nodes, replication 3, fsync. A node gives up on a
    peer that does not answer within 1 s, well inside the workload's timeouts."""
    c = LocalCluster.ephemeral(
        tmp_path / "c", nodes=4, replication=3, durability="fsync", request_timeout_s=1.0
    )
    try:
        yield c.start()
    finally:
        c.close()
