"""Authentication against real node processes: node-to-node credentials, client tokens.

Every route is taken from the app's own route table, so a route added later is checked
too: internal routes take only a node credential, public ones (but /v1/health and
/v1/openapi.yaml) a client token with the right on the queue when the cluster lists
client tokens.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.cluster.support import id_owned_by, placement_of, queue_owned_by
from tests.helpers import json_bytes, node_signed, unique
from zdmq import Client, Forbidden, Unauthorized
from zdmq.auth import NODE_AUTH_HEADER, SECRET_FILE, NodeSigner, node_secret
from zdmq.config import ClusterConfig
from zdmq.local import LocalCluster
from zdmq.server.app import make_app

ADMIN = "admin-token-0123456789abcdef"
ORDERS = "orders-token-0123456789abcdef"  # read and write on orders-*, from the environment
READER = "reader-token-0123456789abcdef"  # read on orders-*
TOPICS = "topics-token-0123456789abcdef"  # admin on orders-t* (topics), nothing on orders-q*
PUBLISHER = "publisher-token-0123456789abcdef"  # write on orders-t* (topics) only
ORDERS_ENV = "ZDMQ_TEST_ORDERS_TOKEN"
TOKENS = [
    {"name": "admin", "token": ADMIN, "rights": {"": ["admin"]}},
    {"token_env": ORDERS_ENV, "rights": {"orders-": ["read", "write"]}},
    {"name": "reader", "token": READER, "rights": {"orders-": ["read"]}},
    {"name": "topics", "token": TOPICS, "rights": {"orders-t": ["admin"]}},
    {"name": "publisher", "token": PUBLISHER, "rights": {"orders-t": ["write"]}},
]
NEEDS_A_BODY = {"/batch", "/ack", "/nack", "/extend"}


def app_routes(tmp_path: Path) -> list[tuple[str, str]]:
    """(METHOD, pattern) of every route a node's app serves, read from its table."""
    config = ClusterConfig.from_dict(
        {"nodes": [{"id": "n1", "port": 1}], "replication": 1, "data_dir": str(tmp_path)}
    )
    app = make_app(config, "n1")
    routes = [(m, path) for path, methods in app._exact.items() for m in methods]
    for _, methods, pattern in app._routes:
        routes += [(m, pattern) for m in methods]
    assert len(routes) > 20  # the table was read
    return sorted(routes)


def _internal(routes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(m, p) for m, p in routes if p.startswith("/v1/internal/")]


def _open(path: str) -> bool:
    return path in ("/v1/health", "/metrics", "/v1/openapi.yaml", "/") or path.startswith("/ui/")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, tls: dict[str, str]) -> Iterator[LocalCluster]:
    """A 2-node loopback cluster with no auth set up at all (as `zdmq up` runs)."""
    c = LocalCluster.ephemeral(
        tmp_path_factory.mktemp("plain"), nodes=2, partitions=64, **({"tls": tls} if tls else {})
    )
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory, tls: dict[str, str]) -> Iterator[LocalCluster]:
    """A 2-node cluster that lists client tokens."""
    os.environ[ORDERS_ENV] = ORDERS  # read by the nodes when they start
    c = LocalCluster.ephemeral(
        tmp_path_factory.mktemp("tokens"),
        nodes=2,
        partitions=64,
        auth={"client_tokens": TOKENS},
        **({"tls": tls} if tls else {}),
    )
    try:
        yield c.start()
    finally:
        c.close()
        os.environ.pop(ORDERS_ENV, None)


async def _call(
    http: aiohttp.ClientSession, url: str, method: str, path: str, headers: dict[str, str]
) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    path = path.replace("{queue}", "orders-x")
    data = b'{"receipts": ["r"]}' if any(path.endswith(s) for s in NEEDS_A_BODY) else None
    async with http.request(method, url + path, data=data, headers=headers) as r:
        body = await r.read()
        payload = None
        if r.content_type == "application/json" and body:
            payload = await r.json()
        return r.status, payload, r.headers


def _is_error(payload: Any, code: str) -> bool:
    return (
        isinstance(payload, dict)
        and list(payload) == ["error"]
        and payload["error"]["code"] == code
        and bool(payload["error"]["message"])
    )


