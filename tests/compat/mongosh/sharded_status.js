// mongosh's sharding helpers through shoal's router (two shards): sh.enableSharding,
// sh.shardCollection, sh.status(), the balancer switches, sh.splitAt and sh.moveChunk.
assert.strictEqual(db.hello().msg, 'isdbgrid');
sh.enableSharding('shapp');
const sharded = sh.shardCollection('shapp.c', { k: 'hashed' });
assert.strictEqual(sharded.ok, 1, JSON.stringify(sharded));
const c = db.getSiblingDB('shapp').c;
c.insertMany(Array.from({ length: 100 }, (_, i) => ({ _id: i, k: i })));
assert.strictEqual(c.countDocuments({}), 100);

const status = sh.status();
const text = JSON.stringify(status.value ?? status);
assert.ok(text.includes('shapp.c') && text.includes('shard0') && text.includes('shard1'), text);
// The data distribution section ($shardedDataDistribution): both shards, every document owned.
const dist = (status.value ?? status).shardedDataDistribution;
assert.ok(Array.isArray(dist), text);
const shappC = dist.find((d) => d.ns === 'shapp.c');
assert.ok(shappC && shappC.shards.length === 2, JSON.stringify(dist));
assert.strictEqual(shappC.shards.reduce((n, s) => n + Number(s.numOwnedDocuments), 0), 100);
assert.strictEqual(shappC.shards.reduce((n, s) => n + Number(s.numOrphanedDocs), 0), 0);
// The shell's stats and explain helpers through the router.
const stats = c.stats();
assert.strictEqual(stats.sharded, true, JSON.stringify(stats));
assert.strictEqual(Number(stats.count), 100);
assert.strictEqual(Number(db.getSiblingDB('shapp').stats().objects), 100);
assert.strictEqual(c.find({ k: 5 }).explain().queryPlanner.winningPlan.stage, 'SINGLE_SHARD');
assert.strictEqual(c.find({}).explain('executionStats').queryPlanner.winningPlan.stage, 'SHARD_MERGE');
assert.strictEqual(db.serverStatus().process, 'mongos');

assert.strictEqual(sh.getBalancerState(), true);
sh.stopBalancer();
assert.strictEqual(sh.getBalancerState(), false);
sh.startBalancer();
assert.strictEqual(sh.getBalancerState(), true);

const chunks = () => db.getSiblingDB('config').chunks.find({}).sort({ min: 1 }).toArray();
assert.strictEqual(chunks().length, 4);
sh.splitAt('shapp.c', { k: NumberLong('123456789') });
assert.strictEqual(chunks().length, 5);

// Move the chunk holding k: 1 to shard1 (it may be there already), then to shard0: the
// second move is a real one. Every document stays, once.
const onShard1 = () => chunks().filter((ch) => ch.shard === 'shard1').length;
sh.moveChunk('shapp.c', { k: 1 }, 'shard1');
const n1 = onShard1();
assert.strictEqual(c.countDocuments({}), 100);
sh.moveChunk('shapp.c', { k: 1 }, 'shard0');
assert.strictEqual(onShard1(), n1 - 1);
assert.strictEqual(c.countDocuments({}), 100);
assert.strictEqual(c.find({ k: 1 }).toArray().length, 1);
assert.strictEqual(db.getSiblingDB('config').migrations.countDocuments({}), 0);
