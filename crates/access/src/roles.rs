//! Built-in roles and what each command needs: MongoDB's privilege model (an action on a
//! resource) for the roles mongod ships, and the privileges of user-defined roles
//! (createRole), which are stored in admin.system.roles.

use bson::{doc, Bson, Document};
use common::{Code, Error, Result};

/// What an action applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// The whole deployment (serverStatus, replSet*, shutdown...).
    Cluster,
    /// A database: the action is on the database itself (dropDatabase, listCollections).
    Db(String),
    /// One collection, `db` and collection name.
    Ns(String, String),
}

impl Resource {
    pub fn ns(db: &str, coll: &str) -> Resource {
        Resource::Ns(db.to_string(), coll.to_string())
    }

    pub fn db(db: &str) -> Resource {
        Resource::Db(db.to_string())
    }

    fn database(&self) -> Option<&str> {
        match self {
            Resource::Cluster => None,
            Resource::Db(d) | Resource::Ns(d, _) => Some(d),
        }
    }

    /// A database resource or a "normal" collection in it: not system.* (but system.js,
    /// which read roles cover).
    fn is_normal(&self) -> bool {
        match self {
            Resource::Cluster => false,
            Resource::Db(_) => true,
            Resource::Ns(_, c) => !c.starts_with("system.") || c == "system.js",
        }
    }
}

/// Roles that exist only on the admin database.
const ADMIN_ONLY: &[&str] = &[
    "readAnyDatabase",
    "readWriteAnyDatabase",
    "userAdminAnyDatabase",
    "dbAdminAnyDatabase",
    "clusterMonitor",
    "clusterManager",
    "hostManager",
    "clusterAdmin",
    "root",
];
/// Roles that exist on every database.
const ANY_DB: &[&str] = &["read", "readWrite", "dbAdmin", "dbOwner", "userAdmin"];

/// The internal user's role: every action on every resource. No user can be granted it.
pub const INTERNAL_ROLE: &str = "__system";

/// The built-in roles defined on `db`.
pub fn builtin_on(db: &str) -> Vec<&'static str> {
    let mut v = ANY_DB.to_vec();
    if db == "admin" {
        v.extend_from_slice(ADMIN_ONLY);
    }
    v
}

/// Whether `role` on `db` is a built-in role.
pub fn exists(role: &str, db: &str) -> bool {
    ANY_DB.contains(&role) || (db == "admin" && ADMIN_ONLY.contains(&role))
}

const READ: &[&str] = &["find", "listCollections", "listIndexes", "collStats", "dbStats", "killCursors", "changeStream", "dbHash", "planCacheRead"];
const WRITE: &[&str] =
    &["insert", "update", "remove", "createCollection", "createIndex", "dropCollection", "dropIndex", "renameCollectionSameDB", "convertToCapped"];
const DB_ADMIN: &[&str] = &[
    "bypassDocumentValidation",
    "collMod",
    "collStats",
    "compact",
    "convertToCapped",
    "createCollection",
    "createIndex",
    "dbStats",
    "dropCollection",
    "dropDatabase",
    "dropIndex",
    "enableProfiler",
    "listCollections",
    "listIndexes",
    "reIndex",
    "renameCollectionSameDB",
    "validate",
];
const USER_ADMIN: &[&str] = &[
    "changeCustomData",
    "changePassword",
    "createRole",
    "createUser",
    "dropRole",
    "dropUser",
    "grantRole",
    "revokeRole",
    "setAuthenticationRestriction",
    "viewRole",
    "viewUser",
];
const CLUSTER_MONITOR: &[&str] = &[
    "connPoolStats",
    "getCmdLineOpts",
    "getLog",
    "getParameter",
    "hostInfo",
    "inprog",
    "listDatabases",
    "listSessions",
    "netstat",
    "replSetGetConfig",
    "replSetGetStatus",
    "serverStatus",
    "top",
    "getShardMap",
];
/// What clusterMonitor may do on any database.
const MONITOR_ANY_DB: &[&str] = &["collStats", "dbStats", "indexStats"];
const HOST_MANAGER: &[&str] =
    &["auditConfigure", "dropConnections", "fsync", "killAnyCursor", "killAnySession", "killop", "logRotate", "setParameter", "shutdown", "unlock"];
