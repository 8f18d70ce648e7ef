"""One official SDK's Telemetry stream: the settings handshake and transaction check-backs.

Each Settings the client writes is answered with its settings completed by the server's
(``GatewayService._settings``). A producer's stream also joins the broker's client registry as
the producer group every gateway message is sent under (``rmq_v2_gateway``), under the client id
``v2:{x-mq-client-id}``: the transaction check service then picks it like any RocketQ producer,
and its ``CheckTransactionState`` goes down this stream as a
``RecoverOrphanedTransactionCommand``; the SDK asks its checker and answers with
EndTransaction(SOURCE_SERVER_CHECK). The registration is kept alive by the SDK's Heartbeat calls
(every 10 s) and ends with the stream.

Every stream also joins the gateway's :class:`~.commands.ClientCommands` under its
x-mq-client-id, so an admin can ask the client for its thread stacks or to verify a message
(``ask``: the command goes down the stream; the reply with its nonce is the answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from rocketq._api.rocketq.v1 import messaging_pb2
from services.broker.client_manager import ClientChannel, ClientLimitError, ClientManager
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc

if TYPE_CHECKING:
    from services.broker.gateway.commands import ClientCommands

log = logging.getLogger(__name__)

CLIENT_ID_PREFIX = "v2:"
REPLY_FIELDS = ("thread_stack_trace", "verify_message_result", "verify_message_command")
"""Frames that answer a server command by its nonce (the last: Node's answer to verify)."""
CLIENT_ID_MAX_CHARS = 200
OUT_QUEUE_MAX = 256
SETTINGS_REPEAT_S = 1.0
"""The first settings reply of a stream is written again this much later: the Node SDK 1.0.8
loses a reply that arrives before its startup() is waiting for one (a client of several topics
opens the stream while it still fetches routes), and then waits forever."""


def client_id_of(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The SDK's x-mq-client-id header as a registry id, or "" when it sent none."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id" and isinstance(value, str) and value:
            return f"{CLIENT_ID_PREFIX}{value[:CLIENT_ID_MAX_CHARS]}"
    return ""


class TelemetrySession:
    """Reads the client's commands and writes settings replies and check-backs."""

    def __init__(
        self,
        *,
        clients: ClientManager,
        producer_group: str,
        settings: Callable[[Any], Any],
        check_command: Callable[[messaging_pb2.CheckTransactionState], Any],
        client_id: str,
        peer: str,
        commands: ClientCommands | None = None,
    ) -> None:
        self.clients = clients
        self.producer_group = producer_group
        self.settings = settings
        self.check_command = check_command
        self.client_id = client_id
        self.peer = peer
        self.out: asyncio.Queue[Any] = asyncio.Queue(maxsize=OUT_QUEUE_MAX)
        self.channel: ClientChannel | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.commands = commands
        self.pending: dict[str, asyncio.Future[Any]] = {}
        """Server commands awaiting the client's reply, by nonce."""
        self.repeated = False

    async def ask(self, nonce: str, command: Any, timeout_s: float) -> Any:
        """Send a server command and wait for the reply with its nonce; None if none came."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[nonce] = reply
        try:
            await asyncio.wait_for(self.out.put(command), timeout_s)
            return await asyncio.wait_for(reply, timeout_s)
        except TimeoutError:
            return None
        finally:
            self.pending.pop(nonce, None)

    def _answered(self, command: Any) -> bool:
        """Whether ``command`` replies to a server command (then it is handed to its asker)."""
        kind = command.WhichOneof("command")
        if kind not in REPLY_FIELDS:
            return False
        reply = self.pending.get(getattr(command, kind).nonce)
        if reply is not None and not reply.done():
            reply.set_result(command)
        return True

    async def run(self, commands: AsyncIterator[Any]) -> AsyncIterator[Any]:
        self.tasks.append(asyncio.create_task(self._read(commands)))
        raw_id = self.client_id.removeprefix(CLIENT_ID_PREFIX)
        if self.commands is not None:
            self.commands.join(raw_id, self)
        try:
            while True:
                item = await self.out.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if self.commands is not None:
                self.commands.leave(raw_id, self)
            for task in self.tasks:
                task.cancel()
            for task in self.tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self.channel is not None:
                self.clients.close_channel(self.channel, "telemetry stream ended")

    async def _read(self, commands: AsyncIterator[Any]) -> None:
        try:
            async for command in commands:
                if self._answered(command) or not command.HasField("settings"):
                    continue
                settings = command.settings
                if settings.client_type == v2.PRODUCER:
                    self._join_as_producer()
                reply = svc.TelemetryCommand(
                    status=v2.Status(code=v2.OK, message="OK"),
                    settings=self.settings(settings),
                )
                await self.out.put(reply)
                if not self.repeated:  # see SETTINGS_REPEAT_S
                    self.repeated = True
                    self.tasks.append(asyncio.create_task(self._repeat(reply)))
            await self.out.put(None)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the writer: the stream ends with its status
            await self.out.put(exc)

    async def _repeat(self, reply: Any) -> None:
        await asyncio.sleep(SETTINGS_REPEAT_S)
        await self.out.put(reply)

    def _join_as_producer(self) -> None:
        if self.channel is not None or not self.client_id:
            return
        try:
            channel = self.clients.open_channel(self.client_id, self.peer)
        except ClientLimitError as exc:
            log.warning("v2 producer %s not registered for checks: %s", self.client_id, exc)
            return
        self.channel = channel
        heartbeat(self.clients, channel, self.producer_group)
        self.tasks.append(asyncio.create_task(self._forward(channel)))

    async def _forward(self, channel: ClientChannel) -> None:
        """Check-backs from the broker's registry, as the protocol's server commands."""
        while True:
            item = await channel.queue.get()
            if item is None or channel.closed:
                return
            if item.WhichOneof("command") == "check_transaction_state":
                await self.out.put(self.check_command(item.check_transaction_state))


def heartbeat(clients: ClientManager, channel: ClientChannel, producer_group: str) -> None:
    clients.heartbeat(
        channel,
        messaging_pb2.Heartbeat(
            client_id=channel.client_id,
            producers=[messaging_pb2.ProducerData(producer_group=producer_group)],
        ),
    )
