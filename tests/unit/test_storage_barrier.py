"""`Storage.barrier`: a reply about an earlier write waits until that write is durable."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from zdmq.server.state import NodeState
from zdmq.server.storage import MemoryStorage, SqliteStorage


class _HeldStorage(SqliteStorage):
    """The real SQLite storage whose commits wait for the test to let them through."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, fsync=True)
        self.gate = threading.Event()

    def _write(self, ops):  # type: ignore[no-untyped-def]
        self.gate.wait(timeout=10)
        super()._write(ops)


async def test_a_barrier_waits_for_the_commit_in_flight(tmp_path: Path) -> None:
    storage = _HeldStorage(tmp_path / "zdmq.sqlite3")
    state = storage.load()
    first = storage.submit([state.push("jobs", "a", b"x", None)])
    await asyncio.sleep(0.05)  # the writer thread now holds the commit at the gate
    barrier = storage.barrier()
    await asyncio.sleep(0.05)
    assert not first.done() and not barrier.done()
    storage.gate.set()
    await asyncio.wait_for(barrier, 5)
    assert first.done()
    await storage.close()


async def test_a_barrier_waits_for_ops_submitted_but_not_yet_started(tmp_path: Path) -> None:
    storage = _HeldStorage(tmp_path / "zdmq.sqlite3")
    state = storage.load()
    storage.submit([state.push("jobs", "a", b"x", None)])
    await asyncio.sleep(0.05)
    second = storage.submit([state.push("jobs", "b", b"x", None)])  # queued behind the first
    barrier = storage.barrier()
    storage.gate.set()
    await asyncio.wait_for(barrier, 5)
    assert second.done()
    await storage.close()


async def test_a_barrier_with_nothing_pending_is_already_resolved(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    storage.load()
    assert storage.barrier().done()
    await storage.close()
    memory = MemoryStorage()
    assert isinstance(memory.load(), NodeState)
    assert memory.barrier().done()
