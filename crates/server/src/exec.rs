//! Query execution over a storage snapshot: a collection scan (or an `_id` point lookup) with
//! a filter, pulled in bounded chunks so a cursor can resume it across getMore calls.

use crate::ops::OpCtx;
use crate::plan::{Access, IndexPlan, Plan};
use bson::{Bson, Document};
use common::Result;
use query::filter::{Filter, MatchDetails};
use query::sort::SortSpec;
use std::collections::HashSet;
use storage::{RecordId, Snapshot};

/// Records read from storage per pull; bounds the memory a scan holds between checks of
/// maxTimeMS and killOp.
const SCAN_CHUNK_DOCS: usize = 256;
/// How often (in documents examined) a scan checks its deadline and kill flag.
const EXAMINED_CHECK_DOCS: u64 = 32;

pub struct Scan {
    snapshot: Snapshot,
    filter: Filter,
    access: ScanAccess,
    chunk: std::vec::IntoIter<(RecordId, Document)>,
    done: bool,
    examined: u64,
    /// Index keys read (explain's keysExamined).
    pub keys_examined: u64,
    /// Documents read from the record store (explain's docsExamined).
    pub docs_examined: u64,
    /// A shard's chunks: documents outside them (a migration's) are not returned.
    owner: Option<std::sync::Arc<crate::sharding::CollMeta>>,
    /// find's min/max on the hinted index.
    key_range: Option<KeyRange>,
}

// One per scan, so a variant's size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum ScanAccess {
    Collection {
        after: Option<RecordId>,
        reverse: bool,
    },
    /// `Some(v)`: the filter pins `_id` to v, so one index lookup replaces the scan.
    Point(Option<Bson>),
    Index {
        plan: IndexPlan,
        interval: usize,
        after: Option<Vec<u8>>,
        /// Record ids already returned, when one record can appear under several keys
        /// (multikey index, or several intervals).
        seen: Option<HashSet<RecordId>>,
    },
}

impl Scan {
    pub fn with_plan(snapshot: Snapshot, filter: Filter, plan: &Plan) -> Scan {
        let access = match &plan.access {
            Access::CollScan { reverse } => ScanAccess::Collection { after: None, reverse: *reverse },
            Access::IdPoint(id) => ScanAccess::Point(Some(id.clone())),
            Access::IndexScan(p) => {
                let seen = (p.multikey || p.intervals.len() > 1).then(HashSet::new);
                ScanAccess::Index { plan: p.clone(), interval: 0, after: None, seen }
            }
        };
        Scan::with_access(snapshot, filter, access)
    }

    fn with_access(snapshot: Snapshot, filter: Filter, access: ScanAccess) -> Scan {
        Scan {
            snapshot,
            filter,
            access,
            chunk: Vec::new().into_iter(),
            done: false,
            examined: 0,
            keys_examined: 0,
            docs_examined: 0,
            owner: None,
            key_range: None,
        }
    }

    /// Keep to a range of the hinted index's keys (find's min and max).
    pub fn in_key_range(mut self, range: Option<KeyRange>) -> Scan {
        self.key_range = range;
        self
    }

    /// Keep to `owner`'s chunks (a router's versioned operation on a shard).
    pub fn owned_by(mut self, owner: Option<std::sync::Arc<crate::sharding::CollMeta>>) -> Scan {
        self.owner = owner;
        self
    }

    /// Next matching document with its match details (for positional projection/update).
    pub fn next(&mut self, op: &OpCtx) -> Result<Option<(RecordId, Document, MatchDetails)>> {
        loop {
            if let Some((rid, doc)) = self.chunk.next() {
                self.examined += 1;
                // Filters can be costly ($expr): honour maxTimeMS/killOp within a chunk too.
                if self.examined.is_multiple_of(EXAMINED_CHECK_DOCS) {
                    op.check()?;
                }
                let (ok, details) = self.filter.try_matches_details(&doc)?;
                if ok && self.owner.as_ref().is_none_or(|o| o.owns(&doc)) && self.key_range.as_ref().is_none_or(|r| r.contains(&doc)) {
                    return Ok(Some((rid, doc, details)));
                }
                continue;
            }
            if self.done {
                return Ok(None);
            }
            op.check()?;
            self.refill()?;
        }
    }

