//! The oplog: MongoDB-shaped change entries in `local.oplog.rs`, appended in the same engine
//! batch as the writes they describe, so a crash never keeps a write without its entry or
//! an entry without its write.
//!
//! Entries are encoded by the writer that prepares the change (outside any shared lock),
//! with `ts` and `t` as placeholders at fixed offsets. `Shared::apply_logged` then takes the
//! oplog lock, stamps each entry with the next timestamp and the current term, and writes
//! the batch while still holding it. So timestamps are assigned in the order batches reach
//! the engine, and a reader never sees an entry before an earlier one (no oplog holes).
//! A retryable write's entries also carry its session (`SessionWrite`), and the batch that
//! logs them writes the session's record.
//!
//! An entry's record id is its timestamp as `secs << 32 | inc`, so record order is oplog
//! order and `Snapshot::scan` reads the oplog forward from any point.
//!
//! The store logs only once told to (`Store::enable_oplog`), never the `local` database,
//! and knows nothing of replica-set membership. The oplog is capped: once its entries take
//! more than the cap, the oldest are deleted down to 90% of it, never one written but not
//! yet applied. A secondary writes fetched entries with their own optimes
//! (`Store::write_oplog_replicated`) and applies them after (`Store::apply_written`).
//!
//! The newest entries, up to `OPLOG_RECENT_BYTES_MAX` (16 MiB), are also kept in memory as
//! written (`OplogState::recent`): a tailing reader (`Collection::tail_chunk`) takes them
//! from there, shared rather than copied (`RawRecord::Shared`), without an engine read.
//! Beside them is when each batch was logged (`OplogState::logged_at`), from which
//! `Store::oplog_lag` measures a member's replication lag.

use crate::bsonenc::{append_string, append_value, begin, end};
use bson::spec::BinarySubtype;
use bson::{Bson, Document};

/// A retryable write in progress: its entries carry mongod's session fields
/// (`lsid`, `txnNumber`, `stmtId`, `prevOpTime`), and every batch that logs them also writes
/// the session's `config.transactions` record (see `Store::begin_retryable_write`).
pub(crate) struct SessionWrite {
    pub lsid: Vec<u8>,
    pub txn: i64,
    /// `config.transactions`.
    pub records: std::sync::Arc<crate::CollState>,
    /// The optime of this transaction's newest entry (`prevOpTime` of its next), or
    /// `OpTime::NULL`.
    pub prev: OpTime,
    /// The statement the next entries belong to.
    pub stmt: i32,
    /// The statement of each document of the next `insert_many` (an insert command's
    /// documents are its statements).
    pub stmt_per_document: Option<Vec<i32>>,
    /// Log the document findAndModify returns (the one it changes, as it was or as it
    /// becomes) as a no-op entry before the change's own, so that a retry can return it: an
    /// update's own entry may hold only its diff.
    pub image: Option<RetryImage>,
}

/// Which version of the changed document a retryable write's no-op entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryImage {
    Before,
    After,
}

/// The session fields of an entry: `lsid` bytes and `txnNumber` (the statement is per
/// entry).
pub(crate) struct SessionTag {
    pub lsid: Vec<u8>,
    pub txn: i64,
}

/// `local.oplog.rs`.
pub const OPLOG_DB: &str = "local";
pub const OPLOG_COLLECTION: &str = "oplog.rs";

/// Byte offsets of the placeholders every entry starts with: `{ts: Timestamp, t: Int64, ..}`.
/// 4 (document length) + 1 (type) + 3 ("ts\0") = 8; then 8 bytes of timestamp,
/// 1 (type) + 2 ("t\0") = 19 for the term.
const TS_OFFSET: usize = 8;
const TERM_OFFSET: usize = 19;

pub use common::optime::{ts_of, OpTime};

