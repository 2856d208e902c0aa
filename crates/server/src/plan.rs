//! Query planning: choose between a collection scan, an `_id` point lookup and an index scan,
//! and compute index bounds from the filter.
//!
//! Bounds are always a superset of the matching keys: every fetched document is checked
//! against the full filter again, so a predicate the planner does not understand only costs
//! speed, never correctness. Multikey indexes never intersect two range predicates on one
//! field (each array element may satisfy a different side), so they use one side only.
//!
//! A hashed field is bounded by the hash of each equality value (`storage::hash_bson`), and
//! never by a range: hash order is not value order. A covered plan ([`cover`]) reads index
//! entries without fetching documents and checks the filter against a document rebuilt from
//! each entry, so it is chosen only when the filter proves every field it names or returns
//! present and non-null (a missing field is indexed as null); multikey and hashed indexes
//! never cover. Explain (`commands::explain`) shows the chosen plan, with each field's
//! bounds from `IndexPlan::bounds_display`.

use bson::{Bson, Document};
use common::{Code, Error, Result};
use query::sort::SortSpec;
use std::collections::BTreeMap;
use std::ops::Bound;
use storage::{IndexBounds, IndexSpec, Snapshot};

/// Index intervals from one `$in` may multiply across compound fields; past this many the
/// planner stops extending the equality prefix (a shorter prefix is still correct).
const INTERVALS_MAX: usize = 256;

// One per query plan, so a variant's size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Access {
    /// `reverse`: descending record order (`$natural: -1`).
    CollScan {
        reverse: bool,
    },
    /// `_id` equality: one lookup in the `_id_` index (MongoDB's IDHACK).
    IdPoint(Bson),
    IndexScan(IndexPlan),
}

#[derive(Clone, Debug)]
pub struct IndexPlan {
    pub index: IndexSpec,
    pub multikey: bool,
    pub intervals: Vec<IndexBounds>,
    /// Human-readable bounds per field, as explain shows them (`"[1, 1]"`).
    pub bounds_display: Document,
    pub reverse: bool,
    /// The index entries alone answer the query (see [`cover`]): no document is fetched.
    pub covered: bool,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub access: Access,
    /// The scan yields documents already in the requested sort order.
    pub provides_sort: bool,
}

impl Plan {
    pub fn coll_scan() -> Plan {
        Plan { access: Access::CollScan { reverse: false }, provides_sort: false }
    }
}

/// One value-space interval on a field.
#[derive(Clone, Debug)]
struct Interval {
    lo: Bound<Bson>,
    hi: Bound<Bson>,
}

impl Interval {
    fn point(v: Bson) -> Interval {
        Interval { lo: Bound::Included(v.clone()), hi: Bound::Included(v) }
    }
    fn is_point(&self) -> bool {
        matches!((&self.lo, &self.hi), (Bound::Included(a), Bound::Included(b)) if query::compare::cmp_bson(a, b).is_eq())
    }
}

/// What the filter says about one field: a union of point intervals, or one range.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
enum FieldPred {
    Points(Vec<Bson>),
    Range(Interval),
}

/// Values the planner can look up by equality. Arrays (element-or-whole matching), null
/// (matches missing and undefined too), regexes and operator documents are left to the filter.
fn point_value(v: &Bson) -> bool {
    match v {
        Bson::Array(_) | Bson::Null | Bson::Undefined | Bson::RegularExpression(_) => false,
        Bson::Document(d) => d.keys().next().map(|k| !k.starts_with('$')).unwrap_or(true),
        _ => true,
    }
}

/// The smallest value of the next canonical type, so a range on one type stays inside it
/// (MongoDB's type bracketing: `{$gt: 5}` matches only numbers).
fn type_upper(v: &Bson) -> Bound<Bson> {
    match v {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => Bound::Included(Bson::Double(f64::INFINITY)),
        Bson::String(_) | Bson::Symbol(_) => Bound::Excluded(Bson::Document(Document::new())),
        Bson::DateTime(_) => Bound::Included(Bson::DateTime(bson::DateTime::MAX)),
        _ => Bound::Unbounded,
    }
}

