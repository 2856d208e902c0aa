//! Multi-document transactions on the simulated replica set, by the rules of mongod 7.0
//! and the server (`server::txn`: sessions and their states; `storage::txn`: conflicts and
//! the one atomic commit; `replication::apply`: a commit's entry applied whole, the
//! session's record derived from it).
//!
//! Member side (`Sessions`, `impl Member`):
//! - a transaction lives in its primary's memory only: its statements log nothing. Each
//!   statement writes one key. A key another transaction in progress wrote, or one this
//!   primary wrote since the transaction began (its snapshot), is a WriteConflict at once,
//!   and the failed statement aborts the transaction (first writer wins). A plain write to
//!   a key a transaction in progress wrote waits for that transaction to end, as the
//!   server's runs again after each WriteConflict;
//! - the commit logs one entry, `applyOps` with every write, `lsid` and `txnNumber` (the
//!   server's unprepared commit), through the member's `storage::Store` like any write;
//!   secondaries fetch it in one batch and rollback removes it whole. w:"majority" answers
//!   once it is majority-committed; a step-down first answers UnknownTransactionCommitResult;
//! - a kill, a step-down for any reason, or `TXN_LIFETIME_MS` abort the transactions in
//!   progress: a later statement, commit or abort finds NoSuchTransaction;
//! - a commit of a transaction the member does not hold in memory (retried after a
//!   failover, or after a restart) is answered from the session's record: the replicated
//!   commit entry, or the copied data of an initial sync. A commit or retry that finds no
//!   transaction waits for its write concern on the member's newest entry before it answers
//!   NoSuchTransaction, as the server's does (`dispatch.rs`: an end that finds none).
//!
//! Client side (`TxnClient`, `impl Sim`): begin on the member believed primary, one to
//! `STATEMENTS_MAX` statements on distinct keys, then commit (w:"majority" mostly, w:1
//! sometimes) or abort. A statement answered NoSuchTransaction or NotPrimary, or without
//! an answer, is a TransientTransactionError: the client starts over with the next
//! txnNumber. A commit without a definite answer (UnknownTransactionCommitResult, not
//! primary, no answer) is retried with w:"majority", as drivers retry it; now and then a
//! commit acknowledged with w:"majority" is sent again, and must be answered the same.
//!
//! Checker side (`TxnChecker`): atomicity of every member's data and of what majority reads
//! return, no transaction logged twice or logged after its client was told it ended, no
//! transaction the client was told did not commit in the committed history, and retried
//! commits that agree with the first definite answer.

use crate::member::{self, Answer, DataDoc, Member, Values, ENTRY_ENVELOPE_BYTES, KEYS, REGISTERS_NS};
use crate::{Event, Failure, Msg, Note, Out, Sim, CLIENT_TIMEOUT_MS, ENTRY_SMALL_BYTES_MAX, ENTRY_SMALL_BYTES_MIN, SETTLE_MS};
use bson::{doc, Bson, Document};
use repl::MemberState;
use std::collections::{BTreeMap, BTreeSet};
use storage::{OpTime, Store};

/// mongod's transactionLifetimeLimitSeconds (60 s), scaled to the sim's runs: a transaction
/// its client left (a statement without an answer) frees its keys, and the writes waiting
/// for them run, well before the set must have settled (`SETTLE_MS`).
pub const TXN_LIFETIME_MS: u64 = 2_000;
const _: () = assert!(2 * TXN_LIFETIME_MS <= SETTLE_MS);
const STATEMENTS_MAX: u64 = 3;
/// The clients' pause between transactions (ms): two clients' transactions overlap now and
/// then, and the transactions add a fraction of the other clients' load.
const TXN_PAUSE_MS: (u64, u64) = (100, 300);
/// Within a transaction, the application's work between statements (ms): long enough that
/// failovers and kills find transactions in progress.
const STATEMENT_PAUSE_MS: (u64, u64) = (0, 30);
const ABORT_CHANCE: f64 = 0.1;
const COMMIT_MAJORITY_CHANCE: f64 = 0.8;
/// A commit acknowledged with w:"majority" sent again (drivers allow it; the answer must
/// not change).
const COMMIT_AGAIN_CHANCE: f64 = 0.1;
const COMMIT_RETRIES_MAX: u32 = 20;

/// A transaction: its session (`lsid`) and `txnNumber`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TxnId {
    pub lsid: u64,
    pub number: i64,
}

impl std::fmt::Display for TxnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "txn {}#{}", self.lsid, self.number)
    }
}

