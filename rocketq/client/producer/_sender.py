"""The network side of producing: checked messages, SendRequests, the Send call, and the loop
that ships accumulated batches (after aiokafka's ``sender.py``).

**Preparing a message** (client-side checks, so a mistake is reported where it was made):
topic name rules, not a topic producers may not write (the auto-create template, ``rmq_sys_*``
and ``RMQ_SYS_*``), a non-empty body, delay level 0..18, no reserved property and no separator
characters. Each message gets its UNIQ_KEY (``new_unique_id``) once, so every retry carries the
same message id (SPEC §7).

**Size accounting** (SPEC §5.5), per message, summed over a batch::

    size = len(topic) + len(body) + 20 (log overhead) + len(encoded properties)

Properties are encoded as stored (``name\\x01value\\x02`` each), UNIQ_KEY included. A message or
batch over ``max_message_size_bytes`` (4 MiB) is a MessageTooLargeError before anything is sent.

**Compression**: a request of one message whose body is larger than ``compress_over_bytes``
(4 KiB, RocketMQ's ``compressMsgBodyOverHowmuch``) is sent zlib-compressed with SYSFLAG 0x1;
consumers decompress. Batches are never compressed (SYSFLAG is per request).

**One handler per request kind**: :class:`SendHandler` (Send, and the oneway variant that does
not wait). Errors come back as SDK errors through ``from_rpc_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

import grpc

from rocketq import codec
from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2, messaging_pb2_grpc
from rocketq.aio import wait_event
from rocketq.client._request_stream import RequestStreams, StreamUnsupported
from rocketq.client.errors import (
    ClientStateError,
    InvalidArgumentError,
    MessageTooLargeError,
    RocketQError,
    ServerError,
    from_rpc_error,
)
from rocketq.client.producer._accumulator import ProducerBatch, RecordAccumulator
from rocketq.codec import Prop
from rocketq.message import (
    DELAY_LEVEL_MAX,
    Message,
    MessageQueue,
    SendResult,
    SendStatus,
    check_property_text,
    check_user_properties,
    new_unique_id,
    new_unique_ids,
    send_result,
)
from rocketq.validation import check_topic

log = logging.getLogger(__name__)

#: Per-message overhead SPEC §5.5 charges besides topic, body and properties.
LOG_OVERHEAD_BYTES = 20
#: Bodies above this are compressed when sent alone.
COMPRESS_OVER_BYTES = 4096
#: zlib level: RocketMQ's default compressMsgBodyOverHowmuch level.
COMPRESS_LEVEL = 5

_FORBIDDEN_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_SYS_")

_STATUS = {
    messaging_pb2.SEND_OK: SendStatus.SEND_OK,
    messaging_pb2.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    messaging_pb2.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    messaging_pb2.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


def message_size_bytes(topic: str, body_bytes: int, encoded_properties_bytes: int) -> int:
    """SPEC §5.5 size of one message: topic + body + 20 bytes of log overhead + properties."""
    return len(topic.encode()) + body_bytes + LOG_OVERHEAD_BYTES + encoded_properties_bytes


class PreparedMessage:
    """A checked message ready for the wire; its id is fixed for every retry.

    The protobuf ``Message`` is built only when a request carries messages (a lone send); a
    batch travels as records encoded from ``properties`` (DESIGN.md §12)."""

    __slots__ = (
        "_pb", "body", "delayed", "flag", "msg_id", "properties", "props", "size_bytes", "topic",
    )  # fmt: skip

    def __init__(
        self,
        topic: str,
        flag: int,
        body: bytes,
        props: dict[str, str],
        properties: bytes,
        msg_id: str,
        size_bytes: int,
        delayed: bool,
    ) -> None:
        self.topic = topic
        self.flag = flag
        self.body = body
        self.props = props
        self.properties = properties
        """``props`` encoded (name\x01value\x02 …)."""
        self.msg_id = msg_id
        self.size_bytes = size_bytes
        self.delayed = delayed
        self._pb: common_pb2.Message | None = None

    def add_properties(self, extra: Mapping[str, str]) -> None:
        """Properties added after the checks (a send span's trace context), kept in step in
        every form the message travels in: ``props``, the encoded ``properties`` a batch's
        records are made of, and the protobuf if it was built."""
        self.props.update(extra)
        encoded = codec.encode_properties(self.props)
        self.size_bytes += len(encoded) - len(self.properties)
        self.properties = encoded
        if self._pb is not None:
            self._pb.properties.update(extra)

    @property
    def pb(self) -> common_pb2.Message:
        if self._pb is None:
            self._pb = common_pb2.Message(
                topic=self.topic, flag=self.flag, body=self.body, properties=self.props
            )
        return self._pb


def check_send_topic(topic: str, create_topic_key: str) -> None:
    try:
        check_topic(topic)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None
    if topic == create_topic_key or topic.startswith(_FORBIDDEN_TOPIC_PREFIXES):
        raise InvalidArgumentError(
            f"topic {topic!r} is reserved for RocketQ itself; producers may not send to it"
        )


def prepare_message(
    msg: Message, *, create_topic_key: str, max_size_bytes: int, msg_id: str = ""
) -> PreparedMessage:
    """Check ``msg`` and give it its UNIQ_KEY (InvalidArgumentError, MessageTooLargeError);
    ``msg_id`` is the key to give instead of a new one."""
    check_send_topic(msg.topic, create_topic_key)
    return prepare_checked_topic(
        msg, msg_id or new_unique_id(), len(msg.topic.encode()), max_size_bytes
    )


def prepare_batch(
    msgs: Sequence[Message], *, create_topic_key: str, max_size_bytes: int
) -> list[PreparedMessage]:
    """Check a batch (:func:`prepare_message` of each, then :func:`check_batch`). What is the
    same for every message is done once: the topic rules for the messages of the first
    message's topic, its encoded length, the clock reading of the UNIQ_KEYs."""
    if not isinstance(msgs, (list, tuple)):
        msgs = list(msgs)
    items: list[PreparedMessage] = []
    if msgs:
        topic = msgs[0].topic
        check_send_topic(topic, create_topic_key)
        topic_size = len(topic.encode())
        prepare = prepare_checked_topic
        add = items.append
        # The common message (its topic, a bytes body, a tag as its only property) is made
        # inline, its tag checked once per batch: a third of the per-message cost. Anything
        # else, or anything the checks would refuse, takes prepare_checked_topic.
        fixed = topic_size + LOG_OVERHEAD_BYTES
        heads: dict[str, bytes] = {}
        for msg, msg_id in zip(msgs, new_unique_ids(len(msgs)), strict=True):
            body = msg.body
            if msg.topic == topic and type(body) is bytes and body and _tags_only(msg):
                tags = msg.tags
                head = heads.get(tags)
                if head is None:
                    head = _tags_head(tags)
                    if head is not None:
                        heads[tags] = head
                if head is not None:
                    encoded = head + msg_id.encode() + b"\x02"
                    size = fixed + len(body) + len(encoded)
                    if size <= max_size_bytes and len(encoded) <= _PROPERTIES_MAX_BYTES:
                        props = _tags_dict(tags, msg_id)
                        add(
                            PreparedMessage(
                                topic, msg.flag, body, props, encoded, msg_id, size, False
                            )
                        )
                        continue
            if msg.topic == topic:
                add(prepare(msg, msg_id, topic_size, max_size_bytes))
            else:  # check_batch refuses the mix once every message is checked
                check_send_topic(msg.topic, create_topic_key)
                add(prepare(msg, msg_id, len(msg.topic.encode()), max_size_bytes))
    check_batch(items, max_size_bytes)
    return items


def _tags_head(tags: str) -> bytes | None:
    """The encoded properties of a tags-only message up to its UNIQ_KEY's value (what
    :func:`_tags_properties` makes), or None when the tag holds a separator (refused by the
    per-message path, which names it)."""
    if codec.NAME_VALUE_SEPARATOR in tags or codec.PROPERTY_SEPARATOR in tags:
        return None
    if not tags:
        return f"{_UNIQ_KEY}\x01".encode()
    return f"{_TAGS}\x01{tags}\x02{_UNIQ_KEY}\x01".encode()


def prepare_checked_topic(
    msg: Message, msg_id: str, topic_size_bytes: int, max_size_bytes: int
) -> PreparedMessage:
    """:func:`prepare_message` past the topic's checks (``topic_size_bytes``: its UTF-8 size)."""
    body = msg.body
    if type(body) is not bytes:
        if not isinstance(body, (bytearray, memoryview)):
            raise InvalidArgumentError(
                f"message body must be bytes, got {type(body).__name__}; encode it first"
            )
        body = bytes(body)
    if not body:
        raise InvalidArgumentError(f"message to {msg.topic!r} has an empty body; send some bytes")
    if not 0 <= msg.delay_level <= DELAY_LEVEL_MAX:
        raise InvalidArgumentError(
            f"delay_level is {msg.delay_level}; use 0 (none) or 1..{DELAY_LEVEL_MAX}"
        )
    if msg.deliver_time_ms < 0:
        raise InvalidArgumentError(f"deliver_time_ms is {msg.deliver_time_ms}; it must be >= 0")
    if msg.delay_ms < 0:
        raise InvalidArgumentError(f"delay_ms is {msg.delay_ms}; it must be >= 0")
    try:
        if _tags_only(msg):
            props, encoded = _tags_properties(msg.tags, msg_id)
        else:
            check_user_properties(msg.properties)
            props = msg.wire_properties()
            if msg.tags:
                check_property_text(Prop.TAGS, msg.tags)
            if msg.keys:
                check_property_text(Prop.KEYS, props.get(Prop.KEYS, ""))
            props[Prop.UNIQ_KEY] = msg_id
            encoded = codec.encode_properties(props)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None
    if len(encoded) > codec.PROPERTIES_MAX_BYTES:
        raise MessageTooLargeError(
            f"the properties of a message to {msg.topic!r} take {len(encoded)} bytes encoded; "
            f"the limit is {codec.PROPERTIES_MAX_BYTES}"
        )
    size = topic_size_bytes + len(body) + LOG_OVERHEAD_BYTES + len(encoded)
    if size > max_size_bytes:
        raise MessageTooLargeError(
            f"message to {msg.topic!r} is {size} bytes (topic + body + 20 + properties); the "
            f"limit is {max_size_bytes} (max_message_size_bytes); split it, or raise "
            "maxMessageSize on producer and broker"
        )
    delayed = bool(msg.delay_level or msg.deliver_time_ms or msg.delay_ms)
    return PreparedMessage(msg.topic, msg.flag, body, props, encoded, msg_id, size, delayed)


def _tags_only(msg: Message) -> bool:
    """True when the only property ``msg`` has to carry (besides its UNIQ_KEY) is its tag:
    the common message, whose properties :func:`_tags_properties` makes directly."""
    return (
        not msg.properties
        and not msg.keys
        and not msg.delay_level
        and not msg.deliver_time_ms
        and not msg.delay_ms
        and msg.wait_store_msg_ok
    )


def _tags_properties(tags: str, msg_id: str) -> tuple[dict[str, str], bytes]:
    """``Message.wire_properties()`` plus the UNIQ_KEY, and their encoding, for a message
    whose only property is its tag (ValueError for a separator in the tag)."""
    head = _tags_head(tags)
    if head is None:
        check_property_text(Prop.TAGS, tags)  # raises, naming the separator
        raise AssertionError("_tags_head and check_property_text disagree")
    return _tags_dict(tags, msg_id), head + msg_id.encode() + b"\x02"


def _tags_dict(tags: str, msg_id: str) -> dict[str, str]:
    """The properties of a message whose only one is its tag (if any), with its UNIQ_KEY."""
    return {_TAGS: tags, _UNIQ_KEY: msg_id} if tags else {_UNIQ_KEY: msg_id}


_TAGS, _UNIQ_KEY = Prop.TAGS, Prop.UNIQ_KEY
_PROPERTIES_MAX_BYTES = codec.PROPERTIES_MAX_BYTES


def check_batch(items: Sequence[PreparedMessage], max_size_bytes: int) -> None:
    """SPEC §5.5: one topic, no delayed message in a batch of several, total within the limit."""
    if not items:
        raise InvalidArgumentError("a batch needs at least one message")
    topic = items[0].topic
    for i, item in enumerate(items):
        if item.topic != topic:
            raise InvalidArgumentError(
                f"batch message {i} is for topic {item.topic!r} but message 0 is for {topic!r}; "
                "a batch holds one topic"
            )
        if item.delayed and len(items) > 1:
            raise InvalidArgumentError(
                f"batch message {i} is delayed; delayed messages cannot be batched (send it alone)"
            )
    total = sum(item.size_bytes for item in items)
    if total > max_size_bytes:
        raise MessageTooLargeError(
            f"batch of {len(items)} messages to {topic!r} is {total} bytes (topic + body + 20 + "
            f"properties each); the limit is {max_size_bytes}; split it into smaller batches"
        )


def build_send_request(
    group: str,
    mq: MessageQueue,
    items: Sequence[PreparedMessage],
    *,
    default_topic: str = "",
    default_topic_queue_nums: int = 4,
    compress_over_bytes: int = COMPRESS_OVER_BYTES,
    born_timestamp_ms: int | None = None,
    as_records: bool = False,
) -> messaging_pb2.SendRequest:
    """The SendRequest for ``items`` to ``mq`` (``default_topic`` set for a borrowed route);
    ``as_records``: a batch of several travels as encoded records (SendRequest.records)."""
    req = messaging_pb2.SendRequest(
        producer_group=group,
        queue_id=mq.queue_id,
        born_timestamp_ms=born_timestamp_ms or time.time_ns() // 1_000_000,
    )
    if as_records and len(items) > 1:
        req.compact_response = True  # we know the ids: SendResponse.batch (batch_results)
        req.records = codec.encode_sent_batch(
            items[0].topic.encode(),
            [(m.body, m.properties, m.flag) for m in items],
            req.born_timestamp_ms,
        )
    elif len(items) == 1 and 0 < compress_over_bytes < len(items[0].body):
        item = items[0]
        body = zlib.compress(item.body, COMPRESS_LEVEL)
        req.messages.add(topic=item.topic, flag=item.flag, body=body, properties=item.props)
        req.sys_flag = codec.SysFlag.COMPRESSED
    else:
        # Made in the request, not as a Message copied into it: a third of the cost of a
        # single send's request.
        add = req.messages.add
        for item in items:
            add(topic=item.topic, flag=item.flag, body=item.body, properties=item.props)
    if default_topic:
        req.default_topic = default_topic
        req.default_topic_queue_nums = default_topic_queue_nums
    return req


def to_results(
    resp: messaging_pb2.SendResponse, mq: MessageQueue, count: int, target: str
) -> list[SendResult]:
    results = resp.results
    if len(results) != count:
        raise ServerError(
            f"broker answered {len(results)} results for {count} messages", target=target
        )
    # The results of one request name its queue: ``mq`` is shared rather than one equal
    # MessageQueue made per message.
    queues = {mq.queue_id: mq}
    status_of = _STATUS.get
    out = []
    for r in results:
        status = status_of(r.status)
        if status is None:
            raise ServerError(f"broker sent an unknown send status {r.status}", target=target)
        queue_id = r.queue_id
        queue = queues.get(queue_id)
        if queue is None:
            queue = queues[queue_id] = MessageQueue(mq.topic, mq.broker_name, queue_id)
        out.append(
            send_result(status, r.msg_id, r.offset_msg_id, queue, r.queue_offset, r.transaction_id)
        )
    return out


def batch_results(
    batch: messaging_pb2.SendBatchResult, mq: MessageQueue, msg_ids: Sequence[str], target: str
) -> list[SendResult]:
    """The SendResults of a compact answer (SendRequest.compact_response): message i has the
    i-th of ``msg_ids`` (the UNIQ_KEYs the request carried), ``first_queue_offset + i`` and an
    offset message id made of the store host prefix and its physical offset. Equal to the
    results :func:`to_results` makes of the same answer sent per message."""
    offsets = list(batch.physical_offsets)
    if len(offsets) != len(msg_ids):
        raise ServerError(
            f"broker answered {len(offsets)} results for {len(msg_ids)} messages", target=target
        )
    status = _STATUS.get(batch.status)
    if status is None:
        raise ServerError(f"broker sent an unknown send status {batch.status}", target=target)
    queue_id = batch.queue_id
    queue = mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id)
    prefix = batch.offset_msg_id_prefix
    first = batch.first_queue_offset
    new = send_result
    return [
        new(status, msg_id, f"{prefix}{phys:016X}", queue, queue_offset)
        for msg_id, phys, queue_offset in zip(
            msg_ids, offsets, range(first, first + len(offsets)), strict=True
        )
    ]


