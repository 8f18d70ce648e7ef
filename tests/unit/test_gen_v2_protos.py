"""tools/gen_v2_protos.py's pieces that need no network: reading a serialized descriptor out of a
generated module's text (without running it) and re-rooting the generated imports."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2

from tools.gen_v2_protos import OUT_PACKAGE, V2GenerationError, rewrite, serialized_descriptor

pytestmark = pytest.mark.unit


def test_the_descriptor_bytes_are_read_from_the_text_not_executed() -> None:
    fd = descriptor_pb2.FileDescriptorProto(name="definition.proto", package="apache.rocketmq.v2")
    data = fd.SerializeToString()
    text = (
        "import os\nos.system('never run')\n"
        f"DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile({data!r})\n"
    )
    assert serialized_descriptor(text) == data
    with pytest.raises(V2GenerationError):
        serialized_descriptor("x = 1\n")


def test_generated_imports_are_rerooted_under_the_gateway_package() -> None:
    text = (
        "import definition_pb2 as definition__pb2\n"
        "_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'service_pb2', _globals)\n"
    )
    out = rewrite(text)
    assert f"from {OUT_PACKAGE} import definition_pb2 as definition__pb2" in out
    assert f"'{OUT_PACKAGE}.service_pb2', _globals)" in out
