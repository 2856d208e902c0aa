//! Change streams (`$changeStream`): a cursor that turns the oplog's majority-committed
//! entries into change events (`event`), from a start point on, and waits for new ones.
//!
//! A stream's position (`token::Position`) is the last event it returned, or a point
//! between events; every batch carries it as `postBatchResumeToken`, and a stream opened
//! with `resumeAfter`, `startAfter` or `startAtOperationTime` starts after it. Only entries
//! at or before the commit point are read, so an event is never one a rollback can take
//! back. Entries are read per getMore from the oplog's recent tail (`Collection::tail_chunk`),
//! which the oplog keeps in memory for the members that fetch it. Streams of one kind share
//! their events, made and encoded once (`feed`); batches go out as raw BSON.

mod event;
mod feed;
mod token;

use crate::commands::Ctx;
use crate::cursor::{Cursor, Source};
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use event::{Scope, Shape};
pub use feed::Feed;
use query::agg::{Pipeline, RunOptions};
use std::collections::VecDeque;
use std::sync::Arc;
pub use token::Position;

/// Oplog entries read per look.
const ENTRIES_PER_READ: usize = 256;

/// The stage that splits events larger than a BSON document into fragments (last only).
const SPLIT_STAGE: &str = "$changeStreamSplitLargeEvent";

/// The stages mongod allows after `$changeStream`.
const STAGES_ALLOWED: &[&str] = &["$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FullDocument {
    Default,
    UpdateLookup,
    /// The post-image, derived from the logged pre-image and the update (null without one).
    WhenAvailable,
    /// The post-image, or NoMatchingDocument without one.
    Required,
}

/// `fullDocumentBeforeChange`: the logged pre-image of updates, replaces and deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BeforeChange {
    Off,
    WhenAvailable,
    Required,
}

pub struct ChangeStream {
    scope: Scope,
    shape: Shape,
    full_document: FullDocument,
    before_change: BeforeChange,
    /// The stream has returned everything up to here.
    pos: Position,
    /// Events read and not yet shaped (a batch that filled up inside an entry's events).
    pending: VecDeque<event::Produced>,
    /// Events (or fragments) shaped and not yet returned.
    ready: VecDeque<Piece>,
    /// `$changeStreamSplitLargeEvent` ends the pipeline.
    split_large: bool,
    /// The stages after `$changeStream`, applied to each event.
    pipeline: Pipeline,
    /// The kind of stream whose events it shares (`feed`), when it makes none of its own:
    /// no stage after `$changeStream`, and no lookup of the current document.
    kind: Option<feed::Kind>,
    oplog: storage::Collection,
    /// An invalidate was returned: the stream is over.
    invalidated: bool,
}

/// What the stream returns next: an event, or one fragment of a split event, with its size.
struct Piece {
    at: Position,
    body: Body,
    size_bytes: usize,
    /// The stream ends after it (the last piece of an invalidate).
    ends: bool,
}

enum Body {
    Doc(Document),
    /// Encoded once, shared with the other streams of its kind.
    Shared(Arc<[u8]>),
}

/// The largest change event (or fragment) returned: a BSON document's limit.
const EVENT_BYTES_MAX: usize = common::limits::BSON_OBJECT_SIZE_MAX_BYTES;

/// The fragment number of a position after every fragment of its event.
const FRAGMENTS_AFTER: u32 = u32::MAX;

/// Room in a fragment for its `_id` and `splitEvent`.
const EVENT_SIZE_MARGIN_BYTES: usize = 64 * 1024;

fn encode(d: &Document) -> Result<Vec<u8>> {
    d.to_vec().map_err(|e| Error::internal(format!("encoding a change event: {e}")))
}

fn encoded_len(d: &Document) -> Result<usize> {
    encode(d).map(|v| v.len())
}

