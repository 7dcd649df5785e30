"""Storage: what SqliteStorage commits comes back on reopen; concurrent writes share commits.

These tests open a SQLite file in tmp_path (storage is the one module that owns files)
and never open a socket.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from zdmq.errors import StorageFailed
from zdmq.models import QueueSettings
from zdmq.server.state import (
    CreateQueue,
    CreateTopic,
    DropQueue,
    DropTopic,
    MessageView,
    NodeState,
    Op,
    Push,
    Register,
    Subscribe,
    Unregister,
    Unsubscribe,
)
from zdmq.server.storage import BODY_INLINE_MAX, MemoryStorage, SqliteStorage, open_storage

from .views import all_ids, where


def _snapshot(state: NodeState) -> dict[str, object]:
    """What a node must get back after a restart, in comparable form.

    Runtime knowledge (whether a UUID queue is registered, the next sequence number)
    is rebuilt after a restart, so it is left out.
    """
    views = {mid: state.find(mid) for mid in all_ids(state)}
    return {
        "queues": {q: state.ready_list(q) for q, lq in state.queues.items() if lq.ready},
        "messages": {
            mid: (m.queue, m.seq, m.body, m.content_type)
            for mid, m in views.items()
            if m is not None
        },
        "meta": {
            q: (m.incarnation, m.created_at, list(m.nodes.items())) for q, m in state.meta.items()
        },
        "tombstones": list(state.tombstones.items()),
    }


_OPEN: list[SqliteStorage] = []


@pytest.fixture(autouse=True)
async def _close_reopened() -> AsyncIterator[None]:
    yield
    await _close_open()


async def _close_open() -> None:
    """Closes the stores `_reopen` opened: a node's database has one owner at a time."""
    while _OPEN:
        await _OPEN.pop().close()


async def _reopen(path: Path) -> NodeState:
    """The state a restart loads. Its storage stays open until the test ends: the state
    reads message bodies from it."""
    storage = SqliteStorage(path, fsync=True)
    _OPEN.append(storage)
    return storage.load()


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
        popped, ops = self.state.pop(queue, limit)
        self.ops.extend(ops)
        return [t.id for t in popped]

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
    rec(DropQueue("gone", "inc-gone", 1700000003.0))
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
    before = _snapshot(state)
    await storage.close()

    again = await _reopen(path)
    assert _snapshot(again) == before
    # Spelled out: FIFO order kept, popped and purged messages gone, metadata lists kept.
    assert again.ready_list("jobs") == [f"j{i}" for i in range(4, 10)]
    assert again.ready_list("bin") == ["b0", "b1"]
    assert again.tombstones == {"gone": ("inc-gone", 1700000003.0)}
    assert _find(again, "b0").body == bytes(range(256))
    assert _find(again, "j5").content_type == "text/plain"
    assert "purged" not in again.queues
    assert not set(popped) & all_ids(again)
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
    assert again.ready_list("jobs") == ["a1", "a2", "a3", "a4", "b0", "b1", "b2"]


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
    assert again.ready_list("jobs") == [f"m{i:03d}" for i in range(200)]


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
    assert len(all_ids(again)) == again.stored() == 200


