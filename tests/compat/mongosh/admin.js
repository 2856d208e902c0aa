const assert = require('assert');
// Shell values live in another realm, so compare by canonical JSON (order-sensitive, like BSON).
function eq(actual, expected, msg) {
  const a = JSON.stringify(actual);
  const b = JSON.stringify(expected);
  if (a !== b) throw new Error(`${msg || 'mismatch'}: got ${a}, want ${b}`);
}
db = db.getSiblingDB('sh_admin');
db.dropDatabase();
assert.strictEqual(db.hello().isWritablePrimary, true);
assert.ok(db.version().startsWith('7.0'), db.version());
db.createCollection('a');
db.b.insertOne({ x: 1 });
eq(db.getCollectionNames().sort(), ['a', 'b']);
const dbs = db.adminCommand({ listDatabases: 1 });
assert.ok(dbs.databases.some((d) => d.name === 'sh_admin'), JSON.stringify(dbs));
assert.strictEqual(db.b.createIndex({ x: 1 }), 'x_1');
eq(db.b.getIndexes().map((i) => i.name), ['_id_', 'x_1']);
const stats = db.stats();
assert.strictEqual(stats.db, 'sh_admin');
// dbStats counts are Int64 (Long) in MongoDB 7.0.
assert.strictEqual(Number(stats.collections), 2);
assert.strictEqual(Number(stats.objects), 1);
assert.ok(stats.dataSize > 0);
const st = db.serverStatus();
assert.ok(st.opcounters.insert >= 1);
assert.strictEqual(db.b.validate().valid, true);
db.b.renameCollection('c');
eq(db.getCollectionNames().sort(), ['a', 'c']);
assert.strictEqual(db.c.drop(), true);
eq(db.getCollectionNames(), ['a']);
const dropped = db.dropDatabase();
assert.strictEqual(dropped.ok, 1);
assert.ok(!db.adminCommand({ listDatabases: 1 }).databases.some((d) => d.name === 'sh_admin'));
print('admin ok');
