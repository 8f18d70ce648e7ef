"""The orderly history checker (tests/integration/history.py) on synthetic histories: a clean
history passes, and overlap, reorder, gaps, loss and unexplained duplicates are each caught with
a message that names the queue, the consumers and the times."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.history import (
    END,
    START,
    Delivery,
    Event,
    History,
    append_fd,
    check_history,
    encode_lines,
    load_histories,
    parse_history,
)

pytestmark = pytest.mark.unit

MS = 1_000_000


class Worker:
    """Builds the history lines of one synthetic worker, like orderly_worker writes them."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.client = f"127.0.0.1@{pid}#1"
        self.calls = 0
        self.text = b""

    def call(
        self,
        start_ms: int,
        end_ms: int | None,
        queue: int,
        msgs: list[tuple[str, int, int]],  # (key, seq, offset)
    ) -> None:
        self.calls += 1
        ds = [Delivery("T", "broker-a", queue, off, key, seq) for key, seq, off in msgs]
        self.text += encode_lines(START, self.client, self.pid, self.calls, ds, start_ms * MS)
        if end_ms is not None:
            self.text += encode_lines(END, self.client, self.pid, self.calls, ds, end_ms * MS)


def history(*workers: Worker) -> History:
    h = History()
    for w in workers:
        parse_history(w.text.decode(), h)
    return h


def sent(keys: dict[str, int]) -> set[tuple[str, int]]:
    return {(k, s) for k, n in keys.items() for s in range(n)}


def test_clean_handover_passes_and_counts() -> None:
    a, b = Worker(100), Worker(200)
    a.call(0, 10, 0, [("k0", 0, 0)])
    a.call(10, 20, 0, [("k0", 1, 1), ("k0", 2, 2)])
    b.call(25, 30, 0, [("k0", 3, 3)])
    b.call(5, 15, 1, [("k1", 0, 0)])  # another queue at the same time: fine
    rep = check_history(history(a, b), sent({"k0": 4, "k1": 1}))
    rep.assert_ok()
    assert (rep.expected, rep.consumed, rep.duplicates, rep.calls, rep.events) == (5, 5, 0, 4, 10)
    assert rep.consumers[100].messages == 3 and rep.consumers[100].calls == 2
    assert rep.consumers[200].queues == {"T@broker-a#0", "T@broker-a#1"}
    assert rep.span_ns == 30 * MS
    assert "consumed 5/5" in rep.summary() and "pid 200" in rep.summary()


def test_overlap_of_two_consumers_names_queue_consumers_and_times() -> None:
    a, b = Worker(100), Worker(200)
    a.call(0, 10, 3, [("k", 0, 0)])
    b.call(8, 12, 3, [("k", 1, 1)])
    rep = check_history(history(a, b), sent({"k": 2}))
    assert not rep.ok and len(rep.overlaps) == 1
    msg = rep.overlaps[0]
    assert "queue T@broker-a#3" in msg
    assert "call 1 of 127.0.0.1@100#1 (pid 100) from +0.000 s to +0.010 s" in msg
    assert "(pid 200) from +0.008 s to +0.012 s" in msg
    with pytest.raises(AssertionError, match="overlapping calls on one queue"):
        rep.assert_ok()


def test_two_calls_of_one_consumer_on_one_queue_overlap() -> None:
    a = Worker(100)
    a.call(0, 10, 0, [("k", 0, 0)])
    a.call(5, 15, 0, [("k", 1, 1)])
    rep = check_history(history(a), sent({"k": 2}))
    assert len(rep.overlaps) == 1 and "call 2 of" in rep.overlaps[0]


def test_touching_intervals_do_not_overlap() -> None:
    a, b = Worker(100), Worker(200)
    a.call(0, 10, 0, [("k", 0, 0)])
    b.call(10, 20, 0, [("k", 1, 1)])
    check_history(history(a, b), sent({"k": 2})).assert_ok()


def test_killed_call_lasts_until_the_kill() -> None:
    a, b = Worker(100), Worker(200)
    a.call(0, 5, 0, [("k", 0, 0)])
    a.call(5, None, 0, [("k", 1, 1)])  # SIGKILLed mid-call
    b.call(30, 35, 0, [("k", 1, 1)])
    b.call(35, 40, 0, [("k", 2, 2)])
    # killed at 50 ms: b's calls at 30 ms ran while a's call was still (possibly) running
    rep = check_history(history(a, b), sent({"k": 3}), killed={100: 50 * MS})
    assert len(rep.overlaps) == 2
    assert "(killed)" in rep.overlaps[0] and "to +0.050 s" in rep.overlaps[0]
    # killed at 20 ms: b took over afterwards; the redelivery of seq 1 is an explained duplicate
    rep = check_history(history(a, b), sent({"k": 3}), killed={100: 20 * MS})
    rep.assert_ok()
    assert (rep.duplicates, rep.duplicates_unexplained, rep.consumers[100].open_calls) == (1, 0, 1)
    assert "killed at" in rep.summary()


