// mongosh against a server started with --auth: the first user through the localhost
// exception, then SCRAM logins with db.auth() and with credentials in a connection string.
const admin = db.getSiblingDB('admin');
let refused = null;
try {
  db.getSiblingDB('app').c.findOne();
} catch (e) {
  refused = e;
}
assert.ok(refused && refused.code === 13, String(refused));

assert.strictEqual(admin.createUser({ user: 'root', pwd: 'rootpw', roles: ['root'] }).ok, 1);
assert.strictEqual(admin.auth('root', 'rootpw').ok, 1);
const app = db.getSiblingDB('app');
app.c.insertOne({ _id: 1 });
app.createUser({ user: 'ann', pwd: 'annpw', roles: ['read'] });
const info = app.getUser('ann');
assert.strictEqual(info.user, 'ann');
assert.strictEqual(JSON.stringify(info.mechanisms), JSON.stringify(['SCRAM-SHA-1', 'SCRAM-SHA-256']));

// A second connection with the user's credentials in its URI.
const host = db.getMongo().getURI().match(/mongodb:\/\/([^/?]+)/)[1];
const ann = new Mongo(`mongodb://ann:annpw@${host}/app`).getDB('app');
assert.strictEqual(ann.c.countDocuments({}), 1);
let denied = null;
try {
  ann.c.insertOne({ _id: 2 });
} catch (e) {
  denied = e;
}
assert.ok(denied && denied.code === 13, String(denied));

let failed = null;
try {
  new Mongo(`mongodb://ann:wrong@${host}/app`).getDB('app').c.countDocuments({});
} catch (e) {
  failed = e;
}
assert.ok(failed && /Authentication failed/.test(String(failed)), String(failed));

// User-defined roles through the shell's helpers.
app.createRole({ role: 'countC', privileges: [{ resource: { db: 'app', collection: 'c' }, actions: ['find'] }], roles: [] });
const role = app.getRole('countC', { showPrivileges: true });
assert.strictEqual(role.role, 'countC');
assert.strictEqual(role.isBuiltin, false);
assert.strictEqual(JSON.stringify(role.privileges[0].actions), JSON.stringify(['find']));
// mongosh's getRoles answers rolesInfo's reply document, {roles: [...], ok: 1}.
assert.strictEqual(app.getRoles().roles.length, 1);
app.grantRolesToUser('ann', ['countC']);
app.dropRole('countC');
assert.strictEqual(app.getRoles().roles.length, 0);
assert.strictEqual(JSON.stringify(app.getUser('ann').roles), JSON.stringify([{ role: 'read', db: 'app' }]));
