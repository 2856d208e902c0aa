//! Query execution over a storage snapshot: a collection scan (or an `_id` point lookup) with
//! a filter, pulled in bounded chunks so a cursor can resume it across getMore calls.

use crate::ops::OpCtx;
use bson::{Bson, Document};
use common::Result;
use query::filter::{Filter, MatchDetails};
use storage::{RecordId, Snapshot};

/// Records read from storage per pull; bounds the memory a scan holds between checks of
/// maxTimeMS and killOp.
const SCAN_CHUNK_DOCS: usize = 256;
/// How often (in documents examined) a scan checks its deadline and kill flag.
const EXAMINED_CHECK_DOCS: u64 = 32;

pub struct Scan {
    snapshot: Snapshot,
    filter: Filter,
    /// `Some(v)`: the filter pins `_id` to v, so one index lookup replaces the scan.
    point: Option<Bson>,
    after: Option<RecordId>,
    chunk: std::vec::IntoIter<(RecordId, Document)>,
    done: bool,
    examined: u64,
}

impl Scan {
    pub fn new(snapshot: Snapshot, filter: Filter) -> Scan {
        let point = filter.id_equality().cloned();
        Scan { snapshot, filter, point, after: None, chunk: Vec::new().into_iter(), done: false, examined: 0 }
    }

    /// Next matching document with its match details (for positional projection/update).
    pub fn next(&mut self, op: &OpCtx) -> Result<Option<(RecordId, Document, MatchDetails)>> {
        loop {
            if let Some((rid, doc)) = self.chunk.next() {
                self.after = Some(rid);
                self.examined += 1;
                // Filters can be costly ($expr): honour maxTimeMS/killOp within a chunk too.
                if self.examined % EXAMINED_CHECK_DOCS == 0 {
                    op.check()?;
                }
                let (ok, details) = self.filter.try_matches_details(&doc)?;
                if ok {
                    return Ok(Some((rid, doc, details)));
                }
                continue;
            }
            if self.done {
                return Ok(None);
            }
            op.check()?;
            if let Some(id) = self.point.take() {
                self.done = true;
                let found = self.snapshot.find_by_id(&id)?;
                self.chunk = found.into_iter().collect::<Vec<_>>().into_iter();
                continue;
            }
            let batch = self.snapshot.scan(self.after, SCAN_CHUNK_DOCS)?;
            if batch.len() < SCAN_CHUNK_DOCS {
                self.done = true;
            }
            self.chunk = batch.into_iter();
        }
    }

    /// All matches (for sorts, distinct, aggregation input), bounded by the caller's checks.
    pub fn collect_all(&mut self, op: &OpCtx, size_bytes_max: usize) -> Result<Vec<(RecordId, Document, MatchDetails)>> {
        let mut out = Vec::new();
        let mut size = 0usize;
        while let Some(item) = self.next(op)? {
            size += approx_doc_size(&item.1);
            if size > size_bytes_max {
                return Err(common::Error::new(
                    common::Code(292, "QueryExceededMemoryLimitNoDiskUseAllowed"),
                    format!("Executor error during find command :: caused by :: Sort exceeded memory limit of {size_bytes_max} bytes, but did not opt in to external sorting."),
                ));
            }
            out.push(item);
        }
        Ok(out)
    }
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
