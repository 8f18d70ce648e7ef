"""Consume-offset stores: where a consumer remembers how far it got (SPEC §6.12, §11.8).

An offset here is the queue offset of the **next** message to consume. The consumer updates
the in-memory table after every consumed batch (with the smallest offset still in flight, SPEC
§6.11) and persists it periodically (every 5 s) and when a queue is taken away.

* :class:`RemoteBrokerOffsetStore` — clustering. The broker keeps the group's offsets; this
  store caches them and pushes the changed ones. The network calls are callables supplied by the
  consumer, so this module stays pure logic.
* :class:`LocalFileOffsetStore` — broadcasting. Every consumer keeps its own progress in
  ``{dir}/{clientId}/{group}/offsets.json``; ``dir`` is the ``base_dir`` argument, else the
  environment variable ``ROCKETMQ_CLIENT_LOCAL_OFFSET_STORE_DIR``, else ``~/.rocketmq_offsets``.

``read_offset`` answers -1 (:data:`NO_OFFSET`) when there is no stored offset — a first start,
so the consumer applies its ConsumeFromWhere — and -2 (:data:`OFFSET_READ_ERROR`) when the store
could not be read, so the consumer must not guess and skips the queue until the next rebalance.

The file format is RocketMQ's (SPEC §11.8), which is not quite JSON — its keys are objects::

    {"offsetTable":{
      {"brokerName":"broker-a","queueId":0,"topic":"TopicTest"}:335,
      {"brokerName":"broker-a","queueId":1,"topic":"TopicTest"}:335
    }}

A write goes to ``offsets.json.tmp`` (fsync), the current file becomes ``offsets.json.bak``, and
the temporary file is renamed over ``offsets.json`` (then the directory is fsynced). A crash at
any point leaves a complete file or a complete ``.bak``; :meth:`LocalFileOffsetStore.load` falls
back to the ``.bak`` when the main file is missing, empty or unreadable.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Protocol

from rocketq.client._atomic_write import write_atomic
from rocketq.client.errors import NotFoundError, RocketQError
from rocketq.message import MessageQueue

log = logging.getLogger(__name__)

#: read_offset: no offset stored for the queue.
NO_OFFSET = -1
#: read_offset: the store could not be read; do not start the queue now.
OFFSET_READ_ERROR = -2

#: Environment variable naming the broadcasting offset directory.
LOCAL_OFFSET_STORE_DIR_ENV = "ROCKETMQ_CLIENT_LOCAL_OFFSET_STORE_DIR"
#: Default broadcasting offset directory.
LOCAL_OFFSET_STORE_DIR_DEFAULT = "~/.rocketmq_offsets"
OFFSETS_FILE_NAME = "offsets.json"
#: At most this many offset pushes to brokers run at once.
PUSH_CONCURRENCY_MAX = 16


class ReadOffsetType(enum.Enum):
    """Where :meth:`OffsetStore.read_offset` looks."""

    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    """The cached value only; -1 when none is cached."""
    READ_FROM_STORE = "READ_FROM_STORE"
    """The broker or the file; refreshes the cache."""
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"
    """The cached value if there is one, else the store."""


class OffsetStore(Protocol):
    """A consumer's offset table and where it is persisted."""

    async def load(self) -> None:
        """Read what was persisted before (a no-op for the broker-backed store)."""
        ...

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        """Set the cached offset; with ``increase_only`` a smaller value is ignored."""
        ...

    async def read_offset(self, mq: MessageQueue, type_: ReadOffsetType) -> int:
        """The offset of ``mq``: >= 0, or -1 (none stored) or -2 (store unreadable)."""
        ...

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        """Persist the offsets of ``mqs`` (best effort; failures are logged)."""
        ...

    async def persist(self, mq: MessageQueue) -> None:
        """Persist one queue's offset (best effort; failures are logged)."""
        ...

    def remove_offset(self, mq: MessageQueue) -> None:
        """Forget the cached offset of a queue this consumer no longer owns."""
        ...

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        """A copy of the cached offsets of ``topic`` (of every topic if ``topic`` is empty)."""
        ...


