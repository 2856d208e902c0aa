//! Updates: operator documents ($set, $inc, ...), replacement documents and pipeline-style
//! updates, with MongoDB's path creation, positional operators and error codes.

use crate::compare::{bson_eq, cmp_bson};
use crate::filter::{Filter, MatchDetails};
use crate::num::{ArithOp, DecPrecision, Num};
use crate::sort::SortSpec;
use bson::{Bson, DateTime, Document};
use common::{Code, Error, Result};
use std::cmp::Ordering;

/// Largest array index an update may create by padding with nulls (MongoDB refuses
/// pathological padding too).
const ARRAY_PAD_INDEX_MAX: usize = 1_500_000;

#[derive(Clone, Debug)]
pub struct Update {
    kind: Kind,
}

/// An update's kind: by operators, by an aggregation pipeline, or a replacement document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateForm {
    Modifiers,
    Pipeline,
    Replacement,
}

#[derive(Clone, Debug)]
enum Kind {
    Replacement(Document),
    Operators { mods: Vec<Mod>, array_filters: Vec<(String, Filter)> },
    Pipeline(crate::agg::Pipeline),
}

#[derive(Clone, Debug, PartialEq)]
enum Comp {
    Field(String),
    /// `$`: the element matched by the query.
    Positional,
    /// `$[]`: every element.
    All,
    /// `$[id]`: elements matching array filter `id`.
    Filtered(String),
}

#[derive(Clone, Debug)]
struct Mod {
    path: Vec<Comp>,
    dotted: String,
    op: Op,
}

#[derive(Clone, Debug)]
enum Op {
    Set(Bson),
    SetOnInsert(Bson),
    Unset,
    Inc(Num),
    Mul(Num),
    Min(Bson),
    Max(Bson),
    CurrentDate { timestamp: bool },
    Push(PushSpec),
    AddToSet(Vec<Bson>),
    Pop { first: bool },
    Pull(PullCond),
    PullAll(Vec<Bson>),
    Bit(Vec<(BitOp, Num)>),
    Rename { from: Vec<Comp>, from_dotted: String },
}

#[derive(Clone, Copy, Debug)]
enum BitOp {
    And,
    Or,
    Xor,
}

#[derive(Clone, Debug)]
struct PushSpec {
    each: Vec<Bson>,
    slice: Option<i64>,
    sort: Option<PushSort>,
    position: Option<i64>,
}

#[derive(Clone, Debug)]
enum PushSort {
    Whole { ascending: bool },
    Pattern(SortSpec),
}

#[derive(Clone, Debug)]
enum PullCond {
    /// Matches elements through a predicate on the element itself ({$gte: 5}, /re/).
    Value(Filter),
    /// Matches document elements against a query ({score: 8}).
    Doc(Filter),
    Equal(Bson),
}

fn ftp(msg: impl Into<String>) -> Error {
    Error::new(Code::FailedToParse, msg)
}

fn bad(msg: impl Into<String>) -> Error {
    Error::bad_value(msg)
}

fn parse_path(dotted: &str) -> Result<Vec<Comp>> {
    if dotted.is_empty() {
        return Err(Error::new(Code::EmptyFieldName, "An empty update path is not valid."));
    }
    let mut comps = Vec::new();
    let mut positional = 0;
    for part in dotted.split('.') {
        if part.is_empty() {
            return Err(Error::new(Code::EmptyFieldName, format!("The update path '{dotted}' contains an empty field name, which is not allowed.")));
        }
        let c = if part == "$" {
            positional += 1;
            Comp::Positional
        } else if part == "$[]" {
            Comp::All
        } else if let Some(id) = part.strip_prefix("$[").and_then(|p| p.strip_suffix(']')) {
            Comp::Filtered(id.to_string())
        } else {
            Comp::Field(part.to_string())
        };
        comps.push(c);
    }
    if positional > 1 {
        return Err(bad(format!("Too many positional (i.e. '$') elements found in path '{dotted}'")));
    }
    if matches!(comps.first(), Some(Comp::Positional | Comp::All | Comp::Filtered(_))) {
        return Err(bad(format!("Cannot have array filter identifier (i.e. '$[<id>]') element in the first position in path '{dotted}'")));
    }
    Ok(comps)
}

fn comp_key(c: &Comp) -> String {
    match c {
        Comp::Field(s) => s.clone(),
        Comp::Positional => "$".into(),
        Comp::All => "$[]".into(),
        Comp::Filtered(id) => format!("$[{id}]"),
    }
}

/// Field order MongoDB applies updates in: numeric names numerically, others bytewise.
fn cmp_component(a: &str, b: &str) -> Ordering {
    let num = |s: &str| -> Option<u64> {
        if !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) && s.len() < 20 {
            s.parse().ok()
        } else {
            None
        }
    };
    match (num(a), num(b)) {
        (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.cmp(b)),
        _ => a.as_bytes().cmp(b.as_bytes()),
    }
}

