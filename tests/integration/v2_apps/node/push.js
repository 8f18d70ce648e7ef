'use strict';
// A PushConsumer whose listener fails once.
//
//   node push.js ENDPOINT TOPIC GROUP COUNT
//
// Sends COUNT messages, then consumes them with a PushConsumer: the listener answers FAILURE the
// first time it sees the first message (the SDK then changes its invisible duration by the
// server's backoff policy and the message comes back with delivery attempt 2) and SUCCESS
// otherwise. Prints what was sent and each delivery the listener saw.
const {
  Producer, PushConsumer, ConsumeResult, FilterExpression,
} = require('rocketmq-client-nodejs');
const {
  clientOptions, run, shutdownWithin, until, view,
} = require('./common');

// PushConsumer.shutdown() first waits for its receive in flight, a long poll of up to 20 s (the
// server's setting); the app has what it came for by then, and exits after this much.
const PUSH_SHUTDOWN_GRACE_MS = 3_000;

run(async ({ endpoint, topic, group, count }) => {
  const producer = new Producer(clientOptions(endpoint, { topics: [topic] }));
  await producer.startup();
  const sent = [];
  try {
    for (let i = 0; i < count; i++) {
      sent.push((await producer.send({ topic, body: Buffer.from(`push-${i}`) })).messageId);
    }
  } finally {
    await producer.shutdown();
  }
  const seen = [];
  const done = new Set();
  let failed = null;
  const consumer = new PushConsumer(clientOptions(endpoint, {
    consumerGroup: group,
    subscriptions: new Map([[topic, FilterExpression.SUB_ALL]]),
    messageListener: {
      async consume(m) {
        seen.push(view(m));
        if (failed === null) {
          failed = m.messageId;
          return ConsumeResult.FAILURE;
        }
        done.add(m.messageId);
        return ConsumeResult.SUCCESS;
      },
    },
  }));
  await consumer.startup();
  try {
    await until(() => done.size === count, 'every message consumed');
  } finally {
    await shutdownWithin(consumer, PUSH_SHUTDOWN_GRACE_MS);
  }
  return { sent, seen, failed };
});