class _OffsetTable:
    """The in-memory table both stores share; a lock because listeners run on threads."""

    def __init__(self) -> None:
        self._table_lock = threading.Lock()
        self._table: dict[MessageQueue, int] = {}

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        """Set the cached offset of ``mq``; with ``increase_only`` never move it backwards."""
        with self._table_lock:
            self._set_locked(mq, offset, increase_only)

    def _set_locked(self, mq: MessageQueue, offset: int, increase_only: bool) -> bool:
        """Set under ``_table_lock``; True if the value changed."""
        old = self._table.get(mq)
        if old == offset or (increase_only and old is not None and offset < old):
            return False
        self._table[mq] = offset
        return True

    def _cached(self, mq: MessageQueue) -> int | None:
        with self._table_lock:
            return self._table.get(mq)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        """A copy of the cached offsets of ``topic`` (of every topic if ``topic`` is empty)."""
        with self._table_lock:
            return {mq: o for mq, o in self._table.items() if not topic or mq.topic == topic}

    def _snapshot(self) -> dict[MessageQueue, int]:
        with self._table_lock:
            return dict(self._table)


# ---- broker-backed store (clustering) -------------------------------------------------------

FetchOffset = Callable[[MessageQueue], Awaitable[int]]
"""Reads the group's offset of a queue from its broker; raises NotFoundError if none."""
PushOffset = Callable[[MessageQueue, int], Awaitable[None]]
"""Stores the group's offset of a queue on its broker."""


class RemoteBrokerOffsetStore(_OffsetTable):
    """Clustering: the broker is the store; this caches offsets and pushes the changed ones.

    ``fetch`` and ``push`` do the network calls (QueryConsumerOffset, UpdateConsumerOffset on
    the queue's master). ``fetch`` must raise :class:`~rocketq.client.errors.NotFoundError` when
    the broker has no offset for the queue; any other exception counts as a failed read.
    """

    def __init__(
        self,
        group: str,
        fetch: FetchOffset,
        push: PushOffset,
        push_concurrency_max: int = PUSH_CONCURRENCY_MAX,
    ) -> None:
        super().__init__()
        self.group = group
        self._fetch = fetch
        self._push = push
        self._push_concurrency_max = push_concurrency_max
        self._pushed: dict[MessageQueue, int] = {}  # what the broker is known to hold

    async def load(self) -> None:
        """Nothing to load: offsets are fetched per queue when the queue is assigned."""

    async def read_offset(self, mq: MessageQueue, type_: ReadOffsetType) -> int:
        """The offset of ``mq`` (see :class:`ReadOffsetType`); -1 none, -2 broker error."""
        if type_ is not ReadOffsetType.READ_FROM_STORE:
            cached = self._cached(mq)
            if cached is not None:
                return cached
            if type_ is ReadOffsetType.READ_FROM_MEMORY:
                return NO_OFFSET
        try:
            offset = await self._fetch(mq)
        except NotFoundError:
            return NO_OFFSET
        except Exception as exc:  # any failure: the caller must not guess a start offset
            log.warning(
                "group %s: cannot read the offset of %s from its broker: %s", self.group, mq, exc
            )
            return OFFSET_READ_ERROR
        self.update_offset(mq, offset, increase_only=False)
        with self._table_lock:
            self._pushed[mq] = offset
        return offset

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        """Push the offsets of ``mqs`` that changed since the last push, then forget the rest.

        ``mqs`` are all the queues this consumer holds now; cached offsets of any other queue
        belong to queues given away, so they are dropped once the pushes are done.
        """
        wanted = set(mqs)
        if not wanted:
            return
        with self._table_lock:
            changed = [
                (mq, off)
                for mq, off in self._table.items()
                if mq in wanted and self._pushed.get(mq) != off
            ]
        limit = asyncio.Semaphore(self._push_concurrency_max)

        async def push_one(mq: MessageQueue, offset: int) -> None:
            async with limit:
                await self._push_logged(mq, offset)

        await asyncio.gather(*(push_one(mq, off) for mq, off in changed))
        with self._table_lock:
            for mq in [mq for mq in self._table if mq not in wanted]:
                log.info("group %s: forgetting the offset of %s, no longer held", self.group, mq)
                del self._table[mq]
                self._pushed.pop(mq, None)

    async def persist(self, mq: MessageQueue) -> None:
        """Push the cached offset of ``mq`` now, changed or not."""
        offset = self._cached(mq)
        if offset is not None:
            await self._push_logged(mq, offset)

    async def _push_logged(self, mq: MessageQueue, offset: int) -> None:
        try:
            await self._push(mq, offset)
        except Exception as exc:  # best effort: the next period (or the next pull) retries
            log.warning(
                "group %s: cannot push offset %d of %s to its broker: %s",
                self.group,
                offset,
                mq,
                exc,
            )
            return
        with self._table_lock:
            self._pushed[mq] = offset

    def remove_offset(self, mq: MessageQueue) -> None:
        """Forget ``mq``: the queue went to another consumer, whose pushes now count."""
        with self._table_lock:
            self._table.pop(mq, None)
            self._pushed.pop(mq, None)


