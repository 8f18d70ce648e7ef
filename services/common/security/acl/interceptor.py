"""The server interceptor of access control, and the audit log.

Per call: find the method's :class:`~.rules.Rule`; unless it is open, authenticate the
``authorization`` header (UNAUTHENTICATED with the reason), then check the role or the
permissions on the topics and groups the request names (PERMISSION_DENIED naming the user,
the resource and the permission). Resource checks need the decoded request, so they run in a
wrapper around the handler, like services.common.rpc_guard's.

Audit (structlog logger ``rocketq.audit``): every refused call, and every call of an ``admin``
method, with access key, method, peer and resource. Refusals are logged at most
:data:`AUDIT_REFUSALS_PER_S` a second (a flood of bad requests must not flood the disk); the
number left out is logged with the next line.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog

from rocketq._api.rocketq.v1 import common_pb2
from rocketq.client.security import AUTHORIZATION_HEADER, DATE_HEADER
from services.common.errors import ServiceError
from services.common.rpc_guard import _responses
from services.common.security.acl.auth import AuthError, authenticate
from services.common.security.acl.model import User
from services.common.security.acl.rules import Rule, rule_for
from services.common.security.acl.store import AclStore

audit = structlog.get_logger("rocketq.audit")

AUDIT_REFUSALS_PER_S = 50
VERIFIED_CACHE_MAX = 4096
"""Verified (authorization, date) pairs kept: one per client per second in use."""
_ROLE_RANK = {"user": 0, "admin": 1, "internal": 2}


class AclGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, store: AclStore, service: str) -> None:
        self.store = store
        self.service = service
        self._window_s = 0
        self._refusals_in_window = 0
        self._dropped = 0
        self._cache: dict[tuple[str, str], User] = {}
        self._cache_users: object = None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = str(details.method)
        rule = rule_for(method)
        if handler is None or rule.role == "open":
            return handler
        metadata = {k: v for k, v in (details.invocation_metadata or ()) if isinstance(v, str)}
        try:
            user: User | None = self._authenticated(metadata)
            refusal: ServiceError | None = None
        except AuthError as exc:
            user = None
            refusal = ServiceError(
                grpc.StatusCode.UNAUTHENTICATED, common_pb2.NO_PERMISSION,
                f"{method}: {exc}",
            )  # fmt: skip
        if user is not None:
            refusal = self._role_refusal(user, rule, method)
        return self._wrap(handler, method, rule, user, refusal)

    def _authenticated(self, metadata: dict[str, str]) -> User:
        """The request's user; a signature already verified is looked up, not recomputed
        (clients sign once a second, so nearly every call is a hit). The cache starts over when
        the ACL file is reloaded and when it is full."""
        users = self.store.users()
        if users is not self._cache_users:
            self._cache.clear()
            self._cache_users = users
        key = (metadata.get(AUTHORIZATION_HEADER, ""), metadata.get(DATE_HEADER, ""))
        user = self._cache.get(key)
        if user is None:
            user = authenticate(metadata, users)
            if len(self._cache) >= VERIFIED_CACHE_MAX:
                self._cache.clear()
            self._cache[key] = user
        return user

    def _role_refusal(self, user: User, rule: Rule, method: str) -> ServiceError | None:
        if rule.role in ("admin", "internal") and _ROLE_RANK[user.role] < _ROLE_RANK[rule.role]:
            return _denied(f"user {user.access_key!r} may not call {method}: it needs the "
                           f"{rule.role} role")  # fmt: skip
        return None

    def _resource_refusal(
        self, user: User, rule: Rule, method: str, request: Any
    ) -> ServiceError | None:
        if rule.needs is None or user.role != "user" or not hasattr(request, "ListFields"):
            return None
        for kind, name, need in rule.needs(request):
            perm, resource = user.topic_perm(name) if kind == "topic" else user.group_perm(name)
            if need not in perm:
                return _denied(
                    f"user {user.access_key!r} has no {need.name} permission on {resource} "
                    f"({method}); grant it with `rocketq acl grant`"
                )
        return None

    def _wrap(
        self, handler: Any, method: str, rule: Rule, user: User | None, refusal: ServiceError | None
    ) -> Any:
        peer_ak = user.access_key if user else ""

        async def check(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            """None to go on, else what the refused call answers (see :meth:`_refuse`)."""
            error = refusal
            if error is None and user is not None:
                error = self._resource_refusal(user, rule, method, request)
            if error is not None:
                self._audit_refusal(method, peer_ak, context.peer(), error)
                return await self._refuse(method, error, context)
            if rule.role in ("admin",):
                audit.info("admin call", method=method, access_key=peer_ak, peer=context.peer())
            return None

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                answer = await check(request, context)
                return answer if answer is not None else await inner(request, context)

            return handler._replace(unary_unary=unary)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                answer = await check(request, context)
                if answer is not None:
                    yield answer
                    return
                async for item in _responses(inner_us(request, context)):
                    yield item

            return handler._replace(unary_stream=unary_stream)
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            async def stream_unary(requests: Any, context: Any) -> Any:
                answer = await check(None, context)
                return answer if answer is not None else await inner_su(requests, context)

            return handler._replace(stream_unary=stream_unary)
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream

            async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
                answer = await check(None, context)
                if answer is not None:
                    yield answer
                    return
                async for item in _responses(inner_ss(requests, context)):
                    yield item

            return handler._replace(stream_stream=stream_stream)
        return handler

    async def _refuse(
        self, method: str, error: ServiceError, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        """End a refused call: here with the gRPC status (UNAUTHENTICATED, PERMISSION_DENIED).
        A protocol that answers refusals in its responses (apache.rocketmq.v2's Status) returns
        the response to send instead."""
        await context.abort_with_status(error.to_status())

    def _audit_refusal(self, method: str, ak: str, peer: str, error: ServiceError) -> None:
        now_s = int(time.monotonic())
        if now_s != self._window_s:
            self._window_s, self._refusals_in_window = now_s, 0
        self._refusals_in_window += 1
        if self._refusals_in_window > AUDIT_REFUSALS_PER_S:
            self._dropped += 1
            return
        dropped, self._dropped = self._dropped, 0
        audit.warning(
            "refused", method=method, access_key=ak, peer=peer, code=error.code.name,
            reason=error.message, not_logged_before=dropped, service=self.service,
        )  # fmt: skip


def _denied(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.PERMISSION_DENIED, common_pb2.NO_PERMISSION, message)
