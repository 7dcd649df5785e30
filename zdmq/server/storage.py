"""Durable storage of a node's operations in SQLite (WAL), with group commit.

The only module that opens files. `NodeState.apply` hands every op it applies to
`write`; the ops are written into the open transaction before the next read or commit.
`submit` returns a future that resolves once they are committed. The commit runs on the
loop at its next iteration, so every op of the same iteration (and of every request that
arrived while the last commit's fsync ran) shares one transaction and one fsync. A reply
goes out only after its future resolves.

Message bodies live only here: the state reads the rows of the messages it delivers
with `read`, on the same connection, so it sees what is written but not yet committed
(a message pushed and received in one loop iteration). A body larger than
`BODY_INLINE_MAX` is kept out of its message's row, in table `bodies`, so that the
updates a message goes through (lease, requeue, dead-letter) rewrite a small row rather
than the body (see `BODY_INLINE_MAX`).

    durability: fsync   synchronous=FULL: the WAL is fsynced at every commit
    durability: os      synchronous=OFF: written to the OS at every commit, not flushed
    durability: memory  nothing is written (MemoryStorage)

On open, `load` replays the tables into a fresh `NodeState`. If a commit fails the
node's memory no longer matches its disk: storage marks itself failed, fails every
later write with StorageFailed, and the node reports unhealthy rather than serve state
it cannot keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import orjson

from zdmq.errors import StorageFailed
from zdmq.models import QueueSettings
from zdmq.raft.core import Conf
from zdmq.server.state import (
    CANCELS_KEPT,
    TIES_KEPT,
    TOMBSTONES_KEPT,
    Cancel,
    Claimed,
    CreateQueue,
    CreateTopic,
    DeadLetter,
    DropQueue,
    DropTopic,
    Extend,
    ForgetDedup,
    Lease,
    NodeState,
    Op,
    Purge,
    Push,
    Register,
    Remove,
    Requeue,
    Row,
    Subscribe,
    Tied,
    Unregister,
    Unsubscribe,
    Untied,
)

__all__ = ["MemoryStorage", "SqliteStorage", "Storage", "open_storage"]

_perf_counter = time.perf_counter
log = logging.getLogger("zdmq.storage")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    id TEXT NOT NULL,
    content_type TEXT,
    body BLOB NOT NULL,
    enqueued_at REAL NOT NULL DEFAULT 0,
    receive_count INTEGER NOT NULL DEFAULT 0,
    lease TEXT,
    lease_until REAL NOT NULL DEFAULT 0,
    visible_at REAL NOT NULL DEFAULT 0,
    origin TEXT,
    body_ref INTEGER,  -- bodies.id of a body kept out of line (body is then empty), or NULL
    priority INTEGER NOT NULL DEFAULT 0,
    deadline REAL NOT NULL DEFAULT 0,  -- 0: none
    attributes TEXT,  -- a JSON object, or NULL
    grp TEXT,  -- the FIFO group of a FIFO queue's message, or NULL
    tie TEXT  -- the token of the tie of a tied copy, or NULL
);
-- Bodies above BODY_INLINE_MAX, written with their message's row and deleted with it.
-- id is the seq the message was pushed with; it never changes while the message lives.
CREATE TABLE IF NOT EXISTS bodies (
    id INTEGER PRIMARY KEY,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    incarnation TEXT NOT NULL,
    created_at REAL NOT NULL,
    settings TEXT NOT NULL DEFAULT '{}'
);
-- Deleted queues (on their metadata owner): a repair sweep purges only these.
CREATE TABLE IF NOT EXISTS tombstones (
    name TEXT PRIMARY KEY,
    incarnation TEXT NOT NULL,
    deleted_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS dedup (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    until REAL NOT NULL
);
-- A replica group's state: the last log index applied (`applied`), that entry's term
-- (`applied_term`), the state's clock, and the group's configuration as of `applied`
-- (`conf`, JSON text; absent while the group's first members all vote); in the group
-- that keeps the cluster map, the map as of `applied` (`map`, JSON text).
CREATE TABLE IF NOT EXISTS machine (
    key TEXT PRIMARY KEY,
    value REAL NOT NULL
) WITHOUT ROWID;
-- Topics (on the metadata owner of their name) and their subscriptions, in the order
-- they were made (id).
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS subscriptions (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    queue TEXT NOT NULL,
    UNIQUE (topic, queue)
);
-- Messages dropped past their deadline, per queue (GET /v1/queues/{q}: expired).
CREATE TABLE IF NOT EXISTS expired (
    queue TEXT PRIMARY KEY,
    n INTEGER NOT NULL
);
-- The last CANCELS_KEPT cancelled message ids, in order (n).
CREATE TABLE IF NOT EXISTS cancelled (
    n INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    queue TEXT NOT NULL
);
-- Ties whose token this group owns, in the order they were made (n): their copies as a
-- JSON list of [queue, id], the copy that won its claim, whether it was cancelled.
CREATE TABLE IF NOT EXISTS ties (
    n INTEGER PRIMARY KEY,
    token TEXT NOT NULL UNIQUE,
    copies TEXT NOT NULL,
    winner TEXT,
    cancelled INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS registrations (
    queue TEXT NOT NULL,
    node TEXT NOT NULL,
    first_uuid TEXT NOT NULL,
    registered_at REAL NOT NULL,
    PRIMARY KEY (queue, node)
);
"""


