"""Guards the public surface: `import rocketq` exposes exactly what it declares, and the client
library never imports the server side (DESIGN.md §2: services depend on rocketq, not back)."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import rocketq

pytestmark = pytest.mark.unit


def test_all_names_exist() -> None:
    for name in rocketq.__all__:
        assert hasattr(rocketq, name), name


def test_public_names_are_declared() -> None:
    public = {n for n in vars(rocketq) if not n.startswith("_")}
    undeclared = public - set(rocketq.__all__) - {"annotations", "version", "PackageNotFoundError"}
    # submodules imported as a side effect are fine; anything else must be in __all__
    undeclared = {n for n in undeclared if not isinstance(getattr(rocketq, n), types.ModuleType)}
    assert not undeclared, f"public names missing from rocketq.__all__: {sorted(undeclared)}"


def test_client_library_does_not_import_services() -> None:
    code = (
        "import sys, rocketq, rocketq.codec, rocketq.java_hash, rocketq.client.admin\n"
        "bad = [m for m in sys.modules if m == 'services' or m.startswith('services.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


#: The names a user of the SDK relies on; removing one is a breaking change.
STABLE_NAMES = {
    "Message",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "MessageQueue",
    "Producer",
    "ProducerConfig",
    "AccumulatingProducer",
    "SyncProducer",
    "PushConsumer",
    "PushConsumerConfig",
    "LitePullConsumer",
    "SyncPushConsumer",
    "ConsumeResult",
    "ConsumeOrderlyStatus",
    "ConsumeOrderlyContext",
    "SubscriptionConflict",
    "MessageModel",
    "ConsumeFromWhere",
    "AllocateAveragely",
    "AllocateAveragelyByCircle",
    "Admin",
    "RocketQError",
    "TimerClient",
    "TimerStats",
    "TransactionProducer",
    "SyncTransactionProducer",
    "TransactionListener",
    "LocalTransactionState",
    "TransactionSendResult",
}


def test_stable_names_are_exported() -> None:
    missing = STABLE_NAMES - set(rocketq.__all__)
    assert not missing, f"removed from the public API: {sorted(missing)}"


def test_no_protobuf_type_in_public_config_signatures() -> None:
    import dataclasses
    import typing

    for name in (
        "ProducerConfig",
        "PushConsumerConfig",
        "LitePullConsumerConfig",
        "TransactionProducerConfig",
    ):
        cls = getattr(rocketq, name)
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            assert "_pb2" not in repr(hints[field.name]), f"{name}.{field.name}"