fn cmp_paths(a: &[Comp], b: &[Comp]) -> Ordering {
    for (x, y) in a.iter().zip(b.iter()) {
        let o = cmp_component(&comp_key(x), &comp_key(y));
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

fn numeric_arg(op: &str, field: &str, v: &Bson) -> Result<Num> {
    Num::from_bson(v).ok_or_else(|| {
        let verb = if op == "$inc" { "increment" } else { "multiply" };
        Error::type_mismatch(format!("Cannot {verb} with non-numeric argument: {{{field}: {v}}}"))
    })
}

fn as_integer(v: &Bson) -> Option<i64> {
    Num::from_bson(v).and_then(|n| n.as_exact_i64())
}

fn parse_push(v: &Bson) -> Result<PushSpec> {
    let Bson::Document(d) = v else {
        return Ok(PushSpec { each: vec![v.clone()], slice: None, sort: None, position: None });
    };
    if !d.contains_key("$each") {
        return Ok(PushSpec { each: vec![v.clone()], slice: None, sort: None, position: None });
    }
    let mut spec = PushSpec { each: vec![], slice: None, sort: None, position: None };
    for (k, val) in d {
        match k.as_str() {
            "$each" => match val {
                Bson::Array(items) => spec.each = items.clone(),
                other => {
                    return Err(bad(format!("The argument to $each in $push must be an array but it was of type: {}", crate::expr::type_name(Some(other)))))
                }
            },
            "$slice" => {
                spec.slice =
                    Some(as_integer(val).ok_or_else(|| {
                        bad(format!("The value for $slice must be an integer value but was given type: {}", crate::expr::type_name(Some(val))))
                    })?)
            }
            "$position" => {
                spec.position = Some(
                    as_integer(val)
                        .ok_or_else(|| bad(format!("The value for $position must be an integer value, not of type: {}", crate::expr::type_name(Some(val)))))?,
                )
            }
            "$sort" => {
                let invalid = || bad("The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields");
                spec.sort = Some(match val {
                    Bson::Document(sd) => {
                        if sd.is_empty() {
                            return Err(bad("The $sort pattern is empty when it should be a set of fields."));
                        }
                        for (_, dir) in sd {
                            let n = Num::from_bson(dir).map(|n| n.to_f64());
                            if n != Some(1.0) && n != Some(-1.0) {
                                return Err(bad("The $sort element value must be either 1 or -1"));
                            }
                        }
                        PushSort::Pattern(SortSpec::parse(sd).map_err(|_| invalid())?)
                    }
                    other => match Num::from_bson(other).map(|n| n.to_f64()) {
                        Some(1.0) => PushSort::Whole { ascending: true },
                        Some(-1.0) => PushSort::Whole { ascending: false },
                        _ => return Err(invalid()),
                    },
                })
            }
            other => return Err(bad(format!("Unrecognized clause in $push: {other}"))),
        }
    }
    Ok(spec)
}

fn parse_pull(v: &Bson) -> Result<PullCond> {
    match v {
        Bson::Document(d) => {
            let first = d.keys().next().map(String::as_str).unwrap_or("");
            let top_level = matches!(first, "$and" | "$or" | "$nor" | "$expr" | "$where" | "$text" | "$comment" | "$alwaysTrue" | "$alwaysFalse");
            if first.starts_with('$') && !top_level {
                let mut f = Document::new();
                f.insert("", v.clone());
                Ok(PullCond::Value(Filter::parse(&f)?))
            } else {
                Ok(PullCond::Doc(Filter::parse(d)?))
            }
        }
        Bson::RegularExpression(_) => {
            let mut f = Document::new();
            f.insert("", v.clone());
            Ok(PullCond::Value(Filter::parse(&f)?))
        }
        other => Ok(PullCond::Equal(other.clone())),
    }
}

impl PullCond {
    fn matches(&self, e: &Bson) -> bool {
        match self {
            PullCond::Value(f) => {
                let mut d = Document::new();
                d.insert("", e.clone());
                f.matches(&d)
            }
            PullCond::Doc(f) => match e {
                Bson::Document(d) => f.matches(d),
                _ => false,
            },
            PullCond::Equal(v) => bson_eq(e, v) && crate::compare::canonical_rank(e) == crate::compare::canonical_rank(v),
        }
    }
}

fn parse_bit(field: &str, v: &Bson) -> Result<Vec<(BitOp, Num)>> {
    let Bson::Document(d) = v else {
        return Err(bad(format!(
            "The $bit modifier is not compatible with a {}. You must pass in an embedded document: {{$bit: {{field: {{and/or/xor: #}}}}",
            crate::expr::type_name(Some(v))
        )));
    };
    let mut ops = Vec::new();
    for (k, val) in d {
        let op = match k.as_str() {
            "and" => BitOp::And,
            "or" => BitOp::Or,
            "xor" => BitOp::Xor,
            other => {
                return Err(bad(format!(
                    "The $bit modifier only supports 'and', 'or', and 'xor', not '{other}' which is an unknown operator: {{{other}: {val}}}"
                )))
            }
        };
        let n = match val {
            Bson::Int32(i) => Num::I32(*i),
            Bson::Int64(i) => Num::I64(*i),
            other => {
                return Err(bad(format!(
                    "The $bit modifier field must be an Integer(32/64 bit); a '{}' is not supported here: {{{k}: {other}}}",
                    crate::expr::type_name(Some(other))
                )))
            }
        };
        ops.push((op, n));
    }
    if ops.is_empty() {
        return Err(bad(format!("You must pass in at least one bitwise operation. The format is: {{$bit: {{field: {{and/or/xor: #}}}}}} for field {field}")));
    }
    Ok(ops)
}

fn parse_operator(op: &str, field: &str, v: &Bson) -> Result<Op> {
    Ok(match op {
        "$set" => Op::Set(v.clone()),
        "$setOnInsert" => Op::SetOnInsert(v.clone()),
        "$unset" => Op::Unset,
        "$inc" => Op::Inc(numeric_arg(op, field, v)?),
        "$mul" => Op::Mul(numeric_arg(op, field, v)?),
        "$min" => Op::Min(v.clone()),
        "$max" => Op::Max(v.clone()),
        "$currentDate" => match v {
            Bson::Boolean(_) => Op::CurrentDate { timestamp: false },
            Bson::Document(d) => match (d.len(), d.get("$type")) {
                (1, Some(Bson::String(t))) if t == "date" => Op::CurrentDate { timestamp: false },
                (1, Some(Bson::String(t))) if t == "timestamp" => Op::CurrentDate { timestamp: true },
                (1, Some(_)) => return Err(bad("The '$type' string field is required to be 'date' or 'timestamp': {$currentDate: {field : {$type: 'date'}}}")),
                _ => return Err(bad(format!("Unrecognized $currentDate option: {d}"))),
            },
            other => {
                return Err(bad(format!(
                    "{field}: {other} is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({{$type: 'timestamp/date'}})."
                )))
            }
        },
        "$push" => Op::Push(parse_push(v)?),
        "$addToSet" => {
            let each = match v {
                Bson::Document(d) if d.contains_key("$each") => {
                    if d.len() != 1 {
                        let other = d.keys().find(|k| *k != "$each").cloned().unwrap_or_default();
                        return Err(bad(format!("Found unexpected fields after $each in $addToSet: {other}")));
                    }
                    match d.get("$each") {
                        Some(Bson::Array(items)) => items.clone(),
                        other => {
                            return Err(bad(format!(
                                "The argument to $each in $addToSet must be an array but it was of type {}",
                                crate::expr::type_name(other)
                            )))
                        }
                    }
                }
                other => vec![other.clone()],
            };
            Op::AddToSet(each)
        }
        "$pop" => {
            let n = Num::from_bson(v).ok_or_else(|| bad(format!("Expected a number in: {field}: {v}")))?;
            let x = n.to_f64();
            if x == 1.0 {
                Op::Pop { first: false }
            } else if x == -1.0 {
                Op::Pop { first: true }
            } else {
                return Err(bad(format!("$pop expects 1 or -1, found: {v}")));
            }
        }
        "$pull" => Op::Pull(parse_pull(v)?),
        "$pullAll" => match v {
            Bson::Array(items) => Op::PullAll(items.clone()),
            other => return Err(bad(format!("$pullAll requires an array argument but was given a {}", crate::expr::type_name(Some(other))))),
        },
        "$bit" => Op::Bit(parse_bit(field, v)?),
        "$rename" => {
            let Bson::String(to) = v else {
                return Err(bad(format!("The 'to' field for $rename must be a string: {field}: {v}")));
            };
            // Built in Update::parse: the rename lives at its target path.
            Op::Rename { from: Vec::new(), from_dotted: to.clone() }
        }
        other => return Err(ftp(format!("Unknown modifier: {other}. Expected a valid update modifier or pipeline-style update specified as an array"))),
    })
}

fn is_dynamic(comps: &[Comp]) -> bool {
    comps.iter().any(|c| !matches!(c, Comp::Field(_)))
}

fn is_prefix(a: &[Comp], b: &[Comp]) -> bool {
    a.len() <= b.len() && a.iter().zip(b.iter()).all(|(x, y)| x == y)
}

impl Update {
    pub fn parse(u: &Bson, array_filters: Option<&[Document]>) -> Result<Update> {
        let filters = parse_array_filters(array_filters.unwrap_or(&[]))?;
        match u {
            Bson::Array(stages) => {
                if !filters.is_empty() {
                    return Err(Error::new(Code::FailedToParse, "arrayFilters may not be specified for pipeline-style updates"));
                }
                let mut docs = Vec::with_capacity(stages.len());
                for s in stages {
                    let Bson::Document(d) = s else {
                        return Err(Error::type_mismatch("Each element of the 'pipeline' array must be an object"));
                    };
                    let name = d.keys().next().cloned().unwrap_or_default();
                    if !matches!(name.as_str(), "$addFields" | "$set" | "$project" | "$unset" | "$replaceRoot" | "$replaceWith") {
                        // Unknown names get the pipeline's own error.
                        crate::agg::Pipeline::parse(std::slice::from_ref(d))?;
                        return Err(Error::new(Code::InvalidOptions, format!("{name} is not allowed to be used within an update")));
                    }
                    docs.push(d.clone());
                }
                Ok(Update { kind: Kind::Pipeline(crate::agg::Pipeline::parse(&docs)?) })
            }
            Bson::Document(d) => {
                let operator_style = d.keys().next().is_some_and(|k| k.starts_with('$'));
                if !operator_style {
                    if !filters.is_empty() {
                        return Err(Error::new(Code::FailedToParse, "arrayFilters may not be specified for replacement-style updates"));
                    }
                    for k in d.keys() {
                        if k.starts_with('$') {
                            return Err(Error::new(
                                Code::DollarPrefixedFieldName,
                                format!("The dollar ($) prefixed field '{k}' in '{k}' is not allowed in the context of an update's replacement document. Consider using an aggregation pipeline with $replaceWith."),
                            ));
                        }
                    }
                    return Ok(Update { kind: Kind::Replacement(d.clone()) });
                }
                let mut mods: Vec<Mod> = Vec::new();
                // Every path touched (rename sources included), for conflict detection.
                let mut touched: Vec<(Vec<Comp>, String)> = Vec::new();
                for (op, fields) in d {
                    if !op.starts_with('$') {
                        return Err(ftp(format!("Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update specified as an array")));
                    }
                    let Bson::Document(fields) = fields else {
                        if !is_known_modifier(op) {
                            return Err(ftp(format!(
                                "Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update specified as an array"
                            )));
                        }
                        return Err(ftp(format!(
                            "Modifiers operate on fields but we found type {} instead. For example: {{$mod: {{<field>: ...}}}} not {{{op}: {fields}}}",
                            crate::expr::type_name(Some(fields))
                        )));
                    };
                    if !is_known_modifier(op) {
                        return Err(ftp(format!("Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update specified as an array")));
                    }
                    // mongod 5.0+: an operator with no fields changes nothing.
                    if fields.is_empty() {
                        continue;
                    }
                    for (field, v) in fields {
                        let path = parse_path(field)?;
                        let mut parsed = parse_operator(op, field, v)?;
                        let mut target = path.clone();
                        let mut target_dotted = field.clone();
                        if let Op::Rename { from_dotted, .. } = &parsed {
                            // {$rename: {from: to}}: the modification lives at `to`.
                            let to = from_dotted.clone();
                            let to_path = parse_path(&to)?;
                            if is_dynamic(&path) {
                                return Err(bad(format!("The source field for $rename may not be dynamic: {field}")));
                            }
                            if is_dynamic(&to_path) {
                                return Err(bad(format!("The destination field for $rename may not be dynamic: {to}")));
                            }
                            if to == *field {
                                return Err(bad(format!("The source and target field for $rename must differ: {field}: \"{to}\"")));
                            }
                            if is_prefix(&path, &to_path) || is_prefix(&to_path, &path) {
                                return Err(bad(format!("The source and target field for $rename must not be on the same path: {field}: \"{to}\"")));
                            }
                            parsed = Op::Rename { from: path.clone(), from_dotted: field.clone() };
                            touched.push((path.clone(), field.clone()));
                            target = to_path;
                            target_dotted = to;
                        }
                        touched.push((target.clone(), target_dotted.clone()));
                        mods.push(Mod { path: target, dotted: target_dotted, op: parsed });
                    }
                }
                check_conflicts(&touched)?;
                // Identifiers used must have filters, and every filter must be used.
                for m in &mods {
                    for c in &m.path {
                        if let Comp::Filtered(id) = c {
                            if !filters.iter().any(|(fid, _)| fid == id) {
                                return Err(bad(format!("No array filter found for identifier '{id}' in path '{}'", m.dotted)));
                            }
                        }
                    }
                }
                for (id, _) in &filters {
                    let used = mods.iter().any(|m| m.path.iter().any(|c| matches!(c, Comp::Filtered(x) if x == id)));
                    if !used {
                        return Err(ftp(format!("The array filter for identifier '{id}' was not used in the update {d}")));
                    }
                }
                mods.sort_by(|a, b| cmp_paths(&a.path, &b.path));
                Ok(Update { kind: Kind::Operators { mods, array_filters: filters } })
            }
            other => Err(Error::new(
                Code::FailedToParse,
                format!("Update argument must be either an object or an array, found {}", crate::expr::type_name(Some(other))),
            )),
        }
    }

    pub fn is_replacement(&self) -> bool {
        matches!(self.kind, Kind::Replacement(_))
    }

    pub fn is_pipeline(&self) -> bool {
        matches!(self.kind, Kind::Pipeline(_))
    }

    pub fn form(&self) -> UpdateForm {
        match self.kind {
            Kind::Replacement(_) => UpdateForm::Replacement,
            Kind::Operators { .. } => UpdateForm::Modifiers,
            Kind::Pipeline(_) => UpdateForm::Pipeline,
        }
    }

    pub fn apply(&self, doc: &Document, details: &MatchDetails, is_insert: bool) -> Result<Document> {
        match &self.kind {
            Kind::Replacement(r) => {
                let mut out = Document::new();
                match (doc.get("_id"), r.get("_id")) {
                    (Some(old), Some(new)) => {
                        if !same_value(old, new) {
                            return Err(Error::new(
                                Code::ImmutableField,
                                format!("After applying the update, the (immutable) field '_id' was found to have been altered to _id: {new}"),
                            ));
                        }
                        out.insert("_id", new.clone());
                    }
                    (Some(old), None) => {
                        out.insert("_id", old.clone());
                    }
                    (None, Some(new)) => {
                        check_id_type(new)?;
                        out.insert("_id", new.clone());
                    }
                    (None, None) => {}
                }
                for (k, v) in r {
                    if k != "_id" {
                        out.insert(k.clone(), v.clone());
                    }
                }
                Ok(out)
            }
            Kind::Pipeline(p) => {
                let mut input = std::iter::once(Ok(doc.clone()));
                let mut out = p.run(&mut input, &crate::agg::RunOptions::default())?;
                let mut new = out.pop().unwrap_or_default();
                match (doc.get("_id"), new.get("_id")) {
                    (Some(old), Some(n)) if !same_value(old, n) => {
                        return Err(Error::new(
                            Code::ImmutableField,
                            format!("After applying the update, the (immutable) field '_id' was found to have been altered to _id: {n}"),
                        ));
                    }
                    (Some(old), None) => {
                        let mut with_id = Document::new();
                        with_id.insert("_id", old.clone());
                        for (k, v) in new {
                            with_id.insert(k, v);
                        }
                        new = with_id;
                    }
                    _ => {}
                }
                Ok(new)
            }
            Kind::Operators { mods, array_filters } => {
                let mut root = Bson::Document(doc.clone());
                let ctx = ApplyCtx { details, root_id: id_of(Some(doc)), is_insert, array_filters, now: DateTime::now() };
                for m in mods {
                    if let Op::SetOnInsert(_) = m.op {
                        if !is_insert {
                            continue;
                        }
                    }
                    let path = resolve_positional(&m.path, &m.dotted, details)?;
                    if let Op::Rename { from, from_dotted } = &m.op {
                        let Some(v) = take_for_rename(&mut root, from, from_dotted)? else { continue };
                        check_rename_target(&root, &path, &m.dotted)?;
                        apply_path(&mut root, &path, "", &m.dotted, &Op::Set(v), &ctx)?;
                        continue;
                    }
                    apply_path(&mut root, &path, "", &m.dotted, &m.op, &ctx)?;
                }
                let Bson::Document(out) = root else { return Err(Error::internal("update root is not a document")) };
                match (doc.get("_id"), out.get("_id")) {
                    (Some(old), new) if new.is_none_or(|n| !same_value(old, n)) => {
                        return Err(Error::new(Code::ImmutableField, "Performing an update on the path '_id' would modify the immutable field '_id'"));
                    }
                    (_, Some(new)) => check_id_type(new)?,
                    _ => {}
                }
                Ok(out)
            }
        }
    }
}

fn is_known_modifier(op: &str) -> bool {
    matches!(
        op,
        "$set"
            | "$setOnInsert"
            | "$unset"
            | "$inc"
            | "$mul"
            | "$min"
            | "$max"
            | "$currentDate"
            | "$push"
            | "$addToSet"
            | "$pop"
            | "$pull"
            | "$pullAll"
            | "$bit"
            | "$rename"
    )
}

/// Exact value identity (type and value), as MongoDB's binary comparison of `_id`.
fn same_value(a: &Bson, b: &Bson) -> bool {
    a == b || matches!((a, b), (Bson::Double(x), Bson::Double(y)) if x.is_nan() && y.is_nan())
}

fn check_id_type(v: &Bson) -> Result<()> {
    match v {
        Bson::Array(_) => Err(Error::new(Code::InvalidIdField, "The '_id' value cannot be of type array")),
        Bson::RegularExpression(_) => Err(Error::new(Code::InvalidIdField, "The '_id' value cannot be of type regex")),
        Bson::Undefined => Err(Error::new(Code::InvalidIdField, "The '_id' value cannot be of type undefined")),
        _ => Ok(()),
    }
}

fn check_conflicts(paths: &[(Vec<Comp>, String)]) -> Result<()> {
    for (i, (a, ad)) in paths.iter().enumerate() {
        for (b, bd) in paths.iter().skip(i + 1) {
            let (short, long_dotted) = if a.len() <= b.len() { (a, bd) } else { (b, ad) };
            let long = if a.len() <= b.len() { b } else { a };
            if is_prefix(short, long) {
                let at: Vec<String> = short.iter().map(comp_key).collect();
                return Err(Error::new(
                    Code::ConflictingUpdateOperators,
                    format!("Updating the path '{long_dotted}' would create a conflict at '{}'", at.join(".")),
                ));
            }
        }
    }
    Ok(())
}

fn parse_array_filters(filters: &[Document]) -> Result<Vec<(String, Filter)>> {
    let mut out: Vec<(String, Filter)> = Vec::with_capacity(filters.len());
    for f in filters {
        let mut id: Option<String> = None;
        for k in f.keys() {
            let top = k.split('.').next().unwrap_or("");
            if k.starts_with('$') {
                // $and/$or/... inside an array filter: identifiers come from their children.
                continue;
            }
            match &id {
                None => id = Some(top.to_string()),
                Some(existing) if existing != top => {
                    return Err(ftp(format!(
                        "Error parsing array filter :: caused by :: Expected a single top-level field name, found '{existing}' and '{top}'"
                    )))
                }
                _ => {}
            }
        }
        let id = match id {
            Some(i) => i,
            None => find_filter_identifier(f)
                .ok_or_else(|| ftp("Error parsing array filter :: caused by :: Cannot use an expression without a top-level field name in arrayFilters"))?,
        };
        let mut chars = id.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_lowercase()) && chars.all(|c| c.is_ascii_alphanumeric());
        if !valid {
            return Err(bad(format!(
                "Error parsing array filter :: caused by :: The top-level field name must be an alphanumeric string beginning with a lowercase letter, found '{id}'"
            )));
        }
        if out.iter().any(|(x, _)| *x == id) {
            return Err(ftp(format!("Found multiple array filters with the same top-level field name {id}")));
        }
        out.push((id, Filter::parse(f)?));
    }
    Ok(out)
}

fn find_filter_identifier(f: &Document) -> Option<String> {
    for (k, v) in f {
        if !k.starts_with('$') {
            return Some(k.split('.').next().unwrap_or("").to_string());
        }
        if let Bson::Array(items) = v {
            for i in items {
                if let Bson::Document(d) = i {
                    if let Some(id) = find_filter_identifier(d) {
                        return Some(id);
                    }
                }
            }
        }
    }
    None
}

struct ApplyCtx<'a> {
    details: &'a MatchDetails,
    /// "{_id: ...}" of the document being updated, for error messages.
    root_id: String,
    is_insert: bool,
    array_filters: &'a [(String, Filter)],
    now: DateTime,
}

