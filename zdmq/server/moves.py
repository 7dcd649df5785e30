"""Moving one replica of a group from a node to another, online (docs/design.md §19).

A move is a few single changes of the group's configuration, each committed through
its log (raft.core's `next_change`): `add` joins as a learner (its node first starts
keeping the group, empty), catches up from the leader (a snapshot, then the log), is
promoted to voter, and only then is `remove` removed; its node then drops the group.
A member that leads the group and is to be removed hands leadership to another voter
first, so the group has no leaderless gap beyond a hand-over.

`run_move` keeps nothing of its own: each step is read off the configuration the
group's leader has committed, so a move cut short anywhere (its runner killed, a node
restarted, a leader changed) is finished by running it again with the same arguments.
It reaches the nodes through `call(target, method, path, body)`, a node-signed call to
a node (`target` a node id) or to a group's leader (`target` ("group", id)).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from zdmq.errors import NodeUnavailable, ZdmqError
from zdmq.raft.core import Conf, next_change

__all__ = ["Call", "MoveProgress", "MoveStuck", "run_move"]

#: A node-signed call: (node id, or ("group", group id) for its leader), method, path,
#: JSON body (or None) -> the reply's JSON (None for an empty reply). Raises ZdmqError.
Call = Callable[[str | tuple[str, str], str, str, Any], Awaitable[Any]]

POLL_S = 0.1


class MoveStuck(NodeUnavailable):
    """A move made no progress within its time: the group has no leader, or the new
    member does not catch up (503 node_unavailable). Run it again once the cause is gone;
    it goes on from where the group's log stands."""


@dataclass(slots=True)
class MoveProgress:
    """What a move has done so far (for `zdmq cluster moves` and the status page)."""

    group: str
    add: str | None
    remove: str | None
    step: str = "starting"
    #: The new member's log position against the leader's commit index, while it
    #: catches up.
    matched: int = 0
    commit_index: int = 0
    #: What the new member holds: messages, and the bytes of the group's state it has
    #: pulled (a snapshot) of `snapshot_size`.
    messages: int = 0
    bytes: int = 0
    snapshot_size: int = 0
    started: float = field(default_factory=time.time)
    finished: float | None = None
    done: bool = False


async def _view(call: Call, group: str) -> dict[str, Any]:
    """The group's configuration as its leader sees it (a follower that answers does not
    know how far each member's log matches: the call goes on to the leader it names)."""
    path = f"/v1/internal/groups/{group}"
    view = await call(("group", group), "GET", path, None)
    assert isinstance(view, dict)
    leader, answered = view.get("leader"), view.get("node")
    if leader is not None and answered is not None and leader != answered:
        view = await call(leader, "GET", path, None)
        assert isinstance(view, dict)
    return view


async def _learner_progress(call: Call, group: str, node: str, progress: MoveProgress) -> None:
    """What the new member holds so far (best effort: progress only)."""
    try:
        view = await call(node, "GET", f"/v1/internal/groups/{group}", None)
    except ZdmqError:
        return
    if isinstance(view, dict):
        progress.messages = int(view.get("messages", 0))
        progress.bytes = int(view.get("snapshot_bytes", 0))
        progress.snapshot_size = int(view.get("snapshot_size", 0))


async def run_move(
    call: Call,
    group: str,
    add: str | None,
    remove: str | None,
    *,
    progress: MoveProgress | None = None,
    step_timeout_s: float = 120.0,
) -> Conf:
    """Moves `group`'s replica from `remove` to `add` (either may be None: a replica
    added, or one removed) and returns the group's configuration once done."""
    progress = progress or MoveProgress(group, add, remove)
    deadline = time.monotonic() + step_timeout_s
    while True:
        try:
            view = await _view(call, group)
        except NodeUnavailable:
            view = None
        if view is None or not view["committed"] or view["leader"] is None:
            progress.step = f"waiting for group {group} to have a leader (a majority up)"
            if time.monotonic() > deadline:
                raise MoveStuck(f"group {group}: no leader with a settled configuration")
            await asyncio.sleep(POLL_S)  # an election, or a change committing
            continue
        conf = Conf(frozenset(view["conf"]["voters"]), frozenset(view["conf"]["learners"]))
        change = next_change(conf, add, remove)
        if change is None:
            if remove is not None:
                progress.step = f"dropping the group on {remove}"
                # A dead node being replaced is out of the group whether it hears or not.
                with contextlib.suppress(NodeUnavailable):
                    await call(remove, "DELETE", f"/v1/internal/groups/{group}", None)
            progress.step, progress.done, progress.finished = "done", True, time.time()
            return conf
        if change.kind == "add_learner":
            progress.step = f"starting the group on {change.node}"
            start = Conf(conf.voters, conf.learners | {change.node})
            await call(
                change.node, "PUT", f"/v1/internal/groups/{group}", {"conf": start.to_dict()}
            )
        elif change.kind == "promote":
            progress.step = f"catching {change.node} up"
            progress.matched = int(view["match"].get(change.node, 0))
            progress.commit_index = int(view["commit_index"])
            await _learner_progress(call, group, change.node, progress)
            if progress.matched < progress.commit_index:
                if time.monotonic() > deadline:
                    raise MoveStuck(
                        f"group {group}: {change.node} is at {progress.matched} of "
                        f"{progress.commit_index}"
                    )
                await asyncio.sleep(POLL_S)
                continue
        elif change.node == view["leader"]:
            progress.step = f"handing the lead over from {change.node}"
            to = min(conf.voters - {change.node})
            await call(
                ("group", group), "POST", f"/v1/internal/groups/{group}/transfer", {"to": to}
            )
            await asyncio.sleep(POLL_S)
            continue
        progress.step = f"{change.kind} {change.node}"
        try:
            await call(
                ("group", group),
                "POST",
                f"/v1/internal/groups/{group}/changes",
                {
                    "change": change.kind,
                    "node": change.node,
                },
            )
        except ZdmqError as e:
            if e.status not in (400, 421, 503) or time.monotonic() > deadline:
                raise
            progress.step = f"{change.kind} {change.node}: waiting for group {group} ({e.code})"
            await asyncio.sleep(POLL_S)  # refused for now (a change under way, a new leader)
            continue
        deadline = time.monotonic() + step_timeout_s  # each step gets its own time
