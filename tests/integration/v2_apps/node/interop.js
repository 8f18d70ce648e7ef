'use strict';
// Only sends or only receives (for messages crossing between RocketQ's SDK and this one).
//
//   node interop.js ENDPOINT TOPIC GROUP COUNT send      sends COUNT messages "node-{i}"
//   node interop.js ENDPOINT TOPIC GROUP COUNT receive   receives and acks COUNT messages
//
// Sent messages carry tag "FromNode", key "nk{i}" and property origin=node-sdk. Prints the ids
// sent, or every message received.
const { Producer, SimpleConsumer, FilterExpression } = require('rocketmq-client-nodejs');
const { clientOptions, run, view } = require('./common');

async function send(endpoint, topic, count) {
  const producer = new Producer(clientOptions(endpoint, { topics: [topic] }));
  await producer.startup();
  const sent = [];
  try {
    for (let i = 0; i < count; i++) {
      const receipt = await producer.send({
        topic,
        body: Buffer.from(`node-${i}`),
        tag: 'FromNode',
        keys: [`nk${i}`],
        properties: new Map([['origin', 'node-sdk']]),
      });
      sent.push(receipt.messageId);
    }
  } finally {
    await producer.shutdown();
  }
  return { sent };
}

async function receive(endpoint, topic, group, count) {
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
  return { received };
}

run(async ({ endpoint, topic, group, count, extra: [mode] }) => {
  if (mode === 'send') return send(endpoint, topic, count);
  if (mode === 'receive') return receive(endpoint, topic, group, count);
  throw new Error(`mode must be send or receive, not ${mode}`);
});