fn resolve_positional(path: &[Comp], dotted: &str, details: &MatchDetails) -> Result<Vec<Comp>> {
    if !path.iter().any(|c| matches!(c, Comp::Positional)) {
        return Ok(path.to_vec());
    }
    let Some(idx) = details.elem_match_index else {
        return Err(bad("The positional operator did not find the match needed from the query."));
    };
    let _ = dotted;
    Ok(path
        .iter()
        .map(|c| match c {
            Comp::Positional => Comp::Field(idx.to_string()),
            other => other.clone(),
        })
        .collect())
}

fn short(v: &Bson) -> String {
    let s = v.to_string();
    if s.len() > 200 {
        format!("{}...", &s[..s.char_indices().nth(200).map(|(i, _)| i).unwrap_or(s.len())])
    } else {
        s
    }
}

/// Remove and return the value at a rename source (no arrays allowed on the way).
fn take_for_rename(root: &mut Bson, from: &[Comp], dotted: &str) -> Result<Option<Bson>> {
    let mut cur = root;
    for (i, c) in from.iter().enumerate() {
        let Comp::Field(name) = c else { return Ok(None) };
        let last = i + 1 == from.len();
        match cur {
            Bson::Document(d) => {
                if last {
                    return Ok(d.remove(name));
                }
                match d.get_mut(name) {
                    Some(next) => cur = next,
                    None => return Ok(None),
                }
            }
            Bson::Array(_) => return Err(bad(format!("The source field cannot be an array element, '{dotted}' in doc with an array on the path"))),
            _ => return Ok(None),
        }
    }
    Ok(None)
}

