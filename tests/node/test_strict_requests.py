"""A request the document does not describe is refused, never half-read.

One node over real HTTP. What a call does not read is refused with 400 bad_request naming
it (a misspelt query parameter or JSON field, a zdmq header with a value it does not take, a
`null` where settings belong) rather than ignored; a number a settle call takes may come in
the JSON body or the query, checked either way, the body's used when both have it; a method
a path does not take is 405 with an `Allow` header listing the methods it does take.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from yarl import URL

from tests.node.conftest import NodeHttp, expect_error

Http = NodeHttp


async def _queue_with_lease(http: Http, queue: str = "jobs") -> str:
    """Creates `queue`, pushes one message and leases it; returns the receipt."""
    assert (await http.put(f"/v1/queues/{queue}")).status == 201
    assert (await http.post(f"/v1/queues/{queue}/messages", data=b"m")).status == 201
    resp = await http.post(f"/v1/queues/{queue}/receive", params={"visibility_s": "30"})
    [message] = (await resp.json())["messages"]
    return str(message["receipt"])


# ---- 405 ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/v1/health", "GET"),
        ("DELETE", "/v1/queues", "GET"),
        ("PATCH", "/v1/queues/jobs", "DELETE, GET, PUT"),
        ("GET", "/v1/queues/jobs/pop", "POST"),
        ("OPTIONS", "/v1/queues/jobs/messages", "POST"),
        ("TRACE", "/v1/queues/jobs/ack", "POST"),
    ],
)
async def test_a_method_a_path_does_not_take_is_405_with_allow_listing_the_ones_it_does(
    http: Http, method: str, path: str, allow: str
) -> None:
    resp = await http.request(method, path)
    await expect_error(resp, 405, "method_not_allowed")
    assert resp.headers["Allow"] == allow


async def test_an_unknown_path_is_404_without_allow(http: Http) -> None:
    resp = await http.request("PATCH", "/v1/nowhere")
    await expect_error(resp, 404, "not_found")
    assert "Allow" not in resp.headers


# ---- query parameters ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "params"),
    [
        ("GET", "/v1/health", {"verbose": "1"}),
        ("GET", "/v1/queues", {"": ""}),
        ("PUT", "/v1/queues/other", {"visibility_timeout_s": "5"}),
        ("POST", "/v1/queues/jobs/messages", {"max": "1"}),
        ("POST", "/v1/queues/jobs/pop", {"visibility_s": "5"}),
        ("POST", "/v1/queues/jobs/receive", {"visibilty_s": "5"}),
        ("POST", "/v1/queues/jobs/ack", {"visibility_s": "5"}),
    ],
)
async def test_a_query_parameter_the_call_does_not_read_is_400_naming_it(
    http: Http, method: str, path: str, params: dict[str, str]
) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    message = await expect_error(
        await http.request(method, path, params=params), 400, "bad_request"
    )
    assert repr(next(iter(params))) in message


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("pop", "max=1&max=5"),
        ("receive", "visibility_s=1&wait_s=0&visibility_s=2"),
        ("ack", "delay_s=1&delay_s=true"),
    ],
)
async def test_a_query_parameter_given_twice_is_400_naming_it(
    http: Http, path: str, query: str
) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    assert (await http.post("/v1/queues/jobs/messages", data=b"kept")).status == 201
    resp = await http.post(
        URL(f"/v1/queues/jobs/{path}?{query}", encoded=True),
        json={"receipts": ["x"]} if path == "ack" else None,
    )
    message = await expect_error(resp, 400, "bad_request")
    assert "more than once" in message
    stats = await (await http.get("/v1/queues/jobs")).json()
    assert stats["messages"] == 1 and stats["in_flight"] == 0


async def test_a_refused_query_parameter_stores_and_takes_nothing(http: Http) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    resp = await http.post("/v1/queues/jobs/messages", data=b"x", params={"dedup": "1"})
    await expect_error(resp, 400, "bad_request")
    resp = await http.post("/v1/queues/jobs/pop", params={"max": "5", "visibility": "1"})
    await expect_error(resp, 400, "bad_request")
    stats = await (await http.get("/v1/queues/jobs")).json()
    assert stats["messages"] == 0


# ---- zdmq headers --------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["pop", "receive"])
@pytest.mark.parametrize(
    "headers",
    [{"zdmq-route": "everywhere"}, {"zdmq-route": "Local"}, {"zdmq-listed": "yes"}],
)
async def test_a_zdmq_header_with_a_value_it_does_not_take_is_400_and_takes_nothing(
    http: Http, op: str, headers: dict[str, str]
) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    assert (await http.post("/v1/queues/jobs/messages", data=b"kept")).status == 201
    resp = await http.post(f"/v1/queues/jobs/{op}", headers=headers)
    message = await expect_error(resp, 400, "bad_request")
    assert next(iter(headers)) in message
    resp = await http.post("/v1/queues/jobs/pop")
    assert resp.status == 200
    assert await resp.read() == b"kept"


async def test_zdmq_route_owner_routes_as_if_the_header_were_absent(http: Http) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    assert (await http.post("/v1/queues/jobs/messages", data=b"m")).status == 201
    resp = await http.post("/v1/queues/jobs/pop", headers={"zdmq-route": "owner"})
    assert resp.status == 200
    assert await resp.read() == b"m"


# ---- null bodies ----------------------------------------------------------------------------
async def test_a_create_with_a_null_body_is_400_and_creates_nothing(http: Http) -> None:
    resp = await http.put(
        "/v1/queues/jobs", data=b"null", headers={"Content-Type": "application/json"}
    )
    await expect_error(resp, 400, "bad_request")
    await expect_error(await http.get("/v1/queues/jobs"), 404, "queue_not_found")


async def test_a_create_with_an_empty_body_takes_every_default(http: Http) -> None:
    resp = await http.put("/v1/queues/jobs", data=b"", headers={"Content-Type": "application/json"})
    assert resp.status == 201
    assert (await resp.json())["settings"]["visibility_timeout_s"] == 30


@pytest.mark.parametrize("path", ["batch", "ack", "nack", "extend"])
async def test_a_null_body_where_an_object_belongs_is_400(http: Http, path: str) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    resp = await http.post(
        f"/v1/queues/jobs/{path}", data=b"null", headers={"Content-Type": "application/json"}
    )
    await expect_error(resp, 400, "bad_request")


# ---- settle numbers in the query with a JSON body ------------------------------------------------
async def test_a_json_nack_reads_delay_s_from_the_query(http: Http) -> None:
    receipt = await _queue_with_lease(http)
    resp = await http.post(
        "/v1/queues/jobs/nack", json={"receipts": [receipt]}, params={"delay_s": "60"}
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["nacked"] == 1
    stats = await (await http.get("/v1/queues/jobs")).json()
    assert stats["delayed"] == 1  # the query's delay held it back
    assert (await http.post("/v1/queues/jobs/pop")).status == 204


async def test_a_json_extend_reads_visibility_s_from_the_query(http: Http) -> None:
    receipt = await _queue_with_lease(http)
    resp = await http.post(
        "/v1/queues/jobs/extend", json={"receipts": [receipt]}, params={"visibility_s": "0"}
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["extended"] == 1
    # The lease now ends at once: the message is visible again.
    deadline = time.monotonic() + 5
    while (resp := await http.post("/v1/queues/jobs/pop")).status == 204:
        assert time.monotonic() < deadline, "the extended lease did not end"
    assert await resp.read() == b"m"


@pytest.mark.parametrize(
    ("op", "params", "body"),
    [
        ("ack", {"delay_s": "43201"}, {}),
        ("nack", {"delay_s": "-1"}, {}),
        ("nack", {"delay_s": "soon"}, {}),
        ("extend", {"visibility_s": "nan"}, {}),
        ("nack", {"delay_s": "-1"}, {"delay_s": 1}),
        ("extend", {"visibility_s": "43201"}, {"visibility_s": 1}),
    ],
)
async def test_a_json_settle_checks_its_query_numbers_even_when_the_body_has_them(
    http: Http, op: str, params: dict[str, str], body: dict[str, Any]
) -> None:
    receipt = await _queue_with_lease(http)
    if op == "extend" and "visibility_s" not in body and "visibility_s" not in params:
        body = {**body, "visibility_s": 1}
    resp = await http.post(
        f"/v1/queues/jobs/{op}", json={"receipts": [receipt], **body}, params=params
    )
    message = await expect_error(resp, 400, "bad_request")
    assert next(iter(params)) in message
    stats = await (await http.get("/v1/queues/jobs")).json()
    assert stats["in_flight"] == 1  # the lease is untouched


@pytest.mark.parametrize(
    ("op", "field", "query", "body"),
    [("nack", "delay_s", "60", 0), ("extend", "visibility_s", "0", 60)],
)
async def test_a_number_in_both_the_json_body_and_the_query_is_taken_from_the_body(
    http: Http, op: str, field: str, query: str, body: float
) -> None:
    receipt = await _queue_with_lease(http)
    resp = await http.post(
        f"/v1/queues/jobs/{op}", json={"receipts": [receipt], field: body}, params={field: query}
    )
    assert resp.status == 200, await resp.text()
    # nack: visible at once (the body's 0, not the query's 60); extend: leased for 60 s
    # more (not 0): either way the message is not delayed, and only the nack frees it.
    stats = await (await http.get("/v1/queues/jobs")).json()
    assert stats["delayed"] == 0
    assert stats["in_flight"] == (1 if op == "extend" else 0)


@pytest.mark.parametrize(
    ("path", "payload", "field"),
    [
        ("batch", {"messages": [{"body": "b", "priorty": 1}]}, "priorty"),
        ("batch", {"messages": [{"body": "b"}], "dedup": True}, "dedup"),
        ("ack", {"receipts": ["x"], "visibility_s": 1}, "visibility_s"),
        ("nack", {"receipts": ["x"], "delay": 1}, "delay"),
    ],
)
async def test_a_json_field_the_call_does_not_take_is_400_naming_it(
    http: Http, path: str, payload: dict[str, Any], field: str
) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    resp = await http.post(f"/v1/queues/jobs/{path}", json=payload)
    assert repr(field) in await expect_error(resp, 400, "bad_request")
    stats = await (await http.get("/v1/queues/jobs")).json()
    assert stats["messages"] == 0


async def test_a_null_id_dedup_id_or_content_type_in_a_batch_item_is_as_if_left_out(
    http: Http,
) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    item = {"body": "b", "id": None, "dedup_id": None, "content_type": None}
    resp = await http.post("/v1/queues/jobs/batch", json={"messages": [item, item]})
    assert resp.status == 201, await resp.text()
    reply = await resp.json()
    assert reply["duplicates"] == 0 and len(set(reply["ids"])) == 2  # two fresh ids
    resp = await http.post("/v1/queues/jobs/pop", params={"max": "2"})
    messages = (await resp.json())["messages"]
    assert [m["body"] for m in messages] == ["b", "b"]
    assert all("content_type" not in m for m in messages)
