//! Deterministic simulation of a shoal replica set.
//!
//! N members (`member::Member`: the server coordinator's rules, made by the `repl` crate,
//! over a real `storage::Store` on a crashable in-memory engine) and a few clients exchange
//! messages through a simulated network, on a simulated clock, driven by one seeded random
//! generator. A nemesis partitions, delays, drops and reorders messages, kills members
//! (losing what they had not synced) and restarts them, pauses them, jumps their wall
//! clocks and points their fetchers at other members. Also modeled:
//!
//! - initial sync (`replication::initial_sync`): some runs start with an empty member, and reconfigs
//!   add empty ones. The member notes its source's rollback id and majority-committed entry
//!   (begin; its oldest while it knows none), sets the durable initial-sync flag, drops its
//!   data, copies the source's data in batches while writes and faults go on, notes
//!   minValid (the source's newest entry), copies again if the source's rollback id moved,
//!   seeds its oplog with begin, clears the flag and stays RECOVERING until minValid is
//!   applied; a divergence before that, or minValid's entry missing then, starts the sync
//!   over. A kill mid-sync starts it over after the restart (flag set or empty oplog);
//! - entry sizes: each write stands for a document of a drawn size, mostly small, some near
//!   16 MiB (the sim carries the number, not the bytes). Fetched batches follow the
//!   cursor's rule (stop before 16 MiB - 64 KiB, at least one entry); a member refuses a
//!   reply larger than 16 MiB + 16 KiB; a link moves 10 Gbit/s;
//! - replSetReconfig on the primary, adding the next slot's member (empty) or removing the
//!   last, checked by the repl crate's rules (`validate`, `check_reconfig`: one voter change
//!   at most); configs spread by heartbeat, the newer (config term, version) winning, and a
//!   member left out becomes REMOVED. Like the server, the primary does not wait for the
//!   previous config to reach a majority before the next;
//! - multi-document transactions (`txn.rs`): clients begin one on the member they believe
//!   primary, write a few keys, then commit (w:"majority" mostly, w:1 sometimes) or abort.
//!   A transaction lives in its primary's memory until its commit logs one `applyOps`
//!   entry with all its writes; a write conflict with another transaction in progress (or
//!   a write since it began) aborts it at once; a kill or a step-down aborts those in
//!   progress (NoSuchTransaction after); a commit whose answer was lost is retried, and a
//!   member that did not run it answers from the session's record (the replicated entry).
//!
//! After every step the invariants are checked:
//!
//! - at most one primary per term;
//! - no write acknowledged with w:"majority" is ever rolled back, and every later primary
//!   holds it (in its oplog, or in the data its initial sync copied);
//! - the oplog up to each member's commit point is a prefix of one committed history (the
//!   committed prefix is identical on every member; a member that initial-synced holds it
//!   from its begin entry on);
//! - a member never loses what it had committed and made durable, across restarts, except
//!   by starting an initial sync, which only a member that never finished one does (a member
//!   that finished one never starts another);
//! - majority reads return committed values only, and a member's never go back;
//! - atomicity: a member's data holds each transaction's writes all or none (checked when
//!   its data changes other than by whole entries: a finished initial sync's copy, a
//!   rollback; and at the end), and so does every majority read (all keys at one point);
//! - a transaction acknowledged committed with w:"majority" is never rolled back, and every
//!   later primary holds all of it (the write checks above, on its entry);
//! - a transaction its client was told did not commit (aborted, NoSuchTransaction, given
//!   up before its commit) is never logged afterwards (but by a deposed primary that still
//!   received its commit), never enters the committed history, and at the end is in no
//!   member's oplog or data; a transaction is logged once at most, and only a primary
//!   holds transactions in progress, all begun in its current term;
//! - a commit's answers agree: the entry it names is that transaction's, with every write
//!   the client made, and a retried commit never contradicts an earlier definite answer.
//!
//! At the end the faults heal and the set must settle: one primary, every member of its
//! config caught up (a member that cannot make progress, say because a batch it needs can
//! never be sent, fails the run), every member's oplog the same from the later start and its
//! data the same, every acknowledged majority write and transaction whole in it.
//!
//! The same seed replays the same run exactly: nothing here reads a real clock, a thread or
//! an unordered map.
//!
//! Not modeled: the server's tokio tasks themselves (its connections, locks and threads:
//! here connections are messages and tasks are timers), arbiters, forced reconfig, data
//! beyond the set of writes (each write is one value of one of `member::KEYS` registers,
//! with the size it stands for), and transactions' reads, prepared (two-phase) commits and
//! chains of entries (a transaction's writes are small: one entry holds them).

pub mod member;
pub mod txn;

use member::Member;
use repl::election::VoteRequest;
use repl::{MemberState, ReplSetConfig};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::sync::Arc;
use storage::OpTime;

/// xorshift64*: small, fast, and the same on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, n) (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo))
    }

    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// A source's oplog cursor: valid while the source runs the same process (`incarnation`)
/// and has not truncated its oplog since (`truncations`, the server's
/// `Collection::truncations`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub incarnation: u64,
    pub truncations: u64,
}

/// A member's progress as reported upstream.
#[derive(Clone, Copy, Debug)]
pub struct Position {
    pub member: usize,
    pub applied: OpTime,
    pub durable: OpTime,
}

#[derive(Clone, Debug)]
pub enum WriteResult {
    Ok(OpTime),
    NotPrimary,
    /// The primary stepped down before the write concern was met: the outcome is unknown.
    SteppedDown,
}

#[derive(Clone, Debug)]
pub enum Msg {
    HeartbeatRequest {
        seq: u64,
        term: i64,
        config_version: i32,
        config_term: i64,
    },
    /// `config`: ours, when the sender's is older.
    HeartbeatReply {
        seq: u64,
        term: i64,
        state: MemberState,
        applied: OpTime,
        durable: OpTime,
        commit_point: Option<OpTime>,
        sync_source: Option<usize>,
        config: Option<Arc<ReplSetConfig>>,
    },
    VoteRequest {
        id: u64,
        req: VoteRequest,
    },
    VoteReply {
        id: u64,
        term: i64,
        granted: bool,
    },
    /// The fetcher's find: the source's entries from our newest one on.
    Find {
        req: u64,
        from: OpTime,
    },
    /// The fetcher's getMore on its tailable cursor, carrying progress (`$replProgress`).
    GetMore {
        req: u64,
        cursor: Cursor,
        after: OpTime,
        positions: Vec<Position>,
        term: i64,
    },
    Batch {
        req: u64,
        cursor: Cursor,
        entries: Vec<(OpTime, Vec<u8>)>,
        cursor_lost: bool,
        first_matches: bool,
        oldest: Option<OpTime>,
        newest: Option<OpTime>,
        term: i64,
        commit_point: OpTime,
    },
    UpdatePosition {
        positions: Vec<Position>,
        term: i64,
    },
    RollbackQuery {
        req: u64,
        from_ts: u64,
        to_ts: u64,
    },
    RollbackAnswer {
        req: u64,
        optimes: Vec<OpTime>,
        newest: OpTime,
    },
    /// The connection of fetch request `req` broke (its source was killed).
    Reset {
        req: u64,
    },
    Write(txn::PlainWrite),
    /// A transaction's statement, writing one key; `start`: its first (startTransaction).
    TxnStatement {
        op: u64,
        txn: txn::TxnId,
        start: bool,
        write: txn::TxnWrite,
    },
    /// commitTransaction, first or retried.
    TxnCommit {
        op: u64,
        txn: txn::TxnId,
        majority: bool,
        j: bool,
    },
    TxnAbort {
        op: u64,
        txn: txn::TxnId,
    },
    /// The answer to a transaction's request, from a member in `term`.
    TxnReply {
        op: u64,
        term: i64,
        result: txn::TxnResult,
    },
    /// Initial sync: the source's majority-committed oplog entry (`committed`: `begin`; its
    /// oldest while it knows none), or its newest (`minValid`).
    OplogNewest {
        req: u64,
        committed: bool,
    },
    /// `rollback_id`: the source's rollback count (mongod's RBID).
    NewestReply {
        req: u64,
        entry: Option<(OpTime, Vec<u8>)>,
        rollback_id: u64,
    },
    /// Initial sync's clone: the source's data after a timestamp, one batch.
    CloneRead {
        req: u64,
        after: Option<(u64, u32)>,
    },
    /// None: the source serves no reads (not primary or secondary).
    CloneBatch {
        req: u64,
        docs: Option<Vec<member::DataDoc>>,
        more: bool,
    },
    WriteReply {
        op: u64,
        result: WriteResult,
    },
    Read {
        op: u64,
    },
    /// The commit point when answered and every key's newest value, from the member's
    /// `incarnation`; None when the member serves no reads.
    ReadReply {
        op: u64,
        incarnation: u64,
        result: Option<(OpTime, member::Values)>,
    },
}

