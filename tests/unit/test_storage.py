"""Storage: what SqliteStorage commits comes back on reopen; concurrent writes share commits.

These tests open a SQLite file in tmp_path (storage is the one module that owns files)
and never open a socket.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from zdmq.errors import StorageFailed
from zdmq.server.state import (
    CreateQueue,
    DropQueue,
    NodeState,
    Op,
    Push,
    Register,
    Unregister,
)
from zdmq.server.storage import MemoryStorage, SqliteStorage, open_storage


def _snapshot(state: NodeState) -> dict[str, object]:
    """What a node must get back after a restart, in comparable form.

    Runtime knowledge (whether a UUID queue is registered, the next sequence number)
    is rebuilt after a restart, so it is left out.
    """
    return {
        "queues": {q: list(lq.ids) for q, lq in state.queues.items() if lq.ids},
        "messages": {
            mid: (m.queue, m.seq, m.body, m.content_type) for mid, m in state.messages.items()
        },
        "meta": {
            q: (m.incarnation, m.created_at, list(m.nodes.items())) for q, m in state.meta.items()
        },
    }


async def _reopen(path: Path) -> NodeState:
    storage = SqliteStorage(path, fsync=True)
    try:
        return storage.load()
    finally:
        await storage.close()


class _Recorder:
    """Applies ops to a live state and collects them, as the node does before a commit."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.ops: list[Op] = []

    def __call__(self, op: Op) -> None:
        self.state.apply(op)
        self.ops.append(op)

    def push(self, queue: str, mid: str, body: bytes, ctype: str | None = None) -> None:
        self.ops.append(self.state.push(queue, mid, body, ctype))

    def pop(self, queue: str, limit: int) -> list[str]:
        popped = self.state.pop(queue, limit)
        self.ops.extend(op for _, _, op in popped)
        return [mid for mid, _, _ in popped]

    def purge(self, queue: str) -> None:
        op = self.state.purge(queue)
        assert op is not None
        self.ops.append(op)

    def take(self) -> list[Op]:
        ops, self.ops = self.ops, []
        return ops


@pytest.mark.parametrize("fsync", [True, False], ids=["fsync", "os"])
async def test_a_reopened_store_holds_exactly_the_committed_state(
    tmp_path: Path, fsync: bool
) -> None:
    path = tmp_path / "n1" / "zdmq.sqlite3"
    storage = SqliteStorage(path, fsync=fsync)
    state = storage.load()
    assert path.exists()
    rec = _Recorder(state)

    rec(CreateQueue("jobs", "inc-jobs", 1700000000.25))
    rec(CreateQueue("idle", "inc-idle", 1700000001.5))
    rec(CreateQueue("gone", "inc-gone", 1700000002.0))
    rec(Register("jobs", "n3", "u3"))
    rec(Register("jobs", "n1", "u1"))
    rec(Register("idle", "n2", "u2"))
    rec(Register("gone", "n4", "u4"))
    first = storage.submit(rec.take())

    rec(Unregister("idle", "n2"))
    rec(DropQueue("gone"))
    rec(Register("jobs", "n2", "u2"))
    for i in range(10):
        rec.push("jobs", f"j{i}", f"body {i}".encode(), "text/plain" if i % 2 else None)
    rec.push("bin", "b0", bytes(range(256)), "application/octet-stream")
    rec.push("bin", "b1", b"", None)
    for i in range(3):
        rec.push("purged", f"p{i}", b"x", None)
    second = storage.submit(rec.take())

    popped = rec.pop("jobs", 4)
    rec.purge("purged")
    third = storage.submit(rec.take())
    await asyncio.gather(first, second, third)
    assert popped == ["j0", "j1", "j2", "j3"]
    await storage.close()

    again = await _reopen(path)
    assert _snapshot(again) == _snapshot(state)
    # Spelled out: FIFO order kept, popped and purged messages gone, metadata lists kept.
    assert list(again.queues["jobs"].ids) == [f"j{i}" for i in range(4, 10)]
    assert list(again.queues["bin"].ids) == ["b0", "b1"]
    assert again.messages["b0"].body == bytes(range(256))
    assert again.messages["j5"].content_type == "text/plain"
    assert "purged" not in again.queues
    assert not set(popped) & set(again.messages)
    assert list(again.meta["jobs"].nodes.items()) == [("n3", "u3"), ("n1", "u1"), ("n2", "u2")]
    assert again.meta["idle"].nodes == {}
    assert "gone" not in again.meta
    # The head of each reloaded UUID queue stands as its firstUUID.
    assert again.queues["jobs"].first_uuid == "j4"


