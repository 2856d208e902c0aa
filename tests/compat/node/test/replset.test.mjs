// A three-member replica set through the Node driver: discovery by replicaSet=, w:"majority"
// by default, failover after kill -9 of the primary with retryable writes, and secondary
// reads.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { MongoClient } from 'mongodb';
import { startServer } from '../lib/server.mjs';

let servers = [];
let client;

before(async () => {
  servers = await Promise.all([0, 1, 2].map(() => startServer(['--replSet', 'rs0'])));
  const direct = new MongoClient(`${servers[0].uri}?directConnection=true`);
  await direct.db('admin').command({
    replSetInitiate: {
      _id: 'rs0',
      version: 1,
      settings: { electionTimeoutMillis: 1000, heartbeatIntervalMillis: 200 },
      members: servers.map((s, i) => ({ _id: i, host: `127.0.0.1:${s.port}` })),
    },
  });
  await direct.close();
  const hosts = servers.map((s) => `127.0.0.1:${s.port}`).join(',');
  client = new MongoClient(`mongodb://${hosts}/?replicaSet=rs0&serverSelectionTimeoutMS=30000`);
  await client.connect();
});

after(async () => {
  await client?.close();
  await Promise.all(servers.map((s) => s.stop()));
});

test('a three-member set fails over under retryable writes', async () => {
  const coll = client.db('app').collection('c');
  await coll.insertMany(Array.from({ length: 100 }, (_, i) => ({ _id: i })));
  const hello = await client.db('admin').command({ hello: 1 });
  assert.equal(hello.setName, 'rs0');
  assert.equal(hello.hosts.length, 3);
  const first = hello.primary;
  // The default write concern was w:"majority": the next primary has all 100.
  const primary = servers.find((s) => `127.0.0.1:${s.port}` === first);
  await primary.stop();
  // Let the driver see its pooled sockets to the dead primary close. Writing to one whose FIN
  // it has not processed yet fails with a bare EPIPE that this driver version does not class
  // as a network error, so it does not retry. (After SIGKILL the kernel closes the sockets;
  // the server takes no part in this race.)
  await new Promise((r) => setTimeout(r, 200));
  for (let i = 100; i < 120; i++) {
    await coll.insertOne({ _id: i });
  }
  const after = await client.db('admin').command({ hello: 1 });
  assert.notEqual(after.primary, first);
  assert.equal(await coll.countDocuments({}), 120);
  // A secondary serves reads to a client that allows them.
  const secondary = client.db('app').collection('c', { readPreference: 'secondary' });
  const deadline = Date.now() + 10_000;
  while ((await secondary.countDocuments({})) !== 120) {
    assert.ok(Date.now() < deadline, 'the secondary did not catch up');
    await new Promise((r) => setTimeout(r, 50));
  }
});

test('withTransaction commits a transfer whole and aborts on a thrown error', async () => {
  const db = client.db('bank');
  const accounts = db.collection('accounts');
  await accounts.insertMany([{ _id: 'a', balance: 100 }, { _id: 'b', balance: 0 }]);
  const session = client.startSession();
  try {
    await session.withTransaction(async () => {
      await accounts.updateOne({ _id: 'a' }, { $inc: { balance: -40 } }, { session });
      // Inside, the transaction reads its own write; outside, nobody does yet.
      assert.equal((await accounts.findOne({ _id: 'a' }, { session })).balance, 60);
      assert.equal((await accounts.findOne({ _id: 'a' })).balance, 100);
      await accounts.updateOne({ _id: 'b' }, { $inc: { balance: 40 } }, { session });
    });
    assert.deepEqual((await accounts.find().sort({ _id: 1 }).toArray()).map((d) => d.balance), [60, 40]);
    await assert.rejects(
      session.withTransaction(async () => {
        await accounts.updateOne({ _id: 'a' }, { $set: { balance: 0 } }, { session });
        throw new Error('the callback fails');
      }),
      /the callback fails/,
    );
    assert.equal((await accounts.findOne({ _id: 'a' })).balance, 60);
  } finally {
    await session.endSession();
  }
});
