//! Command dispatch: parse the generic command fields (`$db`, maxTimeMS, lsid, txnNumber,
//! readConcern, writeConcern), find the handler, and shape the reply or error as MongoDB does.

use crate::commands::{self, Ctx};
use crate::conn::ConnState;
use crate::state::{Counters, Shared};
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::Request;

/// What a write on a primary waits for before its reply: entries up to `at` on the members
/// that `mode` needs.
#[derive(Debug)]
pub struct ReplicationWait {
    pub at: storage::OpTime,
    pub mode: repl::progress::WMode,
    /// Durable on those members (j), not only applied.
    pub durable: bool,
    /// Durable on this member: every acknowledged write unless j:false. The write's handler
    /// leaves the fsync to the journal flusher, and this wait counts it.
    pub own_durable: bool,
    pub timeout: Option<Duration>,
    /// The write concern as sent, for writeConcernError.errInfo.
    pub write_concern: Document,
}

/// The wait a write needs on a set with other data-bearing members: w:"majority" when the
/// client says nothing (MongoDB's implicit default since 5.0); for w:1, only this member's
/// journal (none with j:false); none for w:0.
fn replication_wait(shared: &Shared, req: &Request, wc: Option<&WriteConcern>, unsatisfiable: bool) -> Option<ReplicationWait> {
    let repl = shared.repl.as_ref()?;
    if unsatisfiable || commands::on_secondary(&req.name) != commands::OnSecondary::Never || wc.is_some_and(|w| w.is_unacknowledged()) || !repl.replicates() {
        return None;
    }
    let mode = repl::progress::WMode::from_w(wc.and_then(|w| w.w.as_ref()))?;
    let own_durable = wc.and_then(|w| w.j) != Some(false);
    if !mode.needs_others() && !own_durable {
        return None;
    }
    // writeConcernMajorityJournalDefault: majority means durable on the majority.
    let durable = wc.and_then(|w| w.j).unwrap_or(mode == repl::progress::WMode::Majority);
    let timeout = wc.and_then(|w| w.wtimeout_ms).filter(|ms| *ms > 0).map(|ms| Duration::from_millis(ms as u64));
    let mut write_concern = req.body.get_document("writeConcern").cloned().unwrap_or_else(|_| doc! {"w": "majority", "wtimeout": 0});
    if !write_concern.contains_key("provenance") {
        write_concern.insert("provenance", if req.body.contains_key("writeConcern") { "clientSupplied" } else { "implicitDefault" });
    }
    Some(ReplicationWait { at: storage::OpTime::default(), mode, durable, own_durable, timeout, write_concern })
}

/// Parsed `writeConcern`. Standalone semantics: w:1 and "majority" both mean "applied and,
/// when j is true (the default), durable in the journal"; w:0 is acknowledged only by TCP.
#[derive(Clone, Debug)]
pub struct WriteConcern {
    pub w: Option<Bson>,
    pub j: Option<bool>,
    pub wtimeout_ms: Option<i64>,
}

impl WriteConcern {
    /// `replset`: a replica-set member, where w may name other members (checked after the
    /// write, as mongod reports an unsatisfiable concern in writeConcernError).
    pub fn parse(cmd: &Document, replset: bool) -> Result<Option<WriteConcern>> {
        let wc = match cmd.get("writeConcern") {
            None | Some(Bson::Null) => return Ok(None),
            Some(Bson::Document(d)) => d,
            Some(_) => return Err(Error::type_mismatch("BSON field 'writeConcern' is the wrong type, expected type 'object'")),
        };
        let mut out = WriteConcern { w: None, j: None, wtimeout_ms: None };
        for (k, v) in wc {
            match k.as_str() {
                "w" => match v {
                    Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => {
                        let n = common::value::as_i64(v).unwrap_or(-1);
                        if n < 0 {
                            return Err(Error::new(
                                Code::FailedToParse,
                                "w has to be a non-negative number and not greater than 50; found: ".to_string() + &n.to_string(),
                            ));
                        }
                        if n > 1 && !replset {
                            return Err(Error::bad_value("cannot use 'w' > 1 on a standalone"));
                        }
                        if n > repl::MEMBERS_MAX as i64 {
                            return Err(Error::new(Code::FailedToParse, format!("w has to be a non-negative number and not greater than 50; found: {n}")));
                        }
                        out.w = Some(v.clone());
                    }
                    Bson::String(s) if s == "majority" || replset => out.w = Some(v.clone()),
                    Bson::String(s) => {
                        return Err(Error::new(
                            Code(79, "UnknownReplWriteConcern"),
                            format!("No write concern mode named '{s}' found in replica set configuration"),
                        ))
                    }
                    Bson::Document(_) => return Err(Error::new(Code(79, "UnknownReplWriteConcern"), "tagged write concern requires a replica set")),
                    _ => return Err(Error::new(Code::FailedToParse, "w has to be a number, string, or object")),
                },
                "j" | "fsync" => match v {
                    Bson::Boolean(b) => out.j = Some(*b || out.j.unwrap_or(false)),
                    Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => out.j = Some(common::value::as_i64(v) != Some(0)),
                    _ => return Err(Error::new(Code::FailedToParse, format!("{k} must be a boolean"))),
                },
                "wtimeout" | "wtimeoutMS" => out.wtimeout_ms = common::value::as_i64(v),
                "provenance" | "getLastError" => {}
                other => return Err(Error::new(Code::FailedToParse, format!("unrecognized write concern field: {other}"))),
            }
        }
        Ok(Some(out))
    }

