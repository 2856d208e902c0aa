//! The router's commands, one row each: its name, whether it runs only on admin, and its
//! handler. Dispatch (`commands::run`) and listCommands read this table; a name it lacks
//! answers CommandNotFound, as mongos does for commands it does not have. What a command
//! needs of the user is the shared privilege table (`access::privileges::need`).

use crate::commands as c;
use crate::{admin, balance, introspect, users, Router, RouterConn};
use bson::{doc, Document};
use common::Result;
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::OnceLock;
use wire::Request;

type Handler = for<'a> fn(&'a Router, &'a mut RouterConn, &'a Request) -> BoxFuture<'a, Result<Document>>;

pub struct Row {
    pub name: &'static str,
    /// Runs only on the admin database (mongos's adminOnly): these change the cluster.
    pub admin_only: bool,
    /// A CRUD command: its authorization checks are audited when they pass too
    /// (`auditAuthorizationSuccess`).
    pub crud: bool,
    pub run: Handler,
}

macro_rules! rows {
    ($($name:literal $(| $alias:literal)* => $admin:ident, |$r:ident, $conn:ident, $q:ident| $body:expr;)*) => {
        &[$(
            Row { name: $name, admin_only: rows!(@admin $admin), crud: rows!(@crud $admin), run: |$r, $conn, $q| Box::pin(async move { let _ = &$conn; $body }) },
            $(Row { name: $alias, admin_only: rows!(@admin $admin), crud: rows!(@crud $admin), run: |$r, $conn, $q| Box::pin(async move { let _ = &$conn; $body }) },)*
        )*]
    };
    (@admin admin) => { true };
    (@admin $other:ident) => { false };
    (@crud crud) => { true };
    (@crud $other:ident) => { false };
}

