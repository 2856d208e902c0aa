//! Authentication and authorization: who a connection is, and whether it may run a command.
//!
//! - SCRAM itself (SHA-1 and SHA-256) is `net::scram`; the keyFile and the internal user
//!   members authenticate as (`__system@local`) are `net::key_file`.
//! - `roles.rs`: the built-in roles and the action each grants on a cluster, database or
//!   collection resource, and user-defined roles' privileges.
//! - This module: users, user-defined roles (admin.system.roles) resolved through the
//!   roles they inherit (`grants_of`, at most `ROLES_RESOLVED_MAX` roles per user), a
//!   connection's user, and `check`, which dispatch runs before every command. A command
//!   the privilege table (`need`) does not name needs the `internal` action, which only the
//!   internal role (`roles::INTERNAL_ROLE`) grants: a new command is closed until it is
//!   given a privilege.
//! - The commands: `commands/users.rs` (saslStart, saslContinue and user management) and
//!   `commands/roles.rs` (role management and rolesInfo).
//!
//! Users live in admin.system.users, as mongod keeps them (`_id` "db.user", credentials per
//! mechanism, roles). A connection that authenticates keeps its user's roles; every change
//! to users bumps `AuthState::generation`, and a connection that sees a new generation reads
//! its user again before its next command, so a revoked role or a dropped user takes effect
//! at once.

pub mod roles;

pub use net::key_file::{internal_key, INTERNAL_USER, INTERNAL_USER_DB};
use net::scram;

use crate::conn::ConnState;
use crate::state::Shared;
use bson::{Bson, Document};
use common::{Code, Error, Result};
use roles::Resource;
use std::sync::atomic::{AtomicU64, Ordering};

pub const USERS_DB: &str = "admin";
pub use common::server::EXTERNAL_DB;
pub const USERS_COLLECTION: &str = "system.users";
/// User-defined roles, in admin as mongod keeps them (`_id` "db.role").
pub const ROLES_COLLECTION: &str = "system.roles";
/// Roles looked at, at most, in resolving one user's roles: a bound on the walk of a role
/// graph, which createRole and grantRolesToRole keep free of cycles.
const ROLES_RESOLVED_MAX: usize = 1024;
fn is_internal(user: &str, db: &str) -> bool {
    user == INTERNAL_USER && db == INTERNAL_USER_DB
}

/// The credentials `user`@`db` authenticates with by `mechanism`, if any.
pub fn credentials_of(shared: &Shared, db: &str, user: &str, mechanism: scram::Mechanism) -> Result<Option<scram::Credentials>> {
    if is_internal(user, db) {
        return Ok(internal_key().and_then(|k| k.credentials(mechanism)));
    }
    Ok(find_user(shared, db, user)?
        .and_then(|d| d.get_document("credentials").ok().and_then(|c| c.get_document(mechanism.name()).ok()).and_then(scram::Credentials::from_document)))
}

/// The mechanisms `user`@`db` has credentials for (hello's saslSupportedMechs).
pub fn mechanisms_of(shared: &Shared, db: &str, user: &str) -> Option<Vec<&'static str>> {
    if is_internal(user, db) {
        return internal_key().map(|_| scram::Mechanism::ALL.iter().map(|m| m.name()).collect());
    }
    let d = find_user(shared, db, user).ok()??;
    Some(d.get_document("credentials").map(|c| c.keys().filter_map(|k| scram::Mechanism::parse(k)).map(|m| m.name()).collect()).unwrap_or_default())
}

/// Server-wide authorization state.
#[derive(Debug, Default)]
pub struct AuthState {
    /// `security.authorization: enabled` / `--auth`.
    pub enabled: bool,
    /// Bumped by every change to users and roles.
    pub generation: AtomicU64,
}

