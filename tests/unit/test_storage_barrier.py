"""`Storage.barrier`: a reply about an earlier write waits until that write is durable.

Commits run on the event loop, queued at the first submit of a loop iteration, so a
write is "not yet durable" from its submit until the next iteration's flush.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from zdmq.server.state import NodeState
from zdmq.server.storage import MemoryStorage, SqliteStorage


async def test_a_barrier_waits_for_ops_submitted_but_not_yet_committed(tmp_path: Path) -> None:
    path = tmp_path / "zdmq.sqlite3"
    storage = SqliteStorage(path, fsync=True)
    state = storage.load()
    first = storage.submit([state.push("jobs", "a", b"x", None)])
    barrier = storage.barrier()
    assert not first.done() and not barrier.done()
    await asyncio.wait_for(barrier, 5)
    assert first.done()
    # Durable by then: committed (the node holds its database exclusively, so no second
    # reader can look while it is open), and a restart after a close finds the row.
    assert storage.commits == 1
    await storage.close()
    reader = SqliteStorage(path, fsync=True)
    assert reader.load().holder("a") == "jobs"
    await reader.close()


async def test_ops_submitted_in_one_loop_iteration_share_one_commit(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    futures = [storage.submit([state.push("jobs", f"m{i}", b"x", None)]) for i in range(10)]
    await asyncio.gather(*futures)
    assert (storage.commits, storage.ops_written) == (1, 10)
    await storage.close()


async def test_close_commits_what_is_still_pending(tmp_path: Path) -> None:
    path = tmp_path / "zdmq.sqlite3"
    storage = SqliteStorage(path, fsync=True)
    state = storage.load()
    pending = storage.submit([state.push("jobs", "late", b"x", None)])
    await storage.close()
    assert pending.done() and pending.exception() is None
    reader = SqliteStorage(path, fsync=True)
    assert reader.load().holder("late") == "jobs"
    await reader.close()


async def test_a_barrier_with_nothing_pending_is_already_resolved(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    storage.load()
    assert storage.barrier().done()
    await storage.close()
    memory = MemoryStorage()
    assert isinstance(memory.load(), NodeState)
    assert memory.barrier().done()
