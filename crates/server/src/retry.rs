//! Retryable writes (lsid + txnNumber), as mongod keeps them: a write's oplog entries carry
//! its session (`lsid`, `txnNumber`, `stmtId`, `prevOpTime`), and the session's record in
//! `config.transactions` (`txnNum`, `lastWriteOpTime`) is written in the same engine batch
//! (`storage::Store::begin_retryable_write`). Every member derives the record from the
//! entries it applies (`apply`), so after a failover the new primary has it too.
//!
//! A retry (same session, same txnNumber) walks the transaction's entries back from the
//! record's `lastWriteOpTime` through their `prevOpTime`s and finds which statements already
//! took effect. The command then runs again with those statements' results taken from their
//! entries instead of being executed a second time (`Executed`), and with the others
//! executed (a statement that failed, or never ran, before).
//!
//! Here, in memory, are only the sessions themselves: one write at a time per session, the
//! newest txnNumber each has begun (an older one is refused), and a copy of its record while
//! this member stays primary in the term that wrote it (reading the record for every write
//! was 6% of a primary's CPU under YCSB inserts). In a later term the record is read again:
//! meanwhile this member may have applied other primaries' writes, or rolled back its own.

use bson::{Bson, Document};
use common::{Code, Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use storage::OpTime;

/// mongod's maxSessions default.
pub const SESSIONS_MAX: usize = 1_000_000;
/// Sessions unused this long are forgotten (logicalSessionTimeoutMinutes).
pub const SESSION_IDLE_MAX: Duration = Duration::from_secs(30 * 60);
/// A retry walks at most this many entries of its transaction (an insert of the largest
/// batch, 100,000 documents, logs one per document).
const TRANSACTION_ENTRIES_MAX: usize = 100_000;

#[derive(Default)]
pub struct RetryTable {
    sessions: Mutex<HashMap<Vec<u8>, Arc<Mutex<Session>>>>,
}

struct Session {
    /// The newest txnNumber begun here (i64::MIN: none yet).
    txn_number: i64,
    last_used: Instant,
    /// The session's record (`txnNum`, `lastWriteOpTime`) as of term `record_term`.
    record: Option<(i64, OpTime)>,
    record_term: Option<i64>,
}

/// What earlier attempts of a retryable write did: each statement's oplog entries, oldest
/// first.
#[derive(Default)]
pub struct Executed {
    by_stmt: HashMap<i32, Vec<Document>>,
}

impl Executed {
    /// The entries statement `stmt` logged, if it took effect.
    pub fn statement(&self, stmt: i32) -> Option<&[Document]> {
        self.by_stmt.get(&stmt).map(|v| v.as_slice())
    }
}

impl RetryTable {
    /// Run `write` as transaction `txn_number` of session `lsid` on the primary of `term`,
    /// with what earlier attempts of that transaction already did. `write` sets the statement
    /// of each write it makes on the guard.
    pub fn run(
        &self,
        store: &storage::Store,
        term: i64,
        lsid: &[u8],
        txn_number: i64,
        write: impl FnOnce(&Executed, &storage::RetryableWriteGuard) -> Result<Document>,
    ) -> Result<Document> {
        let session = {
            let mut map = self.sessions.lock();
            if !map.contains_key(lsid) && map.len() >= SESSIONS_MAX {
                return Err(Error::new(Code::TooManyLogicalSessions, format!("cannot track more than {SESSIONS_MAX} sessions with retryable writes")));
            }
            let new = || Arc::new(Mutex::new(Session { txn_number: i64::MIN, last_used: Instant::now(), record: None, record_term: None }));
            map.entry(lsid.to_vec()).or_insert_with(new).clone()
        };
        // One write at a time per session: a retry that arrives while the first attempt
        // still runs waits for it, and then finds what it did.
        let mut s = session.lock();
        s.last_used = Instant::now();
        if s.record_term != Some(term) {
            s.record = load_record(store, lsid)?;
            s.record_term = Some(term);
        }
        let record = s.record;
        let newest = s.txn_number.max(record.map_or(i64::MIN, |r| r.0));
        if txn_number < newest {
            return Err(Error::new(
                Code::TransactionTooOld,
                format!("Retryable write with txnNumber {txn_number} is prohibited on this session because a newer retryable write with txnNumber {newest} has already started"),
            ));
        }
        let (executed, prev) = match record {
            Some((txn, last)) if txn == txn_number => (walk(store, lsid, txn_number, last)?, last),
            _ => (Executed::default(), OpTime::NULL),
        };
        s.txn_number = txn_number;
        let guard = store.begin_retryable_write(lsid, txn_number, prev)?;
        let r = write(&executed, &guard);
        // Whether or not the command succeeded, what it logged is in the record.
        let last = guard.last_write();
        if last != prev {
            s.record = Some((txn_number, last));
        }
        r
    }

    /// Forget sessions idle for longer than SESSION_IDLE_MAX; returns how many.
    pub fn reap_idle(&self) -> usize {
        let mut map = self.sessions.lock();
        let before = map.len();
        map.retain(|_, s| s.try_lock().is_none_or(|w| w.last_used.elapsed() <= SESSION_IDLE_MAX));
        before - map.len()
    }
}

fn lsid_bson(lsid: &[u8]) -> Bson {
    Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: lsid.to_vec() })
}

/// The session's record: its newest transaction that logged a write, and that write's optime.
fn load_record(store: &storage::Store, lsid: &[u8]) -> Result<Option<(i64, OpTime)>> {
    let Some(coll) = store.collection(storage::SESSION_RECORDS_DB, storage::SESSION_RECORDS_COLLECTION) else { return Ok(None) };
    let Some((_, d)) = coll.snapshot().find_by_id(&Bson::Document(bson::doc! {"id": lsid_bson(lsid)}))? else { return Ok(None) };
    let bad = || Error::new(Code::InvalidBSON, format!("malformed config.transactions record {d}"));
    let txn = d.get_i64("txnNum").map_err(|_| bad())?;
    let last = d.get_document("lastWriteOpTime").ok().and_then(OpTime::from_doc).ok_or_else(bad)?;
    Ok(Some((txn, last)))
}

/// The entries of transaction `txn` of `lsid`, walked back from `last`.
fn walk(store: &storage::Store, lsid: &[u8], txn: i64, last: OpTime) -> Result<Executed> {
    let incomplete = || Error::new(Code::IncompleteTransactionHistory, format!("Incomplete history detected for transaction {txn} on session {}", hex(lsid)));
    let oplog = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).ok_or_else(incomplete)?;
    let snap = oplog.snapshot();
    let mut entries = Vec::new();
    let mut at = last;
    while at != OpTime::NULL {
        if entries.len() >= TRANSACTION_ENTRIES_MAX {
            return Err(incomplete());
        }
        // An entry truncated away, or replaced by a rollback: the history is gone.
        let e = snap.get(at.ts)?.ok_or_else(incomplete)?;
        let ours = OpTime::from_doc(&e) == Some(at)
            && e.get_i64("txnNumber").ok() == Some(txn)
            && matches!(e.get_document("lsid").ok().and_then(|l| l.get("id")), Some(Bson::Binary(b)) if b.bytes == lsid);
        if !ours {
            return Err(incomplete());
        }
        at = e.get_document("prevOpTime").ok().and_then(OpTime::from_doc).ok_or_else(incomplete)?;
        entries.push(e);
    }
    let mut executed = Executed::default();
    for e in entries.into_iter().rev() {
        let stmt = e.get_i32("stmtId").map_err(|_| incomplete())?;
        executed.by_stmt.entry(stmt).or_default().push(e);
    }
    Ok(executed)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
