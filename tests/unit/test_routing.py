"""GroupRouter, the search for a group's leader the client and the nodes share: fed
scripted replies (no sockets), it must follow hints, wait out elections and hand-overs,
and give up after its bound."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from zdmq import routing
from zdmq.errors import NodeUnavailable, NotLeader
from zdmq.routing import GroupRouter, group_members

MEMBERS = group_members(["n1", "n2", "n3", "n4"], 3)


def scripted(replies: dict[str, list[str | None]]) -> tuple[Callable[[str], object], list[str]]:
    """send(node): pops that node's next reply: "ok", "down", or a leader hint (421)."""
    sent: list[str] = []

    async def send(node: str) -> str:
        sent.append(node)
        reply = replies[node].pop(0) if replies[node] else "ok"
        if reply == "ok":
            return node
        if reply == "down":
            err = NodeUnavailable(f"{node} down")
            err.unsent = True
            raise err
        raise NotLeader(f"{node} does not lead", group="n1", leader=reply)

    return send, sent


async def test_a_hint_is_followed_at_once() -> None:
    send, sent = scripted({"n1": ["n2"], "n2": [], "n3": []})
    assert await GroupRouter(MEMBERS).call("n1", send) == "n2"
    assert sent == ["n1", "n2"]


async def test_a_hint_naming_a_node_the_members_list_lacks_is_followed_if_reachable() -> None:
    # Group n1's replica moved from n3 to n4 since the list was made: n2 names n4.
    send, sent = scripted({"n1": ["down"], "n2": ["n4"], "n3": ["n4"], "n4": []})
    assert await GroupRouter(MEMBERS).call("n1", send) == "n4"
    assert sent == ["n1", "n2", "n4"]
    # A node no call can reach is not followed: the members are tried instead.
    send, sent = scripted({"n1": ["n9"], "n2": [], "n3": []})
    assert await GroupRouter(MEMBERS, nodes=["n1", "n2", "n3", "n4"]).call("n1", send) == "n2"


async def test_a_leader_handing_over_is_asked_again_after_a_pause_not_spun_on() -> None:
    # n2 still leads but hands over (it names itself); n3 does not lead yet (names n2).
    send, sent = scripted({"n1": ["n2"], "n2": ["n2", "n2", "n2"], "n3": ["n2", "n2"]})
    t0 = time.monotonic()
    assert await GroupRouter(MEMBERS).call("n1", send) in ("n2", "n3")
    assert time.monotonic() - t0 >= 0.1  # it paused between the refusals
    assert len(sent) <= 8


async def test_hints_that_go_round_in_a_circle_give_an_election_time() -> None:
    # n1 names n2, n2 names n1, for a while: a hand-over in flight between them.
    send, _ = scripted({"n1": ["n2", "n2", "n2"], "n2": ["n1", "n1", "n1"], "n3": ["n1"] * 3})
    t0 = time.monotonic()
    await GroupRouter(MEMBERS).call("n1", send)
    assert time.monotonic() - t0 >= 0.15


async def test_it_gives_up_with_the_last_refusal_after_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(routing, "BACKOFF_S", (0.001,) * routing.ATTEMPTS)
    send, sent = scripted({n: ["n2"] * 20 for n in ("n1", "n2", "n3")})
    with pytest.raises(NotLeader):
        await GroupRouter(MEMBERS).call("n1", send)
    assert len(sent) == routing.ATTEMPTS


async def test_a_silent_member_is_left_out_while_the_others_elect_and_tried_in_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(routing, "BACKOFF_S", (0.001,) * routing.ATTEMPTS)
    # n3, the leader that n2 still names, is paused: n1 and n2 refuse (an election runs),
    # then n2 leads. n3 is never sent the call, so no call waits out its timeout.
    send, sent = scripted({"n1": [None] * 20, "n2": ["n3", None], "n3": []})
    router = GroupRouter(MEMBERS, silent=lambda n: n == "n3")
    assert await router.call("n1", send) == "n2"
    assert "n3" not in sent
    # Every other member refusing for half the tries, n3 is tried after all (silence
    # is this node's own view: n3 may lead, cut off from this node only).
    send, sent = scripted({"n1": [None] * 20, "n2": [None] * 20, "n3": []})
    assert await router.call("n1", send) == "n3"
    assert sent.index("n3") >= routing.ATTEMPTS // 2
    # A group whose members are all silent is tried as it is, from its first member.
    send, sent = scripted({"n1": [], "n2": [], "n3": []})
    assert await GroupRouter(MEMBERS, silent=lambda n: True).call("n1", send) == "n1"
