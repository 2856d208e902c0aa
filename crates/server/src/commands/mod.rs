//! Command handlers, one module per family. Each handler takes the parsed request context and
//! returns the reply body without `ok` (dispatch adds `ok: 1`) or a MongoDB-style error.

mod admin;
pub(crate) mod aggregate;
mod crud;
mod explain;
pub(crate) mod hello;
mod repl;
mod roles;
pub(crate) mod sharding;
pub mod users;

use crate::conn::ConnState;
use crate::dispatch::WriteConcern;
use crate::ops::OpCtx;
use crate::state::Shared;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};

pub struct Ctx<'a> {
    pub shared: &'a Shared,
    pub conn: &'a mut ConnState,
    pub db: &'a str,
    pub name: &'a str,
    pub cmd: &'a Document,
    pub op: &'a OpCtx<'a>,
    pub write_concern: Option<WriteConcern>,
    /// Set for a retryable write (`retry`).
    pub retry: Option<RetryCtx<'a>>,
    /// The reply waits (`conn::wait_for_replication`) until the write is durable here too:
    /// its fsync is left to the journal flusher (`ReplCoord::request_journal_flush`),
    /// shared by every write meanwhile, instead of a thread blocked in a group commit.
    pub defer_durable: bool,
}

/// A retryable write's context: what earlier attempts did, and the guard on which the
/// handler names the statement each of its writes belongs to.
pub struct RetryCtx<'a> {
    pub executed: &'a crate::retry::Executed,
    pub guard: &'a storage::RetryableWriteGuard,
}

impl Ctx<'_> {
    /// A retryable write's statement `stmt` is next: the entries it logs carry it. `None`
    /// if it already took effect in an earlier attempt (its entries, to rebuild its result).
    pub fn begin_statement(&self, stmt: i32) -> Option<&[Document]> {
        let r = self.retry.as_ref()?;
        r.guard.set_statement(stmt);
        r.executed.statement(stmt)
    }

    /// The logged-in user as (name, database), under authorization (cursors remember it).
    pub fn user_name(&self) -> Option<(String, String)> {
        self.conn.auth.user.as_ref().filter(|_| self.shared.auth.enabled).map(|u| (u.user.clone(), u.db.clone()))
    }

    /// Keep `cursor` open for getMore, as the logged-in user's.
    pub fn register_cursor(&self, mut cursor: crate::cursor::Cursor) -> Result<i64> {
        cursor.owner = self.user_name();
        self.shared.cursors.register(cursor)
    }

    /// `exec::planned_scan`, keeping to this shard's chunks for a router's versioned
    /// operation (`sharding::admit`); then no plan is covered, as the shard key is read.
    pub fn planned_scan(
        &self,
        snapshot: storage::Snapshot,
        filter: &Document,
        sort: Option<&query::sort::SortSpec>,
        hint: Option<&Bson>,
        projected: Option<&[String]>,
    ) -> Result<(crate::exec::Scan, crate::plan::Plan)> {
        let owner = self.conn.shard_filter.clone();
        let projected = if owner.is_some() { None } else { projected };
        let (scan, plan) = crate::exec::planned_scan(snapshot, filter, sort, hint, projected)?;
        Ok((scan.owned_by(owner), plan))
    }

    /// The statement id of the command's `i`th statement: its `stmtIds` entry if it has one
    /// (what mongos sends), else its position.
    pub fn statement_id(&self, i: usize) -> i32 {
        match self.cmd.get_array("stmtIds").ok().and_then(|ids| ids.get(i)) {
            Some(Bson::Int32(id)) => *id,
            _ => i as i32,
        }
    }
}

pub type Handler = fn(&mut Ctx) -> Result<Document>;

/// Defines `lookup` (name to handler) and `NAMES` (every name, for listCommands) from one
/// list, so the two cannot disagree.
macro_rules! command_table {
    ($($($name:literal)|+ => $handler:path,)*) => {
        /// The command table. Names are case-sensitive as in MongoDB (isMaster has its
        /// lowercase alias).
        pub fn lookup(name: &str) -> Option<Handler> {
            Some(match name {
                $($($name)|+ => $handler,)*
                _ => return None,
            })
        }

        /// Every command name `lookup` knows.
        pub const NAMES: &[&str] = &[$($($name,)+)*];
    };
}

