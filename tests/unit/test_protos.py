"""The generated wire contracts: they import, round-trip, expose DESIGN.md §3's RPCs, and match
proto/ (tools/gen_protos.py --check)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO_ROOT / "proto" / "rocketq" / "v1"
API_PACKAGE = "rocketq._api.rocketq.v1"
GEN_PROTOS_TIMEOUT_S = 120

# proto stem -> (service, messages module, RPC names): what DESIGN.md §3 requires, so dropping or
# renaming an RPC fails here. Only BIDI_METHODS stream (both ways); every other RPC is unary.
EXPECTED_SERVICES: dict[str, tuple[str, str, set[str]]] = {
    "nameserver": (
        "NameServer",
        "nameserver_pb2",
        {
            "RegisterBroker",
            "UnregisterBroker",
            "GetRouteInfoByTopic",
            "GetClusterInfo",
            "GetAllTopics",
        },
    ),
    "messaging": (
        "Messaging",
        "messaging_pb2",
        {
            "Send",
            "Pull",
            "UpdateConsumerOffset",
            "QueryConsumerOffset",
            "GetMaxOffset",
            "GetMinOffset",
            "SearchOffsetByTimestamp",
            "LockBatch",
            "UnlockBatch",
            "ConsumerSendBack",
            "EndTransaction",
            "QueryMessageByKey",
            "QueryMessageById",
            "ViewMessage",
            "ClientStream",
            "GetConsumerIdList",
            "Pop",
            "Ack",
            "ChangeInvisibleTime",
            "SendStream",
            "PullStream",
        },
    ),
    "admin": (
        "Admin",
        "admin_pb2",
        {
            "CreateTopic",
            "UpdateTopic",
            "DeleteTopic",
            "ListTopics",
            "DescribeTopic",
            "CreateSubscriptionGroup",
            "UpdateSubscriptionGroup",
            "DeleteSubscriptionGroup",
            "ListSubscriptionGroups",
            "GetConsumeStats",
            "GetConsumerConnection",
            "ListDeadLetters",
            "ResendDeadLetter",
            "ListHalfMessages",
            "ResetOffset",
            "GetBrokerConfig",
            "UpdateBrokerConfig",
            "GetRuntimeStats",
            "Switchover",
            "DrainBroker",
            "AskGatewayClient",
        },
    ),
    "replication": ("Replication", "replication_pb2", {"Stream", "SyncConfig"}),
    "timer": ("TimerAdmin", "timer_pb2", {"GetTimerStats", "CancelTimer"}),
}
BIDI_METHODS = {
    ("Messaging", "ClientStream"),
    ("Messaging", "SendStream"),
    ("Messaging", "PullStream"),
    ("Replication", "Stream"),
}


def _generated_modules() -> list[ModuleType]:
    package = importlib.import_module(API_PACKAGE)
    return [
        importlib.import_module(f"{API_PACKAGE}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
    ]


def test_every_proto_has_its_modules_and_they_import() -> None:
    names = {module.__name__.rsplit(".", 1)[1] for module in _generated_modules()}
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        assert f"{proto.stem}_pb2" in names, proto.name
    for stem in EXPECTED_SERVICES:
        assert f"{stem}_pb2_grpc" in names, stem


def test_generated_classes_live_under_rocketq_api() -> None:
    # The generator re-roots `rocketq.v1` under rocketq._api; a missed rewrite shows up here.
    for module in _generated_modules():
        if not module.__name__.endswith("_pb2"):
            continue
        for message_name in module.DESCRIPTOR.message_types_by_name:
            cls = getattr(module, message_name)
            assert cls.__module__ == module.__name__, (module.__name__, message_name)


@pytest.mark.parametrize("stem", sorted(EXPECTED_SERVICES))
def test_services_expose_the_designed_rpcs(stem: str) -> None:
    service_name, module_name, expected = EXPECTED_SERVICES[stem]
    module = importlib.import_module(f"{API_PACKAGE}.{module_name}")
    service = module.DESCRIPTOR.services_by_name[service_name]
    assert {m.name for m in service.methods} == expected
    for method in service.methods:
        bidi = (service_name, method.name) in BIDI_METHODS
        assert (method.client_streaming, method.server_streaming) == (bidi, bidi), method.name
    grpc_module = importlib.import_module(f"{API_PACKAGE}.{stem}_pb2_grpc")
    assert hasattr(grpc_module, f"{service_name}Stub")
    assert hasattr(grpc_module, f"add_{service_name}Servicer_to_server")


def test_send_request_round_trips() -> None:
    from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2

    request = messaging_pb2.SendRequest(
        producer_group="pg",
        queue_id=3,
        born_timestamp_ms=1_700_000_000_123,
        messages=[
            common_pb2.Message(
                topic="TopicTest",
                flag=7,
                body=b"\x00hello\xff",
                properties={"TAGS": "TagA", "KEYS": "order-1 order-2", "UNIQ_KEY": "AB" * 16},
            ),
            common_pb2.Message(topic="TopicTest", body=b"second"),
        ],
        default_topic="TBW102",
    )
    parsed = messaging_pb2.SendRequest.FromString(request.SerializeToString())

    assert parsed == request
    assert parsed.messages[0].properties["KEYS"].split(" ") == ["order-1", "order-2"]
    assert parsed.messages[1].body == b"second"
    # Optional fields keep presence: absent means "server default", not zero.
    assert not parsed.HasField("default_topic_queue_nums")
    assert not parsed.HasField("max_reconsume_times")


def test_pull_response_round_trips_records_and_decoded_messages() -> None:
    from rocketq._api.rocketq.v1 import common_pb2, messaging_pb2

    records = b"\x00\x00\x00\x10" + b"\xda\xa3\x20\xa7" + bytes(8)  # opaque to protobuf
    response = messaging_pb2.PullResponse(
        status=messaging_pb2.FOUND,
        next_begin_offset=42,
        min_offset=0,
        max_offset=100,
        suggest_which_broker_id=1,
        records=records,
        messages=[
            common_pb2.StoredMessage(
                message=common_pb2.Message(topic="TopicTest", body=b"x"),
                queue_id=2,
                queue_offset=41,
                commitlog_offset=1_073_741_824,
                store_timestamp_ms=1_700_000_000_456,
            )
        ],
    )
    parsed = messaging_pb2.PullResponse.FromString(response.SerializeToString())

    assert parsed == response
    assert parsed.status == messaging_pb2.PullStatus.Value("FOUND")
    assert parsed.records == records
    assert parsed.messages[0].commitlog_offset == 1_073_741_824


def test_unset_statuses_are_unspecified_not_success() -> None:
    from rocketq._api.rocketq.v1 import messaging_pb2

    assert messaging_pb2.SendResult().status == messaging_pb2.SEND_STATUS_UNSPECIFIED
    assert messaging_pb2.PullResponse().status == messaging_pb2.PULL_STATUS_UNSPECIFIED


def test_generated_code_matches_proto() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "gen_protos.py"), "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=GEN_PROTOS_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