impl AuthState {
    pub fn users_changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// The user a connection authenticated as.
#[derive(Clone, Debug)]
pub struct AuthedUser {
    pub user: String,
    pub db: String,
    /// (role, db) pairs: the roles the user was granted.
    pub roles: Vec<(String, String)>,
    /// What those roles grant, through the roles they inherit.
    pub grants: Grants,
    /// `AuthState::generation` when `roles` were read.
    generation: u64,
}

/// Failed authentications one connection may make; then it is closed, so that guessing
/// costs a new connection (and its TLS handshake) every few tries, within
/// maxIncomingConnections.
pub const FAILURES_PER_CONNECTION_MAX: u32 = 10;

/// A connection's authentication: its user, and a SCRAM conversation under way.
#[derive(Debug, Default)]
pub struct ConnAuth {
    pub user: Option<AuthedUser>,
    pub conversation: Option<(scram::Conversation, String)>,
    /// Failed authentications on this connection so far.
    pub failures: u32,
    /// The subject of the client's verified TLS certificate (RFC 2253), the user an
    /// X.509 login names.
    pub peer_subject: Option<String>,
}

/// The stored user document for `user`@`db`.
pub fn find_user(shared: &Shared, db: &str, user: &str) -> Result<Option<Document>> {
    let Some(coll) = shared.store.collection(USERS_DB, USERS_COLLECTION) else { return Ok(None) };
    Ok(coll.snapshot().find_by_id(&Bson::String(format!("{db}.{user}")))?.map(|(_, d)| d))
}

/// The stored user-defined role `role`@`db`.
pub fn find_role(shared: &Shared, db: &str, role: &str) -> Result<Option<Document>> {
    let Some(coll) = shared.store.collection(USERS_DB, ROLES_COLLECTION) else { return Ok(None) };
    Ok(coll.snapshot().find_by_id(&Bson::String(format!("{db}.{role}")))?.map(|(_, d)| d))
}

/// Whether `role`@`db` is a built-in role or a stored one.
pub fn role_exists(shared: &Shared, role: &str, db: &str) -> Result<bool> {
    Ok(roles::exists(role, db) || find_role(shared, db, role)?.is_some())
}

/// What a set of roles grants: the built-in roles among them and among the roles they
/// inherit, and the privileges of the user-defined ones.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grants {
    pub builtin: Vec<(String, String)>,
    pub privileges: Vec<roles::Privilege>,
}

impl Grants {
    pub fn allow(&self, action: &str, resource: &Resource) -> bool {
        self.builtin.iter().any(|(r, d)| roles::grants(r, d, action, resource)) || self.privileges.iter().any(|p| p.grants(action, resource))
    }
}

/// The privileges of a role document's `privileges`, as stored (checked when written).
pub fn privileges_of(role_doc: &Document, role_db: &str) -> Vec<roles::Privilege> {
    role_doc.get_array("privileges").map(|a| a.iter().filter_map(|p| roles::Privilege::parse(p, role_db).ok()).collect()).unwrap_or_default()
}

/// Resolve `roles` through the user-defined roles they name (a role that no longer exists
/// grants nothing).
pub fn grants_of(shared: &Shared, roles: &[(String, String)]) -> Result<Grants> {
    let mut grants = Grants::default();
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut queue: std::collections::VecDeque<(String, String)> = roles.iter().cloned().collect();
    while let Some(r) = queue.pop_front() {
        if seen.contains(&r) || seen.len() >= ROLES_RESOLVED_MAX {
            continue;
        }
        seen.push(r.clone());
        if roles::exists(&r.0, &r.1) || r.0 == roles::INTERNAL_ROLE {
            grants.builtin.push(r);
        } else if let Some(d) = find_role(shared, &r.1, &r.0)? {
            grants.privileges.extend(privileges_of(&d, &r.1));
            queue.extend(roles_of(&d));
        }
    }
    Ok(grants)
}

/// Whether any user exists (the localhost exception ends with the first).
pub fn any_users(shared: &Shared) -> bool {
    shared.store.collection(USERS_DB, USERS_COLLECTION).is_some_and(|c| c.snapshot().count().map_or(true, |n| n > 0))
}

/// (role, db) pairs of a user or role document's `roles`.
pub fn roles_of(user_doc: &Document) -> Vec<(String, String)> {
    user_doc
        .get_array("roles")
        .map(|a| {
            a.iter().filter_map(|r| r.as_document()).filter_map(|r| Some((r.get_str("role").ok()?.to_string(), r.get_str("db").ok()?.to_string()))).collect()
        })
        .unwrap_or_default()
}

