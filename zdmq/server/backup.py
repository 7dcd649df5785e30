"""Backups of a running node's state: consistent copies served in chunks.

A node holds its SQLite files with `locking_mode=EXCLUSIVE`, so no other process can read
them while it runs, and a plain copy of the files is not consistent. A backup is made by
the node itself, as a snapshot is (replicas.py): `VACUUM INTO` a new file, in one read
transaction of the state it has applied, on the event loop, so it holds exactly the
commands applied up to one log index. `GET /v1/backup/<group>` serves it to a caller with
a cluster-wide admin token (app.py), `zdmq backup` / `Client.backup` fetch it from each
replica group's leader.

The first call (`offset=0`, no `copy`) makes a new copy of the group's state and answers its
first chunk, with headers naming the copy (`zdmq-backup-copy`), the log index and term the
copy holds (`zdmq-snapshot-index`, `zdmq-snapshot-term`: 0 with one copy, which has no log)
and its size (`zdmq-snapshot-size`); later calls name the copy and an offset. Copies live
in `<data_dir>/<node>/backups/`: the newest per group (a new one replaces it), all deleted
when the node starts.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
from pathlib import Path

from zdmq.backup import read_chunk
from zdmq.errors import BadRequest, RouteNotFound
from zdmq.server.storage import Storage

__all__ = ["BACKUP_COPY_HEADER", "CHUNK", "BackupChunk", "BackupCopies"]

#: A backup travels in chunks of this many bytes (one call each: bounded memory).
CHUNK = 4 << 20
BACKUP_COPY_HEADER = "zdmq-backup-copy"
_COPY_ID = re.compile(r"[0-9a-f]{16}")


class BackupChunk:
    """`data` from `offset` of copy `copy` (`size` bytes, holding the log up to `index`
    of `term`)."""

    __slots__ = ("copy", "data", "index", "offset", "size", "term")

    def __init__(
        self, copy: str, index: int, term: int, size: int, offset: int, data: bytes
    ) -> None:
        self.copy, self.index, self.term = copy, index, term
        self.size, self.offset, self.data = size, offset, data


class BackupCopies:
    """The backup copies one node keeps, in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # copy id -> (group, index, term)
        self._copies: dict[str, tuple[str, int, int]] = {}
        shutil.rmtree(directory, ignore_errors=True)  # copies of an earlier run

    def _path(self, group: str, copy: str) -> Path:
        return self.directory / f"backup-{group}-{copy}.sqlite3"

    async def chunk(
        self, group: str, storage: Storage, offset: int, copy: str | None
    ) -> BackupChunk:
        """CHUNK bytes from `offset` of copy `copy` of `group`'s state, or, without
        `copy`, of a new copy made from `storage` now."""
        if copy is None:
            if offset:
                raise BadRequest("a backup's first call takes no offset: name the copy")
            self.directory.mkdir(parents=True, exist_ok=True)
            copy = secrets.token_hex(8)
            path = self._path(group, copy)
            index, term = storage.copy_to(path)  # on the loop: one read transaction
            for old, (g, _, _) in list(self._copies.items()):
                if g == group:
                    self._path(g, old).unlink(missing_ok=True)
                    del self._copies[old]
            self._copies[copy] = (group, index, term)
        else:
            if not _COPY_ID.fullmatch(copy):
                raise BadRequest(f"copy: not a backup copy id: {copy[:40]!r}")
            found = self._copies.get(copy)
            if found is None or found[0] != group:
                raise RouteNotFound(
                    f"this node keeps no backup copy {copy} of group {group[:100]!r} "
                    "(a newer backup replaced it, or the node restarted): start again"
                )
            path = self._path(group, copy)
        _, index, term = self._copies[copy]

        size, data = await asyncio.to_thread(read_chunk, path, offset, CHUNK)
        if offset > size:
            raise BadRequest(f"offset {offset} is past the backup's {size} bytes")
        return BackupChunk(copy, index, term, size, offset, data)
