"""Create a topic through the admin SDK and wait for the nameserver to route it.

The SDK-level integration tests (ordered send, orderly consumers, subscription consistency)
all need a topic whose route is live before the first send or subscribe; this is that step
once, on :func:`tests.support.until.until`.
"""

from __future__ import annotations

from rocketq.client.admin import Admin, TopicConfig
from rocketq.client.errors import TopicNotFoundError
from tests.support.until import until

ROUTE_TIMEOUT_S = 15.0


async def create_routed_topic(admin: Admin, config: TopicConfig) -> None:
    """Create ``config`` on the cluster; return once its route shows every write queue."""
    results = await admin.create_topic(config)
    assert all(r.ok for r in results), results
    await wait_routed(admin, config.topic_name, config.write_queue_nums)


async def wait_routed(admin: Admin, topic: str, write_queues: int) -> None:
    """Wait until the nameserver routes ``topic`` with ``write_queues`` write queues."""

    async def routed() -> bool:
        try:
            route = await admin.route(topic)
        except TopicNotFoundError:
            return False
        return bool(route.queues) and route.queues[0].write_queue_nums == write_queues

    await until(routed, f"a route for {topic}", ROUTE_TIMEOUT_S)