// Each row: name(s) => where it runs (admin: only on admin; crud: a CRUD command on any
// database; any), and its handler.
pub static COMMANDS: &[Row] = rows! {
    "hello" | "isMaster" | "ismaster" => any, |r, conn, q| c::hello(r, conn, q).await;
    "ping" => any, |_r, conn, _q| Ok(Document::new());
    "buildInfo" | "buildinfo" => any, |_r, conn, _q| Ok(common::server::build_info());
    "isdbgrid" => any, |_r, conn, _q| Ok(doc! {"isdbgrid": 1, "hostname": net::process::hostname()});
    "whatsmyuri" => any, |_r, conn, _q| Ok(doc! {"you": conn.remote.to_string()});
    "listCommands" => any, |r, conn, _q| Ok(list_commands(r.config.enable_test_commands));
    "saslStart" => any, |r, conn, q| users::sasl_start(r, conn, &q.db, &q.body).await;
    "saslContinue" => any, |r, conn, q| users::sasl_continue(r, conn, &q.body).await;
    "authenticate" => any, |r, conn, q| users::authenticate(r, conn, &q.db, &q.body).await;
    "logout" => any, |r, conn, q| Ok(users::logout(r, conn, &q.db));
    "connectionStatus" => any, |_r, conn, q| Ok(users::connection_status(conn, q));
    "createUser" | "updateUser" | "dropUser" | "dropAllUsersFromDatabase" | "usersInfo" | "grantRolesToUser" | "revokeRolesFromUser" | "createRole"
        | "updateRole" | "dropRole" | "dropAllRolesFromDatabase" | "grantRolesToRole" | "revokeRolesFromRole" | "grantPrivilegesToRole"
        | "revokePrivilegesFromRole" | "rolesInfo" => any, |r, conn, q| users::user_command(r, conn, q).await;
    "endSessions" => any, |r, conn, q| c::end_sessions(r, q).await;
    // Run through `txn` (with autocommit: false); outside a transaction they are refused.
    "commitTransaction" | "abortTransaction" => admin, |_r, conn, q| Err(common::Error::new(
        common::Code::InvalidOptions,
        format!("{} must be run within a transaction (with lsid, txnNumber and autocommit: false)", q.name),
    ));
    "addShard" | "addshard" => admin, |r, conn, q| c::add_shard(r, q).await;
    "listShards" | "listshards" => admin, |r, conn, _q| c::list_shards(r).await;
    "enableSharding" | "enablesharding" => admin, |r, conn, q| c::enable_sharding(r, q).await;
    "shardCollection" | "shardcollection" => admin, |r, conn, q| c::shard_collection(r, q).await;
    "split" => admin, |r, conn, q| balance::split(r, q).await;
    "balancerStart" => admin, |r, conn, _q| balance::set_balancer(r, true).await;
    "balancerStop" => admin, |r, conn, _q| balance::set_balancer(r, false).await;
    "balancerStatus" => admin, |r, conn, _q| balance::balancer_status(r).await;
    "removeShard" | "removeshard" => admin, |r, conn, q| balance::remove_shard(r, q).await;
    "movePrimary" | "moveprimary" => admin, |r, conn, q| balance::move_primary(r, q).await;
    "moveChunk" | "movechunk" | "moveRange" => admin, |r, conn, q| c::move_chunk(r, q).await;
    "flushRouterConfig" | "flushrouterconfig" => admin, |r, conn, q| admin::flush_router_config(r, q).await;
    "getShardMap" => admin, |r, conn, _q| admin::get_shard_map(r).await;
    "insert" => crud, |r, conn, q| c::insert(r, q).await;
    "update" => crud, |r, conn, q| c::update(r, q).await;
    "delete" => crud, |r, conn, q| c::delete(r, q).await;
    "find" | "count" | "distinct" | "findAndModify" | "findandmodify" => crud, |r, conn, q| c::whole(r, q).await;
    "aggregate" => crud, |r, conn, q| c::aggregate_command(r, conn, q).await;
    "getMore" => crud, |r, conn, q| c::get_more(r, q).await;
    "killCursors" => crud, |r, conn, q| c::kill_cursors(r, q).await;
    "serverStatus" => any, |r, conn, _q| Ok(introspect::server_status(r));
    "dbStats" | "dbstats" => any, |r, conn, q| introspect::db_stats(r, q).await;
    "collStats" | "collstats" => any, |r, conn, q| introspect::coll_stats(r, q).await;
    "explain" => any, |r, conn, q| introspect::explain(r, q).await;
    "listDatabases" => any, |r, conn, q| c::list_databases(r, q).await;
    "listCollections" | "listIndexes" | "create" => any, |r, conn, q| c::forward_to_primary(r, q).await;
    "createIndexes" | "dropIndexes" | "deleteIndexes" | "drop" | "collMod" => any, |r, conn, q| c::forward_to_owners(r, q).await;
    "dropDatabase" => any, |r, conn, q| c::drop_database(r, q).await;
    "validate" => any, |r, conn, q| admin::validate(r, q).await;
    "renameCollection" => admin, |r, conn, q| admin::rename_collection(r, q).await;
    "getParameter" => admin, |r, conn, q| admin::get_parameter(r, q);
    "configureFailPoint" => admin, |r, conn, q| admin::configure_fail_point(r, q);
    "waitForFailPoint" => admin, |r, conn, q| admin::wait_for_fail_point(r, q).await;
    "testVersion2" | "testVersion1AndVersion2" => any, |r, conn, q| admin::test_api_command(r, q);
    "getCmdLineOpts" => admin, |r, conn, _q| Ok(admin::get_cmd_line_opts(r));
    "hostInfo" => any, |_r, conn, _q| Ok(net::process::host_info(&net::process::hostname()));
    "getLog" => admin, |_r, conn, q| common::server::get_log(&q.body);
    "currentOp" => admin, |r, conn, q| admin::current_op(r, q).await;
    "killOp" => admin, |r, conn, q| admin::kill_op(r, q).await;
};

/// The row for a command name.
pub fn lookup(name: &str) -> Option<&'static Row> {
    static BY_NAME: OnceLock<HashMap<&'static str, &'static Row>> = OnceLock::new();
    BY_NAME.get_or_init(|| COMMANDS.iter().map(|r| (r.name, r)).collect()).get(name).copied()
}

/// listCommands: every row, as mongos lists them (test commands only with
/// enableTestCommands).
fn list_commands(test_commands: bool) -> Document {
    let mut cmds = Document::new();
    for r in COMMANDS.iter().filter(|r| test_commands || !common::server::TEST_COMMANDS.contains(&r.name)) {
        cmds.insert(r.name, doc! {"help": "", "adminOnly": r.admin_only, "secondaryOk": true, "requiresAuth": !matches!(access::privileges::need(r.name, "admin", &Document::new()), access::privileges::Need::Nothing)});
    }
    doc! {"commands": cmds}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_one_row() {
        let mut names = std::collections::HashSet::new();
        for r in COMMANDS {
            assert!(names.insert(r.name), "{} twice", r.name);
            assert!(lookup(r.name).is_some());
        }
        assert!(lookup("noSuchCommand").is_none());
    }

    /// Every router command is one a client may be granted: none falls to the internal
    /// role for want of an entry in the privilege table.
    #[test]
    fn every_row_has_a_privilege() {
        let closed: Vec<&str> =
            COMMANDS.iter().map(|r| r.name).filter(|n| access::privileges::needs_internal(&access::privileges::need(n, "admin", &Document::new()))).collect();
        assert!(closed.is_empty(), "{closed:?}");
    }
}
