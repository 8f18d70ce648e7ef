"""The SDK's internal API for RocketQ's own services. Not for applications.

What it is: the few pieces of the client's core, below the public producer and consumer API, that
a RocketQ service needs to act as a client of the brokers. The timer-wheel service is one: it
consumes the system topic ``rmq_sys_wheel_timer`` as a consumer group but stores each timer before
it commits the offset and re-puts messages itself, so it drives the SDK's client instance,
rebalance and pull requests directly instead of through :class:`rocketq.PushConsumer`.

Who may use it: code under ``services/`` (and RocketQ's own tests and tools). Services import the
SDK through :mod:`rocketq`, its public modules and this module only; importing the private modules
behind it (``rocketq.client._instance``, ``consumer._rebalance``, ...) is refused by an
import-linter contract in ``make lint`` (docs/architecture.md, "Import rules").

Not for applications: these names carry no compatibility promise. They change whenever the
client's internals do, in any release, without deprecation. Applications use what :mod:`rocketq`
exports.

- :class:`ClientConfig`, :class:`ClientInstance`, :func:`local_ip`: the shared client core
  (routes, channels, the ClientStream heartbeats) and the address it reports.
- :class:`TopicRoute`: a topic's route as the nameserver gives it.
- :class:`BrokerApi`: the consumer-side broker calls (pull, offsets, locks) with failover.
- :func:`readable_queues`: the readable message queues of a topic, from its route.
- :class:`RebalanceImpl`, :class:`RebalanceService`, :class:`PullRequest`: queue allocation across
  a consumer group and the pull requests it hands out.
- :class:`ProcessQueue`: the per-queue buffer of pulled, not yet consumed messages.
- :func:`trace_context_of`, :data:`TRACE_CONTEXT`: the OpenTelemetry context a message carries
  in its properties (``rocketq.client._tracing``), for the broker's and timer wheel's spans.
"""

from __future__ import annotations

from rocketq.client._instance import ClientConfig, ClientInstance, local_ip
from rocketq.client._route import TopicRoute
from rocketq.client._tracing import TRACE_CONTEXT
from rocketq.client._tracing import context_of as trace_context_of
from rocketq.client.consumer._api import BrokerApi
from rocketq.client.consumer._common import readable_queues
from rocketq.client.consumer._rebalance import PullRequest, RebalanceImpl, RebalanceService
from rocketq.client.consumer.process_queue import ProcessQueue

__all__ = [
    "TRACE_CONTEXT",
    "BrokerApi",
    "ClientConfig",
    "ClientInstance",
    "ProcessQueue",
    "PullRequest",
    "RebalanceImpl",
    "RebalanceService",
    "TopicRoute",
    "local_ip",
    "readable_queues",
    "trace_context_of",
]