const CLUSTER_MANAGER: &[&str] = &[
    "appendOplogNote",
    "listShards",
    "addShard",
    "removeShard",
    "replSetConfigure",
    "replSetGetConfig",
    "replSetGetStatus",
    "replSetStateChange",
    "resync",
    "flushRouterConfig",
    "balancer",
];
/// What clusterManager may do on any database: shard it and move its data.
const MANAGER_ANY_DB: &[&str] = &["enableSharding", "moveChunk", "splitChunk"];

/// Whether holding `role`@`role_db` grants `action` on `resource`.
pub fn grants(role: &str, role_db: &str, action: &str, resource: &Resource) -> bool {
    let on_own_db = || resource.database() == Some(role_db) && resource.is_normal();
    // "Any database" roles cover every database but local and config.
    let on_any_db = || resource.is_normal() && resource.database().is_some_and(|d| d != "local" && d != "config");
    let on_cluster = matches!(resource, Resource::Cluster);
    let admin = role_db == "admin";
    let users_collection = matches!(resource, Resource::Ns(d, c) if d == "admin" && (c == "system.users" || c == "system.roles"));
    match role {
        INTERNAL_ROLE if admin => true,
        "read" => on_own_db() && READ.contains(&action),
        "readWrite" => on_own_db() && (READ.contains(&action) || WRITE.contains(&action)),
        "dbAdmin" => on_own_db() && DB_ADMIN.contains(&action),
        "userAdmin" => on_own_db() && USER_ADMIN.contains(&action),
        "dbOwner" => ["readWrite", "dbAdmin", "userAdmin"].iter().any(|r| grants(r, role_db, action, resource)),
        "readAnyDatabase" if admin => (on_any_db() && READ.contains(&action)) || (on_cluster && action == "listDatabases"),
        "readWriteAnyDatabase" if admin => (on_any_db() && (READ.contains(&action) || WRITE.contains(&action))) || (on_cluster && action == "listDatabases"),
        "dbAdminAnyDatabase" if admin => (on_any_db() && DB_ADMIN.contains(&action)) || (on_cluster && matches!(action, "listDatabases" | "applyOps")),
        "userAdminAnyDatabase" if admin => {
            (resource.database().is_some() && resource.is_normal() && USER_ADMIN.contains(&action))
                || (on_cluster && matches!(action, "listDatabases" | "viewUser" | "invalidateUserCache"))
                || (users_collection && matches!(action, "find" | "listIndexes" | "collStats"))
        }
        "clusterMonitor" if admin => (on_cluster && CLUSTER_MONITOR.contains(&action)) || (resource.database().is_some() && MONITOR_ANY_DB.contains(&action)),
        "hostManager" if admin => (on_cluster && HOST_MANAGER.contains(&action)) || (resource.database().is_some() && action == "killCursors"),
        "clusterManager" if admin => (on_cluster && CLUSTER_MANAGER.contains(&action)) || (on_any_db() && MANAGER_ANY_DB.contains(&action)),
        "clusterAdmin" if admin => {
            ["clusterMonitor", "hostManager", "clusterManager"].iter().any(|r| grants(r, "admin", action, resource))
                || (on_any_db() && action == "dropDatabase")
        }
        "root" if admin => {
            ["clusterAdmin", "userAdminAnyDatabase", "dbAdminAnyDatabase", "readWriteAnyDatabase"].iter().any(|r| grants(r, "admin", action, resource))
                // root also backs up and restores: it reads and writes everywhere but in the
                // internal local and config databases' system collections.
                || (resource.database().is_some() && (READ.contains(&action) || WRITE.contains(&action) || action == "validate"))
        }
        _ => false,
    }
}

/// The databases a role names a privilege on (listDatabases for users without the
/// cluster-wide action shows these).
pub fn database_of(role: &str, role_db: &str) -> Option<String> {
    ANY_DB.contains(&role).then(|| role_db.to_string())
}

/// What a user-defined role's privilege applies to: a privilege document's `resource`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// `{cluster: true}`.
    Cluster,
    /// `{anyResource: true}`.
    AnyResource,
    /// `{db, collection}`: "" for db is every database; "" for collection is the database
    /// itself and every collection in it but system ones.
    Ns { db: String, collection: String },
}