/// The next timestamp after `last` at wall-clock `now_secs`: a new second starts at
/// increment 1; within a second, or if the clock went back, the increment grows.
pub(crate) fn next_ts(last: u64, now_secs: u32) -> u64 {
    let (secs, inc) = ((last >> 32) as u32, last as u32);
    if now_secs > secs {
        (u64::from(now_secs) << 32) | 1
    } else if inc == u32::MAX {
        (u64::from(secs) + 1) << 32 | 1
    } else {
        (u64::from(secs) << 32) | u64::from(inc + 1)
    }
}

/// Stamp an encoded entry with its optime.
pub(crate) fn stamp(entry: &mut [u8], at: OpTime) {
    // Timestamp is stored as increment then seconds (u64 little-endian of secs << 32 | inc).
    entry[TS_OFFSET..TS_OFFSET + 8].copy_from_slice(&at.ts.to_le_bytes());
    entry[TERM_OFFSET..TERM_OFFSET + 8].copy_from_slice(&at.term.to_le_bytes());
}

/// The common head of every entry, up to and including `ns` (and `ui` when given).
fn head(out: &mut Vec<u8>, op: &str, ns: &str, ui: Option<bson::Uuid>) -> usize {
    let start = begin(out);
    out.push(0x11); // Timestamp
    out.extend_from_slice(b"ts\0");
    out.extend_from_slice(&[0; 8]);
    out.push(0x12); // Int64
    out.extend_from_slice(b"t\0");
    out.extend_from_slice(&[0; 8]);
    debug_assert_eq!(out.len() - start, TERM_OFFSET + 8);
    out.push(0x12);
    out.extend_from_slice(b"v\0");
    out.extend_from_slice(&2i64.to_le_bytes());
    out.push(0x02);
    out.extend_from_slice(b"op\0");
    append_string(op, out);
    out.push(0x02);
    out.extend_from_slice(b"ns\0");
    append_string(ns, out);
    if let Some(ui) = ui {
        out.push(0x05);
        out.extend_from_slice(b"ui\0");
        out.extend_from_slice(&16i32.to_le_bytes());
        out.push(u8::from(BinarySubtype::Uuid));
        out.extend_from_slice(&ui.bytes());
    }
    start
}

fn raw_doc_field(out: &mut Vec<u8>, name: &[u8], raw: &[u8]) {
    out.push(0x03);
    out.extend_from_slice(name);
    out.push(0);
    out.extend_from_slice(raw);
}

/// Byte offsets, from an entry's end, of `prevOpTime`'s `ts` and `t` in an entry that has
/// session fields: `prevOpTime` is followed only by `wall` (1 + 5 + 8 bytes) and the
/// terminating 0; its value is `{ts: Timestamp, t: Int64}` (28 bytes).
const PREV_TS_FROM_END: usize = 15 + 28 - 8;
const PREV_TERM_FROM_END: usize = 15 + 28 - 19;

/// `{id: BinData(4, lsid)}`, a session id as drivers send it.
fn append_lsid(out: &mut Vec<u8>, lsid: &[u8]) {
    let start = begin(out);
    out.push(0x05);
    out.extend_from_slice(b"id\0");
    out.extend_from_slice(&(lsid.len() as i32).to_le_bytes());
    out.push(u8::from(BinarySubtype::Uuid));
    out.extend_from_slice(lsid);
    end(out, start);
}

fn session_fields(out: &mut Vec<u8>, tag: &SessionTag, stmt: i32) {
    out.push(0x03);
    out.extend_from_slice(b"lsid\0");
    append_lsid(out, &tag.lsid);
    out.push(0x12);
    out.extend_from_slice(b"txnNumber\0");
    out.extend_from_slice(&tag.txn.to_le_bytes());
    out.push(0x10);
    out.extend_from_slice(b"stmtId\0");
    out.extend_from_slice(&stmt.to_le_bytes());
    // Stamped with the transaction's previous entry when the batch is applied.
    out.push(0x03);
    out.extend_from_slice(b"prevOpTime\0");
    append_optime(out, OpTime::default());
}

