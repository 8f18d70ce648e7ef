"""The cluster-level robustness suite (issue 8), laid out like etcd's ``tests/robustness``.

Real processes (a 3-member etcd cluster, nameservers, a controller-mode broker group of 3
replicas, a static group, a timer-wheel) under client traffic while faults are injected; every
request and its outcome is journaled and checked afterwards against a model of a correct queue:

* :mod:`~tests.robustness.chaos.traffic` - producer and consumer processes (the workload);
* :mod:`~tests.robustness.chaos.recorder` - the recording client's JSON-lines journals;
* :mod:`~tests.robustness.chaos.faults` - fault injection (SIGKILL/restart, SIGSTOP/SIGCONT,
  network partitions and disk full through :mod:`~tests.robustness.chaos.netns` and
  :mod:`~tests.robustness.chaos.disk` when available);
* :mod:`~tests.robustness.chaos.model` - what a correct queue allows;
* :mod:`~tests.robustness.chaos.validate` - the checker;
* :mod:`~tests.robustness.chaos.report` - summary, and the evidence of a failed run kept;
* :mod:`~tests.robustness.chaos.scenario` - the cluster, the schedule, drain and read-back.

``python -m tests.robustness.chaos --help`` runs it exploratorily (seed, duration, faults).
"""
