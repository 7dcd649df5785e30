"""The cluster status: what `GET /v1/status`, the status page at `/` and `zdmq status` show.

Each node keeps its own view (`local_status`, served to the other nodes at
`GET /v1/internal/status`): its health; with replication, per replica group it is a
member of, its role, the leader and term it knows, the commit and applied index and, on
the group's leader, each follower's lag (entries of the leader's log the follower is not
known to hold); the queues it stores messages of (only in the groups it leads, so that
each copy is counted once), at most `QUEUES_PER_NODE` of the deepest; and its message
rates.

Rates: `RateSampler` reads the node's counters (pushed, popped, received, acked, summed
over its groups) just after each whole second into a ring buffer of `RATE_SECONDS` samples;
what a counter moved between two samples is its rate in that second, keyed by the whole
second (Unix time) the later sample was taken in, so that rates of different nodes add up
second by second, and the rates add up to the counts.

`cluster_status` is what any node serves at `GET /v1/status`: every node of the cluster
map it routes by (cluster.yaml's nodes until the map changes; a node being drained is
marked `leaving`) asked for its view at once, each with a `NODE_TIMEOUT_S` timeout (a node
that does not answer in time is reported down, so a dead node shows within a second), the
queues merged (depth per node or group, the `QUEUES_LISTED` deepest, with the count of the
rest) and the rates summed; with it the map's epoch and, meanwhile, the rebalancer's
progress (`moves_view`: what `GET /v1/cluster/moves` shows, from the home group's leader,
or null when it did not answer in time).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from zdmq import _http
from zdmq.config import ClusterConfig
from zdmq.errors import ZdmqError

if TYPE_CHECKING:
    from zdmq.server.node import Node
    from zdmq.server.rebalance import Rebalancer
    from zdmq.server.replicas import Member

__all__ = [
    "NODE_TIMEOUT_S",
    "QUEUES_LISTED",
    "RATE_SECONDS",
    "RateSampler",
    "cluster_status",
    "local_status",
    "moves_view",
]

#: How many seconds of rates a node keeps (and the status reports).
RATE_SECONDS = 300
#: How long the status waits for each node's view before it reports the node down.
NODE_TIMEOUT_S = 0.5
#: The queues the status lists (the deepest), and how many each node reports.
QUEUES_LISTED = 50
QUEUES_PER_NODE = 200
#: The rates, each from the counter it is the rate of.
SERIES = {"push": "pushed", "pop": "popped", "receive": "received", "ack": "acked"}


class RateSampler:
    """Per-second rates of a node's counters over the last `seconds` seconds."""

    def __init__(self, nodes: Callable[[], Iterable[Node]], seconds: int = RATE_SECONDS) -> None:
        self._nodes = nodes
        # (the whole second it was taken in, the time, totals in SERIES order)
        self._samples: deque[tuple[int, float, tuple[int, ...]]] = deque(maxlen=seconds + 1)

    def totals(self) -> tuple[int, ...]:
        sums = [0] * len(SERIES)
        for node in self._nodes():
            c = node.counters
            for i, name in enumerate(SERIES.values()):
                sums[i] += c.get(name, 0)
        return tuple(sums)

    def sample(self, now: float) -> None:
        second = math.floor(now)
        if self._samples and self._samples[-1][0] >= second:
            return
        self._samples.append((second, now, self.totals()))

    def rates(self) -> dict[str, Any]:
        """{"t": [whole seconds], "push": [the rate in the second before each], ...}.

        Each rate is what a counter moved between two samples: a sample is taken just
        after each whole second, so that is one second's count. Should the loop miss a
        second, the count is spread evenly over the seconds between the two samples, so
        that the rates still add up to the counts."""
        out: dict[str, list[Any]] = {"t": [], **{name: [] for name in SERIES}}
        for (s0, _, before), (s1, _, after) in itertools.pairwise(self._samples):
            span = s1 - s0
            # A counter that went back (a group's state reloaded) is no negative rate.
            moved = [max(b - a, 0) / span for a, b in zip(before, after, strict=True)]
            for second in range(s1 - span + 1, s1 + 1):
                out["t"].append(second)
                for name, rate in zip(SERIES, moved, strict=True):
                    out[name].append(round(rate, 2))
        return out

    async def run(self) -> None:
        """Samples once a second, just after each whole second, until cancelled."""
        while True:
            self.sample(time.time())
            await asyncio.sleep(1.0 - time.time() % 1.0 + 0.01)


