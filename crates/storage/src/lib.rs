//! shoal's storage layer: a narrow ordered key-value [`engine::Engine`] (fjall on disk, an
//! in-memory MVCC map for simulation) and, engine-agnostic above it, the catalog, the record
//! store, index key encoding ([`keys`]) and index maintenance, snapshots and group commit.
//!
//! Key layout (all integers big-endian, so byte order is numeric order):
//! - `Space::Catalog`
//!   - `'m' db 0x00 name` → collection metadata (BSON: id, db, name, uuid, options, indexes).
//!   - `'s' coll_id` → collection statistics (BSON: next record id, count, data bytes,
//!     per-index entry bytes, multikey index ids). Rewritten in every write batch.
//!   - `'a'` → the oplog's applied-through point (an optime: timestamp, term) while a
//!     secondary has written entries after it that it may not have applied yet.
//!   - `'g' kind coll_or_index_id` → garbage marker: data of a dropped collection (`'c'`) or
//!     index (`'i'`), or of an index build in progress, still to be deleted (resumed at open).
//! - `Space::Records`: `coll_id record_id` → document BSON.
//! - `Space::Index`: unique indexes `index_id key` → `record_id values`; other indexes
//!   `index_id key record_id` → `record_id values`; `key` is [`keys::encode_index_key`],
//!   `values` the BSON document `{"0": v0, "1": v1, ..}` of the key's original values.
//!
//! Internal ids (collections and indexes share one sequence) are never reused while their
//! data may exist: at open the sequence restarts above every id in the catalog and in the
//! garbage markers. A collection's data is addressed by id, not name, so rename and drop are
//! single catalog batches (atomic across a crash); dropped data is deleted afterwards.
//!
//! Concurrency: snapshots read an engine snapshot and never wait for writers; writers to a
//! collection hold its write lock; catalog changes hold the store's catalog lock, then the
//! collection locks they need (always in that order).
//!
//! Index builds do not block writers: a new index is first registered as *building* (in
//! memory only, with its garbage marker written), so every writer maintains it from then on;
//! `CollectionMeta.indexes`, snapshots (`index_scan`, `index_spec`), `validate`, stats and the
//! catalog list only *ready* indexes. The builder reads existing records in chunks without the
//! lock and, holding the lock briefly per chunk, adds the entries of the records unchanged
//! since it read them (changed ones were indexed by their writers). A unique conflict a
//! writer meets on a building index fails the build, not the write (like MongoDB). Finally,
//! under the lock, the index becomes ready and enters the catalog. Progress:
//! [`Store::index_builds`].
//!
//! Hashed indexes (`{field: "hashed"}`, compound with at most one hashed field) store
//! MongoDB's 64-bit hash of the value ([`hashed_value`]) as an Int64 key component.
//!
//! TTL: [`Store::start_ttl_monitor`] runs [`Store::run_ttl_pass`] every interval, deleting
//! expired documents found by a range scan of each TTL index, in bounded batches.

mod bsonenc;
pub mod engine;
mod hash;
mod keygen;
pub mod keys;
mod oplog;

pub use engine::{Batch, BatchOp, Engine, EngineSnapshot, Space};
pub use oplog::{applying_replicated_ops, ts_of, OpTime, ReplicatedApplyGuard, OPLOG_COLLECTION, OPLOG_DB, SESSION_MIGRATE_INFO};

/// The storage memory budget when none is configured (the issue's bound: at most 1 GiB).
pub const CACHE_SIZE_BYTES_DEFAULT: u64 = 1 << 30;
pub const CACHE_SIZE_BYTES_MIN: u64 = engine::fjall_engine::MEMORY_BYTES_MIN;
pub use engine::fjall_engine::{memtable_bytes_for, memtables_bytes_max};
pub use hash::{hash_bson, hashed_value};
pub use keygen::{is_hashed, KEYS_PER_DOCUMENT_MAX};
pub use keys::{encode_component, encode_index_key, encode_value};

use bson::{doc, Bson, Document};
use common::limits::BSON_OBJECT_SIZE_MAX_BYTES;
use common::{Code, Error, Result};
use engine::{fjall_engine::FjallEngine, memory::MemoryEngine, prefix_bounds};
use keygen::{index_keys, key_fields, key_value_doc, KeyField};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub type RecordId = u64;

/// Name of the index every collection has on `_id`.
pub const ID_INDEX_NAME: &str = "_id_";
/// MongoDB's limit of indexes per collection (including `_id_`).
pub const INDEXES_PER_COLLECTION_MAX: usize = 64;
/// Longest database name MongoDB accepts.
pub const DB_NAME_LENGTH_MAX_BYTES: usize = 63;
/// Longest full namespace (`db.collection`) MongoDB accepts.
pub const NAMESPACE_LENGTH_MAX_BYTES: usize = 255;
/// Documents per write batch while building an index over existing data.
const INDEX_BUILD_CHUNK_DOCS: usize = 1000;
/// How often a request for an index being built checks whether the build finished.
const INDEX_BUILD_WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(10);
/// Oplog entries deleted per truncation (the oplog lock is held meanwhile).
const OPLOG_TRUNCATE_ENTRIES_MAX: usize = 10_000;
/// Bytes of the newest oplog entries kept in memory for tailing readers (`OplogState::recent`).
/// A fetcher that is caught up, or behind by less than this (a second of writes at 16k
/// inserts/s of 1 KB), reads its batches from memory.
const OPLOG_RECENT_BYTES_MAX: usize = 16 << 20;
/// Batches whose logging time `OplogState::logged_at` keeps (for replication lag).
const OPLOG_LOGGED_MARKS_MAX: usize = 65_536;
/// What an entry of `recent` costs beside its bytes (deque slot, Arc header).
const OPLOG_RECENT_ENTRY_OVERHEAD_BYTES: usize = 40;
/// Deletes per write batch while removing dropped data.
const GARBAGE_CHUNK_KEYS: usize = 1000;

#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// All the memory the engine may hold for data, however large the data: the memtables
    /// (at most [`memtables_bytes_max`] of the directory's memtable size) and the block cache
    /// (the rest). At least [`CACHE_SIZE_BYTES_MIN`].
    pub cache_size_bytes: u64,
    /// fsync the journal in `commit_durable` (false: only flush to the OS, survives a process
    /// crash but not a power loss).
    pub fsync: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { cache_size_bytes: CACHE_SIZE_BYTES_DEFAULT, fsync: true }
    }
}

#[derive(Clone, Debug)]
pub struct CollectionMeta {
    pub db: String,
    pub name: String,
    pub uuid: bson::Uuid,
    pub options: Document,
    pub indexes: Vec<IndexSpec>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct IndexSpec {
    pub name: String,
    pub key: Document,
    pub unique: bool,
    pub sparse: bool,
    pub partial_filter: Option<Document>,
    pub expire_after_seconds: Option<i64>,
    /// The full spec document as listIndexes returns it: `{v: 2, key, name, unique?, ...}`.
    pub spec: Document,
}

impl IndexSpec {
    /// The `_id_` index: unique, though (as in MongoDB) its spec document does not say so.
    pub fn id_index() -> IndexSpec {
        IndexSpec { unique: true, ..IndexSpec::new(doc! {"_id": 1}, ID_INDEX_NAME) }
    }

    /// A plain (non-unique, non-sparse) index.
    pub fn new(key: Document, name: &str) -> IndexSpec {
        let spec = doc! {"v": 2, "key": key.clone(), "name": name};
        IndexSpec { name: name.to_string(), key, unique: false, sparse: false, partial_filter: None, expire_after_seconds: None, spec }
    }

    /// Rebuild the typed fields from a spec document (as stored in the catalog).
    pub fn from_spec(spec: Document) -> Result<IndexSpec> {
        let key = match spec.get("key") {
            Some(Bson::Document(k)) => k.clone(),
            _ => return Err(Error::new(Code::FailedToParse, "index spec is missing 'key'")),
        };
        let name = match spec.get("name") {
            Some(Bson::String(n)) => n.clone(),
            _ => return Err(Error::new(Code::FailedToParse, "index spec is missing 'name'")),
        };
        let truthy = |k: &str| match spec.get(k) {
            Some(Bson::Boolean(b)) => *b,
            Some(Bson::Int32(i)) => *i != 0,
            Some(Bson::Int64(i)) => *i != 0,
            Some(Bson::Double(d)) => *d != 0.0,
            _ => false,
        };
        let partial_filter = match spec.get("partialFilterExpression") {
            Some(Bson::Document(d)) => Some(d.clone()),
            _ => None,
        };
        let expire_after_seconds = match spec.get("expireAfterSeconds") {
            Some(Bson::Int32(i)) => Some(*i as i64),
            Some(Bson::Int64(i)) => Some(*i),
            Some(Bson::Double(d)) => Some(*d as i64),
            _ => None,
        };
        let unique = truthy("unique") || name == ID_INDEX_NAME;
        Ok(IndexSpec { name, key, unique, sparse: truthy("sparse"), partial_filter, expire_after_seconds, spec: spec.clone() })
    }

    /// The spec document, with v/key/name first and the typed fields authoritative.
    fn normalized_spec(&self) -> Document {
        let mut out = doc! {"v": self.spec.get("v").cloned().unwrap_or(Bson::Int32(2)), "key": self.key.clone(), "name": self.name.clone()};
        for (k, v) in &self.spec {
            if !matches!(k.as_str(), "v" | "key" | "name" | "ns") {
                out.insert(k.clone(), v.clone());
            }
        }
        // Keep the caller's numeric type when it already says the same thing.
        let ttl_same = match (out.get("expireAfterSeconds"), self.expire_after_seconds) {
            (Some(Bson::Int32(a)), Some(b)) => *a as i64 == b,
            (Some(Bson::Int64(a)), Some(b)) => *a == b,
            _ => false,
        };
        let mut set = |k: &str, v: Option<Bson>| match v {
            Some(v) => {
                out.insert(k, v);
            }
            None => {
                out.remove(k);
            }
        };
        set("unique", (self.unique && self.name != ID_INDEX_NAME).then_some(Bson::Boolean(true)));
        set("sparse", self.sparse.then_some(Bson::Boolean(true)));
        set("partialFilterExpression", self.partial_filter.clone().map(Bson::Document));
        if !ttl_same {
            set("expireAfterSeconds", self.expire_after_seconds.map(Bson::Int64));
        }
        out
    }

    fn same_options(&self, other: &IndexSpec) -> bool {
        self.unique == other.unique
            && self.sparse == other.sparse
            && self.partial_filter == other.partial_filter
            && self.expire_after_seconds == other.expire_after_seconds
    }
}

#[derive(Clone, Debug, Default)]
pub struct CollStats {
    pub count: u64,
    pub size_bytes: u64,
    pub storage_size_bytes: u64,
    pub index_sizes: Vec<(String, u64)>,
}

#[derive(Clone, Debug, Default)]
pub struct DbStats {
    pub collections: u64,
    pub objects: u64,
    pub data_size_bytes: u64,
    pub storage_size_bytes: u64,
    pub indexes: u64,
    pub index_size_bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct ValidateReport {
    pub valid: bool,
    pub errors: Vec<String>,
    pub records: u64,
    pub keys_per_index: Vec<(String, u64)>,
}

/// An index build in progress (for currentOp).
#[derive(Clone, Debug, PartialEq)]
pub struct IndexBuildProgress {
    pub ns: String,
    pub index_name: String,
    pub done_records: u64,
    pub total_records: u64,
}

#[derive(Debug)]
pub struct InsertOutcome {
    pub inserted: usize,
    pub errors: Vec<(usize, Error)>,
}

/// A range over encoded index keys (see [`encode_index_key`]), compared with memcmp against
/// each entry's key. A bound may be a full key or a key prefix (the leading components);
/// for prefix bounds use MinKey/MaxKey for the remaining components to get MongoDB-style
/// inclusive ranges.
#[derive(Clone, Debug)]
pub struct IndexBounds {
    pub lower: Bound<Vec<u8>>,
    pub upper: Bound<Vec<u8>>,
    /// Scan from upper to lower.
    pub reverse: bool,
}

impl IndexBounds {
    pub fn all() -> IndexBounds {
        IndexBounds { lower: Bound::Unbounded, upper: Bound::Unbounded, reverse: false }
    }
    /// Entries whose key equals `key` exactly.
    pub fn point(key: Vec<u8>) -> IndexBounds {
        IndexBounds { lower: Bound::Included(key.clone()), upper: Bound::Included(key), reverse: false }
    }
    fn admits_lower(&self, key: &[u8]) -> bool {
        match &self.lower {
            Bound::Unbounded => true,
            Bound::Included(b) => key >= b.as_slice(),
            Bound::Excluded(b) => key > b.as_slice(),
        }
    }
    fn admits_upper(&self, key: &[u8]) -> bool {
        match &self.upper {
            Bound::Unbounded => true,
            Bound::Included(b) => key <= b.as_slice(),
            Bound::Excluded(b) => key < b.as_slice(),
        }
    }
}

/// An index entry as stored: (key, value).
type StoredEntry = (Vec<u8>, Vec<u8>);

/// The key values of a stored index entry value (`rid ‖ {"0": v0, ..}`).
fn entry_values(value: &[u8]) -> Result<Vec<Bson>> {
    Ok(decode_doc(value.get(8..).unwrap_or(&[]))?.into_iter().map(|(_, v)| v).collect())
}

/// One index entry returned by [`Snapshot::index_scan`].
#[derive(Clone, Debug, PartialEq)]
pub struct IndexEntry {
    /// The encoded key (comparable with bounds).
    pub key: Vec<u8>,
    /// Opaque resume position: pass as `after` to continue the scan after this entry.
    pub position: Vec<u8>,
    pub record_id: RecordId,
    /// The key's values, one per key pattern field, with their original types.
    pub values: Vec<Bson>,
}

// ---------------------------------------------------------------------------------------
// Key helpers.

const CATALOG_META: u8 = b'm';
const CATALOG_STATS: u8 = b's';
const CATALOG_GARBAGE: u8 = b'g';
const CATALOG_APPLIED_THROUGH: u8 = b'a';
const GARBAGE_COLLECTION: u8 = b'c';
const GARBAGE_INDEX: u8 = b'i';

fn meta_key(db: &str, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + db.len() + name.len());
    k.push(CATALOG_META);
    k.extend_from_slice(db.as_bytes());
    k.push(0);
    k.extend_from_slice(name.as_bytes());
    k
}

/// How a secondary's oplog batch moves the applied-through point (`OplogState::applied_through`).
enum Marker {
    /// Unchanged: the entries' changes are applied already (or nothing is written).
    Keep,
    /// The entries are written ahead of their application.
    Written,
    /// Every written entry up to this one is applied.
    Applied(OpTime),
}

fn encode_optime(at: OpTime) -> Vec<u8> {
    let mut v = at.ts.to_be_bytes().to_vec();
    v.extend_from_slice(&at.term.to_be_bytes());
    v
}

fn decode_optime(v: &[u8]) -> Option<OpTime> {
    let ts = u64::from_be_bytes(v.get(..8)?.try_into().ok()?);
    let term = i64::from_be_bytes(v.get(8..16)?.try_into().ok()?);
    Some(OpTime { ts, term })
}

fn stats_key(coll_id: u64) -> Vec<u8> {
    let mut k = vec![CATALOG_STATS];
    k.extend_from_slice(&coll_id.to_be_bytes());
    k
}

fn garbage_key(kind: u8, id: u64) -> Vec<u8> {
    let mut k = vec![CATALOG_GARBAGE, kind];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn record_key(coll_id: u64, rid: RecordId) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&coll_id.to_be_bytes());
    k.extend_from_slice(&rid.to_be_bytes());
    k
}

fn read_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::new(Code::InvalidBSON, format!("corrupt data in storage: {what}"))
}

/// A record's BSON as `Collection::tail_chunk` returns it: shared with the in-memory oplog
/// tail (every downstream member's batch refers to the one copy written when the entry was
/// logged) or read from the engine.
#[derive(Clone, Debug)]
pub enum RawRecord {
    Shared(Arc<[u8]>),
    Owned(Vec<u8>),
}

impl AsRef<[u8]> for RawRecord {
    fn as_ref(&self) -> &[u8] {
        match self {
            RawRecord::Shared(b) => b,
            RawRecord::Owned(b) => b,
        }
    }
}

/// A record's `Document` from its stored BSON (as `Snapshot::scan_raw` returns it).
pub fn decode_record(bytes: &[u8]) -> Result<Document> {
    decode_doc(bytes)
}

fn decode_doc(bytes: &[u8]) -> Result<Document> {
    let raw = bson::RawDocument::from_bytes(bytes).map_err(|e| corrupt(format!("invalid BSON record: {e}")))?;
    Document::try_from(raw).map_err(|e| corrupt(format!("invalid BSON record: {e}")))
}

fn encode_doc(d: &Document) -> Result<Vec<u8>> {
    d.to_vec().map_err(|e| Error::bad_value(format!("cannot serialize document: {e}")))
}

/// A record's BSON, into a buffer of `capacity_bytes` (a guess of its size, saving regrowth).
fn encode_record(d: &Document, capacity_bytes: usize) -> Result<Vec<u8>> {
    bsonenc::encode_document(d, capacity_bytes).map_err(|e| Error::bad_value(format!("cannot serialize document: {e}")))
}

