import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { MongoClient, MongoServerError } from 'mongodb';
import { startServer } from '../lib/server.mjs';

let server;
let client;
before(async () => {
  server = await startServer();
  client = new MongoClient(server.uri);
});
after(async () => {
  await client?.close();
  await server?.stop();
});

test('1000 documents with batchSize 7 across getMore', async () => {
  const c = client.db('node_cursor').collection('c');
  await c.insertMany(Array.from({ length: 1000 }, (_, i) => ({ _id: i })));
  const ids = [];
  for await (const d of c.find().sort({ _id: 1 }).batchSize(7)) ids.push(d._id);
  assert.deepEqual(ids, Array.from({ length: 1000 }, (_, i) => i));
  const cursor = c.find().batchSize(2);
  await cursor.next();
  assert.ok(cursor.id && !cursor.id.isZero());
  await cursor.close();
});

test('error codes', async () => {
  const db = client.db('node_errors');
  await db.collection('c').insertOne({ a: 1 });
  await assert.rejects(db.command({ foo: 1 }), (e) => e instanceof MongoServerError && e.code === 59 && e.codeName === 'CommandNotFound');
  await assert.rejects(db.collection('c').find({ a: { $foo: 1 } }).toArray(), (e) => e.code === 2 && e.codeName === 'BadValue');
  await assert.rejects(client.db('admin').command({ renameCollection: 'node_errors.missing', to: 'node_errors.x' }), (e) => e.code === 26);
  await db.createCollection('dup');
  await assert.rejects(db.createCollection('dup'), (e) => e.code === 48);
});

test('getMore with a bogus cursor id: CursorNotFound', async () => {
  const { Long } = await import('mongodb');
  const db = client.db('node_errors2');
  await db.collection('c').insertOne({ a: 1 });
  await assert.rejects(db.command({ getMore: Long.fromNumber(12345), collection: 'c' }), (e) => e.code === 43 && e.codeName === 'CursorNotFound');
});

test('aggregate stages', async () => {
  const c = client.db('node_agg').collection('sales');
  await c.insertMany([
    { _id: 1, item: 'a', price: 10, qty: 2, tags: ['x', 'y'] },
    { _id: 2, item: 'b', price: 20, qty: 1, tags: ['x'] },
    { _id: 3, item: 'a', price: 5, qty: 10, tags: [] },
  ]);
  const grouped = await c.aggregate([
    { $match: { price: { $gte: 5 } } },
    { $group: { _id: '$item', total: { $sum: { $multiply: ['$price', '$qty'] } }, n: { $sum: 1 } } },
    { $sort: { total: -1 } },
  ]).toArray();
  assert.deepEqual(grouped, [{ _id: 'a', total: 70, n: 2 }, { _id: 'b', total: 20, n: 1 }]);
  const unwound = await c.aggregate([{ $unwind: '$tags' }, { $count: 'n' }]).toArray();
  assert.deepEqual(unwound, [{ n: 3 }]);
  const shaped = await c.aggregate([
    { $sort: { _id: 1 } }, { $skip: 1 }, { $limit: 1 }, { $addFields: { rev: { $multiply: ['$price', '$qty'] } } }, { $unset: ['tags'] }, { $project: { _id: 0, item: 1, rev: 1 } },
  ]).toArray();
  assert.deepEqual(shaped, [{ item: 'b', rev: 20 }]);
  await assert.rejects(c.aggregate([{ $foo: 1 }]).toArray(), (e) => e.code === 40324);
});

test('admin: list databases, collections, indexes, stats', async () => {
  const db = client.db('node_admin');
  await db.collection('c').insertMany([{ a: 1 }, { a: 2 }]);
  await db.collection('c').createIndex({ a: 1 });
  const dbs = await client.db('admin').admin().listDatabases();
  assert.ok(dbs.databases.some((d) => d.name === 'node_admin'));
  const colls = await db.listCollections().toArray();
  assert.deepEqual(colls.map((c) => c.name), ['c']);
  const idx = await db.collection('c').indexes();
  assert.deepEqual(idx.map((i) => i.name), ['_id_', 'a_1']);
  const stats = await db.stats();
  assert.equal(stats.objects, 2);
  assert.ok(stats.dataSize > 0);
  const v = await db.command({ validate: 'c' });
  assert.equal(v.valid, true);
  await db.collection('c').rename('d');
  assert.deepEqual((await db.listCollections().toArray()).map((c) => c.name), ['d']);
  assert.equal(await db.collection('d').drop(), true);
  assert.equal(await db.dropDatabase(), true);
});