/// `{ts: Timestamp, t: Int64}` (28 bytes).
fn append_optime(out: &mut Vec<u8>, at: OpTime) {
    let start = begin(out);
    out.push(0x11);
    out.extend_from_slice(b"ts\0");
    out.extend_from_slice(&at.ts.to_le_bytes());
    out.push(0x12);
    out.extend_from_slice(b"t\0");
    out.extend_from_slice(&at.term.to_le_bytes());
    end(out, start);
}

/// Stamp an entry that has session fields with the optime of its transaction's previous
/// entry.
pub(crate) fn stamp_prev(entry: &mut [u8], prev: OpTime) {
    let n = entry.len();
    debug_assert_eq!(&entry[n - PREV_TS_FROM_END - 3..n - PREV_TS_FROM_END], b"ts\0", "an entry without session fields");
    entry[n - PREV_TS_FROM_END..n - PREV_TS_FROM_END + 8].copy_from_slice(&prev.ts.to_le_bytes());
    entry[n - PREV_TERM_FROM_END..n - PREV_TERM_FROM_END + 8].copy_from_slice(&prev.term.to_le_bytes());
}

/// A session's `config.transactions` record, as mongod keeps it for retryable writes:
/// `{_id: {id: lsid}, txnNum, lastWriteOpTime: {ts, t}, lastWriteDate}`.
pub(crate) fn session_record(lsid: &[u8], txn: i64, last: OpTime, wall_ms: i64) -> Vec<u8> {
    record(lsid, txn, None, last, wall_ms)
}

/// A session's record with its transaction's `state` (before `lastWriteOpTime`, whose place
/// from the end `stamp_session_record` relies on).
fn record(lsid: &[u8], txn: i64, state: Option<&str>, last: OpTime, wall_ms: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(144);
    let start = begin(&mut out);
    out.push(0x03);
    out.extend_from_slice(b"_id\0");
    append_lsid(&mut out, lsid);
    out.push(0x12);
    out.extend_from_slice(b"txnNum\0");
    out.extend_from_slice(&txn.to_le_bytes());
    if let Some(state) = state {
        out.push(0x02);
        out.extend_from_slice(b"state\0");
        append_string(state, &mut out);
    }
    out.push(0x03);
    out.extend_from_slice(b"lastWriteOpTime\0");
    append_optime(&mut out, last);
    out.push(0x09);
    out.extend_from_slice(b"lastWriteDate\0");
    out.extend_from_slice(&wall_ms.to_le_bytes());
    end(&mut out, start);
    out
}

/// `lastWriteOpTime`'s `ts` and `t`, from the record's end: then come `lastWriteDate`
/// (1 + 14 + 8 bytes) and the terminating 0.
const RECORD_TS_FROM_END: usize = 24 + 28 - 8;
const RECORD_TERM_FROM_END: usize = 24 + 28 - 19;

/// Stamp a `session_record` with the optime of its transaction's newest entry.
pub(crate) fn stamp_session_record(record: &mut [u8], last: OpTime) {
    let n = record.len();
    debug_assert_eq!(&record[n - RECORD_TS_FROM_END - 3..n - RECORD_TS_FROM_END], b"ts\0", "not a session record");
    record[n - RECORD_TS_FROM_END..n - RECORD_TS_FROM_END + 8].copy_from_slice(&last.ts.to_le_bytes());
    record[n - RECORD_TERM_FROM_END..n - RECORD_TERM_FROM_END + 8].copy_from_slice(&last.term.to_le_bytes());
}

fn finish(mut out: Vec<u8>, start: usize, wall_ms: i64, session: Option<(&SessionTag, i32)>) -> Vec<u8> {
    if let Some((tag, stmt)) = session {
        session_fields(&mut out, tag, stmt);
    }
    out.push(0x09); // UTC datetime
    out.extend_from_slice(b"wall\0");
    out.extend_from_slice(&wall_ms.to_le_bytes());
    end(&mut out, start);
    out
}