/// Open a change stream for `aggregate` whose first stage is `$changeStream` (`spec`), the
/// rest being `rest`; returns the command's reply.
pub fn open(ctx: &mut Ctx, coll: Option<&str>, spec: &Document, rest: &[Document], batch_size: usize) -> Result<Document> {
    let Some(repl) = ctx.shared.repl.as_ref() else {
        return Err(Error::location(40573, "The $changeStream stage is only supported on replica sets"));
    };
    // Events are majority-committed: a stream reads at "majority", or says nothing.
    if let Some(level) = ctx.cmd.get_document("readConcern").ok().and_then(|rc| rc.get_str("level").ok()) {
        if level != "majority" {
            return Err(Error::new(Code::InvalidOptions, format!("$changeStream reads at readConcern level 'majority', not '{level}'")));
        }
    }
    let all = spec.get_bool("allChangesForCluster").unwrap_or(false);
    let scope = match (coll, all) {
        (_, true) if ctx.db != "admin" || coll.is_some() => {
            return Err(Error::new(
                Code::InvalidOptions,
                "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' database, and with no collection name",
            ));
        }
        (None, true) => Scope::Cluster,
        (None, false) if event::is_internal_db(ctx.db) => {
            return Err(Error::new(Code::InvalidNamespace, format!("$changeStream may not be opened on the internal {} database", ctx.db)));
        }
        (None, false) => Scope::Database { db: ctx.db.to_string() },
        (Some(c), _) if event::is_internal_db(ctx.db) || c.starts_with("system.") => {
            return Err(Error::new(Code::InvalidNamespace, format!("$changeStream may not be opened on the internal {}.{c} collection", ctx.db)));
        }
        (Some(c), _) => Scope::Collection { db: ctx.db.to_string(), coll: c.to_string() },
    };
    let mut shape = Shape::default();
    let mut full_document = FullDocument::Default;
    let mut before_change = BeforeChange::Off;
    let mut start: Option<Position> = None;
    for (k, v) in spec {
        match (k.as_str(), v) {
            ("allChangesForCluster", Bson::Boolean(_)) => {}
            ("showExpandedEvents", Bson::Boolean(b)) => shape.show_expanded_events = *b,
            ("fullDocument", Bson::String(s)) => {
                full_document = match s.as_str() {
                    "default" => FullDocument::Default,
                    "updateLookup" => FullDocument::UpdateLookup,
                    "whenAvailable" => FullDocument::WhenAvailable,
                    "required" => FullDocument::Required,
                    _ => return Err(Error::bad_value(format!("unknown fullDocument value '{s}'"))),
                }
            }
            ("fullDocumentBeforeChange", Bson::String(s)) => {
                before_change = match s.as_str() {
                    "off" => BeforeChange::Off,
                    "whenAvailable" => BeforeChange::WhenAvailable,
                    "required" => BeforeChange::Required,
                    _ => return Err(Error::bad_value(format!("unknown fullDocumentBeforeChange value '{s}'"))),
                }
            }
            ("resumeAfter" | "startAfter", token) => {
                if start.is_some() {
                    return Err(Error::location(40674, "Only one type of resume option is allowed, but multiple were found."));
                }
                let p = Position::from_token(token)?;
                if p.invalidate && k == "resumeAfter" {
                    return Err(Error::new(
                        Code::InvalidResumeToken,
                        "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification.",
                    ));
                }
                start = Some(p);
            }
            ("startAtOperationTime", Bson::Timestamp(t)) => {
                if start.is_some() {
                    return Err(Error::location(40674, "Only one type of resume option is allowed, but multiple were found."));
                }
                let ts = common::optime::ts_value(*t);
                // The events at or after `ts`.
                start = Some(Position::high_water(ts.saturating_sub(1)));
            }
            ("showMigrationEvents" | "allowToRunOnConfigDB" | "allowToRunOnSystemNS", Bson::Boolean(false)) => {}
            (k, v) => return Err(Error::new(Code::FailedToParse, format!("unknown or invalid $changeStream option '{k}': {v}"))),
        }
    }
    let split_large = rest.last().is_some_and(|s| s.len() == 1 && s.contains_key(SPLIT_STAGE));
    if split_large {
        match rest.last().and_then(|s| s.get(SPLIT_STAGE)) {
            Some(Bson::Document(d)) if d.is_empty() => {}
            _ => return Err(Error::new(Code::FailedToParse, format!("{SPLIT_STAGE} takes an empty object"))),
        }
    }
    let rest = if split_large { &rest[..rest.len() - 1] } else { rest };
    for stage in rest {
        let name = stage.keys().next().map(String::as_str).unwrap_or("");
        if name == SPLIT_STAGE {
            return Err(Error::new(Code::IllegalOperation, format!("{SPLIT_STAGE} must be the last stage of a $changeStream pipeline")));
        }
        if !STAGES_ALLOWED.contains(&name) {
            return Err(Error::new(Code::IllegalOperation, format!("{name} is not permitted in a $changeStream pipeline")));
        }
    }
    shape.images = before_change != BeforeChange::Off || matches!(full_document, FullDocument::WhenAvailable | FullDocument::Required);
    let pipeline = Pipeline::parse(rest)?;
    let store = ctx.store();
    let oplog = store
        .collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION)
        .ok_or_else(|| Error::location(40573, "The $changeStream stage is only supported on replica sets"))?;
    if start.is_some_and(|p| p.fragment > 0) && !split_large {
        return Err(Error::new(
            Code::ChangeStreamFatalError,
            format!("Attempted to resume from a split event fragment, but the event in the resumed stream was not split: add {SPLIT_STAGE}"),
        ));
    }
    // From now on: after the newest entry a majority has.
    let pos = match start {
        Some(p) => p,
        None => Position::high_water(repl.commit_point(store).ts),
    };
    let kind = (rest.is_empty() && full_document != FullDocument::UpdateLookup).then(|| feed::Kind {
        scope: format!("{scope:?}"),
        show_expanded_events: shape.show_expanded_events,
        full_document: full_document as u8,
        before_change: before_change as u8,
        split_large,
    });
    let mut stream = ChangeStream {
        scope,
        shape,
        full_document,
        before_change,
        pos,
        pending: VecDeque::new(),
        ready: VecDeque::new(),
        split_large,
        pipeline,
        kind,
        oplog,
        invalidated: false,
    };
    stream.check_history()?;
    let ns = match coll {
        Some(c) => ctx.ns(c),
        None => format!("{}.$cmd.aggregate", ctx.db),
    };
    let (events, pbrt) = stream.next_batch(ctx, batch_size)?;
    let done = stream.invalidated;
    let mut cursor = Cursor::new(ns.clone(), Source::ChangeStream(Box::new(stream)));
    cursor.lsid = ctx.lsid();
    let id = if done { 0 } else { ctx.register_cursor(cursor)? };
    Ok(reply(ctx, &ns, id, events, pbrt, true))
}

