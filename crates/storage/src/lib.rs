//! shoal's storage layer. (Skeleton: the real implementation lands in small steps.)

use bson::{Bson, Document};
use common::{Code, Error, Result};
use std::ops::Bound;
use std::sync::Arc;

pub type RecordId = u64;

#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub cache_size_bytes: u64,
    pub fsync: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { cache_size_bytes: 256 * 1024 * 1024, fsync: true }
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

#[derive(Clone, Debug)]
pub struct IndexSpec {
    pub name: String,
    pub key: Document,
    pub unique: bool,
    pub sparse: bool,
    pub partial_filter: Option<Document>,
    pub expire_after_seconds: Option<i64>,
    pub spec: Document,
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

pub struct InsertOutcome {
    pub inserted: usize,
    pub errors: Vec<(usize, Error)>,
}

/// Range over encoded index keys (see `encode_index_key`).
#[derive(Clone, Debug)]
pub struct IndexBounds {
    pub lower: Bound<Vec<u8>>,
    pub upper: Bound<Vec<u8>>,
    pub reverse: bool,
}

impl IndexBounds {
    pub fn all() -> IndexBounds {
        IndexBounds { lower: Bound::Unbounded, upper: Bound::Unbounded, reverse: false }
    }
}

#[derive(Clone, Debug)]
pub struct IndexEntry {
    pub key: Vec<u8>,
    pub position: Vec<u8>,
    pub record_id: RecordId,
    pub values: Vec<Bson>,
}

pub fn encode_index_key(_key_pattern: &Document, _values: &[Bson]) -> Vec<u8> {
    Vec::new()
}

fn not_yet() -> Error {
    Error::new(Code::NotImplemented, "storage not implemented yet")
}

#[derive(Clone)]
pub struct Store {
    _inner: Arc<()>,
}

impl Store {
    pub fn open(_path: &std::path::Path, _opts: StoreOptions) -> Result<Store> {
        Err(not_yet())
    }
    pub fn open_in_memory() -> Store {
        Store { _inner: Arc::new(()) }
    }
    pub fn database_names(&self) -> Vec<String> {
        Vec::new()
    }
    pub fn list_collections(&self, _db: &str) -> Vec<CollectionMeta> {
        Vec::new()
    }
    pub fn collection(&self, _db: &str, _name: &str) -> Option<Collection> {
        None
    }
    pub fn create_collection(&self, _db: &str, _name: &str, _options: Document) -> Result<Collection> {
        Err(not_yet())
    }
    pub fn collection_or_create(&self, _db: &str, _name: &str) -> Result<Collection> {
        Err(not_yet())
    }
    pub fn drop_collection(&self, _db: &str, _name: &str) -> Result<bool> {
        Err(not_yet())
    }
    pub fn drop_database(&self, _db: &str) -> Result<()> {
        Err(not_yet())
    }
    pub fn rename_collection(&self, _from_db: &str, _from: &str, _to_db: &str, _to: &str, _drop_target: bool) -> Result<()> {
        Err(not_yet())
    }
    pub fn commit_durable(&self) -> Result<()> {
        Ok(())
    }
    pub fn database_stats(&self, _db: &str) -> DbStats {
        DbStats::default()
    }
    pub fn storage_size_bytes(&self) -> u64 {
        0
    }
}

#[derive(Clone)]
pub struct Collection {
    _inner: Arc<()>,
}

impl Collection {
    pub fn meta(&self) -> CollectionMeta {
        CollectionMeta { db: String::new(), name: String::new(), uuid: bson::Uuid::new(), options: Document::new(), indexes: Vec::new() }
    }
    pub fn insert_many(&self, docs: &[Document], _ordered: bool) -> InsertOutcome {
        InsertOutcome { inserted: 0, errors: (0..docs.len()).map(|i| (i, not_yet())).collect() }
    }
    pub fn snapshot(&self) -> Snapshot {
        Snapshot { _inner: Arc::new(()) }
    }
    pub fn writer(&self) -> Writer {
        Writer { _inner: Arc::new(()) }
    }
    pub fn create_index(&self, _spec: IndexSpec) -> Result<bool> {
        Err(not_yet())
    }
    pub fn drop_index(&self, _name: &str) -> Result<()> {
        Err(not_yet())
    }
    pub fn stats(&self) -> CollStats {
        CollStats::default()
    }
    pub fn validate(&self) -> ValidateReport {
        ValidateReport::default()
    }
}

pub struct Snapshot {
    _inner: Arc<()>,
}

impl Snapshot {
    pub fn scan(&self, _after: Option<RecordId>, _max_docs: usize) -> Result<Vec<(RecordId, Document)>> {
        Err(not_yet())
    }
    pub fn get(&self, _id: RecordId) -> Result<Option<Document>> {
        Err(not_yet())
    }
    pub fn find_by_id(&self, _id: &Bson) -> Result<Option<(RecordId, Document)>> {
        Err(not_yet())
    }
    pub fn count(&self) -> Result<u64> {
        Err(not_yet())
    }
    pub fn index_scan(&self, _name: &str, _bounds: IndexBounds, _after: Option<Vec<u8>>, _max: usize) -> Result<Vec<IndexEntry>> {
        Err(not_yet())
    }
}

pub struct Writer {
    _inner: Arc<()>,
}

impl Writer {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot { _inner: Arc::new(()) }
    }
    pub fn insert(&mut self, _doc: &Document) -> Result<RecordId> {
        Err(not_yet())
    }
    pub fn update(&mut self, _id: RecordId, _old: &Document, _new: &Document) -> Result<()> {
        Err(not_yet())
    }
    pub fn delete(&mut self, _id: RecordId, _old: &Document) -> Result<()> {
        Err(not_yet())
    }
}
