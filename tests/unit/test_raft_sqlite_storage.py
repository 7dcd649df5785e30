"""zdmq.raft.sqlite_storage: the durable Raft log, many groups in one SQLite file.

The storage cases run on `MemoryStorage` and on the SQLite log (in memory, in a file, and
with a tail cache of two entries so reads go below it), and a random sequence of writes
must read back the same from all of them. Then: reopening a file gives back every group
as persisted; a batch is one commit and rolls back whole; a writer process killed with
SIGKILL at a seeded point loses nothing it acknowledged; the seeded simulation runs the
same on SQLite disks as on memory ones.

Run as a script (`python tests/unit/test_raft_sqlite_storage.py FILE SEED`) this module is
the writer the crash test kills.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from zdmq.raft import (
    Entry,
    HardState,
    MemoryStorage,
    Message,
    MsgType,
    RaftCore,
    RaftLogError,
    Ready,
    Role,
    SnapshotMeta,
    WritableStorage,
    sim,
    sqlite_storage,
)
from zdmq.raft.sim import SimConfig
from zdmq.raft.sqlite_storage import GroupLog, RaftLogStore, RaftStorageFailed

Factory = Callable[[Path], WritableStorage]

FACTORIES: dict[str, Factory] = {
    "memory": lambda tmp: MemoryStorage(),
    "sqlite-memory": lambda tmp: RaftLogStore(None, "memory").group("g"),
    "sqlite-file": lambda tmp: RaftLogStore(tmp / "raft.sqlite3", "fsync").group("g"),
    "sqlite-tail-2": lambda tmp: RaftLogStore(tmp / "raft.sqlite3", "os", tail_entries=2).group(
        "g"
    ),
}


@pytest.fixture(params=sorted(FACTORIES))
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> WritableStorage:
    return FACTORIES[request.param](tmp_path)


def ents(first: int, *terms: int) -> list[Entry]:
    return [Entry(t, first + k, f"{t}@{first + k}".encode()) for k, t in enumerate(terms)]


def contents(d: WritableStorage) -> tuple[HardState, list[Entry]]:
    return d.hard_state(), d.entries(1, d.last_index() + 1)


# -- the storage cases, on every storage ----------------------------------------------------


def test_an_empty_log_has_index_0_of_term_0_and_no_hard_state(disk: WritableStorage) -> None:
    assert disk.hard_state() == HardState(0, None, 0)
    assert disk.last_index() == 0 and disk.term_at(0) == 0
    assert disk.entries(1, 1) == []


def test_appended_entries_read_back_by_index_and_range(disk: WritableStorage) -> None:
    disk.append(ents(1, 1, 1, 2))
    disk.append(ents(4, 2, 3))
    assert disk.last_index() == 5
    assert [disk.term_at(i) for i in range(6)] == [0, 1, 1, 2, 2, 3]
    assert disk.entries(2, 5) == ents(2, 1, 2, 2)
    assert disk.entries(1, 6) == ents(1, 1, 1, 2, 2, 3)
    assert disk.entries(6, 6) == [] and disk.entries(3, 3) == []


def test_an_append_overwrites_the_conflicting_suffix_and_keeps_the_prefix(
    disk: WritableStorage,
) -> None:
    disk.append(ents(1, 1, 1, 2, 2, 2))
    disk.append(ents(3, 3))
    assert disk.last_index() == 3
    assert disk.entries(1, 4) == ents(1, 1, 1) + ents(3, 3)
    disk.append(ents(1, 4, 4, 4, 4))
    assert disk.entries(1, 5) == ents(1, 4, 4, 4, 4)
    assert [disk.term_at(i) for i in range(5)] == [0, 4, 4, 4, 4]


def test_the_empty_entry_and_empty_data_keep_their_difference(disk: WritableStorage) -> None:
    disk.append([Entry(1, 1, None), Entry(1, 2, b""), Entry(1, 3, b"\x00\xff")])
    assert [e.data for e in disk.entries(1, 4)] == [None, b"", b"\x00\xff"]


def test_the_hard_state_is_replaced_whole(disk: WritableStorage) -> None:
    disk.append(ents(1, 1, 2))
    disk.set_hard_state(HardState(2, "n1", 1))
    assert disk.hard_state() == HardState(2, "n1", 1)
    disk.set_hard_state(HardState(3, None, 2))
    assert disk.hard_state() == HardState(3, None, 2)


def test_persist_writes_a_readys_entries_then_its_hard_state(disk: WritableStorage) -> None:
    # A follower's Ready: an append's entries, and the commit index it announced.
    core = RaftCore("n0", ["n0", "n1"], disk, random.Random(0))
    core.step(
        Message(
            MsgType.APPEND,
            "n1",
            "n0",
            1,
            entries=(Entry(1, 1, None), Entry(1, 2, b"a")),
            commit=2,
        )
    )
    rd = core.ready()
    assert rd.hard_state is not None and rd.hard_state.commit == 2  # needs the entries first
    disk.persist(rd)
    assert contents(disk) == (HardState(1, None, 2), [Entry(1, 1, None), Entry(1, 2, b"a")])


def test_reads_and_writes_out_of_range_are_refused(disk: WritableStorage) -> None:
    disk.append(ents(1, 1, 1))
    refused: list[tuple[Callable[[], object], str]] = [
        (lambda: disk.term_at(3), r"term_at\(3\): expected an index in 0\.\.2"),
        (lambda: disk.term_at(-1), r"term_at\(-1\)"),
        (lambda: disk.entries(0, 1), r"entries\(0, 1\): expected 1 <= lo <= hi <= 3"),
        (lambda: disk.entries(1, 4), r"entries\(1, 4\)"),
        (lambda: disk.entries(3, 2), r"entries\(3, 2\)"),
        (
            lambda: disk.append(ents(4, 1)),
            r"entries from 4: expected the first index in 1\.\.3 .* no hole",
        ),
        (
            lambda: disk.append([Entry(1, 2, None), Entry(1, 4, None)]),
            "entries from 2: index 4 at position 1",
        ),
        (
            lambda: disk.set_hard_state(HardState(1, None, 3)),
            "commit index 3 is past the log's last entry 2",
        ),
        (
            lambda: disk.persist(ready(ents(3, 2), HardState(2, None, 4))),
            "commit index 4 is past the log's last entry 3",
        ),
        (lambda: disk.compact(1), r"compact\(1\): expected an index in 1\.\.0"),
    ]
    for bad, message in refused:
        with pytest.raises(RaftLogError, match=message):
            bad()
    assert contents(disk) == (HardState(), ents(1, 1, 1))


def test_a_snapshot_older_than_the_commit_index_is_refused(disk: WritableStorage) -> None:
    disk.append(ents(1, 1, 1, 1))
    disk.set_hard_state(HardState(1, None, 2))
    with pytest.raises(RaftLogError, match="restore to 1: older than the commit index 2"):
        disk.restore(SnapshotMeta(1, 1))
    assert contents(disk) == (HardState(1, None, 2), ents(1, 1, 1, 1))


def random_writes(rng: random.Random, disk: WritableStorage, n: int) -> Iterator[None]:
    """`n` random writes (appends, overwrites of a suffix, hard states), yielding after each."""
    term = 1
    for _ in range(n):
        last, commit = disk.last_index(), disk.hard_state().commit
        if rng.random() < 0.3:
            term += 1
        first = rng.randint(commit + 1, last + 1) if rng.random() < 0.3 else last + 1
        entries = ents(first, *[term] * rng.randint(0, 6))
        hard = None
        if rng.random() < 0.5:
            new_last = entries[-1].index if entries else last
            hard = HardState(term, rng.choice([None, "n1", "n2"]), rng.randint(commit, new_last))
        if entries and hard:
            disk.persist(ready(entries, hard))
        elif entries:
            disk.append(entries)
        elif hard:
            disk.set_hard_state(hard)
        yield


def ready(entries: list[Entry], hard: HardState | None) -> Ready:
    """A `Ready` carrying only writes."""
    return Ready(hard, tuple(entries), (), (), None, Role.FOLLOWER, hard.term if hard else 0)


@pytest.mark.parametrize("seed", range(5))
def test_random_writes_read_back_as_on_memory_storage(
    seed: int, disk: WritableStorage, tmp_path: Path
) -> None:
    model = MemoryStorage()
    model_steps = random_writes(random.Random(seed), model, 300)
    for _ in random_writes(random.Random(seed), disk, 300):
        next(model_steps)
        last = model.last_index()
        assert disk.last_index() == last and disk.hard_state() == model.hard_state()
        for i in {0, last, max(last - 3, 0), last // 2}:
            assert disk.term_at(i) == model.term_at(i)
        lo = random.Random(last).randint(1, last + 1)
        assert disk.entries(lo, last + 1) == model.entries(lo, last + 1)
    assert contents(disk) == contents(model)


# -- many groups in one file --------------------------------------------------------------


def test_reopening_the_file_gives_back_every_group_as_persisted(tmp_path: Path) -> None:
    path = tmp_path / "raft.sqlite3"
    rng = random.Random(4)
    models = {f"group-{g}": MemoryStorage() for g in range(20)}
    store = RaftLogStore(path, "fsync", tail_entries=4)
    identity = store.identity
    walks = {g: random_writes(random.Random(g), store.group(g), 60) for g in models}
    model_walks = {g: random_writes(random.Random(g), m, 60) for g, m in models.items()}
    for _ in range(60 * len(models)):
        g = rng.choice(sorted(models))
        if next(walks[g], "done") != "done":
            next(model_walks[g])
    store.close()

    again = RaftLogStore(path, "fsync", tail_entries=4)
    assert again.identity == identity
    assert again.group_ids() == sorted(
        g for g, m in models.items() if m.last_index() or m.hard_state() != HardState()
    )
    for g, m in models.items():
        assert contents(again.group(g)) == contents(m), g
    assert contents(again.group("never-written")) == (HardState(), [])
    again.close()


def test_every_new_file_has_its_own_identity(tmp_path: Path) -> None:
    a = RaftLogStore(tmp_path / "a.sqlite3", "os")
    b = RaftLogStore(tmp_path / "b.sqlite3", "os")
    m = RaftLogStore(None, "memory")
    assert len({a.identity, b.identity, m.identity}) == 3
    assert all(len(s.identity) == 32 for s in (a, b, m))
    a.close()
    (tmp_path / "a.sqlite3").unlink()  # the disk is lost
    assert RaftLogStore(tmp_path / "a.sqlite3", "os").identity != a.identity


def test_a_batch_of_many_groups_readies_is_one_commit(tmp_path: Path) -> None:
    store = RaftLogStore(tmp_path / "raft.sqlite3", "fsync")
    groups = [store.group(str(g)) for g in range(10)]
    before = store.commits
    with store.batch():
        for k, g in enumerate(groups):
            g.persist(ready(ents(1, 1, 1), HardState(1, "n0", k % 3)))
            assert g.last_index() == 2  # visible in memory at once
    assert store.commits == before + 1
    groups[0].append(ents(3, 1))
    assert store.commits == before + 2
    store.close()
    again = RaftLogStore(tmp_path / "raft.sqlite3", "fsync")
    assert [again.group(str(g)).hard_state().commit for g in range(10)] == [
        0,
        1,
        2,
        0,
        1,
        2,
        0,
        1,
        2,
        0,
    ]
    assert again.group("0").last_index() == 3


def test_a_failing_batch_rolls_back_every_group_in_memory_and_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "raft.sqlite3"
    store = RaftLogStore(path, "fsync", tail_entries=2)
    g1, g2 = store.group("a"), store.group("b")
    g1.append(ents(1, 1, 1, 1))
    g1.set_hard_state(HardState(1, "n0", 2))
    before = contents(g1)
    with (
        pytest.raises(RaftLogError, match=r"entries from 5: expected the first index in 1\.\.2 "),
        store.batch(),
    ):
        g1.persist(ready(ents(3, 2, 2, 2), HardState(2, None, 3)))
        g2.append(ents(1, 1))
        g2.append(ents(5, 1))  # a hole: refused, the whole batch with it
    assert contents(g1) == before and contents(g2) == (HardState(), [])
    assert [g1.term_at(i) for i in range(4)] == [0, 1, 1, 1]
    g1.append(ents(4, 3))  # the store still works
    store.close()
    again = RaftLogStore(path, "fsync")
    assert contents(again.group("a")) == (HardState(1, "n0", 2), ents(1, 1, 1, 1, 3))
    assert again.group_ids() == ["a"]


def test_a_batch_that_goes_on_after_a_failed_write_commits_none_of_it(tmp_path: Path) -> None:
    store = RaftLogStore(tmp_path / "raft.sqlite3", "fsync")
    g1, g2 = store.group("a"), store.group("b")
    conn = store._conn
    with pytest.raises(RaftStorageFailed, match="rolled back"), store.batch():
        g1.append(ents(1, 1))
        with pytest.raises(
            RaftLogError, match=r"entries from 2: expected the first index in 1\.\.1 "
        ):
            g2.append(ents(2, 1))  # refused before it reaches SQLite: the batch goes on
        g2.append(ents(1, 1))
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(sqlite3.OperationalError, match="full"):
            g2.append([Entry(1, 2, bytes(64 * 1024))])
        conn.execute("PRAGMA max_page_count = 1073741823")
        assert g2.last_index() == 0  # rolled back at once
        with pytest.raises(RaftStorageFailed):
            g2.append(ents(1, 1))
    assert contents(g1) == contents(g2) == (HardState(), [])
    g1.append(ents(1, 7))
    store.close()
    again = RaftLogStore(tmp_path / "raft.sqlite3", "fsync")
    assert again.group_ids() == ["a"] and contents(again.group("a"))[1] == ents(1, 7)


def test_a_full_disk_fails_the_write_and_leaves_the_group_as_it_was(tmp_path: Path) -> None:
    store = RaftLogStore(tmp_path / "raft.sqlite3", "fsync", tail_entries=2)
    g = store.group("a")
    g.append(ents(1, 1, 1, 1))
    (pages,) = store._conn.execute("PRAGMA page_count").fetchone()
    store._conn.execute(f"PRAGMA max_page_count = {pages}")  # no room for one more page
    before = contents(g)
    big = [Entry(2, 2, bytes(64 * 1024))]
    with pytest.raises(sqlite3.OperationalError, match="full"):
        g.persist(ready(big, HardState(2, None, 1)))
    assert contents(g) == before and [g.term_at(i) for i in range(4)] == [0, 1, 1, 1]
    store._conn.execute("PRAGMA max_page_count = 1073741823")
    g.persist(ready(big, HardState(2, None, 1)))
    store.close()
    assert contents(RaftLogStore(tmp_path / "raft.sqlite3", "fsync").group("a")) == (
        HardState(2, None, 1),
        ents(1, 1) + big,
    )


def test_durability_sets_what_a_commit_waits_for(tmp_path: Path) -> None:
    def synchronous(s: RaftLogStore) -> int:
        return int(s._conn.execute("PRAGMA synchronous").fetchone()[0])

    def journal(s: RaftLogStore) -> str:
        return str(s._conn.execute("PRAGMA journal_mode").fetchone()[0])

    full = RaftLogStore(tmp_path / "f.sqlite3", "fsync")
    off = RaftLogStore(tmp_path / "o.sqlite3", "os")
    assert (synchronous(full), journal(full)) == (2, "wal")  # FULL: the WAL fsynced per commit
    assert (synchronous(off), journal(off)) == (0, "wal")
    with pytest.raises(ValueError, match="durability: expected fsync, os or memory"):
        RaftLogStore(tmp_path / "x.sqlite3", "fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="durability 'fsync' needs a path"):
        RaftLogStore(None, "fsync")
    with pytest.raises(ValueError, match="tail_entries: expected at least 1, got 0"):
        RaftLogStore(None, "memory", tail_entries=0)


def test_a_second_opener_of_the_file_is_refused(tmp_path: Path) -> None:
    store = RaftLogStore(tmp_path / "raft.sqlite3", "os")
    store.group("a").append(ents(1, 1))
    with pytest.raises(RaftStorageFailed, match="in use by another process"):
        RaftLogStore(tmp_path / "raft.sqlite3", "os", lock_wait_s=0.05)
    store.close()
    assert RaftLogStore(tmp_path / "raft.sqlite3", "os").group("a").last_index() == 1


def test_the_measurement_reports_writes_and_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sqlite_storage.main([str(tmp_path / "bench.sqlite3"), "--seconds", "0.05"]) == 0
    out = dict(line.rsplit(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert all(float(v.replace(",", "")) > 0 for v in out.values())
    assert "entries/s, 100 per Ready, 1 group(s) per commit" in out
    assert "term_at µs (any index)" in out
    assert list(tmp_path.iterdir()) == []  # the scratch file is gone


# -- a real crash ---------------------------------------------------------------------------

CRASH_GROUPS = [f"w{g}" for g in range(6)]


def crash_units(seed: int) -> Iterator[list[tuple[str, list[Entry], HardState]]]:
    """The writer's endless, seeded sequence of commits: each a list of (group, entries,
    hard state), one group's Ready or a batch of several groups' Readies."""
    rng = random.Random(seed)
    models = {g: MemoryStorage() for g in CRASH_GROUPS}
    unit = 0
    while True:
        unit += 1
        size = 1 if rng.random() < 0.5 else rng.randint(2, len(CRASH_GROUPS))
        writes = []
        for g in rng.sample(CRASH_GROUPS, size):
            m = models[g]
            hard = m.hard_state()
            last, term = m.last_index(), hard.term
            first = last + 1
            if last > hard.commit and rng.random() < 0.15:  # a new leader overwrites a suffix
                first = rng.randint(hard.commit + 1, last)
                term += 1
            n = rng.randint(1, 8)
            entries = [
                Entry(
                    term or 1, first + k, f"{g}/{first + k}/{unit}".encode() * rng.randint(1, 200)
                )
                for k in range(n)
            ]
            new = HardState(term or 1, "n1", rng.randint(hard.commit, first - 1))
            m.append(entries)
            m.set_hard_state(new)
            writes.append((g, entries, new))
        yield writes


def crash_writer(path: Path, seed: int) -> None:
    """Persists `crash_units(seed)` with fsync, printing each unit's number once it returns."""
    store = RaftLogStore(path, "fsync")
    groups = {g: store.group(g) for g in CRASH_GROUPS}
    for k, writes in enumerate(crash_units(seed), 1):
        with store.batch():
            for g, entries, hard in writes:
                groups[g].persist(ready(entries, hard))
        print(k, flush=True)