command_table! {
    "hello" | "isMaster" | "ismaster" => hello::hello,
    "ping" => hello::ping,
    "buildInfo" | "buildinfo" => hello::build_info,
    "getParameter" => hello::get_parameter,
    "getCmdLineOpts" => hello::get_cmd_line_opts,
    "serverStatus" => hello::server_status,
    "hostInfo" => hello::host_info,
    "connectionStatus" => hello::connection_status,
    "whatsmyuri" => hello::whatsmyuri,
    "getLog" => hello::get_log,
    "listCommands" => hello::list_commands,
    "endSessions" => hello::end_sessions,
    "killAllSessions" => hello::kill_all_sessions,
    "killSessions" => hello::end_sessions,
    "refreshSessions" => hello::refresh_sessions,
    "startSession" => hello::start_session,
    "currentOp" => hello::current_op,
    "killOp" => hello::kill_op,
    "shutdown" => hello::shutdown,
    "listDatabases" => admin::list_databases,
    "listCollections" => admin::list_collections,
    "listIndexes" => admin::list_indexes,
    "create" => admin::create,
    "drop" => admin::drop,
    "dropDatabase" => admin::drop_database,
    "renameCollection" => admin::rename_collection,
    "collStats" => admin::coll_stats,
    "dbStats" => admin::db_stats,
    "validate" => admin::validate,
    "createIndexes" => admin::create_indexes,
    "dropIndexes" | "deleteIndexes" => admin::drop_indexes,
    "insert" => crud::insert,
    "find" => crud::find,
    "getMore" => crud::get_more,
    "killCursors" => crud::kill_cursors,
    "update" => crud::update,
    "delete" => crud::delete,
    "findAndModify" | "findandmodify" => crud::find_and_modify,
    "count" => crud::count,
    "distinct" => crud::distinct,
    "aggregate" => aggregate::aggregate,
    "explain" => explain::explain,
    "replSetInitiate" => repl::repl_set_initiate,
    "replSetGetConfig" => repl::repl_set_get_config,
    "replSetGetStatus" => repl::repl_set_get_status,
    "applyOps" => repl::apply_ops,
    "replSetHeartbeat" => repl::repl_set_heartbeat,
    "_addShard" => sharding::add_shard,
    "_shardsvrCleanupRange" => sharding::cleanup_range,
    "_shardsvrMigrateStart" => sharding::migrate_start,
    "_shardsvrMigrateClone" => sharding::migrate_clone,
    "_shardsvrTransferMods" => sharding::transfer_mods,
    "_shardsvrEnterCriticalSection" => sharding::enter_critical_section,
    "_shardsvrExitCriticalSection" => sharding::exit_critical_section,
    "_recvChunkApply" => sharding::recv_chunk_apply,
    "replSetRequestVotes" => repl::repl_set_request_votes,
    "replSetUpdatePosition" => repl::repl_set_update_position,
    "replSetGetAcknowledged" => repl::repl_set_get_acknowledged,
    "replSetGetRBID" => repl::repl_set_get_rbid,
    "replSetStepDown" => repl::repl_set_step_down,
    "replSetFreeze" => repl::repl_set_freeze,
    "replSetReconfig" => repl::repl_set_reconfig,
    "replSetSyncFrom" => repl::repl_set_sync_from,
    "replSetStepUp" => repl::repl_set_step_up,
    "configureFailPoint" => repl::configure_fail_point,
    "saslStart" => users::sasl_start,
    "authenticate" => users::authenticate,
    "getAuditConfig" => users::get_audit_config,
    "logRotate" => users::log_rotate,
    "setAuditConfig" => users::set_audit_config,
    "saslContinue" => users::sasl_continue,
    "logout" => users::logout,
    "createUser" => users::create_user,
    "updateUser" => users::update_user,
    "dropUser" => users::drop_user,
    "dropAllUsersFromDatabase" => users::drop_all_users_from_database,
    "usersInfo" => users::users_info,
    "grantRolesToUser" => users::grant_roles_to_user,
    "revokeRolesFromUser" => users::revoke_roles_from_user,
    "createRole" => roles::create_role,
    "updateRole" => roles::update_role,
    "dropRole" => roles::drop_role,
    "dropAllRolesFromDatabase" => roles::drop_all_roles_from_database,
    "grantRolesToRole" => roles::grant_roles_to_role,
    "revokeRolesFromRole" => roles::revoke_roles_from_role,
    "grantPrivilegesToRole" => roles::grant_privileges_to_role,
    "revokePrivilegesFromRole" => roles::revoke_privileges_from_role,
    "rolesInfo" => roles::roles_info,
}

