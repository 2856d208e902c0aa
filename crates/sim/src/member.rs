//! One simulated replica-set member: the event-driven twin of the server's coordinator
//! (`replication`: `member.rs` heartbeats, elections and votes; `fetcher.rs` oplog
//! fetching, rollback and progress reports; `mod.rs` terms, commit point and write concern).
//! Every decision is made by the `repl` crate's functions, the same ones the server calls,
//! and the oplog, the last vote and minValid live in a real `storage::Store` over a
//! crashable in-memory engine. What is simulated is only what the server does with tokio:
//! connections become messages, tasks become timers.
//!
//! Beyond those: initial sync (`initial_sync.rs`: an empty member copies its source's data
//! in batches, then tails the oplog from where the copy began), entry sizes up to the
//! largest an oplog entry can have (the cursor's batch rule, `cursor.rs`), and configs
//! installed by replSetReconfig and spread by heartbeats (`member.rs` `adopt_config`,
//! `mod.rs` `install_config`). Multi-document transactions are `txn.rs`'s.

use crate::txn::{self, TxnId};
use crate::{Cursor, Msg, Note, Out, Position, Timer, WriteResult};
use bson::{doc, Bson, Document};
use repl::election::VoteRequest;
use repl::progress::WMode;
use repl::sync_source::{Mismatch, PeerView};
use repl::{MemberState, ReplSetConfig};
use std::sync::Arc;
use storage::engine::memory::MemoryEngine;
use storage::{OpTime, Store};

/// The server's values (member.rs, fetcher.rs), in simulated milliseconds.
pub const TICK_MS: u64 = 50;
pub const VOTE_TIMEOUT_MS: u64 = 5_000;
pub const FETCH_RETRY_MS: u64 = 200;
pub const NO_SOURCE_RETRY_MS: u64 = 100;
pub const AWAIT_DATA_MS: u64 = 1_000;
/// fetcher.rs: CONNECT_TIMEOUT for a command, plus REPLY_SLACK for a find or a getMore.
pub const COMMAND_TIMEOUT_MS: u64 = 10_000;
pub const REPLY_SLACK_MS: u64 = 10_000;
pub const TOO_STALE_DENY_MS: u64 = 60_000;
pub const CATCH_UP_POLL_MS: u64 = 10;
/// The journal flusher's longest wait (the server's flusher wakes on request; w:1 writes
/// without j ask for nothing, and are synced by the next request or this).
pub const JOURNAL_FLUSH_MS: u64 = 100;
/// initial_sync.rs's rollback id check: a sync whose source rolled back during the clone
/// (its rollback id changed, as mongod checks) copies again, since the clone may hold
/// writes the set took back that no entry from begin on would undo. False shows why it is
/// there (the server before it).
pub const INITIAL_SYNC_CHECKS_ROLLBACK: bool = true;
/// Entries per fetched batch: small, so that batches interleave with faults.
pub const FETCH_BATCH_ENTRIES: usize = 20;
/// Documents per clone batch: small, so that a clone takes several messages and faults
/// and writes interleave with it (the server asks for 5000).
pub const CLONE_BATCH_DOCS: usize = 40;
/// cursor.rs: a batch stops before passing this many bytes, and holds at least one document
/// whatever its size.
pub const BATCH_SIZE_BYTES_MAX: u64 = 16 * 1024 * 1024 - 64 * 1024;
/// mongod's BSONObjMaxInternalSize: the largest reply a member accepts; a larger one is
/// refused and the fetch fails.
pub const REPLY_SIZE_MAX_BYTES: u64 = (common::limits::BSON_OBJECT_SIZE_MAX_BYTES + common::limits::BSON_USER_OBJECT_SLACK_BYTES) as u64;
/// An oplog entry's fields around the document it carries (ts, t, wall, op, ns, ...).
pub const ENTRY_ENVELOPE_BYTES: u64 = 1024;
/// The largest entry: a largest document, with its envelope.
pub const ENTRY_SIZE_MAX_BYTES: u64 = common::limits::BSON_OBJECT_SIZE_MAX_BYTES as u64 + ENTRY_ENVELOPE_BYTES;
/// A cursor reply's fields around its batch (cursor id, ns, $replData, ok, ...).
pub const REPLY_ENVELOPE_BYTES: u64 = 1024;
/// Entries at least this large count as large in the report.
pub const ENTRY_LARGE_BYTES: u64 = 1024 * 1024;
const _: () = assert!(ENTRY_SIZE_MAX_BYTES + REPLY_ENVELOPE_BYTES <= REPLY_SIZE_MAX_BYTES, "a batch of one largest entry must fit in a reply");
const _: () = assert!(2 * ENTRY_LARGE_BYTES <= BATCH_SIZE_BYTES_MAX);
pub const ROLLBACK_CHUNK: usize = 1000;
const OPLOG_CAP_BYTES: u64 = 64 << 20;
const LOCAL: &str = "local";
/// The size of a no-op entry ("new primary").
const NOOP_ENTRY_BYTES: u64 = 120;
const ELECTION: &str = "replset.election";
const MIN_VALID: &str = "replset.minvalid";
/// mongod's initialSyncFlag: set durably before an initial sync drops anything, cleared
/// once its oplog is seeded (set again when the sync starts over).
const INITIAL_SYNC_FLAG: &str = "replset.initialSyncFlag";
/// The data an initial sync copied: one document per write, `{_id: {ts, i}, ts, t, k, v,
/// size, i, of}` and a transaction's `lsid` and `txnNumber` (the rest of a member's data is
/// its oplog's writes, the workload being inserts only).
const DATA_DB: &str = "sim";
const DATA_COLLECTION: &str = "data";
/// The registers the clients write: each write sets one key's value (the newest write to a
/// key is its value).
pub const KEYS: u64 = 6;
pub const REGISTERS_NS: &str = "sim.registers";
/// Wall clocks start here (2026-12-01), so timestamps look like real ones.
const EPOCH_WALL_MS: i64 = 1_796_083_200_000;

#[derive(Clone, Debug, Default)]
pub struct Peer {
    pub view: PeerView,
    pub durable: OpTime,
    /// Monotonic time of its last heartbeat answer.
    pub last_response: Option<u64>,
    pub denied_until: u64,
    /// The heartbeat in flight: its sequence number and when it was sent (monotonic).
    pub heartbeat: Option<(u64, u64)>,
}

#[derive(Debug)]
pub struct Election {
    pub id: u64,
    pub term: i64,
    pub dry_run: bool,
    pub votes: usize,
    pub answers: usize,
    pub last: OpTime,
}

/// Where an initial sync is (`initial_sync.rs` `attempt`).
#[derive(Debug, Clone, Copy)]
pub enum SyncPhase {
    /// Asking the source for its newest entry: `begin`.
    Begin,
    /// Copying the source's data, `after` its document at this place (`DataDoc::pos`); the
    /// source's rollback id when the sync began.
    Cloning { begin: OpTime, after: Option<(u64, u32)>, rollback_id: u64 },
    /// Asking the source for its newest entry again: `minValid`.
    MinValid { begin: OpTime, rollback_id: u64 },
}

#[derive(Debug, Clone, Copy)]
pub enum Fetch {
    /// Choose a source at or after this monotonic time.
    Idle {
        at: u64,
    },
    /// An initial sync from `src`, its request `req` in flight.
    Syncing {
        src: usize,
        req: u64,
        phase: SyncPhase,
    },
    /// A find (`from` our newest entry) or getMore (`after` the cursor's last entry) in flight.
    Find {
        src: usize,
        req: u64,
        forced: bool,
    },
    Tail {
        src: usize,
        req: u64,
        forced: bool,
        cursor: Cursor,
    },
    /// Looking for the common point with `src`, among our entries older than `upper`.
    RollingBack {
        src: usize,
        req: u64,
        upper: Option<u64>,
        /// The source's oldest entry: no common point is found past it.
        source_oldest: Option<OpTime>,
    },
}

/// A w:"majority" wait for `at`, and what it answers once met.
pub struct PendingWrite {
    pub client: usize,
    pub op: u64,
    pub at: OpTime,
    pub answer: Answer,
}

pub enum Answer {
    /// A write: acknowledged at `at`.
    Write,
    /// A transaction's commit (or its retry): this result once the wait is met,
    /// UnknownTransactionCommitResult if the member steps down first.
    Txn(txn::TxnResult),
}

/// Every key's newest value as a read saw it: (the write's optime, the value).
pub type Values = Vec<Option<(OpTime, u64)>>;

/// A majority read waiting for the commit point to reach what it read.
pub struct ParkedRead {
    pub client: usize,
    pub op: u64,
    pub values: Values,
    pub until: u64,
}

/// How long a majority read waits for the commit point (the clients give up sooner).
pub const READ_WAIT_MS: u64 = 5_000;

pub struct ParkedGetMore {
    pub from: usize,
    pub req: u64,
    pub cursor: Cursor,
    pub after: OpTime,
    pub until: u64,
}

pub struct Member {
    pub index: usize,
    pub config: Arc<ReplSetConfig>,
    pub engine: MemoryEngine,
    pub store: Store,
    pub up: bool,
    pub incarnation: u64,
    /// SIGSTOP: nothing runs here before this global time.
    pub paused_until: u64,
    /// Wall clock offset (jumps) and monotonic drift, parts per million.
    pub wall_offset_ms: i64,
    pub drift_ppm: i64,
    pub term: i64,
    pub last_vote_term: Option<i64>,
    pub state: MemberState,
    pub commit_point: OpTime,
    pub peers: Vec<Peer>,
    pub primary_seen: u64,
    pub election_timeout_ms: u64,
    pub election_running: bool,
    pub election: Option<Election>,
    /// Since when this member has qualified for a priority takeover (monotonic).
    pub takeover_since: Option<u64>,
    /// Wall time of this member's election (the server's `election_date`).
    pub elected_wall_ms: i64,
    pub sync_source: Option<usize>,
    pub sync_from: Option<usize>,
    pub fetch: Fetch,
    /// Primary catch-up after winning: (source, target, term, started).
    pub catch_up: Option<(usize, OpTime, i64)>,
    pub min_valid: Option<OpTime>,
    pub pending: Vec<PendingWrite>,
    /// Transactions in progress and sessions' outcomes, in memory only (`txn.rs`).
    pub txns: txn::Sessions,
    pub parked: Vec<ParkedGetMore>,
    pub parked_reads: Vec<ParkedRead>,
    pub flush_requested: bool,
    /// Positions last reported upstream (own and others'), to report only changes.
    pub reported: Vec<(OpTime, OpTime)>,
    pub next_id: u64,
    /// Rollback truncations of the oplog in this process (`Collection::truncations`).
    pub truncations: u64,
    /// Moves at every config installed: heartbeat timers of an older one stop (the
    /// server's heartbeat loops of an older epoch).
    pub config_epoch: u64,
    /// The begin entry of the initial sync under way (it seeds the oplog).
    pub sync_begin: Option<(OpTime, Vec<u8>)>,
    /// While an initial sync applies the oplog up to its minValid: (begin, minValid).
    pub sync_min_valid: Option<(OpTime, OpTime)>,
    /// Rollbacks this member has done, across restarts (mongod's RBID, kept durably in
    /// local.system.rollback.id).
    pub rollback_id: u64,
}

