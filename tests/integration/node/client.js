// Drives boxqueue with the real Node connector (tarantool-driver 3.1.0) and prints one JSON line
// per step; tests/integration/test_node_connector.py checks them.
const Tarantool = require('tarantool-driver');

const port = parseInt(process.argv[2], 10);

async function step(out, name, fn) {
  try {
    out[name] = { ok: await fn() };
  } catch (e) {
    out[name] = { error: e.message };
  }
}

async function main() {
  const out = {};
  const conn = new Tarantool({ host: '127.0.0.1', port, lazyConnect: true, retryStrategy: null });
  await conn.connect();
  await step(out, 'ping', () => conn.ping());
  await step(out, 'insert', () => conn.insert('test', [900, 'node']));
  await step(out, 'select', () => conn.select('test', 'primary', 10, 0, 'eq', [900]));
  await step(out, 'select_by_name_index', () => conn.select('test', 'name', 10, 0, 'eq', ['node']));
  await step(out, 'update', () => conn.update('test', 'primary', [900], [['=', 1, 'nodejs']]));
  await step(out, 'upsert', () => conn.upsert('test', [['=', 1, 'x']], [901, 'up']));
  await step(out, 'call16_select', () => conn.call('box.space.test:select', [900]));
  await step(out, 'call16_scalar', () => conn.call('box.session.user'));
  await step(out, 'duplicate', () => conn.insert('test', [901, 'dup']));
  await step(out, 'delete', () => conn.delete('test', 'primary', [900]));
  await step(out, 'delete_upserted', () => conn.delete('test', 'primary', [901]));
  await step(out, 'unknown_space', () => conn.select('nosuch', 'primary', 1, 0, 'eq', [1]));
  // tarantool/queue's API, as an application calls it with this connector
  await step(out, 'queue_create', () => conn.eval("queue.create_tube('node_jobs', 'fifo', {if_not_exists = true})"));
  await step(out, 'queue_put', () => conn.call('queue.tube.node_jobs:put', 'from node'));
  await step(out, 'queue_take', () => conn.call('queue.tube.node_jobs:take', 0));
  await step(out, 'queue_ack', () => conn.call('queue.tube.node_jobs:ack', 0));
  await step(out, 'queue_drop', () => conn.call('queue.tube.node_jobs:drop'));
  conn.disconnect();
  const auth = new Tarantool({
    host: '127.0.0.1', port, username: 'alice', password: 'secret', lazyConnect: true, retryStrategy: null,
  });
  await auth.connect();
  await step(out, 'auth_user', () => auth.call('box.session.user'));
  auth.disconnect();
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => {
  process.stderr.write(`FAIL ${e.stack}\n`);
  process.exit(1);
});
