"""The NameServer gRPC servicer: protobuf in, :class:`RouteTable` call, protobuf out.

All state and all rules live in :mod:`services.nameserver.route_table`; this layer only maps
the five RPCs of ``nameserver.proto`` onto it and turns a missing route into NOT_FOUND with
reason TOPIC_NOT_EXIST, the answer a producer uses to fall back to the TBW102 template
(SPEC §4.3). Errors leave through :func:`services.common.errors.rpc`, so a bad request gets
INVALID_ARGUMENT with an ErrorDetail and an unexpected bug gets INTERNAL without stopping the
server. Method names are the proto's (gRPC dispatches on them), hence the ``N802`` waivers.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from rocketq._api.rocketq.v1 import common_pb2, nameserver_pb2, nameserver_pb2_grpc
from services.common.errors import not_found, rpc
from services.nameserver.route_table import RouteTable, log_removed

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class NameServerService(nameserver_pb2_grpc.NameServerServicer):
    """Serves one :class:`RouteTable` (all calls run on the server's event loop)."""

    def __init__(self, table: RouteTable) -> None:
        self.table = table

    @rpc
    async def RegisterBroker(  # noqa: N802 - the proto's method name
        self, request: nameserver_pb2.RegisterBrokerRequest, context: Context
    ) -> nameserver_pb2.RegisterBrokerResponse:
        master_addr, ha_server_addr = self.table.register(request)
        return nameserver_pb2.RegisterBrokerResponse(
            master_addr=master_addr, ha_server_addr=ha_server_addr
        )

    @rpc
    async def UnregisterBroker(  # noqa: N802 - the proto's method name
        self, request: nameserver_pb2.UnregisterBrokerRequest, context: Context
    ) -> nameserver_pb2.UnregisterBrokerResponse:
        removed = self.table.unregister(request)
        if removed is not None:
            log_removed(removed)
        return nameserver_pb2.UnregisterBrokerResponse()

    @rpc
    async def GetRouteInfoByTopic(  # noqa: N802 - the proto's method name
        self, request: nameserver_pb2.GetRouteInfoByTopicRequest, context: Context
    ) -> nameserver_pb2.GetRouteInfoByTopicResponse:
        route = self.table.route(request.topic)
        if route is None:
            not_found(
                common_pb2.TOPIC_NOT_EXIST,
                f"no live broker hosts topic {request.topic!r}; create it, or check that its "
                "brokers are running and registered with this nameserver",
                topic=request.topic,
            )
        return nameserver_pb2.GetRouteInfoByTopicResponse(route=route)

    @rpc
    async def GetClusterInfo(  # noqa: N802 - the proto's method name
        self, request: nameserver_pb2.GetClusterInfoRequest, context: Context
    ) -> nameserver_pb2.GetClusterInfoResponse:
        return self.table.cluster_info()

    @rpc
    async def GetAllTopics(  # noqa: N802 - the proto's method name
        self, request: nameserver_pb2.GetAllTopicsRequest, context: Context
    ) -> nameserver_pb2.GetAllTopicsResponse:
        return nameserver_pb2.GetAllTopicsResponse(
            topics=self.table.all_topics(request.cluster_name)
        )