// ---------------------------------------------------------------------------------------
// Shared state: engine, group commit, id allocation.

struct CommitState {
    /// Highest applied-write sequence known durable.
    synced_seq: u64,
    syncing: bool,
}

struct Shared {
    engine: Arc<dyn Engine>,
    /// Count of write batches applied so far (their order of completion).
    applied_seq: AtomicU64,
    /// Called after `write_seq` moves (`Store::set_write_listener`), for readers that wait
    /// for new data (awaitData).
    write_listener: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    commit: Mutex<CommitState>,
    commit_done: Condvar,
    sync_count: AtomicU64,
    /// Time spent in those syncs.
    sync_us: AtomicU64,
    next_internal_id: AtomicU64,
    total_data_bytes: AtomicU64,
    /// Index builds in progress.
    builds: Mutex<Vec<Arc<BuildState>>>,
    ttl_deleted: AtomicU64,
    ttl_passes: AtomicU64,
    /// The oplog of a replica-set member; `None` on a standalone.
    oplog: RwLock<Option<Arc<Oplog>>>,
}

/// `local.oplog.rs` and the position of its newest entry.
struct Oplog {
    coll: Arc<CollState>,
    /// Oldest entries are deleted once the entries take more than this.
    cap_bytes: u64,
    state: Mutex<OplogState>,
}

struct OplogState {
    /// The newest entry written.
    last: OpTime,
    /// The newest entry known durable (every entry up to it was synced).
    durable: OpTime,
    /// The term new entries are stamped with.
    term: i64,
    /// The newest entries as written, oldest first: every entry after `recent_floor` is
    /// here. A secondary's fetcher tails the oplog a few entries behind its newest; reading
    /// those back through the engine (a snapshot and an LSM seek per getMore) was an eighth of
    /// a primary's CPU with two secondaries, and grows with each member that fetches from it.
    recent: std::collections::VecDeque<(u64, Arc<[u8]>)>,
    recent_floor: u64,
    recent_bytes: usize,
    /// When each recent batch was logged here: its first entry's timestamp and the time,
    /// oldest first. What a member's replication lag is measured with (`Store::oplog_lag`).
    logged_at: std::collections::VecDeque<(u64, std::time::Instant)>,
    /// Entries after this one are written but perhaps not applied: a secondary writes a
    /// fetched batch to its oplog, makes it durable (which acknowledges it) and applies it
    /// after (`Store::write_oplog_replicated`, `Store::apply_written`). `None` when the data
    /// holds every entry. Persisted (`CATALOG_APPLIED_THROUGH`) in the batches that move it,
    /// so a restart finds what is left to apply.
    applied_through: Option<OpTime>,
}

impl OplogState {
    fn new(last: OpTime) -> OplogState {
        OplogState {
            last,
            durable: last,
            term: last.term.max(0),
            recent: Default::default(),
            recent_floor: last.ts,
            recent_bytes: 0,
            logged_at: Default::default(),
            applied_through: None,
        }
    }

    /// Keep a new entry (the newest) in `recent`, dropping the oldest past the bound.
    fn remember(&mut self, ts: u64, entry: &[u8]) {
        debug_assert!(self.recent.back().is_none_or(|(t, _)| *t < ts) && ts > self.recent_floor);
        self.recent_bytes += entry.len() + OPLOG_RECENT_ENTRY_OVERHEAD_BYTES;
        self.recent.push_back((ts, Arc::from(entry)));
        while self.recent_bytes > OPLOG_RECENT_BYTES_MAX {
            let Some((t, e)) = self.recent.pop_front() else { break };
            self.recent_bytes -= e.len() + OPLOG_RECENT_ENTRY_OVERHEAD_BYTES;
            self.recent_floor = t;
        }
    }

    /// A batch whose first entry is `first_ts` was logged now.
    fn mark_logged(&mut self, first_ts: u64) {
        if self.logged_at.len() >= OPLOG_LOGGED_MARKS_MAX {
            self.logged_at.pop_front();
        }
        self.logged_at.push_back((first_ts, std::time::Instant::now()));
    }

    /// Entries after `after` are gone (a rollback's truncation).
    fn forget_after(&mut self, after: u64) {
        while self.logged_at.back().is_some_and(|(t, _)| *t > after) {
            self.logged_at.pop_back();
        }
        while self.recent.back().is_some_and(|(t, _)| *t > after) {
            if let Some((_, e)) = self.recent.pop_back() {
                self.recent_bytes -= e.len() + OPLOG_RECENT_ENTRY_OVERHEAD_BYTES;
            }
        }
        self.recent_floor = self.recent_floor.min(after);
    }
}

/// Progress and outcome of one index build, shared by the builder and concurrent writers.
struct BuildState {
    coll: std::sync::Weak<CollState>,
    index_name: String,
    done_records: AtomicU64,
    total_records: AtomicU64,
    /// First unique-key conflict met by a concurrent writer; fails the build.
    conflict: Mutex<Option<Error>>,
}

impl Shared {
    fn write_seq(&self) -> u64 {
        self.applied_seq.load(Ordering::SeqCst)
    }

    /// Tell the write listener that `write_seq` moved.
    fn notify_write_seq(&self) {
        if let Some(f) = self.write_listener.get() {
            f();
        }
    }

    fn apply(&self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.engine.write(batch)?;
        self.applied_seq.fetch_add(1, Ordering::SeqCst);
        self.notify_write_seq();
        Ok(())
    }

    /// Apply `batch` with the oplog `entries` that describe it: under the oplog lock, stamp
    /// each entry with the next optime and add it to the same engine batch, so entries reach
    /// the engine (and become visible) in timestamp order.
    fn apply_logged(&self, batch: Batch, entries: Vec<Vec<u8>>) -> Result<()> {
        self.apply_logged_with(batch, entries, None).map(|_| ())
    }

    /// `apply_logged`, for a retryable write when `session` is given: every entry is stamped
    /// with its transaction's previous entry (`prevOpTime`, the first with `session.prev`),
    /// and the session record at `session.record_op` in `batch` with the newest. Returns the
    /// newest entry's optime.
    fn apply_logged_with(&self, mut batch: Batch, entries: Vec<Vec<u8>>, session: Option<SessionStamp>) -> Result<Option<OpTime>> {
        if entries.is_empty() {
            return self.apply(batch).map(|_| None);
        }
        let Some(log) = self.oplog.read().clone() else {
            return self.apply(batch).map(|_| None);
        };
        let mut st = log.state.lock();
        let now_secs = (oplog::wall_now_ms() / 1000).clamp(0, u32::MAX as i64) as u32;
        let mut stats = log.coll.stats.lock().clone();
        let mut last = st.last;
        let mut added_bytes = 0u64;
        let mut prev = session.as_ref().map(|s| s.prev);
        st.mark_logged(oplog::next_ts(last.ts, now_secs));
        for mut e in entries {
            last = OpTime { ts: oplog::next_ts(last.ts, now_secs), term: st.term };
            oplog::stamp(&mut e, last);
            if let Some(p) = prev.as_mut() {
                oplog::stamp_prev(&mut e, *p);
                *p = last;
            }
            stats.count += 1;
            added_bytes += e.len() as u64;
            // Readers of `recent` hold the oplog lock, so they see these only once applied.
            st.remember(last.ts, &e);
            batch.put(Space::Records, record_key(log.coll.id, last.ts), e);
        }
        stats.data_bytes += added_bytes;
        batch.put(Space::Catalog, stats_key(log.coll.id), stats.to_bytes());
        if let Some(SessionStamp { record_op, .. }) = session {
            match batch.ops.get_mut(record_op) {
                Some(BatchOp::Put(Space::Records, _, record)) => oplog::stamp_session_record(record, last),
                _ => {
                    let newest = st.last.ts;
                    st.forget_after(newest);
                    return Err(Error::internal("a retryable write's batch lost its session record"));
                }
            }
        }
        if let Err(e) = self.apply(batch) {
            let newest = st.last.ts;
            st.forget_after(newest);
            return Err(e);
        }
        st.last = last;
        self.after_oplog_append(&log, stats, added_bytes, None);
        Ok(Some(last))
    }

    /// After a batch of oplog entries is applied (the caller holds the oplog lock): publish
    /// the collection's new stats, and truncate the oldest entries once over the cap.
    /// `applied_through`: entries after it are not applied yet, and capping keeps them.
    fn after_oplog_append(&self, log: &Oplog, stats: Stats, added_bytes: u64, applied_through: Option<OpTime>) {
        self.total_data_bytes.fetch_add(added_bytes, Ordering::Relaxed);
        let over_cap = stats.data_bytes > log.cap_bytes;
        *log.coll.stats.lock() = stats;
        if over_cap {
            // The write itself succeeded; a failed truncation is retried after the next one.
            if let Err(e) = self.truncate_oplog(log, applied_through) {
                tracing::warn!("oplog truncation failed: {}", e.message);
            }
        }
    }

    /// Delete the oldest oplog entries until they take at most 90% of the cap (at most
    /// OPLOG_TRUNCATE_ENTRIES_MAX per call), never one after `applied_through` (written, not
    /// yet applied: a restart applies it from here). The caller holds the oplog lock.
    fn truncate_oplog(&self, log: &Oplog, applied_through: Option<OpTime>) -> Result<()> {
        let mut stats = log.coll.stats.lock().clone();
        let target = log.cap_bytes / 10 * 9;
        let snap = self.engine.snapshot();
        let (lo, hi) = prefix_bounds(&log.coll.id.to_be_bytes());
        let mut batch = Batch::new();
        let mut removed = 0u64;
        for kv in snap.iter(Space::Records, lo, hi, false) {
            if stats.data_bytes <= target || batch.len() >= OPLOG_TRUNCATE_ENTRIES_MAX {
                break;
            }
            let (k, v) = kv?;
            let ts = read_u64(k.get(8..).unwrap_or(&[])).ok_or_else(|| corrupt("oplog key"))?;
            if applied_through.is_some_and(|a| ts > a.ts) {
                break;
            }
            stats.data_bytes = stats.data_bytes.saturating_sub(v.len() as u64);
            stats.count = stats.count.saturating_sub(1);
            removed += v.len() as u64;
            batch.delete(Space::Records, k);
        }
        if batch.is_empty() {
            return Ok(());
        }
        batch.put(Space::Catalog, stats_key(log.coll.id), stats.to_bytes());
        self.apply(batch)?;
        log.coll.removals.fetch_add(1, Ordering::SeqCst);
        *log.coll.stats.lock() = stats;
        let _ = self.total_data_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(removed)));
        Ok(())
    }

    /// Group commit: one caller (the leader) syncs on behalf of everyone whose writes were
    /// applied before the sync started; the others wait for that sync.
    fn commit_durable(&self) -> Result<()> {
        let target = self.applied_seq.load(Ordering::SeqCst);
        let mut st = self.commit.lock();
        loop {
            if st.synced_seq >= target {
                return Ok(());
            }
            if st.syncing {
                self.commit_done.wait(&mut st);
                continue;
            }
            st.syncing = true;
            // The oplog position and the batch count together, under the oplog lock (which
            // every logged batch holds while it is applied): entries up to `log_at` are
            // exactly those in batches counted by `covers`, so the sync makes them durable.
            let log = self.oplog.read().clone();
            let (log_at, covers) = match &log {
                Some(l) => {
                    let g = l.state.lock();
                    (Some(g.last), self.applied_seq.load(Ordering::SeqCst))
                }
                None => (None, self.applied_seq.load(Ordering::SeqCst)),
            };
            drop(st);
            let started = std::time::Instant::now();
            let r = self.engine.sync();
            self.sync_us.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            self.sync_count.fetch_add(1, Ordering::Relaxed);
            if let (true, Some(l), Some(at)) = (r.is_ok(), &log, log_at) {
                let mut ls = l.state.lock();
                ls.durable = ls.durable.max(at);
            }
            st = self.commit.lock();
            st.syncing = false;
            if r.is_ok() {
                st.synced_seq = st.synced_seq.max(covers);
            }
            self.commit_done.notify_all();
            r?;
        }
    }

    /// Remove the build of `idx` from the builds in progress (idempotent).
    fn unregister_build(&self, idx: &IndexRt) {
        self.builds.lock().retain(|b| !idx.build.as_ref().is_some_and(|mine| Arc::ptr_eq(b, mine)));
    }

    fn alloc_id(&self) -> u64 {
        self.next_internal_id.fetch_add(1, Ordering::SeqCst)
    }

    /// Delete the data of a dropped collection or index, then its garbage marker.
    fn collect_garbage(&self, kind: u8, id: u64) -> Result<()> {
        let space = if kind == GARBAGE_COLLECTION { Space::Records } else { Space::Index };
        let snap = self.engine.snapshot();
        let (lo, hi) = prefix_bounds(&id.to_be_bytes());
        let mut batch = Batch::new();
        for kv in snap.iter(space, lo, hi, false) {
            let (k, _) = kv?;
            batch.delete(space, k);
            if batch.len() >= GARBAGE_CHUNK_KEYS {
                self.apply(std::mem::take(&mut batch))?;
            }
        }
        if kind == GARBAGE_COLLECTION {
            batch.delete(Space::Catalog, stats_key(id));
        }
        batch.delete(Space::Catalog, garbage_key(kind, id));
        self.apply(batch)
    }
}

// ---------------------------------------------------------------------------------------
// Per-collection state.

/// The collection write lock; a guard can be owned (lives in a `Writer`).
struct WriteLock {
    held: Mutex<bool>,
    released: Condvar,
}

impl WriteLock {
    fn new() -> WriteLock {
        WriteLock { held: Mutex::new(false), released: Condvar::new() }
    }
}

struct WriteGuard {
    coll: Arc<CollState>,
}

impl WriteGuard {
    fn acquire(coll: &Arc<CollState>) -> WriteGuard {
        let mut held = coll.lock.held.lock();
        while *held {
            coll.lock.released.wait(&mut held);
        }
        *held = true;
        WriteGuard { coll: coll.clone() }
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        *self.coll.lock.held.lock() = false;
        self.coll.lock.released.notify_one();
    }
}

struct IndexRt {
    id: u64,
    spec: IndexSpec,
    fields: Vec<KeyField>,
    filter: Option<query::filter::Filter>,
    prefix: [u8; 8],
    /// Set while the index is being built: writers maintain it, readers do not see it.
    build: Option<Arc<BuildState>>,
}

impl IndexRt {
    fn new(id: u64, spec: IndexSpec) -> Result<IndexRt> {
        let filter = match &spec.partial_filter {
            Some(f) => Some(query::filter::Filter::parse(f)?),
            None => None,
        };
        Ok(IndexRt { id, fields: key_fields(&spec.key), spec, filter, prefix: id.to_be_bytes(), build: None })
    }

    fn ready(&self) -> bool {
        self.build.is_none()
    }

    /// A unique-key conflict met by a writer on a building index: the write goes ahead
    /// without that entry and the build fails (as MongoDB's hybrid builds do).
    fn building_conflict(&self, e: Error) -> bool {
        match &self.build {
            Some(b) => {
                b.conflict.lock().get_or_insert(e);
                true
            }
            None => false,
        }
    }

    /// The entries `doc` contributes: (stored key, stored value), and multikey. A stored
    /// value is `rid ‖ {"0": v0, ..}`; [`entry_values`] recovers the values (for errors).
    fn entries(&self, doc: &Document, rid: RecordId) -> Result<(Vec<StoredEntry>, bool)> {
        if let Some(f) = &self.filter {
            if !f.matches(doc) {
                return Ok((Vec::new(), false));
            }
        }
        // Fast path, the common case: one scalar (or missing) value per field, encoded
        // straight from the document without copying the values.
        if let Some(values) = keygen::scalar_key_values(&self.fields, doc) {
            if self.spec.sparse && values.iter().all(|v| v.is_none()) {
                return Ok((Vec::new(), false));
            }
            let values: Vec<&Bson> = values.into_iter().map(|v| v.unwrap_or(&Bson::Null)).collect();
            let mut stored = Vec::with_capacity(8 + 12 * values.len() + 8);
            stored.extend_from_slice(&self.prefix);
            for (f, v) in self.fields.iter().zip(&values) {
                encode_component(v, f.descending, &mut stored);
            }
            if !self.spec.unique {
                stored.extend_from_slice(&rid.to_be_bytes());
            }
            return Ok((vec![(stored, self.stored_value(rid, values.iter().copied())?)], false));
        }
        let (keys, multikey) = index_keys(&self.fields, self.spec.sparse, doc)?;
        let mut out = Vec::with_capacity(keys.len());
        for (k, values) in keys {
            let mut stored = Vec::with_capacity(8 + k.len() + 8);
            stored.extend_from_slice(&self.prefix);
            stored.extend_from_slice(&k);
            if !self.spec.unique {
                stored.extend_from_slice(&rid.to_be_bytes());
            }
            out.push((stored, self.stored_value(rid, values.iter())?));
        }
        Ok((out, multikey))
    }