/// One statement's write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnWrite {
    pub key: u64,
    pub value: u64,
    pub size: u64,
}

/// A plain (non-transaction) write.
#[derive(Clone, Copy, Debug)]
pub struct PlainWrite {
    pub op: u64,
    pub key: u64,
    pub value: u64,
    pub majority: bool,
    pub j: bool,
    pub size_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnResult {
    /// A statement or an abort took effect.
    Ok,
    /// The commit's entry.
    Committed(OpTime),
    WriteConflict,
    NoSuchTransaction,
    NotPrimary,
    UnknownCommitResult,
}

// ---- entries ----

fn lsid_bytes(lsid: u64) -> Vec<u8> {
    let mut b = lsid.to_be_bytes().to_vec();
    b.resize(16, 0);
    b
}

/// A session id as drivers send it: `{id: UUID}`.
pub fn lsid_doc(lsid: u64) -> Document {
    doc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: lsid_bytes(lsid) }}
}

/// The transaction of an entry or a copied document (`lsid`, `txnNumber`), if any.
pub fn entry_txn(d: &Document) -> Option<TxnId> {
    let Some(Bson::Binary(id)) = d.get_document("lsid").ok()?.get("id") else { return None };
    let lsid = u64::from_be_bytes(id.bytes.get(..8)?.try_into().ok()?);
    Some(TxnId { lsid, number: d.get_i64("txnNumber").ok()? })
}

/// A committed transaction's entry, shaped as the server logs one (`storage::oplog`
/// `transaction_entry`): `{op: "c", ns: "admin.$cmd", o: {applyOps: [ops]}, lsid, txnNumber,
/// prevOpTime}`, each operation with the size its document stands for.
pub fn txn_entry(at: OpTime, wall_ms: i64, txn: TxnId, writes: &[TxnWrite]) -> Vec<u8> {
    let ops: Vec<Bson> = writes
        .iter()
        .map(|w| Bson::Document(doc! {"op": "i", "ns": REGISTERS_NS, "o": {"_id": w.key as i64, "v": w.value as i64}, "size": w.size as i64}))
        .collect();
    let size = writes.iter().map(|w| w.size).sum::<u64>() + ENTRY_ENVELOPE_BYTES;
    assert!(size <= member::ENTRY_SIZE_MAX_BYTES, "a transaction of {size} bytes needs a chain of entries");
    let d = doc! {
        "ts": at.timestamp(), "t": at.term, "wall": bson::DateTime::from_millis(wall_ms), "size": size as i64,
        "op": "c", "ns": "admin.$cmd", "o": {"applyOps": ops},
        "lsid": lsid_doc(txn.lsid), "txnNumber": txn.number,
        "prevOpTime": {"ts": bson::Timestamp { time: 0, increment: 0 }, "t": -1i64},
    };
    d.to_vec().expect("entry")
}

/// The session's record of `txn` in `store`: the optime of its commit entry, from the
/// oplog or, older than it, the data an initial sync copied (`server::txn`
/// `committed_on_record`; the records are derived from the entries, `replication::apply`).
pub fn find_committed(store: &Store, txn: TxnId) -> Option<OpTime> {
    let c = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
    let mut after = None;
    loop {
        let chunk = c.snapshot().scan_raw(after, 1000).expect("scan");
        if chunk.is_empty() {
            break;
        }
        for (rid, b) in chunk {
            after = Some(rid);
            let raw = bson::RawDocument::from_bytes(&b).expect("entry");
            // Only a transaction's entry has a txnNumber: read the rest of those only.
            if raw.get_i64("txnNumber").ok() != Some(txn.number) {
                continue;
            }
            let d: Document = raw.try_into().expect("entry");
            if entry_txn(&d) == Some(txn) {
                return OpTime::from_doc(&d);
            }
        }
    }
    member::copied_docs(store).into_iter().find(|d| d.txn == Some(txn)).map(|d| d.at)
}

// ---- member side ----

/// A member's sessions, in memory only (a restart forgets them; what committed is on
/// record).
#[derive(Default)]
pub struct Sessions {
    sessions: BTreeMap<u64, Session>,
    /// Plain writes waiting for the transaction that wrote their key to end.
    pub parked_writes: Vec<(usize, PlainWrite)>,
    /// This primary's newest write to each key: a transaction that began before it
    /// conflicts.
    pub written: BTreeMap<u64, OpTime>,
}

struct Session {
    number: i64,
    state: State,
}

enum State {
    Open(Open),
    Committed(OpTime),
    Aborted,
}

