"""Test support shared by every tier: waiting on observable state, raw gRPC clients, clusters.

One helper per mechanism (STYLE.md habit 13): before writing a polling loop, a raw stub or a
process launcher in a test file, use or extend the one here.
"""
