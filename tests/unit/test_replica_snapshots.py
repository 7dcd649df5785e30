"""A member's side of compaction and snapshots (zdmq/server/replicas.py), on real files:
the checkpoint and copy of a group's state, and the start of a member whose last install
was cut short between its two steps."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from zdmq.backup import state_conf
from zdmq.config import ClusterConfig
from zdmq.errors import StorageFailed
from zdmq.raft.core import Conf
from zdmq.raft.driver import PulledSnapshot
from zdmq.raft.sqlite_storage import RaftLogStore
from zdmq.raft.storage import Entry, HardState, SnapshotMeta
from zdmq.server.replicas import Member
from zdmq.server.storage import SqliteStorage


def config(tmp_path: Path) -> ClusterConfig:
    nodes = [{"id": f"n{i}", "host": "127.0.0.1", "port": 1 + i} for i in range(1, 4)]
    return ClusterConfig.from_dict(
        {"nodes": nodes, "replication": 3, "data_dir": str(tmp_path), "durability": "fsync"}
    )


async def group_state(path: Path, applied: int, term: int) -> None:
    storage = SqliteStorage(path, fsync=False, replica=True)
    storage.load()
    storage.note_applied(applied, 0.0, term)
    await storage.close()


async def test_a_state_ahead_of_its_log_at_start_resets_the_log_after_it(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    data = cfg.node_data_dir("n1")
    data.mkdir(parents=True)
    # An install (from a leader of term 3) that stopped after replacing group n2's state
    # (at index 50, term 3) and before resetting its log (committed up to 10, entries to 12).
    await group_state(data / "group-n2.sqlite3", 50, 3)
    with RaftLogStore(data / "raft.sqlite3") as store:
        store.group("n2").write([Entry(2, i, b"x") for i in range(1, 13)], HardState(3, "n2", 10))
    member = Member(cfg, "n1", b"s" * 32)
    await member.start()
    try:
        assert member.raft is not None and member.store is not None
        glog = member.store.group("n2")
        assert glog.snapshot() == SnapshotMeta(50, 3)
        assert (glog.last_index(), glog.hard_state()) == (50, HardState(3, "n2", 50))
        assert member.raft.commit_index("n2") == 50 and member.raft.last_index("n2") == 50
        assert member.log_sizes()["n2"] == {"log_start": 50, "log_last": 50}
        # The other groups, whose state is not ahead, keep their logs.
        assert member.store.group("n1").snapshot() == SnapshotMeta()
    finally:
        await member.stop()


async def test_a_state_ahead_of_the_recorded_commit_at_an_entry_its_log_holds_keeps_the_log(
    tmp_path: Path,
) -> None:
    """The host applies entries once committed and persisted and writes the commit index
    with its next write: a kill -9 in between leaves the state (at 11, term 2) ahead of the
    recorded commit (10) at an entry the log holds. The log stays whole: its entries after
    the state (which this member may have acknowledged, counted in a commit) are kept."""
    cfg = config(tmp_path)
    data = cfg.node_data_dir("n1")
    data.mkdir(parents=True)
    await group_state(data / "group-n2.sqlite3", 11, 2)
    with RaftLogStore(data / "raft.sqlite3") as store:
        store.group("n2").write([Entry(2, i, b"x") for i in range(1, 16)], HardState(2, "n2", 10))
    member = Member(cfg, "n1", b"s" * 32)
    await member.start()
    try:
        assert member.raft is not None and member.store is not None
        glog = member.store.group("n2")
        assert glog.snapshot() == SnapshotMeta()
        assert glog.last_index() == 15
        assert member.raft.commit_index("n2") == 11 and member.raft.last_index("n2") == 15
    finally:
        await member.stop()


async def test_a_restored_state_under_a_new_log_starts_the_log_after_it_at_its_term(
    tmp_path: Path,
) -> None:
    """`zdmq restore` writes a group's state (here at index 50, term 4) into a data directory
    with no Raft log: the new log starts after the state, and its term is the state's, so
    no entry the group appends later has a lower term than the state's last."""
    cfg = config(tmp_path)
    data = cfg.node_data_dir("n1")
    data.mkdir(parents=True)
    await group_state(data / "group-n2.sqlite3", 50, 4)
    member = Member(cfg, "n1", b"s" * 32)
    await member.start()
    try:
        assert member.raft is not None and member.store is not None
        glog = member.store.group("n2")
        assert glog.snapshot() == SnapshotMeta(50, 4)
        assert (glog.last_index(), glog.hard_state()) == (50, HardState(4, None, 50))
        assert member.raft.commit_index("n2") == 50 and member.raft.last_index("n2") == 50
        assert member.nodes["n2"].storage.applied == 50
        # A group restored with nothing in it (a fresh state) keeps an empty log.
        assert member.store.group("n1").snapshot() == SnapshotMeta()
        assert member.store.group("n1").hard_state().term == 0
    finally:
        await member.stop()