fn type_lower(v: &Bson) -> Bound<Bson> {
    match v {
        // NaN sorts below every other number.
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => Bound::Included(Bson::Double(f64::NAN)),
        Bson::String(_) | Bson::Symbol(_) => Bound::Included(Bson::String(String::new())),
        Bson::DateTime(_) => Bound::Included(Bson::DateTime(bson::DateTime::MIN)),
        _ => Bound::Unbounded,
    }
}

/// Collect per-field predicates from the top level of a filter (and of nested `$and`).
fn collect_preds(filter: &Document, out: &mut BTreeMap<String, Vec<FieldPred>>) {
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(children) = v {
                for c in children {
                    if let Bson::Document(c) = c {
                        collect_preds(c, out);
                    }
                }
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let preds = out.entry(k.clone()).or_default();
        match v {
            Bson::Document(ops) if ops.keys().next().map(|o| o.starts_with('$')).unwrap_or(false) => {
                for (op, arg) in ops {
                    match op.as_str() {
                        "$eq" if point_value(arg) => preds.push(FieldPred::Points(vec![arg.clone()])),
                        "$in" => {
                            if let Bson::Array(vals) = arg {
                                if !vals.is_empty() && vals.iter().all(point_value) {
                                    preds.push(FieldPred::Points(vals.clone()));
                                }
                            }
                        }
                        "$gt" | "$gte" if point_value(arg) => {
                            let lo = if op == "$gt" { Bound::Excluded(arg.clone()) } else { Bound::Included(arg.clone()) };
                            preds.push(FieldPred::Range(Interval { lo, hi: type_upper(arg) }));
                        }
                        "$lt" | "$lte" if point_value(arg) => {
                            let hi = if op == "$lt" { Bound::Excluded(arg.clone()) } else { Bound::Included(arg.clone()) };
                            preds.push(FieldPred::Range(Interval { lo: type_lower(arg), hi }));
                        }
                        _ => {}
                    }
                }
            }
            v if point_value(v) => preds.push(FieldPred::Points(vec![v.clone()])),
            _ => {}
        }
    }
}

/// Merge a field's predicates into one: points win (most selective); ranges intersect unless
/// the index is multikey on it.
fn merge(preds: &[FieldPred], multikey: bool) -> Option<FieldPred> {
    if let Some(p) = preds.iter().find(|p| matches!(p, FieldPred::Points(_))) {
        return Some(p.clone());
    }
    let mut ranges = preds.iter().filter_map(|p| match p {
        FieldPred::Range(r) => Some(r.clone()),
        FieldPred::Points(_) => None,
    });
    let mut acc = ranges.next()?;
    if multikey {
        return Some(FieldPred::Range(acc));
    }
    for r in ranges {
        acc.lo = max_lower(acc.lo, r.lo);
        acc.hi = min_upper(acc.hi, r.hi);
    }
    Some(FieldPred::Range(acc))
}

fn max_lower(a: Bound<Bson>, b: Bound<Bson>) -> Bound<Bson> {
    use std::cmp::Ordering::*;
    match (&a, &b) {
        (Bound::Unbounded, _) => b,
        (_, Bound::Unbounded) => a,
        (Bound::Included(x) | Bound::Excluded(x), Bound::Included(y) | Bound::Excluded(y)) => match query::compare::cmp_bson(x, y) {
            Greater => a,
            Less => b,
            Equal => {
                if matches!(a, Bound::Excluded(_)) {
                    a
                } else {
                    b
                }
            }
        },
    }
}

fn min_upper(a: Bound<Bson>, b: Bound<Bson>) -> Bound<Bson> {
    use std::cmp::Ordering::*;
    match (&a, &b) {
        (Bound::Unbounded, _) => b,
        (_, Bound::Unbounded) => a,
        (Bound::Included(x) | Bound::Excluded(x), Bound::Included(y) | Bound::Excluded(y)) => match query::compare::cmp_bson(x, y) {
            Less => a,
            Greater => b,
            Equal => {
                if matches!(a, Bound::Excluded(_)) {
                    a
                } else {
                    b
                }
            }
        },
    }
}

/// One field of an index key pattern, as the planner sees it.
struct KeyField {
    name: String,
    asc: bool,
    /// Stores the field's hash: only equality can use it, and its order is not value order.
    hashed: bool,
}

