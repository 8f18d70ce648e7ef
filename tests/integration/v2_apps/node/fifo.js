'use strict';
// FIFO messages of two message groups, received by a FIFO consumer group.
//
//   node fifo.js ENDPOINT TOPIC GROUP COUNT
//
// Sends COUNT messages alternating between message groups "order-a" and "order-b" (bodies
// "order-a-0", "order-b-1", ...), then receives them with a SimpleConsumer, acking each message
// as it arrives. Prints the bodies in the order received with their groups and attempts.
const { Producer, SimpleConsumer, FilterExpression } = require('rocketmq-client-nodejs');
const { clientOptions, run, view } = require('./common');

run(async ({ endpoint, topic, group, count }) => {
  const producer = new Producer(clientOptions(endpoint, { topics: [topic] }));
  await producer.startup();
  const sent = [];
  try {
    for (let i = 0; i < count; i++) {
      const messageGroup = i % 2 === 0 ? 'order-a' : 'order-b';
      const body = Buffer.from(`${messageGroup}-${i}`);
      sent.push((await producer.send({ topic, body, messageGroup })).messageId);
    }
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
    while (received.length < count) {
      for (const m of await consumer.receive(16, 15_000)) {
        received.push(view(m));
        await consumer.ack(m);
      }
    }
  } finally {
    await consumer.shutdown();
  }
  return { sent, received };
});
