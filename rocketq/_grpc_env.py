"""grpc's experiments RocketQ turns off, set before grpc is imported.

grpcio 1.85's EventEngine client and listener add a thread hand-off to every call and stream
message. With the older poller, one outstanding send took p50/p99 0.43-0.45/0.71-0.76 ms
against 0.54-0.66/0.69-1.18, and a drain 264-266k against 216-236k msgs/s (``make
bench-peers``, issue 16).

grpc reads GRPC_EXPERIMENTS once, when it is first imported, so ``rocketq/__init__.py`` imports
this module first, and ``services/__init__.py`` imports ``rocketq`` before anything of its own:
every RocketQ process (SDK user, broker, nameserver, timer wheel, CLI) sets it in time. A
process that sets GRPC_EXPERIMENTS itself (to "" for grpc's defaults) keeps its value; one that
imported grpc before rocketq keeps grpc's defaults. tests/unit/test_grpc_experiments.py fails
if the installed grpc no longer knows these names.
"""

import os

EXPERIMENTS_OFF = "-event_engine_client,-event_engine_listener"

os.environ.setdefault("GRPC_EXPERIMENTS", EXPERIMENTS_OFF)