/// `{_id: id}` as raw BSON (the `o2` of updates and the `o` of deletes).
pub(crate) fn id_doc(id: &Bson) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(32);
    let start = begin(&mut out);
    out.push(id.element_type() as u8);
    out.extend_from_slice(b"_id\0");
    append_value(id, &mut out)?;
    end(&mut out, start);
    Ok(out)
}

pub(crate) fn wall_now_ms() -> i64 {
    bson::DateTime::now().timestamp_millis()
}

/// Room for the session fields of a retryable write's entries.
const SESSION_FIELDS_BYTES: usize = 128;

/// An insert: `o` is the stored document.
pub(crate) fn insert_entry(ns: &str, ui: bson::Uuid, record: &[u8], wall_ms: i64, session: Option<(&SessionTag, i32)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(record.len() + ns.len() + 96 + SESSION_FIELDS_BYTES);
    let start = head(&mut out, "i", ns, Some(ui));
    raw_doc_field(&mut out, b"o", record);
    finish(out, start, wall_ms, session)
}

/// An update: `o` is the whole new document (a replacement) or `{$v: 2, diff}` (`diff`'s
/// delta, as mongod 5.0+ logs an update by operators or pipeline); `o2` is `{_id}`.
pub(crate) fn update_entry(ns: &str, ui: bson::Uuid, change: &UpdateChange, id: &[u8], wall_ms: i64, session: Option<(&SessionTag, i32)>) -> Vec<u8> {
    let o_len = match change {
        UpdateChange::Document(record) => record.len(),
        UpdateChange::Diff(diff) => diff.len() + 24,
    };
    let mut out = Vec::with_capacity(o_len + id.len() + ns.len() + 100 + SESSION_FIELDS_BYTES);
    let start = head(&mut out, "u", ns, Some(ui));
    match change {
        UpdateChange::Document(record) => raw_doc_field(&mut out, b"o", record),
        UpdateChange::Diff(diff) => {
            out.push(0x03);
            out.extend_from_slice(b"o\0");
            let o = begin(&mut out);
            out.push(0x10);
            out.extend_from_slice(b"$v\0");
            out.extend_from_slice(&2i32.to_le_bytes());
            raw_doc_field(&mut out, b"diff", diff);
            end(&mut out, o);
        }
    }
    raw_doc_field(&mut out, b"o2", id);
    finish(out, start, wall_ms, session)
}

/// What an update entry carries (`update_entry`): the new document, or the diff (encoded).
pub(crate) enum UpdateChange<'a> {
    Document(&'a [u8]),
    Diff(&'a [u8]),
}

pub(crate) fn delete_entry(ns: &str, ui: bson::Uuid, id: &[u8], wall_ms: i64, session: Option<(&SessionTag, i32)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.len() + ns.len() + 96 + SESSION_FIELDS_BYTES);
    let start = head(&mut out, "d", ns, Some(ui));
    raw_doc_field(&mut out, b"o", id);
    finish(out, start, wall_ms, session)
}

/// The document a retryable findAndModify returns, as it was or as it became (a no-op on
/// `ns` whose `o` is the document, as mongod logged pre- and post-images before it kept
/// them in `config.image_collection`), so that a retry can return it.
pub(crate) fn image_entry(ns: &str, ui: bson::Uuid, record: &[u8], wall_ms: i64, session: (&SessionTag, i32)) -> Vec<u8> {
    let mut out = Vec::with_capacity(record.len() + ns.len() + 96 + SESSION_FIELDS_BYTES);
    let start = head(&mut out, "n", ns, Some(ui));
    raw_doc_field(&mut out, b"o", record);
    finish(out, start, wall_ms, Some(session))
}