    pub fn is_unacknowledged(&self) -> bool {
        matches!(self.w, Some(Bson::Int32(0)) | Some(Bson::Int64(0))) || matches!(self.w, Some(Bson::Double(d)) if d == 0.0)
    }
}

/// Read concern levels that make a read wait on a replica set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadLevel {
    Majority,
    Linearizable,
    /// A read outside a transaction at one point in time: `atClusterTime`, or the majority
    /// commit point when it names none.
    Snapshot {
        at: Option<u64>,
    },
}

/// The commands that read at a point in time outside a transaction (mongod 5.0+).
const SNAPSHOT_READ_COMMANDS: [&str; 3] = ["find", "aggregate", "distinct"];

/// What a read waits for before its reply on a set with other data-bearing members.
///
/// majority: every entry the read could have seen (up to `at`, our newest entry once the
/// read ran) is majority-committed, so nothing returned can be rolled back. The read may
/// return newer data than mongod's majority snapshot would, never uncommitted data.
/// linearizable: as mongod, the primary writes a no-op after the read and waits until a
/// majority has it durable; if it is still primary in the same term then, no other primary
/// can have taken a write the read missed.
#[derive(Debug)]
pub struct ReadWait {
    pub at: storage::OpTime,
    pub linearizable: bool,
    pub deadline: Option<Instant>,
}

/// What a read on a replica-set member waits for before it runs: that this member has
/// applied through timestamp `ts` (readConcern afterClusterTime or afterOpTime: a causally
/// consistent session's earlier operations), and, when `strict`, through every write the
/// primary had acknowledged when the read arrived (`repl::strict`).
#[derive(Debug)]
pub struct ReadAfter {
    pub ts: u64,
    pub strict: bool,
    pub deadline: Option<Instant>,
}

/// The wait before `req` runs, if it needs one (checked again, with errors, when it runs).
pub fn read_after(shared: &Shared, req: &Request) -> Result<Option<ReadAfter>> {
    let Some(repl) = &shared.repl else { return Ok(None) };
    // The reads of data that take a read concern (a getMore reads at its cursor's).
    if !commands::lookup(&req.name).is_some_and(|s| s.reads) {
        return Ok(None);
    }
    let rc = match req.body.get("readConcern") {
        Some(Bson::Document(d)) => Some(d),
        _ => None,
    };
    let level = rc.and_then(|d| d.get_str("level").ok());
    let primary = repl.is_writable_primary();
    // --strictConsistency makes strict the default level; a read that names "local" or
    // "available" gets what it names.
    let strict = !primary && (level == Some("strict") || (shared.config.strict_consistency && matches!(level, None | Some("majority"))));
    // A time beyond this member's cluster time is refused, as mongod refuses it.
    let within_clock = |field: &str| -> Result<Option<u64>> {
        let Some(Bson::Timestamp(t)) = rc.and_then(|d| d.get(field)) else { return Ok(None) };
        let t = common::optime::ts_value(*t);
        let clock = repl.cluster_time(&shared.store);
        if t > clock {
            return Err(Error::new(
                Code::InvalidOptions,
                format!("readConcern {field} value must not be greater than the current clusterTime. Requested clusterTime: {t}; current clusterTime: {clock}"),
            ));
        }
        Ok(Some(t))
    };
    let mut ts = within_clock("afterClusterTime")?.unwrap_or(0);
    if let Some(at) = rc.and_then(|d| d.get_document("afterOpTime").ok()).and_then(storage::OpTime::from_doc) {
        ts = ts.max(at.ts);
    }
    // A read at a point in time waits until this member has applied it; a primary has applied
    // every entry there will be at or before it (`snapshot_read`).
    if let Some(t) = within_clock("atClusterTime")? {
        if !primary {
            ts = ts.max(t);
        }
    }
    if !strict && (ts == 0 || ts <= shared.store.oplog_applied().unwrap_or_default().ts) {
        return Ok(None);
    }
    let deadline = parse_max_time(&req.body)?.map(|d| Instant::now() + d);
    Ok(Some(ReadAfter { ts, strict, deadline }))
}

