"""The durable Raft log: many groups' hard states and logs in one SQLite file.

A node runs one Raft group per ring window, and all of them keep their log here, in one
file with one connection, so that one commit (one fsync) can carry the `Ready`s of many
groups:

    store = RaftLogStore(path, durability="fsync")
    g1, g2 = store.group("0"), store.group("1")
    with store.batch():          # one transaction, one commit, one fsync
        g1.persist(rd1)
        g2.persist(rd2)
    # both are durable here; now send their messages

Outside a `batch()` each `persist` (or `append`, `set_hard_state`) is its own transaction.
A `Ready`'s writes (truncating a conflicting suffix, appending entries, setting the hard
state) always land together or not at all. If a write fails before the commit, the
transaction rolls back and the touched groups reload from the file; if the commit itself
fails the file's state is unknown (an fsync error may have dropped pages), so the store
marks itself failed and refuses everything after.

    durability: fsync   synchronous=FULL: the WAL is fsynced before a commit returns
    durability: os      synchronous=OFF: written to the OS at commit, not flushed
    durability: memory  an in-memory database, for tests

Tables (named raft_* so they can share a file with the node's other tables):
    raft_meta        key -> value; `identity`, a random id written when the file is created
    raft_hard_state  group -> term, vote, commit
    raft_log         (group, index) -> term, data
    raft_snapshot    group -> index, term: the log's compacted prefix (entries after it only)
    raft_peers       peer -> identity: the store identity last seen from each peer
    raft_probation   (group, peer) -> since: peers on probation here (zdmq/raft/identity.py)
    raft_cleared     (group, peer) -> identity: peer stores whose probation was lifted here
    raft_self        group -> proven, told index, told term (`RaftCore.proven`, `told`)

Reads are served from memory where cheap, so the core's hot reads never reach SQLite:
each group keeps its hard state and last index, its log's terms as runs (the first index
of each run of equal terms: a handful per group, so `term_at` of any index is a bisect),
and the entries of the log's tail (the last `tail_entries`). Only `entries` reaching
below the tail reads the file. Opening a group scans its log's terms once, to build the
runs: linear in the entries kept since the last compaction.

`compact(index)` deletes a group's entries up to `index` and records it (and its term)
in `raft_snapshot`; `restore(meta)` deletes them all, for a snapshot installed from the
leader. Deleted rows free pages SQLite reuses for new entries, so a log compacted as it
grows keeps the file about the size of its largest uncompacted stretch.

`store.identity` tells a node that lost its disk (a new, empty file has a new identity)
from one that restarted with its log.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import sqlite3
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from zdmq.raft.identity import PeerBook
from zdmq.raft.storage import (
    Entry,
    HardState,
    RaftLogError,
    SnapshotMeta,
    check_append,
    check_commit,
    check_compact,
    check_restore,
    entries_refused,
    term_at_refused,
)

if TYPE_CHECKING:
    from zdmq.raft.core import Ready

__all__ = ["Durability", "GroupLog", "RaftLogError", "RaftLogStore", "RaftStorageFailed"]

Durability = Literal["fsync", "os", "memory"]

#: Entries of each group's log tail kept in memory (served to `entries` without SQLite).
TAIL_ENTRIES = 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS raft_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS raft_hard_state (
    grp TEXT PRIMARY KEY,
    term INTEGER NOT NULL,
    vote TEXT,
    commit_index INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS raft_log (
    grp TEXT NOT NULL,
    idx INTEGER NOT NULL,
    term INTEGER NOT NULL,
    data BLOB,
    PRIMARY KEY (grp, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS raft_peers (
    peer TEXT PRIMARY KEY,
    identity TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS raft_snapshot (
    grp TEXT PRIMARY KEY,
    idx INTEGER NOT NULL,
    term INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS raft_self (
    grp TEXT PRIMARY KEY,
    proven INTEGER NOT NULL,
    told_index INTEGER NOT NULL,
    told_term INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS raft_probation (
    grp TEXT NOT NULL,
    peer TEXT NOT NULL,
    since INTEGER NOT NULL,
    PRIMARY KEY (grp, peer)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS raft_cleared (
    grp TEXT NOT NULL,
    peer TEXT NOT NULL,
    identity TEXT NOT NULL,
    PRIMARY KEY (grp, peer)
) WITHOUT ROWID;
"""