    fn stored_value<'a>(&self, rid: RecordId, values: impl ExactSizeIterator<Item = &'a Bson>) -> Result<Vec<u8>> {
        let mut value = Vec::with_capacity(8 + 5 + 16 * values.len());
        value.extend_from_slice(&rid.to_be_bytes());
        bsonenc::append_values_doc(values, &mut value).map_err(|e| Error::bad_value(format!("cannot serialize index key: {e}")))?;
        Ok(value)
    }

    /// The encoded key part of a stored key.
    fn key_of<'a>(&self, stored: &'a [u8]) -> &'a [u8] {
        let end = if self.spec.unique { stored.len() } else { stored.len().saturating_sub(8) };
        stored.get(8..end).unwrap_or(&[])
    }
}

struct MetaRt {
    uuid: bson::Uuid,
    options: Document,
    /// `_id_` first, then in creation order; includes indexes being built.
    indexes: Vec<Arc<IndexRt>>,
}

impl MetaRt {
    /// A ready index (what readers may use).
    fn index(&self, name: &str) -> Option<&Arc<IndexRt>> {
        self.indexes.iter().find(|i| i.spec.name == name && i.ready())
    }

    fn ready_indexes(&self) -> impl Iterator<Item = &Arc<IndexRt>> {
        self.indexes.iter().filter(|i| i.ready())
    }

    /// The catalog entry: only ready indexes (a build interrupted by a crash is garbage).
    fn to_doc(&self, id: u64, db: &str, name: &str) -> Document {
        let indexes: Vec<Bson> = self.ready_indexes().map(|i| Bson::Document(doc! {"id": i.id as i64, "spec": i.spec.spec.clone()})).collect();
        doc! {"id": id as i64, "db": db, "name": name, "uuid": bson::Binary::from_uuid(self.uuid), "options": self.options.clone(), "indexes": indexes}
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Stats {
    next_rid: u64,
    count: u64,
    data_bytes: u64,
    /// Index id → bytes of its entries.
    index_bytes: BTreeMap<u64, u64>,
    multikey: BTreeSet<u64>,
}

impl Stats {
    fn to_bytes(&self) -> Vec<u8> {
        let mut ix = Document::new();
        for (id, b) in &self.index_bytes {
            ix.insert(id.to_string(), *b as i64);
        }
        let mk: Vec<Bson> = self.multikey.iter().map(|id| Bson::Int64(*id as i64)).collect();
        let d = doc! {"n": self.next_rid as i64, "c": self.count as i64, "d": self.data_bytes as i64, "ix": ix, "mk": mk};
        d.to_vec().unwrap_or_default()
    }

    fn from_bytes(b: &[u8]) -> Result<Stats> {
        let d = decode_doc(b)?;
        let num = |k: &str| d.get_i64(k).map(|v| v.max(0) as u64).map_err(|_| corrupt("collection statistics"));
        let mut index_bytes = BTreeMap::new();
        if let Ok(ix) = d.get_document("ix") {
            for (k, v) in ix {
                if let (Ok(id), Bson::Int64(b)) = (k.parse::<u64>(), v) {
                    index_bytes.insert(id, (*b).max(0) as u64);
                }
            }
        }
        let multikey = match d.get_array("mk") {
            Ok(a) => a.iter().filter_map(|v| v.as_i64()).map(|v| v as u64).collect(),
            Err(_) => BTreeSet::new(),
        };
        Ok(Stats { next_rid: num("n")?, count: num("c")?, data_bytes: num("d")?, index_bytes, multikey })
    }
}

struct CollState {
    shared: Arc<Shared>,
    id: u64,
    ns: RwLock<(String, String)>,
    meta: RwLock<Arc<MetaRt>>,
    lock: WriteLock,
    /// Published statistics; only the write lock holder changes them.
    stats: Mutex<Stats>,
    dropped: AtomicBool,
    /// Bumped after records are deleted (a delete, the oplog's truncation): a tailing reader
    /// checks that its position still exists only when this moved.
    removals: AtomicU64,
    /// Bumped before the oplog is truncated by a rollback (mongod's rollback id): a record
    /// at the position of a reader that began before may now be another branch's entry with
    /// the same timestamp, so such a reader must stop (`Collection::truncations`).
    truncations: AtomicU64,
}

impl CollState {
    fn ns_string(&self) -> String {
        let ns = self.ns.read();
        format!("{}.{}", ns.0, ns.1)
    }

    /// The live oplog is written only by `apply_logged`: its records are keyed by timestamp
    /// and it has no indexes to maintain.
    fn check_not_oplog(&self) -> Result<()> {
        if self.shared.oplog.read().as_ref().is_some_and(|l| l.coll.id == self.id) {
            return Err(Error::new(Code::IllegalOperation, "the live oplog cannot be written to or indexed directly"));
        }
        Ok(())
    }

    /// `config.transactions`, where retryable writes keep their sessions' records.
    fn is_session_records(&self) -> bool {
        let ns = self.ns.read();
        ns.0 == SESSION_RECORDS_DB && ns.1 == SESSION_RECORDS_COLLECTION
    }

    fn check_live(&self) -> Result<()> {
        if self.dropped.load(Ordering::SeqCst) {
            return Err(Error::new(Code::NamespaceNotFound, format!("collection {} was dropped", self.ns_string())));
        }
        Ok(())
    }

    fn snapshot(self: &Arc<Self>) -> Snapshot {
        // Engine snapshot under the meta read lock: the index list matches the data.
        let meta = self.meta.read();
        let snap = self.shared.engine.snapshot();
        let m = meta.clone();
        drop(meta);
        Snapshot { snap, coll: self.clone(), meta: m }
    }

    fn meta_public(&self) -> CollectionMeta {
        let (db, name) = self.ns.read().clone();
        let m = self.meta.read().clone();
        CollectionMeta { db, name, uuid: m.uuid, options: m.options.clone(), indexes: m.ready_indexes().map(|i| i.spec.clone()).collect() }
    }

    /// The duplicate key error for an entry whose stored value is `value`.
    fn dup_error(&self, idx: &IndexRt, value: &[u8]) -> Error {
        let values = entry_values(value).unwrap_or_default();
        let kv = key_value_doc(&idx.fields, &values);
        Error::new(
            Code::DuplicateKey,
            format!("E11000 duplicate key error collection: {} index: {} dup key: {}", self.ns_string(), idx.spec.name, format_doc(&kv)),
        )
        .with_extra(doc! {"keyPattern": idx.spec.key.clone(), "keyValue": kv})
    }

    /// Add one document to `pending` (nothing is added if it fails a check).
    fn prepare_insert(&self, meta: &MetaRt, snap: &dyn EngineSnapshot, doc: &Document, pending: &mut Pending) -> Result<RecordId> {
        // Documents of one batch tend to be alike: size the buffer like the previous one.
        let bytes = encode_record(doc, pending.record_size_hint_bytes + pending.record_size_hint_bytes / 8)?;
        pending.record_size_hint_bytes = bytes.len();
        self.prepare_insert_encoded(meta, snap, doc, bytes, false, pending)
    }

    /// `prepare_insert` of a document already encoded as `bytes`. `doc` gives the index keys:
    /// the document itself, or only its `_id` when the `_id` index is the only one.
    /// `id_absent`: the caller found no `_id` entry for `doc` in `snap`; the `_id` index's
    /// own check then only looks at `pending`.
    fn prepare_insert_encoded(
        &self,
        meta: &MetaRt,
        snap: &dyn EngineSnapshot,
        doc: &Document,
        bytes: Vec<u8>,
        id_absent: bool,
        pending: &mut Pending,
    ) -> Result<RecordId> {
        if bytes.len() > BSON_OBJECT_SIZE_MAX_BYTES {
            return Err(Error::new(
                Code::BSONObjectTooLarge,
                format!("object to insert too large. size in bytes: {}, max size: {BSON_OBJECT_SIZE_MAX_BYTES}", bytes.len()),
            ));
        }
        match doc.get("_id") {
            None => return Err(Error::bad_value("document to insert has no _id field")),
            Some(Bson::Array(_)) => return Err(Error::new(Code::InvalidIdField, "The '_id' value cannot be of type array")),
            Some(_) => {}
        }
        let rid = pending.stats.next_rid;
        let mut all = Vec::with_capacity(meta.indexes.len());
        for idx in &meta.indexes {
            let (mut entries, multikey) = idx.entries(doc, rid)?;
            if idx.spec.unique {
                let mut conflicts = Vec::new();
                for (i, (stored, value)) in entries.iter().enumerate() {
                    let checked = id_absent && idx.spec.name == ID_INDEX_NAME;
                    if pending.unique_keys.contains(stored) || (!checked && snap.get(Space::Index, stored)?.is_some()) {
                        if !idx.building_conflict(self.dup_error(idx, value)) {
                            return Err(self.dup_error(idx, value));
                        }
                        conflicts.push(i);
                    }
                }
                for i in conflicts.into_iter().rev() {
                    entries.remove(i);
                }
            }
            all.push((idx, entries, multikey));
        }
        pending.stats.next_rid += 1;
        pending.stats.count += 1;
        pending.stats.data_bytes += bytes.len() as u64;
        pending.data_delta += bytes.len() as i64;
        if let Some(log) = &pending.log {
            pending.oplog.push(oplog::insert_entry(&log.ns, log.ui, &bytes, log.wall_ms, log.session.as_ref().map(|t| (t, oplog::current_stmt()))));
        }
        pending.batch.put(Space::Records, record_key(self.id, rid), bytes);
        for (idx, entries, multikey) in all {
            if multikey {
                pending.stats.multikey.insert(idx.id);
            }
            let mut added = 0u64;
            for (stored, value) in entries {
                added += (stored.len() + value.len()) as u64;
                if idx.spec.unique {
                    pending.unique_keys.insert(stored.clone());
                }
                pending.batch.put(Space::Index, stored, value);
            }
            *pending.stats.index_bytes.entry(idx.id).or_insert(0) += added;
        }
        Ok(rid)
    }

    /// Apply `pending` (plus the new statistics) as one batch and publish the statistics.
    fn commit_pending(&self, mut pending: Pending) -> Result<()> {
        self.check_not_oplog()?;
        pending.batch.put(Space::Catalog, stats_key(self.id), pending.stats.to_bytes());
        let mut batch = std::mem::take(&mut pending.batch);
        let entries = std::mem::take(&mut pending.oplog);
        let tagged = pending.log.as_ref().is_some_and(|l| l.session.is_some()) && !entries.is_empty();
        let session = if tagged { oplog::with_session(|s| s.map(|s| (s.records.clone(), s.lsid.clone(), s.txn, s.prev))) } else { None };
        let Some((records, lsid, txn, prev)) = session else {
            self.shared.apply_logged(batch, entries)?;
            self.publish_pending(pending);
            return Ok(());
        };
        // A retryable write: the session's record goes into the same batch, unlogged (each
        // member derives it from the entries, as mongod's secondaries do), so the write and
        // the record that makes a retry find it are one atomic engine write. The record's
        // collection is locked after this one's, as `Store::apply_replicated` locks it last.
        let _records_lock = WriteGuard::acquire(&records);
        records.check_live()?;
        let meta = records.meta.read().clone();
        let snap = self.shared.engine.snapshot();
        let mut rp = records.pending();
        rp.log = None;
        let wall_ms = pending.log.as_ref().map_or_else(oplog::wall_now_ms, |l| l.wall_ms);
        let record = oplog::session_record(&lsid, txn, OpTime::default(), wall_ms);
        let doc = bson::RawDocumentBuf::from_bytes(record).map_err(|e| Error::internal(format!("session record: {e}")))?;
        records.prepare_replicated(&meta, &*snap, &ReplicatedChange::Put { doc }, &mut rp)?;
        let prefix = records.id.to_be_bytes();
        let at = rp.batch.ops.iter().position(|op| matches!(op, BatchOp::Put(Space::Records, k, _) if k.starts_with(&prefix)));
        let record_op = batch.ops.len() + at.ok_or_else(|| Error::internal("a session record was not prepared"))?;
        rp.batch.put(Space::Catalog, stats_key(records.id), rp.stats.to_bytes());
        batch.ops.append(&mut rp.batch.ops);
        let last = self.shared.apply_logged_with(batch, entries, Some(SessionStamp { prev, record_op }))?;
        if let Some(last) = last {
            oplog::with_session(|s| {
                if let Some(s) = s {
                    s.prev = last;
                }
            });
        }
        records.publish_pending(rp);
        self.publish_pending(pending);
        Ok(())
    }

    /// The record whose `_id` is `id`, in `snap`.
    fn rid_by_id(&self, meta: &MetaRt, snap: &dyn EngineSnapshot, id: &Bson) -> Result<Option<RecordId>> {
        let Some(idx) = meta.index(ID_INDEX_NAME) else { return Ok(None) };
        let mut key = idx.prefix.to_vec();
        encode_component(id, false, &mut key);
        match snap.get(Space::Index, &key)? {
            Some(v) => Ok(Some(read_u64(&v).ok_or_else(|| corrupt("_id index entry"))?)),
            None => Ok(None),
        }
    }

    /// Add one replicated change to `pending` (see `Store::apply_replicated`).
    fn prepare_replicated(&self, meta: &MetaRt, snap: &dyn EngineSnapshot, change: &ReplicatedChange, pending: &mut Pending) -> Result<()> {
        match change {
            ReplicatedChange::Put { doc } => {
                let invalid = |e: bson::error::Error| Error::new(Code::InvalidBSON, format!("invalid replicated document: {e}"));
                let id = doc.get("_id").map_err(invalid)?.ok_or_else(|| Error::new(Code::FailedToParse, "a replicated document has no _id"))?;
                let id = Bson::try_from(id).map_err(invalid)?;
                let rid = self.rid_by_id(meta, snap, &id)?;
                // The index keys of a collection indexed on `_id` alone come from the `_id`:
                // the document is stored as it came, never decoded.
                let id_only = meta.indexes.iter().all(|i| i.spec.name == ID_INDEX_NAME);
                let keys_doc = match id_only {
                    true => doc! {"_id": id},
                    false => Document::try_from(doc.as_ref()).map_err(invalid)?,
                };
                let bytes = doc.as_bytes().to_vec();
                match rid {
                    Some(rid) if id_only => {
                        let old_len = snap
                            .get(Space::Records, &record_key(self.id, rid))?
                            .ok_or_else(|| corrupt(format!("_id index entry points at missing record {rid}")))?
                            .len();
                        self.prepare_update_encoded(meta, snap, rid, old_len, &keys_doc, &keys_doc, bytes, pending)
                    }
                    Some(rid) => {
                        let (old_bytes, old) = self.stored_doc(snap, rid)?;
                        self.prepare_update_encoded(meta, snap, rid, old_bytes.len(), &old, &keys_doc, bytes, pending)
                    }
                    None => self.prepare_insert_encoded(meta, snap, &keys_doc, bytes, true, pending).map(|_| ()),
                }
            }
            ReplicatedChange::Delete { id } => match self.rid_by_id(meta, snap, id)? {
                Some(rid) => self.prepare_delete(meta, snap, rid, pending),
                None => Ok(()),
            },
        }
    }

    /// Publish what `pending` changed once its batch is applied (the write lock is held).
    fn publish_pending(&self, pending: Pending) {
        if pending.removes {
            self.removals.fetch_add(1, Ordering::SeqCst);
        }
        *self.stats.lock() = pending.stats;
        if pending.data_delta >= 0 {
            self.shared.total_data_bytes.fetch_add(pending.data_delta as u64, Ordering::Relaxed);
        } else {
            let d = pending.data_delta.unsigned_abs();
            let _ = self.shared.total_data_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(d)));
        }
    }

    /// Add the replacement of record `id` (stored as `old`, `old_len` bytes) by `new` to
    /// `pending`, maintaining indexes: only index entries that change are written.
    #[allow(clippy::too_many_arguments)]
    fn prepare_update(
        &self,
        meta: &MetaRt,
        snap: &dyn EngineSnapshot,
        id: RecordId,
        old_len: usize,
        old: &Document,
        new: &Document,
        pending: &mut Pending,
    ) -> Result<()> {
        let new_bytes = encode_record(new, old_len + old_len / 8)?;
        self.prepare_update_encoded(meta, snap, id, old_len, old, new, new_bytes, pending)
    }