impl Msg {
    /// The request id of a fetcher's request to its source.
    fn fetch_request(&self) -> Option<u64> {
        match self {
            Msg::Find { req, .. } | Msg::GetMore { req, .. } | Msg::RollbackQuery { req, .. } | Msg::OplogNewest { req, .. } | Msg::CloneRead { req, .. } => {
                Some(*req)
            }
            _ => None,
        }
    }

    /// The bytes the message stands for (entries and documents at their modeled sizes).
    fn size_bytes(&self) -> u64 {
        match self {
            Msg::Batch { entries, .. } => entries.iter().map(|(_, b)| member::entry_size(b)).sum(),
            Msg::CloneBatch { docs: Some(docs), .. } => docs.iter().map(|d| d.size).sum(),
            Msg::NewestReply { entry: Some((_, b)), .. } => member::entry_size(b),
            Msg::Write(w) => w.size_bytes,
            Msg::TxnStatement { write, .. } => write.size,
            _ => 0,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Timer {
    /// To member `.0`, in config epoch `.1`.
    Heartbeat(usize, u64),
    HeartbeatTimeout(usize, u64),
    Tick,
    /// Primary catch-up's poll (member.rs `catch_up`).
    CatchUp,
    JournalFlush,
    FlushRequested,
    ElectionTimeout(u64),
    AwaitData,
    FetchTimeout(u64),
}

/// What a member's step did that the checker must see.
#[derive(Debug)]
pub enum Note {
    BecamePrimary {
        member: usize,
        term: i64,
    },
    /// `at` acknowledged with w:"majority" by a primary in `term` (a retried commit's entry
    /// may be of an older term, made majority-committed in this one).
    AckedMajority {
        member: usize,
        at: OpTime,
        term: i64,
    },
    RollingBack {
        member: usize,
        common: OpTime,
        removed: Vec<OpTime>,
        commit_point: OpTime,
    },
    Stuck {
        member: usize,
        why: String,
    },
    InitialSyncStarted {
        member: usize,
        source: usize,
        reason: String,
        had_oplog: bool,
    },
    InitialSyncDone {
        member: usize,
        begin: OpTime,
        min_valid: OpTime,
    },
    /// A primary logged a transaction's commit entry.
    TxnLogged {
        member: usize,
        txn: txn::TxnId,
        at: OpTime,
        keys: Vec<u64>,
        term: i64,
    },
    /// Transactions in progress aborted: by a step-down, or past their lifetime (`expired`).
    TxnsAborted {
        member: usize,
        count: u64,
        expired: bool,
        why: String,
    },
    /// A fetched reply past the largest a member accepts.
    BatchRefused {
        member: usize,
        source: usize,
        bytes: u64,
        entries: usize,
    },
    Trace(String),
}

/// A member step's effects: messages to send, timers to set, notes for the checker.
pub struct Out<'a> {
    pub now: u64,
    pub rng: &'a mut Rng,
    pub sends: Vec<(usize, Msg)>,
    /// (global delay ms, member, incarnation, timer)
    pub timers: Vec<(u64, usize, u64, Timer)>,
    pub notes: Vec<Note>,
}

#[derive(Debug)]
enum Event {
    Deliver {
        from: usize,
        to: usize,
        msg: Msg,
    },
    Timer {
        member: usize,
        incarnation: u64,
        timer: Timer,
    },
    ClientNext(usize),
    ClientTimeout {
        client: usize,
        op: u64,
    },
    TxnClientNext(usize),
    TxnClientTimeout {
        client: usize,
        op: u64,
    },
    Nemesis,
    Restart(usize),
    HealPartition(u64),
    /// Kill the member if its initial sync is still under way.
    KillSyncing(usize),
    EndLossy(u64),
}

struct Queued {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// How a run is shaped; `Options::for_seed` draws one from the seed.
#[derive(Clone, Debug)]
pub struct Options {
    pub members: usize,
    /// Members that never stand (priority 0), and members without a vote (votes 0,
    /// priority 0), counted from the last.
    pub unelectable: usize,
    pub non_voting: usize,
    /// Members 0 and 1 have priorities 3 and 2 (the rest 1): priority takeovers.
    pub priorities: bool,
    pub chaining: bool,
    /// Simulated milliseconds of faults, then `quiet_ms` healed.
    pub fault_ms: u64,
    pub quiet_ms: u64,
    pub clients: usize,
    /// Clients that run multi-document transactions (beside `clients`).
    pub txn_clients: usize,
    pub trace: bool,
    /// Members at the end of the first config whose store starts empty: they initial-sync.
    pub empty_members: usize,
    /// Slots beyond the first config, for members a reconfig adds.
    pub spare_slots: usize,
    /// Whether the nemesis runs replSetReconfig (adding an empty member, or removing the
    /// last).
    pub reconfig: bool,
    /// The chance that a write is large (near the largest entry); the rest are small.
    pub large_entry_chance: f64,
}

impl Options {
    pub fn for_seed(seed: u64) -> Options {
        let mut r = Rng::new(seed ^ 0x5EED);
        let members = if r.chance(0.5) { 3 } else { 5 };
        // A third of the sets have a member that cannot be elected, a third of the 5-member
        // ones one more without a vote.
        let unelectable = usize::from(r.chance(1.0 / 3.0));
        let non_voting = usize::from(members == 5 && r.chance(1.0 / 3.0));
        let priorities = r.chance(1.0 / 3.0);
        let chaining = r.chance(0.5);
        let empty_members = usize::from(r.chance(0.25));
        let reconfig = r.chance(0.35);
        let spare_slots = usize::from(reconfig);
        // Up to 3% of the writes near 16 MiB: a run's data stays a few GB, which a clone or a
        // catch-up moves well within the quiet period.
        let large_entry_chance = if r.chance(0.5) { 0.0 } else { r.range(5, 31) as f64 / 1000.0 };
        Options {
            members,
            unelectable,
            non_voting,
            priorities,
            chaining,
            fault_ms: 20_000,
            quiet_ms: 30_000,
            clients: 3,
            txn_clients: 2,
            trace: false,
            empty_members,
            spare_slots,
            reconfig,
            large_entry_chance,
        }
    }
}

/// What one run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub members: usize,
    pub events: u64,
    pub messages: u64,
    pub dropped: u64,
    pub crashes: u64,
    pub pauses: u64,
    pub partitions: u64,
    pub lossy_periods: u64,
    pub clock_jumps: u64,
    pub sync_from: u64,
    pub primaries: u64,
    pub max_term: i64,
    pub writes_majority_acked: u64,
    pub writes_w1_acked: u64,
    pub writes_unknown: u64,
    pub reads: u64,
    pub rollbacks: u64,
    pub rolled_back_entries: u64,
    pub committed_entries: u64,
    pub initial_syncs_started: u64,
    pub initial_syncs_done: u64,
    /// Syncs started by a member that had started one before (it was killed mid-sync, or
    /// its copy was found rolled back).
    pub initial_syncs_restarted: u64,
    pub reconfigs: u64,
    /// Reconfigs the primary refused (the config rules, or no primary to run one).
    pub reconfigs_refused: u64,
    pub members_added: u64,
    pub members_removed: u64,
    /// Writes of at least `member::ENTRY_LARGE_BYTES`.
    pub large_entries: u64,
    /// Fetched replies refused as larger than the largest a member accepts.
    pub batches_refused: u64,
    pub txns_started: u64,
    /// Commits acknowledged (the first time), of which after a w:"majority" wait.
    pub txns_committed: u64,
    pub txns_committed_majority: u64,
    /// Transactions their clients chose to abort.
    pub txns_aborted_by_client: u64,
    /// Transactions in progress that a kill or a step-down aborted on their primary.
    pub txns_aborted_by_failover: u64,
    /// Transactions past their lifetime, aborted by the reaper.
    pub txns_expired: u64,
    /// Transactions their clients began again (TransientTransactionError, no answer).
    pub txns_restarted: u64,
    /// Statements that met a WriteConflict (their transaction aborted).
    pub txn_write_conflicts: u64,
    /// Commit answers of unknown outcome (UnknownTransactionCommitResult, not primary, no
    /// answer).
    pub txn_commits_unknown: u64,
    pub txn_commits_retried: u64,
    /// Retried commits answered committed by a member that found them on record (another
    /// than the one that logged the commit).
    pub txn_commits_recovered: u64,
    /// Retried commits answered NoSuchTransaction: the commit never took effect.
    pub txn_commits_not_found: u64,
}

impl Report {
    pub fn faults(&self) -> u64 {
        self.crashes + self.pauses + self.partitions + self.lossy_periods + self.clock_jumps + self.sync_from
    }
}

/// An invariant that did not hold, with the seed that replays it and the run's last notes.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    pub at_ms: u64,
    pub what: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {} failed at {} ms: {}", self.seed, self.at_ms, self.what)?;
        writeln!(f, "replay: SHOAL_SIM_SEED={} SHOAL_SIM_TRACE=1 cargo test -p shoal-sim --release -- --nocapture", self.seed)?;
        writeln!(f, "last notes:")?;
        for l in &self.trace {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

/// The checker's view: the one committed history, and what each member was checked to.
struct Checker {
    committed: Vec<OpTime>,
    committed_set: BTreeSet<OpTime>,
    /// Per member: how many of its oldest entries match `committed`, and the last one's ts.
    verified: Vec<(usize, Option<u64>)>,
    primaries: BTreeMap<i64, usize>,
    /// Entries acknowledged with w:"majority", and the first term that acknowledged each.
    acked_majority: BTreeMap<OpTime, i64>,
    /// Per member: (incarnation, commit point) last seen, for monotonic majority reads.
    last_cp: Vec<(u64, OpTime)>,
    /// Per (client, member): (incarnation, commit point) of the last majority read.
    last_read: BTreeMap<(usize, usize), (u64, OpTime)>,
    /// Per member: the newest entry it had committed and durable, across its restarts; a
    /// restart must find it still there.
    kept: Vec<OpTime>,
    /// Per member (machine): initial syncs started and finished, across its restarts.
    syncs_started: Vec<u64>,
    syncs_done: Vec<u64>,
    txns: txn::TxnChecker,
}

struct Client {
    op: u64,
    /// The op in flight: (op, is write, majority).
    busy: Option<(u64, bool, bool)>,
    next_value: u64,
}

const MSG_DELAY_MS_MAX: u64 = 3;
/// Link speed (10 Gbit/s): a 16 MiB batch takes 13 ms on the wire.
const LINK_BYTES_PER_MS: u64 = 1_250_000;
/// Documents the clients write: mostly small, some near the largest (16 MiB).
const ENTRY_SMALL_BYTES_MIN: u64 = 100;
const ENTRY_SMALL_BYTES_MAX: u64 = 4 * 1024;
const DOC_NEAR_MAX_BYTES_MIN: u64 = 15 * 1024 * 1024;
const CLIENT_TIMEOUT_MS: u64 = 3_000;
const KILL_SYNCING_CHANCE: f64 = 1.0 / 3.0;
const KILL_SYNCING_WITHIN_MS: u64 = 400;
/// Clients stop this long before the end, so the final checks see a settled set.
const SETTLE_MS: u64 = 5_000;

pub struct Sim {
    seed: u64,
    opts: Options,
    now: u64,
    seq: u64,
    rng: Rng,
    queue: BinaryHeap<Reverse<Queued>>,
    /// Every slot: members of the first config, then spares a reconfig may add.
    members: Vec<Member>,
    /// Whether the slot's machine runs (spares do once added).
    provisioned: Vec<bool>,
    clients: Vec<Client>,
    txn_clients: Vec<txn::TxnClient>,
    /// Member pairs whose link is cut, by partition id.
    cut: BTreeSet<(usize, usize)>,
    partition_id: u64,
    loss: f64,
    lossy_id: u64,
    slow_ms: u64,
    faults_on: bool,
    checker: Checker,
    report: Report,
    notes: VecDeque<String>,
    stuck: Vec<String>,
}

const NOTES_KEPT: usize = 400;

impl Sim {
    pub fn new(seed: u64, opts: Options) -> Sim {
        let n = opts.members;
        let mut rng = Rng::new(seed);
        let members_doc: Vec<bson::Document> = (0..n)
            .map(|i| {
                let mut d = bson::doc! {"_id": i as i32, "host": member::host(i)};
                if i >= n - opts.non_voting {
                    d.insert("votes", 0);
                    d.insert("priority", 0);
                } else if i >= n - opts.non_voting - opts.unelectable {
                    d.insert("priority", 0);
                } else if opts.priorities && i < 2 {
                    d.insert("priority", 3 - i as i32);
                }
                d
            })
            .collect();
        let mut settings = bson::doc! {"electionTimeoutMillis": 1000, "heartbeatIntervalMillis": 200};
        settings.insert("chainingAllowed", opts.chaining);
        let mut config = ReplSetConfig::parse(&bson::doc! {"_id": "sim", "version": 1, "members": members_doc, "settings": settings}).expect("config");
        config.term = Some(0);
        let config = Arc::new(config);
        // replSetInitiate's "initiating set" entry, on every member (as after an initial sync).
        let genesis_at = OpTime { ts: 1 << 32, term: 0 };
        let genesis = [(genesis_at, member::entry(genesis_at, 0, None, 120))];
        assert!(opts.empty_members < n);
        let slots = n + opts.spare_slots;
        let members: Vec<Member> = (0..slots)
            .map(|i| {
                let empty = i >= n - opts.empty_members;
                let mut m = Member::new(i, config.clone(), if empty { &[] } else { &genesis[..] }, rng.range(0, 4001) as i64 - 2000);
                m.up = i < n;
                m
            })
            .collect();
        let provisioned = (0..slots).map(|i| i < n).collect();
        let clients = (0..opts.clients).map(|c| Client { op: 0, busy: None, next_value: (c as u64 + 1) << 40 }).collect();
        let txn_clients = (0..opts.txn_clients).map(|t| txn::TxnClient::new(t as u64 + 1, ((opts.clients + t) as u64 + 1) << 40)).collect();
        let checker = Checker {
            committed: vec![genesis_at],
            committed_set: [genesis_at].into_iter().collect(),
            verified: vec![(0, None); slots],
            primaries: BTreeMap::new(),
            acked_majority: BTreeMap::new(),
            last_cp: vec![(0, OpTime::default()); slots],
            last_read: BTreeMap::new(),
            kept: vec![OpTime::default(); slots],
            syncs_started: vec![0; slots],
            syncs_done: vec![0; slots],
            txns: txn::TxnChecker::default(),
        };
        let report = Report { seed, members: n, ..Report::default() };
        Sim {
            seed,
            opts,
            now: 0,
            seq: 0,
            rng,
            queue: BinaryHeap::new(),
            members,
            provisioned,
            clients,
            txn_clients,
            cut: BTreeSet::new(),
            partition_id: 0,
            loss: 0.0,
            lossy_id: 0,
            slow_ms: 0,
            faults_on: true,
            checker,
            report,
            notes: VecDeque::new(),
            stuck: Vec::new(),
        }
    }

    fn push(&mut self, delay: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse(Queued { at: self.now + delay, seq: self.seq, event }));
    }

    fn note(&mut self, s: String) {
        if self.opts.trace {
            println!("{:>7} {s}", self.now);
        }
        if self.notes.len() == NOTES_KEPT {
            self.notes.pop_front();
        }
        self.notes.push_back(format!("{:>7} {s}", self.now));
    }

    fn fail(&self, what: String) -> Failure {
        Failure { seed: self.seed, at_ms: self.now, what, trace: self.notes.iter().cloned().collect() }
    }

    /// Run to the end: faults for `fault_ms`, then healed for `quiet_ms`, then the final
    /// checks.
    pub fn run(mut self) -> Result<Report, Failure> {
        for m in 0..self.members.len() {
            if self.provisioned[m] {
                self.step_member(m, |mem, out| mem.start(out))?;
            }
        }
        for c in 0..self.clients.len() {
            let d = self.rng.below(50);
            self.push(d, Event::ClientNext(c));
        }
        for t in 0..self.txn_clients.len() {
            let d = self.rng.below(50);
            self.push(d, Event::TxnClientNext(t));
        }
        let first = self.rng.range(1000, 3000);
        self.push(first, Event::Nemesis);
        let fault_end = self.opts.fault_ms;
        let end = fault_end + self.opts.quiet_ms;
        let mut healed = false;
        while let Some(Reverse(q)) = self.queue.pop() {
            if q.at > end {
                break;
            }
            self.now = q.at;
            if !healed && self.now >= fault_end {
                healed = true;
                self.heal_all()?;
            }
            self.report.events += 1;
            self.dispatch(q.event)?;
        }
        self.now = end;
        self.final_checks()?;
        self.report.committed_entries = self.checker.committed.len() as u64;
        self.report.max_term = self.checker.primaries.keys().next_back().copied().unwrap_or(0);
        Ok(self.report)
    }

    fn dispatch(&mut self, event: Event) -> Result<(), Failure> {
        match event {
            Event::Deliver { from, to, msg } => {
                if self.link_cut(from, to) {
                    self.report.dropped += 1;
                    return Ok(());
                }
                if to >= self.members.len() + self.clients.len() {
                    let t = to - self.members.len() - self.clients.len();
                    return match msg {
                        Msg::TxnReply { op, term, result } => self.txn_client_reply(t, from, op, term, result),
                        _ => Ok(()),
                    };
                }
                if to >= self.members.len() {
                    return self.client_reply(to - self.members.len(), from, msg);
                }
                let m = &self.members[to];
                if !m.up {
                    // Nothing listens there: the connection is refused, and a fetcher
                    // waiting on it hears so at once.
                    self.report.dropped += 1;
                    if let Some(req) = msg.fetch_request() {
                        self.send(to, from, Msg::Reset { req });
                    }
                    return Ok(());
                }
                if m.paused_until > self.now {
                    let d = m.paused_until - self.now;
                    self.push(d, Event::Deliver { from, to, msg });
                    return Ok(());
                }
                if self.opts.trace {
                    self.note(format!("m{to} <- {} {}", self.endpoint(from), brief(&msg)));
                }
                self.step_member(to, |mem, out| mem.on_message(from, msg, out))
            }
            Event::Timer { member, incarnation, timer } => {
                let m = &self.members[member];
                if !m.up || m.incarnation != incarnation {
                    return Ok(());
                }
                if m.paused_until > self.now {
                    let d = m.paused_until - self.now;
                    self.push(d, Event::Timer { member, incarnation, timer });
                    return Ok(());
                }
                self.step_member(member, |mem, out| mem.on_timer(timer, out))
            }
            Event::ClientNext(c) => {
                self.client_next(c);
                Ok(())
            }
            Event::ClientTimeout { client, op } => {
                let cl = &mut self.clients[client];
                if let Some((o, write, majority)) = cl.busy {
                    if o == op {
                        cl.busy = None;
                        if write && majority {
                            self.report.writes_unknown += 1;
                        }
                        let d = self.rng.range(5, 40);
                        self.push(d, Event::ClientNext(client));
                    }
                }
                Ok(())
            }
            Event::TxnClientNext(t) => {
                self.txn_client_next(t);
                Ok(())
            }
            Event::TxnClientTimeout { client, op } => self.txn_client_timeout(client, op),
            Event::Nemesis => {
                if self.faults_on {
                    self.nemesis()?;
                    let d = self.rng.range(300, 2500);
                    self.push(d, Event::Nemesis);
                }
                Ok(())
            }
            Event::Restart(m) => self.restart(m),
            Event::KillSyncing(m) => {
                let mem = &self.members[m];
                if self.faults_on && (mem.state == MemberState::Startup2 || mem.sync_min_valid.is_some()) {
                    self.kill(m);
                }
                Ok(())
            }
            Event::HealPartition(id) => {
                if id == self.partition_id {
                    self.cut.clear();
                    self.note("partition healed".into());
                }
                Ok(())
            }
            Event::EndLossy(id) => {
                if id == self.lossy_id {
                    self.loss = 0.0;
                    self.slow_ms = 0;
                }
                Ok(())
            }
        }
    }

    fn endpoint(&self, i: usize) -> String {
        if i < self.members.len() {
            format!("m{i}")
        } else if i < self.members.len() + self.clients.len() {
            format!("c{}", i - self.members.len())
        } else {
            format!("x{}", i - self.members.len() - self.clients.len())
        }
    }

    fn link_cut(&self, a: usize, b: usize) -> bool {
        self.cut.contains(&(a.min(b), a.max(b)))
    }

    /// Run one member step and apply its effects, then check the invariants.
    fn step_member(&mut self, m: usize, f: impl FnOnce(&mut Member, &mut Out)) -> Result<(), Failure> {
        let mut out = Out { now: self.now, rng: &mut self.rng, sends: Vec::new(), timers: Vec::new(), notes: Vec::new() };
        f(&mut self.members[m], &mut out);
        self.members[m].after_step(&mut out);
        let Out { sends, timers, notes, .. } = out;
        for (to, msg) in sends {
            self.send(m, to, msg);
        }
        for (delay, member, incarnation, timer) in timers {
            self.push(delay, Event::Timer { member, incarnation, timer });
        }
        for note in notes {
            self.on_note(note)?;
        }
        self.check_member(m)
    }

    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        self.report.messages += 1;
        if self.link_cut(from, to) {
            self.report.dropped += 1;
            return;
        }
        let mut delay = 1 + self.rng.below(MSG_DELAY_MS_MAX) + msg.size_bytes() / LINK_BYTES_PER_MS;
        // A lost packet: TCP sends it again after its retransmission timeout (200 ms,
        // doubling), and the message arrives that much later.
        let mut rto = 200;
        while self.rng.chance(self.loss) {
            self.report.dropped += 1;
            delay += rto;
            rto *= 2;
        }
        if self.rng.chance(0.02) {
            delay += self.rng.below(200);
        }
        if self.slow_ms > 0 {
            delay += self.rng.below(self.slow_ms);
        }
        self.push(delay, Event::Deliver { from, to, msg });
    }

    fn on_note(&mut self, note: Note) -> Result<(), Failure> {
        match note {
            Note::Trace(s) => self.note(s),
            Note::BecamePrimary { member, term } => {
                self.report.primaries += 1;
                self.note(format!("m{member} is primary in term {term}"));
                if let Some(other) = self.checker.primaries.insert(term, member) {
                    return Err(self.fail(format!("two primaries in term {term}: m{other} and m{member}")));
                }
                // Every write a majority acknowledged is on every primary of a term after the
                // one that acknowledged it (Raft's leader completeness). A primary of an
                // earlier term may still take over late, after a long catch-up; it can commit
                // nothing, as the majority that elected the later term has moved on.
                let store = &self.members[member].store;
                let acked = self.checker.acked_majority.iter().filter(|(_, t)| **t < term).map(|(at, _)| at);
                if let Some(at) = member::missing_write(store, acked) {
                    return Err(self.fail(format!("m{member}, primary in term {term}, lacks the majority-acknowledged write {at:?}")));
                }
            }
            Note::AckedMajority { member, at, term } => {
                let first = *self.checker.acked_majority.entry(at).and_modify(|t| *t = (*t).min(term)).or_insert(term);
                let later = self.checker.primaries.range(first + 1..).next().map(|(t, m)| (*t, *m));
                if let Some((t, p)) = later {
                    // Not yet a loss if that primary has it; BecamePrimary checked it then.
                    if member::missing_write(&self.members[p].store, std::iter::once(&at)).is_some() {
                        self.note(format!("m{member} acknowledged {at:?} (w:majority) after m{p} became primary in term {t} without it"));
                    }
                }
            }
            Note::RollingBack { member, common, removed, commit_point } => {
                self.report.rollbacks += 1;
                self.report.rolled_back_entries += removed.len() as u64;
                self.note(format!("m{member} rolls back {} entries to {common:?}", removed.len()));
                if commit_point > common {
                    return Err(self
                        .fail(format!("m{member} rolls back to {common:?}, behind its commit point {commit_point:?}: a majority read saw writes now undone")));
                }
                if let Some(at) = removed.iter().find(|at| self.checker.acked_majority.contains_key(at)) {
                    return Err(self.fail(format!("m{member} rolls back the majority-acknowledged write {at:?}")));
                }
                // A member that never counted an entry committed (its commit point is checked
                // above) may still follow a primary of a stale term past it, as Raft's
                // followers truncate what their term's leader lacks; it is back once the
                // member learns the newer term. What may never happen: a committed entry left
                // on fewer than a majority of the voters.
                let config = self.members[member].config.clone();
                let held_elsewhere = |at: &OpTime| {
                    config
                        .members
                        .iter()
                        .enumerate()
                        .filter(|(j, m)| {
                            *j != member
                                && m.is_voter()
                                && self.provisioned.get(*j).copied().unwrap_or(false)
                                && member::holds_entry(&self.members[*j].store, *at)
                        })
                        .count()
                };
                if let Some(at) = removed.iter().find(|at| self.checker.committed_set.contains(at) && held_elsewhere(at) < config.write_majority_count()) {
                    return Err(self.fail(format!("m{member} rolls back the committed entry {at:?}, which fewer than a majority of the voters hold")));
                }
                // What was checked beyond the common point is gone: check it again from the
                // start (rare, so the rescan's cost does not matter).
                if self.checker.verified[member].1.is_some_and(|t| t > common.ts) {
                    self.checker.verified[member] = (0, None);
                }
                // The rollback took back the copied data after the common point too:
                // transactions whole.
                if member::has_copied_data(&self.members[member].store) {
                    self.check_data_atomic(member)?;
                }
            }
            Note::Stuck { member, why } => {
                self.note(format!("m{member} stuck: {why}"));
                self.stuck.push(format!("m{member}: {why}"));
            }
            Note::InitialSyncStarted { member, source, reason, had_oplog } => {
                self.report.initial_syncs_started += 1;
                self.checker.syncs_started[member] += 1;
                let (started, done) = (self.checker.syncs_started[member], self.checker.syncs_done[member]);
                if started > 1 {
                    self.report.initial_syncs_restarted += 1;
                }
                self.note(format!("m{member} starts initial sync #{started} from m{source}: {reason}"));
                // A member whose sync finished has an oplog and no flag: it never syncs again,
                // and never drops what it committed.
                if done > 0 {
                    return Err(self.fail(format!(
                        "m{member} starts initial sync #{started} ({reason}) after {done} finished (oplog {})",
                        if had_oplog { "not empty" } else { "empty" }
                    )));
                }
                // What it held is legitimately gone: nothing to keep, nothing checked.
                self.checker.kept[member] = OpTime::default();
                self.checker.verified[member] = (0, None);
                // A sync is short: a kill aimed at it (a third of the time) cuts it at any
                // step, so that syncs start over after a restart.
                if self.faults_on && self.rng.chance(KILL_SYNCING_CHANCE) {
                    let d = self.rng.range(1, KILL_SYNCING_WITHIN_MS);
                    self.push(d, Event::KillSyncing(member));
                }
            }
            Note::InitialSyncDone { member, begin, min_valid } => {
                self.report.initial_syncs_done += 1;
                self.checker.syncs_done[member] += 1;
                self.note(format!("m{member} finished its initial sync: oplog from {}, minValid {}", ot(begin), ot(min_valid)));
                // Its data is consistent from here: the copy and the oplog, transactions whole.
                self.check_data_atomic(member)?;
            }
            Note::TxnLogged { member, txn, at, keys, term } => self.on_txn_logged(member, txn, at, keys, term)?,
            Note::TxnsAborted { member, count, expired, why } => {
                if expired {
                    self.report.txns_expired += count;
                } else {
                    self.report.txns_aborted_by_failover += count;
                }
                self.note(format!("m{member} aborts {count} transactions in progress: {why}"));
            }
            Note::BatchRefused { member, source, bytes, entries } => {
                self.report.batches_refused += 1;
                self.note(format!("m{member} refuses m{source}'s reply of {entries} entries, {bytes} bytes"));
            }
        }
        Ok(())
    }

    /// The committed-prefix and monotonic-commit-point invariants for member `m`, and its
    /// transactions in progress.
    fn check_member(&mut self, m: usize) -> Result<(), Failure> {
        let mem = &self.members[m];
        if !mem.up {
            return Ok(());
        }
        self.check_open_txns(m)?;
        let mem = &self.members[m];
        let cp = mem.commit_point;
        let (inc, prev) = self.checker.last_cp[m];
        if inc == mem.incarnation && cp < prev {
            return Err(self.fail(format!("m{m}'s commit point went back from {prev:?} to {cp:?}")));
        }
        if mem.state == MemberState::Startup2 {
            // Initial sync: what it holds is about to go, or a copy not yet seeded.
            self.checker.last_cp[m] = (mem.incarnation, cp);
            self.checker.kept[m] = OpTime::default();
            self.checker.verified[m] = (0, None);
            return Ok(());
        }
        // What it had committed and durable survives its restarts (rollbacks are checked
        // as they happen, an initial sync only when it never finished one).
        let kept = self.checker.kept[m];
        // (An oplog that starts after it began with an initial sync since, at an entry
        // committed after it: that is no loss.)
        let starts_after = member::oldest_entry(&mem.store).is_some_and(|first| first.ts > kept.ts);
        if inc != mem.incarnation && kept > OpTime::default() && !starts_after && !member::holds_entry(&mem.store, kept) {
            return Err(self.fail(format!("m{m} lost its committed, durable entry {kept:?} across a restart")));
        }
        self.checker.kept[m] = kept.max(cp.min(mem.durable()));
        self.checker.last_cp[m] = (mem.incarnation, cp);
        let (mut count, last_ts) = self.checker.verified[m];
        if last_ts.is_some_and(|t| cp.ts <= t) {
            return Ok(());
        }
        let entries = member::oplog_between(&mem.store, last_ts, cp);
        if last_ts.is_none() {
            // A member that initial-synced holds the history from its begin entry on.
            if let Some(first) = entries.first() {
                if self.checker.committed.first() != Some(first) {
                    let first = *first;
                    if first.ts > self.checker.committed.last().map_or(0, |c| c.ts) {
                        self.fill_committed_through(first)?;
                    }
                    match self.checker.committed.binary_search_by_key(&first.ts, |c| c.ts) {
                        Ok(i) => count = i,
                        // Past the history checked so far, and no member holds the way there:
                        // checked once the history gets there.
                        Err(i) if i == self.checker.committed.len() => return Ok(()),
                        Err(_) => return Err(self.fail(format!("m{m}'s oldest entry {first:?}, committed, is not in the committed history"))),
                    }
                }
            }
        }
        for at in entries {
            match self.checker.committed.get(count) {
                Some(c) if *c == at => {}
                Some(c) => {
                    let c = *c;
                    return Err(self.fail(format!(
                        "m{m}'s committed prefix differs at entry {count}: {at:?} where the committed history has {c:?} (commit point {cp:?})"
                    )));
                }
                None => {
                    self.checker.committed.push(at);
                    self.checker.committed_set.insert(at);
                    self.check_committed_txn(at)?;
                }
            }
            count += 1;
            self.checker.verified[m] = (count, Some(at.ts));
        }
        Ok(())
    }

    /// `through` is committed (a member that initial-synced has it at or below its commit
    /// point, as the first entry of its oplog), and so is every entry before it: extend the
    /// committed history to it from a member whose oplog holds both the history's newest
    /// entry and `through` (log matching: it holds the same entries before them).
    fn fill_committed_through(&mut self, through: OpTime) -> Result<(), Failure> {
        let Some(&newest) = self.checker.committed.last() else { return Ok(()) };
        let holder = (0..self.members.len())
            .find(|&j| self.provisioned[j] && member::holds_entry(&self.members[j].store, newest) && member::holds_entry(&self.members[j].store, through));
        let Some(j) = holder else { return Ok(()) };
        for at in member::oplog_between(&self.members[j].store, Some(newest.ts), through) {
            self.checker.committed.push(at);
            self.checker.committed_set.insert(at);
            self.check_committed_txn(at)?;
        }
        Ok(())
    }

    // ---- clients ----

    fn client_next(&mut self, c: usize) {
        // The last seconds are for the set to settle: no new operations.
        if self.clients[c].busy.is_some() || self.now + SETTLE_MS >= self.opts.fault_ms + self.opts.quiet_ms {
            return;
        }
        let n = self.members.len();
        let write = self.rng.chance(0.7);
        let majority = self.rng.chance(0.75);
        let j = self.rng.chance(0.5);
        // Writes go where the client believes the primary is (any member that says so,
        // as a driver's topology view might); reads to any member.
        let primaries: Vec<usize> = (0..n).filter(|&i| self.members[i].up && self.members[i].state == MemberState::Primary).collect();
        let running: Vec<usize> = (0..n).filter(|&i| self.provisioned[i]).collect();
        let to = if write && !primaries.is_empty() {
            primaries[self.rng.below(primaries.len() as u64) as usize]
        } else {
            running[self.rng.below(running.len() as u64) as usize]
        };
        let size_bytes = if self.rng.chance(self.opts.large_entry_chance) {
            self.rng.range(DOC_NEAR_MAX_BYTES_MIN, common::limits::BSON_OBJECT_SIZE_MAX_BYTES as u64 + 1)
        } else {
            self.rng.range(ENTRY_SMALL_BYTES_MIN, ENTRY_SMALL_BYTES_MAX)
        };
        let key = self.rng.below(member::KEYS);
        let cl = &mut self.clients[c];
        cl.op += 1;
        let op = cl.op;
        cl.busy = Some((op, write, majority));
        let msg = if write {
            cl.next_value += 1;
            Msg::Write(txn::PlainWrite { op, key, value: cl.next_value, majority, j, size_bytes })
        } else {
            Msg::Read { op }
        };
        self.send(n + c, to, msg);
        self.push(CLIENT_TIMEOUT_MS, Event::ClientTimeout { client: c, op });
    }

    fn client_reply(&mut self, c: usize, from: usize, msg: Msg) -> Result<(), Failure> {
        let (op, outcome) = match &msg {
            Msg::WriteReply { op, result } => (*op, Some(result.clone())),
            Msg::ReadReply { op, .. } => (*op, None),
            _ => return Ok(()),
        };
        let Some((busy_op, _, majority)) = self.clients[c].busy else { return Ok(()) };
        if busy_op != op {
            return Ok(());
        }
        self.clients[c].busy = None;
        match outcome {
            Some(WriteResult::Ok(_)) if majority => self.report.writes_majority_acked += 1,
            Some(WriteResult::Ok(_)) => self.report.writes_w1_acked += 1,
            Some(WriteResult::SteppedDown) => self.report.writes_unknown += 1,
            Some(WriteResult::NotPrimary) => {}
            None => {
                if let Msg::ReadReply { result: Some((cp, values)), incarnation, .. } = msg {
                    self.report.reads += 1;
                    if let Some(at) = values.iter().flatten().map(|(at, _)| *at).find(|at| !self.checker.committed_set.contains(at)) {
                        return Err(self.fail(format!("c{c} read {at:?} from m{from} at commit point {cp:?}, not in the committed history")));
                    }
                    self.check_read_atomic(c, from, &values)?;
                    let at = values.iter().flatten().map(|(at, _)| *at).max().unwrap_or_default();
                    if let Some((i, prev)) = self.checker.last_read.insert((c, from), (incarnation, at)) {
                        if i == incarnation && at < prev {
                            return Err(self.fail(format!("c{c}'s majority reads from m{from} went back from {prev:?} to {at:?}")));
                        }
                    }
                }
            }
        }
        let d = self.rng.range(5, 40);
        self.push(d, Event::ClientNext(c));
        Ok(())
    }

    // ---- faults ----

    fn nemesis(&mut self) -> Result<(), Failure> {
        let n = self.members.len();
        let mut m = self.rng.below(n as u64) as usize;
        let kinds = if self.opts.reconfig { 8 } else { 7 };
        let kind = self.rng.below(kinds);
        // Half the kills of a run with an initial sync under way hit the syncing member.
        let syncing = (0..n).find(|&i| self.provisioned[i] && self.members[i].up && self.members[i].state == MemberState::Startup2);
        if let Some(s) = syncing.filter(|_| kind == 0 && self.rng.chance(0.5)) {
            m = s;
        }
        if !self.provisioned[m] && kind != 7 {
            return Ok(());
        }
        match kind {
            7 => self.reconfig()?,
            0 => self.kill(m),
            1 => {
                if self.members[m].up && self.members[m].paused_until <= self.now {
                    self.report.pauses += 1;
                    let d = self.rng.range(100, 3000);
                    self.note(format!("nemesis: SIGSTOP m{m} for {d} ms"));
                    self.members[m].paused_until = self.now + d;
                }
            }
            2 | 3 => {
                self.report.partitions += 1;
                let side: Vec<bool> = loop {
                    let s: Vec<bool> = (0..n).map(|_| self.rng.chance(0.5)).collect();
                    if s.iter().any(|&x| x) && s.iter().any(|&x| !x) {
                        break s;
                    }
                };
                // Half the time a bridge (Jepsen's): one member still reaches both sides,
                // which see each other only through it.
                let bridge = self.rng.chance(0.5).then(|| self.rng.below(n as u64) as usize);
                self.cut.clear();
                for a in 0..n {
                    for b in a + 1..n {
                        if side[a] != side[b] && bridge != Some(a) && bridge != Some(b) {
                            self.cut.insert((a, b));
                        }
                    }
                }
                self.partition_id += 1;
                let d = self.rng.range(200, 8000);
                self.note(format!("nemesis: partition {:?} bridged by {bridge:?} for {d} ms", (0..n).filter(|&i| side[i]).collect::<Vec<_>>()));
                let id = self.partition_id;
                self.push(d, Event::HealPartition(id));
            }
            4 => {
                self.report.lossy_periods += 1;
                self.loss = self.rng.range(5, 40) as f64 / 100.0;
                self.slow_ms = if self.rng.chance(0.5) { self.rng.range(20, 1500) } else { 0 };
                self.lossy_id += 1;
                let d = self.rng.range(500, 5000);
                self.note(format!("nemesis: loss {:.2}, delays up to {} ms, for {d} ms", self.loss, self.slow_ms));
                let id = self.lossy_id;
                self.push(d, Event::EndLossy(id));
            }
            5 => {
                self.report.clock_jumps += 1;
                let jump = self.rng.range(0, 6001) as i64 - 3000;
                self.note(format!("nemesis: m{m}'s wall clock jumps {jump} ms"));
                self.members[m].wall_offset_ms += jump;
            }
            _ => {
                let t = self.rng.below(n as u64) as usize;
                let mem = &mut self.members[m];
                if t != m && mem.up && mem.state != MemberState::Primary {
                    self.report.sync_from += 1;
                    mem.sync_from = Some(t);
                    self.note(format!("nemesis: replSetSyncFrom m{m} -> m{t}"));
                }
            }
        }
        Ok(())
    }

    /// replSetReconfig on the primary: add the next slot's member, empty (it initial-syncs),
    /// or remove the last member; one voter change at most, checked by the repl crate's
    /// rules as the server checks them.
    fn reconfig(&mut self) -> Result<(), Failure> {
        let n = self.members.len();
        let primaries: Vec<usize> =
            (0..n).filter(|&i| self.members[i].up && self.members[i].state == MemberState::Primary && self.members[i].paused_until <= self.now).collect();
        let Some(&p) = primaries.first() else {
            self.report.reconfigs_refused += 1;
            return Ok(());
        };
        let current = self.members[p].config.clone();
        let len = current.members.len();
        let mut d = current.to_doc();
        d.insert("version", current.version + 1);
        d.remove("term");
        let mut list: Vec<bson::Bson> = d.get_array("members").expect("members").clone();
        let add = len < n && (len <= self.opts.members || self.rng.chance(0.5));
        let slot = if add { len } else { len - 1 };
        if add {
            let mut m = bson::doc! {"_id": slot as i32, "host": member::host(slot)};
            match self.rng.below(3) {
                0 => {
                    m.insert("votes", 0);
                    m.insert("priority", 0);
                }
                1 => {
                    m.insert("priority", 0);
                }
                _ => {}
            }
            list.push(m.into());
        } else {
            list.pop();
        }
        d.insert("members", list);
        let new = ReplSetConfig::parse(&d).expect("a config the sim builds parses");
        let mut result = Ok(());
        self.step_member(p, |mem, out| result = mem.reconfig(new, out))?;
        if let Err(why) = result {
            self.report.reconfigs_refused += 1;
            self.note(format!("nemesis: replSetReconfig on m{p} ({} m{slot}) refused: {why}", if add { "add" } else { "remove" }));
            return Ok(());
        }
        self.report.reconfigs += 1;
        let config = self.members[p].config.clone();
        self.note(format!(
            "nemesis: replSetReconfig on m{p}: version {} of term {}, {} m{slot}",
            config.version,
            config.term.unwrap_or(0),
            if add { "adds" } else { "removes" }
        ));
        if add {
            self.report.members_added += 1;
            self.provision(slot, config)?;
        } else {
            self.report.members_removed += 1;
        }
        Ok(())
    }

    /// A new, empty machine at `slot` (replacing any removed member that ran there), with
    /// the config that adds it: the server's would learn it from the primary's first
    /// heartbeat.
    fn provision(&mut self, slot: usize, config: Arc<ReplSetConfig>) -> Result<(), Failure> {
        if self.provisioned[slot] && self.members[slot].up {
            let parked: Vec<(usize, u64)> = self.members[slot].parked.iter().map(|p| (p.from, p.req)).collect();
            for (from, req) in parked {
                self.send(slot, from, Msg::Reset { req });
            }
        }
        let old = &self.members[slot];
        let (incarnation, next_id) = (old.incarnation + 1, old.next_id);
        let drift = self.rng.range(0, 4001) as i64 - 2000;
        let mut fresh = Member::new(slot, config, &[], drift);
        // Messages and timers of the old machine are told apart from the new one's.
        fresh.incarnation = incarnation;
        fresh.next_id = next_id;
        self.members[slot] = fresh;
        self.provisioned[slot] = true;
        self.checker.verified[slot] = (0, None);
        self.checker.last_cp[slot] = (incarnation, OpTime::default());
        self.checker.kept[slot] = OpTime::default();
        self.checker.syncs_started[slot] = 0;
        self.checker.syncs_done[slot] = 0;
        self.checker.last_read.retain(|(_, m), _| *m != slot);
        self.note(format!("m{slot}: a new, empty machine starts"));
        self.step_member(slot, |mem, out| mem.start(out))
    }

    fn kill(&mut self, m: usize) {
        if !self.members[m].up {
            return;
        }
        self.report.crashes += 1;
        self.note(format!("nemesis: kill -9 m{m}"));
        self.report.txns_aborted_by_failover += self.members[m].txns.open_count();
        // Its connections break: the fetchers waiting on its cursors hear so.
        let parked: Vec<(usize, u64)> = self.members[m].parked.iter().map(|p| (p.from, p.req)).collect();
        for (from, req) in parked {
            self.send(m, from, Msg::Reset { req });
        }
        self.members[m].crash();
        let d = self.rng.range(100, 5000);
        self.push(d, Event::Restart(m));
    }

    fn restart(&mut self, m: usize) -> Result<(), Failure> {
        if self.members[m].up || !self.provisioned[m] {
            return Ok(());
        }
        self.note(format!("restart m{m}"));
        self.members[m].up = true;
        self.members[m].paused_until = 0;
        self.checker.verified[m] = (0, None);
        self.step_member(m, |mem, out| mem.start(out))
    }

    fn heal_all(&mut self) -> Result<(), Failure> {
        self.faults_on = false;
        self.cut.clear();
        self.loss = 0.0;
        self.slow_ms = 0;
        self.note("all faults healed".into());
        for m in 0..self.members.len() {
            self.members[m].paused_until = 0;
            if !self.members[m].up && self.provisioned[m] {
                self.restart(m)?;
            }
        }
        Ok(())
    }

    /// After the quiet period: one primary, identical oplogs, every majority write kept.
    fn final_checks(&mut self) -> Result<(), Failure> {
        if !self.stuck.is_empty() {
            return Err(self.fail(format!("members needed a resync: {:?}", self.stuck)));
        }
        let primaries: Vec<usize> = (0..self.members.len()).filter(|&i| self.provisioned[i] && self.members[i].state == MemberState::Primary).collect();
        let [p] = primaries[..] else {
            let states: Vec<String> = self.members.iter().map(|m| format!("m{} {:?} term {}", m.index, m.state, m.term)).collect();
            return Err(self.fail(format!("{} primaries after {} ms without faults: {states:?}", primaries.len(), self.opts.quiet_ms)));
        };
        let store = &self.members[p].store;
        let reference = member::oplog_between(store, None, self.members[p].last());
        if let Some(at) = member::missing_write(store, self.checker.acked_majority.keys()) {
            return Err(self.fail(format!("the majority-acknowledged write {at:?} is not on the primary m{p}")));
        }
        // A primary that initial-synced holds the history from its begin entry on.
        let (ours, known) = align(&reference, &self.checker.committed);
        if !ours.starts_with(known) {
            return Err(self.fail("the primary's oplog does not extend the committed history".into()));
        }
        self.report.large_entries = member::large_entries(store);
        // Data: where one side holds copied data (identical oplogs from genesis hold the
        // same writes).
        let primary_copied = member::has_copied_data(store);
        let data = if primary_copied { member::data_docs(store, None, usize::MAX) } else { Vec::new() };
        let mut data_from_oplog: Option<Vec<member::DataDoc>> = None;
        let config = self.members[p].config.clone();
        for i in 0..config.members.len() {
            let m = &self.members[i];
            // Liveness: once healed, a member that was behind catches up (a batch it could
            // never take would stall it here), within the quiet period's last SETTLE_MS
            // without writes.
            if m.last() != self.members[p].last() || !matches!(m.state, MemberState::Primary | MemberState::Secondary) {
                return Err(self.fail(format!(
                    "m{i} did not catch up in the {} ms after the faults healed: {:?} at {:?}, the primary m{p} at {:?}; fetch {:?}",
                    self.opts.quiet_ms,
                    m.state,
                    m.last(),
                    self.members[p].last(),
                    m.fetch
                )));
            }
            let log = member::oplog_between(&m.store, None, m.last());
            // A member that initial-synced holds the oplog from its begin entry on: the two
            // agree from the later start.
            let (a, b) = align(&log, &reference);
            if a != b {
                let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
                return Err(self.fail(format!(
                    "m{i}'s oplog ({} entries) differs from the primary m{p}'s ({}) at entry {at} of the part both hold, after the quiet period",
                    log.len(),
                    reference.len()
                )));
            }
            if !primary_copied && !member::has_copied_data(&m.store) {
                // Its data is its oplog's entries, each whole.
                self.final_txn_checks(i, None)?;
                continue;
            }
            let data = if primary_copied { &data } else { data_from_oplog.get_or_insert_with(|| member::data_docs(&self.members[p].store, None, usize::MAX)) };
            let theirs = member::data_docs(&m.store, None, usize::MAX);
            self.final_txn_checks(i, Some(&theirs))?;
            if theirs != *data {
                let at = theirs.iter().zip(data.iter()).position(|(a, b)| a != b).unwrap_or(theirs.len().min(data.len()));
                return Err(self.fail(format!(
                    "m{i}'s data ({} writes) differs from the primary m{p}'s ({}) at write {at}: {:?} where the primary has {:?}",
                    theirs.len(),
                    data.len(),
                    theirs.get(at),
                    data.get(at)
                )));
            }
        }
        Ok(())
    }
}

/// Two oplogs from the later one's first entry on (a member that initial-synced holds the
/// oplog from its begin entry).
fn align<'a>(a: &'a [OpTime], b: &'a [OpTime]) -> (&'a [OpTime], &'a [OpTime]) {
    match (a.first(), b.first()) {
        (Some(x), Some(y)) if x.ts < y.ts => (&a[a.iter().position(|o| o.ts >= y.ts).unwrap_or(a.len())..], b),
        (Some(x), Some(y)) if y.ts < x.ts => (a, &b[b.iter().position(|o| o.ts >= x.ts).unwrap_or(b.len())..]),
        _ => (a, b),
    }
}

