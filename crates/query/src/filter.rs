//! Query predicates (the `filter` of find/update/delete/count and `$match`), matching with
//! MongoDB's path semantics: implicit traversal of arrays, numeric path components, and
//! "missing equals null".

use crate::compare::{canonical_rank, cmp_bson};
use crate::expr::Expr;
use bson::{Bson, Document};
use common::{Code, Error, Result};
use std::cmp::Ordering;

/// A parsed query predicate.
#[derive(Clone, Debug)]
pub struct Filter {
    root: Node,
    id_eq: Option<Bson>,
}

/// Side information of a match needed by the positional `$` update / projection operator.
#[derive(Default, Clone, Debug)]
pub struct MatchDetails {
    /// Index of the array element that matched, in the outermost array traversed implicitly.
    pub elem_match_index: Option<usize>,
}

#[derive(Clone, Debug)]
enum Node {
    And(Vec<Node>),
    Or(Vec<Node>),
    Nor(Vec<Node>),
    Not(Box<Node>),
    Leaf(Path, Leaf),
    Expr(Box<Expr>),
    SampleRate(f64),
    True,
    False,
}

#[derive(Clone, Debug)]
struct Path {
    parts: Vec<Part>,
}

#[derive(Clone, Debug)]
struct Part {
    name: String,
    /// Set when the component is a canonical array index ("0", "12"; not "01").
    index: Option<usize>,
}

