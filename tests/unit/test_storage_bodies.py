"""Bodies above BODY_INLINE_MAX live in table `bodies`, out of their message's row: they
come back byte for byte through every path a message takes, go with their message, and
a lease no longer rewrites them.

SqliteStorage on a file in tmp_path (its row cache off, so that reads go to SQLite),
and one test through a real node process.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from zdmq import Client
from zdmq.local import LocalCluster
from zdmq.server.state import DeadLetter, NodeState, Op, Remove, Taken
from zdmq.server.storage import BODY_INLINE_MAX, SqliteStorage

from .views import all_ids, where

BIG = os.urandom(1 << 20)
MID = os.urandom(50_000)
SMALL = os.urandom(100)
EDGE = os.urandom(BODY_INLINE_MAX)  # the largest body kept in its row
PAST_EDGE = os.urandom(BODY_INLINE_MAX + 1)
BODIES = {"big": BIG, "mid": MID, "small": SMALL, "edge": EDGE, "past-edge": PAST_EDGE}
OUT_OF_LINE = {"big", "mid", "past-edge"}

_OPEN: list[SqliteStorage] = []


@pytest.fixture(autouse=True)
async def _close_opened() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().close()


def _open(path: Path) -> tuple[SqliteStorage, NodeState]:
    """A store with no row cache: every body the state reads comes from SQLite."""
    storage = SqliteStorage(path, fsync=True, body_cache_bytes=0)
    _OPEN.append(storage)
    return storage, storage.load()


async def _reopen(storage: SqliteStorage, ops: list[Op]) -> tuple[SqliteStorage, NodeState]:
    await storage.submit(ops)
    await storage.close()
    _OPEN.remove(storage)
    return _open(storage.path)


def _conn(storage: SqliteStorage) -> sqlite3.Connection:
    conn = storage._conn
    assert conn is not None
    return conn


def _stored(storage: SqliteStorage) -> dict[str, tuple[int, int | None]]:
    """id -> (length of the body in the row, body_ref), and checks every body_ref has
    its body."""
    conn = _conn(storage)
    rows = {
        mid: (n, ref)
        for mid, n, ref in conn.execute("SELECT id, length(body), body_ref FROM messages")
    }
    refs = sorted(ref for _, ref in rows.values() if ref is not None)
    assert [i for (i,) in conn.execute("SELECT id FROM bodies ORDER BY id")] == refs
    return rows


def _bodies_table(storage: SqliteStorage) -> int:
    (n,) = _conn(storage).execute("SELECT count(*) FROM bodies").fetchone()
    return int(n)


_counter = itertools.count()


def _token() -> str:
    return f"t{next(_counter)}"


def _lease(state: NodeState, queue: str, n: int, now: float) -> tuple[dict[str, Taken], list[Op]]:
    got, ops = state.lease(queue, n, now=now, visibility_s=30, new_token=_token)
    return {t.id: t for t in got}, ops


def _ack(state: NodeState, queue: str, taken: Taken, now: float | None = None) -> Remove:
    op = state.ack(queue, taken.id, taken.token or "", time.time() if now is None else now)
    assert op is not None
    return op


def _find_body(state: NodeState, mid: str) -> bytes:
    m = state.find(mid)
    assert m is not None, f"{mid} is not stored"
    return m.body


async def test_large_bodies_go_out_of_line_and_small_ones_stay_in_their_row(
    tmp_path: Path,
) -> None:
    storage, state = _open(tmp_path / "zdmq.sqlite3")
    now = time.time()
    await storage.submit(
        [state.push("jobs", mid, body, None, now=now) for mid, body in BODIES.items()]
    )
    rows = _stored(storage)
    assert {mid for mid, (_, ref) in rows.items() if ref is not None} == OUT_OF_LINE
    assert {mid: n for mid, (n, _) in rows.items()} == {
        mid: 0 if mid in OUT_OF_LINE else len(body) for mid, body in BODIES.items()
    }


async def test_bodies_round_trip_through_lease_nack_expiry_dead_letter_ack_and_restarts(
    tmp_path: Path,
) -> None:
    storage, state = _open(tmp_path / "zdmq.sqlite3")
    now = time.time() - 100  # the lease that runs out ends in the past
    ops: list[Op] = [state.push("jobs", mid, body, "b/x", now=now) for mid, body in BODIES.items()]
    # Read back before the commit: from the open transaction.
    got, leased = _lease(state, "jobs", 10, now)
    assert {mid: t.body for mid, t in got.items()} == BODIES
    ops += leased
    # big: nacked; mid: its lease runs out; small: acked; the edges: nacked.
    for mid in ("big", "edge", "past-edge"):
        op = state.requeue("jobs", mid, got[mid].token or "", now)
        assert op is not None
        ops.append(op)
    expired = state.requeue("jobs", "mid", got["mid"].token or "", now + 31, expired=True)
    assert expired is not None
    ops += [expired, _ack(state, "jobs", got["small"], now)]
    storage, state = await _reopen(storage, ops)

    # Requeued rows have new seqs; their bodies kept their ids and are found.
    rows = _stored(storage)
    assert {mid for mid, (_, ref) in rows.items() if ref is not None} == OUT_OF_LINE
    assert _find_body(state, "big") == BIG
    now = time.time()
    got, ops = _lease(state, "jobs", 10, now)
    assert {mid: (t.body, t.receive_count) for mid, t in got.items()} == {
        mid: (body, 2) for mid, body in BODIES.items() if mid != "small"
    }
    # big and past-edge go to the dead-letter queue; the others are acked.
    for mid in ("big", "past-edge"):
        op = state.requeue(
            "jobs", mid, got[mid].token or "", now, max_receives=2, dead_letter_queue="dead"
        )
        assert isinstance(op, DeadLetter)
        ops.append(op)
    ops += [_ack(state, "jobs", got[mid]) for mid in ("mid", "edge")]
    storage, state = await _reopen(storage, ops)

    assert where(state, "dead") == (["big", "past-edge"], set(), set())
    assert _bodies_table(storage) == 2
    got, ops = _lease(state, "dead", 10, time.time())
    assert {mid: t.body for mid, t in got.items()} == {"big": BIG, "past-edge": PAST_EDGE}
    ops += [_ack(state, "dead", t) for t in got.values()]
    await storage.submit(ops)
    assert _stored(storage) == {}
    assert _bodies_table(storage) == 0
    storage, state = await _reopen(storage, [])
    assert all_ids(state) == set()
    assert _bodies_table(storage) == 0


async def test_a_purge_deletes_the_bodies_of_its_queue_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    storage, state = _open(tmp_path / "zdmq.sqlite3")
    now = time.time()
    ops: list[Op] = [
        state.push("a", "a-ready", MID, None, now=now),
        state.push("a", "a-leased", BIG, None, now=now),
        state.push("a", "a-small", SMALL, None, now=now),
        state.push("b", "b-kept", PAST_EDGE, None, now=now),
    ]
    got, leased = _lease(state, "a", 2, now)
    assert set(got) == {"a-ready", "a-leased"}
    delayed = state.requeue("a", "a-ready", got["a-ready"].token or "", now, delay_s=600)
    purge = state.purge("a")
    assert delayed is not None and purge is not None
    await storage.submit([*ops, *leased, delayed, purge])
    assert set(_stored(storage)) == {"b-kept"}
    assert _bodies_table(storage) == 1
    storage, state = await _reopen(storage, [])
    assert _find_body(state, "b-kept") == PAST_EDGE
    assert all_ids(state) == {"b-kept"}


async def test_a_message_dropped_past_retention_takes_its_body_with_it(tmp_path: Path) -> None:
    storage, state = _open(tmp_path / "zdmq.sqlite3")
    past = time.time() - 1000
    await storage.submit([state.push("jobs", "old", BIG, None, now=past)])
    assert _bodies_table(storage) == 1
    got, ops = state.pop("jobs", 1, now=time.time(), retention_s=60)
    assert got == [] and ops
    await storage.submit(ops)
    assert _stored(storage) == {}
    assert _bodies_table(storage) == 0


async def test_requeued_and_dead_lettered_messages_acked_without_a_restart_leave_no_body(
    tmp_path: Path,
) -> None:
    # A requeue or move gives the row a new seq: the body must still be found by it.
    storage, state = _open(tmp_path / "zdmq.sqlite3")
    now = time.time()
    ops: list[Op] = [state.push("jobs", mid, BIG, None, now=now) for mid in ("nacked", "moved")]
    got, leased = _lease(state, "jobs", 2, now)
    ops += leased
    nack = state.requeue("jobs", "nacked", got["nacked"].token or "", now)
    move = state.requeue(
        "jobs", "moved", got["moved"].token or "", now, max_receives=1, dead_letter_queue="dead"
    )
    assert nack is not None and isinstance(move, DeadLetter)
    await storage.submit([*ops, nack, move])
    assert _bodies_table(storage) == 2
    ops = []
    for queue in ("jobs", "dead"):
        got, leased = _lease(state, queue, 1, now)
        assert [t.body for t in got.values()] == [BIG]
        ops += [*leased, *(_ack(state, queue, t) for t in got.values())]
    await storage.submit(ops)
    assert _stored(storage) == {}
    assert _bodies_table(storage) == 0


async def test_a_pushed_and_acked_message_in_one_commit_leaves_no_body(tmp_path: Path) -> None:
    storage, state = _open(tmp_path / "zdmq.sqlite3")
    now = time.time()
    push = state.push("jobs", "a", BIG, None, now=now)
    got, leased = _lease(state, "jobs", 1, now)
    await storage.submit([push, *leased, _ack(state, "jobs", got["a"])])
    assert _bodies_table(storage) == 0


def _wal_frames_since_last_checkpoint(storage: SqliteStorage) -> int:
    """Frames in the WAL; the checkpoint also moves them all into the database, so the
    next commit starts the WAL over and the next call counts that commit's frames."""
    busy, frames, done = _conn(storage).execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and done == frames
    return int(frames)


