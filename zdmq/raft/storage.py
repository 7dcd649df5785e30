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
    "SnapshotMeta",
    "Storage",
    "WritableStorage",
    "holds_entry",
]


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
        assert snap.index <= index <= self.last_index(), (index, snap)
        return self._entries[index - snap.index - 1].term if index > snap.index else snap.term

    def entries(self, lo: int, hi: int) -> list[Entry]:
        base = self._snap.index
        assert base < lo <= hi <= self.last_index() + 1, (lo, hi, base)
        return self._entries[lo - base - 1 : hi - base - 1]

    def append(self, entries: Sequence[Entry]) -> None:
        """Write `entries`, first dropping every stored entry at or after the first one's index."""
        if not entries:
            return
        first = entries[0].index
        base = self._snap.index
        assert base < first <= self.last_index() + 1, (first, base)
        del self._entries[first - base - 1 :]
        self._entries.extend(entries)

    def set_hard_state(self, hard: HardState) -> None:
        assert hard.commit <= self.last_index(), (hard.commit, self.last_index())
        self._hard = hard

    def compact(self, index: int) -> None:
        snap = self._snap
        assert snap.index < index <= self._hard.commit, (index, snap, self._hard)
        term = self.term_at(index)
        del self._entries[: index - snap.index]
        self._snap = SnapshotMeta(index, term)

    def restore(self, meta: SnapshotMeta) -> None:
        assert self._hard.commit <= meta.index and self._snap.index <= meta.index, meta
        self._entries = []
        self._snap = meta
        self._hard = self._hard._replace(commit=meta.index)

    def persist(self, rd: Ready) -> None:
        self.append(rd.entries)
        if rd.hard_state is not None:
            self.set_hard_state(rd.hard_state)


def holds_entry(log: Storage, index: int, term: int) -> bool:
    """Whether `log` holds the entry at `index`, of `term` (or its compacted prefix ends
    there)."""
    return log.snapshot().index <= index <= log.last_index() and log.term_at(index) == term