struct Open {
    /// The term it began in (only its primary's current term may hold it).
    term: i64,
    /// The newest entry when it began: its snapshot.
    snapshot: OpTime,
    writes: Vec<TxnWrite>,
    /// Monotonic time it began.
    started: u64,
}

impl Sessions {
    /// The session whose transaction in progress wrote `key`.
    pub fn owner(&self, key: u64) -> Option<u64> {
        self.sessions.iter().find(|(_, s)| matches!(&s.state, State::Open(o) if o.writes.iter().any(|w| w.key == key))).map(|(l, _)| *l)
    }

    pub fn open_count(&self) -> u64 {
        self.sessions.values().filter(|s| matches!(s.state, State::Open(_))).count() as u64
    }

    /// The terms the transactions in progress began in.
    fn open_terms(&self) -> impl Iterator<Item = (u64, i64)> + '_ {
        self.sessions.iter().filter_map(|(l, s)| match &s.state {
            State::Open(o) => Some((*l, o.term)),
            _ => None,
        })
    }
}

impl Member {
    fn txn_reply(&self, client: usize, op: u64, result: TxnResult, out: &mut Out) {
        out.sends.push((client, Msg::TxnReply { op, term: self.term, result }));
    }

    /// A transaction's statement (`start`: its first, startTransaction).
    pub(crate) fn on_txn_statement(&mut self, client: usize, op: u64, txn: TxnId, start: bool, write: TxnWrite, out: &mut Out) {
        if self.state != MemberState::Primary {
            return self.txn_reply(client, op, TxnResult::NotPrimary, out);
        }
        let now = self.mono(out.now);
        if start {
            if self.txns.sessions.get(&txn.lsid).is_some_and(|s| s.number >= txn.number) {
                // TransactionTooOld or ConflictingOperationInProgress (the clients never
                // start a number twice).
                return self.txn_reply(client, op, TxnResult::NoSuchTransaction, out);
            }
            // A newer transaction of the session replaces one still in progress.
            let open = Open { term: self.term, snapshot: self.last(), writes: Vec::new(), started: now };
            let replaced = self.txns.sessions.insert(txn.lsid, Session { number: txn.number, state: State::Open(open) });
            if replaced.is_some_and(|s| matches!(s.state, State::Open(_))) {
                self.run_parked_writes(out);
            }
        }
        let owner = self.txns.owner(write.key);
        let newer = self.txns.written.get(&write.key).copied();
        let Some(session) = self.txns.sessions.get_mut(&txn.lsid).filter(|s| s.number == txn.number) else {
            return self.txn_reply(client, op, TxnResult::NoSuchTransaction, out);
        };
        let State::Open(open) = &mut session.state else {
            return self.txn_reply(client, op, TxnResult::NoSuchTransaction, out);
        };
        let conflict = owner.is_some_and(|l| l != txn.lsid) || newer.is_some_and(|at| at > open.snapshot);
        if conflict {
            // The failed statement aborts its transaction (server::txn `after_statement`).
            session.state = State::Aborted;
            out.notes.push(Note::Trace(format!("m{}: {txn} meets a write conflict on key {}", self.index, write.key)));
            self.run_parked_writes(out);
            return self.txn_reply(client, op, TxnResult::WriteConflict, out);
        }
        open.writes.push(write);
        self.txn_reply(client, op, TxnResult::Ok, out);
    }

