"""Every public REST call of one node, over real HTTP: status codes and error shapes.

Errors must be `{"error": {"code", "message"}}` (JSON, nothing else) with the status
of the error class; the client turns that code back into the same exception.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from yarl import URL

from tests.node.conftest import NodeHttp, expect_error
from zdmq.config import ClusterConfig
from zdmq.models import QueueSettings

Http = NodeHttp
MiB = 1024 * 1024


async def _create(http: Http, queue: str) -> None:
    resp = await http.put(f"/v1/queues/{queue}")
    assert resp.status == 201, await resp.text()


async def _push(http: Http, queue: str, body: bytes, content_type: str | None = None) -> str:
    headers = {"Content-Type": content_type} if content_type else None
    resp = await http.post(f"/v1/queues/{queue}/messages", data=body, headers=headers)
    assert resp.status == 201, await resp.text()
    return str((await resp.json())["id"])


async def _pop_many(http: Http, queue: str, n: int) -> list[dict[str, str]]:
    resp = await http.post(f"/v1/queues/{queue}/pop", params={"max": str(n)})
    assert resp.status == 200, await resp.text()
    return list((await resp.json())["messages"])


def _is_uuid(value: str) -> bool:
    return str(uuid.UUID(value)) == value


# ---- health ----------------------------------------------------------------------------
async def test_health_reports_the_node_id_and_ok(http: Http) -> None:
    resp = await http.get("/v1/health")
    assert resp.status == 200
    body = await resp.json()
    assert body["node"] == "n1"
    assert body["status"] == "ok"


# ---- queues ----------------------------------------------------------------------------
async def test_put_queue_creates_it_and_returns_201_with_its_name_and_default_settings(
    http: Http,
) -> None:
    resp = await http.put("/v1/queues/jobs")
    assert resp.status == 201
    assert await resp.json() == {"queue": "jobs", "settings": QueueSettings().to_wire()}


async def test_put_queue_with_settings_returns_them_and_get_reports_them(http: Http) -> None:
    await _create(http, "dlq")
    wanted = {
        "visibility_timeout_s": 5,
        "max_receives": 3,
        "dead_letter_queue": "dlq",
        "retention_s": 60,
        "dedup_window_s": 10,
        "max_message_bytes": 1000,
    }
    resp = await http.put("/v1/queues/jobs", json=wanted)
    assert resp.status == 201, await resp.text()
    settings = QueueSettings.from_wire(wanted).to_wire()
    assert await resp.json() == {"queue": "jobs", "settings": settings}
    assert (await (await http.get("/v1/queues/jobs")).json())["settings"] == settings
    assert (await (await http.get("/v1/queues/jobs/metadata")).json())["settings"] == settings


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"visibility_timeout_s": -1}, "visibility_timeout_s"),
        ({"retention_s": "long"}, "retention_s"),
        ({"no_such_field": 1}, "no_such_field"),
        ({"max_receives": 3}, "max_receives"),
        ({"content_based_dedup": True}, "content_based_dedup"),
    ],
    ids=["out_of_bounds", "not_a_number", "unknown_field", "no_dlq", "not_fifo"],
)
async def test_put_queue_with_bad_settings_returns_400_naming_the_field_and_creates_nothing(
    http: Http, settings: dict[str, Any], field: str
) -> None:
    message = await expect_error(
        await http.put("/v1/queues/jobs", json=settings), 400, "bad_request"
    )
    assert field in message
    await expect_error(await http.get("/v1/queues/jobs"), 404, "queue_not_found")


async def test_put_of_an_existing_queue_returns_409_queue_exists(http: Http) -> None:
    await _create(http, "jobs")
    message = await expect_error(await http.put("/v1/queues/jobs"), 409, "queue_exists")
    assert "jobs" in message


async def test_get_queues_lists_every_queue_sorted(http: Http) -> None:
    resp = await http.get("/v1/queues")
    assert resp.status == 200
    assert await resp.json() == {"queues": []}
    for q in ("zeta", "alpha", "mid.q-1"):
        await _create(http, q)
    assert await (await http.get("/v1/queues")).json() == {"queues": ["alpha", "mid.q-1", "zeta"]}


async def test_get_queue_reports_its_message_count_and_nodes(http: Http) -> None:
    await _create(http, "jobs")
    resp = await http.get("/v1/queues/jobs")
    assert resp.status == 200
    body = await resp.json()
    assert body == {
        "queue": "jobs",
        "messages": 0,
        "in_flight": 0,
        "delayed": 0,
        "dead_lettered": 0,
        "expired": 0,
        "nodes": [],
        "depth": {},
        "registered": [],
        "settings": QueueSettings().to_wire(),
        "unavailable": [],
    }
    for i in range(3):
        await _push(http, "jobs", b"m%d" % i)
    body = await (await http.get("/v1/queues/jobs")).json()
    assert (body["queue"], body["messages"], body["nodes"]) == ("jobs", 3, ["n1"])
    assert (body["depth"], body["registered"], body["in_flight"]) == ({"n1": 3}, ["n1"], 0)


async def test_get_of_a_missing_queue_returns_404_queue_not_found(http: Http) -> None:
    message = await expect_error(await http.get("/v1/queues/nope"), 404, "queue_not_found")
    assert "nope" in message


async def test_queue_metadata_lists_the_nodes_holding_messages(http: Http) -> None:
    await _create(http, "jobs")
    body = await (await http.get("/v1/queues/jobs/metadata")).json()
    assert body["queue"] == "jobs" and body["nodes"] == []
    first = await _push(http, "jobs", b"a")
    await _push(http, "jobs", b"b")
    body = await (await http.get("/v1/queues/jobs/metadata")).json()
    assert body["nodes"] == [{"node": "n1", "first_uuid": first}]
    await expect_error(await http.get("/v1/queues/nope/metadata"), 404, "queue_not_found")


async def test_delete_queue_returns_204_and_drops_it_with_its_messages(http: Http) -> None:
    await _create(http, "jobs")
    await _push(http, "jobs", b"doomed")
    resp = await http.delete("/v1/queues/jobs")
    assert resp.status == 204
    assert await resp.read() == b""
    await expect_error(await http.get("/v1/queues/jobs"), 404, "queue_not_found")
    assert await (await http.get("/v1/queues")).json() == {"queues": []}
    # A queue created again under the same name starts empty.
    await _create(http, "jobs")
    assert (await http.post("/v1/queues/jobs/pop")).status == 204


async def test_delete_of_a_missing_queue_returns_404(http: Http) -> None:
    await expect_error(await http.delete("/v1/queues/nope"), 404, "queue_not_found")


# ---- push ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"hello", "text/plain"),
        (b'{"a": 1}', "application/json"),
        (bytes(range(256)), "application/octet-stream"),
        (b"\xff\xfe\x00 not utf-8", "image/x-anything; v=2"),
    ],
)
async def test_push_stores_any_raw_body_and_returns_201_with_a_uuid(
    http: Http, body: bytes, content_type: str
) -> None:
    await _create(http, "jobs")
    resp = await http.post(
        "/v1/queues/jobs/messages", data=body, headers={"Content-Type": content_type}
    )
    assert resp.status == 201
    payload = await resp.json()
    assert payload == {"id": payload["id"], "duplicate": False} and _is_uuid(payload["id"])

    popped = await http.post("/v1/queues/jobs/pop")
    assert popped.status == 200
    assert await popped.read() == body
    assert popped.headers["Content-Type"] == content_type
    assert popped.headers["zdmq-id"] == payload["id"]


async def test_push_keeps_a_caller_supplied_id(http: Http) -> None:
    await _create(http, "jobs")
    mid = str(uuid.uuid4())
    resp = await http.post("/v1/queues/jobs/messages", data=b"x", headers={"zdmq-id": mid})
    assert resp.status == 201
    assert await resp.json() == {"id": mid, "duplicate": False}
    assert (await http.post("/v1/queues/jobs/pop")).headers["zdmq-id"] == mid


async def test_pushing_the_same_id_twice_stores_it_once(http: Http) -> None:
    await _create(http, "jobs")
    mid = str(uuid.uuid4())
    resp = await http.post("/v1/queues/jobs/messages", data=b"x", headers={"zdmq-id": mid})
    assert resp.status == 201
    assert await resp.json() == {"id": mid, "duplicate": False}
    resp = await http.post("/v1/queues/jobs/messages", data=b"y", headers={"zdmq-id": mid})
    assert resp.status == 200
    assert await resp.json() == {"id": mid, "duplicate": True}
    [m] = await _pop_many(http, "jobs", 10)
    # The first push is the one stored.
    assert (m["id"], m["body"]) == (mid, "x")


async def test_one_id_twice_in_one_batch_is_stored_once(http: Http) -> None:
    await _create(http, "jobs")
    mid = str(uuid.uuid4())
    messages = [{"id": mid, "body": "first"}, {"body": "other"}, {"id": mid, "body": "again"}]
    resp = await http.post("/v1/queues/jobs/batch", json={"messages": messages})
    assert resp.status == 201
    reply = await resp.json()
    assert reply["duplicates"] == 1 and reply["ids"][0] == reply["ids"][2] == mid
    got = await _pop_many(http, "jobs", 10)
    assert [(m["id"], m["body"]) for m in got] == [(mid, "first"), (reply["ids"][1], "other")]


async def test_a_body_pushed_without_a_content_type_pops_as_octet_stream(http: Http) -> None:
    await _create(http, "jobs")
    resp = await http.post(
        "/v1/queues/jobs/messages", data=b"\x00raw", skip_auto_headers=["Content-Type"]
    )
    assert resp.status == 201
    popped = await http.post("/v1/queues/jobs/pop")
    assert popped.headers["Content-Type"] == "application/octet-stream"
    assert await popped.read() == b"\x00raw"


async def test_push_with_a_malformed_id_returns_400_invalid_message(http: Http) -> None:
    await _create(http, "jobs")
    resp = await http.post("/v1/queues/jobs/messages", data=b"x", headers={"zdmq-id": "nope"})
    await expect_error(resp, 400, "invalid_message")


async def test_push_batch_returns_201_with_one_id_per_message_in_order(http: Http) -> None:
    await _create(http, "jobs")
    messages = [
        {"body": "plain text", "encoding": "utf-8"},
        {"body": base64.b64encode(b"\xff\x00\xfe").decode(), "encoding": "base64"},
        {"body": "no encoding means utf-8"},
        {"body": "", "encoding": "utf-8"},
    ]
    resp = await http.post("/v1/queues/jobs/batch", json={"messages": messages})
    assert resp.status == 201
    reply = await resp.json()
    assert set(reply) == {"ids", "duplicates"} and reply["duplicates"] == 0
    ids = reply["ids"]
    assert len(ids) == 4 and len(set(ids)) == 4 and all(_is_uuid(i) for i in ids)
    got = await _pop_many(http, "jobs", 10)
    assert [m["id"] for m in got] == ids
    bodies = [
        base64.b64decode(m["body"]) if m["encoding"] == "base64" else m["body"].encode()
        for m in got
    ]
    assert bodies == [b"plain text", b"\xff\x00\xfe", b"no encoding means utf-8", b""]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"{not json", "bad_request"),
        (b"", "bad_request"),
        (b"[]", "bad_request"),
        (b'{"messages": "x"}', "bad_request"),
        (b'{"messages": []}', "bad_request"),
        (b'{"messages": ["x"]}', "invalid_message"),
        (b'{"messages": [{"body": 5}]}', "invalid_message"),
        (b'{"messages": [{"body": "x", "encoding": "latin-1"}]}', "invalid_message"),
        (b'{"messages": [{"body": "not base64!", "encoding": "base64"}]}', "invalid_message"),
        (b'{"messages": [{"body": "x", "id": "not-a-uuid"}]}', "invalid_message"),
        (b'{"messages": [{"body": "x", "content_type": 5}]}', "invalid_message"),
    ],
    ids=[
        "bad_json",
        "no_body",
        "not_an_object",
        "messages_not_a_list",
        "empty_list",
        "item_not_an_object",
        "body_not_a_string",
        "bad_encoding",
        "bad_base64",
        "bad_id",
        "bad_content_type",
    ],
)
async def test_a_malformed_batch_returns_400_and_stores_nothing(
    http: Http, data: bytes, code: str
) -> None:
    await _create(http, "jobs")
    resp = await http.post(
        "/v1/queues/jobs/batch", data=data, headers={"Content-Type": "application/json"}
    )
    await expect_error(resp, 400, code)
    assert await _pop_many(http, "jobs", 10) == []


async def test_a_batch_with_one_bad_message_names_its_index(http: Http) -> None:
    await _create(http, "jobs")
    messages = [{"body": "ok"}, {"body": "ok"}, {"body": "%%%", "encoding": "base64"}]
    resp = await http.post("/v1/queues/jobs/batch", json={"messages": messages})
    message = await expect_error(resp, 400, "invalid_message")
    assert message.startswith("messages[2]: ")
    assert await _pop_many(http, "jobs", 10) == []


async def test_a_batch_over_the_message_limit_returns_400_batch_too_large(
    http: Http, node_config: ClusterConfig
) -> None:
    await _create(http, "jobs")
    limit = node_config.limits.max_batch_messages
    resp = await http.post(
        "/v1/queues/jobs/batch", json={"messages": [{"body": "x"}] * (limit + 1)}
    )
    await expect_error(resp, 400, "batch_too_large")
    resp = await http.post("/v1/queues/jobs/batch", json={"messages": [{"body": "x"}] * limit})
    assert resp.status == 201
    assert len((await resp.json())["ids"]) == limit


# ---- pop -------------------------------------------------------------------------------
async def test_pop_returns_the_raw_body_with_its_content_type_and_id(http: Http) -> None:
    await _create(http, "jobs")
    mid = await _push(http, "jobs", "h\u00e9llo".encode(), "text/plain; charset=utf-8")
    resp = await http.post("/v1/queues/jobs/pop")
    assert resp.status == 200
    assert await resp.read() == "h\u00e9llo".encode()
    assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert resp.headers["zdmq-id"] == mid


async def test_pop_on_empty_queue_returns_204(http: Http) -> None:
    await _create(http, "jobs")
    resp = await http.post("/v1/queues/jobs/pop")
    assert resp.status == 204
    assert await resp.read() == b""
    await _push(http, "jobs", b"one")
    assert (await http.post("/v1/queues/jobs/pop")).status == 200
    assert (await http.post("/v1/queues/jobs/pop")).status == 204


async def test_pop_with_max_returns_up_to_max_messages_as_json(http: Http) -> None:
    await _create(http, "jobs")
    ids = [await _push(http, "jobs", b"m%d" % i, "text/plain") for i in range(5)]
    resp = await http.post("/v1/queues/jobs/pop", params={"max": "3"})
    assert resp.status == 200
    assert resp.content_type == "application/json"
    got = (await resp.json())["messages"]
    assert got == [
        {"id": ids[i], "body": f"m{i}", "encoding": "utf-8", "content_type": "text/plain"}
        for i in range(3)
    ]
    assert [m["id"] for m in await _pop_many(http, "jobs", 100)] == ids[3:]


async def test_pop_with_max_on_empty_queue_returns_an_empty_list(http: Http) -> None:
    await _create(http, "jobs")
    resp = await http.post("/v1/queues/jobs/pop", params={"max": "10"})
    assert resp.status == 200
    assert await resp.json() == {"messages": []}


@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "1.5", "1001"])
async def test_pop_with_a_bad_max_returns_400(http: Http, value: str) -> None:
    await _create(http, "jobs")
    await _push(http, "jobs", b"keep me")
    resp = await http.post("/v1/queues/jobs/pop", params={"max": value})
    message = await expect_error(resp, 400, "bad_request")
    assert message.startswith("max: ")
    # Nothing was popped by the refused call.
    assert len(await _pop_many(http, "jobs", 10)) == 1


async def test_pop_on_one_node_is_fifo(http: Http) -> None:
    await _create(http, "jobs")
    ids = [await _push(http, "jobs", b"%03d" % i) for i in range(30)]
    resp = await http.post(
        "/v1/queues/jobs/batch", json={"messages": [{"body": f"b{i}"} for i in range(30)]}
    )
    ids += (await resp.json())["ids"]
    got: list[str] = []
    for _ in range(10):
        resp = await http.post("/v1/queues/jobs/pop")
        got.append(resp.headers["zdmq-id"])
    while batch := await _pop_many(http, "jobs", 7):
        got += [m["id"] for m in batch]
    assert got == ids


async def test_binary_bodies_come_back_base64_in_json_pops(http: Http) -> None:
    await _create(http, "jobs")
    binary = b"\x80\xff\x00binary\xfe"
    await _push(http, "jobs", binary)
    await _push(http, "jobs", b"text")
    first, second = await _pop_many(http, "jobs", 2)
    assert first["encoding"] == "base64"
    assert base64.b64decode(first["body"]) == binary
    assert (second["encoding"], second["body"]) == ("utf-8", "text")


# ---- sizes -----------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, MiB], ids=["empty", "one_byte", "one_mib"])
async def test_bodies_up_to_the_limit_come_back_byte_identical(http: Http, size: int) -> None:
    await _create(http, "jobs")
    body = bytes(i % 251 for i in range(size))
    mid = await _push(http, "jobs", body, "application/octet-stream")
    resp = await http.post("/v1/queues/jobs/pop")
    assert resp.status == 200
    assert resp.headers["zdmq-id"] == mid
    assert await resp.read() == body
    await _push(http, "jobs", body)
    [m] = await _pop_many(http, "jobs", 1)
    text = m["body"].encode() if m["encoding"] == "utf-8" else base64.b64decode(m["body"])
    assert text == body


async def test_a_body_one_byte_over_the_limit_returns_413(http: Http) -> None:
    await _create(http, "jobs")
    resp = await http.post("/v1/queues/jobs/messages", data=b"x" * (MiB + 1))
    message = await expect_error(resp, 413, "message_too_large")
    assert str(MiB) in message
    assert (await http.post("/v1/queues/jobs/pop")).status == 204


@pytest.mark.parametrize("size", [MiB + 1, 3 * MiB], ids=["one_byte_over", "over_the_request_cap"])
async def test_a_chunked_body_over_the_limit_returns_413(http: Http, size: int) -> None:
    # Without a Content-Length the node can only count the bytes as they arrive.
    async def chunks() -> AsyncIterator[bytes]:
        left = size
        while left:
            n = min(left, 256 * 1024)
            left -= n
            yield b"x" * n

    await _create(http, "jobs")
    resp = await http.post("/v1/queues/jobs/messages", data=chunks())
    await expect_error(resp, 413, "message_too_large")
    assert (await http.post("/v1/queues/jobs/pop")).status == 204


async def test_a_batch_message_at_the_limit_is_stored_and_one_byte_over_returns_413(
    http: Http,
) -> None:
    await _create(http, "jobs")
    at_limit = base64.b64encode(b"\xff" * MiB).decode()
    resp = await http.post(
        "/v1/queues/jobs/batch", json={"messages": [{"body": at_limit, "encoding": "base64"}]}
    )
    assert resp.status == 201
    over = base64.b64encode(b"\xff" * (MiB + 1)).decode()
    resp = await http.post(
        "/v1/queues/jobs/batch", json={"messages": [{"body": over, "encoding": "base64"}]}
    )
    await expect_error(resp, 413, "message_too_large")
    [m] = await _pop_many(http, "jobs", 10)
    assert base64.b64decode(m["body"]) == b"\xff" * MiB


# ---- names, missing queues, routes -----------------------------------------------------
BAD_NAMES = {
    "space": "bad%20name",
    "too_long": "x" * 129,
    "unicode": "j%C3%B6bs",
    "colon": "a:b",
}
CALLS = [
    ("PUT", ""),
    ("GET", ""),
    ("DELETE", ""),
    ("GET", "/metadata"),
    ("POST", "/messages"),
    ("POST", "/batch"),
    ("POST", "/pop"),
]


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
@pytest.mark.parametrize(("method", "suffix"), CALLS, ids=[f"{m} {s}" for m, s in CALLS])
async def test_an_invalid_queue_name_returns_400_invalid_queue_name(
    http: Http, name: str, method: str, suffix: str
) -> None:
    kw: dict[str, Any] = {"json": {"messages": [{"body": "x"}]}} if suffix == "/batch" else {}
    resp = await http.request(method, f"/v1/queues/{name}{suffix}", **kw)
    await expect_error(resp, 400, "invalid_queue_name")


async def test_an_encoded_slash_in_a_queue_name_returns_400(http: Http) -> None:
    for method in ("PUT", "GET", "DELETE"):
        resp = await http.request(method, URL("/v1/queues/a%2Fb", encoded=True))
        await expect_error(resp, 400, "invalid_queue_name")


async def test_a_name_of_128_characters_is_accepted(http: Http) -> None:
    name = "q" * 128
    await _create(http, name)
    await _push(http, name, b"x")
    assert (await http.post(f"/v1/queues/{name}/pop")).status == 200


CALLS_ON_A_QUEUE = [
    ("POST", "/messages", None),
    ("POST", "/batch", {"messages": [{"body": "x"}]}),
    ("POST", "/pop", None),
    ("POST", "/pop?max=5", None),
]


@pytest.mark.parametrize(
    ("method", "suffix", "payload"), CALLS_ON_A_QUEUE, ids=[s for _, s, _ in CALLS_ON_A_QUEUE]
)
async def test_push_and_pop_on_a_never_created_queue_return_404(
    http: Http, method: str, suffix: str, payload: object
) -> None:
    kw: dict[str, Any] = {"json": payload} if payload is not None else {"data": b"x"}
    resp = await http.request(method, f"/v1/queues/nope{suffix}", **kw)
    await expect_error(resp, 404, "queue_not_found")


@pytest.mark.parametrize(
    ("method", "suffix", "payload"), CALLS_ON_A_QUEUE, ids=[s for _, s, _ in CALLS_ON_A_QUEUE]
)
async def test_push_and_pop_on_a_deleted_queue_return_404(
    http: Http, method: str, suffix: str, payload: object
) -> None:
    await _create(http, "jobs")
    await _push(http, "jobs", b"before delete")
    assert (await http.delete("/v1/queues/jobs")).status == 204
    kw: dict[str, Any] = {"json": payload} if payload is not None else {"data": b"x"}
    resp = await http.request(method, f"/v1/queues/jobs{suffix}", **kw)
    await expect_error(resp, 404, "queue_not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/index.html"),
        ("GET", "/ui/other.js"),
        ("GET", "/v2/health"),
        ("GET", "/v1/nope"),
        ("POST", "/v1/queues/jobs/nope"),
        ("GET", "/v1/queues/jobs/messages/extra/more"),
    ],
)
async def test_an_unknown_route_returns_404_not_found_as_json(
    http: Http, method: str, path: str
) -> None:
    await expect_error(await http.request(method, path), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/health"),
        ("DELETE", "/v1/queues"),
        ("PATCH", "/v1/queues/jobs"),
        ("GET", "/v1/queues/jobs/pop"),
        ("GET", "/v1/queues/jobs/messages"),
        ("PUT", "/v1/queues/jobs/batch"),
    ],
)
async def test_a_wrong_method_returns_405_method_not_allowed_as_json(
    http: Http, method: str, path: str
) -> None:
    await expect_error(await http.request(method, path), 405, "method_not_allowed")