/// A member's host in configs: its slot fixes its position (configs add members at the end
/// and remove the last, so a member's index is its position in every config it is in).
pub fn host(index: usize) -> String {
    format!("m{index}:27017")
}

fn vote_doc(term: i64, candidate: usize) -> Document {
    doc! {"_id": "lastVote", "term": term, "candidateIndex": candidate as i32}
}

/// Replace the one document of `local.<coll>` and make it durable (the server's
/// `put_single_doc`).
fn put_single_doc(store: &Store, coll: &str, d: &Document) {
    let c = store.collection_or_create(LOCAL, coll).expect("local collection");
    {
        let mut w = c.writer();
        for (rid, old) in w.snapshot().scan(None, usize::MAX).expect("scan") {
            w.delete(rid, &old).expect("delete");
        }
        w.insert(d).expect("insert");
    }
    store.commit_durable().expect("sync");
}

fn first_doc(store: &Store, coll: &str) -> Option<Document> {
    store.collection(LOCAL, coll).and_then(|c| c.snapshot().scan(None, 1).expect("scan").into_iter().next().map(|(_, d)| d))
}

/// An oplog entry of the simulated workload: an insert of `(key, value)` (a key's newest
/// value is its newest insert), or a no-op (initiation, a new primary). `size_bytes` is the
/// size the entry stands for: the sim carries the number, not the bytes.
pub fn entry(at: OpTime, wall_ms: i64, write: Option<(u64, u64)>, size_bytes: u64) -> Vec<u8> {
    assert!(size_bytes <= ENTRY_SIZE_MAX_BYTES, "entry of {size_bytes} bytes");
    let mut d = doc! {"ts": at.timestamp(), "t": at.term, "wall": bson::DateTime::from_millis(wall_ms), "size": size_bytes as i64};
    match write {
        Some((key, v)) => {
            d.insert("op", "i");
            d.insert("ns", REGISTERS_NS);
            d.insert("o", doc! {"_id": key as i64, "v": v as i64});
        }
        None => {
            d.insert("op", "n");
            d.insert("ns", "");
            d.insert("o", doc! {"msg": "new primary"});
        }
    }
    d.to_vec().expect("entry")
}

/// The writes an entry made, in order: (key, value, size), one for an insert, a
/// transaction's several for its `applyOps` (none for a no-op).
pub fn entry_writes(d: &Document, mut f: impl FnMut(u64, u64, u64)) {
    let write = |o: &Document| Some((o.get_i64("_id").ok()? as u64, o.get_i64("v").ok()? as u64));
    match d.get_str("op") {
        Ok("i") => {
            if let Some((k, v)) = d.get_document("o").ok().and_then(write) {
                f(k, v, d.get_i64("size").unwrap_or(0) as u64);
            }
        }
        Ok("c") => {
            let ops = d.get_document("o").ok().and_then(|o| o.get_array("applyOps").ok());
            for op in ops.into_iter().flatten() {
                let Bson::Document(op) = op else { continue };
                if let Some((k, v)) = op.get_document("o").ok().and_then(write) {
                    f(k, v, op.get_i64("size").unwrap_or(0) as u64);
                }
            }
        }
        _ => {}
    }
}

/// The data documents an oplog entry's writes make.
pub fn entry_docs(d: &Document) -> Vec<DataDoc> {
    let Some(at) = OpTime::from_doc(d) else { return Vec::new() };
    let txn = txn::entry_txn(d);
    let mut docs = Vec::new();
    entry_writes(d, |key, value, size| docs.push(DataDoc { at, idx: docs.len() as u32, of: 0, key, value, size, txn }));
    let of = docs.len() as u32;
    for doc in &mut docs {
        doc.of = of;
    }
    docs
}

/// The size an entry stands for.
pub fn entry_size(bytes: &[u8]) -> u64 {
    bson::RawDocument::from_bytes(bytes).ok().and_then(|d| d.get_i64("size").ok()).map_or(0, |s| s as u64)
}

/// cursor.rs's batch rule over items of `size(item)` bytes: at least one item, and no more
/// once the next would pass BATCH_SIZE_BYTES_MAX.
pub fn cut_batch<T>(items: Vec<T>, size: impl Fn(&T) -> u64) -> Vec<T> {
    let mut total = 0;
    let mut out = Vec::new();
    for item in items {
        let s = size(&item);
        if !out.is_empty() && total + s > BATCH_SIZE_BYTES_MAX {
            break;
        }
        total += s;
        out.push(item);
    }
    out
}

/// One write as a clone copies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataDoc {
    /// The entry that wrote it.
    pub at: OpTime,
    /// Its place among that entry's writes, and how many the entry made (several for a
    /// transaction's).
    pub idx: u32,
    pub of: u32,
    pub key: u64,
    pub value: u64,
    pub size: u64,
    /// The transaction that wrote it: the session's record travels with the data (mongod
    /// clones `config.transactions`).
    pub txn: Option<TxnId>,
}

impl DataDoc {
    /// Its place in the data: clone cursors move by it.
    pub fn pos(&self) -> (u64, u32) {
        (self.at.ts, self.idx)
    }

    fn to_doc(&self) -> Document {
        let mut d = doc! {"_id": {"ts": self.at.ts as i64, "i": self.idx as i64}, "k": self.key as i64, "v": self.value as i64, "size": self.size as i64, "i": self.idx as i64, "of": self.of as i64};
        d.extend(self.at.to_doc());
        if let Some(t) = self.txn {
            d.insert("lsid", txn::lsid_doc(t.lsid));
            d.insert("txnNumber", t.number);
        }
        d
    }

    fn from_doc(d: &Document) -> Option<DataDoc> {
        let n = |k: &str| d.get_i64(k).ok().map(|v| v as u64);
        Some(DataDoc {
            at: OpTime::from_doc(d)?,
            idx: n("i")? as u32,
            of: n("of")? as u32,
            key: n("k")?,
            value: n("v")?,
            size: n("size")?,
            txn: txn::entry_txn(d),
        })
    }
}

impl Member {
    /// A member with `genesis` in its oplog; an empty `genesis` makes an empty member, which
    /// initial-syncs.
    pub fn new(index: usize, config: Arc<ReplSetConfig>, genesis: &[(OpTime, Vec<u8>)], drift_ppm: i64) -> Member {
        let engine = MemoryEngine::crashable();
        let store = Store::open_with_engine(Arc::new(engine.clone())).expect("open");
        store.enable_oplog(OPLOG_CAP_BYTES).expect("oplog");
        if !genesis.is_empty() {
            store.append_oplog_replicated(genesis).expect("genesis");
        }
        store.commit_durable().expect("sync");
        let n = config.members.len();
        let m = Member {
            index,
            config,
            engine,
            store,
            up: true,
            incarnation: 0,
            paused_until: 0,
            wall_offset_ms: 0,
            drift_ppm,
            term: genesis.last().map_or(0, |(at, _)| at.term),
            last_vote_term: None,
            state: MemberState::Secondary,
            commit_point: OpTime::default(),
            peers: vec![Peer::default(); n],
            primary_seen: 0,
            election_timeout_ms: 0,
            election_running: false,
            election: None,
            takeover_since: None,
            elected_wall_ms: 0,
            sync_source: None,
            sync_from: None,
            fetch: Fetch::Idle { at: 0 },
            catch_up: None,
            min_valid: None,
            pending: Vec::new(),
            txns: txn::Sessions::default(),
            parked: Vec::new(),
            parked_reads: Vec::new(),
            flush_requested: false,
            reported: vec![(OpTime::default(), OpTime::default()); n],
            next_id: 1,
            truncations: 0,
            config_epoch: 0,
            sync_begin: None,
            rollback_id: 0,
            sync_min_valid: None,
        };
        m.store.set_oplog_term(m.term);
        m
    }

    pub fn mono(&self, now: u64) -> u64 {
        (now as i64 + now as i64 * self.drift_ppm / 1_000_000) as u64
    }

    pub fn wall_ms(&self, now: u64) -> i64 {
        EPOCH_WALL_MS + now as i64 + self.wall_offset_ms
    }

    /// A delay on this member's clock, in global milliseconds.
    fn global_delay(&self, local_ms: u64) -> u64 {
        (local_ms as i64 * 1_000_000 / (1_000_000 + self.drift_ppm)).max(0) as u64
    }