async def _send(
    http: aiohttp.ClientSession, url: str, method: str, path: str, token: str, body: Any = None
) -> tuple[int, Any]:
    """A call with `token`: its status and JSON reply (None for none). `body` is bytes as
    they are, or JSON; a 403 must be the `forbidden` error."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"}
    async with http.request(method, url + path, headers=headers, data=data) as r:
        payload = await r.json() if r.content_type == "application/json" else None
        if r.status == 403:
            assert _is_error(payload, "forbidden"), payload
        return r.status, payload


# ---- node to node ----------------------------------------------------------------------------
async def test_every_internal_route_is_401_without_a_node_credential_and_403_for_a_client(
    plain: LocalCluster, tokens: LocalCluster, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    internal = _internal(app_routes(tmp_path))
    assert len(internal) >= 7
    for cluster in (plain, tokens):
        url = cluster.urls[0]
        for method, path in internal:
            for headers in ({}, {"zdmq-forwarded": "n2"}):
                status, payload, _ = await _call(http, url, method, path, headers)
                assert status == 401 and _is_error(payload, "unauthorized"), (method, path)
            # A client token: the wrong kind of credential.
            bearer = {"Authorization": f"Bearer {ADMIN}"}
            status, payload, _ = await _call(http, url, method, path, bearer)
            assert status == 403 and _is_error(payload, "forbidden"), (method, path)
    # A token the cluster does not know is no credential at all.
    bad = {"Authorization": "Bearer not-a-token-of-this-cluster"}
    status, payload, _ = await _call(http, tokens.urls[0], "GET", "/v1/internal/owned-queues", bad)
    assert status == 401 and _is_error(payload, "unauthorized")


async def test_a_wrong_expired_or_misapplied_node_credential_is_401(
    plain: LocalCluster, http: aiohttp.ClientSession
) -> None:
    url, path = plain.urls[0], "/v1/internal/owned-queues"
    secret = node_secret(plain.config, create=False)

    async def owned(value: str) -> int:
        async with http.get(url + path, headers={NODE_AUTH_HEADER: value}) as r:
            if r.status != 200:
                assert _is_error(await r.json(), "unauthorized")
            return r.status

    start = f"GET {path}".encode()
    assert await owned(NodeSigner(secret, "n2").value(start, b"")) == 200  # the real thing
    assert await owned(NodeSigner(b"x" * 32, "n2").value(start, b"")) == 401  # wrong secret
    old = time.time() - 120
    assert await owned(NodeSigner(secret, "n2").value(start, b"", now=old)) == 401  # expired
    ahead = time.time() + 120
    assert await owned(NodeSigner(secret, "n2").value(start, b"", now=ahead)) == 401
    assert await owned(NodeSigner(secret, "n9").value(start, b"")) == 401  # not a node
    other = NodeSigner(secret, "n2").value(b"GET /v1/internal/queues/q/depth", b"")
    assert await owned(other) == 401  # signed for another call
    assert await owned("n2:1:00") == 401
    assert await owned("garbage") == 401
    # Signed for one body, sent with another.
    body = json_bytes({"node": "n2", "queues": []})
    headers = {
        "Content-Type": "application/json",
        **node_signed(plain.config, "n2", "POST", "/v1/internal/ready", body),
    }
    async with http.post(url + "/v1/internal/ready", data=body, headers=headers) as r:
        assert r.status == 200, await r.text()
    tampered = json_bytes({"node": "n2", "queues": ["x"]})
    async with http.post(url + "/v1/internal/ready", data=tampered, headers=headers) as r:
        assert r.status == 401


async def test_a_forwarded_call_without_a_node_credential_is_401_and_does_nothing(
    plain: LocalCluster, http: aiohttp.ClientSession
) -> None:
    placement = placement_of(plain)
    q = queue_owned_by(placement, "n1")
    msg_id = id_owned_by(placement, "n2")
    async with Client.from_config(plain.config_path) as c:
        await c.create_queue(q)
        await c.push(q, "kept")
        for url in plain.urls:
            forwarded = {"zdmq-forwarded": "n1", "zdmq-id": msg_id}
            async with http.post(
                f"{url}/v1/queues/{q}/messages", data=b"x", headers=forwarded
            ) as r:
                assert r.status == 401
                assert _is_error(await r.json(), "unauthorized")
            async with http.post(f"{url}/v1/queues/{q}/pop?max=10", headers=forwarded) as r:
                assert r.status == 401
            async with http.delete(f"{url}/v1/queues/{q}", headers=forwarded) as r:
                assert r.status == 401
        assert sum((await c.stats(q)).depth.values()) == 1
        # Calls between nodes (a push and a pop through the non-owner) carry the credential.
        async with http.post(
            f"{plain.urls[0]}/v1/queues/{q}/messages", data=b"via n1", headers={"zdmq-id": msg_id}
        ) as r:
            assert r.status == 201, await r.text()
        got = []
        while (m := await c.pop(q)) is not None:
            got.append(m.body)
    assert sorted(got) == [b"kept", b"via n1"]


async def test_the_local_cluster_makes_one_node_secret_with_mode_0600(
    plain: LocalCluster, http: aiohttp.ClientSession
) -> None:
    path = plain.config.data_dir / SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(path.read_text().strip()) == 64
    assert not [p for p in path.parent.iterdir() if p.name.startswith(f".{SECRET_FILE}")]
    async with Client.from_config(plain.config_path) as c:
        q = unique()
        await c.create_queue(q)
        assert q in await c.list_queues()  # asks every node for the queues it owns


def _start_node(tmp_path: Path, raw: dict[str, Any], env: dict[str, str]) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(raw))
    environ = {k: v for k, v in os.environ.items() if k != "ZDMQ_NODE_SECRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "zdmq.server", "--config", str(path), "--node", "n1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **env},
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def test_a_node_off_loopback_refuses_to_start_without_a_secret_or_client_tokens(
    tmp_path: Path,
) -> None:
    # 192.0.2.0/24 is reserved for documentation: no host here has it.
    raw: dict[str, Any] = {
        "nodes": [{"id": "n1", "host": "192.0.2.1", "port": 7701}],
        "replication": 1,
        "data_dir": str(tmp_path / "data"),
    }
    err = _start_node(tmp_path, raw, {})
    assert "ZDMQ_NODE_SECRET" in err and "auth.node_secret_file" in err
    assert not (tmp_path / "data" / SECRET_FILE).exists()
    err = _start_node(tmp_path, raw, {"ZDMQ_NODE_SECRET": "s" * 32})
    assert "auth.client_tokens" in err
    raw["auth"] = {"client_tokens": [{"token": ADMIN, "rights": {"": ["admin"]}}]}
    err = _start_node(tmp_path, raw, {"ZDMQ_NODE_SECRET": "s" * 32})
    assert "cannot listen on 192.0.2.1" in err  # past every auth check


# ---- client tokens -------------------------------------------------------------------------
async def test_every_route_but_health_metrics_openapi_and_the_status_page_is_401_without_a_token(
    tokens: LocalCluster, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    public = [(m, p) for m, p in app_routes(tmp_path) if not p.startswith("/v1/internal/")]
    url = tokens.urls[1]
    for method, path in public:
        for headers in (
            {},
            {"Authorization": "Bearer not-a-token-of-this-cluster"},
            {"Authorization": f"Basic {ADMIN}"},
        ):
            status, payload, reply_headers = await _call(http, url, method, path, headers)
            if _open(path):
                assert status == 200, (method, path)
                continue
            assert status == 401 and _is_error(payload, "unauthorized"), (method, path, headers)
            assert reply_headers["WWW-Authenticate"].startswith("Bearer")
        status, _, _ = await _call(http, url, method, path, {"Authorization": f"Bearer {ADMIN}"})
        assert status not in (401, 403), (method, path)


async def test_a_token_is_403_without_the_right_and_works_with_it(
    tokens: LocalCluster, http: aiohttp.ClientSession
) -> None:
    orders, other = unique("orders-"), unique("billing-")
    url = tokens.urls[0]

    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async def status(method: str, path: str, token: str, data: bytes | None = None) -> int:
        async with http.request(method, url + path, headers=bearer(token), data=data) as r:
            if r.status == 403:
                assert _is_error(await r.json(), "forbidden")
            return r.status

    # admin creates and deletes; read and write do not.
    assert await status("PUT", f"/v1/queues/{orders}", ORDERS) == 403
    assert await status("PUT", f"/v1/queues/{orders}", ADMIN) == 201
    assert await status("PUT", f"/v1/queues/{other}", ADMIN) == 201
    # write pushes; read does not.
    assert await status("POST", f"/v1/queues/{orders}/messages", READER, b"m") == 403
    assert await status("POST", f"/v1/queues/{orders}/messages", ORDERS, b"m") == 201
    # read pops and inspects; the prefix bounds both.
    assert await status("GET", f"/v1/queues/{orders}", READER) == 200
    assert await status("POST", f"/v1/queues/{orders}/pop?max=1", READER) == 200
    for method, path in (
        ("GET", f"/v1/queues/{other}"),
        ("POST", f"/v1/queues/{other}/messages"),
        ("POST", f"/v1/queues/{other}/pop"),
        ("DELETE", f"/v1/queues/{other}"),
    ):
        assert await status(method, path, ORDERS) == 403
    assert await status("DELETE", f"/v1/queues/{orders}", ORDERS) == 403
    # The metadata list is read's; cancelling a message is write's (it is a producer's
    # take-back, as a push is).
    assert await status("GET", f"/v1/queues/{orders}/metadata", READER) == 200
    assert await status("GET", f"/v1/queues/{other}/metadata", ORDERS) == 403
    pushed, reply = await _send(http, url, "POST", f"/v1/queues/{orders}/messages", ORDERS, b"c")
    assert pushed == 201
    cancel = f"/v1/queues/{orders}/messages/{reply['id']}"
    assert await status("DELETE", cancel, READER) == 403
    assert await status("DELETE", cancel, ORDERS) == 204
    # The cluster's layout and status are any valid token's.
    for path in ("/v1/cluster", "/v1/status"):
        assert await status("GET", path, READER) == 200
    # A token lists the queues it has a right on.
    async with http.get(url + "/v1/queues", headers=bearer(READER)) as r:
        listed = (await r.json())["queues"]
    assert orders in listed and other not in listed
    async with http.get(url + "/v1/queues", headers=bearer(ADMIN)) as r:
        assert {orders, other} <= set((await r.json())["queues"])
    assert await status("DELETE", f"/v1/queues/{other}", ADMIN) == 204


async def test_the_client_takes_a_token_and_raises_typed_errors(tokens: LocalCluster) -> None:
    q = unique("orders-")
    async with Client.from_config(tokens.config_path, token=ADMIN) as admin:
        await admin.create_queue(q)
    async with Client.from_config(tokens.config_path, token=ORDERS) as c:
        ids = [await c.push(q, f"m{i}") for i in range(20)]  # to both nodes, forwarded or not
        got = await c.receive(q, max_messages=10)
        assert (await c.ack(q, [m.receipt for m in got])).done == len(got)
        popped = [m.id for m in got]
        while batch := await c.pop_many(q, 20):
            popped += [m.id for m in batch]
        assert sorted(popped) == sorted(ids)
        with pytest.raises(Forbidden):
            await c.delete_queue(q)
    async with Client.from_config(tokens.config_path, token="not-a-token-of-this-cluster") as bad:
        with pytest.raises(Unauthorized):
            await bad.push(q, "x")
    os.environ["ZDMQ_TOKEN"] = READER
    try:
        async with Client.from_config(tokens.config_path) as reader:
            assert await reader.pop(q) is None
            with pytest.raises(Forbidden):
                await reader.push(q, "x")
    finally:
        del os.environ["ZDMQ_TOKEN"]
    async with Client.from_config(tokens.config_path) as anonymous:
        with pytest.raises(Unauthorized):
            await anonymous.pop(q)


def test_the_cli_takes_a_token_as_an_option_or_from_the_environment(tokens: LocalCluster) -> None:
    cfg, q = str(tokens.config_path), unique("orders-")

    def zdmq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if k != "ZDMQ_TOKEN"}
        return subprocess.run(
            [sys.executable, "-m", "zdmq.cli", "--config", cfg, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**environ, **(env or {})},
        )

    denied = zdmq("queue", "create", q)
    assert denied.returncode == 1 and "unauthorized" in denied.stderr
    made = zdmq("--token", ADMIN, "queue", "create", q)
    assert made.returncode == 0, made.stderr
    assert zdmq("push", q, "hello", "--token", ORDERS).returncode == 0
    forbidden = zdmq("queue", "delete", q, env={"ZDMQ_TOKEN": ORDERS})
    assert forbidden.returncode == 1 and "forbidden" in forbidden.stderr
    popped = zdmq("pop", q, env={"ZDMQ_TOKEN": READER})
    assert popped.returncode == 0 and popped.stdout.strip() == "hello", popped.stderr


async def test_topic_routes_need_rights_on_the_topic_and_on_every_queue_they_reach(
    tokens: LocalCluster, http: aiohttp.ClientSession
) -> None:
    topic, other_topic = unique("orders-t"), unique("billing-t")
    mine, theirs = unique("orders-q"), unique("billing-q")
    url = tokens.urls[0]

    async def status(method: str, path: str, token: str, body: Any = None) -> int:
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {token}"}
        async with http.request(method, url + path, headers=headers, data=data) as r:
            if r.status == 403:
                assert _is_error(await r.json(), "forbidden")
            return r.status

    # Creating and subscribing are admin's, on the topic and on the queue.
    assert await status("PUT", f"/v1/topics/{topic}", ORDERS) == 403
    assert await status("PUT", f"/v1/topics/{topic}", ADMIN) == 201
    assert await status("PUT", f"/v1/topics/{other_topic}", ADMIN) == 201
    sub = f"/v1/topics/{topic}/subscriptions"
    assert await status("POST", sub, ORDERS, {"queue": mine}) == 403
    assert await status("POST", sub, ADMIN, {"queue": mine}) == 201
    assert (
        await status("POST", f"/v1/topics/{other_topic}/subscriptions", ADMIN, {"queue": theirs})
        == 201
    )
    # Publishing is write on the topic's name; reading it, read.
    assert await status("POST", f"/v1/topics/{topic}/messages", READER, b"m") == 403
    assert await status("POST", f"/v1/topics/{topic}/messages", ORDERS, b"m") == 201
    assert await status("POST", f"/v1/topics/{other_topic}/messages", ORDERS, b"m") == 403
    assert await status("GET", f"/v1/topics/{topic}", READER) == 200
    assert await status("GET", f"/v1/topics/{other_topic}", READER) == 403
    async with http.get(url + "/v1/topics", headers={"Authorization": f"Bearer {READER}"}) as r:
        listed = (await r.json())["topics"]
    assert topic in listed and other_topic not in listed
    # A broadcast needs write on every queue it names; refused, it stores nothing.
    both = {"queues": [mine, theirs], "body": "b"}
    assert await status("POST", "/v1/broadcast", ORDERS, both) == 403
    assert await status("POST", "/v1/broadcast", ORDERS, {"queues": [mine], "body": "b"}) == 201
    async with http.get(
        url + f"/v1/queues/{theirs}", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as r:
        assert (await r.json())["messages"] == 0  # the refused broadcast stored nothing
    async with http.get(
        url + f"/v1/queues/{mine}", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as r:
        assert (await r.json())["messages"] == 2  # the publish's copy and the broadcast's
    # Unsubscribing and deleting are admin's.
    assert await status("DELETE", f"{sub}/{mine}", ORDERS) == 403
    assert await status("DELETE", f"{sub}/{mine}", ADMIN) == 200
    assert await status("DELETE", f"/v1/topics/{topic}", ORDERS) == 403
    for t in (topic, other_topic):
        assert await status("DELETE", f"/v1/topics/{t}", ADMIN) == 204


async def test_publishing_needs_write_on_the_topic_only_and_reaches_every_subscribed_queue(
    tokens: LocalCluster, http: aiohttp.ClientSession
) -> None:
    # SNS's model: an admin's subscription authorises delivery into the queue, so a
    # publisher needs no right on the queues the topic reaches.
    topic, other_topic, queue = unique("orders-t"), unique("billing-t"), unique("billing-q")
    url = tokens.urls[0]
    for t in (topic, other_topic):
        assert (await _send(http, url, "PUT", f"/v1/topics/{t}", ADMIN))[0] == 201
    subscribed = await _send(
        http, url, "POST", f"/v1/topics/{topic}/subscriptions", ADMIN, {"queue": queue}
    )
    assert subscribed[0] == 201
    for url in tokens.urls:  # the topic's owner, and a node that forwards to it
        assert (await _send(http, url, "POST", f"/v1/topics/{topic}/messages", PUBLISHER, b"m"))[
            0
        ] == 201
        batch = {"messages": [{"body": "b1"}, {"body": "b2"}]}
        assert (await _send(http, url, "POST", f"/v1/topics/{topic}/batch", PUBLISHER, batch))[
            0
        ] == 201
        for path in (f"/v1/topics/{other_topic}/messages", f"/v1/queues/{queue}/messages"):
            assert (await _send(http, url, "POST", path, PUBLISHER, b"m"))[0] == 403, path
    _, stats = await _send(http, url, "GET", f"/v1/queues/{queue}", ADMIN)
    assert stats["messages"] == 3 * len(tokens.urls)


async def test_subscribing_and_unsubscribing_need_admin_on_the_queue_through_any_node(
    tokens: LocalCluster, http: aiohttp.ClientSession
) -> None:
    # TOPICS is admin on the topic but has no right on `queue`: it may neither route
    # messages into the queue (nor create it) nor purge it, whichever node it calls (the
    # topic's owner, or one that forwards the call there with its node credential).
    topic, queue, own = unique("orders-t"), unique("orders-q"), unique("orders-t")
    url = tokens.urls[0]
    sub = f"/v1/topics/{topic}/subscriptions"
    assert (await _send(http, url, "PUT", f"/v1/topics/{topic}", TOPICS))[0] == 201
    for url in tokens.urls:
        assert (await _send(http, url, "POST", sub, TOPICS, {"queue": queue}))[0] == 403
    _, got = await _send(http, url, "GET", f"/v1/topics/{topic}", ADMIN)
    assert got["subscriptions"] == []
    assert (await _send(http, url, "GET", f"/v1/queues/{queue}", ADMIN))[0] == 404  # not made
    assert (await _send(http, url, "POST", sub, TOPICS, {"queue": own}))[0] == 201
    assert (await _send(http, url, "POST", sub, ADMIN, {"queue": queue}))[0] == 201
    for url in tokens.urls:
        assert (await _send(http, url, "DELETE", f"{sub}/{queue}", TOPICS))[0] == 403
    _, got = await _send(http, url, "GET", f"/v1/topics/{topic}", ADMIN)
    assert got["subscriptions"] == [own, queue]
    assert (await _send(http, url, "DELETE", f"{sub}/{own}", TOPICS))[0] == 200
    assert (await _send(http, url, "DELETE", f"{sub}/{queue}", ADMIN))[0] == 200
    assert (await _send(http, url, "DELETE", f"/v1/topics/{topic}", TOPICS))[0] == 204


async def test_tied_messages_need_write_on_every_queue_to_push_and_to_cancel_through_any_node(
    tokens: LocalCluster, http: aiohttp.ClientSession
) -> None:
    mine, mine2, theirs = unique("orders-q"), unique("orders-q"), unique("billing-q")
    url = tokens.urls[0]
    for q in (mine, mine2, theirs):
        assert (await _send(http, url, "PUT", f"/v1/queues/{q}", ADMIN))[0] == 201

    def copies(*queues: str) -> dict[str, Any]:
        return {"messages": [{"queue": q, "body": "tied"} for q in queues]}

    async def depth(q: str) -> int:
        _, stats = await _send(http, url, "GET", f"/v1/queues/{q}", ADMIN)
        return int(stats["messages"])

    for url in tokens.urls:
        assert (await _send(http, url, "POST", "/v1/tied", ORDERS, copies(mine, theirs)))[0] == 403
    assert [await depth(q) for q in (mine, theirs)] == [0, 0]  # refused: nothing stored
    status, ours = await _send(http, url, "POST", "/v1/tied", ORDERS, copies(mine, mine2))
    assert status == 201
    status, mixed = await _send(http, url, "POST", "/v1/tied", ADMIN, copies(mine, theirs))
    assert status == 201
    # Only the token's owner knows a tie's queues: a node that forwards a cancel there
    # passes the caller's token on, and the owner checks it.
    for url in tokens.urls:
        assert (await _send(http, url, "DELETE", f"/v1/tied/{ours['token']}", READER))[0] == 403
        assert (await _send(http, url, "DELETE", f"/v1/tied/{mixed['token']}", ORDERS))[0] == 403
    assert [await depth(q) for q in (mine, mine2, theirs)] == [2, 1, 1]  # nothing cancelled
    status, done = await _send(http, url, "DELETE", f"/v1/tied/{ours['token']}", ORDERS)
    assert (status, done["cancelled"]) == (200, 2)
    status, done = await _send(http, url, "DELETE", f"/v1/tied/{mixed['token']}", ADMIN)
    assert (status, done["cancelled"]) == (200, 2)
    assert [await depth(q) for q in (mine, mine2, theirs)] == [0, 0, 0]
