"""Read-only views of a NodeState for the unit tests: what it stores, where, in what order."""

from __future__ import annotations

from zdmq.server.state import NodeState


def all_ids(state: NodeState) -> set[str]:
    """Every message id the state stores: leased, delayed and ready."""
    return set(state.hot) | {mid for q in state.queues for mid in state.ready_list(q)}


def where(state: NodeState, queue: str = "jobs") -> tuple[list[str], set[str], set[str]]:
    """(ready ids in order, leased ids, delayed ids) of a queue on this node."""
    lq = state.queues.get(queue)
    if lq is None:
        return [], set(), set()
    return state.ready_list(queue), set(lq.leased), set(lq.delayed)