    fn timer(&self, out: &mut Out, local_ms: u64, t: Timer) {
        let d = self.global_delay(local_ms);
        out.timers.push((d, self.index, self.incarnation, t));
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub fn last(&self) -> OpTime {
        self.store.oplog_last().unwrap_or_default()
    }

    pub fn durable(&self) -> OpTime {
        self.store.oplog_durable().unwrap_or_default()
    }

    fn randomized_timeout(&self, out: &mut Out) -> u64 {
        repl::election::randomized_timeout_ms(self.config.settings.election_timeout_ms, out.rng.unit())
    }

    fn heartbeat_timeout_ms(&self) -> u64 {
        let s = &self.config.settings;
        (s.heartbeat_timeout_secs * 1000).min(s.election_timeout_ms).max(100) as u64
    }

    /// Start (or restart after a crash): the server's `ReplCoord::start` and `spawn_tasks`.
    pub fn start(&mut self, out: &mut Out) {
        let now = self.mono(out.now);
        let last = self.last();
        let vote = first_doc(&self.store, ELECTION);
        let vote_term = vote.as_ref().and_then(|v| v.get_i64("term").ok());
        self.term = last.term.max(vote_term.unwrap_or(0));
        self.last_vote_term = vote_term;
        self.store.set_oplog_term(self.term);
        self.state = MemberState::Secondary;
        self.min_valid = first_doc(&self.store, MIN_VALID).as_ref().and_then(OpTime::from_doc).filter(|mv| last < *mv);
        if self.min_valid.is_some() {
            self.state = MemberState::Recovering;
        }
        // mod.rs `install_config`: a member that must initial-sync has no data to serve.
        if self.initial_sync_reason().is_some() {
            self.state = MemberState::Startup2;
            self.min_valid = None;
        }
        self.sync_begin = None;
        self.sync_min_valid = None;
        self.commit_point = OpTime::default();
        self.peers = vec![Peer::default(); self.config.members.len()];
        self.primary_seen = now;
        self.election_timeout_ms = self.randomized_timeout(out);
        self.election_running = false;
        self.election = None;
        self.takeover_since = None;
        self.sync_source = None;
        self.sync_from = None;
        self.fetch = Fetch::Idle { at: now };
        self.catch_up = None;
        self.pending.clear();
        self.txns = txn::Sessions::default();
        self.parked.clear();
        self.parked_reads.clear();
        self.flush_requested = false;
        self.truncations = 0;
        self.reported = vec![(OpTime::default(), OpTime::default()); self.config.members.len()];
        self.start_heartbeats(out);
        let first_tick = out.rng.below(TICK_MS);
        self.timer(out, first_tick, Timer::Tick);
        self.timer(out, JOURNAL_FLUSH_MS, Timer::JournalFlush);
    }

    /// One heartbeat loop per other member of the config, of a new epoch.
    fn start_heartbeats(&mut self, out: &mut Out) {
        self.config_epoch += 1;
        for i in 0..self.config.members.len() {
            if i != self.index {
                let first = out.rng.below(self.config.settings.heartbeat_interval_ms as u64);
                self.timer(out, first, Timer::Heartbeat(i, self.config_epoch));
            }
        }
    }

    /// Whether this member is in its config (a removed one is REMOVED once it hears so).
    fn in_config(&self) -> bool {
        self.config.members.get(self.index).is_some_and(|m| m.host == host(self.index))
    }

    /// mod.rs `initial_sync_reason`: the flag of a sync that did not finish, or an empty
    /// oplog.
    pub fn initial_sync_reason(&self) -> Option<&'static str> {
        if self.sync_min_valid.is_some() {
            // Seeded by this incarnation: it catches up from the copy's begin.
            None
        } else if first_doc(&self.store, INITIAL_SYNC_FLAG).is_some() {
            Some("an initial sync did not finish")
        } else if self.last() == OpTime::default() {
            Some("this member's oplog is empty")
        } else {
            None
        }
    }

    /// kill -9: what was not synced is gone; the process state with it (its transactions in
    /// progress too).
    pub fn crash(&mut self) {
        self.up = false;
        self.parked.clear();
        self.txns = txn::Sessions::default();
        self.incarnation += 1;
        self.engine = self.engine.crash_image();
        self.store = Store::open_with_engine(Arc::new(self.engine.clone())).expect("reopen after crash");
        self.store.enable_oplog(OPLOG_CAP_BYTES).expect("oplog after crash");
    }

    // ---- terms and roles (mod.rs) ----

    fn observe_term(&mut self, term: i64, out: &mut Out) {
        if term <= self.term {
            return;
        }
        self.term = term;
        if self.state == MemberState::Primary {
            self.step_down(out, "a member is in a higher term");
        }
    }

    fn step_down(&mut self, out: &mut Out, why: &str) {
        if self.state != MemberState::Primary {
            return;
        }
        self.state = MemberState::Secondary;
        self.primary_seen = self.mono(out.now);
        out.notes.push(Note::Trace(format!("m{} steps down in term {}: {why}", self.index, self.term)));
        // Its transactions in progress could not commit: aborted, whatever the reason.
        self.abort_transactions(why, out);
        self.check_pending(out);
    }

    fn become_primary(&mut self, term: i64, out: &mut Out) {
        self.store.set_oplog_term(term);
        let at = self.next_optime(out.now, term);
        let bytes = entry(at, self.wall_ms(out.now), None, NOOP_ENTRY_BYTES);
        // mod.rs `become_primary`: the config is now of this term (heartbeats spread it).
        Arc::make_mut(&mut self.config).term = Some(term);
        self.store.append_oplog_replicated(&[(at, bytes)]).expect("new primary entry");
        self.store.commit_durable().expect("sync");
        self.term = term;
        self.state = MemberState::Primary;
        self.txns.written.clear();
        self.elected_wall_ms = self.wall_ms(out.now);
        self.sync_source = None;
        self.fetch = Fetch::Idle { at: 0 };
        for (i, p) in self.peers.iter_mut().enumerate() {
            if i != self.index && p.view.state == Some(MemberState::Primary) {
                p.view.state = Some(MemberState::Secondary);
            }
        }
        out.notes.push(Note::BecamePrimary { member: self.index, term });
        self.serve_parked(out);
    }

    /// The next optime a primary stamps: its wall clock's second, after the newest entry.
    pub(crate) fn next_optime(&self, now: u64, term: i64) -> OpTime {
        let secs = (self.wall_ms(now) / 1000).max(0) as u64;
        let ts = (self.last().ts + 1).max(secs << 32);
        OpTime { ts, term }
    }

    fn advance_commit_point(&mut self) {
        if self.state != MemberState::Primary {
            return;
        }
        let own = self.durable();
        let me = self.index;
        let peers = &self.peers;
        self.commit_point = repl::progress::advance_commit_point(&self.config, self.commit_point, self.term, |i| if i == me { own } else { peers[i].durable });
    }

    fn reported_commit_point(&self) -> OpTime {
        if self.state == MemberState::Primary && self.config.write_majority_count() <= 1 {
            self.commit_point.max(self.durable())
        } else {
            self.commit_point
        }
    }

    /// w:"majority" waiters (the server's `write_status` with durable optimes).
    fn check_pending(&mut self, out: &mut Out) {
        let own = self.durable();
        let me = self.index;
        let mut keep = Vec::new();
        for w in std::mem::take(&mut self.pending) {
            if self.state != MemberState::Primary || self.term != w.at.term {
                let reply = match w.answer {
                    Answer::Write => Msg::WriteReply { op: w.op, result: WriteResult::SteppedDown },
                    Answer::Txn(_) => Msg::TxnReply { op: w.op, term: self.term, result: txn::TxnResult::UnknownCommitResult },
                };
                out.sends.push((w.client, reply));
                continue;
            }
            let peers = &self.peers;
            let met = repl::progress::write_concern_met(&self.config, &WMode::Majority, w.at, |i| if i == me { own } else { peers[i].durable });
            if met == Ok(true) {
                let reply = match w.answer {
                    Answer::Write => {
                        out.notes.push(Note::AckedMajority { member: me, at: w.at, term: w.at.term });
                        Msg::WriteReply { op: w.op, result: WriteResult::Ok(w.at) }
                    }
                    Answer::Txn(result) => {
                        // The commit's entry is at or before the entry waited for, which is of
                        // this primary's term.
                        if let txn::TxnResult::Committed(at) = result {
                            out.notes.push(Note::AckedMajority { member: me, at, term: w.at.term });
                        }
                        Msg::TxnReply { op: w.op, term: self.term, result }
                    }
                };
                out.sends.push((w.client, reply));
            } else {
                keep.push(w);
            }
        }
        self.pending = keep;
    }

    fn learn_commit_point(&mut self, cp: OpTime, from_sync_source: bool) {
        if self.state == MemberState::Primary {
            return;
        }
        self.commit_point = repl::progress::learn_commit_point(self.commit_point, cp, self.last(), from_sync_source);
    }

    // ---- events ----