fn check_rename_target(root: &Bson, path: &[Comp], dotted: &str) -> Result<()> {
    let mut cur = root;
    for c in path {
        let Comp::Field(name) = c else { return Ok(()) };
        match cur {
            Bson::Document(d) => match d.get(name) {
                Some(next) => cur = next,
                None => return Ok(()),
            },
            Bson::Array(_) => return Err(bad(format!("The destination field cannot be an array element, '{dotted}' in doc with an array on the path"))),
            _ => return Ok(()),
        }
    }
    Ok(())
}

impl Op {
    /// Does applying this to a missing field create it (and the path to it)?
    fn creates(&self, ctx: &ApplyCtx) -> bool {
        match self {
            Op::Unset | Op::Pop { .. } | Op::Pull(_) | Op::PullAll(_) | Op::Rename { .. } => false,
            Op::SetOnInsert(_) => ctx.is_insert,
            _ => true,
        }
    }
}

enum Outcome {
    Keep,
    Set(Bson),
    Remove,
}

fn type_of(v: &Bson) -> &'static str {
    crate::expr::type_name(Some(v))
}

fn id_of(ctx_doc: Option<&Document>) -> String {
    match ctx_doc.and_then(|d| d.get("_id")) {
        Some(id) => format!("{{_id: {id}}}"),
        None => "{}".into(),
    }
}

