"""The timer-wheel service: delay levels, arbitrary delivery times and consume-retry backoff
(DESIGN.md §8, SPEC §8.2).

Brokers store every delayed message in the system topic ``rmq_sys_wheel_timer``. This service
consumes that topic on every broker group as the consumer group :data:`TIMER_GROUP` (several
instances share its queues by rebalance), keeps each timer durably in its own TimerLog /
MessageLog / TimerWheel (``timer_log``, ``message_log``, ``wheel``, ``checkpoint``), and re-puts
each message to its real topic on the same broker group when it falls due (``enqueue``,
``dequeue``). ``service`` serves the TimerAdmin contract, ``server`` runs the process.
"""

TIMER_GROUP = "rmq_sys_timer_wheel"
"""Consumer group of the timer-wheel instances over rmq_sys_wheel_timer (and the producer group
of their re-puts)."""