    /// commitTransaction (a retry too: the same txnNumber).
    pub(crate) fn on_txn_commit(&mut self, client: usize, op: u64, txn: TxnId, majority: bool, j: bool, out: &mut Out) {
        if self.state != MemberState::Primary {
            return self.txn_reply(client, op, TxnResult::NotPrimary, out);
        }
        let session = self.txns.sessions.get_mut(&txn.lsid).filter(|s| s.number == txn.number);
        let result = match session {
            Some(s) if matches!(s.state, State::Open(_)) => {
                let State::Open(open) = std::mem::replace(&mut s.state, State::Aborted) else { unreachable!() };
                let at = self.next_optime(out.now, self.term);
                let bytes = txn_entry(at, self.wall_ms(out.now), txn, &open.writes);
                self.store.append_oplog_replicated(&[(at, bytes)]).expect("log the commit");
                if let Some(s) = self.txns.sessions.get_mut(&txn.lsid) {
                    s.state = State::Committed(at);
                }
                for w in &open.writes {
                    self.txns.written.insert(w.key, at);
                }
                let keys = open.writes.iter().map(|w| w.key).collect();
                out.notes.push(Note::TxnLogged { member: self.index, txn, at, keys, term: self.term });
                self.logged(j, out);
                self.run_parked_writes(out);
                if majority {
                    return self.wait_majority(client, op, at, Answer::Txn(TxnResult::Committed(at)), out);
                }
                return self.txn_reply(client, op, TxnResult::Committed(at), out);
            }
            Some(Session { state: State::Committed(at), .. }) => TxnResult::Committed(*at),
            Some(Session { state: State::Aborted, .. }) => TxnResult::NoSuchTransaction,
            _ => {
                // Not in memory: the session's record says.
                let found = find_committed(&self.store, txn);
                let known = self.txns.sessions.get(&txn.lsid).map(|s| s.number);
                if let Some(at) = found.filter(|_| known.is_none_or(|n| n < txn.number)) {
                    self.txns.sessions.insert(txn.lsid, Session { number: txn.number, state: State::Committed(at) });
                }
                found.map_or(TxnResult::NoSuchTransaction, TxnResult::Committed)
            }
        };
        // The answer waits for its write concern on this member's newest entry, so that a
        // commit that happened elsewhere is majority-committed first, or can no longer be.
        // NoSuchTransaction waits on a no-op it logs in this member's term (the server's
        // rule): a primary of a superseded term that has not heard of the newer one yet may
        // have had its newest entry majority-committed long before, and would answer so for
        // a transaction the newer primary committed; no majority that moved on acknowledges
        // its no-op.
        let mut wait_at = self.last();
        if result == TxnResult::NoSuchTransaction && majority {
            wait_at = self.next_optime(out.now, self.term);
            let bytes = member::entry(wait_at, self.wall_ms(out.now), None, 120);
            self.store.append_oplog_replicated(&[(wait_at, bytes)]).expect("log a no-op");
            self.logged(false, out);
        }
        if majority {
            self.wait_majority(client, op, wait_at, Answer::Txn(result), out);
        } else {
            self.txn_reply(client, op, result, out);
        }
    }

    /// abortTransaction.
    pub(crate) fn on_txn_abort(&mut self, client: usize, op: u64, txn: TxnId, out: &mut Out) {
        if self.state != MemberState::Primary {
            return self.txn_reply(client, op, TxnResult::NotPrimary, out);
        }
        let result = match self.txns.sessions.get_mut(&txn.lsid).filter(|s| s.number == txn.number) {
            Some(s) if matches!(s.state, State::Open(_)) => {
                s.state = State::Aborted;
                self.run_parked_writes(out);
                TxnResult::Ok
            }
            // TransactionCommitted (a client never aborts what it committed: the checker
            // takes this answer for the model's error it would be).
            Some(Session { state: State::Committed(at), .. }) => TxnResult::Committed(*at),
            _ => TxnResult::NoSuchTransaction,
        };
        self.txn_reply(client, op, result, out);
    }

    /// A step-down (whatever its reason): the transactions in progress could not commit.
    pub(crate) fn abort_transactions(&mut self, why: &str, out: &mut Out) {
        let mut count = 0;
        for s in self.txns.sessions.values_mut() {
            if matches!(s.state, State::Open(_)) {
                s.state = State::Aborted;
                count += 1;
            }
        }
        // The writes that waited for them fail as they run again.
        for (client, w) in std::mem::take(&mut self.txns.parked_writes) {
            out.sends.push((client, Msg::WriteReply { op: w.op, result: crate::WriteResult::NotPrimary }));
        }
        self.txns.written.clear();
        if count > 0 {
            out.notes.push(Note::TxnsAborted { member: self.index, count, expired: false, why: why.to_string() });
        }
    }

    /// The reaper (server::txn `reap`): transactions older than the lifetime limit end.
    pub(crate) fn expire_transactions(&mut self, out: &mut Out) {
        let now = self.mono(out.now);
        let mut count = 0;
        for s in self.txns.sessions.values_mut() {
            if matches!(&s.state, State::Open(o) if now.saturating_sub(o.started) >= TXN_LIFETIME_MS) {
                s.state = State::Aborted;
                count += 1;
            }
        }
        if count > 0 {
            out.notes.push(Note::TxnsAborted { member: self.index, count, expired: true, why: "transactionLifetimeLimitSeconds".into() });
            self.run_parked_writes(out);
        }
    }

    /// A transaction ended: the plain writes that waited for its keys run (again parked if
    /// another still holds theirs), in the order they came.
    fn run_parked_writes(&mut self, out: &mut Out) {
        for (client, w) in std::mem::take(&mut self.txns.parked_writes) {
            self.on_write(client, w, out);
        }
    }
}