/// A read at one point in time outside a transaction: the point, the oplog entry at or
/// before it, and a store handle that reads there.
struct SnapshotRead {
    ts: u64,
    entry: storage::OpTime,
    store: storage::Store,
}

/// Choose a snapshot read's point and open the store there: `at` (which `read_after` waited
/// for this member to apply), or the newest applied point. A capped
/// collection, or a namespace dropped or renamed since, cannot be read at a past point
/// (SnapshotUnavailable, as mongod).
fn snapshot_read(shared: &Shared, store: &storage::Store, req: &Request, at: Option<u64>) -> Result<SnapshotRead> {
    let Some(repl) = &shared.repl else {
        return Err(Error::new(Code::NotAReplicaSet, "node needs to be a replica set member to use readConcern level 'snapshot'"));
    };
    let (ts, view, entry) = match at.map(|t| (t, snapshot_view(shared, repl, t))) {
        Some((t, view)) => {
            let (view, entry) = view?;
            (t, view, entry)
        }
        // The newest applied point, whose majority commit the reply waits for (as a majority
        // read's); on a secondary mid-batch, the newest kept point the majority has committed.
        // (May wait for a prepared transaction's decision: off the worker thread.)
        None => match tokio::task::block_in_place(|| shared.store.snapshot_now())? {
            Some((view, entry)) => (entry.ts, view, entry),
            None => {
                let point = repl.commit_point(&shared.store).ts.min(shared.store.oplog_applied().unwrap_or_default().ts);
                let t = shared.store.snapshot_boundary_at_or_before(point).ok_or_else(|| {
                    Error::new(Code::SnapshotUnavailable, "no majority-committed point is readable at a snapshot yet; please retry the operation")
                })?;
                let (view, entry) = snapshot_view(shared, repl, t)?;
                (t, view, entry)
            }
        },
    };
    let store = store.reading_at(view);
    if let Ok(coll) = req.body.get_str(&req.name) {
        store.check_catalog_at_view(&req.db, coll)?;
        if store.collection(&req.db, coll).is_some_and(|c| c.is_capped()) {
            return Err(Error::new(
                Code::SnapshotUnavailable,
                format!("Reading from capped collections with readConcern snapshot is not supported: {}.{coll}", req.db),
            ));
        }
    }
    Ok(SnapshotRead { ts, entry, store })
}

/// The engine view at cluster time `ts` and the oplog entry at or before it: from history,
/// or, for a point after every entry on a primary, its state now (nothing later is stamped
/// at or before it).
pub(crate) fn snapshot_view(shared: &Shared, repl: &replication::ReplCoord, ts: u64) -> Result<(Arc<dyn storage::EngineSnapshot>, storage::OpTime)> {
    let applied = shared.store.oplog_applied().unwrap_or_default().ts;
    // Either may wait for a prepared transaction's decision: off the worker thread.
    match ts > applied {
        true if repl.is_writable_primary() => tokio::task::block_in_place(|| shared.store.snapshot_now_at(ts)),
        true => Err(Error::new(Code::SnapshotUnavailable, "this member has not applied the point the read asks for yet; please retry")),
        false => tokio::task::block_in_place(|| shared.store.snapshot_at(ts)),
    }
}