class Storage:
    """The interface the node uses; `MemoryStorage` and `SqliteStorage` implement it."""

    failed: str | None = None
    commits = 0
    ops_written = 0
    #: Called after each commit with (ops it wrote, seconds it took): the node's metrics.
    on_commit: Callable[[int, float], None] | None = None
    # A replica group's state: the last log index applied to it and its clock, as of the
    # last commit (load reads them back; `note_applied` moves them).
    applied = 0
    applied_term = 0
    clock = 0.0
    #: The group's configuration as of `applied` (None: its first members all vote).
    conf: Conf | None = None
    #: The cluster map this group's log holds as of `applied` (JSON text; None: the map
    #: cluster.yaml makes, or a group that does not keep it).
    map_json: str | None = None
    # Rows of delivered messages served from the cache of recent pushes, and read back.
    cache_hits = 0
    cache_misses = 0

    def load(self) -> NodeState:
        raise NotImplementedError

    def submit(self, ops: Sequence[Op]) -> asyncio.Future[None]:
        """The commit of `ops`: ops the loaded state has applied (`NodeState.apply`
        hands each one to the state's rows, which are this storage)."""
        raise NotImplementedError

    def barrier(self) -> asyncio.Future[None]:
        """Resolves once everything submitted so far is committed (a reply that reports
        an earlier write, such as a duplicate push, waits for it to be durable)."""
        raise NotImplementedError

    def checkpoint(self) -> int:
        """A replica group's state made durable: everything applied is committed and
        synced to the database file. Returns the log index the file now holds durably
        (0: this storage cannot tell, nothing may be compacted on its word)."""
        return 0

    def copy_to(self, path: Path) -> tuple[int, int]:
        """A consistent copy of a replica group's state in a new database file `path`
        (its snapshot); returns the (index, term) of the last entry it holds."""
        raise NotImplementedError("this storage keeps no file to copy")

    def note_applied(self, index: int, clock: float, term: int = 0) -> None:
        """A replica group applied its log up to `index` (of `term`): written with the ops
        applied so far, in the same commit, so a reload knows where to resume the log."""
        self.applied, self.clock = index, clock
        if term:
            self.applied_term = term

    def note_conf(self, conf: Conf) -> None:
        """The group applied a configuration entry: written with the next `note_applied`."""
        self.conf = conf

    def note_map(self, text: str) -> None:
        """The group applied a cluster map: written with the next `note_applied`."""
        self.map_json = text

    async def close(self) -> None:
        raise NotImplementedError


class MemoryStorage(Storage):
    """`durability: memory`: state lives only in the process."""

    def __init__(self) -> None:
        self._done: asyncio.Future[None] | None = None

    def load(self) -> NodeState:
        return NodeState()

    def submit(self, ops: Sequence[Op]) -> asyncio.Future[None]:
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
            self._done.set_result(None)
        self.ops_written += len(ops)
        return self._done

    def barrier(self) -> asyncio.Future[None]:
        return self.submit(())

    async def close(self) -> None:
        return None


_LOCK_WAIT_S = 2.0  # how long opening waits for another process's lock on the database
# SQLite's WAL layout: a 32-byte file header, then frames of a 24-byte header and a page.
_WAL_HEADER = 32
_WAL_FRAME_HEADER = 24
_WAL_SLACK_FRAMES = 64  # room past the checkpoint threshold for the commit that crosses it

# The bodies of recently pushed messages kept in memory, so that a consumer that keeps up
# is served without reading its messages back from SQLite (docs/design.md §8). A cached
# row costs its body and about _ROW_BYTES more (the Row, its id string, the dict slot).
BODY_CACHE_BYTES = 8 << 20
_ROW_BYTES = 320

# Bodies longer than this are stored out of line, in table `bodies`. SQLite rewrites a
# whole record on UPDATE, overflow pages included: a 1 MiB body kept in its message's row
# would be written to the WAL again by every lease, requeue and dead-letter (and the freed
# copy zeroed, see secure_delete below). Out of line, the body is written once; a lease
# rewrites only the leaf page of small rows it changes. Below a page a lease still
# rewrites the page the row is on, and more rows share a page the smaller they are, so
# the saving shrinks with the body while the cost (a second row to insert, read and
# delete) stays. Measured on the storage alone (fsync; push, lease, ack of 64-message
# batches; medians of 5-7, CPU spread +-2-7 us), in the row against out of line: 2 KiB
# bodies 31.6 against 26.7 us CPU and 8.5 against 4.7 KiB of WAL a message, 4 KiB 42
# against 37 us and 8.5 against 4.7 KiB, 10 KiB 81 against 55 us and 25 against 13 KiB;
# from 0.5 to 1.5 KiB the CPU is the same within the noise. So bodies above 2 KiB go out
# of line and the 100-byte path keeps its one row.
BODY_INLINE_MAX = 2048