// ---- client side ----

pub struct TxnClient {
    pub lsid: u64,
    /// The current transaction's txnNumber.
    pub number: i64,
    pub op: u64,
    /// The request in flight.
    pub busy: Option<u64>,
    phase: Phase,
    next_value: u64,
}

enum Phase {
    /// Between transactions.
    Idle,
    /// `done` of the statements acknowledged.
    Statements { writes: Vec<TxnWrite>, done: usize },
    /// abortTransaction sent: the client's choice, or after a WriteConflict.
    Aborting { by_client: bool },
    /// commitTransaction sent; `attempt` counts retries, `again` a commit sent again after
    /// a majority acknowledgement.
    Committing { writes: Vec<TxnWrite>, majority: bool, attempt: u32, again: bool },
}

impl TxnClient {
    pub fn new(lsid: u64, next_value: u64) -> TxnClient {
        TxnClient { lsid, number: 0, op: 0, busy: None, phase: Phase::Idle, next_value }
    }

    fn id(&self) -> TxnId {
        TxnId { lsid: self.lsid, number: self.number }
    }
}

impl Sim {
    fn txn_endpoint(&self, t: usize) -> usize {
        self.members.len() + self.clients.len() + t
    }

    /// The next request of transaction client `t`.
    pub(crate) fn txn_client_next(&mut self, t: usize) {
        if self.txn_clients[t].busy.is_some() || self.now + SETTLE_MS >= self.opts.fault_ms + self.opts.quiet_ms {
            return;
        }
        let n = self.members.len();
        let primaries: Vec<usize> = (0..n).filter(|&i| self.members[i].up && self.members[i].state == MemberState::Primary).collect();
        let primary = (!primaries.is_empty()).then(|| primaries[self.rng.below(primaries.len() as u64) as usize]);
        if primary.is_none() && matches!(self.txn_clients[t].phase, Phase::Idle) {
            self.push(50, Event::TxnClientNext(t));
            return;
        }
        let to = primary.unwrap_or_else(|| {
            let running: Vec<usize> = (0..n).filter(|&i| self.provisioned[i]).collect();
            running[self.rng.below(running.len() as u64) as usize]
        });
        if matches!(self.txn_clients[t].phase, Phase::Idle) {
            // A new transaction: distinct keys, small documents (one entry holds them all).
            let count = self.rng.range(1, STATEMENTS_MAX + 1);
            let mut keys: Vec<u64> = (0..KEYS).collect();
            let mut writes = Vec::new();
            for _ in 0..count {
                let key = keys.swap_remove(self.rng.below(keys.len() as u64) as usize);
                let size = self.rng.range(ENTRY_SMALL_BYTES_MIN, ENTRY_SMALL_BYTES_MAX);
                let cl = &mut self.txn_clients[t];
                cl.next_value += 1;
                writes.push(TxnWrite { key, value: cl.next_value, size });
            }
            let cl = &mut self.txn_clients[t];
            cl.number += 1;
            cl.phase = Phase::Statements { writes, done: 0 };
            self.report.txns_started += 1;
        }
        let j = self.rng.chance(0.5);
        let cl = &mut self.txn_clients[t];
        let txn = cl.id();
        cl.op += 1;
        let op = cl.op;
        cl.busy = Some(op);
        let msg = match &cl.phase {
            Phase::Statements { writes, done } => Msg::TxnStatement { op, txn, start: *done == 0, write: writes[*done] },
            Phase::Aborting { .. } => Msg::TxnAbort { op, txn },
            Phase::Committing { majority, attempt, again, .. } => {
                if *attempt > 0 {
                    self.report.txn_commits_retried += 1;
                }
                // Drivers retry a commit with w:"majority".
                Msg::TxnCommit { op, txn, majority: *majority || *attempt > 0 || *again, j }
            }
            Phase::Idle => unreachable!("a transaction was just begun"),
        };
        let from = self.txn_endpoint(t);
        self.send(from, to, msg);
        self.push(CLIENT_TIMEOUT_MS, Event::TxnClientTimeout { client: t, op });
    }

    /// A request of client `t` went unanswered for CLIENT_TIMEOUT_MS.
    pub(crate) fn txn_client_timeout(&mut self, t: usize, op: u64) -> Result<(), Failure> {
        if self.txn_clients[t].busy != Some(op) {
            return Ok(());
        }
        self.txn_clients[t].busy = None;
        // As an answer that tells nothing: the transaction is given up (a commit retried).
        self.txn_answer(t, None, None)
    }

