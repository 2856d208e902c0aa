//! What each command needs: the privilege table (an action on a resource per command, from
//! its arguments), checked against what a user's roles grant (`authorize`). A command the
//! table does not name needs the `internal` action, which only the internal role grants: a
//! new command is closed until it is given a privilege. mongod and the router check with
//! this one table.

use crate::roles::Resource;
use crate::{AuthedUser, EXTERNAL_DB, USERS_DB};
use bson::{Bson, Document};
use common::{Code, Error, Result};

/// Whether `name` on `db` is one a client on this host may run before any user exists
/// (the localhost exception: create the first user, bootstrap a replica set).
pub fn is_bootstrap(name: &str, db: &str) -> bool {
    match name {
        "createUser" => db == USERS_DB || db == EXTERNAL_DB,
        "replSetInitiate" | "replSetGetStatus" => true,
        _ => false,
    }
}

/// Whether `user` (None: not authenticated) may run `name` (a known command) with body
/// `cmd` on `db`. `localhost_exception` says whether the client is on this host and no user
/// exists yet; it is asked only for a bootstrap command of an unauthenticated client.
pub fn authorize(user: Option<&AuthedUser>, db: &str, name: &str, cmd: &Document, localhost_exception: impl FnOnce() -> bool) -> Result<()> {
    let need = need(name, db, cmd);
    if matches!(need, Need::Nothing) {
        return Ok(());
    }
    let Some(user) = user else {
        if is_bootstrap(name, db) && localhost_exception() {
            return Ok(());
        }
        return Err(Error::new(Code::Unauthorized, format!("Command {name} requires authentication")));
    };
    let Need::Privileges(privileges) = need else { return Ok(()) };
    // A user may always read their own user document.
    if name == "usersInfo" && names_only_user(cmd, db, &user.user, &user.db) {
        return Ok(());
    }
    if privileges.iter().all(|(action, resource)| user.grants.allow(action, resource)) {
        return Ok(());
    }
    Err(Error::new(Code::Unauthorized, format!("not authorized on {db} to execute command {}", redacted(cmd))))
}

/// What running a command takes.
pub enum Need {
    /// Nothing: it runs before authentication (hello, saslStart...).
    Nothing,
    /// An authenticated user, with no particular privilege.
    AnyUser,
    /// Each action on its resource.
    Privileges(Vec<(&'static str, Resource)>),
}

/// Whether `need` is the internal role's privilege alone (member-to-member commands, and
/// any command the table does not name).
pub fn needs_internal(need: &Need) -> bool {
    matches!(need, Need::Privileges(p) if p.len() == 1 && p[0].0 == "internal" && p[0].1 == Resource::Cluster)
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

pub fn need(name: &str, db: &str, cmd: &Document) -> Need {
    use Need::*;
    let ns = |action: &'static str| Privileges(vec![(action, Resource::ns(db, coll_arg(cmd, name)))]);
    let on_db = |action: &'static str| Privileges(vec![(action, Resource::db(db))]);
    let cluster = |action: &'static str| Privileges(vec![(action, Resource::Cluster)]);
    match name {
        "hello"
        | "isMaster"
        | "ismaster"
        | "ping"
        | "buildInfo"
        | "buildinfo"
        | "saslStart"
        | "saslContinue"
        | "authenticate"
        | "connectionStatus"
        | "listCommands"
        | "logout"
        | "configureFailPoint"
        | "waitForFailPoint"
        | "testVersion2"
        | "testVersion1AndVersion2" => Nothing,
        "whatsmyuri" | "endSessions" | "killSessions" | "refreshSessions" | "startSession" | "listDatabases" | "commitTransaction" | "abortTransaction" => {
            AnyUser
        }
        "find" | "count" | "distinct" => ns("find"),
        "listIndexes" => ns("listIndexes"),
        "collStats" | "collstats" => ns("collStats"),
        "collMod" => ns("collMod"),
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
        "dbStats" | "dbstats" => on_db("dbStats"),
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
        "fsync" => cluster("fsync"),
        "killAllSessions" => cluster("killAnySession"),
        "replSetGetStatus" => cluster("replSetGetStatus"),
        "replSetGetConfig" => cluster("replSetGetConfig"),
        "replSetInitiate" | "replSetReconfig" => cluster("replSetConfigure"),
        "replSetStepDown" | "replSetFreeze" | "replSetSyncFrom" | "replSetStepUp" => cluster("replSetStateChange"),
        "applyOps" => cluster("applyOps"),
        "appendOplogNote" => cluster("appendOplogNote"),
        "getAuditConfig" | "setAuditConfig" => cluster("auditConfigure"),
        "logRotate" => cluster("logRotate"),
        // Member-to-member commands: only the internal user (a keyFile's) runs them.
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
        // The router's cluster commands, on admin (the namespace a sharding command names
        // is its argument, "db.coll").
        "addShard" | "addshard" => cluster("addShard"),
        "listShards" | "listshards" => cluster("listShards"),
        "removeShard" | "removeshard" => cluster("removeShard"),
        "balancerStart" | "balancerStop" | "balancerStatus" => cluster("balancer"),
        "flushRouterConfig" | "flushrouterconfig" => cluster("flushRouterConfig"),
        "getShardMap" => cluster("getShardMap"),
        "isdbgrid" => AnyUser,
        "enableSharding" | "enablesharding" | "movePrimary" | "moveprimary" => {
            let target = cmd.get_str(name).unwrap_or("");
            Privileges(vec![(if name.eq_ignore_ascii_case("movePrimary") { "moveChunk" } else { "enableSharding" }, Resource::db(target))])
        }
        "shardCollection" | "shardcollection" | "split" | "moveChunk" | "movechunk" | "moveRange" => {
            let (d, c) = cmd.get_str(name).ok().and_then(|s| s.split_once('.')).unwrap_or(("", ""));
            let action = match name {
                "split" => "splitChunk",
                "shardCollection" | "shardcollection" => "enableSharding",
                _ => "moveChunk",
            };
            Privileges(vec![(action, Resource::ns(d, c))])
        }
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