async def test_leasing_or_requeueing_a_stored_1_mib_message_writes_a_few_pages_not_its_body(
    tmp_path: Path,
) -> None:
    storage, state = _open(tmp_path / "zdmq.sqlite3")
    (page,) = _conn(storage).execute("PRAGMA page_size").fetchone()
    now = time.time()
    await storage.submit([state.push("jobs", "big", BIG, None, now=now)])
    assert _wal_frames_since_last_checkpoint(storage) * page > len(BIG)  # the push wrote it

    got, leased = _lease(state, "jobs", 1, now)
    assert got["big"].body == BIG
    await storage.submit(leased)
    # Inline, the lease rewrote the record (and freed, zeroed, its old overflow pages):
    # 514 frames, 2 MiB. Out of line it changes one leaf page of the messages table.
    assert _wal_frames_since_last_checkpoint(storage) <= 4

    nack = state.requeue("jobs", "big", got["big"].token or "", now)
    assert nack is not None
    await storage.submit([nack])
    assert _wal_frames_since_last_checkpoint(storage) <= 4

    got, leased = _lease(state, "jobs", 1, now)
    assert got["big"].body == BIG
    await storage.submit([*leased, _ack(state, "jobs", got["big"])])
    # Deleting the body frees its pages onto the free list, without zeroing each one.
    assert _wal_frames_since_last_checkpoint(storage) <= 8