/// `repl`: set with --replSet; asked only about linearizable reads.
/// `in_txn`: the first statement of a transaction, which reads one snapshot whatever the
/// level (it waits for nothing: the commit's write concern covers what it read).
fn check_read_concern(name: &str, cmd: &Document, repl: Option<&replication::ReplCoord>, in_txn: bool) -> Result<Option<ReadLevel>> {
    let mut level = None;
    let mut at_cluster_time = None;
    let rc = match cmd.get("readConcern") {
        None | Some(Bson::Null) => return Ok(None),
        Some(Bson::Document(d)) => d,
        Some(_) => return Err(Error::type_mismatch("BSON field 'readConcern' is the wrong type, expected type 'object'")),
    };
    for (k, v) in rc {
        match k.as_str() {
            "level" => match v.as_str() {
                // "strict" is shoal's: a local read that, on a secondary, first waits until
                // it has applied what the primary had when the read arrived (`read_after`).
                Some("local" | "available" | "strict") => {}
                // A standalone's applied writes are its committed writes; a set's wait for
                // the commit point (ReadWait).
                Some("majority") => level = Some(ReadLevel::Majority),
                Some("linearizable") if repl.is_some_and(|r| r.is_writable_primary()) => level = Some(ReadLevel::Linearizable),
                Some("linearizable") if repl.is_some() => {
                    return Err(Error::new(Code::NotWritablePrimary, "cannot satisfy linearizable read concern on non-primary node"))
                }
                Some("linearizable") => return Err(Error::bad_value("Cannot use linearizable readConcern on a standalone; it requires a replica set")),
                Some("snapshot") if in_txn => {}
                Some("snapshot") if repl.is_none() => {
                    return Err(Error::new(Code::NotAReplicaSet, "node needs to be a replica set member to use readConcern level 'snapshot'"))
                }
                Some("snapshot") if !SNAPSHOT_READ_COMMANDS.contains(&name) => {
                    return Err(Error::new(Code::InvalidOptions, format!("Command {name} does not support readConcern level 'snapshot' outside a transaction")))
                }
                Some("snapshot") => level = Some(ReadLevel::Snapshot { at: None }),
                Some(other) => return Err(Error::bad_value(format!("Invalid readConcern level '{other}'"))),
                None => return Err(Error::type_mismatch("readConcern.level must be a string")),
            },
            "afterClusterTime" if repl.is_none() => {
                return Err(Error::new(Code::InvalidOptions, "Cannot specify afterClusterTime readConcern without replication enabled"));
            }
            "afterClusterTime" if !matches!(v, Bson::Timestamp(_)) => {
                return Err(Error::type_mismatch("BSON field 'readConcern.afterClusterTime' is the wrong type, expected type 'timestamp'"));
            }
            "afterOpTime" if repl.is_none() => return Err(Error::new(Code::NoReplicationEnabled, "node needs to be a replica set member to use read concern")),
            "afterOpTime" if !matches!(v, Bson::Document(d) if storage::OpTime::from_doc(d).is_some()) => {
                return Err(Error::type_mismatch("BSON field 'readConcern.afterOpTime' is the wrong type, expected type 'object' with ts and t"));
            }
            "atClusterTime" => match v {
                Bson::Timestamp(t) if t.time == 0 && t.increment == 0 => {
                    return Err(Error::new(Code::InvalidOptions, "readConcern atClusterTime cannot be a null timestamp"))
                }
                Bson::Timestamp(t) => at_cluster_time = Some(common::optime::ts_value(*t)),
                _ => return Err(Error::type_mismatch("BSON field 'readConcern.atClusterTime' is the wrong type, expected type 'timestamp'")),
            },
            "afterClusterTime" | "afterOpTime" => {}
            "provenance" => {}
            other => return Err(Error::new(Code::FailedToParse, format!("unrecognized readConcern field: {other}"))),
        }
    }
    if let Some(t) = at_cluster_time {
        if rc.contains_key("afterClusterTime") {
            return Err(Error::new(Code::InvalidOptions, "Specifying a timestamp for readConcern snapshot in a causally consistent session is not allowed"));
        }
        match level {
            Some(ReadLevel::Snapshot { .. }) => level = Some(ReadLevel::Snapshot { at: Some(t) }),
            // A transaction's first statement reads there (`txn::TransactionTable`).
            None if in_txn && rc.get_str("level").ok() == Some("snapshot") => {}
            _ => return Err(Error::new(Code::InvalidOptions, "readConcern level 'snapshot' is required when specifying atClusterTime")),
        }
    }
    Ok(level.filter(|_| !in_txn))
}

/// The wait for a read's `level` (None where nothing needs waiting: a standalone, a set with
/// one data-bearing member, or a write command).
fn read_wait(shared: &Shared, req: &Request, level: Option<ReadLevel>, deadline: Option<Instant>) -> Result<Option<ReadWait>> {
    let Some(repl) = shared.repl.as_ref().filter(|r| r.replicates()) else { return Ok(None) };
    let Some(level) = level else { return Ok(None) };
    if commands::on_secondary(&req.name) == commands::OnSecondary::Never {
        return Ok(None);
    }
    let at = match level {
        // The read's point must be majority-committed (snapshot_read chose it: `snapshot_at`).
        ReadLevel::Snapshot { .. } => return Ok(None),
        ReadLevel::Majority => shared.store.oplog_last().unwrap_or_default(),
        ReadLevel::Linearizable => {
            if !repl.is_writable_primary() {
                return Err(Error::new(Code::PrimarySteppedDown, "stepped down while serving a linearizable read"));
            }
            shared.store.append_oplog_noop(&doc! {"msg": "linearizable read"})?
        }
    };
    Ok(Some(ReadWait { at, linearizable: level == ReadLevel::Linearizable, deadline }))
}

