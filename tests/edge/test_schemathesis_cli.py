"""The schemathesis CLI, every check and every phase, against a replicated 4-node cluster.

`schemathesis run --checks all` with the examples, coverage, fuzzing and stateful phases,
loading the document a node serves (/v1/openapi.yaml), on 4 nodes with replication 3 (each
call to the first node, which forwards what it does not own). No check may fail: every
reply is one the document gives (status, content type, headers, body); a request the
schemas take is taken, or refused only with a status the document gives for a state
(404, 409, 413), never 400; a request they refuse is refused; a deleted resource stays
gone and a created one is there. The stateful phase follows the document's links: list or
create queues and topics, push, receive, ack, nack and extend with real receipts, cancel,
tie and cancel ties, subscribe and unsubscribe. The calls that change the cluster's
nodes are in the run too: a node to add must answer at its address (none does, so each is
refused), and a node removed drains onto the others while the run goes on.

The CLI reads the repository's schemathesis.toml (long polls may take their wait, a queue's
own size limit is a 413), and here two more settings keep the run to about a minute on a
small machine: at most MAX_EXAMPLES examples per operation and phase, and `wait_s` drawn
from a few short waits (a run is many calls, not a few long polls). The run is seeded
(ZDMQ_SCHEMATHESIS_SEED, default SEED; printed): the same seed generates the same
requests. The CLI's output is shown when the test fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from zdmq.local import LocalCluster

SEED = int(os.environ.get("ZDMQ_SCHEMATHESIS_SEED", "4242"))
MAX_EXAMPLES = 40
RUN_TIMEOUT_S = 240.0
REPO = Path(__file__).resolve().parents[2]
# Added to the repository's settings for this run (TOML).
SHORT_WAITS = """
[dictionaries.short-waits]
values = [0, 0.01, 0.05]

[parameters]
"query.wait_s" = { dictionary = "short-waits" }
"""


@pytest.fixture(scope="module")
def replicated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.ephemeral(tmp_path_factory.mktemp("cli"), nodes=4, replication=3)
    try:
        yield c.start()
    finally:
        c.close()


def _config(directory: Path) -> Path:
    path = directory / "schemathesis.toml"
    path.write_text((REPO / "schemathesis.toml").read_text() + SHORT_WAITS)
    return path


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_schemathesis_cli_finds_no_failure_against_a_replicated_cluster(
    replicated_cluster: LocalCluster, tmp_path: Path
) -> None:
    argv = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(_config(tmp_path)),
        "run",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--seed",
        str(SEED),
        "--max-examples",
        str(MAX_EXAMPLES),
        "--workers",
        "1",  # Hypothesis describes strategies with ast, which is not thread-safe on 3.11
        "--no-color",
        f"{replicated_cluster.urls[0]}/v1/openapi.yaml",
    ]
    print(f"\nschemathesis seed {SEED} (ZDMQ_SCHEMATHESIS_SEED); {MAX_EXAMPLES} examples")
    started = time.monotonic()
    run = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    output = run.stdout + run.stderr
    summary = [line for line in output.splitlines() if "generated" in line or "===" in line]
    print(f"{time.monotonic() - started:.1f}s: " + " | ".join(s.strip() for s in summary[-2:]))
    assert run.returncode == 0, output
    assert "Stateful" in output and "Scenarios:" in output, output  # the phase ran
