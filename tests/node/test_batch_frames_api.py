"""The binary batch format over real HTTP on one node: push, pop, receive, ack, nack and
extend in frames, side by side with JSON on the same queue; bad frames get 400 with the
usual JSON error and store nothing."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from tests.node.conftest import NodeHttp, expect_error
from zdmq.config import ClusterConfig
from zdmq.models import (
    BATCH_BODIES,
    BATCH_CONTENT_TYPE,
    BATCH_IDS,
    Batch,
    decode_batch,
    dedup_message_id,
    encode_batch,
    new_message_id,
)

Http = NodeHttp
FRAME = {"Content-Type": BATCH_CONTENT_TYPE}
ACCEPT = {"Accept": BATCH_CONTENT_TYPE}


async def _create(http: Http, queue: str, **settings: Any) -> None:
    resp = await http.put(f"/v1/queues/{queue}", json=settings or None)
    assert resp.status == 201, await resp.text()


async def _push_frame(http: Http, queue: str, frame: bytes) -> dict[str, Any]:
    resp = await http.post(f"/v1/queues/{queue}/batch", data=frame, headers=FRAME)
    assert resp.status == 201, await resp.text()
    return dict(await resp.json())


async def _take_frame(http: Http, queue: str, kind: str, n: int, **params: str) -> Batch:
    resp = await http.post(
        f"/v1/queues/{queue}/{kind}", params={"max": str(n), **params}, headers=ACCEPT
    )
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"] == BATCH_CONTENT_TYPE
    return decode_batch(await resp.read())


async def _pop_json(http: Http, queue: str, n: int = 100) -> list[dict[str, Any]]:
    resp = await http.post(f"/v1/queues/{queue}/pop", params={"max": str(n)})
    assert resp.status == 200, await resp.text()
    return list((await resp.json())["messages"])


def _json_body(m: dict[str, Any]) -> bytes:
    if m["encoding"] == "base64":
        return base64.b64decode(m["body"])
    return str(m["body"]).encode()


async def test_a_frame_push_stores_every_body_as_sent_and_json_pops_them_in_order(
    http: Http,
) -> None:
    await _create(http, "jobs")
    ids = [new_message_id() for _ in range(3)]
    bodies = [b"plain text", bytes(range(256)), b""]
    reply = await _push_frame(
        http, "jobs", encode_batch(ids=ids, bodies=bodies, content_types=[None, "a/b", None])
    )
    assert reply == {"ids": ids, "duplicates": 0}
    got = await _pop_json(http, "jobs")
    assert [m["id"] for m in got] == ids
    assert [_json_body(m) for m in got] == bodies
    assert [m.get("content_type") for m in got] == [None, "a/b", None]


async def test_a_json_push_is_received_as_a_frame_with_receipts_and_counts(http: Http) -> None:
    await _create(http, "jobs")
    messages = [
        {"body": "one", "content_type": "text/plain"},
        {"body": base64.b64encode(b"\xff\x00").decode(), "encoding": "base64"},
    ]
    resp = await http.post("/v1/queues/jobs/batch", json={"messages": messages})
    assert resp.status == 201
    ids = (await resp.json())["ids"]
    batch = await _take_frame(http, "jobs", "receive", 10, visibility_s="30")
    assert batch.count == 2
    assert batch.ids == ids
    assert batch.bodies == [b"one", b"\xff\x00"]
    assert batch.content_types == ["text/plain", None]
    assert batch.receive_counts == [1, 1]
    assert batch.receipts is not None
    assert [r.split(".")[0] for r in batch.receipts if r] == ids
    # A frame pop of an empty queue is an empty frame, not 204.
    empty = await _take_frame(http, "jobs", "pop", 10)
    assert empty.count == 0


async def test_a_pop_frame_has_no_receipts_and_removes_the_messages(http: Http) -> None:
    await _create(http, "jobs")
    ids = [new_message_id() for _ in range(5)]
    await _push_frame(http, "jobs", encode_batch(ids=ids, bodies=[b"x"] * 5))
    batch = await _take_frame(http, "jobs", "pop", 3)
    assert batch.ids == ids[:3]
    assert batch.receipts is None and batch.receive_counts is None
    assert [m["id"] for m in await _pop_json(http, "jobs")] == ids[3:]


async def test_frame_acks_nacks_and_extends_settle_leases_and_report_bad_receipts(
    http: Http,
) -> None:
    await _create(http, "jobs")
    await _push_frame(http, "jobs", encode_batch(ids=[None] * 4, bodies=[b"a", b"b", b"c", b"d"]))
    leased = await _take_frame(http, "jobs", "receive", 4, visibility_s="30")
    assert leased.receipts is not None
    r = [x for x in leased.receipts if x is not None]
    # Ids the node assigned are canonical UUIDs.
    assert leased.ids is not None and all(i and len(i) == 36 for i in leased.ids)

    resp = await http.post(
        "/v1/queues/jobs/extend",
        data=encode_batch(receipts=[r[0]]),
        headers=FRAME,
        params={"visibility_s": "60"},
    )
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"extended": 1, "failed": []}
    resp = await http.post(
        "/v1/queues/jobs/extend", data=encode_batch(receipts=[r[0]]), headers=FRAME
    )
    assert resp.status == 200, await resp.text()  # no visibility_s: the queue's timeout
    assert await resp.json() == {"extended": 1, "failed": []}

    resp = await http.post(
        "/v1/queues/jobs/ack", data=encode_batch(receipts=[r[0], r[1], "junk"]), headers=FRAME
    )
    assert resp.status == 200
    assert await resp.json() == {
        "acked": 2,
        "failed": [{"receipt": "junk", "code": "invalid_receipt"}],
    }
    resp = await http.post("/v1/queues/jobs/ack", data=encode_batch(receipts=[r[0]]), headers=FRAME)
    assert await resp.json() == {
        "acked": 0,
        "failed": [{"receipt": r[0], "code": "lease_expired"}],
    }
    resp = await http.post(
        "/v1/queues/jobs/nack",
        data=encode_batch(receipts=r[2:]),
        headers=FRAME,
        params={"delay_s": "0"},
    )
    assert await resp.json() == {"nacked": 2, "failed": []}
    again = await _take_frame(http, "jobs", "receive", 4)
    assert again.bodies == [b"c", b"d"]
    assert again.receive_counts == [2, 2]


async def test_dedup_ids_in_a_frame_store_each_message_once_under_its_derived_id(
    http: Http,
) -> None:
    await _create(http, "jobs")
    frame = encode_batch(
        ids=[None, None, None], bodies=[b"a", b"b", b"a again"], dedup_ids=["k1", "k2", "k1"]
    )
    reply = await _push_frame(http, "jobs", frame)
    k1, k2 = dedup_message_id("jobs", "k1"), dedup_message_id("jobs", "k2")
    assert reply == {"ids": [k1, k2, k1], "duplicates": 1}
    # A retry of the whole frame stores nothing more; JSON with the same dedup id neither.
    assert (await _push_frame(http, "jobs", frame))["duplicates"] == 3
    resp = await http.post(
        "/v1/queues/jobs/batch", json={"messages": [{"body": "x", "dedup_id": "k2"}]}
    )
    assert (await resp.json())["duplicates"] == 1
    got = await _pop_json(http, "jobs")
    assert [(m["id"], m["body"]) for m in got] == [(k1, "a"), (k2, "b")]


async def test_a_frame_message_with_an_id_and_a_dedup_id_keeps_its_id_and_refuses_repeats(
    http: Http,
) -> None:
    await _create(http, "jobs")
    mid = new_message_id()
    frame = encode_batch(ids=[mid], bodies=[b"a"], dedup_ids=["k"])
    assert await _push_frame(http, "jobs", frame) == {"ids": [mid], "duplicates": 0}
    assert [m["id"] for m in await _pop_json(http, "jobs")] == [mid]
    # Gone, yet within the dedup window a repeat stores nothing, as a dedup id's would.
    assert await _push_frame(http, "jobs", frame) == {"ids": [mid], "duplicates": 1}
    assert await _pop_json(http, "jobs") == []


async def test_bodies_up_to_the_message_limit_pass_and_one_byte_more_is_413(
    http: Http, node_config: ClusterConfig
) -> None:
    await _create(http, "jobs")
    limit = node_config.limits.max_message_bytes
    big = bytes(range(256)) * (limit // 256) + b"z" * (limit % 256)
    assert len(big) == limit
    await _push_frame(http, "jobs", encode_batch(bodies=[b"small", big]))
    batch = await _take_frame(http, "jobs", "receive", 10)
    assert batch.bodies == [b"small", big]
    over = encode_batch(bodies=[b"small", big + b"!"])
    resp = await http.post("/v1/queues/jobs/batch", data=over, headers=FRAME)
    message = await expect_error(resp, 413, "message_too_large")
    assert message.startswith("messages[1]: ")
    resp = await http.post("/v1/queues/jobs/pop", params={"max": "10"})
    assert (await resp.json())["messages"] == []


def _head(count: int, fields: int) -> bytes:
    return b"ZQB1" + struct.pack("<II", count, fields)


GOOD_ID = "0d7a1a0e-1111-4222-8333-444455556666"


@pytest.mark.parametrize(
    ("frame", "status", "code"),
    [
        (b"", 400, "bad_request"),
        (b"ZQB1", 400, "bad_request"),
        (b'{"messages": [{"body": "json under the frame type"}]}', 400, "bad_request"),
        (_head(0, BATCH_BODIES), 400, "bad_request"),  # no message
        (_head(1, BATCH_IDS) + GOOD_ID.encode(), 400, "bad_request"),  # no bodies
        (  # a good message, then one whose id is not canonical
            _head(2, BATCH_IDS | BATCH_BODIES)
            + GOOD_ID.encode()
            + GOOD_ID.upper().encode()
            + struct.pack("<II", 1, 1)
            + b"ab",
            400,
            "bad_request",
        ),
        (  # the second body is cut short
            _head(2, BATCH_BODIES) + struct.pack("<II", 1, 5) + b"abc",
            400,
            "bad_request",
        ),
        (_head(1, BATCH_BODIES) + struct.pack("<I", 1) + b"ab", 400, "bad_request"),  # extra
        (encode_batch(bodies=[b"a"], receipts=[GOOD_ID + ".t"]), 400, "bad_request"),
        (_head(1001, BATCH_BODIES) + struct.pack("<I", 0) * 1001, 400, "batch_too_large"),
    ],
    ids=[
        "empty",
        "head_only",
        "json_body",
        "no_messages",
        "no_bodies",
        "bad_second_id",
        "cut_short",
        "trailing_bytes",
        "receipts_in_a_push",
        "over_the_batch_limit",
    ],
)
async def test_a_malformed_push_frame_gets_400_with_a_json_error_and_stores_nothing(
    http: Http, frame: bytes, status: int, code: str
) -> None:
    await _create(http, "jobs")
    resp = await http.post("/v1/queues/jobs/batch", data=frame, headers=FRAME)
    await expect_error(resp, status, code)
    assert await _pop_json(http, "jobs") == []
    health = await (await http.get("/v1/health")).json()
    assert health["messages"] == 0


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"nonsense",
        encode_batch(bodies=[b"x"]),
        _head(1, 1 << 4) + struct.pack("<I", 0xFFFFFFFF),
    ],
    ids=["empty", "nonsense", "bodies_not_receipts", "missing_receipt"],
)
async def test_a_malformed_ack_frame_gets_400_and_settles_nothing(http: Http, frame: bytes) -> None:
    await _create(http, "jobs")
    await _push_frame(http, "jobs", encode_batch(bodies=[b"a"]))
    leased = await _take_frame(http, "jobs", "receive", 1)
    resp = await http.post("/v1/queues/jobs/ack", data=frame, headers=FRAME)
    await expect_error(resp, 400, "bad_request")
    assert leased.receipts is not None
    resp = await http.post(
        "/v1/queues/jobs/ack", data=encode_batch(receipts=leased.receipts), headers=FRAME
    )
    assert await resp.json() == {"acked": 1, "failed": []}


async def test_json_stays_the_default_for_callers_that_do_not_ask_for_frames(
    http: Http,
) -> None:
    await _create(http, "jobs")
    await _push_frame(http, "jobs", encode_batch(bodies=[b"a", b"b"]))
    resp = await http.post("/v1/queues/jobs/receive", params={"max": "1"})
    assert resp.content_type == "application/json"
    [m] = (await resp.json())["messages"]
    resp = await http.post("/v1/queues/jobs/ack", json={"receipts": [m["receipt"]]})
    assert await resp.json() == {"acked": 1, "failed": []}
    resp = await http.post(
        "/v1/queues/jobs/pop", params={"max": "5"}, headers={"Accept": "application/json"}
    )
    assert resp.content_type == "application/json"
    assert [m["body"] for m in (await resp.json())["messages"]] == ["b"]
