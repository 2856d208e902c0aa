const assert = require('assert');
// Shell values live in another realm, so compare by canonical JSON (order-sensitive, like BSON).
function eq(actual, expected, msg) {
  const a = JSON.stringify(actual);
  const b = JSON.stringify(expected);
  if (a !== b) throw new Error(`${msg || 'mismatch'}: got ${a}, want ${b}`);
}
db = db.getSiblingDB('sh_agg');
db.dropDatabase();
db.sales.insertMany([
  { _id: 1, item: 'a', price: 10, qty: 2, tags: ['x', 'y'] },
  { _id: 2, item: 'b', price: 20, qty: 1, tags: ['x'] },
  { _id: 3, item: 'a', price: 5, qty: 10, tags: [] },
]);
const grouped = db.sales.aggregate([
  { $group: { _id: '$item', total: { $sum: { $multiply: ['$price', '$qty'] } }, avg: { $avg: '$price' } } },
  { $sort: { _id: 1 } },
]).toArray();
eq(grouped, [{ _id: 'a', total: 70, avg: 7.5 }, { _id: 'b', total: 20, avg: 20 }]);
eq(db.sales.aggregate([{ $unwind: '$tags' }, { $count: 'n' }]).toArray(), [{ n: 3 }]);
const shaped = db.sales.aggregate([
  { $match: { price: { $gte: 10 } } }, { $sort: { price: -1 } }, { $limit: 1 },
  { $addFields: { rev: { $multiply: ['$price', '$qty'] } } }, { $unset: 'tags' }, { $project: { _id: 0, item: 1, rev: 1 } },
]).toArray();
eq(shaped, [{ item: 'b', rev: 20 }]);
eq(db.sales.aggregate([{ $sort: { _id: 1 } }, { $skip: 2 }, { $project: { _id: 1 } }]).toArray(), [{ _id: 3 }]);
print('aggregate ok');
