"""Plain HTTP calls a node cannot serve itself, served through a leader that can.

With replication, a call that names no replica group (curl, a shell script, Locust's
HTTP users: every caller but zdmq's client and the nodes, which route themselves and
name the group in `zdmq-group`) is served by a group this node leads, its own first
(replicas.py). A node may lead none of its groups for a while: it has just restarted
and its groups are led elsewhere until they are handed back, an election is running,
or leadership moved under load. And a node may stop leading the group a call is using
while it serves it. Neither is the caller's business: the node relays the call, as it
came (method, target, body, the caller's own credentials, which the leader checks
again), to the leader of one of its groups, naming that group, and passes the reply
back. One hop: the leader serves it, or, if it has just lost the lead, answers 421, and
the relay tries the next leader.

Which group: any of the node's groups serves a call that names none, so the relay takes
the first (the group the call failed on, then the node's own, then the others) whose
leader it heard from lately (a paused or cut-off leader falls silent within half an
election timeout, and is passed over, as is a member that stopped answering this node's
Raft traffic) and that has not refused this call. While none has (an election), it waits,
up to RELAY_WAIT_S; then the caller gets 503 `node_unavailable` with `Retry-After` and
`"unsent": true` (nothing was done).

What may be sent twice. A relayed call that the leader may have run (it timed out on
the way, or the leader lost the lead before the call's entry committed and could not
learn its outcome) is not sent again, except a receive (a second lease of other
messages only delays them) and reads: the caller gets the 503 and decides, as it would
from the node that holds the queue. A node that lost the lead mid-call ran the call's
steps up to the one its group refused; a call relayed then runs whole on the leader, so
a batch push can store some of its messages twice (at-least-once), never none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl

from zdmq import _http
from zdmq.auth import NODE_AUTH_HEADER
from zdmq.config import ClusterConfig
from zdmq.errors import NodeUnavailable, NotLeader
from zdmq.logs import REQUEST_ID_HEADER, request_id
from zdmq.models import MAX_WAIT_S
from zdmq.routing import GROUP_HEADER
from zdmq.server.http import Request, Response
from zdmq.server.replicas import LEADER_WAIT_S, Member

__all__ = ["RELAYED_HEADER", "SERVED_BY_HEADER", "Relay"]

# How long a plain call waits for one of the node's groups to have a leader to relay to.
RELAY_WAIT_S = LEADER_WAIT_S
# On a relayed call: the node that relayed it (for logs; it routes nothing). On the reply
# to the caller: the node that served it.
RELAYED_HEADER = "zdmq-relayed-by"
SERVED_BY_HEADER = "zdmq-served-by"
# Request headers that belong to one connection, not to the call.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "content-length",
        "host",
        "expect",
        "proxy-connection",
        REQUEST_ID_HEADER,
        GROUP_HEADER,
    }
)
# Reply headers the relay does not pass back (the node writes its own).
_HOP_REPLY = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}
)
# Routes a call of which may be sent again after an unknown outcome.
_AGAIN = frozenset({"/v1/queues/{queue}/receive"})

Handler = Callable[[Request], Awaitable[Response]]


class Relay:
    """Relays the plain calls of one node (see the module docstring)."""

    def __init__(self, config: ClusterConfig, member: Member) -> None:
        self.member = member
        self.timeout_s = config.request_timeout_s
        # Unsigned: the leader checks the caller's own credentials, not this node's.
        self.pool = _http.HttpPool(
            timeout_s=config.request_timeout_s,
            limit_per_host=64,
            idle_s=min(30.0, config.limits.idle_timeout_s / 2),
            ssl_context=config.client_ssl(),
        )
        #: Calls relayed, and those that found no leader in time (for /v1/health).
        self.relayed = 0
        self.no_leader = 0

    async def close(self) -> None:
        await self.pool.close()

    def wrap(self, handler: Handler) -> Handler:
        """`handler`, with a call that names no group relayed when this node cannot serve
        it (NotLeader)."""

        async def relaying(request: Request) -> Response:
            headers = request.headers
            if GROUP_HEADER in headers or NODE_AUTH_HEADER in headers:
                return await handler(request)  # a caller that routes itself
            try:
                return await handler(request)
            except NotLeader as e:
                return await self.send(request, e.group)

        return relaying

    async def send(self, request: Request, failed: str | None) -> Response:
        """`request` served by a group's leader elsewhere; its reply, as it came."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers[RELAYED_HEADER] = self.member.id
        rid = request_id.get()
        if rid is not None:
            headers[REQUEST_ID_HEADER] = rid
        params = dict(parse_qsl(request.query_string, keep_blank_values=True))
        timeout_s = self.timeout_s + _wait_s(params)
        once = request.method not in ("GET", "HEAD") and request.route not in _AGAIN
        self.relayed += 1
        refused: set[tuple[str, str]] = set()  # (group, leader) that did not take it
        deadline = time.monotonic() + RELAY_WAIT_S
        idle = 0
        while True:
            pick = self._pick(failed, refused)
            if pick is None:
                if time.monotonic() >= deadline:
                    self.no_leader += 1
                    err = NodeUnavailable(
                        f"{self.member.id}: no leader of its replica groups took the call "
                        f"in {RELAY_WAIT_S:g} s (an election is running)"
                    )
                    err.unsent = True
                    raise err
                idle += 1
                if idle % 10 == 0:  # leaders that refused may take it now (a hand-over ended)
                    refused.clear()
                await asyncio.sleep(0.05)
                continue
            group, leader = pick
            headers[GROUP_HEADER] = group
            try:
                reply = await self._send(request, leader, headers, params, timeout_s)
            except NotLeader:  # it has just lost the lead: another, or the next leader
                refused.add(pick)
                continue
            except NodeUnavailable as e:
                if once and not e.unsent:
                    raise  # it may have run there: not sent twice
                refused.add(pick)
                continue
            out = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP_REPLY}
            out[SERVED_BY_HEADER] = leader
            return Response(status=reply.status, body=reply.body or None, headers=out)

    async def _send(
        self,
        request: Request,
        target: str,
        headers: dict[str, str],
        params: dict[str, str],
        timeout_s: float,
    ) -> _http.Reply:
        """The call sent to `target`; NotLeader for its 421, NodeUnavailable when it did
        not answer (`unsent` when nothing listened)."""
        reply = await _http.send(
            self.pool,
            request.method,
            self.member.urls[target],
            request.path,
            what=target,
            data=request.body,
            headers=headers,
            params=params,
            timeout_s=timeout_s,
        )
        if reply.status == NotLeader.status:
            refusal = _http.error_of(reply)
            if isinstance(refusal, NotLeader):
                raise refusal
        return reply

    def _pick(self, failed: str | None, refused: set[tuple[str, str]]) -> tuple[str, str] | None:
        """A group of this node and its leader to relay to: the group the call failed on,
        else the node's own, else another; a leader heard from lately, that has not
        refused this call, and answers this node's Raft traffic. None while none has."""
        member = self.member
        order = list(member.groups)
        for first in (member.id, failed):
            if first in order:
                order.remove(first)
                order.insert(0, first)
        for g in order:
            leader = member.live_leader(g)
            if leader is None or (g, leader) in refused:
                continue
            if leader == member.id and not member.leads(g):
                continue
            if leader != member.id and member.silent(leader):
                continue
            return g, leader
        # A node that keeps no group with a live leader (one that has just joined the
        # cluster, or drained to leave it): a group's leader as the map or a 421 names it.
        for g, members in member.members.items():
            if g in member.nodes or not members:
                continue
            leader = member.router.hint(g) or members[0]
            if (g, leader) not in refused and leader != member.id:
                return g, leader
        return None


def _wait_s(params: dict[str, str]) -> float:
    """The long-poll wait a call asks for (checked by its handler already)."""
    try:
        return min(float(params.get("wait_s", 0.0)), MAX_WAIT_S)
    except ValueError:
        return 0.0