def _queues_of(nodes: Iterable[Node]) -> tuple[list[dict[str, Any]], int]:
    """The deepest queues the given nodes (groups) store messages of, and how many
    (queue, group) pairs hold messages in all."""
    rows: list[tuple[int, str, str]] = []
    by_id: dict[str, Node] = {}
    for node in nodes:
        by_id[node.id] = node
        rows.extend(
            (depth, q, node.id) for q, lq in node.state.queues.items() if (depth := lq.holds())
        )
    out = []
    for depth, queue, group in heapq.nlargest(QUEUES_PER_NODE, rows):
        counts = by_id[group].state.counts(queue)
        out.append(
            {
                "queue": queue,
                "node": group,
                "depth": depth,
                "in_flight": counts["in_flight"],
                "delayed": counts["delayed"],
            }
        )
    return out, len(rows)


def local_status(
    node_id: str, node: Node | None, member: Member | None, sampler: RateSampler
) -> dict[str, Any]:
    """This node's own view (see the module's docstring). `node`: the node's own state,
    None on a node that joined the cluster and holds no replica group yet."""
    groups: dict[str, Any] = {}
    if member is None:
        assert node is not None
        failed = node.storage.failed
        served = [node]
        messages = node.state.stored()
        started = node.started_at
    else:
        problems = [f"{g}: {n.storage.failed}" for g, n in member.nodes.items() if n.storage.failed]
        host = member.raft
        if host is not None and host.failed:
            problems.append(f"raft: {host.failed}")
        failed = "; ".join(problems) or None
        served = [n for g, n in member.nodes.items() if member.leads(g)]
        own = member.nodes.get(member.id)
        messages = own.state.stored() if own is not None else 0
        started = member.started_at
        for g, n in member.nodes.items():
            if host is None:
                groups[g] = {"role": "stopped", "leader": None, "term": 0}
                continue
            leader, term = host.leader(g)
            last = host.last_index(g)
            groups[g] = {
                "role": host.role(g).value,
                "leader": leader,
                "term": term,
                "commit": host.commit_index(g),
                "applied": n.storage.applied,
                "last": last,
                "lag": {p: max(last - m, 0) for p, m in sorted(host.followers(g).items())},
            }
    queues, total = _queues_of(served)
    return {
        "node": node_id,
        "status": "failed" if failed else "ok",
        "detail": failed,
        "uptime_s": round(time.time() - started, 3),
        "messages": messages,
        "groups": groups,
        "queues": queues,
        "queues_total": total,
        "rates": sampler.rates(),
    }


def _merge_rates(views: Iterable[dict[str, Any]], now: float) -> dict[str, Any]:
    """The nodes' rates summed second by second, over the last RATE_SECONDS seconds."""
    end = math.floor(now)
    start = end - RATE_SECONDS + 1
    sums = {name: [0.0] * RATE_SECONDS for name in SERIES}
    for view in views:
        rates = view.get("rates") or {}
        for i, second in enumerate(rates.get("t", [])):
            if start <= second <= end:
                for name in SERIES:
                    sums[name][second - start] += rates[name][i]
    out: dict[str, Any] = {"interval_s": 1, "start": start, "end": end}
    for name in SERIES:
        series = [round(v, 2) for v in sums[name]]
        out[name] = series
    # The rate now: the mean of the last five whole seconds (the last one may not be in).
    out["current"] = {name: round(sum(sums[name][-6:-1]) / 5, 2) for name in SERIES}
    return out


def _merge_queues(views: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], int, bool]:
    """(the QUEUES_LISTED deepest queues with depth per node, how many queues were seen,
    whether some node listed only its deepest)."""
    merged: dict[str, dict[str, Any]] = {}
    partial = False
    for view in views:
        queues = view.get("queues", [])
        partial = partial or view.get("queues_total", 0) > len(queues)
        for row in queues:
            q = merged.setdefault(
                row["queue"],
                {"queue": row["queue"], "messages": 0, "in_flight": 0, "delayed": 0, "depth": {}},
            )
            q["messages"] += row["depth"]
            q["in_flight"] += row["in_flight"]
            q["delayed"] += row["delayed"]
            q["depth"][row["node"]] = q["depth"].get(row["node"], 0) + row["depth"]
    ranked = sorted(merged.values(), key=lambda q: (-q["messages"], q["queue"]))
    for q in ranked:
        q["depth"] = dict(sorted(q["depth"].items()))
    return ranked[:QUEUES_LISTED], len(ranked), partial


