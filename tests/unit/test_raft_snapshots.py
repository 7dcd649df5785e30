"""Log compaction and snapshots in the Raft core and its two storages, one step at a time."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.unit.test_raft_core import Group
from zdmq.raft import (
    Entry,
    HardState,
    MemoryStorage,
    Message,
    MsgType,
    RaftCore,
    RaftLogError,
    Role,
    SnapshotMeta,
)
from zdmq.raft.sqlite_storage import RaftLogStore


def install(g: Group, follower: str, leader: str) -> bool:
    """What a driver does with a snapshot request: pull the leader's applied state, hand
    the core `restore`, and (when it says so) reset the stored log and the state."""
    lead = g[leader]
    index = lead.log.applied
    term = lead.log.term_at(index)
    if not g[follower].restore(index, term, leader):
        return False
    g.disks[follower].restore(SnapshotMeta(index, term))
    g.applied[follower] = list(g.applied[leader][:index])
    return True


def grown(n: int = 3) -> Group:
    """A group led by n0 in which n2 missed 6 proposals that n0 and n1 then compacted."""
    g = Group(n)
    g.elect("n0")
    g.down.add("n2")
    for k in range(6):
        g["n0"].propose(f"e{k}".encode())
    g.deliver()
    g.tick_all(2)
    for i in ("n0", "n1"):
        assert g[i].log.applied == 7
        g.disks[i].compact(5)
    return g


def test_a_follower_behind_the_compacted_log_is_asked_to_install_a_snapshot() -> None:
    g = grown()
    g.down.discard("n2")
    g.tick_all(3)
    asks = [m for m in g.sent if m.type is MsgType.SNAPSHOT]
    assert asks and all((m.src, m.dst, m.index) == ("n0", "n2", 5) for m in asks)
    assert asks[0].log_term == g["n0"].log.term_at(5) == 1
    req = g["n2"].take_snapshot_request()
    assert req is not None and req.src == "n0" and g["n2"].take_snapshot_request() is None
    # The request repeats every heartbeat until the follower answers.
    before = len(asks)
    g.tick_all(2)
    assert len([m for m in g.sent if m.type is MsgType.SNAPSHOT]) > before
    assert install(g, "n2", "n0")
    n2 = g["n2"]
    assert (n2.log.snapshot(), n2.log.committed, n2.log.applied) == (SnapshotMeta(7, 1), 7, 7)
    g.deliver()
    assert g["n0"].progress["n2"].match == 7
    g["n0"].propose(b"after")
    g.deliver()
    g.tick_all(2)
    assert [e.data for e in g.applied["n2"]] == [e.data for e in g.applied["n0"]]
    assert g.disks["n2"].entries(8, 9) == [Entry(1, 8, b"after")]


def test_a_stale_snapshot_is_ignored() -> None:
    g = grown()
    n1 = g["n1"]
    log = (n1.log.last_index(), n1.log.committed, n1.log.applied, n1.log.snapshot())
    assert not n1.restore(6, 1, "n0") and not n1.restore(7, 1, "n0")
    assert (n1.log.last_index(), n1.log.committed, n1.log.applied, n1.log.snapshot()) == log
    # A late request for a snapshot this follower already holds is answered as an append.
    n1.step(Message(MsgType.SNAPSHOT, "n0", "n1", n1.term, index=5, log_term=1, commit=7))
    assert n1.take_snapshot_request() is None
    rd = n1.ready()
    assert [(m.type, m.index, m.reject) for m in rd.messages] == [(MsgType.APPEND_RESP, 7, False)]


def test_restore_drops_a_conflicting_log_and_starts_it_after_the_snapshot() -> None:
    # n2 holds entries of a term that never committed (terms 1, 2, 2); the snapshot's
    # entry 3 is of term 3: its log is dropped whole.
    g = Group(3, logs={"n0": [1, 3, 3, 3], "n1": [1, 3, 3, 3], "n2": [1, 2, 2]})
    n2 = g["n2"]
    assert n2.restore(3, 3, "n0")
    assert (n2.log.last_index(), n2.log.committed, n2.log.applied) == (3, 3, 3)
    assert n2.log.term_at(3) == 3 and n2.log.term_at(2) == -1 and n2.log.unstable == []
    rd = n2.ready()
    assert [(m.type, m.dst, m.index) for m in rd.messages] == [(MsgType.APPEND_RESP, "n0", 3)]
    assert rd.committed == ()  # the snapshot holds them: nothing is applied again
    g.disks["n2"].restore(SnapshotMeta(3, 3))
    n2.advance(rd)
    assert g.disks["n2"].hard_state().commit == 3 and g.disks["n2"].last_index() == 3
    # A restart reads the log from the disk: it starts after the snapshot, which the
    # state machine holds (applied up to it).
    n2 = RaftCore("n2", g.ids, g.disks["n2"], random.Random(2), applied=3)
    assert n2.log.snapshot() == SnapshotMeta(3, 3) and n2.log.last_index() == 3
    assert not n2.restore(3, 3)  # the same snapshot again: stale


def test_a_snapshot_whose_entry_the_log_holds_only_moves_the_commit_index() -> None:
    g = Group(3, logs={"n0": [1, 1, 1, 1], "n1": [1, 1, 1, 1]})
    n1 = g["n1"]
    assert n1.log.committed == 0
    assert not n1.restore(2, 1, "n0")  # nothing to install: entries 1-2 apply from the log
    assert (n1.log.committed, n1.log.last_index()) == (2, 4)
    assert [e.index for e in n1.ready().committed] == [1, 2]


def test_only_a_follower_installs_a_snapshot() -> None:
    g = grown()
    g["n2"].campaign()  # it starts an election meanwhile: it installs nothing
    assert g["n2"].role is not Role.FOLLOWER
    assert not g["n2"].restore(7, 1, "n0")


def test_a_leader_whose_log_is_compacted_sends_no_entry_below_it() -> None:
    g = grown()
    n0 = g["n0"]
    pr = n0.progress["n2"]
    pr.next, pr.probing, pr.paused = 3, True, False
    n0._send_append("n2")
    rd = n0.ready()
    assert [(m.type, m.index, m.entries) for m in rd.messages] == [(MsgType.SNAPSHOT, 5, ())]
    assert pr.paused  # one request until n2 answers


# -- the storages ---------------------------------------------------------------------------


def entries(lo: int, hi: int, term: int = 1) -> list[Entry]:
    return [Entry(term if k < 6 else term + 1, k, f"{k}".encode()) for k in range(lo, hi)]


@pytest.fixture(params=["memory", "sqlite"])
def disk_and_reopen(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param == "memory":
        disk = MemoryStorage()
        yield disk, lambda: disk
        return
    path = tmp_path / "raft.sqlite3"
    stores = [RaftLogStore(path, "os", tail_entries=2)]

    def reopen():  # type: ignore[no-untyped-def]
        stores[-1].close()
        stores.append(RaftLogStore(path, "os", tail_entries=2))
        return stores[-1].group("g")

    yield stores[0].group("g"), reopen
    stores[-1].close()


def test_compact_drops_entries_up_to_an_index_and_keeps_its_term(disk_and_reopen) -> None:  # type: ignore[no-untyped-def]
    disk, reopen = disk_and_reopen
    disk.append(entries(1, 10))
    disk.set_hard_state(HardState(2, "n0", 8))
    with pytest.raises(RaftLogError, match=r"compact\(9\): expected an index in 1\.\.8"):
        disk.compact(9)  # past the commit index
    disk.compact(6)
    for d in (disk, None):
        d = d or reopen()
        assert d.snapshot() == SnapshotMeta(6, 2) and d.last_index() == 9
        assert d.term_at(6) == 2 and d.term_at(7) == 2 and d.term_at(5 + 4) == 2
        assert d.entries(7, 10) == entries(7, 10)
        with pytest.raises(RaftLogError, match=r"entries\(6, 8\): expected 7 <= lo <= hi <= 10"):
            d.entries(6, 8)
    d.append(entries(8, 12))  # overwrites after the snapshot
    d.set_hard_state(HardState(2, "n0", 11))
    d.compact(11)
    d = reopen()
    assert (d.snapshot(), d.last_index(), d.term_at(11)) == (SnapshotMeta(11, 2), 11, 2)
    d.append([Entry(3, 12, b"x")])
    assert reopen().entries(12, 13) == [Entry(3, 12, b"x")]


def test_restore_drops_every_entry_and_moves_the_commit_index(disk_and_reopen) -> None:  # type: ignore[no-untyped-def]
    disk, reopen = disk_and_reopen
    disk.append(entries(1, 6))
    disk.set_hard_state(HardState(4, "n1", 3))
    disk.restore(SnapshotMeta(20, 3))
    for d in (disk, None):
        d = d or reopen()
        assert d.snapshot() == SnapshotMeta(20, 3) and d.last_index() == 20
        assert d.hard_state() == HardState(4, "n1", 20) and d.term_at(20) == 3
    d.append([Entry(4, 21, b"y")])
    assert reopen().entries(21, 22) == [Entry(4, 21, b"y")]


def test_the_sqlite_log_counts_its_data_bytes_through_every_change(tmp_path: Path) -> None:
    path = tmp_path / "raft.sqlite3"
    with RaftLogStore(path, "os", tail_entries=2) as store:
        g = store.group("g")
        g.write([Entry(1, i, b"x" * i) for i in range(1, 11)], HardState(1, None, 8))
        assert g.data_bytes() == sum(range(1, 11))
        g.append([Entry(2, 9, b"yy"), Entry(2, 10, None)])  # 9 and 10 overwritten
        assert g.data_bytes() == sum(range(1, 9)) + 2
        # From 8 down, the entries that fit in 15 bytes: 8 and 7 (15 bytes; 6 more is 21).
        assert g.keep_from(8, 15) == 7 and g.keep_from(8, 7) == 9 and g.keep_from(8, 100) == 1
        g.compact(5)
        assert g.data_bytes() == 6 + 7 + 8 + 2
    with RaftLogStore(path, "os", tail_entries=2) as store:
        g = store.group("g")
        assert g.data_bytes() == 6 + 7 + 8 + 2
        g.restore(SnapshotMeta(30, 2))
        assert g.data_bytes() == 0
