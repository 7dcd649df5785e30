"""What a Raft core has persisted: its hard state and its log, behind `Storage`.

The core only reads storage; the driver writes it, from each `Ready`, before it sends
that batch's messages (zdmq/raft/core.py), through `WritableStorage`. `MemoryStorage`
keeps both in the process; `zdmq.raft.sqlite_storage.GroupLog` keeps them in SQLite,
many groups to one file.

Log indices start at 1; index 0 is the empty prefix, of term 0.

Compaction. A log may have dropped its first entries, those a snapshot of the state
machine holds (`snapshot()`: the index and term of the last entry dropped; (0, 0) while
nothing is). It then holds the entries after that index only; `term_at` still answers
for the snapshot's index itself (what an append right after it checks). `compact`
drops entries up to a committed index the state machine holds durably; `restore`
drops every entry, for a snapshot installed from the leader.

A read or write outside those bounds raises `RaftLogError` and changes nothing: the
bounds hold whatever the caller was told by a peer, and under `python -O` too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from zdmq.raft.core import Ready

__all__ = [
    "Entry",
    "HardState",
    "MemoryStorage",
    "RaftLogError",
    "SnapshotMeta",
    "Storage",
    "WritableStorage",
    "holds_entry",
]


class RaftLogError(Exception):
    """A read or write a log refuses, changing nothing: an index outside the log (at or
    below its compacted prefix, or past its last entry), entries that would leave a hole
    or are not contiguous, a commit index past the last entry, a compaction past the
    commit index, or a snapshot older than the commit index or the compacted prefix."""


# The checks of the log's bounds, shared by MemoryStorage and the SQLite log. The reads
# (`term_at`, `entries`) compare inline, on the core's hot path, and call these to fail.


def term_at_refused(snap_index: int, last: int, index: int) -> RaftLogError:
    return RaftLogError(f"term_at({index}): expected an index in {snap_index}..{last}")


def entries_refused(snap_index: int, last: int, lo: int, hi: int) -> RaftLogError:
    return RaftLogError(f"entries({lo}, {hi}): expected {snap_index + 1} <= lo <= hi <= {last + 1}")


def check_append(snap_index: int, last: int, entries: Sequence[Entry]) -> int:
    """`entries` may be written over a log holding snap_index+1..last: they start inside
    it or right after it, with no gap, and their indices follow one another. Their last
    index."""
    first = entries[0].index
    if not snap_index < first <= last + 1:
        raise RaftLogError(
            f"entries from {first}: expected the first index in {snap_index + 1}..{last + 1} "
            "(after the compacted prefix, and leaving no hole)"
        )
    for k, e in enumerate(entries):
        if e.index != first + k:
            raise RaftLogError(f"entries from {first}: index {e.index} at position {k}")
    return entries[-1].index


def check_commit(commit: int, last: int) -> None:
    """A hard state's commit index is within the log."""
    if commit > last:
        raise RaftLogError(f"commit index {commit} is past the log's last entry {last}")


def check_compact(snap_index: int, index: int, commit: int) -> None:
    """A compaction up to `index` drops entries the log holds, all of them committed."""
    if not snap_index < index <= commit:
        raise RaftLogError(
            f"compact({index}): expected an index in {snap_index + 1}..{commit} (up to the "
            "commit index)"
        )


def check_restore(snap_index: int, commit: int, meta: SnapshotMeta) -> None:
    """A snapshot installed from the leader is at least the commit index and the
    compacted prefix."""
    if meta.index < commit or meta.index < snap_index:
        raise RaftLogError(
            f"restore to {meta.index}: older than the commit index {commit} or the compacted "
            f"prefix {snap_index}"
        )


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. `data` None is the empty entry a leader appends when its term starts."""

    term: int
    index: int
    data: bytes | None


class HardState(NamedTuple):
    """What must be on disk before any message that depends on it leaves the node."""

    term: int = 0
    vote: str | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Where a snapshot of the state machine stands: the last log index it holds and
    that entry's term. A log's entries start after its snapshot's index."""

    index: int = 0
    term: int = 0