/// Compute the new value of one field. `field` is its name (for messages).
fn compute(op: &Op, existing: Option<&Bson>, field: &str, ctx: &ApplyCtx, root_id: &str) -> Result<Outcome> {
    Ok(match op {
        Op::Set(v) | Op::SetOnInsert(v) => Outcome::Set(v.clone()),
        Op::Unset => {
            if existing.is_some() {
                Outcome::Remove
            } else {
                Outcome::Keep
            }
        }
        Op::Inc(n) | Op::Mul(n) => {
            let is_inc = matches!(op, Op::Inc(_));
            match existing {
                None => Outcome::Set(if is_inc {
                    n.to_bson()
                } else {
                    match n {
                        Num::I32(_) => Bson::Int32(0),
                        Num::I64(_) => Bson::Int64(0),
                        Num::F64(_) => Bson::Double(0.0),
                        Num::Dec(_) => Bson::Decimal128(crate::decimal::Dec::zero().encode()),
                    }
                }),
                Some(cur) => {
                    let Some(c) = Num::from_bson(cur) else {
                        let name = if is_inc { "$inc" } else { "$mul" };
                        return Err(Error::type_mismatch(format!(
                            "Cannot apply {name} to a value of non-numeric type. {root_id} has the field '{field}' of non-numeric type {}",
                            type_of(cur)
                        )));
                    };
                    let aop = if is_inc { ArithOp::Add } else { ArithOp::Mul };
                    let r = c.arith(*n, aop, DecPrecision::Digits34, true).ok_or_else(|| {
                        bad(format!("Failed to apply {} operations to current value ({cur}) for document {root_id}", if is_inc { "$inc" } else { "$mul" }))
                    })?;
                    Outcome::Set(r.to_bson())
                }
            }
        }
        Op::Min(v) | Op::Max(v) => match existing {
            None => Outcome::Set(v.clone()),
            Some(cur) => {
                let o = cmp_bson(v, cur);
                let replace = if matches!(op, Op::Min(_)) { o == Ordering::Less } else { o == Ordering::Greater };
                if replace {
                    Outcome::Set(v.clone())
                } else {
                    Outcome::Keep
                }
            }
        },
        Op::CurrentDate { timestamp } => Outcome::Set(if *timestamp {
            Bson::Timestamp(bson::Timestamp { time: (ctx.now.timestamp_millis() / 1000).clamp(0, u32::MAX as i64) as u32, increment: 1 })
        } else {
            Bson::DateTime(ctx.now)
        }),
        Op::Push(spec) => {
            let mut items = match existing {
                None => Vec::new(),
                Some(Bson::Array(a)) => a.clone(),
                Some(other) => return Err(bad(format!("The field '{field}' must be an array but is of type {} in document {root_id}", type_of(other)))),
            };
            let pos = match spec.position {
                None => items.len(),
                Some(p) if p >= 0 => (p as usize).min(items.len()),
                Some(p) => items.len().saturating_sub(p.unsigned_abs() as usize),
            };
            let tail = items.split_off(pos);
            items.extend(spec.each.iter().cloned());
            items.extend(tail);
            if let Some(sort) = &spec.sort {
                match sort {
                    PushSort::Whole { ascending } => items.sort_by(|a, b| {
                        let o = cmp_bson(a, b);
                        if *ascending {
                            o
                        } else {
                            o.reverse()
                        }
                    }),
                    PushSort::Pattern(s) => {
                        let empty = Document::new();
                        items.sort_by(|a, b| {
                            let da = if let Bson::Document(d) = a { d } else { &empty };
                            let db = if let Bson::Document(d) = b { d } else { &empty };
                            s.compare(da, db)
                        })
                    }
                }
            }
            if let Some(n) = spec.slice {
                if n >= 0 {
                    items.truncate(n as usize);
                } else {
                    let keep = n.unsigned_abs() as usize;
                    if items.len() > keep {
                        items.drain(..items.len() - keep);
                    }
                }
            }
            Outcome::Set(Bson::Array(items))
        }
        Op::AddToSet(values) => {
            let mut items = match existing {
                None => Vec::new(),
                Some(Bson::Array(a)) => a.clone(),
                Some(other) => {
                    return Err(bad(format!("Cannot apply $addToSet to non-array field. Field named '{field}' has non-array type {}", type_of(other))))
                }
            };
            let before = items.len();
            for v in values {
                if !items.iter().any(|i| same_set_member(i, v)) {
                    items.push(v.clone());
                }
            }
            if existing.is_some() && items.len() == before {
                Outcome::Keep
            } else {
                Outcome::Set(Bson::Array(items))
            }
        }
        Op::Pop { first } => match existing {
            None => Outcome::Keep,
            Some(Bson::Array(a)) => {
                if a.is_empty() {
                    Outcome::Keep
                } else {
                    let mut items = a.clone();
                    if *first {
                        items.remove(0);
                    } else {
                        items.pop();
                    }
                    Outcome::Set(Bson::Array(items))
                }
            }
            Some(other) => return Err(Error::type_mismatch(format!("Path '{field}' contains an element of non-array type '{}'", type_of(other)))),
        },
        Op::Pull(cond) => match existing {
            None => Outcome::Keep,
            Some(Bson::Array(a)) => {
                let items: Vec<Bson> = a.iter().filter(|e| !cond.matches(e)).cloned().collect();
                if items.len() == a.len() {
                    Outcome::Keep
                } else {
                    Outcome::Set(Bson::Array(items))
                }
            }
            Some(_) => return Err(bad("Cannot apply $pull to a non-array value")),
        },
        Op::PullAll(values) => match existing {
            None => Outcome::Keep,
            Some(Bson::Array(a)) => {
                let items: Vec<Bson> = a.iter().filter(|e| !values.iter().any(|v| same_set_member(e, v))).cloned().collect();
                if items.len() == a.len() {
                    Outcome::Keep
                } else {
                    Outcome::Set(Bson::Array(items))
                }
            }
            Some(_) => return Err(bad("Cannot apply $pull to a non-array value")),
        },
        Op::Bit(ops) => {
            let start = match existing {
                None => match ops.first().map(|o| o.1) {
                    Some(Num::I64(_)) => Num::I64(0),
                    _ => Num::I32(0),
                },
                Some(Bson::Int32(i)) => Num::I32(*i),
                Some(Bson::Int64(i)) => Num::I64(*i),
                Some(other) => {
                    return Err(bad(format!(
                        "Cannot apply $bit to a value of non-integral type.{root_id} has the field {field} of non-integer type {}",
                        type_of(other)
                    )))
                }
            };
            let mut acc = start;
            for (bop, n) in ops {
                acc = bit_apply(acc, *bop, *n);
            }
            Outcome::Set(acc.to_bson())
        }
        Op::Rename { .. } => Outcome::Keep,
    })
}

/// $addToSet/$pullAll compare with MongoDB's equality, but numbers of different types stay
/// distinct only when their values differ.
fn same_set_member(a: &Bson, b: &Bson) -> bool {
    bson_eq(a, b)
}

fn bit_apply(acc: Num, op: BitOp, n: Num) -> Num {
    let f = |a: i64, b: i64| match op {
        BitOp::And => a & b,
        BitOp::Or => a | b,
        BitOp::Xor => a ^ b,
    };
    match (acc, n) {
        (Num::I32(a), Num::I32(b)) => Num::I32(f(a as i64, b as i64) as i32),
        (a, b) => Num::I64(f(a.to_i64().unwrap_or(0), b.to_i64().unwrap_or(0))),
    }
}

fn not_viable(field: &str, parent_name: &str, parent: &Bson) -> Error {
    Error::new(Code::PathNotViable, format!("Cannot create field '{field}' in element {{{parent_name}: {}}}", short(parent)))
}

/// Apply `op` at `path` below `cur` (a document or array). `cur_name` names `cur` in errors.
/// Continue `rest` of the path inside `child` (named `name`). A scalar in the way is an error
/// only for operators that would create the path; the others leave the document alone.
fn descend(child: &mut Bson, rest: &[Comp], name: &str, dotted: &str, op: &Op, ctx: &ApplyCtx) -> Result<()> {
    match child {
        Bson::Document(_) | Bson::Array(_) => apply_path(child, rest, name, dotted, op, ctx),
        _ if !op.creates(ctx) => Ok(()),
        other => match &rest[0] {
            Comp::Field(next) => Err(not_viable(next, name, other)),
            _ => Err(bad(format!("Cannot apply array updates to non-array element {name}: {}", short(other)))),
        },
    }
}

