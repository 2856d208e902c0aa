//! The replication coordinator of a `--replSet` member: its configuration (stored in
//! `local.system.replset`), its state and term, what it knows of the other members, and
//! what hello, replSetGetStatus and the write path ask of it. The protocol rules live in the
//! `repl` crate; this crate does the I/O around them, reaching the process it runs in only
//! through `Host`:
//!
//! - `member`: heartbeats to every other member, elections, and step-down (async tasks);
//! - `fetcher`: a secondary's oplog fetching, application, and progress reports upstream;
//! - `initial_sync`: an empty member's copy of the set's data before it fetches;
//! - `apply`: oplog application, idempotent;
//! - `shm`: the primary's position page and the shared-memory transport's ring;
//! - `strict`: strict reads' wait for where the primary's acknowledged writes reach;
//! - `fail_points`: a member's fail points.
//!
//! Locking: `inner` is a short-held mutex, never held across an await or a storage write
//! that can wait on the engine.

pub mod apply;
pub mod fail_points;
mod fetcher;
mod host;
mod initial_sync;
mod member;
pub mod reach;
pub mod shm;
pub mod strict;

pub use host::{Counters, Host, LogTransport};

use bson::{doc, Bson, DateTime, Document, Timestamp};
use common::{Code, Error, Result};
use parking_lot::Mutex;
use repl::progress::WMode;
use repl::sync_source::PeerView;
use repl::{election_id, MemberState, ReplSetConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use storage::{OpTime, Store};

pub use member::spawn_tasks;

/// The handlers of the member-to-member commands.
pub mod member_commands {
    pub use super::member::{freeze, heartbeat, reporter_term, request_votes, step_down_command, step_up, sync_from, update_position, update_positions};
}

const CONFIG_DB: &str = "local";
const CONFIG_COLLECTION: &str = "system.replset";
/// mongod keeps its last vote here, so a restarted member never votes twice in a term.
const ELECTION_COLLECTION: &str = "replset.election";
/// mongod's minValid: after a rollback or an initial sync, the optime the oplog must reach
/// before the data is consistent. Kept durably so a restart in between stays RECOVERING.
const MIN_VALID_COLLECTION: &str = "replset.minvalid";
/// mongod's initialSyncFlag: present from the start of an initial sync (before it drops
/// anything) until its oplog reaches minValid. A member starts an initial sync only when its
/// oplog is empty or this says an earlier one did not finish; never again once it has
/// finished.
const INITIAL_SYNC_FLAG_COLLECTION: &str = "replset.initialSyncFlag";
/// mongod's rollback id (replSetGetRBID): counts this member's rollbacks, durably. An
/// initial sync whose source's id moved while it copied may hold writes the set took back.
const ROLLBACK_ID_COLLECTION: &str = "replset.rollbackId";

/// The journal flusher's requests: whether a sync is asked for, and the newest entry the
/// sync taken or under way covers (`request_journal_flush_through`).
#[derive(Default)]
struct FlushRequests {
    requested: bool,
    covering: OpTime,
}

/// The flusher syncs at least this often while entries are not durable (mongod's
/// storage.journal.commitIntervalMs default).
const JOURNAL_COMMIT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

pub struct ReplCoord {
    pub set_name: String,
    /// "host:port" this member answers to when a config does not say otherwise.
    default_host: String,
    port: u16,
    oplog_size_bytes: u64,
    inner: Mutex<Inner>,
    /// `inner.state == Primary`, read by every command without taking the lock.
    primary: AtomicBool,
    /// topologyVersion.counter: bumped on every change hello reports, waking awaitable hellos.
    topology: tokio::sync::watch::Sender<i64>,
    /// Bumped on any replication progress (a member's optimes, the commit point, a role
    /// change): wakes read-concern and write-concern waiters (but w:"majority" ones, see
    /// `majority_waiters`).
    progress: tokio::sync::watch::Sender<u64>,
    /// Bumped when an optime this member reports upstream changes (its own, or a member's
    /// downstream), or its role or config does: wakes the progress reporter, which must not
    /// send a report for each commit point it learns (that doubled the reports).
    positions: tokio::sync::watch::Sender<u64>,
    /// w:"majority" waiters by the optime they wait for (mongod's replication waiter list):
    /// each is woken once, when a majority has its write durable or the role or config
    /// changes, instead of on every member's report. Lock order: `inner`, then this.
    majority_waiters: Mutex<MajorityWaiters>,
    /// Bumped when the config is installed or replaced: member tasks of an older config stop.
    config_epoch: AtomicU64,
    /// Wakes the member tasks at once (a newer config was seen, a role changed).
    pub wake: tokio::sync::Notify,
    /// Set once the background tasks run (`spawn_tasks`, which needs the `Host`).
    tasks_started: AtomicBool,
    /// Held while fetched entries are written to the oplog, and while this member becomes
    /// primary: no fetched entry lands after the "new primary" entry of its own term.
    /// Taken before `apply_lock` where both are.
    pub oplog_write_lock: Mutex<()>,
    /// Held while written entries are applied, and while this member becomes primary or
    /// rolls back. Apart from `oplog_write_lock`, so that a push stream's applier applies a
    /// batch while the fetcher writes the next.
    pub apply_lock: Mutex<()>,
    /// Set when a write leaves its fsync to the journal flusher thread (`journal_flush_loop`),
    /// which syncs and then counts this member's new durable optime.
    journal_flush: Mutex<FlushRequests>,
    journal_flush_wake: parking_lot::Condvar,
    /// The server state, for tasks that commands start (set by `spawn_tasks`).
    shared: std::sync::OnceLock<std::sync::Weak<dyn crate::Host>>,
    /// Where the primary stood, asked for strict-consistency reads (`strict`).
    pub primary_position: strict::PrimaryPosition,
    /// The newest cluster time clients gossiped (`$clusterTime`), as `secs << 32 | inc`.
    gossiped_cluster_time: AtomicU64,
    /// On a primary: the newest entry of a write whose reply was sent or is being sent
    /// (`secs << 32 | inc`). A strict-consistency read on a secondary must see this far.
    acknowledged_ts: AtomicU64,
    /// The same, and the term while primary, in shared memory for secondaries on this host
    /// (`shm`); None where /dev/shm is not available.
    pub position_page: Option<shm::PositionPage>,
}

/// What this member knows of another, from heartbeats and progress reports.
#[derive(Clone, Debug, Default)]
pub struct Peer {
    pub view: PeerView,
    pub durable: OpTime,
    pub applied_wall: Option<DateTime>,
    pub durable_wall: Option<DateTime>,
    pub term: i64,
    pub config_version: i32,
    pub config_term: i64,
    pub election_time: Option<Timestamp>,
    pub last_heartbeat: Option<DateTime>,
    pub last_heartbeat_recv: Option<DateTime>,
    /// When the member last answered a heartbeat (liveness for step-down and elections).
    pub last_response: Option<Instant>,
    pub message: String,
    pub up_since: Option<Instant>,
    /// Not a sync source before this: its oplog starts after our newest entry (mongod
    /// denylists a source it is too stale for).
    pub denied_until: Option<Instant>,
}

struct Inner {
    config: Option<ReplSetConfig>,
    /// This member's index in `config.members`.
    self_index: usize,
    state: MemberState,
    term: i64,
    /// When this member became primary (its "new primary" entry).
    election: Option<OpTime>,
    election_date: DateTime,
    /// Aligned with `config.members`; this member's own slot is unused.
    peers: Vec<Peer>,
    /// The newest optime a majority has durable, as known here.
    commit_point: OpTime,
    /// The term of the last vote this member cast (durable in local.replset.election).
    last_vote_term: Option<i64>,
    /// The member index this member fetches from.
    sync_source: Option<usize>,
    /// The last time this member heard from a primary of its term, or became secondary.
    primary_seen: Instant,
    /// A secondary stands for election when `primary_seen` is older than this.
    election_timeout: Duration,
    /// No election of this member before this (replSetFreeze, replSetStepDown).
    frozen_until: Instant,
    election_running: bool,
    /// Why replication stopped, when it did (shown in replSetGetStatus.infoMessage).
    info_message: String,
    /// Since when this member has qualified for a priority takeover (member::tick_loop).
    pub takeover_since: Option<Instant>,
    /// The latest initial sync's progress (replSetGetStatus initialSyncStatus).
    pub initial_sync: initial_sync::Stats,
    /// After a rollback: RECOVERING until the oplog is applied up to here.
    min_valid: Option<OpTime>,
    /// The minValid of an initial sync this process seeded the oplog for, until it is
    /// applied: meanwhile a divergence from the source starts the sync over
    /// (`restart_initial_sync`), since the copy may hold writes the set took back.
    pub sync_pending: Option<OpTime>,
    /// replSetSyncFrom: the member to fetch from next, whatever the usual choice.
    sync_from: Option<usize>,
}

#[derive(Default)]
struct MajorityWaiters {
    next_id: u64,
    by_optime: std::collections::BTreeMap<(OpTime, u64), tokio::sync::oneshot::Sender<()>>,
    /// Waiters that gave up (timed out) are swept out when there are this many: twice as
    /// many as the last sweep left, and at least MAJORITY_WAITERS_SWEEP_MIN, so sweeping
    /// costs O(1) per wait however many connections wait.
    sweep_at: usize,
}

const MAJORITY_WAITERS_SWEEP_MIN: usize = 64;

/// How a write-concern wait stands.
#[derive(Debug, PartialEq)]
pub enum WcStatus {
    Satisfied,
    Pending,
    /// The member is no longer the primary that took the write.
    SteppedDown,
}

impl ReplCoord {
    /// Load the stored configuration, if any, and take up the member's role.
    pub fn start(store: &Store, set_name: String, default_host: String, port: u16, oplog_size_bytes: u64) -> Result<ReplCoord> {
        let now = Instant::now();
        let coord = ReplCoord {
            set_name,
            default_host,
            port,
            oplog_size_bytes,
            inner: Mutex::new(Inner {
                config: None,
                self_index: 0,
                state: MemberState::Startup,
                term: 0,
                election: None,
                election_date: DateTime::now(),
                peers: Vec::new(),
                commit_point: OpTime::default(),
                last_vote_term: None,
                sync_source: None,
                primary_seen: now,
                election_timeout: Duration::from_secs(10),
                frozen_until: now,
                election_running: false,
                info_message: String::new(),
                initial_sync: Default::default(),
                takeover_since: None,
                min_valid: None,
                sync_pending: None,
                sync_from: None,
            }),
            primary: AtomicBool::new(false),
            topology: tokio::sync::watch::Sender::new(0),
            progress: tokio::sync::watch::Sender::new(0),
            positions: tokio::sync::watch::Sender::new(0),
            majority_waiters: Mutex::new(MajorityWaiters::default()),
            primary_position: strict::PrimaryPosition::default(),
            gossiped_cluster_time: AtomicU64::new(0),
            acknowledged_ts: AtomicU64::new(0),
            position_page: shm::PositionPage::create(port),
            config_epoch: AtomicU64::new(0),
            wake: tokio::sync::Notify::new(),
            tasks_started: AtomicBool::new(false),
            oplog_write_lock: Mutex::new(()),
            apply_lock: Mutex::new(()),
            journal_flush: Mutex::new(FlushRequests::default()),
            journal_flush_wake: parking_lot::Condvar::new(),
            shared: std::sync::OnceLock::new(),
        };
        // Until this member is primary, deletions come from the primary's oplog only.
        store.set_ttl_deletes_enabled(false);
        let stored = first_doc(store, CONFIG_COLLECTION)?;
        if let Some(d) = stored {
            let config = ReplSetConfig::parse(&d)?;
            store.enable_oplog(oplog_size_bytes)?;
            // Transactions prepared before the restart are kept prepared again first: the
            // entries applied next may decide them.
            let prepared = crate::apply::recover_prepared(store)?;
            if prepared > 0 {
                tracing::info!(prepared, "found the transactions prepared before the restart");
            }
            // A secondary stopped between writing a batch to its oplog and applying it
            // applies the rest now, before anything reads or fetches.
            let applied = crate::apply::apply_unapplied(store)?;
            if applied > 0 {
                store.commit_durable()?;
                tracing::info!(applied, "applied the oplog entries written before the restart");
            }
            let last = store.oplog_last().unwrap_or_default();
            let vote = first_doc(store, ELECTION_COLLECTION)?;
            {
                let mut inner = coord.inner.lock();
                inner.term = last.term.max(vote.as_ref().and_then(|v| v.get_i64("term").ok()).unwrap_or(0));
                inner.last_vote_term = vote.as_ref().and_then(|v| v.get_i64("term").ok());
            }
            store.set_oplog_term(coord.inner.lock().term);
            coord.install_config(store, config)?;
            let min_valid = first_doc(store, MIN_VALID_COLLECTION)?.as_ref().and_then(OpTime::from_doc);
            if let Some(mv) = min_valid.filter(|mv| last < *mv) {
                tracing::info!(?mv, ?last, "restarted before reaching minValid: recovering");
                coord.inner.lock().min_valid = Some(mv);
                coord.set_state(MemberState::Recovering);
            }
        }
        Ok(coord)
    }

    /// Why this member must copy the set's data before it can fetch (initial sync), if it
    /// must: its oplog is empty (it never synced), or an earlier sync did not finish. A
    /// member whose sync finished has oplog entries and no flag, and never syncs again.
    pub fn initial_sync_reason(&self, store: &Store) -> Result<Option<String>> {
        if self.inner.lock().sync_pending.is_some() {
            // Seeded by this process: the fetcher catches up from the copy's begin.
            return Ok(None);
        }
        if let Some(flag) = first_doc(store, INITIAL_SYNC_FLAG_COLLECTION)? {
            let since = flag.get_datetime("startedAt").map(|d| d.try_to_rfc3339_string().unwrap_or_default()).unwrap_or_default();
            return Ok(Some(format!("an initial sync started at {since} did not finish")));
        }
        if store.oplog_last().unwrap_or_default() == OpTime::default() {
            return Ok(Some("this member's oplog is empty".to_string()));
        }
        Ok(None)
    }

    /// Set (durably) or clear the initial-sync flag (`initial_sync_reason`).
    pub fn persist_initial_sync_flag(store: &Store, set: bool) -> Result<()> {
        if set {
            return put_single_doc(store, INITIAL_SYNC_FLAG_COLLECTION, &doc! {"_id": "initialSyncFlag", "startedAt": bson::DateTime::now()});
        }
        if let Some(c) = store.collection(CONFIG_DB, INITIAL_SYNC_FLAG_COLLECTION) {
            let mut w = c.writer();
            for (rid, d) in w.snapshot().scan(None, usize::MAX)? {
                w.delete(rid, &d)?;
            }
        }
        store.commit_durable()
    }

    /// This member's rollback id (0 before its first rollback).
    pub fn rollback_id(store: &Store) -> Result<i32> {
        Ok(first_doc(store, ROLLBACK_ID_COLLECTION)?.and_then(|d| d.get_i32("rollbackId").ok()).unwrap_or(0))
    }

    /// Count a rollback, durably, before it changes anything.
    pub fn bump_rollback_id(store: &Store) -> Result<i32> {
        let next = Self::rollback_id(store)?.wrapping_add(1);
        put_single_doc(store, ROLLBACK_ID_COLLECTION, &doc! {"_id": "rollbackId", "rollbackId": next})?;
        Ok(next)
    }

    /// An initial sync's oplog is seeded: RECOVERING until `min_valid`; until then a
    /// divergence from the source starts the sync over.
    pub fn recover_from_initial_sync(&self, min_valid: OpTime, applied: OpTime) {
        self.inner.lock().sync_pending = Some(min_valid);
        self.recover_until(min_valid, applied);
    }

    /// Give up an initial sync whose copy may not be on the set's history (its source's
    /// oplog diverged from ours before minValid was applied): the flag is set again, and the
    /// fetcher copies again. The tail under way ends (`fetcher::superseded`: STARTUP2).
    pub fn restart_initial_sync(&self, store: &Store, why: &str) {
        tracing::info!("the initial sync starts over: {why}");
        if let Err(e) = Self::persist_initial_sync_flag(store, true) {
            tracing::error!("cannot set the initial-sync flag: {}", e.message);
        }
        {
            let mut inner = self.inner.lock();
            inner.sync_pending = None;
            inner.min_valid = None;
            inner.state = MemberState::Startup2;
        }
        self.changed();
    }

    /// The minValid last recorded (`persist_min_valid`), if any.
    pub fn persisted_min_valid(store: &Store) -> Option<OpTime> {
        first_doc(store, MIN_VALID_COLLECTION).ok().flatten().as_ref().and_then(OpTime::from_doc)
    }

    /// Record `min_valid` durably, before the rollback or initial sync that needs it makes
    /// its changes to the oplog (a restart then finds it and stays RECOVERING).
    pub fn persist_min_valid(store: &Store, min_valid: OpTime) -> Result<()> {
        let mut d = doc! {"_id": "minValid"};
        d.extend(min_valid.to_doc());
        put_single_doc(store, MIN_VALID_COLLECTION, &d)
    }

    /// The member of `config` that is this node: its port is ours and its host names this
    /// machine (a loopback address, localhost, our host name, or an address we listen on).
    fn self_index(&self, config: &ReplSetConfig) -> Option<usize> {
        let ours = |host: &str| {
            let (name, port) = match host.rsplit_once(':') {
                Some((n, p)) => (n, p.parse::<u16>().ok()),
                None => (host, Some(27017)),
            };
            let default_name = self.default_host.rsplit_once(':').map(|(h, _)| h);
            // Several members may share this machine on loopback addresses (127.0.0.x, one
            // port): when we listen on a loopback address, only that address (or localhost
            // for 127.0.0.1) is us.
            let loopback_ours = match default_name {
                Some(d) if d.starts_with("127.") => name == d || (d == "127.0.0.1" && name.eq_ignore_ascii_case("localhost")),
                _ => name.eq_ignore_ascii_case("localhost") || name.starts_with("127.") || name == "::1",
            };
            port == Some(self.port) && (loopback_ours || default_name.is_some_and(|h| h.eq_ignore_ascii_case(name)))
        };
        config.members.iter().position(|m| ours(&m.host))
    }

    /// Take up `config`: the member's index and role in it. A set whose only electable voter
    /// is this member elects it at once (a new term, logged as mongod logs it); otherwise
    /// the member starts as a secondary and elections decide.
    fn install_config(&self, store: &Store, config: ReplSetConfig) -> Result<()> {
        let self_index = self
            .self_index(&config)
            .ok_or_else(|| Error::new(Code::NodeNotFound, format!("the replica set config has no member that is this node (port {})", self.port)))?;
        let me = config.members[self_index].clone();
        let alone = config.members.iter().enumerate().all(|(i, m)| i == self_index || !m.is_voter()) && me.is_electable();
        // A member with nothing in its oplog (or whose initial sync did not finish) has no
        // data to serve yet: it stays in STARTUP2 until an initial sync (repl::initial_sync)
        // has copied the set's data.
        let empty = self.initial_sync_reason(store)?.is_some();
        {
            let mut inner = self.inner.lock();
            let old_peers = std::mem::take(&mut inner.peers);
            let old_hosts: Vec<String> = inner.config.as_ref().map(|c| c.members.iter().map(|m| m.host.clone()).collect()).unwrap_or_default();
            inner.peers = config
                .members
                .iter()
                .map(|m| old_hosts.iter().position(|h| *h == m.host).and_then(|i| old_peers.get(i).cloned()).unwrap_or_default())
                .collect();
            inner.sync_source = None;
            inner.sync_from = None;
            inner.self_index = self_index;
            inner.election_timeout = Duration::from_millis(repl::election::randomized_timeout_ms(config.settings.election_timeout_ms, rand::random()));
            inner.primary_seen = Instant::now();
            let stays_primary = inner.state == MemberState::Primary && me.is_electable();
            if !stays_primary {
                inner.state = match inner.state {
                    _ if me.arbiter_only => MemberState::Arbiter,
                    // A rollback or the recovery after it is not over because the config changed.
                    s @ (MemberState::Rollback | MemberState::Recovering) => s,
                    _ if empty && !alone => MemberState::Startup2,
                    _ => MemberState::Secondary,
                };
                self.primary.store(false, Ordering::SeqCst);
                if let Some(p) = &self.position_page {
                    p.set_primary(None);
                }
            }
            inner.config = Some(config.clone());
        }
        self.config_epoch.fetch_add(1, Ordering::SeqCst);
        if alone && !self.is_writable_primary() {
            // One change for hello to report: primary (become_primary announces it).
            let term = self.inner.lock().term + 1;
            return self.become_primary(store, term);
        }
        self.changed();
        Ok(())
    }

    /// Win term `term`: stamp new entries with it and log "new primary".
    fn become_primary(&self, store: &Store, term: i64) -> Result<()> {
        // Entries this member wrote as a secondary are applied before it writes its own.
        crate::apply::apply_unapplied(store)?;
        store.set_oplog_term(term);
        let at = store.append_oplog_noop(&doc! {"msg": "new primary"})?;
        {
            let mut inner = self.inner.lock();
            inner.term = term;
            if let Some(c) = inner.config.as_mut() {
                c.term = Some(term);
            }
            inner.state = MemberState::Primary;
            inner.election = Some(at);
            inner.election_date = DateTime::now();
            inner.sync_source = None;
            let me = inner.self_index;
            for (i, p) in inner.peers.iter_mut().enumerate() {
                if i != me && p.view.state == Some(MemberState::Primary) {
                    p.view.state = Some(MemberState::Secondary);
                }
            }
            self.primary.store(true, Ordering::SeqCst);
            if let Some(p) = &self.position_page {
                // Whatever this member acknowledged in an earlier term is durable here.
                p.note_acknowledged(store.oplog_durable().unwrap_or_default().ts);
                p.set_primary(Some(term));
            }
        }
        store.set_ttl_deletes_enabled(true);
        self.changed();
        tracing::info!(term, "this member is primary");
        Ok(())
    }

    /// Stop being primary (a higher term was seen, the majority was lost, or replSetStepDown).
    /// Write-concern waiters see `SteppedDown`.
    pub fn step_down(&self, why: &str) {
        let mut inner = self.inner.lock();
        if inner.state != MemberState::Primary {
            return;
        }
        inner.state = MemberState::Secondary;
        inner.primary_seen = Instant::now();
        self.primary.store(false, Ordering::SeqCst);
        if let Some(p) = &self.position_page {
            p.set_primary(None);
        }
        drop(inner);
        tracing::info!("stepping down: {why}");
        self.changed();
    }

    /// A higher term was seen: adopt it; a primary steps down. The oplog's stamp keeps the
    /// term this member last won (`become_primary` sets it): a write already admitted while
    /// it was primary logs in that term, never in one another member leads.
    pub fn observe_term(&self, term: i64) {
        let stepped = {
            let mut inner = self.inner.lock();
            if term <= inner.term {
                return;
            }
            inner.term = term;
            inner.state == MemberState::Primary
        };
        if stepped {
            self.step_down(&format!("a member is in the higher term {term}"));
        }
    }

    /// Something hello or the waiters care about changed.
    fn changed(&self) {
        self.positions.send_modify(|c| *c += 1);
        for (_, tx) in std::mem::take(&mut self.majority_waiters.lock().by_optime) {
            let _ = tx.send(());
        }
        self.topology.send_modify(|c| *c += 1);
        self.progress.send_modify(|c| *c += 1);
        self.wake.notify_waiters();
    }

    /// replSetInitiate: validate, check that every member answers, store the config, start
    /// the oplog, and take up the member's role.
    pub fn initiate(&self, store: &Store, arg: Option<&Document>) -> Result<Document> {
        if self.inner.lock().config.is_some() || store.collection(CONFIG_DB, CONFIG_COLLECTION).is_some_and(|c| c.stats().count > 0) {
            return Err(Error::new(Code::AlreadyInitialized, "already initialized"));
        }
        let mut config = match arg {
            Some(d) => ReplSetConfig::parse(d)?,
            None => ReplSetConfig::parse(&doc! {"_id": self.set_name.clone(), "version": 1, "members": [{"_id": 0, "host": self.default_host.clone()}]})?,
        };
        if config.set_name != self.set_name {
            return Err(Error::new(
                Code::InvalidReplicaSetConfig,
                format!("Attempting to initiate a replica set with name {}, but command line reports {}; rejecting", config.set_name, self.set_name),
            ));
        }
        config.validate()?;
        let Some(self_index) = self.self_index(&config) else {
            return Err(Error::new(
                Code::InvalidReplicaSetConfig,
                format!(
                    "No host described in new configuration with {{version: {}, term: 0}} for replica set {} maps to this node",
                    config.version, self.set_name
                ),
            ));
        };
        if config.members.len() > 1 {
            // mongod's quorum check: every member must answer, and none may be in a set yet.
            let handle = tokio::runtime::Handle::current();
            handle.block_on(member::check_quorum_for_initiate(&config, self_index))?;
        }
        config.settings.replica_set_id.get_or_insert_with(bson::oid::ObjectId::new);
        config.term = Some(0);
        store_config(store, &config)?;
        store.enable_oplog(self.oplog_size_bytes)?;
        store.append_oplog_noop(&doc! {"msg": "initiating set"})?;
        self.install_config(store, config)?;
        // The initiator stands first, once the others have fetched the config (one round of
        // heartbeats), rather than after a whole election timeout.
        {
            let mut inner = self.inner.lock();
            let hb = inner.config.as_ref().map_or(2000, |c| c.settings.heartbeat_interval_ms) as u64;
            let wait = inner.election_timeout.saturating_sub(Duration::from_millis(hb.max(200)));
            inner.primary_seen = Instant::now().checked_sub(wait).unwrap_or_else(Instant::now);
        }
        Ok(Document::new())
    }

    /// replSetReconfig: a primary installs a new config (version higher, one voter change at
    /// a time); heartbeats carry it to the other members. `force` installs it on any member
    /// that is in it, with the version raised past any the set may have used.
    pub fn reconfig(&self, store: &Store, arg: &Document, force: bool) -> Result<Document> {
        let (current, term, primary) = {
            let inner = self.inner.lock();
            let current = inner.config.clone().ok_or_else(not_initialized)?;
            (current, inner.term, inner.state == MemberState::Primary)
        };
        if !primary && !force {
            return Err(Error::new(Code::NotWritablePrimary, "replSetReconfig should only be run on a writable PRIMARY. Current state SECONDARY;"));
        }
        let mut new = ReplSetConfig::parse(arg)?;
        new.validate()?;
        current.check_reconfig(&new, force)?;
        let Some(self_index) = self.self_index(&new) else {
            return Err(Error::new(
                Code::InvalidReplicaSetConfig,
                format!(
                    "No host described in new configuration with {{version: {}, term: {term}}} for replica set {} maps to this node",
                    new.version, self.set_name
                ),
            ));
        };
        if primary && !new.members[self_index].is_electable() {
            return Err(Error::new(Code::InvalidReplicaSetConfig, "This node, the primary, would not be electable in the new configuration; step down first"));
        }
        if force {
            // mongod adds a large random amount, so a forced config outranks any the old
            // majority may still be spreading.
            new.version = new.version.max(current.version).saturating_add(10_000 + (rand::random::<u16>() as i32));
        }
        new.settings.replica_set_id = current.settings.replica_set_id;
        new.term = Some(term);
        let version = new.version;
        store_config(store, &new)?;
        self.install_config(store, new)?;
        tracing::info!(version, "replica set reconfigured");
        Ok(Document::new())
    }

    /// Why write concern `w` cannot be satisfied by this set, if it cannot: more members than
    /// bear data, or a mode that is not in getLastErrorModes or that the members' tags cannot
    /// meet.
    pub fn unsatisfiable(&self, w: &Bson) -> Option<Error> {
        let inner = self.inner.lock();
        let config = inner.config.as_ref()?;
        let mode = WMode::from_w(Some(w))?;
        // Every member at the same optime: whether the set could ever meet the mode.
        match repl::progress::write_concern_met(config, &mode, OpTime::default(), |_| OpTime::default()) {
            Ok(true) => None,
            Ok(false) if matches!(mode, WMode::Tag(_)) => {
                let WMode::Tag(name) = mode else { unreachable!() };
                Some(Error::new(Code::UnsatisfiableWriteConcern, format!("Not enough nodes match write concern mode \"{name}\"")))
            }
            Ok(false) => Some(Error::new(Code::UnsatisfiableWriteConcern, "Not enough data-bearing nodes")),
            Err(name) => Some(Error::new(Code::UnknownReplWriteConcern, format!("No write concern mode named '{name}' found in replica set configuration"))),
        }
    }

    /// Whether a write at `at` has reached the members `mode` needs (`durable`: in their
    /// journals, else applied; `own_durable`: in this member's journal in any case).
    pub fn write_concern_status(&self, store: &Store, at: OpTime, mode: &WMode, durable: bool, own_durable: bool) -> WcStatus {
        let inner = self.inner.lock();
        let Some(config) = &inner.config else { return WcStatus::Satisfied };
        if inner.state != MemberState::Primary || inner.term != at.term {
            return WcStatus::SteppedDown;
        }
        let me = inner.self_index;
        let own = if durable || own_durable { store.oplog_durable() } else { store.oplog_last() }.unwrap_or_default();
        // A journaled write is durable here before anyone acknowledges it: w:1 is met by any
        // one member, and a secondary that fetched and applied the entry before this
        // member's sync ended must not stand in for its journal.
        if own_durable && own < at {
            return WcStatus::Pending;
        }
        let optime_of = |i: usize| {
            if i == me {
                own
            } else if durable {
                inner.peers[i].durable
            } else {
                // A secondary acknowledges a batch once it is durable in its oplog and
                // applies it after (mongod 8.0 counts such a member's lastWritten), so what
                // it has durable it has at least written.
                inner.peers[i].view.applied.max(inner.peers[i].durable)
            }
        };
        match repl::progress::write_concern_met(config, mode, at, optime_of) {
            Ok(true) => WcStatus::Satisfied,
            _ => WcStatus::Pending,
        }
    }

    /// Resolves once writeMajorityCount voting members may have made `at` durable, or the
    /// role or config changed: a w:"majority" waiter then checks `write_concern_status`.
    pub fn majority_durable_waiter(&self, store: &Store, at: OpTime) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let inner = self.inner.lock();
        if inner.state != MemberState::Primary || majority_durable(store, &inner).is_some_and(|m| m >= at) {
            let _ = tx.send(());
            return rx;
        }
        // Registered under `inner`, which a report holds while it computes whom to wake.
        let mut w = self.majority_waiters.lock();
        if w.by_optime.len() >= w.sweep_at.max(MAJORITY_WAITERS_SWEEP_MIN) {
            w.by_optime.retain(|_, t| !t.is_closed());
            w.sweep_at = 2 * w.by_optime.len();
        }
        w.next_id += 1;
        let id = w.next_id;
        w.by_optime.insert((at, id), tx);
        rx
    }

    /// Wake the w:"majority" waiters whose optime a majority now has durable.
    fn wake_majority_waiters(&self, store: &Store, inner: &Inner) {
        let mut w = self.majority_waiters.lock();
        if w.by_optime.is_empty() {
            return;
        }
        let Some(m) = majority_durable(store, inner) else { return };
        while let Some(e) = w.by_optime.first_entry() {
            if e.key().0 > m {
                break;
            }
            let _ = e.remove().send(());
        }
    }

    /// Changes whenever this member has new optimes to report upstream (see `positions`).
    pub fn position_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.positions.subscribe()
    }

    /// Changes whenever replication makes progress (see `progress`).
    pub fn progress_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.progress.subscribe()
    }

    /// Whether writes must wait for other members at all (a set with more than one
    /// data-bearing member).
    pub fn replicates(&self) -> bool {
        self.inner.lock().config.as_ref().is_some_and(|c| c.members.iter().filter(|m| !m.arbiter_only).count() > 1)
    }

    /// The commit point on a primary: advanced from the members' durable optimes.
    fn advance_commit_point(&self, store: &Store, inner: &mut Inner) {
        let Some(config) = &inner.config else { return };
        let me = inner.self_index;
        let own = if inner.state == MemberState::Primary { store.oplog_durable().unwrap_or_default() } else { return };
        let peers = &inner.peers;
        let cp = repl::progress::advance_commit_point(config, inner.commit_point, inner.term, |i| if i == me { own } else { peers[i].durable });
        if cp != inner.commit_point {
            inner.commit_point = cp;
            // Majority reads wait for it (woken without holding the lock: watch receivers
            // only read a counter).
            self.progress.send_modify(|c| *c += 1);
        }
    }

    /// Have the journal flusher make this member's applied writes durable soon.
    pub fn request_journal_flush(&self) {
        let mut flush = self.journal_flush.lock();
        if !flush.requested {
            flush.requested = true;
            self.journal_flush_wake.notify_one();
        }
    }

    /// A wait for this member's own journal to reach `at` (a write concern, a majority
    /// read): have the flusher sync unless a sync that covers `at` is already asked for or
    /// under way. The write that logged `at` may not have asked (w:0, j:false), nor may
    /// the command now waiting (a no-op write waits for the newest entry): without this the
    /// wait lasted until some later write asked, or the flusher's interval.
    pub fn request_journal_flush_through(&self, store: &Store, at: OpTime) {
        if store.oplog_durable().is_some_and(|d| d >= at) {
            return;
        }
        let mut flush = self.journal_flush.lock();
        if !flush.requested && flush.covering < at {
            flush.requested = true;
            self.journal_flush_wake.notify_one();
        }
    }

    /// The journal flusher (mongod has one too): wait for a request, sync (a group commit:
    /// writers that sync themselves share it), and count the new durable optime toward the
    /// waiting write concerns and the commit point. One thread, so a burst of writes takes
    /// one fsync and no thread blocked for it.
    /// Without requests it still syncs every `JOURNAL_COMMIT_INTERVAL` while entries are not
    /// durable (mongod's storage.journal.commitIntervalMs), so no durability depends on a
    /// later write's request.
    pub fn journal_flush_loop(&self, store: &Store) {
        loop {
            {
                let mut flush = self.journal_flush.lock();
                while !flush.requested {
                    let timed_out = self.journal_flush_wake.wait_for(&mut flush, JOURNAL_COMMIT_INTERVAL).timed_out();
                    if timed_out && store.oplog_durable() < store.oplog_last() {
                        break;
                    }
                }
                flush.requested = false;
                // Every write applied before the sync starts is durable after it.
                flush.covering = store.oplog_last().unwrap_or_default();
            }
            if let Some(d) = crate::fail_points::journal_flush_delay() {
                std::thread::sleep(d);
            }
            if let Err(e) = store.commit_durable() {
                // Every later sync fails too (storage treats a failed fsync as fatal, as
                // mongod does): stop taking writes, so that the waiting ones fail with
                // PrimarySteppedDown instead of waiting for a durability that cannot come.
                tracing::error!("journal flush failed: {}", e.message);
                self.step_down("the journal cannot be synced");
                std::thread::sleep(std::time::Duration::from_secs(1));
                continue;
            }
            let mut inner = self.inner.lock();
            if inner.state == MemberState::Primary {
                self.advance_commit_point(store, &mut inner);
                self.wake_majority_waiters(store, &inner);
                drop(inner);
                // Other write concerns re-check on any progress.
                self.progress.send_modify(|c| *c += 1);
            }
        }
    }

    /// A commit point another member told this one of: its sync source (`from_sync_source`)
    /// or a primary's heartbeat (repl::progress::learn_commit_point says what is taken).
    pub fn learn_commit_point(&self, store: &Store, cp: OpTime, from_sync_source: bool) {
        let mut inner = self.inner.lock();
        if inner.state == MemberState::Primary {
            return;
        }
        let last = store.oplog_last().unwrap_or_default();
        let learned = repl::progress::learn_commit_point(inner.commit_point, cp, last, from_sync_source);
        if learned > inner.commit_point {
            inner.commit_point = learned;
            drop(inner);
            // Majority reads on this member wait for it.
            self.progress.send_modify(|c| *c += 1);
        }
    }

    /// Secondaries (and a primary) serve reads; members in STARTUP, ROLLBACK or RECOVERING
    /// do not.
    pub fn serves_secondary_reads(&self) -> bool {
        matches!(self.inner.lock().state, MemberState::Primary | MemberState::Secondary)
    }

    /// A write that logged through `at` is about to be acknowledged.
    pub fn note_acknowledged(&self, at: OpTime) {
        self.acknowledged_ts.fetch_max(at.ts, Ordering::SeqCst);
        if let Some(p) = &self.position_page {
            p.note_acknowledged(at.ts);
        }
    }

    /// How far a strict read must see: every write this primary acknowledged. Its
    /// acknowledgement needs its entries durable here unless the client said j:false or w:0,
    /// and those record themselves (`note_acknowledged`). Entries logged and not yet
    /// acknowledged (a write waiting for its sync) are not included: a read that arrives
    /// before a write's reply may or may not see it, on the primary as anywhere.
    pub fn acknowledged(&self, store: &Store) -> OpTime {
        let durable = store.oplog_durable().unwrap_or_default();
        let ts = self.acknowledged_ts.load(Ordering::SeqCst).max(durable.ts);
        OpTime { ts, term: self.term().max(durable.term) }
    }

    /// This member's cluster time (mongod's logical clock): its newest oplog entry, or a
    /// newer time a client gossiped.
    pub fn cluster_time(&self, store: &Store) -> u64 {
        store.oplog_last().unwrap_or_default().ts.max(self.gossiped_cluster_time.load(Ordering::Relaxed))
    }

    /// A request's `$clusterTime` moves the clock forward, as mongod's logical clock: a
    /// causally consistent read on a secondary may ask for a time the secondary has not
    /// applied yet, and waits for it; a write after it is stamped after it, so a read at a
    /// point its client saw before the write (a transaction's, on another shard) does not
    /// see the write. (`common::optime::gossiped_cluster_time` checks the time first.)
    pub fn gossip_cluster_time(&self, store: &Store, t: Timestamp) {
        let ts = common::optime::ts_value(t);
        self.gossiped_cluster_time.fetch_max(ts, Ordering::Relaxed);
        store.advance_clock(ts);
    }

    /// `$clusterTime` and `operationTime` for a reply: the operation's time is the newest
    /// entry this member has applied (at least what the operation read or wrote), the
    /// cluster time at least that. None before the set is initiated.
    pub fn reply_times(&self, store: &Store) -> Option<(Document, Timestamp)> {
        let applied = store.oplog_applied()?;
        let cluster = self.cluster_time(store).max(applied.ts);
        Some((common::optime::cluster_time_doc(common::optime::ts_of(cluster)), applied.timestamp()))
    }

    pub fn is_writable_primary(&self) -> bool {
        self.primary.load(Ordering::SeqCst)
    }

    pub fn topology_counter(&self) -> i64 {
        *self.topology.borrow()
    }

    pub fn topology_changes(&self) -> tokio::sync::watch::Receiver<i64> {
        self.topology.subscribe()
    }

    /// hello's replica-set fields (SDAM reads these to find the set and its primary).
    pub fn hello_fields(&self, store: &Store, legacy: bool, r: &mut Document) {
        let inner = self.inner.lock();
        let Some(config) = &inner.config else {
            r.insert(if legacy { "ismaster" } else { "isWritablePrimary" }, false);
            r.insert("secondary", false);
            r.insert("info", "Does not have a valid replica set config");
            r.insert("isreplicaset", true);
            return;
        };
        let me = &config.members[inner.self_index];
        let visible = |m: &&repl::MemberConfig| !m.hidden && !m.arbiter_only;
        let hosts: Vec<String> = config.members.iter().filter(|m| visible(m) && m.priority > 0.0).map(|m| m.host.clone()).collect();
        let passives: Vec<String> = config.members.iter().filter(|m| visible(m) && m.priority == 0.0).map(|m| m.host.clone()).collect();
        let arbiters: Vec<String> = config.members.iter().filter(|m| m.arbiter_only).map(|m| m.host.clone()).collect();
        let primary = inner.state == MemberState::Primary;
        r.insert(if legacy { "ismaster" } else { "isWritablePrimary" }, primary);
        r.insert("hosts", hosts);
        if !passives.is_empty() {
            r.insert("passives", passives);
        }
        if !arbiters.is_empty() {
            r.insert("arbiters", arbiters);
        }
        r.insert("setName", config.set_name.clone());
        r.insert("setVersion", config.version);
        r.insert("secondary", inner.state == MemberState::Secondary);
        if inner.state == MemberState::Arbiter {
            r.insert("arbiterOnly", true);
        }
        if primary {
            r.insert("primary", me.host.clone());
            r.insert("electionId", election_id(inner.term));
        } else if let Some(p) = inner.peers.iter().position(|p| p.view.up && p.view.state == Some(MemberState::Primary)) {
            r.insert("primary", config.members[p].host.clone());
        }
        if me.hidden {
            r.insert("hidden", true);
        }
        if !me.tags.is_empty() {
            r.insert("tags", me.tags.clone());
        }
        r.insert("me", me.host.clone());
        let last = store.oplog_last().unwrap_or_default();
        let majority = Self::reported_commit_point(&inner, store);
        r.insert(
            "lastWrite",
            doc! {"opTime": last.to_doc(), "lastWriteDate": wall_of(last), "majorityOpTime": majority.to_doc(), "majorityWriteDate": wall_of(majority)},
        );
    }

    /// The majority commit point, as this member reports it.
    pub fn commit_point(&self, store: &Store) -> OpTime {
        Self::reported_commit_point(&self.inner.lock(), store)
    }

    /// The commit point this member reports (hello, replSetGetStatus, heartbeats,
    /// `$replData`). A primary whose set has no other data-bearing voter commits each entry
    /// as soon as it is durable, with no report to advance `commit_point`.
    fn reported_commit_point(inner: &Inner, store: &Store) -> OpTime {
        match &inner.config {
            Some(c) if inner.state == MemberState::Primary && c.write_majority_count() <= 1 => {
                inner.commit_point.max(store.oplog_durable().unwrap_or_default())
            }
            _ => inner.commit_point,
        }
    }

    /// Whether a read that saw entries up to `at` may be answered (dispatch::ReadWait): the
    /// commit point has reached `at`. For a linearizable read this member must moreover still
    /// be primary in the term of `at`, its no-op.
    pub fn read_status(&self, store: &Store, at: OpTime, linearizable: bool) -> WcStatus {
        let inner = self.inner.lock();
        if linearizable && (inner.state != MemberState::Primary || inner.term != at.term) {
            return WcStatus::SteppedDown;
        }
        if Self::reported_commit_point(&inner, store) >= at {
            WcStatus::Satisfied
        } else {
            WcStatus::Pending
        }
    }

    pub fn get_config(&self) -> Result<Document> {
        let inner = self.inner.lock();
        let config = inner.config.as_ref().ok_or_else(not_initialized)?;
        Ok(doc! {"config": config.to_doc()})
    }

    /// `initial_sync`: include initialSyncStatus (replSetGetStatus's `initialSync: 1`); it is
    /// always included while the member is in STARTUP2.
    pub fn status(&self, store: &Store, uptime_secs: i64, initial_sync: bool) -> Result<Document> {
        let inner = self.inner.lock();
        let config = inner.config.as_ref().ok_or_else(not_initialized)?;
        let last = store.oplog_applied().unwrap_or_default();
        let written = store.oplog_last().unwrap_or_default();
        let durable = store.oplog_durable().unwrap_or_default();
        let commit = Self::reported_commit_point(&inner, store);
        let sync_host = inner.sync_source.map(|i| config.members[i].host.clone()).unwrap_or_default();
        let sync_id = inner.sync_source.map_or(-1, |i| config.members[i].id);
        let mut members = Vec::new();
        for (i, m) in config.members.iter().enumerate() {
            let mut d = doc! {"_id": m.id, "name": m.host.clone()};
            if i == inner.self_index {
                d.insert("health", 1.0);
                d.insert("state", inner.state.code());
                d.insert("stateStr", inner.state.name());
                d.insert("uptime", uptime_secs);
                d.insert("optime", last.to_doc());
                d.insert("optimeDate", wall_of(last));
                d.insert("optimeDurable", durable.to_doc());
                d.insert("optimeDurableDate", wall_of(durable));
                d.insert("lastAppliedWallTime", wall_of(last));
                d.insert("lastDurableWallTime", wall_of(durable));
                d.insert("syncSourceHost", sync_host.clone());
                d.insert("syncSourceId", sync_id);
                d.insert("infoMessage", inner.info_message.clone());
                if let (MemberState::Primary, Some(e)) = (inner.state, inner.election) {
                    d.insert("electionTime", e.timestamp());
                    d.insert("electionDate", inner.election_date);
                }
                d.insert("configVersion", config.version);
                d.insert("configTerm", config.term.unwrap_or(0));
                d.insert("self", true);
                d.insert("lastHeartbeatMessage", "");
            } else {
                let p = &inner.peers[i];
                let state = if p.view.up { p.view.state.unwrap_or(MemberState::Unknown) } else { MemberState::Down };
                d.insert("health", if p.view.up { 1.0 } else { 0.0 });
                d.insert("state", state.code());
                d.insert("stateStr", state.name());
                d.insert("uptime", p.up_since.map_or(0, |t| t.elapsed().as_secs() as i64));
                d.insert("optime", p.view.applied.to_doc());
                d.insert("optimeDurable", p.durable.to_doc());
                d.insert("optimeDate", wall_of(p.view.applied));
                d.insert("optimeDurableDate", wall_of(p.durable));
                d.insert("lastAppliedWallTime", p.applied_wall.unwrap_or(wall_of(p.view.applied)));
                d.insert("lastDurableWallTime", p.durable_wall.unwrap_or(wall_of(p.durable)));
                d.insert("lastHeartbeat", p.last_heartbeat.unwrap_or(DateTime::from_millis(0)));
                d.insert("lastHeartbeatRecv", p.last_heartbeat_recv.unwrap_or(DateTime::from_millis(0)));
                d.insert("pingMs", p.view.ping_us.map_or(0, |us| (us / 1000) as i64));
                d.insert("lastHeartbeatMessage", p.message.clone());
                d.insert("syncSourceHost", p.view.sync_source.map(|s| config.members[s].host.clone()).unwrap_or_default());
                d.insert("syncSourceId", p.view.sync_source.map_or(-1, |s| config.members[s].id));
                d.insert("infoMessage", "");
                if let (Some(MemberState::Primary), Some(e)) = (p.view.state, p.election_time) {
                    d.insert("electionTime", e);
                }
                d.insert("configVersion", p.config_version);
                d.insert("configTerm", p.config_term);
                // How far the member trails this one's oplog, by what it last reported:
                // entries, and how long ago the oldest of them was logged here (absent when
                // they are no longer all in memory: far behind).
                if !config.members[i].arbiter_only {
                    let lag = |at: OpTime| store.oplog_lag(at).map(|(n, age)| (n as i64, age.as_secs_f64() * 1000.0));
                    if let Some((entries, ms)) = lag(p.view.applied) {
                        d.insert("lagEntries", entries);
                        d.insert("lagMillis", ms);
                    }
                    if let Some((entries, ms)) = lag(p.durable) {
                        d.insert("durableLagEntries", entries);
                        d.insert("durableLagMillis", ms);
                    }
                }
            }
            members.push(Bson::Document(d));
        }
        let voting = config.voters() as i32;
        let writable_voting = config.members.iter().filter(|m| m.is_voter() && !m.arbiter_only).count() as i32;
        let mut reply = doc! {
            "set": config.set_name.clone(),
            "date": DateTime::now(),
            "myState": inner.state.code(),
            "term": inner.term,
            "syncSourceHost": sync_host,
            "syncSourceId": sync_id,
            "heartbeatIntervalMillis": config.settings.heartbeat_interval_ms,
            "majorityVoteCount": config.majority_vote_count() as i32,
            "writeMajorityCount": config.write_majority_count() as i32,
            "votingMembersCount": voting,
            "writableVotingMembersCount": writable_voting,
            "optimes": {
                "lastCommittedOpTime": commit.to_doc(), "lastCommittedWallTime": wall_of(commit),
                "readConcernMajorityOpTime": commit.to_doc(), "readConcernMajorityWallTime": wall_of(commit),
                "appliedOpTime": last.to_doc(), "durableOpTime": durable.to_doc(), "writtenOpTime": written.to_doc(),
                "lastAppliedWallTime": wall_of(last), "lastDurableWallTime": wall_of(durable), "lastWrittenWallTime": wall_of(written),
            },
            "members": members,
        };
        if (initial_sync || inner.state == MemberState::Startup2) && inner.initial_sync.start.is_some() {
            reply.insert("initialSyncStatus", inner.initial_sync.to_doc());
        }
        Ok(reply)
    }

    /// Whether `config` names this member.
    pub fn is_member_of(&self, config: &ReplSetConfig) -> bool {
        self.self_index(config).is_some()
    }

    /// The config this member runs with, and its index in it (None before initiation).
    pub fn config(&self) -> Option<(ReplSetConfig, usize)> {
        let inner = self.inner.lock();
        inner.config.clone().map(|c| (c, inner.self_index))
    }

    pub fn state(&self) -> MemberState {
        self.inner.lock().state
    }

    pub fn term(&self) -> i64 {
        self.inner.lock().term
    }

    pub fn epoch(&self) -> u64 {
        self.config_epoch.load(Ordering::SeqCst)
    }

    pub fn sync_source(&self) -> Option<usize> {
        self.inner.lock().sync_source
    }

    pub fn shared(&self) -> Option<std::sync::Arc<dyn crate::Host>> {
        self.shared.get().and_then(std::sync::Weak::upgrade)
    }

    /// `$replData` for a member fetching from this one: our term and commit point.
    pub fn repl_data(&self, store: &Store) -> Document {
        let inner = self.inner.lock();
        let Some(config) = &inner.config else { return Document::new() };
        let cp = Self::reported_commit_point(&inner, store);
        let primary_index = if inner.state == MemberState::Primary {
            inner.self_index as i32
        } else {
            inner.peers.iter().position(|p| p.view.up && p.view.state == Some(MemberState::Primary)).map_or(-1, |i| i as i32)
        };
        doc! {
            "term": inner.term, "lastOpCommitted": cp.to_doc(), "lastOpVisible": store.oplog_last().unwrap_or_default().to_doc(),
            "configVersion": config.version, "replicaSetId": config.settings.replica_set_id, "primaryIndex": primary_index,
            "syncSourceIndex": inner.sync_source.map_or(-1, |i| i as i32),
        }
    }

    /// Rollback's states (ROLLBACK, then RECOVERING); never used to leave PRIMARY.
    pub fn set_state(&self, state: MemberState) {
        let mut inner = self.inner.lock();
        if inner.state == MemberState::Primary {
            return;
        }
        inner.state = state;
        drop(inner);
        self.changed();
    }

    /// After a rollback or an initial sync: RECOVERING (no reads) until the oplog reaches
    /// `min_valid`, where the data is consistent again.
    /// `applied` is our newest entry: if it already reaches `min_valid` (nothing changed on
    /// the source meanwhile) no batch would come to end the recovery, so it ends here.
    pub fn recover_until(&self, min_valid: OpTime, applied: OpTime) {
        self.inner.lock().min_valid = Some(min_valid);
        self.set_state(MemberState::Recovering);
        self.after_apply(applied, false);
    }

    /// A fetched batch is applied and durable: have the reporter report it (unless
    /// `reported`: the fetcher's next getMore carries it), and leave RECOVERING once the
    /// oplog reaches minValid.
    pub fn after_apply(&self, applied: OpTime, reported: bool) {
        let synced = {
            let inner = self.inner.lock();
            inner.sync_pending.filter(|mv| inner.state == MemberState::Recovering && applied >= *mv)
        };
        if let Some(min_valid) = synced {
            // An initial sync's minValid: our oplog must hold that very entry, or the set
            // took it back after the copy and the copy may hold writes no entry undoes.
            let store = self.shared().map(|s| s.store().clone());
            let held = store
                .as_ref()
                .and_then(|st| st.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION))
                .and_then(|c| c.snapshot().get(min_valid.ts).ok().flatten())
                .and_then(|d| OpTime::from_doc(&d));
            if held != Some(min_valid) {
                if let Some(store) = &store {
                    self.restart_initial_sync(store, &format!("minValid {min_valid:?} is not in the oplog: the set took it back"));
                }
                return;
            }
            // The sync is done: the flag goes, durably, before this member serves reads.
            if let Some(store) = &store {
                if let Err(e) = Self::persist_initial_sync_flag(store, false) {
                    tracing::error!("cannot clear the initial-sync flag: {}", e.message);
                    return;
                }
            }
        }
        let recovered = {
            let mut inner = self.inner.lock();
            let done = inner.state == MemberState::Recovering && inner.min_valid.is_some_and(|m| applied >= m);
            if done {
                inner.min_valid = None;
                inner.sync_pending = None;
                inner.state = MemberState::Secondary;
            }
            done
        };
        if recovered {
            // Before minValid the data was no state of the set's: no read may go back there.
            if let Some(shared) = self.shared() {
                let store = shared.store();
                store.reset_snapshot_history();
                // The prepared transactions are the ones the records of this state name (a
                // rollback may have taken a prepare back; an initial sync copied records).
                store.forget_prepared();
                if let Err(e) = crate::apply::recover_prepared(store) {
                    tracing::error!("finding the prepared transactions after recovering failed: {}", e.message);
                }
            }
            tracing::info!(initial_sync = synced.is_some(), "caught up to minValid: secondary");
            self.changed();
        } else {
            if !reported {
                self.positions.send_modify(|c| *c += 1);
            }
            self.progress.send_modify(|c| *c += 1);
        }
    }

    pub fn set_info_message(&self, msg: impl Into<String>) {
        self.inner.lock().info_message = msg.into();
    }
}