async def test_new_pushes_after_a_reopen_queue_behind_the_reloaded_ones(tmp_path: Path) -> None:
    path = tmp_path / "zdmq.sqlite3"
    storage = SqliteStorage(path, fsync=True)
    rec = _Recorder(storage.load())
    for i in range(5):
        rec.push("jobs", f"a{i}", b"", None)
    rec.pop("jobs", 1)
    await storage.submit(rec.take())
    await storage.close()

    storage = SqliteStorage(path, fsync=True)
    rec = _Recorder(storage.load())
    for i in range(3):
        rec.push("jobs", f"b{i}", b"", None)
    await storage.submit(rec.take())
    await storage.close()

    again = await _reopen(path)
    assert list(again.queues["jobs"].ids) == ["a1", "a2", "a3", "a4", "b0", "b1", "b2"]


async def test_submits_during_an_in_flight_commit_share_the_next_commit(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    first = storage.submit([state.push("jobs", "m000", b"", None)])
    # One turn of the loop: the writer takes the first op and starts its commit.
    await asyncio.sleep(0)
    later = [storage.submit([state.push("jobs", f"m{i:03d}", b"", None)]) for i in range(1, 200)]
    await asyncio.gather(first, *later)
    assert storage.commits == 2
    assert storage.ops_written == 200
    await storage.close()
    again = await _reopen(tmp_path / "zdmq.sqlite3")
    assert list(again.queues["jobs"].ids) == [f"m{i:03d}" for i in range(200)]


async def test_200_concurrent_submits_take_fewer_commits_than_submits(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()

    async def push_one(i: int) -> None:
        await storage.submit([state.push("jobs", f"m{i:03d}", b"x", None)])

    await asyncio.gather(*(push_one(i) for i in range(200)))
    assert storage.ops_written == 200
    assert 1 <= storage.commits < 200
    await storage.close()
    again = await _reopen(tmp_path / "zdmq.sqlite3")
    assert len(again.messages) == 200


async def test_close_writes_what_was_submitted_but_not_awaited(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    fut = storage.submit([state.push("jobs", "a", b"", None)])
    await storage.close()
    assert fut.done() and fut.exception() is None
    again = await _reopen(tmp_path / "zdmq.sqlite3")
    assert list(again.queues["jobs"].ids) == ["a"]


async def test_a_failed_commit_fails_its_writers_and_every_later_write(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    storage.load()
    # Two rows with one sequence number: the disk refuses the transaction.
    bad = storage.submit([Push("jobs", "a", 1, b"", None), Push("jobs", "b", 1, b"", None)])
    with pytest.raises(StorageFailed):
        await bad
    assert storage.failed is not None and "IntegrityError" in storage.failed
    with pytest.raises(StorageFailed, match="storage failed earlier"):
        storage.submit([Push("jobs", "c", 2, b"", None)])
    await storage.close()
    # The refused transaction left nothing behind.
    again = await _reopen(tmp_path / "zdmq.sqlite3")
    assert again.messages == {}


async def test_memory_storage_returns_done_futures_and_loads_empty() -> None:
    storage = MemoryStorage()
    assert _snapshot(storage.load()) == _snapshot(NodeState())
    fut = storage.submit([CreateQueue("jobs", "inc", 1.0)])
    assert fut.done() and fut.result() is None
    assert storage.submit([]).done()
    assert storage.ops_written == 1
    await storage.close()


def test_open_storage_picks_the_engine_for_the_durability(tmp_path: Path) -> None:
    assert isinstance(open_storage("memory", tmp_path), MemoryStorage)
    for durability in ("fsync", "os"):
        storage = open_storage(durability, tmp_path / durability)
        assert isinstance(storage, SqliteStorage)
        assert storage.path == tmp_path / durability / "zdmq.sqlite3"
        assert not storage.path.exists()  # nothing is opened before load
