//! Aggregation pipeline over a stream of documents. Stages needing storage ($lookup, $out,
//! ...) are returned as `Stage::External` for the server to handle.

use crate::compare::cmp_bson;
use crate::expr::Expr;
use crate::filter::{Filter, MatchDetails};
use crate::num::{ArithOp, DecPrecision, Num};
use crate::projection::{AddFields, Projection};
use crate::sort::SortSpec;
use bson::{Bson, Document};
use common::{Code, Error, Result};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Default memory budget of blocking stages ($group, $sort): MongoDB's 100 MiB.
pub const MEM_LIMIT_BYTES_DEFAULT: usize = 100 * 1024 * 1024;
/// Largest `$sample` size honoured in one pass (bounded by the input anyway).
const SAMPLE_SIZE_MAX: usize = 16 * 1024 * 1024;

#[derive(Clone, Debug)]
pub struct Pipeline {
    pub stages: Vec<Stage>,
}

#[derive(Clone, Debug)]
pub enum Stage {
    /// The parsed filter and its source document (for `leading_match`).
    Match(Filter, Document),
    Project(Projection),
    AddFields(AddFields),
    Unset(Projection),
    /// `limit` is set when a following `$limit` lets the sort keep only the top k.
    Sort {
        spec: SortSpec,
        limit: Option<u64>,
    },
    Limit(u64),
    Skip(u64),
    Group(Group),
    Count(String),
    Unwind(Unwind),
    ReplaceRoot(Expr),
    SortByCount(Expr),
    Sample(u64),
    Facet(Vec<(String, Pipeline)>),
    Bucket(Bucket),
    Documents(Vec<Document>),
    /// A stage the server must run: name and argument. Non-document arguments
    /// (`{$out: "coll"}`) are given as the whole stage document.
    External(String, Document),
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub allow_disk_use: bool,
    pub mem_limit_bytes: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { allow_disk_use: false, mem_limit_bytes: MEM_LIMIT_BYTES_DEFAULT }
    }
}

#[derive(Clone, Debug)]
pub struct Group {
    id: GroupId,
    fields: Vec<(String, AccSpec)>,
}

#[derive(Clone, Debug)]
enum GroupId {
    Expr(Expr),
}

#[derive(Clone, Debug)]
struct AccSpec {
    op: AccOp,
    arg: Expr,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum AccOp {
    Num(AccKind),
    First,
    Last,
    Push,
    AddToSet,
    MergeObjects,
    Count,
}

#[derive(Clone, Debug)]
pub struct Unwind {
    path: Vec<String>,
    include_array_index: Option<String>,
    preserve: bool,
}

#[derive(Clone, Debug)]
pub struct Bucket {
    group_by: Expr,
    boundaries: Vec<Bson>,
    default: Option<Bson>,
    output: Vec<(String, AccSpec)>,
}

fn loc(code: i32, msg: impl Into<String>) -> Error {
    Error::location(code, msg)
}

fn tname(v: &Bson) -> &'static str {
    crate::expr::type_name(Some(v))
}

const EXTERNAL_STAGES: &[&str] = &[
    "$changeStreamSplitLargeEvent",
    "$lookup",
    "$graphLookup",
    "$unionWith",
    "$out",
    "$merge",
    "$collStats",
    "$indexStats",
    "$currentOp",
    "$listSessions",
    "$listLocalSessions",
    "$changeStream",
    "$planCacheStats",
    "$geoNear",
    "$search",
    "$searchMeta",
    "$listSearchIndexes",
    "$listCatalog",
    "$shardedDataDistribution",
    "$vectorSearch",
];

const UNSUPPORTED_STAGES: &[&str] = &["$redact", "$bucketAuto", "$setWindowFields", "$densify", "$fill"];

impl Pipeline {
    pub fn parse(stages: &[Document]) -> Result<Pipeline> {
        let mut out: Vec<Stage> = Vec::with_capacity(stages.len());
        for (i, s) in stages.iter().enumerate() {
            let stage = parse_stage(s, i == 0)?;
            // $sort followed by $limit keeps only the top k while sorting.
            if let Stage::Limit(n) = stage {
                if let Some(Stage::Sort { limit, .. }) = out.last_mut() {
                    *limit = Some(limit.map_or(n, |l| l.min(n)));
                }
            }
            out.push(stage);
        }
        Ok(Pipeline { stages: out })
    }

    pub fn run(&self, input: &mut dyn Iterator<Item = Result<Document>>, opts: &RunOptions) -> Result<Vec<Document>> {
        self.run_interruptible(input, opts, &|| Ok(()))
    }

    /// `run`, calling `interrupt` every `INTERRUPT_CHECK_DOCS` documents that flow out of each
    /// stage, so maxTimeMS and killOp stop a pipeline that computes without reading input.
    pub fn run_interruptible(
        &self,
        input: &mut dyn Iterator<Item = Result<Document>>,
        opts: &RunOptions,
        interrupt: &dyn Fn() -> Result<()>,
    ) -> Result<Vec<Document>> {
        let mut stream: Box<dyn Iterator<Item = Result<Document>> + '_> = Box::new(input);
        for stage in &self.stages {
            let checked = Interruptible { inner: stream, interrupt, seen: 0, failed: false };
            stream = apply_stage(stage, Box::new(checked), opts)?;
        }
        Interruptible { inner: stream, interrupt, seen: 0, failed: false }.collect()
    }

    /// If the first stage(s) are $match, their combined filter document.
    pub fn leading_match(&self) -> Option<Document> {
        let filters: Vec<&Document> = self
            .stages
            .iter()
            .map_while(|s| match s {
                Stage::Match(_, d) => Some(d),
                _ => None,
            })
            .collect();
        match filters.len() {
            0 => None,
            1 => Some(filters[0].clone()),
            _ => Some(bson::doc! {"$and": filters.iter().map(|d| Bson::Document((*d).clone())).collect::<Vec<_>>()}),
        }
    }
}

const INTERRUPT_CHECK_DOCS: u32 = 1024;

struct Interruptible<'a, I> {
    inner: I,
    interrupt: &'a dyn Fn() -> Result<()>,
    seen: u32,
    failed: bool,
}

impl<I: Iterator<Item = Result<Document>>> Iterator for Interruptible<'_, I> {
    type Item = Result<Document>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        self.seen = self.seen.wrapping_add(1);
        if self.seen.is_multiple_of(INTERRUPT_CHECK_DOCS) {
            if let Err(e) = (self.interrupt)() {
                self.failed = true;
                return Some(Err(e));
            }
        }
        self.inner.next()
    }
}