fn not_initialized() -> Error {
    Error::new(Code::NotYetInitialized, "no replset config has been received")
}

/// The wall-clock time of an optime (its timestamp's seconds; the entry's exact `wall` is in
/// the oplog).
fn wall_of(at: OpTime) -> DateTime {
    let Timestamp { time, .. } = at.timestamp();
    DateTime::from_millis(i64::from(time) * 1000)
}

/// Run storage work (locks, engine writes, syncs) off the async workers, as every member task
/// must; a panic in it becomes an internal error.
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| Error::internal(e.to_string()))?
}

fn first_doc(store: &Store, coll: &str) -> Result<Option<Document>> {
    Ok(match store.collection(CONFIG_DB, coll) {
        Some(c) => c.snapshot().scan(None, 1)?.into_iter().next().map(|(_, d)| d),
        None => None,
    })
}

/// Replace the one document of `local.<coll>` and make it durable.
fn put_single_doc(store: &Store, coll: &str, doc: &Document) -> Result<()> {
    let c = store.collection_or_create(CONFIG_DB, coll)?;
    {
        let mut w = c.writer();
        let old = w.snapshot().scan(None, usize::MAX)?;
        for (rid, d) in old {
            w.delete(rid, &d)?;
        }
        w.insert(doc)?;
    }
    store.commit_durable()
}

