"""What a Send is told when the store refuses an append (send_processor.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import grpc

from rocketq._api.rocketq.v1 import common_pb2
from services.common.errors import ServiceError
from services.store.message_store import StoreClosedError, StoreFullError

log = logging.getLogger(__name__)
R = TypeVar("R")


def store_call(append: Callable[[], R], topic: str) -> R:
    """A store append with store exceptions turned into ServiceError."""
    try:
        return append()
    except Exception as exc:
        raise service_error(exc, topic) from None


def service_error(exc: BaseException, topic: str) -> ServiceError:
    """What the caller is told when the store refuses an append."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, StoreFullError):
        return ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, common_pb2.DISK_FULL, str(exc), topic=topic
        )
    if isinstance(exc, StoreClosedError):
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE, common_pb2.SERVICE_NOT_AVAILABLE, str(exc), topic=topic
        )
    if isinstance(exc, ValueError):  # MessageTooLarge: a record larger than a commitlog file
        return ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT, common_pb2.MESSAGE_TOO_LARGE, str(exc), topic=topic
        )
    log.error("store append failed", exc_info=exc)
    return ServiceError(
        grpc.StatusCode.INTERNAL,
        common_pb2.ERROR_REASON_UNSPECIFIED,
        f"store append failed: {type(exc).__name__}: {exc}",
    )