fn parse_stage(s: &Document, first: bool) -> Result<Stage> {
    if s.len() != 1 {
        return Err(loc(40323, "A pipeline stage specification object must contain exactly one field."));
    }
    let Some((name, v)) = s.iter().next() else {
        return Err(loc(40323, "A pipeline stage specification object must contain exactly one field."));
    };
    let name = name.as_str();
    if EXTERNAL_STAGES.contains(&name) {
        let spec = match v {
            Bson::Document(d) => d.clone(),
            _ => s.clone(),
        };
        return Ok(Stage::External(name.to_string(), spec));
    }
    if UNSUPPORTED_STAGES.contains(&name) {
        return Err(Error::new(Code::NotImplemented, format!("{name} is not supported by shoal")));
    }
    Ok(match name {
        "$match" => {
            let Bson::Document(d) = v else {
                return Err(loc(15959, "the match filter must be an expression in an object"));
            };
            Stage::Match(Filter::parse(d)?, d.clone())
        }
        "$project" => {
            let Bson::Document(d) = v else {
                return Err(loc(15969, "$project specification must be an object"));
            };
            if d.is_empty() {
                return Err(loc(51272, "Invalid $project :: caused by :: projection specification must have at least one field"));
            }
            Stage::Project(Projection::parse_agg(d)?)
        }
        "$addFields" | "$set" => {
            let Bson::Document(d) = v else {
                return Err(loc(40272, format!("{name} specification stage must be an object, got {}", tname(v))));
            };
            Stage::AddFields(AddFields::parse(d)?)
        }
        "$unset" => {
            let paths: Vec<String> = match v {
                Bson::String(p) => vec![p.clone()],
                Bson::Array(items) => {
                    if items.is_empty() {
                        return Err(loc(31119, "$unset specification must be a string or an array with at least one field"));
                    }
                    items
                        .iter()
                        .map(|i| match i {
                            Bson::String(p) => Ok(p.clone()),
                            _ => Err(loc(31120, "$unset specification must be a string or an array containing only string values")),
                        })
                        .collect::<Result<_>>()?
                }
                _ => return Err(loc(31002, "$unset specification must be a string or an array")),
            };
            Stage::Unset(Projection::exclusion_of(&paths)?)
        }
        "$sort" => {
            let Bson::Document(d) = v else {
                return Err(loc(15973, "the $sort key specification must be an object"));
            };
            if d.is_empty() {
                return Err(loc(15976, "$sort stage must have at least one sort key"));
            }
            Stage::Sort { spec: SortSpec::parse(d)?, limit: None }
        }
        "$limit" => {
            let n = Num::from_bson(v).ok_or_else(|| loc(15957, "the limit must be specified as a number"))?;
            let n = n
                .as_exact_i64()
                .ok_or_else(|| Error::bad_value(format!("invalid argument to $limit stage: Cannot represent as a 64-bit integer: $limit: {v}")))?;
            if n <= 0 {
                return Err(loc(15958, "the limit must be positive"));
            }
            Stage::Limit(n as u64)
        }
        "$skip" => {
            let n = Num::from_bson(v).ok_or_else(|| loc(15972, "Argument to $skip must be a number"))?;
            let n = n
                .as_exact_i64()
                .ok_or_else(|| Error::bad_value(format!("invalid argument to $skip stage: Cannot represent as a 64-bit integer: $skip: {v}")))?;
            if n < 0 {
                return Err(loc(15956, "Argument to $skip cannot be negative"));
            }
            Stage::Skip(n as u64)
        }
        "$count" => {
            let Bson::String(f) = v else {
                return Err(loc(40156, "the count field must be a non-empty string"));
            };
            if f.is_empty() {
                return Err(loc(40156, "the count field must be a non-empty string"));
            }
            if f.starts_with('$') {
                return Err(loc(40158, "the count field cannot be a $-prefixed path"));
            }
            if f.contains('.') {
                return Err(loc(40160, "the count field cannot contain '.'"));
            }
            Stage::Count(f.clone())
        }
        "$group" => Stage::Group(parse_group(v)?),
        "$unwind" => Stage::Unwind(parse_unwind(v)?),
        "$replaceRoot" => {
            let Bson::Document(d) = v else {
                return Err(loc(40229, format!("expected an object as specification for $replaceRoot stage, got {}", tname(v))));
            };
            let mut new_root = None;
            for (k, val) in d {
                if k == "newRoot" {
                    new_root = Some(val);
                } else {
                    return Err(Error::new(Code::IDLUnknownField, format!("BSON field '$replaceRoot.{k}' is an unknown field.")));
                }
            }
            let nr = new_root.ok_or_else(|| loc(40231, "no newRoot specified for the $replaceRoot stage"))?;
            Stage::ReplaceRoot(Expr::parse(nr)?)
        }
        "$replaceWith" => Stage::ReplaceRoot(Expr::parse(v)?),
        "$sortByCount" => {
            let ok = matches!(v, Bson::String(s) if s.starts_with('$'))
                || matches!(v, Bson::Document(d) if d.len() == 1 && d.keys().next().is_some_and(|k| k.starts_with('$')));
            if !ok {
                return Err(loc(40148, "the sortByCount field must be defined as a $-prefixed path or an expression"));
            }
            Stage::SortByCount(Expr::parse(v)?)
        }
        "$sample" => {
            let Bson::Document(d) = v else {
                return Err(loc(28745, "the $sample stage specification must be an object"));
            };
            let mut size = None;
            for (k, val) in d {
                if k != "size" {
                    return Err(loc(28748, format!("unrecognized option to $sample: {k}")));
                }
                let n = Num::from_bson(val).ok_or_else(|| loc(28746, "size argument to $sample must be a number"))?;
                let f = n.to_f64();
                if f < 0.0 {
                    return Err(loc(28747, "size argument to $sample must not be negative"));
                }
                size = Some(f.min(u64::MAX as f64) as u64);
            }
            Stage::Sample(size.ok_or_else(|| loc(28749, "$sample stage must specify a size"))?)
        }
        "$facet" => {
            let Bson::Document(d) = v else {
                return Err(loc(15947, "the $facet specification must be an object"));
            };
            if d.is_empty() {
                return Err(loc(40169, "the $facet specification must be a non-empty object"));
            }
            let mut facets = Vec::with_capacity(d.len());
            for (k, val) in d {
                let Bson::Array(items) = val else {
                    return Err(loc(40170, format!("arguments to $facet must be arrays, {k} is type {}", tname(val))));
                };
                let mut docs = Vec::with_capacity(items.len());
                for item in items {
                    let Bson::Document(sd) = item else {
                        return Err(loc(
                            40171,
                            format!("subpipeline in $facet stage specification must contain only objects containing exactly one field, {k} is {}", tname(item)),
                        ));
                    };
                    if let Some(n) = sd.keys().next() {
                        if matches!(
                            n.as_str(),
                            "$facet" | "$out" | "$merge" | "$collStats" | "$indexStats" | "$changeStream" | "$currentOp" | "$geoNear" | "$documents"
                        ) {
                            return Err(loc(40600, format!("{n} is not allowed to be used within a $facet stage")));
                        }
                    }
                    docs.push(sd.clone());
                }
                let sub = Pipeline::parse(&docs)?;
                if let Some(Stage::External(n, _)) = sub.stages.iter().find(|s| matches!(s, Stage::External(..))) {
                    return Err(Error::new(Code::NotImplemented, format!("{n} inside $facet is not supported by shoal")));
                }
                facets.push((k.clone(), sub));
            }
            Stage::Facet(facets)
        }
        "$bucket" => Stage::Bucket(parse_bucket(v)?),
        "$documents" => {
            if !first {
                return Err(loc(40602, "$documents is only valid as the first stage in a pipeline"));
            }
            let val = Expr::parse(v)?.eval(&Document::new())?;
            let Some(Bson::Array(items)) = val else {
                return Err(loc(5858203, "error during lookup :: caused by :: $documents requires an array of objects"));
            };
            let docs = items
                .into_iter()
                .map(|i| match i {
                    Bson::Document(d) => Ok(d),
                    _ => Err(loc(40228, "$documents requires an array of objects")),
                })
                .collect::<Result<Vec<_>>>()?;
            Stage::Documents(docs)
        }
        _ => return Err(loc(40324, format!("Unrecognized pipeline stage name: '{name}'"))),
    })
}