/// A getMore of a change stream's cursor (`cursor`, checked out): the next events, or an
/// empty batch after waiting up to `await_ms` for some.
pub fn get_more(ctx: &mut Ctx, mut cursor: Cursor, batch_size: usize, await_ms: Option<i64>) -> Result<Document> {
    let Source::ChangeStream(stream) = &mut cursor.source else { return Err(Error::internal("not a change stream cursor")) };
    let seen = ctx.shared.store.write_seq();
    let progress_seen = ctx.shared.repl.as_ref().map(|r| r.commit_point(&ctx.shared.store));
    let (events, pbrt) = stream.next_batch(ctx, batch_size)?;
    let done = stream.invalidated;
    if events.is_empty() && !done {
        let wait = std::time::Duration::from_millis(await_ms.unwrap_or(crate::commands::AWAIT_DATA_MS_DEFAULT).min(crate::commands::AWAIT_DATA_MS_MAX) as u64);
        let deadline = ctx.resumed.unwrap_or_else(|| std::time::Instant::now() + wait);
        if std::time::Instant::now() < deadline {
            ctx.shared.cursors.restore(cursor);
            ctx.out.await_data = Some(crate::dispatch::AwaitData { seen, deadline, commit_point: progress_seen });
            return Ok(Document::new());
        }
    }
    cursor.n_returned += events.len() as u64;
    cursor.last_used = std::time::Instant::now();
    let (ns, id) = (cursor.ns.clone(), if done { 0 } else { cursor.id });
    if !done {
        ctx.shared.cursors.restore(cursor);
    }
    Ok(reply(ctx, &ns, id, events, pbrt, false))
}

/// The reply to the command that returns `events`: they go out as raw BSON beside it
/// (`dispatch::Effects::raw_batch`), shared ones as they were encoded.
fn reply(ctx: &mut Ctx, ns: &str, id: i64, events: Vec<storage::RawRecord>, pbrt: Document, first: bool) -> Document {
    let key = if first { "firstBatch" } else { "nextBatch" };
    let mut c = Document::new();
    c.insert(key, Bson::Array(Vec::new()));
    c.insert("postBatchResumeToken", pbrt);
    c.insert("id", id);
    c.insert("ns", ns);
    ctx.out.raw_batch = Some(net::service::RawBatch { key, docs: events });
    doc! {"cursor": c}
}

