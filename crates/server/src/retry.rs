//! Retryable writes (lsid + txnNumber): the reply of each session's newest write is kept, so
//! a driver that retries it after a network error gets that reply instead of a second write.
//!
//! The table is in memory, backed on a replica-set member by `config.transactions` (as
//! mongod's): each recorded reply is also written there, as an ordinary replicated write,
//! so a new primary after a failover, or this member after a restart, still answers a retry
//! with the first reply instead of writing twice. The record is written after the write it
//! describes and before the write concern wait, which therefore covers both; the two form
//! one oplog unit, so secondaries fetch them together.

use bson::Document;
use common::{Code, Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// mongod's maxSessions default.
pub const SESSIONS_MAX: usize = 1_000_000;
/// Bytes of saved replies, estimated as cursor and sort memory are (`exec::approx_doc_size`);
/// new sessions and writes are refused above it (one reply, at most
/// 16 MiB, may overshoot it).
pub const SAVED_REPLY_BYTES_MAX: u64 = 256 << 20;
/// Sessions unused this long are forgotten (logicalSessionTimeoutMinutes).
pub const SESSION_IDLE_MAX: Duration = Duration::from_secs(30 * 60);

#[derive(Default)]
pub struct RetryTable {
    sessions: Mutex<HashMap<Vec<u8>, Arc<Mutex<SessionWrite>>>>,
    saved_bytes: AtomicU64,
}

struct SessionWrite {
    txn_number: i64,
    reply: Option<Document>,
    reply_bytes: u64,
    last_used: Instant,
}

impl RetryTable {
    /// Run `write` as transaction `txn_number` of session `lsid` unless it already ran; then
    /// return the reply it gave.
    #[cfg(test)]
    pub fn run(&self, lsid: &[u8], txn_number: i64, write: impl FnOnce() -> Result<Document>) -> Result<Document> {
        self.run_durable(lsid, txn_number, None, write)
    }

    /// `run`, with the session's record also kept in `store`'s config.transactions.
    pub fn run_durable(&self, lsid: &[u8], txn_number: i64, store: Option<&storage::Store>, write: impl FnOnce() -> Result<Document>) -> Result<Document> {
        let session = {
            let mut map = self.sessions.lock();
            if !map.contains_key(lsid) && map.len() >= SESSIONS_MAX {
                return Err(Error::new(Code::TooManyLogicalSessions, format!("cannot track more than {SESSIONS_MAX} sessions with retryable writes")));
            }
            map.entry(lsid.to_vec())
                .or_insert_with(|| Arc::new(Mutex::new(SessionWrite { txn_number: i64::MIN, reply: None, reply_bytes: 0, last_used: Instant::now() })))
                .clone()
        };
        // One write at a time per session: a retry that arrives while the first attempt
        // still runs waits for it and then replays its reply.
        let mut s = session.lock();
        s.last_used = Instant::now();
        if s.txn_number == i64::MIN {
            if let Some((txn, reply)) = store.and_then(|st| load_record(st, lsid)) {
                s.txn_number = txn;
                s.reply = Some(reply);
            }
        }
        if txn_number < s.txn_number {
            return Err(Error::new(
                Code::TransactionTooOld,
                format!("Retryable write with txnNumber {txn_number} is prohibited on this session because a newer retryable write with txnNumber {} has already started", s.txn_number),
            ));
        }
        if txn_number == s.txn_number {
            if let Some(reply) = &s.reply {
                return Ok(reply.clone());
            }
        }
        if self.saved_bytes.load(Ordering::Relaxed) > SAVED_REPLY_BYTES_MAX {
            return Err(Error::new(Code::TooManyLogicalSessions, "the retryable write table is full"));
        }
        // The write and its record reach the secondaries together (one fetch, one apply).
        let unit = store.map(|st| st.begin_oplog_unit());
        let reply = write()?;
        if let Some(st) = store {
            if let Err(e) = save_record(st, lsid, txn_number, &reply) {
                // The write stands; only a retry after a failover could now repeat it.
                tracing::warn!("cannot record a retryable write in config.transactions: {}", e.message);
            }
        }
        drop(unit);
        let bytes = crate::exec::approx_doc_size(&reply) as u64;
        self.saved_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.saved_bytes.fetch_sub(s.reply_bytes, Ordering::Relaxed);
        s.txn_number = txn_number;
        s.reply = Some(reply.clone());
        s.reply_bytes = bytes;
        Ok(reply)
    }

    /// Forget sessions idle for longer than SESSION_IDLE_MAX; returns how many.
    pub fn reap_idle(&self) -> usize {
        let mut map = self.sessions.lock();
        let before = map.len();
        map.retain(|_, s| match s.try_lock() {
            Some(w) if w.last_used.elapsed() > SESSION_IDLE_MAX => {
                self.saved_bytes.fetch_sub(w.reply_bytes, Ordering::Relaxed);
                false
            }
            _ => true,
        });
        before - map.len()
    }
}

const RECORDS_DB: &str = "config";
const RECORDS_COLLECTION: &str = "transactions";

fn record_id(lsid: &[u8]) -> bson::Bson {
    bson::Bson::Document(bson::doc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: lsid.to_vec() }})
}

fn load_record(store: &storage::Store, lsid: &[u8]) -> Option<(i64, Document)> {
    let coll = store.collection(RECORDS_DB, RECORDS_COLLECTION)?;
    let (_, d) = coll.snapshot().find_by_id(&record_id(lsid)).ok()??;
    Some((d.get_i64("txnNum").ok()?, d.get_document("reply").ok()?.clone()))
}

/// `{_id: {id: lsid}, txnNum, lastWriteDate, reply}`: mongod's record, with the reply that a
/// retry gets (mongod rebuilds it from the oplog instead).
fn save_record(store: &storage::Store, lsid: &[u8], txn_number: i64, reply: &Document) -> Result<()> {
    let coll = store.collection_or_create(RECORDS_DB, RECORDS_COLLECTION)?;
    let id = record_id(lsid);
    let doc = bson::doc! {"_id": id.clone(), "txnNum": txn_number, "lastWriteDate": bson::DateTime::now(), "reply": reply.clone()};
    let mut w = coll.writer();
    match w.snapshot().find_by_id(&id)? {
        Some((rid, old)) => w.update(rid, &old, &doc),
        None => w.insert(&doc).map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn a_retry_replays_the_reply_and_an_older_txn_is_refused() {
        let t = RetryTable::default();
        let mut runs = 0;
        let r = t.run(b"s1", 1, || {
            runs += 1;
            Ok(doc! {"n": 1})
        });
        assert_eq!(r.unwrap(), doc! {"n": 1});
        let r = t.run(b"s1", 1, || {
            runs += 1;
            Ok(doc! {"n": 99})
        });
        assert_eq!(r.unwrap(), doc! {"n": 1}, "the retry replays");
        assert_eq!(runs, 1);
        assert_eq!(t.run(b"s1", 0, || Ok(doc! {})).unwrap_err().code, Code::TransactionTooOld.0);
        // A failed attempt is not recorded: its retry runs.
        assert!(t.run(b"s1", 2, || Err(Error::bad_value("x"))).is_err());
        assert_eq!(t.run(b"s1", 2, || Ok(doc! {"n": 2})).unwrap(), doc! {"n": 2});
        // Sessions are independent.
        assert_eq!(t.run(b"s2", 1, || Ok(doc! {"n": 3})).unwrap(), doc! {"n": 3});
        assert_eq!(t.reap_idle(), 0);
    }
}
