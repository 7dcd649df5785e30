"""The REST error surface of at-least-once delivery, on one node over real HTTP.

Queue settings, receive parameters and ack / nack / extend bodies are checked before
anything changes: a bad one is a 400 whose message names the field at fault, and
nothing is created, leased or settled.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import uuid
from typing import Any

import orjson
import pytest

from tests.helpers import wait_until
from tests.node.conftest import NodeHttp, expect_error
from zdmq.config import ClusterConfig

Http = NodeHttp
MiB = 1024 * 1024


async def _create(http: Http, queue: str, settings: dict[str, Any] | None = None) -> None:
    resp = await http.put(f"/v1/queues/{queue}", json=settings)
    assert resp.status == 201, await resp.text()


async def _push(http: Http, queue: str, body: bytes) -> str:
    resp = await http.post(f"/v1/queues/{queue}/messages", data=body)
    assert resp.status == 201, await resp.text()
    return str((await resp.json())["id"])


async def _stats(http: Http, queue: str) -> dict[str, Any]:
    resp = await http.get(f"/v1/queues/{queue}")
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


async def _receive(http: Http, queue: str, n: int) -> list[dict[str, Any]]:
    resp = await http.post(
        f"/v1/queues/{queue}/receive", params={"max": str(n), "visibility_s": "30"}
    )
    assert resp.status == 200, await resp.text()
    return list((await resp.json())["messages"])


# ---- queue settings --------------------------------------------------------------------
BAD_SETTINGS = [
    ({"visibility_timeout_s": -1}, "visibility_timeout_s"),
    ({"visibility_timeout_s": 43_201}, "visibility_timeout_s"),
    ({"visibility_timeout_s": "30"}, "visibility_timeout_s"),
    ({"visibility_timeout_s": True}, "visibility_timeout_s"),
    ({"max_receives": 0, "dead_letter_queue": "dlq"}, "max_receives"),
    ({"max_receives": 1_001, "dead_letter_queue": "dlq"}, "max_receives"),
    ({"max_receives": 2.5, "dead_letter_queue": "dlq"}, "max_receives"),
    ({"max_receives": "3", "dead_letter_queue": "dlq"}, "max_receives"),
    ({"max_receives": 3}, "max_receives"),  # no dead-letter queue to move them to
    ({"dead_letter_queue": 5}, "dead_letter_queue"),
    ({"dead_letter_queue": "has space"}, "dead_letter_queue"),
    ({"dead_letter_queue": ""}, "dead_letter_queue"),
    ({"retention_s": 0}, "retention_s"),
    ({"retention_s": 14 * 86_400 + 1}, "retention_s"),
    ({"retention_s": "1d"}, "retention_s"),
    ({"dedup_window_s": -1}, "dedup_window_s"),
    ({"dedup_window_s": 86_401}, "dedup_window_s"),
    ({"max_message_bytes": 0}, "max_message_bytes"),
    ({"max_message_bytes": MiB + 1}, "max_message_bytes"),  # over the cluster's limit
    ({"max_message_bytes": 1.5}, "max_message_bytes"),
    ({"colour": "blue"}, "colour"),
    ({"visibility_timeout_s": 5, "visibilty_timeout_s": 5}, "visibilty_timeout_s"),
]


@pytest.mark.parametrize(("settings", "field"), BAD_SETTINGS)
async def test_put_queue_with_a_bad_setting_returns_400_naming_the_field_and_creates_nothing(
    http: Http, settings: dict[str, Any], field: str
) -> None:
    await _create(http, "dlq")
    message = await expect_error(
        await http.put("/v1/queues/jobs", json=settings), 400, "bad_request"
    )
    assert field in message
    await expect_error(await http.get("/v1/queues/jobs"), 404, "queue_not_found")


@pytest.mark.parametrize("body", [b"[]", b'"fast"', b"5", b"true", b"{not json"])
async def test_put_queue_with_a_body_that_is_not_a_json_object_returns_400(
    http: Http, body: bytes
) -> None:
    resp = await http.put(
        "/v1/queues/jobs", data=body, headers={"Content-Type": "application/json"}
    )
    await expect_error(resp, 400, "bad_request")
    await expect_error(await http.get("/v1/queues/jobs"), 404, "queue_not_found")


async def test_put_queue_with_a_dead_letter_queue_that_does_not_exist_returns_404_naming_it(
    http: Http,
) -> None:
    resp = await http.put("/v1/queues/jobs", json={"dead_letter_queue": "missing-dlq"})
    message = await expect_error(resp, 404, "queue_not_found")
    assert "dead_letter_queue" in message and "missing-dlq" in message
    await expect_error(await http.get("/v1/queues/jobs"), 404, "queue_not_found")


async def test_put_queue_naming_itself_as_its_dead_letter_queue_returns_404(http: Http) -> None:
    # The queue does not exist until the create succeeds, so it cannot be its own.
    resp = await http.put("/v1/queues/jobs", json={"dead_letter_queue": "jobs"})
    assert "dead_letter_queue" in await expect_error(resp, 404, "queue_not_found")
    await expect_error(await http.get("/v1/queues/jobs"), 404, "queue_not_found")


async def test_put_queue_with_every_setting_reports_them_back(http: Http) -> None:
    await _create(http, "dlq")
    settings = {
        "visibility_timeout_s": 12.5,
        "max_receives": 4,
        "dead_letter_queue": "dlq",
        "retention_s": 3_600,
        "dedup_window_s": 60,
        "max_message_bytes": 2_048,
        "fifo": True,
        "content_based_dedup": True,
    }
    resp = await http.put("/v1/queues/jobs", json=settings)
    assert resp.status == 201, await resp.text()
    assert await resp.json() == {"queue": "jobs", "settings": settings}
    assert (await _stats(http, "jobs"))["settings"] == settings
    meta = await (await http.get("/v1/queues/jobs/metadata")).json()
    assert meta["settings"] == settings


# ---- receive parameters ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("max", "0"),
        ("max", "101"),
        ("max", "ten"),
        ("visibility_s", "-1"),
        ("visibility_s", "43201"),
        ("visibility_s", "abc"),
        ("visibility_s", "nan"),
        ("wait_s", "21"),
        ("wait_s", "-1"),
    ],
)
async def test_receive_with_a_parameter_out_of_range_returns_400_naming_it(
    http: Http, param: str, value: str
) -> None:
    await _create(http, "jobs")
    await _push(http, "jobs", b"untouched")
    resp = await http.post("/v1/queues/jobs/receive", params={param: value})
    assert param in await expect_error(resp, 400, "bad_request")
    stats = await _stats(http, "jobs")
    assert (stats["messages"], stats["in_flight"]) == (1, 0)


async def test_receive_at_the_bounds_of_its_parameters_is_accepted(http: Http) -> None:
    await _create(http, "jobs")
    mid = await _push(http, "jobs", b"edge")
    resp = await http.post(
        "/v1/queues/jobs/receive", params={"max": "100", "visibility_s": "43200", "wait_s": "0"}
    )
    assert resp.status == 200, await resp.text()
    [m] = (await resp.json())["messages"]
    assert (m["id"], m["body"], m["receive_count"]) == (mid, "edge", 1)


@pytest.mark.parametrize("params", [{}, {"wait_s": "1"}])
async def test_receive_on_a_missing_queue_returns_404_queue_not_found(
    http: Http, params: dict[str, str]
) -> None:
    resp = await http.post("/v1/queues/nope/receive", params=params)
    assert "nope" in await expect_error(resp, 404, "queue_not_found")


# ---- ack, nack, extend bodies ---------------------------------------------------------------
ACTIONS = ["ack", "nack", "extend"]
# Everything else an action needs, so that only the part under test is wrong.
EXTRA: dict[str, dict[str, Any]] = {
    "ack": {},
    "nack": {"delay_s": 0},
    "extend": {"visibility_s": 30},
}


def _fake_receipt() -> str:
    return f"{uuid.uuid4()}.{uuid.uuid4().hex[:16]}"


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize(
    "payload",
    [
        {"receipts": "abc.def"},
        {"receipts": {"r": 1}},
        {"receipts": None},
        {},
        {"receipts": []},
        ["not", "an", "object"],
    ],
    ids=["string", "object", "null", "missing", "empty", "list-body"],
)
async def test_settle_calls_without_a_non_empty_list_of_receipts_return_400(
    http: Http, action: str, payload: Any
) -> None:
    await _create(http, "jobs")
    if isinstance(payload, dict):
        payload = {**EXTRA[action], **payload}
    resp = await http.post(f"/v1/queues/jobs/{action}", json=payload)
    assert "receipts" in await expect_error(resp, 400, "bad_request")


@pytest.mark.parametrize("action", ACTIONS)
async def test_settle_calls_with_a_body_that_is_not_json_return_400(
    http: Http, action: str
) -> None:
    await _create(http, "jobs")
    resp = await http.post(
        f"/v1/queues/jobs/{action}", data=b"{receipts", headers={"Content-Type": "application/json"}
    )
    await expect_error(resp, 400, "bad_request")


@pytest.mark.parametrize("action", ACTIONS)
async def test_settle_calls_over_the_batch_limit_return_400_batch_too_large(
    http: Http, node_config: ClusterConfig, action: str
) -> None:
    await _create(http, "jobs")
    mid = await _push(http, "jobs", b"held")
    [m] = await _receive(http, "jobs", 1)
    limit = node_config.limits.max_batch_messages
    receipts = [m["receipt"]] + [_fake_receipt() for _ in range(limit)]
    resp = await http.post(
        f"/v1/queues/jobs/{action}", json={"receipts": receipts, **EXTRA[action]}
    )
    assert str(limit) in await expect_error(resp, 400, "batch_too_large")
    # The one real receipt in the refused call was not settled.
    stats = await _stats(http, "jobs")
    assert (stats["messages"], stats["in_flight"]) == (1, 1)
    assert m["id"] == mid


async def test_extend_without_visibility_s_extends_by_the_queues_visibility_timeout(
    http: Http,
) -> None:
    await _create(http, "jobs", {"visibility_timeout_s": 0})
    await _push(http, "jobs", b"m")
    [m] = await _receive(http, "jobs", 1)  # leased for 30 s
    resp = await http.post("/v1/queues/jobs/extend", json={"receipts": [m["receipt"]]})
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"extended": 1, "failed": []}
    # The lease now ends visibility_timeout_s (0) from the extend: visible again.
    await wait_until(lambda: _popped(http, "jobs"), timeout_s=5)


async def _popped(http: Http, queue: str) -> bool:
    return (await http.post(f"/v1/queues/{queue}/pop")).status == 200


async def test_extend_without_visibility_s_of_a_queue_that_does_not_exist_returns_404(
    http: Http,
) -> None:
    resp = await http.post("/v1/queues/nope/extend", json={"receipts": [_fake_receipt()]})
    await expect_error(resp, 404, "queue_not_found")


@pytest.mark.parametrize(
    ("action", "field", "value"),
    [
        ("extend", "visibility_s", -1),
        ("extend", "visibility_s", 43_201),
        ("extend", "visibility_s", "30"),
        ("extend", "visibility_s", None),
        ("nack", "delay_s", -1),
        ("nack", "delay_s", 43_201),
        ("nack", "delay_s", "soon"),
        ("nack", "delay_s", True),
    ],
)
async def test_settle_calls_with_a_bad_number_return_400_naming_it_and_settle_nothing(
    http: Http, action: str, field: str, value: Any
) -> None:
    await _create(http, "jobs")
    await _push(http, "jobs", b"held")
    [m] = await _receive(http, "jobs", 1)
    resp = await http.post(
        f"/v1/queues/jobs/{action}", json={"receipts": [m["receipt"]], field: value}
    )
    assert field in await expect_error(resp, 400, "bad_request")
    assert (await _stats(http, "jobs"))["in_flight"] == 1
    resp = await http.post("/v1/queues/jobs/ack", json={"receipts": [m["receipt"]]})
    assert await resp.json() == {"acked": 1, "failed": []}  # the lease was untouched


@pytest.mark.parametrize("action", ACTIONS)
async def test_malformed_receipts_fail_one_by_one_as_invalid_receipt_while_valid_ones_settle(
    http: Http, action: str
) -> None:
    await _create(http, "jobs")
    for body in (b"a", b"b"):
        await _push(http, "jobs", body)
    good = [m["receipt"] for m in await _receive(http, "jobs", 2)]
    assert len(good) == 2
    some_id = str(uuid.uuid4())
    malformed: list[Any] = [
        "garbage",
        42,
        None,
        "not-a-uuid.abcdef",
        f"{some_id}.bad!token",
        f"{some_id}.",
        f"{some_id}.abc.def",
        some_id.upper() + ".abcdef",
    ]
    unknown = _fake_receipt()  # well formed, but no such lease
    payload = {"receipts": [good[0], *malformed, unknown, good[1]], **EXTRA[action]}
    resp = await http.post(f"/v1/queues/jobs/{action}", json=payload)
    assert resp.status == 200, await resp.text()
    reply = await resp.json()
    count = {"ack": "acked", "nack": "nacked", "extend": "extended"}[action]
    assert reply[count] == 2
    failed = {f["receipt"]: f["code"] for f in reply["failed"]}
    assert failed == {
        **{str(r): "invalid_receipt" for r in malformed},
        unknown: "lease_expired",
    }
    stats = await _stats(http, "jobs")
    expected = {"ack": (0, 0), "nack": (2, 0), "extend": (2, 2)}[action]
    assert (stats["messages"], stats["in_flight"]) == expected


# ---- pushes --------------------------------------------------------------------------------
async def test_a_push_with_an_id_and_a_dedup_id_keeps_the_id_and_refuses_repeats_in_the_window(
    http: Http,
) -> None:
    await _create(http, "jobs")
    mid = str(uuid.uuid4())
    headers = {"zdmq-id": mid, "zdmq-dedup-id": "order-1"}
    resp = await http.post("/v1/queues/jobs/messages", data=b"once", headers=headers)
    assert resp.status == 201, await resp.text()
    assert await resp.json() == {"id": mid, "duplicate": False}
    popped = await http.post("/v1/queues/jobs/pop")
    assert popped.headers["zdmq-id"] == mid
    # Gone, yet within the dedup window a repeat stores nothing, as a dedup id's would.
    resp = await http.post("/v1/queues/jobs/messages", data=b"once", headers=headers)
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"id": mid, "duplicate": True}
    assert (await _stats(http, "jobs"))["messages"] == 0


async def test_a_message_over_the_queues_max_message_bytes_returns_413_and_stores_nothing(
    http: Http, node_config: ClusterConfig
) -> None:
    limit = 64
    assert limit < node_config.limits.max_message_bytes
    await _create(http, "small", {"max_message_bytes": limit})
    await _create(http, "big")

    resp = await http.post("/v1/queues/small/messages", data=b"x" * (limit + 1))
    assert str(limit) in await expect_error(resp, 413, "message_too_large")
    batch = {"messages": [{"body": "fits"}, {"body": "y" * (limit + 1)}]}
    resp = await http.post("/v1/queues/small/batch", data=orjson.dumps(batch))
    await expect_error(resp, 413, "message_too_large")
    assert (await _stats(http, "small"))["messages"] == 0

    # At the limit it fits; the queue's limit is not the cluster's.
    await _push(http, "small", b"x" * limit)
    await _push(http, "big", b"x" * (limit + 1))
    assert (await _stats(http, "small"))["messages"] == 1
    assert (await _stats(http, "big"))["messages"] == 1


async def test_a_long_poll_receive_whose_caller_hung_up_releases_what_it_leased(
    http: Http,
) -> None:
    q = f"hangup-{uuid.uuid4().hex[:8]}"
    await _create(http, q)
    # A raw long poll ...
    port = int(http.base.rsplit(":", 1)[1])
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST /v1/queues/{q}/receive?max=5&wait_s=5&visibility_s=60 HTTP/1.1\r\n"
        f"Host: x\r\nContent-Length: 0\r\n\r\n".encode()
    )
    await writer.drain()
    # ... whose caller gives up while it waits: with a reset, as zdmq's client ends a call
    # it gives up on (a FIN alone could be a caller that still waits for its reply).
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
    await writer.wait_closed()
    await _push(http, q, b"wakes the poll")

    async def released() -> bool:
        s = await _stats(http, q)
        return (s["messages"], s["in_flight"]) == (1, 0)

    # The poll wakes, leases the message, sees its caller gone and releases it at once:
    # visible again well before its 60 s visibility timeout.
    await wait_until(released, timeout_s=5, what="the lease to be released")
    [got] = await _receive(http, q, 5)
    assert got["body"] == "wakes the poll"