    pub(crate) fn txn_client_reply(&mut self, t: usize, from: usize, op: u64, term: i64, result: TxnResult) -> Result<(), Failure> {
        if self.txn_clients[t].busy != Some(op) {
            return Ok(());
        }
        self.txn_clients[t].busy = None;
        self.txn_answer(t, Some((from, term)), Some(result))
    }

    /// What client `t` does with the answer to its request (None: no answer in time), from
    /// member `from` in `term`.
    fn txn_answer(&mut self, t: usize, from: Option<(usize, i64)>, result: Option<TxnResult>) -> Result<(), Failure> {
        use TxnResult::{Committed, NoSuchTransaction, NotPrimary, UnknownCommitResult, WriteConflict};
        let id = self.txn_clients[t].id();
        let phase = std::mem::replace(&mut self.txn_clients[t].phase, Phase::Idle);
        // Between transactions a pause; within one, a short one.
        let mut delay = self.rng.range(TXN_PAUSE_MS.0, TXN_PAUSE_MS.1);
        let next = match (phase, result) {
            (Phase::Idle, _) => Phase::Idle,
            (Phase::Statements { writes, done }, Some(TxnResult::Ok)) if done + 1 < writes.len() => {
                delay = self.rng.range(STATEMENT_PAUSE_MS.0, STATEMENT_PAUSE_MS.1);
                Phase::Statements { writes, done: done + 1 }
            }
            (Phase::Statements { writes, .. }, Some(TxnResult::Ok)) => {
                delay = self.rng.range(STATEMENT_PAUSE_MS.0, STATEMENT_PAUSE_MS.1);
                if self.rng.chance(ABORT_CHANCE) {
                    Phase::Aborting { by_client: true }
                } else {
                    Phase::Committing { writes, majority: self.rng.chance(COMMIT_MAJORITY_CHANCE), attempt: 0, again: false }
                }
            }
            (Phase::Statements { .. }, Some(WriteConflict)) => {
                self.report.txn_write_conflicts += 1;
                delay = self.rng.range(STATEMENT_PAUSE_MS.0, STATEMENT_PAUSE_MS.1);
                Phase::Aborting { by_client: false }
            }
            // TransientTransactionError, or no answer: the transaction is given up and the
            // next begins (no commit was ever sent for it).
            (Phase::Statements { .. }, None | Some(NoSuchTransaction | NotPrimary)) => {
                self.report.txns_restarted += 1;
                self.txn_not_committed(id, false, None)?;
                Phase::Idle
            }
            (Phase::Aborting { by_client }, None | Some(TxnResult::Ok | NoSuchTransaction | NotPrimary)) => {
                if by_client {
                    self.report.txns_aborted_by_client += 1;
                }
                self.txn_not_committed(id, false, None)?;
                Phase::Idle
            }
            (Phase::Committing { writes, majority, attempt, again }, Some(Committed(at))) => {
                let (from, _) = from.expect("an answer has a sender");
                // Answered after a w:"majority" wait.
                let strong = majority || attempt > 0 || again;
                self.txn_committed(id, at, strong, &writes, from)?;
                if !again {
                    self.report.txns_committed += 1;
                    self.report.txns_committed_majority += u64::from(strong);
                }
                if attempt > 0 && self.checker.txns.logged.get(&at).is_some_and(|l| l.member != from) {
                    // A member that did not run it found it on record.
                    self.report.txn_commits_recovered += 1;
                }
                if strong && !again && self.rng.chance(COMMIT_AGAIN_CHANCE) {
                    delay = self.rng.range(1, 200);
                    Phase::Committing { writes, majority: true, attempt: 0, again: true }
                } else {
                    Phase::Idle
                }
            }
            (Phase::Committing { attempt, again, majority, .. }, Some(NoSuchTransaction)) => {
                if attempt > 0 || again {
                    self.report.txn_commits_not_found += 1;
                } else {
                    self.report.txns_restarted += 1;
                }
                self.txn_not_committed(id, true, from.map(|(_, term)| (term, majority || attempt > 0 || again)))?;
                Phase::Idle
            }
            (Phase::Committing { writes, majority, attempt, again }, None | Some(UnknownCommitResult | NotPrimary)) => {
                self.report.txn_commits_unknown += 1;
                if attempt >= COMMIT_RETRIES_MAX {
                    self.note(format!("c{}: gives up committing {id}", self.txn_endpoint(t) - self.members.len()));
                    Phase::Idle
                } else {
                    delay = self.rng.range(50, 300);
                    Phase::Committing { writes, majority, attempt: attempt + 1, again }
                }
            }
            (phase, result) => {
                let what = match phase {
                    Phase::Statements { .. } => "a statement",
                    Phase::Aborting { .. } => "an abort",
                    _ => "a commit",
                };
                return Err(self.fail(format!("{id}: {what} answered {result:?} by {from:?}")));
            }
        };
        self.txn_clients[t].phase = next;
        self.push(delay, Event::TxnClientNext(t));
        Ok(())
    }
}