    /// `prepare_update` to a document already encoded as `new_bytes`. `old` and `new` give
    /// the index keys: the documents themselves, or only their `_id` when the `_id` index is
    /// the only one.
    #[allow(clippy::too_many_arguments)]
    fn prepare_update_encoded(
        &self,
        meta: &MetaRt,
        snap: &dyn EngineSnapshot,
        id: RecordId,
        old_len: usize,
        old: &Document,
        new: &Document,
        new_bytes: Vec<u8>,
        pending: &mut Pending,
    ) -> Result<()> {
        let st = self;
        let old_doc = old;
        if new_bytes.len() > BSON_OBJECT_SIZE_MAX_BYTES {
            return Err(Error::new(Code::BSONObjectTooLarge, format!("Resulting document after update is larger than {BSON_OBJECT_SIZE_MAX_BYTES}")));
        }
        if matches!(new.get("_id"), Some(Bson::Array(_))) {
            return Err(Error::new(Code::InvalidIdField, "The '_id' value cannot be of type array"));
        }
        let mut changes = Vec::with_capacity(meta.indexes.len());
        for idx in &meta.indexes {
            let (old_entries, _) = idx.entries(old_doc, id)?;
            let (new_entries, multikey) = idx.entries(new, id)?;
            let old_map: BTreeMap<&[u8], &[u8]> = old_entries.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
            let new_keys: HashSet<&[u8]> = new_entries.iter().map(|(k, _)| k.as_slice()).collect();
            let mut delta: i64 = 0;
            let mut ops = Vec::new();
            for (k, v) in &old_entries {
                if !new_keys.contains(k.as_slice()) {
                    delta -= (k.len() + v.len()) as i64;
                    ops.push(BatchOp::Delete(Space::Index, k.clone()));
                }
            }
            for (k, v) in &new_entries {
                let old = old_map.get(k.as_slice());
                // A building index may lack the old entry (record not yet scanned), and the
                // builder skips records changed since it read them: always write, and check
                // uniqueness even for keys the old version had.
                if idx.ready() && old.is_some_and(|ov| *ov == v.as_slice()) {
                    continue;
                }
                if idx.spec.unique && (old.is_none() || !idx.ready()) {
                    if let Some(existing) = snap.get(Space::Index, k)? {
                        if read_u64(&existing) != Some(id) {
                            if idx.building_conflict(st.dup_error(idx, v)) {
                                continue;
                            }
                            return Err(st.dup_error(idx, v));
                        }
                    }
                }
                match old {
                    Some(ov) => delta += v.len() as i64 - ov.len() as i64,
                    None => delta += (k.len() + v.len()) as i64,
                }
                ops.push(BatchOp::Put(Space::Index, k.clone(), v.clone()));
            }
            changes.push((idx.id, ops, delta, multikey));
        }
        for (iid, ops, delta, multikey) in changes {
            pending.batch.ops.extend(ops);
            let b = pending.stats.index_bytes.entry(iid).or_insert(0);
            *b = (*b as i64 + delta).max(0) as u64;
            if multikey {
                pending.stats.multikey.insert(iid);
            }
        }
        let delta = new_bytes.len() as i64 - old_len as i64;
        pending.stats.data_bytes = (pending.stats.data_bytes as i64 + delta).max(0) as u64;
        pending.data_delta += delta;
        if let Some(log) = &pending.log {
            let session = log.session.as_ref().map(|t| (t, oplog::current_stmt()));
            if let Some(tag) = session.filter(|_| oplog::wants_pre_image()) {
                pending.oplog.push(oplog::pre_image_entry(&log.ns, log.ui, &encode_record(old_doc, old_len)?, log.wall_ms, tag));
            }
            let id_doc = oplog::id_doc(new.get("_id").unwrap_or(&Bson::Null)).map_err(Error::bad_value)?;
            pending.oplog.push(oplog::update_entry(&log.ns, log.ui, &new_bytes, &id_doc, log.wall_ms, session));
        }
        pending.batch.put(Space::Records, record_key(st.id, id), new_bytes);
        Ok(())
    }

    /// Add the deletion of record `rid` and its index entries (computed from the stored
    /// document) to `pending`.
    fn prepare_delete(&self, meta: &MetaRt, snap: &dyn EngineSnapshot, rid: RecordId, pending: &mut Pending) -> Result<()> {
        let (old_bytes, old_doc) = self.stored_doc(snap, rid)?;
        for idx in &meta.indexes {
            let (entries, _) = idx.entries(&old_doc, rid)?;
            let mut removed = 0u64;
            for (k, v) in entries {
                removed += (k.len() + v.len()) as u64;
                pending.batch.delete(Space::Index, k);
            }
            let b = pending.stats.index_bytes.entry(idx.id).or_insert(0);
            *b = b.saturating_sub(removed);
        }
        pending.stats.count = pending.stats.count.saturating_sub(1);
        pending.stats.data_bytes = pending.stats.data_bytes.saturating_sub(old_bytes.len() as u64);
        pending.data_delta -= old_bytes.len() as i64;
        pending.removes = true;
        pending.batch.delete(Space::Records, record_key(self.id, rid));
        if let Some(log) = &pending.log {
            let session = log.session.as_ref().map(|t| (t, oplog::current_stmt()));
            if let Some(tag) = session.filter(|_| oplog::wants_pre_image()) {
                pending.oplog.push(oplog::pre_image_entry(&log.ns, log.ui, &old_bytes, log.wall_ms, tag));
            }
            let id = oplog::id_doc(old_doc.get("_id").unwrap_or(&Bson::Null)).map_err(Error::bad_value)?;
            pending.oplog.push(oplog::delete_entry(&log.ns, log.ui, &id, log.wall_ms, session));
        }
        Ok(())
    }

    /// Delete the documents with an entry of TTL index `idx` dated at or before `expiry_ms`,
    /// found by an index range scan, in batches of at most TTL_DELETE_BATCH_DOCS documents.
    fn ttl_delete_expired(self: &Arc<Self>, idx: &Arc<IndexRt>, expiry_ms: i64) -> Result<u64> {
        let descending = idx.fields.first().is_some_and(|f| f.descending);
        let bound = |ms: i64| {
            let mut k = Vec::with_capacity(10);
            encode_component(&Bson::DateTime(bson::DateTime::from_millis(ms)), descending, &mut k);
            k
        };
        let (oldest, newest) = (bound(i64::MIN), bound(expiry_ms));
        let bounds = if descending {
            IndexBounds { lower: Bound::Included(newest), upper: Bound::Included(oldest), reverse: true }
        } else {
            IndexBounds { lower: Bound::Included(oldest), upper: Bound::Included(newest), reverse: false }
        };
        let mut deleted = 0u64;
        loop {
            let _guard = WriteGuard::acquire(self);
            if self.dropped.load(Ordering::SeqCst) {
                return Ok(deleted);
            }
            let snapshot = self.snapshot();
            // The index may have been dropped (or recreated) since the pass started.
            if !snapshot.meta.ready_indexes().any(|i| i.id == idx.id) {
                return Ok(deleted);
            }
            let entries = snapshot.index_scan(&idx.spec.name, bounds.clone(), None, TTL_DELETE_BATCH_DOCS)?;
            let rids: BTreeSet<RecordId> = entries.iter().map(|e| e.record_id).collect();
            if rids.is_empty() {
                return Ok(deleted);
            }
            let mut pending = self.pending();
            for rid in &rids {
                self.prepare_delete(&snapshot.meta, &*snapshot.snap, *rid, &mut pending)?;
            }
            self.commit_pending(pending)?;
            deleted += rids.len() as u64;
            self.shared.ttl_deleted.fetch_add(rids.len() as u64, Ordering::Relaxed);
            if entries.len() < TTL_DELETE_BATCH_DOCS {
                return Ok(deleted);
            }
        }
    }

    fn pending(&self) -> Pending {
        let log = self.logs_changes().then(|| {
            // The session record's own collection is written in the same batch, not tagged.
            let session = oplog::with_session(|s| s.filter(|s| s.records.id != self.id).map(|s| oplog::SessionTag { lsid: s.lsid.clone(), txn: s.txn }));
            LogTarget { ns: self.ns_string(), ui: self.meta.read().uuid, wall_ms: oplog::wall_now_ms(), session }
        });
        Pending {
            batch: Batch::new(),
            stats: self.stats.lock().clone(),
            unique_keys: HashSet::new(),
            data_delta: 0,
            record_size_hint_bytes: 0,
            log,
            oplog: Vec::new(),
            removes: false,
        }
    }

    /// Changes are logged when the store keeps an oplog, except those of the `local`
    /// database, which no member replicates (the oplog itself lives there).
    fn logs_changes(&self) -> bool {
        self.shared.oplog.read().is_some() && self.ns.read().0 != oplog::OPLOG_DB && !oplog::is_applying_replicated()
    }

    fn stored_doc(&self, snap: &dyn EngineSnapshot, id: RecordId) -> Result<(Vec<u8>, Document)> {
        let bytes = snap
            .get(Space::Records, &record_key(self.id, id))?
            .ok_or_else(|| Error::new(Code::NoSuchKey, format!("record {id} not found in {}", self.ns_string())))?;
        let d = decode_doc(&bytes)?;
        Ok((bytes, d))
    }
}

struct Pending {
    batch: Batch,
    stats: Stats,
    /// Stored keys of unique indexes added by this batch.
    unique_keys: HashSet<Vec<u8>>,
    data_delta: i64,
    /// Size of the last record encoded.
    record_size_hint_bytes: usize,
    /// Set when this collection's changes go to the oplog.
    log: Option<LogTarget>,
    /// Oplog entries describing this batch, stamped when it is applied.
    oplog: Vec<Vec<u8>>,
    /// The batch deletes records (`CollState::removals` moves once it is applied).
    removes: bool,
}

/// What every oplog entry of one batch shares.
struct LogTarget {
    ns: String,
    ui: bson::Uuid,
    wall_ms: i64,
    /// The retryable write the entries belong to.
    session: Option<oplog::SessionTag>,
}

/// How `Shared::apply_logged_with` stamps a retryable write's batch.
struct SessionStamp {
    /// The transaction's newest entry before this batch (`OpTime::NULL` if none).
    prev: OpTime,
    /// The position in the batch of the put of the session's `config.transactions` record.
    record_op: usize,
}

/// MongoDB's shell-like rendering used in duplicate key messages: `{ _id: 1, a: "x" }`.
fn format_doc(d: &Document) -> String {
    if d.is_empty() {
        return "{}".to_string();
    }
    let parts: Vec<String> = d.iter().map(|(k, v)| format!("{k}: {}", format_value(v))).collect();
    format!("{{ {} }}", parts.join(", "))
}

