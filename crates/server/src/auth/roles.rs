//! Built-in roles and what each command needs: MongoDB's privilege model (an action on a
//! resource) for the roles mongod ships. User-defined roles (createRole) are not here yet.

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

/// Whether `role` on `db` is a built-in role (the only kind there is yet).
pub fn exists(role: &str, db: &str) -> bool {
    ANY_DB.contains(&role) || (db == "admin" && ADMIN_ONLY.contains(&role))
}

const READ: &[&str] = &["find", "listCollections", "listIndexes", "collStats", "dbStats", "killCursors", "changeStream", "dbHash", "planCacheRead"];
const WRITE: &[&str] = &["insert", "update", "remove", "createCollection", "createIndex", "dropCollection", "dropIndex", "renameCollectionSameDB", "convertToCapped"];
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
const USER_ADMIN: &[&str] = &["changeCustomData", "changePassword", "createRole", "createUser", "dropRole", "dropUser", "grantRole", "revokeRole", "setAuthenticationRestriction", "viewRole", "viewUser"];
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
];
/// What clusterMonitor may do on any database.
const MONITOR_ANY_DB: &[&str] = &["collStats", "dbStats", "indexStats"];
const HOST_MANAGER: &[&str] = &["auditConfigure", "dropConnections", "fsync", "killAnyCursor", "killAnySession", "killop", "logRotate", "setParameter", "shutdown", "unlock"];
const CLUSTER_MANAGER: &[&str] = &["listShards", "addShard", "removeShard", "replSetConfigure", "replSetGetConfig", "replSetGetStatus", "replSetStateChange", "resync"];

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
        "clusterManager" if admin => on_cluster && CLUSTER_MANAGER.contains(&action),
        "clusterAdmin" if admin => {
            ["clusterMonitor", "hostManager", "clusterManager"].iter().any(|r| grants(r, "admin", action, resource)) || (on_any_db() && action == "dropDatabase")
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
}
