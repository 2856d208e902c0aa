//! Command handlers, one module per family. Each handler takes the parsed request context and
//! returns the reply body without `ok` (dispatch adds `ok: 1`) or a MongoDB-style error.

mod admin;
pub(crate) mod aggregate;
mod crud;
pub(crate) use crud::{AWAIT_DATA_MS_DEFAULT, AWAIT_DATA_MS_MAX};
mod explain;
pub(crate) mod hello;
mod repl;
mod roles;
pub(crate) mod sharding;
mod transaction;
pub mod users;

use crate::conn::ConnState;
use crate::dispatch::WriteConcern;
use crate::ops::OpCtx;
use crate::state::Shared;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};

pub struct Ctx<'a> {
    pub shared: &'a Shared,
    /// The store handle the command writes through (`store()`); the server's, or one that
    /// notes what it creates for the audit log.
    pub store_handle: &'a storage::Store,
    pub conn: &'a mut ConnState,
    pub db: &'a str,
    pub name: &'a str,
    pub cmd: &'a Document,
    pub op: &'a OpCtx<'a>,
    pub write_concern: Option<WriteConcern>,
    /// Set for a retryable write (`retry`).
    pub retry: Option<RetryCtx<'a>>,
    /// The session's transaction state, for a statement of a transaction (`crate::txn`).
    pub txn: Option<&'a mut crate::txn::Session>,
    /// The reply waits (`conn::wait_for_replication`) until the write is durable here too:
    /// its fsync is left to the journal flusher (`ReplCoord::request_journal_flush`),
    /// shared by every write meanwhile, instead of a thread blocked in a group commit.
    pub defer_durable: bool,
    /// The deadline of an awaitData getMore run again after its wait (`conn::await_data_loop`).
    pub resumed: Option<std::time::Instant>,
    /// What the handler leaves beside its reply.
    pub out: &'a mut crate::dispatch::Effects,
}

/// A retryable write's context: what earlier attempts did, and the write itself: the store
/// handle its writes go through, on which the handler names the statement each belongs to.
pub struct RetryCtx<'a> {
    pub executed: &'a crate::retry::Executed,
    pub write: &'a storage::RetryableWrite,
}

impl Ctx<'_> {
    /// The store this command writes through: a retryable write's handle, whose entries
    /// carry its session, or the server's.
    pub fn store(&self) -> &storage::Store {
        match &self.retry {
            Some(r) => r.write.store(),
            None => self.store_handle,
        }
    }

    /// A retryable write's statement `stmt` is next: the entries it logs carry it. `None`
    /// if it already took effect in an earlier attempt (its entries, to rebuild its result).
    pub fn begin_statement(&self, stmt: i32) -> Option<&[Document]> {
        let r = self.retry.as_ref()?;
        r.write.set_statement(stmt);
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

/// Everything dispatch, the audit log, the counters and the worker pool need to know of a
/// command, in one row, so that no list elsewhere can disagree with it.
#[derive(Clone, Copy)]
pub struct Spec {
    pub handler: Handler,
    /// Never waits on a lock, a condition or an fsync (reads from a snapshot, replies built
    /// from memory): runs on the async worker itself. Everything else may block (collection
    /// write lock, group commit) and leaves the worker first; the hop costs a thread handoff
    /// per command, a sixth of the server's CPU on a point-read workload.
    pub never_blocks: bool,
    pub on_secondary: OnSecondary,
    /// The opcounter and currentOp kind.
    pub op_kind: &'static str,
    /// CRUD: audited under auditAuthorizationSuccess, as mongod audits them.
    pub crud: bool,
    /// Reads data at a point the read concern may name (afterClusterTime, afterOpTime,
    /// "strict"): waits for this member to reach it first.
    pub reads: bool,
    /// A retryable write: takes `txnNumber` with `lsid`, and a retry finds what the first
    /// attempt did (`retry`).
    pub retryable: bool,
    /// Run by members and routers only, as the internal user (its privilege is `internal`
    /// in `access::privileges::need`; the unit test below holds the two together).
    pub internal: bool,
}

const fn spec(handler: Handler) -> Spec {
    Spec { handler, never_blocks: false, on_secondary: OnSecondary::Always, op_kind: "command", crud: false, reads: false, retryable: false, internal: false }
}

impl Spec {
    const fn never_blocks(mut self) -> Spec {
        self.never_blocks = true;
        self
    }

    /// Writes, and the shard side of migrations: on the primary only.
    const fn primary_only(mut self) -> Spec {
        self.on_secondary = OnSecondary::Never;
        self
    }

    const fn read_on_secondary(mut self) -> Spec {
        self.on_secondary = OnSecondary::OptIn;
        self
    }

    const fn op_kind(mut self, kind: &'static str) -> Spec {
        self.op_kind = kind;
        self
    }

    const fn crud(mut self) -> Spec {
        self.crud = true;
        self
    }

    const fn reads(mut self) -> Spec {
        self.reads = true;
        self
    }

    const fn retryable(mut self) -> Spec {
        self.retryable = true;
        self
    }

    const fn internal(mut self) -> Spec {
        self.internal = true;
        self
    }
}

/// Defines `lookup` (name to row) and `NAMES` (every name, for listCommands) from one list.
macro_rules! command_table {
    ($($($name:literal)|+ => $spec:expr,)*) => {
        /// The command table. Names are case-sensitive as in MongoDB (isMaster has its
        /// lowercase alias).
        pub fn lookup(name: &str) -> Option<&'static Spec> {
            Some(match name {
                $($($name)|+ => {
                    const ROW: Spec = $spec;
                    &ROW
                })*
                _ => return None,
            })
        }

        /// Every command name `lookup` knows.
        pub const NAMES: &[&str] = &[$($($name,)+)*];
    };
}

