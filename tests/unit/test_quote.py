"""Inputs in error messages: a short escaped prefix, never the whole input (issue 21)."""

from __future__ import annotations

import grpc
import pytest

from rocketq._api.rocketq.v1 import common_pb2
from rocketq.validation import QUOTE_MAX_CHARS, check_group, clip, quote
from services.common.errors import MESSAGE_MAX_BYTES, METADATA_VALUE_MAX_BYTES, ServiceError

pytestmark = pytest.mark.unit


def test_quote_keeps_short_inputs_whole_and_escaped() -> None:
    assert quote("Orders") == "'Orders'"
    assert quote("a\nb\x00") == "'a\\nb\\x00'"


def test_quote_cuts_long_inputs_and_says_how_long_they_were() -> None:
    text = quote("é" * 20_000)
    assert text.startswith(repr("é" * QUOTE_MAX_CHARS))
    assert text.endswith("(20000 characters)")
    assert len(text) < 2 * QUOTE_MAX_CHARS


def test_clip_bounds_composed_text() -> None:
    assert clip("short", 10) == "short"
    assert clip("x" * 50, 10) == "x" * 10 + "… (cut at 10 of 50 characters)"


def test_service_errors_are_bounded_whatever_the_caller_composed() -> None:
    huge = "é" * 20_000
    err = ServiceError(
        grpc.StatusCode.INVALID_ARGUMENT, common_pb2.ILLEGAL_ARGUMENT, f"bad {huge}", topic=huge
    )
    assert len(err.message.encode()) < MESSAGE_MAX_BYTES + 40
    assert len(err.metadata["topic"].encode()) < METADATA_VALUE_MAX_BYTES + 40
    err.to_status()  # packs


@pytest.mark.parametrize("group", ["%RETRY%G", "%DLQ%G"])
def test_group_names_may_not_take_a_retry_or_dead_letter_prefix(group: str) -> None:
    with pytest.raises(ValueError, match="retry and dead-letter"):
        check_group(group)