impl ChangeStream {
    /// ChangeStreamHistoryLost when the oplog no longer holds the stream's position.
    fn check_history(&self) -> Result<()> {
        if self.oplog.tail_holds(self.pos.ts) {
            return Ok(());
        }
        let oldest = self.oplog.tail_chunk(None, 1)?.first().map(|(ts, _)| *ts);
        match oldest {
            Some(oldest) if oldest > self.pos.ts.saturating_add(1) => {
                Err(Error::new(Code::ChangeStreamHistoryLost, "Resume of change stream was not possible, as the resume point may no longer be in the oplog."))
            }
            _ => Ok(()),
        }
    }

    /// The next events, at most `docs_max`, and the batch's resume token.
    fn next_batch(&mut self, ctx: &Ctx, docs_max: usize) -> Result<(Vec<storage::RawRecord>, Document)> {
        let mut out = Vec::new();
        if self.invalidated {
            return Ok((out, self.pos.token()));
        }
        self.check_history()?;
        let store = ctx.store();
        let commit_ts = ctx.shared.repl.as_ref().map_or(0, |r| r.commit_point(store).ts);
        let mut size = 0usize;
        while out.len() < docs_max {
            let Some(piece) = self.next_piece(ctx, commit_ts)? else { break };
            // A batch holds what fits in a reply; one that does not starts the next batch.
            if !out.is_empty() && size + piece.size_bytes > crate::cursor::BATCH_SIZE_BYTES_MAX {
                self.ready.push_front(piece);
                break;
            }
            size += piece.size_bytes;
            out.push(match piece.body {
                Body::Shared(bytes) => storage::RawRecord::Shared(bytes),
                Body::Doc(d) => storage::RawRecord::Owned(encode(&d)?),
            });
            self.pos = piece.at;
            if piece.ends {
                self.invalidated = true;
                break;
            }
        }
        Ok((out, self.pos.token()))
    }

    /// The next event (or fragment of one) to return, shaped by the stream's pipeline; none
    /// when the stream has returned everything up to the commit point. Events the pipeline
    /// drops move the position past them.
    fn next_piece(&mut self, ctx: &Ctx, commit_ts: u64) -> Result<Option<Piece>> {
        let opts = RunOptions { allow_disk_use: false, mem_limit_bytes: common::limits::AGG_MEMORY_BYTES_MAX };
        loop {
            if let Some(piece) = self.ready.pop_front() {
                return Ok(Some(piece));
            }
            let Some(p) = self.pending.pop_front() else {
                if !self.read_entries(ctx, commit_ts)? {
                    return Ok(None);
                }
                continue;
            };
            ctx.op.check()?;
            let mut event = p.event;
            self.add_documents(ctx, &mut event, p.images)?;
            let shaped = self.pipeline.run_interruptible(&mut std::iter::once(Ok(event)), &opts, &|| ctx.op.check())?;
            let mut pieces = Vec::new();
            for e in shaped {
                if e.get("_id") != Some(&Bson::Document(p.at.token())) {
                    return Err(Error::new(
                        Code::ChangeStreamFatalError,
                        "Encountered an event whose _id field, which contains the resume token, was modified by the pipeline. Modifying the _id field of an event makes it impossible to resume the stream from that point.",
                    ));
                }
                pieces.extend(self.split(e, p.at)?);
            }
            // A stream resumed from a fragment goes on with the next one.
            pieces.retain(|piece| piece.at > self.pos);
            match (pieces.last_mut(), p.invalidates) {
                (Some(last), true) => last.ends = true,
                (Some(_), false) => {}
                (None, invalidates) => {
                    self.pos = self.pos.max(p.at);
                    if self.pos.fragment > 0 && self.pos.whole() == p.at {
                        // Every fragment of a split event was returned: after all of them.
                        self.pos.fragment = FRAGMENTS_AFTER;
                    }
                    if invalidates {
                        self.invalidated = true;
                        return Ok(None);
                    }
                    continue;
                }
            }
            self.ready.extend(pieces);
        }
    }