fn parse_acc(field: &str, v: &Bson) -> Result<AccSpec> {
    let Bson::Document(d) = v else {
        return Err(loc(40234, format!("The field '{field}' must be an accumulator object")));
    };
    if d.len() != 1 {
        return Err(loc(40238, format!("The field '{field}' must specify one accumulator")));
    }
    let Some((op, arg)) = d.iter().next() else {
        return Err(loc(40238, format!("The field '{field}' must specify one accumulator")));
    };
    let acc = match op.as_str() {
        "$sum" => AccOp::Num(AccKind::Sum),
        "$avg" => AccOp::Num(AccKind::Avg),
        "$min" => AccOp::Num(AccKind::Min),
        "$max" => AccOp::Num(AccKind::Max),
        "$stdDevPop" => AccOp::Num(AccKind::StdDevPop),
        "$stdDevSamp" => AccOp::Num(AccKind::StdDevSamp),
        "$first" => AccOp::First,
        "$last" => AccOp::Last,
        "$push" => AccOp::Push,
        "$addToSet" => AccOp::AddToSet,
        "$mergeObjects" => AccOp::MergeObjects,
        "$count" => {
            if !matches!(arg, Bson::Document(a) if a.is_empty()) {
                return Err(Error::type_mismatch("$count takes no arguments, i.e. $count:{}"));
            }
            AccOp::Count
        }
        "$top" | "$bottom" | "$topN" | "$bottomN" | "$firstN" | "$lastN" | "$maxN" | "$minN" | "$accumulator" | "$median" | "$percentile" => {
            return Err(Error::new(Code::NotImplemented, format!("accumulator {op} is not supported by shoal")))
        }
        _ => return Err(loc(15952, format!("unknown group operator '{op}'"))),
    };
    if matches!(arg, Bson::Array(_)) && acc != AccOp::Count {
        return Err(loc(40237, format!("The {op} accumulator is a unary operator")));
    }
    let arg = if acc == AccOp::Count { Expr::parse(&Bson::Int32(1))? } else { Expr::parse(arg)? };
    Ok(AccSpec { op: acc, arg })
}

fn parse_group(v: &Bson) -> Result<Group> {
    let Bson::Document(d) = v else {
        return Err(loc(15947, "a group's fields must be specified in an object"));
    };
    let mut id = None;
    let mut fields = Vec::new();
    for (k, val) in d {
        if k == "_id" {
            id = Some(Expr::parse(val)?);
            continue;
        }
        if k.starts_with('$') {
            return Err(loc(40236, format!("The field name '{k}' cannot be an operator name")));
        }
        if k.contains('.') {
            return Err(loc(40235, format!("The field name '{k}' cannot contain '.'")));
        }
        fields.push((k.clone(), parse_acc(k, val)?));
    }
    let id = id.ok_or_else(|| loc(15955, "a group specification must include an _id"))?;
    Ok(Group { id: GroupId::Expr(id), fields })
}

fn parse_unwind(v: &Bson) -> Result<Unwind> {
    let (path, idx, preserve) = match v {
        Bson::String(p) => (p.clone(), None, false),
        Bson::Document(d) => {
            let mut path = None;
            let mut idx = None;
            let mut preserve = false;
            for (k, val) in d {
                match k.as_str() {
                    "path" => match val {
                        Bson::String(p) => path = Some(p.clone()),
                        other => return Err(loc(28808, format!("expected a string as the path for $unwind stage, got {}", tname(other)))),
                    },
                    "includeArrayIndex" => match val {
                        Bson::String(p) => {
                            if p.is_empty() {
                                return Err(loc(28810, "includeArrayIndex option to $unwind stage should not be empty"));
                            }
                            if p.starts_with('$') {
                                return Err(loc(28822, format!("includeArrayIndex option to $unwind stage should not be prefixed with a '$': {p}")));
                            }
                            idx = Some(p.clone());
                        }
                        other => {
                            return Err(loc(
                                28810,
                                format!("expected a non-empty string for the includeArrayIndex  option to $unwind stage, got {}", tname(other)),
                            ))
                        }
                    },
                    "preserveNullAndEmptyArrays" => match val {
                        Bson::Boolean(b) => preserve = *b,
                        other => {
                            return Err(loc(
                                28809,
                                format!("expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage, got {}", tname(other)),
                            ))
                        }
                    },
                    other => return Err(loc(28811, format!("unrecognized option to $unwind stage: {other}"))),
                }
            }
            (path.ok_or_else(|| loc(28812, "no path specified to $unwind stage"))?, idx, preserve)
        }
        other => return Err(loc(15981, format!("expected either a string or an object as specification for $unwind stage, got {}", tname(other)))),
    };
    let Some(p) = path.strip_prefix('$') else {
        return Err(loc(28818, format!("path option to $unwind stage should be prefixed with a '$': {path}")));
    };
    let parts: Vec<String> = p.split('.').map(str::to_string).collect();
    if parts.iter().any(|x| x.is_empty() || x.starts_with('$')) {
        return Err(loc(28818, format!("path option to $unwind stage is invalid: {path}")));
    }
    Ok(Unwind { path: parts, include_array_index: idx, preserve })
}

