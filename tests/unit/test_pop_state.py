"""The pop state as the revive log builds it, and receipt handles (services/broker/pop/state)."""

from __future__ import annotations

import pytest

from rocketq._api.rocketq.v1 import common_pb2
from services.broker.pop.state import PopState, encode, handle_of, new_checkpoint_id, parse_handle
from services.common.errors import ServiceError

pytestmark = pytest.mark.unit


def ck(ck_id: str, offsets: list[int], nxt: int, until_ms: int = 1_000) -> bytes:
    return encode(
        {"t": "ck", "id": ck_id, "g": "g", "at": "T", "rt": "T", "q": 0, "o": offsets,
         "n": nxt, "u": until_ms}
    )  # fmt: skip


def test_acks_retire_a_checkpoint_and_the_pop_offset_only_grows() -> None:
    state = PopState()
    a, b = new_checkpoint_id(), new_checkpoint_id()
    state.apply(ck(a, [0, 1], 2), log_offset=0)
    state.apply(ck(b, [1], 2), log_offset=1)  # a changed invisible time: offset 1 again
    state.apply(encode({"t": "ack", "id": a, "o": 1}), log_offset=2)
    assert state.pop_offset("g", "T", 0) == 2
    assert state.in_flight(a, 1) is None and state.in_flight(a, 0) is not None
    assert state.replay_start() == 0
    state.apply(encode({"t": "ack", "id": a, "o": 0}), log_offset=3)
    assert a not in state.cks and state.replay_start() == 1
    assert [c.ck_id for c in state.due(1_000)] == [b]
    state.apply(b"{not json", log_offset=4)  # skipped, never fatal
    assert set(state.cks) == {b}


def test_handles_name_their_broker_and_refuse_anything_else() -> None:
    ck_id = new_checkpoint_id()
    assert parse_handle(handle_of("broker-a", ck_id, 7), "broker-a") == (ck_id, 7)
    for bad, text in [
        ("", "empty"),
        ("x" * 600, "not a receipt handle"),
        (handle_of("broker-b", ck_id, 7), "issued by broker 'broker-b'"),
        (handle_of("broker-a", "short", 7), "malformed"),
        (handle_of("broker-a", ck_id, -1), "malformed"),
    ]:
        with pytest.raises(ServiceError) as err:
            parse_handle(bad, "broker-a")
        assert err.value.reason == common_pb2.INVALID_RECEIPT_HANDLE
        assert text in err.value.message


def fifo_ck(
    ck_id: str, offsets: list[int], frontier: int, done: list[int], attempt: object = 1
) -> bytes:
    return encode(
        {"t": "ck", "id": ck_id, "g": "g", "at": "T", "rt": "T", "q": 0, "o": offsets,
         "n": frontier, "u": 1_000, "f": True, "a": attempt, "d": done}
    )  # fmt: skip


def test_fifo_queue_frontier_out_of_order_acks_and_a_replay_from_the_newest_checkpoint() -> None:
    state = PopState()
    a, b = new_checkpoint_id(), new_checkpoint_id()
    state.apply(fifo_ck(a, [0, 1], 0, []), log_offset=0)
    state.apply(encode({"t": "ack", "id": a, "o": 1}), log_offset=1)  # out of order
    assert state.pop_offset("g", "T", 0) == 0 and state.fifo_queue("g", "T", 0).done == {1}
    # Offset 0 handed out again (attempt 2): the new checkpoint takes it over.
    state.apply(fifo_ck(b, [0], 0, [1], attempt=2), log_offset=2)
    assert state.in_flight(a, 0) is None and a not in state.cks
    assert state.in_flight(b, 0) is not None and state.cks[b].attempt_of(0) == 2
    assert state.replay_start() == 2
    # A broker replaying from the newest checkpoint knows offset 1 is acked.
    replayed = PopState()
    replayed.apply(fifo_ck(b, [0], 0, [1], attempt=2), log_offset=2)
    assert replayed.fifo_queue("g", "T", 0).done == {1}
    for s in (state, replayed):
        s.apply(encode({"t": "ack", "id": b, "o": 0}), log_offset=3)
        assert s.pop_offset("g", "T", 0) == 2 and not s.fifo and not s.cks
