const assert = require('assert');
db = db.getSiblingDB('sh_cursor');
db.dropDatabase();
const docs = [];
for (let i = 0; i < 1000; i++) docs.push({ _id: i });
db.c.insertMany(docs);
let seen = 0;
let last = -1;
db.c.find().sort({ _id: 1 }).batchSize(7).forEach((d) => { assert.strictEqual(d._id, last + 1); last = d._id; seen++; });
assert.strictEqual(seen, 1000);
const cur = db.c.find().batchSize(10);
assert.strictEqual(cur.next()._id !== undefined, true);
assert.strictEqual(cur.objsLeftInBatch(), 9);

function code(fn) {
  let result;
  try { result = fn(); } catch (e) { return e.code; }
  // Some helpers return ok:0 replies instead of throwing.
  if (result && result.ok === 0) return result.code;
  throw new Error('expected an error, got ' + JSON.stringify(result));
}
assert.strictEqual(code(() => db.runCommand({ foo: 1 })), 59);
assert.strictEqual(code(() => db.c.find({ a: { $foo: 1 } }).toArray()), 2);
assert.strictEqual(code(() => db.adminCommand({ renameCollection: 'sh_cursor.missing', to: 'sh_cursor.x' })), 26);
assert.strictEqual(code(() => db.runCommand({ getMore: NumberLong(12345), collection: 'c' })), 43);
assert.strictEqual(code(() => db.createCollection('c')), 48);
print('cursors/errors ok');