fn parse_bucket(v: &Bson) -> Result<Bucket> {
    let Bson::Document(d) = v else {
        return Err(loc(40201, format!("Argument to $bucket stage must be an object, but found type: {}", tname(v))));
    };
    let (mut group_by, mut boundaries, mut default, mut output) = (None, None, None, None);
    for (k, val) in d {
        match k.as_str() {
            "groupBy" => {
                let ok = matches!(val, Bson::String(s) if s.starts_with('$')) || matches!(val, Bson::Document(_));
                if !ok {
                    return Err(loc(40202, format!("The $bucket 'groupBy' field must be defined as a $-prefixed path or an expression, but found: {val}")));
                }
                group_by = Some(Expr::parse(val)?);
            }
            "boundaries" => match val {
                Bson::Array(items) => boundaries = Some(items.clone()),
                other => return Err(loc(40200, format!("The $bucket 'boundaries' field must be an array, but found type: {}", tname(other)))),
            },
            "default" => default = Some(val.clone()),
            "output" => match val {
                Bson::Document(od) => {
                    let mut fields = Vec::new();
                    for (ok, ov) in od {
                        fields.push((ok.clone(), parse_acc(ok, ov)?));
                    }
                    output = Some(fields);
                }
                other => return Err(loc(40196, format!("The $bucket 'output' field must be an object, but found type: {}", tname(other)))),
            },
            other => return Err(loc(40197, format!("Unrecognized option to $bucket: {other}."))),
        }
    }
    let (Some(group_by), Some(boundaries)) = (group_by, boundaries) else {
        return Err(loc(40198, "$bucket requires 'groupBy' and 'boundaries' to be specified."));
    };
    if boundaries.len() < 2 {
        return Err(loc(40192, format!("The $bucket 'boundaries' field must have at least 2 values, but found {} value(s).", boundaries.len())));
    }
    for w in boundaries.windows(2) {
        if crate::compare::canonical_rank(&w[0]) != crate::compare::canonical_rank(&w[1]) {
            return Err(loc(
                40193,
                format!(
                    "All values in the the 'boundaries' option to $bucket must have the same type. Found conflicting types {} and {}.",
                    tname(&w[0]),
                    tname(&w[1])
                ),
            ));
        }
        if cmp_bson(&w[0], &w[1]) != Ordering::Less {
            return Err(loc(40194, format!("The 'boundaries' option to $bucket must be sorted in ascending order, but elements {} and {} are not in ascending order ({} is not less than {}).", 0, 1, w[0], w[1])));
        }
    }
    if let Some(def) = &default {
        let lo = &boundaries[0];
        let hi = &boundaries[boundaries.len() - 1];
        let same_type = crate::compare::canonical_rank(def) == crate::compare::canonical_rank(lo);
        if same_type && cmp_bson(def, lo) != Ordering::Less && cmp_bson(def, hi) == Ordering::Less {
            return Err(loc(40199, "The $bucket 'default' field must be less than the lowest boundary or greater than or equal to the highest boundary."));
        }
    }
    let output = match output {
        Some(o) => o,
        None => vec![("count".to_string(), AccSpec { op: AccOp::Num(AccKind::Sum), arg: Expr::parse(&Bson::Int32(1))? })],
    };
    Ok(Bucket { group_by, boundaries, default, output })
}

// ---------------------------------------------------------------------------------------------
// Execution

type Stream<'a> = Box<dyn Iterator<Item = Result<Document>> + 'a>;

/// Approximate in-memory size of a value, for memory limits.
pub(crate) fn approx_size(v: &Bson) -> usize {
    match v {
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => s.len() + 24,
        Bson::Document(d) => approx_doc_size(d),
        Bson::Array(a) => 24 + a.iter().map(approx_size).sum::<usize>(),
        Bson::Binary(b) => b.bytes.len() + 24,
        Bson::RegularExpression(r) => r.pattern.as_str().len() + r.options.as_str().len() + 48,
        Bson::JavaScriptCodeWithScope(c) => c.code.len() + approx_doc_size(&c.scope),
        _ => 16,
    }
}

pub(crate) fn approx_doc_size(d: &Document) -> usize {
    32 + d.iter().map(|(k, v)| k.len() + 16 + approx_size(v)).sum::<usize>()
}

fn mem_error(stage: &str) -> Error {
    Error::new(Code::ExceededMemoryLimit, format!("Exceeded memory limit for {stage}, but didn't allow external spilling; pass allowDiskUse:true to opt in."))
}

/// A `$group`/`$bucket` output document: `_id` first, then the accumulated fields.
fn group_doc(key: Bson, fields: impl IntoIterator<Item = (String, Bson)>) -> Document {
    let mut d = Document::new();
    d.insert("_id", key);
    for (k, v) in fields {
        d.insert(k, v);
    }
    d
}

