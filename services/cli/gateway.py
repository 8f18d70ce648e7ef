"""``rocketq gateway ask``: a server command to an official RocketMQ 5 SDK client.

The broker whose gateway the client's Telemetry stream is on sends the command
(PrintThreadStackTraceCommand or VerifyMessageCommand, Admin RPC ``AskGatewayClient``) and
prints the client's answer as one JSON object: whether it answered, its status code and
message, and the stack trace it sent. The call is signed and uses TLS as the environment says
(ROCKETQ_ACCESS_KEY, ROCKETQ_TLS_CA_FILE, ...); it needs the admin role when ACL is on.
"""

from __future__ import annotations

import json

import click
import grpc

from rocketq._api.rocketq.v1 import admin_pb2, admin_pb2_grpc
from rocketq.cli._common import run
from rocketq.client.security import security_channel

CALL_MARGIN_S = 5.0
"""The call's deadline beyond the client's timeout (the broker answers after at most that)."""


@click.group()
def gateway() -> None:
    """The RocketMQ 5 gateway's clients (the official SDKs)."""


@gateway.command("ask")
@click.argument("client_id")
@click.option("--broker", "broker_addr", required=True, metavar="HOST:PORT",
              help="The broker (its RocketQ port) whose gateway the client uses.")  # fmt: skip
@click.option("--stack", "what", flag_value="stack", default=True,
              help="Ask for the client's thread stack traces (the default).")  # fmt: skip
@click.option("--verify", "what", flag_value="verify",
              help="Ask the client to verify (consume) message --topic/--msg-id.")  # fmt: skip
@click.option("--topic", default="", help="With --verify: the message's topic (ns%name).")
@click.option("--msg-id", default="", help="With --verify: the message's unique id.")
@click.option("--timeout-ms", type=click.IntRange(1, 60_000), default=5_000, show_default=True,
              help="How long to wait for the client's answer.")  # fmt: skip
def ask(
    client_id: str, broker_addr: str, what: str, topic: str, msg_id: str, timeout_ms: int
) -> None:
    """Ask gateway client CLIENT_ID (its x-mq-client-id) for its thread stacks or to verify a
    message, and print its answer."""
    if what == "verify" and not (topic and msg_id):
        raise click.UsageError("--verify needs --topic and --msg-id")
    request = admin_pb2.AskGatewayClientRequest(
        client_id=client_id,
        ask=admin_pb2.VERIFY_MESSAGE if what == "verify" else admin_pb2.THREAD_STACK_TRACE,
        topic=topic,
        msg_id=msg_id,
        timeout_ms=timeout_ms,
    )

    async def call() -> admin_pb2.AskGatewayClientResponse:
        async with security_channel(broker_addr, []) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            response: admin_pb2.AskGatewayClientResponse = await stub.AskGatewayClient(
                request, timeout=timeout_ms / 1000 + CALL_MARGIN_S
            )
            return response

    try:
        out = run(call())
    except grpc.RpcError as err:
        raise click.ClickException(f"{err.code().name}: {err.details()}") from None
    click.echo(
        json.dumps(
            {
                "answered": out.answered,
                "code": out.code,
                "message": out.message,
                "thread_stack_trace": out.thread_stack_trace,
                "nonce": out.nonce,
            }
        )
    )
