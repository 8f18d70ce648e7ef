"""Admin's subscription group handlers: create, update, delete (broker or cluster mode), list."""

from __future__ import annotations

from rocketq._api.rocketq.v1 import admin_pb2
from services.broker.admin_common import check_group_name, group_from_request
from services.broker.admin_fanout import ClusterFanout, StatusCode
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.subscription_group_manager import SubscriptionGroupManager


class GroupAdmin:
    """CreateSubscriptionGroup, UpdateSubscriptionGroup, DeleteSubscriptionGroup and
    ListSubscriptionGroups of one broker."""

    def __init__(
        self,
        *,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        fanout: ClusterFanout,
    ) -> None:
        self.groups = groups
        self.offsets = offsets
        self.fanout = fanout

    async def create(
        self, request: admin_pb2.CreateSubscriptionGroupRequest
    ) -> admin_pb2.CreateSubscriptionGroupResponse:
        cfg = group_from_request(request.config)
        result = self.fanout.result

        def here() -> admin_pb2.BrokerApplyResult:
            if self.groups.get(cfg.group_name) is not None:
                return result(
                    StatusCode.ALREADY_EXISTS,
                    f"subscription group {cfg.group_name} already exists",
                )
            self.groups.put(cfg)
            return result(StatusCode.OK)

        results = await self.fanout.apply(
            request.target,
            "CreateSubscriptionGroup",
            lambda t: admin_pb2.CreateSubscriptionGroupRequest(target=t, config=request.config),
            here,
        )
        return admin_pb2.CreateSubscriptionGroupResponse(results=results)

    async def update(
        self, request: admin_pb2.UpdateSubscriptionGroupRequest
    ) -> admin_pb2.UpdateSubscriptionGroupResponse:
        cfg = group_from_request(request.config)
        result = self.fanout.result

        def here() -> admin_pb2.BrokerApplyResult:
            if self.groups.get(cfg.group_name) is None:
                return result(
                    StatusCode.NOT_FOUND,
                    f"subscription group {cfg.group_name} does not exist here",
                )
            self.groups.put(cfg)
            return result(StatusCode.OK)

        results = await self.fanout.apply(
            request.target,
            "UpdateSubscriptionGroup",
            lambda t: admin_pb2.UpdateSubscriptionGroupRequest(target=t, config=request.config),
            here,
        )
        return admin_pb2.UpdateSubscriptionGroupResponse(results=results)

    async def delete(
        self, request: admin_pb2.DeleteSubscriptionGroupRequest
    ) -> admin_pb2.DeleteSubscriptionGroupResponse:
        group = request.group_name
        check_group_name(group)
        result = self.fanout.result

        def here() -> admin_pb2.BrokerApplyResult:
            if not self.groups.delete(group):
                return result(
                    StatusCode.NOT_FOUND, f"subscription group {group} does not exist here"
                )
            if request.clean_offsets:
                self.offsets.remove_group(group)
                self.offsets.persist()
            return result(StatusCode.OK)

        results = await self.fanout.apply(
            request.target,
            "DeleteSubscriptionGroup",
            lambda t: admin_pb2.DeleteSubscriptionGroupRequest(
                target=t, group_name=group, clean_offsets=request.clean_offsets
            ),
            here,
        )
        return admin_pb2.DeleteSubscriptionGroupResponse(results=results)

    def list(
        self, request: admin_pb2.ListSubscriptionGroupsRequest
    ) -> admin_pb2.ListSubscriptionGroupsResponse:
        return admin_pb2.ListSubscriptionGroupsResponse(
            groups=[g.to_pb() for g in self.groups.all()]
        )