fn apply_stage<'a>(stage: &'a Stage, input: Stream<'a>, opts: &'a RunOptions) -> Result<Stream<'a>> {
    Ok(match stage {
        Stage::Match(f, _) => Box::new(input.filter_map(move |r| match r {
            Ok(d) => match f.try_matches(&d) {
                Ok(true) => Some(Ok(d)),
                Ok(false) => None,
                Err(e) => Some(Err(e)),
            },
            Err(e) => Some(Err(e)),
        })),
        Stage::Project(p) | Stage::Unset(p) => Box::new(input.map(move |r| r.and_then(|d| p.apply(&d, &MatchDetails::default())))),
        Stage::AddFields(a) => Box::new(input.map(move |r| r.and_then(|d| a.apply(&d)))),
        Stage::Limit(n) => Box::new(input.take((*n).min(usize::MAX as u64) as usize)),
        Stage::Skip(n) => Box::new(input.skip((*n).min(usize::MAX as u64) as usize)),
        Stage::ReplaceRoot(e) => Box::new(input.map(move |r| {
            r.and_then(|d| match e.eval(&d)? {
                Some(Bson::Document(nd)) => Ok(nd),
                other => Err(loc(
                    40228,
                    format!(
                        "'replacement document' must evaluate to an object, but resulting value was: {}. Type of resulting value: '{}'. Input document: {}",
                        other.as_ref().map(|b| b.to_string()).unwrap_or_else(|| "MISSING".into()),
                        crate::expr::type_name(other.as_ref()),
                        d
                    ),
                )),
            })
        })),
        Stage::Unwind(u) => Box::new(input.flat_map(move |r| -> Box<dyn Iterator<Item = Result<Document>>> {
            match r {
                Ok(d) => Box::new(unwind(u, d).into_iter().map(Ok)),
                Err(e) => Box::new(std::iter::once(Err(e))),
            }
        })),
        Stage::Sort { spec, limit } => Box::new(sort_stage(spec, *limit, input, opts)?.into_iter().map(Ok)),
        Stage::Group(g) => Box::new(group_stage(g, input, opts)?.into_iter().map(Ok)),
        Stage::Count(field) => {
            let mut n: i64 = 0;
            for r in input {
                r?;
                n += 1;
            }
            let out = if n == 0 {
                vec![]
            } else {
                let mut d = Document::new();
                d.insert(field.clone(), if n <= i32::MAX as i64 { Bson::Int32(n as i32) } else { Bson::Int64(n) });
                vec![d]
            };
            Box::new(out.into_iter().map(Ok))
        }
        Stage::SortByCount(e) => {
            let g = Group {
                id: GroupId::Expr(e.clone()),
                fields: vec![("count".to_string(), AccSpec { op: AccOp::Num(AccKind::Sum), arg: Expr::parse(&Bson::Int32(1))? })],
            };
            let mut groups = group_stage(&g, input, opts)?;
            let count = |d: &Document| d.get("count").cloned().unwrap_or(Bson::Int32(0));
            groups.sort_by(|a, b| cmp_bson(&count(b), &count(a)));
            Box::new(groups.into_iter().map(Ok))
        }
        Stage::Sample(n) => {
            let n = (*n).min(SAMPLE_SIZE_MAX as u64) as usize;
            let mut reservoir: Vec<Document> = Vec::with_capacity(n.min(1024));
            let mut seen = 0usize;
            for r in input {
                let d = r?;
                seen += 1;
                if reservoir.len() < n {
                    reservoir.push(d);
                } else {
                    let j = rand::random::<usize>() % seen;
                    if j < n {
                        reservoir[j] = d;
                    }
                }
            }
            // Random output order as well.
            for i in (1..reservoir.len()).rev() {
                let j = rand::random::<usize>() % (i + 1);
                reservoir.swap(i, j);
            }
            Box::new(reservoir.into_iter().map(Ok))
        }
        Stage::Facet(facets) => {
            let docs: Vec<Document> = input.collect::<Result<_>>()?;
            let mut out = Document::new();
            for (name, p) in facets {
                let mut it = docs.iter().cloned().map(Ok);
                let res = p.run(&mut it, opts)?;
                out.insert(name.clone(), Bson::Array(res.into_iter().map(Bson::Document).collect()));
            }
            Box::new(std::iter::once(Ok(out)))
        }
        Stage::Bucket(b) => Box::new(bucket_stage(b, input, opts)?.into_iter().map(Ok)),
        Stage::Documents(docs) => {
            // Replaces the input (MongoDB runs $documents against an empty collection).
            drop(input);
            Box::new(docs.clone().into_iter().map(Ok))
        }
        Stage::External(name, _) => return Err(Error::new(Code::NotImplemented, format!("{name} must be executed by the server, not the query layer"))),
    })
}

fn get_nested<'a>(d: &'a Document, path: &[String]) -> Option<&'a Bson> {
    let (first, rest) = path.split_first()?;
    let v = d.get(first)?;
    if rest.is_empty() {
        return Some(v);
    }
    match v {
        Bson::Document(sub) => get_nested(sub, rest),
        _ => None,
    }
}

fn set_nested(d: &mut Document, path: &[String], v: Option<Bson>) {
    let Some((first, rest)) = path.split_first() else { return };
    if rest.is_empty() {
        match v {
            Some(v) => {
                d.insert(first.clone(), v);
            }
            None => {
                d.remove(first);
            }
        }
        return;
    }
    if let Some(Bson::Document(sub)) = d.get_mut(first) {
        set_nested(sub, rest, v);
    }
}

fn unwind(u: &Unwind, d: Document) -> Vec<Document> {
    let with_index = |mut doc: Document, idx: Option<i64>| {
        if let Some(f) = &u.include_array_index {
            doc.insert(f.clone(), idx.map(Bson::Int64).unwrap_or(Bson::Null));
        }
        doc
    };
    match get_nested(&d, &u.path) {
        Some(Bson::Array(items)) if !items.is_empty() => {
            let items = items.clone();
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| {
                    let mut nd = d.clone();
                    set_nested(&mut nd, &u.path, Some(item));
                    with_index(nd, Some(i as i64))
                })
                .collect()
        }
        Some(Bson::Array(_)) => {
            if u.preserve {
                let mut nd = d.clone();
                set_nested(&mut nd, &u.path, None);
                vec![with_index(nd, None)]
            } else {
                vec![]
            }
        }
        None | Some(Bson::Null) | Some(Bson::Undefined) => {
            if u.preserve {
                vec![with_index(d, None)]
            } else {
                vec![]
            }
        }
        Some(_) => vec![with_index(d, None)],
    }
}

fn sort_stage(spec: &SortSpec, limit: Option<u64>, input: Stream, opts: &RunOptions) -> Result<Vec<Document>> {
    let k = limit.map(|l| l.min(usize::MAX as u64) as usize);
    let mut buf: Vec<(Vec<Bson>, Document)> = Vec::new();
    let mut bytes = 0usize;
    let cmp = |a: &(Vec<Bson>, Document), b: &(Vec<Bson>, Document)| spec.compare_keys(&a.0, &b.0);
    for r in input {
        let d = r?;
        let key = spec.sort_key(&d);
        bytes += approx_doc_size(&d) + key.iter().map(approx_size).sum::<usize>();
        buf.push((key, d));
        if let Some(k) = k {
            // Top-k: compact once the buffer holds twice what we keep (stable sort).
            if buf.len() >= k.saturating_mul(2).max(64) {
                buf.sort_by(cmp);
                buf.truncate(k);
                bytes = buf.iter().map(|(key, d)| approx_doc_size(d) + key.iter().map(approx_size).sum::<usize>()).sum();
            }
        }
        if bytes > opts.mem_limit_bytes && !opts.allow_disk_use {
            return Err(Error::new(
                Code::ExceededMemoryLimit,
                format!(
                    "Executor error during aggregate command :: caused by :: Sort exceeded memory limit of {} bytes, but did not opt in to external sorting.",
                    opts.mem_limit_bytes
                ),
            ));
        }
    }
    buf.sort_by(cmp);
    if let Some(k) = k {
        buf.truncate(k);
    }
    Ok(buf.into_iter().map(|(_, d)| d).collect())
}

/// Bson with MongoDB's total order, for ordered maps and sets.
#[derive(Clone, Debug)]
pub(crate) struct OrdBson(pub Bson);

impl PartialEq for OrdBson {
    fn eq(&self, other: &Self) -> bool {
        cmp_bson(&self.0, &other.0) == Ordering::Equal
    }
}
impl Eq for OrdBson {}
impl PartialOrd for OrdBson {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdBson {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_bson(&self.0, &other.0)
    }
}

