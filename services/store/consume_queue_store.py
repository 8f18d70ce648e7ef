"""All consume queues of a store: ``consumequeue/{topic}/{queueId}/`` created on first use."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from services.store.consume_queue import DEFAULT_UNITS_PER_FILE, ConsumeQueue


class ConsumeQueueStore:
    """Finds, creates, loads and closes consume queues."""

    def __init__(self, root: Path, units_per_file: int = DEFAULT_UNITS_PER_FILE) -> None:
        self.root = root
        self.units_per_file = units_per_file
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.rebuild_needed = False
        """A damaged queue was set aside: recovery must re-dispatch the whole commitlog."""

    def load(self) -> list[str]:
        """Map every queue on disk; return problems (odd directory names, bad files)."""
        problems: list[str] = []
        if not self.root.exists():
            return problems
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for qdir in sorted(topic_dir.iterdir()):
                if not qdir.name.isdigit():
                    problems.append(f"{qdir}: not a queue id directory, ignored")
                    continue
                cq = ConsumeQueue(qdir, topic_dir.name, int(qdir.name), self.units_per_file)
                damage = cq.files.load()
                if damage:
                    problems.extend(damage)
                    cq = self._quarantine(cq)
                    problems.append(
                        f"{qdir}: damaged queue moved aside; it is rebuilt from the commitlog"
                    )
                self.queues[(topic_dir.name, int(qdir.name))] = cq
        return problems

    def _quarantine(self, cq: ConsumeQueue) -> ConsumeQueue:
        """Move a damaged queue's files under ``corrupt/`` and start it afresh.

        Kept, not deleted, so an operator can look at what went wrong; the queue itself is
        derived data and is rebuilt exactly from the commitlog.
        """
        cq.close()
        qdir = cq.files.directory
        stamp = time.strftime("%Y%m%d%H%M%S")
        aside = self.root.parent / "corrupt" / "consumequeue" / cq.topic / f"{cq.queue_id}-{stamp}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(qdir), str(aside))
        self.rebuild_needed = True
        return ConsumeQueue(qdir, cq.topic, cq.queue_id, self.units_per_file)

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            path = self.root / topic / str(queue_id)
            cq = ConsumeQueue(path, topic, queue_id, self.units_per_file)
            self.queues[(topic, queue_id)] = cq
        return cq

    def topic_queues(self, topic: str) -> dict[int, ConsumeQueue]:
        return {qid: cq for (t, qid), cq in self.queues.items() if t == topic}

    def delete_topic(self, topic: str) -> None:
        """Close and delete every queue of ``topic`` (admin topic deletion)."""
        for qid, cq in list(self.topic_queues(topic).items()):
            for mf in list(cq.files):
                mf.destroy()
            cq.files.files = []
            del self.queues[(topic, qid)]
            for d in (self.root / topic / str(qid), self.root / topic):
                with contextlib.suppress(OSError):  # not empty: leave it
                    d.rmdir()

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self.queues.values()))

    def flush(self) -> None:
        for cq in list(self.queues.values()):
            cq.flush()

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
