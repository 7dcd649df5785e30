"""The failover benchmark runs end to end: a kill -9 of a group's leader, and its next write."""

from __future__ import annotations

import json
from pathlib import Path

from zdmq.bench import failover


def test_failover_measures_the_time_from_a_kill_to_the_groups_next_write(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    assert failover.main(["--kills", "1", "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["kills"] == 1 and len(summary["times_s"]) == 1
    # An election takes 1 to 2 s and the client's timeout is 1 s: well under 10 s.
    assert 0 < summary["max_s"] < 10
