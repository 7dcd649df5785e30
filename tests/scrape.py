"""Reading a node's `GET /metrics` in tests: every sample, parsed by prometheus-client's
own parser, the value of one series or the sum of several, and how soon a killed leader
must show up in them."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from zdmq.local import LocalCluster
from zdmq.server.replicas import ELECTION_TICKS, TICK_S

# A follower campaigns 1 to 2 election timeouts after it last heard its leader.
ELECTION_TIMEOUT_S = 2 * ELECTION_TICKS * TICK_S

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(http: aiohttp.ClientSession, cluster: LocalCluster, node: str) -> Samples:
    """Every sample of `node`'s /metrics, parsed by prometheus-client's own parser."""
    async with http.get(cluster.config.node(node).url + "/metrics") as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await r.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))
