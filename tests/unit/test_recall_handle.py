"""Recall handles (services/broker/gateway/recall.py): Apache RocketMQ's v1 form, strictly."""

from __future__ import annotations

import base64

import pytest

from services.broker.gateway.recall import RecallHandle, parse, recall_handle_of

pytestmark = pytest.mark.unit


def test_a_handle_is_apaches_v1_form_and_parses_back() -> None:
    handle = RecallHandle("ns%Orders", "broker-a", 1_700_000_000_000, "0102FC00AB")
    text = handle.encode()
    assert base64.urlsafe_b64decode(text) == b"v1 ns%Orders broker-a 1700000000000 0102FC00AB"
    assert parse(text) == handle


def test_only_messages_delayed_into_the_future_get_a_handle() -> None:
    props = {"TIMER_DELIVER_MS": "2000"}
    assert parse(recall_handle_of("b", "T", props, "ID", now_ms=1000)) == RecallHandle(
        "T", "b", 2000, "ID"
    )
    assert recall_handle_of("b", "T", props, "ID", now_ms=2000) == ""  # stored as due
    assert recall_handle_of("b", "T", {}, "ID", now_ms=0) == ""
    assert recall_handle_of("b", "T", props, "", now_ms=0) == ""


@pytest.mark.parametrize(
    "text",
    [
        "",
        "%%%",
        "x" * 2000,
        base64.urlsafe_b64encode(b"v2 T b 1 ID").decode(),
        base64.urlsafe_b64encode(b"v1 T b soon ID").decode(),
        base64.urlsafe_b64encode(b"v1 T b 1").decode(),
        base64.urlsafe_b64encode(b"v1 T  1 ID").decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_anything_else_is_not_a_handle(text: str) -> None:
    assert parse(text) is None