    pub fn on_timer(&mut self, t: Timer, out: &mut Out) {
        match t {
            Timer::Heartbeat(i, epoch) => {
                if epoch == self.config_epoch {
                    self.send_heartbeat(i, out);
                }
            }
            Timer::HeartbeatTimeout(i, seq) => {
                if self.peers.get(i).is_some_and(|p| p.heartbeat.is_some_and(|(s, _)| s == seq)) {
                    let sent = self.peers[i].heartbeat.take().map_or(0, |(_, at)| at);
                    let p = &mut self.peers[i];
                    p.view.up = false;
                    self.schedule_next_heartbeat(i, sent, out);
                }
            }
            Timer::Tick => {
                self.tick(out);
                self.timer(out, TICK_MS, Timer::Tick);
            }
            Timer::CatchUp => {
                self.catch_up_step(out);
                if self.catch_up.is_some() {
                    self.timer(out, CATCH_UP_POLL_MS, Timer::CatchUp);
                }
            }
            Timer::JournalFlush => {
                self.journal_flush(out);
                self.timer(out, JOURNAL_FLUSH_MS, Timer::JournalFlush);
            }
            Timer::FlushRequested => {
                self.flush_requested = false;
                self.journal_flush(out);
            }
            Timer::ElectionTimeout(id) => {
                if self.election.as_ref().is_some_and(|e| e.id == id) {
                    self.election_failed(out, "vote requests timed out");
                }
            }
            Timer::FetchTimeout(req) => {
                let pending = match self.fetch {
                    Fetch::Find { req: r, .. } | Fetch::Tail { req: r, .. } | Fetch::RollingBack { req: r, .. } | Fetch::Syncing { req: r, .. } => r == req,
                    Fetch::Idle { .. } => false,
                };
                if pending {
                    if self.state == MemberState::Rollback {
                        self.rollback_failed();
                    }
                    self.fetch_failed(out, "the source did not answer in time".into());
                }
            }
            Timer::AwaitData => {
                let now = self.mono(out.now);
                let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.parked).into_iter().partition(|p| p.until <= now);
                self.parked = keep;
                for p in due {
                    let reply = self.batch_after(p.cursor, p.after, p.req);
                    out.sends.push((p.from, reply));
                }
                // The clock's drift rounds timer delays: wake again for any still waiting.
                if let Some(next) = self.parked.iter().map(|p| p.until).min() {
                    self.timer(out, next.saturating_sub(now) + 1, Timer::AwaitData);
                }
            }
        }
    }

    fn journal_flush(&mut self, out: &mut Out) {
        self.store.commit_durable().expect("sync");
        if self.state == MemberState::Primary {
            self.advance_commit_point();
            self.check_pending(out);
        }
    }

    fn send_heartbeat(&mut self, i: usize, out: &mut Out) {
        let now = self.mono(out.now);
        let seq = self.id();
        self.peers[i].heartbeat = Some((seq, now));
        out.sends.push((i, Msg::HeartbeatRequest { seq, term: self.term, config_version: self.config.version, config_term: self.config.term.unwrap_or(0) }));
        self.timer(out, self.heartbeat_timeout_ms(), Timer::HeartbeatTimeout(i, seq));
    }

    fn schedule_next_heartbeat(&mut self, i: usize, sent: u64, out: &mut Out) {
        let now = self.mono(out.now);
        let interval = self.config.settings.heartbeat_interval_ms.max(1) as u64;
        self.timer(out, (sent + interval).saturating_sub(now), Timer::Heartbeat(i, self.config_epoch));
    }

    /// The server's `tick_loop`: commit point, step-down, elections; plus the fetcher's
    /// and catch-up's polling.
    fn tick(&mut self, out: &mut Out) {
        let now = self.mono(out.now);
        let et = self.config.settings.election_timeout_ms.max(1) as u64;
        let responsive = |p: &Peer| p.view.up && p.last_response.is_some_and(|t| now.saturating_sub(t) < et);
        match self.state {
            MemberState::Primary => {
                self.advance_commit_point();
                self.check_pending(out);
                self.expire_transactions(out);
                let primary_for_ms = (self.wall_ms(out.now) - self.elected_wall_ms).max(0) as u64;
                if repl::election::lost_majority(&self.config, self.index, |i| responsive(&self.peers[i]), primary_for_ms, et) {
                    self.step_down(out, "can no longer see a majority of the set");
                }
            }
            MemberState::Secondary => {
                let me = self.index;
                let primary = (0..self.peers.len()).find(|&i| i != me && responsive(&self.peers[i]) && self.peers[i].view.state == Some(MemberState::Primary));
                let electable = self.config.members[me].is_electable() && self.config.members[me].is_voter();
                let may_stand = electable && !self.election_running;
                let last = self.last();
                let takeover = primary
                    .filter(|_| may_stand)
                    .and_then(|pi| repl::election::priority_takeover_wait_ms(&self.config, me, pi, last, self.peers[pi].view.applied, et));
                let stand = match takeover {
                    Some(wait_ms) => now.saturating_sub(*self.takeover_since.get_or_insert(now)) >= wait_ms,
                    None => {
                        self.takeover_since = None;
                        repl::election::stands_for_want_of_primary(
                            &self.config,
                            me,
                            may_stand,
                            primary.is_some(),
                            now.saturating_sub(self.primary_seen),
                            self.election_timeout_ms,
                        )
                    }
                };
                if stand {
                    self.takeover_since = None;
                    self.start_election(out, true);
                }
            }
            _ => {}
        }
        if let Fetch::Idle { at } = self.fetch {
            if now >= at {
                self.start_fetch(out);
            }
        }
    }

    // ---- elections (member.rs) ----

    pub fn start_election(&mut self, out: &mut Out, dry_run: bool) {
        self.election_running = true;
        let id = self.id();
        let last = self.last();
        let term = self.term + 1;
        out.notes.push(Note::Trace(format!("m{} stands for term {term} (dry run {dry_run}) at {last:?}", self.index)));
        self.election = Some(Election { id, term, dry_run, votes: 1, answers: 0, last });
        if !dry_run {
            self.term = term;
            self.last_vote_term = Some(term);
            put_single_doc(&self.store, ELECTION, &vote_doc(term, self.index));
        }
        self.request_votes(out);
    }

    fn request_votes(&mut self, out: &mut Out) {
        let e = self.election.as_ref().expect("an election");
        let req = VoteRequest {
            set_name: self.config.set_name.clone(),
            dry_run: e.dry_run,
            term: e.term,
            candidate_index: self.index,
            config_version: self.config.version,
            config_term: self.config.term.unwrap_or(0),
            last_applied: e.last,
        };
        let id = e.id;
        if self.enough_votes() {
            return self.votes_counted(out);
        }
        for (i, m) in self.config.members.iter().enumerate() {
            if i != self.index && m.is_voter() {
                out.sends.push((i, Msg::VoteRequest { id, req: req.clone() }));
            }
        }
        self.timer(out, VOTE_TIMEOUT_MS, Timer::ElectionTimeout(id));
    }

    fn enough_votes(&self) -> bool {
        self.election.as_ref().is_some_and(|e| e.votes >= self.config.majority_vote_count())
    }

    fn on_vote_reply(&mut self, id: u64, term: i64, granted: bool, out: &mut Out) {
        let Some(e) = self.election.as_mut().filter(|e| e.id == id) else { return };
        let asked = e.term;
        e.answers += 1;
        if granted {
            e.votes += 1;
        }
        let answers = e.answers;
        if term > asked {
            self.observe_term(term, out);
        }
        if self.enough_votes() {
            self.votes_counted(out);
        } else if answers >= self.config.voters() - 1 {
            self.election_failed(out, "not enough votes");
        }
    }

    fn votes_counted(&mut self, out: &mut Out) {
        let e = self.election.take().expect("an election");
        if e.dry_run {
            // The real election: a new term, our own vote durable first.
            if self.term != e.term - 1 || self.state != MemberState::Secondary {
                return self.election_failed(out, "the term or state changed during the dry run");
            }
            let id = self.id();
            self.election = Some(Election { id, term: e.term, dry_run: false, votes: 1, answers: 0, last: e.last });
            self.term = e.term;
            self.last_vote_term = Some(e.term);
            put_single_doc(&self.store, ELECTION, &vote_doc(e.term, self.index));
            return self.request_votes(out);
        }
        // Won: catch up first from the member furthest ahead (member.rs `catch_up`).
        let me = self.index;
        let ahead = (0..self.peers.len())
            .filter(|&i| i != me && self.peers[i].view.up && !self.config.members[i].arbiter_only)
            .max_by_key(|&i| self.peers[i].view.applied);
        match ahead.map(|i| (i, self.peers[i].view.applied)) {
            Some((src, target)) if self.last() < target => {
                out.notes.push(Note::Trace(format!("m{me} won term {}; catching up to {target:?} from m{src}", e.term)));
                self.catch_up = Some((src, target, e.term));
                self.sync_from = Some(src);
                self.timer(out, CATCH_UP_POLL_MS, Timer::CatchUp);
            }
            _ => self.take_over(e.term, out),
        }
    }

    fn catch_up_step(&mut self, out: &mut Out) {
        let Some((src, target, term)) = self.catch_up else { return };
        let same_term = self.term == term && self.state == MemberState::Secondary;
        let up = self.peers.get(src).is_some_and(|p| p.view.up);
        if self.last() >= target || !same_term || !up {
            self.catch_up = None;
            if self.sync_from == Some(src) {
                self.sync_from = None;
            }
            self.take_over(term, out);
        }
    }

    fn take_over(&mut self, term: i64, out: &mut Out) {
        self.election_running = false;
        self.primary_seen = self.mono(out.now);
        self.election_timeout_ms = self.randomized_timeout(out);
        if self.term != term || self.state != MemberState::Secondary {
            out.notes.push(Note::Trace(format!("m{} election for term {term} ended: a later term began", self.index)));
            return;
        }
        self.become_primary(term, out);
    }

    fn election_failed(&mut self, out: &mut Out, why: &str) {
        out.notes.push(Note::Trace(format!("m{} election failed: {why}", self.index)));
        self.election = None;
        self.election_running = false;
        self.primary_seen = self.mono(out.now);
        self.election_timeout_ms = self.randomized_timeout(out);
    }

    // ---- messages ----

    pub fn on_message(&mut self, from: usize, msg: Msg, out: &mut Out) {
        match msg {
            Msg::HeartbeatRequest { seq, term, config_version, config_term } => {
                if term > self.term {
                    self.observe_term(term, out);
                }
                // member.rs `heartbeat`: a sender with an older config gets ours.
                let mine = (self.config.term.unwrap_or(0), self.config.version);
                let config = ((config_term, config_version) < mine).then(|| self.config.clone());
                let reply = Msg::HeartbeatReply {
                    config,
                    seq,
                    term: self.term,
                    state: self.state,
                    applied: self.last(),
                    durable: self.durable(),
                    commit_point: (self.state == MemberState::Primary).then(|| self.reported_commit_point()),
                    sync_source: self.sync_source,
                };
                out.sends.push((from, reply));
            }
            Msg::HeartbeatReply { seq, term, state, applied, durable, commit_point, sync_source, config } => {
                if let Some(config) = config {
                    return self.on_heartbeat_config(from, seq, term, config, out);
                }
                self.on_heartbeat_reply(from, seq, term, state, applied, durable, commit_point, sync_source, out)
            }
            Msg::VoteRequest { id, req } => {
                if req.term > self.term && !req.dry_run {
                    self.observe_term(req.term, out);
                }
                if self.state == MemberState::Removed || !self.in_config() {
                    out.sends.push((from, Msg::VoteReply { id, term: self.term, granted: false }));
                    return;
                }
                let voter = repl::election::Voter {
                    config: &self.config,
                    self_index: self.index,
                    term: self.term,
                    last_vote_term: self.last_vote_term,
                    last_applied: self.last(),
                };
                let decision = repl::election::decide(&voter, &req);
                if decision.is_ok() && !req.dry_run {
                    self.last_vote_term = Some(req.term);
                    self.primary_seen = self.mono(out.now);
                    put_single_doc(&self.store, ELECTION, &vote_doc(req.term, req.candidate_index));
                }
                out.sends.push((from, Msg::VoteReply { id, term: self.term, granted: decision.is_ok() }));
            }
            Msg::VoteReply { id, term, granted } => self.on_vote_reply(id, term, granted, out),
            Msg::Find { req, from: at } => {
                let reply = self.find_from(at, req);
                out.sends.push((from, reply));
            }
            Msg::GetMore { req, cursor, after, positions, term } => {
                self.update_positions(&positions, term, out);
                let reply = self.batch_after(cursor, after, req);
                match reply {
                    Msg::Batch { ref entries, cursor_lost: false, .. } if entries.is_empty() => {
                        let until = self.mono(out.now) + AWAIT_DATA_MS;
                        self.parked.push(ParkedGetMore { from, req, cursor, after, until });
                        self.timer(out, AWAIT_DATA_MS, Timer::AwaitData);
                    }
                    reply => out.sends.push((from, reply)),
                }
            }
            Msg::UpdatePosition { positions, term } => self.update_positions(&positions, term, out),
            Msg::Batch { req, cursor, entries, cursor_lost, first_matches, oldest, newest, term, commit_point } => {
                self.on_batch(from, req, cursor, entries, cursor_lost, first_matches, oldest, newest, term, commit_point, out)
            }
            Msg::RollbackQuery { req, from_ts, to_ts } => {
                let optimes = self.optimes_between(from_ts, to_ts);
                out.sends.push((from, Msg::RollbackAnswer { req, optimes, newest: self.last() }));
            }
            Msg::RollbackAnswer { req, optimes, newest } => self.on_rollback_answer(from, req, optimes, newest, out),
            Msg::Write(w) => self.on_write(from, w, out),
            Msg::TxnStatement { op, txn, start, write } => self.on_txn_statement(from, op, txn, start, write, out),
            Msg::TxnCommit { op, txn, majority, j } => self.on_txn_commit(from, op, txn, majority, j, out),
            Msg::TxnAbort { op, txn } => self.on_txn_abort(from, op, txn, out),
            Msg::OplogNewest { req, committed } => {
                // initial_sync.rs `begin_entry`: the committed entry (the oldest while none
                // is known), so that no rollback goes back past the copy's first entry;
                // `newest_entry` for minValid.
                let cp = self.commit_point;
                let entry = if !committed {
                    self.entries_before(None, 1).into_iter().next()
                } else if cp != OpTime::default() && cp <= self.last() {
                    self.entries_before(Some(cp.ts + 1), 1).into_iter().next().filter(|(at, _)| *at == cp)
                } else {
                    // No commit point known yet: the oldest entry, the set's first.
                    let c = self.store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
                    c.snapshot()
                        .scan(None, 1)
                        .expect("scan")
                        .into_iter()
                        .next()
                        .map(|(_, d)| (OpTime::from_doc(&d).expect("optime"), d.to_vec().expect("entry")))
                };
                out.sends.push((from, Msg::NewestReply { req, entry, rollback_id: self.rollback_id }));
            }
            Msg::NewestReply { req, entry, rollback_id } => self.on_newest(from, req, entry, rollback_id, out),
            Msg::CloneRead { req, after } => {
                // Reads of a member that is not primary or secondary fail (NotPrimaryOrSecondary).
                let serving = matches!(self.state, MemberState::Primary | MemberState::Secondary);
                let (docs, more) = if serving { self.data_after(after) } else { (Vec::new(), false) };
                out.sends.push((from, Msg::CloneBatch { req, docs: serving.then_some(docs), more }));
            }
            Msg::CloneBatch { req, docs, more } => self.on_clone_batch(from, req, docs, more, out),
            Msg::Read { op } => {
                // readConcern "majority" (server dispatch::ReadWait): read the data as it is,
                // then answer once the commit point reaches the newest entry read.
                let values = self.values_at(self.last());
                let until = self.mono(out.now) + READ_WAIT_MS;
                self.parked_reads.push(ParkedRead { client: from, op, values, until });
            }
            Msg::Reset { req } => {
                let pending = match self.fetch {
                    Fetch::Find { req: r, src, .. }
                    | Fetch::Tail { req: r, src, .. }
                    | Fetch::RollingBack { req: r, src, .. }
                    | Fetch::Syncing { req: r, src, .. } => r == req && src == from,
                    Fetch::Idle { .. } => false,
                };
                if pending {
                    if self.state == MemberState::Rollback {
                        self.rollback_failed();
                    }
                    self.fetch_failed(out, format!("m{from} closed the connection"));
                }
            }
            Msg::WriteReply { .. } | Msg::ReadReply { .. } | Msg::TxnReply { .. } => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_heartbeat_reply(
        &mut self,
        i: usize,
        seq: u64,
        term: i64,
        state: MemberState,
        applied: OpTime,
        durable: OpTime,
        commit_point: Option<OpTime>,
        sync_source: Option<usize>,
        out: &mut Out,
    ) {
        let Some((s, sent)) = self.peers.get(i).and_then(|p| p.heartbeat) else { return };
        if s != seq {
            return;
        }
        self.peers[i].heartbeat = None;
        let now = self.mono(out.now);
        if term > self.term {
            self.observe_term(term, out);
        }
        let my_term = self.term;
        let p = &mut self.peers[i];
        p.view.up = true;
        p.view.state = Some(state);
        p.view.applied = p.view.applied.max(applied);
        p.durable = p.durable.max(durable);
        p.view.ping_us = Some(now.saturating_sub(sent) * 1000);
        p.view.sync_source = sync_source;
        p.last_response = Some(now);
        if state == MemberState::Primary && term >= my_term {
            self.primary_seen = now;
            if let Some(cp) = commit_point {
                self.learn_commit_point(cp, false);
            }
        }
        if self.state == MemberState::Primary {
            self.advance_commit_point();
            self.check_pending(out);
        }
        if state == MemberState::Primary && self.state == MemberState::Primary && term >= self.term {
            self.step_down(out, "another member is primary in the same or a later term");
        }
        self.schedule_next_heartbeat(i, sent, out);
    }

    /// A heartbeat reply carrying a newer config (member.rs `on_heartbeat_reply`, which takes
    /// it and notes nothing else of that reply).
    fn on_heartbeat_config(&mut self, i: usize, seq: u64, term: i64, config: Arc<ReplSetConfig>, out: &mut Out) {
        let Some((s, sent)) = self.peers.get(i).and_then(|p| p.heartbeat) else { return };
        if s != seq {
            return;
        }
        self.peers[i].heartbeat = None;
        if term > self.term {
            self.observe_term(term, out);
        }
        let epoch = self.config_epoch;
        self.adopt_config(config, out);
        if self.config_epoch == epoch {
            self.schedule_next_heartbeat(i, sent, out);
        }
    }

    /// member.rs `adopt_config`: install a config received from a member if it is newer
    /// (config term, then version); one that does not name this member makes it REMOVED.
    fn adopt_config(&mut self, config: Arc<ReplSetConfig>, out: &mut Out) {
        if config.validate().is_err() || config.set_name != self.config.set_name {
            return;
        }
        if (config.term.unwrap_or(0), config.version) <= (self.config.term.unwrap_or(0), self.config.version) {
            return;
        }
        let named = config.members.get(self.index).is_some_and(|m| m.host == host(self.index));
        if !named {
            if self.state != MemberState::Removed {
                out.notes.push(Note::Trace(format!("m{}: not in config version {}: REMOVED", self.index, config.version)));
                self.step_down(out, "removed from the config");
                self.state = MemberState::Removed;
                self.election = None;
                self.election_running = false;
                self.catch_up = None;
                self.sync_source = None;
                self.fetch = Fetch::Idle { at: 0 };
            }
            return;
        }
        out.notes.push(Note::Trace(format!("m{} installs config version {} of term {}", self.index, config.version, config.term.unwrap_or(0))));
        self.install_config(config, out);
    }

    /// mod.rs `install_config`: take up `config` (it names this member at its index).
    pub fn install_config(&mut self, config: Arc<ReplSetConfig>, out: &mut Out) {
        assert!(config.members.get(self.index).is_some_and(|m| m.host == host(self.index)), "m{}: config without it at its index", self.index);
        for (i, m) in config.members.iter().enumerate() {
            assert_eq!(m.host, host(i), "configs keep members at their slots");
        }
        let n = config.members.len();
        // Peers keep their views by host: slots are positions, so by index.
        self.peers.resize(n, Peer::default());
        self.reported.resize(n, (OpTime::default(), OpTime::default()));
        let me = &config.members[self.index];
        let alone = config.members.iter().enumerate().all(|(i, m)| i == self.index || !m.is_voter()) && me.is_electable();
        assert!(!alone, "the sim's sets have several voters");
        let stays_primary = self.state == MemberState::Primary && me.is_electable();
        if self.state == MemberState::Primary && !stays_primary {
            self.step_down(out, "not electable in the new config");
        }
        self.config = config;
        self.sync_source = None;
        self.sync_from = None;
        self.election_timeout_ms = self.randomized_timeout(out);
        self.primary_seen = self.mono(out.now);
        // An election under way counted votes of the old config: it ends.
        self.election = None;
        self.election_running = false;
        if !stays_primary {
            self.state = match self.state {
                s @ (MemberState::Rollback | MemberState::Recovering) => s,
                _ if self.initial_sync_reason().is_some() => MemberState::Startup2,
                _ => MemberState::Secondary,
            };
        }
        // The fetch of the old epoch ends (an initial sync under way goes on, as the
        // server's does).
        if !matches!(self.fetch, Fetch::Syncing { .. } | Fetch::RollingBack { .. }) {
            self.fetch = Fetch::Idle { at: 0 };
        }
        self.start_heartbeats(out);
    }

    /// replSetReconfig on this member (mod.rs `reconfig`, not forced): `Err` says why not.
    pub fn reconfig(&mut self, new: ReplSetConfig, out: &mut Out) -> Result<(), String> {
        if self.state != MemberState::Primary {
            return Err("not primary".into());
        }
        new.validate().map_err(|e| e.to_string())?;
        self.config.check_reconfig(&new, false).map_err(|e| e.to_string())?;
        if new.members.get(self.index).is_none_or(|m| m.host != host(self.index)) {
            return Err("the new config does not name this member".into());
        }
        if !new.members[self.index].is_electable() {
            return Err("this member, the primary, would not be electable".into());
        }
        let mut new = new;
        new.settings.replica_set_id = self.config.settings.replica_set_id;
        new.term = Some(self.term);
        self.install_config(Arc::new(new), out);
        Ok(())
    }

    /// Downstream members' progress (getMore's `$replProgress`, replSetUpdatePosition), with
    /// the reporter's term: a later one first makes a primary step down (member.rs
    /// `update_positions`).
    fn update_positions(&mut self, positions: &[Position], term: i64, out: &mut Out) {
        if term > self.term {
            self.observe_term(term, out);
        }
        let mut moved = false;
        for p in positions {
            // A member this config no longer has (or does not have yet) counts for nothing.
            if p.member == self.index || p.member >= self.peers.len() {
                continue;
            }
            let peer = &mut self.peers[p.member];
            if p.applied > peer.view.applied || p.durable > peer.durable {
                peer.view.applied = peer.view.applied.max(p.applied);
                peer.durable = peer.durable.max(p.durable);
                moved = true;
            }
        }
        if moved {
            self.advance_commit_point();
            self.check_pending(out);
            self.report_upstream(out);
        }
    }

    /// What this member reports upstream: its own positions and others' (fetcher.rs
    /// `progress_optimes`).
    fn positions_for(&self, src: usize) -> Vec<Position> {
        let mut v = vec![Position { member: self.index, applied: self.last(), durable: self.durable() }];
        for (i, p) in self.peers.iter().enumerate() {
            if i != self.index && i != src && p.view.applied > OpTime::default() {
                v.push(Position { member: i, applied: p.view.applied, durable: p.durable });
            }
        }
        v
    }

    /// The reporter (fetcher.rs `report_loop`): changed positions go to the sync source at
    /// once when no getMore is about to carry them.
    fn report_upstream(&mut self, out: &mut Out) {
        let Some(src) = self.sync_source else { return };
        if self.state == MemberState::Primary {
            return;
        }
        let positions = self.positions_for(src);
        let changed = positions.iter().any(|p| self.reported[p.member] != (p.applied, p.durable));
        if changed {
            for p in &positions {
                self.reported[p.member] = (p.applied, p.durable);
            }
            out.sends.push((src, Msg::UpdatePosition { positions, term: self.term }));
        }
    }

    // ---- the source's side of fetching ----

    fn oplog_edges(&self) -> (Option<OpTime>, Option<OpTime>) {
        let c = self.store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
        let snap = c.snapshot();
        let first = snap.scan(None, 1).expect("scan").into_iter().next().and_then(|(_, d)| OpTime::from_doc(&d));
        let last = snap.scan_reverse(None, 1).expect("scan").into_iter().next().and_then(|(_, d)| OpTime::from_doc(&d));
        (first, last)
    }

    /// Entries with ts > `after_ts`: one batch of at most `n`, by the cursor's rule.
    fn entries_after(&self, after_ts: Option<u64>, n: usize) -> Vec<(OpTime, Vec<u8>)> {
        let c = self.store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
        let entries = c
            .snapshot()
            .scan_raw(after_ts, n)
            .expect("scan")
            .into_iter()
            .map(|(_, b)| (OpTime::from_raw(bson::RawDocument::from_bytes(&b).expect("entry")).expect("optime"), b))
            .collect();
        cut_batch(entries, |(_, b)| entry_size(b))
    }

    /// The newest entries before `before_ts`, newest first, at most `n`.
    fn entries_before(&self, before_ts: Option<u64>, n: usize) -> Vec<(OpTime, Vec<u8>)> {
        let c = self.store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
        c.snapshot()
            .scan_reverse(before_ts, n)
            .expect("scan")
            .into_iter()
            .map(|(_, d)| (OpTime::from_doc(&d).expect("optime"), d.to_vec().expect("entry")))
            .collect()
    }

    fn has_entry_at(&self, ts: u64) -> bool {
        let c = self.store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
        c.snapshot().get(ts).expect("get").is_some()
    }

    fn cursor(&self) -> Cursor {
        Cursor { incarnation: self.incarnation, truncations: self.truncations }
    }

    /// A fetcher's find: our entries from its newest one's timestamp on.
    fn find_from(&self, at: OpTime, req: u64) -> Msg {
        let entries = self.entries_after(at.ts.checked_sub(1), FETCH_BATCH_ENTRIES + 1);
        let first_matches = entries.first().map(|(o, _)| *o) == Some(at);
        let (oldest, newest) = if first_matches { (None, None) } else { self.oplog_edges() };
        Msg::Batch {
            req,
            cursor: self.cursor(),
            entries,
            cursor_lost: false,
            first_matches,
            oldest,
            newest,
            term: self.term,
            commit_point: self.reported_commit_point(),
        }
    }

    /// A getMore on a tailable oplog cursor positioned at `after` (server cursor.rs `Tail`):
    /// the cursor is gone after a restart or a rollback here (QueryPlanKilled), and dies
    /// when the record at its position is (CappedPositionLost); otherwise it returns what
    /// follows that position.
    fn batch_after(&self, cursor: Cursor, after: OpTime, req: u64) -> Msg {
        let lost = cursor != self.cursor() || !self.has_entry_at(after.ts);
        let entries = if lost { Vec::new() } else { self.entries_after(Some(after.ts), FETCH_BATCH_ENTRIES) };
        Msg::Batch {
            req,
            cursor,
            entries,
            cursor_lost: lost,
            first_matches: true,
            oldest: None,
            newest: None,
            term: self.term,
            commit_point: self.reported_commit_point(),
        }
    }

    fn serve_parked(&mut self, out: &mut Out) {
        for p in std::mem::take(&mut self.parked) {
            let reply = self.batch_after(p.cursor, p.after, p.req);
            out.sends.push((p.from, reply));
        }
    }

    fn optimes_between(&self, from_ts: u64, to_ts: u64) -> Vec<OpTime> {
        scan_optimes(&self.store, from_ts.checked_sub(1), |rid, _| rid <= to_ts)
    }

    // ---- the fetching side (fetcher.rs) ----

    fn fetching_state(&self) -> bool {
        matches!(self.state, MemberState::Secondary | MemberState::Startup2 | MemberState::Recovering)
    }

    fn start_fetch(&mut self, out: &mut Out) {
        if !self.fetching_state() {
            return;
        }
        let now = self.mono(out.now);
        let views = self.source_views(now);
        let last = self.last();
        let forced = self.sync_from.take().filter(|&i| views.get(i).is_some_and(|v| v.up));
        let src = forced.or_else(|| repl::sync_source::choose(&self.config, self.index, &views, last));
        self.sync_source = src;
        let Some(src) = src else {
            self.fetch = Fetch::Idle { at: now + NO_SOURCE_RETRY_MS };
            return;
        };
        let req = self.id();
        let reason = self.initial_sync_reason();
        if let Some(reason) = reason {
            // An empty member copies the data first, then tails from where the copy began.
            self.state = MemberState::Startup2;
            let had_oplog = last != OpTime::default();
            out.notes.push(Note::InitialSyncStarted { member: self.index, source: src, reason: reason.into(), had_oplog });
            self.fetch = Fetch::Syncing { src, req, phase: SyncPhase::Begin };
            out.sends.push((src, Msg::OplogNewest { req, committed: true }));
            self.timer(out, COMMAND_TIMEOUT_MS + REPLY_SLACK_MS, Timer::FetchTimeout(req));
            return;
        }
        self.fetch = Fetch::Find { src, req, forced: forced.is_some() };
        out.sends.push((src, Msg::Find { req, from: last }));
        self.timer(out, COMMAND_TIMEOUT_MS + REPLY_SLACK_MS, Timer::FetchTimeout(req));
    }

    fn source_views(&self, now: u64) -> Vec<PeerView> {
        self.peers
            .iter()
            .map(|p| {
                let mut v = p.view.clone();
                v.denied = p.denied_until > now;
                v
            })
            .collect()
    }

    fn fetch_failed(&mut self, out: &mut Out, why: String) {
        out.notes.push(Note::Trace(format!("m{}: oplog fetching stopped: {why}", self.index)));
        self.fetch = Fetch::Idle { at: self.mono(out.now) + FETCH_RETRY_MS };
    }

    #[allow(clippy::too_many_arguments)]
    fn on_batch(
        &mut self,
        from: usize,
        req: u64,
        cursor: Cursor,
        mut entries: Vec<(OpTime, Vec<u8>)>,
        cursor_lost: bool,
        first_matches: bool,
        oldest: Option<OpTime>,
        newest: Option<OpTime>,
        term: i64,
        commit_point: OpTime,
        out: &mut Out,
    ) {
        let (src, forced, was_find) = match self.fetch {
            Fetch::Find { src, req: r, forced } if r == req && src == from => (src, forced, true),
            Fetch::Tail { src, req: r, forced, .. } if r == req && src == from => (src, forced, false),
            _ => return,
        };
        // on_repl_data: the source's term.
        if term > self.term {
            self.observe_term(term, out);
        }
        // The fetcher writes nothing once this member is primary (fetcher::write_batch).
        if !self.fetching_state() {
            self.fetch = Fetch::Idle { at: 0 };
            return;
        }
        if cursor_lost {
            return self.fetch_failed(out, format!("m{src}: CappedPositionLost"));
        }
        // A reply past BSONObjMaxInternalSize is refused whole (the connection drops it).
        let reply_bytes = entries.iter().map(|(_, b)| entry_size(b)).sum::<u64>() + REPLY_ENVELOPE_BYTES;
        if reply_bytes > REPLY_SIZE_MAX_BYTES {
            out.notes.push(Note::BatchRefused { member: self.index, source: src, bytes: reply_bytes, entries: entries.len() });
            return self.fetch_failed(out, format!("m{src}'s reply of {reply_bytes} bytes is larger than {REPLY_SIZE_MAX_BYTES}"));
        }
        let last = self.last();
        if was_find {
            if !first_matches {
                match repl::sync_source::classify_mismatch(last, self.term, oldest, newest) {
                    Mismatch::TooStale => {
                        self.peers[src].denied_until = self.mono(out.now) + TOO_STALE_DENY_MS;
                        return self.fetch_failed(out, format!("too stale to sync from m{src}"));
                    }
                    Mismatch::Behind => return self.fetch_failed(out, format!("m{src} is behind us: {newest:?} < {last:?}")),
                    Mismatch::OlderTerm => return self.fetch_failed(out, format!("m{src}'s newest {newest:?} is of a term before ours ({})", self.term)),
                    // fetcher.rs: before the sync is done, a divergence means the copy may
                    // hold writes the set took back; copy again rather than roll back.
                    Mismatch::Diverged if self.sync_min_valid.is_some() => {
                        return self.restart_initial_sync(out, format!("m{src}'s oplog diverged from ours before the initial sync was done"));
                    }
                    Mismatch::Diverged => return self.start_rollback(src, oldest, out),
                }
            }
            entries.remove(0);
        }
        if let Some((first, _)) = entries.first() {
            assert!(first.ts > last.ts, "m{}: fetched {first:?} from m{src}, not after our newest {last:?}", self.index);
            self.store.append_oplog_replicated(&entries).expect("write fetched entries");
            self.store.commit_durable().expect("sync");
            // Members fetching from this one (chaining) wait for exactly these.
            self.serve_parked(out);
            self.learn_commit_point(commit_point, true);
            self.after_apply(out);
        } else {
            self.learn_commit_point(commit_point, true);
            // A sync's minValid may be committed now.
            self.after_apply(out);
        }
        if self.state == MemberState::Startup2 {
            // The initial sync starts over (`restart_initial_sync`): no more tailing
            // (fetcher.rs `superseded`).
            return;
        }
        let now = self.mono(out.now);
        let views = self.source_views(now);
        let last = self.last();
        let change = self.sync_from.is_some()
            || if forced {
                repl::sync_source::is_unusable(&views, self.index, last, src)
            } else {
                repl::sync_source::should_change(&self.config, self.index, &views, last, src)
            };
        if change {
            self.fetch = Fetch::Idle { at: 0 };
            self.report_upstream(out);
            return;
        }
        let req = self.id();
        self.fetch = Fetch::Tail { src, req, forced, cursor };
        let positions = self.positions_for(src);
        for p in &positions {
            self.reported[p.member] = (p.applied, p.durable);
        }
        out.sends.push((src, Msg::GetMore { req, cursor, after: last, positions, term: self.term }));
        self.timer(out, AWAIT_DATA_MS + REPLY_SLACK_MS, Timer::FetchTimeout(req));
    }

    /// The source's newest entry: `begin`, or `minValid` once the data is copied.
    fn on_newest(&mut self, from: usize, req: u64, entry: Option<(OpTime, Vec<u8>)>, rollback_id: u64, out: &mut Out) {
        let Fetch::Syncing { src, req: r, phase } = self.fetch else { return };
        if r != req || src != from {
            return;
        }
        let Some((at, bytes)) = entry else {
            return self.fetch_failed(out, format!("initial sync: m{src} has an empty oplog"));
        };
        match phase {
            SyncPhase::Begin => {
                // Before anything is dropped: a crash from here until the oplog is seeded
                // starts the sync over.
                put_single_doc(&self.store, INITIAL_SYNC_FLAG, &doc! {"_id": "initialSyncFlag"});
                // What an earlier attempt seeded goes too (mongod truncates the oplog).
                if self.last() != OpTime::default() {
                    self.store.truncate_oplog_after(OpTime::default()).expect("truncate");
                    self.store.commit_durable().expect("sync");
                }
                // The copy's own writes, not logged (as the server's initial sync).
                let data = self.store.replicated().collection_or_create(DATA_DB, DATA_COLLECTION).expect("data");
                {
                    let mut w = data.writer();
                    for (rid, old) in w.snapshot().scan(None, usize::MAX).expect("scan") {
                        w.delete(rid, &old).expect("delete");
                    }
                }
                // The sessions' outcomes it knew go with the data.
                self.txns = txn::Sessions::default();
                self.sync_begin = Some((at, bytes));
                let req = self.id();
                self.fetch = Fetch::Syncing { src, req, phase: SyncPhase::Cloning { begin: at, after: None, rollback_id } };
                out.sends.push((src, Msg::CloneRead { req, after: None }));
                self.timer(out, COMMAND_TIMEOUT_MS + REPLY_SLACK_MS, Timer::FetchTimeout(req));
            }
            SyncPhase::MinValid { begin, rollback_id: at_begin } => {
                // mongod's rollback id check: a source that rolled back since the sync began
                // may have taken back writes the clone copied, which no entry would undo.
                if INITIAL_SYNC_CHECKS_ROLLBACK && rollback_id != at_begin {
                    return self.fetch_failed(out, format!("initial sync: m{src} rolled back during the clone"));
                }
                let min_valid = at.max(begin);
                let Some((begin_at, begin_bytes)) = self.sync_begin.take() else { return self.fetch_failed(out, "initial sync: no begin entry".into()) };
                assert_eq!(begin_at, begin);
                assert!(self.last() == OpTime::default(), "m{}: seeding a non-empty oplog", self.index);
                // minValid first, then the seeded oplog.
                let mut mv = doc! {"_id": "minValid"};
                mv.extend(min_valid.to_doc());
                put_single_doc(&self.store, MIN_VALID, &mv);
                self.store.set_oplog_term(self.term.max(begin_at.term));
                self.store.append_oplog_replicated(&[(begin_at, begin_bytes)]).expect("seed the oplog");
                self.store.commit_durable().expect("sync");
                // initial_sync.rs: the flag stays until minValid is applied (a restart
                // before then copies again); until then a divergence starts the sync over.
                self.sync_min_valid = Some((begin, min_valid));
                // mod.rs `recover_until`.
                self.min_valid = Some(min_valid);
                self.state = MemberState::Recovering;
                self.after_apply(out);
                self.fetch = Fetch::Idle { at: 0 };
            }
            SyncPhase::Cloning { .. } => {}
        }
    }

    fn on_clone_batch(&mut self, from: usize, req: u64, docs: Option<Vec<DataDoc>>, more: bool, out: &mut Out) {
        let Fetch::Syncing { src, req: r, phase: SyncPhase::Cloning { begin, after, rollback_id } } = self.fetch else { return };
        if r != req || src != from {
            return;
        }
        let Some(docs) = docs else {
            return self.fetch_failed(out, format!("initial sync: m{src} serves no reads"));
        };
        let size: u64 = docs.iter().map(|d| d.size).sum();
        if size + REPLY_ENVELOPE_BYTES > REPLY_SIZE_MAX_BYTES && docs.len() > 1 {
            return self.fetch_failed(out, format!("initial sync: a clone batch of {size} bytes from m{src} is larger than {REPLY_SIZE_MAX_BYTES}"));
        }
        let after = docs.last().map(DataDoc::pos).or(after);
        // The copy's own writes, not logged (as the server's initial sync).
        let data = self.store.replicated().collection_or_create(DATA_DB, DATA_COLLECTION).expect("data");
        {
            let mut w = data.writer();
            for d in docs {
                w.insert(&d.to_doc()).expect("insert a cloned document");
            }
        }
        let req = self.id();
        if more {
            self.fetch = Fetch::Syncing { src, req, phase: SyncPhase::Cloning { begin, after, rollback_id } };
            out.sends.push((src, Msg::CloneRead { req, after }));
        } else {
            self.fetch = Fetch::Syncing { src, req, phase: SyncPhase::MinValid { begin, rollback_id } };
            out.sends.push((src, Msg::OplogNewest { req, committed: false }));
        }
        self.timer(out, COMMAND_TIMEOUT_MS + REPLY_SLACK_MS, Timer::FetchTimeout(req));
    }

    /// The data a clone reads (as a find on the data's collections, in `_id` order): the
    /// writes this member holds, cloned or in its oplog, after place `after`, one batch
    /// by the cursor's rule; and whether more follow.
    fn data_after(&self, after: Option<(u64, u32)>) -> (Vec<DataDoc>, bool) {
        let mut all = data_docs(&self.store, after, CLONE_BATCH_DOCS + 1);
        let more_than_docs = all.len() > CLONE_BATCH_DOCS;
        all.truncate(CLONE_BATCH_DOCS);
        let n = all.len();
        let batch = cut_batch(all, |d| d.size);
        let more = more_than_docs || batch.len() < n;
        (batch, more)
    }

    /// The sync is done: the flag goes, and the oplog (and minValid) carry this member.
    /// minValid applied: the sync is done.
    fn finish_initial_sync(&mut self, out: &mut Out) {
        let Some((begin, min_valid)) = self.sync_min_valid.take() else { return };
        clear_flag(&self.store);
        out.notes.push(Note::InitialSyncDone { member: self.index, begin, min_valid });
    }

    /// What the sync copied may hold writes the set rolled back: copy again (the flag is
    /// still set, so a restart would too).
    fn restart_initial_sync(&mut self, out: &mut Out, why: String) {
        out.notes.push(Note::Trace(format!("m{}: initial sync starts over: {why}", self.index)));
        put_single_doc(&self.store, INITIAL_SYNC_FLAG, &doc! {"_id": "initialSyncFlag"});
        self.sync_min_valid = None;
        self.min_valid = None;
        self.state = MemberState::Startup2;
        self.fetch_failed(out, why);
    }

    fn after_apply(&mut self, out: &mut Out) {
        if self.state == MemberState::Recovering && self.min_valid.is_some_and(|m| self.last() >= m) {
            if let Some((_, sync_min_valid)) = self.sync_min_valid {
                // mod.rs `after_apply`: that very entry, or the set took it back after the copy.
                if !holds_entry(&self.store, sync_min_valid) {
                    return self.restart_initial_sync(out, format!("minValid {sync_min_valid:?} was rolled back"));
                }
                self.finish_initial_sync(out);
            }
            self.min_valid = None;
            self.state = MemberState::Secondary;
            out.notes.push(Note::Trace(format!("m{} recovered: secondary", self.index)));
        }
    }

    /// fetcher.rs `roll_back`: a rollback that failed after it changed something (minValid,
    /// written first, is ahead of the oplog) leaves the member RECOVERING until minValid; one
    /// that failed before leaves the data as it was: SECONDARY. (RECOVERING without a
    /// minValid was forever: nothing would end it.)
    fn rollback_failed(&mut self) {
        let last = self.last();
        self.min_valid = first_doc(&self.store, MIN_VALID).as_ref().and_then(OpTime::from_doc).filter(|mv| last < *mv);
        self.state = if self.min_valid.is_some() { MemberState::Recovering } else { MemberState::Secondary };
    }

    fn start_rollback(&mut self, src: usize, source_oldest: Option<OpTime>, out: &mut Out) {
        self.state = MemberState::Rollback;
        self.rollback_query(src, source_oldest, None, out);
    }

    /// Our chunk of entries older than `upper` (newest first), for the common-point search.
    fn rollback_chunk(&self, upper: Option<u64>) -> Vec<OpTime> {
        let c = self.store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
        c.snapshot().scan_reverse(upper, ROLLBACK_CHUNK).expect("scan").into_iter().filter_map(|(_, d)| OpTime::from_doc(&d)).collect()
    }

    /// Ask the source for its optimes over our chunk of entries older than `upper`
    /// (fetcher.rs `source_entries_from`).
    fn rollback_query(&mut self, src: usize, source_oldest: Option<OpTime>, upper: Option<u64>, out: &mut Out) {
        let Some(oldest) = self.rollback_chunk(upper).last().copied() else {
            if self.sync_min_valid.is_some() {
                return self.restart_initial_sync(out, format!("no common point with m{src} in the oplog since the copy began"));
            }
            out.notes.push(Note::Stuck { member: self.index, why: format!("no common point with m{src}: needs a resync") });
            self.state = MemberState::Recovering;
            return self.fetch_failed(out, "no common point".into());
        };
        let req = self.id();
        self.fetch = Fetch::RollingBack { src, req, upper, source_oldest };
        out.sends.push((src, Msg::RollbackQuery { req, from_ts: oldest.ts, to_ts: self.last().ts }));
        self.timer(out, COMMAND_TIMEOUT_MS + REPLY_SLACK_MS, Timer::FetchTimeout(req));
    }

    fn on_rollback_answer(&mut self, from: usize, req: u64, theirs: Vec<OpTime>, newest: OpTime, out: &mut Out) {
        let Fetch::RollingBack { src, req: r, upper, source_oldest } = self.fetch else { return };
        if r != req || src != from || self.state != MemberState::Rollback {
            return;
        }
        let chunk = self.rollback_chunk(upper);
        let Some(common) = chunk.iter().copied().find(|o| theirs.contains(o)) else {
            // fetcher.rs `roll_back_inner`: past the source's oldest entry nothing can match;
            // the common point is older than its oplog, and another source may hold it.
            if chunk.last().is_some_and(|o| source_oldest.is_none_or(|so| o.ts < so.ts)) {
                self.peers[src].denied_until = self.mono(out.now) + TOO_STALE_DENY_MS;
                self.rollback_failed();
                return self.fetch_failed(out, format!("too stale to roll back to m{src}: our common point is older than its oplog"));
            }
            return self.rollback_query(src, source_oldest, chunk.last().map(|o| o.ts), out);
        };
        let removed = oplog_between(&self.store, Some(common.ts), self.last());
        out.notes.push(Note::RollingBack { member: self.index, common, removed, commit_point: self.commit_point });
        // minValid first and durable, then the cut (fetcher.rs `roll_back_inner`).
        let min_valid = newest.max(common);
        let mut mv = doc! {"_id": "minValid"};
        mv.extend(min_valid.to_doc());
        put_single_doc(&self.store, MIN_VALID, &mv);
        self.truncations += 1;
        self.rollback_id += 1;
        // mongod's rollback invalidates the sessions: their outcomes are read again from
        // what remains.
        self.txns = txn::Sessions::default();
        // Cursors parked here read on at once, and find their cursor gone.
        self.serve_parked(out);
        self.store.truncate_oplog_after(common).expect("truncate");
        // The rollback undoes the writes after the common point, copied ones too.
        if let Some(data) = self.store.replicated().collection(DATA_DB, DATA_COLLECTION) {
            let mut w = data.writer();
            for (rid, d) in w.snapshot().scan(None, usize::MAX).expect("scan") {
                if OpTime::from_doc(&d).is_some_and(|at| at.ts > common.ts) {
                    w.delete(rid, &d).expect("delete");
                }
            }
        }
        self.store.commit_durable().expect("sync");
        self.min_valid = Some(min_valid);
        self.state = MemberState::Recovering;
        self.after_apply(out);
        self.fetch = Fetch::Idle { at: 0 };
    }

    // ---- clients ----

    /// A write: on a key a transaction in progress wrote, it waits for that transaction to
    /// end (`txn.rs`), as the server's write runs again after each WriteConflict.
    pub(crate) fn on_write(&mut self, client: usize, w: txn::PlainWrite, out: &mut Out) {
        if self.state != MemberState::Primary {
            out.sends.push((client, Msg::WriteReply { op: w.op, result: WriteResult::NotPrimary }));
            return;
        }
        if self.txns.owner(w.key).is_some() {
            self.txns.parked_writes.push((client, w));
            return;
        }
        let at = self.next_optime(out.now, self.term);
        let bytes = entry(at, self.wall_ms(out.now), Some((w.key, w.value)), w.size_bytes + ENTRY_ENVELOPE_BYTES);
        self.store.append_oplog_replicated(&[(at, bytes)]).expect("log the write");
        self.txns.written.insert(w.key, at);
        self.logged(w.j, out);
        if w.majority {
            self.wait_majority(client, w.op, at, Answer::Write, out);
        } else {
            out.sends.push((client, Msg::WriteReply { op: w.op, result: WriteResult::Ok(at) }));
        }
    }

    /// After this primary logged an entry: synced if `j`, and the fetchers waiting for it
    /// served.
    pub(crate) fn logged(&mut self, j: bool, out: &mut Out) {
        if j {
            self.store.commit_durable().expect("sync");
        }
        self.serve_parked(out);
    }

    /// Answer once `at` is majority-committed (durable on a majority).
    pub(crate) fn wait_majority(&mut self, client: usize, op: u64, at: OpTime, answer: Answer, out: &mut Out) {
        self.pending.push(PendingWrite { client, op, at, answer });
        if !self.flush_requested {
            self.flush_requested = true;
            self.timer(out, 1, Timer::FlushRequested);
        }
        self.advance_commit_point();
        self.check_pending(out);
    }

    /// Answer the parked majority reads that may be answered (called after every step).
    pub fn after_step(&mut self, out: &mut Out) {
        if self.parked_reads.is_empty() {
            return;
        }
        let serving = matches!(self.state, MemberState::Primary | MemberState::Secondary);
        let cp = self.reported_commit_point();
        let now = self.mono(out.now);
        let incarnation = self.incarnation;
        self.parked_reads.retain_mut(|r| {
            let at = r.values.iter().flatten().map(|(at, _)| *at).max().unwrap_or_default();
            let result = if !serving {
                None
            } else if cp >= at {
                Some((cp, std::mem::take(&mut r.values)))
            } else if now < r.until {
                return true;
            } else {
                None
            };
            out.sends.push((r.client, Msg::ReadReply { op: r.op, incarnation, result }));
            false
        });
    }

    /// Every key's value as of `cp` (one snapshot): the newest write to it at or before.
    fn values_at(&self, cp: OpTime) -> Values {
        let mut values: Values = vec![None; KEYS as usize];
        let mut missing = values.len();
        let c = self.store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
        let mut before = Some(cp.ts + 1);
        // Most entries are writes: the newest few dozen hold every key.
        let mut n = 16;
        loop {
            let chunk = c.snapshot().scan_reverse(before, n).expect("scan");
            n = (n * 4).min(1024);
            if chunk.is_empty() {
                break;
            }
            for (rid, d) in chunk {
                before = Some(rid);
                let Some(at) = OpTime::from_doc(&d) else { continue };
                entry_writes(&d, |k, v, _| {
                    if let Some(slot @ None) = values.get_mut(k as usize) {
                        *slot = Some((at, v));
                        missing -= 1;
                    }
                });
                if missing == 0 {
                    return values;
                }
            }
        }
        // Older writes are in the data an initial sync copied, if any.
        if let Some(data) = self.store.collection(DATA_DB, DATA_COLLECTION) {
            for (_, d) in data.snapshot().scan(None, usize::MAX).expect("scan") {
                let Some(d) = DataDoc::from_doc(&d).filter(|d| d.at <= cp) else { continue };
                if let Some(slot) = values.get_mut(d.key as usize) {
                    if slot.is_none_or(|(at, _)| at < d.at) {
                        *slot = Some((d.at, d.value));
                    }
                }
            }
        }
        values
    }
}

/// The data an initial sync copied, in no order.
pub fn copied_docs(store: &Store) -> Vec<DataDoc> {
    let Some(c) = store.collection(DATA_DB, DATA_COLLECTION) else { return Vec::new() };
    c.snapshot().scan(None, usize::MAX).expect("scan").into_iter().filter_map(|(_, d)| DataDoc::from_doc(&d)).collect()
}

/// A member's data: the writes it holds, cloned (an initial sync's copy) or in its oplog,
/// after place `after` (`DataDoc::pos`), oldest first, at most `limit`.
pub fn data_docs(store: &Store, after: Option<(u64, u32)>, limit: usize) -> Vec<DataDoc> {
    let is_after = |d: &DataDoc| after.is_none_or(|a| d.pos() > a);
    let mut out: Vec<DataDoc> = copied_docs(store).into_iter().filter(is_after).collect();
    let c = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
    // From the entry at `after` itself: a transaction's later writes follow its earlier ones.
    let mut from = after.and_then(|(ts, _)| ts.checked_sub(1));
    let mut writes = 0;
    'scan: loop {
        let chunk = c.snapshot().scan(from, 256).expect("scan");
        if chunk.is_empty() {
            break;
        }
        for (rid, d) in chunk {
            from = Some(rid);
            for doc in entry_docs(&d).into_iter().filter(is_after) {
                out.push(doc);
                writes += 1;
            }
            if writes >= limit {
                break 'scan;
            }
        }
    }
    out.sort_by_key(DataDoc::pos);
    out.dedup_by_key(|d| d.pos());
    out.truncate(limit);
    out
}

