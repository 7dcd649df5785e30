"""`zdmq status`: the cluster status (`GET /v1/status`, see zdmq/server/status.py) drawn
in the terminal with rich: the cluster map's epoch, the nodes (up or down, health,
messages, rates), the replica groups as their leaders see them (term, commit index, each
follower's lag), while replicas move or nodes leave the rebalancer's progress, the
deepest queues with their depth on each node, and the message rates with a sparkline of
the last minute. `--watch` redraws it every second; `--json` prints the endpoint's JSON
as it is.

The moves' progress (`moves_progress`, `render_moves`, `moves_line`) is drawn the same way
here and by `zdmq cluster moves` and `--wait` (zdmq/cli.py), from `GET /v1/cluster/moves`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from zdmq import _http
from zdmq.auth import bearer_headers
from zdmq.config import ClusterConfig
from zdmq.errors import ZdmqError

__all__ = [
    "MovesProgress",
    "fetch_status",
    "moves_active",
    "moves_line",
    "moves_progress",
    "render_moves",
    "render_status",
    "status_command",
]

STATUS_TIMEOUT_S = 3.0
SPARK = "▁▂▃▄▅▆▇█"
SERIES = ("push", "pop", "receive", "ack")


async def fetch_status(
    config: ClusterConfig, token: str | None, pool: _http.HttpPool
) -> tuple[dict[str, Any] | None, dict[str, ZdmqError]]:
    """The status as the first node that answers gives it (in cluster.yaml's order), and
    the errors of those asked before it; (None, every node's error) if none answers.
    A refused token (401, 403) is raised: no other node would take it either."""
    errors: dict[str, ZdmqError] = {}
    headers = bearer_headers(token)
    for node in config.nodes:
        try:
            reply = await _http.call(pool, "GET", node.url + "/v1/status", headers=headers)
            return dict(reply.json()), errors
        except ZdmqError as e:
            if e.status in (401, 403):
                raise
            errors[node.id] = e
    return None, errors


def _spark(values: list[float]) -> str:
    top = max(values, default=0.0)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(
        SPARK[min(int(v / top * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)] for v in values
    )


def _rate(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 or v == int(v) else f"{v:,.1f}"


def _uptime(s: float | None) -> str:
    if s is None:
        return ""
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


# ---- the rebalancer's moves ----------------------------------------------------------------
def moves_active(moves: dict[str, Any] | None) -> bool:
    """Whether the rebalancer has work: a move under way, steps planned, nodes leaving."""
    if not moves:
        return False
    return (
        moves.get("current") is not None
        or int(moves.get("pending_steps") or 0) > 0
        or bool(moves.get("leaving"))
    )


@dataclass(frozen=True, slots=True)
class MovesProgress:
    """What the progress bar shows: `done` of `total` steps (moves done, and the steps
    still planned, the move under way among them), the time left at the rate of the moves
    done (None: no move done yet to tell), the move under way in words."""

    done: int
    total: int
    eta_s: float | None
    current: str | None
    leaving: tuple[str, ...]
    last_error: str | None
    epoch: int | None


def _duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def _move_text(cur: dict[str, Any]) -> str:
    """ "group n2: n1 -> n5, catching n5 up, 1,200 of 3,000 entries (800/s), 4s"."""
    text = f"group {cur['group']}: {cur.get('remove') or '(none)'} -> {cur.get('add') or '(none)'}"
    text += f", {cur.get('step', '')}"
    commit = int(cur.get("commit_index") or 0)
    if commit:
        rate = float(cur.get("entries_per_s") or 0.0)
        text += f", {int(cur.get('matched') or 0):,} of {commit:,} entries ({rate:,.0f}/s)"
    size = int(cur.get("snapshot_size") or 0)
    if size:
        mib, of = int(cur.get("bytes") or 0) / (1 << 20), size / (1 << 20)
        speed = float(cur.get("bytes_per_s") or 0.0) / (1 << 20)
        text += f", {mib:,.1f} of {of:,.1f} MiB ({speed:,.1f} MiB/s)"
    if cur.get("messages"):
        text += f", {int(cur['messages']):,} messages"
    return text + f", {_duration(float(cur.get('elapsed_s') or 0.0))}"


def moves_progress(
    moves: dict[str, Any], *, base: int = 0, rate: float | None = None
) -> MovesProgress:
    """The progress in `moves` (`GET /v1/cluster/moves`): the moves done past `base`
    (the count when the caller started watching; the rebalancer's own count starts again
    at 0 on a new home-group leader) against those plus the steps still planned. The time
    left is the pending steps at `rate` moves a second, or, without one, at the mean time
    the last moves done took."""
    done = max(int(moves.get("moves_done") or 0) - base, 0)
    pending = int(moves.get("pending_steps") or 0)
    if rate is None:
        took = [float(p["elapsed_s"]) for p in moves.get("done") or [] if p.get("done")]
        rate = len(took) / sum(took) if took and sum(took) > 0 else None
    eta: float | None = 0.0 if not pending else (pending / rate if rate else None)
    current = moves.get("current")
    if eta is not None and current is not None:
        eta = max(eta - float(current.get("elapsed_s") or 0.0), 0.0)
    return MovesProgress(
        done=done,
        total=done + pending,
        eta_s=eta,
        current=_move_text(current) if current is not None else None,
        leaving=tuple(moves.get("leaving") or ()),
        last_error=moves.get("last_error"),
        epoch=moves.get("epoch"),
    )


def _left(p: MovesProgress) -> str:
    if p.total == p.done:
        return ""
    return "time left: estimating" if p.eta_s is None else f"about {_duration(p.eta_s)} left"


def moves_line(p: MovesProgress, width: int = 30) -> str:
    """The progress on one line of plain text (for output that is not a terminal)."""
    frac = p.done / p.total if p.total else 1.0
    bar = "#" * int(frac * width)
    line = f"moves [{bar:<{width}}] {p.done}/{p.total}"
    if left := _left(p):
        line += f", {left}"
    if p.current:
        line += f"; {p.current}"
    if p.leaving:
        line += f"; leaving: {', '.join(p.leaving)}"
    if p.last_error:
        line += f"; last error: {p.last_error}"
    return line


def render_moves(p: MovesProgress, title: str = "Moves") -> Group:
    """The progress as rich renderables: a bar, the move under way, the nodes leaving."""
    bar = Table.grid(padding=(0, 1))
    for _ in range(3):
        bar.add_column()
    bar.add_row(
        ProgressBar(total=max(p.total, 1), completed=p.done if p.total else 1, width=30),
        f"{p.done}/{p.total} steps",
        Text(_left(p), style="dim"),
    )
    parts: list[Any] = [Text(title, style="bold"), bar]
    if p.current:
        parts.append(Text(f"now: {p.current}"))
    if p.leaving:
        parts.append(Text(f"leaving: {', '.join(p.leaving)}", style="yellow"))
    if p.last_error:
        parts.append(Text(f"last error: {p.last_error}", style="red"))
    return Group(*parts)


def render_status(status: dict[str, Any]) -> Group:
    """The status as rich tables."""
    nodes = status["nodes"]
    up = sum(1 for n in nodes if n["up"])
    epoch = f", map epoch {status['epoch']}" if status.get("epoch") is not None else ""
    head = Text.assemble(
        ("zdmq ", "bold"),
        f"{up} of {len(nodes)} nodes up, replication {status['replication']}{epoch}, "
        f"as {status['node']} sees it",
        style="red" if up < len(nodes) else "",
    )

    node_table = Table(title="Nodes", title_justify="left", expand=False)
    for col, justify in (
        ("node", "left"),
        ("url", "left"),
        ("status", "left"),
        ("uptime", "right"),
        ("messages", "right"),
        ("push/s", "right"),
        ("pop/s", "right"),
        ("leads", "left"),
    ):
        node_table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for n in nodes:
        if not n["up"]:
            node_table.add_row(
                n["id"], n["url"], Text("DOWN", style="bold red"), "", "", "", "", ""
            )
            continue
        rate = n.get("rate") or {}
        leads = [g for g, s in (n.get("groups") or {}).items() if s.get("role") == "leader"]
        state = Text(
            str(n["status"]).upper(), style="bold green" if n["status"] == "ok" else "bold yellow"
        )
        if n.get("leaving"):
            state.append(" leaving", style="yellow")
        node_table.add_row(
            n["id"],
            n["url"],
            state,
            _uptime(n.get("uptime_s")),
            f"{n.get('messages', 0):,}",
            _rate(rate.get("push", 0.0)),
            _rate(rate.get("pop", 0.0) + rate.get("receive", 0.0)),
            " ".join(leads),
        )
    parts: list[Any] = [head, node_table]

    groups: dict[str, tuple[str, dict[str, Any]]] = {}
    members: dict[str, list[str]] = {}
    for n in nodes:
        for g, s in (n.get("groups") or {}).items():
            members.setdefault(g, []).append(n["id"])
            if s.get("role") == "leader":
                groups[g] = (n["id"], s)
    if members:
        group_table = Table(title="Replica groups", title_justify="left")
        for col in ("group", "leader", "term", "commit", "follower lag (entries)"):
            group_table.add_column(col, justify="right" if col in ("term", "commit") else "left")
        for g in sorted(members):
            if g not in groups:
                group_table.add_row(g, Text("no leader", style="bold red"), "", "", "")
                continue
            leader, s = groups[g]
            lag = s.get("lag") or {}
            lag_text = Text()
            for i, (peer, behind) in enumerate(sorted(lag.items())):
                if i:
                    lag_text.append(", ")
                lag_text.append(f"{peer} {behind}", style="red" if behind > 1000 else "")
            group_table.add_row(g, leader, str(s.get("term")), f"{s.get('commit', 0):,}", lag_text)
        parts.append(group_table)
    moves = status.get("moves")
    if moves is not None and moves_active(moves):
        parts.append(render_moves(moves_progress(moves)))

    ids = [n["id"] for n in nodes]
    queue_table = Table(title="Queues", title_justify="left")
    queue_table.add_column("queue")
    for col in ("messages", "in flight", "delayed", *ids):
        queue_table.add_column(col, justify="right")
    for q in status["queues"]:
        queue_table.add_row(
            q["queue"],
            f"{q['messages']:,}",
            f"{q['in_flight']:,}",
            f"{q['delayed']:,}",
            *(f"{q['depth'].get(i, 0):,}" for i in ids),
        )
    if not status["queues"]:
        queue_table.add_row(Text("no messages stored", style="dim"), *[""] * (3 + len(ids)))
    parts.append(queue_table)
    if status.get("queues_more"):
        parts.append(Text(f"... and {status['queues_more']} more queue(s)", style="dim"))

    rates = status["rates"]
    rate_table = Table(title="Rates (messages/s; last minute)", title_justify="left")
    for col in ("", "now", "last 60 s"):
        rate_table.add_column(col, justify="right" if col == "now" else "left")
    for name in SERIES:
        last = rates[name][-61:-1]
        rate_table.add_row(name, _rate(rates["current"][name]), _spark(last))
    parts.append(rate_table)
    return Group(*parts)


def _render_down(config: ClusterConfig, errors: dict[str, ZdmqError]) -> Table:
    """Every node, none of which answered."""
    table = Table(title="Nodes (none answers)", title_justify="left")
    for col in ("node", "url", "status", "error"):
        table.add_column(col)
    for n in config.nodes:
        e = errors.get(n.id)
        table.add_row(n.id, n.url, Text("DOWN", style="bold red"), e.code if e else "")
    return table


def _console() -> Console:
    # Not a terminal (a pipe, a file): wide enough that the tables do not wrap.
    return Console() if sys.stdout.isatty() else Console(width=160, color_system=None)


async def status_command(
    config: ClusterConfig, token: str | None, *, as_json: bool, watch: bool
) -> int:
    """`zdmq status`: 0 when every node is up, else 1."""
    pool = _http.HttpPool(timeout_s=STATUS_TIMEOUT_S, ssl_context=config.client_ssl())
    console = _console()
    try:
        status, errors = await fetch_status(config, token, pool)
        if as_json:
            print(json.dumps(status, indent=2) if status is not None else "null")
            return 0 if status is not None and all(n["up"] for n in status["nodes"]) else 1
        if not watch:
            if status is None:
                console.print(_render_down(config, errors))
                return 1
            console.print(render_status(status))
            return 0 if all(n["up"] for n in status["nodes"]) else 1
        view: Any = render_status(status) if status else _render_down(config, errors)
        with Live(view, console=console, refresh_per_second=4, screen=False) as live:
            while True:
                await asyncio.sleep(1.0)
                status, errors = await fetch_status(config, token, pool)
                live.update(render_status(status) if status else _render_down(config, errors))
    finally:
        await pool.close()