/// Record that the connection authenticated as `user`@`db`. mongod allows one user per
/// connection: authenticating as another fails.
pub fn log_in(shared: &Shared, conn: &mut ConnState, user: &str, db: &str) -> Result<()> {
    if let Some(u) = &conn.auth.user {
        if u.user != user || u.db != db {
            return Err(Error::location(
                5626701,
                format!("Each client connection may only be authenticated once. Previously authenticated as: {}@{}", u.user, u.db),
            ));
        }
    }
    let generation = shared.auth.generation.load(Ordering::SeqCst);
    let roles = if is_internal(user, db) {
        vec![(roles::INTERNAL_ROLE.to_string(), "admin".to_string())]
    } else {
        find_user(shared, db, user)?.map(|d| roles_of(&d)).unwrap_or_default()
    };
    let grants = grants_of(shared, &roles)?;
    conn.auth.user = Some(AuthedUser { user: user.to_string(), db: db.to_string(), roles, grants, generation });
    Ok(())
}

/// Re-read the connection's user if users changed since it last did; a user that is gone
/// leaves the connection unauthenticated.
fn refresh(shared: &Shared, conn: &mut ConnState) -> Result<()> {
    let generation = shared.auth.generation.load(Ordering::SeqCst);
    let Some(u) = &mut conn.auth.user else { return Ok(()) };
    if u.generation == generation || is_internal(&u.user, &u.db) {
        return Ok(());
    }
    match find_user(shared, &u.db, &u.user)? {
        Some(d) => {
            u.roles = roles_of(&d);
            u.grants = grants_of(shared, &u.roles)?;
            u.generation = generation;
        }
        None => conn.auth.user = None,
    }
    Ok(())
}

/// Whether the connection's user holds `action` on `resource`.
pub fn is_authorized(conn: &ConnState, action: &str, resource: &Resource) -> bool {
    conn.auth.user.as_ref().is_some_and(|u| u.grants.allow(action, resource))
}

/// What running a command takes.
enum Need {
    /// Nothing: it runs before authentication (hello, saslStart...).
    Nothing,
    /// An authenticated user, with no particular privilege.
    AnyUser,
    /// Each action on its resource.
    Privileges(Vec<(&'static str, Resource)>),
}

/// Check that the connection may run `name` (a known command) with body `cmd` on `db`.
pub fn check(shared: &Shared, conn: &mut ConnState, db: &str, name: &str, cmd: &Document) -> Result<()> {
    if !shared.auth.enabled {
        return Ok(());
    }
    refresh(shared, conn)?;
    let need = need(name, db, cmd);
    if matches!(need, Need::Nothing) {
        return Ok(());
    }
    if conn.auth.user.is_none() {
        // The localhost exception: until the first user exists, a client on this host may
        // create it, and bootstrap a replica set, without authenticating.
        let bootstrap = match name {
            "createUser" => db == USERS_DB || db == EXTERNAL_DB,
            "replSetInitiate" | "replSetGetStatus" => true,
            _ => false,
        };
        if bootstrap && conn.remote.ip().is_loopback() && !any_users(shared) {
            return Ok(());
        }
        return Err(Error::new(Code::Unauthorized, format!("Command {name} requires authentication")));
    }
    let Need::Privileges(privileges) = need else { return Ok(()) };
    // A user may always read their own user document and change their own password.
    if let Some(u) = &conn.auth.user {
        if name == "usersInfo" && names_only_user(cmd, db, &u.user, &u.db) {
            return Ok(());
        }
    }
    if privileges.iter().all(|(action, resource)| is_authorized(conn, action, resource)) {
        return Ok(());
    }
    Err(Error::new(Code::Unauthorized, format!("not authorized on {db} to execute command {}", redacted(cmd))))
}

/// Fields that carry a password or a SCRAM message.
pub const SECRET_FIELDS: [&str; 3] = ["pwd", "payload", "speculativeAuthenticate"];

/// Whether command `name` carries a secret (currentOp shows it redacted). Only these
/// commands can; the name test keeps the check off other commands' path.
pub fn has_secrets(name: &str, cmd: &Document) -> bool {
    matches!(name, "createUser" | "updateUser" | "saslStart" | "saslContinue" | "hello" | "isMaster" | "ismaster")
        && SECRET_FIELDS.iter().any(|k| cmd.contains_key(k))
}

/// The command with its secrets replaced by "xxx", as mongod shows it.
pub fn redacted(cmd: &Document) -> Document {
    let mut d = cmd.clone();
    for k in SECRET_FIELDS {
        if d.contains_key(k) {
            d.insert(k, "xxx");
        }
    }
    d
}

/// Whether a usersInfo asks only about `user`@`user_db`.
fn names_only_user(cmd: &Document, db: &str, user: &str, user_db: &str) -> bool {
    match cmd.get("usersInfo") {
        Some(Bson::String(u)) => u == user && db == user_db,
        Some(Bson::Document(d)) => d.get_str("user").ok() == Some(user) && d.get_str("db").ok() == Some(user_db),
        _ => false,
    }
}

fn coll_arg<'a>(cmd: &'a Document, name: &str) -> &'a str {
    cmd.get_str(name).unwrap_or("")
}