class Storage(Protocol):
    """The persisted part of one core: read by the core, written by its driver."""

    def hard_state(self) -> HardState: ...

    def last_index(self) -> int: ...

    def snapshot(self) -> SnapshotMeta:
        """The compacted prefix: entries up to its index are gone ((0, 0): none are)."""
        ...

    def term_at(self, index: int) -> int:
        """The term of the entry at `index` (snapshot().index <= index <= last_index())."""
        ...

    def entries(self, lo: int, hi: int) -> list[Entry]:
        """The entries at indices lo..hi-1 (snapshot().index < lo <= hi <= last_index() + 1)."""
        ...


class WritableStorage(Storage, Protocol):
    """A `Storage` plus the writes its driver makes."""

    def append(self, entries: Sequence[Entry]) -> None:
        """Write `entries`, first dropping every stored entry at or after the first one's index."""
        ...

    def set_hard_state(self, hard: HardState) -> None: ...

    def persist(self, rd: Ready) -> None:
        """Write a `Ready`'s entries, then its hard state (if any), all or nothing."""
        ...

    def compact(self, index: int) -> None:
        """Drop the entries up to `index` (committed, and held durably by the state
        machine), keeping its term as the snapshot's."""
        ...

    def restore(self, meta: SnapshotMeta) -> None:
        """Drop every entry: the log now starts after `meta`, a snapshot installed from
        the leader (its index is committed, and at least the stored commit index: the
        commit index moves up to it)."""
        ...


class MemoryStorage:
    """A `Storage` in memory, plus the writes a driver makes."""

    __slots__ = ("_entries", "_hard", "_snap")

    def __init__(self) -> None:
        self._hard = HardState()
        self._snap = SnapshotMeta()
        self._entries: list[Entry] = []  # _entries[0] is at index _snap.index + 1

    def hard_state(self) -> HardState:
        return self._hard

    def last_index(self) -> int:
        return self._snap.index + len(self._entries)

    def snapshot(self) -> SnapshotMeta:
        return self._snap

    def term_at(self, index: int) -> int:
        snap = self._snap
        if not snap.index <= index <= self.last_index():
            raise term_at_refused(snap.index, self.last_index(), index)
        return self._entries[index - snap.index - 1].term if index > snap.index else snap.term

    def entries(self, lo: int, hi: int) -> list[Entry]:
        base = self._snap.index
        if not base < lo <= hi <= self.last_index() + 1:
            raise entries_refused(base, self.last_index(), lo, hi)
        return self._entries[lo - base - 1 : hi - base - 1]

    def append(self, entries: Sequence[Entry]) -> None:
        """Write `entries`, first dropping every stored entry at or after the first one's index."""
        if not entries:
            return
        first = entries[0].index
        base = self._snap.index
        check_append(base, self.last_index(), entries)
        del self._entries[first - base - 1 :]
        self._entries.extend(entries)

    def set_hard_state(self, hard: HardState) -> None:
        check_commit(hard.commit, self.last_index())
        self._hard = hard

    def compact(self, index: int) -> None:
        snap = self._snap
        check_compact(snap.index, index, self._hard.commit)
        term = self.term_at(index)
        del self._entries[: index - snap.index]
        self._snap = SnapshotMeta(index, term)

    def restore(self, meta: SnapshotMeta) -> None:
        check_restore(self._snap.index, self._hard.commit, meta)
        self._entries = []
        self._snap = meta
        self._hard = self._hard._replace(commit=meta.index)

    def persist(self, rd: Ready) -> None:
        # Both checked before either is written: all or nothing, as the SQLite log.
        last = self.last_index()
        if rd.entries:
            last = check_append(self._snap.index, last, rd.entries)
        if rd.hard_state is not None:
            check_commit(rd.hard_state.commit, last)
        self.append(rd.entries)
        if rd.hard_state is not None:
            self.set_hard_state(rd.hard_state)


def holds_entry(log: Storage, index: int, term: int) -> bool:
    """Whether `log` holds the entry at `index`, of `term` (or its compacted prefix ends
    there)."""
    return log.snapshot().index <= index <= log.last_index() and log.term_at(index) == term