class RaftStorageFailed(Exception):
    """A commit failed: what the file holds is unknown, so the store refuses all writes."""


class RaftLogStore:
    """One SQLite file holding the hard state and log of every Raft group of a node."""

    def __init__(
        self,
        path: Path | str | None,
        durability: Durability = "fsync",
        *,
        tail_entries: int = TAIL_ENTRIES,
        lock_wait_s: float = 2.0,
    ) -> None:
        if durability not in ("fsync", "os", "memory"):
            raise ValueError(f"durability: expected fsync, os or memory, got {durability!r}")
        if durability != "memory" and path is None:
            raise ValueError(f"durability {durability!r} needs a path")
        if tail_entries < 1:
            raise ValueError(f"tail_entries: expected at least 1, got {tail_entries}")
        self.path = None if durability == "memory" else Path(path)  # type: ignore[arg-type]
        self.durability: Durability = durability
        self.tail_entries = tail_entries
        self.failed: str | None = None
        #: Transactions committed (a batch of many groups' writes counts once).
        self.commits = 0
        self._groups: dict[str, GroupLog] = {}
        self._depth = 0  # nested batch() levels open
        self._doomed = False  # a write of the open transaction failed: it is rolled back
        self._touched: set[str] = set()  # groups written in the open transaction
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            ":memory:" if self.path is None else self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=lock_wait_s,
        )
        try:
            # One process owns the file: the lock is taken once and kept (no lock calls
            # per commit, the WAL index in this process's memory, a second opener refused).
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            if self.path is not None:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'fsync' else 'OFF'}")
            conn.executescript(_SCHEMA)
            # Written once, when the file is created (a lost disk comes back with a new one).
            conn.execute(
                "INSERT OR IGNORE INTO raft_meta (key, value) VALUES ('identity', ?)",
                (uuid.uuid4().hex,),
            )
            row = conn.execute("SELECT value FROM raft_meta WHERE key = 'identity'").fetchone()
        except sqlite3.OperationalError as e:
            conn.close()
            if "locked" in str(e):
                raise RaftStorageFailed(f"{self.path} is in use by another process") from e
            raise
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        #: A random id written when the file was created: a new file (a lost disk) has a new one.
        self.identity: str = row[0]

    # -- groups ---------------------------------------------------------------------------

    def group(self, group_id: str) -> GroupLog:
        """The log of `group_id` (empty if nothing was ever persisted for it)."""
        g = self._groups.get(group_id)
        if g is None:
            self._check()
            g = self._groups[group_id] = GroupLog(self, group_id)
        return g

    def drop_group(self, group_id: str) -> None:
        """Deletes everything kept for `group_id` (this node left the group), in one
        transaction (or the open batch)."""
        self._check()
        self._groups.pop(group_id, None)
        with self._transaction():
            for table in (
                "raft_log",
                "raft_hard_state",
                "raft_snapshot",
                "raft_self",
                "raft_probation",
                "raft_cleared",
            ):
                self._conn.execute(f"DELETE FROM {table} WHERE grp = ?", (group_id,))

    def group_ids(self) -> list[str]:
        """Every group with a hard state or an entry in the file, sorted."""
        rows = self._conn.execute(
            "SELECT grp FROM raft_hard_state UNION SELECT DISTINCT grp FROM raft_log ORDER BY 1"
        )
        return [r[0] for r in rows]

    # -- what this node knows of its peers (zdmq/raft/identity.py) --------------------------

    def peer_book(self) -> PeerBook:
        """The identities, probations and cleared stores recorded here."""
        self._check()
        book = PeerBook()
        for peer, ident in self._conn.execute("SELECT peer, identity FROM raft_peers"):
            book.identities[peer] = ident
        for grp, peer, since in self._conn.execute("SELECT grp, peer, since FROM raft_probation"):
            book.probation[(grp, peer)] = since
        for grp, peer, ident in self._conn.execute("SELECT grp, peer, identity FROM raft_cleared"):
            book.cleared[(grp, peer)] = ident
        return book

    def save_peer_book(
        self,
        identities: dict[str, str | None],
        probation: dict[tuple[str, str], int | None],
        cleared: dict[tuple[str, str], str | None] | None = None,
    ) -> None:
        """Writes `PeerBook.take_changes()` (one transaction, or the open batch)."""
        if not identities and not probation and not cleared:
            return
        with self._transaction():
            conn = self._conn
            conn.executemany(
                "INSERT OR REPLACE INTO raft_peers (peer, identity) VALUES (?, ?)",
                [(p, i) for p, i in identities.items() if i is not None],
            )
            conn.executemany(
                "DELETE FROM raft_peers WHERE peer = ?",
                [(p,) for p, i in identities.items() if i is None],
            )
            for (grp, peer), since in probation.items():
                if since is None:
                    conn.execute(
                        "DELETE FROM raft_probation WHERE grp = ? AND peer = ?", (grp, peer)
                    )
                else:
                    conn.execute(
                        "INSERT OR REPLACE INTO raft_probation (grp, peer, since) VALUES (?, ?, ?)",
                        (grp, peer, since),
                    )
            for (grp, peer), ident in (cleared or {}).items():
                if ident is None:
                    conn.execute("DELETE FROM raft_cleared WHERE grp = ? AND peer = ?", (grp, peer))
                else:
                    conn.execute(
                        "INSERT OR REPLACE INTO raft_cleared (grp, peer, identity)"
                        " VALUES (?, ?, ?)",
                        (grp, peer, ident),
                    )

    def self_states(self) -> dict[str, tuple[bool, tuple[int, int]]]:
        """Group -> (proven, told) as last saved; a group not listed is not proven and
        was told nothing."""
        self._check()
        rows = self._conn.execute("SELECT grp, proven, told_index, told_term FROM raft_self")
        return {g: (bool(p), (i, t)) for g, p, i, t in rows}

    def save_self_states(self, states: dict[str, tuple[bool, tuple[int, int]]]) -> None:
        if not states:
            return
        with self._transaction():
            self._conn.executemany(
                "INSERT OR REPLACE INTO raft_self (grp, proven, told_index, told_term) "
                "VALUES (?, ?, ?, ?)",
                [(g, int(p), i, t) for g, (p, (i, t)) in states.items()],
            )

    # -- transactions ---------------------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction (one commit, one fsync) for every write made inside it.

        Returns once the commit is durable (under `fsync`). An exception inside rolls
        back every write of the batch, in every group, at once; so does a write that fails
        in SQLite, and a batch that goes on after it raises `RaftStorageFailed` at its next
        write and at its end. (A write the log refuses before it reaches SQLite, with
        `RaftLogError`, changes nothing and leaves the batch open.)
        Batches nest: the outermost one commits.
        """
        with self._transaction():
            yield

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._check()
        conn = self._conn
        if self._depth == 0:
            self._doomed = False
            conn.execute("BEGIN")
        elif self._doomed:
            raise RaftStorageFailed("a write of this batch failed: the batch is rolled back")
        self._depth += 1
        try:
            yield
        except BaseException:
            # Rolled back at once, whatever the level: a caller inside the batch that
            # swallows the error must not commit the rest (nor write outside a transaction).
            self._depth -= 1
            if not self._doomed:
                self._doomed = True
                self._rollback()
            raise
        self._depth -= 1
        if self._depth:
            return
        if self._doomed:
            raise RaftStorageFailed("a write of this batch failed: the batch was rolled back")
        try:
            conn.execute("COMMIT")
        except BaseException as e:
            self.failed = f"commit failed: {e!r}"
            raise RaftStorageFailed(self.failed) from e
        finally:
            self._touched.clear()
        self.commits += 1

    def _rollback(self) -> None:
        touched, self._touched = self._touched, set()
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            for gid in touched:
                self._groups[gid]._load()
        except Exception as e:
            self.failed = f"rollback failed: {e!r}"

    def _check(self) -> None:
        if self.failed is not None:
            raise RaftStorageFailed(f"raft storage failed earlier: {self.failed}")

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the file (an open batch must have ended)."""
        assert self._depth == 0, "close() inside batch()"
        self._conn.close()
        self._groups.clear()

    def __enter__(self) -> RaftLogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GroupLog:
    """One group's hard state and log: the core's `Storage`, and its driver's writes."""

    __slots__ = (
        "_bytes",
        "_hard",
        "_last",
        "_run_starts",
        "_run_terms",
        "_snap",
        "_store",
        "_tail",
        "_tail_start",
        "group_id",
    )

    def __init__(self, store: RaftLogStore, group_id: str) -> None:
        self._store = store
        self.group_id = group_id
        self._hard = HardState()
        self._snap = SnapshotMeta()
        self._last = 0
        self._bytes = 0  # the entries' data bytes
        # Runs of equal terms: the run k covers indices _run_starts[k] up to the next start.
        self._run_starts: list[int] = []
        self._run_terms: list[int] = []
        # The last entries of the log: _tail[0] is at index _tail_start.
        self._tail: list[Entry] = []
        self._tail_start = 1
        self._load()

    def _load(self) -> None:
        conn, gid = self._store._conn, self.group_id
        row = conn.execute(
            "SELECT term, vote, commit_index FROM raft_hard_state WHERE grp = ?", (gid,)
        ).fetchone()
        self._hard = HardState(*row) if row else HardState()
        row = conn.execute("SELECT idx, term FROM raft_snapshot WHERE grp = ?", (gid,)).fetchone()
        self._snap = SnapshotMeta(*row) if row else SnapshotMeta()
        starts: list[int] = []
        terms: list[int] = []
        last = self._snap.index
        size = 0
        for idx, term, n in conn.execute(
            "SELECT idx, term, length(data) FROM raft_log WHERE grp = ? ORDER BY idx", (gid,)
        ):
            if idx != last + 1:
                raise RaftStorageFailed(f"group {gid!r}: the log skips from {last} to {idx}")
            if not terms or terms[-1] != term:
                starts.append(idx)
                terms.append(term)
            last = idx
            size += n or 0
        self._run_starts, self._run_terms, self._last = starts, terms, last
        self._bytes = size
        lo = max(self._snap.index + 1, last - self._store.tail_entries + 1)
        self._tail = self._read(lo, last + 1)
        self._tail_start = lo

    def _read(self, lo: int, hi: int) -> list[Entry]:
        rows = self._store._conn.execute(
            "SELECT term, idx, data FROM raft_log WHERE grp = ? AND idx >= ? AND idx < ? "
            "ORDER BY idx",
            (self.group_id, lo, hi),
        )
        return [Entry(*r) for r in rows]

    # -- Storage: what the core reads ----------------------------------------------------

    def hard_state(self) -> HardState:
        return self._hard

    def last_index(self) -> int:
        return self._last

    def snapshot(self) -> SnapshotMeta:
        return self._snap

    def term_at(self, index: int) -> int:
        snap = self._snap
        if not snap.index <= index <= self._last:
            raise term_at_refused(snap.index, self._last, index)
        if index >= self._tail_start:
            return self._tail[index - self._tail_start].term
        if index == snap.index:
            return snap.term
        return self._run_terms[bisect.bisect_right(self._run_starts, index) - 1]

    def entries(self, lo: int, hi: int) -> list[Entry]:
        if not self._snap.index < lo <= hi <= self._last + 1:
            raise entries_refused(self._snap.index, self._last, lo, hi)
        start = self._tail_start
        if lo >= start:
            return self._tail[lo - start : hi - start]
        out = self._read(lo, min(hi, start))
        if hi > start:
            out.extend(self._tail[: hi - start])
        return out

    # -- the driver's writes -------------------------------------------------------------

    def persist(self, rd: Ready) -> None:
        """Writes a `Ready`'s entries and hard state in one transaction (or the open batch)."""
        self.write(rd.entries, rd.hard_state)

    def append(self, entries: Sequence[Entry]) -> None:
        """Writes `entries`, first dropping every stored entry at or after the first one's index."""
        self.write(entries, None)

    def set_hard_state(self, hard: HardState) -> None:
        self.write((), hard)

    def write(self, entries: Sequence[Entry], hard: HardState | None) -> None:
        """Truncates and appends `entries`, then sets `hard` (if given), atomically."""
        if not entries and hard is None:
            return
        last = self._last
        if entries:
            first = entries[0].index
            last = check_append(self._snap.index, last, entries)
        if hard is not None:
            check_commit(hard.commit, last)
        store, gid = self._store, self.group_id
        with store._transaction():
            store._touched.add(gid)
            conn = store._conn
            dropped = 0
            if entries:
                if first <= self._last:
                    dropped = self._data_bytes(first, self._last)
                    conn.execute("DELETE FROM raft_log WHERE grp = ? AND idx >= ?", (gid, first))
                conn.executemany(
                    "INSERT INTO raft_log (grp, idx, term, data) VALUES (?, ?, ?, ?)",
                    [(gid, e.index, e.term, e.data) for e in entries],
                )
            if hard is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO raft_hard_state (grp, term, vote, commit_index) "
                    "VALUES (?, ?, ?, ?)",
                    (gid, hard.term, hard.vote, hard.commit),
                )
            if entries:
                self._cache_entries(entries)
                self._bytes += sum(len(e.data or b"") for e in entries) - dropped
            if hard is not None:
                self._hard = hard

    def _data_bytes(self, lo: int, hi: int) -> int:
        """The data bytes of the entries lo..hi (inclusive), from the file."""
        (n,) = self._store._conn.execute(
            "SELECT COALESCE(SUM(length(data)), 0) FROM raft_log "
            "WHERE grp = ? AND idx >= ? AND idx <= ?",
            (self.group_id, lo, hi),
        ).fetchone()
        return int(n)

    def data_bytes(self) -> int:
        """The data bytes of the entries the log holds (what compaction by bytes counts)."""
        return self._bytes

    def keep_from(self, index: int, budget: int) -> int:
        """The lowest index i <= `index` + 1 such that the entries i..`index` hold at most
        `budget` data bytes (reads the file)."""
        kept = 0
        lowest = index + 1
        for idx, n in self._store._conn.execute(
            "SELECT idx, length(data) FROM raft_log WHERE grp = ? AND idx <= ? ORDER BY idx DESC",
            (self.group_id, index),
        ):
            kept += n or 0
            if kept > budget:
                break
            lowest = idx
        return lowest

    def compact(self, index: int) -> None:
        """Deletes the entries up to `index` (at most the commit index), keeping its term
        as the snapshot's, in one transaction (or the open batch)."""
        snap = self._snap
        check_compact(snap.index, index, self._hard.commit)
        meta = SnapshotMeta(index, self.term_at(index))
        store, gid = self._store, self.group_id
        with store._transaction():
            store._touched.add(gid)
            conn = store._conn
            dropped = self._data_bytes(snap.index + 1, index)
            conn.execute("DELETE FROM raft_log WHERE grp = ? AND idx <= ?", (gid, index))
            conn.execute(
                "INSERT OR REPLACE INTO raft_snapshot (grp, idx, term) VALUES (?, ?, ?)",
                (gid, meta.index, meta.term),
            )
            self._snap = meta
            self._bytes -= dropped
            # The run holding index + 1 now starts there; those before it are gone.
            k = max(bisect.bisect_right(self._run_starts, index) - 1, 0)
            del self._run_starts[:k], self._run_terms[:k]
            if self._run_starts:
                self._run_starts[0] = index + 1
            if self._tail_start <= index:
                del self._tail[: index + 1 - self._tail_start]
                self._tail_start = index + 1

    def restore(self, meta: SnapshotMeta) -> None:
        """Deletes every entry: the log starts after `meta` (a snapshot installed from
        the leader, at or past the commit index, which moves up to it)."""
        check_restore(self._snap.index, self._hard.commit, meta)
        hard = self._hard._replace(commit=meta.index)
        store, gid = self._store, self.group_id
        with store._transaction():
            store._touched.add(gid)
            conn = store._conn
            conn.execute("DELETE FROM raft_log WHERE grp = ?", (gid,))
            conn.execute(
                "INSERT OR REPLACE INTO raft_snapshot (grp, idx, term) VALUES (?, ?, ?)",
                (gid, meta.index, meta.term),
            )
            conn.execute(
                "INSERT OR REPLACE INTO raft_hard_state (grp, term, vote, commit_index) "
                "VALUES (?, ?, ?, ?)",
                (gid, hard.term, hard.vote, hard.commit),
            )
            self._snap, self._hard, self._last = meta, hard, meta.index
            self._bytes = 0
            self._run_starts, self._run_terms = [], []
            self._tail, self._tail_start = [], meta.index + 1

    def _cache_entries(self, entries: Sequence[Entry]) -> None:
        first = entries[0].index
        # Term runs: drop those starting at or after `first`, then extend.
        k = bisect.bisect_left(self._run_starts, first)
        del self._run_starts[k:], self._run_terms[k:]
        starts, terms = self._run_starts, self._run_terms
        for e in entries:
            if not terms or terms[-1] != e.term:
                starts.append(e.index)
                terms.append(e.term)
        self._last = entries[-1].index
        # The tail stays contiguous and ends at the last index.
        cap = self._store.tail_entries
        if first < self._tail_start:
            self._tail = list(entries[-cap:])
            self._tail_start = self._last - len(self._tail) + 1
            return
        del self._tail[first - self._tail_start :]
        self._tail.extend(entries)
        if len(self._tail) > 2 * cap:  # trimmed in chunks: amortised O(1) per entry
            drop = len(self._tail) - cap
            del self._tail[:drop]
            self._tail_start += drop


