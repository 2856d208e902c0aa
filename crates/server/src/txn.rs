//! Multi-document transactions on a replica-set member, as mongod 7.0 runs them: each
//! session's transaction number and state (in progress, committed, aborted), the checks
//! every statement passes (`begin_or_continue`), the commands a transaction may run, the
//! abort of a transaction whose statement failed, commit and abort, and the end of
//! transactions that outlive `transactionLifetimeLimitSeconds` or their primary's term.
//! The data side (snapshot, own writes, conflicts, the atomic commit) is
//! `storage::Transaction`.

use crate::state::Shared;
use bson::{Bson, Document};
use common::{Code, Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use storage::OpTime;

/// Sessions whose transaction state is kept (mongod's logical session cache bound).
pub const SESSIONS_MAX: usize = 1_000_000;
/// How often open transactions are checked for their lifetime and their primary's term.
pub const REAP_INTERVAL: Duration = Duration::from_millis(250);

/// The commands that end a transaction, or prepare it for its end (run on `admin`, with
/// the transaction's write concern).
pub fn is_end(name: &str) -> bool {
    matches!(name, "prepareTransaction" | "commitTransaction" | "abortTransaction" | "coordinateCommitTransaction")
}

/// A statement of a transaction before its end waits for no fsync, no replication and no
/// other writer to finish (a key another transaction owns is a WriteConflict at once; the
/// locks it takes are held only while a batch is prepared or applied): it runs on the
/// connection's worker, as reads do, without the hand-off of a thread that may block. So
/// does a participant's end on a member that leaves its sync to the journal flusher
/// (`replicates`): it applies one batch and waits, off the worker, for its write concern.
/// The coordinator's commit talks to other shards and keeps to a thread of its own.
pub fn runs_inline(req: &wire::Request, replicates: impl FnOnce() -> bool) -> bool {
    req.body.contains_key("autocommit") && (!is_end(&req.name) || (req.name != "coordinateCommitTransaction" && replicates()))
}

/// Every session's transaction state.
pub struct TransactionTable {
    sessions: Mutex<HashMap<Vec<u8>, Arc<Mutex<Session>>>>,
    /// Transactions in progress (so the reaper looks only when there are some).
    open: AtomicUsize,
    /// serverStatus's `transactions` counters.
    started: AtomicU64,
    committed: AtomicU64,
    aborted: AtomicU64,
    lifetime: Duration,
}

/// One session's transaction state.
pub struct Session {
    lsid: Vec<u8>,
    /// The newest transaction number the session started (-1: none).
    txn_number: i64,
    state: State,
}

enum State {
    None,
    InProgress(Open),
    /// Prepared for a two-phase commit: the transaction is in the store's table of
    /// prepared ones (`storage::Store::prepare_transaction`), where a member that becomes
    /// primary finds it too.
    Prepared,
    Committed,
    Aborted,
}

/// A transaction in progress.
pub struct Open {
    txn: Arc<storage::Transaction>,
    /// The store handle its statements read and write through.
    store: storage::Store,
    started: Instant,
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::None => "none",
            State::InProgress(_) => "in progress",
            State::Prepared => "prepared",
            State::Committed => "committed",
            State::Aborted => "aborted",
        }
    }
}

impl TransactionTable {
    pub fn new(lifetime: Duration) -> TransactionTable {
        TransactionTable {
            sessions: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            lifetime,
        }
    }

    /// The session's state, made on first use.
    pub fn session(&self, lsid: &[u8]) -> Result<Arc<Mutex<Session>>> {
        let mut sessions = self.sessions.lock();
        if let Some(s) = sessions.get(lsid) {
            return Ok(s.clone());
        }
        if sessions.len() >= SESSIONS_MAX {
            // Forget sessions with no transaction in progress before refusing.
            sessions.retain(|_, s| s.try_lock().is_none_or(|s| matches!(s.state, State::InProgress(_))));
            if sessions.len() >= SESSIONS_MAX {
                return Err(Error::new(Code::TooManyLogicalSessions, format!("cannot keep transaction state for more than {SESSIONS_MAX} sessions")));
            }
        }
        let s = Arc::new(Mutex::new(Session { lsid: lsid.to_vec(), txn_number: -1, state: State::None }));
        sessions.insert(lsid.to_vec(), s.clone());
        Ok(s)
    }

