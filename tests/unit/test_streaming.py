"""The stream protocol's frames (zdmq/streaming.py): what each end builds, the other reads,
and what is not the protocol is refused with a reason."""

from __future__ import annotations

import msgpack
import pytest

from zdmq.streaming import (
    ACK,
    CREDIT,
    DRAIN,
    MAX_CREDIT,
    MAX_SETTLE,
    NACK,
    RETURNED,
    SETTLED,
    close_code,
    credit_frame,
    drain_frame,
    parse_credit,
    parse_drain,
    parse_settle,
    returned_frame,
    settle_frame,
    settled_frame,
    unpack,
)


def test_frames_round_trip() -> None:
    f = credit_frame(25)
    assert f[0] == CREDIT and parse_credit(f[1:]) == 25
    f = settle_frame("nack", 7, ["r1", "r2"], 1.5)
    assert f[0] == NACK and parse_settle(f[1:]) == (7, ["r1", "r2"], 1.5)
    assert settle_frame("ack", 1, ["r"])[0] == ACK
    f = settled_frame(7, 1, {"r2": "lease_expired"})
    assert f[0] == SETTLED and unpack(f[1:]) == [7, 1, {"r2": "lease_expired"}]
    assert close_code(404) == 4404
    f = drain_frame(9)
    assert f[0] == DRAIN and parse_drain(f[1:]) == 9
    f = returned_frame(9, 23)
    assert f[0] == RETURNED and unpack(f[1:]) == [9, 23]


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb(-1), msgpack.packb(False), b""])
def test_bad_drains_are_refused(payload: bytes) -> None:
    with pytest.raises(ValueError):
        parse_drain(payload)


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgpack.packb(-1), msgpack.packb(MAX_CREDIT + 1), msgpack.packb(True), b""],
)
def test_bad_credit_is_refused(payload: bytes) -> None:
    with pytest.raises(ValueError):
        parse_credit(payload)


@pytest.mark.parametrize(
    "value",
    [
        [1, ["r"]],
        [-1, ["r"], 0],
        [True, ["r"], 0],
        [1, "r", 0],
        [1, [3], 0],
        [1, ["r"], "0"],
        [1, ["r"] * (MAX_SETTLE + 1), 0],
        {"seq": 1},
    ],
)
def test_bad_settles_are_refused(value: object) -> None:
    with pytest.raises(ValueError):
        parse_settle(msgpack.packb(value))
