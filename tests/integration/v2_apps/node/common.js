'use strict';
// What every Node app here shares: its arguments, a quiet logger, the JSON result line and a
// deadline. The apps are ordinary RocketMQ 5 applications of the official Node.js SDK
// (rocketmq-client-nodejs, installed by tools/install_node.sh); only their endpoint is RocketQ's.
//
//   node APP.js ENDPOINT TOPIC GROUP COUNT [EXTRA...]
//
// Each prints exactly one JSON object on its last stdout line; the SDK's log goes to stderr.

const { format } = require('node:util');

const DEADLINE_MS = Number(process.env.RQ_NODE_DEADLINE_MS ?? 90_000);
const VERBOSE = Boolean(process.env.RQ_NODE_VERBOSE);

function parseArgs() {
  const [endpoint, topic, group, count, ...extra] = process.argv.slice(2);
  if (!endpoint || !topic || !group || !count) {
    throw new Error('usage: node APP.js ENDPOINT TOPIC GROUP COUNT [EXTRA...]');
  }
  return { endpoint, topic, group, count: Number(count), extra };
}

// The SDK's default logger writes ~/logs/rocketmq/*.log; the tests read stderr instead.
const logger = {
  info(...args) { if (VERBOSE) console.error(`INFO ${format(...args)}`); },
  debug(...args) { if (VERBOSE) console.error(`DEBUG ${format(...args)}`); },
  warn(...args) { console.error(`WARN ${format(...args)}`); },
  error(...args) { console.error(`ERROR ${format(...args)}`); },
};

function clientOptions(endpoint, extra = {}) {
  return { endpoints: endpoint, namespace: '', logger, requestTimeout: 10_000, ...extra };
}

function until(check, what, timeoutMs = 60_000, everyMs = 50) {
  const end = Date.now() + timeoutMs;
  return new Promise((resolve, reject) => {
    const tick = () => {
      if (check()) return resolve();
      if (Date.now() > end) return reject(new Error(`timed out waiting for ${what}`));
      setTimeout(tick, everyMs);
    };
    tick();
  });
}

function view(m) {
  return {
    id: m.messageId,
    body: m.body.toString(),
    tag: m.tag ?? null,
    keys: m.keys,
    group: m.messageGroup ?? null,
    attempt: m.deliveryAttempt,
    properties: Object.fromEntries(m.properties),
    received_ms: Date.now(),
  };
}

// Starts client.shutdown() and waits for it at most graceMs (the process exits after the result).
function shutdownWithin(client, graceMs) {
  let timer;
  const grace = new Promise((resolve) => { timer = setTimeout(resolve, graceMs); });
  return Promise.race([client.shutdown(), grace]).finally(() => clearTimeout(timer));
}

// Runs main(args); prints its result; exits (the SDK keeps timers that would hold the process).
function run(main) {
  const deadline = setTimeout(() => {
    console.error(`deadline of ${DEADLINE_MS} ms passed`);
    process.exit(3);
  }, DEADLINE_MS);
  main(parseArgs()).then(
    (result) => {
      clearTimeout(deadline);
      process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(0));
    },
    (err) => {
      console.error(err);
      process.exit(1);
    },
  );
}

module.exports = {
  clientOptions, logger, run, shutdownWithin, until, view,
};
