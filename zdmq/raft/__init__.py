"""Raft for zdmq: a pure, deterministic core (`RaftCore`) and the storage it reads.

Nothing here opens a socket or a file or reads a clock; a driver moves messages and
persists each `Ready`. zdmq/raft/sim.py drives several cores over a simulated network
and disk to check Raft's safety properties under faults, from a replayable seed.
zdmq/raft/sqlite_storage.py (imported on its own) is the durable log: every group of a
node in one SQLite file, many groups' `Ready`s in one commit. zdmq/raft/driver.py
(imported on its own too) is the I/O around the cores: `RaftHost` runs every group of a
node on asyncio, persisting their `Ready`s together and batching their messages per peer.
"""

from zdmq.raft.core import (
    Message,
    MsgType,
    NotCommitted,
    NotLeader,
    Progress,
    RaftCore,
    Ready,
    Role,
)
from zdmq.raft.storage import (
    Entry,
    HardState,
    MemoryStorage,
    RaftLogError,
    SnapshotMeta,
    Storage,
    WritableStorage,
)

__all__ = [
    "Entry",
    "HardState",
    "MemoryStorage",
    "Message",
    "MsgType",
    "NotCommitted",
    "NotLeader",
    "Progress",
    "RaftCore",
    "RaftLogError",
    "Ready",
    "Role",
    "SnapshotMeta",
    "Storage",
    "WritableStorage",
]
