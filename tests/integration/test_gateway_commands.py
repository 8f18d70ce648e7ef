"""Server commands on the gateway's Telemetry streams: PrintThreadStackTraceCommand and
VerifyMessageCommand, asked by an admin (``rocketq gateway ask`` / Admin AskGatewayClient).

The client here speaks the v2 protocol itself (the gateway's generated classes) and answers the
commands as Apache's Java SDK does: its stack with OK, a message to verify with OK when it can
read it. The official Python SDK 5.1.2 ignores both commands (no handler in its source), so
no official SDK in this repository's test set could show an answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from rocketq._api.rocketq.v1 import admin_pb2, common_pb2
from services.broker.gateway._v2api import definition_pb2 as v2
from services.broker.gateway._v2api import service_pb2 as svc
from services.broker.gateway._v2api import service_pb2_grpc as svc_grpc
from tests.support.cli import rocketq
from tests.support.cluster import Cluster, cluster
from tests.support.raw_client import RawClient, refused
from tests.support.until import until

pytestmark = pytest.mark.integration

CLIENT_ID = "raw-v2-client@test"
STACK = '"main" #1\n  at app.Main.run(Main.java:42)'
TOPIC = "V2Cmds"
OFFICIAL_STYLE_ID = "0100AB000000000000000000000000C0DE"
"""The official SDKs' message ids are 34 hex characters (RocketQ's own are 32)."""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("gwcmds"), gateway=True) as c:
        yield c
        c.check_logs()


class AnsweringClient:
    """A Telemetry stream that answers server commands as the Java SDK does; ``silent`` clients
    answer nothing (as the Python SDK)."""

    def __init__(self, stub: Any, client_id: str, silent: bool = False) -> None:
        self.stub = stub
        self.client_id = client_id
        self.silent = silent
        self.replies: asyncio.Queue[Any] = asyncio.Queue()
        self.verified: list[bytes] = []
        self.settled = asyncio.Event()

    async def requests(self) -> AsyncIterator[Any]:
        settings = v2.Settings(client_type=v2.SIMPLE_CONSUMER)
        yield svc.TelemetryCommand(settings=settings)
        while (reply := await self.replies.get()) is not None:
            yield reply

    async def run(self) -> None:
        call = self.stub.Telemetry(self.requests(), metadata=(("x-mq-client-id", self.client_id),))
        async for command in call:
            kind = command.WhichOneof("command")
            if kind == "settings":
                self.settled.set()
            elif self.silent:
                continue
            elif kind == "print_thread_stack_trace_command":
                nonce = command.print_thread_stack_trace_command.nonce
                await self.replies.put(
                    svc.TelemetryCommand(
                        status=v2.Status(code=v2.OK, message="OK"),
                        thread_stack_trace=svc.ThreadStackTrace(
                            nonce=nonce, thread_stack_trace=STACK
                        ),
                    )
                )
            elif kind == "verify_message_command":
                verify = command.verify_message_command
                self.verified.append(verify.message.body)
                await self.replies.put(
                    svc.TelemetryCommand(
                        status=v2.Status(code=v2.OK, message="consumed"),
                        verify_message_result=svc.VerifyMessageResult(nonce=verify.nonce),
                    )
                )


@pytest.fixture
async def clients(gw: Cluster) -> AsyncIterator[tuple[AnsweringClient, AnsweringClient]]:
    async with grpc.aio.insecure_channel(gw.gateway_addr(gw.broker)) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        java_like = AnsweringClient(stub, CLIENT_ID)
        python_like = AnsweringClient(stub, "silent@test", silent=True)
        tasks = [asyncio.create_task(c.run()) for c in (java_like, python_like)]
        for c in (java_like, python_like):
            await asyncio.wait_for(c.settled.wait(), 30)
        yield java_like, python_like
        for c in (java_like, python_like):
            await c.replies.put(None)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_admin_gets_a_clients_thread_stack_through_the_cli(
    gw: Cluster, clients: tuple[AnsweringClient, AnsweringClient]
) -> None:
    ask = ("gateway", "ask", CLIENT_ID, "--broker", gw.broker.addr, "--stack")
    done = await asyncio.to_thread(rocketq, *ask, check=True)
    out = json.loads(done.stdout)
    assert (out["answered"], out["code"], out["thread_stack_trace"]) == (True, v2.OK, STACK)


async def test_admin_asks_a_client_to_verify_a_stored_message(
    gw: Cluster, clients: tuple[AnsweringClient, AnsweringClient]
) -> None:
    java_like, _ = clients
    async with RawClient(gw.broker.addr) as raw:
        await raw.admin.CreateTopic(
            admin_pb2.CreateTopicRequest(
                target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                config=common_pb2.TopicConfig(
                    topic_name=TOPIC, read_queue_nums=1, write_queue_nums=1, perm=6
                ),
            )
        )
        async with grpc.aio.insecure_channel(gw.gateway_addr(gw.broker)) as channel:
            sent = await svc_grpc.MessagingServiceStub(channel).SendMessage(
                svc.SendMessageRequest(
                    messages=[
                        v2.Message(
                            topic=v2.Resource(name=TOPIC),
                            body=b"verify me",
                            system_properties=v2.SystemProperties(
                                message_id=OFFICIAL_STYLE_ID,
                                message_type=v2.NORMAL,
                            ),
                        )
                    ]
                )
            )
        msg_id = sent.entries[0].message_id

        async def ask() -> Any:
            return await raw.admin.AskGatewayClient(
                admin_pb2.AskGatewayClientRequest(
                    client_id=CLIENT_ID, ask=admin_pb2.VERIFY_MESSAGE, topic=TOPIC, msg_id=msg_id
                )
            )

        async def indexed() -> bool:  # the index is built behind the commit log
            try:
                await ask()
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    return False
                raise
            return True

        await until(indexed, f"message {msg_id} indexed and verified")
        out = await ask()
        assert (out.answered, out.code, out.message) == (True, v2.OK, "consumed")
        assert java_like.verified[-1] == b"verify me"


async def test_silent_unknown_and_bad_asks_say_what_happened(
    gw: Cluster, clients: tuple[AnsweringClient, AnsweringClient]
) -> None:
    async with RawClient(gw.broker.addr) as raw:
        silent = await raw.admin.AskGatewayClient(
            admin_pb2.AskGatewayClientRequest(
                client_id="silent@test", ask=admin_pb2.THREAD_STACK_TRACE, timeout_ms=300
            )
        )
        assert not silent.answered and silent.nonce
        code, _, message = await refused(
            raw.admin.AskGatewayClient(
                admin_pb2.AskGatewayClientRequest(
                    client_id="nobody", ask=admin_pb2.THREAD_STACK_TRACE
                )
            )
        )
        assert code == grpc.StatusCode.NOT_FOUND and CLIENT_ID in message, message
        code, _, _ = await refused(
            raw.admin.AskGatewayClient(admin_pb2.AskGatewayClientRequest(client_id=CLIENT_ID))
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        code, _, _ = await refused(
            raw.admin.AskGatewayClient(
                admin_pb2.AskGatewayClientRequest(
                    client_id=CLIENT_ID, ask=admin_pb2.THREAD_STACK_TRACE, timeout_ms=600_000
                )
            )
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