fn key_fields(spec: &IndexSpec) -> Vec<KeyField> {
    spec.key.iter().map(|(k, v)| KeyField { name: k.clone(), asc: !matches!(query_number(v), Some(n) if n < 0.0), hashed: storage::is_hashed(v) }).collect()
}

fn query_number(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(i) => Some(*i as f64),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(d) => Some(*d),
        _ => None,
    }
}

/// Index kinds the planner can scan: fields ordered by value or hashed (not text or geo).
fn is_plannable_index(spec: &IndexSpec) -> bool {
    spec.key.values().all(|v| query_number(v).is_some() || storage::is_hashed(v))
}

fn successor(mut b: Vec<u8>) -> Option<Vec<u8>> {
    while let Some(last) = b.last_mut() {
        if *last < 0xFF {
            *last += 1;
            return Some(b);
        }
        b.pop();
    }
    None
}

fn encode(v: &Bson, descending: bool) -> Vec<u8> {
    let mut out = Vec::new();
    storage::encode_component(v, descending, &mut out);
    out
}

/// Byte bounds of `prefix` followed by the value interval `iv` on a field of direction `asc`,
/// with any later key fields unconstrained. `None` when the range is empty.
fn byte_bounds(prefix: &[u8], iv: Option<&Interval>, asc: bool) -> Option<(Bound<Vec<u8>>, Bound<Vec<u8>>)> {
    let with = |b: &[u8]| {
        let mut k = prefix.to_vec();
        k.extend_from_slice(b);
        k
    };
    let (lo, hi) = match iv {
        None => (Bound::Unbounded, Bound::Unbounded),
        Some(iv) => {
            let enc = |b: &Bound<Bson>| match b {
                Bound::Unbounded => Bound::Unbounded,
                Bound::Included(v) => Bound::Included(encode(v, !asc)),
                Bound::Excluded(v) => Bound::Excluded(encode(v, !asc)),
            };
            // A descending component is complemented: the value range flips in byte order.
            if asc {
                (enc(&iv.lo), enc(&iv.hi))
            } else {
                (enc(&iv.hi), enc(&iv.lo))
            }
        }
    };
    // Later fields follow these bytes, so "key > x" means "key >= successor(x)" and
    // "key <= x" means "key < successor(x)".
    let lower = match lo {
        Bound::Unbounded if prefix.is_empty() => Bound::Unbounded,
        Bound::Unbounded => Bound::Included(prefix.to_vec()),
        Bound::Included(b) => Bound::Included(with(&b)),
        Bound::Excluded(b) => Bound::Included(successor(with(&b))?),
    };
    let upper = match hi {
        Bound::Unbounded => match successor(prefix.to_vec()) {
            Some(s) if !prefix.is_empty() => Bound::Excluded(s),
            _ => Bound::Unbounded,
        },
        Bound::Included(b) => match successor(with(&b)) {
            Some(s) => Bound::Excluded(s),
            None => Bound::Unbounded,
        },
        Bound::Excluded(b) => Bound::Excluded(with(&b)),
    };
    if let (Bound::Included(l), Bound::Excluded(u)) = (&lower, &upper) {
        if l >= u {
            return None;
        }
    }
    Some((lower, upper))
}

fn show_bound(b: &Bound<Bson>, lower: bool) -> String {
    match b {
        Bound::Unbounded if lower => "MinKey".into(),
        Bound::Unbounded => "MaxKey".into(),
        Bound::Included(v) | Bound::Excluded(v) => match v {
            Bson::String(s) => format!("\"{s}\""),
            Bson::Double(d) if d.is_infinite() => {
                if *d > 0.0 {
                    "inf.0".into()
                } else {
                    "-inf.0".into()
                }
            }
            Bson::Double(d) if d.is_nan() => "nan.0".into(),
            v => v.to_string(),
        },
    }
}

fn show_interval(iv: &Interval) -> String {
    let open = if matches!(iv.lo, Bound::Excluded(_)) { "(" } else { "[" };
    let close = if matches!(iv.hi, Bound::Excluded(_)) { ")" } else { "]" };
    format!("{open}{}, {}{close}", show_bound(&iv.lo, true), show_bound(&iv.hi, false))
}