// ---- checker side ----

/// A transaction's commit entry as its primary logged it.
pub struct Logged {
    pub txn: TxnId,
    pub keys: Vec<u64>,
    pub member: usize,
}

/// Why a client holds a transaction for not committed.
#[derive(Clone, Copy, Debug)]
pub struct NotCommitted {
    /// A commit was sent for it (only then may a member log it).
    pub commit_sent: bool,
    /// NoSuchTransaction answered to a commit: the answering member's term, and whether the
    /// answer waited for w:"majority".
    pub answered: Option<(i64, bool)>,
}

#[derive(Default)]
pub struct TxnChecker {
    /// Every commit entry logged, by optime.
    pub logged: BTreeMap<OpTime, Logged>,
    pub logged_at: BTreeMap<TxnId, OpTime>,
    /// The first commit acknowledgement each transaction's client got.
    committed: BTreeMap<TxnId, OpTime>,
    /// Transactions their clients hold for not committed.
    not_committed: BTreeMap<TxnId, NotCommitted>,
    /// Acknowledged committed with w:"majority".
    pub majority: BTreeSet<TxnId>,
}

impl Sim {
    /// Only a primary holds transactions in progress, each begun in its current term: a
    /// kill or a step-down ended the others.
    pub(crate) fn check_open_txns(&self, m: usize) -> Result<(), Failure> {
        let mem = &self.members[m];
        let primary = mem.state == MemberState::Primary;
        if let Some((lsid, term)) = mem.txns.open_terms().find(|&(_, t)| !primary || t != mem.term) {
            return Err(self.fail(format!("m{m}, {:?} in term {}, holds session {lsid}'s transaction in progress begun in term {term}", mem.state, mem.term)));
        }
        Ok(())
    }

    /// A primary logged `txn`'s commit entry: once only, and never after its client was
    /// told it ended, unless by a primary of a superseded term.
    pub(crate) fn on_txn_logged(&mut self, member: usize, txn: TxnId, at: OpTime, keys: Vec<u64>, term: i64) -> Result<(), Failure> {
        if let Some(first) = self.checker.txns.logged_at.get(&txn) {
            return Err(self.fail(format!("m{member} logs {txn} at {at:?}, logged before at {first:?}")));
        }
        if let Some(nc) = self.checker.txns.not_committed.get(&txn).copied() {
            let newest = self.checker.primaries.keys().next_back().copied().unwrap_or(0);
            if !nc.commit_sent || term >= newest {
                return Err(self.fail(format!("m{member}, primary in term {term}, logs {txn} after its client was told it did not commit ({nc:?})")));
            }
        }
        self.note(format!("m{member} commits {txn} at {} ({} writes)", crate::ot(at), keys.len()));
        self.checker.txns.logged_at.insert(txn, at);
        self.checker.txns.logged.insert(at, Logged { txn, keys, member });
        Ok(())
    }

    /// An entry joins the committed history: never one of a transaction its client was told
    /// did not commit.
    pub(crate) fn check_committed_txn(&self, at: OpTime) -> Result<(), Failure> {
        let Some(l) = self.checker.txns.logged.get(&at) else { return Ok(()) };
        match self.checker.txns.not_committed.get(&l.txn) {
            Some(nc) => Err(self.fail(format!("{}, whose client was told it did not commit ({nc:?}), is committed at {at:?}", l.txn))),
            None => Ok(()),
        }
    }

    /// The client holds `txn` for not committed (`answered`: NoSuchTransaction to a
    /// commit, with the answering member's term and whether it waited for w:"majority").
    fn txn_not_committed(&mut self, txn: TxnId, commit_sent: bool, answered: Option<(i64, bool)>) -> Result<(), Failure> {
        let nc = NotCommitted { commit_sent, answered };
        if let Some(first) = self.checker.txns.committed.get(&txn).copied() {
            if self.checker.txns.majority.contains(&txn) {
                return Err(self.fail(format!("{txn}: a commit answered NoSuchTransaction ({nc:?}) after it was acknowledged committed at {first:?}")));
            }
            // A w:1 commit may be rolled back; the record then says none.
            return Ok(());
        }
        if let Some(at) = self.checker.txns.logged_at.get(&txn).copied() {
            if self.checker.committed_set.contains(&at) {
                return Err(self.fail(format!("{txn}: told it did not commit ({nc:?}), yet committed at {at:?}")));
            }
        }
        self.checker.txns.not_committed.insert(txn, nc);
        Ok(())
    }

