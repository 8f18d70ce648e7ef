"""The ``rocketq`` command.

Server and store subcommands import ``services`` lazily, inside the command, so that the
client library itself (``import rocketq``) never depends on the server side.
"""
