//! Server-side cursors: what find/aggregate/listCollections leave open for getMore.
//!
//! A cursor owns its storage snapshot, so every batch of one cursor reads the same
//! point-in-time state (snapshot semantics documented in ARCHITECTURE.md). Limits: at most
//! `CURSORS_OPEN_MAX` cursors; idle ones die after `cursorTimeoutMillis`; a batch holds at most
//! `BATCH_SIZE_BYTES_MAX` of documents.
//!
//! The exception is a tailable cursor on a capped collection (the oplog): it follows the
//! collection, so each batch reads a new snapshot from just after the last record it saw.

use crate::exec::{approx_doc_size, Scan};
use crate::ops::OpCtx;
use bson::{Bson, Document};
use common::{Code, Error, Result};
use parking_lot::Mutex;
use query::projection::Projection;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

pub const CURSORS_OPEN_MAX: usize = 100_000;
/// A reply batch stops growing past this many bytes (MongoDB: 16 MiB per batch).
pub const BATCH_SIZE_BYTES_MAX: usize = 16 * 1024 * 1024 - 64 * 1024;
/// find's first batch default (MongoDB: 101 documents).
pub const FIRST_BATCH_DOCS_DEFAULT: usize = 101;

pub enum Source {
    /// Results computed up front (sorted finds, aggregation, listings).
    Buffered(VecDeque<Document>),
    /// A streaming scan that resumes where the previous batch ended.
    /// `held`: a result read for the previous batch that did not fit in it.
    Find {
        scan: Box<Scan>,
        projection: Option<Projection>,
        /// returnKey and showRecordId.
        key_output: Option<Box<crate::exec::KeyOutput>>,
        skip: u64,
        limit: Option<u64>,
        returned: u64,
        held: Option<Document>,
    },
    /// A tailable cursor: never exhausted by reaching the end of the data.
    Tail(Box<Tail>),
    /// A change stream's events (`change_stream`), read by its own getMore.
    ChangeStream(Box<crate::change_stream::ChangeStream>),
}

pub struct Tail {
    pub coll: storage::Collection,
    pub filter: query::filter::Filter,
    pub projection: Option<Projection>,
    /// The last record examined; the next batch starts after it.
    pub last: Option<storage::RecordId>,
    /// Where the first batch starts (after this record id, which need not exist): an oplog
    /// read from a timestamp on starts there instead of scanning from the oldest entry.
    pub start_after: Option<storage::RecordId>,
    /// getMore waits for new data when it has none (awaitData).
    pub await_data: bool,
    /// `filter` holds for every record after `start_after` and there is no projection (an
    /// oplog fetcher's `{ts: {$gte: T}}`): batches are the records' BSON as stored, sent
    /// without decoding and encoding each entry again.
    pub raw: bool,
    pub limit: Option<u64>,
    pub returned: u64,
    /// `Collection::removals` when the last batch was read: while it stays, no record was
    /// deleted, so the one the cursor stands on still exists.
    pub removals_seen: u64,
    /// `Collection::truncations` when the cursor was opened: a rollback since has cut the
    /// oplog this cursor reads, and it ends (a fetcher downstream opens a new one, whose
    /// first entry it checks against its own newest).
    pub truncations_seen: u64,
}

/// Records a tailable batch reads per snapshot scan.
const TAIL_CHUNK_DOCS: usize = 256;

impl Tail {
    /// The next batch after `last`, read from a fresh snapshot; `done` when the collection
    /// is gone or the limit is reached. CappedPositionLost when the record the cursor stood on
    /// was truncated away (the reader fell behind the cap); QueryPlanKilled when a rollback
    /// cut the oplog since the cursor opened (`check_not_rolled_back`).
    fn next_batch(&mut self, docs_max: usize, op: &OpCtx) -> Result<(Batch, bool)> {
        self.check_not_rolled_back()?;
        let batch = self.read_batch(docs_max, op)?;
        // A rollback during the read may have mixed the new branch into this batch.
        self.check_not_rolled_back()?;
        Ok(batch)
    }

