"""The repair sweep's endpoint on the metadata owner: it re-registers the caller, names
the queues that are gone, and returns settings only for incarnations the caller lacks."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import json_bytes, node_signed
from tests.node.conftest import NodeHttp, expect_error
from zdmq.config import ClusterConfig

FIRST = "00000000-0000-4000-8000-000000000000"
JSON = {"Content-Type": "application/json"}


async def _post_sweep(http: NodeHttp, config: ClusterConfig, body: Any) -> Any:
    data = json_bytes(body)
    headers = {**JSON, **node_signed(config, "n1", "POST", "/v1/internal/sweep", data)}
    return await http.post("/v1/internal/sweep", data=data, headers=headers)


async def _sweep(http: NodeHttp, config: ClusterConfig, body: dict[str, Any]) -> dict[str, Any]:
    r = await _post_sweep(http, config, body)
    assert r.status == 200, await r.text()
    reply: dict[str, Any] = await r.json()
    return reply


async def test_the_sweep_leaves_out_the_settings_of_an_incarnation_the_caller_knows(
    http: NodeHttp, node_config: ClusterConfig
) -> None:
    assert (await http.put("/v1/queues/jobs", json={"visibility_timeout_s": 7})).status == 201
    first = await _sweep(
        http, node_config, {"node": "n1", "queues": {"jobs": FIRST, "gone": FIRST}}
    )
    # Never created, so no delete is recorded: unknown, not deleted.
    assert first["missing"] == ["gone"]
    assert first["deleted"] == []
    assert first["settings"]["jobs"]["visibility_timeout_s"] == 7
    incarnation = first["incarnations"]["jobs"]
    assert isinstance(incarnation, str) and incarnation
    # The caller is listed now.
    listed = (await (await http.get("/v1/queues/jobs/metadata")).json())["nodes"]
    assert [entry["node"] for entry in listed] == ["n1"]

    again = await _sweep(
        http,
        node_config,
        {"node": "n1", "queues": {"jobs": FIRST}, "incarnations": {"jobs": incarnation}},
    )
    assert again == {"missing": [], "deleted": [], "settings": {}, "incarnations": {}}

    # A queue deleted and created again is a new incarnation: its settings come back.
    assert (await http.delete("/v1/queues/jobs")).status == 204
    assert (await http.put("/v1/queues/jobs", json={"visibility_timeout_s": 9})).status == 201
    renewed = await _sweep(
        http,
        node_config,
        {"node": "n1", "queues": {"jobs": FIRST}, "incarnations": {"jobs": incarnation}},
    )
    assert renewed["settings"]["jobs"]["visibility_timeout_s"] == 9
    assert renewed["incarnations"]["jobs"] != incarnation


async def test_the_sweep_names_a_deleted_queue_deleted_and_a_never_created_one_only_missing(
    http: NodeHttp, node_config: ClusterConfig
) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    assert (await http.delete("/v1/queues/jobs")).status == 204
    reply = await _sweep(
        http, node_config, {"node": "n1", "queues": {"jobs": FIRST, "never": FIRST}}
    )
    assert sorted(reply["missing"]) == ["jobs", "never"]
    assert reply["deleted"] == ["jobs"]
    # Created again, the name is no longer deleted: the sweep registers the caller.
    assert (await http.put("/v1/queues/jobs")).status == 201
    reply = await _sweep(http, node_config, {"node": "n1", "queues": {"jobs": FIRST}})
    assert reply["missing"] == [] and reply["deleted"] == []
    listed = (await (await http.get("/v1/queues/jobs/metadata")).json())["nodes"]
    assert [entry["node"] for entry in listed] == ["n1"]


@pytest.mark.parametrize(
    "body",
    [
        {"node": "n1", "queues": {"jobs": FIRST}, "incarnations": ["jobs"]},
        {"node": "n1", "queues": {"jobs": 5}},
        {"node": "n1", "queues": ["jobs"]},
        # Not a node of the cluster, not the calling node, not a message id:
        {"node": "n9", "queues": {"jobs": FIRST}},
        {"node": "n1", "queues": {"jobs": "not-a-uuid"}},
        {"node": "n1", "queues": {"jobs": FIRST[:-1]}},
    ],
)
async def test_a_malformed_sweep_is_refused_and_registers_nothing(
    http: NodeHttp, node_config: ClusterConfig, body: dict[str, Any]
) -> None:
    assert (await http.put("/v1/queues/jobs")).status == 201
    r = await _post_sweep(http, node_config, body)
    await expect_error(r, 400, "bad_request")
    assert (await (await http.get("/v1/queues/jobs/metadata")).json())["nodes"] == []