/// The config, stored as one document whose _id is the set name, as mongod stores it.
fn store_config(store: &Store, config: &ReplSetConfig) -> Result<()> {
    put_single_doc(store, CONFIG_COLLECTION, &config.to_doc())
}

/// The newest optime writeMajorityCount voting members have durable, this member included.
fn majority_durable(store: &Store, inner: &Inner) -> Option<OpTime> {
    let config = inner.config.as_ref()?;
    let me = inner.self_index;
    let own = store.oplog_durable().unwrap_or_default();
    repl::progress::majority_optime(config, |i| if i == me { own } else { inner.peers[i].durable })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A secondary stopped after writing a fetched batch to its oplog (which acknowledged
    /// it) and before applying it applies the batch when it starts again, before it serves
    /// anything; the applied-through point is gone afterwards, across another restart too.
    #[test]
    fn a_restart_applies_what_was_written_and_not_applied() {
        let dir = std::env::temp_dir().join(format!("shoal-unapplied-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let opts = storage::StoreOptions { cache_size_bytes: storage::CACHE_SIZE_BYTES_MIN, fsync: true };
        // The primary's entries: a create (applied entry by entry on restart) and inserts
        // and a replacement (as final states).
        let primary = Store::open_in_memory();
        primary.enable_oplog(1 << 20).unwrap();
        let c = primary.collection_or_create("db", "c").unwrap();
        assert!(c.insert_many(&[doc! {"_id": 1, "v": 1}, doc! {"_id": 2}], true).errors.is_empty());
        {
            let mut w = c.writer();
            let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(1)).unwrap().unwrap();
            w.update(rid, &old, &doc! {"_id": 1, "v": 2}, storage::UpdateForm::Modifiers).unwrap();
        }
        let oplog = primary.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).unwrap();
        let logged: Vec<(OpTime, Vec<u8>)> =
            oplog.snapshot().scan(None, usize::MAX).unwrap().into_iter().map(|(_, d)| (OpTime::from_doc(&d).unwrap(), d.to_vec().unwrap())).collect();
        assert!(logged.len() >= 4);
        let contents = |s: &Store| {
            s.collection("db", "c").map(|c| c.snapshot().scan(None, usize::MAX).unwrap().into_iter().map(|(_, d)| d).collect::<Vec<_>>()).unwrap_or_default()
        };
        let config =
            doc! {"_id": "rs0", "version": 1, "term": 1_i64, "members": [{"_id": 0, "host": "127.0.0.1:27017"}, {"_id": 1, "host": "127.0.0.1:27018"}]};
        {
            let secondary = Store::open(&dir, opts.clone()).unwrap();
            put_single_doc(&secondary, CONFIG_COLLECTION, &config).unwrap();
            secondary.enable_oplog(1 << 20).unwrap();
            crate::apply::write_fetched(&secondary, &logged).unwrap();
            secondary.commit_durable().unwrap();
            assert_eq!(secondary.oplog_last(), Some(logged.last().unwrap().0));
            assert_eq!(secondary.oplog_applied(), Some(OpTime::default()), "written, not applied");
            assert_eq!(secondary.oplog_unapplied(usize::MAX).unwrap(), logged);
            assert!(contents(&secondary).is_empty());
        }
        for restart in 0..2 {
            let secondary = Store::open(&dir, opts.clone()).unwrap();
            let coord = ReplCoord::start(&secondary, "rs0".into(), "127.0.0.1:27017".into(), 27017, 1 << 20).unwrap();
            assert_eq!(coord.state(), MemberState::Secondary, "restart {restart}");
            assert_eq!(secondary.oplog_applied(), secondary.oplog_last(), "restart {restart}");
            assert!(secondary.oplog_unapplied(usize::MAX).unwrap().is_empty(), "restart {restart}");
            assert_eq!(contents(&secondary), contents(&primary), "restart {restart}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A member that stops between a rollback's or an initial sync's first change and
    /// minValid comes back RECOVERING, not SECONDARY, and serves no reads.
    #[test]
    fn a_restart_before_min_valid_stays_recovering() {
        let store = Store::open_in_memory();
        let config =
            doc! {"_id": "rs0", "version": 1, "term": 1_i64, "members": [{"_id": 0, "host": "127.0.0.1:27017"}, {"_id": 1, "host": "127.0.0.1:27018"}]};
        put_single_doc(&store, CONFIG_COLLECTION, &config).unwrap();
        store.enable_oplog(1 << 20).unwrap();
        store.append_oplog_noop(&doc! {"msg": "initiating set"}).unwrap();
        let last = store.oplog_last().unwrap();
        let start = |store: &Store| ReplCoord::start(store, "rs0".into(), "127.0.0.1:27017".into(), 27017, 1 << 20).unwrap();
        // No minValid: a secondary.
        assert_eq!(start(&store).state(), MemberState::Secondary);
        // minValid ahead of the oplog: recovering.
        let ahead = OpTime { ts: last.ts + (10 << 32), term: last.term };
        ReplCoord::persist_min_valid(&store, ahead).unwrap();
        let coord = start(&store);
        assert_eq!(coord.state(), MemberState::Recovering);
        assert!(!coord.serves_secondary_reads());
        // Reached: recovering ends with the batch that reaches it.
        coord.after_apply(ahead, false);
        assert_eq!(coord.state(), MemberState::Secondary);
        // An old minValid the oplog has passed: a secondary again.
        ReplCoord::persist_min_valid(&store, last).unwrap();
        assert_eq!(start(&store).state(), MemberState::Secondary);
    }
}
