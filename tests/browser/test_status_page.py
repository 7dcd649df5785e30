"""The status page at `/` in a real browser (Chromium), against real node processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.helpers import unique
from zdmq import Client
from zdmq.local import LocalCluster

TOKEN = "status-page-token-0123456789abcdef"


def _push(cluster: LocalCluster, queue: str, n: int, *, create: bool = False, **kw: Any) -> None:
    async def go() -> None:
        async with Client.from_config(cluster.config_path, **kw) as c:
            if create:
                await c.create_queue(queue)
            # One push each: each message goes to the node its id hashes to.
            await asyncio.gather(*(c.push(queue, f"m{i}".encode()) for i in range(n)))

    # Playwright's sync API runs an event loop in this thread: the client gets its own.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result()


def _admin(cluster: LocalCluster, call: Callable[[Client], Awaitable[Any]]) -> None:
    """An admin call of a client (on a thread of its own, as in `_push`)."""

    async def go() -> None:
        async with Client.from_config(cluster.config_path) as c:
            await call(c)

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result()


def _within(seconds: float, what: str, check: Any) -> float:
    """Polls `check()` until it holds; fails after `seconds`. How long it took."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"{what}: not within {seconds}s")
        time.sleep(0.05)
    return time.monotonic() - started


def _shown(page: Any, queue: str) -> int:
    row = page.locator(f'tr[data-queue="{queue}"] [data-field="messages"]')
    return int(row.inner_text().replace(",", "")) if row.count() else -1


def test_the_page_shows_nodes_queues_and_rates_live_and_a_killed_node_turns_red(
    make_cluster: Any, browser_page: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(nodes=4, replication=3)
    page = browser_page
    queue = unique("page")
    _push(cluster, queue, 200, create=True)
    page.goto(cluster.urls[0] + "/")
    nodes = page.locator(".node")
    for n in cluster.config.node_ids:
        page.wait_for_selector(f'.node[data-node="{n}"][data-up="true"]')
    assert nodes.count() == 4
    # Each node shows its replica groups, one of which it leads.
    page.wait_for_selector('.node[data-node="n1"] tr[data-group="n1"] .role-leader')
    # ... and, as its leader, how far behind each of its followers is.
    lag = page.inner_text('.node[data-node="n1"] tr[data-lag="n1"]')
    assert lag.strip().startswith("follower lag: n2 ") and ", n3 " in lag, lag
    # The queue, with its depth on each node: the bars add up to what was pushed.
    _within(5, "the queue's depth shows", lambda: _shown(page, queue) == 200)
    bars = page.locator(f'tr[data-queue="{queue}"] .bar')
    assert bars.count() == 4
    per_node = [int(bars.nth(i).locator(".value").inner_text()) for i in range(4)]
    assert sum(per_node) == 200 and sum(1 for d in per_node if d) >= 3, per_node

    # A push shows within 2 s.
    _push(cluster, queue, 50)
    took = _within(2.0, "a push shows", lambda: _shown(page, queue) == 250)
    print(f"\npush shown after {took:.2f}s")
    # ... and the push rate chart has seen it.
    _within(3.0, "the push rate shows", lambda: "push 0/s" not in page.inner_text(".legend"))
    page.screenshot(path=str(tmp_path / "status.png"), full_page=True)
    # The map's epoch, and no moves section while the rebalancer is idle.
    assert "map epoch 1" in page.inner_text("#summary")
    assert page.locator("#moves").is_hidden()

    cluster.kill("n3")
    took = _within(
        2.0, "a killed node turns red", lambda: page.locator('.node.down[data-node="n3"]').count()
    )
    print(f"killed node shown down after {took:.2f}s")
    color = page.eval_on_selector(
        '.node[data-node="n3"]', "e => getComputedStyle(e).borderLeftColor"
    )
    assert color == "rgb(214, 69, 69)", color
    assert page.locator(".node.down").count() == 1
    page.screenshot(path=str(tmp_path / "status-down.png"), full_page=True)

    # Moves held up: n4 removed while n3 is down too, the groups both are in (n2 and n3)
    # have no majority, so their moves wait, and the page shows them, with a progress
    # bar and the move under way, until n3 is back.
    cluster.kill("n4")
    _admin(cluster, lambda c: c.remove_node("n4"))
    page.wait_for_selector("#moves:not([hidden])", timeout=10_000)
    _within(20, "the move held up shows", lambda: "now: group" in page.inner_text("#moves"))
    assert int(page.get_attribute("#moves", "data-total") or 0) >= 2
    page.screenshot(path=str(tmp_path / "status-moves.png"), full_page=True)
    cluster.start_node("n3")
    page.wait_for_selector("#moves[hidden]", state="attached", timeout=90_000)
    _within(5, "n4 leaves the page", lambda: page.locator('.node[data-node="n4"]').count() == 0)
    assert "map epoch 1" not in page.inner_text("#summary")
    assert (tmp_path / "status.png").stat().st_size > 10_000


def test_with_client_tokens_the_page_asks_for_one_and_then_shows_the_cluster(
    make_cluster: Any, browser_page: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(
        nodes=2,
        partitions=64,
        auth={"client_tokens": [{"token": TOKEN, "rights": {"": ["admin"]}}]},
    )
    page = browser_page
    queue = unique("auth")
    _push(cluster, queue, 7, create=True, token=TOKEN)
    page.goto(cluster.urls[1] + "/")
    page.wait_for_selector("#login:not([hidden])")
    assert page.locator("#main").is_hidden()
    page.fill("#token", "not-the-token")
    page.click("#login button")
    page.wait_for_selector("#login-error:has-text('refused')")
    assert page.locator("#main").is_hidden()
    page.fill("#token", TOKEN)
    page.click("#login button")
    page.wait_for_selector('.node[data-node="n2"][data-up="true"]')
    _within(5, "the queue shows", lambda: _shown(page, queue) == 7)
    assert page.evaluate("sessionStorage.getItem('zdmq-token')") == TOKEN
    page.screenshot(path=str(tmp_path / "status-auth.png"), full_page=True)