def _old_schema_db(path: Path, body: bytes) -> None:
    """A database written before out-of-line bodies: no body_ref column, no bodies table,
    one message with a large body in its row."""
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript(
            """
            CREATE TABLE messages (
                seq INTEGER PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL,
                content_type TEXT, body BLOB NOT NULL, enqueued_at REAL NOT NULL DEFAULT 0,
                receive_count INTEGER NOT NULL DEFAULT 0, lease TEXT,
                lease_until REAL NOT NULL DEFAULT 0, visible_at REAL NOT NULL DEFAULT 0,
                origin TEXT
            );
            CREATE TABLE queues (
                name TEXT PRIMARY KEY, incarnation TEXT NOT NULL, created_at REAL NOT NULL,
                settings TEXT NOT NULL DEFAULT '{}'
            );
            """
        )
        conn.execute(
            "INSERT INTO messages (seq, queue, id, content_type, body, enqueued_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (5, "jobs", "old", "b/x", body, time.time()),
        )
    conn.close()


async def test_a_database_with_large_bodies_in_their_rows_opens_and_serves_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "zdmq.sqlite3"
    _old_schema_db(path, MID)
    storage, state = _open(path)
    assert _stored(storage) == {"old": (len(MID), None)}  # migrated in place, still inline
    now = time.time()
    ops: list[Op] = [state.push("jobs", "new", BIG, None, now=now)]
    got, leased = _lease(state, "jobs", 2, now)
    assert {mid: t.body for mid, t in got.items()} == {"old": MID, "new": BIG}
    nack = state.requeue("jobs", "old", got["old"].token or "", now)
    assert nack is not None
    storage, state = await _reopen(storage, [*ops, *leased, nack])

    assert _stored(storage) == {"old": (len(MID), None), "new": (0, 6)}
    got, ops = _lease(state, "jobs", 1, time.time())
    assert got["old"].body == MID and got["old"].receive_count == 2
    ops.append(_ack(state, "jobs", got["old"]))
    storage, state = await _reopen(storage, ops)
    assert set(_stored(storage)) == {"new"} and _bodies_table(storage) == 1
    assert _find_body(state, "new") == BIG