/// mongod's NotPrimaryError category: errors that tell a driver the member's role changed.
/// (A ShutdownError carries a topologyVersion only in mongod's quiesce mode, which shoal's
/// shutdown has not: without one, a driver marks the server unknown at once.)
fn is_not_primary_error(code: i32) -> bool {
    matches!(code, 10107 | 13435 | 13436 | 11602 | 189 | 10058)
}

/// A not-primary error carries the member's topologyVersion, as mongod appends it to every
/// such reply. A driver compares it with what its monitor has seen: if it is not newer, the
/// error is not news and the server stays selectable. Without it the driver marks the server
/// unknown and, with a streaming monitor in an awaitable hello, waits up to maxAwaitTimeMS
/// (10 s) before it sends anything more.
pub fn with_topology_version(shared: &Shared, e: Error) -> Error {
    if shared.repl.is_none() || !is_not_primary_error(e.code) || e.extra.as_ref().is_some_and(|x| x.contains_key("topologyVersion")) {
        return e;
    }
    let mut extra = e.extra.as_deref().cloned().unwrap_or_default();
    extra.insert("topologyVersion", shared.topology_version());
    e.with_extra(extra)
}

/// A member that is not primary takes no writes, and reads only from clients that allow
/// secondaries. The `local` database is every member's own and always open.
fn check_member_state(repl: &replication::ReplCoord, req: &Request) -> Result<()> {
    if req.db == "local" || repl.is_writable_primary() {
        return Ok(());
    }
    let error = match commands::on_secondary(&req.name) {
        commands::OnSecondary::Always => return Ok(()),
        commands::OnSecondary::Never => Error::new(Code::NotWritablePrimary, "not primary"),
        commands::OnSecondary::OptIn => {
            let mode = req.body.get_document("$readPreference").ok().and_then(|p| p.get_str("mode").ok());
            match mode {
                // A member in ROLLBACK or RECOVERING may hold documents newer than its oplog.
                Some(m) if m != "primary" && !repl.serves_secondary_reads() => {
                    Error::new(Code::NotPrimaryOrSecondary, "node is not in primary or recovering state")
                }
                Some(m) if m != "primary" => return Ok(()),
                _ => Error::new(Code::NotPrimaryNoSecondaryOk, "not primary and secondaryOk=false"),
            }
        }
    };
    Err(error)
}

fn parse_max_time(cmd: &Document) -> Result<Option<Duration>> {
    match cmd.get("maxTimeMS") {
        None | Some(Bson::Null) => Ok(None),
        Some(v) => {
            let ms = match v {
                Bson::Int32(_) | Bson::Int64(_) => common::value::as_i64(v),
                Bson::Double(d) if d.fract() == 0.0 => Some(*d as i64),
                _ => None,
            };
            match ms {
                Some(ms) if (0..=i32::MAX as i64).contains(&ms) => Ok(if ms == 0 { None } else { Some(Duration::from_millis(ms as u64)) }),
                Some(_) => Err(Error::bad_value(format!("{} value for maxTimeMS is out of range [0, 2147483647]", v))),
                None => Err(Error::bad_value("maxTimeMS must be a non-negative integer")),
            }
        }
    }
}

/// What running a command produced: its reply, and what the connection must do before
/// the reply goes out (`conn::execute` waits).
#[derive(Default)]
pub struct Outcome {
    pub reply: Document,
    /// The reply's cursor batch as stored records (`commands::cursor_batch_reply`).
    pub raw_batch: Option<net::service::RawBatch<storage::RawRecord>>,
    /// A write on a primary waits for other members before its reply.
    pub replication_wait: Option<ReplicationWait>,
    /// A majority or linearizable read waits for the commit point.
    pub read_wait: Option<ReadWait>,
    /// An awaitData getMore found nothing new: it waits for a write after `seen`, until
    /// `deadline`, then runs again.
    pub await_data: Option<AwaitData>,
    /// Drop the connection instead of replying (a test's fail point).
    pub close_connection: bool,
}

impl Outcome {
    fn reply(reply: Document) -> Outcome {
        Outcome { reply, ..Default::default() }
    }
}

/// What a handler leaves beside its reply (`Outcome`'s raw batch and awaitData wait).
#[derive(Default)]
pub struct Effects {
    pub raw_batch: Option<net::service::RawBatch<storage::RawRecord>>,
    pub await_data: Option<AwaitData>,
}

#[derive(Clone, Copy, Debug)]
pub struct AwaitData {
    pub seen: u64,
    pub deadline: Instant,
    /// A change stream waits for the commit point to move from here, too: what it reads
    /// is majority-committed.
    pub commit_point: Option<storage::OpTime>,
}