fn apply_path(cur: &mut Bson, path: &[Comp], cur_name: &str, dotted: &str, op: &Op, ctx: &ApplyCtx) -> Result<()> {
    let Some((first, rest)) = path.split_first() else { return Ok(()) };
    let root_id = ctx.root_id.as_str();
    match first {
        Comp::Field(name) => match cur {
            Bson::Document(d) => {
                if rest.is_empty() {
                    let outcome = compute(op, d.get(name), name, ctx, root_id)?;
                    match outcome {
                        Outcome::Keep => {}
                        Outcome::Set(v) => {
                            if d.get(name).is_none() && !op.creates(ctx) {
                                return Ok(());
                            }
                            d.insert(name.clone(), v);
                        }
                        Outcome::Remove => {
                            d.remove(name);
                        }
                    }
                    return Ok(());
                }
                if !d.contains_key(name) {
                    if !op.creates(ctx) {
                        return Ok(());
                    }
                    if rest.iter().any(|c| matches!(c, Comp::All | Comp::Filtered(_))) {
                        return Err(Error::new(
                            Code::PathNotViable,
                            format!("The path '{dotted}' must exist in the document in order to apply array updates."),
                        ));
                    }
                    d.insert(name.clone(), Document::new());
                }
                let Some(child) = d.get_mut(name) else { return Ok(()) };
                descend(child, rest, name, dotted, op, ctx)
            }
            Bson::Array(items) => {
                let idx = if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) { name.parse::<usize>().ok() } else { None };
                let Some(idx) = idx else {
                    if !op.creates(ctx) {
                        return Ok(());
                    }
                    return Err(not_viable(name, cur_name, &Bson::Array(items.clone())));
                };
                if rest.is_empty() {
                    let outcome = compute(op, items.get(idx), name, ctx, root_id)?;
                    match outcome {
                        Outcome::Keep => {}
                        Outcome::Set(v) => {
                            if idx < items.len() {
                                items[idx] = v;
                            } else {
                                if !op.creates(ctx) {
                                    return Ok(());
                                }
                                pad(items, idx)?;
                                items.push(v);
                            }
                        }
                        // $unset of an array element leaves a null hole, as MongoDB does.
                        Outcome::Remove => {
                            if let Some(slot) = items.get_mut(idx) {
                                *slot = Bson::Null;
                            }
                        }
                    }
                    return Ok(());
                }
                if idx >= items.len() {
                    if !op.creates(ctx) {
                        return Ok(());
                    }
                    pad(items, idx)?;
                    items.push(Bson::Document(Document::new()));
                }
                let Some(child) = items.get_mut(idx) else { return Ok(()) };
                descend(child, rest, name, dotted, op, ctx)
            }
            _ => Ok(()),
        },
        Comp::All | Comp::Filtered(_) => {
            let Bson::Array(items) = cur else {
                return Err(bad(format!("Cannot apply array updates to non-array element {cur_name}: {}", short(cur))));
            };
            let filter = match first {
                Comp::Filtered(id) => ctx.array_filters.iter().find(|(fid, _)| fid == id).map(|(fid, f)| (fid.as_str(), f)),
                _ => None,
            };
            for (i, item) in items.iter_mut().enumerate() {
                if let Some((id, f)) = filter {
                    let mut probe = Document::new();
                    probe.insert(id, item.clone());
                    if !f.try_matches(&probe)? {
                        continue;
                    }
                }
                let name = i.to_string();
                if rest.is_empty() {
                    match compute(op, Some(item), &name, ctx, root_id)? {
                        Outcome::Keep => {}
                        Outcome::Set(v) => *item = v,
                        Outcome::Remove => *item = Bson::Null,
                    }
                    continue;
                }
                descend(item, rest, &name, dotted, op, ctx)?;
            }
            let _ = ctx.details;
            Ok(())
        }
        Comp::Positional => Err(bad("The positional operator did not find the match needed from the query.")),
    }
}

fn pad(items: &mut Vec<Bson>, idx: usize) -> Result<()> {
    if idx > ARRAY_PAD_INDEX_MAX {
        return Err(bad(format!("can't backfill array to larger than {ARRAY_PAD_INDEX_MAX} elements")));
    }
    while items.len() < idx {
        items.push(Bson::Null);
    }
    Ok(())
}

/// Seed document for an upsert insert: the equality fields of the query.
pub fn upsert_seed(filter: &Document) -> Result<Document> {
    let mut fields: Vec<(String, Bson)> = Vec::new();
    collect_equalities(filter, &mut fields)?;
    // _id first, as inserted documents keep it.
    fields.sort_by_key(|(k, _)| if k == "_id" || k.starts_with("_id.") { 0 } else { 1 });
    let mut root = Bson::Document(Document::new());
    let mut seen: Vec<Vec<String>> = Vec::new();
    for (path, v) in fields {
        let parts: Vec<String> = path.split('.').map(str::to_string).collect();
        for s in &seen {
            if *s == parts {
                return Err(Error::new(Code::NotSingleValueField, format!("cannot infer query fields to set, path '{path}' is matched twice")));
            }
            let (a, b) = if s.len() < parts.len() { (s, &parts) } else { (&parts, s) };
            if a.len() < b.len() && b.starts_with(a) {
                return Err(Error::new(
                    Code::NotSingleValueField,
                    format!("cannot infer query fields to set, both paths '{}' and '{}' are matched", a.join("."), b.join(".")),
                ));
            }
        }
        seen.push(parts.clone());
        let comps: Vec<Comp> = parts.into_iter().map(Comp::Field).collect();
        let ctx = ApplyCtx { details: &MatchDetails::default(), root_id: String::new(), is_insert: true, array_filters: &[], now: DateTime::now() };
        apply_path(&mut root, &comps, "", &path, &Op::Set(v), &ctx)?;
    }
    match root {
        Bson::Document(d) => Ok(d),
        _ => Ok(Document::new()),
    }
}

