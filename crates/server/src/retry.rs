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
use std::collections::{HashMap, HashSet};
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

    /// No statement of this transaction number took effect yet.
    pub fn is_empty(&self) -> bool {
        self.by_stmt.is_empty()
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
        write: impl FnOnce(&Executed, &storage::RetryableWrite) -> Result<Document>,
    ) -> Result<Document> {
        let session = self.session(lsid)?;
        // One write at a time per session: a retry that arrives while the first attempt
        // still runs waits for it, and then finds what it did.
        let mut s = session.lock();
        let record = s.record(store, term, lsid)?;
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

    /// Log, on collection `coll` of the primary of `term`, the history of transaction `txn`
    /// of session `lsid` that a chunk migration brought from the donor (`history` there):
    /// each entry with its statement. Entries this shard has already (sent again, or with
    /// an earlier batch) are skipped, by the donor's optime they carry; a transaction older
    /// than the session's newest here is ignored, since its client has moved on and never
    /// retries it. Returns how many entries were logged.
    pub fn import(&self, store: &storage::Store, term: i64, lsid: &[u8], txn: i64, entries: &[(i32, Document)], coll: &storage::Collection) -> Result<usize> {
        let session = self.session(lsid)?;
        let mut s = session.lock();
        let record = s.record(store, term, lsid)?;
        if txn < s.txn_number.max(record.map_or(i64::MIN, |r| r.0)) {
            return Ok(0);
        }
        let (known, prev) = match record {
            Some((t, last)) if t == txn => match transaction_entries(store, lsid, txn, last) {
                Ok(here) => (here.iter().map(|(stmt, e)| (*stmt, e.get_timestamp("ts").ok())).collect::<HashSet<_>>(), last),
                // This member's part of the transaction is gone from its oplog: a retry here
                // fails (IncompleteTransactionHistory) whatever is added, so add nothing
                // rather than fail the migration.
                Err(e) if e.code == Code::IncompleteTransactionHistory.0 => return Ok(0),
                Err(e) => return Err(e),
            },
            _ => (HashSet::new(), OpTime::NULL),
        };
        let mut fresh = Vec::new();
        for (stmt, e) in entries {
            let ts = e.get_timestamp("ts").map_err(|_| Error::bad_value("a migrated session entry has no ts"))?;
            if !known.contains(&(*stmt, Some(ts))) {
                fresh.push((*stmt, bson::RawDocumentBuf::try_from(e).map_err(|e| Error::bad_value(format!("a migrated session entry: {e}")))?.into_bytes()));
            }
        }
        s.txn_number = txn;
        if fresh.is_empty() {
            return Ok(0);
        }
        let guard = store.begin_retryable_write(lsid, txn, prev)?;
        let r = coll.through(guard.store()).writer().log_session_history(&fresh);
        let last = guard.last_write();
        if last != prev {
            s.record = Some((txn, last));
        }
        r.map(|_| fresh.len())
    }

    fn session(&self, lsid: &[u8]) -> Result<Arc<Mutex<Session>>> {
        let mut map = self.sessions.lock();
        if !map.contains_key(lsid) && map.len() >= SESSIONS_MAX {
            return Err(Error::new(Code::TooManyLogicalSessions, format!("cannot track more than {SESSIONS_MAX} sessions with retryable writes")));
        }
        let new = || Arc::new(Mutex::new(Session { txn_number: i64::MIN, last_used: Instant::now(), record: None, record_term: None }));
        Ok(map.entry(lsid.to_vec()).or_insert_with(new).clone())
    }

    /// Forget sessions idle for longer than SESSION_IDLE_MAX; returns how many.
    pub fn reap_idle(&self) -> usize {
        let mut map = self.sessions.lock();
        let before = map.len();
        map.retain(|_, s| s.try_lock().is_none_or(|w| w.last_used.elapsed() <= SESSION_IDLE_MAX));
        before - map.len()
    }
}

impl Session {
    /// The session's record, read again in a new term (see the module's comment).
    fn record(&mut self, store: &storage::Store, term: i64, lsid: &[u8]) -> Result<Option<(i64, OpTime)>> {
        self.last_used = Instant::now();
        if self.record_term != Some(term) {
            self.record = load_record(store, lsid)?;
            self.record_term = Some(term);
        }
        Ok(self.record)
    }
}

/// Session `lsid`'s newest transaction that logged a write on this member, and that
/// transaction's entries, oldest first, each with its statement (what a chunk migration's
/// donor sends the recipient). `None` when the session wrote nothing here.
pub fn history(store: &storage::Store, lsid: &[u8]) -> Result<Option<(i64, Vec<(i32, Document)>)>> {
    let Some((txn, last)) = load_record(store, lsid)? else { return Ok(None) };
    Ok(Some((txn, transaction_entries(store, lsid, txn, last)?)))
}