/// Build the index plan for `spec` from the filter's predicates; `None` if it can't bound
/// the scan at all and is not forced (by hint or sort).
fn index_plan(spec: &IndexSpec, multikey: bool, preds: &BTreeMap<String, Vec<FieldPred>>, forced: bool) -> Option<(usize, IndexPlan)> {
    let fields = key_fields(spec);
    // Per field in key order: the intervals that bound it (points first, then one range).
    let mut per_field: Vec<Vec<Interval>> = Vec::new();
    let mut score = 0usize;
    let mut combos = 1usize;
    for field in &fields {
        let Some(p) = preds.get(&field.name).and_then(|ps| merge(ps, multikey)) else { break };
        match p {
            FieldPred::Points(vals) => {
                if combos.saturating_mul(vals.len()) > INTERVALS_MAX {
                    break;
                }
                combos *= vals.len();
                // A hashed field is looked up by the hash of each value (values equal by
                // comparison hash alike, numbers squash to one integer); the filter re-check
                // drops the rare collision.
                let mut vals = if field.hashed { vals.iter().map(|v| Bson::Int64(storage::hash_bson(v))).collect() } else { vals };
                vals.sort_by(query::compare::cmp_bson);
                vals.dedup_by(|a, b| query::compare::cmp_bson(a, b).is_eq());
                per_field.push(vals.into_iter().map(Interval::point).collect());
                score += 2;
            }
            // Hash order is not value order: a range cannot bound a hashed field.
            FieldPred::Range(_) if field.hashed => break,
            FieldPred::Range(r) => {
                per_field.push(vec![r]);
                score += 1;
                break;
            }
        }
    }
    if score == 0 && !forced {
        return None;
    }
    // Cartesian product of the per-field intervals, each turned into byte bounds.
    let mut prefixes: Vec<(Vec<u8>, Option<Interval>)> = vec![(Vec::new(), None)];
    for (i, ivs) in per_field.iter().enumerate() {
        let asc = fields[i].asc;
        let mut next = Vec::new();
        for (prefix, _) in &prefixes {
            for iv in ivs {
                if iv.is_point() {
                    let Bound::Included(v) = &iv.lo else { continue };
                    let mut p = prefix.clone();
                    storage::encode_component(v, !asc, &mut p);
                    next.push((p, None));
                } else {
                    next.push((prefix.clone(), Some(iv.clone())));
                }
            }
        }
        prefixes = next;
    }
    let range_field_asc = fields.get(per_field.len().saturating_sub(1)).map(|f| f.asc).unwrap_or(true);
    let mut intervals = Vec::new();
    for (prefix, range) in &prefixes {
        if let Some((lower, upper)) = byte_bounds(prefix, range.as_ref(), range_field_asc) {
            intervals.push(IndexBounds { lower, upper, reverse: false });
        }
    }
    // Byte order of the intervals follows value order only for ascending fields; sort them
    // so a forward scan visits them in key order.
    intervals.sort_by_key(|iv| bound_key(&iv.lower));
    let mut bounds_display = Document::new();
    for (i, field) in fields.iter().enumerate() {
        let shown: Vec<Bson> = match per_field.get(i) {
            Some(ivs) => {
                let mut s: Vec<String> = ivs.iter().map(show_interval).collect();
                if !field.asc {
                    s.reverse();
                }
                s.into_iter().map(Bson::String).collect()
            }
            None => vec![Bson::String(if field.asc { "[MinKey, MaxKey]".into() } else { "[MaxKey, MinKey]".into() })],
        };
        bounds_display.insert(field.name.clone(), shown);
    }
    Some((score, IndexPlan { index: spec.clone(), multikey, intervals, bounds_display, reverse: false, covered: false }))
}

fn bound_key(b: &Bound<Vec<u8>>) -> Vec<u8> {
    match b {
        Bound::Unbounded => Vec::new(),
        Bound::Included(v) | Bound::Excluded(v) => v.clone(),
    }
}

/// Does scanning `spec` (forward, or reversed) yield `sort` order, given that the first
/// `eq_prefix` fields are pinned to single values?
fn sort_direction(spec: &IndexSpec, eq_prefix: usize, sort: &SortSpec) -> Option<bool> {
    let fields = key_fields(spec);
    let wanted = sort.fields();
    if wanted.is_empty() || fields.len() < eq_prefix + wanted.len() {
        return None;
    }
    let rest = &fields[eq_prefix..eq_prefix + wanted.len()];
    if rest.iter().any(|f| f.hashed) {
        return None;
    }
    let same = rest.iter().zip(&wanted).all(|(f, (w, b))| &f.name == w && f.asc == *b);
    let flipped = rest.iter().zip(&wanted).all(|(f, (w, b))| &f.name == w && f.asc != *b);
    if same {
        Some(false)
    } else if flipped {
        Some(true)
    } else {
        None
    }
}

