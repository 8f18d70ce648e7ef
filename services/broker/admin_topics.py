"""Admin's topic handlers: create, update, delete (broker or cluster mode), list, describe.

Deleting a topic drops its consume queues and the consumer offsets on it at once; its
commitlog bytes age out with retention like any others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from services.broker.admin_common import check_topic_name, store_time, topic_from_request
from services.broker.admin_fanout import ClusterFanout, StatusCode
from services.broker.config import BrokerConfig
from services.broker.consumer_offset_manager import ConsumerOffsetManager
from services.broker.topic_config_manager import TopicConfigManager
from services.common.errors import not_found
from services.store.message_store import MessageStore

log = logging.getLogger(__name__)


class TopicAdmin:
    """CreateTopic, UpdateTopic, DeleteTopic, ListTopics and DescribeTopic of one broker."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        fanout: ClusterFanout,
        registrar_trigger: Callable[[], None],
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.fanout = fanout
        self.registrar_trigger = registrar_trigger

    def _topics_changed(self) -> None:
        """Tell the nameservers now (the server usually hooks the registrar on topics too)."""
        if self.registrar_trigger not in self.topics.on_change:
            self.registrar_trigger()

    async def create(self, request: admin_pb2.CreateTopicRequest) -> admin_pb2.CreateTopicResponse:
        cfg = topic_from_request(request.config)
        result = self.fanout.result

        def here() -> admin_pb2.BrokerApplyResult:
            if self.topics.get(cfg.topic_name) is not None:
                return result(StatusCode.ALREADY_EXISTS, f"topic {cfg.topic_name} already exists")
            self.topics.put(cfg)
            self._topics_changed()
            return result(StatusCode.OK)

        results = await self.fanout.apply(
            request.target,
            "CreateTopic",
            lambda t: admin_pb2.CreateTopicRequest(target=t, config=request.config),
            here,
        )
        return admin_pb2.CreateTopicResponse(results=results)

    async def update(self, request: admin_pb2.UpdateTopicRequest) -> admin_pb2.UpdateTopicResponse:
        cfg = topic_from_request(request.config)
        result = self.fanout.result

        def here() -> admin_pb2.BrokerApplyResult:
            if self.topics.get(cfg.topic_name) is None:
                return result(StatusCode.NOT_FOUND, f"topic {cfg.topic_name} does not exist here")
            self.topics.put(cfg)
            self._topics_changed()
            return result(StatusCode.OK)

        results = await self.fanout.apply(
            request.target,
            "UpdateTopic",
            lambda t: admin_pb2.UpdateTopicRequest(target=t, config=request.config),
            here,
        )
        return admin_pb2.UpdateTopicResponse(results=results)

    async def delete(self, request: admin_pb2.DeleteTopicRequest) -> admin_pb2.DeleteTopicResponse:
        topic = request.topic
        check_topic_name(topic, change=True)
        result = self.fanout.result

        def here() -> admin_pb2.BrokerApplyResult:
            if not self.topics.delete(topic):
                return result(StatusCode.NOT_FOUND, f"topic {topic} does not exist here")
            # Consume queues and offsets go now; commitlog bytes age out with retention.
            self.store.queues.delete_topic(topic)
            self.offsets.remove_topic(topic)
            self.offsets.persist()
            self._topics_changed()
            log.info("topic %s deleted", topic)
            return result(StatusCode.OK)

        results = await self.fanout.apply(
            request.target,
            "DeleteTopic",
            lambda t: admin_pb2.DeleteTopicRequest(target=t, topic=topic),
            here,
        )
        return admin_pb2.DeleteTopicResponse(results=results)

    def list(self, request: admin_pb2.ListTopicsRequest) -> admin_pb2.ListTopicsResponse:
        return admin_pb2.ListTopicsResponse(
            topics=[
                t.to_pb()
                for t in self.topics.all()
                if request.include_system_topics or not self.topics.is_system(t.topic_name)
            ]
        )

    def describe(self, request: admin_pb2.DescribeTopicRequest) -> admin_pb2.DescribeTopicResponse:
        check_topic_name(request.topic, change=False)
        cfg = self.topics.get(request.topic)
        if cfg is None:
            not_found(
                common_pb2.TOPIC_NOT_EXIST,
                f"topic {request.topic} does not exist on broker {self.config.broker_name}",
                topic=request.topic,
            )
        queues = []
        for qid in range(cfg.queue_nums):
            max_offset = int(self.store.max_offset(cfg.topic_name, qid))
            queues.append(
                admin_pb2.TopicQueueStats(
                    queue_id=qid,
                    min_offset=int(self.store.min_offset(cfg.topic_name, qid)),
                    max_offset=max_offset,
                    last_update_timestamp_ms=store_time(
                        self.store, cfg.topic_name, qid, max_offset - 1
                    ),
                )
            )
        return admin_pb2.DescribeTopicResponse(
            broker_name=self.config.broker_name, config=cfg.to_pb(), queues=queues
        )
