"""Auto-renew: the gateway keeps a push consumer's messages invisible while its listener runs.

RocketMQ 5's push consumers receive with ``auto_renew`` and no invisible duration; the server
hides each message for ``gatewayAutoRenewInvisibleMs`` (60 s) and renews that time, as Apache's
proxy does, until the consumer acks the message, changes its invisible duration, forwards it to
the DLQ, or goes away. The SDK keeps using the receipt handle it received; every renewal makes a
new one (ChangeInvisibleTime), so the table maps the first handle to the current one and the
gateway translates before it acks.

Renewal stops when the client's last Heartbeat (every 10 s) or receive is older than
``CLIENT_SILENT_MS`` (its messages then come back after their invisible time, to whoever asks),
after ``RENEW_MAX_MS`` (3 h, Apache's default), or when a renewal is refused (the message was
redelivered meanwhile). At most ``ENTRIES_MAX`` messages are renewed at once; beyond, a message
is simply not renewed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from rocketq._api.rocketq.v1 import messaging_pb2
from services.broker.pop.processor import PopProcessor
from services.common.clock import SYSTEM_CLOCK, Clock
from services.common.errors import ServiceError

log = logging.getLogger(__name__)

ENTRIES_MAX = 100_000
RENEW_MAX_MS = 3 * 3600 * 1000
CLIENT_SILENT_MS = 30_000
TICK_MS_MAX = 1_000


@dataclass(slots=True)
class Renewed:
    client_id: str
    group: str
    topic: str
    handle: str
    """The current receipt handle (the latest renewal's)."""
    renew_at_ms: int
    started_ms: int


class RenewTable:
    """First receipt handle → what to renew, and the loop that renews."""

    def __init__(self, pops: PopProcessor, invisible_ms: int, clock: Clock = SYSTEM_CLOCK) -> None:
        self.pops = pops
        self.invisible_ms = invisible_ms
        self.clock = clock
        self.entries: dict[str, Renewed] = {}
        self.last_seen_ms: dict[str, int] = {}
        self.renewals = 0
        self.lock = asyncio.Lock()
        """Held around each renewal and each take: a handle never changes under an ack."""

    def seen(self, client_id: str) -> None:
        """The client is alive (a Heartbeat or a receive)."""
        self.last_seen_ms[client_id] = self.clock.now_ms()

    def gone(self, client_id: str) -> None:
        """NotifyClientTermination: stop renewing its messages."""
        self.last_seen_ms.pop(client_id, None)
        for key in [k for k, e in self.entries.items() if e.client_id == client_id]:
            del self.entries[key]

    def add(self, client_id: str, group: str, topic: str, handle: str) -> None:
        if len(self.entries) >= ENTRIES_MAX:
            return
        now = self.clock.now_ms()
        self.seen(client_id)
        self.entries[handle] = Renewed(
            client_id, group, topic, handle, now + self.invisible_ms // 2, now
        )

    async def take(self, handle: str) -> str:
        """The current handle for ``handle``, which the client is done with (ack, change,
        forward): no longer renewed. Waits for a renewal of it in flight, whose new handle it
        returns (the old one is stale once that renewal is stored)."""
        async with self.lock:
            entry = self.entries.pop(handle, None)
        return entry.handle if entry is not None else handle

    async def run(self) -> None:
        while True:
            await asyncio.sleep(min(self.invisible_ms // 4, TICK_MS_MAX) / 1000)
            try:
                await self.renew_due()
            except Exception:  # the loop must outlive any one bad round
                log.exception("auto-renew round failed")

    async def renew_due(self) -> int:
        now = self.clock.now_ms()
        renewed = 0
        for key, entry in list(self.entries.items()):
            if entry.renew_at_ms > now:
                continue
            silent = now - self.last_seen_ms.get(entry.client_id, 0) > CLIENT_SILENT_MS
            if silent or now - entry.started_ms > RENEW_MAX_MS:
                self.entries.pop(key, None)
                continue
            async with self.lock:
                if self.entries.get(key) is not entry:
                    continue  # taken meanwhile
                try:
                    out = await self.pops.change_invisible_time(
                        messaging_pb2.ChangeInvisibleTimeRequest(
                            consumer_group=entry.group,
                            topic=entry.topic,
                            receipt_handle=entry.handle,
                            invisible_time_ms=self.invisible_ms,
                        )
                    )
                except ServiceError as exc:  # redelivered meanwhile, or a slave now
                    log.debug("auto-renew of %s stopped: %s", key, exc.message)
                    self.entries.pop(key, None)
                    continue
                entry.handle = out.receipt_handle
                entry.renew_at_ms = now + self.invisible_ms // 2
                renewed += 1
        self.renewals += renewed
        return renewed