    /// The client was told `txn` committed at `at` (`strong`: after a w:"majority" wait):
    /// the entry is `txn`'s with every write the client made, and no answer contradicts
    /// another.
    fn txn_committed(&mut self, txn: TxnId, at: OpTime, strong: bool, writes: &[TxnWrite], from: usize) -> Result<(), Failure> {
        let Some(l) = self.checker.txns.logged.get(&at) else {
            return Err(self.fail(format!("m{from} answers {txn} committed at {at:?}, where no commit was logged")));
        };
        let keys: Vec<u64> = writes.iter().map(|w| w.key).collect();
        if l.txn != txn || l.keys != keys {
            return Err(
                self.fail(format!("m{from} answers {txn} committed at {at:?}, the entry of {} with keys {:?} (the client wrote {keys:?})", l.txn, l.keys))
            );
        }
        if let Some(nc) = self.checker.txns.not_committed.get(&txn) {
            return Err(self.fail(format!("m{from} answers {txn} committed at {at:?}; an earlier answer said it did not ({nc:?})")));
        }
        if let Some(first) = self.checker.txns.committed.insert(txn, at) {
            if first != at {
                return Err(self.fail(format!("{txn} answered committed at {at:?}, and before at {first:?}")));
            }
        }
        if strong {
            self.checker.txns.majority.insert(txn);
        }
        Ok(())
    }

    /// A majority read saw every key at one point: a transaction's writes all or none.
    pub(crate) fn check_read_atomic(&self, c: usize, from: usize, values: &Values) -> Result<(), Failure> {
        for (k, v) in values.iter().enumerate() {
            let Some((at, _)) = v else { continue };
            let Some(l) = self.checker.txns.logged.get(at) else { continue };
            for &other in &l.keys {
                let seen = values.get(other as usize).copied().flatten().map(|(a, _)| a);
                if seen.is_none_or(|a| a < *at) {
                    return Err(self.fail(format!(
                        "c{c}'s read from m{from} saw {}'s write to key {k} at {at:?} but key {other} at {seen:?}: part of a transaction",
                        l.txn
                    )));
                }
            }
        }
        Ok(())
    }

    /// Atomicity of member `m`'s data: each transaction's writes all there or none.
    pub(crate) fn check_data_atomic(&self, m: usize) -> Result<(), Failure> {
        let docs = member::data_docs(&self.members[m].store, None, usize::MAX);
        self.check_docs_atomic(m, &docs)
    }

    pub(crate) fn check_docs_atomic(&self, m: usize, docs: &[DataDoc]) -> Result<(), Failure> {
        let mut i = 0;
        while i < docs.len() {
            let at = docs[i].at;
            let n = docs[i..].iter().take_while(|d| d.at == at).count();
            if let Some(txn) = docs[i].txn {
                let want = self.checker.txns.logged.get(&at).filter(|l| l.txn == txn).map(|l| l.keys.len());
                if want != Some(n) || docs[i].of as usize != n {
                    return Err(self.fail(format!("m{m}'s data holds {n} writes of {txn}'s commit at {at:?}, which made {want:?}: part of a transaction")));
                }
            }
            i += n;
        }
        Ok(())
    }

    /// After healing: no member holds a transaction its client was told did not commit,
    /// and its data (`docs`, where it is more than its oplog's entries) is atomic.
    pub(crate) fn final_txn_checks(&self, m: usize, docs: Option<&[DataDoc]>) -> Result<(), Failure> {
        let store = &self.members[m].store;
        if let Some(docs) = docs {
            self.check_docs_atomic(m, docs)?;
        }
        let copied = member::has_copied_data(store).then(|| member::copied_docs(store));
        for (txn, nc) in &self.checker.txns.not_committed {
            let Some(&at) = self.checker.txns.logged_at.get(txn) else { continue };
            if member::holds_entry(store, at) || copied.as_ref().is_some_and(|c| c.iter().any(|d| d.at == at)) {
                return Err(self.fail(format!("m{m} holds {txn} (at {at:?}), whose client was told it did not commit ({nc:?})")));
            }
        }
        Ok(())
    }
}