class SqliteStorage(Storage):
    def __init__(
        self,
        path: Path,
        *,
        fsync: bool,
        body_cache_bytes: int = BODY_CACHE_BYTES,
        body_inline_max: int = BODY_INLINE_MAX,
        replica: bool = False,
    ) -> None:
        self.path = path
        self._fsync = fsync
        # A replica group's state (its log makes it durable): reloaded as of its clock,
        # not the wall clock, so it equals the other members' state at the same index.
        self._replica = replica
        self._applied_unwritten = False
        self._bodies = _OutOfLine(body_inline_max)
        # Rows of ready messages as pushed (seq -> Row), while they fit in the budget:
        # filled as pushes are written, emptied as their messages are leased, popped,
        # requeued, moved or purged, so a row here is always the row in SQLite.
        self._recent: dict[int, Row] = {}
        self._recent_bytes = 0
        self._recent_max = body_cache_bytes
        # Opened (and loaded) on a worker thread, then written only from the event loop.
        self._conn: sqlite3.Connection | None = None
        self._unwritten: list[Op] = []  # applied, not yet written
        self._uncommitted = 0  # ops written in the open transaction
        self._loading = False
        self._next: asyncio.Future[None] | None = None
        self._scheduled = False  # a flush is queued on the event loop

    # ---- open and recover --------------------------------------------------------------
    def load(self) -> NodeState:
        """Opens the database (creating it) and rebuilds the node state from it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = self._open_and_load()
        self._presize_wal()
        return state

    def _open_and_load(self) -> NodeState:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=_LOCK_WAIT_S
        )
        # One process owns a node's database. The exclusive lock is taken once and kept:
        # commits make no lock calls (six fcntl calls each in WAL's shared mode), the WAL
        # index lives in this process's memory instead of a shared -shm file, and a second
        # node started on the same data_dir is refused rather than allowed to interleave.
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            # A replica's state is rebuilt from its log: NORMAL keeps the file consistent
            # through a power loss without an fsync per commit.
            sync = "FULL" if self._fsync else "NORMAL" if self._replica else "OFF"
            conn.execute(f"PRAGMA synchronous={sync}")
            conn.execute("PRAGMA temp_store=MEMORY")
            # FAST zeroes deleted content only inside pages a delete writes anyway; ON
            # (Debian's default) also overwrites every freed overflow page, a 1 MiB write
            # to the WAL for each 1 MiB body acked. Freed pages keep old bodies until
            # SQLite reuses them, as the WAL's old frames do until it wraps.
            conn.execute("PRAGMA secure_delete=FAST")
            conn.executescript(_SCHEMA)
        except sqlite3.OperationalError as e:
            conn.close()
            if "locked" not in str(e):
                raise
            raise StorageFailed(
                f"{self.path} is in use by another process (another node on this data_dir?)"
            ) from e
        _migrate(conn)
        self._conn = conn
        state = NodeState(self)
        machine = dict(conn.execute("SELECT key, value FROM machine"))
        self.applied = int(machine.get("applied", 0))
        self.applied_term = int(machine.get("applied_term", 0))
        self.clock = state.clock = float(machine.get("clock", 0.0))
        conf = machine.get("conf")
        self.conf = Conf.from_json(conf) if isinstance(conf, str) else None
        map_json = machine.get("map")
        self.map_json = map_json if isinstance(map_json, str) else None
        self._loading = True  # the replay below writes nothing back
        for name, incarnation, created_at, settings in conn.execute(
            "SELECT name, incarnation, created_at, settings FROM queues"
        ):
            cfg = QueueSettings(**orjson.loads(settings))
            state.apply(CreateQueue(name, incarnation, created_at, cfg))
        for name, incarnation, deleted_at in conn.execute(
            "SELECT name, incarnation, deleted_at FROM tombstones ORDER BY deleted_at"
        ):
            state.restore_tombstone(name, incarnation, deleted_at)
        for queue, node, first_uuid in conn.execute(
            "SELECT queue, node, first_uuid FROM registrations ORDER BY registered_at"
        ):
            if queue in state.meta:
                state.apply(Register(queue, node, first_uuid))
        for name, created_at in conn.execute("SELECT name, created_at FROM topics"):
            state.apply(CreateTopic(name, created_at))
        for topic, queue in conn.execute("SELECT topic, queue FROM subscriptions ORDER BY id"):
            if topic in state.topics:
                state.apply(Subscribe(topic, queue))
        now = self.clock if self._replica else time.time()
        refs = self._bodies.refs
        for row in conn.execute(
            "SELECT seq, queue, id, enqueued_at, receive_count, lease, lease_until, "
            "visible_at, origin, body_ref, priority, deadline, grp FROM messages ORDER BY seq"
        ):
            seq, queue, mid, enqueued_at, count, lease, until, visible, origin, ref = row[:10]
            if ref is not None:
                refs[seq] = ref
            state.restore(
                queue,
                mid,
                seq,
                enqueued_at=enqueued_at,
                receive_count=count,
                lease=lease,
                lease_until=until,
                visible_at=visible,
                origin=origin,
                now=now,
                priority=row[10],
                deadline=row[11],
                group=row[12],
            )
        state.finish_restore()
        for queue, n in conn.execute("SELECT queue, n FROM expired"):
            state.expired[queue] = n
        for mid, queue in conn.execute("SELECT id, queue FROM cancelled ORDER BY n"):
            state.restore_cancel(mid, queue)
        for token, copies, winner, cancelled, created_at in conn.execute(
            "SELECT token, copies, winner, cancelled, created_at FROM ties ORDER BY n"
        ):
            pairs = tuple((q, mid) for q, mid in orjson.loads(copies))
            state.restore_tie(token, pairs, created_at, winner, bool(cancelled))
        for mid, queue, until in conn.execute("SELECT id, queue, until FROM dedup ORDER BY until"):
            state.restore_dedup(mid, queue, until)
        _drop_orphan_bodies(conn, len(refs))
        self._loading = False
        return state

    def _presize_wal(self) -> None:
        """Lays the WAL file out to the size it works at, before the first commit.

        SQLite writes the WAL over from its start after each checkpoint (every
        `wal_autocheckpoint` pages), so once it has grown, commits rewrite blocks the file
        already has. Until then each commit makes the file longer, and an fdatasync that
        must also record a new size and new blocks takes much longer on this machine's
        disk (one-row commits, p50 of the first 1,000: ~320 µs growing, ~190 µs laid
        out; docs/design.md §8). A node starts with an empty WAL (SQLite deletes it on a
        clean close), so it would pay that on its first ~1,000 commits.

        Everything is checkpointed into the database first (TRUNCATE), then the empty WAL
        is filled with zeros and synced: SQLite's next commit writes a fresh WAL header at
        offset 0, and recovery stops at the first frame that does not match that header,
        so zeros past the last frame are never read as data. Only for `durability:
        fsync`: without fdatasync, growth is cheap."""
        conn = self._conn
        assert conn is not None
        if not self._fsync or conn.in_transaction:
            return
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            return
        (page,) = conn.execute("PRAGMA page_size").fetchone()
        (pages,) = conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        size = _WAL_HEADER + (max(pages, 0) + _WAL_SLACK_FRAMES) * (_WAL_FRAME_HEADER + page)
        try:
            fd = os.open(self.path.with_name(self.path.name + "-wal"), os.O_WRONLY)
        except FileNotFoundError:
            return
        try:
            if os.fstat(fd).st_size != 0:  # frames SQLite has not checkpointed: leave them
                return
            zeros = memoryview(bytes(min(size, 1 << 20)))
            done = 0
            while done < size:
                done += os.pwrite(fd, zeros[: size - done], done)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    # ---- group commit ------------------------------------------------------------------
    def write(self, op: Op) -> None:
        """Takes an op the state just applied (NodeState.apply hands each one here); it
        is written into the open transaction before the next read or commit."""
        if self._loading:
            return  # replaying what is on disk
        self._unwritten.append(op)
        if not self._scheduled:
            try:
                self._schedule(asyncio.get_running_loop())
            except RuntimeError:  # no loop running (a script, a test): the next submit commits
                return

    def note_applied(self, index: int, clock: float, term: int = 0) -> None:
        super().note_applied(index, clock, term)
        self._applied_unwritten = True
        if not self._scheduled:
            with contextlib.suppress(RuntimeError):  # no loop: the next submit commits
                self._schedule(asyncio.get_running_loop())

    def submit(self, ops: Sequence[Op]) -> asyncio.Future[None]:
        """The commit of `ops`, which the state has applied (and so handed to `write`)."""
        if self.failed is not None:
            raise StorageFailed(f"storage failed earlier: {self.failed}")
        loop = asyncio.get_running_loop()
        fut = self._next
        if fut is None:
            fut = self._next = loop.create_future()
        if not self._scheduled:
            self._schedule(loop)
        return fut

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commits on the next loop iteration: every request parsed in this one joins
        the same commit (group commit)."""
        self._scheduled = True
        loop.call_soon(self._flush)

    def barrier(self) -> asyncio.Future[None]:
        if self.failed is not None:
            raise StorageFailed(f"storage failed earlier: {self.failed}")
        if self._unwritten or (self._conn is not None and self._conn.in_transaction):
            return self.submit(())
        # Commits run to completion on the loop: nothing else is half-written.
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def _drain(self) -> None:
        """Writes the ops taken so far into the open transaction (one executemany per
        run of ops of one kind)."""
        if not self._unwritten or self.failed is not None:
            return
        ops, self._unwritten = self._unwritten, []
        conn = self._conn
        assert conn is not None
        try:
            if not conn.in_transaction:
                conn.execute("BEGIN")
            i, n = 0, len(ops)
            while i < n:
                kind = type(ops[i])
                j = i + 1
                while j < n and type(ops[j]) is kind:
                    j += 1
                run = ops[i:j]
                _WRITERS[kind](conn, run, self._bodies)
                if kind is Push:
                    self._remember(run)
                elif self._recent and kind in _CHANGES_ROWS:
                    self._forget(run)
                i = j
        except Exception as e:  # the disk refused: memory and disk now disagree
            self._fail(e)
            raise StorageFailed(self.failed or "") from e
        self._uncommitted += len(ops)

    def _remember(self, ops: Sequence[Any]) -> None:
        """Keeps the rows of pushed messages while the budget has room for them."""
        room = self._recent_max - self._recent_bytes
        if room <= 0:
            return
        recent = self._recent
        make = Row._make
        used = 0
        for op in ops:
            cost = len(op.body) + _ROW_BYTES
            if cost <= room - used:
                o = op[7]  # Push's options
                if o is None:
                    recent[op.seq] = make((op.id, op.body, op.content_type, 0, None, 0, None, None))
                else:
                    row = (op.id, op.body, op.content_type, 0, o[3], o[0], o[4], o[5])
                    recent[op.seq] = make(row)
                used += cost
        self._recent_bytes += used

    def _forget(self, ops: Sequence[Any]) -> None:
        """Drops the cached rows of messages a lease, removal, requeue, move or purge
        changed or deleted."""
        pop = self._recent.pop
        freed = 0
        if type(ops[0]) is Purge:
            seqs = [seq for op in ops for seq in op.seqs]
        else:
            seqs = [op[2] for op in ops]  # Lease, Remove, Requeue, DeadLetter: seq is third
        for seq in seqs:
            row = pop(seq, None)
            if row is not None:
                freed += len(row[1]) + _ROW_BYTES
        self._recent_bytes -= freed

    def _flush(self) -> None:
        """Commits the open transaction on the event loop itself, fsync included
        (docs/design.md §8): requests that arrive meanwhile wait in their sockets and
        join the next commit, and no thread hand-off is paid for."""
        self._scheduled = False
        if self.failed is not None:
            return
        try:
            self._drain()
        except StorageFailed:
            return
        conn = self._conn
        assert conn is not None
        if self._applied_unwritten:
            self._applied_unwritten = False
            try:
                if not conn.in_transaction:
                    conn.execute("BEGIN")
                rows: list[tuple[str, float | str]] = [
                    ("applied", self.applied),
                    ("applied_term", self.applied_term),
                    ("clock", self.clock),
                ]
                if self.conf is not None:
                    rows.append(("conf", self.conf.to_json()))
                if self.map_json is not None:
                    rows.append(("map", self.map_json))
                conn.executemany("INSERT OR REPLACE INTO machine (key, value) VALUES (?, ?)", rows)
            except Exception as e:
                self._fail(e)
                return
        if conn.in_transaction:
            started = _perf_counter()
            try:
                conn.execute("COMMIT")
            except Exception as e:
                self._fail(e)
                return
            self.commits += 1
            self.ops_written += self._uncommitted
            if self.on_commit is not None:
                self.on_commit(self._uncommitted, _perf_counter() - started)
            self._uncommitted = 0
        fut, self._next = self._next, None
        if fut is not None:
            fut.set_result(None)

    def checkpoint(self) -> int:
        """Commits what is applied, then checkpoints the WAL into the database file with
        its syncs (a replica's `synchronous=NORMAL` syncs the WAL before a checkpoint and
        the file after it): the file then holds `applied` through a power loss. Runs on
        the loop (one fsync or two). Returns `applied`, or 0 if the checkpoint could not
        finish."""
        self._flush()
        conn = self._conn
        if self.failed is not None or conn is None:
            return 0
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return 0 if busy else self.applied

    def copy_to(self, path: Path) -> tuple[int, int]:
        """Commits what is applied, then writes a consistent copy of the database to
        `path` (VACUUM INTO: compact, in one read transaction), on the loop. Returns the
        (applied index, its term) the copy holds."""
        self._flush()
        conn = self._conn
        if self.failed is not None or conn is None:
            raise StorageFailed(f"storage failed earlier: {self.failed}")
        path.unlink(missing_ok=True)
        conn.execute("VACUUM INTO ?", (str(path),))
        return self.applied, self.applied_term

    def _fail(self, e: Exception) -> None:
        """A write or commit failed: everything since the last commit is lost on disk
        while memory has it, so storage refuses every later write."""
        self.failed = f"{type(e).__name__}: {e}"
        log.critical(
            "storage commit failed, refusing further writes: %s",
            self.failed,
            extra={"event": "storage_failed"},
        )
        conn = self._conn
        if conn is not None and conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
                conn.execute("ROLLBACK")
        fut, self._next = self._next, None
        if fut is not None:
            fut.set_exception(StorageFailed(self.failed))
            fut.exception()  # retrieved: a caller may have gone

    def read(self, seqs: Sequence[int]) -> dict[int, Row]:
        """The rows of messages `seqs` (those that exist), committed or not."""
        self._drain()
        conn = self._conn
        assert conn is not None
        out: dict[int, Row] = {}
        recent = self._recent
        if recent:
            missing: list[int] = []
            for seq in seqs:
                row = recent.get(seq)
                if row is None:
                    missing.append(seq)
                else:
                    out[seq] = row
            self.cache_hits += len(seqs) - len(missing)
            if not missing:
                return out
            seqs = missing
        self.cache_misses += len(seqs)
        make = Row._make
        # While no body is out of line, the plain SELECT (no look at body_ref).
        joined = bool(self._bodies.refs)
        for i in range(0, len(seqs), _READ_CHUNK):
            chunk = seqs[i : i + _READ_CHUNK]
            for r in conn.execute(_select_rows(len(chunk), joined), chunk):
                out[r[8]] = make(r[:8])
        return out

    async def close(self) -> None:
        if self.failed is None:
            self._flush()
        if self._conn is not None:
            conn = self._conn
            self._conn = None
            conn.close()


