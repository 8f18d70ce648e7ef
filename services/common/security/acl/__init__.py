"""Access control: who a request is from (signature) and what it may touch (permissions).

- :mod:`.model`: users, roles, PUB/SUB/DENY permissions on topics and groups, the JSON file;
- :mod:`.store`: the file as a running server sees it (reloaded on change, secrets resolved);
- :mod:`.auth`: the RocketMQ 5 ``authorization`` header checked against a user's secret;
- :mod:`.rules`: which RPC needs what (resource, permission or role);
- :mod:`.interceptor`: the server interceptor tying them together, with the audit log.
"""
