"""Access control on the v2 gateway: the official SDKs' signatures against RocketQ's ACL.

The SDKs sign every request as RocketQ's own SDK does (``authorization: MQv2-HMAC-SHA1
Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(sk, x-mq-date-time)>``;
the Python SDK in lower-case hex, Node in upper-case), so the broker port's guard
(services/common/security/acl) checks them with the same users and the same rules
(acl/rules.py lists the v2 methods: a topic's PUB to send, the group's and topic's SUB to
receive, ack, pull and move offsets).

What differs is how a refusal is said: the v2 protocol answers in its own ``Status``, so a
refused call gets its method's response with UNAUTHORIZED (40100: no, unknown or wrongly signed
credentials) or FORBIDDEN (40300: the user lacks the permission), the reason in the message, as
Apache's proxy answers. Streams (ReceiveMessage, PullMessage, Telemetry) get that one response,
then end.
"""

from __future__ import annotations

from typing import Any

import grpc

from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway.v2common import status
from services.common.errors import ServiceError
from services.common.security.acl.interceptor import AclGuard
from services.common.security.acl.store import AclStore

SERVICE = svc.DESCRIPTOR.services_by_name["MessagingService"]
_RESPONSES = {
    f"/{SERVICE.full_name}/{m.name}": getattr(svc, m.output_type.name) for m in SERVICE.methods
}
_CODES = {
    grpc.StatusCode.UNAUTHENTICATED: v2.UNAUTHORIZED,
    grpc.StatusCode.PERMISSION_DENIED: v2.FORBIDDEN,
}


class GatewayAclGuard(AclGuard):
    """The broker port's access control, answering refusals in v2 responses."""

    def __init__(self, store: AclStore) -> None:
        super().__init__(store, "gateway")

    async def _refuse(
        self, method: str, error: ServiceError, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        response = _RESPONSES.get(method)
        code = _CODES.get(error.code)
        if response is None or code is None:  # health, reflection: not the v2 protocol
            return await super()._refuse(method, error, context)
        return response(status=status(code, error.message))
