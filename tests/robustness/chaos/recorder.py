"""The recording client's journal: every request a traffic process made and what came of it.

Every process of a run (producers, consumers, the fault injector, the final read-back) appends
JSON lines to its own file under ``<run>/history/``. Each event is one ``os.write`` on an
``O_APPEND`` descriptor, so a SIGKILLed writer loses at most the event it was writing and a
torn last line is skipped when reading. Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC is
one clock for every process of the host (network namespaces do not change it), so events of
different processes compare directly.

| ``ev``    | written by | fields (besides ``ev``, ``proc``)                                     |
|-----------|------------|-----------------------------------------------------------------------|
| invoke    | producer   | id, topic, shard, seq, delay_ms, t0 (written before the call: a send  |
|           |            | with no ``send`` event after it never finished - indeterminate)       |
| send      | producer   | id, topic, shard, seq, delay_ms, t0, t1, outcome, err, broker, queue, |
|           |            | offset                                                                |
| deliver   | consumer   | group, id, topic, broker, queue, offset, t, reconsume                 |
| commit    | consumer   | group, topic, broker, queue, offset, t0, t1 (an acknowledged offset   |
|           |            | push to the broker)                                                   |
| fetch     | consumer   | group, topic, broker, queue, offset, t0, t1 (the group's offset read  |
|           |            | from the broker when a queue was assigned; -1 none)                   |
| stopped   | producer   | in_flight (sends awaited at stop), unfinished (still unanswered past  |
|           |            | their timeout, then cancelled), t                                     |
| fault     | injector   | kind, target, group (broker group or ""), t0, t1, note                |
| stored    | read-back  | topic, broker, queue, offset, id (what the final masters hold)        |

``outcome`` is ``SEND_OK``, another :class:`rocketq.SendStatus` name (stored but not
acknowledged as safe), or ``ERROR`` (``err`` says which); only ``SEND_OK`` is an
acknowledgement the checker holds the system to.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

HISTORY_DIR = "history"
"""Subdirectory of a run directory holding every ``*.jsonl`` journal."""


class Recorder:
    """Appends events to one journal file; safe to call from several threads."""

    def __init__(self, path: Path, proc: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.proc = proc
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def record(self, ev: str, **fields: Any) -> None:
        """Write one event line (``proc`` is added)."""
        line = json.dumps({"ev": ev, "proc": self.proc, **fields}, separators=(",", ":"))
        self.write_raw([line])

    def write_raw(self, lines: Iterable[str]) -> None:
        """Several complete lines in one ``os.write`` (e.g. every delivery of one call)."""
        data = "".join(line + "\n" for line in lines).encode()
        with self._lock:
            if self._fd < 0:
                return
            view = memoryview(data)
            while view:  # a regular file takes it whole; the loop is for form's sake
                view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def event_line(ev: str, proc: str, **fields: Any) -> str:
    """One event as a line without its newline (for :meth:`Recorder.write_raw`)."""
    return json.dumps({"ev": ev, "proc": proc, **fields}, separators=(",", ":"))


def read_events(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Every well-formed event of the given journals; a torn or garbled line is skipped (it
    can only be the last one of a killed writer)."""
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "ev" in event:
                yield event


def journals(run_dir: Path) -> list[Path]:
    """The journal files of a run, in name order."""
    return sorted((run_dir / HISTORY_DIR).glob("*.jsonl"))