    fn refill(&mut self) -> Result<()> {
        match &mut self.access {
            ScanAccess::Point(id) => {
                self.done = true;
                if let Some(id) = id.take() {
                    self.keys_examined += 1;
                    let found = self.snapshot.find_by_id(&id)?;
                    self.docs_examined += found.is_some() as u64;
                    self.chunk = found.into_iter().collect::<Vec<_>>().into_iter();
                }
            }
            ScanAccess::Collection { after, reverse } => {
                let batch = if *reverse { self.snapshot.scan_reverse(*after, SCAN_CHUNK_DOCS)? } else { self.snapshot.scan(*after, SCAN_CHUNK_DOCS)? };
                if batch.len() < SCAN_CHUNK_DOCS {
                    self.done = true;
                }
                if let Some((rid, _)) = batch.last() {
                    *after = Some(*rid);
                }
                self.docs_examined += batch.len() as u64;
                self.chunk = batch.into_iter();
            }
            ScanAccess::Index { plan, interval, after, seen } => {
                let n = plan.intervals.len();
                if *interval >= n {
                    self.done = true;
                    return Ok(());
                }
                // A reverse scan visits the intervals last to first.
                let i = if plan.reverse { n - 1 - *interval } else { *interval };
                let mut bounds = plan.intervals[i].clone();
                bounds.reverse = plan.reverse;
                let entries = self.snapshot.index_scan(&plan.index.name, bounds, after.take(), SCAN_CHUNK_DOCS)?;
                self.keys_examined += entries.len() as u64;
                if entries.len() < SCAN_CHUNK_DOCS {
                    *interval += 1;
                } else {
                    *after = entries.last().map(|e| e.position.clone());
                }
                let mut docs = Vec::with_capacity(entries.len());
                for e in entries {
                    if let Some(seen) = seen {
                        if !seen.insert(e.record_id) {
                            continue;
                        }
                    }
                    if plan.covered {
                        docs.push((e.record_id, key_document(&plan.index.key, e.values)));
                    } else if let Some(doc) = self.snapshot.get(e.record_id)? {
                        self.docs_examined += 1;
                        docs.push((e.record_id, doc));
                    }
                }
                self.chunk = docs.into_iter();
            }
        }
        Ok(())
    }

    /// The matches in `sort` order (stable: ties keep scan order), the first `keep` of them
    /// when given (a find's skip + limit). The documents held at once must fit in
    /// `bytes_max`, or the sort fails as mongod's blocking sort does. With `keep`, only the
    /// best `keep` are held (mongod's top-k sort): the buffer is sorted and cut back to
    /// `keep` whenever it holds twice that or goes over `bytes_max`, so memory follows
    /// `keep`, not the collection.
    pub fn collect_sorted(&mut self, op: &OpCtx, sort: &SortSpec, keep: Option<usize>, bytes_max: usize) -> Result<Vec<(RecordId, Document, MatchDetails)>> {
        let mut out = Vec::new();
        let mut size = 0usize;
        let compact_at = keep.map(|k| k.saturating_mul(2).max(64));
        while let Some(item) = self.next(op)? {
            size += approx_doc_size(&item.1);
            out.push(item);
            if let (Some(k), Some(at)) = (keep, compact_at) {
                // Also before failing: the documents past the best k do not count.
                if out.len() >= at || size > bytes_max {
                    out.sort_by(|a, b| sort.compare(&a.1, &b.1));
                    out.truncate(k);
                    size = out.iter().map(|i| approx_doc_size(&i.1)).sum();
                }
            }
            if size > bytes_max {
                return Err(common::Error::new(
                    common::Code::QueryExceededMemoryLimitNoDiskUseAllowed,
                    format!("Executor error during find command :: caused by :: Sort exceeded memory limit of {bytes_max} bytes, but did not opt in to external sorting."),
                ));
            }
        }
        if !sort.is_empty() {
            out.sort_by(|a, b| sort.compare(&a.1, &b.1));
        }
        if let Some(k) = keep {
            out.truncate(k);
        }
        Ok(out)
    }
}

/// The document a covered scan stands in for an index entry: each key field (a dotted path
/// becomes nested documents) with its value.
fn key_document(key_pattern: &Document, values: Vec<Bson>) -> Document {
    let mut doc = Document::new();
    for (path, value) in key_pattern.keys().zip(values) {
        let mut parts = path.split('.').peekable();
        let mut at = &mut doc;
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                at.insert(part, value);
                break;
            }
            if !matches!(at.get(part), Some(Bson::Document(_))) {
                at.insert(part, Document::new());
            }
            let Some(Bson::Document(sub)) = at.get_mut(part) else { unreachable!("just inserted a document") };
            at = sub;
        }
    }
    doc
}

/// Plan and open a scan of a collection snapshot for `filter_doc`, optionally wanting `sort`
/// order. With `projected` (the paths a plain inclusion projection returns) the plan may be
/// covered.
pub fn planned_scan(
    snapshot: Snapshot,
    filter_doc: &Document,
    sort: Option<&SortSpec>,
    hint: Option<&Bson>,
    projected: Option<&[String]>,
) -> Result<(Scan, Plan)> {
    let filter = Filter::parse(filter_doc)?;
    let mut plan = crate::plan::choose(filter_doc, sort, &snapshot, hint, filter.id_equality())?;
    if let Some(paths) = projected {
        crate::plan::cover(&mut plan, filter_doc, paths, sort);
    }
    Ok((Scan::with_plan(snapshot, filter, &plan), plan))
}