/// Run one command and produce its outcome (always a reply, never a panic). `resumed`: the
/// deadline of an awaitData getMore run again after its wait, so that the wait does not
/// start over.
pub fn run_command(shared: &Shared, conn: &mut ConnState, req: Request, resumed: Option<Instant>) -> Outcome {
    let Some(spec) = commands::lookup(&req.name) else {
        Counters::add(&shared.counters.command, 1);
        return Outcome::reply(Error::new(Code::CommandNotFound, format!("no such command: '{}'", req.name)).to_reply());
    };
    if spec.op_kind == "command" {
        Counters::add(&shared.counters.command, 1);
    }
    if let Err(e) = common::api::check(&req.name, &req.body) {
        return Outcome::reply(e.to_reply());
    }
    let checked = crate::auth::check(shared, conn, &req.db, &req.name, &req.body);
    if shared.audit.is_some() {
        crate::audit::auth_check(shared, conn, &req.name, &req.body, checked.as_ref().err().map(|e| e.code));
    }
    if let Err(e) = checked {
        return Outcome::reply(with_topology_version(shared, e).to_reply());
    }
    if let Err(e) = shared.sessions.touch_request(&req.body, &conn.auth) {
        return Outcome::reply(e.to_reply());
    }
    // With auditing on, the command writes through a handle that notes what it creates.
    let collecting = shared.audit.is_some().then(|| shared.store.collecting_creations());
    let store = collecting.as_ref().unwrap_or(&shared.store);
    let mut outcome = Outcome::default();
    let result = prepare_and_run(shared, conn, &req, spec, store, resumed, &mut outcome);
    if let Some(c) = &collecting {
        // What the command created is recorded even if it then failed (an insert into a new
        // collection whose document was refused leaves the collection).
        crate::audit::creations_done(shared, conn, c.take_created());
    }
    match result {
        Ok(mut reply) => {
            if shared.audit.is_some() {
                crate::audit::command_done(shared, conn, &req.db, &req.name, &req.body);
            }
            reply.insert("ok", 1.0);
            outcome.reply = reply;
            outcome
        }
        // A failed command waits for nothing, and its reply has no batch; but the end of a
        // transaction that found none logs a no-op and waits for its write concern on it:
        // a coordinator that takes the answer as final (an abort delivered) knows this
        // primary's term is then majority-committed, so no member that may hold a prepare of
        // it unreplicated can be elected later; and a primary deposed without knowing it
        // cannot answer so for a transaction its successor committed (its newest entry may
        // be majority-committed from before, a no-op of its term never is).
        Err(e) => {
            let no_such_transaction = e.code == Code::NoSuchTransaction.0 && crate::txn::is_end(&req.name);
            let mut out = Outcome { close_connection: outcome.close_connection, ..Outcome::reply(with_topology_version(shared, e).to_reply()) };
            if no_such_transaction {
                if let Ok(wc) = WriteConcern::parse(&req.body, shared.repl.is_some()) {
                    out.replication_wait = replication_wait(shared, &req, wc.as_ref(), false).map(|mut w| {
                        w.at = match shared.store.log_noop("end of a transaction that found none") {
                            Ok(at) => at,
                            Err(e) => {
                                tracing::warn!("the no-op of a transaction's end failed: {}", e.message);
                                shared.store.oplog_last().unwrap_or_default()
                            }
                        };
                        w
                    });
                }
            }
            out
        }
    }
}

/// A retryable write's handler `run`, under a test's `onPrimaryTransactionalWrite`, which acts
/// only on an attempt that writes (a retry of what took effect answers from the record): it
/// fails the write before it is made (`failBeforeCommitExceptionCode`), or drops the
/// connection after (`closeConnection`, the default), setting `close`.
fn on_primary_transactional_write(
    executed: &crate::retry::Executed,
    guard: &storage::RetryableWrite,
    close: &mut bool,
    run: impl FnOnce() -> Result<Document>,
) -> Result<Document> {
    let point = &crate::fault::ON_PRIMARY_TRANSACTIONAL_WRITE;
    if !point.is_active() {
        return run();
    }
    let fail_before = |d: &Document| d.contains_key("failBeforeCommitExceptionCode");
    if let Some(data) = executed.is_empty().then(|| point.fires(fail_before)).flatten() {
        *close = data.get_bool("closeConnection").unwrap_or(true);
        let code = data.get("failBeforeCommitExceptionCode").and_then(common::value::as_i64).unwrap_or(Code::InternalError.0 as i64);
        return Err(Error::from_number(code as i32, "Failing write due to failpoint. The write must not be reflected."));
    }
    let before = guard.last_write();
    let result = run();
    if guard.last_write() != before {
        if let Some(data) = point.fires(|d| !fail_before(d)) {
            *close = data.get_bool("closeConnection").unwrap_or(true);
        }
    }
    result
}