fn need(name: &str, db: &str, cmd: &Document) -> Need {
    use Need::*;
    let ns = |action: &'static str| Privileges(vec![(action, Resource::ns(db, coll_arg(cmd, name)))]);
    let on_db = |action: &'static str| Privileges(vec![(action, Resource::db(db))]);
    let cluster = |action: &'static str| Privileges(vec![(action, Resource::Cluster)]);
    match name {
        "hello" | "isMaster" | "ismaster" | "ping" | "buildInfo" | "buildinfo" | "saslStart" | "saslContinue" | "authenticate" | "connectionStatus"
        | "listCommands" | "logout" | "configureFailPoint" => Nothing,
        "whatsmyuri" | "endSessions" | "killSessions" | "refreshSessions" | "startSession" | "listDatabases" => AnyUser,
        "find" | "count" | "distinct" => ns("find"),
        "listIndexes" => ns("listIndexes"),
        "collStats" => ns("collStats"),
        "validate" => ns("validate"),
        "create" => ns("createCollection"),
        "drop" => ns("dropCollection"),
        "createIndexes" => ns("createIndex"),
        "dropIndexes" | "deleteIndexes" => ns("dropIndex"),
        "insert" => ns("insert"),
        "delete" => ns("remove"),
        "update" => {
            let upsert = cmd.get_array("updates").is_ok_and(|u| u.iter().any(|s| s.as_document().is_some_and(|s| s.get_bool("upsert").unwrap_or(false))));
            let coll = Resource::ns(db, coll_arg(cmd, name));
            let mut p = vec![("update", coll.clone())];
            if upsert {
                p.push(("insert", coll));
            }
            Privileges(p)
        }
        "findAndModify" | "findandmodify" => {
            let coll = Resource::ns(db, coll_arg(cmd, name));
            let mut p = vec![("find", coll.clone())];
            if cmd.get_bool("remove").unwrap_or(false) {
                p.push(("remove", coll));
            } else {
                p.push(("update", coll.clone()));
                if cmd.get_bool("upsert").unwrap_or(false) {
                    p.push(("insert", coll));
                }
            }
            Privileges(p)
        }
        // A getMore or killCursors needs what reading the collection needs. (mongod checks
        // that the cursor is the user's own; shoal's cursors do not record their user yet.)
        "getMore" => Privileges(vec![("find", Resource::ns(db, cmd.get_str("collection").unwrap_or("")))]),
        "killCursors" => ns("killCursors"),
        "aggregate" => Privileges(aggregate_privileges(db, cmd)),
        "explain" => match cmd.get_document("explain") {
            Ok(inner) => match inner.keys().next().map(|k| k.as_str()) {
                Some(inner_name) if inner_name != "explain" => need(inner_name, db, inner),
                _ => AnyUser,
            },
            Err(_) => AnyUser,
        },
        "listCollections" => on_db("listCollections"),
        "dbStats" => on_db("dbStats"),
        "dropDatabase" => on_db("dropDatabase"),
        "renameCollection" => {
            let split = |k: &str| cmd.get_str(k).ok().and_then(|s| s.split_once('.')).map(|(d, c)| (d.to_string(), c.to_string()));
            match (split("renameCollection"), split("to")) {
                (Some((fd, _)), Some((td, tc))) if fd == td => {
                    let mut p = vec![("renameCollectionSameDB", Resource::Db(fd))];
                    if cmd.get_bool("dropTarget").unwrap_or(false) {
                        p.push(("dropCollection", Resource::Ns(td, tc)));
                    }
                    Privileges(p)
                }
                (Some((fd, fc)), Some((td, tc))) => Privileges(vec![
                    ("find", Resource::Ns(fd.clone(), fc.clone())),
                    ("dropCollection", Resource::Ns(fd, fc)),
                    ("insert", Resource::Ns(td.clone(), tc.clone())),
                    ("createIndex", Resource::Ns(td, tc)),
                ]),
                // Malformed: the command's own parsing says why, for a user who could rename.
                _ => on_db("renameCollectionSameDB"),
            }
        }
        "serverStatus" => cluster("serverStatus"),
        "hostInfo" => cluster("hostInfo"),
        "getCmdLineOpts" => cluster("getCmdLineOpts"),
        "getParameter" => cluster("getParameter"),
        "getLog" => cluster("getLog"),
        "currentOp" => cluster("inprog"),
        "killOp" => cluster("killop"),
        "shutdown" => cluster("shutdown"),
        "killAllSessions" => cluster("killAnySession"),
        "replSetGetStatus" => cluster("replSetGetStatus"),
        "replSetGetConfig" => cluster("replSetGetConfig"),
        "replSetInitiate" | "replSetReconfig" => cluster("replSetConfigure"),
        "replSetStepDown" | "replSetFreeze" | "replSetSyncFrom" | "replSetStepUp" => cluster("replSetStateChange"),
        "applyOps" => cluster("applyOps"),
        "getAuditConfig" | "setAuditConfig" => cluster("auditConfigure"),
        "logRotate" => cluster("logRotate"),
        // Member-to-member commands: only the internal user runs them (internal
        // authentication, a keyFile, is not built yet, so no one does under --auth).
        "replSetHeartbeat" | "replSetRequestVotes" | "replSetUpdatePosition" | "replSetGetAcknowledged" | "replSetGetRBID" => cluster("internal"),
        // Router-to-shard commands of sharding (commands::sharding).
        "_addShard"
        | "_shardsvrCleanupRange"
        | "_recvChunkApply"
        | "_shardsvrMigrateStart"
        | "_shardsvrMigrateClone"
        | "_shardsvrTransferMods"
        | "_shardsvrEnterCriticalSection"
        | "_shardsvrExitCriticalSection" => cluster("internal"),
        "createUser" => {
            let mut p = vec![("createUser", Resource::db(db))];
            p.extend(role_dbs(cmd, db).into_iter().map(|d| ("grantRole", Resource::Db(d))));
            Privileges(p)
        }
        "updateUser" => {
            let mut p = Vec::new();
            if cmd.contains_key("pwd") {
                p.push(("changePassword", Resource::db(db)));
            }
            if cmd.contains_key("customData") {
                p.push(("changeCustomData", Resource::db(db)));
            }
            if cmd.contains_key("roles") {
                p.push(("revokeRole", Resource::db(db)));
                p.extend(role_dbs(cmd, db).into_iter().map(|d| ("grantRole", Resource::Db(d))));
            }
            if p.is_empty() {
                p.push(("changePassword", Resource::db(db)));
            }
            Privileges(p)
        }
        "dropUser" | "dropAllUsersFromDatabase" => on_db("dropUser"),
        "usersInfo" => match cmd.get("usersInfo") {
            Some(Bson::Document(d)) if d.get_bool("forAllDBs").unwrap_or(false) => cluster("viewUser"),
            Some(Bson::Document(d)) => Privileges(vec![("viewUser", Resource::db(d.get_str("db").unwrap_or(db)))]),
            _ => on_db("viewUser"),
        },
        "grantRolesToUser" | "grantRolesToRole" => Privileges(role_dbs(cmd, db).into_iter().map(|d| ("grantRole", Resource::Db(d))).collect()),
        "revokeRolesFromUser" | "revokeRolesFromRole" => Privileges(role_dbs(cmd, db).into_iter().map(|d| ("revokeRole", Resource::Db(d))).collect()),
        "createRole" | "updateRole" => {
            let mut p = vec![("createRole", Resource::db(db))];
            if name == "updateRole" {
                p.push(("dropRole", Resource::db(db)));
            }
            p.extend(role_dbs(cmd, db).into_iter().map(|d| ("grantRole", Resource::Db(d))));
            Privileges(p)
        }
        "dropRole" | "dropAllRolesFromDatabase" => on_db("dropRole"),
        "grantPrivilegesToRole" => on_db("grantRole"),
        "revokePrivilegesFromRole" => on_db("revokeRole"),
        "rolesInfo" => {
            let named: Vec<&Bson> = match cmd.get("rolesInfo") {
                Some(Bson::Array(a)) => a.iter().collect(),
                Some(v) => vec![v],
                None => Vec::new(),
            };
            let mut dbs: Vec<String> = named.iter().map(|v| v.as_document().and_then(|d| d.get_str("db").ok()).unwrap_or(db).to_string()).collect();
            dbs.push(db.to_string());
            dbs.sort();
            dbs.dedup();
            Privileges(dbs.into_iter().map(|d| ("viewRole", Resource::Db(d))).collect())
        }
        // A command this table does not know needs everything: only root-like users pass.
        _ => cluster("internal"),
    }
}