/// The session's record: its newest transaction that logged a write, and that write's optime.
fn load_record(store: &storage::Store, lsid: &[u8]) -> Result<Option<(i64, OpTime)>> {
    let Some(d) = store.session_record_of(lsid)? else { return Ok(None) };
    let bad = || Error::new(Code::InvalidBSON, format!("malformed config.transactions record {d}"));
    let txn = d.get_i64("txnNum").map_err(|_| bad())?;
    let last = d.get_document("lastWriteOpTime").ok().and_then(OpTime::from_doc).ok_or_else(bad)?;
    Ok(Some((txn, last)))
}

/// What the entries of transaction `txn` of `lsid` (walked back from `last`) executed.
fn walk(store: &storage::Store, lsid: &[u8], txn: i64, last: OpTime) -> Result<Executed> {
    let mut executed = Executed::default();
    for (stmt, e) in transaction_entries(store, lsid, txn, last)? {
        executed.by_stmt.entry(stmt).or_default().push(e);
    }
    Ok(executed)
}

/// The entries of transaction `txn` of `lsid`, walked back from `last`, oldest first, each
/// with its statement. An entry a chunk migration brought (`$sessionMigrateInfo`) stands
/// for the donor's entry it wraps: that says what the statement did.
fn transaction_entries(store: &storage::Store, lsid: &[u8], txn: i64, last: OpTime) -> Result<Vec<(i32, Document)>> {
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
        let stmt = e.get_i32("stmtId").map_err(|_| incomplete())?;
        entries.push((stmt, unwrap_migrated(e)));
    }
    entries.reverse();
    Ok(entries)
}

fn unwrap_migrated(mut e: Document) -> Document {
    let migrated = e.get_str("op").ok() == Some("n") && e.get_document("o").is_ok_and(|o| o.contains_key(storage::SESSION_MIGRATE_INFO));
    match e.remove("o2") {
        Some(Bson::Document(original)) if migrated => original,
        Some(o2) => {
            e.insert("o2", o2);
            e
        }
        None => e,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn member() -> storage::Store {
        let s = storage::Store::open_in_memory();
        s.enable_oplog(64 << 20).unwrap();
        s
    }

    #[test]
    fn history_moves_to_another_member_once_and_a_retry_there_finds_it() {
        let (donor, recipient) = (member(), member());
        let table = RetryTable::default();
        let lsid = [9u8; 16];
        let c = donor.collection_or_create("db", "c").unwrap();
        // Transaction 4: statements 0 and 1 insert, on the donor.
        table
            .run(&donor, 1, &lsid, 4, |_, write| {
                write.set_statement_per_document(vec![0, 1]);
                // Through the retryable write's handle, as a command's handler writes.
                assert!(c.through(write.store()).insert_many(&[doc! {"_id": 1}, doc! {"_id": 2}], true).errors.is_empty());
                Ok(Document::new())
            })
            .unwrap();
        let (txn, entries) = history(&donor, &lsid).unwrap().unwrap();
        assert_eq!((txn, entries.iter().map(|(s, _)| *s).collect::<Vec<_>>()), (4, vec![0, 1]));

        let rc = recipient.collection_or_create("db", "c").unwrap();
        let to = RetryTable::default();
        // Statement 0 alone first (a batch cut short), then both: 1 is new, 0 is known.
        assert_eq!(to.import(&recipient, 1, &lsid, 4, &entries[..1], &rc).unwrap(), 1);
        assert_eq!(to.import(&recipient, 1, &lsid, 4, &entries, &rc).unwrap(), 1);
        assert_eq!(to.import(&recipient, 1, &lsid, 4, &entries, &rc).unwrap(), 0, "sent again: nothing new");
        // A retry on the recipient (a new table: as after a restart) finds both statements
        // executed, as the donor's entries say, and inserts nothing.
        let retry = RetryTable::default();
        retry
            .run(&recipient, 1, &lsid, 4, |executed, _| {
                for stmt in [0, 1] {
                    let e = executed.statement(stmt).unwrap_or_else(|| panic!("statement {stmt} executed"));
                    assert_eq!((e.len(), e[0].get_str("op").unwrap()), (1, "i"));
                }
                assert_eq!(executed.statement(2), None);
                Ok(Document::new())
            })
            .unwrap();
        assert!(rc.snapshot().scan(None, 10).unwrap().is_empty(), "history is not data");
        // Moved again, the recipient's history stands for the donor's entries.
        let (txn, again) = history(&recipient, &lsid).unwrap().unwrap();
        assert_eq!(txn, 4);
        assert_eq!(again, entries);
        // A transaction older than the session's newest here is not imported.
        retry.run(&recipient, 1, &lsid, 5, |_, _| Ok(Document::new())).unwrap();
        assert_eq!(retry.import(&recipient, 1, &lsid, 4, &entries, &rc).unwrap(), 0);
    }
}