/// Number of leading index fields pinned to exactly one value by the plan.
fn single_point_prefix(plan: &IndexPlan, preds: &BTreeMap<String, Vec<FieldPred>>) -> usize {
    let mut n = 0;
    for field in key_fields(&plan.index) {
        match preds.get(&field.name).and_then(|p| merge(p, plan.multikey)) {
            Some(FieldPred::Points(v)) if v.len() == 1 => n += 1,
            _ => break,
        }
    }
    n
}

/// Indexes the planner may pick without a hint: a sparse index lacks entries for some
/// documents, so only a hint may choose it; a partial index, when the query's filter implies
/// the index's filter (every document the query wants has an entry).
fn unhinted_candidates<'a>(snapshot: &'a Snapshot, filter: &'a Document) -> impl Iterator<Item = &'a IndexSpec> {
    snapshot.indexes().filter(|i| is_plannable_index(i) && !i.sparse && i.partial_filter.as_ref().is_none_or(|p| filter_implies(filter, p)))
}

/// Whether every document `query` matches also matches `partial` (a partial index's filter:
/// equalities, comparisons and `$exists: true`, joined by `$and`), judged conservatively:
/// each of its conditions must follow from one of the query's top-level conditions on the
/// same field.
fn filter_implies(query: &Document, partial: &Document) -> bool {
    conjuncts(partial).iter().all(|(field, cond)| conjuncts(query).iter().any(|(f, q)| f == field && condition_implies(q, cond)))
}

/// A filter's top-level conditions, `$and`s flattened: (field, condition) pairs.
fn conjuncts(filter: &Document) -> Vec<(String, Bson)> {
    let mut out = Vec::new();
    for (k, v) in filter {
        match (k.as_str(), v) {
            ("$and", Bson::Array(items)) => out.extend(items.iter().filter_map(Bson::as_document).flat_map(conjuncts)),
            (k, _) if k.starts_with('$') => out.push((k.to_string(), Bson::Null)), // implies nothing
            (_, Bson::Document(d)) if d.keys().next().is_some_and(|o| o.starts_with('$')) => {
                out.extend(d.iter().map(|(op, arg)| (k.clone(), Bson::Document(bson::doc! {op.clone(): arg.clone()}))));
            }
            _ => out.push((k.clone(), Bson::Document(bson::doc! {"$eq": v.clone()}))),
        }
    }
    out
}

/// Whether condition `q` (`{$op: value}`) on a field implies condition `p` on it.
fn condition_implies(q: &Bson, p: &Bson) -> bool {
    use query::compare::cmp_bson;
    let (Some(q), Some(p)) = (q.as_document().and_then(|d| d.iter().next()), p.as_document().and_then(|d| d.iter().next())) else { return false };
    let ((qop, qv), (pop, pv)) = ((q.0.as_str(), q.1), (p.0.as_str(), p.1));
    // Comparisons hold only within one type bracket, as the query language compares.
    let same_type = query::compare::canonical_rank(qv) == query::compare::canonical_rank(pv);
    let non_null = !matches!(qv, Bson::Null | Bson::Undefined);
    match (pop, qop) {
        ("$exists", _) if pv.as_bool() == Some(true) || common::value::as_i64(pv).is_some_and(|n| n != 0) => match qop {
            "$eq" | "$gt" | "$gte" | "$lt" | "$lte" => non_null,
            "$exists" => qv.as_bool() == Some(true),
            "$type" => true,
            _ => false,
        },
        ("$eq", "$eq") => cmp_bson(qv, pv).is_eq() && same_type,
        ("$gt", "$eq" | "$gt") => same_type && cmp_bson(qv, pv).is_gt() || (qop == "$gt" && same_type && cmp_bson(qv, pv).is_eq()),
        ("$gt", "$gte") => same_type && cmp_bson(qv, pv).is_gt(),
        ("$gte", "$eq" | "$gt" | "$gte") => same_type && cmp_bson(qv, pv).is_ge(),
        ("$lt", "$eq" | "$lt") => same_type && cmp_bson(qv, pv).is_lt() || (qop == "$lt" && same_type && cmp_bson(qv, pv).is_eq()),
        ("$lt", "$lte") => same_type && cmp_bson(qv, pv).is_lt(),
        ("$lte", "$eq" | "$lt" | "$lte") => same_type && cmp_bson(qv, pv).is_le(),
        _ => false,
    }
}