    /// Forget the sessions `endSessions` ended, aborting their transactions.
    pub fn end_sessions(&self, lsids: &[Vec<u8>]) {
        let ended: Vec<_> = {
            let mut sessions = self.sessions.lock();
            lsids.iter().filter_map(|l| sessions.remove(l)).collect()
        };
        for s in ended {
            self.abort_open(&mut s.lock());
        }
    }

    /// Abort the transactions in progress that wrote `db.name` (with `None`, any collection
    /// of `db`): a migration's or movePrimary's critical section, after which a commit would
    /// write where this shard no longer owns the documents. Their commits then fail with
    /// NoSuchTransaction, a transient error: the client runs them again, through the routing
    /// after the move. Returns how many.
    pub fn abort_writers_of(&self, db: &str, name: Option<&str>) -> usize {
        self.abort_in_progress_where(|open| open.txn.wrote(db, name))
    }

    /// killAllSessions: abort every transaction in progress.
    pub fn kill_all(&self) {
        self.abort_in_progress_where(|_| true);
    }

    /// Abort the transactions in progress that `which` picks; returns how many.
    fn abort_in_progress_where(&self, which: impl Fn(&Open) -> bool) -> usize {
        let sessions: Vec<_> = self.sessions.lock().values().cloned().collect();
        let mut aborted = 0;
        for s in sessions {
            // A session busy with a statement finishes it first (waited for here): for a
            // move, no write to the collection is admitted now, so it commits (its writes
            // then reach the transfer) or does something else.
            let mut s = s.lock();
            if matches!(&s.state, State::InProgress(open) if which(open)) {
                self.abort_open(&mut s);
                aborted += 1;
            }
        }
        aborted
    }

    /// Abort transactions older than the lifetime limit, and every one when `primary` is
    /// false (a member that stepped down keeps none: its writes could not commit).
    pub fn reap(&self, primary: bool) {
        if self.open.load(Ordering::SeqCst) == 0 {
            return;
        }
        let sessions: Vec<_> = self.sessions.lock().values().cloned().collect();
        for s in sessions {
            // A session busy with a statement is checked on the next round.
            let Some(mut s) = s.try_lock() else { continue };
            let expired = matches!(&s.state, State::InProgress(o) if !primary || o.started.elapsed() >= self.lifetime);
            if expired {
                self.abort_open(&mut s);
            }
        }
    }

    fn abort_open(&self, s: &mut Session) {
        match std::mem::replace(&mut s.state, State::Aborted) {
            State::InProgress(open) => {
                open.txn.abort();
                self.open.fetch_sub(1, Ordering::SeqCst);
                self.aborted.fetch_add(1, Ordering::Relaxed);
            }
            other => s.state = other,
        }
    }

