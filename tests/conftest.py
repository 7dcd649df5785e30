"""Fixtures: real node processes on ephemeral loopback ports, and clients for them.

`cluster4` is one 4-node `durability: fsync` cluster shared by a test module (tests use
unique queue names); `make_cluster` builds a private cluster of any shape for a test
that kills, restarts or needs its own layout. Both are real `python -m zdmq.server`
processes started through `zdmq.local.LocalCluster`, waited for by their READY line.

With `ZDMQ_TEST_TLS=1` both start their clusters with `tls` (HTTPS for clients and between
nodes, one CA for the whole session) and `client_ssl` is a context that trusts that CA.
With `ZDMQ_TEST_REPLICATION=3` they keep 3 copies of everything (Raft replica groups).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers import TEST_REPLICATION, TEST_TLS, make_ca_and_cert
from zdmq import Client
from zdmq.local import LocalCluster

# Property tests check what is generated, not how fast: on 2 cores shared with node
# processes and benchmarks, generation can be slow enough to trip Hypothesis's timing
# checks (seen as a `too_slow` health check failure in test_batch_frames).
settings.register_profile(
    "zdmq", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("zdmq")


def _tls(tls: dict[str, str]) -> dict[str, Any]:
    """What the shared fixtures add to a cluster: `tls`, and `replication` when the
    session asks for copies (ZDMQ_TEST_REPLICATION)."""
    extra: dict[str, Any] = {"tls": tls} if tls else {}
    if TEST_REPLICATION > 1:
        extra["replication"] = TEST_REPLICATION
    return extra


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The `tls` block the shared fixtures start clusters with: empty (plain HTTP) unless
    `ZDMQ_TEST_TLS=1`, then a CA and a node certificate made once for the session."""
    return make_ca_and_cert(tmp_path_factory.mktemp("tls")) if TEST_TLS else {}


@pytest.fixture(scope="session")
def client_ssl(tls: dict[str, str]) -> ssl.SSLContext | None:
    """How a test client verifies the nodes: trusts the session's CA under TLS."""
    return ssl.create_default_context(cafile=tls["ca"]) if tls else None


@pytest.fixture(scope="module")
def cluster4(
    tmp_path_factory: pytest.TempPathFactory, tls: dict[str, str]
) -> Iterator[LocalCluster]:
    c = LocalCluster.ephemeral(tmp_path_factory.mktemp("cluster4"), nodes=4, **_tls(tls))
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture
def make_cluster(tmp_path: Path, tls: dict[str, str]) -> Iterator[Callable[..., LocalCluster]]:
    made: list[LocalCluster] = []

    def make(**kw: Any) -> LocalCluster:
        c = LocalCluster.ephemeral(tmp_path / f"cluster{len(made)}", **{**_tls(tls), **kw})
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.close()


@pytest.fixture
async def client(cluster4: LocalCluster) -> AsyncIterator[Client]:
    async with Client.from_config(cluster4.config_path) as c:
        yield c
