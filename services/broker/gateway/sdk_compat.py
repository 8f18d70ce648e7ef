"""What the official SDKs read back that the gateway's first cut dropped, and a Node SDK quirk.

Kept apart from service.py (three one-line hooks there) so the fixes found by the Node.js SDK's
tests (tests/integration/test_gateway_node_sdk.py) stay small and separate:

* A FIFO message's ``message_group`` is stored as ``__SHARDINGKEY`` (Apache RocketMQ's name for
  it) and given back on delivery; a delayed message gives back its ``delivery_timestamp`` (the
  timer wheel's ``TIMER_OUT_MS``). The message type follows: FIFO, DELAY or NORMAL.
* ChangeInvisibleDuration below the pop minimum is raised to it. The Node SDK 1.0.8 reads the
  backoff policy's Duration seconds as milliseconds (a 1 s backoff asks for a 1 ms invisible
  time) and retries a refused change every few seconds forever, so a PushConsumer whose listener
  failed never shuts down; Apache's proxy accepts any invisible time >= 0 here. Negative
  durations are still refused (ILLEGAL_INVISIBLE_TIME).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import timestamp_pb2

from rocketq.codec import Prop
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.pop.processor import INVISIBLE_MIN_MS


def store_message_group(sp: Any, props: dict[str, str]) -> None:
    """Keep a sent message's group (``sp``: the v2 SystemProperties) in its stored properties."""
    if sp.message_group:
        props[Prop.SHARDING_KEY] = sp.message_group


def delivered_fields(props: dict[str, str]) -> dict[str, Any]:
    """SystemProperties fields of a delivered message, from its stored properties (``props``:
    the SHARDING_KEY is taken out so it does not show as a user property)."""
    group = props.pop(Prop.SHARDING_KEY, "")
    if group:
        return {"message_group": group, "message_type": v2.FIFO}
    try:
        out_ms = int(props.get(Prop.TIMER_OUT_MS, ""))
    except ValueError:
        return {"message_type": v2.NORMAL}
    at = timestamp_pb2.Timestamp(seconds=out_ms // 1000, nanos=(out_ms % 1000) * 1_000_000)
    return {"delivery_timestamp": at, "message_type": v2.DELAY}


def change_invisible_ms(ms: int) -> int:
    """The invisible time a ChangeInvisibleDuration of ``ms`` gets (see the module docstring)."""
    return INVISIBLE_MIN_MS if 0 <= ms < INVISIBLE_MIN_MS else ms