command_table! {
    "hello" | "isMaster" | "ismaster" => spec(hello::hello).never_blocks(),
    "ping" => spec(hello::ping).never_blocks(),
    "buildInfo" | "buildinfo" => spec(hello::build_info).never_blocks(),
    "getParameter" => spec(hello::get_parameter),
    "getCmdLineOpts" => spec(hello::get_cmd_line_opts),
    "serverStatus" => spec(hello::server_status),
    "hostInfo" => spec(hello::host_info),
    "connectionStatus" => spec(hello::connection_status),
    "whatsmyuri" => spec(hello::whatsmyuri),
    "getLog" => spec(hello::get_log),
    "listCommands" => spec(hello::list_commands),
    "endSessions" => spec(hello::end_sessions).never_blocks(),
    "prepareTransaction" => spec(transaction::prepare).primary_only().internal(),
    "commitTransaction" => spec(transaction::commit).primary_only(),
    "abortTransaction" => spec(transaction::abort).primary_only(),
    "coordinateCommitTransaction" => spec(transaction::coordinate_commit).primary_only().internal(),
    "killAllSessions" => spec(hello::kill_all_sessions),
    "killSessions" => spec(hello::end_sessions),
    "refreshSessions" => spec(hello::refresh_sessions),
    "startSession" => spec(hello::start_session),
    "currentOp" => spec(hello::current_op),
    "killOp" => spec(hello::kill_op),
    "shutdown" => spec(hello::shutdown),
    "fsync" => spec(hello::fsync),
    "listDatabases" => spec(admin::list_databases),
    "listCollections" => spec(admin::list_collections).never_blocks().read_on_secondary(),
    "listIndexes" => spec(admin::list_indexes).never_blocks().read_on_secondary(),
    "create" => spec(admin::create).primary_only(),
    "drop" => spec(admin::drop).primary_only(),
    "dropDatabase" => spec(admin::drop_database).primary_only(),
    "renameCollection" => spec(admin::rename_collection).primary_only(),
    "collMod" => spec(admin::coll_mod).primary_only(),
    "collStats" => spec(admin::coll_stats).read_on_secondary(),
    "dbStats" => spec(admin::db_stats).read_on_secondary(),
    "validate" => spec(admin::validate).read_on_secondary(),
    "createIndexes" => spec(admin::create_indexes).primary_only(),
    "dropIndexes" | "deleteIndexes" => spec(admin::drop_indexes).primary_only(),
    "insert" => spec(crud::insert).primary_only().op_kind("insert").crud().retryable(),
    "find" => spec(crud::find).never_blocks().read_on_secondary().op_kind("query").crud().reads(),
    "getMore" => spec(crud::get_more).never_blocks().op_kind("getmore").crud(),
    "killCursors" => spec(crud::kill_cursors).never_blocks().crud(),
    "update" => spec(crud::update).primary_only().op_kind("update").crud().retryable(),
    "delete" => spec(crud::delete).primary_only().op_kind("remove").crud().retryable(),
    "findAndModify" | "findandmodify" => spec(crud::find_and_modify).primary_only().op_kind("update").crud().retryable(),
    "count" => spec(crud::count).never_blocks().read_on_secondary().crud().reads(),
    "distinct" => spec(crud::distinct).never_blocks().read_on_secondary().crud().reads(),
    "aggregate" => spec(aggregate::aggregate).never_blocks().read_on_secondary().crud().reads(),
    "explain" => spec(explain::explain).read_on_secondary(),
    "replSetInitiate" => spec(repl::repl_set_initiate),
    "replSetGetConfig" => spec(repl::repl_set_get_config),
    "replSetGetStatus" => spec(repl::repl_set_get_status),
    "applyOps" => spec(repl::apply_ops).primary_only(),
    "appendOplogNote" => spec(repl::append_oplog_note).primary_only(),
    "replSetHeartbeat" => spec(repl::repl_set_heartbeat).internal(),
    "_addShard" => spec(sharding::add_shard).primary_only().internal(),
    "_shardsvrCleanupRange" => spec(sharding::cleanup_range).primary_only().internal(),
    "_shardsvrMigrateStart" => spec(sharding::migrate_start).primary_only().internal(),
    "_shardsvrMigrateClone" => spec(sharding::migrate_clone).primary_only().internal(),
    "_shardsvrTransferMods" => spec(sharding::transfer_mods).primary_only().internal(),
    "_shardsvrEnterCriticalSection" => spec(sharding::enter_critical_section).primary_only().internal(),
    "_shardsvrExitCriticalSection" => spec(sharding::exit_critical_section).primary_only().internal(),
    "_recvChunkApply" => spec(sharding::recv_chunk_apply).primary_only().internal(),
    "replSetRequestVotes" => spec(repl::repl_set_request_votes).internal(),
    "replSetUpdatePosition" => spec(repl::repl_set_update_position).never_blocks().internal(),
    "replSetGetAcknowledged" => spec(repl::repl_set_get_acknowledged).never_blocks().internal(),
    "replSetGetRBID" => spec(repl::repl_set_get_rbid).internal(),
    "replSetStepDown" => spec(repl::repl_set_step_down),
    "replSetFreeze" => spec(repl::repl_set_freeze),
    "replSetReconfig" => spec(repl::repl_set_reconfig),
    "replSetSyncFrom" => spec(repl::repl_set_sync_from),
    "replSetStepUp" => spec(repl::repl_set_step_up),
    "configureFailPoint" => spec(repl::configure_fail_point),
    "waitForFailPoint" => spec(repl::wait_for_fail_point),
    "testVersion2" | "testVersion1AndVersion2" => spec(repl::test_api_command).never_blocks(),
    "saslStart" => spec(users::sasl_start),
    "authenticate" => spec(users::authenticate),
    "getAuditConfig" => spec(users::get_audit_config),
    "logRotate" => spec(users::log_rotate),
    "setAuditConfig" => spec(users::set_audit_config).primary_only(),
    "saslContinue" => spec(users::sasl_continue),
    "logout" => spec(users::logout),
    "createUser" => spec(users::create_user).primary_only(),
    "updateUser" => spec(users::update_user).primary_only(),
    "dropUser" => spec(users::drop_user).primary_only(),
    "dropAllUsersFromDatabase" => spec(users::drop_all_users_from_database).primary_only(),
    "usersInfo" => spec(users::users_info).read_on_secondary(),
    "grantRolesToUser" => spec(users::grant_roles_to_user).primary_only(),
    "revokeRolesFromUser" => spec(users::revoke_roles_from_user).primary_only(),
    "createRole" => spec(roles::create_role).primary_only(),
    "updateRole" => spec(roles::update_role).primary_only(),
    "dropRole" => spec(roles::drop_role).primary_only(),
    "dropAllRolesFromDatabase" => spec(roles::drop_all_roles_from_database).primary_only(),
    "grantRolesToRole" => spec(roles::grant_roles_to_role).primary_only(),
    "revokeRolesFromRole" => spec(roles::revoke_roles_from_role).primary_only(),
    "grantPrivilegesToRole" => spec(roles::grant_privileges_to_role).primary_only(),
    "revokePrivilegesFromRole" => spec(roles::revoke_privileges_from_role).primary_only(),
    "rolesInfo" => spec(roles::roles_info).read_on_secondary(),
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

/// `Spec::never_blocks` of a command; false for one the table lacks.
pub fn never_blocks(name: &str) -> bool {
    lookup(name).is_some_and(|s| s.never_blocks)
}

/// `Spec::on_secondary` of a command; `Always` for one the table lacks (it fails anyway).
pub fn on_secondary(name: &str) -> OnSecondary {
    lookup(name).map_or(OnSecondary::Always, |s| s.on_secondary)
}

/// `Spec::op_kind` of a command.
pub fn op_kind(name: &str) -> &'static str {
    lookup(name).map_or("command", |s| s.op_kind)
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

    /// The command's `let` variables (none when it has no `let`).
    pub fn let_vars(&self) -> Result<query::let_vars::LetVars> {
        match self.doc_arg("let")? {
            Some(spec) => query::let_vars::LetVars::parse(spec),
            None => Ok(Default::default()),
        }
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
        // A transaction's statement wrote nothing to the engine: its commit will.
        if self.store().write_ctx().in_transaction() {
            return Ok(());
        }
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
/// (`dispatch::Effects::raw_batch`) and is written into its empty batch array when it is encoded.
pub fn cursor_batch_reply(ctx: &mut Ctx, ns: &str, id: i64, batch: crate::cursor::Batch, first: bool) -> Document {
    match batch {
        crate::cursor::Batch::Docs(docs) => cursor_reply(ns, id, docs, first),
        crate::cursor::Batch::Raw(docs) => {
            ctx.out.raw_batch = Some(net::service::RawBatch { key: batch_key(first), docs });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commands_properties_come_from_its_one_row() {
        let find = lookup("find").unwrap();
        assert!(find.never_blocks && find.crud && find.reads);
        assert_eq!((find.on_secondary, find.op_kind), (OnSecondary::OptIn, "query"));
        let insert = lookup("insert").unwrap();
        assert!(!insert.never_blocks && insert.crud && !insert.reads);
        assert_eq!((insert.on_secondary, insert.op_kind), (OnSecondary::Never, "insert"));
        // Aliases are one row.
        assert!(std::ptr::eq(lookup("findAndModify").unwrap(), lookup("findandmodify").unwrap()));
        assert_eq!(op_kind("findandmodify"), "update");
        // A command the table lacks: the defaults, and no handler.
        assert!(lookup("noSuchCommand").is_none());
        assert!(!never_blocks("noSuchCommand"));
        assert_eq!((on_secondary("noSuchCommand"), op_kind("noSuchCommand")), (OnSecondary::Always, "command"));
        // Every name listCommands shows has a row.
        assert!(NAMES.iter().all(|n| lookup(n).is_some()));
        assert!(lookup("update").unwrap().retryable && !lookup("find").unwrap().retryable);
    }

    /// The privilege table (`access`, shared with the router) and this one agree: exactly
    /// the rows marked internal need the internal role, so no client command is closed by
    /// being forgotten there.
    #[test]
    fn exactly_the_internal_rows_need_the_internal_role() {
        for name in NAMES {
            let need = access::privileges::need(name, "admin", &Document::new());
            assert_eq!(access::privileges::needs_internal(&need), lookup(name).unwrap().internal, "{name}");
        }
    }
}
