// Mongoose, the most used ODM, on its common paths: save (which sends empty update
// operators), populate, validation errors, lean queries, bulk operations, indexes from
// schemas, and findOneAndUpdate.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import mongoose from 'mongoose';
import { startServer } from '../lib/server.mjs';

let server;
let conn;

const authorSchema = new mongoose.Schema({ name: { type: String, required: true }, born: Number });
const bookSchema = new mongoose.Schema(
  {
    title: { type: String, required: true, minlength: 2 },
    pages: { type: Number, min: 1 },
    author: { type: mongoose.Schema.Types.ObjectId, ref: 'Author' },
    tags: [String],
    isbn: { type: String, unique: true, sparse: true },
  },
  { timestamps: true },
);

let Author;
let Book;

before(async () => {
  server = await startServer();
  conn = await mongoose.createConnection(server.uri, { dbName: 'node_mongoose' }).asPromise();
  Author = conn.model('Author', authorSchema);
  Book = conn.model('Book', bookSchema);
  await Book.init(); // builds the schema's indexes
});
after(async () => {
  await conn?.dropDatabase();
  await conn?.close();
  await server?.stop();
});

test('create, save changes, and save unchanged', async () => {
  const a = await Author.create({ name: 'Le Guin', born: 1929 });
  const b = await Book.create({ title: 'The Dispossessed', pages: 387, author: a._id, tags: ['sf'] });
  assert.ok(b.createdAt instanceof Date);
  b.pages = 388;
  b.tags.push('anarchy');
  await b.save();
  await b.save(); // nothing changed
  const back = await Book.findById(b._id);
  assert.equal(back.pages, 388);
  assert.deepEqual([...back.tags], ['sf', 'anarchy']);
  assert.ok(back.updatedAt >= back.createdAt);
});

test('populate follows references', async () => {
  const a = await Author.create({ name: 'Calvino', born: 1923 });
  await Book.create([{ title: 'Invisible Cities', author: a._id }, { title: 'If on a winter night', author: a._id }]);
  const books = await Book.find({ author: a._id }).populate('author').sort({ title: 1 });
  assert.equal(books.length, 2);
  assert.equal(books[0].author.name, 'Calvino');
  const withVirtual = await Author.findOne({ name: 'Calvino' }).lean();
  assert.equal(withVirtual.born, 1923);
});

test('validation errors come from the schema, duplicate keys from the server', async () => {
  await assert.rejects(Book.create({ title: 'x' }), (e) => e.name === 'ValidationError' && 'title' in e.errors);
  await assert.rejects(Book.create({ title: 'ok', pages: 0 }), (e) => e.name === 'ValidationError' && 'pages' in e.errors);
  await Book.create({ title: 'First', isbn: '978-0' });
  await assert.rejects(Book.create({ title: 'Second', isbn: '978-0' }), (e) => e.code === 11000);
});

test('lean queries, counts, distinct and aggregate', async () => {
  await Book.insertMany([
    { title: 'Lean one', pages: 10, tags: ['x'] },
    { title: 'Lean two', pages: 20, tags: ['x', 'y'] },
  ]);
  const lean = await Book.find({ tags: 'x' }).select({ title: 1, _id: 0 }).sort({ pages: -1 }).lean();
  assert.deepEqual(lean, [{ title: 'Lean two' }, { title: 'Lean one' }]);
  assert.equal(await Book.countDocuments({ tags: 'x' }), 2);
  assert.deepEqual((await Book.distinct('tags', { tags: 'x' })).sort(), ['x', 'y']);
  const [sum] = await Book.aggregate([{ $match: { tags: 'x' } }, { $group: { _id: null, pages: { $sum: '$pages' } } }]);
  assert.equal(sum.pages, 30);
});

test('bulkWrite, updateMany, findOneAndUpdate and deletes', async () => {
  const r = await Book.bulkWrite([
    { insertOne: { document: { title: 'Bulk A', pages: 1 } } },
    { insertOne: { document: { title: 'Bulk B', pages: 2 } } },
    { updateOne: { filter: { title: 'Bulk A' }, update: { $inc: { pages: 10 } } } },
    { deleteOne: { filter: { title: 'Bulk B' } } },
  ]);
  assert.equal(r.insertedCount, 2);
  assert.equal(r.modifiedCount, 1);
  assert.equal(r.deletedCount, 1);
  const upd = await Book.updateMany({ title: /^Bulk/ }, { $set: { tags: ['bulk'] } });
  assert.equal(upd.modifiedCount, 1);
  const after = await Book.findOneAndUpdate({ title: 'Bulk A' }, { $inc: { pages: 1 } }, { returnDocument: 'after' });
  assert.equal(after.pages, 12);
  const upserted = await Book.findOneAndUpdate({ title: 'Bulk C' }, { pages: 3 }, { upsert: true, returnDocument: 'after' });
  assert.equal(upserted.pages, 3);
  assert.equal((await Book.deleteMany({ title: /^Bulk/ })).deletedCount, 2);
});

test('schema indexes are listed', async () => {
  const indexes = await Book.listIndexes();
  const isbn = indexes.find((i) => i.key.isbn === 1);
  assert.ok(isbn && isbn.unique && isbn.sparse);
});