#[derive(Clone, Debug)]
enum AccState {
    Num(Accum),
    First(Option<Bson>),
    Last(Bson),
    Push(Vec<Bson>),
    AddToSet(std::collections::BTreeSet<OrdBson>),
    Merge(Document),
}

impl AccState {
    fn new(op: AccOp) -> AccState {
        match op {
            AccOp::Num(k) => AccState::Num(Accum::new(k)),
            AccOp::Count => AccState::Num(Accum::new(AccKind::Sum)),
            AccOp::First => AccState::First(None),
            AccOp::Last => AccState::Last(Bson::Null),
            AccOp::Push => AccState::Push(Vec::new()),
            AccOp::AddToSet => AccState::AddToSet(Default::default()),
            AccOp::MergeObjects => AccState::Merge(Document::new()),
        }
    }

    /// Feed one value; returns the bytes of state added (approximately).
    fn add(&mut self, v: Option<Bson>) -> Result<usize> {
        Ok(match self {
            AccState::Num(a) => {
                a.add(v)?;
                0
            }
            AccState::First(f) => {
                if f.is_none() {
                    let v = v.unwrap_or(Bson::Null);
                    let n = approx_size(&v);
                    *f = Some(v);
                    n
                } else {
                    0
                }
            }
            AccState::Last(l) => {
                *l = v.unwrap_or(Bson::Null);
                0
            }
            AccState::Push(items) => match v {
                Some(v) => {
                    let n = approx_size(&v);
                    items.push(v);
                    n
                }
                None => 0,
            },
            AccState::AddToSet(set) => match v {
                Some(v) => {
                    let n = approx_size(&v);
                    if set.insert(OrdBson(v)) {
                        n
                    } else {
                        0
                    }
                }
                None => 0,
            },
            AccState::Merge(d) => match v {
                Some(Bson::Document(sub)) => {
                    let n = approx_doc_size(&sub);
                    for (k, val) in sub {
                        d.insert(k, val);
                    }
                    n
                }
                None | Some(Bson::Null) | Some(Bson::Undefined) => 0,
                Some(other) => return Err(loc(40400, format!("$mergeObjects requires object inputs, but input {other} is of type {}", tname(&other)))),
            },
        })
    }

    fn finish(self) -> Bson {
        match self {
            AccState::Num(a) => a.finish().unwrap_or(Bson::Null),
            AccState::First(f) => f.unwrap_or(Bson::Null),
            AccState::Last(l) => l,
            AccState::Push(items) => Bson::Array(items),
            AccState::AddToSet(set) => Bson::Array(set.into_iter().map(|o| o.0).collect()),
            AccState::Merge(d) => Bson::Document(d),
        }
    }
}

/// Groups in first-seen order, indexed by key.
struct Groups<'s> {
    specs: &'s [(String, AccSpec)],
    index: BTreeMap<OrdBson, usize>,
    groups: Vec<(Bson, Vec<AccState>)>,
    bytes: usize,
}

impl<'s> Groups<'s> {
    fn new(specs: &'s [(String, AccSpec)]) -> Self {
        Groups { specs, index: BTreeMap::new(), groups: Vec::new(), bytes: 0 }
    }

    fn add(&mut self, key: Bson, doc: &Document) -> Result<()> {
        let slot = match self.index.get(&OrdBson(key.clone())) {
            Some(i) => *i,
            None => {
                self.bytes += 2 * approx_size(&key) + 64 * (self.specs.len() + 1);
                let states = self.specs.iter().map(|(_, s)| AccState::new(s.op)).collect();
                self.groups.push((key.clone(), states));
                self.index.insert(OrdBson(key), self.groups.len() - 1);
                self.groups.len() - 1
            }
        };
        let (_, states) = &mut self.groups[slot];
        for ((_, spec), state) in self.specs.iter().zip(states.iter_mut()) {
            let v = spec.arg.eval(doc)?;
            self.bytes += state.add(v)?;
        }
        Ok(())
    }

    fn finish(self) -> Vec<(Bson, Document)> {
        let specs = self.specs;
        self.groups
            .into_iter()
            .map(|(key, states)| {
                let mut d = Document::new();
                for ((name, _), st) in specs.iter().zip(states) {
                    d.insert(name.clone(), st.finish());
                }
                (key, d)
            })
            .collect()
    }
}

fn group_stage(g: &Group, input: Stream, opts: &RunOptions) -> Result<Vec<Document>> {
    let mut groups = Groups::new(&g.fields);
    let GroupId::Expr(id) = &g.id;
    for r in input {
        let d = r?;
        let key = id.eval(&d)?.unwrap_or(Bson::Null);
        groups.add(key, &d)?;
        if groups.bytes > opts.mem_limit_bytes && !opts.allow_disk_use {
            return Err(mem_error("$group"));
        }
    }
    Ok(groups.finish().into_iter().map(|(key, fields)| group_doc(key, fields)).collect())
}

fn bucket_stage(b: &Bucket, input: Stream, opts: &RunOptions) -> Result<Vec<Document>> {
    let mut groups = Groups::new(&b.output);
    let n = b.boundaries.len();
    for r in input {
        let d = r?;
        let v = b.group_by.eval(&d)?.unwrap_or(Bson::Null);
        let mut key = None;
        if crate::compare::canonical_rank(&v) == crate::compare::canonical_rank(&b.boundaries[0]) {
            for i in 0..n - 1 {
                if cmp_bson(&v, &b.boundaries[i]) != Ordering::Less && cmp_bson(&v, &b.boundaries[i + 1]) == Ordering::Less {
                    key = Some(b.boundaries[i].clone());
                    break;
                }
            }
        }
        let key = match key.or_else(|| b.default.clone()) {
            Some(k) => k,
            None => return Err(loc(40066, "$switch could not find a matching branch for an input, and no default was specified.")),
        };
        groups.add(key, &d)?;
        if groups.bytes > opts.mem_limit_bytes && !opts.allow_disk_use {
            return Err(mem_error("$bucket"));
        }
    }
    let mut out = groups.finish();
    // Buckets in boundary order, the default bucket last.
    let rank = |k: &Bson| b.boundaries.iter().position(|x| cmp_bson(x, k) == Ordering::Equal).unwrap_or(n);
    out.sort_by_key(|(k, _)| rank(k));
    Ok(out.into_iter().map(|(key, fields)| group_doc(key, fields)).collect())
}

/// Accumulator kinds shared by $group and the array forms of $sum/$avg/... expressions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum AccKind {
    Sum,
    Avg,
    Min,
    Max,
    StdDevPop,
    StdDevSamp,
}