    /// QueryPlanKilled once a rollback truncated the collection (the oplog) after the cursor
    /// was opened. Without this a fetcher tailing a member that rolled back went on after
    /// its position's timestamp, which the new branch can reuse (two primaries in one
    /// second), and took the new branch's entries after the old branch's: an oplog no
    /// primary ever had, that no later check would find (the simulation found it, seed 37).
    fn check_not_rolled_back(&self) -> Result<()> {
        if self.coll.truncations() != self.truncations_seen {
            return Err(Error::new(Code::QueryPlanKilled, "the oplog was rolled back after this cursor was opened"));
        }
        Ok(())
    }

    fn read_batch(&mut self, docs_max: usize, op: &OpCtx) -> Result<(Batch, bool)> {
        if self.raw {
            let mut out = Vec::new();
            // Passed on as they are: the reply's encoder checks each one's framing.
            let done = self.fill(docs_max, op, &mut out, |_, _, record| {
                let len = record.as_ref().len();
                Ok(Some((record, len)))
            })?;
            return Ok((Batch::Raw(out), done));
        }
        let mut out = Vec::new();
        let done = self.fill(docs_max, op, &mut out, |filter, projection, bytes| {
            let doc = storage::decode_record(bytes.as_ref())?;
            let (ok, details) = filter.try_matches_details(&doc)?;
            if !ok {
                return Ok(None);
            }
            let doc = match projection {
                Some(p) => p.apply(&doc, &details)?,
                None => doc,
            };
            let size = approx_doc_size(&doc);
            Ok(Some((doc, size)))
        })?;
        Ok((Batch::Docs(out), done))
    }

    /// Append to `out` what `keep` makes of each record after `last` (None: the record does
    /// not match), up to `docs_max` results and BATCH_SIZE_BYTES_MAX bytes (or one result,
    /// whatever its size).
    fn fill<T>(
        &mut self,
        docs_max: usize,
        op: &OpCtx,
        out: &mut Vec<T>,
        keep: impl Fn(&query::filter::Filter, Option<&Projection>, storage::RawRecord) -> Result<Option<(T, usize)>>,
    ) -> Result<bool> {
        if self.coll.is_dropped() {
            return Ok(true);
        }

        // Only a deletion can take the cursor's record away; the point read that checks
        // cost a primary 6% of its CPU when done for every getMore of its secondaries.
        // (Before the read: see `Collection::removals`.)
        let removals = self.coll.removals();
        if let Some(last) = self.last.filter(|_| removals != self.removals_seen) {
            if self.coll.snapshot().get(last)?.is_none() {
                return Err(Error::new(Code::CappedPositionLost, "CollectionScan died due to position in capped collection being deleted"));
            }
        }
        self.removals_seen = removals;
        let mut size = 0usize;
        loop {
            op.check()?;
            // Entries of a unit still being written stay unread (`tail_chunk` stops before).
            let chunk = self.coll.tail_chunk(self.last.or(self.start_after), TAIL_CHUNK_DOCS)?;
            let full = chunk.len() == TAIL_CHUNK_DOCS;
            for (rid, bytes) in chunk {
                if self.limit.is_some_and(|l| self.returned >= l) {
                    return Ok(true);
                }
                if out.len() >= docs_max {
                    return Ok(false);
                }
                let Some((item, item_size)) = keep(&self.filter, self.projection.as_ref(), bytes)? else {
                    self.last = Some(rid);
                    continue;
                };
                // At least one result per batch, and past that no more than
                // BATCH_SIZE_BYTES_MAX: this one starts the next batch (read again then).
                if !out.is_empty() && size + item_size > BATCH_SIZE_BYTES_MAX {
                    return Ok(false);
                }
                self.last = Some(rid);
                size += item_size;
                self.returned += 1;
                out.push(item);
            }
            if !full {
                return Ok(self.limit.is_some_and(|l| self.returned >= l));
            }
        }
    }
}