/// Cheap estimate of a document's BSON size, used only for memory accounting.
pub fn approx_doc_size(doc: &Document) -> usize {
    fn val(v: &Bson) -> usize {
        match v {
            Bson::String(s) => s.len() + 5,
            Bson::Document(d) => approx_doc_size(d),
            Bson::Array(a) => 5 + a.iter().map(|x| val(x) + 4).sum::<usize>(),
            Bson::Binary(b) => b.bytes.len() + 5,
            Bson::ObjectId(_) => 12,
            Bson::Decimal128(_) => 16,
            _ => 8,
        }
    }
    5 + doc.iter().map(|(k, v)| k.len() + 2 + val(v)).sum::<usize>()
}

/// The value at a dotted path, through subdocuments (an array ends the walk: its whole
/// value stands for the key, as an index entry holds one of its elements).
fn path_value<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let mut v = doc.get(parts.next()?)?;
    for p in parts {
        match v {
            Bson::Document(d) => v = d.get(p)?,
            _ => return None,
        }
    }
    Some(v)
}

/// A document's key in an index of `pattern`: its values of the pattern's fields, null for
/// a missing one, as an index holds it.
fn key_of(pattern: &Document, doc: &Document) -> Vec<Bson> {
    pattern.keys().map(|f| path_value(doc, f).cloned().unwrap_or(Bson::Null)).collect()
}

/// find's `min` and `max`: only documents whose key in the hinted index is at least `min`
/// and below `max`, in the index's order (each field's direction counts).
#[derive(Clone, Debug)]
pub struct KeyRange {
    pattern: Document,
    min: Option<Vec<Bson>>,
    max: Option<Vec<Bson>>,
}

impl KeyRange {
    /// `min`/`max` name the pattern's fields in its order, as mongod requires.
    pub fn new(pattern: &Document, min: Option<&Document>, max: Option<&Document>) -> Result<KeyRange> {
        let bound = |b: Option<&Document>, which: &str| -> Result<Option<Vec<Bson>>> {
            let Some(b) = b else { return Ok(None) };
            if !b.keys().eq(pattern.keys()) {
                return Err(common::Error::location(51174, format!("The index chosen is not equal to the index specified by {which}: {b}, index: {pattern}")));
            }
            Ok(Some(b.values().cloned().collect()))
        };
        Ok(KeyRange { pattern: pattern.clone(), min: bound(min, "min")?, max: bound(max, "max")? })
    }

    fn order(&self, a: &[Bson], b: &[Bson]) -> std::cmp::Ordering {
        for ((x, y), dir) in a.iter().zip(b).zip(self.pattern.values()) {
            let o = query::compare::cmp_bson(x, y);
            let o = if common::value::as_i64(dir).is_some_and(|d| d < 0) { o.reverse() } else { o };
            if o.is_ne() {
                return o;
            }
        }
        std::cmp::Ordering::Equal
    }

    pub fn contains(&self, doc: &Document) -> bool {
        let key = key_of(&self.pattern, doc);
        self.min.as_ref().is_none_or(|m| self.order(&key, m).is_ge()) && self.max.as_ref().is_none_or(|m| self.order(&key, m).is_lt())
    }
}

/// find's `returnKey` and `showRecordId`: a result becomes the key the plan read it by
/// (`{}` for a collection scan), and gains its record id as `$recordId`.
#[derive(Clone, Debug, Default)]
pub struct KeyOutput {
    /// With returnKey: the pattern of the index the plan reads, none for a collection scan.
    pub return_key: Option<Option<Document>>,
    pub record_id: bool,
}

impl KeyOutput {
    pub fn new(plan: &Plan, return_key: bool, record_id: bool) -> Option<KeyOutput> {
        if !return_key && !record_id {
            return None;
        }
        let pattern = match &plan.access {
            Access::CollScan { .. } => None,
            Access::IdPoint(_) => Some(bson::doc! {"_id": 1}),
            Access::IndexScan(p) => Some(p.index.key.clone()),
        };
        Some(KeyOutput { return_key: return_key.then_some(pattern), record_id })
    }

    pub fn apply(&self, rid: RecordId, doc: Document) -> Document {
        let mut out = match &self.return_key {
            None => doc,
            Some(None) => Document::new(),
            Some(Some(pattern)) => pattern.keys().zip(key_of(pattern, &doc)).map(|(k, v)| (k.clone(), v)).collect(),
        };
        if self.record_id {
            out.insert("$recordId", rid as i64);
        }
        out
    }
}

/// A find's result as it goes out: projected, or its key (returnKey), with its `$recordId`
/// (showRecordId).
pub fn shape(
    projection: Option<&query::projection::Projection>,
    key_output: Option<&KeyOutput>,
    rid: RecordId,
    doc: Document,
    details: &MatchDetails,
) -> Result<Document> {
    let doc = match (projection, key_output) {
        (_, Some(k)) if k.return_key.is_some() => return Ok(k.apply(rid, doc)),
        (Some(p), _) => p.apply(&doc, details)?,
        (None, _) => doc,
    };
    Ok(match key_output {
        Some(k) => k.apply(rid, doc),
        None => doc,
    })
}