_READ_CHUNK = 500  # sequence numbers per SELECT (SQLite allows 32,766 parameters)


@functools.lru_cache(maxsize=64)
def _select_rows(n: int, joined: bool = False) -> str:
    """The rows of n messages by seq; `joined` fetches out-of-line bodies from `bodies`
    (only for the rows that have one)."""
    body = (
        "CASE WHEN body_ref IS NULL THEN body "
        "ELSE (SELECT b.body FROM bodies AS b WHERE b.id = messages.body_ref) END"
        if joined
        else "body"
    )
    columns = (
        f"SELECT id, {body}, content_type, receive_count, attributes, priority, grp, tie, seq "
        "FROM messages"
    )
    if n == 1:
        return f"{columns} WHERE seq = ?"
    return f"{columns} WHERE seq IN ({','.join('?' * n)})"


class _OutOfLine:
    """The bodies kept in table `bodies`: the size above which a body goes there, and
    for every message that has one, its current seq -> the body's id.

    The map is what lets the writers of the 100-byte path skip all of this: a removal
    or requeue looks its seqs up here (a dict probe, nothing when the map is empty)
    instead of asking SQLite for a body_ref. `load` fills it from the rows; it changes
    only inside the writers below, in the transaction that changes the rows (if that
    transaction fails, the storage refuses every later write, so they cannot drift)."""

    __slots__ = ("inline_max", "refs")

    def __init__(self, inline_max: int) -> None:
        self.inline_max = inline_max
        self.refs: dict[int, int] = {}

    def move(self, pairs: list[tuple[int, int]]) -> None:
        """Follows messages to new seqs ((old, new) pairs): requeue, dead-letter."""
        refs = self.refs
        for old, new in pairs:
            ref = refs.pop(old, None)
            if ref is not None:
                refs[new] = ref

    def drop(self, conn: sqlite3.Connection, seqs: list[int]) -> None:
        """Deletes the out-of-line bodies of the messages `seqs`, which are being deleted."""
        pop = self.refs.pop
        ids = [ref for ref in map(pop, seqs, repeat(None)) if ref is not None]
        for start, size in _pieces(len(ids)):
            conn.execute(_delete_bodies(size), ids[start : start + size])