# ---- local file store (broadcasting) --------------------------------------------------------


def local_offset_store_dir(base_dir: str | os.PathLike[str] | None = None) -> Path:
    """The broadcasting offset directory: ``base_dir``, else the env variable, else the default."""
    chosen = (
        base_dir or os.environ.get(LOCAL_OFFSET_STORE_DIR_ENV) or LOCAL_OFFSET_STORE_DIR_DEFAULT
    )
    return Path(chosen).expanduser()


def format_offsets(table: dict[MessageQueue, int]) -> str:
    """The §11.8 text of an offset table, queues sorted."""
    entries = [
        json.dumps(
            {"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic},
            separators=(",", ":"),
            sort_keys=True,
        )
        + f":{table[mq]}"
        for mq in sorted(table)
    ]
    if not entries:
        return '{"offsetTable":{}}\n'
    return '{"offsetTable":{\n  ' + ",\n  ".join(entries) + "\n}}\n"


_decoder = json.JSONDecoder()
_WHITESPACE = " \t\r\n"


class _Reader:
    """A cursor over the §11.8 text, which ``json`` cannot read because its keys are objects."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _WHITESPACE:
            self.pos += 1

    def peek(self) -> str:
        self.skip_ws()
        return self.text[self.pos : self.pos + 1]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            found = self.text[self.pos : self.pos + 10] or "end of text"
            raise ValueError(f"expected {char!r} at character {self.pos}, found {found!r}")
        self.pos += 1

    def value(self) -> object:
        self.skip_ws()
        try:
            obj, self.pos = _decoder.raw_decode(self.text, self.pos)
        except json.JSONDecodeError as exc:
            raise ValueError(f"bad JSON value at character {self.pos}: {exc.msg}") from None
        return obj


def _queue_of(key: object) -> MessageQueue:
    if not isinstance(key, dict):
        raise ValueError(f"offset table key must be an object, got {key!r}")
    topic, broker, qid = key.get("topic"), key.get("brokerName"), key.get("queueId")
    if not isinstance(topic, str) or not isinstance(broker, str):
        raise ValueError(f"offset table key needs string topic and brokerName: {key!r}")
    if not isinstance(qid, int) or isinstance(qid, bool) or qid < 0:
        raise ValueError(f"offset table key needs a queueId >= 0: {key!r}")
    return MessageQueue(topic, broker, qid)


def parse_offsets(text: str) -> dict[MessageQueue, int]:
    """Read the §11.8 text written by :func:`format_offsets` (or by RocketMQ); ValueError if bad."""
    reader = _Reader(text)
    reader.expect("{")
    if reader.value() != "offsetTable":
        raise ValueError('the file must start with {"offsetTable":')
    reader.expect(":")
    reader.expect("{")
    table: dict[MessageQueue, int] = {}
    if reader.peek() == "}":
        reader.pos += 1
    else:
        while True:
            mq = _queue_of(reader.value())
            reader.expect(":")
            offset = reader.value()
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise ValueError(f"offset of {mq} must be an integer, got {offset!r}")
            table[mq] = offset
            if reader.peek() == ",":
                reader.pos += 1
                continue
            reader.expect("}")
            break
    reader.expect("}")
    if reader.peek():
        raise ValueError(f"unexpected text after the offset table at character {reader.pos}")
    return table


class LocalFileOffsetStore(_OffsetTable):
    """Broadcasting: this client's own offsets in ``{dir}/{client_id}/{group}/offsets.json``.

    Offsets are never forgotten (:meth:`remove_offset` is a no-op) and every persist writes the
    whole table: a broadcasting consumer owns every queue, and a queue that leaves the route for
    a while (its broker down) must resume where it stopped when it comes back.
    """

    def __init__(
        self, client_id: str, group: str, base_dir: str | os.PathLike[str] | None = None
    ) -> None:
        super().__init__()
        if not client_id or not group:
            raise ValueError("LocalFileOffsetStore needs a client id and a group")
        # A client id is "ip@instance"; keep a stray separator from making it a sub-path.
        safe_id = client_id.replace("/", "_").replace("\\", "_")
        self.group = group
        self.path = local_offset_store_dir(base_dir) / safe_id / group / OFFSETS_FILE_NAME
        self.bak_path = self.path.with_name(OFFSETS_FILE_NAME + ".bak")
        self._file_lock = threading.Lock()
        self._version = 0  # bumped by every change of the table
        self._persisted_version = 0

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        """Set the cached offset of ``mq``; with ``increase_only`` never move it backwards."""
        with self._table_lock:
            if self._set_locked(mq, offset, increase_only):
                self._version += 1

    async def load(self) -> None:
        """Read the file (or its ``.bak``) into memory.

        Raises RocketQError if a file exists but neither it nor the ``.bak`` can be read:
        guessing would silently skip or repeat messages; delete the files to start afresh.
        """
        loaded = await asyncio.to_thread(self._read_file)
        with self._table_lock:
            self._table.update(loaded)

    async def read_offset(self, mq: MessageQueue, type_: ReadOffsetType) -> int:
        """The offset of ``mq`` (see :class:`ReadOffsetType`); -1 none, -2 file unreadable."""
        if type_ is not ReadOffsetType.READ_FROM_STORE:
            cached = self._cached(mq)
            if cached is not None:
                return cached
            if type_ is ReadOffsetType.READ_FROM_MEMORY:
                return NO_OFFSET
        try:
            stored = await asyncio.to_thread(self._read_file)
        except RocketQError as exc:
            log.warning("group %s: %s", self.group, exc)
            return OFFSET_READ_ERROR
        offset = stored.get(mq)
        if offset is None:
            return NO_OFFSET
        self.update_offset(mq, offset, increase_only=False)
        return offset

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        """Write the whole table (every queue, not only ``mqs``) if it changed since last time."""
        await self._persist()

    async def persist(self, mq: MessageQueue) -> None:
        """Write the whole table if it changed since the last write."""
        await self._persist()

    def remove_offset(self, mq: MessageQueue) -> None:
        """Keep the offset: a broadcasting consumer resumes a returning queue where it stopped."""

    async def _persist(self) -> None:
        with self._table_lock:
            if self._version == self._persisted_version:
                return
            version, table = self._version, dict(self._table)
        try:
            await asyncio.to_thread(self._write_file, format_offsets(table))
        except OSError as exc:  # best effort; the next period writes again
            log.warning("group %s: cannot write offsets to %s: %s", self.group, self.path, exc)
            return
        with self._table_lock:
            self._persisted_version = max(self._persisted_version, version)

    def _read_file(self) -> dict[MessageQueue, int]:
        problems: list[str] = []
        for path in (self.path, self.bak_path):
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(f"{path}: {exc}")
                continue
            if not text.strip():  # a torn first write; the .bak may be whole
                continue
            try:
                table = parse_offsets(text)
            except ValueError as exc:
                problems.append(f"{path}: {exc}")
                continue
            if problems:
                log.warning("offsets file unreadable (%s); using the backup %s", problems, path)
            return table
        if problems:
            raise RocketQError(
                "cannot read the consumer offsets file or its backup: "
                + "; ".join(problems)
                + " (delete them to start from the consumer's ConsumeFromWhere)"
            )
        return {}

    def _write_file(self, text: str) -> None:
        with self._file_lock:
            write_atomic(self.path, text.encode("utf-8"), backup_path=self.bak_path)