/// Commands that never wait on a lock, a condition or an fsync: reads from a snapshot and
/// replies built from memory. They run on the async worker itself; everything else may block
/// (collection write lock, group commit) and leaves the worker first. The hop off the worker
/// costs a thread handoff per command, a sixth of the server's CPU on a point-read workload.
pub fn never_blocks(name: &str) -> bool {
    matches!(
        name,
        "find"
            | "getMore"
            | "count"
            | "distinct"
            | "aggregate"
            | "killCursors"
            | "hello"
            | "isMaster"
            | "ismaster"
            | "ping"
            | "buildInfo"
            | "buildinfo"
            | "listIndexes"
            | "listCollections"
            | "endSessions"
            | "replSetUpdatePosition"
            | "replSetGetAcknowledged"
    )
}

/// Where a command may run on a replica-set member that is not primary (mongod's
/// `AllowedOnSecondary`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnSecondary {
    Always,
    /// Reads: only when the client allows secondaries (`$readPreference` other than primary).
    OptIn,
    /// Writes.
    Never,
}

pub fn on_secondary(name: &str) -> OnSecondary {
    match name {
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "create" | "drop" | "dropDatabase" | "renameCollection" | "createIndexes"
        | "dropIndexes" | "deleteIndexes" | "applyOps" => OnSecondary::Never,
        // A migration's commands: its source and critical section belong to the primary.
        "_addShard"
        | "_shardsvrCleanupRange"
        | "_recvChunkApply"
        | "_shardsvrMigrateStart"
        | "_shardsvrMigrateClone"
        | "_shardsvrTransferMods"
        | "_shardsvrEnterCriticalSection"
        | "_shardsvrExitCriticalSection" => OnSecondary::Never,
        // Users and roles are data in admin.system.users and admin.system.roles: changed on
        // the primary only, like any write.
        "createUser"
        | "updateUser"
        | "dropUser"
        | "dropAllUsersFromDatabase"
        | "grantRolesToUser"
        | "revokeRolesFromUser"
        | "setAuditConfig"
        | "createRole"
        | "updateRole"
        | "dropRole"
        | "dropAllRolesFromDatabase"
        | "grantRolesToRole"
        | "revokeRolesFromRole"
        | "grantPrivilegesToRole"
        | "revokePrivilegesFromRole" => OnSecondary::Never,
        "find" | "count" | "distinct" | "aggregate" | "listCollections" | "listIndexes" | "collStats" | "dbStats" | "validate" | "explain" | "usersInfo"
        | "rolesInfo" => OnSecondary::OptIn,
        _ => OnSecondary::Always,
    }
}

/// Which opcounter / currentOp kind a command belongs to.
pub fn op_kind(name: &str) -> &'static str {
    match name {
        "insert" => "insert",
        "find" => "query",
        "getMore" => "getmore",
        "update" | "findAndModify" | "findandmodify" => "update",
        "delete" => "remove",
        _ => "command",
    }
}

use common::value::{as_i64, type_name};

fn wrong_type(cmd_name: &str, field: &str, v: &Bson, expected: &str) -> Error {
    Error::type_mismatch(format!("BSON field '{cmd_name}.{field}' is the wrong type '{}', expected type '{expected}'", type_name(v)))
}

