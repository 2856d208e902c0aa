// mongosh's collection stats helpers run $collStats under the hood.
const assert = require('assert');
db = db.getSiblingDB('sh_stats');
db.dropDatabase();
for (let i = 0; i < 10; i++) db.c.insertOne({ i, pad: 'x'.repeat(100) });
assert.strictEqual(db.c.estimatedDocumentCount(), 10);
const s = db.c.stats();
assert.strictEqual(s.count, 10);
assert.ok(s.size >= 1000, JSON.stringify(s));
assert.ok(db.c.dataSize() >= 1000);
assert.ok(db.c.totalIndexSize() > 0);
print('collstats ok');