class SendHandler:
    """Sends one SendRequest to one broker and turns the answer into SendResults or an error."""

    def __init__(
        self,
        stub_of: Callable[[str], messaging_pb2_grpc.MessagingAsyncStub],
        streams: RequestStreams | None = None,
    ) -> None:
        self._stub_of = stub_of
        self._streams = streams
        """Send down a SendStream per broker (rocketq/client/_request_stream.py); None = a unary
        call each."""

    async def send(
        self,
        addr: str,
        mq: MessageQueue,
        req: messaging_pb2.SendRequest,
        timeout_ms: int,
        msg_ids: Sequence[str] | None = None,
    ) -> list[SendResult]:
        """``msg_ids``: the UNIQ_KEYs of the request's messages, in order (needed to read a
        compact answer; a request without them is answered per message)."""
        timeout_s = max(timeout_ms, 1) / 1000
        streams = self._streams
        resp: messaging_pb2.SendResponse | None = None
        if streams is not None and streams.usable(addr):
            with contextlib.suppress(StreamUnsupported):  # an older broker: unary from now on
                resp = await streams.call(addr, req, timeout_s)
        if resp is None:
            try:
                resp = await self._stub_of(addr).Send(req, timeout=timeout_s)
            except grpc.RpcError as err:
                raise from_rpc_error(err, addr) from None
        if not resp.results and resp.HasField("batch"):
            if msg_ids is None:
                raise ServerError("broker answered compactly to a request without ids", target=addr)
            return batch_results(resp.batch, mq, msg_ids, addr)
        count = (
            len(msg_ids)
            if msg_ids is not None
            else len(req.messages) or codec.count_records(req.records)
        )
        return to_results(resp, mq, count, addr)

    async def close(self) -> None:
        """End the send streams (after the sends in flight are answered)."""
        if self._streams is not None:
            await self._streams.close()

    def send_oneway(
        self, addr: str, req: messaging_pb2.SendRequest, timeout_ms: int
    ) -> asyncio.Future[object]:
        """Hand the request to gRPC and return at once; the outcome is only logged."""
        call = self._stub_of(addr).Send(req, timeout=max(timeout_ms, 1) / 1000)
        fut: asyncio.Future[object] = asyncio.ensure_future(call)
        fut.add_done_callback(_log_oneway_outcome)
        return fut