def _drop_orphan_bodies(conn: sqlite3.Connection, referenced: int) -> None:
    """Deletes bodies no row refers to. Every writer deletes a body with its row, so
    there are none; this makes sure, since a body id is reused by the next push of the
    same seq (a node that has emptied its database counts seqs from 1 again)."""
    (stored,) = conn.execute("SELECT count(*) FROM bodies").fetchone()
    if stored == referenced:
        return
    gone = conn.execute(
        "DELETE FROM bodies WHERE id NOT IN "
        "(SELECT body_ref FROM messages WHERE body_ref IS NOT NULL)"
    ).rowcount
    log.warning("deleted %d message bodies that no message referred to", gone)


def _migrate(conn: sqlite3.Connection) -> None:
    """Adds the columns a database from zdmq 0.1's first schema lacks."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
    if "enqueued_at" not in have:
        # Their arrival time is unknown: count retention from the upgrade, not from 1970.
        conn.execute("ALTER TABLE messages ADD COLUMN enqueued_at REAL NOT NULL DEFAULT 0")
        conn.execute("UPDATE messages SET enqueued_at = ?", (time.time(),))
    for column, decl in (
        ("receive_count", "INTEGER NOT NULL DEFAULT 0"),
        ("lease", "TEXT"),
        ("lease_until", "REAL NOT NULL DEFAULT 0"),
        ("visible_at", "REAL NOT NULL DEFAULT 0"),
        ("origin", "TEXT"),
        ("priority", "INTEGER NOT NULL DEFAULT 0"),
        ("deadline", "REAL NOT NULL DEFAULT 0"),
        ("attributes", "TEXT"),
        ("grp", "TEXT"),
        ("tie", "TEXT"),
    ):
        if column not in have:
            conn.execute(f"ALTER TABLE messages ADD COLUMN {column} {decl}")
    if "body_ref" not in have:  # before out-of-line bodies: every body is in its row
        conn.execute("ALTER TABLE messages ADD COLUMN body_ref INTEGER")
    if "settings" not in {row[1] for row in conn.execute("PRAGMA table_info(queues)")}:
        conn.execute("ALTER TABLE queues ADD COLUMN settings TEXT NOT NULL DEFAULT '{}'")


def _pieces(n: int) -> list[tuple[int, int]]:
    """(start, size) pieces of a run of n rows, sizes powers of two up to _MAX_PIECE: a
    run of many rows takes a few multi-row statements (one statement per row costs about
    1 µs more a row in SQLite), and the texts of those statements stay few enough for
    the connection's statement cache."""
    out: list[tuple[int, int]] = []
    start = 0
    while start < n:
        size = min(_MAX_PIECE, 1 << ((n - start).bit_length() - 1))
        out.append((start, size))
        start += size
    return out