    /// Check a transaction's statement against the session's state and start or continue
    /// the transaction (mongod's `beginOrContinue`). Returns the store the statement works
    /// through: the transaction's, or `base` for a commit or abort of an ended one.
    pub fn begin_or_continue(&self, shared: &Shared, s: &mut Session, req: &wire::Request, lsid: &[u8], txn_number: i64) -> Result<storage::Store> {
        let (name, db, cmd) = (req.name.as_str(), req.db.as_str(), &req.body);
        match cmd.get("autocommit") {
            Some(Bson::Boolean(false)) => {}
            Some(Bson::Boolean(true)) => return Err(Error::new(Code::InvalidOptions, "Specifying autocommit=true is not allowed.")),
            Some(_) => return Err(Error::type_mismatch("BSON field 'autocommit' is the wrong type, expected type 'bool'")),
            None => {
                return Err(Error::new(
                    Code::InvalidOptions,
                    "txnNumber may only be provided for multi-document transactions and retryable write commands. autocommit:false was not provided",
                ))
            }
        }
        let start = match cmd.get("startTransaction") {
            None => false,
            Some(Bson::Boolean(true)) => true,
            Some(Bson::Boolean(false)) => return Err(Error::new(Code::InvalidOptions, "Specifying startTransaction=false is not allowed.")),
            Some(_) => return Err(Error::type_mismatch("BSON field 'startTransaction' is the wrong type, expected type 'bool'")),
        };
        if !common::server::allowed_in_transaction(name) {
            let e = Error::new(Code::OperationNotSupportedInTransaction, format!("Cannot run '{name}' in a multi-document transaction."));
            return Err(e);
        }
        if is_end(name) {
            if db != "admin" {
                return Err(Error::new(Code::Unauthorized, format!("{name} may only be run against the admin database.")));
            }
        } else if matches!(db, "admin" | "config" | "local") {
            return Err(Error::new(Code::OperationNotSupportedInTransaction, format!("Cannot run command against the '{db}' database in a transaction.")));
        }
        if !is_end(name) && cmd.contains_key("writeConcern") {
            return Err(Error::new(Code::InvalidOptions, "writeConcern is not allowed within a multi-statement transaction"));
        }
        if txn_number < s.txn_number {
            return Err(Error::new(
                Code::TransactionTooOld,
                format!("Cannot start transaction {txn_number} on session because a newer transaction {} has already started.", s.txn_number),
            ));
        }
        if start {
            if is_end(name) {
                return Err(Error::new(Code::OperationNotSupportedInTransaction, format!("Cannot start a transaction with {name}.")));
            }
            if txn_number == s.txn_number {
                return Err(Error::new(
                    Code::ConflictingOperationInProgress,
                    format!("Cannot start transaction {txn_number} because a transaction with the same number is {}", s.state.name()),
                ));
            }
            if let Some((n, _)) = shared.store.prepared_transaction(lsid) {
                return Err(Error::new(
                    Code::PreparedTransactionInProgress,
                    format!("Cannot start transaction {txn_number} on a session whose transaction {n} is prepared and undecided"),
                ));
            }
            let at = check_transaction_read_concern(cmd)?;
            // A newer transaction replaces one still in progress.
            self.abort_open(s);
            let txn = match (at, &shared.repl) {
                // Reads one point (a router's, for a transaction over several shards).
                (Some(ts), Some(repl)) => {
                    let (view, _) = crate::dispatch::snapshot_view(shared, repl, ts)?;
                    shared.store.reading_at(view).begin_transaction(Some((lsid, txn_number)))?
                }
                _ => shared.store.begin_transaction(Some((lsid, txn_number)))?,
            };
            let store = shared.store.in_transaction(&txn);
            s.txn_number = txn_number;
            s.state = State::InProgress(Open { txn, store: store.clone(), started: Instant::now() });
            self.open.fetch_add(1, Ordering::SeqCst);
            self.started.fetch_add(1, Ordering::Relaxed);
            return Ok(store);
        }
        let no_such = || {
            Error::new(
                Code::NoSuchTransaction,
                format!("Transaction with {{ txnNumber: {txn_number} }} has been aborted or was never started on this session."),
            )
        };
        // The store's table of prepared transactions is the truth about them: one prepared
        // while another member was primary, or decided by this member's applier since.
        match shared.store.prepared_transaction(lsid) {
            Some((n, _)) if n == txn_number && txn_number >= s.txn_number => {
                if matches!(s.state, State::InProgress(_)) && s.txn_number == txn_number {
                    return Err(Error::internal("a transaction both in progress and prepared"));
                }
                s.txn_number = txn_number;
                s.state = State::Prepared;
            }
            None if matches!(s.state, State::Prepared) => {
                s.state = match committed_on_record(&shared.store, lsid, s.txn_number)? {
                    true => State::Committed,
                    false => State::Aborted,
                };
            }
            _ => {}
        }
        if txn_number > s.txn_number
            && matches!(name, "commitTransaction" | "coordinateCommitTransaction")
            && committed_on_record(&shared.store, lsid, txn_number)?
        {
            // Committed before this member knew of it (a commit retried after a failover):
            // the session's record says so.
            s.txn_number = txn_number;
            s.state = State::Committed;
        }
        if txn_number != s.txn_number {
            return Err(no_such());
        }
        if cmd.contains_key("readConcern") && !is_end(name) {
            return Err(Error::new(Code::InvalidOptions, "Only the first command in a transaction may specify a readConcern"));
        }
        match (&s.state, name) {
            (State::InProgress(open), _) => Ok(open.store.clone()),
            (State::Prepared, "prepareTransaction" | "commitTransaction" | "abortTransaction") => Ok(shared.store.clone()),
            (State::Prepared, _) => Err(Error::new(
                Code::PreparedTransactionInProgress,
                format!("Cannot call {name} on a prepared transaction {txn_number}: only its commit or abort may follow"),
            )),
            (State::Committed, "prepareTransaction") => Err(Error::new(Code::TransactionCommitted, format!("Transaction {txn_number} has been committed."))),
            (State::Committed, "commitTransaction" | "coordinateCommitTransaction") => Ok(shared.store.clone()),
            (State::Committed, _) => Err(Error::new(Code::TransactionCommitted, format!("Transaction {txn_number} has been committed."))),
            (State::Aborted | State::None, _) => Err(no_such()),
        }
    }