def _log_oneway_outcome(fut: asyncio.Future[object]) -> None:
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None:
        log.debug("oneway send failed: %s", exc)


class BatchSender:
    """Ships ready batches of a :class:`RecordAccumulator`, at most ``in_flight_max`` at a time.

    ``send_batch(batch)`` does the real work (queue choice, retries) and returns one result per
    message; its outcome goes to the batch's futures and the batch's bytes are released.
    """

    def __init__(
        self,
        accumulator: RecordAccumulator[PreparedMessage],
        send_batch: Callable[[ProducerBatch[PreparedMessage]], Awaitable[list[SendResult]]],
        *,
        in_flight_max: int,
        now_ms: Callable[[], int],
    ) -> None:
        self._acc = accumulator
        self._send_batch = send_batch
        self._slots = asyncio.Semaphore(in_flight_max)
        self._now_ms = now_ms
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Forever: drain ready batches and send them; sleep until the next linger deadline."""
        while True:
            self._acc.wakeup.clear()
            for batch in self._acc.drain_ready():
                await self._slots.acquire()
                task = asyncio.create_task(self._ship(batch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            deadline = self._acc.next_deadline_ms()
            wait_s = None if deadline is None else max(deadline - self._now_ms(), 0) / 1000
            if wait_s == 0:
                await asyncio.sleep(0)
                continue
            await wait_event(self._acc.wakeup, wait_s)

    async def _ship(self, batch: ProducerBatch[PreparedMessage]) -> None:
        try:
            results = await self._send_batch(batch)
            batch.complete(results)
        except RocketQError as exc:
            batch.fail(exc)
        except Exception as exc:
            log.exception("sending a batch of %d failed", len(batch.items))
            batch.fail(exc)
        except BaseException:
            batch.fail(ClientStateError("the producer closed before this batch was sent"))
            raise
        finally:
            self._acc.release(batch)
            self._slots.release()

    async def wait_in_flight(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks))