def models_after(seed: int, units: int) -> dict[str, MemoryStorage]:
    models = {g: MemoryStorage() for g in CRASH_GROUPS}
    for _, writes in zip(range(units), crash_units(seed), strict=False):
        for g, entries, hard in writes:
            models[g].append(entries)
            models[g].set_hard_state(hard)
    return models


def on_disk(path: Path) -> dict[str, tuple[HardState, list[Entry]]]:
    """What the file holds, read with plain sqlite3."""
    conn = sqlite3.connect(path)
    out: dict[str, tuple[HardState, list[Entry]]] = {g: (HardState(), []) for g in CRASH_GROUPS}
    for g, term, vote, commit in conn.execute(
        "SELECT grp, term, vote, commit_index FROM raft_hard_state"
    ):
        out[g] = (HardState(term, vote, commit), out[g][1])
    for g, idx, term, data in conn.execute(
        "SELECT grp, idx, term, data FROM raft_log ORDER BY grp, idx"
    ):
        out[g][1].append(Entry(term, idx, data))
    conn.close()
    return out


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_a_writer_killed_at_a_seeded_point_loses_nothing_it_acknowledged(
    seed: int, tmp_path: Path
) -> None:
    rng = random.Random(seed)
    wait_for, then_sleep = rng.randint(20, 250), rng.uniform(0, 0.01)
    print(
        f"seed {seed}: SIGKILL after {wait_for} acknowledged commits + {then_sleep * 1000:.1f} ms"
    )
    path = tmp_path / "raft.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, __file__, str(path), str(seed)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        for _ in range(wait_for):
            assert proc.stdout.readline(), "the writer stopped"
        time.sleep(then_sleep)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    lines = rest.split("\n")
    acked = int(lines[-2]) if len(lines) > 1 else wait_for  # the last whole line
    assert acked >= wait_for
    print(f"{acked} commits acknowledged")

    found = on_disk(path)
    for g, (_, log) in found.items():
        assert [e.index for e in log] == list(range(1, len(log) + 1)), f"{g}: a hole"
    # Everything acknowledged is there; of the commit in flight, all of it or none of it.
    candidates = [models_after(seed, acked), models_after(seed, acked + 1)]
    states = [{g: contents(m) for g, m in ms.items()} for ms in candidates]
    assert found in states, f"seed {seed}: the file matches neither {acked} nor {acked + 1} commits"
    store = RaftLogStore(path, "fsync")
    assert {g: contents(store.group(g)) for g in CRASH_GROUPS} == found