/// The document an update or delete of a collection with `changeStreamPreAndPostImages`
/// changes, as it was: a no-op on `ns` whose `o` is the document and whose `o2` marks it
/// (`PRE_IMAGE_O2`), logged immediately before the change's own entry (or operation, in a
/// transaction), so that a change stream's `fullDocumentBeforeChange`, and the post-image
/// it derives from it and the change, outlive the document. Every member logs it in the
/// change's atomic batch, and the oplog keeps it about as long as the change (a truncation
/// may fall between the two).
pub(crate) fn pre_image_entry(ns: &str, ui: bson::Uuid, record: &[u8], wall_ms: i64, session: Option<(&SessionTag, i32)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(record.len() + ns.len() + 120 + SESSION_FIELDS_BYTES);
    let start = head(&mut out, "n", ns, Some(ui));
    raw_doc_field(&mut out, b"o", record);
    raw_doc_field(&mut out, b"o2", &PRE_IMAGE_O2);
    finish(out, start, wall_ms, session)
}

/// `{preImage: true}`, the `o2` of a pre-image's no-op.
const PRE_IMAGE_O2: [u8; 16] = *b"\x10\0\0\0\x08preImage\0\x01\0";

/// Whether `entry` (or a transaction's operation) is a pre-image's no-op (`pre_image_entry`).
pub fn is_pre_image(entry: &Document) -> bool {
    entry.get_str("op").ok() == Some("n") && entry.get_document("o2").is_ok_and(|o2| o2.get_bool("preImage").ok() == Some(true))
}

/// A retryable write's entry that a chunk migration brought from the donor shard, logged
/// by the recipient in the session's transaction (mongod's `$sessionMigrateInfo` no-op):
/// `o2` is the donor's entry, whose statement and change a retry on this shard finds.
pub(crate) fn migrated_session_entry(ns: &str, ui: bson::Uuid, original: &[u8], wall_ms: i64, session: (&SessionTag, i32)) -> Vec<u8> {
    let mut out = Vec::with_capacity(original.len() + ns.len() + 140 + SESSION_FIELDS_BYTES);
    let start = head(&mut out, "n", ns, Some(ui));
    raw_doc_field(&mut out, b"o", &MIGRATED_O);
    raw_doc_field(&mut out, b"o2", original);
    out.push(0x08);
    out.extend_from_slice(b"fromMigrate\0");
    out.push(1);
    finish(out, start, wall_ms, Some(session))
}

/// `{$sessionMigrateInfo: 1}`, the `o` of a migrated session entry.
pub const SESSION_MIGRATE_INFO: &str = "$sessionMigrateInfo";
const MIGRATED_O: [u8; 30] = *b"\x1e\0\0\0\x10$sessionMigrateInfo\0\x01\0\0\0\0";

/// A command on database `db` (`ns` is `db.$cmd`), such as `{create: "c"}` or `{drop: "c"}`.
pub(crate) fn command_entry(db: &str, ui: Option<bson::Uuid>, o: &Document, wall_ms: i64) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(128);
    let start = head(&mut out, "c", &format!("{db}.$cmd"), ui);
    out.push(0x03);
    out.extend_from_slice(b"o\0");
    append_value(&Bson::Document(o.clone()), &mut out)?;
    Ok(finish(out, start, wall_ms, None))
}

/// A logged entry as one operation of a transaction's `applyOps`: its `op`, `ns`, `ui`, `o`
/// and `o2`, without the fields the transaction's own entry carries (`ts`, `t`, `wall`...).
pub(crate) fn inner_op(entry: &[u8]) -> Result<Vec<u8>, String> {
    let raw = bson::RawDocument::from_bytes(entry).map_err(|e| e.to_string())?;
    // The fields' bytes as they are: no decoding of the document into values.
    let mut op = bson::RawDocumentBuf::new();
    for field in [bson::raw::cstr!("op"), bson::raw::cstr!("ns"), bson::raw::cstr!("ui"), bson::raw::cstr!("o"), bson::raw::cstr!("o2")] {
        if let Some(v) = raw.get(field.as_str()).map_err(|e| e.to_string())? {
            op.append(field, v);
        }
    }
    Ok(op.into_bytes())
}

