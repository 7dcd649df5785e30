"""The node-to-node routes that change which nodes keep a replica group (docs/design.md
§19): a group's leader commits one change of its members at a time, a node starts
keeping a group it was added to, and stops keeping one it was removed from. What moves
replicas calls them in order (add a learner, let it catch up, promote it, remove the
member it replaces) and reads each group's configuration off its leader, so a move cut
short anywhere is taken up again from where the group's log stands (raft.core's
`next_change`).

Every route takes a node credential only (NODE_ONLY in app.py's table)."""

from __future__ import annotations

from typing import Any

from zdmq.errors import BadRequest, NotLeader, RouteNotFound
from zdmq.raft.core import Conf, ConfChange
from zdmq.server.http import Request, Response
from zdmq.server.replicas import Member
from zdmq.server.routes.common import MEMBER, NODE, _json, _json_object

__all__ = [
    "change_group",
    "conf_of_group",
    "join_group",
    "leave_group",
    "transfer_group",
]

_CHANGES = frozenset({"add_learner", "promote", "remove"})


def _member(request: Request) -> Member:
    member: Member | None = request.app[MEMBER]
    if member is None or member.raft is None:
        raise RouteNotFound(f"{request.app[NODE].id} runs no Raft groups")
    return member


def _group(request: Request, member: Member) -> str:
    """The group the call names, which this member keeps; else 421 not_leader (naming
    the leader this node heard of, if any), so a caller that routes itself goes on to
    the group's other members (a member the map still names may have left the group)."""
    group = request.match_info["group"]
    if group not in member.nodes:
        raise NotLeader(
            f"{member.id} keeps no replica group {group[:100]!r}",
            group=group,
            leader=member.router.hint(group),
        )
    return group


def _conf(raw: Any) -> Conf:
    if not isinstance(raw, dict) or not isinstance(raw.get("voters"), list):
        raise BadRequest('"conf" must be {"voters": [...], "learners": [...]}')
    voters, learners = raw["voters"], raw.get("learners", [])
    if not isinstance(learners, list) or not all(
        isinstance(n, str) and n for n in (*voters, *learners)
    ):
        raise BadRequest('"conf" names nodes by their ids (non-empty strings)')
    if not voters or set(voters) & set(learners):
        raise BadRequest('"conf" needs voters, none of them also a learner')
    return Conf(frozenset(voters), frozenset(learners))


def _conf_reply(member: Member, group: str) -> Response:
    host = member.raft
    assert host is not None
    leader, term = host.leader(group)
    return _json(
        {
            "group": group,
            "node": member.id,  # the member that answers
            "conf": host.conf(group).to_dict(),
            "committed": host.conf_committed(group),
            "leader": leader,
            "term": term,
            "commit_index": host.commit_index(group),
            "applied_index": host.applied_index(group),
            # As leader: the index each member's log is known to match.
            "match": host.followers(group),
            # As a member a replica moves to: what it holds, and the snapshot it pulled.
            "messages": member.nodes[group].state.stored(),
            "snapshot_bytes": member.pulled.get(group, (0, 0))[0],
            "snapshot_size": member.pulled.get(group, (0, 0))[1],
        }
    )


async def conf_of_group(request: Request) -> Response:
    """`GET /v1/internal/groups/{group}`: the group's configuration as this member uses
    it, whether it is committed, the leader it knows, and (as leader) how far each
    member's log matches its own."""
    member = _member(request)
    return _conf_reply(member, _group(request, member))


async def change_group(request: Request) -> Response:
    """`POST /v1/internal/groups/{group}/changes` `{"change": "add_learner" | "promote" |
    "remove", "node": id}`: as the group's leader, commits the change and answers the
    configuration it made (421 from a member that does not lead; 400 for a change that
    does not apply now: one is under way, a learner not caught up, a member already)."""
    member = _member(request)
    group = _group(request, member)
    body = await _json_object(request)
    kind, node = body.get("change"), body.get("node")
    if kind not in _CHANGES:
        raise BadRequest(f'"change" must be one of {sorted(_CHANGES)}')
    if not isinstance(node, str) or not node:
        raise BadRequest('"node" must name a node')
    await member.change_membership(group, ConfChange(kind, node))
    return _conf_reply(member, group)


async def transfer_group(request: Request) -> Response:
    """`POST /v1/internal/groups/{group}/transfer` `{"to": id}`: as the group's leader,
    hands its lead to voter `to` once `to` is caught up (202: asked; 421 from a member
    that does not lead)."""
    member = _member(request)
    group = _group(request, member)
    to = (await _json_object(request)).get("to")
    if not isinstance(to, str) or not to:
        raise BadRequest('"to" must name a voter of the group')
    member.transfer(group, to)
    return Response(status=202)


async def join_group(request: Request) -> Response:
    """`PUT /v1/internal/groups/{group}` `{"conf": {...}}`: this node starts keeping the
    group it is (being) added to, with the configuration given, empty until its leader
    catches it up. 200 when it kept the group already."""
    member = _member(request)
    group = request.match_info["group"]
    body = await _json_object(request)
    conf = _conf(body.get("conf"))
    if member.id not in conf.members():
        raise BadRequest(f'"conf" does not name {member.id}')
    created = group not in member.nodes
    await member.join_group(group, conf)
    return Response(status=201 if created else 200)


async def leave_group(request: Request) -> Response:
    """`DELETE /v1/internal/groups/{group}`: this node stops keeping the group and drops
    its log and state (call it once its removal is committed). 204, also when it kept
    no such group."""
    member = _member(request)
    await member.leave_group(request.match_info["group"])
    return Response(status=204)
