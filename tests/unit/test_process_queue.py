"""ProcessQueue (SPEC §6.5, §6.11, §6.13): the commit offset is the smallest offset in flight,
counts and sizes track the cache, and expiries follow explicit timestamps."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketq.client.consumer.process_queue import (
    CONSUME_TIMEOUT_MS,
    EXPIRED_SCAN_MAX,
    ConsumeLock,
    ProcessQueue,
)
from rocketq.codec import Prop
from rocketq.message import ReceivedMessage

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def msg(offset: int, body: bytes = b"x", props: dict[str, str] | None = None) -> ReceivedMessage:
    return ReceivedMessage(
        topic="T",
        body=body,
        properties=dict(props or {}),
        queue_id=0,
        queue_offset=offset,
        commitlog_offset=offset * 100,
        msg_id=f"id{offset}",
        offset_msg_id=f"oid{offset}",
        born_timestamp_ms=0,
        store_timestamp_ms=0,
        born_host="127.0.0.1:1",
        store_host="127.0.0.1:2",
        broker_name="b",
    )


def test_out_of_order_completion_keeps_the_offset_at_the_oldest() -> None:
    # SPEC §15: a, b, c, d consumed concurrently; d finishes first -> the offset stays at a.
    pq = ProcessQueue()
    a, b, c, d = (msg(o) for o in (100, 101, 102, 103))
    pq.put_messages([a, b, c, d])
    assert pq.remove_messages([d]) == 100
    assert pq.remove_messages([b]) == 100
    assert pq.remove_messages([a]) == 102
    assert pq.remove_messages([c]) == 104  # empty -> queue_offset_max + 1
    assert pq.msg_count == 0


def test_remove_from_an_empty_queue_commits_nothing() -> None:
    pq = ProcessQueue()
    assert pq.remove_messages([msg(5)]) == -1
    pq.put_messages([msg(5)])
    pq.remove_messages([msg(5)])
    # empty again, but it has seen offset 5: a repeated removal answers -1, not 6
    assert pq.remove_messages([msg(5)]) == -1


def test_removing_unknown_messages_answers_the_head() -> None:
    pq = ProcessQueue()
    pq.put_messages([msg(7), msg(8)])
    assert pq.remove_messages([msg(3)]) == 7
    assert pq.msg_count == 2


def test_counts_sizes_and_span() -> None:
    pq = ProcessQueue()
    assert (pq.msg_count, pq.msg_size_bytes, pq.max_span()) == (0, 0, 0)
    assert (pq.first_offset(), pq.last_offset()) == (-1, -1)
    pq.put_messages([msg(10, b"abc"), msg(11, b"defg"), msg(40, b"")])
    assert pq.msg_count == 3
    assert pq.msg_size_bytes == 7
    assert pq.max_span() == 30
    assert (pq.first_offset(), pq.last_offset()) == (10, 40)
    assert pq.queue_offset_max == 40
    pq.remove_messages([msg(10, b"abc")])
    assert (pq.msg_count, pq.msg_size_bytes, pq.max_span()) == (2, 4, 29)


def test_a_message_pulled_twice_is_cached_once() -> None:
    pq = ProcessQueue()
    pq.put_messages([msg(1, b"aa"), msg(2, b"bb")])
    pq.put_messages([msg(2, b"bb"), msg(3, b"cc")])
    assert (pq.msg_count, pq.msg_size_bytes) == (3, 6)


def test_out_of_order_puts_stay_sorted() -> None:
    pq = ProcessQueue()
    pq.put_messages([msg(5), msg(9)])
    pq.put_messages([msg(7), msg(1)])
    assert (pq.first_offset(), pq.last_offset(), pq.queue_offset_max) == (1, 9, 9)
    assert pq.remove_messages([msg(1)]) == 5
    assert pq.remove_messages([msg(5)]) == 7


def test_lag_comes_from_the_max_offset_property() -> None:
    pq = ProcessQueue()
    pq.put_messages([msg(10), msg(11, props={Prop.MAX_OFFSET: "50"})])
    assert pq.msg_acc_count == 39


def test_pull_expiry_uses_the_given_time() -> None:
    clock = FakeClock(1_000_000)
    pq = ProcessQueue(clock)
    assert pq.last_pull_timestamp_ms == 1_000_000
    assert not pq.is_pull_expired(1_000_000 + 120_000)
    assert pq.is_pull_expired(1_000_000 + 120_001)
    pq.last_pull_timestamp_ms = 1_100_000
    assert not pq.is_pull_expired(1_000_000 + 120_001)
    assert pq.is_pull_expired(1_100_000 + 10_001, pull_max_idle_ms=10_000)


def test_remove_records_the_consume_time() -> None:
    clock = FakeClock(5_000)
    pq = ProcessQueue(clock)
    pq.put_messages([msg(1)])
    clock.now_ms = 9_000
    pq.remove_messages([msg(1)])
    assert pq.last_consume_timestamp_ms == 9_000


def test_dropped_and_orderly_fields_start_cleared() -> None:
    pq = ProcessQueue()
    assert pq.dropped is False
    assert pq.locked is False
    assert pq.try_unlock_times == 0
    pq.dropped = True
    assert pq.dropped


def test_expired_messages_are_the_stuck_head() -> None:
    pq = ProcessQueue()
    start = 1_000_000
    pq.put_messages([msg(o) for o in range(5)])
    pq.mark_consume_start([msg(0), msg(1), msg(3)], now_ms=start)
    assert pq.expired_messages(start + CONSUME_TIMEOUT_MS) == []
    later = start + CONSUME_TIMEOUT_MS + 1
    # offset 2 has not started, so the scan stops there even though 3 is old
    assert [m.queue_offset for m in pq.expired_messages(later)] == [0, 1]
    assert [m.queue_offset for m in pq.expired_messages(later, scan_max=1)] == [0]
    assert [m.queue_offset for m in pq.expired_messages(start + 11, consume_timeout_ms=10)] == [
        0,
        1,
    ]
    pq.remove_messages([msg(0), msg(1)])
    assert pq.expired_messages(later) == []


def test_a_message_not_started_is_never_expired() -> None:
    pq = ProcessQueue()
    pq.put_messages([msg(0)])
    assert pq.expired_messages(10**15) == []


def test_dispatch_flag_and_orderly_take_commit() -> None:
    pq = ProcessQueue()
    assert pq.put_messages([msg(0), msg(1), msg(2)]) is True
    assert pq.put_messages([msg(3)]) is False  # a consume task is already draining
    batch = pq.take_messages(2)
    assert [m.queue_offset for m in batch] == [0, 1]
    assert pq.msg_count == 4  # taken but not committed
    pq.make_messages_to_consume_again([batch[1]])
    assert pq.commit() == 1
    assert pq.msg_count == 3
    assert [m.queue_offset for m in pq.take_messages(10)] == [1, 2, 3]
    assert pq.commit() == 4
    assert pq.take_messages(10) == []  # drained: the dispatch ends
    assert pq.commit() == -1
    assert pq.put_messages([msg(4)]) is True
    with pytest.raises(ValueError):
        pq.take_messages(0)


def test_orderly_partial_retry_commits_past_the_messages_given_up() -> None:
    pq = ProcessQueue()
    pq.put_messages([msg(o, b"ab") for o in range(4)])
    batch = pq.take_messages(3)
    # offset 0 went to the dead-letter topic; 1 and 2 are consumed again, before 3
    pq.make_messages_to_consume_again(batch[1:])
    assert [m.queue_offset for m in pq.take_messages(2)] == [1, 2]
    assert pq.commit() == 3  # 0 (given up) and 1, 2 (now done) together
    assert (pq.msg_count, pq.msg_size_bytes) == (1, 2)
    assert pq.put_messages([msg(4)]) is False  # the drain still runs: 3 is waiting


def test_put_ignores_offsets_being_consumed() -> None:
    pq = ProcessQueue()
    pq.put_messages([msg(0), msg(1)])
    pq.take_messages(1)
    pq.put_messages([msg(0), msg(1), msg(2)])  # a re-pull overlapping the consuming set
    assert pq.msg_count == 3
    assert [m.queue_offset for m in pq.take_messages(10)] == [1, 2]
    assert pq.commit() == 3


def test_lock_expiry_follows_the_last_lock_time() -> None:
    clock = FakeClock()
    pq = ProcessQueue(clock)
    assert not pq.holds_lock(clock(), 30_000)  # never locked
    pq.locked = True
    pq.last_lock_timestamp_ms = clock()
    assert pq.holds_lock(clock.now_ms + 30_000, 30_000)
    assert pq.is_lock_expired(clock.now_ms + 30_001, 30_000)
    assert not pq.holds_lock(clock.now_ms + 30_001, 30_000)


def test_consume_lock_from_threads() -> None:
    lock = ConsumeLock()
    with lock:
        assert lock.locked()
        got: list[bool] = []
        t = threading.Thread(target=lambda: got.append(lock.acquire(timeout_s=0)))
        t.start()
        t.join()
        assert got == [False]
    assert not lock.locked() and lock.acquire(timeout_s=0)
    lock.release()


@pytest.mark.timeout(10)  # a lost wake-up fails fast instead of at the suite-wide timeout
async def test_consume_lock_async_timeout_and_handover() -> None:
    lock = ConsumeLock()
    assert await lock.acquire_async(0)
    assert not await lock.acquire_async(0)  # held: gives up at the deadline
    waiter = asyncio.create_task(lock.acquire_async(5))
    await asyncio.sleep(0)
    assert lock.waiters == 1
    lock.release()
    assert await waiter and lock.waiters == 0
    # a holder re-taking the lock politely lets a registered waiter go first
    other = asyncio.create_task(lock.acquire_async(5))
    await asyncio.sleep(0)
    retake = asyncio.create_task(lock.acquire_async(5, yield_to_waiters=True))
    lock.release()
    assert await asyncio.wait_for(other, 2)
    assert not retake.done()
    lock.release()
    assert await asyncio.wait_for(retake, 2)
    lock.release()


def test_clear_forgets_everything() -> None:
    pq = ProcessQueue()
    pq.put_messages([msg(0, b"abc"), msg(1)])
    pq.take_messages(1)
    pq.clear()
    assert (pq.msg_count, pq.msg_size_bytes, pq.max_span()) == (0, 0, 0)
    assert pq.put_messages([msg(2)]) is True


def test_concurrent_removals_from_threads_keep_counts_exact() -> None:
    pq = ProcessQueue()
    msgs = [msg(o, b"ab") for o in range(4000)]
    pq.put_messages(msgs)
    results: list[int] = []
    barrier = threading.Barrier(4)

    def consume(part: list[ReceivedMessage]) -> None:
        barrier.wait()
        for m in part:
            results.append(pq.remove_messages([m]))

    threads = [threading.Thread(target=consume, args=(msgs[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (pq.msg_count, pq.msg_size_bytes) == (0, 0)
    assert max(results) == 4000
    assert results.count(4000) == 1  # only the removal that emptied the queue sees max + 1


# ---- per-batch bookkeeping against a per-message model (issue 16) ---------------------------


class ModelQueue:
    """The ProcessQueue rules one message at a time: what the per-batch runs must match."""

    def __init__(self) -> None:
        self.waiting: dict[int, ReceivedMessage] = {}
        self.started: dict[int, int] = {}
        self.consuming: dict[int, ReceivedMessage] = {}
        self.offset_max = -1

    def put(self, msgs: list[ReceivedMessage]) -> None:
        for m in msgs:
            if m.queue_offset not in self.waiting and m.queue_offset not in self.consuming:
                self.waiting[m.queue_offset] = m
            self.offset_max = max(self.offset_max, m.queue_offset)

    def remove(self, msgs: list[ReceivedMessage]) -> int:
        if not self.waiting:
            return -1
        for m in msgs:
            if self.waiting.pop(m.queue_offset, None) is not None:
                self.started.pop(m.queue_offset, None)
        return min(self.waiting) if self.waiting else self.offset_max + 1

    def take(self, n: int) -> list[int]:
        taken = sorted(self.waiting)[:n]
        for o in taken:
            self.consuming[o] = self.waiting.pop(o)
            self.started.pop(o, None)
        return taken

    def cached(self) -> list[ReceivedMessage]:
        return [*self.waiting.values(), *self.consuming.values()]


ops = st.lists(
    st.tuples(
        st.sampled_from(["pull", "put_old", "remove_slice", "remove_some", "start", "take",
                         "again", "commit"]),
        st.integers(0, 40),
        st.integers(1, 12),
        st.integers(0, 2**16),
    ),
    max_size=40,
)  # fmt: skip


@given(ops)
@settings(max_examples=150, deadline=None)
def test_per_batch_runs_answer_like_per_message_bookkeeping(steps: list) -> None:
    clock = FakeClock()
    pq, model = ProcessQueue(clock), ModelQueue()
    next_offset = 0
    for op, a, n, seed in steps:
        clock.now_ms += 1
        cached = sorted(model.waiting)
        if op == "pull":  # a pull past everything, with gaps from filtered messages
            batch = [msg(next_offset + i, b"x" * (i % 3 + 1)) for i in range(n) if (seed >> i) & 3]
            next_offset += n
            pq.put_messages(batch)
            model.put(batch)
        elif op == "put_old":  # re-pulled or lower offsets, possibly repeating cached ones
            batch = [msg(max(0, next_offset - a) + i, b"yy") for i in range(n)]
            pq.put_messages(batch)
            model.put(batch)
        elif op in ("remove_slice", "remove_some"):
            picked = cached[a % len(cached) :][:n] if cached else [a]
            if op == "remove_some":
                picked = [o for i, o in enumerate(picked) if (seed >> i) & 1] + [a + 1000]
            batch = [model.waiting.get(o) or msg(o) for o in picked]
            assert pq.remove_messages(batch) == model.remove(batch)
        elif op == "start" and cached:
            batch = [model.waiting[o] for o in cached[a % len(cached) :][:n]]
            pq.mark_consume_start(batch)
            model.started.update((m.queue_offset, clock.now_ms) for m in batch)
        elif op == "take":
            assert [m.queue_offset for m in pq.take_messages(n)] == model.take(n)
        elif op == "again" and model.consuming:
            back = [m for o, m in sorted(model.consuming.items()) if (seed >> o % 16) & 1]
            pq.make_messages_to_consume_again(back)
            for m in back:
                model.waiting[m.queue_offset] = model.consuming.pop(m.queue_offset)
        elif op == "commit":
            expected = max(model.consuming) + 1 if model.consuming else -1
            model.consuming.clear()
            assert pq.commit() == expected
        cached = sorted(model.waiting)
        assert pq.msg_count == len(model.cached())
        assert pq.msg_size_bytes == sum(len(m.body) for m in model.cached())
        assert pq.first_offset() == (cached[0] if cached else -1)
        assert pq.last_offset() == (cached[-1] if cached else -1)
        assert pq.max_span() == (cached[-1] - cached[0] if cached else 0)
        stuck = []
        for o in cached[:EXPIRED_SCAN_MAX]:
            if o not in model.started or clock.now_ms - model.started[o] <= 3:
                break
            stuck.append(o)
        assert [m.queue_offset for m in pq.expired_messages(clock.now_ms, 3)] == stuck


def test_a_listener_batch_is_removed_as_one_slice_of_its_pull() -> None:
    pq = ProcessQueue()
    pulled = [msg(o, b"abc") for o in range(10, 42)]
    pq.put_messages(pulled)
    pq.put_messages([msg(o) for o in range(42, 50)])
    assert pq.remove_messages(pulled[8:16]) == 10  # a later chunk finished first
    assert pq.remove_messages(pulled[0:8]) == 26
    assert (pq.msg_count, pq.msg_size_bytes) == (32 - 16 + 8, 16 * 3 + 8)
    assert pq.remove_messages(pulled[16:]) == 42  # the first pull is gone; the second's head
    assert pq.remove_messages(pulled[16:]) == 42  # removing twice changes nothing
    assert pq.msg_count == 8


# ---- slices of a pulled run (issue 16: the concurrent consume service's fast path) -----------


def test_slices_released_out_of_order_keep_the_offset_at_the_oldest_like_remove_messages() -> None:
    clock = FakeClock()
    pq = ProcessQueue(clock)
    pulled = [msg(o, body=b"x" * (o - 99)) for o in range(100, 106)]  # bodies of 1..6 bytes
    pq.put_messages(pulled)
    run = pq.run_of(pulled)
    assert run is not None and pq.run_of(list(pulled)) is None  # this very list only
    assert pq.start_slice(run, 3, 2) == clock.now_ms
    assert pq.release_slice(run, 3, 2, clock.now_ms) == 100  # 103, 104 out of the middle
    assert (pq.msg_count, pq.msg_size_bytes) == (4, 1 + 2 + 3 + 6)
    assert pq.release_slice(run, 0, 1, clock.now_ms) == 101
    assert pq.release_slice(run, 1, 2, clock.now_ms) == 105  # skips the released 103, 104
    assert pq.release_slice(run, 3, 1, clock.now_ms) is None  # already released
    assert pq.release_slice(run, 5, 1, clock.now_ms) == 106  # empty: offset max + 1
    assert (pq.msg_count, pq.msg_size_bytes) == (0, 0) and not run.live


def test_a_started_slice_expires_and_a_slice_of_a_rebuilt_queue_falls_back() -> None:
    clock = FakeClock()
    pq = ProcessQueue(clock)
    pulled = [msg(o) for o in (10, 11, 12)]
    pq.put_messages(pulled)
    run = pq.run_of(pulled)
    assert run is not None
    pq.start_slice(run, 0, 1)
    clock.now_ms += CONSUME_TIMEOUT_MS + 1
    assert pq.expired_messages(clock.now_ms) == [pulled[0]]
    pq.put_messages([msg(5)])  # below what is cached: the runs are rebuilt as one
    assert not run.live and pq.run_of(pulled) is None
    assert pq.release_slice(run, 1, 1, clock.now_ms) is None  # caller uses remove_messages
    assert pq.expired_messages(clock.now_ms) == []  # 5 never started, so the scan stops
    assert pq.remove_messages([msg(5)]) == 10
    assert pq.expired_messages(clock.now_ms) == [pulled[0]]  # its start time survived
    pq.clear()
    assert pq.msg_count == 0
