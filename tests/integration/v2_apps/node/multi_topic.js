'use strict';
// A producer of several topics: it starts, and sends one message to each.
//
//   node multi_topic.js ENDPOINT TOPIC - 1 MORE_TOPIC...
//
// The Node SDK 1.0.8 opens its Telemetry stream while it still fetches the other topics' routes
// and only then waits for the settings reply: a reply that came early is lost and startup()
// waits forever unless the server writes it again. Prints the ids sent and how long startup took.
const { Producer } = require('rocketmq-client-nodejs');
const { clientOptions, run } = require('./common');

run(async ({ endpoint, topic, extra }) => {
  const topics = [topic, ...extra];
  const t0 = Date.now();
  const producer = new Producer(clientOptions(endpoint, { topics }));
  await producer.startup();
  const startupMs = Date.now() - t0;
  const sent = {};
  try {
    for (const t of topics) {
      sent[t] = (await producer.send({ topic: t, body: Buffer.from(t) })).messageId;
    }
  } finally {
    await producer.shutdown();
  }
  return { startup_ms: startupMs, sent };
});