impl Pattern {
    fn parse(d: &Document) -> Result<Pattern> {
        let bad = || Error::bad_value(format!("resource must be {{db: <string>, collection: <string>}}, {{cluster: true}} or {{anyResource: true}}, not {d}"));
        if d.len() == 1 && d.get_bool("cluster").ok() == Some(true) {
            return Ok(Pattern::Cluster);
        }
        if d.len() == 1 && d.get_bool("anyResource").ok() == Some(true) {
            return Ok(Pattern::AnyResource);
        }
        match (d.len(), d.get_str("db"), d.get_str("collection")) {
            (2, Ok(db), Ok(collection)) => Ok(Pattern::Ns { db: db.to_string(), collection: collection.to_string() }),
            _ => Err(bad()),
        }
    }

    fn to_document(&self) -> Document {
        match self {
            Pattern::Cluster => doc! {"cluster": true},
            Pattern::AnyResource => doc! {"anyResource": true},
            Pattern::Ns { db, collection } => doc! {"db": db, "collection": collection},
        }
    }

    fn covers(&self, resource: &Resource) -> bool {
        match (self, resource) {
            (Pattern::AnyResource, _) | (Pattern::Cluster, Resource::Cluster) => true,
            (Pattern::Ns { db, collection }, Resource::Db(d)) => (db.is_empty() || db == d) && collection.is_empty(),
            (Pattern::Ns { db, collection }, Resource::Ns(d, c)) => {
                (db.is_empty() || db == d) && if collection.is_empty() { resource.is_normal() } else { collection == c }
            }
            _ => false,
        }
    }

    /// The database the pattern names, if one.
    pub fn database(&self) -> Option<&str> {
        match self {
            Pattern::Ns { db, .. } if !db.is_empty() => Some(db),
            _ => None,
        }
    }
}

/// Actions one privilege may list at most, and privileges one role may hold at most.
const ACTIONS_MAX: usize = 256;
pub const PRIVILEGES_MAX: usize = 1024;

/// A user-defined role's privilege: actions on what a pattern covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Privilege {
    pub resource: Pattern,
    pub actions: Vec<String>,
}

impl Privilege {
    /// A privilege document, `{resource, actions}`, of a role on `role_db`: a role defined
    /// on any database but admin may only name its own database.
    pub fn parse(v: &Bson, role_db: &str) -> Result<Privilege> {
        let Bson::Document(d) = v else { return Err(Error::bad_value("a privilege must be a {resource, actions} document")) };
        if let Some(k) = d.keys().find(|k| *k != "resource" && *k != "actions") {
            return Err(Error::bad_value(format!("unknown field '{k}' in a privilege")));
        }
        let resource = Pattern::parse(d.get_document("resource").map_err(|_| Error::bad_value("a privilege needs a resource document"))?)?;
        let actions = d.get_array("actions").map_err(|_| Error::bad_value("a privilege needs an actions array"))?;
        if actions.is_empty() || actions.len() > ACTIONS_MAX {
            return Err(Error::bad_value(format!("a privilege needs 1 to {ACTIONS_MAX} actions")));
        }
        let mut names = Vec::with_capacity(actions.len());
        for a in actions {
            match a {
                Bson::String(s) if !s.is_empty() => {
                    if !names.contains(s) {
                        names.push(s.clone());
                    }
                }
                _ => return Err(Error::bad_value("actions must be non-empty strings")),
            }
        }
        if role_db != "admin" && resource.database() != Some(role_db) {
            return Err(Error::new(
                Code::InvalidRoleModification,
                format!("Roles on the '{role_db}' database cannot be granted privileges that target other databases or the cluster"),
            ));
        }
        Ok(Privilege { resource, actions: names })
    }

    pub fn to_document(&self) -> Document {
        doc! {"resource": self.resource.to_document(), "actions": self.actions.clone()}
    }

