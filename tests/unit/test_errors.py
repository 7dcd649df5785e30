"""Typed errors: every class survives the wire, unknown codes fall back on the status."""

from __future__ import annotations

from typing import Any

import pytest

from zdmq import errors
from zdmq.errors import (
    BadRequest,
    InternalError,
    MessageTooLarge,
    MethodNotAllowed,
    Misrouted,
    NodeUnavailable,
    NotLeader,
    PublishIncomplete,
    QueueExists,
    RouteNotFound,
    StorageFailed,
    ZdmqError,
    error_classes,
    from_wire,
)

CLASSES = error_classes()


def test_error_classes_lists_every_public_error_class_by_its_code() -> None:
    public = {
        getattr(errors, name)
        for name in errors.__all__
        if isinstance(getattr(errors, name), type) and getattr(errors, name) is not ZdmqError
    }
    assert set(CLASSES.values()) == public
    for code, cls in CLASSES.items():
        assert cls.code == code
        assert issubclass(cls, ZdmqError)


@pytest.mark.parametrize("cls", CLASSES.values(), ids=CLASSES.keys())
def test_every_error_class_round_trips_through_the_wire(cls: type[ZdmqError]) -> None:
    sent = cls("queue 'jobs' went wrong: \u2603")
    payload = sent.to_wire()
    extra: dict[str, Any] = {"group": "", "leader": None} if cls is NotLeader else {}
    if cls is PublishIncomplete:
        extra = {"failed": []}
    assert payload == {
        "error": {"code": cls.code, "message": "queue 'jobs' went wrong: \u2603", **extra}
    }
    got = from_wire(cls.status, payload)
    assert type(got) is cls
    assert got.message == sent.message
    assert str(got) == sent.message


@pytest.mark.parametrize("cls", CLASSES.values(), ids=CLASSES.keys())
def test_an_error_without_a_message_carries_its_code(cls: type[ZdmqError]) -> None:
    e = cls()
    assert e.message == cls.code
    assert type(from_wire(cls.status, e.to_wire())) is cls


def test_not_leader_carries_its_group_and_leader_through_the_wire() -> None:
    got = from_wire(421, NotLeader("moved", group="n2", leader="n3").to_wire())
    assert isinstance(got, NotLeader) and got.retriable
    assert (got.group, got.leader, got.message) == ("n2", "n3", "moved")
    # A reply with odd fields still gives a NotLeader, with what could be read.
    odd = from_wire(421, {"error": {"code": "not_leader", "message": "m", "leader": 7}})
    assert isinstance(odd, NotLeader) and (odd.group, odd.leader) == ("", None)


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequest),
        (404, RouteNotFound),
        (405, MethodNotAllowed),
        (409, QueueExists),
        (413, MessageTooLarge),
        (421, Misrouted),
        (503, NodeUnavailable),
        (500, InternalError),
        (502, InternalError),
        (418, InternalError),
    ],
)
def test_an_unknown_code_falls_back_on_the_status(status: int, cls: type[ZdmqError]) -> None:
    got = from_wire(status, {"error": {"code": "no_such_code", "message": "it broke"}})
    assert type(got) is cls
    assert got.message == "it broke"


@pytest.mark.parametrize("payload", [None, "oops", [], {}, {"error": "x"}, {"error": {}}])
def test_a_reply_without_an_error_object_falls_back_on_the_status(payload: object) -> None:
    got = from_wire(503, payload)
    assert type(got) is NodeUnavailable
    assert got.message == "HTTP 503"


def test_a_non_string_code_falls_back_on_the_status() -> None:
    assert type(from_wire(404, {"error": {"code": 404, "message": "m"}})) is RouteNotFound


def test_only_unavailable_nodes_failed_storage_and_not_leader_are_retriable() -> None:
    assert NodeUnavailable.retriable is True
    assert StorageFailed.retriable is True
    retriable = {cls for cls in CLASSES.values() if cls.retriable}
    assert retriable == {NodeUnavailable, StorageFailed, NotLeader}


def test_every_wire_error_has_an_error_status_and_a_unique_code() -> None:
    for cls in CLASSES.values():
        assert 400 <= cls.status <= 599, cls
    assert len({cls.code for cls in CLASSES.values()}) == len(CLASSES)


def test_subclasses_keep_their_parents_status() -> None:
    for name in ("InvalidQueueName", "InvalidMessage", "BatchTooLarge"):
        cls = getattr(errors, name)
        assert issubclass(cls, BadRequest)
        assert cls.status == 400


def test_a_refusal_that_did_nothing_says_so_on_the_wire_and_comes_back_unsent() -> None:
    refused = NodeUnavailable("the node is stopping")
    refused.unsent = True
    wire = refused.to_wire()
    assert wire["error"]["unsent"] is True
    got = from_wire(503, wire)
    assert isinstance(got, NodeUnavailable) and got.unsent
    # An unknown outcome says nothing of it, and reads back as possibly run.
    unknown = NodeUnavailable("timed out")
    assert "unsent" not in unknown.to_wire()["error"]
    assert not from_wire(503, unknown.to_wire()).unsent  # type: ignore[attr-defined]
    assert not from_wire(503, None).unsent  # type: ignore[attr-defined]
