"""Code generated from proto/ by tools/gen_protos.py. DO NOT EDIT.

Regenerate with `python tools/gen_protos.py` (make gen-protos); CI runs it with --check.
Generated with grpcio-tools 1.85.1, mypy-protobuf 5.1.0.
Modules: rocketq._api.rocketq.v1.<name>_pb2 (messages) and <name>_pb2_grpc (stubs, servicers).
"""
