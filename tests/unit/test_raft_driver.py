"""zdmq.raft.driver: real `RaftHost`s in one process, each with its own SQLite log file.

Most tests connect the hosts with an in-process transport that still carries every
payload through `encode_messages` / `receive`; a test's `net` drops what crosses a
partition or goes to a stopped node (the send raises, as a refused connection does).
The HTTP tests serve the real `/v1/internal/raft` route (zdmq/server/routes/internal.py,
behind app.py's node-credential check) on zdmq's own server on 127.0.0.1 ephemeral ports
and send with `http_sender` over a signing `HttpPool`. Groups follow the placement: with N
nodes there are N groups, group `nK` holds the replication-3 window starting at node `nK`,
which is its preferred leader.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import orjson
import pytest

from zdmq import _http
from zdmq.auth import NodeSigner, NodeVerifier
from zdmq.errors import NodeUnavailable
from zdmq.raft import Entry, Message, MsgType, NotCommitted, NotLeader, Role
from zdmq.raft.core import Conf, ConfChange, ConfChangeRefused
from zdmq.raft.driver import (
    RAFT_CONTENT_TYPE,
    RAFT_PATH,
    BadRaftPayload,
    RaftHost,
    RaftHostStopped,
    UnknownGroup,
    decode_messages,
    decode_payload,
    encode_messages,
    http_sender,
)
from zdmq.raft.identity import LiftReport
from zdmq.raft.sqlite_storage import Durability, RaftLogStore
from zdmq.server import app as app_module
from zdmq.server.http import App, serve_app

TICK_S = 0.02
WAIT_S = 10.0  # bound on any single wait; a healthy run takes a fraction of it
SECRET = b"s" * 32
ID = "0123abcd"  # a store identity for payloads a test makes up


async def until(pred: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> float:
    """Waits until `pred()` holds; returns the seconds it took."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(TICK_S / 2)
    return time.monotonic() - t0


def ring_groups(ids: list[str], replication: int = 3) -> dict[str, list[str]]:
    """Group id -> members: the window of `replication` nodes starting at each node."""
    n = len(ids)
    return {ids[g]: [ids[(g + k) % n] for k in range(min(replication, n))] for g in range(n)}


class Cluster:
    """N hosts over an in-process transport (or HTTP), with a state machine per node
    that records every applied entry and survives restarts."""

    def __init__(
        self, tmp: Path, n: int, *, durability: Durability = "os", seed: int = 1, **host_kw: Any
    ) -> None:
        self.tmp = tmp
        self.ids = [f"n{i}" for i in range(n)]
        self.groups = ring_groups(self.ids)
        self.durability = durability
        self.seed = seed
        self.host_kw = {"tick_s": TICK_S, **host_kw}
        self.hosts: dict[str, RaftHost] = {}
        self.stores: dict[str, RaftLogStore] = {}
        self.starts: dict[str, int] = dict.fromkeys(self.ids, 0)
        # node -> group -> entries applied, in order (the state machine, kept durably).
        self.applied: dict[str, dict[str, list[Entry]]] = {i: {} for i in self.ids}
        self.sides: dict[str, int] | None = None  # a partition: node -> side
        self.deaf: set[str] = set()  # nodes that send, but hear nothing (no call, no answer)
        self.poisoned: set[str] = set()  # nodes whose apply raises on b"poison"
        self.send_for: Callable[[str], Callable[[str, bytes], Any]] = self._local_send

    def member_groups(self, node: str) -> dict[str, list[str]]:
        return {g: ms for g, ms in self.groups.items() if node in ms}

    # -- the in-process transport
    def _local_send(self, src: str) -> Callable[[str, bytes], Any]:
        async def send(peer: str, payload: bytes) -> None:
            if self.sides is not None and self.sides[src] != self.sides[peer]:
                raise ConnectionError("partitioned")
            if peer in self.deaf:
                raise ConnectionError("deaf")
            host = self.hosts.get(peer)
            if host is None:
                raise ConnectionRefusedError(f"{peer} is down")
            answer = await host.exchange(payload, src)
            if self.sides is not None and self.sides[src] != self.sides[peer]:
                raise ConnectionError("partitioned")  # cut off while it answered
            if src in self.deaf:
                raise ConnectionError("deaf")  # delivered, the answer lost
            return answer

        return send

    def _apply(self, node: str) -> Callable[[str, Entry], Any]:
        def apply(group: str, e: Entry) -> Any:
            if e.data == b"poison" and node in self.poisoned:
                raise ValueError("the state machine cannot take this")
            done = self.applied[node].setdefault(group, [])
            assert e.index == len(done) + 1, (node, group, e.index, len(done))
            done.append(e)
            return (node, e.index, e.data)

        return apply

    def start(self, node: str) -> RaftHost:
        assert node not in self.hosts
        self.starts[node] += 1
        store = self.stores[node] = RaftLogStore(self.tmp / f"{node}.sqlite3", self.durability)
        # The configuration each group's state machine holds (its last one applied).
        confs = {
            g: conf
            for g, es in self.applied[node].items()
            if (conf := next((c for e in reversed(es) if (c := Conf.decode(e.data))), None))
        }
        host = RaftHost(
            node,
            self.member_groups(node),
            store,
            self.send_for(node),
            self._apply(node),
            {g: len(es) for g, es in self.applied[node].items()},
            rng=random.Random(f"{self.seed}/{node}/{self.starts[node]}"),
            confs=confs,
            **self.host_kw,
        )
        self.hosts[node] = host
        host.start()
        return host

    async def stop(self, node: str) -> None:
        host = self.hosts.pop(node)
        await host.stop()
        self.stores.pop(node).close()

    async def close(self) -> None:
        for node in list(self.hosts):
            await self.stop(node)

    # -- views
    def leader_of(self, group: str) -> str | None:
        """The member that leads `group` and that every running member follows, or None."""
        up = [n for n in self.groups[group] if n in self.hosts and self.hosts[n].running]
        leaders = [n for n in up if self.hosts[n].is_leader(group)]
        if len(leaders) != 1:
            return None
        lead = leaders[0]
        ok = all(
            self.hosts[n].leader(group)[0] == lead
            for n in up
            if self.sides is None or self.sides[n] == self.sides[lead]
        )
        return lead if ok else None

    def datas(self, node: str, group: str) -> list[bytes]:
        """The commands `node` applied in `group` (not its empty or configuration entries)."""
        return [
            e.data
            for e in self.applied[node].get(group, [])
            if e.data is not None and Conf.decode(e.data) is None
        ]

    def converged(self, group: str, want: int) -> bool:
        """Every member applied the same `want` proposals of `group`."""
        seqs = [self.datas(n, group) for n in self.groups[group]]
        return len(seqs[0]) == want and all(s == seqs[0] for s in seqs)

    async def preferred_leaders(self) -> float:
        """Waits until every group is led by its preferred node and every member has
        applied that leader's empty entry."""
        return await until(
            lambda: all(
                self.leader_of(g) == g
                and self.hosts[g].commit_index(g) >= 1  # its empty entry, at least
                and all(
                    len(self.applied[n].get(g, [])) >= self.hosts[g].commit_index(g)
                    for n in self.groups[g]
                )
                for g in self.groups
            ),
            "every group led by its preferred node, its empty entry applied",
        )


