"""A 4-node cluster with `tls`: HTTPS between clients and nodes and between nodes, with a CA
made by the openssl command; plain HTTP to a TLS node gets no reply."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.cluster.support import id_owned_by, placement_of, queue_owned_by
from tests.helpers import make_ca_and_cert, unique
from zdmq import Client, NodeUnavailable, _http
from zdmq.local import LocalCluster

pytestmark = [
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
    # TLS on a cluster of its own: the TLS, replication 3 pass would run it as the first did.
    pytest.mark.main_pass_only,
]


@pytest.fixture(scope="module")
def tls4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    d = tmp_path_factory.mktemp("tls")
    c = LocalCluster.ephemeral(d, nodes=4, tls=make_ca_and_cert(d))
    try:
        yield c.start()
    finally:
        c.close()


async def test_push_pop_receive_and_ack_across_four_tls_nodes(tls4: LocalCluster) -> None:
    assert all(url.startswith("https://127.0.0.1:") for url in tls4.urls)
    placement = placement_of(tls4)
    q = queue_owned_by(placement, "n3")
    async with Client.from_config(tls4.config_path) as c:
        await c.create_queue(q)  # the client calls n3 directly
        ids = [await c.push(q, f"m{i}") for i in range(40)]
        assert len((await c.stats(q)).depth) > 1  # spread over nodes (internal depth calls)
        assert q in await c.list_queues()  # every node asked for its queues
        got = await c.receive(q, max_messages=10)
        assert got and (await c.ack(q, [m.receipt for m in got])).done == len(got)
        popped = [m.id for m in got]
        while (m := await c.pop(q)) is not None:
            popped.append(m.id)
        assert sorted(popped) == sorted(ids)
    # Forwarded calls: a push to a node that does not own the id, a create on a node that
    # is not the queue's metadata owner, a routed pop there.
    ca = tls4.config.client_ssl()
    pool = _http.HttpPool(ssl_context=ca)
    try:
        q2 = queue_owned_by(placement, "n2")
        n1 = tls4.config.node("n1").url
        await _http.call(pool, "PUT", f"{n1}/v1/queues/{q2}", json={})
        msg_id = id_owned_by(placement, "n4")
        reply = await _http.call(
            pool, "POST", f"{n1}/v1/queues/{q2}/messages", data=b"x", headers={"zdmq-id": msg_id}
        )
        assert reply.status == 201
        popped_reply = await _http.call(pool, "POST", f"{n1}/v1/queues/{q2}/pop")
        assert popped_reply.headers["zdmq-id"] == msg_id and popped_reply.body == b"x"
    finally:
        await pool.close()


async def test_plain_http_to_a_tls_node_gets_no_reply_and_an_unverified_client_fails(
    tls4: LocalCluster,
) -> None:
    node = tls4.config.node("n1")

    def plain() -> bytes:
        with socket.create_connection((node.host, node.port), timeout=10) as s:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while chunk := s.recv(4096):
                got += chunk
            return got

    got = await asyncio.to_thread(plain)
    assert b"HTTP/1.1" not in got and b"ok" not in got
    # A client that does not trust the cluster's CA refuses the node.
    with pytest.raises(NodeUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        async with Client([node.url]) as c:
            await c.list_queues()
    async with Client.from_config(tls4.config_path) as c:  # the node still serves
        assert await c.list_queues() is not None


def test_the_cli_reaches_tls_nodes(tls4: LocalCluster) -> None:
    cfg, q = str(tls4.config_path), unique("cli-tls")

    def zdmq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "zdmq.cli", "--config", cfg, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    status = zdmq("status")
    assert status.returncode == 0 and status.stdout.count(" OK ") == 4, status.stdout
    assert zdmq("queue", "create", q).returncode == 0
    assert zdmq("push", q, "over tls").returncode == 0
    popped = zdmq("pop", q)
    assert popped.returncode == 0 and popped.stdout.strip() == "over tls", popped.stderr
