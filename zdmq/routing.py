"""Replica groups as callers see them: who is in each, and how a call finds its leader.

With `replication: R` above 1 on N nodes there are N replica groups, one per node id:
group `g` keeps what the placement puts on node `g`, on the ring window of R nodes that
starts at `g` (`group_members`). Its preferred leader is node `g`, so a caller first
calls `g` itself, as with one copy; when `g` is down or does not lead, the call names
the group in the `zdmq-group` header and goes to another member. A member that does not
lead answers 421 `not_leader`, naming the leader it knows of.

`GroupRouter` is that search, shared by the client and by nodes calling other groups.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from zdmq.errors import NodeUnavailable, NotLeader, ZdmqError

__all__ = ["GROUP_HEADER", "GroupRouter", "group_members", "members_of_view"]

# Names the replica group a call is for (a node is a member of several); absent: the
# group of the node called, whose id is the node's own.
GROUP_HEADER = "zdmq-group"

T = TypeVar("T")

# Tries of one call, and the pauses between them: about 8 s in all, what an election
# after a leader's crash takes at worst on a busy 2-core host (two at once, one of their
# members just restarted).
ATTEMPTS = 12
BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
# A member that did not answer is tried last for this long (a later call does not wait
# out its timeout again while it is down or paused).
SUSPECT_S = 5.0


def group_members(node_ids: Sequence[str], replication: int) -> dict[str, tuple[str, ...]]:
    """Every group (by id) and its members, the ring window that starts at it."""
    n = len(node_ids)
    r = min(replication, n)
    return {g: tuple(node_ids[(i + k) % n] for k in range(r)) for i, g in enumerate(node_ids)}


def members_of_view(groups: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Every group's members as callers try them, from the `groups` of a `GET /v1/cluster`
    reply: its voters (the preferred leader first), then its learners."""
    return {g["id"]: (*g["members"], *g.get("learners", ())) for g in groups}


class GroupRouter:
    """Finds a group's leader for a call: the leader last heard of (`known(group)`, the
    caller's own knowledge if it is a member, else the last 421's hint), then the other
    members in ring order; members that did not answer lately (a timeout here, or
    `silent(node)`) last.

    A group's members may have changed since `members` was made (a replica moved to
    another node): a leader named by a member's 421 is followed wherever it is, if it is
    one of `nodes` (the nodes a call can reach; default: every member of every group)."""

    def __init__(
        self,
        members: Mapping[str, Sequence[str]],
        known: Callable[[str], str | None] | None = None,
        silent: Callable[[str], bool] | None = None,
        nodes: Iterable[str] | None = None,
    ) -> None:
        self.members = members
        self.nodes = (
            frozenset(nodes)
            if nodes is not None
            else frozenset(n for ms in members.values() for n in ms)
        )
        self._known = known
        # A node's own view of which members stopped answering (its Raft traffic): they
        # are tried last, before a call waits out their timeout.
        self._silent = silent
        self._hints: dict[str, str] = {}
        self._suspect: dict[str, float] = {}  # member -> until when it is tried last

    def hint(self, group: str) -> str | None:
        return self._hints.get(group)

    def candidates(self, group: str) -> list[str]:
        """Where `group`'s leader may be, the likeliest first."""
        known = (self._known(group) if self._known is not None else None) or self._hints.get(group)
        order = list(self.members[group])
        if known in order:
            order.remove(known)
            order.insert(0, known)
        elif known is not None and known in self.nodes:
            order.insert(0, known)  # a member the list does not name (yet)
        if self._suspect:
            now = time.monotonic()
            for node, until in list(self._suspect.items()):
                if until <= now:
                    del self._suspect[node]
        silent = self._silent
        if self._suspect or silent is not None:
            suspect = self._suspect
            # Stable: the rest keep their order.
            order.sort(key=lambda n: n in suspect or (silent is not None and silent(n)))
        return order

    def _quiet(self, order: Sequence[str]) -> frozenset[str]:
        """The members of `order` that did not answer lately (none if that is all)."""
        silent = self._silent
        quiet = frozenset(
            n for n in order if n in self._suspect or (silent is not None and silent(n))
        )
        return quiet if len(quiet) < len(order) else frozenset()

    async def call(
        self, group: str, send: Callable[[str], Awaitable[T]], *, once: bool = False
    ) -> T:
        """`send(node)` to `group`'s leader: follows 421 hints, moves on to the next member
        when one does not answer, pausing between rounds (an election's time), up to
        ATTEMPTS tries. A call that must not run twice (`once`: a pop) is sent again only
        where it surely did not run: after a 421, or to a member nothing listens on."""
        last: ZdmqError | None = None
        tried: set[str] = set()
        for attempt in range(ATTEMPTS):
            order = self.candidates(group)
            # For the first half of the tries, members that did not answer lately are left
            # out while another may take the call: a call does not wait out a paused
            # leader's timeout while the rest of its group elects another.
            skip = self._quiet(order) if attempt < ATTEMPTS // 2 else frozenset()
            target = next((n for n in order if n not in tried and n not in skip), None)
            if target is None:  # each member tried once: give an election time, again
                tried.clear()
                await asyncio.sleep(BACKOFF_S[attempt])
                target = next((n for n in order if n not in skip), order[0])
            tried.add(target)
            try:
                result = await send(target)
            except NotLeader as e:
                last = e
                hint = e.leader
                if hint is not None and hint in self.nodes and hint != target:
                    if hint in tried:  # sent back where it was refused: leadership moves
                        await asyncio.sleep(BACKOFF_S[attempt])
                    self._hints[group] = hint
                    tried.discard(hint)
                else:  # an election is running, or a hand-over: wait for it
                    if hint == target:
                        tried.discard(hint)
                    await asyncio.sleep(BACKOFF_S[attempt])
            except NodeUnavailable as e:
                last = e
                self._suspect[target] = time.monotonic() + SUSPECT_S
                if self._hints.get(group) == target:
                    del self._hints[group]
                if once and not e.unsent:
                    raise
            else:
                self._suspect.pop(target, None)
                return result
        assert last is not None
        raise last