impl Path {
    fn parse(s: &str) -> Path {
        Path {
            parts: s
                .split('.')
                .map(|p| Part {
                    name: p.to_string(),
                    index: if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (p.len() == 1 || !p.starts_with('0')) { p.parse().ok() } else { None },
                })
                .collect(),
        }
    }
    fn is_single(&self, name: &str) -> bool {
        self.parts.len() == 1 && self.parts[0].name == name
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum CmpOp {
    Eq,
    Lt,
    Lte,
    Gt,
    Gte,
}

#[derive(Clone, Debug)]
enum Leaf {
    Cmp(CmpOp, Bson),
    In { values: Vec<Bson>, regexes: Vec<Re> },
    Exists,
    Type(TypeSet),
    Regex(Re),
    Mod { divisor: i64, remainder: i64 },
    Size(i64),
    ElemMatchObj(Box<Node>),
    ElemMatchValue(Vec<Pred>),
    Bits { kind: BitsKind, mask: Vec<u8> },
}

/// A predicate on a single value, as used inside `$elemMatch` (value form) and `$not`.
#[derive(Clone, Debug)]
enum Pred {
    Leaf(Leaf),
    Not(Vec<Pred>),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum BitsKind {
    AllSet,
    AnySet,
    AllClear,
    AnyClear,
}

/// A compiled regular expression plus its source (for equality with stored regexes).
#[derive(Clone, Debug)]
struct Re {
    pattern: String,
    options: String,
    re: regex::Regex,
}

impl Re {
    fn new(pattern: &str, options: &str) -> Result<Re> {
        Ok(Re { pattern: pattern.to_string(), options: options.to_string(), re: compile_regex(pattern, options)? })
    }
    fn matches(&self, v: &Bson) -> bool {
        match v {
            Bson::String(s) | Bson::Symbol(s) => self.re.is_match(s),
            Bson::RegularExpression(r) => r.pattern.as_str() == self.pattern && r.options.as_str() == self.options,
            _ => false,
        }
    }
}

/// Largest compiled regex program, so a hostile pattern cannot exhaust memory.
const REGEX_SIZE_MAX_BYTES: usize = 8 * 1024 * 1024;

/// Compile a MongoDB (PCRE-flavoured) regex with its option letters.
pub(crate) fn compile_regex(pattern: &str, options: &str) -> Result<regex::Regex> {
    let mut b = regex::RegexBuilder::new(pattern);
    b.size_limit(REGEX_SIZE_MAX_BYTES);
    for c in options.chars() {
        match c {
            'i' => {
                b.case_insensitive(true);
            }
            'm' => {
                b.multi_line(true);
            }
            's' => {
                b.dot_matches_new_line(true);
            }
            'x' => {
                b.ignore_whitespace(true);
            }
            'u' | 'l' => {}
            other => return Err(Error::location(51108, format!("invalid flag in regex options: {other}"))),
        }
    }
    b.build().map_err(|e| Error::location(51091, format!("Regular expression is invalid: {e}")))
}

/// Set of BSON type codes for `$type`.
#[derive(Clone, Debug, Default)]
struct TypeSet {
    codes: Vec<i32>,
    number: bool,
}

fn type_code(v: &Bson) -> i32 {
    match v {
        Bson::Double(_) => 1,
        Bson::String(_) => 2,
        Bson::Document(_) => 3,
        Bson::Array(_) => 4,
        Bson::Binary(_) => 5,
        Bson::Undefined => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Null => 10,
        Bson::RegularExpression(_) => 11,
        Bson::DbPointer(_) => 12,
        Bson::JavaScriptCode(_) => 13,
        Bson::Symbol(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::Int32(_) => 16,
        Bson::Timestamp(_) => 17,
        Bson::Int64(_) => 18,
        Bson::Decimal128(_) => 19,
        Bson::MinKey => -1,
        Bson::MaxKey => 127,
    }
}

/// Type code for a `$type` alias ("double", "string", ...); "number" is handled separately.
pub(crate) fn type_code_for_alias(s: &str) -> Option<i32> {
    Some(match s {
        "double" => 1,
        "string" => 2,
        "object" => 3,
        "array" => 4,
        "binData" => 5,
        "undefined" => 6,
        "objectId" => 7,
        "bool" => 8,
        "date" => 9,
        "null" => 10,
        "regex" => 11,
        "dbPointer" => 12,
        "javascript" => 13,
        "symbol" => 14,
        "javascriptWithScope" => 15,
        "int" => 16,
        "timestamp" => 17,
        "long" => 18,
        "decimal" => 19,
        "minKey" => -1,
        "maxKey" => 127,
        _ => return None,
    })
}

const VALID_TYPE_CODES: &[i32] = &[-1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 127];

impl TypeSet {
    fn add(&mut self, v: &Bson) -> Result<()> {
        match v {
            Bson::String(s) => {
                if s == "number" {
                    self.number = true;
                } else if s == "javaScript" {
                    self.codes.push(13);
                } else if s == "javaScriptWithScope" {
                    self.codes.push(15);
                } else {
                    let code = type_code_for_alias(s).ok_or_else(|| Error::bad_value(format!("Unknown type name alias: {s}")))?;
                    self.codes.push(code);
                }
            }
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                let n = crate::num::Num::from_bson(v).and_then(|n| n.as_exact_i64());
                match n.and_then(|n| i32::try_from(n).ok()) {
                    Some(c) if VALID_TYPE_CODES.contains(&c) => self.codes.push(c),
                    _ => return Err(Error::bad_value(format!("Invalid numerical type code: {v}"))),
                }
            }
            _ => return Err(Error::type_mismatch("type must be represented as a number or a string")),
        }
        Ok(())
    }
    fn matches(&self, v: &Bson) -> bool {
        (self.number && crate::compare::is_number(v)) || self.codes.contains(&type_code(v))
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing

fn bad(msg: impl Into<String>) -> Error {
    Error::bad_value(msg)
}

impl Filter {
    pub fn parse(filter: &Document) -> Result<Filter> {
        let root = parse_doc(filter, 0)?;
        let id_eq = find_id_eq(&root).cloned();
        Ok(Filter { root, id_eq })
    }

    pub fn match_all() -> Filter {
        Filter { root: Node::And(Vec::new()), id_eq: None }
    }

    pub fn matches(&self, doc: &Document) -> bool {
        self.try_matches(doc).unwrap_or(false)
    }

    /// Like `matches`, but reports errors raised by `$expr` evaluation (e.g. `$divide` by 0)
    /// as MongoDB fails the query in that case.
    pub fn try_matches(&self, doc: &Document) -> Result<bool> {
        let mut idx = None;
        match_node(&self.root, doc, &mut idx)
    }

    pub fn matches_details(&self, doc: &Document) -> (bool, MatchDetails) {
        self.try_matches_details(doc).unwrap_or_default()
    }

    pub fn try_matches_details(&self, doc: &Document) -> Result<(bool, MatchDetails)> {
        let mut idx = None;
        let ok = match_node(&self.root, doc, &mut idx)?;
        Ok((ok, MatchDetails { elem_match_index: if ok { idx } else { None } }))
    }

    /// If the filter pins `_id` to a single value by equality, that value.
    pub fn id_equality(&self) -> Option<&Bson> {
        self.id_eq.as_ref()
    }

    pub fn is_match_all(&self) -> bool {
        match &self.root {
            Node::And(c) => c.is_empty(),
            Node::True => true,
            _ => false,
        }
    }
}

fn find_id_eq(node: &Node) -> Option<&Bson> {
    match node {
        Node::Leaf(p, Leaf::Cmp(CmpOp::Eq, v)) if p.is_single("_id") => match v {
            // An array also matches documents whose _id is one of its elements.
            Bson::Array(_) => None,
            v => Some(v),
        },
        Node::And(children) => children.iter().find_map(find_id_eq),
        _ => None,
    }
}

/// Nesting limit of logical operators (BSON depth already bounds it; this keeps the
/// recursion explicit).
const FILTER_DEPTH_MAX: usize = 200;

fn parse_doc(d: &Document, depth: usize) -> Result<Node> {
    if depth > FILTER_DEPTH_MAX {
        return Err(bad("exceeded depth limit while parsing match expression"));
    }
    let mut children = Vec::with_capacity(d.len());
    for (k, v) in d {
        // A DBRef's fields ($ref, $id, $db) are field names, not operators.
        if let Some(op) = k.strip_prefix('$').filter(|_| !is_dbref_field(k)) {
            match op {
                "and" | "or" | "nor" => {
                    let Bson::Array(items) = v else {
                        return Err(bad(format!("{k} must be an array")));
                    };
                    if items.is_empty() {
                        return Err(bad("$and/$or/$nor must be a nonempty array"));
                    }
                    let mut subs = Vec::with_capacity(items.len());
                    for item in items {
                        let Bson::Document(sd) = item else {
                            return Err(bad("$or/$and/$nor entries need to be full objects"));
                        };
                        subs.push(parse_doc(sd, depth + 1)?);
                    }
                    children.push(match op {
                        "and" => Node::And(subs),
                        "or" => Node::Or(subs),
                        _ => Node::Nor(subs),
                    });
                }
                "expr" => children.push(Node::Expr(Box::new(Expr::parse(v)?))),
                "comment" => {}
                "alwaysTrue" | "alwaysFalse" => {
                    let one = crate::num::Num::from_bson(v).and_then(|n| n.as_exact_i64()) == Some(1);
                    if !one {
                        return Err(bad(format!("{k} must be an integer value of 1")));
                    }
                    children.push(if op == "alwaysTrue" { Node::True } else { Node::False });
                }
                "sampleRate" => {
                    let rate = crate::num::Num::from_bson(v)
                        .map(|n| n.to_f64())
                        .filter(|r| (0.0..=1.0).contains(r))
                        .ok_or_else(|| bad("numeric argument to $sampleRate must be in [0, 1]"))?;
                    children.push(Node::SampleRate(rate));
                }
                "where" => return Err(Error::new(Code::NotImplemented, "$where is not supported by shoal")),
                "text" => return Err(Error::new(Code::IndexNotFound, "text index required for $text query")),
                "jsonSchema" => return Err(Error::new(Code::NotImplemented, "$jsonSchema is not supported by shoal")),
                _ => {
                    return Err(bad(format!(
                        "unknown top level operator: {k}. If you have a field name that starts with a '$' symbol, consider using $getField or $setField."
                    )))
                }
            }
        } else {
            children.push(parse_field(k, v, depth)?);
        }
    }
    Ok(if children.len() == 1 { children.pop().unwrap_or(Node::True) } else { Node::And(children) })
}

/// The fields of a DBRef: names a filter matches as fields, though they start with '$'.
fn is_dbref_field(k: &str) -> bool {
    matches!(k, "$ref" | "$id" | "$db")
}

/// Does this object hold query operators ({$gt: 1}) rather than a literal document?
fn is_operator_doc(d: &Document) -> bool {
    match d.keys().next() {
        Some(k) => k.starts_with('$') && !is_dbref_field(k),
        None => false,
    }
}

fn parse_field(path: &str, v: &Bson, depth: usize) -> Result<Node> {
    let p = Path::parse(path);
    match v {
        Bson::Document(d) if is_operator_doc(d) => {
            let preds = parse_operators(d, depth)?;
            let mut nodes: Vec<Node> = preds.into_iter().map(|pr| pred_to_node(&p, pr)).collect();
            Ok(if nodes.len() == 1 { nodes.pop().unwrap_or(Node::True) } else { Node::And(nodes) })
        }
        Bson::RegularExpression(r) => Ok(Node::Leaf(p, Leaf::Regex(Re::new(r.pattern.as_str(), r.options.as_str())?))),
        _ => Ok(Node::Leaf(p, Leaf::Cmp(CmpOp::Eq, check_not_undefined(v)?.clone()))),
    }
}

fn check_not_undefined(v: &Bson) -> Result<&Bson> {
    if matches!(v, Bson::Undefined) {
        return Err(bad("cannot compare to undefined"));
    }
    Ok(v)
}

fn pred_to_node(p: &Path, pred: Pred) -> Node {
    match pred {
        Pred::Leaf(l) => Node::Leaf(p.clone(), l),
        Pred::Not(inner) => {
            let mut nodes: Vec<Node> = inner.into_iter().map(|i| pred_to_node(p, i)).collect();
            Node::Not(Box::new(if nodes.len() == 1 { nodes.pop().unwrap_or(Node::True) } else { Node::And(nodes) }))
        }
    }
}

fn num_i64_for_mod(v: &Bson, what: &str) -> Result<i64> {
    let n = crate::num::Num::from_bson(v).ok_or_else(|| bad(format!("malformed mod, {what} not a number")))?;
    let f = n.to_f64();
    if !f.is_finite() {
        return Err(bad(format!("malformed mod, {what} value is invalid :: caused by :: Unable to coerce NaN/Inf to integral type")));
    }
    Ok(match n {
        crate::num::Num::I32(i) => i as i64,
        crate::num::Num::I64(i) => i,
        crate::num::Num::F64(d) => {
            // i64's bounds as doubles: -2^63 is exact, 2^63 is the first double past i64::MAX.
            if !(i64::MIN as f64..i64::MAX as f64).contains(&d) {
                return Err(bad(format!("malformed mod, {what} value is invalid :: caused by :: Out of bounds coercing to integral value")));
            }
            d.trunc() as i64
        }
        crate::num::Num::Dec(d) => {
            d.to_i64_trunc().ok_or_else(|| bad(format!("malformed mod, {what} value is invalid :: caused by :: Out of bounds coercing to integral value")))?
        }
    })
}

fn parse_bits_mask(op: &str, v: &Bson) -> Result<Vec<u8>> {
    match v {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
            let n = crate::num::Num::from_bson(v).and_then(|n| n.as_exact_i64()).ok_or_else(|| bad(format!("{op} cannot take a non-integral value: {v}")))?;
            if n < 0 {
                return Err(bad(format!("{op} cannot take a negative number: {n}")));
            }
            Ok((n as u64).to_le_bytes().to_vec())
        }
        Bson::Array(positions) => {
            let mut mask = Vec::new();
            for p in positions {
                let pos = crate::num::Num::from_bson(p)
                    .and_then(|n| n.as_exact_i64())
                    .ok_or_else(|| bad(format!("bit positions must be an integer but got: {p}")))?;
                if pos < 0 {
                    return Err(bad(format!("bit positions must be >= 0 but got: {pos}")));
                }
                // Positions beyond 64 bits can never be set in a number; keep the mask bounded.
                let pos = pos.min(8 * 1024) as usize;
                if mask.len() <= pos / 8 {
                    mask.resize(pos / 8 + 1, 0);
                }
                mask[pos / 8] |= 1 << (pos % 8);
            }
            Ok(mask)
        }
        Bson::Binary(b) => Ok(b.bytes.clone()),
        _ => Err(bad(format!("{op} takes an Array, a number, or a BinData but received: {v}"))),
    }
}

/// Parse a field's operator object ({$gt: 1, $lt: 5}) into single-value predicates.
fn parse_operators(d: &Document, depth: usize) -> Result<Vec<Pred>> {
    if depth > FILTER_DEPTH_MAX {
        return Err(bad("exceeded depth limit while parsing match expression"));
    }
    let mut out = Vec::with_capacity(d.len());
    let regex = d.get("$regex");
    let options = d.get("$options");
    if options.is_some() && regex.is_none() {
        return Err(bad("$options needs a $regex"));
    }
    for (k, v) in d {
        let leaf = match k.as_str() {
            "$eq" => Leaf::Cmp(CmpOp::Eq, check_not_undefined(v)?.clone()),
            "$ne" => {
                out.push(Pred::Not(vec![Pred::Leaf(Leaf::Cmp(CmpOp::Eq, check_not_undefined(v)?.clone()))]));
                continue;
            }
            "$gt" => Leaf::Cmp(CmpOp::Gt, check_not_undefined(v)?.clone()),
            "$gte" => Leaf::Cmp(CmpOp::Gte, check_not_undefined(v)?.clone()),
            "$lt" => Leaf::Cmp(CmpOp::Lt, check_not_undefined(v)?.clone()),
            "$lte" => Leaf::Cmp(CmpOp::Lte, check_not_undefined(v)?.clone()),
            "$in" | "$nin" => {
                let Bson::Array(items) = v else {
                    return Err(bad(format!("{k} needs an array")));
                };
                let mut values = Vec::with_capacity(items.len());
                let mut regexes = Vec::new();
                for item in items {
                    match item {
                        Bson::RegularExpression(r) => regexes.push(Re::new(r.pattern.as_str(), r.options.as_str())?),
                        Bson::Document(sd) if sd.keys().next().is_some_and(|f| f.starts_with('$')) && is_operator_doc(sd) => {
                            return Err(bad(format!("cannot nest $ under {k}")))
                        }
                        Bson::Undefined => return Err(bad("InMatchExpression equality cannot be undefined")),
                        other => values.push(other.clone()),
                    }
                }
                let leaf = Leaf::In { values, regexes };
                if k == "$nin" {
                    out.push(Pred::Not(vec![Pred::Leaf(leaf)]));
                    continue;
                }
                leaf
            }
            "$exists" => {
                if crate::expr::truthy(&Some(v.clone())) {
                    Leaf::Exists
                } else {
                    out.push(Pred::Not(vec![Pred::Leaf(Leaf::Exists)]));
                    continue;
                }
            }
            "$type" => {
                let mut set = TypeSet::default();
                match v {
                    Bson::Array(items) => {
                        for i in items {
                            set.add(i)?;
                        }
                    }
                    other => set.add(other)?,
                }
                Leaf::Type(set)
            }
            "$regex" => {
                let opts = match options {
                    None => None,
                    Some(Bson::String(o)) => Some(o.as_str()),
                    Some(_) => return Err(bad("$options has to be a string")),
                };
                match v {
                    Bson::String(p) => Leaf::Regex(Re::new(p, opts.unwrap_or(""))?),
                    Bson::RegularExpression(r) => {
                        if opts.is_some_and(|o| !o.is_empty()) && !r.options.as_str().is_empty() {
                            return Err(bad("options set in both $regex and $options"));
                        }
                        let o = if r.options.as_str().is_empty() { opts.unwrap_or("") } else { r.options.as_str() };
                        Leaf::Regex(Re::new(r.pattern.as_str(), o)?)
                    }
                    _ => return Err(bad("$regex has to be a string")),
                }
            }
            "$options" => continue,
            "$mod" => {
                let Bson::Array(items) = v else {
                    return Err(bad("malformed mod, needs to be an array"));
                };
                if items.len() < 2 {
                    return Err(bad("malformed mod, not enough elements"));
                }
                if items.len() > 2 {
                    return Err(bad("malformed mod, too many elements"));
                }
                let divisor = num_i64_for_mod(&items[0], "divisor")?;
                let remainder = num_i64_for_mod(&items[1], "remainder")?;
                if divisor == 0 {
                    return Err(bad("divisor cannot be 0"));
                }
                Leaf::Mod { divisor, remainder }
            }
            "$size" => {
                let n = crate::num::Num::from_bson(v).ok_or_else(|| bad("$size needs a number"))?;
                match n.as_exact_i64() {
                    Some(s) if s < 0 => return Err(bad("$size may not be negative")),
                    Some(s) => Leaf::Size(s),
                    // A non-integral size matches no array.
                    None => Leaf::Size(-1),
                }
            }
            "$all" => {
                let Bson::Array(items) = v else {
                    return Err(bad("$all needs an array"));
                };
                if items.is_empty() {
                    // {$all: []} matches nothing: an always-false leaf.
                    out.push(Pred::Leaf(Leaf::In { values: vec![], regexes: vec![] }));
                    continue;
                }
                let is_em = |b: &Bson| matches!(b, Bson::Document(sd) if sd.keys().next().map(String::as_str) == Some("$elemMatch"));
                let em_count = items.iter().filter(|b| is_em(b)).count();
                if em_count > 0 && em_count != items.len() {
                    return Err(bad("$all/$elemMatch has to be consistent"));
                }
                for item in items {
                    match item {
                        Bson::Document(sd) if em_count > 0 => {
                            let mut sub = parse_operators(sd, depth + 1)?;
                            out.append(&mut sub);
                        }
                        Bson::RegularExpression(r) => out.push(Pred::Leaf(Leaf::Regex(Re::new(r.pattern.as_str(), r.options.as_str())?))),
                        Bson::Document(sd) if is_operator_doc(sd) => {
                            return Err(bad("no $ expressions in $all"));
                        }
                        other => out.push(Pred::Leaf(Leaf::Cmp(CmpOp::Eq, check_not_undefined(other)?.clone()))),
                    }
                }
                continue;
            }
            "$elemMatch" => {
                let Bson::Document(sd) = v else {
                    return Err(bad("$elemMatch needs an Object"));
                };
                let value_form = sd.keys().next().is_some_and(|f| {
                    f.starts_with('$')
                        && !matches!(
                            f.as_str(),
                            "$and"
                                | "$or"
                                | "$nor"
                                | "$expr"
                                | "$where"
                                | "$text"
                                | "$comment"
                                | "$alwaysTrue"
                                | "$alwaysFalse"
                                | "$jsonSchema"
                                | "$sampleRate"
                        )
                        && !is_dbref_field(f)
                });
                if value_form {
                    Leaf::ElemMatchValue(parse_operators(sd, depth + 1)?)
                } else {
                    Leaf::ElemMatchObj(Box::new(parse_doc(sd, depth + 1)?))
                }
            }
            "$not" => {
                match v {
                    Bson::Document(sd) => {
                        if sd.is_empty() {
                            return Err(bad("$not cannot be empty"));
                        }
                        if !is_operator_doc(sd) {
                            return Err(bad("$not needs a regex or a document"));
                        }
                        out.push(Pred::Not(parse_operators(sd, depth + 1)?));
                    }
                    Bson::RegularExpression(r) => out.push(Pred::Not(vec![Pred::Leaf(Leaf::Regex(Re::new(r.pattern.as_str(), r.options.as_str())?))])),
                    _ => return Err(bad("$not needs a regex or a document")),
                }
                continue;
            }
            "$bitsAllSet" | "$bitsAnySet" | "$bitsAllClear" | "$bitsAnyClear" => {
                let kind = match k.as_str() {
                    "$bitsAllSet" => BitsKind::AllSet,
                    "$bitsAnySet" => BitsKind::AnySet,
                    "$bitsAllClear" => BitsKind::AllClear,
                    _ => BitsKind::AnyClear,
                };
                Leaf::Bits { kind, mask: parse_bits_mask(k, v)? }
            }
            "$geoWithin" | "$geoIntersects" | "$near" | "$nearSphere" | "$within" => {
                return Err(Error::new(Code::NotImplemented, format!("{k} is not supported by shoal")))
            }
            "$comment" => continue,
            _ => return Err(bad(format!("unknown operator: {k}"))),
        };
        out.push(Pred::Leaf(leaf));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Matching

#[derive(Clone, Copy, PartialEq)]
enum LeafMode {
    /// Arrays at the end of the path yield their elements, then themselves.
    Traverse,
    /// Arrays at the end of the path are examined whole ($size, $elemMatch).
    NoTraversal,
}

impl Leaf {
    fn mode(&self) -> LeafMode {
        match self {
            Leaf::Size(_) | Leaf::ElemMatchObj(_) | Leaf::ElemMatchValue(_) => LeafMode::NoTraversal,
            _ => LeafMode::Traverse,
        }
    }
}

/// Visit every value the path produces in `doc`, mirroring MongoDB's BSONElementIterator.
/// `f(value, array_offset)` returns true to stop; the result says whether it stopped.
fn visit_doc<'a>(
    doc: &'a Document,
    parts: &[Part],
    mode: LeafMode,
    offset: Option<usize>,
    f: &mut dyn FnMut(Option<&'a Bson>, Option<usize>) -> Result<bool>,
) -> Result<bool> {
    let mut cur = doc;
    let mut i = 0;
    loop {
        let Some(part) = parts.get(i) else { return Ok(false) };
        let last = i + 1 == parts.len();
        match cur.get(&part.name) {
            None => return f(None, offset),
            Some(v @ Bson::Document(d)) => {
                if last {
                    return f(Some(v), offset);
                }
                cur = d;
                i += 1;
            }
            Some(v @ Bson::Array(items)) => return visit_array(v, items, &parts[i + 1..], mode, offset, f),
            Some(v) => return f(if last { Some(v) } else { None }, offset),
        }
    }
}

fn visit_array<'a>(
    whole: &'a Bson,
    items: &'a [Bson],
    rest: &[Part],
    mode: LeafMode,
    offset: Option<usize>,
    f: &mut dyn FnMut(Option<&'a Bson>, Option<usize>) -> Result<bool>,
) -> Result<bool> {
    let Some(next) = rest.first() else {
        if mode == LeafMode::Traverse {
            for (i, e) in items.iter().enumerate() {
                if f(Some(e), offset.or(Some(i)))? {
                    return Ok(true);
                }
            }
        }
        return f(Some(whole), offset);
    };
    for (i, e) in items.iter().enumerate() {
        let is_offset = next.index == Some(i);
        match e {
            Bson::Document(d) => {
                if visit_doc(d, rest, mode, offset.or(Some(i)), f)? {
                    return Ok(true);
                }
                if is_offset {
                    if rest.len() == 1 {
                        if f(Some(e), offset)? {
                            return Ok(true);
                        }
                    } else if visit_doc(d, &rest[1..], mode, offset, f)? {
                        return Ok(true);
                    }
                }
            }
            _ if is_offset => {
                if rest.len() == 1 {
                    if f(Some(e), offset)? {
                        return Ok(true);
                    }
                } else if let Bson::Array(inner) = e {
                    if visit_array(e, inner, &rest[1..], mode, offset, f)? {
                        return Ok(true);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(false)
}

fn match_node(node: &Node, doc: &Document, idx: &mut Option<usize>) -> Result<bool> {
    match node {
        Node::And(children) => {
            for c in children {
                if !match_node(c, doc, idx)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Node::Or(children) => {
            for c in children {
                let mut local = None;
                if match_node(c, doc, &mut local)? {
                    if local.is_some() {
                        *idx = local;
                    }
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Node::Nor(children) => {
            let mut scratch = None;
            for c in children {
                if match_node(c, doc, &mut scratch)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Node::Not(c) => {
            let mut scratch = None;
            Ok(!match_node(c, doc, &mut scratch)?)
        }
        Node::Leaf(path, leaf) => {
            let mut found = None;
            let hit = visit_doc(doc, &path.parts, leaf.mode(), None, &mut |v, off| {
                let mut inner = None;
                if leaf.matches_single(v, &mut inner)? {
                    found = off.or(inner);
                    return Ok(true);
                }
                Ok(false)
            })?;
            if hit && found.is_some() {
                *idx = found;
            }
            Ok(hit)
        }
        Node::Expr(e) => Ok(crate::expr::truthy(&e.eval(doc)?)),
        Node::SampleRate(r) => Ok(rand::random::<f64>() < *r),
        Node::True => Ok(true),
        Node::False => Ok(false),
    }
}

fn cmp_matches(op: CmpOp, v: Option<&Bson>, rhs: &Bson) -> bool {
    const MISSING: Bson = Bson::Undefined;
    let e = v.unwrap_or(&MISSING);
    let (re, rr) = (canonical_rank(e), canonical_rank(rhs));
    if re != rr {
        // Null and undefined/missing are the same for comparisons.
        let null_like = |b: &Bson| matches!(b, Bson::Null | Bson::Undefined);
        if null_like(e) && null_like(rhs) {
            return matches!(op, CmpOp::Eq | CmpOp::Lte | CmpOp::Gte);
        }
        return match rhs {
            Bson::MaxKey => matches!(op, CmpOp::Lt | CmpOp::Lte),
            Bson::MinKey => matches!(op, CmpOp::Gt | CmpOp::Gte),
            _ => false,
        };
    }
    let is_nan = |b: &Bson| match b {
        Bson::Double(d) => d.is_nan(),
        Bson::Decimal128(d) => crate::decimal::Dec::decode(d).is_nan(),
        _ => false,
    };
    let (na, nb) = (is_nan(e), is_nan(rhs));
    if na || nb {
        return match op {
            CmpOp::Lt | CmpOp::Gt => false,
            _ => na && nb,
        };
    }
    let o = cmp_bson(e, rhs);
    match op {
        CmpOp::Eq => o == Ordering::Equal,
        CmpOp::Lt => o == Ordering::Less,
        CmpOp::Lte => o != Ordering::Greater,
        CmpOp::Gt => o == Ordering::Greater,
        CmpOp::Gte => o != Ordering::Less,
    }
}

fn array_as_doc(items: &[Bson]) -> Document {
    let mut d = Document::new();
    for (i, v) in items.iter().enumerate() {
        d.insert(i.to_string(), v.clone());
    }
    d
}

fn bits_match(kind: BitsKind, v: &Bson, mask: &[u8]) -> bool {
    let bytes: Vec<u8> = match v {
        Bson::Binary(b) => b.bytes.clone(),
        _ => match crate::num::Num::from_bson(v).and_then(|n| n.as_exact_i64()) {
            // Negative numbers are sign-extended two's complement: bits beyond 64 are set.
            Some(n) => n.to_le_bytes().to_vec(),
            None => return false,
        },
    };
    let negative = matches!(crate::num::Num::from_bson(v).and_then(|n| n.as_exact_i64()), Some(n) if n < 0);
    let byte_at = |i: usize| -> u8 {
        match bytes.get(i) {
            Some(b) => *b,
            None => {
                if negative {
                    0xff
                } else {
                    0
                }
            }
        }
    };
    let mut all_set = true;
    let mut any_set = false;
    let mut all_clear = true;
    let mut any_clear = false;
    for (i, m) in mask.iter().enumerate() {
        if *m == 0 {
            continue;
        }
        let b = byte_at(i);
        if b & m != *m {
            all_set = false;
        }
        if b & m != 0 {
            any_set = true;
            all_clear = false;
        }
        if b & m != *m {
            any_clear = true;
        }
    }
    match kind {
        BitsKind::AllSet => all_set,
        BitsKind::AnySet => any_set,
        BitsKind::AllClear => all_clear,
        BitsKind::AnyClear => any_clear,
    }
}

impl Leaf {
    /// Match one value produced by path traversal (`None` = missing). `inner` receives the
    /// index of the matching element for `$elemMatch`.
    fn matches_single(&self, v: Option<&Bson>, inner: &mut Option<usize>) -> Result<bool> {
        Ok(match self {
            Leaf::Cmp(op, rhs) => cmp_matches(*op, v, rhs),
            Leaf::In { values, regexes } => values.iter().any(|x| cmp_matches(CmpOp::Eq, v, x)) || v.is_some_and(|v| regexes.iter().any(|r| r.matches(v))),
            Leaf::Exists => v.is_some(),
            Leaf::Type(set) => v.is_some_and(|v| set.matches(v)),
            Leaf::Regex(re) => v.is_some_and(|v| re.matches(v)),
            Leaf::Mod { divisor, remainder } => match v.and_then(crate::num::Num::from_bson) {
                Some(n) => {
                    let x = match n {
                        crate::num::Num::I32(i) => i as i64,
                        crate::num::Num::I64(i) => i,
                        crate::num::Num::F64(d) => {
                            if !d.is_finite() {
                                return Ok(false);
                            }
                            d.trunc().clamp(i64::MIN as f64, i64::MAX as f64) as i64
                        }
                        crate::num::Num::Dec(d) => match d.to_i64_trunc() {
                            Some(i) => i,
                            None => return Ok(false),
                        },
                    };
                    x.wrapping_rem(*divisor) == *remainder
                }
                None => false,
            },
            Leaf::Size(n) => matches!(v, Some(Bson::Array(items)) if items.len() as i64 == *n),
            Leaf::ElemMatchObj(node) => {
                let Some(Bson::Array(items)) = v else { return Ok(false) };
                for (i, item) in items.iter().enumerate() {
                    let mut scratch = None;
                    let ok = match item {
                        Bson::Document(d) => match_node(node, d, &mut scratch)?,
                        Bson::Array(a) => match_node(node, &array_as_doc(a), &mut scratch)?,
                        _ => false,
                    };
                    if ok {
                        *inner = Some(i);
                        return Ok(true);
                    }
                }
                false
            }
            Leaf::ElemMatchValue(preds) => {
                let Some(Bson::Array(items)) = v else { return Ok(false) };
                for (i, item) in items.iter().enumerate() {
                    if preds_match(preds, Some(item))? {
                        *inner = Some(i);
                        return Ok(true);
                    }
                }
                false
            }
            Leaf::Bits { kind, mask } => v.is_some_and(|v| bits_match(*kind, v, mask)),
        })
    }
}

fn preds_match(preds: &[Pred], v: Option<&Bson>) -> Result<bool> {
    for p in preds {
        let ok = match p {
            Pred::Leaf(l) => {
                // Inside $elemMatch a nested array is examined like a path leaf: its elements
                // and itself (except for operators that look at arrays whole).
                match (v, l.mode()) {
                    (Some(Bson::Array(items)), LeafMode::Traverse) => {
                        let mut scratch = None;
                        let mut hit = false;
                        for e in items.iter() {
                            if l.matches_single(Some(e), &mut scratch)? {
                                hit = true;
                                break;
                            }
                        }
                        hit || l.matches_single(v, &mut scratch)?
                    }
                    _ => {
                        let mut scratch = None;
                        l.matches_single(v, &mut scratch)?
                    }
                }
            }
            Pred::Not(inner) => !preds_match(inner, v)?,
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn dbref_fields_are_field_names() {
        let d = doc! {"r": {"$ref": "c", "$id": 7, "$db": "x"}, "rs": [{"$ref": "c", "$id": 1}, {"$ref": "c", "$id": 2}]};
        assert!(m(doc! {"r": {"$ref": "c", "$id": 7, "$db": "x"}}, d.clone()));
        assert!(m(doc! {"r.$id": 7}, d.clone()));
        assert!(m(doc! {"rs": {"$elemMatch": {"$ref": "c", "$id": 2}}}, d.clone()));
        assert!(!m(doc! {"rs": {"$elemMatch": {"$ref": "c", "$id": 3}}}, d.clone()));
        assert!(m(doc! {"rs.$id": {"$in": [2]}}, d));
    }

    fn m(filter: Document, d: Document) -> bool {
        Filter::parse(&filter).unwrap().matches(&d)
    }
    fn perr(filter: Document) -> Error {
        Filter::parse(&filter).unwrap_err()
    }

    #[test]
    fn equality_and_arrays() {
        assert!(m(doc! {"a": 1}, doc! {"a": 1.0}));
        assert!(m(doc! {"a": 1}, doc! {"a": [3, 1]}));
        assert!(m(doc! {"a": [3, 1]}, doc! {"a": [3, 1]}));
        assert!(!m(doc! {"a": [1, 3]}, doc! {"a": [3, 1]}));
        assert!(m(doc! {"a": [1]}, doc! {"a": [[1], 2]}));
        assert!(!m(doc! {"a": 1}, doc! {"a": [[1]]}));
        assert!(m(doc! {"a.b": 2}, doc! {"a": [{"b": 1}, {"b": 2}]}));
        assert!(m(doc! {"a.b": 2}, doc! {"a": {"b": [1, 2]}}));
        assert!(!m(doc! {"a.b": 1}, doc! {"a": [[{"b": 1}]]}));
        assert!(m(doc! {"a.0": 5}, doc! {"a": [5, 6]}));
        assert!(m(doc! {"a.1.b": 6}, doc! {"a": [{"b": 5}, {"b": 6}]}));
        assert!(m(doc! {"a.0.b": 1}, doc! {"a": [{"b": 1}]}));
        assert!(m(doc! {"a.0": 1}, doc! {"a": {"0": 1}}));
        assert!(m(doc! {"a.0.0": 1}, doc! {"a": [[1, 2]]}));
        assert!(m(doc! {"a": {"b": 1}}, doc! {"a": {"b": 1}}));
        assert!(!m(doc! {"a": {"b": 1}}, doc! {"a": {"b": 1, "c": 2}}));
    }

    #[test]
    fn null_semantics() {
        assert!(m(doc! {"a": null}, doc! {"b": 1}));
        assert!(m(doc! {"a": null}, doc! {"a": null}));
        assert!(!m(doc! {"a": null}, doc! {"a": 0}));
        assert!(m(doc! {"a.b": null}, doc! {"a": 5}));
        assert!(m(doc! {"a.b": null}, doc! {"a": [{"b": 1}, {"c": 1}]}));
        assert!(!m(doc! {"a.b": null}, doc! {"a": [{"b": 1}]}));
        assert!(!m(doc! {"a": null}, doc! {"a": []}));
        assert!(m(doc! {"a": {"$ne": null}}, doc! {"a": 1}));
        assert!(!m(doc! {"a": {"$ne": null}}, doc! {"b": 1}));
        assert!(m(doc! {"a": {"$in": [null, 5]}}, doc! {"x": 1}));
        assert!(m(doc! {"a": {"$gte": null}}, doc! {"x": 1}));
        assert!(!m(doc! {"a": {"$gt": null}}, doc! {"x": 1}));
    }

    #[test]
    fn comparisons_are_type_bracketed() {
        assert!(m(doc! {"a": {"$gt": 5}}, doc! {"a": 6.5}));
        assert!(!m(doc! {"a": {"$gt": 5}}, doc! {"a": "z"}));
        assert!(m(doc! {"a": {"$gt": 5, "$lt": 10}}, doc! {"a": [1, 20]}));
        assert!(!m(doc! {"a": {"$elemMatch": {"$gt": 5, "$lt": 10}}}, doc! {"a": [1, 20]}));
        assert!(m(doc! {"a": {"$elemMatch": {"$gt": 5, "$lt": 10}}}, doc! {"a": [1, 7]}));
        assert!(m(doc! {"a": {"$gt": bson::Bson::MinKey}}, doc! {"a": "x"}));
        assert!(m(doc! {"a": {"$lt": bson::Bson::MaxKey}}, doc! {"a": {"x": 1}}));
        assert!(!m(doc! {"a": {"$lt": bson::Bson::MinKey}}, doc! {"a": 1}));
        assert!(m(doc! {"a": {"$gt": "abc"}}, doc! {"a": "abd"}));
        assert!(!m(doc! {"a": {"$gt": f64::NAN}}, doc! {"a": 1}));
        assert!(m(doc! {"a": f64::NAN}, doc! {"a": f64::NAN}));
        assert!(m(doc! {"a": {"$lte": [1, 2]}}, doc! {"a": [1, 2]}));
    }

    #[test]
    fn logical_and_errors() {
        assert!(m(doc! {"$or": [{"a": 1}, {"b": 2}]}, doc! {"b": 2}));
        assert!(!m(doc! {"$nor": [{"a": 1}, {"b": 2}]}, doc! {"b": 2}));
        assert!(m(doc! {"$and": [{"a": 1}, {"b": 2}]}, doc! {"a": 1, "b": 2}));
        assert!(m(doc! {"a": {"$not": {"$gt": 5}}}, doc! {"a": 3}));
        assert!(m(doc! {"a": {"$not": {"$gt": 5}}}, doc! {"b": 3}));
        assert!(m(doc! {"a": {"$not": bson::Regex { pattern: "^x".try_into().unwrap(), options: "".try_into().unwrap() }}}, doc! {"a": "yx"}));
        assert_eq!(perr(doc! {"$and": []}).message, "$and/$or/$nor must be a nonempty array");
        assert_eq!(perr(doc! {"$and": 1}).message, "$and must be an array");
        assert_eq!(perr(doc! {"$or": [1]}).message, "$or/$and/$nor entries need to be full objects");
        assert!(perr(doc! {"$foo": 1}).message.starts_with("unknown top level operator: $foo"));
        assert_eq!(perr(doc! {"a": {"$foo": 1}}).message, "unknown operator: $foo");
        assert_eq!(perr(doc! {"a": {"$not": 1}}).message, "$not needs a regex or a document");
        assert_eq!(perr(doc! {"a": {"$in": 1}}).message, "$in needs an array");
        assert_eq!(perr(doc! {"a": {"$mod": [1]}}).message, "malformed mod, not enough elements");
        assert_eq!(perr(doc! {"a": {"$mod": [1, 2, 3]}}).message, "malformed mod, too many elements");
        assert_eq!(perr(doc! {"a": {"$mod": [0, 1]}}).message, "divisor cannot be 0");
        assert_eq!(perr(doc! {"a": {"$options": "i"}}).message, "$options needs a $regex");
        assert_eq!(perr(doc! {"a": {"$type": "foo"}}).message, "Unknown type name alias: foo");
        assert_eq!(perr(doc! {"a": {"$elemMatch": 1}}).message, "$elemMatch needs an Object");
        assert_eq!(perr(doc! {"a": {"$size": -1}}).code, 2);
        assert!(m(doc! {"a": 1, "$comment": "x"}, doc! {"a": 1}));
        assert!(m(doc! {"$alwaysTrue": 1}, doc! {}));
        assert!(!m(doc! {"$alwaysFalse": 1}, doc! {}));
    }

    #[test]
    fn element_operators() {
        assert!(m(doc! {"a": {"$exists": true}}, doc! {"a": null}));
        assert!(m(doc! {"a": {"$exists": false}}, doc! {"b": 1}));
        assert!(!m(doc! {"a.b": {"$exists": true}}, doc! {"a": [1, 2]}));
        assert!(m(doc! {"a": {"$type": "string"}}, doc! {"a": ["x", 1]}));
        assert!(m(doc! {"a": {"$type": "array"}}, doc! {"a": []}));
        assert!(m(doc! {"a": {"$type": "number"}}, doc! {"a": 1i64}));
        assert!(m(doc! {"a": {"$type": [2, "int"]}}, doc! {"a": 1}));
        assert!(!m(doc! {"a": {"$type": "double"}}, doc! {"a": 1}));
        assert!(m(doc! {"a": {"$type": 10}}, doc! {"a": null}));
        assert!(!m(doc! {"a": {"$type": "null"}}, doc! {}));
    }

    #[test]
    fn evaluation_operators() {
        let re = |p: &str, o: &str| bson::Regex { pattern: p.try_into().unwrap(), options: o.try_into().unwrap() };
        assert!(m(doc! {"a": {"$regex": "^AB", "$options": "i"}}, doc! {"a": "abc"}));
        assert!(m(doc! {"a": re("^ab", "")}, doc! {"a": ["x", "abc"]}));
        assert!(m(doc! {"a": {"$in": [re("^z", ""), 3]}}, doc! {"a": "zoo"}));
        assert!(m(doc! {"a": {"$nin": [1, 2]}}, doc! {"a": 3}));
        assert!(!m(doc! {"a": {"$nin": [1, 2]}}, doc! {"a": [3, 2]}));
        assert!(m(doc! {"a": {"$mod": [4, 0]}}, doc! {"a": 8}));
        assert!(m(doc! {"a": {"$mod": [4, 0]}}, doc! {"a": 8.9}));
        assert!(m(doc! {"a": {"$mod": [4, -1]}}, doc! {"a": -5}));
        assert!(!m(doc! {"a": {"$mod": [4, 0]}}, doc! {"a": "8"}));
        assert!(m(doc! {"$expr": {"$gt": ["$a", "$b"]}}, doc! {"a": 5, "b": 3}));
        assert!(!m(doc! {"$expr": {"$gt": ["$a", "$b"]}}, doc! {"a": 1, "b": 3}));
        assert!(m(doc! {"$expr": "$flag"}, doc! {"flag": true}));
        assert!(Filter::parse(&doc! {"$expr": {"$divide": [1, 0]}}).unwrap().try_matches(&doc! {}).is_err());
        assert!(m(doc! {"a": {"$bitsAllSet": [1, 3]}}, doc! {"a": 10}));
        assert!(!m(doc! {"a": {"$bitsAllSet": 5}}, doc! {"a": 4}));
        assert!(m(doc! {"a": {"$bitsAnySet": 5}}, doc! {"a": 4}));
        assert!(m(doc! {"a": {"$bitsAllClear": 3}}, doc! {"a": 4}));
    }

    #[test]
    fn array_operators() {
        assert!(m(doc! {"tags": {"$all": ["a", "b"]}}, doc! {"tags": ["b", "c", "a"]}));
        assert!(!m(doc! {"tags": {"$all": ["a", "d"]}}, doc! {"tags": ["b", "c", "a"]}));
        assert!(!m(doc! {"tags": {"$all": []}}, doc! {"tags": []}));
        assert!(m(doc! {"a": {"$all": [[1, 2]]}}, doc! {"a": [1, 2]}));
        assert!(m(doc! {"a": {"$all": [{"$elemMatch": {"x": 1}}, {"$elemMatch": {"y": 2}}]}}, doc! {"a": [{"x": 1}, {"y": 2}]}));
        assert!(m(doc! {"a": {"$size": 2}}, doc! {"a": [1, [2, 3]]}));
        assert!(m(doc! {"a": {"$size": 1}}, doc! {"a": [[1, 2]]}));
        assert!(!m(doc! {"a": {"$size": 2}}, doc! {"a": [[1, 2]]}));
        assert!(m(doc! {"a.b": {"$size": 2}}, doc! {"a": [{"b": [1, 2]}]}));
        let results = doc! {"results": [{"product": "abc", "score": 10}, {"product": "xyz", "score": 5}]};
        assert!(m(doc! {"results": {"$elemMatch": {"product": "xyz", "score": {"$gte": 5}}}}, results.clone()));
        assert!(!m(doc! {"results": {"$elemMatch": {"product": "xyz", "score": {"$gte": 8}}}}, results.clone()));
        assert!(m(doc! {"results": {"$elemMatch": {"$or": [{"score": 5}, {"score": 1}]}}}, results));
        assert!(m(doc! {"a": {"$elemMatch": {"$elemMatch": {"$gt": 1}}}}, doc! {"a": [[0, 2]]}));
    }

    #[test]
    fn match_details_report_array_offsets() {
        let f = Filter::parse(&doc! {"grades": {"$gte": 85}}).unwrap();
        let (ok, d) = f.matches_details(&doc! {"grades": [80, 85, 90]});
        assert!(ok);
        assert_eq!(d.elem_match_index, Some(1));
        let f = Filter::parse(&doc! {"a.b": 2}).unwrap();
        assert_eq!(f.matches_details(&doc! {"a": [{"b": 1}, {"b": [0, 2]}]}).1.elem_match_index, Some(1));
        let f = Filter::parse(&doc! {"a": {"$elemMatch": {"x": 3}}}).unwrap();
        assert_eq!(f.matches_details(&doc! {"a": [{"x": 1}, {"x": 3}]}).1.elem_match_index, Some(1));
        let f = Filter::parse(&doc! {"a": 1}).unwrap();
        assert_eq!(f.matches_details(&doc! {"a": 1}).1.elem_match_index, None);
    }

    #[test]
    fn id_equality_and_match_all() {
        assert_eq!(Filter::parse(&doc! {"_id": 5}).unwrap().id_equality(), Some(&Bson::Int32(5)));
        assert_eq!(Filter::parse(&doc! {"_id": {"$eq": 5}, "x": 1}).unwrap().id_equality(), Some(&Bson::Int32(5)));
        assert_eq!(Filter::parse(&doc! {"$and": [{"_id": "k"}]}).unwrap().id_equality(), Some(&Bson::String("k".into())));
        assert_eq!(Filter::parse(&doc! {"_id": {"$gt": 5}}).unwrap().id_equality(), None);
        assert_eq!(Filter::parse(&doc! {"$or": [{"_id": 1}]}).unwrap().id_equality(), None);
        assert!(Filter::parse(&doc! {}).unwrap().is_match_all());
        assert!(Filter::match_all().matches(&doc! {"x": 1}));
        assert!(!Filter::parse(&doc! {"a": 1}).unwrap().is_match_all());
    }
}