impl Ctx<'_> {
    /// The collection named by the command's first field (must be a non-empty string).
    pub fn collection_name(&self) -> Result<&str> {
        match self.cmd.get(self.name) {
            Some(Bson::String(s)) if !s.is_empty() => Ok(s.as_str()),
            Some(Bson::String(_)) => Err(Error::new(Code::InvalidNamespace, format!("Invalid namespace specified '{}.'", self.db))),
            Some(v) => Err(Error::new(Code::InvalidNamespace, format!("collection name has invalid type {}", type_name(v)))),
            None => Err(Error::new(Code::InvalidNamespace, "missing collection name")),
        }
    }

    pub fn ns(&self, coll: &str) -> String {
        format!("{}.{}", self.db, coll)
    }

    pub fn doc_arg(&self, field: &str) -> Result<Option<&Document>> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d)),
            Some(v) => Err(wrong_type(self.name, field, v, "object")),
        }
    }

    pub fn bool_arg(&self, field: &str) -> Result<Option<bool>> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Boolean(b)) => Ok(Some(*b)),
            // IDL "safeBool": numbers are accepted, non-zero is true.
            Some(v @ (Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_))) => Ok(Some(as_i64(v) != Some(0))),
            Some(v) => Err(wrong_type(self.name, field, v, "bool")),
        }
    }

    /// A non-negative integer argument (numbers of any type that hold an integral value).
    pub fn int_arg(&self, field: &str) -> Result<Option<i64>> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(v @ (Bson::Int32(_) | Bson::Int64(_))) => Ok(as_i64(v)),
            Some(Bson::Double(d)) if d.fract() == 0.0 && d.is_finite() => Ok(Some(*d as i64)),
            Some(v @ Bson::Double(_)) => Err(Error::bad_value(format!("Field '{field}' must be an integer, got {v}"))),
            Some(v) => Err(wrong_type(self.name, field, v, "long")),
        }
    }

    pub fn str_arg(&self, field: &str) -> Result<Option<&str>> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(wrong_type(self.name, field, v, "string")),
        }
    }

    pub fn array_arg(&self, field: &str) -> Result<Option<&Vec<Bson>>> {
        match self.cmd.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Array(a)) => Ok(Some(a)),
            Some(v) => Err(wrong_type(self.name, field, v, "array")),
        }
    }

    pub fn lsid(&self) -> Option<Bson> {
        self.cmd.get("lsid").and_then(|l| match l {
            Bson::Document(d) => d.get("id").cloned(),
            _ => None,
        })
    }

    /// Make applied writes durable unless the write concern waives it (w:0 or j:false).
    pub fn commit_write(&self) -> Result<()> {
        let wc = self.write_concern.as_ref();
        let unack = wc.map(|w| w.is_unacknowledged()).unwrap_or(false);
        let j = wc.and_then(|w| w.j);
        if unack || j == Some(false) {
            return Ok(());
        }
        if let (true, Some(repl)) = (self.defer_durable, &self.shared.repl) {
            repl.request_journal_flush();
            return Ok(());
        }
        self.shared.store.commit_durable()
    }
}

/// `cursor_reply` for a batch a cursor produced: a raw batch goes beside the reply
/// (`ConnState::raw_batch`) and is written into its empty batch array when it is encoded.
pub fn cursor_batch_reply(ctx: &mut Ctx, ns: &str, id: i64, batch: crate::cursor::Batch, first: bool) -> Document {
    match batch {
        crate::cursor::Batch::Docs(docs) => cursor_reply(ns, id, docs, first),
        crate::cursor::Batch::Raw(docs) => {
            ctx.conn.raw_batch = Some(crate::conn::RawReplyBatch { key: batch_key(first), docs });
            cursor_reply(ns, id, Vec::new(), first)
        }
    }
}

fn batch_key(first: bool) -> &'static str {
    if first {
        "firstBatch"
    } else {
        "nextBatch"
    }
}

/// `{cursor: {firstBatch|nextBatch, id, ns}}`.
pub fn cursor_reply(ns: &str, id: i64, batch: Vec<Document>, first: bool) -> Document {
    let key = batch_key(first);
    let mut c = Document::new();
    c.insert(key, Bson::Array(batch.into_iter().map(Bson::Document).collect()));
    c.insert("id", id);
    c.insert("ns", ns);
    doc! { "cursor": c }
}