async def test_a_checkpoint_and_a_copy_hold_what_was_applied(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "group-g.sqlite3", fsync=False, replica=True)
    storage.load()
    storage.note_applied(7, 1.5, 2)
    assert storage.checkpoint() == 7
    # The WAL is checkpointed into the file: the file alone holds index 7.
    shutil.copy(tmp_path / "group-g.sqlite3", tmp_path / "alone.sqlite3")
    conn = sqlite3.connect(tmp_path / "alone.sqlite3")
    assert dict(conn.execute("SELECT key, value FROM machine"))["applied"] == 7
    conn.close()
    storage.note_applied(9, 2.0, 3)
    assert storage.copy_to(tmp_path / "copy.sqlite3") == (9, 3)
    await storage.close()
    copy = SqliteStorage(tmp_path / "copy.sqlite3", fsync=False, replica=True)
    copy.load()
    assert (copy.applied, copy.applied_term, copy.clock) == (9, 3, 2.0)
    await copy.close()


async def test_a_state_records_its_groups_configuration_and_its_copy_carries_it(
    tmp_path: Path,
) -> None:
    storage = SqliteStorage(tmp_path / "group-g.sqlite3", fsync=False, replica=True)
    storage.load()
    assert storage.conf is None  # the group's first members all vote
    conf = Conf(frozenset({"n1", "n2", "n4"}), frozenset({"n5"}))
    storage.note_conf(conf)
    storage.note_applied(4, 1.0, 2)
    storage.copy_to(tmp_path / "copy.sqlite3")
    await storage.close()
    assert state_conf(tmp_path / "copy.sqlite3") == conf
    again = SqliteStorage(tmp_path / "group-g.sqlite3", fsync=False, replica=True)
    again.load()
    assert (again.conf, again.applied) == (conf, 4)
    await again.close()


async def test_install_replaces_the_state_file_and_reloads_the_group(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    member = Member(cfg, "n1", b"s" * 32)
    await member.start()
    try:
        pulled = tmp_path / "pulled.sqlite3"
        await group_state(pulled, 40, 2)
        assert member.nodes["n3"].storage.applied == 0
        await member.install(PulledSnapshot("n3", "n3", 40, 2, pulled))
        node = member.nodes["n3"]
        assert node.storage.applied == 40 and not pulled.exists()
        assert node.state.rows is node.storage  # the group's state reloaded from it
    finally:
        await member.stop()


async def test_members_catching_up_at_once_share_the_copy_the_log_still_covers(
    tmp_path: Path,
) -> None:
    member = Member(config(tmp_path), "n1", b"s" * 32)
    await member.start()
    try:
        state = member.nodes["n1"].storage
        state.note_applied(5, 1.0, 2)
        first = await member.snapshot_chunk("n1", 0, 0)
        assert (first.index, first.term, first.offset) == (5, 2, 0)
        assert first.data[:16] == b"SQLite format 3\x00" and len(first.data) == first.size
        state.note_applied(6, 1.0, 2)
        # The log holds every entry after 5 (nothing is compacted): the copy serves again.
        again = await member.snapshot_chunk("n1", 0, 0)
        assert (again.index, again.data) == (5, first.data)
        tail = await member.snapshot_chunk("n1", first.size - 10, 5)
        assert tail.data == first.data[-10:]
        # Another group's copy is its own.
        member.nodes["n3"].storage.note_applied(9, 1.0, 4)
        other = await member.snapshot_chunk("n3", 0, 0)
        assert (other.index, other.term) == (9, 4)
        assert (await member.snapshot_chunk("n1", 0, 5)).index == 5
    finally:
        await member.stop()


async def test_a_state_behind_the_compacted_log_stops_the_start_with_what_to_do(
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path)
    data = cfg.node_data_dir("n1")
    data.mkdir(parents=True)
    with RaftLogStore(data / "raft.sqlite3") as store:  # group n2's state file is gone
        glog = store.group("n2")
        glog.write([Entry(2, i, b"x") for i in range(1, 13)], HardState(2, "n2", 10))
        glog.compact(8)
    member = Member(cfg, "n1", b"s" * 32)
    with pytest.raises(StorageFailed, match="move the node's data directory away"):
        await member.start()
    await member.stop()
