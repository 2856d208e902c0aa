//! shoal's storage layer: a narrow ordered key-value [`engine::Engine`] (fjall on disk, an
//! in-memory MVCC map for simulation) and, engine-agnostic above it, the catalog, the record
//! store, index key encoding ([`keys`]) and index maintenance, snapshots and group commit.
//!
//! Files, one concept each: `store` (open, the catalog, durability), `shared` (the engine,
//! group commit, id allocation, dropped data), `coll_state` (a collection's write path),
//! `collection` and `index_build` (the public handle, and index builds), `snapshot` (reads),
//! `writer` (read-modify-write), `replicated` (the oplog's points and replicated
//! application), `oplog` (entries and their encoding), `write_ctx` (how a handle's writes are logged), `session` (retryable writes), `txn` (multi-document transactions), `ttl`,
//! `names`, `layout` (keys and records), `keys` and `keygen` (index keys), `hash`.
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
mod coll_state;
mod collection;
pub mod diff;
pub mod engine;
mod hash;
mod history;
mod index_build;
mod keygen;
pub mod keys;
mod layout;
mod names;
mod oplog;
mod prepared;
mod replicated;
mod session;
mod shared;
mod snapshot;
mod store;
mod ttl;
mod txn;
mod write_ctx;
mod writer;

use coll_state::*;
pub use collection::*;
pub use engine::{Batch, BatchOp, Engine, EngineSnapshot, Space};
use history::History;
pub use history::{SNAPSHOT_BOUNDARIES_MAX, SNAPSHOT_HISTORY_WINDOW_SECONDS_DEFAULT};
pub use layout::*;
use names::*;
pub use oplog::{is_pre_image, ts_of, OpTime, RetryImage, TxnRecordState, OPLOG_COLLECTION, OPLOG_DB, SESSION_MIGRATE_INFO};
pub use prepared::{PREPARED_COMMITS_KEPT_MAX, PREPARE_CONFLICT_WAIT_MAX};
pub use replicated::*;
pub use session::*;
use shared::*;
pub use snapshot::*;
pub use store::*;
use ttl::*;
pub use txn::*;
pub use write_ctx::*;
pub use writer::*;

/// The storage memory budget when none is configured (the bound: at most 1 GiB).
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
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub type RecordId = u64;

/// Name of the index every collection has on `_id`.
pub const ID_INDEX_NAME: &str = "_id_";
/// The collection option that makes its updates and deletes log the documents they change
/// (`oplog::pre_image_entry`): `{enabled: true}`.
pub const PRE_AND_POST_IMAGES_OPTION: &str = "changeStreamPreAndPostImages";
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

#[cfg(test)]
mod tests;