/// Choose how to read the documents matching `filter` (optionally in `sort` order).
pub fn choose(filter: &Document, sort: Option<&SortSpec>, snapshot: &Snapshot, hint: Option<&Bson>, id_point: Option<&Bson>) -> Result<Plan> {
    let mut preds = BTreeMap::new();
    collect_preds(filter, &mut preds);
    let sort = sort.filter(|s| !s.is_empty());
    let multikey = |name: &str| snapshot.index_is_multikey(name).unwrap_or(true);

    // An explicit hint decides.
    if let Some(h) = hint {
        let spec = match h {
            Bson::Document(d) if d.is_empty() => None,
            Bson::Document(d) if d.contains_key("$natural") => {
                let reverse = d.get("$natural").and_then(common::value::as_i64).is_some_and(|n| n < 0);
                // Asked as a sort ({$natural: ±1} with no other key), record order is the order.
                return Ok(Plan { access: Access::CollScan { reverse }, provides_sort: sort.is_none() });
            }
            Bson::Document(d) => Some(snapshot.indexes().find(|i| &i.key == d)),
            Bson::String(s) => Some(snapshot.indexes().find(|i| &i.name == s)),
            _ => None,
        };
        if let Some(spec) = spec {
            let spec = spec.ok_or_else(|| {
                Error::bad_value("error processing query: planner returned error :: caused by :: hint provided does not correspond to an existing index")
            })?;
            if !is_plannable_index(spec) {
                return Err(Error::new(Code::BadValue, format!("hint: index {} cannot be scanned by shoal yet", spec.name)));
            }
            let (_, mut p) = index_plan(spec, multikey(&spec.name), &preds, true).expect("forced plans always exist");
            let mut provides_sort = false;
            if let Some(sort) = sort {
                if !p.multikey {
                    if let Some(rev) = sort_direction(spec, single_point_prefix(&p, &preds), sort) {
                        p.reverse = rev;
                        provides_sort = true;
                    }
                }
            }
            return Ok(Plan { access: Access::IndexScan(p), provides_sort });
        }
    }

    // Collections without an `_id` index (the oplog) have no IDHACK.
    if let Some(id) = id_point.filter(|_| snapshot.index_spec("_id_").is_some()) {
        return Ok(Plan { access: Access::IdPoint(id.clone()), provides_sort: true });
    }

    let mut best: Option<(usize, IndexPlan, bool)> = None;
    for spec in unhinted_candidates(snapshot, filter) {
        let mk = multikey(&spec.name);
        let Some((score, mut p)) = index_plan(spec, mk, &preds, false) else { continue };
        let mut sorted = false;
        if let Some(sort) = sort {
            if !mk {
                if let Some(rev) = sort_direction(spec, single_point_prefix(&p, &preds), sort) {
                    p.reverse = rev;
                    sorted = true;
                }
            }
        }
        // More bounded fields first; then one that also provides the sort; then unique.
        let better = match &best {
            None => true,
            Some((s, bp, bs)) => {
                (score, sorted, spec.unique, std::cmp::Reverse(spec.key.len())) > (*s, *bs, bp.index.unique, std::cmp::Reverse(bp.index.key.len()))
            }
        };
        if better {
            best = Some((score, p, sorted));
        }
    }
    if let Some((_, p, sorted)) = best {
        return Ok(Plan { access: Access::IndexScan(p), provides_sort: sorted });
    }
    // No index bounds the filter: an index may still spare a blocking sort.
    if let Some(sort) = sort {
        for spec in unhinted_candidates(snapshot, filter) {
            if multikey(&spec.name) {
                continue;
            }
            if let Some(rev) = sort_direction(spec, 0, sort) {
                let (_, mut p) = index_plan(spec, false, &preds, true).expect("forced plans always exist");
                p.reverse = rev;
                return Ok(Plan { access: Access::IndexScan(p), provides_sort: true });
            }
        }
    }
    Ok(Plan::coll_scan())
}