/// One reply's worth of a cursor's results.
pub enum Batch {
    Docs(Vec<Document>),
    /// Records' BSON as stored, for a tail whose filter and projection do nothing
    /// (`Tail::raw`): written into the reply as they are. Oplog entries still in memory are
    /// shared, not copied, by the batches of every member tailing them.
    Raw(Vec<storage::RawRecord>),
}

impl Batch {
    pub fn len(&self) -> usize {
        match self {
            Batch::Docs(d) => d.len(),
            Batch::Raw(r) => r.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct Cursor {
    pub id: i64,
    pub ns: String,
    pub source: Source,
    pub lsid: Option<Bson>,
    pub no_timeout: bool,
    /// The user (name, database) logged in on the connection that opened it: under
    /// authorization, only that user may continue or kill it.
    pub owner: Option<(String, String)>,
    pub last_used: Instant,
    /// Documents returned so far (currentOp/serverStatus reporting).
    pub n_returned: u64,
    /// Opened with readConcern "majority": every batch waits for the commit point.
    pub majority_read: bool,
}

impl Cursor {
    pub fn new(ns: String, source: Source) -> Cursor {
        Cursor { id: 0, ns, source, lsid: None, no_timeout: false, owner: None, last_used: Instant::now(), n_returned: 0, majority_read: false }
    }

    /// Fill the next batch: at most `docs_max` documents and about BATCH_SIZE_BYTES_MAX bytes.
    /// Returns the batch and whether the cursor is exhausted.
    pub fn next_batch(&mut self, docs_max: usize, op: &OpCtx) -> Result<(Batch, bool)> {
        let mut out = Vec::new();
        let mut size = 0usize;
        let done = match &mut self.source {
            Source::Tail(t) => {
                let (batch, done) = t.next_batch(docs_max, op)?;
                self.n_returned += batch.len() as u64;
                self.last_used = Instant::now();
                return Ok((batch, done));
            }
            Source::ChangeStream(_) => return Err(Error::internal("a change stream's batches are read by change_stream::get_more")),
            Source::Buffered(q) => {
                while out.len() < docs_max {
                    let Some(d) = q.front() else { break };
                    let s = approx_doc_size(d);
                    if !out.is_empty() && size + s > BATCH_SIZE_BYTES_MAX {
                        break;
                    }
                    size += s;
                    out.extend(q.pop_front());
                }
                q.is_empty()
            }
            Source::Find { scan, projection, key_output, skip, limit, returned, held } => loop {
                // The limit first: a batch that reaches it ends the cursor.
                if let Some(l) = *limit {
                    if *returned >= l {
                        break true;
                    }
                }
                if out.len() >= docs_max {
                    break false;
                }
                let doc = match held.take() {
                    Some(doc) => doc,
                    None => {
                        let Some((rid, doc, details)) = scan.next(op)? else { break true };
                        if *skip > 0 {
                            *skip -= 1;
                            continue;
                        }
                        crate::exec::shape(projection.as_ref(), key_output.as_deref(), rid, doc, &details)?
                    }
                };
                // At least one document per batch, and past that no more than
                // BATCH_SIZE_BYTES_MAX: one that does not fit is held for the next batch.
                let doc_size = approx_doc_size(&doc);
                if !out.is_empty() && size + doc_size > BATCH_SIZE_BYTES_MAX {
                    *held = Some(doc);
                    break false;
                }
                size += doc_size;
                *returned += 1;
                out.push(doc);
            },
        };
        self.n_returned += out.len() as u64;
        self.last_used = Instant::now();
        Ok((Batch::Docs(out), done))
    }
}

pub struct CursorManager {
    cursors: Mutex<HashMap<i64, Cursor>>,
    timeout: Duration,
}

impl CursorManager {
    pub fn new(timeout_ms: u64) -> CursorManager {
        CursorManager { cursors: Mutex::new(HashMap::new()), timeout: Duration::from_millis(timeout_ms) }
    }

    /// Store a cursor that still has results and return its id (never 0; ids are random so
    /// one client cannot guess another's cursor).
    pub fn register(&self, mut c: Cursor) -> Result<i64> {
        let mut map = self.cursors.lock();
        if map.len() >= CURSORS_OPEN_MAX {
            return Err(Error::new(Code::OperationFailed, format!("too many open cursors (limit {CURSORS_OPEN_MAX}); close cursors or let them time out")));
        }
        let id = loop {
            let id = (rand::random::<u64>() >> 2) as i64;
            if id != 0 && !map.contains_key(&id) {
                break id;
            }
        };
        c.id = id;
        c.last_used = Instant::now();
        map.insert(id, c);
        Ok(id)
    }

    /// Take a cursor out for a getMore by `owner` (see `Cursor::owner`); put it back with
    /// `restore` if it has more.
    pub fn checkout(&self, id: i64, ns: &str, owner: Option<&(String, String)>) -> Result<Cursor> {
        let mut map = self.cursors.lock();
        match map.get(&id) {
            None => Err(Error::new(Code::CursorNotFound, format!("cursor id {id} not found"))),
            Some(c) if c.ns != ns => {
                Err(Error::new(Code::Unauthorized, format!("Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {}", c.ns)))
            }
            Some(c) if c.owner.as_ref() != owner => Err(Error::new(Code::Unauthorized, format!("cursor id {id} was not created by the authenticated user"))),
            Some(_) => Ok(map.remove(&id).expect("present: checked above under the same lock")),
        }
    }

    pub fn restore(&self, c: Cursor) {
        self.cursors.lock().insert(c.id, c);
    }

    /// Mark cursor `id` as a readConcern "majority" cursor (see `Cursor::majority_read`).
    pub fn mark_majority_read(&self, id: i64) {
        if let Some(c) = self.cursors.lock().get_mut(&id) {
            c.majority_read = true;
        }
    }

    pub fn is_change_stream(&self, id: i64) -> bool {
        self.cursors.lock().get(&id).is_some_and(|c| matches!(c.source, Source::ChangeStream(_)))
    }

    pub fn is_majority_read(&self, id: i64) -> bool {
        self.cursors.lock().get(&id).is_some_and(|c| c.majority_read)
    }

    /// Kill cursor `id` if `owner` opened it (see `Cursor::owner`).
    pub fn kill(&self, id: i64, owner: Option<&(String, String)>) -> bool {
        let mut map = self.cursors.lock();
        if map.get(&id).is_none_or(|c| c.owner.as_ref() != owner) {
            return false;
        }
        map.remove(&id).is_some()
    }

    pub fn kill_for_session(&self, lsid: &Bson) -> usize {
        let mut map = self.cursors.lock();
        let before = map.len();
        map.retain(|_, c| c.lsid.as_ref() != Some(lsid));
        before - map.len()
    }

    pub fn kill_all_with_session(&self) -> usize {
        let mut map = self.cursors.lock();
        let before = map.len();
        map.retain(|_, c| c.lsid.is_none());
        before - map.len()
    }

    /// Kill cursors of a namespace (collection dropped or renamed); returns how many. A
    /// change stream lives on: it reports the drop or rename, then invalidates.
    pub fn kill_ns(&self, ns: &str) -> usize {
        let mut map = self.cursors.lock();
        let before = map.len();
        map.retain(|_, c| c.ns != ns || matches!(c.source, Source::ChangeStream(_)));
        before - map.len()
    }

    pub fn reap_idle(&self) -> usize {
        let now = Instant::now();
        let mut map = self.cursors.lock();
        let before = map.len();
        map.retain(|_, c| c.no_timeout || now.duration_since(c.last_used) < self.timeout);
        before - map.len()
    }

    pub fn open_count(&self) -> usize {
        self.cursors.lock().len()
    }
}
