"""A broker group that joins a cluster takes the cluster's topics (DESIGN.md §9).

``kubectl scale statefulset <release>-broker --replicas=N`` starts new, empty broker groups.
RocketMQ leaves it to a person to run ``mqadmin updateTopic -c`` again so the new groups get
queues of the existing topics; here a master with ``learnClusterTopics`` on asks the
nameservers at start which topics are *cluster-mode* — hosted by every other broker group of
its cluster — and creates those it lacks on itself, with the queue counts, permission and flags
the others have. The registration that follows puts its queues into the routes.

A topic hosted by only some groups was placed there on purpose and is left alone; system topics
(retry, DLQ, TBW102, rmq_sys_*, broker- and cluster-name topics) are each broker's own. It runs
in the background and never holds up the start: while no nameserver answers it retries, for at
most ``LEARN_ATTEMPTS_MAX`` rounds.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from rocketq._api.rocketq.v1 import nameserver_pb2, nameserver_pb2_grpc
from rocketq.validation import is_system_topic
from services.broker.config import BrokerConfig
from services.broker.model import TopicConfig
from services.broker.topic_config_manager import TopicConfigManager

log = logging.getLogger(__name__)

LEARN_ATTEMPTS_MAX = 30
RETRY_INTERVAL_S = 2.0
RPC_TIMEOUT_S = 5.0
TOPICS_MAX = 10_000
"""Most topics looked at in one learning (each costs a route lookup)."""


async def learn_cluster_topics(config: BrokerConfig, topics: TopicConfigManager) -> list[str]:
    """Create on this broker every cluster-mode topic it lacks; the names created."""
    for attempt in range(1, LEARN_ATTEMPTS_MAX + 1):
        for addr in config.namesrv_addrs:
            try:
                async with grpc.aio.insecure_channel(addr) as channel:
                    stub = nameserver_pb2_grpc.NameServerStub(channel)
                    wanted = await cluster_mode_topics(stub, config)
            except grpc.RpcError as exc:
                log.info("cannot learn cluster topics from %s: %s", addr, exc.code().name)
                continue
            created = [cfg.topic_name for cfg in wanted if topics.get(cfg.topic_name) is None]
            for cfg in wanted:
                if cfg.topic_name in created:
                    topics.put(cfg)
            if created:
                log.info("created %d cluster topic(s) on joining: %s", len(created), created)
            return created
        if attempt < LEARN_ATTEMPTS_MAX:
            await asyncio.sleep(RETRY_INTERVAL_S)
    log.warning("no nameserver answered; cluster topics not learned (create them by hand)")
    return []


async def cluster_mode_topics(
    stub: nameserver_pb2_grpc.NameServerStub, config: BrokerConfig
) -> list[TopicConfig]:
    """Topics of ``config``'s cluster hosted by every other broker group of it, as they are
    configured there (the largest queue counts when groups differ)."""
    info: nameserver_pb2.GetClusterInfoResponse = await stub.GetClusterInfo(
        nameserver_pb2.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S
    )
    members = info.cluster_addr_table.get(config.cluster_name)
    others = set(members.broker_names if members else ()) - {config.broker_name}
    if not others:
        return []
    own_names = set(info.broker_addr_table) | set(info.cluster_addr_table) | {config.broker_name}
    listed: nameserver_pb2.GetAllTopicsResponse = await stub.GetAllTopics(
        nameserver_pb2.GetAllTopicsRequest(cluster_name=config.cluster_name),
        timeout=RPC_TIMEOUT_S,
    )
    out: list[TopicConfig] = []
    for name in listed.topics[:TOPICS_MAX]:
        if name in own_names or is_system_topic(name):
            continue
        try:
            route: nameserver_pb2.GetRouteInfoByTopicResponse = await stub.GetRouteInfoByTopic(
                nameserver_pb2.GetRouteInfoByTopicRequest(topic=name), timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError:
            continue  # deleted meanwhile
        queues = [q for q in route.route.queues if q.broker_name in others]
        if {q.broker_name for q in queues} != others:
            continue
        out.append(
            TopicConfig(
                topic_name=name,
                read_queue_nums=max(q.read_queue_nums for q in queues),
                write_queue_nums=max(q.write_queue_nums for q in queues),
                # a group being drained registers its topics without write: take the widest
                perm=max(q.perm for q in queues),
                topic_sys_flag=queues[0].topic_sys_flag,
                message_type=queues[0].message_type,  # what the v2 gateways accept
            )
        )
    return out
