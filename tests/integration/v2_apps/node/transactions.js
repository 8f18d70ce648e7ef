'use strict';
// Transactional messages: committed, rolled back, and left open for the server to ask about.
//
//   node transactions.js ENDPOINT TOPIC GROUP COUNT
//
// Sends COUNT transactional messages: message i is committed when i % 3 == 0, rolled back when
// i % 3 == 1 and left open otherwise. The producer's TransactionChecker commits the open ones
// when the server asks (and rolls back anything else it is asked about, recording it). A
// SimpleConsumer receives until it has every committed and every checked message. Prints the ids
// of each kind, what the checker was asked about, and what was received.
const { Producer, SimpleConsumer, FilterExpression } = require('rocketmq-client-nodejs');
const { TransactionResolution } = require(
  'rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb',
);
const { clientOptions, run, until } = require('./common');

run(async ({ endpoint, topic, group, count }) => {
  const open = new Set();
  const asked = [];
  const checker = {
    async check(messageView) {
      asked.push(messageView.messageId);
      return open.has(messageView.messageId)
        ? TransactionResolution.COMMIT
        : TransactionResolution.ROLLBACK;
    },
  };
  const producer = new Producer(clientOptions(endpoint, { topics: [topic], checker }));
  await producer.startup();
  const committed = [];
  const rolledBack = [];
  try {
    for (let i = 0; i < count; i++) {
      const tx = producer.beginTransaction();
      const receipt = await producer.send({ topic, body: Buffer.from(`tx-${i}`) }, tx);
      if (i % 3 === 0) {
        await tx.commit();
        committed.push(receipt.messageId);
      } else if (i % 3 === 1) {
        await tx.rollback();
        rolledBack.push(receipt.messageId);
      } else {
        open.add(receipt.messageId);
      }
    }
    // The producer must stay up to answer the server's check.
    await until(() => [...open].every((id) => asked.includes(id)), 'the checks of open ones');
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
    while (received.length < committed.length + open.size) {
      for (const m of await consumer.receive(16, 15_000)) {
        received.push(m.messageId);
        await consumer.ack(m);
      }
    }
  } finally {
    await consumer.shutdown();
  }
  return { committed, rolled_back: rolledBack, open: [...open], asked, received };
});