/// Where a transaction's entry stands in its chain: alone, one of several before the last
/// (`partialTxn: true`), or the last of several (`count`: the transaction's operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChainPart {
    Whole,
    Partial,
    Last { count: usize },
}

/// A committed transaction's entry, as mongod logs one that was not prepared:
/// `{op: "c", ns: "admin.$cmd", o: {applyOps: [ops]}, lsid, txnNumber, prevOpTime}`, with
/// `prevOpTime` stamped when the batch is applied (`stamp_prev`). A transaction whose
/// operations do not fit one entry logs a chain (`ChainPart`), linked by `prevOpTime`.
/// A prepared transaction's last entry (`prepare`) carries `prepare: true` as mongod's
/// does; its operations apply only with the decision's entry (`decision_entry`).
pub(crate) fn transaction_entry(ops: &[Vec<u8>], part: ChainPart, prepare: bool, tag: &SessionTag, wall_ms: i64) -> Vec<u8> {
    let bytes: usize = ops.iter().map(|o| o.len() + 8).sum();
    let mut out = Vec::with_capacity(bytes + 256);
    let start = head(&mut out, "c", "admin.$cmd", None);
    out.push(0x03);
    out.extend_from_slice(b"o\0");
    let o = begin(&mut out);
    out.push(0x04);
    out.extend_from_slice(b"applyOps\0");
    let array = begin(&mut out);
    for (i, op) in ops.iter().enumerate() {
        out.push(0x03);
        out.extend_from_slice(i.to_string().as_bytes());
        out.push(0);
        out.extend_from_slice(op);
    }
    end(&mut out, array);
    match part {
        ChainPart::Whole => {}
        ChainPart::Partial => {
            out.push(0x08);
            out.extend_from_slice(b"partialTxn\0");
            out.push(1);
        }
        ChainPart::Last { count } => {
            out.push(0x12);
            out.extend_from_slice(b"count\0");
            out.extend_from_slice(&(count as i64).to_le_bytes());
        }
    }
    if prepare {
        out.push(0x08);
        out.extend_from_slice(b"prepare\0");
        out.push(1);
    }
    end(&mut out, o);
    transaction_session_fields(out, start, tag, wall_ms)
}

/// The session fields of a transaction's entry (`prevOpTime` stamped when it is logged),
/// `wall`, and the end of the entry begun at `start`.
fn transaction_session_fields(mut out: Vec<u8>, start: usize, tag: &SessionTag, wall_ms: i64) -> Vec<u8> {
    out.push(0x03);
    out.extend_from_slice(b"lsid\0");
    append_lsid(&mut out, &tag.lsid);
    out.push(0x12);
    out.extend_from_slice(b"txnNumber\0");
    out.extend_from_slice(&tag.txn.to_le_bytes());
    out.push(0x03);
    out.extend_from_slice(b"prevOpTime\0");
    append_optime(&mut out, OpTime::default());
    finish(out, start, wall_ms, None)
}

/// The decision on a prepared transaction, as mongod logs it:
/// `{op: "c", ns: "admin.$cmd", o: {commitTransaction: 1, commitTimestamp}}` or
/// `o: {abortTransaction: 1}`, with the session fields, `prevOpTime` the prepare entry.
pub(crate) fn decision_entry(commit_ts: Option<u64>, tag: &SessionTag, wall_ms: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let start = head(&mut out, "c", "admin.$cmd", None);
    let o = match commit_ts {
        Some(ts) => bson::doc! {"commitTransaction": 1, "commitTimestamp": bson::Timestamp { time: (ts >> 32) as u32, increment: ts as u32 }},
        None => bson::doc! {"abortTransaction": 1},
    };
    out.push(0x03);
    out.extend_from_slice(b"o\0");
    append_value(&Bson::Document(o), &mut out).expect("a decision encodes");
    transaction_session_fields(out, start, tag, wall_ms)
}