fn format_value(v: &Bson) -> String {
    match v {
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        Bson::Double(d) => {
            if d.is_finite() && d.fract() == 0.0 && d.abs() < 1e15 {
                format!("{d:.1}")
            } else {
                d.to_string()
            }
        }
        Bson::String(s) => format!("{s:?}"),
        Bson::ObjectId(o) => format!("ObjectId('{}')", o.to_hex()),
        Bson::Boolean(b) => b.to_string(),
        Bson::Null => "null".to_string(),
        Bson::Undefined => "undefined".to_string(),
        Bson::MinKey => "MinKey".to_string(),
        Bson::MaxKey => "MaxKey".to_string(),
        Bson::Document(d) => format_doc(d),
        Bson::Array(a) => {
            if a.is_empty() {
                "[]".to_string()
            } else {
                format!("[ {} ]", a.iter().map(format_value).collect::<Vec<_>>().join(", "))
            }
        }
        Bson::DateTime(d) => format!("new Date({})", d.timestamp_millis()),
        Bson::Decimal128(d) => format!("NumberDecimal(\"{d}\")"),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------
// Names.

fn validate_db_name(db: &str) -> Result<()> {
    if db.is_empty() || db.len() > DB_NAME_LENGTH_MAX_BYTES || db.chars().any(|c| "/\\. \"$*<>:|?\0".contains(c)) {
        return Err(Error::new(Code::InvalidNamespace, format!("Invalid database name: '{db}'")));
    }
    Ok(())
}

/// System collections a client may create or write.
const SYSTEM_COLLECTIONS_ALLOWED: [&str; 2] = ["system.js", "system.profile"];

fn validate_ns(db: &str, name: &str) -> Result<()> {
    validate_db_name(db)?;
    if name.is_empty() || name.contains('$') || name.contains('\0') || name.starts_with('.') {
        return Err(Error::new(Code::InvalidNamespace, format!("Invalid collection name: {name}")));
    }
    // local.system.replset holds a replica-set member's configuration, admin.system.users
    // and admin.system.roles the users and user-defined roles (written by the user and role
    // management commands, or by a client with the privileges to, as with mongod).
    let replset_config = db == OPLOG_DB && name == "system.replset";
    let users = db == "admin" && (name == "system.users" || name == "system.roles");
    if name.starts_with("system.") && !SYSTEM_COLLECTIONS_ALLOWED.contains(&name) && !replset_config && !users {
        return Err(Error::new(Code::InvalidNamespace, format!("Invalid system namespace: {db}.{name}")));
    }
    if db.len() + 1 + name.len() > NAMESPACE_LENGTH_MAX_BYTES {
        return Err(Error::new(
            Code::InvalidNamespace,
            format!("Fully qualified namespace is too long. Namespace: {db}.{name} Max: {NAMESPACE_LENGTH_MAX_BYTES}"),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Store.

struct StoreInner {
    shared: Arc<Shared>,
    /// Serializes catalog changes (create, drop, rename).
    catalog: Mutex<()>,
    colls: RwLock<BTreeMap<(String, String), Arc<CollState>>>,
    ttl: Arc<TtlMonitor>,
    /// Told of every collection created (`Store::on_create`).
    create_hook: std::sync::OnceLock<CreateHook>,
}

/// Called after a collection is created, with its database and name, and whether the
/// database is new with it (the audit log's createCollection and createDatabase records).
/// Runs on the creating thread, inside the catalog lock: it must only take note.
pub type CreateHook = fn(db: &str, coll: &str, new_db: bool);

/// The TTL monitor thread's controls. The thread holds the store only weakly (and strongly
/// only during a pass), so dropping the last `Store` stops it.
struct TtlMonitor {
    /// Cleared on a replica-set member that is not primary: its deletions arrive through
    /// the oplog, as the primary's TTL monitor made them.
    enabled: AtomicBool,
    stop: Mutex<bool>,
    wake: Condvar,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for StoreInner {
    fn drop(&mut self) {
        *self.ttl.stop.lock() = true;
        self.ttl.wake.notify_all();
        let handle = self.ttl.thread.lock().take();
        if let Some(h) = handle {
            // The monitor itself may drop the last reference at the end of a pass.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        // The oplog's collection refers back to `Shared`: break the cycle so the engine closes.
        *self.shared.oplog.write() = None;
    }
}

/// Expired documents deleted per write batch (the collection lock is released between).
const TTL_DELETE_BATCH_DOCS: usize = 1000;

#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
}

/// One document's change in `Store::apply_replicated`.
#[derive(Debug, Clone)]
pub enum ReplicatedChange {
    /// The document with this `_id` becomes `doc` (inserted, or replacing the stored one),
    /// stored as these bytes.
    Put { doc: bson::RawDocumentBuf },
    /// The document with this `_id`, if any, is deleted.
    Delete { id: Bson },
}

/// A session's `config.transactions` record, as a member applying a retryable write's
/// entry derives it: `{_id: {id: lsid}, txnNum, lastWriteOpTime, lastWriteDate}`.
pub fn session_record(lsid: &[u8], txn: i64, last: OpTime, wall_ms: i64) -> bson::RawDocumentBuf {
    bson::RawDocumentBuf::from_bytes(oplog::session_record(lsid, txn, last, wall_ms)).expect("session_record encodes a valid document")
}

/// `config.transactions`.
pub const SESSION_RECORDS_DB: &str = "config";
pub const SESSION_RECORDS_COLLECTION: &str = "transactions";

/// See `Store::begin_retryable_write`; ends the retryable write (on this thread).
pub struct RetryableWriteGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for RetryableWriteGuard {
    fn drop(&mut self) {
        oplog::set_session(None);
    }
}

impl RetryableWriteGuard {
    /// The statement (`stmtId`) the next writes belong to.
    pub fn set_statement(&self, stmt: i32) {
        oplog::with_session(|s| {
            if let Some(s) = s {
                s.stmt = stmt;
                s.stmt_per_document = None;
            }
        });
    }

    /// The statement of each document of the next `Collection::insert_many`.
    pub fn set_statement_per_document(&self, stmts: Vec<i32>) {
        oplog::with_session(|s| {
            if let Some(s) = s {
                s.stmt_per_document = Some(stmts);
            }
        });
    }

    /// The optime of the transaction's newest entry (what its session record says now).
    pub fn last_write(&self) -> OpTime {
        oplog::with_session(|s| s.map_or(OpTime::NULL, |s| s.prev))
    }

    /// Log the documents the next updates and deletes change, as they were, before their
    /// changes (a findAndModify's retry returns them).
    pub fn set_pre_image(&self, on: bool) {
        oplog::with_session(|s| {
            if let Some(s) = s {
                s.pre_image = on;
            }
        });
    }
}

impl Store {
    /// Open (or create) a durable store in `path`.
    pub fn open(path: &std::path::Path, opts: StoreOptions) -> Result<Store> {
        let engine = FjallEngine::open(path, opts.cache_size_bytes, opts.fsync)?;
        Store::open_with_engine(Arc::new(engine))
    }

    pub fn open_in_memory() -> Store {
        Store::empty(Arc::new(MemoryEngine::new()))
    }

    fn empty(engine: Arc<dyn Engine>) -> Store {
        let shared = Arc::new(Shared {
            engine,
            applied_seq: AtomicU64::new(0),
            write_listener: std::sync::OnceLock::new(),
            commit: Mutex::new(CommitState { synced_seq: 0, syncing: false }),
            commit_done: Condvar::new(),
            sync_count: AtomicU64::new(0),
            sync_us: AtomicU64::new(0),
            next_internal_id: AtomicU64::new(1),
            total_data_bytes: AtomicU64::new(0),
            builds: Mutex::new(Vec::new()),
            ttl_deleted: AtomicU64::new(0),
            ttl_passes: AtomicU64::new(0),
            oplog: RwLock::new(None),
        });
        let ttl = Arc::new(TtlMonitor { enabled: AtomicBool::new(true), stop: Mutex::new(false), wake: Condvar::new(), thread: Mutex::new(None) });
        Store {
            inner: Arc::new(StoreInner { shared, catalog: Mutex::new(()), colls: RwLock::new(BTreeMap::new()), ttl, create_hook: std::sync::OnceLock::new() }),
        }
    }

    /// Open a store over any engine, loading its catalog and finishing interrupted drops.
    pub fn open_with_engine(engine: Arc<dyn Engine>) -> Result<Store> {
        let store = Store::empty(engine);
        let shared = store.inner.shared.clone();
        let snap = shared.engine.snapshot();
        let mut max_id = 0u64;
        let mut colls = BTreeMap::new();
        let mut total_data = 0u64;
        let (lo, hi) = prefix_bounds(&[CATALOG_META]);
        for kv in snap.iter(Space::Catalog, lo, hi, false) {
            let (_, v) = kv?;
            let d = decode_doc(&v)?;
            let id = d.get_i64("id").map_err(|_| corrupt("catalog entry without id"))? as u64;
            let db = d.get_str("db").map_err(|_| corrupt("catalog entry without db"))?.to_string();
            let name = d.get_str("name").map_err(|_| corrupt("catalog entry without name"))?.to_string();
            let uuid = match d.get("uuid") {
                Some(Bson::Binary(b)) => b.to_uuid().map_err(|_| corrupt("catalog uuid"))?,
                _ => return Err(corrupt("catalog entry without uuid")),
            };
            let options = d.get_document("options").cloned().unwrap_or_default();
            let mut indexes = Vec::new();
            for ix in d.get_array("indexes").map_err(|_| corrupt("catalog entry without indexes"))? {
                let Bson::Document(ix) = ix else { return Err(corrupt("catalog index entry")) };
                let iid = ix.get_i64("id").map_err(|_| corrupt("catalog index id"))? as u64;
                let spec = IndexSpec::from_spec(ix.get_document("spec").map_err(|_| corrupt("catalog index spec"))?.clone())?;
                max_id = max_id.max(iid);
                let rt = match IndexRt::new(iid, spec.clone()) {
                    Ok(rt) => rt,
                    Err(e) => {
                        // A partial filter this build cannot parse: index every document
                        // rather than refuse to open.
                        tracing::warn!("index {} of {db}.{name}: {e}; ignoring its partial filter", spec.name);
                        IndexRt::new(iid, IndexSpec { partial_filter: None, ..spec })?
                    }
                };
                indexes.push(Arc::new(rt));
            }
            max_id = max_id.max(id);
            let mut stats = match snap.get(Space::Catalog, &stats_key(id))? {
                Some(b) => Stats::from_bytes(&b)?,
                None => Stats::default(),
            };
            // Statistics of an index build a crash interrupted.
            stats.index_bytes.retain(|iid, _| indexes.iter().any(|i| i.id == *iid));
            stats.multikey.retain(|iid| indexes.iter().any(|i| i.id == *iid));
            total_data += stats.data_bytes;
            let st = Arc::new(CollState {
                shared: shared.clone(),
                id,
                ns: RwLock::new((db.clone(), name.clone())),
                meta: RwLock::new(Arc::new(MetaRt { uuid, options, indexes })),
                lock: WriteLock::new(),
                stats: Mutex::new(stats),
                dropped: AtomicBool::new(false),
                removals: AtomicU64::new(0),
                truncations: AtomicU64::new(0),
            });
            colls.insert((db, name), st);
        }
        let mut garbage = Vec::new();
        let (lo, hi) = prefix_bounds(&[CATALOG_GARBAGE]);
        for kv in snap.iter(Space::Catalog, lo, hi, false) {
            let (k, _) = kv?;
            let (Some(&kind), Some(id)) = (k.get(1), k.get(2..).and_then(read_u64)) else { return Err(corrupt("garbage marker")) };
            max_id = max_id.max(id);
            garbage.push((kind, id));
        }
        drop(snap);
        shared.next_internal_id.store(max_id + 1, Ordering::SeqCst);
        shared.total_data_bytes.store(total_data, Ordering::SeqCst);
        *store.inner.colls.write() = colls;
        for (kind, id) in garbage {
            shared.collect_garbage(kind, id)?;
        }
        shared.commit_durable()?;
        Ok(store)
    }

    /// Sorted; a database exists iff it has at least one collection.
    pub fn database_names(&self) -> Vec<String> {
        let colls = self.inner.colls.read();
        let mut names: Vec<String> = colls.keys().map(|(db, _)| db.clone()).collect();
        names.dedup();
        names
    }

    /// Sorted by name.
    pub fn list_collections(&self, db: &str) -> Vec<CollectionMeta> {
        self.colls_in(db).iter().map(|c| c.meta_public()).collect()
    }

    fn colls_in(&self, db: &str) -> Vec<Arc<CollState>> {
        let colls = self.inner.colls.read();
        colls.range((db.to_string(), String::new())..).take_while(|((d, _), _)| d == db).map(|(_, c)| c.clone()).collect()
    }

    /// Have `hook` told of every collection created from now on (once per store).
    pub fn on_create(&self, hook: CreateHook) {
        let _ = self.inner.create_hook.set(hook);
    }

    pub fn collection(&self, db: &str, name: &str) -> Option<Collection> {
        self.inner.colls.read().get(&(db.to_string(), name.to_string())).map(|c| Collection { state: c.clone() })
    }

    /// Create explicitly: NamespaceExists if present; InvalidNamespace for bad names.
    pub fn create_collection(&self, db: &str, name: &str, options: Document) -> Result<Collection> {
        self.create_inner(db, name, options, false, None)
    }

    /// Create a collection with the UUID another member gave it, if it gave one: oplog
    /// application and initial sync, so that a collection has one UUID across the set, as
    /// in mongod. Implicit when `existing_ok` (an insert's entry for a missing collection).
    pub fn create_collection_as(&self, db: &str, name: &str, options: Document, uuid: Option<bson::Uuid>, existing_ok: bool) -> Result<Collection> {
        self.create_inner(db, name, options, existing_ok, uuid)
    }

    /// Implicit creation (insert into a missing collection).
    pub fn collection_or_create(&self, db: &str, name: &str) -> Result<Collection> {
        if let Some(c) = self.collection(db, name) {
            return Ok(c);
        }
        self.create_inner(db, name, Document::new(), true, None)
    }

    fn create_inner(&self, db: &str, name: &str, options: Document, existing_ok: bool, uuid: Option<bson::Uuid>) -> Result<Collection> {
        validate_ns(db, name)?;
        let _cat = self.inner.catalog.lock();
        if let Some(c) = self.collection(db, name) {
            if existing_ok {
                return Ok(c);
            }
            return Err(Error::new(Code::NamespaceExists, format!("Collection {db}.{name} already exists.")));
        }
        self.create_locked(db, name, options, true, uuid)
    }

    /// Create a collection (the caller holds the catalog lock and checked that it is absent),
    /// with an `_id` index unless it is the oplog.
    fn create_locked(&self, db: &str, name: &str, options: Document, id_index: bool, uuid: Option<bson::Uuid>) -> Result<Collection> {
        let shared = &self.inner.shared;
        let id = shared.alloc_id();
        let indexes = if id_index { vec![Arc::new(IndexRt::new(shared.alloc_id(), IndexSpec::id_index())?)] } else { Vec::new() };
        // A new collection's UUID is random (Uuid::new): said by name, not as a "default".
        #[allow(clippy::unwrap_or_default)]
        let meta = MetaRt { uuid: uuid.unwrap_or_else(bson::Uuid::new), options, indexes };
        let stats = Stats { next_rid: 1, ..Stats::default() };
        let mut batch = Batch::new();
        batch.put(Space::Catalog, meta_key(db, name), encode_doc(&meta.to_doc(id, db, name))?);
        batch.put(Space::Catalog, stats_key(id), stats.to_bytes());
        let mut create = doc! {"create": name};
        create.extend(meta.options.clone());
        let entry = self.command_entry(db, Some(meta.uuid), &create)?;
        shared.apply_logged(batch, entry)?;
        let st = Arc::new(CollState {
            shared: shared.clone(),
            id,
            ns: RwLock::new((db.to_string(), name.to_string())),
            meta: RwLock::new(Arc::new(meta)),
            lock: WriteLock::new(),
            stats: Mutex::new(stats),
            dropped: AtomicBool::new(false),
            removals: AtomicU64::new(0),
            truncations: AtomicU64::new(0),
        });
        let new_db = {
            let mut colls = self.inner.colls.write();
            let new_db = colls.range((db.to_string(), String::new())..).next().is_none_or(|((d, _), _)| d != db);
            colls.insert((db.to_string(), name.to_string()), st.clone());
            new_db
        };
        shared.commit_durable()?;
        if let Some(hook) = self.inner.create_hook.get() {
            hook(db, name, new_db);
        }
        Ok(Collection { state: st })
    }

    /// The oplog entry of a catalog command on `db`, or none when changes to `db` are not
    /// logged (no oplog, or the `local` database).
    fn command_entry(&self, db: &str, ui: Option<bson::Uuid>, o: &Document) -> Result<Vec<Vec<u8>>> {
        if db == OPLOG_DB || self.inner.shared.oplog.read().is_none() || oplog::is_applying_replicated() {
            return Ok(Vec::new());
        }
        Ok(vec![oplog::command_entry(db, ui, o, oplog::wall_now_ms()).map_err(Error::bad_value)?])
    }

    /// Keep an oplog from now on (a replica-set member): create `local.oplog.rs` if it does
    /// not exist, otherwise continue after its newest entry. Every later change outside the
    /// `local` database is logged in the batch that makes it. Idempotent.
    pub fn enable_oplog(&self, cap_bytes: u64) -> Result<()> {
        let shared = &self.inner.shared;
        let _cat = self.inner.catalog.lock();
        if shared.oplog.read().is_some() {
            return Ok(());
        }
        let coll = match self.collection(OPLOG_DB, OPLOG_COLLECTION) {
            Some(c) => c,
            None => self.create_locked(OPLOG_DB, OPLOG_COLLECTION, doc! {"capped": true, "size": cap_bytes as i64}, false, None)?,
        };
        let st = coll.state;
        let snap = shared.engine.snapshot();
        let (lo, hi) = prefix_bounds(&st.id.to_be_bytes());
        let last = match snap.iter(Space::Records, lo, hi, true).next() {
            None => OpTime::default(),
            Some(kv) => {
                let (k, v) = kv?;
                let ts = read_u64(k.get(8..).unwrap_or(&[])).ok_or_else(|| corrupt("oplog key"))?;
                let term = decode_doc(&v)?.get_i64("t").unwrap_or(0);
                OpTime { ts, term }
            }
        };
        // What is in the engine after a restart was synced (or replayed from its journal).
        let mut state = OplogState::new(last);
        state.applied_through = match snap.get(Space::Catalog, &[CATALOG_APPLIED_THROUGH])? {
            Some(v) => Some(decode_optime(&v).ok_or_else(|| corrupt("oplog applied-through point"))?),
            None => None,
        };
        *shared.oplog.write() = Some(Arc::new(Oplog { coll: st, cap_bytes, state: Mutex::new(state) }));
        Ok(())
    }

    /// The newest oplog entry's optime (None without an oplog; zero when it is empty).
    pub fn oplog_last(&self) -> Option<OpTime> {
        self.inner.shared.oplog.read().as_ref().map(|l| l.state.lock().last)
    }

    /// The newest entry whose change the data holds: the newest entry, unless a secondary
    /// has written entries it has not applied yet (`write_oplog_replicated`).
    pub fn oplog_applied(&self) -> Option<OpTime> {
        self.inner.shared.oplog.read().as_ref().map(|l| {
            let st = l.state.lock();
            st.applied_through.unwrap_or(st.last)
        })
    }

    /// How far a member whose newest entry is `after` trails this oplog: how many entries
    /// follow it, and how long ago the oldest of them was logged here (zero when none
    /// does). `None` when those entries are no longer all in memory (far behind).
    pub fn oplog_lag(&self, after: OpTime) -> Option<(u64, std::time::Duration)> {
        let log = self.inner.shared.oplog.read().clone()?;
        let st = log.state.lock();
        if after.ts < st.recent_floor {
            return None;
        }
        let start = st.recent.partition_point(|(ts, _)| *ts <= after.ts);
        let Some(&(next, _)) = st.recent.get(start) else { return Some((0, std::time::Duration::ZERO)) };
        let behind = (st.recent.len() - start) as u64;
        // The batch holding that entry: the newest whose first entry is not after it.
        let i = st.logged_at.partition_point(|(first, _)| *first <= next);
        let age = i.checked_sub(1).and_then(|i| st.logged_at.get(i)).map_or(std::time::Duration::ZERO, |(_, at)| at.elapsed());
        Some((behind, age))
    }

    /// The newest oplog entry known durable (what a member reports as its durable optime).
    pub fn oplog_durable(&self) -> Option<OpTime> {
        self.inner.shared.oplog.read().as_ref().map(|l| l.state.lock().durable)
    }

    /// Append entries fetched from another member with their own optimes, in one engine
    /// batch: a secondary's oplog is a copy of its sync source's. The caller has applied
    /// their changes first (under `applying_replicated_ops`, so they logged nothing), so a
    /// crash in between leaves changes whose entries are fetched and applied again, which
    /// oplog application tolerates. Entries must be newer than the newest one, in order.
    pub fn append_oplog_replicated(&self, entries: &[(OpTime, Vec<u8>)]) -> Result<()> {
        self.apply_replicated_marked(&[], entries, Marker::Keep)
    }

    /// Write fetched entries to the oplog (as `append_oplog_replicated`) before their changes
    /// are applied: from here until `apply_written` covers them, `oplog_applied` stays at the
    /// newest entry applied before, and a restart applies the rest first
    /// (`oplog_unapplied`). mongod 8.0's secondaries do the same: a batch is acknowledged
    /// once durable in the oplog, and applied meanwhile.
    pub fn write_oplog_replicated(&self, entries: &[(OpTime, Vec<u8>)]) -> Result<()> {
        self.apply_replicated_marked(&[], entries, Marker::Written)
    }

    /// Apply the changes of entries already written (`write_oplog_replicated`), up to and
    /// including `through`, in one engine write with the moved applied-through point.
    /// `changes` as for `apply_replicated`; empty when the caller applied them itself, entry
    /// by entry (each its own write: a crash in between applies them again, which oplog
    /// application tolerates).
    pub fn apply_written(&self, changes: &[(Collection, Vec<ReplicatedChange>)], through: OpTime) -> Result<()> {
        self.apply_replicated_marked(changes, &[], Marker::Applied(through))
    }

    /// The written entries not yet applied (`write_oplog_replicated`), oldest first, at most
    /// `limit`: what a restart, or a member about to take writes, applies first.
    pub fn oplog_unapplied(&self, limit: usize) -> Result<Vec<(OpTime, Vec<u8>)>> {
        let shared = &self.inner.shared;
        let Some(log) = shared.oplog.read().clone() else { return Ok(Vec::new()) };
        let Some(from) = log.state.lock().applied_through else { return Ok(Vec::new()) };
        let snap = shared.engine.snapshot();
        let lo = std::ops::Bound::Excluded(record_key(log.coll.id, from.ts));
        let (_, hi) = prefix_bounds(&log.coll.id.to_be_bytes());
        let mut out = Vec::new();
        for kv in snap.iter(Space::Records, lo, hi, false).take(limit) {
            let (_, v) = kv?;
            let raw = bson::RawDocument::from_bytes(&v).map_err(|_| corrupt("oplog entry"))?;
            let at = OpTime::from_raw(raw).ok_or_else(|| corrupt("oplog entry without ts and t"))?;
            out.push((at, v.to_vec()));
        }
        Ok(out)
    }

    /// A secondary's batch in one engine write (one journal append): the final state of
    /// each document the fetched `entries` changed, per collection, and the entries
    /// themselves, appended to the oplog with their own optimes (newer than the newest
    /// entry, in order). Each collection appears once and each `_id` at most once in it.
    /// Applying a document's final state instead of every entry is what oplog application
    /// allows (entries are idempotent and the batch ends at the source's state as of its last
    /// entry), and one engine write per batch instead of one per entry takes a lock, a
    /// snapshot and a journal append per batch. Fails, having changed nothing, on a
    /// unique-key conflict among the changes (a key that moved between documents within the
    /// batch): the caller then applies the entries one by one.
    pub fn apply_replicated(&self, changes: &[(Collection, Vec<ReplicatedChange>)], entries: &[(OpTime, Vec<u8>)]) -> Result<()> {
        self.apply_replicated_marked(changes, entries, Marker::Keep)
    }

    fn apply_replicated_marked(&self, changes: &[(Collection, Vec<ReplicatedChange>)], entries: &[(OpTime, Vec<u8>)], marker: Marker) -> Result<()> {
        let shared = &self.inner.shared;
        let Some(log) = shared.oplog.read().clone() else {
            return Err(Error::new(Code::NoReplicationEnabled, "no oplog: not running with --replSet"));
        };
        if changes.is_empty() && entries.is_empty() && matches!(marker, Marker::Keep | Marker::Written) {
            return Ok(());
        }
        // Write locks in collection order (deadlock-free with any writer that holds one),
        // `config.transactions` last: a retryable write locks it after its own collection.
        let mut order: Vec<&(Collection, Vec<ReplicatedChange>)> = changes.iter().collect();
        order.sort_by_key(|(c, _)| (c.state.is_session_records(), c.state.id));
        if order.windows(2).any(|w| w[0].0.state.id == w[1].0.state.id) {
            return Err(Error::internal("apply_replicated: a collection appears twice"));
        }
        let _guards: Vec<WriteGuard> = order.iter().map(|(c, _)| WriteGuard::acquire(&c.state)).collect();
        let snap = shared.engine.snapshot();
        let mut batch = Batch::new();
        let mut published = Vec::with_capacity(order.len());
        for (coll, changes) in order {
            let st = &coll.state;
            st.check_live()?;
            st.check_not_oplog()?;
            let meta = st.meta.read().clone();
            let mut pending = st.pending();
            // Replicated changes are logged as the entries that carry them, below.
            pending.log = None;
            for change in changes {
                st.prepare_replicated(&meta, &*snap, change, &mut pending)?;
            }
            pending.batch.put(Space::Catalog, stats_key(st.id), pending.stats.to_bytes());
            batch.ops.append(&mut pending.batch.ops);
            published.push((st, pending));
        }
        let mut ost = log.state.lock();
        let mut last = ost.last;
        let mut stats = log.coll.stats.lock().clone();
        let mut added_bytes = 0u64;
        if let Some((first, _)) = entries.first().filter(|(at, _)| at.ts > last.ts) {
            ost.mark_logged(first.ts);
        }
        for (at, e) in entries {
            if at.ts <= last.ts {
                let newest = ost.last.ts;
                ost.forget_after(newest);
                return Err(Error::new(Code::OplogOutOfOrder, format!("oplog entry {:?} is not after the newest entry {:?}", at, last)));
            }
            last = *at;
            stats.count += 1;
            added_bytes += e.len() as u64;
            ost.remember(at.ts, e);
            batch.put(Space::Records, record_key(log.coll.id, at.ts), e.clone());
        }
        stats.data_bytes += added_bytes;
        batch.put(Space::Catalog, stats_key(log.coll.id), stats.to_bytes());
        let applied_through = match marker {
            Marker::Keep => ost.applied_through,
            Marker::Written => Some(ost.applied_through.unwrap_or(ost.last)),
            Marker::Applied(through) => {
                if ost.applied_through.is_none_or(|a| through <= a) || through > last {
                    return Err(Error::internal(format!("apply_written: {through:?} is not among the written, unapplied entries")));
                }
                (through < last).then_some(through)
            }
        };
        if applied_through != ost.applied_through {
            match applied_through {
                Some(at) => batch.put(Space::Catalog, vec![CATALOG_APPLIED_THROUGH], encode_optime(at)),
                None => batch.delete(Space::Catalog, vec![CATALOG_APPLIED_THROUGH]),
            }
        }
        if let Err(e) = shared.apply(batch) {
            let newest = ost.last.ts;
            ost.forget_after(newest);
            return Err(e);
        }
        ost.applied_through = applied_through;
        ost.last = last;
        ost.term = ost.term.max(last.term);
        shared.after_oplog_append(&log, stats, added_bytes, applied_through);
        drop(ost);
        for (st, pending) in published {
            st.publish_pending(pending);
        }
        Ok(())
    }

    /// Delete the oplog entries after `at` (rollback: they exist on no other member), so
    /// the oplog continues from `at`. Returns how many were deleted.
    pub fn truncate_oplog_after(&self, at: OpTime) -> Result<u64> {
        let shared = &self.inner.shared;
        let Some(log) = shared.oplog.read().clone() else {
            return Err(Error::new(Code::NoReplicationEnabled, "no oplog: not running with --replSet"));
        };
        let mut st = log.state.lock();
        let mut stats = log.coll.stats.lock().clone();
        let snap = shared.engine.snapshot();
        let lo = std::ops::Bound::Excluded(record_key(log.coll.id, at.ts));
        let (_, hi) = prefix_bounds(&log.coll.id.to_be_bytes());
        let mut batch = Batch::new();
        let mut removed = 0u64;
        let mut removed_bytes = 0u64;
        for kv in snap.iter(Space::Records, lo, hi, false) {
            let (k, v) = kv?;
            removed_bytes += v.len() as u64;
            stats.data_bytes = stats.data_bytes.saturating_sub(v.len() as u64);
            stats.count = stats.count.saturating_sub(1);
            removed += 1;
            batch.delete(Space::Records, k);
        }
        batch.put(Space::Catalog, stats_key(log.coll.id), stats.to_bytes());
        // Before the entries go: a reader that saw the old count before its snapshot and
        // sees it again after its read read none of the new branch.
        log.coll.truncations.fetch_add(1, Ordering::SeqCst);
        shared.apply(batch)?;
        log.coll.removals.fetch_add(1, Ordering::SeqCst);
        *log.coll.stats.lock() = stats;
        let _ = shared.total_data_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(removed_bytes)));
        st.last = at;
        st.durable = st.durable.min(at);
        st.forget_after(at.ts);
        debug_assert!(st.applied_through.is_none(), "rollback runs on a member that applied every entry it wrote");
        Ok(removed)
    }

    /// Stamp later oplog entries with term `t` (terms only grow).
    pub fn set_oplog_term(&self, t: i64) {
        if let Some(l) = self.inner.shared.oplog.read().as_ref() {
            let mut st = l.state.lock();
            st.term = st.term.max(t);
        }
    }

    /// Append a no-op entry carrying `o` (replSetInitiate's "initiating set"; new terms) and
    /// make it durable. Returns its optime.
    pub fn append_oplog_noop(&self, o: &Document) -> Result<OpTime> {
        let shared = &self.inner.shared;
        if shared.oplog.read().is_none() {
            return Err(Error::new(Code::NoReplicationEnabled, "no oplog: not running with --replSet"));
        }
        let entry = oplog::noop_entry(o, oplog::wall_now_ms()).map_err(Error::bad_value)?;
        shared.apply_logged(Batch::new(), vec![entry])?;
        shared.commit_durable()?;
        Ok(self.oplog_last().unwrap_or_default())
    }

    /// Garbage markers and deletes that remove `coll` from the catalog (caller holds its
    /// write lock and the catalog lock).
    fn drop_ops(coll: &CollState, batch: &mut Batch, delete_meta: bool) -> Vec<(u8, u64)> {
        let (db, name) = coll.ns.read().clone();
        if delete_meta {
            batch.delete(Space::Catalog, meta_key(&db, &name));
        }
        let mut garbage = vec![(GARBAGE_COLLECTION, coll.id)];
        for idx in &coll.meta.read().indexes {
            garbage.push((GARBAGE_INDEX, idx.id));
        }
        for (kind, id) in &garbage {
            batch.put(Space::Catalog, garbage_key(*kind, *id), Vec::new());
        }
        garbage
    }

    fn finish_drop(&self, coll: &CollState, garbage: Vec<(u8, u64)>) -> Result<()> {
        let data = coll.stats.lock().data_bytes;
        let _ = self.inner.shared.total_data_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(data)));
        for (kind, id) in garbage {
            self.inner.shared.collect_garbage(kind, id)?;
        }
        Ok(())
    }

    /// False if absent; removes data and indexes.
    pub fn drop_collection(&self, db: &str, name: &str) -> Result<bool> {
        let cat = self.inner.catalog.lock();
        let Some(coll) = self.inner.colls.read().get(&(db.to_string(), name.to_string())).cloned() else {
            return Ok(false);
        };
        self.check_not_live_oplog(db, name)?;
        let guard = WriteGuard::acquire(&coll);
        let mut batch = Batch::new();
        let garbage = Store::drop_ops(&coll, &mut batch, true);
        let uuid = coll.meta.read().uuid;
        let entry = self.command_entry(db, Some(uuid), &doc! {"drop": name})?;
        self.inner.shared.apply_logged(batch, entry)?;
        coll.dropped.store(true, Ordering::SeqCst);
        self.inner.colls.write().remove(&(db.to_string(), name.to_string()));
        drop(guard);
        drop(cat);
        self.finish_drop(&coll, garbage)?;
        self.inner.shared.commit_durable()?;
        Ok(true)
    }

    pub fn drop_database(&self, db: &str) -> Result<()> {
        for c in self.colls_in(db) {
            let name = c.ns.read().1.clone();
            self.drop_collection(db, &name)?;
        }
        // As mongod: each collection's drop, then the database's.
        let entry = self.command_entry(db, None, &doc! {"dropDatabase": 1})?;
        self.inner.shared.apply_logged(Batch::new(), entry)?;
        self.inner.shared.commit_durable()
    }

    /// The live oplog cannot be dropped or renamed (mongod: IllegalOperation).
    fn check_not_live_oplog(&self, db: &str, name: &str) -> Result<()> {
        if db == OPLOG_DB && name == OPLOG_COLLECTION && self.inner.shared.oplog.read().is_some() {
            return Err(Error::new(Code::IllegalOperation, "can't drop or rename the live oplog while replicating"));
        }
        Ok(())
    }

    /// NamespaceNotFound if the source is missing; NamespaceExists unless `drop_target`.
    pub fn rename_collection(&self, from_db: &str, from: &str, to_db: &str, to: &str, drop_target: bool) -> Result<()> {
        validate_ns(to_db, to)?;
        let shared = &self.inner.shared;
        let cat = self.inner.catalog.lock();
        let from_key = (from_db.to_string(), from.to_string());
        let to_key = (to_db.to_string(), to.to_string());
        let (src, target) = {
            let colls = self.inner.colls.read();
            (colls.get(&from_key).cloned(), colls.get(&to_key).cloned())
        };
        let Some(src) = src else {
            return Err(Error::new(Code::NamespaceNotFound, format!("Source collection {from_db}.{from} does not exist")));
        };
        if from_key == to_key {
            return Err(Error::new(Code::IllegalOperation, "Can't rename a collection to itself"));
        }
        if target.is_some() && !drop_target {
            return Err(Error::new(Code::NamespaceExists, "target namespace exists"));
        }
        self.check_not_live_oplog(from_db, from)?;
        self.check_not_live_oplog(to_db, to)?;
        let src_guard = WriteGuard::acquire(&src);
        let target_guard = target.as_ref().map(WriteGuard::acquire);
        let mut batch = Batch::new();
        let garbage = match &target {
            Some(t) => Store::drop_ops(t, &mut batch, false),
            None => Vec::new(),
        };
        batch.delete(Space::Catalog, meta_key(from_db, from));
        let mut meta_guard = src.meta.write();
        let old = meta_guard.clone();
        // Across databases MongoDB copies into a new collection: a new UUID.
        let uuid = if from_db == to_db { old.uuid } else { bson::Uuid::new() };
        let new_meta = Arc::new(MetaRt { uuid, options: old.options.clone(), indexes: old.indexes.clone() });
        batch.put(Space::Catalog, meta_key(to_db, to), encode_doc(&new_meta.to_doc(src.id, to_db, to))?);
        let rename = doc! {
            "renameCollection": format!("{from_db}.{from}"), "to": format!("{to_db}.{to}"), "stayTemp": false,
            "dropTarget": target.as_ref().map_or(Bson::Boolean(false), |t| Bson::Binary(bson::Binary::from_uuid(t.meta.read().uuid))),
        };
        // Logged under the source database unless that is `local` (then under the target's).
        let log_db = if from_db == OPLOG_DB { to_db } else { from_db };
        let entry = self.command_entry(log_db, Some(old.uuid), &rename)?;
        shared.apply_logged(batch, entry)?;
        *meta_guard = new_meta;
        drop(meta_guard);
        *src.ns.write() = to_key.clone();
        {
            let mut colls = self.inner.colls.write();
            colls.remove(&from_key);
            colls.insert(to_key, src.clone());
        }
        if let Some(t) = &target {
            t.dropped.store(true, Ordering::SeqCst);
        }
        drop(target_guard);
        drop(src_guard);
        drop(cat);
        if let Some(t) = &target {
            self.finish_drop(t, garbage)?;
        }
        shared.commit_durable()
    }

    /// Make every write applied so far durable; concurrent callers share one sync.
    pub fn commit_durable(&self) -> Result<()> {
        self.inner.shared.commit_durable()
    }

    /// A counter of applied write batches: a reader that saw it
    /// before looking for new data and finds none waits for the write listener
    /// (`set_write_listener`) to report a change.
    pub fn write_seq(&self) -> u64 {
        self.inner.shared.write_seq()
    }

    /// Call `f` after every applied batch (whenever `write_seq` moves),
    /// on the writing thread: it must be cheap and must not write. Set once; later calls are
    /// ignored.
    pub fn set_write_listener(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.inner.shared.write_listener.set(f);
    }

    /// Run this thread's next writes as retryable write `txn` of session `lsid` until the
    /// returned guard is dropped, as mongod does: each oplog entry carries `lsid`,
    /// `txnNumber`, the statement it belongs to (`RetryableWriteGuard::set_statement`) and `prevOpTime`
    /// (the transaction's previous entry; `prev` for the first, `OpTime::NULL` when it has
    /// none), and each engine write that logs entries also writes the session's record in
    /// `config.transactions` (`lastWriteOpTime`: its newest entry). A retry finds what the
    /// transaction already did by walking the entries back from that record. A replica-set
    /// member only (no oplog: an error).
    pub fn begin_retryable_write(&self, lsid: &[u8], txn: i64, prev: OpTime) -> Result<RetryableWriteGuard> {
        if self.inner.shared.oplog.read().is_none() {
            return Err(Error::new(Code::IllegalOperation, "Transaction numbers are only allowed on a replica set member or mongos"));
        }
        if oplog::with_session(|s| s.is_some()) {
            return Err(Error::internal("a retryable write began inside another"));
        }
        let records = self.collection_or_create(SESSION_RECORDS_DB, SESSION_RECORDS_COLLECTION)?;
        oplog::set_session(Some(oplog::SessionWrite {
            lsid: lsid.to_vec(),
            txn,
            records: records.state,
            prev,
            stmt: 0,
            stmt_per_document: None,
            pre_image: false,
        }));
        Ok(RetryableWriteGuard { _not_send: std::marker::PhantomData })
    }

    /// Number of engine syncs performed (group commit observability; tests).
    pub fn sync_count(&self) -> u64 {
        self.inner.shared.sync_count.load(Ordering::Relaxed)
    }

    /// Time spent in engine syncs so far.
    pub fn sync_time_us(&self) -> u64 {
        self.inner.shared.sync_us.load(Ordering::Relaxed)
    }

    pub fn database_stats(&self, db: &str) -> DbStats {
        let mut s = DbStats::default();
        for c in self.colls_in(db) {
            let cs = Collection { state: c }.stats();
            s.collections += 1;
            s.objects += cs.count;
            s.data_size_bytes += cs.size_bytes;
            s.storage_size_bytes += cs.storage_size_bytes;
            s.indexes += cs.index_sizes.len() as u64;
            s.index_size_bytes += cs.index_sizes.iter().map(|(_, b)| *b).sum::<u64>();
        }
        s
    }

    /// Start the TTL monitor: every `interval` (MongoDB: 60 s) delete expired documents of
    /// every collection with a TTL index. Idempotent; stops when the last Store clone drops.
    pub fn start_ttl_monitor(&self, interval: std::time::Duration) {
        let mut thread = self.inner.ttl.thread.lock();
        if thread.is_some() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let monitor = self.inner.ttl.clone();
        let spawned = std::thread::Builder::new().name("ttl-monitor".to_string()).spawn(move || loop {
            {
                let mut stop = monitor.stop.lock();
                if !*stop {
                    monitor.wake.wait_for(&mut stop, interval);
                }
                if *stop {
                    return;
                }
            }
            let Some(inner) = weak.upgrade() else { return };
            let store = Store { inner };
            if !monitor.enabled.load(Ordering::SeqCst) {
                continue;
            }
            if let Err(e) = store.run_ttl_pass() {
                tracing::warn!("TTL monitor pass failed: {}", e.message);
            }
        });
        match spawned {
            Ok(h) => *thread = Some(h),
            Err(e) => tracing::error!("cannot start the TTL monitor thread: {e}"),
        }
    }

    /// Whether the TTL monitor deletes (a replica-set member deletes only while primary).
    pub fn set_ttl_deletes_enabled(&self, enabled: bool) {
        self.inner.ttl.enabled.store(enabled, Ordering::SeqCst);
    }

    /// One TTL pass (what the monitor runs every interval): in every non-capped collection,
    /// delete the documents whose TTL-indexed date (an array's earliest) is older than now
    /// minus expireAfterSeconds. Returns the number deleted.
    pub fn run_ttl_pass(&self) -> Result<u64> {
        let now_ms = bson::DateTime::now().timestamp_millis();
        let colls: Vec<Arc<CollState>> = self.inner.colls.read().values().cloned().collect();
        let mut deleted = 0u64;
        let mut first_error = None;
        for coll in colls {
            let meta = coll.meta.read().clone();
            if matches!(meta.options.get("capped"), Some(Bson::Boolean(true))) {
                continue;
            }
            for idx in meta.ready_indexes() {
                let Some(secs) = idx.spec.expire_after_seconds else { continue };
                if idx.fields.len() != 1 || idx.fields[0].hashed || secs < 0 {
                    continue;
                }
                let expiry_ms = now_ms.saturating_sub(secs.saturating_mul(1000));
                // One failing collection does not stop the others.
                match coll.ttl_delete_expired(idx, expiry_ms) {
                    Ok(n) => deleted += n,
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        self.inner.shared.ttl_passes.fetch_add(1, Ordering::Relaxed);
        match first_error {
            Some(e) => Err(e),
            None => Ok(deleted),
        }
    }

    /// Documents the TTL monitor has deleted since open.
    pub fn ttl_deleted_count(&self) -> u64 {
        self.inner.shared.ttl_deleted.load(Ordering::Relaxed)
    }

    /// Completed TTL passes since open.
    pub fn ttl_passes(&self) -> u64 {
        self.inner.shared.ttl_passes.load(Ordering::Relaxed)
    }

    /// Index builds in progress.
    pub fn index_builds(&self) -> Vec<IndexBuildProgress> {
        let builds = self.inner.shared.builds.lock().clone();
        builds
            .iter()
            .filter_map(|b| {
                let coll = b.coll.upgrade()?;
                Some(IndexBuildProgress {
                    ns: coll.ns_string(),
                    index_name: b.index_name.clone(),
                    done_records: b.done_records.load(Ordering::Relaxed),
                    total_records: b.total_records.load(Ordering::Relaxed),
                })
            })
            .collect()
    }

    /// On-disk size of the whole store (fjall); approximate bytes held (in-memory).
    pub fn storage_size_bytes(&self) -> u64 {
        self.inner.shared.engine.size_bytes()
    }
}

// ---------------------------------------------------------------------------------------
// Collection.

#[derive(Clone)]
pub struct Collection {
    state: Arc<CollState>,
}

impl Collection {
    pub fn meta(&self) -> CollectionMeta {
        self.state.meta_public()
    }

    /// True once the collection was dropped (or renamed over): its handle sees no new data.
    pub fn is_dropped(&self) -> bool {
        self.state.dropped.load(Ordering::SeqCst)
    }

    /// Up to `max_docs` records after `after` (from the first when None), as stored, for a
    /// tailing reader. On the live oplog it takes the newest entries from memory
    /// (`OplogState::recent`) when they are all there, under the oplog lock, which every
    /// logged batch holds until it is applied: a batch's entries are read all or none.
    /// Entries from memory are not copied: they are shared (`RawRecord::Shared`).
    pub fn tail_chunk(&self, after: Option<RecordId>, max_docs: usize) -> Result<Vec<(RecordId, RawRecord)>> {
        let scan = |snap: Snapshot| -> Result<Vec<(RecordId, RawRecord)>> {
            Ok(snap.scan_raw(after, max_docs)?.into_iter().map(|(rid, b)| (rid, RawRecord::Owned(b))).collect())
        };
        let log = self.state.shared.oplog.read().clone();
        let Some(log) = log.filter(|l| l.coll.id == self.state.id) else {
            return scan(self.state.snapshot());
        };
        let snap = {
            let st = log.state.lock();
            if let Some(after) = after.filter(|a| *a >= st.recent_floor) {
                let start = st.recent.partition_point(|(ts, _)| *ts <= after);
                return Ok(st.recent.range(start..).take(max_docs).map(|(ts, e)| (*ts, RawRecord::Shared(e.clone()))).collect());
            }
            self.state.snapshot()
        };
        scan(snap)
    }

    /// A counter that moves once records of the collection were deleted. Read before taking
    /// a snapshot: if it has not moved since a position was read, the snapshot still holds
    /// that position's record.
    pub fn removals(&self) -> u64 {
        self.state.removals.load(Ordering::SeqCst)
    }

    /// A counter that moves before each rollback truncation of the oplog
    /// (`Store::truncate_oplog_after`). A reader that tails from a position must stop when
    /// it moved: its position's timestamp may now hold another branch's entry, and what
    /// follows is not what followed the entry it read. Read before the snapshot and again
    /// after the read, a batch between two equal reads saw no truncation.
    pub fn truncations(&self) -> u64 {
        self.state.truncations.load(Ordering::SeqCst)
    }

    /// Whether the collection was created capped (the oplog is).
    pub fn is_capped(&self) -> bool {
        matches!(self.state.meta.read().options.get("capped"), Some(Bson::Boolean(true)))
    }

    /// Names of the indexes that have indexed an expanded array (multikey).
    pub fn multikey_indexes(&self) -> Vec<String> {
        let mk = self.state.stats.lock().multikey.clone();
        self.state.meta.read().ready_indexes().filter(|i| mk.contains(&i.id)).map(|i| i.spec.name.clone()).collect()
    }

    /// Insert a batch as one atomic engine batch (documents must already have `_id`).
    /// Checks unique indexes against stored data and within the batch; `ordered` stops at
    /// the first failure (documents before it are inserted). Does not sync.
    pub fn insert_many(&self, docs: &[Document], ordered: bool) -> InsertOutcome {
        let st = &self.state;
        let _guard = WriteGuard::acquire(st);
        if let Err(e) = st.check_live() {
            return InsertOutcome { inserted: 0, errors: (0..docs.len()).map(|i| (i, e.clone())).collect() };
        }
        let meta = st.meta.read().clone();
        let snap = st.shared.engine.snapshot();
        let mut pending = st.pending();
        // A record and (usually) one entry per index for each document, plus the statistics.
        pending.batch.ops.reserve(docs.len() * (1 + meta.indexes.len()) + 1);
        let mut ok = Vec::with_capacity(docs.len());
        let mut errors = Vec::new();
        for (i, d) in docs.iter().enumerate() {
            oplog::select_document_statement(i);
            match st.prepare_insert(&meta, &*snap, d, &mut pending) {
                Ok(_) => ok.push(i),
                Err(e) => {
                    errors.push((i, e));
                    if ordered {
                        break;
                    }
                }
            }
        }
        if ok.is_empty() {
            return InsertOutcome { inserted: 0, errors };
        }
        if let Err(e) = st.commit_pending(pending) {
            errors.extend(ok.iter().map(|i| (*i, e.clone())));
            errors.sort_by_key(|(i, _)| *i);
            return InsertOutcome { inserted: 0, errors };
        }
        InsertOutcome { inserted: ok.len(), errors }
    }

    /// A consistent point-in-time view (owned, Send, may outlive this handle).
    pub fn snapshot(&self) -> Snapshot {
        self.state.snapshot()
    }

    /// Exclusive writer; holds the collection write lock until dropped.
    pub fn writer(&self) -> Writer {
        Writer { guard: WriteGuard::acquire(&self.state) }
    }

    /// Build an index over existing documents. Ok(false) if an identical index exists.
    ///
    /// The build does not block writers: the index is first registered as building (writers
    /// maintain it from then on; readers and `CollectionMeta.indexes` do not see it), then
    /// existing records are indexed in chunks read without the write lock and applied under
    /// it only for records unchanged since they were read, then the index is made ready.
    pub fn create_index(&self, spec: IndexSpec) -> Result<bool> {
        let st = &self.state;
        st.check_not_oplog()?;
        validate_index_spec(&spec)?;
        let spec = IndexSpec { spec: spec.normalized_spec(), ..spec };
        let (idx, rid_end) = loop {
            let guard = WriteGuard::acquire(st);
            st.check_live()?;
            let meta = st.meta.read().clone();
            match check_new_index(&meta, &spec, st)? {
                NewIndex::Exists => return Ok(false),
                NewIndex::Building => {
                    // Like MongoDB, a request for an index being built waits for that build.
                    drop(guard);
                    std::thread::sleep(INDEX_BUILD_WAIT_POLL);
                    continue;
                }
                NewIndex::Absent => {}
            }
            let shared = &st.shared;
            let (rid_end, total) = {
                let stats = st.stats.lock();
                (stats.next_rid, stats.count)
            };
            let build = Arc::new(BuildState {
                coll: Arc::downgrade(st),
                index_name: spec.name.clone(),
                done_records: AtomicU64::new(0),
                total_records: AtomicU64::new(total),
                conflict: Mutex::new(None),
            });
            let mut idx = IndexRt::new(shared.alloc_id(), spec.clone())?;
            idx.build = Some(build.clone());
            let idx = Arc::new(idx);
            // The marker makes a crash mid-build delete the partial entries at the next open
            // (the catalog lists only ready indexes).
            let mut batch = Batch::new();
            batch.put(Space::Catalog, garbage_key(GARBAGE_INDEX, idx.id), Vec::new());
            shared.apply(batch)?;
            let mut indexes = meta.indexes.clone();
            indexes.push(idx.clone());
            *st.meta.write() = Arc::new(MetaRt { uuid: meta.uuid, options: meta.options.clone(), indexes });
            shared.builds.lock().push(build);
            break (idx, rid_end);
        };
        let result = self.build_existing(&idx, rid_end).and_then(|()| self.finish_build(&idx));
        st.shared.unregister_build(&idx);
        match result {
            Ok(()) => Ok(true),
            Err(e) => {
                self.abort_build(&idx)?;
                Err(e)
            }
        }
    }

    /// Index the records with ids below `rid_end` (later ones were inserted after the index
    /// was registered, so writers indexed them).
    fn build_existing(&self, idx: &Arc<IndexRt>, rid_end: RecordId) -> Result<()> {
        let st = &self.state;
        let Some(build) = idx.build.as_ref() else { return Ok(()) };
        let end_key = record_key(st.id, rid_end);
        let mut next_rid: RecordId = 0;
        loop {
            // Unlocked: read and key a chunk from a fresh snapshot.
            let mut chunk = Vec::with_capacity(INDEX_BUILD_CHUNK_DOCS);
            {
                let snap = st.shared.engine.snapshot();
                let lower = Bound::Included(record_key(st.id, next_rid));
                for kv in snap.iter(Space::Records, lower, Bound::Excluded(end_key.clone()), false) {
                    let (k, v) = kv?;
                    let rid = read_u64(k.get(8..).unwrap_or(&[])).ok_or_else(|| corrupt("record key"))?;
                    let d = decode_doc(&v)?;
                    let (entries, multikey) = idx.entries(&d, rid)?;
                    chunk.push((rid, v, entries, multikey));
                    if chunk.len() >= INDEX_BUILD_CHUNK_DOCS {
                        break;
                    }
                }
            }
            let Some(last) = chunk.last().map(|c| c.0) else { return Ok(()) };
            next_rid = last.saturating_add(1);
            // Locked, briefly: records changed or deleted since the read were indexed by
            // their writers (the index was already registered); add the rest.
            let _guard = WriteGuard::acquire(st);
            self.check_build_alive(idx)?;
            let latest = st.shared.engine.snapshot();
            let mut pending = st.pending();
            let mut added_bytes = 0u64;
            let mut multikey = false;
            let scanned = chunk.len() as u64;
            for (rid, bytes, entries, mk) in chunk {
                if latest.get(Space::Records, &record_key(st.id, rid))?.is_none_or(|b| b != bytes) {
                    continue;
                }
                multikey |= mk;
                for (stored, value) in entries {
                    if let Some(existing) = latest.get(Space::Index, &stored)? {
                        if idx.spec.unique && read_u64(&existing) != Some(rid) {
                            return Err(st.dup_error(idx, &value));
                        }
                        continue;
                    }
                    if idx.spec.unique && !pending.unique_keys.insert(stored.clone()) {
                        return Err(st.dup_error(idx, &value));
                    }
                    added_bytes += (stored.len() + value.len()) as u64;
                    pending.batch.put(Space::Index, stored, value);
                }
            }
            *pending.stats.index_bytes.entry(idx.id).or_insert(0) += added_bytes;
            if multikey {
                pending.stats.multikey.insert(idx.id);
            }
            st.commit_pending(pending)?;
            build.done_records.fetch_add(scanned, Ordering::Relaxed);
        }
    }

    /// Abort if the collection or the index was dropped, or a writer met a unique conflict.
    /// Caller holds the write lock.
    fn check_build_alive(&self, idx: &IndexRt) -> Result<()> {
        let st = &self.state;
        if st.dropped.load(Ordering::SeqCst) {
            return Err(Error::new(Code::IndexBuildAborted, format!("Index build aborted: {}: collection dropped", idx.spec.name)));
        }
        if !st.meta.read().indexes.iter().any(|i| i.id == idx.id) {
            return Err(Error::new(Code::IndexBuildAborted, format!("Index build aborted: {}: index dropped", idx.spec.name)));
        }
        if let Some(e) = idx.build.as_ref().and_then(|b| b.conflict.lock().clone()) {
            return Err(e);
        }
        Ok(())
    }

    /// Under the write lock: make the index ready and record it in the catalog.
    fn finish_build(&self, idx: &Arc<IndexRt>) -> Result<()> {
        let st = &self.state;
        let _guard = WriteGuard::acquire(st);
        self.check_build_alive(idx)?;
        let ready = Arc::new(IndexRt::new(idx.id, idx.spec.clone())?);
        let meta = st.meta.read().clone();
        let indexes = meta.indexes.iter().map(|i| if i.id == idx.id { ready.clone() } else { i.clone() }).collect();
        let new_meta = Arc::new(MetaRt { uuid: meta.uuid, options: meta.options.clone(), indexes });
        let mut pending = st.pending();
        let (db, name) = st.ns.read().clone();
        pending.batch.put(Space::Catalog, meta_key(&db, &name), encode_doc(&new_meta.to_doc(st.id, &db, &name))?);
        pending.batch.delete(Space::Catalog, garbage_key(GARBAGE_INDEX, idx.id));
        if let Some(log) = &pending.log {
            // Logged once the build is done: a member applying it builds the whole index.
            let mut o = doc! {"createIndexes": name.as_str()};
            o.extend(idx.spec.spec.clone());
            pending.oplog.push(oplog::command_entry(&db, Some(log.ui), &o, log.wall_ms).map_err(Error::bad_value)?);
        }
        let mut meta_guard = st.meta.write();
        st.commit_pending(pending)?;
        // Leave the list of builds before readers can see the index, so that no one sees it
        // both ready and building.
        st.shared.unregister_build(idx);
        *meta_guard = new_meta;
        Ok(())
    }

    /// Unregister a failed build and delete its entries (unless a drop already owns them).
    fn abort_build(&self, idx: &IndexRt) -> Result<()> {
        let st = &self.state;
        {
            let _guard = WriteGuard::acquire(st);
            if st.dropped.load(Ordering::SeqCst) {
                return Ok(());
            }
            let meta = st.meta.read().clone();
            if !meta.indexes.iter().any(|i| i.id == idx.id) {
                return Ok(());
            }
            let indexes = meta.indexes.iter().filter(|i| i.id != idx.id).cloned().collect();
            let new_meta = Arc::new(MetaRt { uuid: meta.uuid, options: meta.options.clone(), indexes });
            let mut pending = st.pending();
            pending.stats.index_bytes.remove(&idx.id);
            pending.stats.multikey.remove(&idx.id);
            let mut meta_guard = st.meta.write();
            st.commit_pending(pending)?;
            *meta_guard = new_meta;
        }
        st.shared.collect_garbage(GARBAGE_INDEX, idx.id)
    }

    /// IndexNotFound if absent; the `_id_` index cannot be dropped.
    pub fn drop_index(&self, name: &str) -> Result<()> {
        let st = &self.state;
        if name == ID_INDEX_NAME {
            return Err(Error::new(Code::InvalidOptions, "cannot drop _id index"));
        }
        let _guard = WriteGuard::acquire(st);
        st.check_live()?;
        let meta = st.meta.read().clone();
        // A build in progress is aborted by dropping its index.
        let Some(idx) = meta.indexes.iter().find(|i| i.spec.name == name).cloned() else {
            return Err(Error::new(Code::IndexNotFound, format!("index not found with name [{name}]")));
        };
        let indexes: Vec<Arc<IndexRt>> = meta.indexes.iter().filter(|i| i.id != idx.id).cloned().collect();
        let new_meta = Arc::new(MetaRt { uuid: meta.uuid, options: meta.options.clone(), indexes });
        let mut pending = st.pending();
        pending.stats.index_bytes.remove(&idx.id);
        pending.stats.multikey.remove(&idx.id);
        let (db, coll) = st.ns.read().clone();
        pending.batch.put(Space::Catalog, meta_key(&db, &coll), encode_doc(&new_meta.to_doc(st.id, &db, &coll))?);
        pending.batch.put(Space::Catalog, garbage_key(GARBAGE_INDEX, idx.id), Vec::new());
        if let Some(log) = &pending.log {
            let o = doc! {"dropIndexes": coll.as_str(), "index": idx.spec.name.as_str()};
            pending.oplog.push(oplog::command_entry(&db, Some(log.ui), &o, log.wall_ms).map_err(Error::bad_value)?);
        }
        {
            let mut meta_guard = st.meta.write();
            st.commit_pending(pending)?;
            *meta_guard = new_meta;
        }
        st.shared.collect_garbage(GARBAGE_INDEX, idx.id)
    }

    pub fn stats(&self) -> CollStats {
        let st = &self.state;
        let stats = st.stats.lock().clone();
        let meta = st.meta.read().clone();
        let total = st.shared.total_data_bytes.load(Ordering::Relaxed);
        let records_space = st.shared.engine.space_size_bytes(Space::Records);
        // The records keyspace is shared: attribute its size by share of logical bytes.
        let storage = if total == 0 { 0 } else { (records_space as u128 * stats.data_bytes as u128 / total as u128) as u64 };
        CollStats {
            count: stats.count,
            size_bytes: stats.data_bytes,
            storage_size_bytes: storage,
            index_sizes: meta.ready_indexes().map(|i| (i.spec.name.clone(), stats.index_bytes.get(&i.id).copied().unwrap_or(0))).collect(),
        }
    }

    /// Recount records; check every record has exactly its index entries and every index
    /// entry belongs to a record with that key.
    pub fn validate(&self) -> ValidateReport {
        let snapshot = self.snapshot();
        let mut report = ValidateReport { valid: true, ..ValidateReport::default() };
        if let Err(e) = snapshot.validate_into(&mut report) {
            report.valid = false;
            report.errors.push(e.message);
        }
        report
    }
}

enum NewIndex {
    Absent,
    /// An identical index exists.
    Exists,
    /// An identical index is being built.
    Building,
}

/// Conflicts of a requested index with the existing ones (ready or building).
fn check_new_index(meta: &MetaRt, spec: &IndexSpec, st: &CollState) -> Result<NewIndex> {
    for existing in &meta.indexes {
        let e = &existing.spec;
        if e.name == spec.name {
            if e.key == spec.key {
                if e.same_options(spec) {
                    return Ok(if existing.ready() { NewIndex::Exists } else { NewIndex::Building });
                }
                return Err(Error::new(
                    Code::IndexOptionsConflict,
                    format!(
                        "An equivalent index already exists with the same name but different options. Requested index: {}, existing index: {}",
                        spec.spec, e.spec
                    ),
                ));
            }
            return Err(Error::new(
                Code::IndexKeySpecsConflict,
                format!("An existing index has the same name as the requested index. When index names are not specified, they are auto generated and can cause conflicts. Please refer to our documentation. Requested index: {}, existing index: {}", spec.spec, e.spec),
            ));
        }
        if e.key == spec.key && e.partial_filter == spec.partial_filter {
            if e.same_options(spec) {
                return Err(Error::new(Code::IndexOptionsConflict, format!("Index already exists with a different name: {}", e.name)));
            }
            return Err(Error::new(
                Code::IndexOptionsConflict,
                format!("An equivalent index already exists with a different name and options. Requested index: {}, existing index: {}", spec.spec, e.spec),
            ));
        }
    }
    if meta.indexes.len() >= INDEXES_PER_COLLECTION_MAX {
        return Err(Error::new(Code::CannotCreateIndex, format!("add index fails, too many indexes for {} key:{}", st.ns_string(), spec.key)));
    }
    Ok(NewIndex::Absent)
}

fn validate_index_spec(spec: &IndexSpec) -> Result<()> {
    if spec.name.is_empty() {
        return Err(Error::new(Code::CannotCreateIndex, "index name cannot be empty"));
    }
    if spec.key.is_empty() {
        return Err(Error::new(Code::CannotCreateIndex, "Index keys cannot be empty."));
    }
    for (field, dir) in &spec.key {
        let numeric_nonzero = match dir {
            Bson::Int32(i) => *i != 0,
            Bson::Int64(i) => *i != 0,
            Bson::Double(d) => *d != 0.0 && !d.is_nan(),
            Bson::Decimal128(_) => true,
            _ => false,
        };
        if let Bson::String(kind) = dir {
            if kind != keygen::HASHED {
                return Err(Error::new(Code::CannotCreateIndex, format!("Index type '{kind}' on field '{field}' is not supported")));
            }
        } else if !numeric_nonzero {
            return Err(Error::new(
                Code::CannotCreateIndex,
                format!("Values in the index key pattern can only be numbers or strings; bad key: {field}: {dir}"),
            ));
        }
        if field.is_empty() || field.split('.').any(str::is_empty) {
            return Err(Error::new(Code::CannotCreateIndex, format!("Index keys cannot be an empty field: {}", spec.key)));
        }
    }
    let hashed_fields = spec.key.values().filter(|d| keygen::is_hashed(d)).count();
    if hashed_fields > 0 {
        if spec.unique {
            return Err(Error::location(16764, "Currently hashed indexes cannot guarantee uniqueness. Use a regular index."));
        }
        if hashed_fields > 1 {
            return Err(Error::location(
                31303,
                format!("A maximum of one index field is allowed to be hashed but found {hashed_fields} for 'key' {}", format_doc(&spec.key)),
            ));
        }
    }
    if spec.unique && spec.key.keys().any(|k| k.contains("$")) {
        return Err(Error::new(Code::CannotCreateIndex, "index key cannot contain '$'"));
    }
    if let Some(f) = &spec.partial_filter {
        query::filter::Filter::parse(f)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Snapshot.

/// A point-in-time view of one collection: `Send + 'static`, it may live in a cursor.
pub struct Snapshot {
    snap: Arc<dyn EngineSnapshot>,
    coll: Arc<CollState>,
    meta: Arc<MetaRt>,
}

impl Snapshot {
    /// Records in RecordId order after `after` (exclusive), at most `max_docs`.
    pub fn scan(&self, after: Option<RecordId>, max_docs: usize) -> Result<Vec<(RecordId, Document)>> {
        let Some((lower, upper)) = self.bounds_after(after) else { return Ok(Vec::new()) };
        self.scan_records(lower, upper, false, max_docs)
    }

    /// Key bounds of the records after `after` (all of them for None); None when nothing can
    /// follow it.
    fn bounds_after(&self, after: Option<RecordId>) -> Option<(Bound<Vec<u8>>, Bound<Vec<u8>>)> {
        let id = self.coll.id;
        let lower = match after {
            Some(rid) => record_key(id, rid.checked_add(1)?),
            None => record_key(id, 0),
        };
        Some((Bound::Included(lower), prefix_bounds(&id.to_be_bytes()).1))
    }

    /// Records in descending RecordId order before `before` (exclusive), at most `max_docs`
    /// (a `$natural: -1` scan; on the oplog, newest first).
    pub fn scan_reverse(&self, before: Option<RecordId>, max_docs: usize) -> Result<Vec<(RecordId, Document)>> {
        let id = self.coll.id;
        let upper = match before {
            Some(0) => return Ok(Vec::new()),
            Some(rid) => Bound::Excluded(record_key(id, rid)),
            None => prefix_bounds(&id.to_be_bytes()).1,
        };
        self.scan_records(Bound::Included(record_key(id, 0)), upper, true, max_docs)
    }

    /// `scan`, with each record's BSON as stored instead of a decoded `Document` (an oplog
    /// tail sends its entries on as they are; `decode_record` reads one).
    pub fn scan_raw(&self, after: Option<RecordId>, max_docs: usize) -> Result<Vec<(RecordId, Vec<u8>)>> {
        let Some((lower, upper)) = self.bounds_after(after) else { return Ok(Vec::new()) };
        self.scan_with(lower, upper, false, max_docs, Ok)
    }

    fn scan_records(&self, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>, reverse: bool, max_docs: usize) -> Result<Vec<(RecordId, Document)>> {
        self.scan_with(lower, upper, reverse, max_docs, |v| decode_doc(&v))
    }

    fn scan_with<T>(
        &self,
        lower: Bound<Vec<u8>>,
        upper: Bound<Vec<u8>>,
        reverse: bool,
        max_docs: usize,
        decode: impl Fn(Vec<u8>) -> Result<T>,
    ) -> Result<Vec<(RecordId, T)>> {
        let mut out = Vec::new();
        if max_docs == 0 {
            return Ok(out);
        }
        for kv in self.snap.iter(Space::Records, lower, upper, reverse) {
            let (k, v) = kv?;
            let rid = read_u64(k.get(8..).unwrap_or(&[])).ok_or_else(|| corrupt("record key"))?;
            out.push((rid, decode(v)?));
            if out.len() >= max_docs {
                break;
            }
        }
        Ok(out)
    }

    pub fn get(&self, id: RecordId) -> Result<Option<Document>> {
        match self.snap.get(Space::Records, &record_key(self.coll.id, id))? {
            Some(b) => Ok(Some(decode_doc(&b)?)),
            None => Ok(None),
        }
    }

    /// Lookup via the `_id` index.
    pub fn find_by_id(&self, id: &Bson) -> Result<Option<(RecordId, Document)>> {
        let Some(rid) = self.coll.rid_by_id(&self.meta, &*self.snap, id)? else { return Ok(None) };
        match self.get(rid)? {
            Some(d) => Ok(Some((rid, d))),
            None => Err(corrupt(format!("_id index entry points at missing record {rid}"))),
        }
    }

    pub fn count(&self) -> Result<u64> {
        Ok(self.stats()?.count)
    }

    fn stats(&self) -> Result<Stats> {
        match self.snap.get(Space::Catalog, &stats_key(self.coll.id))? {
            Some(b) => Stats::from_bytes(&b),
            None => Ok(Stats::default()),
        }
    }

    /// The ready indexes as of this snapshot, `_id_` first (what the planner chooses from).
    pub fn indexes(&self) -> impl Iterator<Item = &IndexSpec> {
        self.meta.ready_indexes().map(|i| &i.spec)
    }

    /// The key pattern of index `name`, as of this snapshot.
    pub fn index_spec(&self, name: &str) -> Option<IndexSpec> {
        self.meta.index(name).map(|i| i.spec.clone())
    }

    /// Whether index `name` had indexed an expanded array as of this snapshot.
    pub fn index_is_multikey(&self, name: &str) -> Result<bool> {
        let Some(idx) = self.meta.index(name) else { return Ok(false) };
        Ok(self.stats()?.multikey.contains(&idx.id))
    }

    /// Entries of index `name` whose encoded key lies within `bounds`, in key order (or
    /// reverse), starting after position `after` (an `IndexEntry::position`), at most `max`.
    pub fn index_scan(&self, name: &str, bounds: IndexBounds, after: Option<Vec<u8>>, max: usize) -> Result<Vec<IndexEntry>> {
        let idx = self.meta.index(name).ok_or_else(|| Error::new(Code::IndexNotFound, format!("index not found with name [{name}]")))?;
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        let p = &idx.prefix;
        let with_prefix = |b: &[u8]| {
            let mut k = p.to_vec();
            k.extend_from_slice(b);
            k
        };
        let (index_lo, index_hi) = prefix_bounds(p);
        // Engine bounds are loose (entries carry a record id suffix); exact checks below.
        // Stored keys sort by key, as keys are prefix-free.
        let mut lo = match &bounds.lower {
            Bound::Unbounded => index_lo,
            Bound::Included(b) | Bound::Excluded(b) => Bound::Included(with_prefix(b)),
        };
        let mut hi = match &bounds.upper {
            Bound::Unbounded => index_hi.clone(),
            Bound::Included(b) | Bound::Excluded(b) => match engine::prefix_successor(&with_prefix(b)) {
                Some(s) => Bound::Excluded(s),
                None => index_hi.clone(),
            },
        };
        if let Some(a) = &after {
            let pos = with_prefix(a);
            if bounds.reverse {
                hi = Bound::Excluded(pos);
            } else {
                lo = Bound::Excluded(pos);
            }
        }
        for kv in self.snap.iter(Space::Index, lo, hi, bounds.reverse) {
            let (stored, value) = kv?;
            let key = idx.key_of(&stored);
            let (in_lower, in_upper) = (bounds.admits_lower(key), bounds.admits_upper(key));
            if !in_lower || !in_upper {
                // Past the far end of the range: stop; before the near end: skip.
                let past_end = if bounds.reverse { !in_lower } else { !in_upper };
                if past_end {
                    break;
                }
                continue;
            }
            let rid = read_u64(&value).ok_or_else(|| corrupt("index entry"))?;
            out.push(IndexEntry { key: key.to_vec(), position: stored.get(8..).unwrap_or(&[]).to_vec(), record_id: rid, values: entry_values(&value)? });
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }

    fn validate_into(&self, report: &mut ValidateReport) -> Result<()> {
        let id = self.coll.id;
        let (lo, hi) = prefix_bounds(&id.to_be_bytes());
        // Builds in progress are incomplete by design: only ready indexes are checked.
        let indexes: Vec<&Arc<IndexRt>> = self.meta.ready_indexes().collect();
        let mut expected = vec![0u64; indexes.len()];
        for kv in self.snap.iter(Space::Records, lo, hi, false) {
            let (k, v) = kv?;
            report.records += 1;
            let Some(rid) = read_u64(k.get(8..).unwrap_or(&[])) else {
                report.valid = false;
                report.errors.push("record with a malformed key".to_string());
                continue;
            };
            let d = match decode_doc(&v) {
                Ok(d) => d,
                Err(e) => {
                    report.valid = false;
                    report.errors.push(format!("record {rid}: {}", e.message));
                    continue;
                }
            };
            for (i, idx) in indexes.iter().enumerate() {
                let entries = match idx.entries(&d, rid) {
                    Ok((e, _)) => e,
                    Err(e) => {
                        report.valid = false;
                        report.errors.push(format!("record {rid}: index {}: {}", idx.spec.name, e.message));
                        continue;
                    }
                };
                for (stored, _) in entries {
                    expected[i] += 1;
                    match self.snap.get(Space::Index, &stored)? {
                        Some(v) if read_u64(&v) == Some(rid) => {}
                        Some(_) => {
                            report.valid = false;
                            report.errors.push(format!("index {} entry for record {rid} points at another record", idx.spec.name));
                        }
                        None => {
                            report.valid = false;
                            report.errors.push(format!("index {} is missing an entry for record {rid}", idx.spec.name));
                        }
                    }
                }
            }
        }
        for (i, idx) in indexes.iter().enumerate() {
            let (lo, hi) = prefix_bounds(&idx.prefix);
            let mut n = 0u64;
            for kv in self.snap.iter(Space::Index, lo, hi, false) {
                kv?;
                n += 1;
            }
            if n != expected[i] {
                report.valid = false;
                report.errors.push(format!("index {} has {n} entries, expected {}", idx.spec.name, expected[i]));
            }
            report.keys_per_index.push((idx.spec.name.clone(), n));
        }
        let count = self.count()?;
        if count != report.records {
            report.valid = false;
            report.errors.push(format!("collection count is {count}, but {} records exist", report.records));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Writer.

/// Exclusive writer for read-modify-write operations; holds the collection write lock.
/// Each mutation is applied atomically (record and all index entries) immediately.
pub struct Writer {
    guard: WriteGuard,
}

impl Writer {
    fn st(&self) -> &Arc<CollState> {
        &self.guard.coll
    }

    /// Latest state, including this writer's applied mutations.
    pub fn snapshot(&self) -> Snapshot {
        self.st().snapshot()
    }

    pub fn insert(&mut self, doc: &Document) -> Result<RecordId> {
        let st = self.st();
        st.check_live()?;
        let meta = st.meta.read().clone();
        let snap = st.shared.engine.snapshot();
        let mut pending = st.pending();
        let rid = st.prepare_insert(&meta, &*snap, doc, &mut pending)?;
        st.commit_pending(pending)?;
        Ok(rid)
    }

    /// Replace record `id` with `new`, maintaining indexes. `old` must be the stored
    /// document as read through this writer (its snapshot, under its lock), so it is
    /// current: its index entries are the ones removed. Decoding the stored bytes again
    /// would cost as much as the rest of an update.
    pub fn update(&mut self, id: RecordId, old: &Document, new: &Document) -> Result<()> {
        let st = self.st();
        st.check_live()?;
        let meta = st.meta.read().clone();
        let snap = st.shared.engine.snapshot();
        let old_bytes = snap
            .get(Space::Records, &record_key(st.id, id))?
            .ok_or_else(|| Error::new(Code::NoSuchKey, format!("record {id} not found in {}", st.ns_string())))?;
        debug_assert!(decode_doc(&old_bytes).is_ok_and(|d| &d == old), "Writer::update given a stale document");
        let mut pending = st.pending();
        st.prepare_update(&meta, &*snap, id, old_bytes.len(), old, new, &mut pending)?;
        st.commit_pending(pending)
    }

    /// Log a retryable write's history that a chunk migration brought from the donor shard:
    /// for each `(stmtId, donor's entry)`, a no-op entry of this collection in the
    /// transaction this thread runs (`Store::begin_retryable_write`), all in one batch with
    /// the session's record. A retry here then finds those statements executed.
    pub fn log_session_history(&mut self, entries: &[(i32, Vec<u8>)]) -> Result<()> {
        let st = self.st();
        st.check_live()?;
        let mut pending = st.pending();
        let Some(log) = pending.log.as_ref() else { return Err(Error::new(Code::IllegalOperation, "session history is logged on a replica-set member only")) };
        let Some(tag) = log.session.as_ref() else { return Err(Error::internal("session history is logged inside a retryable write")) };
        for (stmt, original) in entries {
            pending.oplog.push(oplog::migrated_session_entry(&log.ns, log.ui, original, log.wall_ms, (tag, *stmt)));
        }
        st.commit_pending(pending)
    }

    /// Delete record `id` and its index entries (computed from the stored document).
    pub fn delete(&mut self, id: RecordId, old: &Document) -> Result<()> {
        let _ = old;
        let st = self.st();
        st.check_live()?;
        let meta = st.meta.read().clone();
        let snap = st.shared.engine.snapshot();
        let mut pending = st.pending();
        st.prepare_delete(&meta, &*snap, id, &mut pending)?;
        st.commit_pending(pending)
    }
}

#[cfg(test)]
mod tests;
