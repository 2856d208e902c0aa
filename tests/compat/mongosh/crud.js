// Shell CRUD helpers. Fails by throwing (non-zero exit).
const assert = require('assert');
// Shell values live in another realm, so compare by canonical JSON (order-sensitive, like BSON).
function eq(actual, expected, msg) {
  const a = JSON.stringify(actual);
  const b = JSON.stringify(expected);
  if (a !== b) throw new Error(`${msg || 'mismatch'}: got ${a}, want ${b}`);
}
db = db.getSiblingDB('sh_crud');
db.dropDatabase();

const r = db.people.insertOne({ name: 'ann', age: 31 });
assert.ok(r.acknowledged);
assert.ok(r.insertedId instanceof ObjectId);
const many = db.people.insertMany([{ name: 'bob', age: 25 }, { name: 'cy', age: 40 }, { name: 'di', age: 25 }]);
assert.strictEqual(Object.keys(many.insertedIds).length, 3);

const all = db.people.find({}, { _id: 0 }).sort({ name: 1 }).toArray();
eq(all.map((d) => d.name), ['ann', 'bob', 'cy', 'di']);
eq(Object.keys(all[0]), ['name', 'age']);
assert.strictEqual(db.people.countDocuments({ age: 25 }), 2);
eq(db.people.distinct('age').sort(), [25, 31, 40]);
assert.strictEqual(db.people.findOne({ name: 'cy' }).age, 40);
assert.strictEqual(db.people.find({ age: { $gt: 26 } }).count(), 2);
eq(db.people.find().sort({ age: -1, name: 1 }).skip(1).limit(2).toArray().map((d) => d.name), ['ann', 'bob']);

let u = db.people.updateOne({ name: 'bob' }, { $inc: { age: 1 }, $set: { city: 'x' } });
assert.strictEqual(u.matchedCount, 1);
assert.strictEqual(u.modifiedCount, 1);
u = db.people.updateMany({ age: { $lt: 30 } }, { $set: { young: true } });
assert.strictEqual(u.modifiedCount, 2);
u = db.people.updateOne({ name: 'zed' }, { $set: { age: 1 } }, { upsert: true });
assert.strictEqual(u.upsertedCount, 1);
db.people.replaceOne({ name: 'zed' }, { name: 'zed', age: 2 });
assert.strictEqual(db.people.findOne({ name: 'zed' }).age, 2);

const before = db.people.findOneAndUpdate({ name: 'ann' }, { $set: { age: 32 } });
assert.strictEqual(before.age, 31);
const after = db.people.findOneAndUpdate({ name: 'ann' }, { $inc: { age: 1 } }, { returnDocument: 'after' });
assert.strictEqual(after.age, 33);

assert.strictEqual(db.people.deleteOne({ name: 'zed' }).deletedCount, 1);
assert.strictEqual(db.people.deleteMany({ young: true }).deletedCount, 2);
assert.strictEqual(db.people.countDocuments(), 2);

let threw = false;
try {
  db.people.insertOne({ _id: 1 });
  db.people.insertOne({ _id: 1 });
} catch (e) {
  threw = true;
  assert.strictEqual(e.code, 11000);
}
assert.ok(threw, 'duplicate _id must throw');
print('crud ok');