    /// After a statement other than a commit or abort: a statement that failed aborts its
    /// transaction, as in mongod.
    pub fn after_statement(&self, s: &mut Session, failed: bool) {
        if failed {
            self.abort_open(s);
        }
    }

    /// prepareTransaction: log the transaction's prepare entry, keep its writes and keys
    /// until the decision. Returns the prepare timestamp (again, for a retry). A failed
    /// prepare aborts the transaction.
    pub fn prepare(&self, shared: &Shared, s: &mut Session) -> Result<OpTime> {
        match std::mem::replace(&mut s.state, State::Aborted) {
            State::InProgress(open) if open.txn.is_read_only() => {
                // Nothing to prepare: a read-only participant commits now (what it read is
                // made majority-committed by the prepare's write concern), and a later
                // commit finds it committed.
                self.open.fetch_sub(1, Ordering::SeqCst);
                open.txn.commit()?;
                s.state = State::Committed;
                self.committed.fetch_add(1, Ordering::Relaxed);
                Ok(shared.store.oplog_last().unwrap_or_default())
            }
            State::InProgress(open) => {
                self.open.fetch_sub(1, Ordering::SeqCst);
                match shared.store.prepare_transaction(&open.txn, &s.lsid, s.txn_number) {
                    Ok(at) => {
                        s.state = State::Prepared;
                        Ok(at)
                    }
                    Err(e) => {
                        open.txn.abort();
                        self.aborted.fetch_add(1, Ordering::Relaxed);
                        Err(e)
                    }
                }
            }
            State::Prepared => {
                s.state = State::Prepared;
                shared.store.prepared_transaction(&s.lsid).map(|(_, at)| at).ok_or_else(|| Error::internal("a prepared transaction the store does not keep"))
            }
            other => {
                s.state = other;
                Err(Error::new(Code::NoSuchTransaction, format!("Transaction {} has been aborted.", s.txn_number)))
            }
        }
    }