/// Running state of a numeric/ordering accumulator.
#[derive(Clone, Debug)]
pub(crate) struct Accum {
    kind: AccKind,
    sum: Num,
    count: u64,
    best: Option<Bson>,
    // Welford's online variance.
    mean: f64,
    m2: f64,
}

impl Accum {
    pub fn new(kind: AccKind) -> Accum {
        Accum { kind, sum: Num::I32(0), count: 0, best: None, mean: 0.0, m2: 0.0 }
    }

    pub fn add(&mut self, v: Option<Bson>) -> Result<()> {
        match self.kind {
            AccKind::Sum | AccKind::Avg => {
                if let Some(n) = v.as_ref().and_then(Num::from_bson) {
                    self.sum = self.sum.arith(n, ArithOp::Add, DecPrecision::Digits34, true).unwrap_or(Num::F64(f64::NAN));
                    self.count += 1;
                }
            }
            AccKind::Min | AccKind::Max => {
                let Some(v) = v else { return Ok(()) };
                if matches!(v, Bson::Null | Bson::Undefined) {
                    return Ok(());
                }
                let replace = match &self.best {
                    None => true,
                    Some(b) => {
                        let o = cmp_bson(&v, b);
                        (self.kind == AccKind::Min && o == Ordering::Less) || (self.kind == AccKind::Max && o == Ordering::Greater)
                    }
                };
                if replace {
                    self.best = Some(v);
                }
            }
            AccKind::StdDevPop | AccKind::StdDevSamp => {
                if let Some(n) = v.as_ref().and_then(Num::from_bson) {
                    let x = n.to_f64();
                    self.count += 1;
                    let delta = x - self.mean;
                    self.mean += delta / self.count as f64;
                    self.m2 += delta * (x - self.mean);
                }
            }
        }
        Ok(())
    }

