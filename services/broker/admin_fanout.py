"""Where an Admin change runs: this broker (broker mode) or every master of a cluster.

Targets of a change (``ApplyTarget``, mqadmin's ``-b`` / ``-c``):

- broker mode: the receiving broker only; ``broker_name`` must be ours, which catches a request
  sent to the wrong address.
- cluster mode: the receiving broker asks a nameserver (the first of ``namesrvAddr`` that
  answers) for the cluster's masters (broker id 0) and calls the same RPC in broker mode on each
  of them, itself included, concurrently, each with a timeout. Every master gets one
  ``BrokerApplyResult``; a master that already has the topic says ALREADY_EXISTS, one without
  it NOT_FOUND, one that does not answer UNAVAILABLE. The call itself succeeds so that the
  caller sees partial outcomes instead of a single error hiding them. Going through the network
  even for ourselves keeps one code path; the cost is one loopback call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    nameserver_pb2,
    nameserver_pb2_grpc,
)
from rocketq.client.security import security_channel
from services.broker.admin_common import require_master
from services.broker.config import BrokerConfig
from services.common.errors import invalid, not_found, unavailable

StatusCode = grpc.StatusCode

#: How long a cluster-mode change waits for each master, and a nameserver for cluster info.
FANOUT_TIMEOUT_MS = 5000
NAMESRV_TIMEOUT_MS = 3000


class ClusterFanout:
    """Runs a change here or on every master of a cluster, and words this broker's outcome."""

    def __init__(
        self, config: BrokerConfig, advertised_addr: str, timeout_ms: int = FANOUT_TIMEOUT_MS
    ) -> None:
        self.config = config
        self.advertised_addr = advertised_addr
        self.timeout_ms = timeout_ms
        """How long each master has to answer a cluster-mode change."""

    def result(self, code: grpc.StatusCode, message: str = "") -> admin_pb2.BrokerApplyResult:
        """This broker's outcome of a change."""
        return admin_pb2.BrokerApplyResult(
            broker_name=self.config.broker_name,
            broker_addr=self.advertised_addr,
            status_code=code.value[0],
            error_message=message,
        )

    async def apply(
        self,
        target: admin_pb2.ApplyTarget,
        rpc_name: str,
        make_request: Callable[[admin_pb2.ApplyTarget], Any],
        apply_here: Callable[[], admin_pb2.BrokerApplyResult],
    ) -> list[admin_pb2.BrokerApplyResult]:
        """Run a change in broker mode here, or in cluster mode on every master."""
        kind = target.WhichOneof("target")
        if kind is None:
            invalid(
                common_pb2.ILLEGAL_ARGUMENT,
                "no target: set target.cluster_name (every master of a cluster) or "
                "target.broker_name (this broker)",
            )
        if kind == "broker_name":
            if target.broker_name != self.config.broker_name:
                invalid(
                    common_pb2.ILLEGAL_ARGUMENT,
                    f"target broker {target.broker_name!r} is not this broker "
                    f"({self.config.broker_name} at {self.advertised_addr})",
                    broker_name=target.broker_name,
                )
            require_master(self.config)
            return [apply_here()]
        if not target.cluster_name:
            invalid(common_pb2.ILLEGAL_ARGUMENT, "target.cluster_name is empty")
        require_master(self.config)
        masters = await self.cluster_masters(target.cluster_name)
        calls = [
            self.call_master(
                name, addr, rpc_name, make_request(admin_pb2.ApplyTarget(broker_name=name))
            )
            for name, addr in masters
        ]
        results = await asyncio.gather(*calls)
        return sorted(results, key=lambda r: r.broker_name)

    async def cluster_masters(self, cluster: str) -> list[tuple[str, str]]:
        """(broker name, master address or "") of every broker group of ``cluster``."""
        info = await self.cluster_info()
        if cluster not in info.cluster_addr_table:
            not_found(
                common_pb2.ERROR_REASON_UNSPECIFIED,
                f"cluster {cluster!r} has no live brokers on the nameservers "
                f"({';'.join(self.config.namesrv_addrs)})",
                cluster_name=cluster,
            )
        out: list[tuple[str, str]] = []
        for name in sorted(info.cluster_addr_table[cluster].broker_names):
            addr = ""
            if name in info.broker_addr_table:
                addr = info.broker_addr_table[name].broker_addrs.get(0, "")
            out.append((name, addr))
        return out

    async def cluster_info(self) -> nameserver_pb2.GetClusterInfoResponse:
        """The first answer of the configured nameservers, asked in order."""
        errors: list[str] = []
        for addr in self.config.namesrv_addrs:
            async with security_channel(addr, []) as channel:
                stub = nameserver_pb2_grpc.NameServerStub(channel)
                try:
                    info: nameserver_pb2.GetClusterInfoResponse = await stub.GetClusterInfo(
                        nameserver_pb2.GetClusterInfoRequest(), timeout=NAMESRV_TIMEOUT_MS / 1000
                    )
                    return info
                except grpc.aio.AioRpcError as err:
                    errors.append(f"{addr}: {err.code().name} {err.details()}")
        unavailable(
            common_pb2.SERVICE_NOT_AVAILABLE,
            "no nameserver answered GetClusterInfo, so the cluster's masters are unknown: "
            + ("; ".join(errors) or "namesrvAddr is empty"),
        )

    async def call_master(
        self, name: str, addr: str, rpc_name: str, request: Any
    ) -> admin_pb2.BrokerApplyResult:
        """One master's outcome of ``rpc_name`` in broker mode; failures become results."""

        def failed(code: grpc.StatusCode, message: str) -> admin_pb2.BrokerApplyResult:
            return admin_pb2.BrokerApplyResult(
                broker_name=name,
                broker_addr=addr,
                status_code=code.value[0],
                error_message=message,
            )

        if not addr:
            return failed(StatusCode.UNAVAILABLE, f"broker {name} has no live master (id 0)")
        async with security_channel(addr, []) as channel:
            method = getattr(admin_pb2_grpc.AdminStub(channel), rpc_name)
            try:
                response = await method(request, timeout=self.timeout_ms / 1000)
            except grpc.aio.AioRpcError as err:
                if err.code() == StatusCode.DEADLINE_EXCEEDED:
                    return failed(
                        StatusCode.UNAVAILABLE,
                        f"master {addr} did not answer within {self.timeout_ms} ms",
                    )
                return failed(err.code(), err.details() or err.code().name)
        for result in response.results:
            if result.broker_name == name:
                out = admin_pb2.BrokerApplyResult()
                out.CopyFrom(result)
                out.broker_addr = addr
                return out
        return failed(StatusCode.INTERNAL, f"master {addr} answered without a result for {name}")
