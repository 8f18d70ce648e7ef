"""The SDK's error types: one per kind of failure, each with a message a person can act on.

Every failed call raises a subclass of :class:`RocketQError`. Server refusals keep the server's
reason and metadata (from the ``rocketq.v1.ErrorDetail`` in the status details), and say which
broker or nameserver answered. ``retriable`` tells the producer's retry loop whether another
attempt (on another broker) can help.

| error                        | when                                                       |
|------------------------------|------------------------------------------------------------|
| InvalidArgumentError         | bad topic/group name, body, property, expression, count    |
| MessageTooLargeError         | a message or batch over 4 MiB (an InvalidArgumentError)    |
| TopicNotFoundError           | no route for the topic, or the broker does not host it     |
| GroupNotFoundError           | unknown subscription group and auto-create is off          |
| MessageNotFoundError         | a query or send-back names a message that is not stored    |
| NotFoundError                | other NOT_FOUND answers                                    |
| PermissionDeniedError        | topic/broker perm forbids it, or ACL                       |
| ResourceExhaustedError       | broker flow control or a full disk                         |
| BrokerUnavailableError       | broker down, starting, or a slave asked to write           |
| NameServerUnavailableError   | no nameserver answered                                     |
| RequestTimeoutError          | no answer within the timeout (e.g. sendMsgTimeout 3 s)     |
| FailedPreconditionError      | the server needs something first (e.g. a heartbeat)        |
| SubscriptionInconsistentError| the group's members subscribe to the topic differently;    |
|                              | pulls resume once they agree (a FailedPreconditionError)   |
| AlreadyExistsError           | creating something that exists                             |
| ClientStateError             | the producer/consumer is not started, or already closed    |
| ServerError                  | the server failed unexpectedly (INTERNAL/UNKNOWN)          |
"""

from __future__ import annotations

import grpc
from grpc_status import rpc_status

from rocketq._api.rocketq.v1 import common_pb2
from rocketq.client.security import transport_hint


class RocketQError(Exception):
    """Base of every RocketQ SDK error."""

    retriable = False

    def __init__(
        self,
        message: str,
        *,
        code: str = "",
        reason: str = "",
        metadata: dict[str, str] | None = None,
        target: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        """gRPC status code name ("NOT_FOUND"), empty for client-side errors."""
        self.reason = reason
        """RocketQ ErrorReason name ("TOPIC_NOT_EXIST"), empty when the server gave none."""
        self.metadata = metadata or {}
        self.target = target
        """Address of the server that answered, when there was one."""


class InvalidArgumentError(RocketQError, ValueError):
    pass


class MessageTooLargeError(InvalidArgumentError):
    pass


class NotFoundError(RocketQError):
    pass


class TopicNotFoundError(NotFoundError):
    retriable = True  # the route may appear (auto-create, another broker)


class GroupNotFoundError(NotFoundError):
    pass


class MessageNotFoundError(NotFoundError):
    pass


class PermissionDeniedError(RocketQError):
    retriable = True  # a broker being drained turns perm off; others may accept (SPEC §2.4)


class ResourceExhaustedError(RocketQError):
    retriable = True


class BrokerUnavailableError(RocketQError):
    retriable = True


class NameServerUnavailableError(RocketQError):
    retriable = True


class RequestTimeoutError(RocketQError, TimeoutError):
    retriable = True


class FailedPreconditionError(RocketQError):
    pass


class SubscriptionInconsistentError(FailedPreconditionError):
    """The broker refuses a pull because the consumer group's live members subscribe to the
    topic differently (SPEC §6.17, strictSubscriptionConsistency). ``metadata`` has
    ``consumer_group``, ``topic`` and ``members`` (each expression and who holds it). Nothing is
    lost: pulls succeed again once every member subscribes the same way."""


class AlreadyExistsError(RocketQError):
    pass


class ClientStateError(RocketQError):
    pass


class ServerError(RocketQError):
    retriable = True


_BY_REASON: dict[int, type[RocketQError]] = {
    common_pb2.TOPIC_NOT_EXIST: TopicNotFoundError,
    common_pb2.SUBSCRIPTION_GROUP_NOT_EXIST: GroupNotFoundError,
    common_pb2.MESSAGE_NOT_FOUND: MessageNotFoundError,
    common_pb2.MESSAGE_TOO_LARGE: MessageTooLargeError,
    common_pb2.SUBSCRIPTION_INCONSISTENT: SubscriptionInconsistentError,
}

_BY_CODE: dict[grpc.StatusCode, type[RocketQError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimeoutError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.CANCELLED: BrokerUnavailableError,
}


def detail_of(err: grpc.RpcError) -> common_pb2.ErrorDetail | None:
    """The ErrorDetail a RocketQ server packed into the status, if any."""
    try:
        status = rpc_status.from_call(err)
    except (ValueError, AttributeError, TypeError):
        return None
    if status is None:
        return None
    for packed in status.details:
        detail = common_pb2.ErrorDetail()
        if packed.Unpack(detail):
            return detail
    return None


def from_rpc_error(err: grpc.RpcError, target: str = "") -> RocketQError:
    """Translate a failed gRPC call into the matching SDK error."""
    code: grpc.StatusCode = err.code()
    return from_status(code, err.details() or code.name, detail_of(err), target)


_CODE_OF_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """The gRPC status code of its number on the wire (UNKNOWN for a number it is not)."""
    return _CODE_OF_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


def from_status(
    code: grpc.StatusCode,
    text: str,
    detail: common_pb2.ErrorDetail | None,
    target: str = "",
) -> RocketQError:
    """:func:`from_rpc_error` of a status known by its parts (code, message, the packed
    ErrorDetail): a status carried in a response rather than ending a call (SendStream)."""
    reason = ""
    metadata: dict[str, str] = {}
    cls = _BY_CODE.get(code, ServerError)
    if detail is not None:
        reason = common_pb2.ErrorReason.Name(detail.reason)
        metadata = dict(detail.metadata)
        cls = _BY_REASON.get(detail.reason, cls)
        if detail.reason in (common_pb2.NOT_MASTER, common_pb2.SERVICE_NOT_AVAILABLE):
            cls = BrokerUnavailableError
    where = f" (from {target})" if target else ""
    if code == grpc.StatusCode.UNAVAILABLE and detail is None:
        text = f"cannot reach {target or 'the server'}: {text}{transport_hint(text)}"
        where = ""
    return cls(f"{text}{where}", code=code.name, reason=reason, metadata=metadata, target=target)