def test_open_call_of_a_live_worker_fails() -> None:
    a = Worker(100)
    a.call(0, None, 0, [("k", 0, 0)])
    rep = check_history(history(a), sent({"k": 1}))
    assert any("never ended, though its worker was not killed" in p for p in rep.problems)
    assert rep.lost == [("k", 0)]  # started, never completed: not consumed


def test_reorder_is_caught() -> None:
    a = Worker(100)
    a.call(0, 1, 0, [("k", 0, 0)])
    a.call(1, 2, 0, [("k", 2, 2)])
    a.call(2, 3, 0, [("k", 1, 1)])
    rep = check_history(history(a), sent({"k": 3}))
    assert rep.lost == []
    texts = "\n".join(rep.order_violations)
    assert "key k: seq 2 (offset 2 of T@broker-a#0) first consumed at +0.001 s" in texts
    assert "before seq 1" in texts
    assert "seq 1 (offset 1 of T@broker-a#0)" in texts and "late" in texts
    assert "queue T@broker-a#0: offset 1 first consumed" in texts


def test_order_within_one_batch_follows_line_order() -> None:
    a = Worker(100)
    a.call(0, 1, 0, [("k", 1, 1), ("k", 0, 0)])  # one call, same ns, wrong order in the batch
    rep = check_history(history(a), sent({"k": 2}))
    assert len(rep.order_violations) >= 1


def test_gap_and_loss_are_caught() -> None:
    a = Worker(100)
    a.call(0, 1, 0, [("k", 0, 0)])
    a.call(1, 2, 0, [("k", 2, 2)])
    rep = check_history(history(a), sent({"k": 3, "j": 2}))
    assert rep.lost == [("j", 0), ("j", 1), ("k", 1)]
    assert rep.consumed == 2 and rep.expected == 5
    assert any("before seq 1" in v for v in rep.order_violations)
    with pytest.raises(AssertionError, match=r"lost \(3 of 5\): j/0, j/1, k/1"):
        rep.assert_ok()


def test_unsent_message_is_a_problem() -> None:
    a = Worker(100)
    a.call(0, 1, 0, [("x", 0, 0)])
    rep = check_history(history(a), set())
    assert any("never sent: x/0" in p for p in rep.problems)


def test_duplicates_without_a_kill() -> None:
    a, b = Worker(100), Worker(200)
    a.call(0, 1, 0, [("k", 0, 0)])
    a.call(1, 2, 0, [("k", 1, 1)])
    b.call(3, 4, 0, [("k", 1, 1)])  # redelivered although a handed over cleanly
    b.call(4, 5, 0, [("k", 2, 2)])
    rep = check_history(history(a, b), sent({"k": 3}))
    assert (rep.duplicates, rep.duplicates_unexplained) == (1, 1)
    assert any("consumed again by 127.0.0.1@200#1" in p for p in rep.problems)
    lenient = check_history(history(a, b), sent({"k": 3}), duplicates_only_after_kill=False)
    lenient.assert_ok()
    assert lenient.duplicates_unexplained == 1


def test_key_in_two_queues_and_call_over_two_queues() -> None:
    a = Worker(100)
    a.call(0, 1, 0, [("k", 0, 0)])
    a.call(1, 2, 1, [("k", 1, 0)])
    a.text += encode_lines(
        START,
        a.client,
        a.pid,
        9,
        [Delivery("T", "broker-a", 2, 0, "j", 0), Delivery("T", "broker-a", 3, 0, "i", 0)],
        3 * MS,
    )
    rep = check_history(history(a), sent({"k": 2}), killed={100: 4 * MS})
    problems = "\n".join(rep.problems)
    assert "key k was consumed from several queues: T@broker-a#0, T@broker-a#1" in problems
    assert "took messages of several queues: T@broker-a#2, T@broker-a#3" in problems


def test_files_torn_line_and_missing_file(tmp_path: Path) -> None:
    a = Worker(100)
    a.call(0, 1, 0, [("k", 0, 0)])
    path = tmp_path / "a.history"
    fd = append_fd(path)
    try:
        os_write_all(fd, a.text)
        os_write_all(fd, b'{"ev":"start","client":"x","pid":1')  # a kill mid-write
    finally:
        os.close(fd)
    h = load_histories([path, tmp_path / "never-started.history"])
    assert h.torn_lines == 1 and len(h.events) == 2
    assert isinstance(h.events[0], Event) and h.events[0].queue_name == "T@broker-a#0"
    rep = check_history(h, sent({"k": 1}))
    rep.assert_ok()
    assert rep.torn_lines == 1


def os_write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def test_empty_history() -> None:
    rep = check_history(History(), sent({"k": 1}))
    assert rep.lost == [("k", 0)] and rep.calls == 0
    assert "consumed 0/1" in rep.summary()
    assert encode_lines(END, "c", 1, 1, [], 0) == b""