fn collect_equalities(filter: &Document, out: &mut Vec<(String, Bson)>) -> Result<()> {
    for (k, v) in filter {
        match k.as_str() {
            "$and" => {
                if let Bson::Array(items) = v {
                    for i in items {
                        if let Bson::Document(d) = i {
                            collect_equalities(d, out)?;
                        }
                    }
                }
            }
            "$or" => {
                // A single-clause $or is an $and.
                if let Bson::Array(items) = v {
                    if let [Bson::Document(d)] = items.as_slice() {
                        collect_equalities(d, out)?;
                    }
                }
            }
            _ if k.starts_with('$') => {}
            _ => {
                if k.split('.').any(|p| p.starts_with('$')) {
                    continue;
                }
                match v {
                    Bson::Document(d) if d.keys().next().is_some_and(|f| f.starts_with('$')) && !d.contains_key("$ref") => {
                        if let Some(eq) = d.get("$eq") {
                            if !matches!(eq, Bson::RegularExpression(_)) {
                                out.push((k.clone(), eq.clone()));
                            }
                        } else if let Some(Bson::Array(items)) = d.get("$in") {
                            if let [single] = items.as_slice() {
                                if !matches!(single, Bson::RegularExpression(_)) {
                                    out.push((k.clone(), single.clone()));
                                }
                            }
                        }
                    }
                    Bson::RegularExpression(_) => {}
                    other => out.push((k.clone(), other.clone())),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn up(u: Document, d: Document) -> Result<Document> {
        Update::parse(&Bson::Document(u), None)?.apply(&d, &MatchDetails::default(), false)
    }

    #[test]
    fn set_unset_and_paths() {
        assert_eq!(up(doc! {"$set": {"b": 2}}, doc! {"_id": 1, "a": 1}).unwrap(), doc! {"_id": 1, "a": 1, "b": 2});
        assert_eq!(up(doc! {"$set": {"a.b.c": 2}}, doc! {"_id": 1}).unwrap(), doc! {"_id": 1, "a": {"b": {"c": 2}}});
        assert_eq!(up(doc! {"$set": {"z": 1, "b": 1, "a": 1}}, doc! {"_id": 1}).unwrap(), doc! {"_id": 1, "a": 1, "b": 1, "z": 1});
        assert_eq!(up(doc! {"$set": {"a.1": 9}}, doc! {"_id": 1, "a": [1, 2]}).unwrap(), doc! {"_id": 1, "a": [1, 9]});
        assert_eq!(up(doc! {"$set": {"a.3": 9}}, doc! {"_id": 1, "a": [1]}).unwrap(), doc! {"_id": 1, "a": [1, null, null, 9]});
        assert_eq!(up(doc! {"$set": {"a.0.b": 9}}, doc! {"_id": 1, "a": [{"b": 1}]}).unwrap(), doc! {"_id": 1, "a": [{"b": 9}]});
        assert_eq!(up(doc! {"$unset": {"a": ""}}, doc! {"_id": 1, "a": 1, "b": 2}).unwrap(), doc! {"_id": 1, "b": 2});
        assert_eq!(up(doc! {"$unset": {"a.0": 1}}, doc! {"_id": 1, "a": [1, 2]}).unwrap(), doc! {"_id": 1, "a": [null, 2]});
        assert_eq!(up(doc! {"$unset": {"x.y": 1}}, doc! {"_id": 1}).unwrap(), doc! {"_id": 1});
        let e = up(doc! {"$set": {"a.b": 1}}, doc! {"_id": 1, "a": 5}).unwrap_err();
        assert_eq!(e.code, 28);
        let e = up(doc! {"$set": {"a.b": 1}}, doc! {"_id": 1, "a": [1]}).unwrap_err();
        assert_eq!(e.code, 28);
        let e = up(doc! {"$set": {"_id": 2}}, doc! {"_id": 1}).unwrap_err();
        assert_eq!(e.code, 66);
        assert_eq!(e.message, "Performing an update on the path '_id' would modify the immutable field '_id'");
        assert!(up(doc! {"$set": {"_id": 1}}, doc! {"_id": 1}).is_ok());
    }

    #[test]
    fn empty_operators_change_nothing() {
        assert_eq!(up(doc! {"$set": {}}, doc! {"_id": 1, "a": 1}).unwrap(), doc! {"_id": 1, "a": 1});
        assert_eq!(up(doc! {"$set": {}, "$inc": {"a": 1}}, doc! {"_id": 1, "a": 1}).unwrap(), doc! {"_id": 1, "a": 2});
    }

    #[test]
    fn parse_errors() {
        let p = |u: Document| Update::parse(&Bson::Document(u), None).unwrap_err();
        assert_eq!(p(doc! {"$set": {"a": 1}, "b": 1}).code, 9);
        assert_eq!(p(doc! {"a": 1, "$set": {"b": 1}}).code, 52);
        let e = p(doc! {"$foo": {"a": 1}});
        assert_eq!(e.code, 9);
        assert!(e.message.starts_with("Unknown modifier: $foo"));
        assert_eq!(p(doc! {"$set": 1}).code, 9);
        let e = p(doc! {"$set": {"a": 1}, "$inc": {"a.b": 1}});
        assert_eq!(e.code, 40);
        assert_eq!(e.message, "Updating the path 'a.b' would create a conflict at 'a'");
        assert_eq!(p(doc! {"$set": {"a": 1}, "$unset": {"a": 1}}).code, 40);
        assert_eq!(p(doc! {"$inc": {"a": "x"}}).code, 14);
        assert_eq!(p(doc! {"$rename": {"a": "a"}}).code, 2);
        assert_eq!(p(doc! {"$rename": {"a": "a.b"}}).code, 2);
        assert_eq!(p(doc! {"$pop": {"a": 2}}).code, 2);
    }

    #[test]
    fn arithmetic() {
        assert_eq!(up(doc! {"$inc": {"a": 1}}, doc! {"_id": 1, "a": 1}).unwrap(), doc! {"_id": 1, "a": 2});
        assert_eq!(up(doc! {"$inc": {"a": 1}}, doc! {"_id": 1}).unwrap(), doc! {"_id": 1, "a": 1});
        assert_eq!(up(doc! {"$inc": {"a": 1}}, doc! {"_id": 1, "a": i32::MAX}).unwrap(), doc! {"_id": 1, "a": 2147483648i64});
        assert_eq!(up(doc! {"$inc": {"a": 1.5}}, doc! {"_id": 1, "a": 1}).unwrap(), doc! {"_id": 1, "a": 2.5});
        assert_eq!(up(doc! {"$inc": {"a": 1i64}}, doc! {"_id": 1, "a": 1}).unwrap(), doc! {"_id": 1, "a": 2i64});
        assert_eq!(up(doc! {"$inc": {"a": 1}}, doc! {"_id": 1, "a": "x"}).unwrap_err().code, 14);
        assert_eq!(up(doc! {"$mul": {"a": 2}}, doc! {"_id": 1}).unwrap(), doc! {"_id": 1, "a": 0});
        assert_eq!(up(doc! {"$mul": {"a": 2.5}}, doc! {"_id": 1}).unwrap(), doc! {"_id": 1, "a": 0.0});
        assert_eq!(up(doc! {"$mul": {"a": 3}}, doc! {"_id": 1, "a": 4}).unwrap(), doc! {"_id": 1, "a": 12});
        assert_eq!(up(doc! {"$min": {"a": 3}}, doc! {"_id": 1, "a": 4}).unwrap(), doc! {"_id": 1, "a": 3});
        assert_eq!(up(doc! {"$min": {"a": 5}}, doc! {"_id": 1, "a": 4}).unwrap(), doc! {"_id": 1, "a": 4});
        assert_eq!(up(doc! {"$max": {"a": "s"}}, doc! {"_id": 1, "a": 4}).unwrap(), doc! {"_id": 1, "a": "s"});
        assert_eq!(up(doc! {"$bit": {"a": {"and": 10}}}, doc! {"_id": 1, "a": 13}).unwrap(), doc! {"_id": 1, "a": 8});
        assert_eq!(up(doc! {"$bit": {"a": {"or": 5i64}}}, doc! {"_id": 1, "a": 2}).unwrap(), doc! {"_id": 1, "a": 7i64});
        let d = up(doc! {"$currentDate": {"d": true, "t": {"$type": "timestamp"}}}, doc! {"_id": 1}).unwrap();
        assert!(matches!(d.get("d"), Some(Bson::DateTime(_))));
        assert!(matches!(d.get("t"), Some(Bson::Timestamp(_))));
    }

    #[test]
    fn arrays() {
        assert_eq!(up(doc! {"$push": {"a": 3}}, doc! {"_id": 1, "a": [1]}).unwrap(), doc! {"_id": 1, "a": [1, 3]});
        assert_eq!(up(doc! {"$push": {"a": 3}}, doc! {"_id": 1}).unwrap(), doc! {"_id": 1, "a": [3]});
        assert_eq!(up(doc! {"$push": {"a": 3}}, doc! {"_id": 1, "a": 1}).unwrap_err().code, 2);
        let u = doc! {"$push": {"q": {"$each": [{"s": 9}, {"s": 1}, {"s": 5}], "$sort": {"s": -1}, "$slice": 2}}};
        assert_eq!(up(u, doc! {"_id": 1, "q": [{"s": 7}]}).unwrap(), doc! {"_id": 1, "q": [{"s": 9}, {"s": 7}]});
        let u = doc! {"$push": {"a": {"$each": [20, 30], "$position": 1}}};
        assert_eq!(up(u, doc! {"_id": 1, "a": [1, 2]}).unwrap(), doc! {"_id": 1, "a": [1, 20, 30, 2]});
        let u = doc! {"$push": {"a": {"$each": [5], "$position": -1}}};
        assert_eq!(up(u, doc! {"_id": 1, "a": [1, 2]}).unwrap(), doc! {"_id": 1, "a": [1, 5, 2]});
        let u = doc! {"$push": {"a": {"$each": [3, 1], "$sort": 1, "$slice": -2}}};
        assert_eq!(up(u, doc! {"_id": 1, "a": [2]}).unwrap(), doc! {"_id": 1, "a": [2, 3]});
        assert_eq!(up(doc! {"$addToSet": {"a": 1}}, doc! {"_id": 1, "a": [1.0]}).unwrap(), doc! {"_id": 1, "a": [1.0]});
        assert_eq!(up(doc! {"$addToSet": {"a": {"$each": [2, 3, 2]}}}, doc! {"_id": 1, "a": [1]}).unwrap(), doc! {"_id": 1, "a": [1, 2, 3]});
        assert_eq!(up(doc! {"$pop": {"a": -1}}, doc! {"_id": 1, "a": [1, 2]}).unwrap(), doc! {"_id": 1, "a": [2]});
        assert_eq!(up(doc! {"$pop": {"a": 1}}, doc! {"_id": 1, "a": [1, 2]}).unwrap(), doc! {"_id": 1, "a": [1]});
        assert_eq!(up(doc! {"$pull": {"a": {"$gte": 6}}}, doc! {"_id": 1, "a": [5, 6, 7, 1]}).unwrap(), doc! {"_id": 1, "a": [5, 1]});
        assert_eq!(up(doc! {"$pull": {"a": 1}}, doc! {"_id": 1, "a": [1, 2, 1.0]}).unwrap(), doc! {"_id": 1, "a": [2]});
        let d = doc! {"_id": 1, "results": [{"score": 8, "item": "A"}, {"score": 8, "item": "B"}]};
        assert_eq!(up(doc! {"$pull": {"results": {"score": 8, "item": "B"}}}, d).unwrap(), doc! {"_id": 1, "results": [{"score": 8, "item": "A"}]});
        assert_eq!(up(doc! {"$pullAll": {"a": [0, 5]}}, doc! {"_id": 1, "a": [0, 2, 5, 5]}).unwrap(), doc! {"_id": 1, "a": [2]});
    }

    #[test]
    fn rename() {
        assert_eq!(up(doc! {"$rename": {"a": "z"}}, doc! {"_id": 1, "a": 1, "b": 2}).unwrap(), doc! {"_id": 1, "b": 2, "z": 1});
        assert_eq!(up(doc! {"$rename": {"a.b": "c"}}, doc! {"_id": 1, "a": {"b": 1}}).unwrap(), doc! {"_id": 1, "a": {}, "c": 1});
        assert_eq!(up(doc! {"$rename": {"nope": "c"}}, doc! {"_id": 1}).unwrap(), doc! {"_id": 1});
        assert_eq!(up(doc! {"$rename": {"a.0": "c"}}, doc! {"_id": 1, "a": [1]}).unwrap_err().code, 2);
    }

    #[test]
    fn positional_operators() {
        let d = doc! {"_id": 1, "grades": [80, 85, 90]};
        let f = Filter::parse(&doc! {"grades": 85}).unwrap();
        let (_, details) = f.matches_details(&d);
        let u = Update::parse(&Bson::Document(doc! {"$set": {"grades.$": 82}}), None).unwrap();
        assert_eq!(u.apply(&d, &details, false).unwrap(), doc! {"_id": 1, "grades": [80, 82, 90]});
        assert_eq!(u.apply(&d, &MatchDetails::default(), false).unwrap_err().code, 2);

        assert_eq!(up(doc! {"$inc": {"a.$[]": 1}}, doc! {"_id": 1, "a": [1, 2]}).unwrap(), doc! {"_id": 1, "a": [2, 3]});
        assert_eq!(up(doc! {"$inc": {"a.$[].n": 1}}, doc! {"_id": 1, "a": [{"n": 1}, {}]}).unwrap(), doc! {"_id": 1, "a": [{"n": 2}, {"n": 1}]});
        assert_eq!(up(doc! {"$set": {"a.$[]": 1}}, doc! {"_id": 1}).unwrap_err().code, 28);

        let filters = vec![doc! {"elem": {"$gte": 100}}];
        let u = Update::parse(&Bson::Document(doc! {"$set": {"grades.$[elem]": 100}}), Some(&filters)).unwrap();
        let d = doc! {"_id": 1, "grades": [95, 102, 90, 150]};
        assert_eq!(u.apply(&d, &MatchDetails::default(), false).unwrap(), doc! {"_id": 1, "grades": [95, 100, 90, 100]});
        let filters = vec![doc! {"e.grade": {"$gte": 85}}];
        let u = Update::parse(&Bson::Document(doc! {"$set": {"g.$[e].mean": 100}}), Some(&filters)).unwrap();
        let d = doc! {"_id": 1, "g": [{"grade": 80, "mean": 75}, {"grade": 85, "mean": 90}]};
        assert_eq!(u.apply(&d, &MatchDetails::default(), false).unwrap(), doc! {"_id": 1, "g": [{"grade": 80, "mean": 75}, {"grade": 85, "mean": 100}]});
        let unused = vec![doc! {"x": 1}];
        assert_eq!(Update::parse(&Bson::Document(doc! {"$set": {"a": 1}}), Some(&unused)).unwrap_err().code, 9);
        assert_eq!(Update::parse(&Bson::Document(doc! {"$set": {"a.$[y]": 1}}), None).unwrap_err().code, 2);
    }

    #[test]
    fn replacement_and_set_on_insert() {
        let u = Update::parse(&Bson::Document(doc! {"x": 1, "_id": 1}), None).unwrap();
        assert!(u.is_replacement());
        assert_eq!(u.apply(&doc! {"_id": 1, "y": 2}, &MatchDetails::default(), false).unwrap(), doc! {"_id": 1, "x": 1});
        let u = Update::parse(&Bson::Document(doc! {"x": 1}), None).unwrap();
        assert_eq!(u.apply(&doc! {"_id": 7, "y": 2}, &MatchDetails::default(), false).unwrap(), doc! {"_id": 7, "x": 1});
        let u = Update::parse(&Bson::Document(doc! {"_id": 2}), None).unwrap();
        assert_eq!(u.apply(&doc! {"_id": 1}, &MatchDetails::default(), false).unwrap_err().code, 66);
        let u = Update::parse(&Bson::Document(doc! {"$setOnInsert": {"n": 1}, "$set": {"m": 1}}), None).unwrap();
        assert_eq!(u.apply(&doc! {"_id": 1}, &MatchDetails::default(), false).unwrap(), doc! {"_id": 1, "m": 1});
        assert_eq!(u.apply(&doc! {"_id": 1}, &MatchDetails::default(), true).unwrap(), doc! {"_id": 1, "m": 1, "n": 1});
    }

    #[test]
    fn upsert_seeds() {
        assert_eq!(
            upsert_seed(&doc! {"a": 1, "b.c": 2, "$and": [{"d": 3}], "e": {"$gt": 1}, "f": {"$eq": 4}}).unwrap(),
            doc! {"a": 1, "b": {"c": 2}, "d": 3, "f": 4}
        );
        assert_eq!(upsert_seed(&doc! {"x": 1, "_id": 5}).unwrap(), doc! {"_id": 5, "x": 1});
        assert_eq!(upsert_seed(&doc! {"a": 1, "a.b": 2}).unwrap_err().code, 54);
    }
}
