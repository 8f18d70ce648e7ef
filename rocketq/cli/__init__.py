"""The client commands of ``rocketq``.

The server and store subcommands live on the server side (``services.cli``), which adds them
to this group; the client library (``import rocketq``) never depends on the servers.
"""
