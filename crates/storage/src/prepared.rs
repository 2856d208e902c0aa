//! Prepared transactions: a participant's side of a two-phase commit across shards.
//!
//! `Store::prepare_transaction` logs a transaction's operations in a prepare entry
//! (`applyOps` with `prepare: true`) and its session's record with `state: "prepared"`, and
//! applies nothing: the transaction keeps its writes and its keys (no other writer can
//! change them) until the decision. The decision's entry (`commitTransaction` with the
//! coordinator's `commitTimestamp`, or `abortTransaction`) applies the writes or drops
//! them. Prepared transactions live in the store's table of them (`Shared::prepared`),
//! not in a connection's session: a secondary's applier keeps the ones it applied a prepare
//! entry of, a restart finds them again from the records (`state: "prepared"`), and a member
//! that becomes primary commits or aborts them from there.
//!
//! **Reads at a point in time.** The coordinator's commit timestamp is the latest of the
//! participants' prepare timestamps, and each participant logs its commit entry later than
//! that. A read at T between the two must still see the transaction (another shard's read
//! at T does), so:
//! - a read at T waits while a transaction prepared at or before T is undecided (mongod's
//!   prepare conflict), since it could yet commit at or before T;
//! - a view at T overlays the writes of transactions committed at or before T whose commit
//!   came after the view's position. This is exact: a prepared transaction owns its keys
//!   from its prepare to its commit, so nothing else wrote them in between, and what wrote
//!   them after is later than T.

use super::*;
use crate::txn::Writes;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Commits of prepared transactions kept for reads at a point in time, whatever the window.
pub const PREPARED_COMMITS_KEPT_MAX: usize = 100_000;
/// How long a read at a point in time waits for an undecided prepared transaction's
/// decision before it gives up (SnapshotUnavailable).
pub const PREPARE_CONFLICT_WAIT_MAX: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(crate) struct Prepared {
    /// Undecided, by lsid.
    open: HashMap<Vec<u8>, PreparedTxn>,
    /// Committed, oldest commit first.
    committed: VecDeque<CommittedPrepared>,
}

struct PreparedTxn {
    txn_number: i64,
    txn: Arc<Transaction>,
    /// The prepare entry's optime; None while it is being logged.
    at: Option<OpTime>,
}

struct CommittedPrepared {
    commit_ts: u64,
    /// The engine position after the commit's write.
    position: u64,
    writes: Arc<Writes>,
    committed_at: Instant,
}

fn no_prepared(txn_number: i64) -> Error {
    Error::new(Code::NoSuchTransaction, format!("Transaction {txn_number} is not prepared on this member."))
}

impl Prepared {
    fn conflict(&self, ts: Option<u64>) -> bool {
        self.open.values().any(|e| match (e.at, ts) {
            (None, _) | (_, None) => true,
            (Some(at), Some(ts)) => at.ts <= ts,
        })
    }
}

impl Store {
    /// Prepare `txn` (the session `lsid`'s transaction `txn_number`): log its prepare entry
    /// and its record in one write, keeping its writes and keys until the decision. Returns
    /// the prepare entry's optime (the prepare timestamp). A transaction that wrote nothing
    /// logs nothing and returns the newest entry's optime; it is not kept.
    pub fn prepare_transaction(&self, txn: &Arc<Transaction>, lsid: &[u8], txn_number: i64) -> Result<OpTime> {
        let shared = &self.inner.shared;
        {
            let mut p = shared.prepared.lock();
            if p.open.contains_key(lsid) {
                return Err(Error::new(Code::PreparedTransactionInProgress, "this session already has a prepared transaction"));
            }
            // Registered before it is logged: a read at a point in time meanwhile waits.
            p.open.insert(lsid.to_vec(), PreparedTxn { txn_number, txn: txn.clone(), at: None });
            shared.has_prepared.store(true, Ordering::SeqCst);
        }
        let logged = txn.prepare();
        let mut p = shared.prepared.lock();
        match logged {
            Ok(Some(at)) => {
                if let Some(e) = p.open.get_mut(lsid) {
                    e.at = Some(at);
                }
                drop(p);
                shared.prepared_changed.notify_all();
                Ok(at)
            }
            other => {
                p.open.remove(lsid);
                shared.has_prepared.store(!p.open.is_empty(), Ordering::SeqCst);
                drop(p);
                shared.prepared_changed.notify_all();
                let last = shared.oplog.read().as_ref().map(|l| l.state.lock().last).unwrap_or_default();
                other.map(|_| last)
            }
        }
    }

