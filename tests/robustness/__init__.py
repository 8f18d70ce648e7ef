"""Crash-robustness suite (STYLE.md habit 8), in the manner of etcd's ``tests/robustness``.

One module per stage:

* :mod:`tests.robustness.writer` — the traffic: a subprocess that appends deterministic
  messages under SYNC_FLUSH and prints an ACK line for every message the store acknowledged;
* :mod:`tests.robustness.harness` — the faults: starts, kills and reaps writer processes
  (SIGKILL at a random moment, or a failpoint from ``ROCKETQ_FAILPOINTS``);
* :mod:`tests.robustness.checker` — validation and report: reopens the store after the crash,
  checks every ACK against what recovery kept, and keeps the data directory of a failed run.
"""
