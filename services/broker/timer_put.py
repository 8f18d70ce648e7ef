"""Delayed messages on the broker: where a delayed send goes, and re-puts stored only once.

A message is delayed by exactly one of these properties (SPEC §8.1, §8.2):

| property           | value                                  | delivery time (``out_ms``)       |
|--------------------|----------------------------------------|----------------------------------|
| ``DELAY``          | level 1..N of ``messageDelayLevel``    | now + the level's delay          |
|                    | (0 = not delayed)                      |                                  |
| ``TIMER_DELIVER_MS`` | absolute time in ms, >= 0            | the value                        |
| ``TIMER_DELAY_MS`` | delay in ms, >= 0                      | now + the value                  |
| ``TIMER_DELAY_SEC``| delay in s, >= 0 (RocketMQ 5 spelling) | now + 1000 × the value           |

``out_ms - now`` beyond ``timerMaxDelaySec`` is refused. A message whose ``out_ms`` is already
due (<= now) is stored in its own topic at once, without the delay properties. Any other goes
to the timer topic ``rmq_sys_wheel_timer`` instead of its topic (:func:`timer_properties`):

* queue = crc32(UNIQ_KEY) % the timer topic's write queues, so one message (and its cancel
  marker, which carries the same handle) always lands on the same timer-wheel owner;
* ``REAL_TOPIC`` / ``REAL_QID`` = where it goes when due, ``TIMER_OUT_MS`` = ``out_ms``;
* the delay properties and any stale ``TIMER_SOURCE`` removed; everything else kept (UNIQ_KEY,
  TAGS, KEYS, user properties), so the timer-wheel re-puts exactly what the producer sent.

The timer-wheel re-puts a due message with ``TIMER_SOURCE`` = the commitlog offset of its timer
record. It may re-put one twice (a crash between the re-put and its checkpoint), so the broker
remembers the sources it stored in :class:`RePutDedup` — bounded in entries and in time, O(1)
per lookup — and answers a repeat with the first store's position, storing nothing. The table
is in memory: a broker restart forgets it (the window a timer-wheel re-puts in after its own
crash is seconds, a broker restart in that window can still duplicate one message).

Only the timer-wheel's consumer group (:data:`TIMER_CONSUMER_GROUP`) may pull the timer topic.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from rocketq.codec import Prop
from rocketq.validation import PERM_READ, PERM_WRITE, TIMER_TOPIC
from services.broker.config import BrokerConfig
from services.broker.model import TopicConfig
from services.broker.topic_config_manager import TopicConfigManager
from services.common.clock import Clock

TIMER_CONSUMER_GROUP = "rmq_sys_timer_wheel"
"""The timer-wheel service's consumer group (services.timer_wheel.TIMER_GROUP); the only group
allowed to pull the timer topic."""
TIMER_TOPIC_PERM = PERM_READ | PERM_WRITE

DELAY_PROPERTIES = (
    Prop.DELAY_LEVEL,
    Prop.TIMER_DELIVER_MS,
    Prop.TIMER_DELAY_MS,
    Prop.TIMER_DELAY_SEC,
)
"""Properties that ask for a delay; stripped from whatever is stored."""

DEDUP_ENTRIES_MAX = 2_000_000
"""Re-put sources remembered at most (~200 bytes each: ~400 MB at the limit)."""
DEDUP_WINDOW_MS = 30 * 60 * 1000
"""How long a re-put source is remembered; a timer-wheel repeats a re-put within seconds."""


class DelayError(ValueError):
    """A malformed or out-of-range delay; the text says which property and why."""


def _int_property(props: Mapping[str, str], name: str) -> int:
    text = props[name]
    try:
        value = int(text)
    except ValueError:
        raise DelayError(f"{name} is {text!r}; it must be an integer") from None
    if value < 0:
        raise DelayError(f"{name} is {value}; it must be >= 0")
    return value


def delivery_ms(
    props: Mapping[str, str], *, now_ms: int, levels_ms: list[int], max_delay_ms: int
) -> int | None:
    """The delivery time ``props`` ask for, or None if the message is not delayed.

    Raises :class:`DelayError` for a level outside 1..len(levels_ms), a malformed value, more
    than one delay property, or a delay beyond ``max_delay_ms``.
    """
    asked = [name for name in DELAY_PROPERTIES if props.get(name, "")]
    if asked and asked[0] == Prop.DELAY_LEVEL and props[Prop.DELAY_LEVEL].strip() == "0":
        del asked[0]  # level 0 = not delayed
    if not asked:
        return None
    if len(asked) > 1:
        raise DelayError(f"a message may carry one delay property; this one has {', '.join(asked)}")
    name = asked[0]
    if name == Prop.DELAY_LEVEL:
        try:
            level = int(props[name])
        except ValueError:
            level = -1
        if not 1 <= level <= len(levels_ms):
            raise DelayError(
                f"delay level {props[name]!r} is outside 1..{len(levels_ms)} (this broker's "
                "messageDelayLevel; 0 = not delayed)"
            )
        out_ms = now_ms + levels_ms[level - 1]
    elif name == Prop.TIMER_DELIVER_MS:
        out_ms = _int_property(props, name)
    elif name == Prop.TIMER_DELAY_MS:
        out_ms = now_ms + _int_property(props, name)
    else:
        out_ms = now_ms + 1000 * _int_property(props, name)
    if out_ms - now_ms > max_delay_ms:
        raise DelayError(
            f"{name}={props[name]} asks for a delay of {out_ms - now_ms} ms; the limit is "
            f"timerMaxDelaySec={max_delay_ms // 1000} s"
        )
    return out_ms


def retry_level(requested_level: int, stored_reconsume_times: int, levels_total: int) -> int:
    """Delay level of a consume retry (SPEC §6.14): the request's, else 3 + the times the
    message was already reconsumed, capped at the last level (so beyond 16 retries every retry
    waits as long as the last level, 2 h by default)."""
    level = requested_level if requested_level > 0 else 3 + stored_reconsume_times
    return max(1, min(level, levels_total))


def timer_queue_id(uniq_key: str, queue_nums: int) -> int:
    """The timer-topic queue of a message: stable across processes (unlike ``hash``)."""
    return zlib.crc32(uniq_key.encode()) % queue_nums


def timer_properties(
    props: Mapping[str, str], *, real_topic: str, real_qid: int, out_ms: int
) -> dict[str, str]:
    """The properties of a message's timer-topic record (see the module docstring)."""
    out = {k: v for k, v in props.items() if k not in DELAY_PROPERTIES and k != Prop.TIMER_SOURCE}
    out[Prop.REAL_TOPIC] = real_topic
    out[Prop.REAL_QUEUE_ID] = str(real_qid)
    out[Prop.TIMER_OUT_MS] = str(out_ms)
    return out