/// Fields named by a filter, or `None` if it has top-level operators other than `$and`
/// (`$or`, `$expr`, ...) that a covered plan does not try to see through.
fn filter_fields(filter: &Document, out: &mut Vec<String>) -> Option<()> {
    for (k, v) in filter {
        match (k.as_str(), v) {
            ("$and", Bson::Array(children)) => {
                for c in children {
                    filter_fields(c.as_document()?, out)?;
                }
            }
            (k, _) if k.starts_with('$') => return None,
            (k, _) => out.push(k.to_string()),
        }
    }
    Some(())
}

/// Whether a predicate proves the field exists with a non-null value in every match.
/// Points never hold null; a range does unless it reaches MinKey or MaxKey, which compare
/// across types (`{$gt: MinKey}` matches null and missing).
fn proves_value(pred: &FieldPred) -> bool {
    match pred {
        FieldPred::Points(_) => true,
        FieldPred::Range(iv) => {
            ![&iv.lo, &iv.hi].iter().any(|b| matches!(b, Bound::Included(Bson::MinKey | Bson::MaxKey) | Bound::Excluded(Bson::MinKey | Bson::MaxKey)))
        }
    }
}

/// Mark an index plan covered (MongoDB's covered query: IXSCAN without FETCH) when its
/// entries can stand in for the documents. Each field the filter names and each field the
/// projection returns (`projected`) must be a key field whose value the filter proves present
/// and non-null: a missing field is indexed as null, so without that proof the entry cannot
/// tell `{a: null}` from a missing `a`. Multikey entries hold array elements and hashed ones
/// hold hashes, not values. Any sort must come from the index itself.
pub fn cover(plan: &mut Plan, filter: &Document, projected: &[String], sort: Option<&SortSpec>) {
    let provides_sort = plan.provides_sort;
    let Access::IndexScan(p) = &mut plan.access else { return };
    if p.multikey || projected.is_empty() || (sort.is_some_and(|s| !s.is_empty()) && !provides_sort) {
        return;
    }
    let fields = key_fields(&p.index);
    if fields.iter().any(|f| f.hashed) {
        return;
    }
    let mut named = projected.to_vec();
    if filter_fields(filter, &mut named).is_none() {
        return;
    }
    let mut preds = BTreeMap::new();
    collect_preds(filter, &mut preds);
    let proven = |name: &String| preds.get(name).is_some_and(|ps: &Vec<FieldPred>| ps.iter().any(proves_value));
    p.covered = named.iter().all(|n| fields.iter().any(|f| &f.name == n) && proven(n));
}

#[cfg(test)]
mod tests {
    use super::filter_implies;
    use bson::doc;

    #[test]
    fn a_query_implies_a_partial_filter_only_when_it_must() {
        let partial = doc! {"status": "A", "qty": {"$gte": 10}};
        assert!(filter_implies(&doc! {"status": "A", "qty": {"$gt": 20}}, &partial));
        assert!(filter_implies(&doc! {"$and": [{"status": "A"}, {"qty": 10}]}, &partial));
        assert!(!filter_implies(&doc! {"status": "A", "qty": {"$gt": 5}}, &partial));
        assert!(!filter_implies(&doc! {"status": "A"}, &partial));
        assert!(!filter_implies(&doc! {"status": "B", "qty": 50}, &partial));
        assert!(!filter_implies(&doc! {"status": "A", "qty": "50"}, &partial), "another type bracket");
        let exists = doc! {"email": {"$exists": true}};
        assert!(filter_implies(&doc! {"email": "a@b"}, &exists));
        assert!(!filter_implies(&doc! {"email": null}, &exists));
        assert!(filter_implies(&doc! {"email": {"$gt": "a"}}, &exists));
        assert!(!filter_implies(&doc! {"$or": [{"email": "a"}]}, &exists));
        assert!(filter_implies(&doc! {"a": {"$lt": 3}}, &doc! {"a": {"$lte": 3}}));
        assert!(!filter_implies(&doc! {"a": {"$lte": 3}}, &doc! {"a": {"$lt": 3}}));
    }
}
