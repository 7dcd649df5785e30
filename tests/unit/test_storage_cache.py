"""SqliteStorage's cache of recently pushed rows: a consumer that keeps up is served from
memory, every row it serves is the row in SQLite, and the cache stays within its budget.

Opens a SQLite file in tmp_path, never a socket.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from zdmq.server.state import NodeState, Op
from zdmq.server.storage import _ROW_BYTES, SqliteStorage

_tokens = (f"t{i}" for i in itertools.count())


def _token() -> str:
    return next(_tokens)


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[tuple[SqliteStorage, NodeState]]:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=False, body_cache_bytes=10_000)
    state = storage.load()
    yield storage, state
    await storage.close()


def _sql_rows(storage: SqliteStorage) -> dict[str, tuple[bytes, str | None, int]]:
    conn = storage._conn
    assert conn is not None
    return {
        mid: (body, ctype, count)
        for mid, body, ctype, count in conn.execute(
            "SELECT id, body, content_type, receive_count FROM messages"
        )
    }


async def test_messages_received_soon_after_their_push_are_served_without_a_select(
    opened: tuple[SqliteStorage, NodeState],
) -> None:
    storage, state = opened
    now = time.time()
    ops: list[Op] = state.push_many(
        "jobs", [(f"m{i}", b"x" * 10, "t/x" if i % 2 else None, 0.0) for i in range(5)], now=now
    )
    await storage.submit(ops)
    got, leased = state.lease("jobs", 5, now=now, visibility_s=30, new_token=_token)
    assert [(t.id, t.body, t.content_type, t.receive_count) for t in got] == [
        (f"m{i}", b"x" * 10, "t/x" if i % 2 else None, 1) for i in range(5)
    ]
    assert (storage.cache_hits, storage.cache_misses) == (5, 0)
    await storage.submit(leased)
    # Leased rows left the cache: their receive count changed in SQLite.
    assert storage._recent == {} and storage._recent_bytes == 0
    assert {mid: count for mid, (_, _, count) in _sql_rows(storage).items()} == {
        f"m{i}": 1 for i in range(5)
    }


async def test_a_requeued_message_is_read_back_with_its_new_receive_count(
    opened: tuple[SqliteStorage, NodeState],
) -> None:
    storage, state = opened
    now = time.time()
    await storage.submit([state.push("jobs", "a", b"body", None, now=now)])
    got, ops = state.lease("jobs", 1, now=now, visibility_s=30, new_token=_token)
    nack = state.requeue("jobs", "a", got[0].token or "", now)
    assert nack is not None
    await storage.submit([*ops, nack])
    again, _ = state.lease("jobs", 1, now=now, visibility_s=30, new_token=_token)
    assert [(t.id, t.body, t.receive_count) for t in again] == [("a", b"body", 2)]
    assert storage.cache_misses == 1  # the requeued row came from SQLite


async def test_the_cache_keeps_what_fits_its_budget_and_frees_it_as_messages_go(
    opened: tuple[SqliteStorage, NodeState],
) -> None:
    storage, state = opened
    now = time.time()
    body = b"y" * 1000
    per_row = len(body) + _ROW_BYTES
    fits = 10_000 // per_row
    ops: list[Op] = state.push_many(
        "jobs", [(f"m{i}", body, None, 0.0) for i in range(fits + 3)], now=now
    )
    await storage.submit(ops)
    assert len(storage._recent) == fits
    assert storage._recent_bytes == fits * per_row <= 10_000
    popped, removes = state.pop("jobs", fits + 3, now=now)
    assert [t.body for t in popped] == [body] * (fits + 3)
    assert (storage.cache_hits, storage.cache_misses) == (fits, 3)
    await storage.submit(removes)
    assert storage._recent == {} and storage._recent_bytes == 0
    assert _sql_rows(storage) == {}


async def test_a_purge_empties_the_cache_of_the_queue(
    opened: tuple[SqliteStorage, NodeState],
) -> None:
    storage, state = opened
    now = time.time()
    ops: list[Op] = state.push_many(
        "jobs", [("a", b"1", None, 0.0), ("b", b"2", None, 0.0)], now=now
    )
    await storage.submit(ops)
    purge = state.purge("jobs")
    assert purge is not None
    await storage.submit([purge])
    assert storage._recent == {} and storage._recent_bytes == 0
    assert _sql_rows(storage) == {}
