"""Pop consumption: message-level load balancing as a broker capability (DESIGN.md §7).

RocketMQ 5 moved load balancing from queues to messages (PopMessageProcessor,
AckMessageProcessor, PopReviveService in Apache RocketMQ); this package does the same for
RocketQ, for ``Messaging.Pop / Ack / ChangeInvisibleTime`` and the gateway above them:

    Pop ──▶ read from the group's pop offset ──▶ checkpoint record ──▶ messages + handles
    Ack ──▶ ack record                          (both in rmq_sys_REVIVE_LOG_{cluster})
    revive loop: a checkpoint past its invisible time with unacked messages
                 ──▶ copies to %RETRY%{group} (reconsume times + 1) or %DLQ%{group}
                 ──▶ done record

| module        | what                                                                      |
|---------------|---------------------------------------------------------------------------|
| ``state``     | the revive log's records, the in-memory state rebuilt from them, handles  |
| ``processor`` | Pop (with long polling on every queue read), Ack, ChangeInvisibleTime     |
| ``revive``    | the loop that redelivers what was not acked in time                       |
| ``fifo``      | FIFO groups: ordered per message group, the groups of a queue side by side |
| ``dead_letter``| copies for redelivery: the pop retry topic or ``%DLQ%{group}``           |

The revive log is the only source of truth: every change is appended to it first and then read
back into :class:`state.PopState`, which is how a restarted broker, a slave and a slave that
became master all arrive at the same state. Pop offsets are also committed to the consumer
offset table (replicated with the broker's config), so a replay can start at the oldest
checkpoint still in flight instead of the log's beginning.
"""
