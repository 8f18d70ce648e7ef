"""What the RPC fuzzer found (issue 21), each as a scenario against real service processes.

A nameserver, a broker and a timer-wheel shared by the module; every test leaves them healthy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rocketq._api.rocketq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
)
from services.store.inspect import detect_layout, verify
from tests.robustness.fuzz_rpc import TOPIC, FuzzCluster, fuzz_cluster, round_trip

pytestmark = pytest.mark.integration

GROUP = "hostile-group"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzCluster]:
    root: Path = tmp_path_factory.mktemp("hostile")
    with fuzz_cluster(root) as c:
        assert round_trip(c.broker.addr, TOPIC) is None
        yield c


def raw_call(addr: str, path: str, payload: bytes) -> grpc.RpcError:
    """Send ``payload`` as the request bytes of ``path``; the error it is answered with."""
    with grpc.insecure_channel(addr) as ch, pytest.raises(grpc.RpcError) as caught:
        ch.unary_unary(path)(payload, timeout=5)
    err = caught.value
    assert isinstance(err, grpc.RpcError)
    return err


def test_bytes_that_are_not_protobuf_get_invalid_argument_and_one_log_line(
    cluster: FuzzCluster,
) -> None:
    for payload in (b"\x00", b"\xff" * 7, b"\x35"):
        err = raw_call(cluster.broker.addr, "/rocketq.v1.Admin/CreateTopic", payload)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "not a valid protobuf message" in (err.details() or "")
    log = cluster.broker.log_path.read_text(errors="replace")
    assert log.count("refused an undecodable") == 1, "one warning per peer per interval"
    assert "Traceback" not in log


def test_a_corrupt_frame_ends_the_client_stream_with_invalid_argument(cluster: FuzzCluster) -> None:
    with grpc.insecure_channel(cluster.broker.addr) as ch:
        call = ch.stream_stream("/rocketq.v1.Messaging/ClientStream")
        with pytest.raises(grpc.RpcError) as caught:
            for _ in call(iter([b"\x00"]), timeout=5):
                pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert "Traceback" not in cluster.broker.log_path.read_text(errors="replace")


def test_errors_quote_a_short_prefix_of_a_huge_input(cluster: FuzzCluster) -> None:
    # 20 000 characters: echoed whole, the trailers exceeded a client's 16 KiB limit and the
    # caller saw RESOURCE_EXHAUSTED instead of the real answer
    huge = "é" * 20_000
    with grpc.insecure_channel(cluster.broker.addr) as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        with pytest.raises(grpc.RpcError) as caught:
            admin.DeleteTopic(
                admin_pb2.DeleteTopicRequest(
                    target=admin_pb2.ApplyTarget(broker_name="broker-a"), topic=huge
                ),
                timeout=5,
            )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert len((caught.value.details() or "").encode()) < 600


def test_an_offset_past_the_queue_end_is_stored_as_the_end(cluster: FuzzCluster) -> None:
    with grpc.insecure_channel(cluster.broker.addr) as ch:
        stub = messaging_pb2_grpc.MessagingStub(ch)
        end = stub.GetMaxOffset(
            messaging_pb2.GetMaxOffsetRequest(topic=TOPIC, queue_id=0), timeout=5
        ).offset
        stub.UpdateConsumerOffset(
            messaging_pb2.UpdateConsumerOffsetRequest(
                consumer_group=GROUP, topic=TOPIC, queue_id=0, commit_offset=2**62
            ),
            timeout=5,
        )
        stored = stub.QueryConsumerOffset(
            messaging_pb2.QueryConsumerOffsetRequest(consumer_group=GROUP, topic=TOPIC, queue_id=0),
            timeout=5,
        ).offset
    assert stored == end >= 1


@pytest.mark.parametrize("group", ["%RETRY%G", "%DLQ%G"])
def test_groups_named_like_retry_or_dead_letter_topics_are_refused(
    cluster: FuzzCluster, group: str
) -> None:
    with grpc.insecure_channel(cluster.broker.addr) as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        with pytest.raises(grpc.RpcError) as caught:
            admin.CreateSubscriptionGroup(
                admin_pb2.CreateSubscriptionGroupRequest(
                    target=admin_pb2.ApplyTarget(broker_name="broker-a"),
                    config=common_pb2.SubscriptionGroupConfig(group_name=group),
                ),
                timeout=5,
            )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert "retry and dead-letter" in (caught.value.details() or "")


def test_a_replication_window_beyond_its_bound_is_refused(cluster: FuzzCluster) -> None:
    with grpc.insecure_channel(cluster.broker.addr) as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        with pytest.raises(grpc.RpcError) as caught:
            admin.UpdateBrokerConfig(
                admin_pb2.UpdateBrokerConfigRequest(updates={"haMaxInFlightBytes": "1" + "0" * 30}),
                timeout=5,
            )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert "at most" in (caught.value.details() or "")


def test_health_list_answers(cluster: FuzzCluster) -> None:
    for sp in cluster.servers.values():
        with grpc.insecure_channel(sp.addr) as ch:
            listed = health_pb2_grpc.HealthStub(ch).List(health_pb2.HealthListRequest(), timeout=5)
        assert listed.statuses[""].status == health_pb2.HealthCheckResponse.SERVING
        assert "Traceback" not in sp.log_path.read_text(errors="replace")


def test_store_verify_counts_records_of_a_deleted_topic_apart(tmp_path: Path) -> None:
    # topic create T, produce one message, topic delete T, stop: the record stays in the
    # commitlog (until retention) with no queue, which is expected, not corruption
    with fuzz_cluster(tmp_path) as c:
        assert round_trip(c.broker.addr, "Doomed") is None
        with grpc.insecure_channel(c.broker.addr) as ch:
            admin_pb2_grpc.AdminStub(ch).DeleteTopic(
                admin_pb2.DeleteTopicRequest(
                    target=admin_pb2.ApplyTarget(broker_name="broker-a"), topic="Doomed"
                ),
                timeout=5,
            )
        assert c.broker.stop(timeout_s=15) == 0
        report = verify(detect_layout(c.broker.workdir / "store"))
    assert report.ok, report.problems
    assert report.deleted_topic_records == 1