    /// `event` (at `at`) as one piece, or, with `$changeStreamSplitLargeEvent`, as fragments
    /// of at most EVENT_BYTES_MAX each when it is larger: its fields in order, each fragment
    /// with its own resume token and `splitEvent: {fragment, of}`. BSONObjectTooLarge for a
    /// larger event otherwise, or for a field larger than a fragment.
    fn split(&self, event: Document, at: Position) -> Result<Vec<Piece>> {
        let approx = crate::exec::approx_doc_size(&event);
        // The estimate can miss by a few bytes per array element: measure exactly any event
        // that could be near the limit.
        let size_bytes = if approx < EVENT_BYTES_MAX / 2 { approx } else { encoded_len(&event)? };
        if size_bytes <= EVENT_BYTES_MAX {
            return Ok(vec![Piece { at, body: Body::Doc(event), size_bytes, ends: false }]);
        }
        let too_large = |what: String| Error::new(Code::BSONObjectTooLarge, format!("{what} exceeds the {EVENT_BYTES_MAX}-byte limit of a change event"));
        if !self.split_large {
            return Err(too_large(format!("a change event of {size_bytes} bytes (add $changeStreamSplitLargeEvent to split it)")));
        }
        let mut fragments: Vec<(Document, usize)> = vec![(Document::new(), 0)];
        for (k, v) in event {
            if k == "_id" {
                continue;
            }
            let field_bytes = encoded_len(&doc! {k.as_str(): &v})? - 5;
            if field_bytes + EVENT_SIZE_MARGIN_BYTES > EVENT_BYTES_MAX {
                return Err(too_large(format!("the change event's field '{k}' of {field_bytes} bytes, which no fragment can hold,")));
            }
            let last = fragments.last_mut().expect("one fragment at least");
            if last.1 + field_bytes + EVENT_SIZE_MARGIN_BYTES > EVENT_BYTES_MAX {
                fragments.push((Document::new(), 0));
            }
            let last = fragments.last_mut().expect("one fragment at least");
            last.0.insert(k, v);
            last.1 += field_bytes;
        }
        let of = fragments.len() as u32;
        Ok(fragments
            .into_iter()
            .zip(1..)
            .map(|((fields, bytes), n)| {
                let at = Position { fragment: n, ..at };
                let mut event = doc! {"_id": at.token(), "splitEvent": {"fragment": n as i32, "of": of as i32}};
                event.extend(fields);
                Piece { at, body: Body::Doc(event), size_bytes: bytes + EVENT_SIZE_MARGIN_BYTES, ends: false }
            })
            .collect())
    }

    /// An event's `fullDocument` (of updates: the document now, or after the change) and
    /// `fullDocumentBeforeChange`, as the stream's options ask.
    fn add_documents(&self, ctx: &Ctx, event: &mut Document, images: event::Images) -> Result<()> {
        let op_type = event.get_str("operationType").unwrap_or("").to_string();
        let missing = |which: &str, ops: &str, event: &Document| {
            Error::new(
                Code::NoMatchingDocument,
                format!("Change stream was configured to require a {which} for all {ops} events, but the {which} was not found for event: {event}"),
            )
        };
        if op_type == "update" {
            match (self.full_document, images.after) {
                (FullDocument::UpdateLookup, _) => {
                    let now = lookup(ctx, event)?;
                    event.insert("fullDocument", now);
                }
                (FullDocument::WhenAvailable | FullDocument::Required, Some(after)) => {
                    event.insert("fullDocument", after);
                }
                (FullDocument::WhenAvailable, None) => {
                    event.insert("fullDocument", Bson::Null);
                }
                (FullDocument::Required, None) => return Err(missing("post-image", "update", event)),
                (FullDocument::Default, _) => {}
            }
        }
        if matches!(op_type.as_str(), "update" | "replace" | "delete") {
            match (self.before_change, images.before) {
                (BeforeChange::Off, _) => {}
                (_, Some(before)) => {
                    event.insert("fullDocumentBeforeChange", before);
                }
                (BeforeChange::WhenAvailable, None) => {
                    event.insert("fullDocumentBeforeChange", Bson::Null);
                }
                (BeforeChange::Required, None) => return Err(missing("pre-image", "update, delete and replace", event)),
            }
        }
        Ok(())
    }

