'use strict';
// A delayed message beside an ordinary one.
//
//   node delayed.js ENDPOINT TOPIC GROUP DELAY_MS
//
// Sends one message with a delivery timestamp DELAY_MS ahead (the Node SDK sends milliseconds)
// and then one ordinary message, receives both with a SimpleConsumer and acks them. Prints the
// ids, the delivery time asked for and each delivery with the time it was received (ms).
const { Producer, SimpleConsumer, FilterExpression } = require('rocketmq-client-nodejs');
const { clientOptions, run, view } = require('./common');

run(async ({ endpoint, topic, group, count: delayMs }) => {
  const producer = new Producer(clientOptions(endpoint, { topics: [topic] }));
  await producer.startup();
  const deliverMs = Date.now() + delayMs;
  let later;
  let now;
  try {
    const at = new Date(deliverMs);
    later = (await producer.send({ topic, body: Buffer.from('later'), deliveryTimestamp: at }))
      .messageId;
    now = (await producer.send({ topic, body: Buffer.from('now') })).messageId;
  } finally {
    await producer.shutdown();
  }
  const consumer = new SimpleConsumer(clientOptions(endpoint, {
    consumerGroup: group,
    subscriptions: new Map([[topic, FilterExpression.SUB_ALL]]),
    awaitDuration: 5_000,
  }));
  await consumer.startup();
  const received = [];
  try {
    while (received.length < 2) {
      for (const m of await consumer.receive(16, 15_000)) {
        received.push({ ...view(m), delivery_ms: m.deliveryTimestamp?.getTime() ?? null });
        await consumer.ack(m);
      }
    }
  } finally {
    await consumer.shutdown();
  }
  return { later, now, deliver_ms: deliverMs, received };
});
