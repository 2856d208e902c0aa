import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { MongoClient, ObjectId, MongoBulkWriteError, MongoServerError, Long, Decimal128, Binary } from 'mongodb';
import { startServer } from '../lib/server.mjs';

let server;
let client;
let n = 0;
const freshDb = () => client.db(`node_crud_${n++}`);

before(async () => {
  server = await startServer();
  client = new MongoClient(server.uri);
  await client.connect();
});
after(async () => {
  await client?.close();
  await server?.stop();
});

test('hello shape with default connection settings', async () => {
  const hello = await client.db('admin').command({ hello: 1 });
  assert.equal(hello.isWritablePrimary, true);
  assert.equal(hello.maxWireVersion, 21);
  assert.equal(hello.maxBsonObjectSize, 16 * 1024 * 1024);
  const info = await client.db('admin').command({ buildInfo: 1 });
  assert.match(info.version, /^7\.0/);
  assert.deepEqual(await client.db('admin').command({ ping: 1 }), { ok: 1 });
});

test('insertOne/insertMany and typed round trip', async () => {
  const db = freshDb();
  const r = await db.collection('c').insertOne({ x: 1 });
  assert.ok(r.insertedId instanceof ObjectId);
  const doc = {
    _id: 'typed', long: Long.fromString('9007199254740993'), dec: Decimal128.fromString('1.25'),
    bin: new Binary(Buffer.from([0, 1, 255])), date: new Date(1700000000123), arr: [1, 'a', null, { k: 'v' }], nested: { a: { b: 1.5 } },
  };
  await db.collection('c').insertOne(doc);
  const back = await db.collection('c').findOne({ _id: 'typed' }, { promoteLongs: false });
  assert.deepEqual(Object.keys(back), Object.keys(doc));
  assert.equal(back.long.toString(), '9007199254740993');
  assert.equal(back.dec.toString(), '1.25');
  assert.deepEqual([...back.bin.buffer], [0, 1, 255]);
  assert.equal(back.date.getTime(), 1700000000123);
  assert.deepEqual(back.arr, doc.arr);
  assert.deepEqual(back.nested, doc.nested);
});

test('duplicate _id: ordered and unordered BulkWriteError', async () => {
  const c = freshDb().collection('c');
  await c.insertOne({ _id: 1 });
  await assert.rejects(c.insertMany([{ _id: 0 }, { _id: 1 }, { _id: 2 }]), (e) => {
    assert.ok(e instanceof MongoBulkWriteError);
    assert.equal(e.result.insertedCount, 1);
    const errs = e.writeErrors.map((w) => [w.index, w.code]);
    assert.deepEqual(errs, [[1, 11000]]);
    // The Node driver keeps index/code/errmsg of bulk write errors (keyPattern is checked via insertOne below).
    assert.match(e.writeErrors[0].errmsg, /^E11000 duplicate key error collection: node_crud_\d+\.c index: _id_ dup key: \{ _id: 1 \}/);
    return true;
  });
  await assert.rejects(c.insertMany([{ _id: 3 }, { _id: 1 }, { _id: 4 }, { _id: 0 }], { ordered: false }), (e) => {
    assert.deepEqual(e.writeErrors.map((w) => [w.index, w.code]), [[1, 11000], [3, 11000]]);
    return true;
  });
  const ids = (await c.find().sort({ _id: 1 }).toArray()).map((d) => d._id);
  assert.deepEqual(ids, [0, 1, 3, 4]);
  await assert.rejects(c.insertOne({ _id: 4 }), (e) => e instanceof MongoServerError && e.code === 11000 && e.keyValue._id === 4);
});

test('find with filter, projection, sort, skip, limit; count and distinct', async () => {
  const c = freshDb().collection('c');
  await c.insertMany(Array.from({ length: 20 }, (_, i) => ({ _id: i, a: i % 3, b: i, sub: { x: i } })));
  const got = await c.find({ a: 1 }).sort({ b: -1 }).skip(1).limit(3).toArray();
  assert.deepEqual(got.map((d) => d.b), [16, 13, 10]);
  assert.deepEqual(await c.findOne({ _id: 5 }, { projection: { b: 1 } }), { _id: 5, b: 5 });
  assert.deepEqual(await c.findOne({ _id: 5 }, { projection: { sub: 0 } }), { _id: 5, a: 2, b: 5 });
  assert.equal(await c.countDocuments({ a: 0 }), 7);
  assert.equal(await c.estimatedDocumentCount(), 20);
  assert.deepEqual((await c.distinct('a')).sort(), [0, 1, 2]);
});

test('updates: operators, upsert, arrayFilters, pipeline, replace', async () => {
  const c = freshDb().collection('c');
  await c.insertOne({ _id: 1, a: 1, arr: [95, 102, 90, 150] });
  let r = await c.updateOne({ _id: 1 }, { $inc: { a: 2 }, $set: { 'n.m': 1 }, $push: { arr: 1 } });
  assert.equal(r.matchedCount, 1);
  assert.equal(r.modifiedCount, 1);
  assert.deepEqual(await c.findOne({ _id: 1 }), { _id: 1, a: 3, arr: [95, 102, 90, 150, 1], n: { m: 1 } });
  await c.updateOne({ _id: 1 }, { $set: { 'arr.$[el]': 100 } }, { arrayFilters: [{ el: { $gte: 100 } }] });
  assert.deepEqual((await c.findOne({ _id: 1 })).arr, [95, 100, 90, 100, 1]);
  r = await c.updateOne({ k: 'x' }, { $set: { v: 1 } }, { upsert: true });
  assert.equal(r.upsertedCount, 1);
  assert.ok(r.upsertedId instanceof ObjectId);
  await c.updateOne({ _id: 1 }, [{ $set: { total: { $add: ['$a', 10] } } }, { $unset: 'arr' }]);
  assert.deepEqual(await c.findOne({ _id: 1 }), { _id: 1, a: 3, n: { m: 1 }, total: 13 });
  r = await c.replaceOne({ _id: 1 }, { z: 1 });
  assert.equal(r.modifiedCount, 1);
  assert.deepEqual(await c.findOne({ _id: 1 }), { _id: 1, z: 1 });
  r = await c.updateMany({}, { $set: { all: true } });
  assert.equal(r.matchedCount, 2);
  await assert.rejects(c.updateOne({ _id: 1 }, { $set: { _id: 2 } }), (e) => e.code === 66);
});

test('deletes and findOneAndX', async () => {
  const c = freshDb().collection('c');
  await c.insertMany([{ _id: 1, n: 1 }, { _id: 2, n: 2 }, { _id: 3, n: 3 }]);
  assert.deepEqual(await c.findOneAndUpdate({ _id: 1 }, { $inc: { n: 10 } }), { _id: 1, n: 1 });
  assert.deepEqual(await c.findOneAndUpdate({ _id: 1 }, { $inc: { n: 10 } }, { returnDocument: 'after' }), { _id: 1, n: 21 });
  assert.deepEqual(await c.findOneAndReplace({ _id: 2 }, { z: 1 }, { returnDocument: 'after' }), { _id: 2, z: 1 });
  assert.deepEqual(await c.findOneAndDelete({ n: { $exists: true } }, { sort: { n: -1 } }), { _id: 1, n: 21 });
  assert.equal(await c.findOneAndDelete({ _id: 99 }), null);
  assert.equal((await c.deleteOne({ _id: 2 })).deletedCount, 1);
  assert.equal((await c.deleteMany({})).deletedCount, 1);
});
