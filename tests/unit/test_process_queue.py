"""ProcessQueue (SPEC §6.5, §6.11, §6.13): the commit offset is the smallest offset in flight,
counts and sizes track the cache, and expiries follow explicit timestamps."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rocketq.client.consumer.process_queue import CONSUME_TIMEOUT_MS, ConsumeLock, ProcessQueue
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
