"""The fault runs' seed: drawn per run (or taken from ZDMQ_FAULT_SEED), printed with the
command that replays the run."""

from __future__ import annotations

import os
import random

import pytest

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
