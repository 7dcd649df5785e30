"""Ties in a group's state: the record of a tie's copies, the first claim wins, a cancel
makes every later claim lose, tied copies carry their token, and a reload keeps it all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zdmq.raft.sim_queue import state_view
from zdmq.server.machine import (
    Claim,
    Command,
    Push,
    Take,
    Tie,
    Untie,
    apply_command,
    decode_command,
    encode_command,
)
from zdmq.server.state import NodeState, Taken
from zdmq.server.storage import SqliteStorage

COPIES = (("a", "m1"), ("b", "m2"), ("c", "m3"))


def _run(state: NodeState, cmd: Command) -> Any:
    data = encode_command(cmd)
    assert encode_command(decode_command(data)) == data
    return apply_command(state, decode_command(data))


def test_the_first_claim_wins_and_the_winner_may_claim_again() -> None:
    s = NodeState()
    assert _run(s, Tie("t", COPIES, 1.0)) is True
    assert _run(s, Tie("t", COPIES, 2.0)) is False  # a retry records nothing new
    assert _run(s, Claim("t", "m2")) == "won"
    assert _run(s, Claim("t", "m1")) == "lost"
    assert _run(s, Claim("t", "m2")) == "won"  # its redelivery, or a retried claim
    assert _run(s, Claim("t", "m9")) == "lost"  # not a copy of this tie
    assert _run(s, Claim("other", "m1")) == "unknown"
    assert _run(s, Untie("t")) == ([["a", "m1"], ["b", "m2"], ["c", "m3"]], "m2")


def test_a_cancelled_tie_loses_every_claim_and_answers_its_copies() -> None:
    s = NodeState()
    _run(s, Tie("t", COPIES, 1.0))
    assert _run(s, Untie("t")) == ([["a", "m1"], ["b", "m2"], ["c", "m3"]], None)
    assert _run(s, Claim("t", "m1")) == "lost"
    assert _run(s, Untie("t")) == ([["a", "m1"], ["b", "m2"], ["c", "m3"]], None)
    assert _run(s, Untie("nothing")) is None


async def test_tied_copies_carry_their_token_and_a_reload_keeps_every_tie(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "s.sqlite3", fsync=True)
    s = storage.load()
    _run(s, Tie("t1", COPIES, 1.0))
    _run(s, Tie("t2", COPIES[:2], 1.0))
    _run(s, Tie("t3", COPIES[:1], 1.0))
    _run(s, Claim("t1", "m3"))
    _run(s, Untie("t2"))
    item = ("m1", b"x", None, False, 0, 0.0, 0.0, None, None, "t1")
    _run(s, Push("a", [item], 2.0))
    await storage.barrier()
    live = state_view(s)
    await storage.close()
    reopened = SqliteStorage(tmp_path / "s.sqlite3", fsync=True)
    try:
        r = reopened.load()
        r.clock = s.clock
        assert state_view(r) == live
        assert _run(r, Claim("t1", "m1")) == "lost"
        assert _run(r, Claim("t2", "m1")) == "lost"
        assert _run(r, Claim("t3", "m1")) == "won"
        [taken] = _run(r, Take("a", 10, 3.0, None, 30.0, "k."))
        assert isinstance(taken, Taken) and taken.tie == "t1"
        await reopened.barrier()
    finally:
        await reopened.close()
