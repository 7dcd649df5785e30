"""`zdmq status`: the cluster status (`GET /v1/status`, see zdmq/server/status.py) drawn
in the terminal with rich: the nodes (up or down, health, messages, rates), the replica
groups as their leaders see them (term, commit index, each follower's lag), the deepest
queues with their depth on each node, and the message rates with a sparkline of the last
minute. `--watch` redraws it every second; `--json` prints the endpoint's JSON as it is.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from zdmq import _http
from zdmq.auth import bearer_headers
from zdmq.config import ClusterConfig
from zdmq.errors import ZdmqError

__all__ = ["fetch_status", "render_status", "status_command"]

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


def render_status(status: dict[str, Any]) -> Group:
    """The status as rich tables."""
    nodes = status["nodes"]
    up = sum(1 for n in nodes if n["up"])
    head = Text.assemble(
        ("zdmq ", "bold"),
        f"{up} of {len(nodes)} nodes up, replication {status['replication']}, "
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