    pub fn finish(&self) -> Option<Bson> {
        Some(match self.kind {
            AccKind::Sum => self.sum.to_bson(),
            AccKind::Avg => {
                if self.count == 0 {
                    Bson::Null
                } else {
                    match self.sum {
                        Num::Dec(d) => Bson::Decimal128(d.div(crate::decimal::Dec::from_i64(self.count as i64)).encode()),
                        s => Bson::Double(s.to_f64() / self.count as f64),
                    }
                }
            }
            AccKind::Min | AccKind::Max => self.best.clone().unwrap_or(Bson::Null),
            AccKind::StdDevPop => {
                if self.count == 0 {
                    Bson::Null
                } else {
                    Bson::Double((self.m2 / self.count as f64).sqrt())
                }
            }
            AccKind::StdDevSamp => {
                if self.count < 2 {
                    Bson::Null
                } else {
                    Bson::Double((self.m2 / (self.count - 1) as f64).sqrt())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{bson, doc};

    fn run_opts(stages: Vec<Document>, docs: Vec<Document>, opts: &RunOptions) -> Result<Vec<Document>> {
        let p = Pipeline::parse(&stages)?;
        let mut it = docs.into_iter().map(Ok);
        p.run(&mut it, opts)
    }
    fn run(stages: Vec<Document>, docs: Vec<Document>) -> Vec<Document> {
        run_opts(stages, docs, &RunOptions::default()).unwrap()
    }

    fn sales() -> Vec<Document> {
        vec![
            doc! {"_id": 1, "item": "abc", "price": 10, "quantity": 2},
            doc! {"_id": 2, "item": "jkl", "price": 20, "quantity": 1},
            doc! {"_id": 3, "item": "xyz", "price": 5, "quantity": 10},
            doc! {"_id": 4, "item": "xyz", "price": 5, "quantity": 20},
            doc! {"_id": 5, "item": "abc", "price": 10, "quantity": 10},
        ]
    }

    #[test]
    fn group_accumulators() {
        let out = run(
            vec![
                doc! {"$group": {
                    "_id": "$item",
                    "total": {"$sum": {"$multiply": ["$price", "$quantity"]}},
                    "avgQ": {"$avg": "$quantity"},
                    "n": {"$sum": 1},
                    "c": {"$count": {}},
                    "first": {"$first": "$_id"},
                    "last": {"$last": "$_id"},
                    "ids": {"$push": "$_id"},
                    "prices": {"$addToSet": "$price"},
                    "maxQ": {"$max": "$quantity"},
                    "minQ": {"$min": "$quantity"},
                }},
                doc! {"$sort": {"_id": 1}},
            ],
            sales(),
        );
        assert_eq!(out.len(), 3);
        assert_eq!(
            out[0],
            doc! {"_id": "abc", "total": 120, "avgQ": 6.0, "n": 2, "c": 2, "first": 1, "last": 5, "ids": [1, 5], "prices": [10], "maxQ": 10, "minQ": 2}
        );
        let all = run(vec![doc! {"$group": {"_id": null, "q": {"$sum": "$quantity"}}}], sales());
        assert_eq!(all, vec![doc! {"_id": null, "q": 43}]);
        // 1 and 1.0 are the same group.
        let g = run(vec![doc! {"$group": {"_id": "$k"}}], vec![doc! {"k": 1}, doc! {"k": 1.0}, doc! {}]);
        assert_eq!(g, vec![doc! {"_id": 1}, doc! {"_id": null}]);
    }

    #[test]
    fn stage_errors() {
        let e = |s: Document| Pipeline::parse(&[s]).unwrap_err();
        assert_eq!(e(doc! {"$foo": 1}).code, 40324);
        assert_eq!(e(doc! {"$foo": 1}).message, "Unrecognized pipeline stage name: '$foo'");
        assert_eq!(e(doc! {"$match": 1, "$sort": {"a": 1}}).code, 40323);
        assert_eq!(e(doc! {"$group": {"total": {"$sum": 1}}}).code, 15955);
        assert_eq!(e(doc! {"$group": {"_id": null, "t": {"$foo": 1}}}).code, 15952);
        assert_eq!(e(doc! {"$group": {"_id": null, "t": 1}}).code, 40234);
        assert_eq!(e(doc! {"$limit": 0}).code, 15958);
        assert_eq!(e(doc! {"$skip": -1}).code, 15956);
        assert_eq!(e(doc! {"$sort": {}}).code, 15976);
        assert_eq!(e(doc! {"$unwind": "a"}).code, 28818);
        assert_eq!(e(doc! {"$count": "$x"}).code, 40158);
        assert!(matches!(Pipeline::parse(&[doc! {"$lookup": {"from": "x"}}]).unwrap().stages[0], Stage::External(ref n, _) if n == "$lookup"));
        assert!(
            matches!(Pipeline::parse(&[doc! {"$out": "coll"}]).unwrap().stages[0], Stage::External(ref n, ref s) if n == "$out" && s.get_str("$out").ok() == Some("coll"))
        );
    }

    #[test]
    fn match_project_sort_limit_skip() {
        let out = run(
            vec![
                doc! {"$match": {"price": {"$gte": 10}}},
                doc! {"$project": {"item": 1, "rev": {"$multiply": ["$price", "$quantity"]}}},
                doc! {"$sort": {"rev": -1, "_id": 1}},
                doc! {"$skip": 1},
                doc! {"$limit": 1},
            ],
            sales(),
        );
        // rev: 5 -> 100, 1 -> 20, 2 -> 20 (ties by _id); skip one, keep one.
        assert_eq!(out, vec![doc! {"_id": 1, "item": "abc", "rev": 20}]);
        let p = Pipeline::parse(&[doc! {"$match": {"a": 1}}, doc! {"$match": {"b": 2}}, doc! {"$limit": 1}]).unwrap();
        assert_eq!(p.leading_match(), Some(doc! {"$and": [{"a": 1}, {"b": 2}]}));
        let p = Pipeline::parse(&[doc! {"$sort": {"a": 1}}, doc! {"$limit": 3}]).unwrap();
        assert!(matches!(p.stages[0], Stage::Sort { limit: Some(3), .. }));
    }

    #[test]
    fn top_k_sort_is_stable_and_correct() {
        let docs: Vec<Document> = (0..500).map(|i| doc! {"_id": i, "k": (i * 7919) % 101}).collect();
        let top = run(vec![doc! {"$sort": {"k": 1}}, doc! {"$limit": 5}], docs.clone());
        let mut expected = docs.clone();
        expected.sort_by_key(|d| d.get_i32("k").unwrap());
        assert_eq!(top, expected[..5].to_vec());
    }

    #[test]
    fn memory_limits() {
        let docs: Vec<Document> = (0..100).map(|i| doc! {"_id": i, "s": "x".repeat(100)}).collect();
        let small = RunOptions { allow_disk_use: false, mem_limit_bytes: 1000 };
        let e = run_opts(vec![doc! {"$sort": {"s": 1}}], docs.clone(), &small).unwrap_err();
        assert_eq!(e.code, 146);
        let e = run_opts(vec![doc! {"$group": {"_id": "$_id", "v": {"$push": "$s"}}}], docs.clone(), &small).unwrap_err();
        assert_eq!(e.code, 146);
        let disk = RunOptions { allow_disk_use: true, mem_limit_bytes: 1000 };
        assert_eq!(run_opts(vec![doc! {"$sort": {"s": 1}}], docs, &disk).unwrap().len(), 100);
    }

    #[test]
    fn unwind_variants() {
        let docs = vec![
            doc! {"_id": 1, "sizes": ["S", "M"]},
            doc! {"_id": 2, "sizes": []},
            doc! {"_id": 3, "sizes": null},
            doc! {"_id": 4},
            doc! {"_id": 5, "sizes": "L"},
        ];
        let out = run(vec![doc! {"$unwind": "$sizes"}], docs.clone());
        assert_eq!(out, vec![doc! {"_id": 1, "sizes": "S"}, doc! {"_id": 1, "sizes": "M"}, doc! {"_id": 5, "sizes": "L"}]);
        let out = run(vec![doc! {"$unwind": {"path": "$sizes", "includeArrayIndex": "i", "preserveNullAndEmptyArrays": true}}], docs);
        assert_eq!(out.len(), 6);
        assert_eq!(out[1], doc! {"_id": 1, "sizes": "M", "i": 1i64});
        assert_eq!(out[2], doc! {"_id": 2, "i": null});
        assert_eq!(out[3], doc! {"_id": 3, "sizes": null, "i": null});
    }

    #[test]
    fn other_stages() {
        assert_eq!(run(vec![doc! {"$count": "n"}], sales()), vec![doc! {"n": 5}]);
        assert!(run(vec![doc! {"$count": "n"}], vec![]).is_empty());
        let out = run(vec![doc! {"$sortByCount": "$item"}], sales());
        assert_eq!(out[0].get_i32("count").unwrap(), 2);
        assert_eq!(out.len(), 3);
        let out = run(vec![doc! {"$replaceRoot": {"newRoot": {"i": "$item"}}}, doc! {"$limit": 1}], sales());
        assert_eq!(out, vec![doc! {"i": "abc"}]);
        assert_eq!(run_opts(vec![doc! {"$replaceWith": "$item"}], sales(), &RunOptions::default()).unwrap_err().code, 40228);
        let out = run(vec![doc! {"$addFields": {"t": {"$add": ["$price", 1]}}}, doc! {"$unset": ["item", "quantity"]}, doc! {"$limit": 1}], sales());
        assert_eq!(out, vec![doc! {"_id": 1, "price": 10, "t": 11}]);
        assert_eq!(run(vec![doc! {"$sample": {"size": 2}}], sales()).len(), 2);
        let out = run(vec![doc! {"$facet": {"cheap": [{"$match": {"price": 5}}, {"$count": "n"}], "all": [{"$count": "n"}]}}], sales());
        assert_eq!(out, vec![doc! {"cheap": [{"n": 2}], "all": [{"n": 5}]}]);
        let out = run(vec![doc! {"$bucket": {"groupBy": "$price", "boundaries": [0, 10, 100], "default": "other"}}], sales());
        assert_eq!(out, vec![doc! {"_id": 0, "count": 2}, doc! {"_id": 10, "count": 3}]);
        let out = run(vec![doc! {"$documents": [{"x": 1}, {"x": 2}]}, doc! {"$match": {"x": 2}}], vec![]);
        assert_eq!(out, vec![doc! {"x": 2}]);
        let out = run(vec![doc! {"$set": {"nested.v": "$price"}}, doc! {"$project": {"_id": 0, "nested": 1}}, doc! {"$limit": 1}], sales());
        assert_eq!(out, vec![doc! {"nested": {"v": 10}}]);
        let _ = bson!(1);
    }

    #[test]
    fn pipeline_update() {
        let u = crate::update::Update::parse(&bson!([{"$set": {"total": {"$add": ["$a", "$b"]}}}, {"$unset": "a"}]), None).unwrap();
        let out = u.apply(&doc! {"_id": 1, "a": 1, "b": 2}, &MatchDetails::default(), false).unwrap();
        assert_eq!(out, doc! {"_id": 1, "b": 2, "total": 3});
        let u = crate::update::Update::parse(&bson!([{"$replaceWith": {"x": 1}}]), None).unwrap();
        assert_eq!(u.apply(&doc! {"_id": 1, "a": 1}, &MatchDetails::default(), false).unwrap(), doc! {"_id": 1, "x": 1});
        assert_eq!(crate::update::Update::parse(&bson!([{"$match": {}}]), None).unwrap_err().code, 72);
    }
}