# -- measuring --------------------------------------------------------------------------


def bench(path: Path, durability: Durability = "fsync", seconds: float = 2.0) -> dict[str, float]:
    """Entries persisted per second (one Ready of 1 and of 100 entries per commit, and 16
    groups' Readies of 1 entry in one batch), and the cost of `term_at` / `entries` reads."""
    out: dict[str, float] = {}
    path.unlink(missing_ok=True)
    with RaftLogStore(path, durability) as store:
        data = b"x" * 100
        for per_commit, groups in ((1, 1), (100, 1), (1, 16)):
            logs = [store.group(f"b{per_commit}x{groups}/{g}") for g in range(groups)]
            n = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                with store.batch():
                    for g in logs:
                        i = g.last_index()
                        g.write(
                            [Entry(1, i + k + 1, data) for k in range(per_commit)],
                            HardState(1, None, i),
                        )
                        n += per_commit
            dt = time.perf_counter() - t0
            out[f"entries/s, {per_commit} per Ready, {groups} group(s) per commit"] = n / dt
        g = store.group("b100x1/0")
        last = g.last_index()
        reads = 100_000
        t0 = time.perf_counter()
        for k in range(reads):
            g.term_at(1 + k % last)
        out["term_at µs (any index)"] = (time.perf_counter() - t0) / reads * 1e6
        t0 = time.perf_counter()
        for _ in range(reads):
            g.entries(last - 63, last + 1)
        out["entries µs (64 from the tail)"] = (time.perf_counter() - t0) / reads * 1e6
        below = last - store.tail_entries - 64  # reads starting before this end below the tail
        if below >= 1:
            cold = 2000
            t0 = time.perf_counter()
            for k in range(cold):
                lo = 1 + (k * 997) % below
                g.entries(lo, lo + 64)
            dt = time.perf_counter() - t0
            out["entries µs (64 below the tail, from SQLite)"] = dt / cold * 1e6
    path.unlink(missing_ok=True)
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m zdmq.raft.sqlite_storage", description="Measure the durable Raft log."
    )
    ap.add_argument("path", type=Path, help="a scratch file (deleted before and after)")
    ap.add_argument("--durability", choices=("fsync", "os"), default="fsync")
    ap.add_argument("--seconds", type=float, default=2.0, help="per write measurement")
    args = ap.parse_args(argv)
    for name, value in bench(args.path, args.durability, args.seconds).items():
        print(f"{name}: {value:,.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
