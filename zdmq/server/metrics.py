"""A node's Prometheus metrics, served at `GET /metrics` (docs/operations.md, "Metrics").

One `NodeMetrics` per node process, with a registry of its own (never prometheus-client's
global one), exported by prometheus-client (its collector API and text exposition). What
moves on the hot path is counted where it happens, once per request or batch (`n` at a
time), into plain dicts and lists: the node's event loop is their one writer, and
prometheus-client's own Counter and Histogram take a lock on every update, which py-spy
showed as most of what metrics cost a one-message push (a histogram update about 2 µs,
against 0.2 µs here). `_NodeCollector` turns them into metric families when `/metrics` is
scraped, and reads there too what is a level (queue depths, Raft positions, open
connections) or counted elsewhere anyway (the Raft host), so those cost the hot path
nothing.

Per-queue series are bounded: the first `max_queues` queues a node sees get their own
`queue` label value, the rest are counted under `queue="_other"`; a deleted queue's
series are removed and its place is freed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


def _one_two_five(first: float, last: float) -> tuple[float, ...]:
    """Bucket bounds 1, 2.5 and 5 times each power of ten, from `first` to `last`."""
    out: list[float] = []
    decade = first
    while decade <= last:
        out += [round(decade * m, 10) for m in (1.0, 2.5, 5.0) if decade * m <= last * 1.000001]
        decade *= 10
    return tuple(out)


# Request latencies: from a fast local call to a long poll (wait_s up to 20 s).
_LATENCY_BUCKETS = _one_two_five(0.0001, 25.0)
# Commits: from a write the OS buffered to a sync of a busy disk.
_COMMIT_SECONDS_BUCKETS = (0.00005, *_one_two_five(0.0001, 0.25), 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class _Histogram:
    """A histogram the hot path fills with two list and float operations (no lock: the
    node's event loop is its one writer); exported at scrape time."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, +Inf last."""
        out: list[tuple[str, float]] = []
        seen = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            seen += n
            out.append((floatToGoString(bound), seen))
        out.append(("+Inf", seen + self.counts[-1]))
        return out


class NodeMetrics:
    """The metrics of one node process."""

    def __init__(self, node_id: str, *, max_queues: int = MAX_QUEUES) -> None:
        self.node_id = node_id
        self.max_queues = max_queues
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        # (route, method, code) -> requests; (route, method) -> their latencies.
        self.requests: dict[tuple[str, str, int], int] = {}
        self.latency: dict[tuple[str, str], _Histogram] = {}
        # event -> queue label -> messages.
        self.messages: dict[str, dict[str, int]] = {e: {} for e in MESSAGE_EVENTS}
        # store -> (batch sizes, seconds) of its commits.
        self.commits = {
            store: (_Histogram(_BATCH_BUCKETS), _Histogram(_COMMIT_SECONDS_BUCKETS))
            for store in ("state", "raft")
        }
        self._own: set[str] = set()  # queues with a label value of their own
        self._served: Callable[[], Iterable[Node]] = list
        self._member: Member | None = None
        self._connections: Callable[[], int] = int
        self.registry.register(_NodeCollector(self))

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
        requests = self.requests
        requests[key] = requests.get(key, 0) + 1
        hist = self.latency.get((route, method))
        if hist is None:
            hist = self.latency[(route, method)] = _Histogram(_LATENCY_BUCKETS)
        hist.observe(seconds)

    def count(self, event: str, queue: str, n: int) -> None:
        """`n` messages of `queue` went through `event` (one call per batch)."""
        if n:
            label = queue if queue in self._own else self.queue_label(queue)
            counts = self.messages[event]
            counts[label] = counts.get(label, 0) + n

    def state_commit(self, ops: int, seconds: float) -> None:
        sizes, times = self.commits["state"]
        sizes.observe(ops)
        times.observe(seconds)

    def raft_write(self, entries: int, seconds: float) -> None:
        sizes, times = self.commits["raft"]
        sizes.observe(entries)
        times.observe(seconds)

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
        if queue in self._own:
            self._own.discard(queue)
            for counts in self.messages.values():
                counts.pop(queue, None)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _NodeCollector(Collector):
    """What is read at scrape time: queue depths, the replica groups, connections."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        requests = CounterMetricFamily(
            "zdmq_http_requests",
            "HTTP requests served, by route pattern, method and status code",
            labels=("route", "method", "code"),
        )
        for (route, method, code), n in list(m.requests.items()):
            requests.add_metric((route or UNMATCHED_ROUTE, method, str(code)), n)
        yield requests
        latency = HistogramMetricFamily(
            "zdmq_http_request_duration_seconds",
            "Time from a request's parse to its reply's write, by route pattern and method",
            labels=("route", "method"),
        )
        for (route, method), h in list(m.latency.items()):
            latency.add_metric((route or UNMATCHED_ROUTE, method), h.buckets(), h.total)
        yield latency
        for event, doc in MESSAGE_EVENTS.items():
            family = CounterMetricFamily(f"zdmq_messages_{event}", doc, labels=("queue",))
            for queue, n in list(m.messages[event].items()):
                family.add_metric((queue,), n)
            yield family
        sizes = HistogramMetricFamily(
            "zdmq_commit_batch_size",
            "Writes per commit: ops of a state store's group commit, entries of a Raft log write",
            labels=("store",),
        )
        seconds = HistogramMetricFamily(
            "zdmq_commit_duration_seconds",
            "Time a commit took, its sync included (state store: COMMIT; Raft log: the write)",
            labels=("store",),
        )
        for store, (size_h, time_h) in m.commits.items():
            if store == "raft" and m._member is None:
                continue
            sizes.add_metric((store,), size_h.buckets(), size_h.total)
            seconds.add_metric((store,), time_h.buckets(), time_h.total)
        yield sizes
        yield seconds
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
