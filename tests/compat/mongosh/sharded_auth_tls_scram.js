// mongosh through a router with access control over TLS: refused without credentials (13),
// the first user through the localhost exception, a SCRAM-SHA-256 login, a sharded
// collection, a read-only user refused a write (13), and a wrong password (18).
const host = db.getMongo().getURI().match(/mongodb:\/\/([^/?]+)/)[1];
const tls = `tls=true&tlsCAFile=${encodeURIComponent(process.env.SHOAL_TLS_CA_FILE)}&tlsCertificateKeyFile=${encodeURIComponent(process.env.SHOAL_TLS_CLIENT_FILE)}`;
const code = (f) => { try { f(); } catch (e) { return e.code; } return 0; };

assert.strictEqual(code(() => db.getSiblingDB('app').c.insertOne({ _id: 0 })), 13);
assert.strictEqual(db.getSiblingDB('admin').createUser({ user: 'root', pwd: 'rootpw', roles: ['root'] }).ok, 1);

const root = new Mongo(`mongodb://root:rootpw@${host}/admin?${tls}&authMechanism=SCRAM-SHA-256`);
assert.strictEqual(root.getDB('admin').runCommand({ shardCollection: 'app.c', key: { _id: 'hashed' } }).ok, 1);
const app = root.getDB('app');
app.c.insertMany(Array.from({ length: 40 }, (_, i) => ({ _id: i })));
assert.strictEqual(app.c.countDocuments({}), 40);
assert.strictEqual(app.createUser({ user: 'reader', pwd: 'readerpw', roles: ['read'] }).ok, 1);

const reader = new Mongo(`mongodb://reader:readerpw@${host}/app?${tls}&authMechanism=SCRAM-SHA-256`).getDB('app');
assert.strictEqual(reader.c.countDocuments({ _id: { $lt: 4 } }), 4);
assert.strictEqual(code(() => reader.c.insertOne({ _id: 100 })), 13);
assert.strictEqual(code(() => new Mongo(`mongodb://root:wrong@${host}/admin?${tls}`).getDB('admin').runCommand({ ping: 1 })), 18);