    /// commitTransaction: the transaction's changes in one atomic write; a retried commit of
    /// a committed transaction succeeds again. A prepared transaction commits at
    /// `commit_ts`, which only it may be given. Returns the commit's entry, if it logged one.
    pub fn commit(&self, shared: &Shared, s: &mut Session, commit_ts: Option<u64>) -> Result<Option<OpTime>> {
        match (&s.state, commit_ts) {
            (State::Prepared, None) => return Err(Error::new(Code::InvalidOptions, "'commitTimestamp' must be provided to commit a prepared transaction")),
            (State::InProgress(_), Some(_)) => {
                return Err(Error::new(Code::InvalidOptions, "'commitTimestamp' cannot be provided for an unprepared transaction"))
            }
            (State::Prepared, Some(ts)) => {
                let r = shared.store.commit_prepared(&s.lsid, s.txn_number, ts);
                if r.is_ok() {
                    s.state = State::Committed;
                    self.committed.fetch_add(1, Ordering::Relaxed);
                }
                return r;
            }
            _ => {}
        }
        match std::mem::replace(&mut s.state, State::Aborted) {
            State::InProgress(open) => {
                self.open.fetch_sub(1, Ordering::SeqCst);
                let r = open.txn.commit();
                match r.is_ok() {
                    true => {
                        s.state = State::Committed;
                        self.committed.fetch_add(1, Ordering::Relaxed);
                    }
                    false => {
                        self.aborted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                r
            }
            State::Committed => {
                s.state = State::Committed;
                Ok(None)
            }
            other => {
                s.state = other;
                Err(Error::new(Code::NoSuchTransaction, format!("Transaction {} has been aborted.", s.txn_number)))
            }
        }
    }

    /// coordinateCommitTransaction without participants: a router that did not run the
    /// transaction asks for its decision (a commit retried through it). Only a commit that
    /// already happened is reported; a transaction still in progress is aborted, so that no
    /// other commit can follow (mongos's commit recovery).
    pub fn recover_decision(&self, s: &mut Session) -> Result<()> {
        match &s.state {
            State::Committed => Ok(()),
            State::Prepared => {
                Err(Error::new(Code::PreparedTransactionInProgress, format!("Transaction {} is prepared: its coordinator decides it", s.txn_number)))
            }
            _ => {
                self.abort_open(s);
                Err(Error::new(Code::NoSuchTransaction, format!("Transaction {} has been aborted or was never committed.", s.txn_number)))
            }
        }
    }

    /// abortTransaction.
    pub fn abort(&self, shared: &Shared, s: &mut Session) -> Result<()> {
        match &s.state {
            State::InProgress(_) => {
                self.abort_open(s);
                Ok(())
            }
            State::Prepared => {
                shared.store.abort_prepared(&s.lsid, s.txn_number)?;
                s.state = State::Aborted;
                self.aborted.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            State::Committed => Err(Error::new(Code::TransactionCommitted, format!("Transaction {} has been committed.", s.txn_number))),
            State::Aborted | State::None => Err(Error::new(Code::NoSuchTransaction, format!("Transaction {} has been aborted.", s.txn_number))),
        }
    }

    /// serverStatus's `transactions` section.
    pub fn status(&self) -> Document {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed) as i64;
        bson::doc! {
            "currentOpen": self.open.load(Ordering::SeqCst) as i64,
            "totalStarted": n(&self.started),
            "totalCommitted": n(&self.committed),
            "totalAborted": n(&self.aborted),
        }
    }
}

/// Run an ordinary write (`f`) again each time it meets a document an open transaction
/// wrote (WriteConflict), once some transaction ended: the write is ordered after the
/// transaction, as mongod's is. `f` must leave nothing half-done when it fails so (a
/// multi-document write skips what it already changed). The operation's deadline and
/// killOp still apply.
pub fn after_transactions<T>(ctx: &crate::commands::Ctx, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    loop {
        match f() {
            Err(e) if e.is(Code::WriteConflict) && !ctx.store().write_ctx().in_transaction() => {
                ctx.op.check()?;
                ctx.store().wait_for_transactions(CONFLICT_WAIT);
            }
            r => return r,
        }
    }
}

/// How long a write that met a transaction's document waits before it checks its deadline.
const CONFLICT_WAIT: Duration = Duration::from_millis(100);

/// Whether the session's `config.transactions` record says transaction `txn_number`
/// committed.
fn committed_on_record(store: &storage::Store, lsid: &[u8], txn_number: i64) -> Result<bool> {
    Ok(store.session_record_of(lsid)?.is_some_and(|r| r.get_i64("txnNum").ok() == Some(txn_number) && r.get_str("state").ok() == Some("committed")))
}

/// A transaction's write command that reports a write error fails instead, with that error
/// (mongod stops a transaction's write at its first error and fails the command).
pub fn write_error_fails(reply: Document) -> Result<Document> {
    let Some(Bson::Document(first)) = reply.get_array("writeErrors").ok().and_then(|e| e.first()) else { return Ok(reply) };
    let code = first.get_i32("code").unwrap_or(Code::InternalError.0);
    let mut e = Error::from_number(code, first.get_str("errmsg").unwrap_or_default());
    let mut extra = first.clone();
    for k in ["index", "code", "codeName", "errmsg"] {
        extra.remove(k);
    }
    if !extra.is_empty() {
        e = e.with_extra(extra);
    }
    Err(e)
}

/// The first statement's readConcern: a transaction reads at level local, majority or
/// snapshot (all one snapshot here; the commit's write concern makes what it read durable),
/// at `atClusterTime` when level snapshot names one (returned).
fn check_transaction_read_concern(cmd: &Document) -> Result<Option<u64>> {
    let Ok(rc) = cmd.get_document("readConcern") else { return Ok(None) };
    match rc.get("level") {
        None => Ok(None),
        Some(Bson::String(l)) if l == "snapshot" => Ok(rc.get_timestamp("atClusterTime").ok().map(common::optime::ts_value)),
        Some(Bson::String(l)) if matches!(l.as_str(), "local" | "majority") => Ok(None),
        _ => Err(Error::new(
            Code::InvalidOptions,
            "The readConcern level must be either 'local' (default), 'majority' or 'snapshot' in order to run in a transaction",
        )),
    }
}

/// Abort expired transactions, and all of them once this member is not primary.
pub async fn reap_loop(shared: Arc<Shared>) {
    // A change of role (a step-down) is looked at at once, as mongod aborts at its
    // step-down: a member primary again soon after must not find them open.
    let mut role_changes = shared.repl.as_ref().map(|r| r.topology_changes());
    loop {
        match role_changes.as_mut() {
            Some(changes) => {
                if let Ok(Err(_)) = tokio::time::timeout(REAP_INTERVAL, changes.changed()).await {
                    role_changes = None;
                }
            }
            None => tokio::time::sleep(REAP_INTERVAL).await,
        }
        let primary = shared.repl.as_ref().is_some_and(|r| r.is_writable_primary());
        shared.txns.reap(primary);
    }
}