@asynccontextmanager
async def cluster(tmp: Path, n: int = 3, **kw: Any) -> AsyncIterator[Cluster]:
    c = Cluster(tmp, n, **kw)
    try:
        for node in c.ids:
            c.start(node)
        yield c
    finally:
        await c.close()


async def propose_on_leader(c: Cluster, group: str, data: bytes) -> Any:
    lead = c.leader_of(group)
    assert lead is not None, f"no leader of {group}"
    return await c.hosts[lead].propose(group, data)


# ---- wire encoding ---------------------------------------------------------------------------
def test_messages_round_trip_through_a_payload() -> None:
    msgs = [
        ("g1", Message(MsgType.HEARTBEAT, "a", "b", 3, commit=7)),
        (
            "g2",
            Message(
                MsgType.APPEND,
                "a",
                "b",
                5,
                index=4,
                log_term=2,
                entries=(Entry(2, 5, b"x"), Entry(5, 6, None), Entry(5, 7, b"\x00" * 300)),
                commit=4,
            ),
        ),
        (
            "g1",
            Message(
                MsgType.APPEND_RESP, "a", "b", 5, index=9, reject=True, reject_hint=3, log_term=2
            ),
        ),
        ("g3", Message(MsgType.VOTE, "a", "b", 6, index=7, log_term=5, force=True)),
    ]
    assert decode_messages(encode_messages(msgs, "0f3a")) == ("0f3a", msgs)
    assert decode_messages(encode_messages([], "A-z_9" * 12)) == ("A-z_9" * 12, [])
    reports = [LiftReport("a", "g1", "c", "c0ffee", 9, 5), LiftReport("a", "g2", "d", "d1", 0, 1)]
    assert decode_payload(encode_messages(msgs, "0f3a", reports)) == ("0f3a", msgs, reports)
    assert decode_payload(encode_messages(msgs, "0f3a")) == ("0f3a", msgs, [])


def _raw(*items: Any, identity: Any = "5e1f") -> bytes:
    return msgpack.packb([identity, list(items)], use_bin_type=True)


def _good(**over: Any) -> list[Any]:
    m = ["g", 4, "a", "b", 5, 4, 2, [[2, 5, b"x"]], 4, False, 0, False]  # an APPEND
    for k, v in over.items():
        m[
            [
                "group",
                "type",
                "src",
                "dst",
                "term",
                "index",
                "log_term",
                "entries",
                "commit",
                "reject",
                "hint",
                "force",
            ].index(k)
        ] = v
    return m


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # a byte msgpack never uses
        b"\x92\x01",  # an array cut short
        msgpack.packb({"a": 1}),
        msgpack.packb([_good()]),  # messages without the identity
        msgpack.packb(["5e1f", [_good()], 0]),
        msgpack.packb(["5e1f", {}]),
        _raw(_good(), identity=7),
        _raw(_good(), identity=None),
        _raw(_good(), identity=""),
        _raw(_good(), identity="x" * 65),
        _raw(_good(), identity="not an id"),
        _raw(_good(), identity=b"5e1f"),
        _raw(_good(), _good(src="c")),  # two senders in one payload
        _raw([1, 2, 3]),
        _raw(_good(type=99)),
        _raw(_good(term=-1)),
        _raw(_good(term=True)),
        _raw(_good(index=2**64 - 1)),
        _raw(_good(group=7)),
        _raw(_good(reject=0)),
        _raw(_good(entries=[[2, 7, b"x"]])),  # not right after `index`
        _raw(_good(entries=[[9, 5, b"x"]])),  # a term after the message's
        _raw(_good(entries=[[1, 5, b"x"]])),  # a term before log_term
        _raw(_good(entries=[[2, 5, "text"]])),
        _raw(_good(entries=[[2, 5]])),
        _raw(_good(entries={})),
        _raw([*_good(), 0]),
        msgpack.packb(["5e1f", [_good()], {}]),  # reports not an array
        msgpack.packb(["5e1f", [_good()], [], []]),
        msgpack.packb(["5e1f", [], [["g", "c", "c0ffee", 9, 5]]]),  # a report, no sender
        msgpack.packb(["5e1f", [_good()], [["g", "c", "c0ffee", 9]]]),
        msgpack.packb(["5e1f", [_good()], [["g", "c", "not an id", 9, 5]]]),
        msgpack.packb(["5e1f", [_good()], [["g", "c", "c0ffee", -1, 5]]]),
        msgpack.packb(["5e1f", [_good()], [["g", "c", "c0ffee", 9, "5"]]]),
        msgpack.packb(["5e1f", [_good()], [["g", 3, "c0ffee", 9, 5]]]),
        msgpack.packb(["5e1f", [_good()], [[None, "c", "c0ffee", 9, 5]]]),
    ],
)
def test_a_malformed_payload_is_refused_by_the_decoder(payload: bytes) -> None:
    with pytest.raises(BadRaftPayload) as info:
        decode_messages(payload)
    assert info.value.status == 400


# ---- elections and proposals -----------------------------------------------------------------
async def test_every_group_elects_its_preferred_leader(tmp_path: Path) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        for g in c.groups:
            assert c.hosts[g].role(g) is Role.LEADER
            assert {c.hosts[n].leader(g)[0] for n in c.groups[g]} == {g}
    async with cluster(tmp_path / "five", 5) as c:
        await c.preferred_leaders()
        assert sum(h.counters["elections_won"] for h in c.hosts.values()) >= 5