MOVES_PATH = "/v1/internal/cluster/moves"


async def moves_view(
    member: Member | None, rebalancer: Rebalancer | None, pool: _http.HttpPool | None
) -> dict[str, Any] | None:
    """The rebalancer's progress, as `GET /v1/cluster/moves` shows it: this node's own
    rebalancer's when it leads the home group, else asked of the member likeliest to lead
    it, once, within `NODE_TIMEOUT_S`. None when there is none to tell (one copy of each
    message: no rebalancer) or it could not be had: the status goes on without it."""
    if member is None or member.raft is None:
        return None
    home = member.topology.home
    try:
        if member.leads(home):
            return rebalancer.view() if rebalancer is not None else None
        candidates = member.router.candidates(home)
        target = next((n for n in candidates if n != member.id and n in member.urls), None)
        if target is None or pool is None:
            return None
        async with asyncio.timeout(NODE_TIMEOUT_S):
            reply = await _http.call(
                pool, "GET", member.urls[target] + MOVES_PATH, timeout_s=NODE_TIMEOUT_S
            )
        view = reply.json()
        return dict(view) if isinstance(view, dict) else None
    except (ZdmqError, TimeoutError, ValueError, KeyError):
        return None


async def cluster_status(
    config: ClusterConfig,
    self_id: str,
    own: Callable[[], dict[str, Any]],
    pool: _http.HttpPool,
    *,
    nodes: Sequence[tuple[str, str]] | None = None,
    epoch: int | None = None,
    leaving: Iterable[str] = (),
    moves: Awaitable[dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """Every node's view, merged (see the module's docstring): of `nodes` ((id, URL)
    pairs, cluster.yaml's nodes by default), with the map's `epoch` and the nodes
    `leaving` it, and what `moves` gives (awaited beside the views)."""

    async def view_of(node_id: str, url: str) -> dict[str, Any]:
        if node_id == self_id:
            return own()
        try:
            async with asyncio.timeout(NODE_TIMEOUT_S):
                reply = await _http.call(
                    pool, "GET", url + "/v1/internal/status", timeout_s=NODE_TIMEOUT_S
                )
            return dict(reply.json())
        except ZdmqError as e:
            return {"error": {"code": e.code, "message": e.message}}
        except TimeoutError:
            return {"error": {"code": "node_unavailable", "message": "no answer in time"}}

    async def no_moves() -> None:
        return None

    listed = list(nodes) if nodes is not None else [(n.id, n.url) for n in config.nodes]
    gone = set(leaving)
    now = time.time()
    views, moving = await asyncio.gather(
        asyncio.gather(*(view_of(node_id, url) for node_id, url in listed)),
        moves if moves is not None else no_moves(),
    )
    entries = []
    up_views = []
    for (node_id, url), view in zip(listed, views, strict=True):
        entry: dict[str, Any] = {"id": node_id, "url": url, "up": "error" not in view}
        if node_id in gone:
            entry["leaving"] = True
        if entry["up"]:
            up_views.append(view)
            for key in ("status", "detail", "uptime_s", "messages", "groups"):
                entry[key] = view.get(key)
            entry["rate"] = {
                name: round(sum((view.get("rates") or {}).get(name, [])[-5:]) / 5, 2)
                for name in SERIES
            }
        else:
            entry["status"] = "down"
            entry["detail"] = view["error"]["message"]
        entries.append(entry)
    queues, seen, partial = _merge_queues(up_views)
    return {
        "node": self_id,
        "time": round(now, 3),
        "epoch": epoch,
        "replication": config.replication,
        "nodes": entries,
        "moves": moving,
        "queues": queues,
        "queues_seen": seen,
        "queues_more": seen - len(queues),
        "queues_partial": partial,
        "rates": _merge_rates(up_views, now),
    }