async def test_close_writes_what_was_submitted_but_not_awaited(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    fut = storage.submit([state.push("jobs", "a", b"", None)])
    await storage.close()
    assert fut.done() and fut.exception() is None
    again = await _reopen(tmp_path / "zdmq.sqlite3")
    assert again.ready_list("jobs") == ["a"]


async def test_a_failed_commit_fails_its_writers_and_every_later_write(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    good = [state.push("jobs", "ok", b"", None)]
    first = storage.submit(good)
    # Two rows with one sequence number: the disk refuses the transaction, and with it
    # the write submitted before in the same one.
    bad = [Push("jobs", "a", 5, b"", None), Push("jobs", "b", 5, b"", None)]
    for op in bad:
        state.apply(op)
    second = storage.submit(bad)
    for fut in (first, second):
        with pytest.raises(StorageFailed):
            await fut
    assert storage.failed is not None and "IntegrityError" in storage.failed
    with pytest.raises(StorageFailed, match="storage failed earlier"):
        storage.submit([state.push("jobs", "c", b"", None)])
    await storage.close()
    # The refused transaction left nothing behind.
    again = await _reopen(tmp_path / "zdmq.sqlite3")
    assert all_ids(again) == set()


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


# ---- delivery state across a reopen --------------------------------------------------------
# `load` rebuilds leases and delays as of the wall clock, so these tests place them
# relative to time.time(): far enough ahead or behind that the test's own run time
# cannot move them across `now`.
def _tokens(*names: str) -> Callable[[], str]:
    it = iter(names)
    return lambda: next(it)


def _find(state: NodeState, mid: str) -> MessageView:
    m = state.find(mid)
    assert m is not None, f"{mid} is not stored"
    return m


async def _commit_and_reopen(storage: SqliteStorage, ops: list[Op]) -> NodeState:
    await storage.submit(ops)
    await storage.close()
    return await _reopen(storage.path)


async def test_a_reopened_store_keeps_a_running_lease_with_its_token_and_deadline(
    tmp_path: Path,
) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    now = time.time()
    ops: list[Op] = [state.push("jobs", m, m.encode(), None, now=now) for m in ("a", "b")]
    _, leased = state.lease("jobs", 1, now=now, visibility_s=600, new_token=_tokens("tok1"))
    ops += leased
    extend = state.extend("jobs", "a", "tok1", now, 900)  # the deadline on disk is this one
    assert extend is not None
    ops.append(extend)
    again = await _commit_and_reopen(storage, ops)

    m = _find(again, "a")
    assert (m.lease, m.lease_until, m.receive_count) == ("tok1", now + 900, 1)
    assert where(again, "jobs") == (["b"], {"a"}, set())
    assert again.counts("jobs") == {
        "ready": 1,
        "in_flight": 1,
        "delayed": 0,
        "dead_lettered": 0,
        "expired": 0,
    }
    # Still invisible to a new lease, and the lease monitor finds it due at its deadline.
    got, _ = again.lease("jobs", 5, now=time.time(), visibility_s=10_000, new_token=_tokens("x"))
    assert [t.id for t in got] == ["b"]
    assert again.due_leases(now + 899) == []
    assert again.due_leases(now + 900) == [("jobs", "a", "tok1")]
    # Its receipt still acks it.
    assert again.ack("jobs", "a", "tok1", time.time()) is not None


async def test_a_lease_that_ran_out_while_the_store_was_closed_is_due_at_once(
    tmp_path: Path,
) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    past = time.time() - 100
    ops: list[Op] = [state.push("jobs", "a", b"", None, now=past)]
    _, leased = state.lease("jobs", 1, now=past, visibility_s=10, new_token=_tokens("tok1"))
    again = await _commit_and_reopen(storage, ops + leased)

    # Not lost and not yet visible: the monitor's first look requeues it.
    assert where(again, "jobs") == ([], {"a"}, set())
    now = time.time()
    assert again.due_leases(now) == [("jobs", "a", "tok1")]
    assert again.ack("jobs", "a", "tok1", now) is None
    assert again.requeue("jobs", "a", "tok1", now, expired=True) is not None
    got, _ = again.lease("jobs", 1, now=now, visibility_s=30, new_token=_tokens("tok2"))
    assert [(t.id, t.receive_count) for t in got] == [("a", 2)]


async def test_a_delayed_message_stays_delayed_until_visible_at_across_a_reopen(
    tmp_path: Path,
) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    past = time.time() - 100
    ops: list[Op] = [state.push("jobs", m, b"", None, now=past) for m in ("soon", "later")]
    _, leased = state.lease("jobs", 2, now=past, visibility_s=30, new_token=_tokens("t1", "t2"))
    ops += leased
    # "soon" becomes visible while the store is closed; "later" only after the reopen.
    for mid, token, delay_s in (("soon", "t1", 10.0), ("later", "t2", 700.0)):
        op = state.requeue("jobs", mid, token, past, delay_s=delay_s)
        assert op is not None
        ops.append(op)
    again = await _commit_and_reopen(storage, ops)

    assert where(again, "jobs") == (["soon"], set(), {"later"})
    later = _find(again, "later")
    assert (later.visible_at, later.lease, later.receive_count) == (past + 700, None, 1)
    assert again.counts("jobs")["delayed"] == 1
    assert again.wake(past + 699.999) == set()
    assert again.wake(past + 700) == {"jobs"}
    assert where(again, "jobs") == (["soon", "later"], set(), set())


async def test_a_dead_lettered_message_is_in_the_dlq_with_its_origin_counted_after_a_reopen(
    tmp_path: Path,
) -> None:
    path = tmp_path / "zdmq.sqlite3"
    storage = SqliteStorage(path, fsync=True)
    state = storage.load()
    now = time.time()
    push = state.push("jobs", "a", b"poison", "text/plain", now=now)
    _, leased = state.lease("jobs", 1, now=now, visibility_s=30, new_token=_tokens("t1"))
    moved = state.requeue("jobs", "a", "t1", now + 1, max_receives=1, dead_letter_queue="dead")
    assert moved is not None
    again = await _commit_and_reopen(storage, [push, *leased, moved])

    m = _find(again, "a")
    assert (m.queue, m.origin, m.receive_count, m.lease, m.seq) == (
        "dead",
        "jobs",
        0,
        None,
        moved.new_seq,
    )
    assert (m.body, m.content_type, m.enqueued_at) == (b"poison", "text/plain", now + 1)
    assert where(again, "dead") == (["a"], set(), set())
    assert again.depth("jobs") == 0
    assert again.counts("jobs") == {
        "ready": 0,
        "in_flight": 0,
        "delayed": 0,
        "dead_lettered": 1,
        "expired": 0,
    }
    assert again.counts("dead")["ready"] == 1

    # Consumed from the DLQ: gone, and no longer counted against its origin after a reopen.
    await _close_open()
    storage = SqliteStorage(path, fsync=True)
    state = storage.load()
    _, leased = state.lease("dead", 1, now=now + 2, visibility_s=30, new_token=_tokens("t2"))
    ack = state.ack("dead", "a", "t2", now + 3)
    assert ack is not None
    again = await _commit_and_reopen(storage, [*leased, ack])
    assert all_ids(again) == set()
    assert again.counts("jobs")["dead_lettered"] == 0


async def test_dedup_records_survive_a_reopen_and_forgotten_or_purged_ones_stay_gone(
    tmp_path: Path,
) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    now = time.time()
    ops: list[Op] = [
        state.push("jobs", "kept", b"", None, now=now, dedup_window_s=300),
        state.push("jobs", "ended", b"", None, now=now - 100, dedup_window_s=1),
        state.push("purged", "p", b"", None, now=now, dedup_window_s=300),
    ]
    ops += state.pop("jobs", 10, now=now)[1]
    forget = state.forget_dedup(now)
    purge = state.purge("purged")
    assert forget is not None and purge is not None
    again = await _commit_and_reopen(storage, [*ops, forget, purge])

    assert all_ids(again) == set()
    assert again.dedup == {"kept": ("jobs", now + 300)}
    assert again.is_duplicate("kept", time.time())
    assert not again.is_duplicate("ended", time.time())
    assert not again.is_duplicate("p", time.time())
    # The reloaded record still ends on time.
    assert again.forget_dedup(now + 301) is not None
    assert again.dedup == {}


async def test_queue_settings_survive_a_reopen_in_the_metadata(tmp_path: Path) -> None:
    settings = QueueSettings(
        visibility_timeout_s=12.5,
        max_receives=4,
        dead_letter_queue="jobs-dlq",
        retention_s=3600.0,
        dedup_window_s=60.0,
        max_message_bytes=4096,
    )
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    rec = _Recorder(storage.load())
    rec(CreateQueue("jobs", "inc-1", 1.0, settings))
    rec(CreateQueue("jobs-dlq", "inc-2", 2.0))
    again = await _commit_and_reopen(storage, rec.take())
    assert again.meta["jobs"].settings == settings
    assert again.meta["jobs-dlq"].settings == QueueSettings()


async def test_topics_and_their_subscriptions_survive_a_reopen_in_their_order(
    tmp_path: Path,
) -> None:
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    rec = _Recorder(storage.load())
    rec(CreateQueue("events", "inc-1", 1.0))  # a queue may share a topic's name
    rec(CreateTopic("events", 2.0))
    rec(CreateTopic("gone", 3.0))
    for q in ("c", "a", "b"):
        rec(Subscribe("events", q))
    rec(Subscribe("gone", "a"))
    rec(Unsubscribe("events", "c"))
    rec(Subscribe("events", "c"))  # subscribed again: it comes last
    rec(DropTopic("gone"))
    live = rec.state
    again = await _commit_and_reopen(storage, rec.take())
    assert list(again.topics) == ["events"] == list(live.topics)
    assert list(again.topics["events"].subscriptions) == ["a", "b", "c"]
    assert list(live.topics["events"].subscriptions) == ["a", "b", "c"]
    assert again.topics["events"].created_at == 2.0
    assert list(again.meta) == ["events"]


def _old_schema_db(path: Path, mid: str) -> None:
    """A database as zdmq's first schema wrote it: three tables, one message in one queue."""
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript(
            """
            CREATE TABLE messages (
                seq INTEGER PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL,
                content_type TEXT, body BLOB NOT NULL
            );
            CREATE TABLE queues (
                name TEXT PRIMARY KEY, incarnation TEXT NOT NULL, created_at REAL NOT NULL
            );
            CREATE TABLE registrations (
                queue TEXT NOT NULL, node TEXT NOT NULL, first_uuid TEXT NOT NULL,
                registered_at REAL NOT NULL, PRIMARY KEY (queue, node)
            );
            """
        )
        conn.execute(
            "INSERT INTO messages VALUES (?, ?, ?, ?, ?)", (7, "jobs", mid, "text/plain", b"old")
        )
        conn.execute("INSERT INTO queues VALUES (?, ?, ?)", ("jobs", "inc-old", 1700000000.0))
        conn.execute("INSERT INTO registrations VALUES (?, ?, ?, ?)", ("jobs", "n1", mid, 1.0))
    conn.close()


async def test_a_database_of_the_old_schema_opens_migrates_and_keeps_its_message(
    tmp_path: Path,
) -> None:
    path = tmp_path / "zdmq.sqlite3"
    mid = "0b1e3f6c-8a0e-4d3c-9a57-2f1c6d0e7b42"
    _old_schema_db(path, mid)
    storage = SqliteStorage(path, fsync=True)
    state = storage.load()

    m = _find(state, mid)
    assert (m.queue, m.seq, m.body, m.content_type) == ("jobs", 7, b"old", "text/plain")
    assert (m.receive_count, m.lease, m.origin) == (0, None, None)
    assert where(state, "jobs") == ([mid], set(), set())
    meta = state.meta["jobs"]
    assert (meta.incarnation, meta.created_at) == ("inc-old", 1700000000.0)
    assert meta.settings == QueueSettings()
    assert meta.nodes == {"n1": mid}

    # The migrated tables take the new kinds of writes.
    now = time.time()
    push = state.push("jobs", "new", b"", None, now=now, dedup_window_s=60)
    assert push.seq == 8  # after the migrated row's
    ops: list[Op] = [push]
    ops += state.lease("jobs", 1, now=now, visibility_s=600, new_token=_tokens("tok"))[1]
    create = CreateQueue("other", "inc", 2.0, QueueSettings(visibility_timeout_s=5))
    state.apply(create)
    again = await _commit_and_reopen(storage, [*ops, create])
    assert where(again, "jobs") == (["new"], {mid}, set())
    assert (_find(again, mid).lease, _find(again, mid).receive_count) == ("tok", 1)
    assert again.is_duplicate("new", now)
    assert again.meta["other"].settings == QueueSettings(visibility_timeout_s=5)


async def test_a_message_migrated_from_the_old_schema_is_not_dropped_as_past_retention(
    tmp_path: Path,
) -> None:
    # The old schema kept no enqueue time. A message it stored was accepted and must not
    # be dropped by the first pop, receive or retention sweep after the upgrade.
    path = tmp_path / "zdmq.sqlite3"
    mid = "0b1e3f6c-8a0e-4d3c-9a57-2f1c6d0e7b42"
    _old_schema_db(path, mid)
    state = await _reopen(path)
    retention_s = QueueSettings().retention_s
    now = time.time()
    assert state.expired_by_retention("jobs", now, retention_s) == []
    got, _ = state.pop("jobs", 1, now=now, retention_s=retention_s)
    assert [t.id for t in got] == [mid]


async def test_a_second_storage_on_the_same_database_is_refused_while_the_first_is_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "zdmq.sqlite3"
    first = SqliteStorage(path, fsync=True)
    state = first.load()
    await first.submit([state.push("jobs", "a", b"kept", None)])
    with pytest.raises(StorageFailed, match="in use by another process"):
        SqliteStorage(path, fsync=True).load()
    # The refused opener changed nothing; once the owner closes, a restart loads it all.
    await first.close()
    again = await _reopen(path)
    assert again.ready_list("jobs") == ["a"]


async def test_an_fsync_store_lays_its_wal_out_and_reads_back_through_it(tmp_path: Path) -> None:
    path = tmp_path / "zdmq.sqlite3"
    wal = path.with_name(path.name + "-wal")
    storage = SqliteStorage(path, fsync=True)
    rec = _Recorder(storage.load())
    # Laid out before the first commit: a checkpoint's worth of frames, all zeros.
    size = wal.stat().st_size
    assert size > 1000 * 4096
    assert wal.read_bytes() == bytes(size)
    for i in range(5):
        rec.push("jobs", f"a{i}", b"body %d" % i, None)
    await storage.submit(rec.take())
    # A copy taken while the store is open is what kill -9 leaves: frames at the head of
    # the WAL, zeros after them. Opening it recovers the frames and lays the WAL out anew.
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for f in (path, wal):
        (crashed / f.name).write_bytes(f.read_bytes())
    await storage.close()
    again = await _reopen(crashed / path.name)
    assert again.ready_list("jobs") == [f"a{i}" for i in range(5)]
    assert (crashed / wal.name).stat().st_size == size


async def test_an_os_store_leaves_its_wal_to_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "zdmq.sqlite3"
    storage = SqliteStorage(path, fsync=False)
    storage.load()
    # Only what loading wrote (the schema): no laid-out checkpoint's worth of frames.
    assert path.with_name(path.name + "-wal").stat().st_size < 1000 * 4096
    await storage.close()


async def test_tombstones_are_kept_to_the_bound_and_a_create_removes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zdmq.server.state as state_module
    import zdmq.server.storage as storage_module

    monkeypatch.setattr(state_module, "TOMBSTONES_KEPT", 3)
    monkeypatch.setattr(storage_module, "TOMBSTONES_KEPT", 3)
    path = tmp_path / "n1" / "zdmq.sqlite3"
    storage = SqliteStorage(path, fsync=True)
    state = storage.load()
    rec = _Recorder(state)
    for i in range(5):
        rec(CreateQueue(f"q{i}", f"inc-{i}", float(i)))
        rec(DropQueue(f"q{i}", f"inc-{i}", 10.0 + i))
    rec(CreateQueue("q3", "inc-3b", 20.0))
    await storage.submit(rec.take())
    kept = dict(state.tombstones)
    await storage.close()

    again = await _reopen(path)
    assert kept == {"q2": ("inc-2", 12.0), "q4": ("inc-4", 14.0)}
    assert again.tombstones == kept


async def test_delivery_options_expired_counts_and_cancels_survive_a_reopen(
    tmp_path: Path,
) -> None:
    """Priorities, deadlines, push delays and attributes (of a small body and of one kept
    out of line), the queue's expired count and the cancelled ids are all on disk."""
    storage = SqliteStorage(tmp_path / "zdmq.sqlite3", fsync=True)
    state = storage.load()
    now = time.time()
    big = b"x" * (BODY_INLINE_MAX + 1)
    ops: list[Op] = state.push_options(
        "jobs",
        [
            ("plain", b"p", None, 0.0, 0, 0.0, 0.0, None),
            ("high", b"h", None, 0.0, 7, 0.0, 0.0, '{"k":"v"}'),
            ("big", big, None, 0.0, 7, now + 600, 0.0, '{"size":"big"}'),
            ("gone", b"g", None, 0.0, 9, now - 1, 0.0, None),  # past its deadline
            ("later", b"l", None, 0.0, 3, 0.0, 600.0, None),  # delayed 10 minutes
            ("cancelled", b"c", None, 0.0, 0, 0.0, 0.0, None),
        ],
        now=now,
    )
    ops += state.expired_by_deadline(now)
    assert state.cancel("jobs", "cancelled") == "cancelled"
    again = await _commit_and_reopen(storage, ops)

    assert where(again, "jobs") == (["big", "high", "plain"], set(), {"later"})
    assert again.counts("jobs")["expired"] == 1
    assert again.cancel("jobs", "cancelled") == "again"
    taken, _ = again.pop("jobs", 3, now=now, min_priority=7)
    assert [(t.id, t.priority, t.attributes) for t in taken] == [
        ("big", 7, '{"size":"big"}'),
        ("high", 7, '{"k":"v"}'),
    ]
    assert taken[0].body == big
