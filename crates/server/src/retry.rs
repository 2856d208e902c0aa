//! Retryable writes (lsid + txnNumber): the reply of each session's newest write is kept, so
//! a driver that retries it after a network error gets that reply instead of a second write.
//!
//! The table is in memory: a retry is answered exactly once while this process lives. Making
//! it survive a restart or a failover (mongod's config.transactions, written with the oplog)
//! comes with multi-member replica sets.

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
    pub fn run(&self, lsid: &[u8], txn_number: i64, write: impl FnOnce() -> Result<Document>) -> Result<Document> {
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
        let reply = write()?;
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
