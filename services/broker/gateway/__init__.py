"""The apache.rocketmq.v2 gateway (DESIGN.md §7); ``_v2api`` is generated at setup."""