def timer_topic_config(config: BrokerConfig) -> TopicConfig:
    n = config.timer_topic_queue_nums
    return TopicConfig(TIMER_TOPIC, n, n, TIMER_TOPIC_PERM)


def ensure_timer_topic(topics: TopicConfigManager, config: BrokerConfig) -> TopicConfig:
    """The timer topic, created with ``timerTopicQueueNums`` queues if missing."""
    cfg = topics.get(TIMER_TOPIC)
    if cfg is None:
        n = config.timer_topic_queue_nums
        cfg = topics.create_system_topic(TIMER_TOPIC, n, TIMER_TOPIC_PERM)
    return cfg


@dataclass(frozen=True, slots=True)
class StoredRePut:
    """Where the first store of a re-put went (what a repeat is answered with)."""

    stored_ms: int
    """When it was stored, in :func:`mono_ms` (monotonic) milliseconds."""
    msg_id: str
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    end_offset: int
    """Commitlog offset just past the record: a repeat waits for its flush like the first."""


def mono_ms(clock: Clock) -> int:
    """Monotonic milliseconds: the dedup window is real elapsed time, even when a test runs the
    wall clock fast (ScaledClock), so a restarted timer-wheel's repeats are still caught."""
    return int(clock.monotonic_s() * 1000)


class RePutDedup:
    """TIMER_SOURCE values stored recently: at most ``entries_max``, none older than
    ``window_ms``. Insertion order is store order, so expiry and overflow both drop from the
    front of one OrderedDict: O(1) amortized per call."""

    def __init__(
        self,
        clock: Clock,
        *,
        entries_max: int = DEDUP_ENTRIES_MAX,
        window_ms: int = DEDUP_WINDOW_MS,
    ) -> None:
        if entries_max < 1 or window_ms < 1:
            raise ValueError("entries_max and window_ms must be positive")
        self.clock = clock
        self.entries_max = entries_max
        self.window_ms = window_ms
        self._table: OrderedDict[str, StoredRePut] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def get(self, source: str) -> StoredRePut | None:
        """The first store of ``source`` if it happened within the window."""
        entry = self._table.get(source)
        if entry is None or entry.stored_ms <= mono_ms(self.clock) - self.window_ms:
            return None
        return entry

    def add(self, source: str, entry: StoredRePut) -> None:
        """Remember ``source``; drops expired entries and, when full, the oldest."""
        table = self._table
        table.pop(source, None)
        oldest_kept_ms = mono_ms(self.clock) - self.window_ms
        while table:
            first = next(iter(table.values()))
            if len(table) < self.entries_max and first.stored_ms > oldest_kept_ms:
                break
            table.popitem(last=False)
        table[source] = entry
