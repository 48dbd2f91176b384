#!/usr/bin/env node
// A qlayer consumer in Node.js, written from layer/api/proto/qlayer/v1/queue.proto and
// docs/api.md alone: it subscribes to a queue, cancels the first --cancel messages it gets
// (they return to the queue and come back), acks everything else, and stops once --count
// acks are confirmed. It prints one JSON line per event on stdout and a summary at the end.
//
//   npm ci
//   node consumer.js --server 127.0.0.1:7070 --queue orders --count 10 [--cancel 2]
//                    [--token TOKEN] [--backlog 10] [--timeout 60]
//
// Exit codes: 0 done, 1 the server refused or the stream failed, 2 the timeout passed.
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

function parseArgs(argv) {
  const args = { server: '127.0.0.1:7070', count: 1, cancel: 0, backlog: 10, timeout: 60 };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`--${key} needs a value`);
    args[key] = ['count', 'cancel', 'backlog', 'timeout'].includes(key) ? Number(value) : value;
  }
  if (!args.queue) throw new Error('--queue is required');
  return args;
}

function loadService(protoRoot) {
  const definition = protoLoader.loadSync('qlayer/v1/queue.proto', {
    includeDirs: [protoRoot],
    longs: String, // int64 offsets as decimal strings: no precision lost past 2^53
    enums: String,
    defaults: true,
    oneofs: true, // frame.body names the field of the oneof that is set
  });
  return grpc.loadPackageDefinition(definition).qlayer.v1.QueueService;
}

// Offsets of one partition as inclusive runs: [7, 9, 10, 11] -> [7, 7, 9, 11].
function toRuns(offsets) {
  const sorted = [...offsets].map(BigInt).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const runs = [];
  for (const offset of sorted) {
    if (runs.length && runs[runs.length - 1] + 1n === offset) runs[runs.length - 1] = offset;
    else runs.push(offset, offset);
  }
  return runs.map(String);
}

// One Ack frame for a batch of messages: grouped by topic and partition.
function ackFrame(requestId, op, messages) {
  const byPartition = new Map();
  for (const m of messages) {
    const key = `${m.topic}\u0000${m.partition}`;
    if (!byPartition.has(key)) byPartition.set(key, { topic: m.topic, partition: m.partition, offsets: [] });
    byPartition.get(key).offsets.push(m.offset);
  }
  const offsets = [...byPartition.values()].map((p) => ({
    topic: p.topic,
    partition: p.partition,
    runs: toRuns(p.offsets),
  }));
  return { ack: { requestId: String(requestId), op, offsets, seconds: 0 } };
}

const bookmark = (m) => `${m.topic}/${m.partition}/${m.offset}`;
const emit = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);

function main() {
  const args = parseArgs(process.argv.slice(2));
  const protoRoot = args.proto || path.resolve(__dirname, '../../layer/api/proto');
  const QueueService = loadService(protoRoot);
  const client = new QueueService(args.server, grpc.credentials.createInsecure());
  const metadata = new grpc.Metadata();
  if (args.token) metadata.set('authorization', `Bearer ${args.token}`);

  const call = client.Subscribe(metadata);
  const pending = new Map(); // requestId -> {op, bookmarks}: sent, not yet confirmed
  const acked = [];
  const cancelled = [];
  const failed = [];
  let cancelsSent = 0; // sent, confirmed or not: an earlier frame's cancels may be in flight
  let nextRequest = 1;
  let closing = false;

  const timer = setTimeout(() => {
    process.stderr.write(`consumer.js: timeout after ${args.timeout} s (${acked.length} acked)\n`);
    process.exit(2);
  }, args.timeout * 1000);

  function send(op, messages) {
    if (!messages.length) return;
    const id = nextRequest++;
    pending.set(id, { op, bookmarks: messages.map(bookmark) });
    call.write(ackFrame(id, op, messages));
  }

  function maybeClose() {
    if (!closing && acked.length >= args.count && pending.size === 0) {
      closing = true;
      call.write({ close: {} }); // the server ends the stream; leftover leases return at once
      call.end();
    }
  }

  call.on('data', (frame) => {
    switch (frame.body) {
      case 'subscribed':
        emit({ event: 'subscribed', id: frame.subscribed.subscriptionId, backlog: frame.subscribed.backlog });
        break;
      case 'messages': {
        const toCancel = [];
        const toAck = [];
        for (const m of frame.messages.messages) {
          if (m.barrier) continue; // barriers are never acked
          // set on a queue with on_unparseable = "deliver": the payload did not parse
          if (m.parseError) emit({ event: 'unparseable', bookmark: bookmark(m), parseError: m.parseError });
          if (m.cancels === 0 && cancelsSent + toCancel.length < args.cancel) toCancel.push(m);
          else toAck.push(m);
        }
        cancelsSent += toCancel.length;
        send('ACK_OP_CANCEL', toCancel);
        send('ACK_OP_ACK', toAck);
        break;
      }
      case 'ackResult': {
        const id = Number(frame.ackResult.requestId);
        const sent = pending.get(id);
        pending.delete(id);
        const refused = new Set(frame.ackResult.failures.map((f) => f.bookmark));
        for (const f of frame.ackResult.failures) failed.push({ bookmark: f.bookmark, error: f.error, message: f.message });
        for (const b of sent.bookmarks) {
          if (refused.has(b)) continue;
          (sent.op === 'ACK_OP_CANCEL' ? cancelled : acked).push(b);
          emit({ event: sent.op === 'ACK_OP_CANCEL' ? 'cancelled' : 'acked', bookmark: b });
        }
        maybeClose();
        break;
      }
      case 'error':
        process.stderr.write(`consumer.js: server error ${frame.error.code}: ${frame.error.message}\n`);
        break;
      default:
        break; // a frame this consumer does not use (e.g. replaced)
    }
  });

  // The first frame: which queue, and at most how many unacked messages at a time.
  call.write({
    subscribe: { queue: args.queue, maxBacklog: args.backlog, clientName: `node:${process.pid}` },
  });

  call.on('error', (err) => {
    if (closing && err.code === grpc.status.CANCELLED) return;
    const code = (err.metadata && err.metadata.get('qlayer-error-code')[0]) || '';
    const name = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code);
    process.stderr.write(`consumer.js: ${name}${code ? ` ${code}` : ''}: ${err.details}\n`);
    clearTimeout(timer);
    process.exitCode = 1;
    client.close();
  });

  call.on('end', () => {
    clearTimeout(timer);
    if (process.exitCode) return;
    emit({ event: 'done', acked: acked.length, cancelled: cancelled.length, failed });
    client.close();
  });
}

try {
  main();
} catch (err) {
  process.stderr.write(`consumer.js: ${err.message}\n`);
  process.exit(1);
}