/// Whether `store` holds data an initial sync copied.
pub fn has_copied_data(store: &Store) -> bool {
    store.collection(DATA_DB, DATA_COLLECTION).is_some_and(|c| !c.snapshot().scan(None, 1).expect("scan").is_empty())
}

/// The first of `writes` (entries) that `store` does not hold whole, in its oplog or in the
/// data its initial sync copied (older than its oplog): a transaction's entry counts only
/// with every one of its writes.
pub fn missing_write<'a>(store: &Store, writes: impl Iterator<Item = &'a OpTime>) -> Option<OpTime> {
    let mut copied: Option<std::collections::BTreeMap<OpTime, (u32, u32)>> = None;
    for at in writes {
        if holds_entry(store, *at) {
            continue;
        }
        // Read the copied data once, and only for a member whose oplog lacks one.
        let copied = copied.get_or_insert_with(|| {
            let mut m = std::collections::BTreeMap::new();
            for d in copied_docs(store) {
                m.entry(d.at).or_insert((0, d.of)).0 += 1;
            }
            m
        });
        if copied.get(at).is_none_or(|(n, of)| n != of) {
            return Some(*at);
        }
    }
    None
}

/// How many entries of `store`'s oplog are large (`ENTRY_LARGE_BYTES` or more).
pub fn large_entries(store: &Store) -> u64 {
    let c = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
    let mut n = 0;
    let mut after = None;
    loop {
        let chunk = c.snapshot().scan_raw(after, 1000).expect("scan");
        if chunk.is_empty() {
            return n;
        }
        for (rid, b) in chunk {
            after = Some(rid);
            n += u64::from(entry_size(&b) >= ENTRY_LARGE_BYTES);
        }
    }
}

