"""Which replicas and preferred leaderships move when the cluster's nodes change.

A plan is an ordered list of `Step`s (zdmq/cluster_map.py), each changing one group by
one member: a move (a voter replaced by a node that held no copy of the group, which the
group carries out as add learner, promote, remove) or a leader change (which voter is the
preferred leader). Applying a plan with `apply_plan` gives the map the cluster ends in;
every map on the way is a valid one, so an executor may stop after any step.

What a plan guarantees, for a map with no move under way (no learners):

- No step puts two copies of a group on one node, and every group keeps `replication`
  voters after every step.
- `plan(m, nodes)` ends with every replica on `nodes`, each holding floor or ceil of
  G x R / N replicas (G groups, R replication, N = len(nodes)), and each the preferred
  leader of floor or ceil of G / N groups whenever the groups it is a member of allow it
  (Hall's condition; balanced replicas with R >= 2 have met it on every layout tested).
- It moves what balance needs and little more: replicas go from the most loaded nodes
  to the least loaded, and a replica is copied once, to where it ends (a move of this
  plan that balance would move on is redirected instead). Adding the (N+1)th node to a
  balanced map moves at most ceil(G x R / (N+1)) replicas, all to the new node. Removing
  a node moves its replicas, each to the least loaded node that holds no copy of its
  group, and a few more only where few nodes remain for R copies (the least loaded may
  all hold copies of the last groups: up to a tenth more with R = 4 on 7 nodes).
  A leader change takes the shortest chain of hand-overs that fixes one node's count.
- A leaving node's preferred leaderships go with its replicas, each to the node its
  replica moves to, chosen among the least loaded as the one that leads the fewest; leader
  changes then even out what is left (usually a small fraction of the moves).
- `plan_replace(m, old, new)` moves every replica of `old` to `new`, one for one, and
  `new` takes `old`'s place in each group's order: it prefers what `old` preferred, and
  nothing else changes.
- The same map and nodes give the same steps: nothing here is random and no set of
  strings is iterated (their order changes with PYTHONHASHSEED).

Pure: no I/O, no awaits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from zdmq.cluster_map import ClusterMap, MapError, Step

__all__ = ["plan", "plan_add", "plan_remove", "plan_replace", "spread"]


def spread(total: int, nodes: int) -> tuple[int, int]:
    """The floor and ceil of `total` over `nodes`: what each node should hold."""
    return total // nodes, -(-total // nodes)


def plan_add(m: ClusterMap, node: str) -> list[Step]:
    """Steps that give `node` (in the map, holding nothing yet) its share of replicas
    and preferred leaderships, taken from the nodes that have the most."""
    _check_settled(m)
    if node not in m.nodes:
        raise MapError(f"node {node!r} is not in the map: add it (with_node) first")
    if m.holds(node):
        raise MapError(f"node {node!r} already holds replicas")
    return plan(m, list(m.nodes))


def plan_remove(m: ClusterMap, node: str) -> list[Step]:
    """Steps that move every replica and preferred leadership off `node`, to the least
    loaded nodes; after them `without_node(node)` takes it out of the map."""
    if node not in m.nodes:
        raise MapError(f"node {node!r} is not in the map")
    return plan(m, [n for n in m.nodes if n != node])


def plan_replace(m: ClusterMap, old: str, new: str) -> list[Step]:
    """Steps that move every replica of `old` to `new` (in the map, holding nothing),
    `new` taking `old`'s place in each group's order, in group order."""
    _check_settled(m)
    for node in (old, new):
        if node not in m.nodes:
            raise MapError(f"node {node!r} is not in the map")
    if old == new:
        raise MapError(f"replace {old!r} with itself")
    if m.holds(new):
        raise MapError(f"node {new!r} already holds replicas")
    return [Step(g, add=new, remove=old) for g in m.groups_of_node(old)]


def plan(m: ClusterMap, nodes: Sequence[str]) -> list[Step]:
    """Steps that take every replica and preferred leadership to `nodes` (a subset of
    the map's), balanced: the replicas of leaving nodes move first, then replicas even
    out, then preferred leaderships."""
    _check_settled(m)
    wanted = list(nodes)
    if not wanted:
        raise MapError("plan: no nodes to place replicas on")
    for node in wanted:
        if node not in m.nodes:
            raise MapError(f"node {node!r} is not in the map: add it (with_node) first")
    if len(set(wanted)) != len(wanted):
        raise MapError(f"plan: a node is named twice in {wanted}")
    if len(wanted) < m.replication:
        raise MapError(
            f"plan: {m.replication} voters per group need at least {m.replication} nodes, "
            f"{len(wanted)} are left"
        )
    work = _Work(m, wanted)
    work.move_off_leaving()
    work.balance_replicas()
    work.balance_leaders()
    return work.steps


def _check_settled(m: ClusterMap) -> None:
    moving = m.moving()
    if moving:
        raise MapError(
            f"groups {list(moving[:5])} have learners: finish the moves under way before planning"
        )


class _Work:
    """The map as the plan so far leaves it, in node and group indices (ints: their sets
    iterate the same way on every run), with each node's groups and leaderships kept as
    insertion-ordered dicts so that picking "the first that fits" is deterministic."""

    def __init__(self, m: ClusterMap, wanted: Sequence[str]) -> None:
        self.node_ids = list(m.nodes)
        index = {n: i for i, n in enumerate(self.node_ids)}
        self.group_ids = m.groups
        self.members = [[index[n] for n in m.members(g)] for g in m.groups]
        self.wanted = [False] * len(self.node_ids)
        for n in wanted:
            self.wanted[index[n]] = True
        self.targets = [index[n] for n in wanted]  # in the caller's order: ties go first
        self.holds: list[dict[int, None]] = [{} for _ in self.node_ids]
        self.leads: list[dict[int, None]] = [{} for _ in self.node_ids]
        for g, voters in enumerate(self.members):
            for node in voters:
                self.holds[node][g] = None
            self.leads[voters[0]][g] = None
        self.lead_lo, self.lead_hi = spread(len(self.members), len(self.targets))
        # The plan so far; a move rewritten away (below) leaves a hole.
        self._steps: list[Step | None] = []
        # node -> {group: index of the move in this plan that put the node in the group}
        self.arrived: list[dict[int, int]] = [{} for _ in self.node_ids]

    @property
    def steps(self) -> list[Step]:
        return [s for s in self._steps if s is not None]

    # ---- the two kinds of step --------------------------------------------------------
    def move(self, g: int, add: int, remove: int) -> None:
        """Moves `g`'s replica from `remove` to `add`. When an earlier move of this plan
        put `remove` in `g`, that move is redirected to `add` instead (or dropped, if `add`
        is where it came from): a replica is copied once, to where it ends."""
        voters = self.members[g]
        at = voters.index(remove)
        voters[at] = add
        del self.holds[remove][g]
        self.holds[add][g] = None
        if at == 0:
            del self.leads[remove][g]
            self.leads[add][g] = None
        group, to = self.group_ids[g], self.node_ids[add]
        earlier = self.arrived[remove].pop(g, None)
        if earlier is None:
            self.arrived[add][g] = len(self._steps)
            self._steps.append(Step(group, add=to, remove=self.node_ids[remove]))
            return
        first = self._steps[earlier]
        assert first is not None and first.remove is not None
        if first.remove == to:
            self._steps[earlier] = None
        else:
            self._steps[earlier] = Step(group, add=to, remove=first.remove)
            self.arrived[add][g] = earlier

    def lead(self, g: int, node: int) -> None:
        voters = self.members[g]
        del self.leads[voters[0]][g]
        voters.remove(node)
        voters.insert(0, node)
        self.leads[node][g] = None
        self._steps.append(Step(self.group_ids[g], leader=self.node_ids[node]))

    # ---- the phases, in plan order ------------------------------------------------------
    def move_off_leaving(self) -> None:
        """Every replica on a leaving node goes to the least loaded staying node that
        holds no copy of its group; a replica that is its group's preferred leader goes,
        among those, to the one that leads the fewest, as the leadership goes with it."""
        for node in range(len(self.node_ids)):
            if self.wanted[node]:
                continue
            for g in list(self.holds[node]):
                voters = self.members[g]
                leading = voters[0] == node
                to = min(
                    (t for t in self.targets if t not in voters),
                    key=lambda t: (len(self.holds[t]), len(self.leads[t]) if leading else 0),
                )
                self.move(g, add=to, remove=node)

    def balance_replicas(self) -> None:
        """Moves a replica from a most loaded node to a least loaded one until every
        node holds floor or ceil of the mean: each move narrows the gap between the two,
        and none is made that does not, so the count is what balance needs."""
        while True:
            found = self._next_move()
            if found is None:
                return
            g, heavy, light = found
            self.move(g, add=light, remove=heavy)

    def _next_move(self) -> tuple[int, int, int] | None:
        load = [len(h) for h in self.holds]
        heavy = max(self.targets, key=lambda t: load[t])
        light = min(self.targets, key=lambda t: load[t])
        if load[heavy] - load[light] < 2:
            return None
        g = self._group_to_move(heavy, light)
        if g is not None:
            return g, heavy, light
        # Every group of the heaviest holds a copy on the lightest already (rare: few
        # nodes, many groups): any pair two apart with a group to move will do.
        by_load = sorted(self.targets, key=lambda t: load[t])
        for light in by_load:
            for heavy in reversed(by_load):
                if load[heavy] - load[light] < 2:
                    break
                g = self._group_to_move(heavy, light)
                if g is not None:
                    return g, heavy, light
        return None

    def _group_to_move(self, heavy: int, light: int) -> int | None:
        """A group of `heavy` that `light` holds no copy of. First one this plan moved to
        `heavy` (redirecting that move costs no copy); then one `heavy` leads when handing
        that leadership to `light` evens out leaderships too (the move then does a leader
        change's work); otherwise one it does not lead, leaving leaderships as they are."""
        for g in self.arrived[heavy]:
            if light not in self.members[g]:
                return g
        leads = self.leads[heavy]
        if self._evens_leads(heavy, light):
            for g in leads:
                if light not in self.members[g]:
                    return g
        fallback = None
        for g in self.holds[heavy]:
            if light in self.members[g]:
                continue
            if g not in leads:
                return g
            if fallback is None:
                fallback = g
        return fallback

    def _evens_leads(self, giver: int, taker: int) -> bool:
        """Whether one leadership from `giver` to `taker` brings them nearer their
        floor..ceil range of G / N."""
        lo, hi = self.lead_lo, self.lead_hi

        def off(count: int) -> int:
            return max(0, count - hi) + max(0, lo - count)

        a, b = len(self.leads[giver]), len(self.leads[taker])
        return off(a - 1) + off(b + 1) < off(a) + off(b)

    def balance_leaders(self) -> None:
        """Brings every node's preferred leaderships into floor..ceil of G / N by
        changing which member comes first: first each node above the ceil hands one on,
        then each node below the floor takes one, each time along the shortest chain of
        hand-overs between members that does it. When no chain exists, no choice of
        first members among these groups can do it (the nodes the search reached lead
        every group they are members of), and the node is left as it is."""
        for node in self.targets:
            while len(self.leads[node]) > self.lead_hi:
                chain = self._chain_from(node)
                if chain is None:
                    break
                for g, to in chain:
                    self.lead(g, to)
        for node in self.targets:
            while len(self.leads[node]) < self.lead_lo:
                chain = self._chain_to(node)
                if chain is None:
                    break
                for g, to in chain:
                    self.lead(g, to)

    def _chain_from(self, start: int) -> list[tuple[int, int]] | None:
        """Hand-overs (group, new leader) that take one leadership off `start` and end on
        a node below the ceil; the nodes between give one and take one."""
        came: dict[int, tuple[int, int]] = {}  # node -> (the node it takes from, group)
        queue = deque([start])
        seen = {start}
        while queue:
            x = queue.popleft()
            for g in self.leads[x]:
                for v in self.members[g]:
                    if v in seen or not self.wanted[v]:
                        continue
                    seen.add(v)
                    came[v] = (x, g)
                    if len(self.leads[v]) < self.lead_hi:
                        return _trace(came, v, start)
                    queue.append(v)
        return None

    def _chain_to(self, start: int) -> list[tuple[int, int]] | None:
        """Hand-overs that give `start` one more leadership, taken in the end from a
        node above the floor."""
        gave: dict[int, tuple[int, int]] = {}  # node -> (the node it gives to, group)
        queue = deque([start])
        seen = {start}
        while queue:
            y = queue.popleft()
            for g in self.holds[y]:
                x = self.members[g][0]
                if x in seen or not self.wanted[x]:
                    continue
                seen.add(x)
                gave[x] = (y, g)
                if len(self.leads[x]) > self.lead_lo:
                    chain = []
                    while x != start:
                        y, g = gave[x]
                        chain.append((g, y))
                        x = y
                    return chain
                queue.append(x)
        return None


def _trace(came: dict[int, tuple[int, int]], end: int, start: int) -> list[tuple[int, int]]:
    chain = []
    node = end
    while node != start:
        prev, g = came[node]
        chain.append((g, node))
        node = prev
    chain.reverse()
    return chain
