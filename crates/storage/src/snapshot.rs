//! A point-in-time view of one collection: finds, scans, index scans, validation.

use super::*;

/// A point-in-time view of one collection: `Send + 'static`, it may live in a cursor.
pub struct Snapshot {
    pub(crate) snap: Arc<dyn EngineSnapshot>,
    pub(crate) coll: Arc<CollState>,
    pub(crate) meta: Arc<MetaRt>,
}

impl Snapshot {
    /// Records in RecordId order after `after` (exclusive), at most `max_docs`.
    pub fn scan(&self, after: Option<RecordId>, max_docs: usize) -> Result<Vec<(RecordId, Document)>> {
        let Some((lower, upper)) = self.bounds_after(after) else { return Ok(Vec::new()) };
        self.scan_records(lower, upper, false, max_docs)
    }

    /// Key bounds of the records after `after` (all of them for None); None when nothing can
    /// follow it.
    pub(crate) fn bounds_after(&self, after: Option<RecordId>) -> Option<(Bound<Vec<u8>>, Bound<Vec<u8>>)> {
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

    pub(crate) fn scan_records(&self, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>, reverse: bool, max_docs: usize) -> Result<Vec<(RecordId, Document)>> {
        self.scan_with(lower, upper, reverse, max_docs, |v| decode_doc(&v))
    }

    pub(crate) fn scan_with<T>(
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

    pub(crate) fn stats(&self) -> Result<Stats> {
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

    pub(crate) fn validate_into(&self, report: &mut ValidateReport) -> Result<()> {
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
