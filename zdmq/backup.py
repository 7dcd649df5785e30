"""Backups of a whole cluster, and restoring one into new data directories.

Fetching (`Client.backup`, `zdmq backup`): a consistent copy of each replica group's state,
from the group's leader, into a directory.

Each group's copy comes from `GET /v1/backup/<group>` (zdmq/server/backup.py) piece by
piece into `group-<g>.sqlite3.part`, is synced, checked (SQLite's `quick_check`, and that
the log index it records is the one the node named), and renamed to `group-<g>.sqlite3`.
With one copy (`replication: 1`) the groups are the nodes, each copy its `zdmq.sqlite3`.
`backup.json` describes the backup: when it was made, the cluster's layout (nodes in
order, partitions, replication) and per group the log index and term its copy holds, its
size and SHA-256. A group whose leader changes midway is fetched again from its new leader.

The groups are copied one after another, each at its own moment: the backup is consistent
per group (each file holds exactly its group's log up to its index), not across groups, so
a message pushed while the backup runs may be in it or not, and an ack taken meanwhile may
be reflected or not (such a message comes back once after a restore: at-least-once).

Restoring (`restore_node`, `zdmq restore`) is for a whole cluster at once, into new (empty)
data directories: on each host, for its node, the copies of the groups the node is a
member of are checked (the layout against cluster.yaml, each file's size and SHA-256) and
written as the node's group state files (`group-<g>.sqlite3`; with one copy the node's
`zdmq.sqlite3`), synced. The node has no Raft log yet: when it starts, each group's state
is ahead of its (empty) log, so the log starts after the state's index, at a term no lower
than the copy's (replicas.py, `_finish_installs`). Every member of a group starts from the
same copy, at the same index, so they agree from there on; the new stores are a new
cluster to each other (nobody recorded an identity: zdmq/raft/identity.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from zdmq import _http
from zdmq.cluster_map import initial_map
from zdmq.config import ClusterConfig
from zdmq.errors import ConfigError, NodeUnavailable, RouteNotFound
from zdmq.raft.core import Conf

__all__ = ["MANIFEST", "GroupBackup", "fetch_backup", "restore_node"]

MANIFEST = "backup.json"
COPY_HEADER = "zdmq-backup-copy"
INDEX_HEADER = "zdmq-snapshot-index"
TERM_HEADER = "zdmq-snapshot-term"
SIZE_HEADER = "zdmq-snapshot-size"
# A group whose copy went away midway (its leader changed or restarted) is fetched again,
# up to this many times.
ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class GroupBackup:
    """One group's copy in a backup: the log index and term it holds, its file's size and
    SHA-256, its file name in the backup directory."""

    group: str
    index: int
    term: int
    bytes: int
    sha256: str
    file: str


Get = Callable[[str, Mapping[str, Any]], Awaitable[_http.Reply]]


async def fetch_backup(
    get: Get, groups: Sequence[str], directory: Path, layout: dict[str, Any]
) -> list[GroupBackup]:
    """Every group of `groups` into `directory`, then `backup.json` (with `layout`).
    `get(group, params)` calls `GET /v1/backup/<group>` on the group's leader."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    started = time.time()
    done = [await _group(get, g, directory) for g in groups]
    manifest = {
        "format": 1,
        "started": started,
        "finished": time.time(),
        **layout,
        "groups": {b.group: asdict(b) for b in done},
    }
    await asyncio.to_thread(_write_manifest, directory, manifest)
    return done


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    tmp = directory / (MANIFEST + ".part")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, directory / MANIFEST)
    sync_dir(directory)


async def _group(get: Get, group: str, directory: Path) -> GroupBackup:
    for attempt in range(ATTEMPTS):
        try:
            return await _fetch(get, group, directory)
        except RouteNotFound:
            if attempt + 1 == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


async def _fetch(get: Get, group: str, directory: Path) -> GroupBackup:
    name = f"group-{group}.sqlite3"
    part = directory / (name + ".part")
    digest = hashlib.sha256()
    params: dict[str, Any] = {}
    index = term = size = 0
    try:
        with part.open("wb") as f:
            while True:
                reply = await get(group, params)
                h = reply.headers
                copy = h.get(COPY_HEADER) or ""
                index = int(h.get(INDEX_HEADER) or 0)
                term = int(h.get(TERM_HEADER) or 0)
                size = int(h.get(SIZE_HEADER) or 0)
                if not copy or (not reply.body and f.tell() < size):
                    raise NodeUnavailable(f"group {group}'s leader sent an empty piece")
                digest.update(reply.body)
                await asyncio.to_thread(f.write, reply.body)
                if f.tell() >= size:
                    break
                params = {"copy": copy, "offset": f.tell()}
            await asyncio.to_thread(os.fsync, f.fileno())
        held, _ = await asyncio.to_thread(
            check_state_copy, part, "the copy fetched", "a node's state"
        )
        if held != index:
            raise NodeUnavailable(f"group {group}'s copy holds index {held}, not {index}")
        os.replace(part, directory / name)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return GroupBackup(group, index, term, size, digest.hexdigest(), name)


