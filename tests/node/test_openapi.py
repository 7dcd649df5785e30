"""The OpenAPI file (zdmq/server/openapi.yaml) against the node that serves it.

The document must name every public route of the app and no other, and describe the
binary batch media type exactly where a node takes or gives frames; each such place is
then exercised on a real node (one process, real HTTP) and its reply's status and
Content-Type must be ones the document lists for that call.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import pytest
import yaml

from tests.node.conftest import NodeHttp
from zdmq import errors
from zdmq.cluster_map import ADDRESS, MapError, check_address
from zdmq.config import ClusterConfig
from zdmq.models import BATCH_CONTENT_TYPE, decode_batch, encode_batch
from zdmq.server.app import make_app

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
FRAME = {"Content-Type": BATCH_CONTENT_TYPE, "Accept": BATCH_CONTENT_TYPE}
# Where a node takes a frame (request bodies) and gives one (replies), per docs/api.md's
# "Binary batch frames" table.
FRAME_REQUESTS = {"pushBatch", "ack", "nack", "extend", "publishBatch"}
FRAME_REPLIES = {("pop", "200"), ("receive", "200")}


def _spec() -> dict[str, Any]:
    text = resources.files("zdmq.server").joinpath("openapi.yaml").read_text("utf-8")
    spec = yaml.safe_load(text)
    assert isinstance(spec, dict)
    return spec


def _operations(spec: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """operationId -> (METHOD, path, operation)."""
    ops = {}
    for path, item in spec["paths"].items():
        for method in METHODS:
            if method in item:
                op = item[method]
                assert op["operationId"] not in ops, op["operationId"]
                ops[op["operationId"]] = (method.upper(), path, op)
    return ops


def _app_routes(config: ClusterConfig) -> set[tuple[str, str]]:
    """(METHOD, pattern) of every route the app serves, `{queue}` as in its table."""
    app = make_app(config, "n1")
    routes = {(m, path) for path, methods in app._exact.items() for m in methods}
    for _, methods, pattern in app._routes:
        routes |= {(m, pattern) for m in methods}
    return routes


def test_the_document_names_every_public_route_of_the_app_and_no_other(
    node_config: ClusterConfig,
) -> None:
    documented = {(m, path) for m, path, _ in _operations(_spec()).values()}
    public = {(m, p) for m, p in _app_routes(node_config) if not p.startswith("/v1/internal/")}
    assert len(public) > 10  # the table was read
    assert documented == public


def _frame_places(spec: dict[str, Any]) -> tuple[set[str], set[tuple[str, str]]]:
    """The operations whose request body, and the (operation, status) whose reply, list the
    batch media type."""
    requests, replies = set(), set()
    for op_id, (_, _, op) in _operations(spec).items():
        if BATCH_CONTENT_TYPE in op.get("requestBody", {}).get("content", {}):
            requests.add(op_id)
        for status, reply in op.get("responses", {}).items():
            if BATCH_CONTENT_TYPE in reply.get("content", {}):
                replies.add((op_id, status))
    return requests, replies


def test_the_error_shape_lists_every_code_a_node_answers() -> None:
    error = _spec()["components"]["schemas"]["Error"]["properties"]["error"]
    documented = set(error["properties"]["code"]["enum"])
    # `config_error` stops a node or a command at start; it is never a reply.
    assert documented == set(errors.error_classes()) - {"config_error", "error"}


def test_the_batch_media_type_is_described_exactly_where_nodes_take_or_give_frames() -> None:
    requests, replies = _frame_places(_spec())
    assert requests == FRAME_REQUESTS
    assert replies == FRAME_REPLIES


def test_every_batch_media_type_is_binary_and_points_to_the_frame_layout() -> None:
    ops = _operations(_spec())
    media = [ops[op_id][2]["requestBody"]["content"] for op_id in FRAME_REQUESTS]
    media += [ops[op_id][2]["responses"][status]["content"] for op_id, status in FRAME_REPLIES]
    for content in media:
        schema = content[BATCH_CONTENT_TYPE]["schema"]
        assert schema["type"] == "string"
        assert schema["format"] == "binary"
        assert "docs/api.md" in schema["description"]
        assert "Binary batch frames" in schema["description"]


def test_the_query_parameters_a_frame_settle_needs_are_described() -> None:
    ops = _operations(_spec())
    params = _spec()["components"]["parameters"]

    def names(op_id: str) -> set[str]:
        out = set()
        for p in ops[op_id][2].get("parameters", []):
            if "$ref" in p:
                p = params[p["$ref"].rsplit("/", 1)[1]]
            if p["in"] == "query":
                out.add(p["name"])
        return out

    assert "delay_s" in names("nack")
    assert "visibility_s" in names("extend")


async def _call(http: NodeHttp, op_id: str, spec: dict[str, Any]) -> tuple[str, int, str, bytes]:
    """Calls one operation with a frame where the document says the node takes one, asking
    for a frame in reply; returns (operationId, status, Content-Type, body)."""
    method, path, _ = _operations(spec)[op_id]
    target = path.replace("{queue}", "docs").replace("{topic}", "docs")
    params: dict[str, str] = {}
    data: bytes | None = None
    if op_id == "pushBatch":
        # One message for each later call: receive, extend, nack (then ack) and pop.
        bodies = [b"one", b"\xff", b"three", b"four"]
        data = encode_batch(bodies=bodies, content_types=["a/b", None, None, None])
    elif op_id in ("ack", "nack", "extend"):
        leased = await http.post(
            "/v1/queues/docs/receive", params={"max": "1", "visibility_s": "30"}, headers=FRAME
        )
        batch = decode_batch(await leased.read())
        assert batch.receipts, f"nothing to {op_id}"
        data = encode_batch(receipts=batch.receipts)
        params = {"nack": {"delay_s": "0"}, "extend": {"visibility_s": "30"}}.get(op_id, {})
    elif op_id in ("pop", "receive"):
        params = {"max": "1"}
    elif op_id == "publishBatch":  # to a topic with no subscriptions: nothing stored
        data = encode_batch(bodies=[b"x"], dedup_ids=["d"])
    resp = await http.request(method, target, data=data, params=params, headers=FRAME)
    return op_id, resp.status, resp.content_type, await resp.read()


async def test_a_real_node_answers_each_frame_call_as_the_document_says(http: NodeHttp) -> None:
    spec = _spec()
    ops = _operations(spec)
    assert (await http.put("/v1/queues/docs")).status == 201
    assert (await http.put("/v1/topics/docs")).status == 201
    order = ["pushBatch", "receive", "extend", "nack", "ack", "pop", "publishBatch"]
    frame_ops = FRAME_REQUESTS | {op_id for op_id, _ in FRAME_REPLIES}
    assert set(order) == frame_ops
    seen = []
    for op_id in order:
        _, status, ctype, body = await _call(http, op_id, spec)
        responses = ops[op_id][2]["responses"]
        assert str(status) in responses, (op_id, status, body)
        assert 200 <= status < 300, (op_id, status, body)
        assert ctype in responses[str(status)]["content"], (op_id, ctype)
        if (op_id, str(status)) in FRAME_REPLIES:
            assert ctype == BATCH_CONTENT_TYPE
            assert decode_batch(body).count == 1
        seen.append((op_id, ctype))
    assert dict(seen)["pop"] == BATCH_CONTENT_TYPE


@pytest.mark.parametrize("op_id", sorted(FRAME_REQUESTS))
async def test_a_frame_request_with_a_bad_magic_is_a_documented_400(
    http: NodeHttp, op_id: str
) -> None:
    method, path, op = _operations(_spec())[op_id]
    assert (await http.put("/v1/queues/docs")).status == 201
    resp = await http.request(
        method,
        path.replace("{queue}", "docs").replace("{topic}", "docs"),
        data=b"NOPE" + bytes(8),
        headers=FRAME,
    )
    assert resp.status == 400
    assert "400" in op["responses"]
    assert (await resp.json())["error"]["code"] == "bad_request"


async def test_the_node_serves_the_packaged_document(http: NodeHttp) -> None:
    resp = await http.get("/v1/openapi.yaml")
    assert resp.status == 200
    assert yaml.safe_load(await resp.read()) == _spec()


def test_a_node_address_is_checked_with_the_pattern_the_document_gives() -> None:
    """A request body the schema takes is one the node takes (and the reverse)."""
    node_entry = _spec()["components"]["schemas"]["NodeEntry"]["properties"]["address"]
    assert node_entry["pattern"] == ADDRESS.pattern
    taken = ["127.0.0.1:7701", "[::1]:7701", "node-5.zdmq.internal:65535", "zdmq_n5:80"]
    refused = [":7701", "[0:7701", "n5:0", "n5:07", "n5:65536", "n5:80\n", "-n5:80", "nó:80"]
    for address in taken:
        check_address("address", address)
    for address in refused:
        with pytest.raises(MapError):
            check_address("address", address)