    /// Keep `txn`, prepared by the entry at `at` (a secondary applying it, or a restart
    /// finding it again). A transaction kept already is left as it is.
    pub fn note_prepared(&self, txn: Arc<Transaction>, lsid: &[u8], txn_number: i64, at: OpTime) -> Result<()> {
        txn.mark_prepared(at)?;
        let shared = &self.inner.shared;
        let mut p = shared.prepared.lock();
        if p.open.get(lsid).is_some_and(|e| e.txn_number >= txn_number) {
            txn.abort();
            return Ok(());
        }
        if let Some(old) = p.open.insert(lsid.to_vec(), PreparedTxn { txn_number, txn, at: Some(at) }) {
            old.txn.abort();
        }
        shared.has_prepared.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The prepared transaction of session `lsid`: its number and prepare optime.
    pub fn prepared_transaction(&self, lsid: &[u8]) -> Option<(i64, OpTime)> {
        let p = self.inner.shared.prepared.lock();
        p.open.get(lsid).map(|e| (e.txn_number, e.at.unwrap_or_default()))
    }

    /// Wait until no prepared transaction that wrote `db.name` (with `None`, any collection
    /// of `db`) awaits its decision (a migration's or movePrimary's critical section: their
    /// commits must reach what it copies). LockTimeout after `PREPARE_CONFLICT_WAIT_MAX`.
    pub fn wait_for_prepared_on(&self, db: &str, name: Option<&str>) -> Result<()> {
        let colls = match name {
            Some(n) => self.collection(db, n).map(|c| c.state.clone()).into_iter().collect(),
            None => self.colls_in(db),
        };
        let deadline = Instant::now() + PREPARE_CONFLICT_WAIT_MAX;
        while colls.iter().any(|c| c.prepared_txns.load(Ordering::SeqCst) > 0) {
            if Instant::now() >= deadline {
                return Err(Error::new(
                    Code::LockTimeout,
                    format!("a prepared transaction on {db}.{} was not decided within {} s", name.unwrap_or("*"), PREPARE_CONFLICT_WAIT_MAX.as_secs()),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// How many prepared transactions await their decision.
    pub fn prepared_count(&self) -> usize {
        self.inner.shared.prepared.lock().open.len()
    }

    /// Commit the prepared transaction `txn_number` of session `lsid` at `commit_ts`: its
    /// writes, and, where this handle logs, the commit entry and the session's record, in
    /// one write. Returns the entry's optime (None where nothing is logged).
    pub fn commit_prepared(&self, lsid: &[u8], txn_number: i64, commit_ts: u64) -> Result<Option<OpTime>> {
        self.decide_prepared(lsid, txn_number, Some(commit_ts))
    }

    /// Abort the prepared transaction `txn_number` of session `lsid`: drop its writes and,
    /// where this handle logs, log the abort entry and the session's record.
    pub fn abort_prepared(&self, lsid: &[u8], txn_number: i64) -> Result<Option<OpTime>> {
        self.decide_prepared(lsid, txn_number, None)
    }

    fn decide_prepared(&self, lsid: &[u8], txn_number: i64, commit_ts: Option<u64>) -> Result<Option<OpTime>> {
        let shared = &self.inner.shared;
        let (txn, at) = {
            let p = shared.prepared.lock();
            match p.open.get(lsid) {
                Some(e) if e.txn_number == txn_number => (e.txn.clone(), e.at.ok_or_else(|| no_prepared(txn_number))?),
                _ => return Err(no_prepared(txn_number)),
            }
        };
        // Logged where this handle logs (a primary); a secondary's applier logged the entry
        // already, as it came.
        let logs = shared.oplog.read().is_some() && !self.ctx.is_replicated();
        let log = match logs {
            true => {
                let records = self.collection_or_create(SESSION_RECORDS_DB, SESSION_RECORDS_COLLECTION)?;
                Some((records.state, oplog::SessionTag { lsid: lsid.to_vec(), txn: txn_number }, at))
            }
            false => None,
        };
        let decided = txn.decide(commit_ts, log);
        let mut p = shared.prepared.lock();
        let result = match decided {
            Ok((entry, committed)) => {
                p.open.remove(lsid);
                if let (Some(commit_ts), Some((position, writes))) = (commit_ts, committed) {
                    if p.committed.len() >= PREPARED_COMMITS_KEPT_MAX {
                        p.committed.pop_front();
                    }
                    p.committed.push_back(CommittedPrepared { commit_ts, position, writes, committed_at: Instant::now() });
                }
                Ok(entry)
            }
            Err(e) => Err(e),
        };
        shared.has_prepared.store(!p.open.is_empty(), Ordering::SeqCst);
        let window = Duration::from_secs(shared.history.lock().window_secs);
        while p.committed.front().is_some_and(|c| c.committed_at.elapsed() > window) {
            p.committed.pop_front();
        }
        drop(p);
        shared.prepared_changed.notify_all();
        result
    }

    /// Forget every prepared transaction kept (a rollback or an initial sync starts the data
    /// over; what is prepared there is found again from the records).
    pub fn forget_prepared(&self) {
        let shared = &self.inner.shared;
        let open: Vec<_> = {
            let mut p = shared.prepared.lock();
            shared.has_prepared.store(false, Ordering::SeqCst);
            p.committed.clear();
            p.open.drain().map(|(_, e)| e.txn).collect()
        };
        for txn in open {
            txn.abort();
        }
        shared.prepared_changed.notify_all();
    }
}

impl Shared {
    /// Wait while a prepared transaction whose prepare entry is at or before `ts` (or not
    /// logged yet) is undecided: it could commit at or before `ts`. `None`: any (a read of
    /// the newest data). The caller must not hold the oplog lock.
    pub(crate) fn wait_for_prepared(&self, ts: Option<u64>) -> Result<()> {
        if !self.has_prepared.load(Ordering::SeqCst) {
            return Ok(());
        }
        let deadline = Instant::now() + PREPARE_CONFLICT_WAIT_MAX;
        let mut p = self.prepared.lock();
        loop {
            if !p.conflict(ts) {
                return Ok(());
            }
            if self.prepared_changed.wait_until(&mut p, deadline).timed_out() {
                return Err(Error::new(
                    Code::SnapshotUnavailable,
                    format!("a prepared transaction's decision did not come within {} s; please retry", PREPARE_CONFLICT_WAIT_MAX.as_secs()),
                ));
            }
        }
    }

    /// Whether `wait_for_prepared(ts)` would wait.
    pub(crate) fn prepared_conflict(&self, ts: Option<u64>) -> bool {
        self.has_prepared.load(Ordering::SeqCst) && self.prepared.lock().conflict(ts)
    }

    /// `view`, the data as of cluster time `ts`, with the writes of the prepared
    /// transactions committed at or before `ts` whose commit came after the view's position.
    pub(crate) fn with_prepared_commits(&self, view: Arc<dyn EngineSnapshot>, ts: u64) -> Arc<dyn EngineSnapshot> {
        let p = self.prepared.lock();
        let position = view.position();
        let mut later = p.committed.iter().filter(|c| c.commit_ts <= ts && c.position > position).peekable();
        if later.peek().is_none() {
            return view;
        }
        // In commit order: a later commit's value of a key wins.
        let mut writes = Writes::new();
        for c in later {
            for ((space, key), value) in c.writes.iter() {
                if *space != Space::Catalog {
                    writes.insert((*space, key.clone()), value.clone());
                }
            }
        }
        txn::overlay(view, Arc::new(writes))
    }
}
