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
        Scan { snapshot, filter, access, chunk: Vec::new().into_iter(), done: false, examined: 0, keys_examined: 0, docs_examined: 0, owner: None }
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
                if ok && self.owner.as_ref().is_none_or(|o| o.owns(&doc)) {
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
