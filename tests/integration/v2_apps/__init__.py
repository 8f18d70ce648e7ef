"""Applications written against the official RocketMQ 5 Python SDK, run as their own processes
by tests/integration/test_gateway_official_sdk.py (never imported by the test process)."""
