"""What a Raft core has persisted: its hard state and its log, behind `Storage`.

The core only reads storage; the driver writes it, from each `Ready`, before it sends
that batch's messages (zdmq/raft/core.py), through `WritableStorage`. `MemoryStorage`
keeps both in the process; `zdmq.raft.sqlite_storage.GroupLog` keeps them in SQLite,
many groups to one file.

Log indices start at 1; index 0 is the empty prefix, of term 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from zdmq.raft.core import Ready

__all__ = ["Entry", "HardState", "MemoryStorage", "Storage", "WritableStorage"]


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


class Storage(Protocol):
    """The persisted part of one core: read by the core, written by its driver."""

    def hard_state(self) -> HardState: ...

    def last_index(self) -> int: ...

    def term_at(self, index: int) -> int:
        """The term of the entry at `index` (0 <= index <= last_index())."""
        ...

    def entries(self, lo: int, hi: int) -> list[Entry]:
        """The entries at indices lo..hi-1 (1 <= lo <= hi <= last_index() + 1)."""
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


class MemoryStorage:
    """A `Storage` in memory, plus the writes a driver makes."""

    __slots__ = ("_entries", "_hard")

    def __init__(self) -> None:
        self._hard = HardState()
        self._entries: list[Entry] = []

    def hard_state(self) -> HardState:
        return self._hard

    def last_index(self) -> int:
        return len(self._entries)

    def term_at(self, index: int) -> int:
        assert 0 <= index <= len(self._entries), index
        return self._entries[index - 1].term if index else 0

    def entries(self, lo: int, hi: int) -> list[Entry]:
        assert 1 <= lo <= hi <= len(self._entries) + 1, (lo, hi)
        return self._entries[lo - 1 : hi - 1]

    def append(self, entries: Sequence[Entry]) -> None:
        """Write `entries`, first dropping every stored entry at or after the first one's index."""
        if not entries:
            return
        first = entries[0].index
        assert 1 <= first <= len(self._entries) + 1, first
        del self._entries[first - 1 :]
        self._entries.extend(entries)

    def set_hard_state(self, hard: HardState) -> None:
        assert hard.commit <= len(self._entries), (hard.commit, len(self._entries))
        self._hard = hard

    def persist(self, rd: Ready) -> None:
        self.append(rd.entries)
        if rd.hard_state is not None:
            self.set_hard_state(rd.hard_state)