_MAX_PIECE = 128


@functools.lru_cache(maxsize=16)
def _insert_rows(n: int) -> str:
    # Each row binds its Push op's tuple as it is, by parameter number (?3 is the op's
    # third field), rather than a tuple of parameters built per row.
    # Push is (queue, id, seq, body, content_type, enqueued_at, dedup_until, options):
    # eight parameters a row, of which the last two have no column (a message with
    # options is written by _w_push's other statement).
    rows = ",".join(
        f"(?{k + 1}, ?{k + 2}, ?{k + 3}, ?{k + 4}, ?{k + 5}, ?{k + 6})"
        for k in range(0, _PUSH_FIELDS * n, _PUSH_FIELDS)
    )
    return f"INSERT INTO messages (queue, id, seq, body, content_type, enqueued_at) VALUES {rows}"


_PUSH_FIELDS = len(Push._fields)
assert _PUSH_FIELDS == 8


@functools.lru_cache(maxsize=16)
def _delete_rows(n: int) -> str:
    return f"DELETE FROM messages WHERE seq IN ({','.join('?' * n)})"


@functools.lru_cache(maxsize=16)
def _delete_bodies(n: int) -> str:
    return f"DELETE FROM bodies WHERE id IN ({','.join('?' * n)})"


# Writers: each writes a run of ops of one kind into the open transaction.
_Writer = Callable[[sqlite3.Connection, Sequence[Any], _OutOfLine], None]