/// The `state` of a transaction's `config.transactions` record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnRecordState {
    Prepared,
    Committed,
    Aborted,
}

impl TxnRecordState {
    pub fn as_str(self) -> &'static str {
        match self {
            TxnRecordState::Prepared => "prepared",
            TxnRecordState::Committed => "committed",
            TxnRecordState::Aborted => "aborted",
        }
    }
}

/// A session's `config.transactions` record once its transaction `txn` reached `state`:
/// `session_record`'s fields with `state`.
pub(crate) fn transaction_record(lsid: &[u8], txn: i64, state: TxnRecordState, last: OpTime, wall_ms: i64) -> Vec<u8> {
    record(lsid, txn, Some(state.as_str()), last, wall_ms)
}

/// A catalog command as one operation of a transaction's `applyOps`:
/// `{op: "c", ns: "db.$cmd", ui, o}`.
pub(crate) fn command_op(db: &str, ui: Option<bson::Uuid>, o: &Document) -> Result<Vec<u8>, String> {
    let mut op = bson::doc! {"op": "c", "ns": format!("{db}.$cmd")};
    if let Some(ui) = ui {
        op.insert("ui", ui);
    }
    op.insert("o", o.clone());
    op.to_vec().map_err(|e| e.to_string())
}

/// A no-op (`op: "n"`, `ns: ""`) carrying a message, as replSetInitiate and new terms log.
pub(crate) fn noop_entry(o: &Document, wall_ms: i64) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(96);
    let start = head(&mut out, "n", "", None);
    out.push(0x03);
    out.extend_from_slice(b"o\0");
    append_value(&Bson::Document(o.clone()), &mut out)?;
    Ok(finish(out, start, wall_ms, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::Timestamp;

    #[test]
    fn a_pre_image_entry_is_a_marked_no_op_holding_the_document() {
        assert_eq!(bson::doc! {"preImage": true}.to_vec().unwrap(), PRE_IMAGE_O2);
        let ui = bson::Uuid::new();
        let record = bson::doc! {"_id": 7, "x": "old"}.to_vec().unwrap();
        let d = Document::from_reader(&mut pre_image_entry("db.c", ui, &record, 5, None).as_slice()).unwrap();
        assert!(is_pre_image(&d));
        assert_eq!(d.get_document("o").unwrap(), &bson::doc! {"_id": 7, "x": "old"});
        assert_eq!(d.get_str("ns").unwrap(), "db.c");
        let image = Document::from_reader(&mut image_entry("db.c", ui, &record, 5, (&SessionTag { lsid: vec![1; 16], txn: 1 }, 0)).as_slice()).unwrap();
        assert!(!is_pre_image(&image));
    }

    #[test]
    fn timestamps_increase_whatever_the_clock() {
        let t0 = (100u64 << 32) | 7;
        assert_eq!(next_ts(t0, 101), (101 << 32) | 1);
        assert_eq!(next_ts(t0, 100), (100 << 32) | 8);
        assert_eq!(next_ts(t0, 50), (100 << 32) | 8, "a clock that went back never moves ts back");
        assert_eq!(next_ts((100 << 32) | u64::from(u32::MAX), 100), (101 << 32) | 1);
        assert!(next_ts(0, 0) > 0);
    }

    #[test]
    fn entries_are_mongodb_shaped_and_stamped_in_place() {
        let ui = bson::Uuid::new();
        let record = crate::bsonenc::encode_document(&bson::doc! {"_id": 5, "a": "x"}, 0).unwrap();
        let id = id_doc(&Bson::Int32(5)).unwrap();
        let diff = crate::bsonenc::encode_document(&bson::doc! {"u": {"a": "x"}}, 0).unwrap();
        let at = OpTime { ts: (1_700_000_000u64 << 32) | 3, term: 4 };
        for (mut e, op) in [
            (insert_entry("db.c", ui, &record, 1234, None), "i"),
            (update_entry("db.c", ui, &UpdateChange::Document(&record), &id, 1234, None), "u"),
            (update_entry("db.c", ui, &UpdateChange::Diff(&diff), &id, 1234, None), "u2"),
            (delete_entry("db.c", ui, &id, 1234, None), "d"),
        ] {
            stamp(&mut e, at);
            let d = Document::from_reader(&mut e.as_slice()).unwrap();
            assert_eq!(d.get_timestamp("ts").unwrap(), Timestamp { time: 1_700_000_000, increment: 3 });
            assert_eq!(d.get_i64("t").unwrap(), 4);
            assert_eq!(d.get_i64("v").unwrap(), 2);
            assert_eq!(d.get_str("op").unwrap(), &op[..1]);
            assert_eq!(d.get_str("ns").unwrap(), "db.c");
            assert_eq!(d.get("ui"), Some(&Bson::Binary(bson::Binary::from_uuid(ui))));
            assert_eq!(d.get_datetime("wall").unwrap().timestamp_millis(), 1234);
            match op {
                "i" => assert_eq!(d.get_document("o").unwrap(), &bson::doc! {"_id": 5, "a": "x"}),
                "u" => {
                    assert_eq!(d.get_document("o").unwrap(), &bson::doc! {"_id": 5, "a": "x"});
                    assert_eq!(d.get_document("o2").unwrap(), &bson::doc! {"_id": 5});
                }
                "u2" => {
                    assert_eq!(d.get_document("o").unwrap(), &bson::doc! {"$v": 2, "diff": {"u": {"a": "x"}}});
                    assert_eq!(d.get_document("o2").unwrap(), &bson::doc! {"_id": 5});
                }
                _ => assert_eq!(d.get_document("o").unwrap(), &bson::doc! {"_id": 5}),
            }
        }
        let mut c = command_entry("db", Some(ui), &bson::doc! {"create": "c"}, 1).unwrap();
        stamp(&mut c, at);
        let d = Document::from_reader(&mut c.as_slice()).unwrap();
        assert_eq!(d.get_str("ns").unwrap(), "db.$cmd");
        assert_eq!(d.get_document("o").unwrap(), &bson::doc! {"create": "c"});
        let n = noop_entry(&bson::doc! {"msg": "initiating set"}, 1).unwrap();
        let d = Document::from_reader(&mut n.as_slice()).unwrap();
        assert_eq!((d.get_str("op").unwrap(), d.get_str("ns").unwrap()), ("n", ""));
        assert!(d.get("ui").is_none());
    }

    #[test]
    fn a_migrated_session_entry_wraps_the_donors_entry_and_chains_like_any_other() {
        let ui = bson::Uuid::new();
        let original = bson::RawDocumentBuf::try_from(&bson::doc! {"op": "i", "ns": "db.c", "o": {"_id": 1}, "stmtId": 3}).unwrap().into_bytes();
        let tag = SessionTag { lsid: vec![7; 16], txn: 9 };
        let mut e = migrated_session_entry("db.c", ui, &original, 55, (&tag, 3));
        let prev = OpTime { ts: (1_700_000_000u64 << 32) | 1, term: 2 };
        stamp_prev(&mut e, prev);
        let d = Document::from_reader(&mut e.as_slice()).unwrap();
        assert_eq!(d.get_str("op").unwrap(), "n");
        assert_eq!(d.get_document("o").unwrap(), &bson::doc! {SESSION_MIGRATE_INFO: 1});
        assert_eq!(d.get_document("o2").unwrap().get_str("op").unwrap(), "i");
        assert!(d.get_bool("fromMigrate").unwrap());
        assert_eq!((d.get_i64("txnNumber").unwrap(), d.get_i32("stmtId").unwrap()), (9, 3));
        assert_eq!(OpTime::from_doc(d.get_document("prevOpTime").unwrap()), Some(prev));
    }
}
