"""`RaftHost`: the asyncio driver of every Raft group one node takes part in.

A node runs one Raft group per ring window of the placement, so it is a member of
several groups at once. The host owns one `RaftCore` per group, their logs (all in one
`RaftLogStore` file), a ticker and a transport, and knows nothing of what the entries
mean: a committed entry is handed to the `apply` callback, in log order, once.

The pump. Every input (a tick, a batch of messages from a peer, a proposal) goes into
the host's inbox and wakes the pump: an event, so many inputs in one loop turn wake it
once. One pump round:

  1. feeds the inbox to the cores: messages, then proposals, then ticks (messages
     first, so heartbeats that queued during a slow fsync count before the ticks that
     queued with them);
  2. takes `ready()` from every core that `has_ready()`;
  3. hands the leaders' appends and heartbeats (`SENT_BEFORE_PERSIST`) to the
     transport at once, so followers write their copies while the leader writes its
     own (a leader counts its own log toward a commit only once it is persisted);
  4. applies the committed entries (`apply`), resolving the proposals they answer:
     they were persisted in an earlier round and are committed, so a caller hears
     while this round writes;
  5. persists what must be durable in ONE `store.batch()` (one transaction, one
     fsync), in a worker thread (`asyncio.to_thread`), so the fsync does not block the
     loop; inputs that arrive meanwhile wait in the inbox and go into the next round,
     which is what makes one fsync carry many proposals of many groups (group commit).
     A hard state that moved only its commit index is not worth a write of its own: it
     goes with the next write, or with the next tick's (a restart takes what the state
     machine applied as committed, zdmq/raft/core.py);
  6. hands the rest of the round's messages (answers, votes: promises about this
     node's log) to the transport, per peer;
  7. `advance`s every core it took a `Ready` from;

and repeats while any core has more. Rounds with nothing to persist (heartbeats, their
answers, commits) skip the thread and the store.

Slow rounds. A round's ticks are fed after its messages, and at most half an election
timeout of them at once: a write or a stalled loop that held the pump for longer would
otherwise turn into a burst of ticks with no message between them, which a leader's
CheckQuorum takes for silence (it steps down) and a follower for a dead leader. While
the pump waits for a write, each tick has every group this node leads send its
heartbeats (`RaftCore.heartbeats`, which changes nothing and reads no storage), so a
slow disk on the leader does not look like a dead leader to its followers.

Why the cores see no input between `ready()` and `advance()`. `RaftCore` itself would
take a `step` there (`advance` marks only what that `Ready` held as persisted, checking
the term of the last entry, as etcd's raft does), but a core reads its `GroupLog` while
it steps, and during step 5 the worker thread is writing that `GroupLog` (its SQLite
connection and in-memory caches, which are not safe to read while being written). So
the cores are only ever touched by the pump, on the loop, outside the persist: inputs
wait in the inbox until the round's `advance`. A second `ready()` before `advance()`
cannot happen either, since one round takes one `Ready` per core and advances it.

The transport. All messages of all groups for one peer that a round produces go in one
payload (msgpack, `encode_messages`); at most one send per peer is in flight, and what
queues meanwhile goes in the next payload. A peer's payload is answered in the reply to
its call (`exchange`): the receiver waits (briefly) for the round that takes it and
replies with what that round has for the caller, so an append and its acknowledgement
cost one call. A peer's queue is bounded (messages and
bytes); beyond it messages are dropped, as are those of a send that fails: Raft
retransmits what matters (heartbeats, probes after a rejection), so loss costs time, not
safety. `receive(payload)` decodes and checks a whole payload, then queues it; a payload
that is not well formed, or names a group this node is not in, raises `BadRaftPayload`
(400 on the HTTP route) and changes nothing.

Lost stores. Every payload carries the sender's store identity (`RaftLogStore.identity`,
new with every new store file). The host records each peer's in its store (`PeerBook`,
zdmq/raft/identity.py); a peer seen with another identity than the recorded one lost
its store, and goes on probation here in every group the two share: its votes and
acknowledgements do not count and it gets no vote, until it catches up with this node
as leader (`judge_ack`), or this node's current leader reports that it lifted it (a
leader adds a `LiftReport` per member whose store it cleared to its payloads to the
group's other members, for `report_ticks` from the start of its term and from each
lift). The cores also run with
`store_guard` and keep their `proven` / `told` state in the store, so a node whose own
store is new does not vouch for a candidate missing what it was told is committed.
zdmq/raft/identity.py says why this keeps committed entries, and under which faults.

Leadership. A node that is its group's preferred leader campaigns as soon as its host
starts; and every few ticks a leader that is not its group's preferred leader hands
leadership to it (`transfer_leadership`) once the preferred node is caught up (its
matched index is the leader's last) and was heard from in the current quorum round. So
leadership spreads one group per node and comes back to a node that restarts.

Compaction and snapshots (given `snapshots`, the state machine's side, and
`compact_entries`). At the start of a pump round, a group whose log holds
2 * `compact_entries` applied entries past its last compaction (or, with
`compact_bytes`, entries holding 2 * `compact_bytes` bytes of data, once at least 64
are applied) has its state made durable (`snapshots.checkpoint`: the state file is not
fsynced as it is applied), and its log compacted up to `compact_entries` entries short
of the index that checkpoint returned (fewer if those hold more than `compact_bytes`),
so a follower a little behind still catches up from the log. A follower
whose core asks for a snapshot (the leader compacted what it needs) pulls one from that
leader (`snapshots.pull`, a task beside the pump, one per group at a time); at the next
round the core decides (`RaftCore.restore`): a stale snapshot is dropped, otherwise the
host installs the state (`snapshots.install`: the state file replaced atomically) and
then resets the stored log after it (`GroupLog.restore`), before the core takes another
input. A crash between the two leaves a state ahead of the log, which the state
machine's owner resets at start (zdmq/server/replicas.py): the state, never a mix.

An `apply` that raises is a bug in the state machine: the host logs it, marks itself
failed (`failed`) and stops; it never skips an entry. A storage failure stops it the
same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgpack

from zdmq import _http
from zdmq.errors import BadRequest, NodeUnavailable
from zdmq.raft.core import (
    SENT_BEFORE_PERSIST,
    Conf,
    ConfChange,
    ConfChangeRefused,
    Message,
    MsgType,
    NotCommitted,
    NotLeader,
    RaftCore,
    Ready,
    Role,
)
from zdmq.raft.identity import LiftReport, readded, report_current
from zdmq.raft.sqlite_storage import GroupLog, RaftLogStore
from zdmq.raft.storage import Entry, HardState, SnapshotMeta

__all__ = [
    "RAFT_CONTENT_TYPE",
    "RAFT_PATH",
    "BadRaftPayload",
    "PulledSnapshot",
    "RaftHost",
    "RaftHostStopped",
    "SnapshotHooks",
    "UnknownGroup",
    "decode_messages",
    "decode_payload",
    "encode_messages",
    "http_sender",
]

log = logging.getLogger("zdmq.raft")
_perf_counter = time.perf_counter

#: The node-to-node route a payload is posted to.
RAFT_PATH = "/v1/internal/raft"
RAFT_CONTENT_TYPE = "application/vnd.zdmq.raft+msgpack"

#: Carries a payload to a peer; returns the peer's answer payload (`exchange`), if any.
Send = Callable[[str, bytes], Awaitable[bytes | None]]
#: How long a node waits for its round before it replies to a peer's payload without
#: its answers (`RaftHost.exchange`): about one quick round (a write and its fsync).
ANSWER_WAIT_S = 0.003
Apply = Callable[[str, Entry], Any]

# ---- wire encoding --------------------------------------------------------------------------
# A payload is the msgpack array [identity, messages] or [identity, messages, reports]:
# `identity` is the sender's store identity (`RaftLogStore.identity`, 1 to 64 characters
# of [0-9A-Za-z_-]; see zdmq/raft/identity.py for what the receiver does with it),
# `reports` (only with at least one message; the messages' `src` sent them) an array of
#   [group, peer, peer_identity, index, term]
# (`LiftReport`: the sender, leading `group` in `term`, lifted the probation of `peer`,
# whose store `peer_identity` acknowledged up to `index` in that term), `messages` an array of
#   [group, type, src, dst, term, index, log_term, entries, commit, reject, reject_hint, force]
# with `type` a small integer (_TYPE_CODES) and `entries` an array of [term, index, data]
# (data: bin, or nil for a leader's empty entry). Every message of a payload has the
# same `src`: a payload comes from one node.

_TYPE_CODES: dict[MsgType, int] = {t: i for i, t in enumerate(MsgType)}
_CODE_TYPES: tuple[MsgType, ...] = tuple(MsgType)
_FIELDS = 12
_MAX_INT = 2**63 - 1
_IDENTITY = re.compile(r"[0-9A-Za-z_-]{1,64}")


class BadRaftPayload(BadRequest):
    """A Raft payload that is not well formed, or is for a group or node it cannot be for."""


class UnknownGroup(KeyError):
    """A group this host is not a member of."""


class RaftHostStopped(NodeUnavailable):
    """The host is stopped (or failed): it takes no proposals and no messages."""


def _pack_message(packer: msgpack.Packer, group: str, m: Message) -> bytes:
    out: bytes = packer.pack(
        [
            group,
            _TYPE_CODES[m.type],
            m.src,
            m.dst,
            m.term,
            m.index,
            m.log_term,
            [[e.term, e.index, e.data] for e in m.entries],
            m.commit,
            m.reject,
            m.reject_hint,
            m.force,
        ]
    )
    return out


def _pack_report(packer: msgpack.Packer, r: LiftReport) -> bytes:
    out: bytes = packer.pack([r.group, r.peer, r.identity, r.index, r.term])
    return out


def _join_payload(
    packer: msgpack.Packer,
    identity: str,
    packed: Sequence[bytes],
    reports: Sequence[bytes] = (),
) -> bytes:
    """One payload from its sender's store identity, messages packed one by one
    (`_pack_message`) and lift reports (`_pack_report`; none: the payload has 2 parts)."""
    head = bytes(packer.pack_array_header(3 if reports else 2)) + packer.pack(identity)
    body = bytes(packer.pack_array_header(len(packed))) + b"".join(packed)
    if reports:
        body += bytes(packer.pack_array_header(len(reports))) + b"".join(reports)
    return head + body


def encode_messages(
    messages: Sequence[tuple[str, Message]],
    identity: str,
    reports: Sequence[LiftReport] = (),
) -> bytes:
    """A payload of (group id, message) pairs from the store `identity`, with `reports`
    (whose `src` must be the messages')."""
    packer = msgpack.Packer(use_bin_type=True)
    return _join_payload(
        packer,
        identity,
        [_pack_message(packer, g, m) for g, m in messages],
        [_pack_report(packer, r) for r in reports],
    )


def _int(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v <= _MAX_INT:
        raise BadRaftPayload(f"raft payload: {what}: expected a non-negative integer")
    return v


def _str(v: Any, what: str) -> str:
    if type(v) is not str:
        raise BadRaftPayload(f"raft payload: {what}: expected a string")
    return v


def _bool(v: Any, what: str) -> bool:
    if type(v) is not bool:
        raise BadRaftPayload(f"raft payload: {what}: expected a boolean")
    return v


def decode_messages(payload: bytes) -> tuple[str, list[tuple[str, Message]]]:
    """The sender's store identity and the (group id, message) pairs of a payload
    (`decode_payload` without the reports)."""
    identity, msgs, _ = decode_payload(payload)
    return identity, msgs


def decode_payload(
    payload: bytes,
) -> tuple[str, list[tuple[str, Message]], list[LiftReport]]:
    """The sender's store identity, the (group id, message) pairs and the lift reports
    of a payload; `BadRaftPayload` unless the identity, every message and every report
    are well formed (types, one `src` for all messages, and an append's entries
    contiguous after its `index`, of terms between its `log_term` and its `term`;
    reports only with a message, whose `src` sent them)."""
    try:
        top = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for bad input
        raise BadRaftPayload(f"raft payload: not msgpack: {type(e).__name__}") from None
    if type(top) is not list or len(top) not in (2, 3):
        raise BadRaftPayload("raft payload: expected [identity, messages(, reports)]")
    identity, items = top[0], top[1]
    raw_reports = top[2] if len(top) == 3 else []
    if type(identity) is not str or not _IDENTITY.fullmatch(identity):
        raise BadRaftPayload("raft payload: identity: expected 1 to 64 characters of [0-9A-Za-z_-]")
    if type(items) is not list:
        raise BadRaftPayload("raft payload: expected an array of messages")
    out: list[tuple[str, Message]] = []
    for k, item in enumerate(items):
        where = f"messages[{k}]"
        if type(item) is not list or len(item) != _FIELDS:
            raise BadRaftPayload(f"raft payload: {where}: expected an array of {_FIELDS}")
        group, code, src, dst, term, index, log_term, raw_entries, commit, rej, hint, force = item
        code = _int(code, f"{where}.type")
        if code >= len(_CODE_TYPES):
            raise BadRaftPayload(f"raft payload: {where}.type: unknown type {code}")
        term = _int(term, f"{where}.term")
        index = _int(index, f"{where}.index")
        log_term = _int(log_term, f"{where}.log_term")
        if type(raw_entries) is not list:
            raise BadRaftPayload(f"raft payload: {where}.entries: expected an array")
        entries: list[Entry] = []
        prev_term = log_term
        for j, raw in enumerate(raw_entries):
            if type(raw) is not list or len(raw) != 3:
                raise BadRaftPayload(
                    f"raft payload: {where}.entries[{j}]: expected [term, index, data]"
                )
            e_term = _int(raw[0], f"{where}.entries[{j}].term")
            e_index = _int(raw[1], f"{where}.entries[{j}].index")
            data = raw[2]
            if data is not None and type(data) is not bytes:
                raise BadRaftPayload(f"raft payload: {where}.entries[{j}].data: expected bytes")
            if e_index != index + 1 + j or not prev_term <= e_term <= term:
                raise BadRaftPayload(f"raft payload: {where}.entries[{j}]: out of sequence")
            prev_term = e_term
            entries.append(Entry(e_term, e_index, data))
        src = _str(src, f"{where}.src")
        if out and src != out[0][1].src:
            raise BadRaftPayload(f"raft payload: {where}.src: not the src of messages[0]")
        out.append(
            (
                _str(group, f"{where}.group"),
                Message(
                    _CODE_TYPES[code],
                    src,
                    _str(dst, f"{where}.dst"),
                    term,
                    index=index,
                    log_term=log_term,
                    entries=tuple(entries),
                    commit=_int(commit, f"{where}.commit"),
                    reject=_bool(rej, f"{where}.reject"),
                    reject_hint=_int(hint, f"{where}.reject_hint"),
                    force=_bool(force, f"{where}.force"),
                ),
            )
        )
    if type(raw_reports) is not list:
        raise BadRaftPayload("raft payload: reports: expected an array")
    if raw_reports and not out:
        raise BadRaftPayload("raft payload: reports without a message to name their sender")
    reports: list[LiftReport] = []
    for k, raw in enumerate(raw_reports):
        where = f"reports[{k}]"
        if type(raw) is not list or len(raw) != 5:
            raise BadRaftPayload(
                f"raft payload: {where}: expected [group, peer, identity, index, term]"
            )
        group, peer, peer_id, r_index, r_term = raw
        if type(peer_id) is not str or not _IDENTITY.fullmatch(peer_id):
            raise BadRaftPayload(f"raft payload: {where}.identity: not a store identity")
        reports.append(
            LiftReport(
                out[0][1].src,
                _str(group, f"{where}.group"),
                _str(peer, f"{where}.peer"),
                peer_id,
                _int(r_index, f"{where}.index"),
                _int(r_term, f"{where}.term"),
            )
        )
    return identity, out, reports


def http_sender(pool: _http.HttpPool, urls: Mapping[str, str], *, timeout_s: float = 1.0) -> Send:
    """The `send` of a `RaftHost` over HTTP: POSTs a payload to `<url of peer>` +
    `RAFT_PATH` through `pool` (a node's pool signs node auth) and returns the peer's
    answer payload (a 200's body; None for a 204). A failed call raises (the host
    drops that payload)."""
    headers = {"Content-Type": RAFT_CONTENT_TYPE}
    # `urls` may gain peers (a node that joined the cluster): looked up at each send.
    targets: dict[str, str] = {}

    async def send(peer: str, payload: bytes) -> bytes | None:
        url = urls[peer]
        target = targets.get(url)
        if target is None:
            target = targets[url] = url.rstrip("/") + RAFT_PATH
        reply = await _http.call(
            pool, "POST", target, data=payload, headers=headers, timeout_s=timeout_s
        )
        return reply.body if reply.status == 200 and reply.body else None

    return send


# ---- snapshots ------------------------------------------------------------------------------

# Applied entries past the last compaction below which the byte bound does not compact
# (each compaction costs a checkpoint of the state, an fsync or two).
_MIN_COMPACTION = 64
# A follower whose match trails its leader's commit by more than this many entries at two
# checks in a row is behind; the leader logs when it has caught up (reached the commit).
_BEHIND_ENTRIES = 100
_CATCH_UP_CHECK_TICKS = 5


@dataclass(frozen=True, slots=True)
class PulledSnapshot:
    """A snapshot of `group`'s state pulled from `src` into the local file `path`,
    holding the log up to `index` (an entry of `term`), when the group's configuration
    was `conf` (None: the state records none, its first members all vote)."""

    group: str
    src: str
    index: int
    term: int
    path: Path
    conf: Conf | None = None


class SnapshotHooks(Protocol):
    """The state machine's side of compaction and snapshots (zdmq/server/replicas.py)."""

    def checkpoint(self, group: str) -> int:
        """Makes `group`'s state durable; returns the log index it now holds durably
        (0: none, nothing is compacted)."""
        ...

    async def pull(self, group: str, src: str) -> PulledSnapshot:
        """Copies `src`'s snapshot of `group` into a local file (synced); raises if it
        cannot."""
        ...

    async def install(self, snap: PulledSnapshot) -> None:
        """Replaces `group`'s state with the snapshot, atomically, and reloads it."""
        ...

    def discard(self, snap: PulledSnapshot) -> None:
        """Deletes a pulled snapshot that is not installed."""
        ...


# ---- the host -------------------------------------------------------------------------------


class _Peer:
    """A peer's outgoing messages: packed, waiting for the send in flight to end."""

    __slots__ = ("failed_at", "ok_at", "queue", "queued_bytes", "sending_since", "task")

    def __init__(self) -> None:
        self.queue: list[bytes] = []
        self.queued_bytes = 0
        self.task: asyncio.Task[None] | None = None
        # When the send in flight began (None: none), the last send that failed, the
        # last that was answered (monotonic seconds).
        self.sending_since: float | None = None
        self.failed_at = 0.0
        self.ok_at = 0.0


def _at_or_below(upto: int, index: int, _until: int) -> bool:
    return index <= upto


class _Proposal:
    __slots__ = ("data", "future", "group")

    def __init__(self, group: str, data: bytes | ConfChange, future: asyncio.Future[Any]) -> None:
        self.group = group
        self.data = data
        self.future = future


class RaftHost:
    """Drives the Raft groups `groups` (group id -> member node ids) of node `node_id`.

    `store` holds every group's log (the host writes it; the caller opens and closes
    it). `send(peer, payload)` carries a payload to a peer's `receive`. `apply(group,
    entry)` is called for every committed entry after `applied[group]` (what the state
    machine holds durably already), in log order, once per entry in the host's lifetime,
    including the empty entry each leader appends when its term starts (`data` None), so
    the state machine can record its applied index; its return value is the result of
    the `propose` that made the entry, if it was made here.

    Time is `tick_s` seconds a tick; a follower campaigns after 1 to 2 times
    `election_ticks` without a leader, a leader heartbeats every `heartbeat_ticks`.
    `preferred` maps a group to its preferred leader (default: the member whose id is
    the group id, if any); a leader checks every `transfer_check_ticks` whether to hand
    over to it. Bounds: `max_queued_messages` and `max_queued_bytes` per peer (beyond
    them a message is dropped), `max_payload_bytes` per payload (past the first
    message), `max_inbox` received messages waiting for the pump. A leader reports the
    stores it cleared for `report_ticks` from the start of its term and from each lift
    (zdmq/raft/identity.py).
    """

    def __init__(
        self,
        node_id: str,
        groups: Mapping[str, Sequence[str]],
        store: RaftLogStore,
        send: Send,
        apply: Apply,
        applied: Mapping[str, int] | None = None,
        *,
        tick_s: float = 0.1,
        election_ticks: int = 10,
        heartbeat_ticks: int = 1,
        rng: random.Random | None = None,
        preferred: Mapping[str, str] | None = None,
        transfer_check_ticks: int = 3,
        max_queued_messages: int = 10_000,
        max_queued_bytes: int = 32 * 1024 * 1024,
        max_payload_bytes: int = 4 * 1024 * 1024,
        max_inbox: int = 100_000,
        report_ticks: int = 3000,
        outcome_ticks: int | None = None,
        snapshots: SnapshotHooks | None = None,
        compact_entries: int = 0,
        compact_bytes: int = 0,
        confs: Mapping[str, Conf] | None = None,
    ) -> None:
        assert tick_s > 0 and transfer_check_ticks >= 1
        self.node_id = node_id
        self.tick_s = tick_s
        self.store = store
        self._send = send
        self._apply = apply
        self.transfer_check_ticks = transfer_check_ticks
        self._max_ticks = max(1, election_ticks // 2)
        # A node whose ticks stopped for longer than this (a pause, a blocked loop) may
        # have been replaced as leader meanwhile (a follower that has not heard from its
        # leader for an election timeout may elect another) and not know it yet: it
        # serves nothing from the moment the stall shows, and its leaders step down
        # (`serves`, `RaftCore.step_down`).
        self._stall_s = tick_s * election_ticks * 0.7
        self._tick_at = time.monotonic()
        self._stalled = False
        self.max_queued_messages = max_queued_messages
        self.max_queued_bytes = max_queued_bytes
        self.max_payload_bytes = max_payload_bytes
        self.max_inbox = max_inbox
        self.report_ticks = report_ticks
        #: How long a member that stopped leading waits for its proposals' outcome.
        self.outcome_ticks = 2 * election_ticks if outcome_ticks is None else outcome_ticks
        self._snapshots = snapshots
        #: Applied entries a compaction keeps behind the durable state (0: never compacts).
        self.compact_entries = compact_entries if snapshots is not None else 0
        #: The data bytes a compaction keeps at most behind the durable state (0: no bound).
        self.compact_bytes = compact_bytes
        # Group -> the pull of a snapshot in flight; the pulls done, for the next round.
        self._pulling: dict[str, asyncio.Task[None]] = {}
        self._pulled: dict[str, PulledSnapshot] = {}
        self._rng = rng if rng is not None else random.Random()
        self._election_ticks = election_ticks
        self._heartbeat_ticks = heartbeat_ticks
        applied = applied or {}
        confs = confs or {}
        self.members: dict[str, tuple[str, ...]] = {}
        self.preferred: dict[str, str | None] = {}
        self._preferred_given = dict(preferred) if preferred is not None else None
        self._cores: dict[str, RaftCore] = {}
        self._logs: dict[str, GroupLog] = {}
        # The configuration each core was last seen using (see `_sync_members`).
        self._confs: dict[str, Conf] = {}
        # Groups to stop driving at the start of the next round (`remove_group`).
        self._removing: set[str] = set()
        # Leadership hand-overs asked for (`transfer`): (group, to), for the next round.
        self._transfers: list[tuple[str, str]] = []
        self.identity = store.identity
        #: Peers' store identities and probations (zdmq/raft/identity.py), kept in `store`.
        self.book = store.peer_book()
        self._self_states = store.self_states()
        self._peers: dict[str, _Peer] = {}
        # Peer -> the groups this node shares with it.
        self._shared: dict[str, list[str]] = {}
        self._packer = msgpack.Packer(use_bin_type=True)
        # Inputs waiting for the pump (see the module docstring).
        # (group, message or lift report, the sender's store identity)
        self._inbox: deque[tuple[str, Message | LiftReport, str]] = deque()
        # Group -> (the term this node leads it in, the tick its lift reports end at).
        self._reporting: dict[str, tuple[int, int]] = {}
        self._proposals: deque[_Proposal] = deque()
        self._ticks = 0  # ticks not yet given to the cores
        self._ticked = 0  # ticks given, in all
        # Proposals made here awaiting their entry's apply: group -> index -> (term, future).
        self._pending: dict[str, dict[int, tuple[int, asyncio.Future[Any]]]] = {}
        # Those made in a term this member no longer leads: group -> index -> the tick
        # their wait for an outcome ends at.
        self._deposed: dict[str, dict[int, int]] = {}
        # The last entry handed to the state machine, per group (the core hears of it
        # at the round's end).
        self._applied_to: dict[str, int] = {}
        # The term each group is led by this member in, None while it is not leader.
        self._lead_term: dict[str, int | None] = {}
        # Whether the pump waits for a write (see `_beat_while_writing`).
        self._writing = False
        # Hard states that moved only their commit index, not written yet: group -> state.
        self._lazy_hard: dict[str, HardState] = {}
        # Peers' payloads waiting for this node's answer (`exchange`): those received
        # before the round in progress took the inbox, and those received since.
        self._answering: dict[str, list[asyncio.Future[bytes | None]]] = {}
        self._answering_next: dict[str, list[asyncio.Future[bytes | None]]] = {}
        self._wake: asyncio.Event | None = None
        # Set by `hand_over`: every group led here is handed to another member.
        self._leaving = False
        self._pump_task: asyncio.Task[None] | None = None
        self._tick_task: asyncio.Task[None] | None = None
        self.running = False
        self._started = False
        #: Why the host stopped on its own (an `apply` that raised, a storage failure).
        self.failed: str | None = None
        #: For metrics; see the keys.
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "pumps",  # rounds that took at least one Ready
                "fsync_batches",  # store batches (one commit each)
                "entries_persisted",
                "messages_sent",
                "messages_received",
                "messages_dropped",  # over a peer's queue bound, a failed send, a full inbox
                "messages_other_groups",  # for a group this node is not (or no more) in
                "payloads_sent",
                "payloads_answered",  # payloads sent in the reply to a peer's (`exchange`)
                "heartbeats_while_writing",  # sent by a leader while a slow write ran
                "bad_answers",  # answers refused as not well formed
                "send_failures",
                "proposals",  # taken by a core as leader
                "proposals_overwritten",  # never committed: another leader's entry won
                "proposals_unknown",  # its member deposed and no outcome seen in time
                "applied",
                "elections_won",
                "transfers",  # leadership handed to the preferred leader
                "stalls",  # ticks late by most of an election timeout: leaders stepped down
                "replaced_peers",  # a peer seen with a new store identity
                "probations_lifted",
                "probations_lifted_by_report",  # lifted on its leader's report
                "compactions",  # a group's log compacted
                "snapshot_pulls_failed",
                "snapshots_installed",
                "snapshots_dropped",  # pulled, found stale when it arrived
                "leader_changes",  # a leader seen that differs from the one known before
            ),
            0,
        )
        #: Per group, for metrics: leaders seen change, snapshots installed.
        self.leader_changes: dict[str, int] = {}
        self.snapshot_installs: dict[str, int] = {}
        #: Called after each write of the log with (entries written, seconds it took).
        self.on_persist: Callable[[int, float], None] | None = None
        # What the last round left each core at: (role, leader, elections started); the
        # last leader known per group; followers seen behind (group, peer) -> their match.
        self._watched: dict[str, tuple[Role, str | None, int]] = {}
        self._known_leader: dict[str, str | None] = {}
        self._lagging: dict[tuple[str, str], int] = {}
        self._behind: dict[tuple[str, str], int] = {}
        for gid, members in groups.items():
            conf = confs.get(gid)
            if conf is None and node_id not in members:
                raise ValueError(f"group {gid!r}: {node_id!r} is not one of its members")
            self._open_group(gid, members, conf, applied.get(gid, 0))

    # -- groups ---------------------------------------------------------------------------

    def _open_group(
        self, gid: str, members: Sequence[str], conf: Conf | None, applied: int
    ) -> None:
        """Starts driving group `gid`: its core on its log, `applied` entries held by the
        state machine, whose configuration then was `conf` (None: `members` all vote)."""
        self._logs[gid] = glog = self.store.group(gid)
        proven, told = self._self_states.get(gid, (False, (0, 0)))
        core = self._cores[gid] = RaftCore(
            self.node_id,
            members,
            glog,
            self._rng,
            election_ticks=self._election_ticks,
            heartbeat_ticks=self._heartbeat_ticks,
            applied=applied,
            store_guard=True,
            proven=proven,
            told=told,
            conf=conf,
        )
        self.members[gid] = tuple(members) if conf is None else ()
        self._pending[gid] = {}
        self._deposed[gid] = {}
        self._lead_term[gid] = None
        self.leader_changes.setdefault(gid, 0)
        self.snapshot_installs.setdefault(gid, 0)
        self._watched[gid] = (core.role, core.leader, core.elections)
        self._known_leader[gid] = None
        self._sync_members(gid)

    def _sync_members(self, gid: str) -> None:
        """Takes the configuration group `gid`'s core uses now (it changes as entries
        are appended, and back when they are overwritten): its members, the peers this
        node sends to, their probations, and the preferred leader."""
        core = self._cores[gid]
        conf = core.conf
        self._confs[gid] = conf
        members = conf.members() | {self.node_id}
        old = self.members.get(gid, ())
        self.members[gid] = tuple(m for m in old if m in members) + tuple(
            sorted(members - set(old))
        )
        for p in members - {self.node_id}:
            if p not in self._peers:
                self._peers[p] = _Peer()
        self._reshare()
        core.probation = self.book.on_probation(gid, self.members[gid])
        given = self._preferred_given
        pref = given.get(gid) if given is not None else gid
        self.preferred[gid] = pref if pref in conf.voters else None

    def set_preferred(self, gid: str, node: str) -> None:
        """`node` is now group `gid`'s preferred leader (the cluster map changed)."""
        if self._preferred_given is None:
            self._preferred_given = {}
        self._preferred_given[gid] = node
        conf = self._confs.get(gid)
        if conf is not None:
            self.preferred[gid] = node if node in conf.voters else None

    def _reshare(self) -> None:
        """Recomputes, for each peer, the groups this node shares with it."""
        self._shared = {p: [g for g, ms in self.members.items() if p in ms] for p in self._peers}

    def add_group(self, gid: str, conf: Conf) -> None:
        """Starts driving a group this node was added to (as a learner, usually): its
        log starts empty, and the leader catches it up (a snapshot, then the log)."""
        if gid in self._cores:
            return
        if self.node_id not in conf.members():
            raise ValueError(f"group {gid!r}: {self.node_id!r} is not one of its members")
        self._open_group(gid, sorted(conf.voters), conf, 0)
        self._wakeup()

    def remove_group(self, gid: str) -> None:
        """Stops driving a group this node was removed from (its removal committed) and
        drops its log, at the start of the pump's next round (not while it writes); what
        waited on it fails with `NotLeader`."""
        if gid in self._cores:
            self._removing.add(gid)
            self._wakeup()

    def _drop_removed(self) -> None:
        for gid in sorted(self._removing):
            self._drop_group(gid)
        self._removing.clear()

    def _forget_departed(self, gid: str, conf: Conf, readded: frozenset[str] = frozenset()) -> None:
        """A committed configuration of `gid` leaves out the peers that left it: their
        probations there go, and, where they share no other group with this node, their
        store identities (identity.PeerBook.forget); so do those of `readded`, peers the
        entries a snapshot stands for removed and added again (identity.readded)."""
        book = self.book
        # (A member replaying its log applies old configurations again: a peer the
        # configuration in use names is no departed one.)
        members = conf.members() | self._cores[gid].conf.members()
        held = {p for g, p in (*book.probation, *book.cleared) if g == gid}
        for peer in ((held | set(book.identities)) - members | readded) - {self.node_id}:
            elsewhere = any(peer in c.members() for g, c in self._confs.items() if g != gid)
            book.forget(gid, peer, last=not elsewhere)

    def _drop_group(self, gid: str) -> None:
        core = self._cores.pop(gid, None)
        if core is None:
            return
        for key in [k for k in self.book.probation if k[0] == gid]:
            del self.book.probation[key]
        for key in [k for k in self.book.cleared if k[0] == gid]:
            del self.book.cleared[key]
        self._self_states.pop(gid, None)
        for _, fut in self._pending.pop(gid, {}).values():
            if not fut.done():
                fut.set_exception(NotLeader(core.leader, core.term))
        for d in (self._deposed, self._lead_term, self._watched, self._known_leader):
            d.pop(gid, None)
        for d2 in (self._confs, self.members, self.preferred, self._logs, self._lazy_hard):
            d2.pop(gid, None)
        self._applied_to.pop(gid, None)
        self._reporting.pop(gid, None)
        pull = self._pulling.pop(gid, None)
        if pull is not None:
            pull.cancel()
        self._pulled.pop(gid, None)
        self._inbox = deque(item for item in self._inbox if item[0] != gid)
        self.store.drop_group(gid)
        self._reshare()

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the ticker and the pump on the running loop; a node campaigns at once
        for the groups it is the preferred leader of."""
        assert not self._started, "a host starts once (make a new one to restart)"
        self._started = self.running = True
        self._wake = asyncio.Event()
        for gid, core in self._cores.items():
            if self.preferred[gid] == self.node_id:
                core.campaign()
        self._pump_task = asyncio.create_task(self._pump_loop(), name=f"raft-pump-{self.node_id}")
        self._tick_task = asyncio.create_task(self._tick_loop(), name=f"raft-tick-{self.node_id}")
        self._wake.set()

    async def stop(self) -> None:
        """Stops ticking, lets a round in progress finish (its persist cannot be cut
        short), cancels sends in flight and fails the proposals still waiting with
        `RaftHostStopped`. The store stays open (the caller closes it)."""
        self.running = False
        if self._tick_task is not None:
            self._tick_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick_task
        if self._pump_task is not None and self._pump_task is not asyncio.current_task():
            assert self._wake is not None
            self._wake.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
        for peer in self._peers.values():
            if peer.task is not None:
                peer.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await peer.task
            peer.queue.clear()
            peer.queued_bytes = 0
        await self._stop_pulls()
        self._fail_all(RaftHostStopped(f"the Raft host of {self.node_id} is stopped"))

    def _fail_all(self, exc: Exception) -> None:
        for waiting in (self._answering, self._answering_next):
            for futs in waiting.values():
                for fut in futs:
                    if not fut.done():
                        fut.set_result(None)
            waiting.clear()
        for p in self._proposals:
            if not p.future.done():
                p.future.set_exception(exc)
        self._proposals.clear()
        self._inbox.clear()
        for pending in self._pending.values():
            for _, fut in pending.values():
                if not fut.done():
                    fut.set_exception(exc)
            pending.clear()

    def _check_running(self) -> None:
        if not self.running:
            why = f": {self.failed}" if self.failed else ""
            raise RaftHostStopped(f"the Raft host of {self.node_id} is stopped{why}")

    # -- inputs ---------------------------------------------------------------------------

    def propose(self, group: str, data: bytes) -> asyncio.Future[Any]:
        """Proposes `data` to `group`; the future resolves to `apply`'s result once the
        entry is applied here.

        Raises `NotLeader(leader, term)` at once when this member is not the group's
        leader, `UnknownGroup` for a group this node is not in, and `RaftHostStopped`.

        A member that stops leading before the entry is committed keeps waiting for its
        outcome as a follower, up to `outcome_ticks`: the entry is applied here if a
        later leader committed it (a leadership transfer hands over a caught-up log, so
        this is the usual case), and the future resolves as if nothing had happened.
        The future fails with `NotCommitted` (a `NotLeader`) when the core did not take
        the entry (it stopped leading, or began to hand over, before the pump fed it) or
        another leader's entry took its index: it never took effect and may be sent
        again. It fails with
        `NotLeader` when the wait ends with no outcome, or a snapshot replaced the log
        past it, and with `RaftHostStopped` if the host stops first: such an entry may
        still have committed, the caller cannot know, so a retry must be idempotent or
        the caller must accept a duplicate.
        """
        return self._queue_proposal(group, data)

    def propose_conf(self, group: str, change: ConfChange) -> asyncio.Future[Any]:
        """Proposes a change of `group`'s membership (RaftCore.propose_conf: one at a
        time, once this leader committed in its term); the future resolves as `propose`'s
        does once the entry is applied here, or fails with `ConfChangeRefused`."""
        return self._queue_proposal(group, change)

    def _queue_proposal(self, group: str, data: bytes | ConfChange) -> asyncio.Future[Any]:
        """Queues `data` for the pump to give `group`'s core (NotLeader now unless it leads)."""
        self._check_running()
        core = self._core(group)
        if core.role is not Role.LEADER:
            raise NotLeader(core.leader, core.term)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._proposals.append(_Proposal(group, data, fut))
        self._wakeup()
        return fut

    def transfer(self, group: str, to: str) -> None:
        """As `group`'s leader, hands its leadership to voter `to` once `to` is caught up
        (in the pump's next round; NotLeader now if this member does not lead)."""
        self._check_running()
        core = self._core(group)
        if core.role is not Role.LEADER:
            raise NotLeader(core.leader, core.term)
        if to not in core.conf.voters:
            raise ConfChangeRefused(f"{to} is not a voter of group {group}")
        self._transfers.append((group, to))
        self._wakeup()

    def conf(self, group: str) -> Conf:
        """The configuration `group`'s core uses now (its newest, committed or not)."""
        return self._core(group).conf

    def conf_committed(self, group: str) -> bool:
        """Whether the configuration in use is committed (no change under way)."""
        core = self._core(group)
        return core.conf_index <= core.log.committed

    def receive(self, payload: bytes, sender: str | None = None) -> None:
        """Takes a payload from a peer: checked whole (`BadRaftPayload`: not well formed,
        a message not for this node, or from this node, or, when `sender` names the node
        the payload came from (the node credential of the HTTP call), not from `sender`;
        a lift report by another node than `sender`, on its sender or on this node),
        then queued for the pump with the sender's store identity, reports after the
        messages. Messages and reports of a group this node does not drive are dropped
        (membership changes reach the members one by one); the core decides what a
        message from outside a group's configuration is worth. `RaftHostStopped` when
        stopped."""
        self._check_running()
        identity, msgs, reports = decode_payload(payload)
        for _, m in msgs:
            if m.dst != self.node_id:
                raise BadRaftPayload(
                    f"raft payload: a message for {m.dst[:100]!r} reached {self.node_id}"
                )
            if m.src == self.node_id:
                raise BadRaftPayload(f"raft payload: a message of {m.src!r} from itself")
            if sender is not None and m.src != sender:
                raise BadRaftPayload(
                    f"raft payload: a message from {m.src!r} sent by {sender[:100]!r}"
                )
        for r in reports:
            if r.peer in (r.src, self.node_id) or (sender is not None and r.src != sender):
                raise BadRaftPayload(
                    f"raft payload: a report on {r.peer[:100]!r} in group {r.group[:100]!r}"
                )
        self.counters["messages_received"] += len(msgs)
        # A group this node is not in (yet: a learner's host is told after its leader;
        # or no more) is none of its business: its messages are dropped.
        cores = self._cores
        items: list[tuple[str, Message | LiftReport, str]] = [
            (g, m, identity) for g, m in msgs if g in cores
        ]
        if len(items) < len(msgs):
            self.counters["messages_other_groups"] += len(msgs) - len(items)
        items.extend((r.group, r, identity) for r in reports if r.group in cores)
        room = self.max_inbox - len(self._inbox)
        if len(items) > room:
            self.counters["messages_dropped"] += len(items) - max(room, 0)
            items = items[: max(room, 0)]
        self._inbox.extend(items)
        self._wakeup()

    async def exchange(
        self, payload: bytes, sender: str, wait_s: float = ANSWER_WAIT_S
    ) -> bytes | None:
        """`receive` a payload from peer `sender`, then wait (up to `wait_s`) for the pump
        round that takes it, and return what that round has for `sender` (its answers,
        and anything else queued for it) as a payload, None if nothing: so a peer's
        answer rides on the reply to its call, and an exchange costs one call, not two.
        What is not taken in time goes as usual, in a call of this node's own: the
        caller has one call in flight to this node, so a long wait would hold back its
        next payload. So it does not wait at all while a round is writing (under load,
        rounds are long and the calls pipeline instead)."""
        self.receive(payload, sender=sender)
        if sender not in self._peers or self._writing:
            return None  # a round is writing: this payload waits for the next one
        fut: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._answering_next.setdefault(sender, []).append(fut)
        try:
            return await asyncio.wait_for(fut, wait_s)
        except TimeoutError:
            return None

    def _answer(self) -> None:
        """Hands each peer waiting in `exchange` (since before this round) what is queued
        for it, as one payload; the others waiting for the same peer get None."""
        waiting, self._answering = self._answering, {}
        for pid, futs in waiting.items():
            peer = self._peers[pid]
            for fut in futs:
                if fut.done():
                    continue
                if not peer.queue:
                    fut.set_result(None)
                    continue
                payload, n = self._take_payload(pid, peer)
                fut.set_result(payload)
                self.counters["payloads_answered"] += 1
                self.counters["messages_sent"] += n

    async def hand_over(self, timeout_s: float) -> bool:
        """Hands every group this member leads to another member (the most caught-up of
        those it hears from, its preferred leader first), for a graceful stop: waits
        until it leads none, up to `timeout_s`; whether it got there. The groups keep
        serving throughout: no election timeout to wait out."""
        self._leaving = True
        self._wakeup()
        deadline = time.monotonic() + timeout_s
        while any(c.role is Role.LEADER for c in self._cores.values()):
            if time.monotonic() >= deadline or not self.running:
                return False
            await asyncio.sleep(self.tick_s / 4)
        return True

    def _hand_over_all(self) -> None:
        for gid, core in self._cores.items():
            if core.role is not Role.LEADER or core.transferee is not None:
                continue
            pref = self.preferred[gid]
            heard = [
                (pr.match, p == pref, p)
                for p, pr in core.progress.items()
                if p != self.node_id
                and pr.active
                and p not in core.probation
                and p in core.conf.voters
            ]
            if heard:
                to = max(heard)[2]
                log.info("%s hands group %s to %s: it is stopping", self.node_id, gid, to)
                core.transfer_leadership(to)
                self.counters["transfers"] += 1

    def _wakeup(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            if now - self._tick_at > self._stall_s:
                self._stalled = True  # the next round has each leader step down
                self.counters["stalls"] += 1
            self._tick_at = now
            self._ticks += 1
            if self._writing:
                self._beat_while_writing()
            self._wakeup()

    def _beat_while_writing(self) -> None:
        """A tick while the pump waits for a write (a slow fsync): the ticks wait for
        the round to end, but each group this node leads sends its heartbeats now, so
        that its followers, which keep ticking, do not take a slow disk for a dead
        leader and elect another."""
        for gid, core in self._cores.items():
            beats = core.heartbeats()
            for m in beats:
                self._enqueue(gid, m)
            if beats:
                self.counters["heartbeats_while_writing"] += len(beats)
        self._flush_peers()

    # -- what the host knows --------------------------------------------------------------

    def _core(self, group: str) -> RaftCore:
        core = self._cores.get(group)
        if core is None:
            raise UnknownGroup(group)
        return core

    @property
    def groups(self) -> list[str]:
        return list(self._cores)

    def leader(self, group: str) -> tuple[str | None, int]:
        """(the leader this member knows of, or None; its current term)."""
        core = self._core(group)
        return core.leader, core.term

    def is_leader(self, group: str) -> bool:
        return self._core(group).role is Role.LEADER

    def serves(self, group: str) -> bool:
        """Whether this member leads `group` and its state machine holds all that
        was committed before its term. A new leader learns what an earlier one committed
        only when the entry that opens its own term commits; before it has applied that
        entry, a read of its state may miss an acknowledged change (a queue created just
        before a hand-over). Proposals are taken from election on: they apply in order
        after that entry."""
        core = self._core(group)
        if core.role is not Role.LEADER:
            return False
        if self._stalled or time.monotonic() - self._tick_at > self._stall_s:
            return False  # stalled: another may lead now (see _tick_loop)
        return max(core.log.applied, self._applied_to.get(group, 0)) >= core.term_start

    def peer_silent(self, peer: str, after_s: float) -> bool:
        """Whether `peer` stopped answering this node's Raft traffic: a payload to it
        unanswered for over `after_s`, or the last one failed. (False for a peer this
        node sends nothing to: it cannot tell.)"""
        p = self._peers.get(peer)
        if p is None:
            return False
        since = p.sending_since
        return (since is not None and time.monotonic() - since > after_s) or p.failed_at > p.ok_at

    def live_leader(self, group: str, within_ticks: int) -> str | None:
        """The leader this member knows of, if it heard from it in the last
        `within_ticks` ticks (a leader paused or cut off soon falls silent); else None."""
        core = self._core(group)
        return core.leader if core.leader_silent_ticks <= within_ticks else None

    def role(self, group: str) -> Role:
        return self._core(group).role

    def commit_index(self, group: str) -> int:
        return self._core(group).log.committed

    def last_index(self, group: str) -> int:
        return self._core(group).log.last_index()

    def followers(self, group: str) -> dict[str, int]:
        """The leader's view of each follower of `group`: the index up to which the
        follower's log is known to match its own (empty unless this member leads)."""
        core = self._core(group)
        if core.role is not Role.LEADER:
            return {}
        return {p: pr.match for p, pr in core.progress.items() if p != self.node_id}

    def applied_index(self, group: str) -> int:
        return self._core(group).log.applied

    def follower_lags(self, group: str) -> dict[str, int]:
        """As `group`'s leader: its last index minus each follower's match ({} when it
        does not lead)."""
        core = self._core(group)
        if core.role is not Role.LEADER:
            return {}
        last = core.log.last_index()
        return {p: last - pr.match for p, pr in core.progress.items() if p != self.node_id}

    def elections(self, group: str) -> int:
        """Elections this member started in `group` since it started."""
        return self._core(group).elections

    def on_probation(self, group: str) -> frozenset[str]:
        """The members of `group` whose votes and acknowledgements this node does not
        count: their store was replaced and has not caught up (zdmq/raft/identity.py)."""
        return self._core(group).probation

    # -- the pump -------------------------------------------------------------------------

    async def _pump_loop(self) -> None:
        wake = self._wake
        assert wake is not None
        while self.running:
            await wake.wait()
            if not self.running:
                return
            try:
                await self._pump()
            except Exception as e:
                self._die(f"{type(e).__name__}: {e}")
                log.exception("Raft host %s failed", self.node_id)
                return

    def _die(self, why: str) -> None:
        """Stops the host from inside the pump: a bug or a storage failure."""
        self.failed = why
        self.running = False
        if self._tick_task is not None:
            self._tick_task.cancel()
        for peer in self._peers.values():
            if peer.task is not None:
                peer.task.cancel()
        self._fail_all(RaftHostStopped(f"the Raft host of {self.node_id} failed: {why}"))

    async def _pump(self) -> None:
        wake = self._wake
        assert wake is not None
        while self.running:
            wake.clear()
            if self._removing:
                self._drop_removed()
            if self._pulled or self.compact_entries:
                await self._snapshot_round()
            # Those waiting for an answer to a payload this round takes.
            for pid, futs in self._answering_next.items():
                self._answering.setdefault(pid, []).extend(futs)
            self._answering_next = {}
            ticked = self._feed()
            self._start_pulls()
            work: list[tuple[str, RaftCore, Ready]] = [
                (gid, core, core.ready()) for gid, core in self._cores.items() if core.has_ready()
            ]
            lazy = self._lazy_hard
            if ticked and self._ticked % _CATCH_UP_CHECK_TICKS < ticked:
                self._watch_catch_up()
            if not work and not (lazy and ticked):
                self._answer()
                self._watch()
                return
            if work:
                self.counters["pumps"] += 1
            # 1. A leader's appends and heartbeats leave at once: its followers write
            # their copies while it writes its own (its core counts its own log toward a
            # commit only once `advance` says it is persisted).
            late: list[tuple[str, Message]] = []
            for gid, _, rd in work:
                for m in rd.messages:
                    if m.type in SENT_BEFORE_PERSIST:
                        self._enqueue(gid, m)
                    else:
                        late.append((gid, m))
            if self._flush_peers():
                # One turn of the loop: the send loops write their payloads to the peers'
                # sockets before this round's write starts, so the followers' writes
                # (what a commit waits for) start as early as they can.
                await asyncio.sleep(0)
            # 2. Entries handed out to apply are committed and were persisted in an
            # earlier round: applied now, so a proposal's caller hears while we write.
            for gid, _, rd in work:
                if rd.committed:
                    self._apply_entries(gid, rd.committed)
            # 3. One write for the round. A hard state that moved only its commit index
            # waits for the next write (at the latest at the next tick): a restart
            # takes what the state machine applied as committed.
            writes: list[tuple[GroupLog, Ready]] = []
            for gid, _, rd in work:
                hard = rd.hard_state
                if rd.entries or (hard is not None and not self._commit_only(gid, hard)):
                    writes.append((self._logs[gid], rd))
                    if hard is not None:
                        lazy.pop(gid, None)  # this one is newer
                elif hard is not None:
                    lazy[gid] = hard
            selves = {
                g: (c.proven, c.told)
                for g, c in self._cores.items()
                if self._self_states.get(g, (False, (0, 0))) != (c.proven, c.told)
            }
            if writes or selves or self.book.has_changes() or (lazy and ticked):
                ids, prob, clear = self.book.take_changes()
                hards = [(self._logs[g], h) for g, h in lazy.items()]
                lazy.clear()
                self._writing = True
                started = _perf_counter()
                try:
                    await asyncio.to_thread(self._persist, writes, hards, ids, prob, clear, selves)
                finally:
                    self._writing = False
                self._self_states.update(selves)
                entries = sum(len(rd.entries) for _, rd in writes)
                self.counters["fsync_batches"] += 1
                self.counters["entries_persisted"] += entries
                if self.on_persist is not None:
                    self.on_persist(entries, _perf_counter() - started)
            # 4. What promises this node's log or vote (answers, votes) leaves now: in
            # the reply to a peer's payload that waits for it, else in a call of its own.
            for gid, m in late:
                self._enqueue(gid, m)
            self._answer()
            self._flush_peers()
            for _, core, rd in work:
                core.advance(rd)
            self._check_pending()
            self._watch()

    def _commit_only(self, gid: str, hard: HardState) -> bool:
        """Whether `hard` differs from the hard state last written only in its commit."""
        old = self._logs[gid].hard_state()
        return old.term == hard.term and old.vote == hard.vote

    def _persist(
        self,
        writes: list[tuple[GroupLog, Ready]],
        hards: list[tuple[GroupLog, HardState]],
        ids: dict[str, str | None],
        prob: dict[tuple[str, str], int | None],
        clear: dict[tuple[str, str], str | None],
        selves: dict[str, tuple[bool, tuple[int, int]]],
    ) -> None:
        """(In a worker thread.) Every group's Ready, the hard states that moved only
        their commit index since their last write, what changed in the peer book and in
        each core's `proven` / `told`, in one transaction and one fsync."""
        with self.store.batch():
            for glog, hard in hards:
                glog.set_hard_state(hard)
            for glog, rd in writes:
                glog.persist(rd)
            self.store.save_peer_book(ids, prob, clear)
            self.store.save_self_states(selves)

    def _feed(self) -> int:
        """Gives the inbox to the cores: messages, proposals, then ticks; returns how
        many ticks."""
        cores = self._cores
        inbox = self._inbox
        book = self.book
        while inbox:
            gid, m, identity = inbox.popleft()
            core = cores.get(gid)
            if core is None:
                continue  # removed since it arrived
            if type(m) is LiftReport:
                if book.identities.get(m.src) != identity:
                    self._seen(m.src, identity)
                self._take_report(core, m)
                continue
            assert type(m) is Message
            if book.identities.get(m.src) != identity:
                self._seen(m.src, identity)
            if m.type is MsgType.TIMEOUT_NOW and self._leaving:
                continue  # a member that is stopping takes no leadership handed to it
            if m.src in core.probation and m.type is MsgType.APPEND_RESP and not m.reject:
                self._maybe_lift(gid, core, m)
            core.step(m)
        proposals = self._proposals
        while proposals:
            p = proposals.popleft()
            if p.future.done():  # the caller gave up
                continue
            taker = cores.get(p.group)
            if taker is None:  # removed meanwhile
                p.future.set_exception(UnknownGroup(p.group))
                continue
            core = taker
            try:
                if isinstance(p.data, ConfChange):
                    index = core.propose_conf(p.data)
                else:
                    index = core.propose(p.data)
            except NotLeader as e:  # deposed, or handing over, since `propose`: not taken
                p.future.set_exception(NotCommitted(e.leader, e.term))
                continue
            except ConfChangeRefused as e:
                p.future.set_exception(e)
                continue
            self.counters["proposals"] += 1
            self._pending[p.group][index] = (core.term, p.future)
        transfers, self._transfers = self._transfers, []
        for gid, to in transfers:
            leader = cores.get(gid)
            if leader is not None and leader.role is Role.LEADER and to in leader.conf.voters:
                leader.transfer_leadership(to)
                self.counters["transfers"] += 1
        if self._leaving:
            self._hand_over_all()
        # The ticks that passed while a round ran count up to half an election timeout:
        # more at once, with no message between them, would look like silence (a
        # leader's CheckQuorum round with nobody heard from, a follower's timeout) when
        # it was only this node that was busy (a slow write, a stalled loop).
        ticks, self._ticks = min(self._ticks, self._max_ticks), 0
        if self._stalled:
            self._stalled = False
            for core in cores.values():
                core.step_down()
        for _ in range(ticks):
            for core in cores.values():
                core.tick()
            self._ticked += 1
            if self._ticked % self.transfer_check_ticks == 0:
                self._hand_to_preferred()
        self._check_pending()
        return ticks

    # -- compaction and snapshots ---------------------------------------------------------

    def log_bounds(self, group: str) -> tuple[int, int]:
        """(the index `group`'s log is compacted up to, its last index)."""
        glog = self._logs[group]
        return glog.snapshot().index, glog.last_index()

    def _start_pulls(self) -> None:
        """Starts pulling a snapshot for each core that asked for one (one pull per group
        at a time; a core asks again every heartbeat until it is caught up)."""
        if self._snapshots is None:
            return
        for gid, core in self._cores.items():
            req = core.take_snapshot_request()
            if req is None or gid in self._pulling or gid in self._pulled:
                continue
            log.info("%s pulls a snapshot of group %s from %s", self.node_id, gid, req.src)
            self._pulling[gid] = asyncio.create_task(self._pull(gid, req.src))

    async def _pull(self, gid: str, src: str) -> None:
        hooks = self._snapshots
        assert hooks is not None
        try:
            snap = await hooks.pull(gid, src)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.counters["snapshot_pulls_failed"] += 1
            log.warning(
                "%s: pulling group %s's snapshot from %s failed: %r", self.node_id, gid, src, e
            )
        else:
            if self.running:
                self._pulled[gid] = snap
                self._wakeup()
            else:
                hooks.discard(snap)
        finally:
            self._pulling.pop(gid, None)

    async def _stop_pulls(self) -> None:
        for task in list(self._pulling.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._snapshots is not None:
            for snap in self._pulled.values():
                self._snapshots.discard(snap)
        self._pulled.clear()

    async def _snapshot_round(self) -> None:
        """(In the pump, between rounds.) Installs the snapshots pulled (or drops the
        stale ones), then compacts the logs that grew past the threshold."""
        hooks = self._snapshots
        assert hooks is not None
        pulled, self._pulled = self._pulled, {}
        for gid, snap in pulled.items():
            core = self._cores.get(gid)  # None: the group was removed meanwhile
            before = core.committed_conf if core is not None else Conf(frozenset())
            if core is None or not core.restore(snap.index, snap.term, snap.src, conf=snap.conf):
                self.counters["snapshots_dropped"] += 1
                hooks.discard(snap)
                continue
            # The state first, then the log: a crash between leaves the state ahead of
            # the log, which the state's owner resets at start (never a mix).
            await hooks.install(snap)
            await asyncio.to_thread(self._logs[gid].restore, SnapshotMeta(snap.index, snap.term))
            # Proposals the snapshot passed over are never applied here: outcome unknown.
            self._end_waits(gid, functools.partial(_at_or_below, snap.index))
            self._forget_departed(gid, core.conf, readded(before, core.conf))
            self.counters["snapshots_installed"] += 1
            self.snapshot_installs[gid] += 1
            log.info(
                "%s installed %s's snapshot of group %s at %d",
                self.node_id,
                snap.src,
                gid,
                snap.index,
                extra={
                    "event": "snapshot_installed",
                    "group": gid,
                    "src": snap.src,
                    "index": snap.index,
                },
            )
        keep, keep_bytes = self.compact_entries, self.compact_bytes
        if not keep:
            return
        for gid, core in self._cores.items():
            glog = self._logs[gid]
            start = glog.snapshot().index
            applied = core.log.applied - start
            by_bytes = (
                keep_bytes and applied >= _MIN_COMPACTION and (glog.data_bytes() >= 2 * keep_bytes)
            )
            if applied < 2 * keep and not by_bytes:
                continue
            durable = min(hooks.checkpoint(gid), core.log.applied, glog.hard_state().commit)
            if await asyncio.to_thread(self._compact, glog, durable, start):
                self.counters["compactions"] += 1

    def _compact(self, glog: GroupLog, durable: int, start: int) -> bool:
        """(In a worker thread, in the pump.) Compacts `glog` up to `compact_entries`
        entries short of `durable`, or further if those hold more than `compact_bytes`."""
        upto = durable - self.compact_entries
        if self.compact_bytes:
            upto = max(upto, glog.keep_from(durable, self.compact_bytes) - 1)
        if upto <= start:
            return False
        glog.compact(upto)
        return True

    def _seen(self, peer: str, identity: str) -> None:
        """A payload from `peer` with another store identity than the one recorded."""
        shared = self._shared.get(peer, [])
        known = self.book.identities.get(peer)
        # Probation discounts votes and acknowledgements: only where the peer votes (a
        # learner is promoted only once caught up again, from the progress forgotten).
        voting = {
            g: self._cores[g].log.committed for g in shared if peer in self._cores[g].conf.voters
        }
        learning = [g for g in shared if peer in self._cores[g].conf.learners]
        replaced = self.book.see(peer, identity, voting, learning)
        for gid in learning:  # cleared: as leader, it reports the store to the others
            core = self._cores[gid]
            if core.role is Role.LEADER:
                self._reporting[gid] = (core.term, self._ticked + self.report_ticks)
        if known is not None:
            for gid in shared:
                self._cores[gid].forget_progress(peer)
        # (Where it learns, the peer is cleared: a probation it was on there since it
        # voted, before it was removed and added again, goes too.)
        for gid in (*replaced, *learning):
            core = self._cores[gid]
            core.probation = self.book.on_probation(gid, self.members[gid])
        if replaced:
            self.counters["replaced_peers"] += 1
            log.warning(
                "%s: %s has a new store (%s): its votes and acknowledgements do not count "
                "until it catches up in groups %s",
                self.node_id,
                peer,
                identity,
                replaced,
            )

    def _maybe_lift(self, gid: str, core: RaftCore, m: Message) -> None:
        since = self.book.since(gid, m.src)
        assert since is not None
        if core.judge_probation_ack(since, m) == "lift":
            self.book.lift(gid, m.src)
            core.probation = self.book.on_probation(gid, self.members[gid])
            self.counters["probations_lifted"] += 1
            self._reporting[gid] = (core.term, self._ticked + self.report_ticks)
            log.info("%s: %s caught up in group %s", self.node_id, m.src, gid)

    def _take_report(self, core: RaftCore, r: LiftReport) -> None:
        """A leader's report that it lifted a probation (zdmq/raft/identity.py): taken
        only from the leader this core follows in its current term; a report on a store
        not recorded here yet records it first (as its payload would: probation in every
        shared group), then lifts the probation in the report's group if it is due."""
        if not report_current(r, term=core.term, leader=core.leader, probation=core.probation):
            return
        if self.book.identities.get(r.peer) != r.identity:
            self._seen(r.peer, r.identity)
        if self.book.lift_reported(r):
            core.probation = self.book.on_probation(r.group, self.members[r.group])
            self.counters["probations_lifted_by_report"] += 1
            log.info(
                "%s: %s caught up in group %s (reported by %s)",
                self.node_id,
                r.peer,
                r.group,
                r.src,
            )

    def _reports_for(self, pid: str) -> list[bytes]:
        """The lift reports to send `pid` with a payload: in every group `pid` is in that
        this node leads, for `report_ticks` from the start of its term or its latest lift
        there, one per other member whose store this node cleared (`PeerBook.reportable`),
        with that member's matched index in this term."""
        out: list[bytes] = []
        book = self.book
        for gid in self._shared.get(pid, ()):
            reporting = self._reporting.get(gid)
            if reporting is None:
                continue
            core = self._cores[gid]
            term, until = reporting
            if core.role is not Role.LEADER or core.term != term or self._ticked > until:
                del self._reporting[gid]
                continue
            for peer in self.members[gid]:
                if peer in (pid, self.node_id):
                    continue
                ident = book.reportable(gid, peer)
                if ident is None:
                    continue
                pr = core.progress.get(peer)
                r = LiftReport(self.node_id, gid, peer, ident, pr.match if pr else 0, term)
                out.append(_pack_report(self._packer, r))
        return out

    def _hand_to_preferred(self) -> None:
        for gid, core in self._cores.items():
            pref = self.preferred[gid]
            if core.role is not Role.LEADER or pref is None or pref == self.node_id:
                continue
            if pref in core.probation or pref not in core.conf.voters:
                continue  # it could not win: this node would not vote for it
            pr = core.progress.get(pref)
            if pr is not None and pr.active and pr.match == core.log.last_index():
                log.debug("%s hands group %s to its preferred leader %s", self.node_id, gid, pref)
                core.transfer_leadership(pref)
                self.counters["transfers"] += 1

    def _check_pending(self) -> None:
        """Counts elections won; once this member stops leading the term some pending
        proposals were made in, gives those past the commit index `outcome_ticks` to
        be applied (committed by a later leader) or overwritten, then fails the rest
        with `NotLeader` (outcome unknown)."""
        ticked = self._ticked
        for gid, core in self._cores.items():
            lead_term = core.term if core.role is Role.LEADER else None
            deposed = self._deposed[gid]
            if lead_term != self._lead_term[gid]:
                self._lead_term[gid] = lead_term
                if lead_term is not None:
                    self.counters["elections_won"] += 1
                    self._reporting[gid] = (lead_term, ticked + self.report_ticks)
                committed = core.log.committed
                until = ticked + self.outcome_ticks
                for i, (term, _) in self._pending[gid].items():
                    if i > committed and term != lead_term and i not in deposed:
                        deposed[i] = until
            if deposed:
                self._end_waits(gid, lambda i, until: until <= ticked)

    def _end_waits(self, gid: str, ends: Callable[[int, int], bool]) -> None:
        """Fails, outcome unknown, the deposed proposals of `gid` that `ends(index,
        until)` picks."""
        deposed = self._deposed[gid]
        pending = self._pending[gid]
        core = self._cores[gid]
        for i in [i for i, until in deposed.items() if ends(i, until)]:
            del deposed[i]
            waiter = pending.pop(i, None)
            if waiter is not None and not waiter[1].done():
                waiter[1].set_exception(NotLeader(core.leader, core.term))
                self.counters["proposals_unknown"] += 1

    def _watch(self) -> None:
        """After a round: logs each group's campaigns, won elections, step-downs and
        leader changes (once each), and counts the leader changes; takes configurations
        that changed."""
        for gid, core in self._cores.items():
            if core.conf is not self._confs[gid]:
                log.info(
                    "%s: group %s is now %s",
                    self.node_id,
                    gid,
                    core.conf.to_dict(),
                    extra={"event": "configuration", "group": gid, **core.conf.to_dict()},
                )
                self._sync_members(gid)
            now = (core.role, core.leader, core.elections)
            before = self._watched[gid]
            if now == before:
                continue
            self._watched[gid] = now
            role, _, elections = before
            fields = {"group": gid, "term": core.term}
            if core.elections != elections:
                log.info(
                    "%s campaigns in group %s (term %d)",
                    self.node_id,
                    gid,
                    core.term,
                    extra={"event": "campaign", **fields},
                )
            if core.role is Role.LEADER and role is not Role.LEADER:
                log.info(
                    "%s leads group %s (term %d)",
                    self.node_id,
                    gid,
                    core.term,
                    extra={"event": "became_leader", **fields},
                )
            elif role is Role.LEADER and core.role is not Role.LEADER:
                log.info(
                    "%s stepped down in group %s (term %d)",
                    self.node_id,
                    gid,
                    core.term,
                    extra={"event": "stepped_down", **fields},
                )
            known = self._known_leader[gid]
            if core.leader is not None and core.leader != known:
                self._known_leader[gid] = core.leader
                self.leader_changes[gid] += 1
                self.counters["leader_changes"] += 1
                log.info(
                    "%s sees %s lead group %s (term %d; before: %s)",
                    self.node_id,
                    core.leader,
                    gid,
                    core.term,
                    known,
                    extra={
                        "event": "leader_changed",
                        "leader": core.leader,
                        "previous": known,
                        **fields,
                    },
                )

    def _watch_catch_up(self) -> None:
        """Every few ticks, as leader: a follower whose match trails the commit index by
        more than `_BEHIND_ENTRIES` at two checks in a row is behind; it is logged once
        when its match reaches the commit index."""
        lagging, behind = self._lagging, self._behind
        for gid, core in self._cores.items():
            if core.role is not Role.LEADER:
                if lagging or behind:
                    for key in [k for k in (*lagging, *behind) if k[0] == gid]:
                        lagging.pop(key, None)
                        behind.pop(key, None)
                continue
            committed = core.log.committed
            for p, pr in core.progress.items():
                if p == self.node_id:
                    continue
                key = (gid, p)
                if committed - pr.match > _BEHIND_ENTRIES:
                    if key in lagging and key not in behind:
                        behind[key] = lagging[key]
                    lagging[key] = pr.match
                    continue
                lagging.pop(key, None)
                since = behind.get(key)
                if since is not None and pr.match >= committed:
                    del behind[key]
                    log.info(
                        "%s: %s caught up in group %s (from index %d to %d)",
                        self.node_id,
                        p,
                        gid,
                        since,
                        pr.match,
                        extra={
                            "event": "caught_up",
                            "group": gid,
                            "peer": p,
                            "from_index": since,
                            "index": pr.match,
                        },
                    )

    def _apply_entries(self, gid: str, entries: Sequence[Entry]) -> None:
        pending = self._pending[gid]
        deposed = self._deposed[gid]
        apply = self._apply
        for e in entries:
            waiter = pending.pop(e.index, None) if pending else None
            # An exception here is a bug in the state machine: _pump_loop stops the host.
            # (A configuration entry goes to it too: it records the configuration.)
            result = apply(gid, e)
            self.counters["applied"] += 1
            conf = Conf.decode(e.data)
            if conf is not None:
                self._forget_departed(gid, conf)
            if waiter is None:
                continue
            if deposed:
                deposed.pop(e.index, None)
            term, fut = waiter
            if fut.done():
                continue
            if term == e.term:
                fut.set_result(result)
            else:  # another leader's entry took this index: this one never committed
                core = self._cores[gid]
                fut.set_exception(NotCommitted(core.leader, core.term))
                self.counters["proposals_overwritten"] += 1
        if entries:
            self._applied_to[gid] = entries[-1].index

    # -- the transport --------------------------------------------------------------------

    def _enqueue(self, gid: str, m: Message) -> None:
        peer = self._peers.get(m.dst)
        if peer is None:  # a member named by a configuration entry just appended
            peer = self._peers[m.dst] = _Peer()
        packed = _pack_message(self._packer, gid, m)
        if (
            len(peer.queue) >= self.max_queued_messages
            or peer.queued_bytes + len(packed) > self.max_queued_bytes
        ):
            self.counters["messages_dropped"] += 1
            return
        peer.queue.append(packed)
        peer.queued_bytes += len(packed)

    def _flush_peers(self) -> bool:
        """Starts a send loop for each peer with messages queued and none running;
        returns whether it started any."""
        started = False
        for pid, peer in self._peers.items():
            if peer.queue and peer.task is None:
                peer.task = asyncio.create_task(self._send_loop(pid, peer))
                started = True
        return started

    async def _send_loop(self, pid: str, peer: _Peer) -> None:
        """Sends a peer's queue, one payload at a time, until it is empty."""
        try:
            while peer.queue and self.running:
                payload, n = self._take_payload(pid, peer)
                peer.sending_since = time.monotonic()
                try:
                    answer = await self._send(pid, payload)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    peer.failed_at = time.monotonic()
                    self.counters["send_failures"] += 1
                    self.counters["messages_dropped"] += n
                    log.debug("raft send %s -> %s failed: %r", self.node_id, pid, e)
                    continue
                finally:
                    peer.sending_since = None
                peer.ok_at = time.monotonic()
                self.counters["payloads_sent"] += 1
                self.counters["messages_sent"] += n
                if answer and self.running:
                    try:
                        self.receive(answer, sender=pid)
                    except BadRaftPayload as e:
                        self.counters["bad_answers"] += 1
                        log.warning("raft answer %s -> %s refused: %s", pid, self.node_id, e)
        finally:
            peer.task = None

    def _take_payload(self, pid: str, peer: _Peer) -> tuple[bytes, int]:
        """The next payload for `pid` from its queue (up to max_payload_bytes, at least
        one message; the rest waits), and how many messages it holds."""
        n = size = 0
        for packed in peer.queue:
            if n and size + len(packed) > self.max_payload_bytes:
                break
            n += 1
            size += len(packed)
        batch = peer.queue[:n]
        del peer.queue[:n]
        peer.queued_bytes -= size
        reports = self._reports_for(pid) if self.book.cleared else []
        return _join_payload(self._packer, self.identity, batch, reports), n