fn prepare_and_run(
    shared: &Shared,
    conn: &mut ConnState,
    req: &Request,
    spec: &commands::Spec,
    store: &storage::Store,
    resumed: Option<Instant>,
    outcome: &mut Outcome,
) -> Result<Document> {
    let cmd = &req.body;
    // A statement of a multi-document transaction (`crate::txn`).
    let in_txn = cmd.contains_key("autocommit") || cmd.contains_key("startTransaction");
    let txn_number = match cmd.get("txnNumber") {
        _ if shared.repl.is_none() && (cmd.contains_key("txnNumber") || in_txn) => {
            return Err(Error::new(Code::IllegalOperation, "Transaction numbers are only allowed on a replica set member or mongos"));
        }
        None if in_txn => return Err(Error::new(Code::InvalidOptions, "'autocommit' field requires a transaction number to also be specified")),
        None => None,
        Some(Bson::Int64(n)) => Some(*n),
        Some(_) => return Err(Error::type_mismatch("BSON field 'txnNumber' is the wrong type, expected type 'long'")),
    };
    let lsid = match (txn_number, cmd.get_document("lsid").ok().and_then(|l| l.get("id"))) {
        (None, _) => None,
        (Some(_), Some(Bson::Binary(b))) => Some(b.bytes.clone()),
        (Some(_), _) => return Err(Error::new(Code::InvalidOptions, "Transaction number requires a session ID to also be specified")),
    };
    let retry_key = match txn_number {
        None => None,
        Some(_) if in_txn => None,
        Some(_) if !spec.retryable => {
            return Err(Error::location(
                50768,
                format!("txnNumber may only be provided for multi-document transactions and retryable write commands. autocommit:false was not provided, and {} is not a retryable write command.", req.name),
            ));
        }
        Some(_) => lsid.clone(),
    };
    // A member that is not primary refuses before a transaction begins or continues here.
    if let Some(repl) = &shared.repl {
        check_member_state(repl, req)?;
    }
    // The session's transaction state is held for the whole statement: one statement at a
    // time per session, as mongod checks a session out.
    let txn_session = match (in_txn, &lsid) {
        (true, Some(lsid)) => Some(shared.txns.session(lsid)?),
        _ => None,
    };
    // A statement may run on the worker (`txn::runs_inline`): one that must wait for the
    // session's statement in progress (which may itself wait, for a prepared transaction's
    // decision) waits off it, so the worker goes on serving others.
    let mut txn_guard = txn_session.as_ref().map(|s| s.try_lock().unwrap_or_else(|| tokio::task::block_in_place(|| s.lock())));
    let txn_store = match (txn_guard.as_deref_mut(), &lsid, txn_number) {
        (Some(s), Some(lsid), Some(n)) => Some(shared.txns.begin_or_continue(shared, s, req, lsid, n)?),
        _ => None,
    };
    let ends_txn = in_txn && crate::txn::is_end(&req.name);
    let store = txn_store.as_ref().unwrap_or(store);
    let mut read_level = check_read_concern(&req.name, cmd, shared.repl.as_ref(), in_txn)?;
    let snapshot_read = match read_level {
        Some(ReadLevel::Snapshot { at }) => Some(snapshot_read(shared, store, req, at)?),
        _ => None,
    };
    let store = snapshot_read.as_ref().map_or(store, |s| &s.store);
    // A getMore carries no readConcern: its cursor remembers the find's (checked before the
    // getMore runs, which may exhaust and remove the cursor).
    if req.name == "getMore" && req.body.get_i64("getMore").is_ok_and(|id| shared.cursors.is_majority_read(id)) {
        read_level = Some(ReadLevel::Majority);
    }
    let write_concern = WriteConcern::parse(cmd, shared.repl.is_some())?;
    let wc_unsatisfiable = match (&shared.repl, &write_concern) {
        (Some(repl), Some(wc)) if commands::on_secondary(&req.name) == commands::OnSecondary::Never && !wc.is_unacknowledged() => {
            wc.w.as_ref().and_then(|w| repl.unsatisfiable(w))
        }
        _ => None,
    };
    let max_time = parse_max_time(cmd)?;
    if let Some(e) = max_time.filter(|_| req.name != "getMore").and_then(|_| net::fail_point::max_time_expires()) {
        return Err(e);
    }
    // A getMore's maxTimeMS is an awaitData cursor's wait, not a deadline (commands::crud).
    let deadline = max_time.filter(|_| req.name != "getMore").map(|d| Instant::now() + d);
    let ns = req.namespace();
    // currentOp shows the command, but never a password or SCRAM message.
    let shown = if crate::auth::has_secrets(&req.name, &req.body) { Arc::new(crate::auth::redacted(&req.body)) } else { req.body.clone() };
    let op = shared.ops.begin(conn.id, conn.remote, conn.app_name.clone(), commands::op_kind(&req.name), ns, shown, deadline);
    // A transaction's statements write nothing yet: only its end waits for the write concern.
    let wait = replication_wait(shared, req, write_concern.as_ref(), wc_unsatisfiable.is_some()).filter(|_| !in_txn || ends_txn);
    let defer_durable = wait.as_ref().is_some_and(|w| w.own_durable);
    let mut effects = Effects::default();
    let mut reply = {
        let out = &mut effects;
        let handler = |retry: Option<commands::RetryCtx>| {
            (spec.handler)(&mut Ctx {
                shared,
                store_handle: store,
                conn: &mut *conn,
                db: &req.db,
                name: &req.name,
                cmd,
                op: &op,
                write_concern,
                retry,
                txn: txn_guard.as_deref_mut(),
                defer_durable,
                resumed,
                out,
            })
        };
        let result = match (retry_key, txn_number) {
            (Some(lsid), Some(txn)) => {
                let close = &mut outcome.close_connection;
                shared.retry.run(store, shared.repl.as_ref().map_or(0, |r| r.term()), &lsid, txn, |executed, guard| {
                    on_primary_transactional_write(executed, guard, close, || handler(Some(commands::RetryCtx { executed, write: guard })))
                })
            }
            _ => handler(None),
        };
        match txn_guard.as_deref_mut() {
            Some(s) if !ends_txn => {
                // In a transaction a write error fails the command (and so the transaction).
                let result = result.and_then(crate::txn::write_error_fails);
                shared.txns.after_statement(s, result.is_err());
                result?
            }
            _ => result?,
        }
    };
    outcome.raw_batch = effects.raw_batch;
    outcome.await_data = effects.await_data;
    if let Some(s) = &snapshot_read {
        // The point read is answered (in the cursor for find and aggregate), and the reply
        // waits until the entry it reads through is majority-committed.
        let at = Bson::Timestamp(common::optime::ts_of(s.ts));
        match reply.get_mut("cursor") {
            Some(Bson::Document(c)) => {
                c.insert("atClusterTime", at);
            }
            _ => {
                reply.insert("atClusterTime", at);
            }
        }
        if shared.repl.as_ref().is_some_and(|r| r.replicates()) {
            outcome.read_wait = Some(ReadWait { at: s.entry, linearizable: false, deadline });
        }
    }
    if let Some(w) = read_wait(shared, req, read_level, deadline)? {
        if read_level == Some(ReadLevel::Majority) && req.name != "getMore" {
            if let Some(id) = reply.get_document("cursor").ok().and_then(|c| c.get_i64("id").ok()).filter(|id| *id != 0) {
                shared.cursors.mark_majority_read(id);
            }
        }
        outcome.read_wait = Some(w);
    }
    if let Some(repl) = shared.repl.as_ref().filter(|_| commands::on_secondary(&req.name) == commands::OnSecondary::Never) {
        // A write acknowledged without waiting for its own sync (j:false, w:0) counts for
        // strict reads now; one that waits counts when its wait ends (`conn::run`).
        if !wait.as_ref().is_some_and(|w| w.own_durable) {
            repl.note_acknowledged(shared.store.oplog_last().unwrap_or_default());
        }
    }
    if let Some(mut wait) = wait {
        // The write is applied here; the connection waits (off the worker thread) for the
        // other members before it replies. The newest entry covers this command's entries.
        // (Had the member stepped down meanwhile, the wait reports PrimarySteppedDown.)
        wait.at = shared.store.oplog_last().unwrap_or_default();
        outcome.replication_wait = Some(wait);
    }
    if let (Some(repl), true) = (&shared.repl, cmd.contains_key("$replData")) {
        reply.insert("$replData", repl.repl_data(&shared.store));
    }
    if let Some(e) = wc_unsatisfiable {
        // The write is applied and durable here; what cannot be had is the acknowledgement
        // of other members, which mongod reports beside the result.
        let wc = cmd.get_document("writeConcern").cloned().unwrap_or_default();
        reply.insert("writeConcernError", doc! {"code": e.code, "codeName": e.code_name, "errmsg": e.message, "errInfo": {"writeConcern": wc}});
    }
    Ok(reply)
}