    pub fn grants(&self, action: &str, resource: &Resource) -> bool {
        self.actions.iter().any(|a| a == action || a == "anyAction") && self.resource.covers(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_grant_what_mongodb_documents() {
        let c = Resource::ns("app", "c");
        assert!(grants("read", "app", "find", &c));
        assert!(!grants("read", "app", "insert", &c));
        assert!(!grants("read", "other", "find", &c));
        assert!(grants("readWrite", "app", "insert", &c) && grants("readWrite", "app", "dropCollection", &c));
        assert!(!grants("readWrite", "app", "dropDatabase", &Resource::db("app")));
        assert!(grants("dbAdmin", "app", "dropDatabase", &Resource::db("app")) && !grants("dbAdmin", "app", "find", &c));
        assert!(grants("dbOwner", "app", "createUser", &Resource::db("app")) && grants("dbOwner", "app", "insert", &c));
        // Admin-only roles mean nothing on another database.
        assert!(grants("readAnyDatabase", "admin", "find", &c) && !grants("readAnyDatabase", "app", "find", &c));
        assert!(!grants("readAnyDatabase", "admin", "find", &Resource::ns("local", "oplog.rs")));
        assert!(!grants("readWriteAnyDatabase", "admin", "find", &Resource::ns("admin", "system.users")));
        assert!(grants("userAdminAnyDatabase", "admin", "find", &Resource::ns("admin", "system.users")));
        assert!(grants("clusterMonitor", "admin", "serverStatus", &Resource::Cluster) && !grants("clusterMonitor", "admin", "shutdown", &Resource::Cluster));
        assert!(grants("clusterAdmin", "admin", "shutdown", &Resource::Cluster) && grants("clusterAdmin", "admin", "replSetConfigure", &Resource::Cluster));
        assert!(!grants("clusterAdmin", "admin", "find", &c));
        for (action, r) in [("find", &c), ("createUser", &Resource::db("app")), ("shutdown", &Resource::Cluster), ("dropDatabase", &Resource::db("x"))] {
            assert!(grants("root", "admin", action, r), "{action}");
        }
        assert!(exists("read", "app") && exists("root", "admin") && !exists("root", "app") && !exists("reader", "app"));
    }

    #[test]
    fn privileges_of_user_defined_roles_cover_their_patterns() {
        let p = |v: Bson, db: &str| Privilege::parse(&v, db);
        let find_c = p(Bson::Document(doc! {"resource": {"db": "app", "collection": "c"}, "actions": ["find", "find"]}), "app").unwrap();
        assert_eq!(find_c.actions, vec!["find".to_string()]);
        assert!(
            find_c.grants("find", &Resource::ns("app", "c"))
                && !find_c.grants("insert", &Resource::ns("app", "c"))
                && !find_c.grants("find", &Resource::ns("app", "d"))
        );
        let app = p(Bson::Document(doc! {"resource": {"db": "app", "collection": ""}, "actions": ["insert"]}), "app").unwrap();
        assert!(app.grants("insert", &Resource::ns("app", "any")) && app.grants("insert", &Resource::db("app")));
        assert!(!app.grants("insert", &Resource::ns("app", "system.users")) && !app.grants("insert", &Resource::ns("other", "c")));
        let every_db = p(Bson::Document(doc! {"resource": {"db": "", "collection": "c"}, "actions": ["find"]}), "admin").unwrap();
        assert!(every_db.grants("find", &Resource::ns("x", "c")) && !every_db.grants("find", &Resource::ns("x", "d")));
        let cluster = p(Bson::Document(doc! {"resource": {"cluster": true}, "actions": ["serverStatus"]}), "admin").unwrap();
        assert!(cluster.grants("serverStatus", &Resource::Cluster) && !cluster.grants("serverStatus", &Resource::db("admin")));
        let any = p(Bson::Document(doc! {"resource": {"anyResource": true}, "actions": ["anyAction"]}), "admin").unwrap();
        assert!(any.grants("shutdown", &Resource::Cluster) && any.grants("insert", &Resource::ns("local", "x")));
        assert_eq!(Privilege::parse(&Bson::Document(find_c.to_document()), "app").unwrap(), find_c);
        // A role outside admin names only its own database.
        assert_eq!(p(Bson::Document(doc! {"resource": {"db": "other", "collection": ""}, "actions": ["find"]}), "app").unwrap_err().code, 49);
        assert_eq!(p(Bson::Document(doc! {"resource": {"cluster": true}, "actions": ["find"]}), "app").unwrap_err().code, 49);
        for bad in [
            doc! {"resource": {"db": "app"}, "actions": ["find"]},
            doc! {"resource": {"db": "app", "collection": "c"}, "actions": []},
            doc! {"resource": {"db": "app", "collection": "c"}, "actions": [1]},
            doc! {"resource": {"cluster": false}, "actions": ["x"]},
            doc! {"actions": ["find"]},
            doc! {"resource": {"db": "app", "collection": "c"}, "actions": ["find"], "x": 1},
        ] {
            assert_eq!(p(Bson::Document(bad.clone()), "app").unwrap_err().code, 2, "{bad}");
        }
    }
}
