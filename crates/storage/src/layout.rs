//! The key layout (see the crate's docs) and the record codec: catalog, stats, garbage and
//! record keys, optimes as stored, and documents as records.

use super::*;

pub(crate) const CATALOG_META: u8 = b'm';
pub(crate) const CATALOG_STATS: u8 = b's';
pub(crate) const CATALOG_GARBAGE: u8 = b'g';
pub(crate) const CATALOG_APPLIED_THROUGH: u8 = b'a';
pub(crate) const GARBAGE_COLLECTION: u8 = b'c';
pub(crate) const GARBAGE_INDEX: u8 = b'i';

pub(crate) fn meta_key(db: &str, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + db.len() + name.len());
    k.push(CATALOG_META);
    k.extend_from_slice(db.as_bytes());
    k.push(0);
    k.extend_from_slice(name.as_bytes());
    k
}

/// How a secondary's oplog batch moves the applied-through point (`OplogState::applied_through`).
pub(crate) enum Marker {
    /// Unchanged: the entries' changes are applied already (or nothing is written).
    Keep,
    /// The entries are written ahead of their application.
    Written,
    /// Every written entry up to this one is applied.
    Applied(OpTime),
}

pub(crate) fn encode_optime(at: OpTime) -> Vec<u8> {
    let mut v = at.ts.to_be_bytes().to_vec();
    v.extend_from_slice(&at.term.to_be_bytes());
    v
}

pub(crate) fn decode_optime(v: &[u8]) -> Option<OpTime> {
    let ts = u64::from_be_bytes(v.get(..8)?.try_into().ok()?);
    let term = i64::from_be_bytes(v.get(8..16)?.try_into().ok()?);
    Some(OpTime { ts, term })
}

pub(crate) fn stats_key(coll_id: u64) -> Vec<u8> {
    let mut k = vec![CATALOG_STATS];
    k.extend_from_slice(&coll_id.to_be_bytes());
    k
}

pub(crate) fn garbage_key(kind: u8, id: u64) -> Vec<u8> {
    let mut k = vec![CATALOG_GARBAGE, kind];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn record_key(coll_id: u64, rid: RecordId) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&coll_id.to_be_bytes());
    k.extend_from_slice(&rid.to_be_bytes());
    k
}

pub(crate) fn read_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

pub(crate) fn corrupt(what: impl std::fmt::Display) -> Error {
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

pub(crate) fn decode_doc(bytes: &[u8]) -> Result<Document> {
    let raw = bson::RawDocument::from_bytes(bytes).map_err(|e| corrupt(format!("invalid BSON record: {e}")))?;
    Document::try_from(raw).map_err(|e| corrupt(format!("invalid BSON record: {e}")))
}

pub(crate) fn encode_doc(d: &Document) -> Result<Vec<u8>> {
    d.to_vec().map_err(|e| Error::bad_value(format!("cannot serialize document: {e}")))
}

/// A record's BSON, into a buffer of `capacity_bytes` (a guess of its size, saving regrowth).
pub(crate) fn encode_record(d: &Document, capacity_bytes: usize) -> Result<Vec<u8>> {
    bsonenc::encode_document(d, capacity_bytes).map_err(|e| Error::bad_value(format!("cannot serialize document: {e}")))
}