async def test_proposals_apply_in_one_order_on_every_member_and_answer_the_proposer(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        per_group = 40
        calls = [(g, f"{g}-{k}".encode()) for k in range(per_group) for g in c.groups]
        results = await asyncio.gather(*(c.hosts[g].propose(g, d) for g, d in calls))
        for (g, data), (node, index, applied_data) in zip(calls, results, strict=True):
            assert node == g and applied_data == data  # apply's return, on the proposer
            assert c.applied[g][g][index - 1].data == data
        for g in c.groups:
            await until(lambda g=g: c.converged(g, per_group), f"{g} applied everywhere")
            # Each group's proposals in the order each proposer made them.
            assert c.datas(g, g) == [f"{g}-{k}".encode() for k in range(per_group)]
            entries = [c.applied[n][g] for n in c.groups[g]]
            assert all(e == entries[0] for e in entries)  # empty entries too, same terms


async def test_a_leader_sends_its_appends_while_it_writes_its_own_copy(tmp_path: Path) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        lead = c.hosts["n0"]
        sent = threading.Event()  # an append carrying b"x" left for a follower
        send, persist = lead._send, lead._persist

        async def watching_send(peer: str, payload: bytes) -> bytes | None:
            if any(m.type is MsgType.APPEND and m.entries for _, m in decode_messages(payload)[1]):
                sent.set()
            return await send(peer, payload)

        def slow_persist(*args: Any) -> None:  # in the worker thread
            # A write of its group's entries: the leader's own copy of b"x" (not a write
            # of another group it follows, whose leader may append meanwhile).
            if any(glog.group_id == "n0" and rd.entries for glog, rd in args[0]):
                sent.wait(timeout=WAIT_S)  # a busy host may be slow to send it
                assert sent.is_set(), "the write waited for nothing: no append left before it"
            persist(*args)

        lead._send = watching_send  # type: ignore[method-assign]
        lead._persist = slow_persist  # type: ignore[method-assign]
        assert (await lead.propose("n0", b"x"))[2] == b"x"
        assert lead.failed is None


async def test_a_leader_whose_write_is_slow_keeps_its_followers_from_electing(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        lead = c.hosts["n0"]
        term = lead.leader("n0")[1]
        persist = lead._persist

        def slow_persist(*args: Any) -> None:  # in the worker thread
            if args[0]:
                time.sleep(25 * TICK_S)  # over twice the longest election timeout
            persist(*args)

        lead._persist = slow_persist  # type: ignore[method-assign]
        assert (await lead.propose("n0", b"x"))[2] == b"x"
        # It heartbeat through the write: no member of its group campaigned.
        assert lead.counters["heartbeats_while_writing"] > 0
        assert c.leader_of("n0") == "n0" and lead.leader("n0")[1] == term
        assert all(c.hosts[n].leader("n0") == ("n0", term) for n in c.groups["n0"])


async def test_a_proposal_is_answered_without_waiting_to_write_the_commit_index(
    tmp_path: Path,
) -> None:
    # Slow ticks: no tick's write of the commit index falls inside the proposal.
    async with cluster(tmp_path, 3, tick_s=0.5) as c:
        await until(lambda: c.leader_of("n0") == "n0", "n0 leads its group")
        lead = c.hosts["n0"]
        await lead.propose("n0", b"warm")
        commits = c.stores["n0"].commits
        await lead.propose("n0", b"x")
        # The entry's write, and nothing before the answer: the commit index that moved
        # is written with the next write (or tick), and a restart takes what was applied.
        assert c.stores["n0"].commits == commits + 1
        await c.stop("n0")
        c.start("n0")
        await until(lambda: c.leader_of("n0") is not None, "n0's group elects")
        assert c.datas("n0", "n0") == [b"warm", b"x"]  # each applied once


async def test_propose_on_a_follower_raises_not_leader_with_the_leader_hint(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        with pytest.raises(NotLeader) as info:
            c.hosts["n1"].propose("n0", b"x")
        assert info.value.leader == "n0"
        assert info.value.term == c.hosts["n0"].leader("n0")[1]
        with pytest.raises(UnknownGroup):
            c.hosts["n1"].propose("nope", b"x")
        with pytest.raises(KeyError):
            c.hosts["n1"].leader("nope")


async def test_a_stopped_member_is_replaced_and_catches_up_on_restart_without_applying_twice(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        for k in range(10):
            await propose_on_leader(c, "n0", b"before-%d" % k)
        await c.stop("n0")
        # Another member takes group n0 over within a few election timeouts.
        took = await until(
            lambda: c.leader_of("n0") in ("n1", "n2"), "a new leader of n0", timeout_s=3.0
        )
        assert took < 3.0
        for k in range(20):
            await propose_on_leader(c, "n0", b"during-%d" % k)
            await propose_on_leader(c, "n1", b"n1-during-%d" % k)
        before = {g: len(c.applied["n0"].get(g, [])) for g in c.groups}
        assert before["n0"] >= 11  # its empty entry and 10 proposals, at least
        c.start("n0")
        await until(lambda: c.converged("n0", 30) and c.converged("n1", 20), "n0 catches up")
        # The restarted host applied only what came after what its state machine held.
        assert all(len(c.datas("n0", g)) == len(set(c.datas("n0", g))) for g in c.groups)
        assert c.datas("n0", "n0")[:10] == [b"before-%d" % k for k in range(10)]
        # And leadership of n0 goes back to its preferred node.
        await until(lambda: c.leader_of("n0") == "n0", "n0 leads n0 again")
        assert await propose_on_leader(c, "n0", b"after") is not None
        assert sum(h.counters["transfers"] for h in c.hosts.values()) >= 1


async def test_a_minority_side_commits_nothing_and_its_leader_steps_down(tmp_path: Path) -> None:
    async with cluster(tmp_path, 5) as c:
        await c.preferred_leaders()
        # Groups n3 = {n3, n4, n0} and n4 = {n4, n0, n1}: with {n0, n1} cut off from the
        # rest, n3's leader is on the majority side, n4's is alone with no quorum.
        for g in c.groups:
            await propose_on_leader(c, g, b"first")
        c.sides = {"n0": 0, "n1": 0, "n2": 1, "n3": 1, "n4": 1}
        lost = c.hosts["n4"].propose("n4", b"lost")  # taken, never committed on this side
        n4_commit = c.hosts["n4"].commit_index("n4")
        # CheckQuorum: the cut-off leader steps down; its pending proposal fails.
        await until(lambda: not c.hosts["n4"].is_leader("n4"), "n4 steps down", timeout_s=3.0)
        with pytest.raises(NotLeader):
            await asyncio.wait_for(lost, WAIT_S)
        assert c.hosts["n4"].commit_index("n4") == n4_commit
        # The side with the majority of n4's group ({n0, n1}) elects and commits.
        await until(lambda: c.leader_of("n4") in ("n0", "n1"), "n4 gets a leader on n0's side")
        await propose_on_leader(c, "n4", b"majority")
        # Group n3 keeps its leader and commits without n0.
        assert c.leader_of("n3") == "n3"
        await propose_on_leader(c, "n3", b"without n0")
        # The minority member committed nothing of it.
        assert b"majority" not in c.datas("n4", "n4")
        assert c.hosts["n4"].commit_index("n4") == n4_commit
        with pytest.raises(NotLeader):
            c.hosts["n4"].propose("n4", b"x")
        # Healed: n4 takes the majority's log (its lost entry overwritten) and leads again.
        c.sides = None
        await until(lambda: c.leader_of("n4") == "n4", "n4 leads n4 again")
        await until(lambda: c.converged("n4", 2) and c.converged("n3", 2), "healed and converged")
        assert c.datas("n4", "n4") == [b"first", b"majority"]


async def test_a_deposed_leaders_proposal_resolves_when_the_next_leader_commits_it(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3, outcome_ticks=5000) as c:
        await c.preferred_leaders()
        await propose_on_leader(c, "n0", b"first")
        # n0's appends reach its followers, but n0 hears nothing back: it cannot commit.
        c.deaf = {"n0"}
        fut = c.hosts["n0"].propose("n0", b"x")
        await until(lambda: bool(c.hosts["n0"]._pending["n0"]), "x taken by n0's core")
        (index,) = c.hosts["n0"]._pending["n0"]
        await until(lambda: all(last(c, n) >= index for n in ("n1", "n2")), "x appended")
        # CheckQuorum deposes n0; n1 or n2 is elected and commits x in its term.
        await until(lambda: not c.hosts["n0"].is_leader("n0"), "n0 steps down")
        await until(
            lambda: any(b"x" in c.datas(n, "n0") for n in ("n1", "n2")), "x committed by another"
        )
        assert not fut.done()  # n0 still waits for the outcome, as a follower
        c.deaf = set()
        node, _, data = await asyncio.wait_for(fut, WAIT_S)
        assert (node, data) == ("n0", b"x")  # applied here, answered as if led throughout
        assert c.hosts["n0"].counters["proposals_unknown"] == 0


async def test_a_deposed_leaders_overwritten_proposal_fails_as_not_committed(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3, outcome_ticks=5000) as c:
        await c.preferred_leaders()
        await propose_on_leader(c, "n0", b"first")
        c.sides = {"n0": 0, "n1": 1, "n2": 1}
        lost = c.hosts["n0"].propose("n0", b"lost")  # on n0's log alone
        await until(lambda: c.leader_of("n0") in ("n1", "n2"), "n1 or n2 leads n0's group")
        await propose_on_leader(c, "n0", b"majority")
        await until(lambda: not c.hosts["n0"].is_leader("n0"), "n0 steps down")
        assert not lost.done()
        c.sides = None
        with pytest.raises(NotCommitted):
            await asyncio.wait_for(lost, WAIT_S)
        assert c.hosts["n0"].counters["proposals_overwritten"] == 1
        await until(lambda: c.converged("n0", 2), "healed and converged")
        assert c.datas("n0", "n0") == [b"first", b"majority"]


async def test_a_member_handing_over_leads_nothing_and_is_not_handed_its_group_back(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        await propose_on_leader(c, "n0", b"first")
        assert await c.hosts["n0"].hand_over(WAIT_S)  # n0 leads nothing now
        assert not any(c.hosts["n0"].is_leader(g) for g in c.member_groups("n0"))
        # The member it handed the group to wins its election, and the others follow it.
        await until(lambda: c.leader_of("n0") in ("n1", "n2"), "a new leader of group n0")
        # The group serves on at once under its new leader, and its preferred leader,
        # which is leaving, is not handed it back (the others try every few ticks).
        await propose_on_leader(c, "n0", b"after")
        won = c.hosts["n0"].counters["elections_won"]
        ticked = c.hosts["n1"]._ticked
        await until(lambda: c.hosts["n1"]._ticked >= ticked + 20, "20 more ticks")
        assert c.hosts["n0"].counters["elections_won"] == won
        assert c.leader_of("n0") in ("n1", "n2")
        assert c.datas("n1", "n0") == [b"first", b"after"]


async def test_a_leader_handed_its_group_serves_only_once_it_applied_what_was_committed(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        await propose_on_leader(c, "n0", b"x")  # committed, its followers may not know yet
        handing = asyncio.ensure_future(c.hosts["n0"].hand_over(WAIT_S))
        served = None
        loop = asyncio.get_running_loop()
        end = loop.time() + WAIT_S
        while served is None and loop.time() < end:
            for n in ("n1", "n2"):
                if c.hosts[n].serves("n0"):
                    # Elected, it may not have applied x yet (here it usually has not):
                    # it serves only once it has, so a read there sees x.
                    assert b"x" in c.datas(n, "n0"), n
                    served = n
            await asyncio.sleep(0)
        assert await handing
        assert served is not None, "no new leader served"
        assert not c.hosts["n0"].serves("n0")


async def test_a_leader_whose_ticks_stalled_serves_nothing_and_steps_down(
    tmp_path: Path,
) -> None:
    """A node paused (SIGSTOP) while it led may have been replaced and not know it yet: a
    read it served then could miss what the new leader committed. Its ticks show the
    stall: it serves nothing from then on, its leaders step down, and the group elects."""
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        lead = c.hosts["n0"]
        term = lead.leader("n0")[1]
        lead._tick_at -= 1.0  # as if its node had stopped for a second and just resumed
        assert lead.is_leader("n0") and not lead.serves("n0")
        await until(lambda: not lead.is_leader("n0"), "n0 stepped down")
        assert lead.counters["stalls"] == 1
        await until(lambda: c.leader_of("n0") is not None, "group n0 led again")
        assert c.hosts[c.leader_of("n0")].leader("n0")[1] > term


# ---- membership changes ------------------------------------------------------------------------
async def test_a_member_is_replaced_through_the_log_and_the_group_serves_throughout(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 4) as c:
        await c.preferred_leaders()
        await propose_on_leader(c, "n0", b"before")
        lead = c.hosts["n0"]
        # n3 joins group n0 as a learner: its host starts the group empty and catches up.
        await lead.propose_conf("n0", ConfChange("add_learner", "n3"))
        c.hosts["n3"].add_group("n0", lead.conf("n0"))
        await until(lambda: c.datas("n3", "n0") == [b"before"], "n3 caught up")
        assert not c.hosts["n3"].conf("n0").voters & {"n3"}
        # The leader promotes n3 once it has heard that n3's log reaches the commit index.
        core = lead._cores["n0"]
        await until(lambda: core.progress["n3"].match >= core.log.committed, "n3's ack heard")
        await lead.propose_conf("n0", ConfChange("promote", "n3"))
        with pytest.raises(ConfChangeRefused, match="member already"):
            await lead.propose_conf("n0", ConfChange("add_learner", "n3"))
        await lead.propose_conf("n0", ConfChange("remove", "n2"))
        # Its removal applied on the leader, n2 (which hears no more of the group) goes.
        assert lead.conf_committed("n0") and "n2" not in lead.conf("n0").members()
        c.hosts["n2"].remove_group("n0")
        c.groups["n0"] = ["n0", "n1", "n3"]
        await until(lambda: "n0" not in c.hosts["n2"].groups, "n2 left group n0")
        assert c.stores["n2"].group_ids().count("n0") == 0  # its log of n0 is gone
        # n3 now counts: with n1 down, n0 and n3 commit.
        await c.stop("n1")
        await propose_on_leader(c, "n0", b"after")
        await until(lambda: c.datas("n3", "n0") == [b"before", b"after"], "n3 applied after")
        assert c.hosts["n0"].conf("n0") == Conf(frozenset({"n0", "n1", "n3"}))
        # A restart of n3 takes its configuration from what it applied.
        await c.stop("n3")
        c.start("n1")
        c.start("n3")
        assert c.hosts["n3"].conf("n0") == Conf(frozenset({"n0", "n1", "n3"}))
        await until(lambda: c.leader_of("n0") is not None, "a leader of n0")
        await propose_on_leader(c, "n0", b"restarted")
        await until(lambda: c.converged("n0", 3), "n0, n1 and n3 converged")


def last(c: Cluster, node: str) -> int:
    """The last index of `node`'s log of group n0, committed or not."""
    return c.hosts[node]._cores["n0"].log.last_index()


# ---- faults of input and of the state machine ------------------------------------------------
async def test_a_malformed_payload_raises_the_typed_error_and_the_host_keeps_working(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        host = c.hosts["n1"]
        bad = [
            b"\xc1garbage",
            encode_messages([("n0", Message(MsgType.HEARTBEAT, "n0", "n2", 1))], ID),  # not n1's
            encode_messages([("n0", Message(MsgType.HEARTBEAT, "n1", "n1", 1))], ID),  # itself
            *(  # lift reports on their sender, on n1 itself
                encode_messages(
                    [("n0", Message(MsgType.HEARTBEAT, "n0", "n1", 1))],
                    ID,
                    [LiftReport("n0", g, peer, ID, 1, 1)],
                )
                for g, peer in [("n0", "n0"), ("n0", "n1")]
            ),
        ]
        received = host.counters["messages_received"]
        for payload in bad:
            with pytest.raises(BadRaftPayload):
                host.receive(payload)
        assert host.counters["messages_received"] == received
        # Messages of a group n1 is not in (yet, or any more) are dropped, not refused:
        # membership changes reach the members one by one.
        host.receive(encode_messages([("unknown", Message(MsgType.HEARTBEAT, "n0", "n1", 1))], ID))
        assert host.counters["messages_other_groups"] == 1
        # A payload with one bad message among good ones is refused whole.
        mixed = encode_messages(
            [
                ("n0", Message(MsgType.HEARTBEAT, "n0", "n1", 999)),
                ("n0", Message(MsgType.HEARTBEAT, "n0", "n2", 999)),
            ],
            ID,
        )
        with pytest.raises(BadRaftPayload):
            host.receive(mixed)
        # A message whose sender is not the node the payload came from.
        forged = encode_messages([("n0", Message(MsgType.HEARTBEAT, "n2", "n1", 999))], ID)
        with pytest.raises(BadRaftPayload):
            host.receive(forged, sender="n0")
        assert host.running and host.failed is None
        assert all(host.leader(g)[1] < 999 for g in host.groups)
        assert await propose_on_leader(c, "n0", b"still works") is not None
        await until(lambda: c.converged("n0", 1), "the proposal applied everywhere")


async def test_an_apply_that_raises_stops_the_host_rather_than_skip_an_entry(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()
        applied = len(c.applied["n2"]["n0"])
        c.poisoned.add("n2")
        await propose_on_leader(c, "n0", b"poison")  # the others apply it
        await until(lambda: c.hosts["n2"].failed is not None, "n2's host fails")
        h = c.hosts["n2"]
        assert "ValueError" in (h.failed or "") and not h.running
        assert len(c.applied["n2"]["n0"]) == applied  # nothing after it applied either
        with pytest.raises(RaftHostStopped):
            h.propose("n2", b"x")
        with pytest.raises(RaftHostStopped):
            h.receive(encode_messages([], ID))
        # The others carry on: each group keeps a quorum without n2.
        await until(lambda: c.leader_of("n2") in ("n0", "n1"), "n2's group moves")
        await propose_on_leader(c, "n2", b"on")


async def test_a_storage_failure_stops_the_host_and_fails_its_proposals(tmp_path: Path) -> None:
    applied: list[Entry] = []

    async def nowhere(peer: str, payload: bytes) -> None:
        raise AssertionError("a group of one sends nothing")

    store = RaftLogStore(tmp_path / "solo.sqlite3", "fsync")
    host = RaftHost("a", {"a": ["a"]}, store, nowhere, lambda g, e: applied.append(e) or e.index)
    host.start()
    try:
        await until(lambda: host.is_leader("a"), "a group of one elects its member")
        assert await host.propose("a", b"one") == 2  # after the leader's empty entry
        store.failed = "the disk is gone"  # what the store sets when a commit fails
        with pytest.raises(RaftHostStopped):
            await asyncio.wait_for(host.propose("a", b"two"), WAIT_S)
        assert host.failed is not None and "RaftStorageFailed" in host.failed
        assert [e.data for e in applied] == [None, b"one"]
        with pytest.raises(RaftHostStopped):
            host.propose("a", b"three")
    finally:
        await host.stop()
        store.close()


async def test_a_peers_queue_is_bounded_and_failed_sends_are_counted(tmp_path: Path) -> None:
    gate = asyncio.Event()
    sent: list[bytes] = []

    async def stuck(peer: str, payload: bytes) -> None:
        sent.append(payload)
        await gate.wait()  # the first send never ends: everything else queues
        raise ConnectionError("gone")

    store = RaftLogStore(tmp_path / "a.sqlite3", "os")
    host = RaftHost(
        "a",
        {"a": ["a", "b", "c"]},
        store,
        stuck,
        lambda g, e: None,
        tick_s=TICK_S,
        election_ticks=2,
        max_queued_messages=5,
    )
    host.start()
    try:
        await until(lambda: host.counters["messages_dropped"] > 0, "a drop over the bound")
        assert len(sent) == 2  # one send in flight per peer, no more
        for peer in host._peers.values():
            assert len(peer.queue) <= 5
        gate.set()
        await until(lambda: host.counters["send_failures"] >= 2, "the failed sends counted")
    finally:
        await host.stop()
        store.close()


# ---- lost stores -------------------------------------------------------------------------------
def one_group(tmp: Path, preferred: str | None, **kw: Any) -> Cluster:
    """Three nodes in one group "g" (preferred leader `preferred`, or none)."""
    c = Cluster(tmp, 3, preferred={"g": preferred} if preferred else {}, **kw)
    c.groups = {"g": list(c.ids)}
    return c


def lose_disk(c: Cluster, node: str) -> None:
    """Deletes a stopped node's store file, and its state machine with it."""
    assert node not in c.hosts
    path = c.tmp / f"{node}.sqlite3"
    for f in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        f.unlink(missing_ok=True)
    c.applied[node] = {}


async def test_a_fresh_cluster_elects_with_no_preferred_leader_and_sends_its_identity(
    tmp_path: Path,
) -> None:
    c = one_group(tmp_path, None)
    sent: list[tuple[str, bytes]] = []
    local = c.send_for

    def recording(src: str) -> Callable[[str, bytes], Any]:
        inner = local(src)

        async def send(peer: str, payload: bytes) -> bytes | None:
            sent.append((src, payload))
            answer: bytes | None = await inner(peer, payload)
            if answer is not None:
                sent.append((peer, answer))
            return answer

        return send

    c.send_for = recording
    try:
        for node in c.ids:
            c.start(node)
        await until(lambda: c.leader_of("g") is not None, "a leader by election timeouts")
        lead = c.leader_of("g")
        assert lead is not None
        assert await c.hosts[lead].propose("g", b"first") is not None
        await until(lambda: c.converged("g", 1), "applied everywhere")
        for src, payload in sent:
            identity, msgs = decode_messages(payload)
            assert identity == c.stores[src].identity
            assert all(m.src == src for _, m in msgs)
        for node in c.ids:
            h = c.hosts[node]
            assert h.on_probation("g") == frozenset() and h.counters["replaced_peers"] == 0
            assert not h.book.probation
        # The leader heard from both followers: it recorded their stores.
        assert c.hosts[lead].book.identities == {
            n: c.stores[n].identity for n in c.ids if n != lead
        }
    finally:
        await c.close()


async def test_a_lost_store_cannot_elect_a_node_missing_a_committed_entry(tmp_path: Path) -> None:
    """The group {A, B, C} = {n0, n1, n2}: entry e committed on A and B only; B's store
    file is deleted, A is down. C (without e) and the new B elect no one; once A is
    back, A leads with e, B catches up, e is applied everywhere, and A lifts B's
    probation, after which B's acknowledgements and votes count again."""
    c = one_group(tmp_path, "n0")
    try:
        for node in c.ids:
            c.start(node)
        await until(lambda: c.leader_of("g") == "n0", "n0 leads")
        old_b = c.stores["n1"].identity
        c.sides = {"n0": 0, "n1": 0, "n2": 1}  # C misses e
        await c.hosts["n0"].propose("g", b"e")
        committed = c.hosts["n0"].commit_index("g")
        assert c.hosts["n1"].last_index("g") >= committed > c.hosts["n2"].last_index("g")
        await c.stop("n0")
        await c.stop("n1")
        lose_disk(c, "n1")
        c.sides = None
        c.start("n1")
        assert c.stores["n1"].identity != old_b
        # Ten election timeouts at least: neither may win (B's empty log vouches for no
        # one; C's log is not the group's).
        t_end = time.monotonic() + 25 * 10 * TICK_S
        while time.monotonic() < t_end:
            assert not c.hosts["n1"].is_leader("g") and not c.hosts["n2"].is_leader("g")
            await asyncio.sleep(TICK_S)
        assert c.hosts["n2"].commit_index("g") < committed
        # A comes back: it sees B's new store, puts it on probation, and leads with e.
        c.start("n0")
        await until(lambda: c.hosts["n0"].counters["replaced_peers"] >= 1, "A sees B's new store")
        assert c.hosts["n0"].book.identities["n1"] == c.stores["n1"].identity
        await until(lambda: c.leader_of("g") == "n0", "A leads again")
        await until(lambda: c.converged("g", 1), "e applied on every member")
        assert all(c.datas(n, "g") == [b"e"] for n in c.ids)
        # B caught up: A lifted its probation (with an empty entry of its own if needed).
        await until(lambda: c.hosts["n0"].on_probation("g") == frozenset(), "B's probation lifted")
        assert c.hosts["n0"].counters["probations_lifted"] >= 1
        # B's new store knows it holds its leader's commit now, and keeps that.
        await until(lambda: c.stores["n1"].self_states().get("g", (False,))[0], "B proven")
        # B now counts: with C down, A commits with B alone, and after A restarts, B's
        # vote elects it.
        await c.stop("n2")
        assert await propose_on_leader(c, "g", b"with B") is not None
        await c.stop("n0")
        c.start("n0")
        await until(lambda: c.leader_of("g") == "n0", "A elected by B's vote")
        assert await propose_on_leader(c, "g", b"after") is not None
        await until(
            lambda: c.datas("n1", "g") == [b"e", b"with B", b"after"], "B applies all of it"
        )
    finally:
        await c.close()


async def test_a_probation_survives_a_restart_of_the_host_holding_it(tmp_path: Path) -> None:
    c = one_group(tmp_path, "n0")
    try:
        for node in c.ids:
            c.start(node)
        await until(lambda: c.leader_of("g") == "n0", "n0 leads")
        host = c.hosts["n0"]
        term = host.leader("g")[1]
        c.sides = {"n0": 0, "n1": 1, "n2": 0}  # the real n1 cannot answer: nothing lifts it
        # A payload from n1 with another store identity than the one n0 recorded (what a
        # lost and recreated store sends).
        new_b = "b" * 32
        host.receive(
            encode_messages([("g", Message(MsgType.HEARTBEAT_RESP, "n1", "n0", term))], new_b)
        )
        await until(lambda: "n1" in host.on_probation("g"), "n1 on probation")
        assert host.book.identities["n1"] == new_b
        await c.stop("n0")
        # The probation and the identity are in n0's store.
        store = RaftLogStore(tmp_path / "n0.sqlite3", "os")
        try:
            book = store.peer_book()
            assert ("g", "n1") in book.probation and book.identities["n1"] == new_b
        finally:
            store.close()
        host = c.start("n0")
        assert "n1" in host.on_probation("g")
        await until(lambda: c.leader_of("g") == "n0", "n0 leads again, with n2")
        # n1's real store answers once the cut heals: n0 takes it for another new store
        # (probation again), then lifts it once n1 has caught up.
        c.sides = None
        await until(lambda: host.book.identities["n1"] == c.stores["n1"].identity, "n1 seen")
        await until(lambda: host.on_probation("g") == frozenset(), "n1's probation lifted")
        assert await propose_on_leader(c, "g", b"x") is not None
    finally:
        await c.close()


async def test_after_a_replaced_store_caught_up_the_others_elect_without_its_old_leader(
    tmp_path: Path,
) -> None:
    """{A, B, C} = {n0, n1, n2}, A leads: B's store file is deleted, B restarts and
    catches up under A, and A lifts B's probation and reports it; C lifts its own. Then
    A stops: B and C elect one of themselves and commit, which they could not if C still
    held B on probation (C would count neither B's grant nor vote for B)."""
    c = one_group(tmp_path, "n1")
    try:
        for node in c.ids:
            c.start(node)
        # B leads first, so C records B's store (as members sharing several groups do).
        await until(lambda: c.leader_of("g") == "n1", "n1 leads")
        await propose_on_leader(c, "g", b"before")
        await until(lambda: c.converged("g", 1), "applied everywhere")
        assert c.hosts["n2"].book.identities["n1"] == c.stores["n1"].identity
        c.host_kw["preferred"] = {"g": "n0"}
        for h in c.hosts.values():
            h.preferred["g"] = "n0"
        await until(lambda: c.leader_of("g") == "n0", "n1 hands the group to n0")
        await c.stop("n1")
        lose_disk(c, "n1")
        c.start("n1")
        await until(lambda: c.datas("n1", "g") == [b"before"], "B caught up")
        await until(lambda: c.hosts["n0"].on_probation("g") == frozenset(), "A lifts B")
        assert await propose_on_leader(c, "g", b"caught up") is not None
        await until(lambda: c.converged("g", 2), "applied everywhere")
        # C never heard from B's new store: A's report tells it, and lifts it there.
        new_b = c.stores["n1"].identity
        await until(
            lambda: (
                c.hosts["n2"].book.identities["n1"] == new_b
                and c.hosts["n2"].on_probation("g") == frozenset()
            ),
            "C records B's new store, not on probation",
        )
        assert c.hosts["n2"].counters["probations_lifted_by_report"] == 1
        await c.stop("n0")
        took = await until(
            lambda: c.leader_of("g") in ("n1", "n2"), "B or C leads without A", timeout_s=5.0
        )
        assert took < 5.0
        assert await propose_on_leader(c, "g", b"without A") is not None
        await until(
            lambda: (
                c.datas("n1", "g") == c.datas("n2", "g") == [b"before", b"caught up", b"without A"]
            ),
            "B and C apply it",
        )
    finally:
        await c.close()


async def test_a_follower_takes_a_lift_report_only_from_its_leader_in_its_term_on_that_store(
    tmp_path: Path,
) -> None:
    c = one_group(tmp_path, "n0")
    try:
        for node in c.ids:
            c.start(node)
        await until(lambda: c.leader_of("g") == "n0", "n0 leads")
        await propose_on_leader(c, "g", b"x")
        await until(lambda: c.converged("g", 1), "applied everywhere")
        c.sides = {"n0": 0, "n1": 1, "n2": 0}  # the real n1 stays quiet
        host = c.hosts["n2"]
        term = host.leader("g")[1]
        new_b = "b" * 32
        beat_b = [("g", Message(MsgType.HEARTBEAT_RESP, "n1", "n2", term))]
        host.receive(encode_messages(beat_b, c.stores["n1"].identity))  # n2 records n1's store
        host.receive(encode_messages(beat_b, new_b))  # then sees another: replaced
        await until(lambda: "n1" in host.on_probation("g"), "n1 on probation at n2")
        since = host.book.since("g", "n1")
        assert since is not None
        a_id = c.stores["n0"].identity

        def report(src: str, identity: str, index: int, r_term: int, on: str = new_b) -> bytes:
            beat = Message(MsgType.HEARTBEAT_RESP, src, "n2", term)
            return encode_messages(
                [("g", beat)], identity, [LiftReport(src, "g", "n1", on, index, r_term)]
            )

        for payload in [
            report("n0", a_id, since, term - 1),  # an older term's (a deposed leader's)
            report("n0", a_id, since, term + 1),  # a term n2 has not reached
            report("n0", a_id, since - 1, term),  # behind what n2 knew committed
        ]:
            host.receive(payload)
        await asyncio.sleep(5 * TICK_S)
        assert "n1" in host.on_probation("g") and host.book.identities["n1"] == new_b
        assert host.counters["probations_lifted_by_report"] == 0
        # A report on a store of n1's that n2 does not record (an older one, delayed) is
        # taken as that store's payload would be, and lifts only that store: the store
        # n1 really has is a replacement again at its next payload.
        host.receive(report("n0", a_id, since, term, "c" * 32))
        await until(lambda: host.book.identities["n1"] == "c" * 32, "n2 records c")
        assert host.book.reportable("g", "n1") == "c" * 32
        host.receive(encode_messages(beat_b, new_b))
        await until(lambda: "n1" in host.on_probation("g"), "b on probation again")
        assert host.book.identities["n1"] == new_b and host.book.reportable("g", "n1") is None
        since = host.book.since("g", "n1")
        assert since is not None
        host.receive(report("n0", a_id, since - 1, term))  # behind n2's commit at the sighting
        await asyncio.sleep(5 * TICK_S)
        assert "n1" in host.on_probation("g")
        # From its leader, at its term, on the store it records, caught up: lifted.
        host.receive(report("n0", a_id, since, term))
        await until(lambda: "n1" not in host.on_probation("g"), "lifted on the report")
        assert host.counters["probations_lifted_by_report"] == 2
        # A report from another store of n0's: n0 is replaced (on probation), and its
        # report is not taken.
        host.receive(report("n0", "f" * 32, since, term, "d" * 32))
        await until(lambda: "n0" in host.on_probation("g"), "n0 on probation at n2")
        await asyncio.sleep(5 * TICK_S)
        assert host.book.identities["n1"] == new_b and host.book.reportable("g", "n1") == new_b
        assert host.counters["probations_lifted_by_report"] == 2
        assert host.book.reportable("g", "n1") == new_b
    finally:
        await c.close()


# ---- group commit ----------------------------------------------------------------------------
async def test_concurrent_proposals_across_groups_share_few_store_commits(tmp_path: Path) -> None:
    async with cluster(tmp_path, 3) as c:
        await c.preferred_leaders()

        def idle() -> bool:  # no write in flight: a batch's commit and its count agree
            return not any(h._writing for h in c.hosts.values())

        await until(idle, "no write in flight")
        batches0 = {n: h.counters["fsync_batches"] for n, h in c.hosts.items()}
        commits0 = {n: c.stores[n].commits for n in c.ids}
        n = 600
        calls = [(c.ids[k % 3], b"p%d" % k) for k in range(n)]
        await asyncio.gather(*(c.hosts[g].propose(g, d) for g, d in calls))
        for g in c.groups:
            await until(lambda g=g: c.converged(g, n // 3), f"{g} applied everywhere")
        await until(idle, "no write in flight")
        batches = sum(h.counters["fsync_batches"] - batches0[i] for i, h in c.hosts.items())
        commits = sum(c.stores[i].commits - commits0[i] for i in c.ids)
        assert batches == commits  # every store commit is one of the host's batches
        # Each of the 600 entries is persisted on 3 nodes: 1800 writes, in far fewer commits.
        print(f"\n{n} proposals: {commits} store commits, {batches} batches")
        assert commits < n / 4, commits


# ---- over HTTP -------------------------------------------------------------------------------
class HttpNet:
    """Each node's `/v1/internal/raft` served by zdmq's server on a loopback port, and a
    signing pool per node."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.socks: dict[str, socket.socket] = {}
        self.urls: dict[str, str] = {}
        self.apps: dict[str, App] = {}
        self.stops: dict[str, asyncio.Event] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.pools: dict[str, _http.HttpPool] = {}
        [(method, handler, need)] = [
            (m, h, need) for m, p, h, need in app_module.ROUTES if p == RAFT_PATH
        ]
        assert (method, need) == ("POST", app_module.NODE_ONLY)
        verifier = NodeVerifier(SECRET, tuple(c.ids))
        for node in c.ids:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            sock.setblocking(False)
            self.socks[node] = sock
            self.urls[node] = f"http://127.0.0.1:{sock.getsockname()[1]}"
            app = self.apps[node] = App(max_body=16 * 1024 * 1024)
            app[app_module.NODE] = SimpleNamespace(id=node)
            app[app_module.MEMBER] = SimpleNamespace(id=node, raft=None)
            app.route("POST", RAFT_PATH, app_module._guarded(handler, need, verifier, None))
            self.pools[node] = _http.HttpPool(sign=NodeSigner(SECRET, node), timeout_s=2.0)
        c.send_for = lambda node: http_sender(self.pools[node], self.urls)
        self._start = c.start

        def start(node: str) -> RaftHost:
            host = self._start(node)
            self.apps[node][app_module.MEMBER].raft = host
            return host

        c.start = start  # type: ignore[method-assign]

    async def serve(self) -> None:
        for node in self.c.ids:
            up = asyncio.Event()
            self.stops[node] = asyncio.Event()
            self.tasks.append(
                asyncio.create_task(
                    serve_app(self.apps[node], self.socks[node], self.stops[node], ready=up.set)
                )
            )
            await asyncio.wait_for(up.wait(), WAIT_S)

    async def close(self) -> None:
        for stop in self.stops.values():
            stop.set()
        await asyncio.gather(*self.tasks)
        for pool in self.pools.values():
            await pool.close()


@asynccontextmanager
async def http_cluster(tmp: Path, n: int = 3, **kw: Any) -> AsyncIterator[tuple[Cluster, HttpNet]]:
    c = Cluster(tmp, n, **kw)
    net = HttpNet(c)
    await net.serve()
    try:
        for node in c.ids:
            c.start(node)
        yield c, net
    finally:
        await c.close()
        await net.close()


async def test_hosts_over_http_with_fsync_elect_commit_and_refuse_bad_calls(
    tmp_path: Path,
) -> None:
    async with http_cluster(tmp_path, 3, durability="fsync") as (c, net):
        await c.preferred_leaders()
        results = await asyncio.gather(
            *(
                c.hosts[g].propose(g, b"%s-%d" % (g.encode(), k))
                for k in range(20)
                for g in c.groups
            )
        )
        assert all(r[0] in c.ids for r in results)
        for g in c.groups:
            await until(lambda g=g: c.converged(g, 20), f"{g} applied everywhere")
        assert all(h.counters["payloads_sent"] > 0 for h in c.hosts.values())
        # Followers' answers ride on the replies to their leaders' calls (when their round
        # is quick: else they follow in calls of their own).
        assert sum(h.counters["payloads_answered"] for h in c.hosts.values()) > 0
        url = net.urls["n1"] + RAFT_PATH
        pool = net.pools["n0"]
        # A heartbeat of n0's (it leads group n0): n1's answer comes in the 200's body.
        lead_term = c.hosts["n0"].leader("n0")[1]
        beat = encode_messages(
            [("n0", Message(MsgType.HEARTBEAT, "n0", "n1", lead_term))], c.stores["n0"].identity
        )
        for _ in range(50):  # a round slower than ANSWER_WAIT_S (a busy machine): 204
            reply = await pool.request("POST", net.urls["n1"], RAFT_PATH, data=beat)
            if reply.status == 200:
                break
            assert reply.status == 204
        assert reply.status == 200 and reply.headers["content-type"] == RAFT_CONTENT_TYPE
        answers = decode_messages(reply.body)[1]
        assert (
            "n0",
            Message(MsgType.HEARTBEAT_RESP, "n1", "n0", lead_term),
        ) in answers
        # A malformed payload: 400 with zdmq's error body; the host goes on.
        reply = await pool.request("POST", net.urls["n1"], RAFT_PATH, data=b"\xc1\xc1")
        assert reply.status == 400
        assert orjson.loads(reply.body)["error"]["code"] == "bad_request"
        # No node credential: 401 (and nothing reaches the host).
        plain = _http.HttpPool()
        try:
            reply = await plain.request("POST", net.urls["n1"], RAFT_PATH, data=b"\x90")
            assert reply.status == 401
        finally:
            await plain.close()
        # A node without a Raft host: 404 with the error body.
        net.apps["n1"][app_module.MEMBER].raft = None
        try:
            reply = await pool.request("POST", net.urls["n1"], RAFT_PATH, data=b"\x90")
            assert reply.status == 404
            assert orjson.loads(reply.body)["error"]["code"] == "not_found"
        finally:
            net.apps["n1"][app_module.MEMBER].raft = c.hosts["n1"]
        # A message that is not from the calling node (n0 speaking for n2): 400.
        forged = encode_messages([("n1", Message(MsgType.HEARTBEAT, "n2", "n1", 999))], ID)
        reply = await pool.request("POST", net.urls["n1"], RAFT_PATH, data=forged)
        assert reply.status == 400
        assert c.hosts["n1"].leader("n1")[1] < 999
        await _http.call(pool, "POST", url, data=encode_messages([], ID))  # 204
        assert await propose_on_leader(c, "n1", b"after") is not None
        # A stopped node: its peers' sends fail (503 from the route), they carry on.
        await c.stop("n2")
        await until(lambda: c.leader_of("n2") in ("n0", "n1"), "n2's group moves")
        await propose_on_leader(c, "n2", b"without n2")
        assert c.hosts["n0"].counters["send_failures"] > 0


async def test_a_stopped_hosts_route_answers_503(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 3)
    store = RaftLogStore(tmp_path / "x.sqlite3", "os")
    host = RaftHost("n0", c.groups, store, c._local_send("n0"), lambda g, e: None)
    try:
        with pytest.raises(RaftHostStopped) as info:
            host.receive(encode_messages([], ID))  # never started
        assert isinstance(info.value, NodeUnavailable) and info.value.status == 503
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("proposers", [1, 64])
async def test_throughput_over_http_with_fsync(tmp_path: Path, proposers: int) -> None:
    """Proposals/s committed by 3 hosts x 3 groups over HTTP with fsync, with
    `proposers` callers per group each proposing one at a time, and the mean entries per
    store commit (printed; run with -s)."""
    async with http_cluster(tmp_path, 3, durability="fsync", tick_s=0.1) as (c, _):
        await c.preferred_leaders()
        stop_at = time.monotonic() + 5.0
        done = 0

        async def proposer(g: str, k: int) -> None:
            nonlocal done
            i = 0
            while time.monotonic() < stop_at:
                await c.hosts[g].propose(g, b"%d-%d-" % (k, i) + b"x" * 100)
                done += 1
                i += 1

        commits0 = {n: c.stores[n].commits for n in c.ids}
        entries0 = {n: h.counters["entries_persisted"] for n, h in c.hosts.items()}
        t0 = time.monotonic()
        await asyncio.gather(*(proposer(g, k) for g in c.groups for k in range(proposers)))
        dt = time.monotonic() - t0
        commits = sum(c.stores[n].commits - commits0[n] for n in c.ids)
        entries = sum(h.counters["entries_persisted"] - entries0[n] for n, h in c.hosts.items())
        print(
            f"\n{proposers} proposer(s) per group: {done / dt:,.0f} proposals/s committed; "
            f"{commits} store commits, {entries / max(commits, 1):.1f} entries per commit, "
            f"{commits / dt / 3:.0f} commits/s per node"
        )
        assert done / dt > 50