def check_state_copy(path: Path, what: str, kind: str) -> tuple[int, int]:
    """The (applied index, its term) a copy of a state file holds; NodeUnavailable, naming
    the copy as `what` and what it should be as `kind`, unless SQLite finds it sound."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        (ok,) = conn.execute("PRAGMA quick_check").fetchone()
        if ok != "ok":
            raise NodeUnavailable(f"{what} is damaged: {ok}")
        machine = dict(conn.execute("SELECT key, value FROM machine"))
    except sqlite3.DatabaseError as e:
        raise NodeUnavailable(f"{what} is not {kind}: {e}") from None
    finally:
        conn.close()
    return int(machine.get("applied", 0)), int(machine.get("applied_term", 0))


def state_conf(path: Path) -> Conf | None:
    """The group configuration a copy of a state file records (None: its first members
    all vote). Blocking: run it in a thread."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT value FROM machine WHERE key = 'conf'").fetchone()
    finally:
        conn.close()
    return Conf.from_json(row[0]) if row is not None and isinstance(row[0], str) else None


def read_chunk(path: Path, offset: int, limit: int) -> tuple[int, bytes]:
    """The file's size and up to `limit` bytes of it from `offset` (blocking: run it in
    a thread)."""
    with path.open("rb") as f:
        f.seek(offset)
        return os.fstat(f.fileno()).st_size, f.read(limit)


def sync_dir(path: Path) -> None:
    """fsync a directory: a rename or a new file in it is durable once this returns."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def restore_node(backup_dir: Path, config: ClusterConfig, node_id: str) -> list[Path]:
    """Writes the state files `node_id` needs from the backup in `backup_dir` into its
    data directory, which must not hold a node's files; returns the files written.
    ConfigError when the backup does not fit `config` (nodes, their order, partitions,
    replication), a file is missing or damaged, or the data directory is in use."""
    manifest = json.loads((backup_dir / MANIFEST).read_text())
    layout = [n["id"] for n in manifest["nodes"]]
    if (layout, manifest["partitions"], manifest["replication"]) != (
        list(config.node_ids),
        config.partitions,
        config.replication,
    ):
        raise ConfigError(
            f"the backup's layout (nodes {layout}, partitions {manifest['partitions']}, "
            f"replication {manifest['replication']}) is not cluster.yaml's (nodes "
            f"{list(config.node_ids)}, partitions {config.partitions}, replication "
            f"{config.replication}): restore into a cluster laid out as the one backed up"
        )
    config.node(node_id)  # a ConfigError for a node the file does not name
    target = config.node_data_dir(node_id)
    if target.exists() and any(target.iterdir()):
        raise ConfigError(
            f"{target} is not empty: a restore writes into a new data directory (move the "
            "old one away first, with the node stopped)"
        )
    if config.replication > 1:
        # The groups the node keeps in the layout the cluster was made with.
        m = initial_map(config)
        wanted = {g: f"group-{g}.sqlite3" for g in m.groups if node_id in m.members(g)}
    else:
        wanted = {node_id: "zdmq.sqlite3"}
    groups = manifest["groups"]
    for g in wanted:
        if g not in groups:
            raise ConfigError(f"the backup holds no copy of group {g}")
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for g, name in sorted(wanted.items()):
        entry = groups[g]
        src = backup_dir / entry["file"]
        digest = hashlib.sha256()
        part = target / (name + ".part")
        with src.open("rb") as f, part.open("wb") as out:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != entry["sha256"] or part.stat().st_size != entry["bytes"]:
            part.unlink()
            raise ConfigError(f"{src} is not the copy the backup recorded (size or SHA-256)")
        if check_state_copy(part, "the copy fetched", "a node's state")[0] != entry["index"]:
            part.unlink()
            raise ConfigError(f"{src} does not hold index {entry['index']}")
        os.replace(part, target / name)
        written.append(target / name)
    sync_dir(target)
    return written