# -- what a node knows of its peers' stores and of its own ------------------------------


def test_peer_identities_probations_and_proven_states_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "n0.sqlite3"
    with RaftLogStore(path, "fsync") as store:
        ident = store.identity
        assert store.peer_book().identities == {} and store.self_states() == {}
        with store.batch():
            store.save_peer_book({"n1": "a1", "n2": "b1"}, {("g", "n1"): 7, ("h", "n1"): 0})
            store.save_self_states({"g": (False, (9, 3))})
        store.save_peer_book({"n1": "a2"}, {("h", "n1"): None}, {("h", "n1"): "a2"})  # lifted in h
        store.save_peer_book({}, {}, {("h", "n2"): "b1"})
        store.save_peer_book({}, {}, {("h", "n2"): None})
        store.save_self_states({"h": (True, (0, 0))})
        store.save_peer_book({"n3": "c1"}, {})
        store.save_peer_book({"n3": None}, {})  # n3 left every group this node shares
    with RaftLogStore(path, "fsync") as store:
        assert store.identity == ident  # written once, when the file was created
        book = store.peer_book()
        assert book.identities == {"n1": "a2", "n2": "b1"}
        assert book.probation == {("g", "n1"): 7}
        assert book.cleared == {("h", "n1"): "a2"}
        assert store.self_states() == {"g": (False, (9, 3)), "h": (True, (0, 0))}
    path.unlink()
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    with RaftLogStore(path, "fsync") as store:  # a lost disk: a new identity, nothing known
        assert store.identity != ident and store.peer_book().identities == {}


