'use strict';
// Produce, then receive with a SimpleConsumer.
//
//   node produce_consume.js ENDPOINT TOPIC GROUP COUNT
//
// Sends COUNT normal messages (tag "TagA", a key and a property each), then receives until each
// is acked: the first message received is not acked but its invisible duration is changed to 1 s
// (it comes back with delivery attempt 2), the second is left alone after a receive with a 2 s
// invisible duration (it comes back by itself); every other delivery is acked. Prints what was
// sent and every delivery seen.
const { Producer, SimpleConsumer, FilterExpression } = require('rocketmq-client-nodejs');
const { clientOptions, run, view } = require('./common');

run(async ({ endpoint, topic, group, count }) => {
  const producer = new Producer(clientOptions(endpoint, { topics: [topic] }));
  await producer.startup();
  const sent = [];
  try {
    for (let i = 0; i < count; i++) {
      const receipt = await producer.send({
        topic,
        body: Buffer.from(`node-${i}`),
        tag: 'TagA',
        keys: [`key-${i}`],
        properties: new Map([['origin', 'node-sdk']]),
      });
      sent.push({ id: receipt.messageId, offset: receipt.offset });
    }
  } finally {
    await producer.shutdown();
  }
  const consumer = new SimpleConsumer(clientOptions(endpoint, {
    consumerGroup: group,
    subscriptions: new Map([[topic, new FilterExpression('TagA')]]),
    awaitDuration: 5_000,
  }));
  await consumer.startup();
  const received = [];
  const acked = new Set();
  let changed = null;
  let leftAlone = null;
  try {
    while (acked.size < count) {
      // A short invisible time only while one message is still to be left alone.
      const invisibleMs = leftAlone === null && changed !== null ? 2_000 : 15_000;
      for (const m of await consumer.receive(1, invisibleMs)) {
        received.push({ ...view(m), invisible_ms: invisibleMs });
        if (changed === null) {
          changed = m.messageId;
          await consumer.changeInvisibleDuration(m, 1_000);
        } else if (leftAlone === null && m.messageId !== changed) {
          leftAlone = m.messageId;
        } else {
          await consumer.ack(m);
          acked.add(m.messageId);
        }
      }
    }
  } finally {
    await consumer.shutdown();
  }
  return { sent, received, changed, left_alone: leftAlone };
});
