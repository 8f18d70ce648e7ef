"""Server commands to official-SDK clients: PrintThreadStackTraceCommand, VerifyMessageCommand.

The Admin RPC ``AskGatewayClient`` (and ``rocketq gateway ask``) names a client by its
x-mq-client-id; the command goes down that client's Telemetry stream with a fresh nonce and the
first reply carrying the nonce is the answer. What the SDKs do (their sources): Java answers a
stack trace with OK and verifies a message by consuming it (OK or FAILED_TO_CONSUME_MESSAGE);
C# answers both UNSUPPORTED; Node answers the stack with a placeholder and verify with
NOT_IMPLEMENTED (in a ``verify_message_command`` frame instead of a result: accepted too); the
Python SDK 5.1.2 does not answer at all, so every ask has a timeout and says when nothing came.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway.v2common import message_of
from services.broker.query_processor import QueryProcessor, record_to_pb
from services.common.errors import ServiceError

if TYPE_CHECKING:
    from services.broker.gateway.telemetry import TelemetrySession

ASK_TIMEOUT_DEFAULT_MS = 5_000
ASK_TIMEOUT_MAX_MS = 60_000
PENDING_PER_CLIENT_MAX = 16
CLIENTS_LISTED_MAX = 20
MSG_ID_MAX_CHARS = 128
ID_SCAN_MAX = 64


class ClientCommands:
    """Connected clients' Telemetry sessions by x-mq-client-id, and the asks to them."""

    def __init__(self, queries: QueryProcessor) -> None:
        self.queries = queries
        self.sessions: dict[str, TelemetrySession] = {}

    def join(self, client_id: str, session: TelemetrySession) -> None:
        if client_id:
            self.sessions[client_id] = session

    def leave(self, client_id: str, session: TelemetrySession) -> None:
        if self.sessions.get(client_id) is session:
            del self.sessions[client_id]

    async def ask(self, req: admin_pb2.AskGatewayClientRequest) -> Any:
        timeout_ms = req.timeout_ms or ASK_TIMEOUT_DEFAULT_MS
        if not 1 <= timeout_ms <= ASK_TIMEOUT_MAX_MS:
            _refuse(grpc.StatusCode.INVALID_ARGUMENT, f"timeout_ms {req.timeout_ms}: 1..60000")
        session = self.sessions.get(req.client_id)
        if session is None:
            known = ", ".join(sorted(self.sessions)[:CLIENTS_LISTED_MAX]) or "none"
            _refuse(
                grpc.StatusCode.NOT_FOUND,
                f"no client {req.client_id[:200]!r} holds a Telemetry stream with this gateway; "
                f"connected: {known}",
            )
        if len(session.pending) >= PENDING_PER_CLIENT_MAX:
            _refuse(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{PENDING_PER_CLIENT_MAX} asks to client {req.client_id} are still unanswered",
            )
        nonce = uuid.uuid4().hex
        command = self._command(req, nonce)
        reply = await session.ask(nonce, command, timeout_ms / 1000)
        out = admin_pb2.AskGatewayClientResponse(nonce=nonce)
        if reply is not None:
            out.answered = True
            out.code = reply.status.code
            out.message = reply.status.message
            out.thread_stack_trace = reply.thread_stack_trace.thread_stack_trace
        return out

    def _command(self, req: admin_pb2.AskGatewayClientRequest, nonce: str) -> Any:
        if req.ask == admin_pb2.THREAD_STACK_TRACE:
            return svc.TelemetryCommand(
                print_thread_stack_trace_command=svc.PrintThreadStackTraceCommand(nonce=nonce)
            )
        if req.ask == admin_pb2.VERIFY_MESSAGE:
            message = message_of(self._stored(req.topic, req.msg_id), _resource(req.topic))
            return svc.TelemetryCommand(
                verify_message_command=svc.VerifyMessageCommand(nonce=nonce, message=message)
            )
        _refuse(grpc.StatusCode.INVALID_ARGUMENT, "ask THREAD_STACK_TRACE or VERIFY_MESSAGE")

    def _stored(self, topic: str, msg_id: str) -> common_pb2.StoredMessage:
        """The newest message of ``topic`` with unique id ``msg_id`` (any length: the official
        SDKs' ids are 34 hex characters, RocketQ's 32), from the store's index."""
        if not 1 <= len(msg_id) <= MSG_ID_MAX_CHARS or not msg_id.isalnum():
            _refuse(grpc.StatusCode.INVALID_ARGUMENT, f"message id {msg_id[:80]!r} is not an id")
        if self.queries.topics.get(topic) is None:
            _refuse(grpc.StatusCode.NOT_FOUND, f"topic {topic[:200]!r} does not exist")
        now = self.queries.clock.now_ms()
        wanted = msg_id.upper()
        for key in dict.fromkeys((msg_id, wanted)):
            records = self.queries.store.query_by_key(topic, key, ID_SCAN_MAX, 0, now)
            matches = [r for r in records if r.uniq_key.upper() == wanted]
            if matches:
                newest = max(matches, key=lambda r: r.store_timestamp_ms)
                return record_to_pb(newest)
        _refuse(
            grpc.StatusCode.NOT_FOUND,
            f"no message with id {msg_id} in topic {topic} (expired, or messageIndexEnable off)",
        )


def _resource(topic: str) -> Any:
    """``ns%name`` back to the v2 resource the client knows (namespace and name)."""
    ns, sep, name = topic.partition("%")
    if not sep or not ns:  # no namespace (a %RETRY% topic starts with the separator)
        return v2.Resource(name=topic)
    return v2.Resource(resource_namespace=ns, name=name)


def _refuse(code: grpc.StatusCode, message: str) -> NoReturn:
    raise ServiceError(code, common_pb2.ERROR_REASON_UNSPECIFIED, message)
