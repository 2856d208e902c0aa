// mongosh over TLS (the server requires it) with SCRAM-SHA-256: the first user through the
// localhost exception, then a login with the user's credentials in a TLS connection string.
const admin = db.getSiblingDB('admin');
assert.strictEqual(admin.createUser({ user: 'root', pwd: 'rootpw', roles: ['root'] }).ok, 1);
const host = db.getMongo().getURI().match(/mongodb:\/\/([^/?]+)/)[1];
const ca = encodeURIComponent(process.env.SHOAL_TLS_CA_FILE);
const root = new Mongo(`mongodb://root:rootpw@${host}/admin?tls=true&tlsCAFile=${ca}&authMechanism=SCRAM-SHA-256`);
const app = root.getDB('app');
app.c.insertOne({ _id: 1, over: 'tls' });
assert.strictEqual(app.c.findOne({ _id: 1 }).over, 'tls');
const status = root.getDB('admin').runCommand({ connectionStatus: 1 });
assert.strictEqual(status.authInfo.authenticatedUsers[0].user, 'root');