/// An optime in a trace: term, then the timestamp's seconds (last 4 digits) and increment.
pub fn ot(at: OpTime) -> String {
    format!("t{}:{}.{}", at.term, at.secs() % 10_000, at.ts & 0xffff_ffff)
}

/// A message in a trace, without entry bodies.
fn brief(msg: &Msg) -> String {
    match msg {
        Msg::Batch { req, entries, cursor_lost, first_matches, oldest, newest, term, commit_point, .. } => format!(
            "Batch #{req} [{}] lost={cursor_lost} first_matches={first_matches} oldest={} newest={} term={term} cp={}",
            entries.iter().map(|(o, _)| ot(*o)).collect::<Vec<_>>().join(" "),
            oldest.map_or("-".into(), ot),
            newest.map_or("-".into(), ot),
            ot(*commit_point)
        ),
        Msg::GetMore { req, after, positions, .. } => format!(
            "GetMore #{req} after {} positions {}",
            ot(*after),
            positions.iter().map(|p| format!("m{}={}/{}", p.member, ot(p.applied), ot(p.durable))).collect::<Vec<_>>().join(" ")
        ),
        Msg::Find { req, from } => format!("Find #{req} from {}", ot(*from)),
        Msg::UpdatePosition { positions, .. } => {
            format!("UpdatePosition {}", positions.iter().map(|p| format!("m{}={}/{}", p.member, ot(p.applied), ot(p.durable))).collect::<Vec<_>>().join(" "))
        }
        other => format!("{other:?}"),
    }
}

/// Run one seed with the shape it draws.
pub fn run_seed(seed: u64, trace: bool) -> Result<Report, Failure> {
    let mut opts = Options::for_seed(seed);
    opts.trace = trace;
    Sim::new(seed, opts).run()
}