def _w_push(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    inline_max = bodies.inline_max
    inline = ops
    large = [op for op in ops if len(op[3]) > inline_max]  # Push's fourth field is its body
    if large:
        inline = [op for op in ops if len(op[3]) <= inline_max]
    options = [op for op in inline if op[7] is not None]  # Push's eighth field: its options
    if options:
        inline = [op for op in inline if op[7] is None]
        conn.executemany(
            "INSERT INTO messages (queue, id, seq, body, content_type, enqueued_at, "
            "priority, deadline, visible_at, attributes, grp, tie) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(*op[:6], *op[7]) for op in options],
        )
    if large:
        # The body is stored under the seq it is pushed with: its id for good.
        conn.executemany(
            "INSERT INTO bodies (id, body) VALUES (?, ?)", [(op.seq, op.body) for op in large]
        )
        conn.executemany(
            "INSERT INTO messages (queue, id, seq, body, content_type, enqueued_at, body_ref, "
            "priority, deadline, visible_at, attributes, grp, tie) "
            "VALUES (?, ?, ?, x'', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    op.queue,
                    op.id,
                    op.seq,
                    op.content_type,
                    op.enqueued_at,
                    op.seq,
                    *(op.options or (0, 0.0, 0.0, None, None, None)),
                )
                for op in large
            ],
        )
        refs = bodies.refs
        for op in large:
            refs[op.seq] = op.seq
    for start, size in _pieces(len(inline)):
        params = list(chain.from_iterable(inline[start : start + size]))
        del params[-2:]  # the last op's dedup_until and options: no placeholder takes them
        conn.execute(_insert_rows(size), params)
    dedup = [(op.id, op.queue, op.dedup_until) for op in ops if op.dedup_until > 0]
    if dedup:
        conn.executemany("INSERT OR REPLACE INTO dedup (id, queue, until) VALUES (?, ?, ?)", dedup)


