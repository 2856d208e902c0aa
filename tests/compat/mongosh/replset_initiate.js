// mongosh's replica-set helpers against a one-member set: rs.initiate(), rs.status(),
// rs.conf(), db.hello(), and the oplog.
const init = rs.initiate();
assert.strictEqual(init.ok, 1, JSON.stringify(init));
// (try/catch, not assert.throws: mongosh runs shell helpers asynchronously.)
let again = null;
try {
  rs.initiate();
} catch (e) {
  again = e;
}
assert.ok(again && again.code === 23 && /already initialized/.test(again.message), String(again));

const status = rs.status();
assert.strictEqual(status.set, 'rs0');
assert.strictEqual(status.myState, 1);
assert.strictEqual(status.members.length, 1);
assert.strictEqual(status.members[0].stateStr, 'PRIMARY');
assert.strictEqual(status.members[0].self, true);

const conf = rs.conf();
assert.strictEqual(conf._id, 'rs0');
assert.strictEqual(conf.version, 1);
assert.strictEqual(conf.members[0].host, status.members[0].name);

const hello = db.hello();
assert.strictEqual(hello.isWritablePrimary, true);
assert.strictEqual(hello.setName, 'rs0');
assert.strictEqual(hello.primary, conf.members[0].host);

db.getSiblingDB('app').c.insertOne({ _id: 1, v: 'x' });
// Newest first, as tools read the oplog's tail.
const last = db.getSiblingDB('local').getCollection('oplog.rs').find({ ns: 'app.c' }).sort({ $natural: -1 }).limit(1).toArray()[0];
assert.strictEqual(last.op, 'i');
assert.strictEqual(JSON.stringify(last.o), JSON.stringify({ _id: 1, v: 'x' }));