# -- the simulation on SQLite disks -------------------------------------------------------


def sqlite_disks(tmp: Path | None, tail_entries: int, opened: list[str]) -> sim.DiskOpener:
    """Each node's log in its own store; with `tmp`, a file reopened at every restart
    (deleted first when the simulation loses the node's disk)."""
    stores: dict[str, RaftLogStore] = {}

    def open_disk(node: str, lost: bool) -> GroupLog:
        if tmp is None:
            if node not in stores or lost:
                stores[node] = RaftLogStore(None, "memory", tail_entries=tail_entries)
        else:
            path = tmp / f"{node}.sqlite3"
            if node in stores:
                stores[node].close()
            if lost:  # the disk is gone: the file and its WAL
                for f in (path, path.with_name(path.name + "-wal")):
                    f.unlink(missing_ok=True)
            stores[node] = RaftLogStore(path, "os", tail_entries=tail_entries)
        opened.append(node)
        return stores[node].group("g")

    return open_disk


@pytest.mark.parametrize("where", ["memory", "file"])
@pytest.mark.parametrize("seed", range(4))
def test_the_simulation_runs_the_same_on_sqlite_disks(
    seed: int, where: str, tmp_path: Path
) -> None:
    cfg = SimConfig(nodes=3, steps=300)
    trace_mem: list[str] = []
    trace_sql: list[str] = []
    expected = sim.run(seed, cfg, trace_mem.append)
    opened: list[str] = []
    disks = sqlite_disks(tmp_path if where == "file" else None, 4, opened)
    got = sim.run(seed, cfg, trace_sql.append, open_disk=disks)
    assert got == expected and trace_sql == trace_mem
    assert len(opened) == cfg.nodes + got.crashes  # every restart reopened its disk


if __name__ == "__main__":
    crash_writer(Path(sys.argv[1]), int(sys.argv[2]))
