"""The RocketQ storage engine: commitlog, consume queues, index files, flush, recovery, retention.

This package knows nothing of gRPC or protobuf (DESIGN.md §2); the broker's handlers translate.
"""