/// Whether `store`'s oplog holds the entry at `at`.
/// Clear the initial-sync flag, durably.
fn clear_flag(store: &Store) {
    if let Some(flag) = store.collection(LOCAL, INITIAL_SYNC_FLAG) {
        let mut w = flag.writer();
        for (rid, old) in w.snapshot().scan(None, usize::MAX).expect("scan") {
            w.delete(rid, &old).expect("delete");
        }
    }
    store.commit_durable().expect("sync");
}

/// The oldest entry of the oplog of `store`.
pub fn oldest_entry(store: &Store) -> Option<OpTime> {
    let oplog = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION)?;
    oplog.snapshot().scan_raw(None, 1).expect("scan").into_iter().next().and_then(|(_, b)| raw_optime(&b))
}

/// An entry's optime, read without decoding the rest of it.
fn raw_optime(bytes: &[u8]) -> Option<OpTime> {
    OpTime::from_raw(bson::RawDocument::from_bytes(bytes).ok()?)
}

pub fn holds_entry(store: &Store, at: OpTime) -> bool {
    let oplog = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
    oplog.snapshot().get(at.ts).expect("get").and_then(|d| OpTime::from_doc(&d)) == Some(at)
}

/// The oplog of `store` up to `through`, oldest first, after `after_ts`.
pub fn oplog_between(store: &Store, after_ts: Option<u64>, through: OpTime) -> Vec<OpTime> {
    scan_optimes(store, after_ts, |_, at| at <= through)
}

/// The optimes of `store`'s oplog after `after_ts`, oldest first, while `more(record id,
/// optime)` holds.
fn scan_optimes(store: &Store, after_ts: Option<u64>, more: impl Fn(u64, OpTime) -> bool) -> Vec<OpTime> {
    let c = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).expect("oplog");
    let mut out = Vec::new();
    let mut after = after_ts;
    // Most scans want the few entries after `after_ts` (up to a commit point): small chunks
    // first, read raw.
    let mut n = 16;
    loop {
        let chunk = c.snapshot().scan_raw(after, n).expect("scan");
        n = (n * 4).min(1024);
        if chunk.is_empty() {
            return out;
        }
        for (rid, b) in chunk {
            after = Some(rid);
            let Some(at) = raw_optime(&b) else { continue };
            if !more(rid, at) {
                return out;
            }
            out.push(at);
        }
    }
}