/// The databases of the roles a user-management command grants (a bare role name is on
/// the command's database).
fn role_dbs(cmd: &Document, db: &str) -> Vec<String> {
    let mut out: Vec<String> = cmd
        .get_array("roles")
        .map(|a| {
            a.iter()
                .filter_map(|r| match r {
                    Bson::String(_) => Some(db.to_string()),
                    Bson::Document(d) => d.get_str("db").ok().map(str::to_string),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out.dedup();
    out
}

/// An aggregation reads its source collection, and whatever its stages read or write.
fn aggregate_privileges(db: &str, cmd: &Document) -> Vec<(&'static str, Resource)> {
    let mut p = Vec::new();
    // aggregate: 1 runs on the database ($documents, $currentOp...) and reads no collection.
    if let Some(Bson::String(c)) = cmd.get("aggregate") {
        p.push(("find", Resource::ns(db, c)));
    }
    if let Ok(pipeline) = cmd.get_array("pipeline") {
        stage_privileges(db, pipeline, &mut p);
    }
    p
}

fn stage_privileges(db: &str, pipeline: &[Bson], p: &mut Vec<(&'static str, Resource)>) {
    for stage in pipeline.iter().filter_map(|s| s.as_document()) {
        let Some((name, spec)) = stage.iter().next() else { continue };
        match (name.as_str(), spec) {
            ("$out", Bson::String(c)) => {
                p.push(("insert", Resource::ns(db, c)));
                p.push(("remove", Resource::ns(db, c)));
            }
            ("$out", Bson::Document(d)) => {
                let r = Resource::ns(d.get_str("db").unwrap_or(db), d.get_str("coll").unwrap_or(""));
                p.push(("insert", r.clone()));
                p.push(("remove", r));
            }
            ("$merge", spec) => {
                let r = match spec {
                    Bson::String(c) => Resource::ns(db, c),
                    Bson::Document(d) => match d.get("into") {
                        Some(Bson::String(c)) => Resource::ns(db, c),
                        Some(Bson::Document(i)) => Resource::ns(i.get_str("db").unwrap_or(db), i.get_str("coll").unwrap_or("")),
                        _ => Resource::ns(db, ""),
                    },
                    _ => Resource::ns(db, ""),
                };
                p.push(("insert", r.clone()));
                p.push(("update", r));
            }
            ("$lookup" | "$graphLookup", Bson::Document(d)) => {
                if let Ok(from) = d.get_str("from") {
                    p.push(("find", Resource::ns(db, from)));
                }
                if let Ok(inner) = d.get_array("pipeline") {
                    stage_privileges(db, inner, p);
                }
            }
            ("$unionWith", Bson::String(c)) => p.push(("find", Resource::ns(db, c))),
            ("$unionWith", Bson::Document(d)) => {
                if let Ok(c) = d.get_str("coll") {
                    p.push(("find", Resource::ns(db, c)));
                }
                if let Ok(inner) = d.get_array("pipeline") {
                    stage_privileges(db, inner, p);
                }
            }
            ("$facet", Bson::Document(d)) => {
                for inner in d.values().filter_map(|v| v.as_array()) {
                    stage_privileges(db, inner, p);
                }
            }
            ("$currentOp", _) => p.push(("inprog", Resource::Cluster)),
            _ => {}
        }
    }
}