    /// Read the entries after the position, up to the commit point, into `pending`; false
    /// when there were none. Entries with no event for this stream move the position past
    /// them, so the batch's resume token moves too.
    fn read_entries(&mut self, ctx: &Ctx, commit_ts: u64) -> Result<bool> {
        loop {
            // The position's own entry again: a transaction's later operations follow it.
            // With images, the entry before it too: the pre-image of the position's change.
            let back = if self.shape.images { 2 } else { 1 };
            let chunk = self.oplog.tail_chunk(self.pos.ts.checked_sub(back), ENTRIES_PER_READ)?;
            let full = chunk.len() == ENTRIES_PER_READ;
            for (i, (ts, raw)) in chunk.iter().enumerate() {
                let ts = *ts;
                if ts > commit_ts {
                    return Ok(false);
                }
                // An entry before the position is read only as the next one's `before`: its
                // events were returned, and made here without its own `before` they would
                // lack their pre-images.
                if ts < self.pos.ts {
                    continue;
                }
                // The entry logged just before, where a change's pre-image is.
                let before = i.checked_sub(1).map(|b| &chunk[b]).filter(|(b, _)| b.checked_add(1) == Some(ts)).map(|(_, r)| r.as_ref());
                if let Some(shared) = self.shared_events(ctx, ts, raw.as_ref(), before)? {
                    let fresh: Vec<Piece> = shared
                        .iter()
                        .filter(|e| e.at > self.pos)
                        .map(|e| Piece { at: e.at, body: Body::Shared(e.bytes.clone()), size_bytes: e.bytes.len(), ends: e.ends })
                        .collect();
                    if !fresh.is_empty() {
                        self.ready.extend(fresh);
                        return Ok(true);
                    }
                    self.pos = self.pos.max(Position::high_water(ts));
                    continue;
                }
                let produced = self.events_of(ctx, ts, raw.as_ref(), before)?;
                // After the position; or the event a fragment position is part of, whose
                // fragments after it `next_piece` keeps.
                let fresh: Vec<event::Produced> = produced
                    .into_iter()
                    .filter(|p| p.at > self.pos || ((1..FRAGMENTS_AFTER).contains(&self.pos.fragment) && p.at == self.pos.whole()))
                    .collect();
                if !fresh.is_empty() {
                    self.pending.extend(fresh);
                    return Ok(true);
                }
                self.pos = self.pos.max(Position::high_water(ts));
            }
            if !full {
                return Ok(false);
            }
            ctx.op.check()?;
        }
    }

    /// The events of the entry `raw` logged at `ts` (`before`: the entry logged just before).
    fn events_of(&self, ctx: &Ctx, ts: u64, raw: &[u8], before: Option<&[u8]>) -> Result<Vec<event::Produced>> {
        let store = ctx.store();
        let ops_before = |e: &Document| replication::apply::operations_before(store, e);
        let entry = storage::decode_record(raw)?;
        let before = match before.filter(|_| self.shape.images) {
            Some(b) => Some(storage::decode_record(b)?),
            None => None,
        };
        event::events_of(&entry, ts, before.as_ref(), &self.scope, &self.shape, &ops_before)
    }

    /// For a stream that shares its events (`kind`): the entry's events for its kind, as
    /// another stream of the kind made them, or made now and kept for the others. None for
    /// a stream that makes its own, or when this entry's events are not to be shared (an
    /// event the stream fails on: it fails making its own).
    fn shared_events(&self, ctx: &Ctx, ts: u64, raw: &[u8], before: Option<&[u8]>) -> Result<Option<feed::Events>> {
        let Some(kind) = &self.kind else { return Ok(None) };
        let feed = &ctx.shared.change_feed;
        if let Some(events) = feed.get(ts, kind) {
            return Ok(Some(events));
        }
        let mut encoded = Vec::new();
        for p in self.events_of(ctx, ts, raw, before)? {
            let mut event = p.event;
            if self.add_documents(ctx, &mut event, p.images).is_err() {
                return Ok(None);
            }
            let Ok(pieces) = self.split(event, p.at) else { return Ok(None) };
            let last = pieces.len().saturating_sub(1);
            for (n, piece) in pieces.into_iter().enumerate() {
                let Body::Doc(d) = piece.body else { return Err(Error::internal("a change event made twice")) };
                encoded.push(feed::Encoded { at: piece.at, bytes: Arc::from(encode(&d)?), ends: p.invalidates && n == last });
            }
        }
        let events: feed::Events = Arc::from(encoded);
        feed.put(ts, kind, events.clone());
        Ok(Some(events))
    }
}

/// An update event's `fullDocument` for `updateLookup`: the document as it is now, or null.
fn lookup(ctx: &Ctx, event: &Document) -> Result<Bson> {
    let ns = event.get_document("ns").ok();
    let (Some(db), Some(coll)) = (ns.and_then(|n| n.get_str("db").ok()), ns.and_then(|n| n.get_str("coll").ok())) else { return Ok(Bson::Null) };
    let Some(id) = event.get_document("documentKey").ok().and_then(|k| k.get("_id")) else { return Ok(Bson::Null) };
    Ok(match ctx.store().collection(db, coll) {
        Some(c) => c.snapshot().find_by_id(id)?.map_or(Bson::Null, |(_, d)| Bson::Document(d)),
        None => Bson::Null,
    })
}