async def test_a_body_no_row_refers_to_is_deleted_on_open_and_its_id_can_be_reused(
    tmp_path: Path,
) -> None:
    # Writers never leave one; were one left, the next push of that seq (a node whose
    # database emptied counts seqs from 1 again) must not collide with it.
    storage, state = _open(tmp_path / "zdmq.sqlite3")
    await storage.submit([state.push("jobs", "kept", BIG, None, now=time.time())])
    _conn(storage).execute("INSERT INTO bodies (id, body) VALUES (2, x'00')")
    storage, state = await _reopen(storage, [])
    assert _bodies_table(storage) == 1
    push = state.push("jobs", "next", MID, None, now=time.time())
    assert push.seq == 2
    await storage.submit([push])
    assert _find_body(state, "next") == MID and _find_body(state, "kept") == BIG


async def test_a_node_serves_a_1_mib_body_through_nack_restart_and_ack(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(nodes=1, durability="fsync")
    async with Client.from_config(cluster.config_path) as c:
        await c.create_queue("big")
        await c.push_many("big", [BIG, SMALL])
        got = await c.receive("big", 2)
        assert sorted(m.body for m in got) == sorted([BIG, SMALL])
        await c.nack("big", [m.receipt for m in got])
    cluster.restart("n1")
    async with Client.from_config(cluster.config_path) as c:
        got = await c.receive("big", 2)
        assert sorted((m.body, m.receive_count) for m in got) == sorted([(BIG, 2), (SMALL, 2)])
        await c.ack("big", [m.receipt for m in got])
    cluster.stop()
    conn = sqlite3.connect(cluster.config.node_data_dir("n1") / "zdmq.sqlite3")
    try:
        assert conn.execute("SELECT count(*) FROM messages").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM bodies").fetchone() == (0,)
    finally:
        conn.close()
