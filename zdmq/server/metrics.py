"""A node's Prometheus metrics, served at `GET /metrics` (docs/operations.md, "Metrics").

One `NodeMetrics` per node process, with a registry of its own (never prometheus-client's
global one). What moves on the hot path is counted where it happens, once per request or
batch (`.inc(n)`), through label children looked up once and kept; everything that is a
level (queue depths, Raft positions, open connections) or already counted elsewhere (the
Raft host's counters) is read from the node's objects only when `/metrics` is scraped,
by `_NodeCollector`, so it costs the hot path nothing.

Per-queue series are bounded: the first `max_queues` queues a node sees get their own
`queue` label value, the rest are counted under `queue="_other"`; a deleted queue's
series are removed and its place is freed.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from zdmq.server.node import Node
    from zdmq.server.replicas import Member

__all__ = ["CONTENT_TYPE", "MAX_QUEUES", "MESSAGE_EVENTS", "OTHER_QUEUE", "NodeMetrics"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text exposition format 0.0.4
MAX_QUEUES = 1000  # queues with series of their own, per node
OTHER_QUEUE = "_other"  # the label value of every queue past MAX_QUEUES
UNMATCHED_ROUTE = "_unmatched"  # the route label of a request no route matched

#: What happens to messages, each a counter `zdmq_messages_<event>_total{queue}`.
MESSAGE_EVENTS: dict[str, str] = {
    "pushed": "Messages stored by pushes this node served as their group's leader",
    "popped": "Messages popped (taken for good)",
    "received": "Messages leased by receives",
    "acked": "Leases acked (messages deleted)",
    "nacked": "Leases nacked (messages made visible again or dead-lettered)",
    "expired": "Leases that ran out (messages made visible again or dead-lettered)",
    "dead_lettered": "Messages moved to their queue's dead-letter queue",
}

# Request latencies: from a fast local call to a long poll (wait_s up to 20 s).
_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
)
_COMMIT_SECONDS_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class NodeMetrics:
    """The metrics of one node process."""

    def __init__(self, node_id: str, *, max_queues: int = MAX_QUEUES) -> None:
        self.node_id = node_id
        self.max_queues = max_queues
        self.registry = CollectorRegistry(auto_describe=False)
        reg = self.registry
        ProcessCollector(registry=reg)
        self.requests = Counter(
            "zdmq_http_requests",
            "HTTP requests served, by route pattern, method and status code",
            ("route", "method", "code"),
            registry=reg,
        )
        self.request_seconds = Histogram(
            "zdmq_http_request_duration_seconds",
            "Time from a request's parse to its reply's write, by route pattern and method",
            ("route", "method"),
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.messages = {
            event: Counter(f"zdmq_messages_{event}", doc, ("queue",), registry=reg)
            for event, doc in MESSAGE_EVENTS.items()
        }
        self.commit_ops = Histogram(
            "zdmq_commit_batch_size",
            "Writes per commit: ops of a state store's group commit, entries of a Raft log write",
            ("store",),
            buckets=_BATCH_BUCKETS,
            registry=reg,
        )
        self.commit_seconds = Histogram(
            "zdmq_commit_duration_seconds",
            "Time a commit took, its sync included (state store: COMMIT; Raft log: the write)",
            ("store",),
            buckets=_COMMIT_SECONDS_BUCKETS,
            registry=reg,
        )
        self._state_commit = (self.commit_ops.labels("state"), self.commit_seconds.labels("state"))
        self._raft_write = (self.commit_ops.labels("raft"), self.commit_seconds.labels("raft"))
        # (route, method, code) -> its counter and histogram children.
        self._http: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        # event -> queue -> its counter child (queues with a label of their own only).
        self._children: dict[str, dict[str, Any]] = {e: {} for e in MESSAGE_EVENTS}
        self._own: set[str] = set()  # queues with a label value of their own
        self._served: Callable[[], Iterable[Node]] = list
        self._member: Member | None = None
        self._connections: Callable[[], int] = int
        reg.register(_NodeCollector(self))

    def attach(self, served: Callable[[], Iterable[Node]], member: Member | None) -> None:
        """What the scrape reads: the Nodes whose queues this node reports (its own, or
        the replica groups it leads now) and its replica groups (None without)."""
        self._served = served
        self._member = member

    def attach_connections(self, connections: Callable[[], int]) -> None:
        """How many connections the node's HTTP server holds open (set as it starts)."""
        self._connections = connections

    # ---- the hot path -------------------------------------------------------------------
    def request(self, route: str, method: str, code: int, seconds: float) -> None:
        key = (route, method, code)
        pair = self._http.get(key)
        if pair is None:
            label = route or UNMATCHED_ROUTE
            pair = self._http[key] = (
                self.requests.labels(label, method, str(code)),
                self.request_seconds.labels(label, method),
            )
        pair[0].inc()
        pair[1].observe(seconds)

    def count(self, event: str, queue: str, n: int) -> None:
        """`n` messages of `queue` went through `event` (one call per batch)."""
        if not n:
            return
        child = self._children[event].get(queue)
        if child is None:
            label = self.queue_label(queue)
            child = self.messages[event].labels(label)
            if label != OTHER_QUEUE:
                self._children[event][queue] = child
        child.inc(n)

    def state_commit(self, ops: int, seconds: float) -> None:
        self._state_commit[0].observe(ops)
        self._state_commit[1].observe(seconds)

    def raft_write(self, entries: int, seconds: float) -> None:
        self._raft_write[0].observe(entries)
        self._raft_write[1].observe(seconds)

    # ---- queues' labels -------------------------------------------------------------------
    def queue_label(self, queue: str) -> str:
        """`queue` itself while it is one of the first `max_queues` seen, else `_other`."""
        own = self._own
        if queue in own:
            return queue
        if len(own) < self.max_queues:
            own.add(queue)
            return queue
        return OTHER_QUEUE

    def forget_queue(self, queue: str) -> None:
        """A deleted queue: its series go, and its place is free for another queue."""
        if queue not in self._own:
            return
        self._own.discard(queue)
        for event, counter in self.messages.items():
            self._children[event].pop(queue, None)
            with contextlib.suppress(KeyError):
                counter.remove(queue)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _NodeCollector(Collector):
    """What is read at scrape time: queue depths, the replica groups, connections."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        yield GaugeMetricFamily(
            "zdmq_http_open_connections",
            "Connections the node's HTTP server holds open",
            value=m._connections(),
        )
        yield from self._queues()
        if m._member is not None:
            yield from self._raft(m._member)

    def _queues(self) -> Iterator[Metric]:
        m = self.m
        depth: defaultdict[str, int] = defaultdict(int)
        in_flight: defaultdict[str, int] = defaultdict(int)
        delayed: defaultdict[str, int] = defaultdict(int)
        for node in m._served():
            for queue, lq in list(node.state.queues.items()):
                label = m.queue_label(queue)
                depth[label] += lq.holds()
                in_flight[label] += len(lq.leased)
                delayed[label] += len(lq.delayed)
        for name, doc, values in (
            (
                "zdmq_queue_messages",
                "Messages of the queue this node holds (ready, in flight or delayed)",
                depth,
            ),
            ("zdmq_queue_in_flight", "Messages of the queue leased to consumers", in_flight),
            ("zdmq_queue_delayed", "Messages of the queue not visible yet (delay)", delayed),
        ):
            g = GaugeMetricFamily(name, doc, labels=("queue",))
            for label, v in values.items():
                g.add_metric((label,), v)
            yield g

    def _raft(self, member: Member) -> Iterator[Metric]:
        host = member.raft
        if host is None:
            return
        group = ("group",)
        leader = GaugeMetricFamily(
            "zdmq_raft_leader", "1 while this node leads the group, else 0", labels=group
        )
        role = GaugeMetricFamily(
            "zdmq_raft_role", "1 for this node's role in the group", labels=("group", "role")
        )
        term = GaugeMetricFamily("zdmq_raft_term", "The group's current term", labels=group)
        commit = GaugeMetricFamily(
            "zdmq_raft_commit_index", "The group's commit index as this node knows it", labels=group
        )
        applied = GaugeMetricFamily(
            "zdmq_raft_applied_index",
            "The last log index applied to this node's state",
            labels=group,
        )
        last = GaugeMetricFamily(
            "zdmq_raft_last_index", "The last index of this node's log", labels=group
        )
        lag = GaugeMetricFamily(
            "zdmq_raft_follower_lag_entries",
            "As leader: its last index minus each follower's match",
            labels=("group", "follower"),
        )
        elections = CounterMetricFamily(
            "zdmq_raft_elections", "Elections this node started in the group", labels=group
        )
        changes = CounterMetricFamily(
            "zdmq_raft_leader_changes",
            "Leaders this node saw take the group (the first one after start counts)",
            labels=group,
        )
        sent = CounterMetricFamily(
            "zdmq_raft_snapshots_sent",
            "Snapshots of the group's state this node sent",
            labels=group,
        )
        installed = CounterMetricFamily(
            "zdmq_raft_snapshots_installed",
            "Snapshots of the group's state this node installed",
            labels=group,
        )
        for g in host.groups:
            r = host.role(g)
            leader.add_metric((g,), 1 if r.value == "leader" else 0)
            role.add_metric((g, r.value), 1)
            term.add_metric((g,), host.leader(g)[1])
            commit.add_metric((g,), host.commit_index(g))
            applied.add_metric((g,), host.applied_index(g))
            last.add_metric((g,), host.last_index(g))
            for follower, entries in sorted(host.follower_lags(g).items()):
                lag.add_metric((g, follower), entries)
            elections.add_metric((g,), host.elections(g))
            changes.add_metric((g,), host.leader_changes.get(g, 0))
            sent.add_metric((g,), member.snapshots_sent.get(g, 0))
            installed.add_metric((g,), host.snapshot_installs.get(g, 0))
        yield from (leader, role, term, commit, applied, last, lag, elections, changes)
        yield from (sent, installed)