def _w_lease(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    # Lease is (queue, id, seq, token, until, receive_count); binding the whole op would
    # copy its queue and id strings into SQLite for nothing.
    conn.executemany(
        "UPDATE messages SET lease = ?, lease_until = ?, receive_count = ? WHERE seq = ?",
        [(op[3], op[4], op[5], op[2]) for op in ops],
    )


def _w_extend(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany(
        "UPDATE messages SET lease_until = ? WHERE seq = ?", [(op.until, op.seq) for op in ops]
    )


def _w_requeue(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany(
        "UPDATE messages SET lease = NULL, lease_until = 0, visible_at = ?, seq = ? WHERE seq = ?",
        [(op.visible_at, op.new_seq, op.seq) for op in ops],
    )
    if bodies.refs:  # the body stays where it is, under its id; the row's seq changes
        bodies.move([(op.seq, op.new_seq) for op in ops])


def _w_dead_letter(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany(
        "UPDATE messages SET queue = ?, origin = ?, receive_count = 0, lease = NULL, "
        "lease_until = 0, visible_at = 0, enqueued_at = ?, seq = ?, grp = NULL WHERE seq = ?",
        [(op.dlq, op.queue, op.moved_at, op.new_seq, op.seq) for op in ops],
    )
    if bodies.refs:
        bodies.move([(op.seq, op.new_seq) for op in ops])


def _w_forget_dedup(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.execute("DELETE FROM dedup WHERE until < ?", (max(op.before for op in ops),))


def _w_remove(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    seqs = [op[2] for op in ops]  # Remove is (queue, id, seq, expired)
    for start, size in _pieces(len(seqs)):
        conn.execute(_delete_rows(size), seqs[start : start + size])
    if bodies.refs:
        bodies.drop(conn, seqs)
    expired = [op.queue for op in ops if op[3]]
    if expired:
        conn.executemany(
            "INSERT INTO expired (queue, n) VALUES (?, 1) "
            "ON CONFLICT (queue) DO UPDATE SET n = n + 1",
            [(q,) for q in expired],
        )


def _w_cancel(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    seqs = [op.seq for op in ops]
    conn.executemany("DELETE FROM messages WHERE seq = ?", [(s,) for s in seqs])
    if bodies.refs:
        bodies.drop(conn, seqs)
    for op in ops:  # a repeat of a kept id moves it to the end, as in NodeState
        conn.execute("DELETE FROM cancelled WHERE id = ?", (op.id,))
        conn.execute(
            "INSERT INTO cancelled (n, id, queue) "
            "VALUES ((SELECT coalesce(max(n), 0) + 1 FROM cancelled), ?, ?)",
            (op.id, op.queue),
        )
    conn.execute(
        "DELETE FROM cancelled WHERE n NOT IN (SELECT n FROM cancelled ORDER BY n DESC LIMIT ?)",
        (CANCELS_KEPT,),
    )


def _w_purge(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    seqs = [s for op in ops for s in op.seqs]
    conn.executemany("DELETE FROM messages WHERE seq = ?", [(s,) for s in seqs])
    conn.executemany("DELETE FROM dedup WHERE queue = ?", [(op.queue,) for op in ops])
    conn.executemany("DELETE FROM expired WHERE queue = ?", [(op.queue,) for op in ops])
    if bodies.refs:
        bodies.drop(conn, seqs)


def _w_register(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    now = time.time()
    conn.executemany(
        "INSERT OR IGNORE INTO registrations (queue, node, first_uuid, registered_at) "
        "VALUES (?, ?, ?, ?)",
        [(op.queue, op.node, op.first_uuid, now) for op in ops],
    )


def _w_unregister(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany(
        "DELETE FROM registrations WHERE queue = ? AND node = ?",
        [(op.queue, op.node) for op in ops],
    )


def _w_create(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany("DELETE FROM tombstones WHERE name = ?", [(op.queue,) for op in ops])
    conn.executemany(
        "INSERT OR REPLACE INTO queues (name, incarnation, created_at, settings) "
        "VALUES (?, ?, ?, ?)",
        [
            (op.queue, op.incarnation, op.created_at, orjson.dumps(op.settings.to_wire()).decode())
            for op in ops
        ],
    )


def _w_drop(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    # Only the metadata list: the messages of a dropped queue go by Purge.
    for op in ops:
        conn.execute("DELETE FROM registrations WHERE queue = ?", (op.queue,))
        conn.execute("DELETE FROM queues WHERE name = ?", (op.queue,))
        conn.execute(
            "INSERT OR REPLACE INTO tombstones (name, incarnation, deleted_at) VALUES (?, ?, ?)",
            (op.queue, op.incarnation, op.deleted_at),
        )
    # The newest TOMBSTONES_KEPT stay, as in NodeState.
    conn.execute(
        "DELETE FROM tombstones WHERE name IN "
        "(SELECT name FROM tombstones ORDER BY deleted_at DESC LIMIT -1 OFFSET ?)",
        (TOMBSTONES_KEPT,),
    )


def _w_create_topic(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany(
        "INSERT OR REPLACE INTO topics (name, created_at) VALUES (?, ?)",
        [(op.topic, op.created_at) for op in ops],
    )


def _w_drop_topic(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany("DELETE FROM subscriptions WHERE topic = ?", [(op.topic,) for op in ops])
    conn.executemany("DELETE FROM topics WHERE name = ?", [(op.topic,) for op in ops])


def _w_subscribe(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany(
        "INSERT OR IGNORE INTO subscriptions (topic, queue) VALUES (?, ?)",
        [(op.topic, op.queue) for op in ops],
    )


def _w_unsubscribe(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany(
        "DELETE FROM subscriptions WHERE topic = ? AND queue = ?",
        [(op.topic, op.queue) for op in ops],
    )


# Ops after which a cached row (SqliteStorage._recent) is stale or gone.
_CHANGES_ROWS = frozenset({Lease, Remove, Cancel, Requeue, DeadLetter, Purge})


def _w_tied(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany(
        "INSERT INTO ties (token, copies, created_at) VALUES (?, ?, ?)",
        [(op.token, orjson.dumps(op.copies).decode(), op.created_at) for op in ops],
    )
    conn.execute(
        "DELETE FROM ties WHERE n IN (SELECT n FROM ties ORDER BY n DESC LIMIT -1 OFFSET ?)",
        (TIES_KEPT,),
    )


def _w_claimed(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany(
        "UPDATE ties SET winner = ? WHERE token = ?", [(op.id, op.token) for op in ops]
    )


def _w_untied(conn: sqlite3.Connection, ops: Sequence[Any], bodies: _OutOfLine) -> None:
    conn.executemany("UPDATE ties SET cancelled = 1 WHERE token = ?", [(op.token,) for op in ops])


_WRITERS: dict[type, _Writer] = {
    Tied: _w_tied,
    Claimed: _w_claimed,
    Untied: _w_untied,
    Push: _w_push,
    Remove: _w_remove,
    Cancel: _w_cancel,
    Purge: _w_purge,
    Register: _w_register,
    Unregister: _w_unregister,
    CreateQueue: _w_create,
    DropQueue: _w_drop,
    Lease: _w_lease,
    Extend: _w_extend,
    Requeue: _w_requeue,
    DeadLetter: _w_dead_letter,
    ForgetDedup: _w_forget_dedup,
    CreateTopic: _w_create_topic,
    DropTopic: _w_drop_topic,
    Subscribe: _w_subscribe,
    Unsubscribe: _w_unsubscribe,
}


def open_storage(durability: str, data_dir: Path, *, group: str | None = None) -> Storage:
    """A node's storage (`group` None), or the state of replica group `group` on this node
    (`group-<id>.sqlite3`; its log, not this file, makes it durable: no fsync)."""
    if durability == "memory":
        return MemoryStorage()
    if group is not None:
        return SqliteStorage(data_dir / f"group-{group}.sqlite3", fsync=False, replica=True)
    return SqliteStorage(data_dir / "zdmq.sqlite3", fsync=durability == "fsync")
