//! Aggregation expression language: parsed once into a tree, evaluated per document.

use crate::compare::cmp_opt;
use crate::datetime::{self, Tz};
use crate::decimal::Dec;
use crate::num::{fmt_g, ArithOp, DecPrecision, Num};
use bson::{oid::ObjectId, Bson, DateTime, Document};
use common::{Code, Error, Result};
use std::cmp::Ordering;

/// Result of evaluating an expression: `None` is "missing".
pub type Value = Option<Bson>;

/// Largest array `$range` may build (MongoDB bounds it by memory, ~100 MB of values).
const RANGE_ELEMENTS_MAX: usize = 4 * 1024 * 1024;
/// Deepest expression nesting accepted, so hostile input cannot overflow the stack.
const EXPR_DEPTH_MAX: usize = 150;

#[derive(Clone, Debug)]
pub struct Expr {
    node: Node,
    slots: usize,
}

#[derive(Clone, Debug)]
enum Var {
    Root,
    Current,
    Remove,
    Now,
    ClusterTime,
    User(usize),
}

#[derive(Clone, Debug)]
enum Node {
    Lit(Bson),
    Field(Vec<String>),
    Var(Var, Vec<String>),
    Object(Vec<(String, Node)>),
    Array(Vec<Node>),
    Op(Op, Vec<Node>),
    Cond(Box<(Node, Node, Node)>),
    Switch { branches: Vec<(Node, Node)>, default: Option<Box<Node>> },
    Let { vars: Vec<(usize, Node)>, body: Box<Node> },
    Map { input: Box<Node>, var: usize, body: Box<Node> },
    Filter { input: Box<Node>, var: usize, cond: Box<Node>, limit: Option<Box<Node>> },
    Reduce { input: Box<Node>, initial: Box<Node>, value_var: usize, this_var: usize, body: Box<Node> },
    Trim { kind: TrimKind, input: Box<Node>, chars: Option<Box<Node>> },
    Regex { kind: RegexKind, input: Box<Node>, regex: Box<Node>, options: Option<Box<Node>>, compiled: Option<regex::Regex> },
    Replace { all: bool, input: Box<Node>, find: Box<Node>, replacement: Box<Node> },
    DatePart { part: DatePart, date: Box<Node>, timezone: Option<Box<Node>> },
    DateToString { format: Option<Box<Node>>, date: Box<Node>, timezone: Option<Box<Node>>, on_null: Option<Box<Node>> },
    DateFromString { string: Box<Node>, timezone: Option<Box<Node>>, on_error: Option<Box<Node>>, on_null: Option<Box<Node>> },
    Convert { input: Box<Node>, to: Box<Node>, on_error: Option<Box<Node>>, on_null: Option<Box<Node>> },
    GetField { field: Box<Node>, input: Option<Box<Node>> },
    SetField { field: String, input: Box<Node>, value: Option<Box<Node>> },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum TrimKind {
    Both,
    Left,
    Right,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum RegexKind {
    Match,
    Find,
    FindAll,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum DatePart {
    Year,
    Month,
    DayOfMonth,
    Hour,
    Minute,
    Second,
    Millisecond,
    DayOfWeek,
    DayOfYear,
    Week,
    IsoWeek,
    IsoWeekYear,
    IsoDayOfWeek,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Add,
    Subtract,
    Multiply,
    Divide,
    Mod,
    Abs,
    Ceil,
    Floor,
    Sqrt,
    Pow,
    Exp,
    Ln,
    Log10,
    Log,
    Round,
    Trunc,
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
    Cmp,
    And,
    Or,
    Not,
    IfNull,
    Concat,
    SubstrBytes,
    SubstrCP,
    ToLower,
    ToUpper,
    StrLenBytes,
    StrLenCP,
    Split,
    IndexOfBytes,
    IndexOfCP,
    Strcasecmp,
    ArrayElemAt,
    First,
    Last,
    ConcatArrays,
    In,
    Size,
    Slice,
    IsArray,
    ReverseArray,
    Range,
    IndexOfArray,
    ArrayToObject,
    ObjectToArray,
    MergeObjects,
    Type,
    ToString,
    ToInt,
    ToLong,
    ToDouble,
    ToDecimal,
    ToBool,
    ToObjectId,
    ToDate,
    IsNumber,
    Sum,
    Avg,
    Min,
    Max,
    StdDevPop,
    StdDevSamp,
    SetUnion,
    SetIntersection,
    SetDifference,
    SetEquals,
    SetIsSubset,
    AllElementsTrue,
    AnyElementTrue,
    Rand,
    Trig(Trig),
    Atan2,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Trig {
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    Asinh,
    Acosh,
    Atanh,
    DegreesToRadians,
    RadiansToDegrees,
}

/// Arity constraint of a simple operator.
enum Arity {
    Exactly(usize),
    AtLeast(usize),
    Between(usize, usize),
    Any,
}

fn simple_op(name: &str) -> Option<(Op, Arity)> {
    use Arity::*;
    use Op::*;
    Some(match name {
        "$add" => (Add, Any),
        "$subtract" => (Subtract, Exactly(2)),
        "$multiply" => (Multiply, Any),
        "$divide" => (Divide, Exactly(2)),
        "$mod" => (Mod, Exactly(2)),
        "$abs" => (Abs, Exactly(1)),
        "$ceil" => (Ceil, Exactly(1)),
        "$floor" => (Floor, Exactly(1)),
        "$sqrt" => (Sqrt, Exactly(1)),
        "$pow" => (Pow, Exactly(2)),
        "$exp" => (Exp, Exactly(1)),
        "$ln" => (Ln, Exactly(1)),
        "$log10" => (Log10, Exactly(1)),
        "$log" => (Log, Exactly(2)),
        "$round" => (Round, Between(1, 2)),
        "$trunc" => (Trunc, Between(1, 2)),
        "$eq" => (Eq, Exactly(2)),
        "$ne" => (Ne, Exactly(2)),
        "$gt" => (Gt, Exactly(2)),
        "$gte" => (Gte, Exactly(2)),
        "$lt" => (Lt, Exactly(2)),
        "$lte" => (Lte, Exactly(2)),
        "$cmp" => (Cmp, Exactly(2)),
        "$and" => (And, Any),
        "$or" => (Or, Any),
        "$not" => (Not, Exactly(1)),
        "$ifNull" => (IfNull, AtLeast(2)),
        "$concat" => (Concat, Any),
        "$substr" | "$substrBytes" => (SubstrBytes, Exactly(3)),
        "$substrCP" => (SubstrCP, Exactly(3)),
        "$toLower" => (ToLower, Exactly(1)),
        "$toUpper" => (ToUpper, Exactly(1)),
        "$strLenBytes" => (StrLenBytes, Exactly(1)),
        "$strLenCP" => (StrLenCP, Exactly(1)),
        "$split" => (Split, Exactly(2)),
        "$indexOfBytes" => (IndexOfBytes, Between(2, 4)),
        "$indexOfCP" => (IndexOfCP, Between(2, 4)),
        "$strcasecmp" => (Strcasecmp, Exactly(2)),
        "$arrayElemAt" => (ArrayElemAt, Exactly(2)),
        "$first" => (First, Exactly(1)),
        "$last" => (Last, Exactly(1)),
        "$concatArrays" => (ConcatArrays, Any),
        "$in" => (In, Exactly(2)),
        "$size" => (Size, Exactly(1)),
        "$slice" => (Slice, Between(2, 3)),
        "$isArray" => (IsArray, Exactly(1)),
        "$reverseArray" => (ReverseArray, Exactly(1)),
        "$range" => (Range, Between(2, 3)),
        "$indexOfArray" => (IndexOfArray, Between(2, 4)),
        "$arrayToObject" => (ArrayToObject, Exactly(1)),
        "$objectToArray" => (ObjectToArray, Exactly(1)),
        "$mergeObjects" => (MergeObjects, Any),
        "$type" => (Type, Exactly(1)),
        "$toString" => (ToString, Exactly(1)),
        "$toInt" => (ToInt, Exactly(1)),
        "$toLong" => (ToLong, Exactly(1)),
        "$toDouble" => (ToDouble, Exactly(1)),
        "$toDecimal" => (ToDecimal, Exactly(1)),
        "$toBool" => (ToBool, Exactly(1)),
        "$toObjectId" => (ToObjectId, Exactly(1)),
        "$toDate" => (ToDate, Exactly(1)),
        "$isNumber" => (IsNumber, Exactly(1)),
        "$sum" => (Sum, Any),
        "$avg" => (Avg, Any),
        "$min" => (Min, Any),
        "$max" => (Max, Any),
        "$stdDevPop" => (StdDevPop, Any),
        "$stdDevSamp" => (StdDevSamp, Any),
        "$setUnion" => (SetUnion, Any),
        "$setIntersection" => (SetIntersection, Any),
        "$setDifference" => (SetDifference, Exactly(2)),
        "$setEquals" => (SetEquals, AtLeast(2)),
        "$setIsSubset" => (SetIsSubset, Exactly(2)),
        "$allElementsTrue" => (AllElementsTrue, Exactly(1)),
        "$anyElementTrue" => (AnyElementTrue, Exactly(1)),
        "$rand" => (Rand, Exactly(0)),
        "$sin" => (Trig(self::Trig::Sin), Exactly(1)),
        "$cos" => (Trig(self::Trig::Cos), Exactly(1)),
        "$tan" => (Trig(self::Trig::Tan), Exactly(1)),
        "$asin" => (Trig(self::Trig::Asin), Exactly(1)),
        "$acos" => (Trig(self::Trig::Acos), Exactly(1)),
        "$atan" => (Trig(self::Trig::Atan), Exactly(1)),
        "$sinh" => (Trig(self::Trig::Sinh), Exactly(1)),
        "$cosh" => (Trig(self::Trig::Cosh), Exactly(1)),
        "$tanh" => (Trig(self::Trig::Tanh), Exactly(1)),
        "$asinh" => (Trig(self::Trig::Asinh), Exactly(1)),
        "$acosh" => (Trig(self::Trig::Acosh), Exactly(1)),
        "$atanh" => (Trig(self::Trig::Atanh), Exactly(1)),
        "$degreesToRadians" => (Trig(self::Trig::DegreesToRadians), Exactly(1)),
        "$radiansToDegrees" => (Trig(self::Trig::RadiansToDegrees), Exactly(1)),
        "$atan2" => (Atan2, Exactly(2)),
        _ => return None,
    })
}

fn date_part(name: &str) -> Option<DatePart> {
    Some(match name {
        "$year" => DatePart::Year,
        "$month" => DatePart::Month,
        "$dayOfMonth" => DatePart::DayOfMonth,
        "$hour" => DatePart::Hour,
        "$minute" => DatePart::Minute,
        "$second" => DatePart::Second,
        "$millisecond" => DatePart::Millisecond,
        "$dayOfWeek" => DatePart::DayOfWeek,
        "$dayOfYear" => DatePart::DayOfYear,
        "$week" => DatePart::Week,
        "$isoWeek" => DatePart::IsoWeek,
        "$isoWeekYear" => DatePart::IsoWeekYear,
        "$isoDayOfWeek" => DatePart::IsoDayOfWeek,
        _ => return None,
    })
}

/// Names MongoDB knows as expressions but shoal does not evaluate: reported as unsupported
/// rather than "unrecognized" so clients see why.
const UNSUPPORTED_OPERATORS: &[&str] = &[
    "$meta",
    "$function",
    "$accumulator",
    "$dateAdd",
    "$dateSubtract",
    "$dateDiff",
    "$dateTrunc",
    "$dateFromParts",
    "$dateToParts",
    "$zip",
    "$sortArray",
    "$firstN",
    "$lastN",
    "$maxN",
    "$minN",
    "$bsonSize",
    "$binarySize",
    "$tsSecond",
    "$tsIncrement",
    "$getField_",
    "$median",
    "$percentile",
    "$toHashedIndexKey",
    "$sampleRate",
];

// ---------------------------------------------------------------------------------------------
// Parsing

#[derive(Default)]
struct Scope {
    names: Vec<(String, usize)>,
    slots: usize,
    depth: usize,
}

impl Scope {
    fn bind(&mut self, name: &str) -> usize {
        let slot = self.slots;
        self.slots += 1;
        self.names.push((name.to_string(), slot));
        slot
    }
    fn lookup(&self, name: &str) -> Option<usize> {
        self.names.iter().rev().find(|(n, _)| n == name).map(|(_, s)| *s)
    }
    fn pop(&mut self, n: usize) {
        let keep = self.names.len().saturating_sub(n);
        self.names.truncate(keep);
    }
}

fn err(code: i32, msg: impl Into<String>) -> Error {
    Error::location(code, msg)
}

/// MongoDB's type names ($type, error messages), "missing" for an absent value.
pub fn type_name(v: Option<&Bson>) -> &'static str {
    v.map_or("missing", common::value::type_name)
}

fn tn(v: &Value) -> &'static str {
    type_name(v.as_ref())
}

/// Validate a field path component ("$a.b" parts).
fn check_field_name(part: &str) -> Result<()> {
    if part.is_empty() {
        return Err(err(15998, "FieldPath field names may not be empty strings."));
    }
    if part.starts_with('$') {
        return Err(err(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField."));
    }
    if part.contains('\0') {
        return Err(err(16411, "FieldPath field names may not contain '\\0'."));
    }
    Ok(())
}

fn parse_path(s: &str) -> Result<Vec<String>> {
    if s.is_empty() {
        return Err(err(40352, "FieldPath cannot be constructed with empty string"));
    }
    if s.ends_with('.') {
        return Err(err(40353, "FieldPath must not end with a '.'."));
    }
    let parts: Vec<String> = s.split('.').map(str::to_string).collect();
    for p in &parts {
        check_field_name(p)?;
    }
    Ok(parts)
}

fn validate_var_name(name: &str) -> Result<()> {
    let Some(first) = name.chars().next() else {
        return Err(err(16869, "empty variable names are not allowed"));
    };
    if !first.is_ascii_lowercase() && first.is_ascii() {
        return Err(err(16870, format!("'{name}' starts with an invalid character for a user variable name")));
    }
    for c in name.chars() {
        if !(c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii()) {
            return Err(err(16871, format!("'{name}' contains an invalid character for a variable name: '{c}'")));
        }
    }
    Ok(())
}

fn parse_string_operand(s: &str, scope: &Scope) -> Result<Node> {
    if let Some(rest) = s.strip_prefix("$$") {
        let (name, path) = match rest.split_once('.') {
            Some((n, p)) => (n, parse_path(p)?),
            None => (rest, Vec::new()),
        };
        let var = match name {
            "ROOT" => Var::Root,
            "CURRENT" => Var::Current,
            "REMOVE" => Var::Remove,
            "NOW" => Var::Now,
            "CLUSTER_TIME" => Var::ClusterTime,
            "" => return Err(err(16869, "empty variable names are not allowed")),
            _ => match scope.lookup(name) {
                Some(slot) => Var::User(slot),
                None => return Err(err(17276, format!("Use of undefined variable: {name}"))),
            },
        };
        return Ok(Node::Var(var, path));
    }
    if let Some(rest) = s.strip_prefix('$') {
        if rest.is_empty() {
            return Err(err(16872, "'$' by itself is not a valid FieldPath"));
        }
        return Ok(Node::Field(parse_path(rest)?));
    }
    Ok(Node::Lit(Bson::String(s.to_string())))
}

fn parse_node(v: &Bson, scope: &mut Scope) -> Result<Node> {
    scope.depth += 1;
    if scope.depth > EXPR_DEPTH_MAX {
        return Err(Error::new(Code::Overflow, "expression nesting too deep"));
    }
    let r = parse_node_inner(v, scope);
    scope.depth -= 1;
    r
}

fn parse_node_inner(v: &Bson, scope: &mut Scope) -> Result<Node> {
    match v {
        Bson::String(s) => parse_string_operand(s, scope),
        Bson::Array(items) => {
            let nodes = items.iter().map(|i| parse_node(i, scope)).collect::<Result<Vec<_>>>()?;
            if let Some(lits) = all_literals(&nodes) {
                return Ok(Node::Lit(Bson::Array(lits)));
            }
            Ok(Node::Array(nodes))
        }
        Bson::Document(d) => parse_document(d, scope),
        other => Ok(Node::Lit(other.clone())),
    }
}

fn all_literals(nodes: &[Node]) -> Option<Vec<Bson>> {
    nodes
        .iter()
        .map(|n| match n {
            Node::Lit(b) => Some(b.clone()),
            _ => None,
        })
        .collect()
}

fn parse_document(d: &Document, scope: &mut Scope) -> Result<Node> {
    let Some((first, _)) = d.iter().next() else {
        return Ok(Node::Lit(Bson::Document(Document::new())));
    };
    if first.starts_with('$') {
        if d.len() != 1 {
            return Err(err(
                15983,
                format!(
                    "an expression specification must contain exactly one field, the name of the expression. Found {} fields in {}, while parsing object {}",
                    d.len(),
                    d,
                    d
                ),
            ));
        }
        let (name, arg) = d.iter().next().ok_or_else(|| Error::internal("empty"))?;
        return parse_operator(name, arg, scope);
    }
    let mut fields = Vec::with_capacity(d.len());
    for (k, v) in d {
        if k.starts_with('$') {
            return Err(err(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField."));
        }
        if k.contains('.') {
            return Err(err(16412, "FieldPath field names may not contain '.'. Consider using $getField or $setField."));
        }
        if k.is_empty() {
            return Err(err(15998, "FieldPath field names may not be empty strings."));
        }
        fields.push((k.clone(), parse_node(v, scope)?));
    }
    Ok(Node::Object(fields))
}

fn args_of(arg: &Bson) -> Vec<&Bson> {
    match arg {
        Bson::Array(a) => a.iter().collect(),
        other => vec![other],
    }
}

fn check_arity(name: &str, arity: &Arity, n: usize) -> Result<()> {
    match *arity {
        Arity::Exactly(k) if n != k => Err(err(16020, format!("Expression {name} takes exactly {k} arguments. {n} were passed in."))),
        Arity::AtLeast(k) if n < k => Err(err(16020, format!("Expression {name} takes at least {k} arguments, and {n} were passed in."))),
        Arity::Between(lo, hi) if n < lo || n > hi => {
            Err(err(28667, format!("Expression {name} takes at least {lo} arguments, and at most {hi}, but {n} were passed in.")))
        }
        _ => Ok(()),
    }
}

/// Parse `{field: expr, ...}` named arguments, rejecting unknown fields with `unknown(name)`.
fn named_args<'a>(arg: &'a Bson, allowed: &[&str], not_object: impl FnOnce() -> Error, unknown: impl Fn(&str) -> Error) -> Result<Vec<Option<&'a Bson>>> {
    let Bson::Document(d) = arg else { return Err(not_object()) };
    let mut out = vec![None; allowed.len()];
    for (k, v) in d {
        match allowed.iter().position(|a| a == k) {
            Some(i) => out[i] = Some(v),
            None => return Err(unknown(k)),
        }
    }
    Ok(out)
}

fn opt_node(v: Option<&Bson>, scope: &mut Scope) -> Result<Option<Box<Node>>> {
    v.map(|v| parse_node(v, scope).map(Box::new)).transpose()
}

fn parse_operator(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    if let Some((op, arity)) = simple_op(name) {
        let args = args_of(arg);
        check_arity(name, &arity, args.len())?;
        let nodes = args.into_iter().map(|a| parse_node(a, scope)).collect::<Result<Vec<_>>>()?;
        return Ok(Node::Op(op, nodes));
    }
    if let Some(part) = date_part(name) {
        return parse_date_part(name, part, arg, scope);
    }
    match name {
        "$literal" => Ok(Node::Lit(arg.clone())),
        "$cond" => parse_cond(arg, scope),
        "$switch" => parse_switch(arg, scope),
        "$let" => parse_let(arg, scope),
        "$map" => parse_map(arg, scope),
        "$filter" => parse_filter(arg, scope),
        "$reduce" => parse_reduce(arg, scope),
        "$trim" | "$ltrim" | "$rtrim" => {
            let kind = match name {
                "$trim" => TrimKind::Both,
                "$ltrim" => TrimKind::Left,
                _ => TrimKind::Right,
            };
            let a = named_args(
                arg,
                &["input", "chars"],
                || err(50696, format!("{name} only supports an object as its argument")),
                |k| err(50694, format!("{name} found an unknown argument: {k}")),
            )?;
            let input = a[0].ok_or_else(|| err(50695, format!("{name} requires an 'input' field")))?;
            Ok(Node::Trim { kind, input: Box::new(parse_node(input, scope)?), chars: opt_node(a[1], scope)? })
        }
        "$regexMatch" | "$regexFind" | "$regexFindAll" => {
            let kind = match name {
                "$regexMatch" => RegexKind::Match,
                "$regexFind" => RegexKind::Find,
                _ => RegexKind::FindAll,
            };
            let a = named_args(
                arg,
                &["input", "regex", "options"],
                || err(51103, format!("{name} expects an object of named arguments but found: {}", type_name(Some(arg)))),
                |k| err(31024, format!("{name} found an unknown argument: {k}")),
            )?;
            let input = a[0].ok_or_else(|| err(31022, format!("{name} requires 'input' parameter")))?;
            let regex = a[1].ok_or_else(|| err(31023, format!("{name} requires 'regex' parameter")))?;
            let input = Box::new(parse_node(input, scope)?);
            let regex_node = Box::new(parse_node(regex, scope)?);
            let options = opt_node(a[2], scope)?;
            // Compile once when pattern and options are constants.
            let compiled = match (&*regex_node, options.as_deref()) {
                (Node::Lit(r), None) => Some(compile_expr_regex(name, Some(r), None)?).flatten(),
                (Node::Lit(r), Some(Node::Lit(o))) => Some(compile_expr_regex(name, Some(r), Some(o))?).flatten(),
                _ => None,
            };
            Ok(Node::Regex { kind, input, regex: regex_node, options, compiled })
        }
        "$replaceOne" | "$replaceAll" => {
            let a = named_args(
                arg,
                &["input", "find", "replacement"],
                || err(51751, format!("{name} requires an object as an argument, found: {}", type_name(Some(arg)))),
                |k| err(51750, format!("{name} found an unknown argument: {k}")),
            )?;
            let input = a[0].ok_or_else(|| err(51749, format!("{name} requires 'input' to be specified")))?;
            let find = a[1].ok_or_else(|| err(51748, format!("{name} requires 'find' to be specified")))?;
            let repl = a[2].ok_or_else(|| err(51747, format!("{name} requires 'replacement' to be specified")))?;
            Ok(Node::Replace {
                all: name == "$replaceAll",
                input: Box::new(parse_node(input, scope)?),
                find: Box::new(parse_node(find, scope)?),
                replacement: Box::new(parse_node(repl, scope)?),
            })
        }
        "$dateToString" => {
            let a = named_args(
                arg,
                &["format", "date", "timezone", "onNull"],
                || err(18629, "$dateToString only supports an object as its argument"),
                |k| err(18534, format!("Unrecognized argument to $dateToString: {k}")),
            )?;
            let date = a[1].ok_or_else(|| err(18628, "Missing 'date' parameter to $dateToString"))?;
            if let Some(f) = a[0] {
                if !matches!(f, Bson::String(_)) && !matches!(f, Bson::Document(_)) && !is_expr_string(f) {
                    return Err(err(18533, format!("$dateToString requires that 'format' be a string, found: {} with value {}", type_name(Some(f)), f)));
                }
            }
            Ok(Node::DateToString {
                format: opt_node(a[0], scope)?,
                date: Box::new(parse_node(date, scope)?),
                timezone: opt_node(a[2], scope)?,
                on_null: opt_node(a[3], scope)?,
            })
        }
        "$dateFromString" => {
            let a = named_args(
                arg,
                &["dateString", "timezone", "onError", "onNull", "format"],
                || err(40540, format!("$dateFromString only supports an object as an argument, found: {}", type_name(Some(arg)))),
                |k| err(40541, format!("Unrecognized argument to $dateFromString: {k}")),
            )?;
            let s = a[0].ok_or_else(|| err(40542, "Missing 'dateString' parameter to $dateFromString"))?;
            if a[4].is_some() {
                return Err(Error::new(Code::NotImplemented, "$dateFromString 'format' is not supported by shoal"));
            }
            Ok(Node::DateFromString {
                string: Box::new(parse_node(s, scope)?),
                timezone: opt_node(a[1], scope)?,
                on_error: opt_node(a[2], scope)?,
                on_null: opt_node(a[3], scope)?,
            })
        }
        "$convert" => {
            let a = named_args(
                arg,
                &["input", "to", "onError", "onNull", "format", "base"],
                || err(ConversionCodes::NOT_OBJECT, format!("$convert expects an object of named arguments but found: {}", type_name(Some(arg)))),
                |k| err(ConversionCodes::UNKNOWN, format!("$convert found an unknown argument: {k}")),
            )?;
            let input = a[0].ok_or_else(|| err(ConversionCodes::MISSING_INPUT, "Missing 'input' parameter to $convert"))?;
            let to = a[1].ok_or_else(|| err(ConversionCodes::MISSING_TO, "Missing 'to' parameter to $convert"))?;
            if a[4].is_some() || a[5].is_some() {
                return Err(Error::new(Code::NotImplemented, "$convert 'format'/'base' are not supported by shoal"));
            }
            Ok(Node::Convert {
                input: Box::new(parse_node(input, scope)?),
                to: Box::new(parse_node(to, scope)?),
                on_error: opt_node(a[2], scope)?,
                on_null: opt_node(a[3], scope)?,
            })
        }
        "$getField" => {
            if let Bson::Document(d) = arg {
                if d.keys().next().is_some_and(|k| !k.starts_with('$')) {
                    let a = named_args(
                        arg,
                        &["field", "input"],
                        || err(3041703, "$getField requires an object"),
                        |k| err(3041701, format!("$getField found an unknown argument: {k}")),
                    )?;
                    let field = a[0].ok_or_else(|| err(3041702, "$getField requires 'field' to be specified"))?;
                    return Ok(Node::GetField { field: Box::new(parse_node(field, scope)?), input: opt_node(a[1], scope)? });
                }
            }
            Ok(Node::GetField { field: Box::new(parse_node(arg, scope)?), input: None })
        }
        "$setField" | "$unsetField" => {
            let allowed: &[&str] = if name == "$setField" { &["field", "input", "value"] } else { &["field", "input"] };
            let a = named_args(
                arg,
                allowed,
                || err(4161100, format!("{name} only supports an object as its argument")),
                |k| err(4161101, format!("{name} found an unknown argument: {k}")),
            )?;
            let field = a[0].ok_or_else(|| err(4161102, format!("{name} requires 'field' to be specified")))?;
            let input = a[1].ok_or_else(|| err(4161103, format!("{name} requires 'input' to be specified")))?;
            let field = match field {
                Bson::String(s) if !s.starts_with('$') => s.clone(),
                Bson::Document(d) if d.len() == 1 && d.contains_key("$literal") => match d.get("$literal") {
                    Some(Bson::String(s)) => s.clone(),
                    _ => return Err(err(4161107, format!("{name} requires 'field' to evaluate to type String"))),
                },
                _ => return Err(err(4161106, format!("{name} requires 'field' to evaluate to a constant, but got a non-constant argument"))),
            };
            let value = if name == "$setField" {
                let v = a[2].ok_or_else(|| err(4161104, "$setField requires 'value' to be specified"))?;
                let node = parse_node(v, scope)?;
                match node {
                    Node::Var(Var::Remove, ref p) if p.is_empty() => None,
                    n => Some(Box::new(n)),
                }
            } else {
                None
            };
            Ok(Node::SetField { field, input: Box::new(parse_node(input, scope)?), value })
        }
        _ if UNSUPPORTED_OPERATORS.contains(&name) => Err(Error::new(Code::NotImplemented, format!("Expression {name} is not supported by shoal"))),
        _ => Err(Error::new(Code::InvalidPipelineOperator, format!("Unrecognized expression '{name}'"))),
    }
}

fn is_expr_string(v: &Bson) -> bool {
    matches!(v, Bson::String(s) if s.starts_with('$'))
}

struct ConversionCodes;
impl ConversionCodes {
    const NOT_OBJECT: i32 = 4997700;
    const UNKNOWN: i32 = 4997701;
    const MISSING_INPUT: i32 = 4997702;
    const MISSING_TO: i32 = 4997703;
}

fn parse_date_part(name: &str, part: DatePart, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    // {date, timezone} form when the object's first key is not an operator.
    if let Bson::Document(d) = arg {
        if d.keys().next().is_some_and(|k| !k.starts_with('$')) {
            let mut date = None;
            let mut tz = None;
            for (k, v) in d {
                match k.as_str() {
                    "date" => date = Some(v),
                    "timezone" => tz = Some(v),
                    _ => return Err(err(40535, format!("unrecognized option to {name}: \"{k}\""))),
                }
            }
            let date = date.ok_or_else(|| err(40539, format!("missing 'date' argument to {name}, provided: {d}")))?;
            return Ok(Node::DatePart { part, date: Box::new(parse_node(date, scope)?), timezone: opt_node(tz, scope)? });
        }
    }
    let args = args_of(arg);
    check_arity(name, &Arity::Exactly(1), args.len())?;
    Ok(Node::DatePart { part, date: Box::new(parse_node(args[0], scope)?), timezone: None })
}

fn parse_cond(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    match arg {
        Bson::Document(d) => {
            let (mut i, mut t, mut e) = (None, None, None);
            for (k, v) in d {
                match k.as_str() {
                    "if" => i = Some(v),
                    "then" => t = Some(v),
                    "else" => e = Some(v),
                    _ => return Err(err(17083, format!("Unrecognized parameter to $cond: {k}"))),
                }
            }
            let i = i.ok_or_else(|| err(17080, "Missing 'if' parameter to $cond"))?;
            let t = t.ok_or_else(|| err(17081, "Missing 'then' parameter to $cond"))?;
            let e = e.ok_or_else(|| err(17082, "Missing 'else' parameter to $cond"))?;
            Ok(Node::Cond(Box::new((parse_node(i, scope)?, parse_node(t, scope)?, parse_node(e, scope)?))))
        }
        _ => {
            let args = args_of(arg);
            check_arity("$cond", &Arity::Exactly(3), args.len())?;
            Ok(Node::Cond(Box::new((parse_node(args[0], scope)?, parse_node(args[1], scope)?, parse_node(args[2], scope)?))))
        }
    }
}

fn parse_switch(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let Bson::Document(d) = arg else {
        return Err(err(40060, format!("$switch requires an object as an argument, found: {}", type_name(Some(arg)))));
    };
    let mut branches = Vec::new();
    let mut default = None;
    let mut saw_branches = false;
    for (k, v) in d {
        match k.as_str() {
            "branches" => {
                saw_branches = true;
                let Bson::Array(bs) = v else {
                    return Err(err(40061, format!("$switch expected an array for 'branches', found: {}", type_name(Some(v)))));
                };
                for b in bs {
                    let Bson::Document(bd) = b else {
                        return Err(err(40062, format!("$switch expected each branch to be an object, found: {}", type_name(Some(b)))));
                    };
                    let (mut c, mut t) = (None, None);
                    for (bk, bv) in bd {
                        match bk.as_str() {
                            "case" => c = Some(parse_node(bv, scope)?),
                            "then" => t = Some(parse_node(bv, scope)?),
                            _ => return Err(err(40063, format!("$switch found an unknown argument to a branch: {bk}"))),
                        }
                    }
                    let c = c.ok_or_else(|| err(40064, "$switch requires each branch have a 'case' expression"))?;
                    let t = t.ok_or_else(|| err(40065, "$switch requires each branch have a 'then' expression."))?;
                    branches.push((c, t));
                }
            }
            "default" => default = Some(Box::new(parse_node(v, scope)?)),
            _ => return Err(err(40067, format!("$switch found an unknown argument: {k}"))),
        }
    }
    if !saw_branches || branches.is_empty() {
        return Err(err(40068, "$switch requires at least one branch."));
    }
    Ok(Node::Switch { branches, default })
}

fn parse_let(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let Bson::Document(d) = arg else {
        return Err(err(16874, "$let only supports an object as its argument"));
    };
    let (mut vars, mut body) = (None, None);
    for (k, v) in d {
        match k.as_str() {
            "vars" => vars = Some(v),
            "in" => body = Some(v),
            _ => return Err(err(16875, format!("Unrecognized parameter to $let: {k}"))),
        }
    }
    let vars = vars.ok_or_else(|| err(16876, "Missing 'vars' parameter to $let"))?;
    let body = body.ok_or_else(|| err(16877, "Missing 'in' parameter to $let"))?;
    let Bson::Document(vd) = vars else {
        return Err(err(10065, "invalid parameter: expected an object (vars)"));
    };
    // Variable definitions are evaluated in the outer scope.
    let mut defs = Vec::with_capacity(vd.len());
    for (name, e) in vd {
        validate_var_name(name)?;
        defs.push((name.clone(), parse_node(e, scope)?));
    }
    let mut bound = Vec::with_capacity(defs.len());
    for (name, node) in defs {
        let slot = scope.bind(&name);
        bound.push((slot, node));
    }
    let body = parse_node(body, scope);
    scope.pop(bound.len());
    Ok(Node::Let { vars: bound, body: Box::new(body?) })
}

fn var_name_arg(v: Option<&Bson>, default: &str, code: i32, op: &str) -> Result<String> {
    match v {
        None => Ok(default.to_string()),
        Some(Bson::String(s)) => {
            validate_var_name(s)?;
            Ok(s.clone())
        }
        Some(other) => Err(err(code, format!("{op} 'as' must be a string, found: {}", type_name(Some(other))))),
    }
}

fn parse_map(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let a = named_args(
        arg,
        &["input", "as", "in"],
        || err(16878, "$map only supports an object as its argument"),
        |k| err(16879, format!("Unrecognized parameter to $map: {k}")),
    )?;
    let input = a[0].ok_or_else(|| err(16880, "Missing 'input' parameter to $map"))?;
    let body = a[2].ok_or_else(|| err(16882, "Missing 'in' parameter to $map"))?;
    let name = var_name_arg(a[1], "this", 16881, "$map")?;
    let input = parse_node(input, scope)?;
    let var = scope.bind(&name);
    let body = parse_node(body, scope);
    scope.pop(1);
    Ok(Node::Map { input: Box::new(input), var, body: Box::new(body?) })
}

fn parse_filter(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let a = named_args(
        arg,
        &["input", "as", "cond", "limit"],
        || err(28646, "$filter only supports an object as its argument"),
        |k| err(28647, format!("Unrecognized parameter to $filter: {k}")),
    )?;
    let input = a[0].ok_or_else(|| err(28648, "Missing 'input' parameter to $filter"))?;
    let cond = a[2].ok_or_else(|| err(28650, "Missing 'cond' parameter to $filter"))?;
    let name = var_name_arg(a[1], "this", 28649, "$filter")?;
    let input = parse_node(input, scope)?;
    let limit = opt_node(a[3], scope)?;
    let var = scope.bind(&name);
    let cond = parse_node(cond, scope);
    scope.pop(1);
    Ok(Node::Filter { input: Box::new(input), var, cond: Box::new(cond?), limit })
}

fn parse_reduce(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let a = named_args(
        arg,
        &["input", "initialValue", "in"],
        || err(40075, format!("$reduce requires an object as an argument, found: {}", type_name(Some(arg)))),
        |k| err(40076, format!("$reduce found an unknown argument: {k}")),
    )?;
    let input = a[0].ok_or_else(|| err(40077, "$reduce requires 'input' to be specified"))?;
    let initial = a[1].ok_or_else(|| err(40078, "$reduce requires 'initialValue' to be specified"))?;
    let body = a[2].ok_or_else(|| err(40079, "$reduce requires 'in' to be specified"))?;
    let input = parse_node(input, scope)?;
    let initial = parse_node(initial, scope)?;
    let value_var = scope.bind("value");
    let this_var = scope.bind("this");
    let body = parse_node(body, scope);
    scope.pop(2);
    Ok(Node::Reduce { input: Box::new(input), initial: Box::new(initial), value_var, this_var, body: Box::new(body?) })
}

// ---------------------------------------------------------------------------------------------
// Evaluation

struct Ctx<'a> {
    root: &'a Document,
    vars: Vec<Value>,
    now: Option<DateTime>,
}

impl Expr {
    pub fn parse(e: &Bson) -> Result<Expr> {
        Self::parse_with_variables(e, &[])
    }

    /// Parse with extra user variables in scope (e.g. `$lookup`'s `let`); their values are
    /// given to `eval_with_variables` in the same order.
    pub fn parse_with_variables(e: &Bson, names: &[String]) -> Result<Expr> {
        let mut scope = Scope::default();
        for n in names {
            validate_var_name(n)?;
            scope.bind(n);
        }
        let node = parse_node(e, &mut scope)?;
        Ok(Expr { node, slots: scope.slots })
    }

    /// Evaluate against `root` ($$ROOT/$$CURRENT). Missing results are `None`.
    pub fn eval(&self, root: &Document) -> Result<Option<Bson>> {
        self.eval_with_variables(root, &[])
    }

    pub fn eval_with_variables(&self, root: &Document, values: &[Bson]) -> Result<Option<Bson>> {
        let mut ctx = Ctx { root, vars: Vec::new(), now: None };
        if self.slots > 0 {
            ctx.vars = vec![None; self.slots];
            for (slot, v) in values.iter().enumerate().take(self.slots) {
                ctx.vars[slot] = Some(v.clone());
            }
        }
        eval(&self.node, &mut ctx)
    }

    /// The value when the expression is a constant (no field paths or variables).
    pub fn constant(&self) -> Option<&Bson> {
        match &self.node {
            Node::Lit(b) => Some(b),
            _ => None,
        }
    }

    /// A plain field path "$a.b" (relative to $$CURRENT), if that is all this expression is.
    pub fn field_path(&self) -> Option<&[String]> {
        match &self.node {
            Node::Field(p) => Some(p),
            _ => None,
        }
    }
}

/// Evaluate a parsed expression (`{$op: ...}`, field path, literal) in one go.
pub fn eval_bson(e: &Bson, root: &Document) -> Result<Option<Bson>> {
    Expr::parse(e)?.eval(root)
}

/// Aggregation truthiness (Value::coerceToBool).
pub fn truthy(v: &Value) -> bool {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => false,
        Some(Bson::Boolean(b)) => *b,
        Some(Bson::Int32(i)) => *i != 0,
        Some(Bson::Int64(i)) => *i != 0,
        Some(Bson::Double(d)) => *d != 0.0,
        Some(Bson::Decimal128(d)) => !Dec::decode(d).is_zero(),
        Some(_) => true,
    }
}

fn nullish(v: &Value) -> bool {
    matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined))
}

/// Aggregation field path lookup: arrays map the rest of the path over their documents.
pub(crate) fn get_path(v: &Bson, path: &[String]) -> Value {
    if path.is_empty() {
        return Some(v.clone());
    }
    match v {
        Bson::Document(d) => get_path_doc(d, path),
        Bson::Array(items) => Some(Bson::Array(items.iter().filter(|e| matches!(e, Bson::Document(_))).filter_map(|e| get_path(e, path)).collect())),
        _ => None,
    }
}

pub(crate) fn get_path_doc(d: &Document, path: &[String]) -> Value {
    let Some((first, rest)) = path.split_first() else {
        return Some(Bson::Document(d.clone()));
    };
    let v = d.get(first)?;
    if rest.is_empty() {
        return Some(v.clone());
    }
    match v {
        Bson::Document(_) | Bson::Array(_) => get_path(v, rest),
        _ => None,
    }
}

fn eval(node: &Node, ctx: &mut Ctx) -> Result<Value> {
    match node {
        Node::Lit(b) => Ok(Some(b.clone())),
        Node::Field(path) => Ok(get_path_doc(ctx.root, path)),
        Node::Var(var, path) => {
            let base: Value = match var {
                Var::Root | Var::Current => return Ok(get_path_doc(ctx.root, path)),
                Var::Remove => None,
                Var::Now => Some(Bson::DateTime(*ctx.now.get_or_insert_with(DateTime::now))),
                Var::ClusterTime => {
                    let now = ctx.now.get_or_insert_with(DateTime::now);
                    Some(Bson::Timestamp(bson::Timestamp { time: (now.timestamp_millis() / 1000).clamp(0, u32::MAX as i64) as u32, increment: 1 }))
                }
                Var::User(slot) => ctx.vars.get(*slot).cloned().flatten(),
            };
            Ok(match base {
                Some(b) => get_path(&b, path),
                None => None,
            })
        }
        Node::Object(fields) => {
            let mut out = Document::new();
            for (k, n) in fields {
                if let Some(v) = eval(n, ctx)? {
                    out.insert(k.clone(), v);
                }
            }
            Ok(Some(Bson::Document(out)))
        }
        Node::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for n in items {
                out.push(eval(n, ctx)?.unwrap_or(Bson::Null));
            }
            Ok(Some(Bson::Array(out)))
        }
        Node::Op(op, args) => eval_op(*op, args, ctx),
        Node::Cond(c) => {
            let (i, t, e) = &**c;
            if truthy(&eval(i, ctx)?) {
                eval(t, ctx)
            } else {
                eval(e, ctx)
            }
        }
        Node::Switch { branches, default } => {
            for (c, t) in branches {
                if truthy(&eval(c, ctx)?) {
                    return eval(t, ctx);
                }
            }
            match default {
                Some(d) => eval(d, ctx),
                None => Err(err(40066, "$switch could not find a matching branch for an input, and no default was specified.")),
            }
        }
        Node::Let { vars, body } => {
            let mut values = Vec::with_capacity(vars.len());
            for (slot, n) in vars {
                values.push((*slot, eval(n, ctx)?));
            }
            for (slot, v) in values {
                set_var(ctx, slot, v);
            }
            eval(body, ctx)
        }
        Node::Map { input, var, body } => {
            let v = eval(input, ctx)?;
            if nullish(&v) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(items)) = v else {
                return Err(err(16883, format!("input to $map must be an array not {}", tn(&v))));
            };
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                set_var(ctx, *var, Some(item));
                out.push(eval(body, ctx)?.unwrap_or(Bson::Null));
            }
            Ok(Some(Bson::Array(out)))
        }
        Node::Filter { input, var, cond, limit } => {
            let v = eval(input, ctx)?;
            if nullish(&v) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(items)) = v else {
                return Err(err(28651, format!("input to $filter must be an array not {}", tn(&v))));
            };
            let limit = match limit {
                None => None,
                Some(l) => {
                    let lv = eval(l, ctx)?;
                    if nullish(&lv) {
                        None
                    } else {
                        match lv.as_ref().and_then(Num::from_bson).and_then(|n| n.as_exact_i64()) {
                            Some(n) if n > 0 && n <= i32::MAX as i64 => Some(n as usize),
                            Some(n) if n <= 0 => return Err(err(327391, format!("$filter: limit must be greater than 0: {n}"))),
                            _ => return Err(err(327392, format!("$filter: limit must be represented as a 32-bit integral value: {}", show(&lv)))),
                        }
                    }
                }
            };
            let mut out = Vec::new();
            for item in items {
                set_var(ctx, *var, Some(item.clone()));
                if truthy(&eval(cond, ctx)?) {
                    out.push(item);
                    if limit.is_some_and(|l| out.len() >= l) {
                        break;
                    }
                }
            }
            Ok(Some(Bson::Array(out)))
        }
        Node::Reduce { input, initial, value_var, this_var, body } => {
            let v = eval(input, ctx)?;
            if nullish(&v) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(items)) = v else {
                return Err(err(40080, format!("$reduce requires that 'input' be an array, found: {}", show(&v))));
            };
            let mut acc = eval(initial, ctx)?;
            for item in items {
                set_var(ctx, *value_var, acc);
                set_var(ctx, *this_var, Some(item));
                acc = eval(body, ctx)?;
            }
            Ok(acc)
        }
        Node::Trim { kind, input, chars } => eval_trim(*kind, input, chars.as_deref(), ctx),
        Node::Regex { kind, input, regex, options, compiled } => eval_regex(*kind, input, regex, options.as_deref(), compiled.as_ref(), ctx),
        Node::Replace { all, input, find, replacement } => {
            let name = if *all { "$replaceAll" } else { "$replaceOne" };
            let i = eval(input, ctx)?;
            let f = eval(find, ctx)?;
            let r = eval(replacement, ctx)?;
            let check = |v: &Value, what: &str, code: i32| -> Result<()> {
                if !nullish(v) && !matches!(v, Some(Bson::String(_))) {
                    return Err(err(code, format!("{name} requires that '{what}' be a string, found: {}", show(v))));
                }
                Ok(())
            };
            check(&i, "input", 51746)?;
            check(&f, "find", 51745)?;
            check(&r, "replacement", 51744)?;
            match (i, f, r) {
                (Some(Bson::String(i)), Some(Bson::String(f)), Some(Bson::String(r))) => Ok(Some(Bson::String(if *all {
                    if f.is_empty() {
                        // MongoDB inserts the replacement between every character.
                        let mut out = r.clone();
                        for c in i.chars() {
                            out.push(c);
                            out.push_str(&r);
                        }
                        out
                    } else {
                        i.replace(&f, &r)
                    }
                } else {
                    i.replacen(&f, &r, 1)
                }))),
                _ => Ok(Some(Bson::Null)),
            }
        }
        Node::DatePart { part, date, timezone } => {
            let d = eval(date, ctx)?;
            let tz = eval_tz(timezone.as_deref(), ctx)?;
            if nullish(&d) {
                return Ok(Some(Bson::Null));
            }
            let Some(tz) = tz else { return Ok(Some(Bson::Null)) };
            let ms = date_millis(&d)?;
            let c = datetime::civil(ms.saturating_add(tz.offset_minutes as i64 * 60_000));
            let v: i64 = match part {
                DatePart::Year => c.year,
                DatePart::Month => c.month as i64,
                DatePart::DayOfMonth => c.day as i64,
                DatePart::Hour => c.hour as i64,
                DatePart::Minute => c.minute as i64,
                DatePart::Second => c.second as i64,
                DatePart::Millisecond => c.millis as i64,
                DatePart::DayOfWeek => c.weekday as i64 + 1,
                DatePart::DayOfYear => c.yday as i64,
                DatePart::Week => ((c.yday + 6 - c.weekday) / 7) as i64,
                DatePart::IsoWeek => datetime::iso_week(&c).1 as i64,
                DatePart::IsoWeekYear => {
                    return Ok(Some(Bson::Int64(datetime::iso_week(&c).0)));
                }
                DatePart::IsoDayOfWeek => datetime::iso_week(&c).2 as i64,
            };
            Ok(Some(Bson::Int32(v.clamp(i32::MIN as i64, i32::MAX as i64) as i32)))
        }
        Node::DateToString { format, date, timezone, on_null } => {
            let d = eval(date, ctx)?;
            let tz = eval_tz(timezone.as_deref(), ctx)?;
            let fmt = match format {
                Some(f) => match eval(f, ctx)? {
                    Some(Bson::String(s)) => Some(s),
                    v if nullish(&v) => return Ok(Some(Bson::Null)),
                    v => return Err(err(18533, format!("$dateToString requires that 'format' be a string, found: {} with value {}", tn(&v), show(&v)))),
                },
                None => None,
            };
            if nullish(&d) {
                return match on_null {
                    Some(n) => eval(n, ctx),
                    None => Ok(Some(Bson::Null)),
                };
            }
            let Some(tz) = tz else { return Ok(Some(Bson::Null)) };
            let ms = date_millis(&d)?;
            let fmt = fmt.unwrap_or_else(|| if tz == Tz::UTC { "%Y-%m-%dT%H:%M:%S.%LZ".to_string() } else { "%Y-%m-%dT%H:%M:%S.%L".to_string() });
            Ok(Some(Bson::String(datetime::format_date(&fmt, ms, tz)?)))
        }
        Node::DateFromString { string, timezone, on_error, on_null } => {
            let s = eval(string, ctx)?;
            let tz = eval_tz(timezone.as_deref(), ctx)?;
            if nullish(&s) {
                return match on_null {
                    Some(n) => eval(n, ctx),
                    None => Ok(Some(Bson::Null)),
                };
            }
            let Some(tz) = tz else { return Ok(Some(Bson::Null)) };
            let res = match &s {
                Some(Bson::String(st)) => datetime::parse_iso(st, tz)
                    .map(|ms| Bson::DateTime(DateTime::from_millis(ms)))
                    .ok_or_else(|| Error::new(Code::ConversionFailure, format!("Error parsing date string '{st}'"))),
                _ => Err(Error::new(
                    Code::ConversionFailure,
                    format!("$dateFromString requires that 'dateString' be a string, found: {} with value {}", tn(&s), show(&s)),
                )),
            };
            match res {
                Ok(v) => Ok(Some(v)),
                Err(e) => match on_error {
                    Some(n) => eval(n, ctx),
                    None => Err(e),
                },
            }
        }
        Node::Convert { input, to, on_error, on_null } => {
            let v = eval(input, ctx)?;
            let to_v = eval(to, ctx)?;
            if nullish(&to_v) {
                return Ok(Some(Bson::Null));
            }
            let target = convert_target(&to_v)?;
            if nullish(&v) {
                return match on_null {
                    Some(n) => eval(n, ctx),
                    None => Ok(Some(Bson::Null)),
                };
            }
            match convert(v.as_ref(), target) {
                Ok(r) => Ok(r),
                Err(e) if e.is(Code::ConversionFailure) => match on_error {
                    Some(n) => eval(n, ctx),
                    None => Err(e),
                },
                Err(e) => Err(e),
            }
        }
        Node::GetField { field, input } => {
            let f = eval(field, ctx)?;
            let Some(Bson::String(f)) = f else {
                return Err(err(5654602, format!("$getField requires 'field' to evaluate to type String, but got {}", tn(&f))));
            };
            let input = match input {
                Some(i) => eval(i, ctx)?,
                None => Some(Bson::Document(ctx.root.clone())),
            };
            match input {
                Some(Bson::Document(d)) => Ok(d.get(&f).cloned()),
                v if nullish(&v) => Ok(if v.is_none() { None } else { Some(Bson::Null) }),
                v => Err(err(3041705, format!("$getField requires 'input' to evaluate to type Object, but got {}", tn(&v)))),
            }
        }
        Node::SetField { field, input, value } => {
            let input = eval(input, ctx)?;
            let mut d = match input {
                Some(Bson::Document(d)) => d,
                v if nullish(&v) => return Ok(Some(Bson::Null)),
                v => return Err(err(4161105, format!("$setField requires 'input' to evaluate to type Object, but got {}", tn(&v)))),
            };
            match value {
                None => {
                    d.remove(field);
                }
                Some(n) => match eval(n, ctx)? {
                    Some(v) => {
                        d.insert(field.clone(), v);
                    }
                    None => {
                        d.remove(field);
                    }
                },
            }
            Ok(Some(Bson::Document(d)))
        }
    }
}

fn set_var(ctx: &mut Ctx, slot: usize, v: Value) {
    if slot >= ctx.vars.len() {
        ctx.vars.resize(slot + 1, None);
    }
    ctx.vars[slot] = v;
}

fn show(v: &Value) -> String {
    match v {
        None => "missing".into(),
        Some(Bson::String(s)) => format!("\"{s}\""),
        Some(b) => b.to_string(),
    }
}

fn eval_tz(tz: Option<&Node>, ctx: &mut Ctx) -> Result<Option<Tz>> {
    match tz {
        None => Ok(Some(Tz::UTC)),
        Some(n) => match eval(n, ctx)? {
            v if nullish(&v) => Ok(None),
            Some(Bson::String(s)) => Tz::parse(&s).map(Some),
            v => Err(err(40517, format!("timezone must evaluate to a string, found {}", tn(&v)))),
        },
    }
}

fn date_millis(v: &Value) -> Result<i64> {
    match v {
        Some(Bson::DateTime(d)) => Ok(d.timestamp_millis()),
        Some(Bson::Timestamp(t)) => Ok(t.time as i64 * 1000),
        Some(Bson::ObjectId(o)) => Ok(o.timestamp().timestamp_millis()),
        _ => Err(err(16006, format!("can't convert from BSON type {} to Date", tn(v)))),
    }
}

fn num_of(v: &Value) -> Option<Num> {
    v.as_ref().and_then(Num::from_bson)
}

fn bool_v(b: bool) -> Result<Value> {
    Ok(Some(Bson::Boolean(b)))
}

fn eval_args(args: &[Node], ctx: &mut Ctx) -> Result<Vec<Value>> {
    args.iter().map(|a| eval(a, ctx)).collect()
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Abs => "$abs",
        Op::Ceil => "$ceil",
        Op::Floor => "$floor",
        Op::Sqrt => "$sqrt",
        Op::Exp => "$exp",
        Op::Ln => "$ln",
        Op::Log10 => "$log10",
        Op::Round => "$round",
        Op::Trunc => "$trunc",
        Op::Sum => "$sum",
        Op::Avg => "$avg",
        Op::Min => "$min",
        Op::Max => "$max",
        Op::StdDevPop => "$stdDevPop",
        Op::StdDevSamp => "$stdDevSamp",
        Op::First => "$first",
        Op::Last => "$last",
        Op::ToString => "$toString",
        _ => "$expr",
    }
}

/// Integral i64 from a numeric value (2.0 ok, 2.5 not).
fn as_int(v: &Value) -> Option<i64> {
    num_of(v).and_then(|n| n.as_exact_i64())
}

fn as_i32(v: &Value) -> Option<i32> {
    as_int(v).and_then(|i| i32::try_from(i).ok())
}

fn eval_op(op: Op, args: &[Node], ctx: &mut Ctx) -> Result<Value> {
    match op {
        Op::And => {
            for a in args {
                if !truthy(&eval(a, ctx)?) {
                    return bool_v(false);
                }
            }
            bool_v(true)
        }
        Op::Or => {
            for a in args {
                if truthy(&eval(a, ctx)?) {
                    return bool_v(true);
                }
            }
            bool_v(false)
        }
        Op::IfNull => {
            let (last, init) = args.split_last().ok_or_else(|| Error::internal("$ifNull arity"))?;
            for a in init {
                let v = eval(a, ctx)?;
                if !nullish(&v) {
                    return Ok(v);
                }
            }
            eval(last, ctx)
        }
        _ => {
            let vals = eval_args(args, ctx)?;
            apply_op(op, vals)
        }
    }
}

fn arg(vals: &[Value], i: usize) -> &Value {
    const NONE: Value = None;
    vals.get(i).unwrap_or(&NONE)
}

fn apply_op(op: Op, vals: Vec<Value>) -> Result<Value> {
    let a0 = arg(&vals, 0);
    match op {
        Op::Add => {
            let mut acc = Num::I32(0);
            let mut date: Option<i64> = None;
            for v in &vals {
                if nullish(v) {
                    return Ok(Some(Bson::Null));
                }
                match v {
                    Some(Bson::DateTime(d)) => {
                        if date.is_some() {
                            return Err(err(16612, "only one date allowed in an $add expression"));
                        }
                        date = Some(d.timestamp_millis());
                    }
                    _ => match num_of(v) {
                        Some(n) => acc = acc.arith(n, ArithOp::Add, DecPrecision::Digits15, true).ok_or_else(|| Error::internal("add"))?,
                        None => return Err(err(16554, format!("$add only supports numeric or date types, not {}", tn(v)))),
                    },
                }
            }
            match date {
                Some(ms) => Ok(Some(Bson::DateTime(DateTime::from_millis(ms.saturating_add(num_to_millis(acc)?))))),
                None => Ok(Some(acc.to_bson())),
            }
        }
        Op::Subtract => {
            let (a, b) = (a0, arg(&vals, 1));
            if nullish(a) || nullish(b) {
                return Ok(Some(Bson::Null));
            }
            match (a, b) {
                (Some(Bson::DateTime(x)), Some(Bson::DateTime(y))) => Ok(Some(Bson::Int64(x.timestamp_millis().wrapping_sub(y.timestamp_millis())))),
                (Some(Bson::DateTime(x)), _) if num_of(b).is_some() => {
                    let n = num_of(b).ok_or_else(|| Error::internal("num"))?;
                    Ok(Some(Bson::DateTime(DateTime::from_millis(x.timestamp_millis().saturating_sub(num_to_millis(n)?)))))
                }
                _ => match (num_of(a), num_of(b)) {
                    (Some(x), Some(y)) => Ok(x.arith(y, ArithOp::Sub, DecPrecision::Digits15, true).map(Num::to_bson)),
                    _ => Err(err(16556, format!("cant $subtract a {} from a {}", tn(b), tn(a)))),
                },
            }
        }
        Op::Multiply => {
            let mut acc = Num::I32(1);
            for v in &vals {
                if nullish(v) {
                    return Ok(Some(Bson::Null));
                }
                let n = num_of(v).ok_or_else(|| err(16555, format!("$multiply only supports numeric types, not {}", tn(v))))?;
                acc = acc.arith(n, ArithOp::Mul, DecPrecision::Digits15, true).ok_or_else(|| Error::internal("mul"))?;
            }
            Ok(Some(acc.to_bson()))
        }
        Op::Divide => {
            let (a, b) = (a0, arg(&vals, 1));
            if nullish(a) || nullish(b) {
                return Ok(Some(Bson::Null));
            }
            let (Some(x), Some(y)) = (num_of(a), num_of(b)) else {
                return Err(err(16609, format!("$divide only supports numeric types, not {} and {}", tn(a), tn(b))));
            };
            if y.is_zero() {
                return Err(err(16608, "can't $divide by zero"));
            }
            if x.rank() == 3 || y.rank() == 3 {
                let r = x.to_dec(DecPrecision::Digits15).div(y.to_dec(DecPrecision::Digits15));
                return Ok(Some(Bson::Decimal128(r.encode())));
            }
            Ok(Some(Bson::Double(x.to_f64() / y.to_f64())))
        }
        Op::Mod => {
            let (a, b) = (a0, arg(&vals, 1));
            if nullish(a) || nullish(b) {
                return Ok(Some(Bson::Null));
            }
            let (Some(x), Some(y)) = (num_of(a), num_of(b)) else {
                return Err(err(16611, format!("$mod only supports numeric types, not {} and {}", tn(a), tn(b))));
            };
            if y.is_zero() {
                return Err(err(16610, "can't $mod by zero"));
            }
            Ok(Some(num_mod(x, y)))
        }
        Op::Abs | Op::Ceil | Op::Floor | Op::Sqrt | Op::Exp | Op::Ln | Op::Log10 => {
            if nullish(a0) {
                return Ok(Some(Bson::Null));
            }
            let n = num_of(a0).ok_or_else(|| err(28765, format!("{} only supports numeric types, not {}", op_name(op), tn(a0))))?;
            unary_math(op, n)
        }
        Op::Trig(t) => {
            if nullish(a0) {
                return Ok(Some(Bson::Null));
            }
            let n = num_of(a0).ok_or_else(|| err(28765, format!("${t:?} only supports numeric types, not {}", tn(a0))))?;
            trig(t, n)
        }
        Op::Atan2 => {
            let b = arg(&vals, 1);
            if nullish(a0) || nullish(b) {
                return Ok(Some(Bson::Null));
            }
            let (Some(y), Some(x)) = (num_of(a0), num_of(b)) else {
                return Err(err(51044, format!("$atan2 only supports numeric types, not {} and {}", tn(a0), tn(b))));
            };
            let r = y.to_f64().atan2(x.to_f64());
            Ok(Some(if y.rank() == 3 || x.rank() == 3 { Bson::Decimal128(Dec::from_f64_digits(r, 34).encode()) } else { Bson::Double(r) }))
        }
        Op::Log => {
            let b = arg(&vals, 1);
            if nullish(a0) || nullish(b) {
                return Ok(Some(Bson::Null));
            }
            let x = num_of(a0).ok_or_else(|| err(28756, format!("$log's argument must be numeric, not {}", tn(a0))))?;
            let base = num_of(b).ok_or_else(|| err(28757, format!("$log's base must be numeric, not {}", tn(b))))?;
            let (xf, bf) = (x.to_f64(), base.to_f64());
            if !(xf > 0.0) {
                return Err(err(28758, format!("$log's argument must be a positive number, but is {}", show(a0))));
            }
            if !(bf > 0.0) || bf == 1.0 {
                return Err(err(28759, format!("$log's base must be a positive number not equal to 1, but is {}", show(b))));
            }
            let r = xf.ln() / bf.ln();
            Ok(Some(if x.rank() == 3 || base.rank() == 3 { dec_shortest(r) } else { Bson::Double(r) }))
        }
        Op::Pow => {
            let b = arg(&vals, 1);
            if nullish(a0) || nullish(b) {
                return Ok(Some(Bson::Null));
            }
            let base = num_of(a0).ok_or_else(|| err(28762, format!("$pow's base must be numeric, not {}", tn(a0))))?;
            let exp = num_of(b).ok_or_else(|| err(28763, format!("$pow's exponent must be numeric, not {}", tn(b))))?;
            if base.is_zero() && exp.to_f64() < 0.0 {
                return Err(err(28764, "$pow cannot take a base of 0 and a negative exponent"));
            }
            pow(base, exp)
        }
        Op::Round | Op::Trunc => {
            let p = arg(&vals, 1);
            if nullish(a0) || (vals.len() > 1 && nullish(p)) {
                return Ok(Some(Bson::Null));
            }
            let n = num_of(a0).ok_or_else(|| err(51081, format!("{} only supports numeric types, not {}", op_name(op), tn(a0))))?;
            let place = if vals.len() > 1 {
                match as_int(p) {
                    Some(pl) if (-20..=100).contains(&pl) => pl as i32,
                    _ => return Err(err(51083, format!("cannot apply {} with precision value {} value must be in [-20, 100]", op_name(op), show(p)))),
                }
            } else {
                0
            };
            Ok(Some(round_num(n, place, op == Op::Trunc)))
        }
        Op::Eq | Op::Ne | Op::Gt | Op::Gte | Op::Lt | Op::Lte | Op::Cmp => {
            let o = cmp_opt(a0.as_ref(), arg(&vals, 1).as_ref());
            let b = match op {
                Op::Eq => o == Ordering::Equal,
                Op::Ne => o != Ordering::Equal,
                Op::Gt => o == Ordering::Greater,
                Op::Gte => o != Ordering::Less,
                Op::Lt => o == Ordering::Less,
                Op::Lte => o != Ordering::Greater,
                _ => {
                    return Ok(Some(Bson::Int32(match o {
                        Ordering::Less => -1,
                        Ordering::Equal => 0,
                        Ordering::Greater => 1,
                    })))
                }
            };
            bool_v(b)
        }
        Op::Not => bool_v(!truthy(a0)),
        Op::And | Op::Or | Op::IfNull => Err(Error::internal("short-circuit operator evaluated eagerly")),
        Op::Concat => {
            let mut out = String::new();
            for v in &vals {
                match v {
                    Some(Bson::String(s)) => out.push_str(s),
                    v if nullish(v) => return Ok(Some(Bson::Null)),
                    v => return Err(err(16702, format!("$concat only supports strings, not {}", tn(v)))),
                }
            }
            Ok(Some(Bson::String(out)))
        }
        Op::SubstrBytes => substr_bytes(&vals),
        Op::SubstrCP => substr_cp(&vals),
        Op::ToLower | Op::ToUpper => {
            let s = coerce_to_string(a0)?;
            Ok(Some(Bson::String(if op == Op::ToLower { s.to_ascii_lowercase() } else { s.to_ascii_uppercase() })))
        }
        Op::StrLenBytes => match a0 {
            Some(Bson::String(s)) => Ok(Some(int_result(s.len() as i64))),
            v => Err(err(34473, format!("$strLenBytes requires a string argument, found: {}", tn(v)))),
        },
        Op::StrLenCP => match a0 {
            Some(Bson::String(s)) => Ok(Some(int_result(s.chars().count() as i64))),
            v => Err(err(34471, format!("$strLenCP requires a string argument, found: {}", tn(v)))),
        },
        Op::Split => {
            let d = arg(&vals, 1);
            if nullish(a0) || nullish(d) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::String(s)) = a0 else {
                return Err(err(40085, format!("$split requires an expression that evaluates to a string as a first argument, found: {}", tn(a0))));
            };
            let Some(Bson::String(delim)) = d else {
                return Err(err(40086, format!("$split requires an expression that evaluates to a string as a second argument, found: {}", tn(d))));
            };
            if delim.is_empty() {
                return Err(err(40087, "$split requires a non-empty separator"));
            }
            Ok(Some(Bson::Array(s.split(delim.as_str()).map(|p| Bson::String(p.to_string())).collect())))
        }
        Op::IndexOfBytes | Op::IndexOfCP => index_of_str(op, &vals),
        Op::Strcasecmp => {
            let a = coerce_to_string(a0)?.to_ascii_lowercase();
            let b = coerce_to_string(arg(&vals, 1))?.to_ascii_lowercase();
            Ok(Some(Bson::Int32(match a.as_bytes().cmp(b.as_bytes()) {
                Ordering::Less => -1,
                Ordering::Equal => 0,
                Ordering::Greater => 1,
            })))
        }
        Op::ArrayElemAt => {
            let i = arg(&vals, 1);
            if nullish(a0) || nullish(i) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(items)) = a0 else {
                return Err(err(28689, format!("$arrayElemAt's first argument must be an array, but is {}", tn(a0))));
            };
            if num_of(i).is_none() {
                return Err(err(28690, format!("$arrayElemAt's second argument must be a numeric value, but is {}", tn(i))));
            }
            let idx =
                as_i32(i).ok_or_else(|| err(28691, format!("$arrayElemAt's second argument must be representable as a 32-bit integer: {}", show(i))))? as i64;
            let pos = if idx < 0 { items.len() as i64 + idx } else { idx };
            Ok(if pos < 0 { None } else { items.get(pos as usize).cloned() })
        }
        Op::First | Op::Last => {
            if nullish(a0) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(items)) = a0 else {
                return Err(err(28689, format!("{}'s argument must be an array, but is {}", op_name(op), tn(a0))));
            };
            Ok(if op == Op::First { items.first().cloned() } else { items.last().cloned() })
        }
        Op::ConcatArrays => {
            let mut out = Vec::new();
            for v in vals {
                match v {
                    Some(Bson::Array(items)) => out.extend(items),
                    v if nullish(&v) => return Ok(Some(Bson::Null)),
                    v => return Err(err(28664, format!("$concatArrays only supports arrays, not {}", tn(&v)))),
                }
            }
            Ok(Some(Bson::Array(out)))
        }
        Op::In => {
            let arr = arg(&vals, 1);
            let Some(Bson::Array(items)) = arr else {
                return Err(err(40081, format!("$in requires an array as a second argument, found: {}", tn(arr))));
            };
            bool_v(items.iter().any(|i| cmp_opt(a0.as_ref(), Some(i)) == Ordering::Equal))
        }
        Op::Size => match a0 {
            Some(Bson::Array(items)) => Ok(Some(int_result(items.len() as i64))),
            v => Err(err(17124, format!("The argument to $size must be an array. Type of argument is {}", tn(v)))),
        },
        Op::Slice => slice(&vals),
        Op::IsArray => bool_v(matches!(a0, Some(Bson::Array(_)))),
        Op::ReverseArray => match a0 {
            Some(Bson::Array(items)) => Ok(Some(Bson::Array(items.iter().rev().cloned().collect()))),
            v if nullish(v) => Ok(Some(Bson::Null)),
            v => Err(err(34435, format!("The argument to $reverseArray must be an array, but was of type: {}", tn(v)))),
        },
        Op::Range => range(&vals),
        Op::IndexOfArray => {
            if nullish(a0) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(items)) = a0 else {
                return Err(err(40090, format!("$indexOfArray requires an array as a first argument, found: {}", tn(a0))));
            };
            let (start, end) = index_bounds("$indexOfArray", &vals, items.len())?;
            let needle = arg(&vals, 1);
            for (i, item) in items.iter().enumerate().take(end).skip(start) {
                if cmp_opt(Some(item), needle.as_ref()) == Ordering::Equal {
                    return Ok(Some(int_result(i as i64)));
                }
            }
            Ok(Some(Bson::Int32(-1)))
        }
        Op::ArrayToObject => array_to_object(a0),
        Op::ObjectToArray => match a0 {
            Some(Bson::Document(d)) => Ok(Some(Bson::Array(d.iter().map(|(k, v)| Bson::Document(bson::doc! {"k": k.clone(), "v": v.clone()})).collect()))),
            v if nullish(v) => Ok(Some(Bson::Null)),
            v => Err(err(40390, format!("$objectToArray requires a document input, found: {}", tn(v)))),
        },
        Op::MergeObjects => {
            let mut out = Document::new();
            for v in vals {
                match v {
                    Some(Bson::Document(d)) => {
                        for (k, v) in d {
                            out.insert(k, v);
                        }
                    }
                    v if nullish(&v) => {}
                    v => return Err(err(40400, format!("$mergeObjects requires object inputs, but input {} is of type {}", show(&v), tn(&v)))),
                }
            }
            Ok(Some(Bson::Document(out)))
        }
        Op::Type => Ok(Some(Bson::String(type_name(a0.as_ref()).to_string()))),
        Op::IsNumber => bool_v(num_of(a0).is_some()),
        Op::ToString | Op::ToInt | Op::ToLong | Op::ToDouble | Op::ToDecimal | Op::ToBool | Op::ToObjectId | Op::ToDate => {
            if nullish(a0) {
                return Ok(Some(Bson::Null));
            }
            let target = match op {
                Op::ToString => Target::String,
                Op::ToInt => Target::Int,
                Op::ToLong => Target::Long,
                Op::ToDouble => Target::Double,
                Op::ToDecimal => Target::Decimal,
                Op::ToBool => Target::Bool,
                Op::ToObjectId => Target::ObjectId,
                _ => Target::Date,
            };
            convert(a0.as_ref(), target)
        }
        Op::Sum | Op::Avg | Op::Min | Op::Max | Op::StdDevPop | Op::StdDevSamp => {
            // One array argument means "over its elements"; several arguments are the values.
            let items: Vec<Bson> = if vals.len() == 1 {
                match vals.into_iter().next().flatten() {
                    Some(Bson::Array(items)) => items,
                    Some(v) => vec![v],
                    None => vec![],
                }
            } else {
                vals.into_iter().flatten().collect()
            };
            let mut acc = crate::agg::Accum::new(match op {
                Op::Sum => crate::agg::AccKind::Sum,
                Op::Avg => crate::agg::AccKind::Avg,
                Op::Min => crate::agg::AccKind::Min,
                Op::Max => crate::agg::AccKind::Max,
                Op::StdDevPop => crate::agg::AccKind::StdDevPop,
                _ => crate::agg::AccKind::StdDevSamp,
            });
            for i in items {
                acc.add(Some(i))?;
            }
            Ok(acc.finish())
        }
        Op::SetUnion | Op::SetIntersection => {
            let name = if op == Op::SetUnion { "$setUnion" } else { "$setIntersection" };
            let code = if op == Op::SetUnion { 17043 } else { 17047 };
            let mut arrays = Vec::with_capacity(vals.len());
            for v in vals {
                match v {
                    Some(Bson::Array(items)) => arrays.push(items),
                    v if nullish(&v) => return Ok(Some(Bson::Null)),
                    v => return Err(err(code, format!("All operands of {name} must be arrays. One argument is of type: {}", tn(&v)))),
                }
            }
            let mut out: Vec<Bson> = Vec::new();
            if op == Op::SetUnion {
                for items in arrays {
                    for i in items {
                        push_unique(&mut out, i);
                    }
                }
            } else if let Some((first, rest)) = arrays.split_first() {
                for i in first {
                    if rest.iter().all(|r| r.iter().any(|x| crate::compare::bson_eq(x, i))) {
                        push_unique(&mut out, i.clone());
                    }
                }
            }
            Ok(Some(Bson::Array(out)))
        }
        Op::SetDifference => {
            let b = arg(&vals, 1);
            if nullish(a0) || nullish(b) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(x)) = a0 else {
                return Err(err(17048, format!("both operands of $setDifference must be arrays. First argument is of type: {}", tn(a0))));
            };
            let Some(Bson::Array(y)) = b else {
                return Err(err(17049, format!("both operands of $setDifference must be arrays. Second argument is of type: {}", tn(b))));
            };
            let mut out = Vec::new();
            for i in x {
                if !y.iter().any(|v| crate::compare::bson_eq(v, i)) {
                    push_unique(&mut out, i.clone());
                }
            }
            Ok(Some(Bson::Array(out)))
        }
        Op::SetEquals => {
            let mut sets: Vec<&Vec<Bson>> = Vec::new();
            for v in &vals {
                match v {
                    Some(Bson::Array(items)) => sets.push(items),
                    v => return Err(err(17044, format!("All operands of $setEquals must be arrays. One argument is of type: {}", tn(v)))),
                }
            }
            let subset = |a: &Vec<Bson>, b: &Vec<Bson>| a.iter().all(|i| b.iter().any(|x| crate::compare::bson_eq(x, i)));
            let first = sets.first().copied();
            bool_v(first.is_some_and(|f| sets.iter().all(|s| subset(f, s) && subset(s, f))))
        }
        Op::SetIsSubset => {
            let b = arg(&vals, 1);
            let Some(Bson::Array(x)) = a0 else {
                return Err(err(17046, format!("both operands of $setIsSubset must be arrays. First argument is of type: {}", tn(a0))));
            };
            let Some(Bson::Array(y)) = b else {
                return Err(err(17042, format!("both operands of $setIsSubset must be arrays. Second argument is of type: {}", tn(b))));
            };
            bool_v(x.iter().all(|i| y.iter().any(|v| crate::compare::bson_eq(v, i))))
        }
        Op::AllElementsTrue | Op::AnyElementTrue => {
            let Some(Bson::Array(items)) = a0 else {
                let (code, name) = if op == Op::AllElementsTrue { (17040, "$allElementsTrue") } else { (17041, "$anyElementTrue") };
                return Err(err(code, format!("{name}'s argument must be an array, but is {}", tn(a0))));
            };
            let mut it = items.iter().map(|i| truthy(&Some(i.clone())));
            bool_v(if op == Op::AllElementsTrue { it.all(|b| b) } else { it.any(|b| b) })
        }
        Op::Rand => Ok(Some(Bson::Double(rand::random::<f64>()))),
    }
}

fn push_unique(out: &mut Vec<Bson>, v: Bson) {
    if !out.iter().any(|x| crate::compare::bson_eq(x, &v)) {
        out.push(v);
    }
}

/// int32 when it fits, else int64 (lengths and indexes).
fn int_result(v: i64) -> Bson {
    match i32::try_from(v) {
        Ok(i) => Bson::Int32(i),
        Err(_) => Bson::Int64(v),
    }
}

fn num_to_millis(n: Num) -> Result<i64> {
    Ok(match n {
        Num::I32(i) => i as i64,
        Num::I64(i) => i,
        Num::F64(d) => {
            if !d.is_finite() {
                return Err(err(40010, "Invalid date value: NaN or Infinity"));
            }
            d.round() as i64
        }
        Num::Dec(d) => d.round_to_place(0, false).to_i64_trunc().ok_or_else(|| err(40010, "date overflow"))?,
    })
}

fn dec_shortest(x: f64) -> Bson {
    Bson::Decimal128(dec_from_f64_shortest(x).encode())
}

pub(crate) fn dec_from_f64_shortest(x: f64) -> Dec {
    if !x.is_finite() {
        return Dec::from_f64(x);
    }
    let s = format!("{x:e}");
    Dec::from_str(&s).unwrap_or_else(|| Dec::from_f64(x))
}

fn num_mod(x: Num, y: Num) -> Bson {
    match (x, y) {
        (Num::I32(a), Num::I32(b)) => Bson::Int32(a.wrapping_rem(b)),
        _ if x.rank() <= 1 && y.rank() <= 1 => {
            let (a, b) = (x.to_i64().unwrap_or(0), y.to_i64().unwrap_or(1));
            Bson::Int64(a.wrapping_rem(b))
        }
        _ if x.rank() == 3 || y.rank() == 3 => {
            let (a, b) = (x.to_dec(DecPrecision::Digits15), y.to_dec(DecPrecision::Digits15));
            let q = a.div(b).round_to_place(0, true);
            Bson::Decimal128(a.sub(q.mul(b)).encode())
        }
        _ => Bson::Double(x.to_f64() % y.to_f64()),
    }
}

fn unary_math(op: Op, n: Num) -> Result<Value> {
    let r = match (op, n) {
        (Op::Abs, Num::I32(i)) => {
            if i == i32::MIN {
                Bson::Int64(-(i as i64))
            } else {
                Bson::Int32(i.abs())
            }
        }
        (Op::Abs, Num::I64(i)) => {
            if i == i64::MIN {
                return Err(err(28680, "can't take $abs of long long min"));
            }
            Bson::Int64(i.abs())
        }
        (Op::Abs, Num::F64(d)) => Bson::Double(d.abs()),
        (Op::Abs, Num::Dec(d)) => Bson::Decimal128(d.abs().encode()),
        (Op::Ceil | Op::Floor, Num::I32(_) | Num::I64(_)) => n.to_bson(),
        (Op::Ceil, Num::F64(d)) => Bson::Double(d.ceil()),
        (Op::Floor, Num::F64(d)) => Bson::Double(d.floor()),
        (Op::Ceil, Num::Dec(d)) => Bson::Decimal128(d.ceil().encode()),
        (Op::Floor, Num::Dec(d)) => Bson::Decimal128(d.floor().encode()),
        _ => {
            let x = n.to_f64();
            let r = match op {
                Op::Sqrt => {
                    if x < 0.0 {
                        return Err(err(28714, "$sqrt's argument must be greater than or equal to 0"));
                    }
                    x.sqrt()
                }
                Op::Exp => x.exp(),
                Op::Ln => {
                    if !(x > 0.0) {
                        return Err(err(28766, format!("$ln's argument must be a positive number, but is {}", n.to_bson())));
                    }
                    x.ln()
                }
                _ => {
                    if !(x > 0.0) {
                        return Err(err(28761, format!("$log10's argument must be a positive number, but is {}", n.to_bson())));
                    }
                    x.log10()
                }
            };
            if n.rank() == 3 {
                dec_shortest(r)
            } else {
                Bson::Double(r)
            }
        }
    };
    Ok(Some(r))
}

fn trig(t: Trig, n: Num) -> Result<Value> {
    let x = n.to_f64();
    let bounded = |lo: f64, hi: f64, name: &str| -> Result<()> {
        if !x.is_nan() && !(lo..=hi).contains(&x) {
            return Err(err(50989, format!("cannot apply ${name} to {}, value must be in [{lo},{hi}]", n.to_bson())));
        }
        Ok(())
    };
    let r = match t {
        Trig::Sin => x.sin(),
        Trig::Cos => x.cos(),
        Trig::Tan => x.tan(),
        Trig::Asin => {
            bounded(-1.0, 1.0, "asin")?;
            x.asin()
        }
        Trig::Acos => {
            bounded(-1.0, 1.0, "acos")?;
            x.acos()
        }
        Trig::Atan => x.atan(),
        Trig::Sinh => x.sinh(),
        Trig::Cosh => x.cosh(),
        Trig::Tanh => x.tanh(),
        Trig::Asinh => x.asinh(),
        Trig::Acosh => {
            bounded(1.0, f64::INFINITY, "acosh")?;
            x.acosh()
        }
        Trig::Atanh => {
            bounded(-1.0, 1.0, "atanh")?;
            x.atanh()
        }
        Trig::DegreesToRadians => x.to_radians(),
        Trig::RadiansToDegrees => x.to_degrees(),
    };
    Ok(Some(if n.rank() == 3 { dec_shortest(r) } else { Bson::Double(r) }))
}

fn pow(base: Num, exp: Num) -> Result<Value> {
    if base.rank() == 3 || exp.rank() == 3 {
        return Ok(Some(dec_shortest(base.to_f64().powf(exp.to_f64()))));
    }
    if base.rank() == 2 || exp.rank() == 2 {
        return Ok(Some(Bson::Double(base.to_f64().powf(exp.to_f64()))));
    }
    let (b, e) = (base.to_i64().unwrap_or(0), exp.to_i64().unwrap_or(0));
    let both_int = base.rank() == 0 && exp.rank() == 0;
    if e < 0 {
        return Ok(Some(match b {
            1 => base.to_bson(),
            -1 => {
                let v: i64 = if e % 2 == 0 { 1 } else { -1 };
                if both_int {
                    Bson::Int32(v as i32)
                } else {
                    Bson::Int64(v)
                }
            }
            _ => Bson::Double((b as f64).powf(e as f64)),
        }));
    }
    match u32::try_from(e).ok().and_then(|e| b.checked_pow(e)) {
        Some(r) => Ok(Some(if both_int { int_result(r) } else { Bson::Int64(r) })),
        None => Ok(Some(Bson::Double((b as f64).powf(e as f64)))),
    }
}

fn round_num(n: Num, place: i32, truncate: bool) -> Bson {
    match n {
        Num::I32(_) | Num::I64(_) if place >= 0 => n.to_bson(),
        Num::I32(i) => {
            let r = Dec::from_i64(i as i64).round_to_place(place, truncate).to_i64_trunc();
            match r {
                Some(v) => int_result(v),
                None => n.to_bson(),
            }
        }
        Num::I64(i) => match Dec::from_i64(i).round_to_place(place, truncate).to_i64_trunc() {
            Some(v) => Bson::Int64(v),
            None => n.to_bson(),
        },
        Num::F64(d) => {
            if !d.is_finite() {
                return Bson::Double(d);
            }
            let r = dec_from_f64_shortest(d).round_to_place(place, truncate).to_f64();
            // Keep the sign of zero results like C's round/trunc.
            Bson::Double(if r == 0.0 && d.is_sign_negative() { -0.0 } else { r })
        }
        Num::Dec(d) => Bson::Decimal128(d.round_to_place(place, truncate).encode()),
    }
}

/// Value::coerceToString: null/missing -> "", numbers/dates rendered, others an error.
fn coerce_to_string(v: &Value) -> Result<String> {
    Ok(match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => String::new(),
        Some(Bson::String(s)) | Some(Bson::Symbol(s)) | Some(Bson::JavaScriptCode(s)) => s.clone(),
        Some(Bson::Int32(i)) => i.to_string(),
        Some(Bson::Int64(i)) => i.to_string(),
        Some(Bson::Double(d)) => fmt_g(*d),
        Some(Bson::Decimal128(d)) => d.to_string(),
        Some(Bson::DateTime(d)) => datetime::iso_string(d.timestamp_millis()),
        Some(Bson::Timestamp(t)) => format!("Timestamp({}, {})", t.time, t.increment),
        Some(other) => return Err(err(16007, format!("can't convert from BSON type {} to String", type_name(Some(other))))),
    })
}

fn substr_bytes(vals: &[Value]) -> Result<Value> {
    let s = coerce_to_string(arg(vals, 0))?;
    let (lo, len) = (arg(vals, 1), arg(vals, 2));
    let Some(lo_n) = num_of(lo) else {
        return Err(err(16034, format!("$substrBytes: starting index must be a numeric type (is BSON type {})", tn(lo))));
    };
    let Some(len_n) = num_of(len) else {
        return Err(err(16035, format!("$substrBytes: length must be a numeric type (is BSON type {})", tn(len))));
    };
    let lo_i = trunc_i64(lo_n);
    if lo_i < 0 {
        return Err(err(50752, format!("$substrBytes: starting index must be non-negative (got: {lo_i})")));
    }
    let len_i = trunc_i64(len_n);
    let bytes = s.as_bytes();
    let start = (lo_i as usize).min(bytes.len());
    if start < bytes.len() && is_continuation(bytes[start]) {
        return Err(err(28656, "$substrBytes:  Invalid range, starting index is a UTF-8 continuation byte."));
    }
    let end = if len_i < 0 { bytes.len() } else { start.saturating_add(len_i as usize).min(bytes.len()) };
    if end < bytes.len() && is_continuation(bytes[end]) {
        return Err(err(28657, "$substrBytes:  Invalid range, ending index is in the middle of a UTF-8 character."));
    }
    Ok(Some(Bson::String(String::from_utf8_lossy(&bytes[start..end]).into_owned())))
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

fn trunc_i64(n: Num) -> i64 {
    match n {
        Num::I32(i) => i as i64,
        Num::I64(i) => i,
        Num::F64(d) => {
            if d.is_nan() {
                0
            } else {
                d.trunc().clamp(i64::MIN as f64, i64::MAX as f64) as i64
            }
        }
        Num::Dec(d) => d.to_i64_trunc().unwrap_or(if d.is_neg() { i64::MIN } else { i64::MAX }),
    }
}

fn substr_cp(vals: &[Value]) -> Result<Value> {
    let s = coerce_to_string(arg(vals, 0))?;
    let (lo, len) = (arg(vals, 1), arg(vals, 2));
    if num_of(lo).is_none() {
        return Err(err(34450, format!("$substrCP: starting index must be a numeric type (is BSON type {})", tn(lo))));
    }
    let lo_i = as_i32(lo).ok_or_else(|| err(34451, format!("$substrCP: starting index cannot be represented as a 32-bit integral value: {}", show(lo))))?;
    if num_of(len).is_none() {
        return Err(err(34452, format!("$substrCP: length must be a numeric type (is BSON type {})", tn(len))));
    }
    let len_i = as_i32(len).ok_or_else(|| err(34453, format!("$substrCP: length cannot be represented as a 32-bit integral value: {}", show(len))))?;
    if lo_i < 0 {
        return Err(err(34454, "$substrCP: the starting index must be nonnegative integer."));
    }
    if len_i < 0 {
        return Err(err(34455, "$substrCP: length must be a nonnegative integer."));
    }
    Ok(Some(Bson::String(s.chars().skip(lo_i as usize).take(len_i as usize).collect())))
}

/// Optional start/end index arguments (positions 2 and 3) of $indexOf*.
fn index_bounds(name: &str, vals: &[Value], len: usize) -> Result<(usize, usize)> {
    let bound = |i: usize, default: usize, what: &str| -> Result<usize> {
        match vals.get(i) {
            None => Ok(default),
            Some(v) => {
                let n = as_int(v)
                    .ok_or_else(|| err(40096, format!("{name} requires an integral {what}, found a value of type: {}, with value: {}", tn(v), show(v))))?;
                if n < 0 {
                    return Err(err(40097, format!("{name} requires a nonnegative {what}, found: {n}")));
                }
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            }
        }
    };
    let start = bound(2, 0, "starting index")?;
    let end = bound(3, len, "ending index")?.min(len);
    Ok((start, end))
}

fn index_of_str(op: Op, vals: &[Value]) -> Result<Value> {
    let name = if op == Op::IndexOfBytes { "$indexOfBytes" } else { "$indexOfCP" };
    let s = arg(vals, 0);
    if nullish(s) {
        return Ok(Some(Bson::Null));
    }
    let Some(Bson::String(s)) = s else {
        return Err(err(40091, format!("{name} requires a string as the first argument, found: {}", tn(s))));
    };
    let sub = arg(vals, 1);
    let Some(Bson::String(sub)) = sub else {
        return Err(err(40092, format!("{name} requires a string as the second argument, found: {}", tn(sub))));
    };
    if op == Op::IndexOfBytes {
        let (start, end) = index_bounds(name, vals, s.len())?;
        if start > end || start > s.len() {
            return Ok(Some(Bson::Int32(-1)));
        }
        let hay = &s.as_bytes()[start..end];
        let needle = sub.as_bytes();
        if needle.is_empty() {
            return Ok(Some(int_result(start as i64)));
        }
        let pos = hay.windows(needle.len()).position(|w| w == needle);
        Ok(Some(match pos {
            Some(p) => int_result((start + p) as i64),
            None => Bson::Int32(-1),
        }))
    } else {
        let chars: Vec<char> = s.chars().collect();
        let needle: Vec<char> = sub.chars().collect();
        let (start, end) = index_bounds(name, vals, chars.len())?;
        if start > end || start > chars.len() {
            return Ok(Some(Bson::Int32(-1)));
        }
        if needle.is_empty() {
            return Ok(Some(int_result(start as i64)));
        }
        let hay = &chars[start..end];
        let pos = hay.windows(needle.len()).position(|w| w == needle.as_slice());
        Ok(Some(match pos {
            Some(p) => int_result((start + p) as i64),
            None => Bson::Int32(-1),
        }))
    }
}

fn slice(vals: &[Value]) -> Result<Value> {
    let a = arg(vals, 0);
    if vals.iter().any(nullish) {
        return Ok(Some(Bson::Null));
    }
    let Some(Bson::Array(items)) = a else {
        return Err(err(28724, format!("First argument to $slice must be an array, but is of type: {}", tn(a))));
    };
    let second = arg(vals, 1);
    if num_of(second).is_none() {
        return Err(err(28725, format!("Second argument to $slice must be a numeric value, but is of type: {}", tn(second))));
    }
    let second =
        as_i32(second).ok_or_else(|| err(28726, format!("Second argument to $slice can't be represented as a 32-bit integer: {}", show(second))))? as i64;
    let len = items.len() as i64;
    let (start, count) = if vals.len() == 2 {
        if second >= 0 {
            (0, second)
        } else {
            ((len + second).max(0), len)
        }
    } else {
        let third = arg(vals, 2);
        if num_of(third).is_none() {
            return Err(err(28727, format!("Third argument to $slice must be numeric, but is of type: {}", tn(third))));
        }
        let n = as_i32(third).ok_or_else(|| err(28728, format!("Third argument to $slice can't be represented as a 32-bit integer: {}", show(third))))? as i64;
        if n <= 0 {
            return Err(err(28729, format!("Third argument to $slice must be positive: {n}")));
        }
        let start = if second >= 0 { second.min(len) } else { (len + second).max(0) };
        (start, n)
    };
    let start = start as usize;
    let end = (start as i64 + count).min(len).max(start as i64) as usize;
    Ok(Some(Bson::Array(items[start..end].to_vec())))
}

fn range(vals: &[Value]) -> Result<Value> {
    let (s, e) = (arg(vals, 0), arg(vals, 1));
    if num_of(s).is_none() {
        return Err(err(34443, format!("$range requires a numeric starting value, found value of type: {}", tn(s))));
    }
    let start = as_i32(s)
        .ok_or_else(|| err(34444, format!("$range requires a starting value that can be represented as a 32-bit integer, found value: {}", show(s))))?
        as i64;
    if num_of(e).is_none() {
        return Err(err(34445, format!("$range requires a numeric ending value, found value of type: {}", tn(e))));
    }
    let end = as_i32(e)
        .ok_or_else(|| err(34446, format!("$range requires an ending value that can be represented as a 32-bit integer, found value: {}", show(e))))?
        as i64;
    let step = match vals.get(2) {
        None => 1,
        Some(st) => {
            if num_of(st).is_none() {
                return Err(err(34447, format!("$range requires a numeric step value, found value of type: {}", tn(st))));
            }
            as_i32(st)
                .ok_or_else(|| err(34448, format!("$range requires a step value that can be represented as a 32-bit integer, found value: {}", show(st))))?
                as i64
        }
    };
    if step == 0 {
        return Err(err(34449, "$range requires a non-zero step value"));
    }
    let count = if (step > 0 && end > start) || (step < 0 && end < start) { ((end - start).abs() + step.abs() - 1) / step.abs() } else { 0 };
    if count as usize > RANGE_ELEMENTS_MAX {
        return Err(Error::new(Code::ExceededMemoryLimit, format!("$range would use too much memory ({} elements) and cannot spill to disk", count)));
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut v = start;
    for _ in 0..count {
        out.push(Bson::Int32(v as i32));
        v += step;
    }
    Ok(Some(Bson::Array(out)))
}

fn array_to_object(v: &Value) -> Result<Value> {
    let items = match v {
        Some(Bson::Array(items)) => items,
        v if nullish(v) => return Ok(Some(Bson::Null)),
        v => return Err(err(40386, format!("$arrayToObject requires an array input, found: {}", tn(v)))),
    };
    let mut out = Document::new();
    let pairs_form = matches!(items.first(), Some(Bson::Array(_)));
    for item in items {
        let (k, val) = match (item, pairs_form) {
            (Bson::Array(pair), true) => {
                if pair.len() != 2 {
                    return Err(err(40397, format!("$arrayToObject requires an array of size 2 arrays,found array of size: {}", pair.len())));
                }
                match &pair[0] {
                    Bson::String(k) => (k.clone(), pair[1].clone()),
                    other => {
                        return Err(err(
                            40395,
                            format!(
                                "$arrayToObject requires an array of key-value pairs, where the key must be of type string. Found key type: {}",
                                type_name(Some(other))
                            ),
                        ))
                    }
                }
            }
            (Bson::Document(d), false) => {
                if d.len() != 2 {
                    return Err(err(40392, format!("$arrayToObject requires an object keys of 'k' and 'v'. Found incorrect number of keys:{}", d.len())));
                }
                match (d.get("k"), d.get("v")) {
                    (Some(Bson::String(k)), Some(v)) => (k.clone(), v.clone()),
                    (Some(other), Some(_)) => {
                        return Err(err(
                            40394,
                            format!(
                                "$arrayToObject requires an object with keys 'k' and 'v', where the value of 'k' must be of type string. Found type: {}",
                                type_name(Some(other))
                            ),
                        ))
                    }
                    _ => return Err(err(40393, "$arrayToObject requires an object with keys 'k' and 'v'. Missing either or both keys from: ")),
                }
            }
            (other, _) => return Err(err(40398, format!("Unrecognised input type format for $arrayToObject: {}", type_name(Some(other))))),
        };
        if k.contains('\0') {
            return Err(err(4940400, "Key field cannot contain an embedded null byte"));
        }
        out.insert(k, val);
    }
    Ok(Some(Bson::Document(out)))
}

fn eval_trim(kind: TrimKind, input: &Node, chars: Option<&Node>, ctx: &mut Ctx) -> Result<Value> {
    let name = match kind {
        TrimKind::Both => "$trim",
        TrimKind::Left => "$ltrim",
        TrimKind::Right => "$rtrim",
    };
    let v = eval(input, ctx)?;
    if nullish(&v) {
        return Ok(Some(Bson::Null));
    }
    let Some(Bson::String(s)) = v else {
        return Err(err(50699, format!("{name} requires its input to be a string, got {} (of type {}) instead.", show(&v), tn(&v))));
    };
    let set: Vec<char> = match chars {
        None => vec![
            '\0', ' ', '\t', '\n', '\u{0B}', '\u{0C}', '\r', '\u{A0}', '\u{1680}', '\u{2000}', '\u{2001}', '\u{2002}', '\u{2003}', '\u{2004}', '\u{2005}',
            '\u{2006}', '\u{2007}', '\u{2008}', '\u{2009}', '\u{200A}', '\u{2028}', '\u{2029}', '\u{202F}', '\u{205F}', '\u{3000}',
        ],
        Some(c) => match eval(c, ctx)? {
            Some(Bson::String(cs)) => cs.chars().collect(),
            v if nullish(&v) => return Ok(Some(Bson::Null)),
            v => return Err(err(50700, format!("{name} requires 'chars' to be a string, got {} (of type {}) instead.", show(&v), tn(&v)))),
        },
    };
    let pred = |c: char| set.contains(&c);
    let out = match kind {
        TrimKind::Both => s.trim_matches(pred),
        TrimKind::Left => s.trim_start_matches(pred),
        TrimKind::Right => s.trim_end_matches(pred),
    };
    Ok(Some(Bson::String(out.to_string())))
}

/// Compile the regex of $regexMatch/$regexFind. Ok(None) when the pattern is null.
fn compile_expr_regex(name: &str, regex: Option<&Bson>, options: Option<&Bson>) -> Result<Option<regex::Regex>> {
    let (pattern, mut opts) = match regex {
        Some(Bson::String(s)) => (s.clone(), String::new()),
        Some(Bson::RegularExpression(r)) => (r.pattern.to_string(), r.options.to_string()),
        None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(None),
        Some(other) => return Err(err(51105, format!("{name} needs 'regex' to be of type string or regex, found {}", type_name(Some(other))))),
    };
    match options {
        None | Some(Bson::Null) | Some(Bson::Undefined) => {}
        Some(Bson::String(o)) => {
            if !opts.is_empty() && !o.is_empty() {
                return Err(err(51075, format!("{name}: found regex option(s) specified in both 'regex' and 'option' fields")));
            }
            if o.contains('\0') {
                return Err(err(51110, format!("{name}: regular expression options cannot contain an embedded null byte")));
            }
            opts.push_str(o);
        }
        Some(other) => return Err(err(51106, format!("{name} needs 'options' to be of type string, found {}", type_name(Some(other))))),
    }
    if pattern.contains('\0') {
        return Err(err(51109, format!("{name}: regular expression cannot contain an embedded null byte")));
    }
    crate::filter::compile_regex(&pattern, &opts).map(Some).map_err(|e| {
        if e.code == 51108 {
            err(51108, format!("{name} invalid flag in regex options: {}", e.message.rsplit(' ').next().unwrap_or("")))
        } else {
            err(51111, format!("Invalid Regex in {name}: {}", e.message))
        }
    })
}

fn eval_regex(kind: RegexKind, input: &Node, regex: &Node, options: Option<&Node>, compiled: Option<&regex::Regex>, ctx: &mut Ctx) -> Result<Value> {
    let name = match kind {
        RegexKind::Match => "$regexMatch",
        RegexKind::Find => "$regexFind",
        RegexKind::FindAll => "$regexFindAll",
    };
    let i = eval(input, ctx)?;
    let owned;
    let re = match compiled {
        Some(r) => Some(r),
        None => {
            let r = eval(regex, ctx)?;
            let o = match options {
                Some(o) => eval(o, ctx)?,
                None => None,
            };
            owned = compile_expr_regex(name, r.as_ref(), o.as_ref())?;
            owned.as_ref()
        }
    };
    let empty = || match kind {
        RegexKind::Match => Some(Bson::Boolean(false)),
        RegexKind::Find => Some(Bson::Null),
        RegexKind::FindAll => Some(Bson::Array(vec![])),
    };
    let s = match &i {
        v if nullish(v) => return Ok(empty()),
        Some(Bson::String(s)) => s,
        v => return Err(err(51104, format!("{name} needs 'input' to be of type string, found {}", tn(v)))),
    };
    let Some(re) = re else { return Ok(empty()) };
    let capture_doc = |caps: regex::Captures| -> Bson {
        let m = caps.get(0);
        let idx = m.map(|m| s[..m.start()].chars().count()).unwrap_or(0);
        let captures: Vec<Bson> = (1..caps.len()).map(|g| caps.get(g).map(|c| Bson::String(c.as_str().to_string())).unwrap_or(Bson::Null)).collect();
        Bson::Document(bson::doc! {
            "match": m.map(|m| m.as_str()).unwrap_or(""),
            "idx": int_result(idx as i64),
            "captures": captures,
        })
    };
    Ok(Some(match kind {
        RegexKind::Match => Bson::Boolean(re.is_match(s)),
        RegexKind::Find => re.captures(s).map(capture_doc).unwrap_or(Bson::Null),
        RegexKind::FindAll => Bson::Array(re.captures_iter(s).map(capture_doc).collect()),
    }))
}

// ---------------------------------------------------------------------------------------------
// Type conversion ($convert and $toX)

#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    Double,
    String,
    ObjectId,
    Bool,
    Date,
    Int,
    Long,
    Decimal,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Double => "double",
            Target::String => "string",
            Target::ObjectId => "objectId",
            Target::Bool => "bool",
            Target::Date => "date",
            Target::Int => "int",
            Target::Long => "long",
            Target::Decimal => "decimal",
        }
    }
}

fn convert_target(to: &Value) -> Result<Target> {
    let t = match to {
        Some(Bson::String(s)) => match s.as_str() {
            "double" => Target::Double,
            "string" => Target::String,
            "objectId" => Target::ObjectId,
            "bool" => Target::Bool,
            "date" => Target::Date,
            "int" => Target::Int,
            "long" => Target::Long,
            "decimal" => Target::Decimal,
            other => {
                return match crate::filter::type_code_for_alias(other) {
                    Some(_) => Err(Error::new(Code::ConversionFailure, format!("Unsupported conversion to {other} in $convert with no onError value"))),
                    None => Err(Error::bad_value(format!("Unknown type name: {other}"))),
                };
            }
        },
        Some(v) if num_of(to).is_some() => match as_int(to) {
            Some(1) => Target::Double,
            Some(2) => Target::String,
            Some(7) => Target::ObjectId,
            Some(8) => Target::Bool,
            Some(9) => Target::Date,
            Some(16) => Target::Int,
            Some(18) => Target::Long,
            Some(19) => Target::Decimal,
            _ => return Err(Error::bad_value(format!("In $convert, numeric 'to' argument is not a valid type: {v}"))),
        },
        v => return Err(err(50784, format!("$convert's 'to' argument must be a string or number, but is {}", tn(v)))),
    };
    Ok(t)
}

fn conv_err(msg: impl std::fmt::Display) -> Error {
    Error::new(Code::ConversionFailure, format!("{msg} in $convert with no onError value"))
}

fn unsupported(from: &Bson, to: Target) -> Error {
    conv_err(format!("Unsupported conversion from {} to {}", type_name(Some(from)), to.name()))
}

fn convert(v: Option<&Bson>, to: Target) -> Result<Value> {
    let Some(v) = v else { return Ok(Some(Bson::Null)) };
    if matches!(v, Bson::Null | Bson::Undefined) {
        return Ok(Some(Bson::Null));
    }
    let out = match to {
        Target::Double => match v {
            Bson::Double(d) => Bson::Double(*d),
            Bson::Int32(i) => Bson::Double(*i as f64),
            Bson::Int64(i) => Bson::Double(*i as f64),
            Bson::Decimal128(d) => {
                let dec = Dec::decode(d);
                let f = dec.to_f64();
                if f.is_infinite() && !matches!(dec, Dec::Inf { .. }) {
                    return Err(conv_err(format!("Conversion would overflow target type: {d}")));
                }
                Bson::Double(f)
            }
            Bson::Boolean(b) => Bson::Double(if *b { 1.0 } else { 0.0 }),
            Bson::DateTime(d) => Bson::Double(d.timestamp_millis() as f64),
            Bson::String(s) => Bson::Double(parse_double(s)?),
            _ => return Err(unsupported(v, to)),
        },
        Target::String => match v {
            Bson::String(s) => Bson::String(s.clone()),
            Bson::Double(d) => Bson::String(if d.is_infinite() {
                if *d < 0.0 {
                    "-Infinity".into()
                } else {
                    "Infinity".into()
                }
            } else if d.is_nan() {
                "NaN".into()
            } else {
                fmt_g(*d)
            }),
            Bson::Int32(_) | Bson::Int64(_) | Bson::Decimal128(_) | Bson::DateTime(_) => Bson::String(coerce_to_string(&Some(v.clone()))?),
            Bson::Boolean(b) => Bson::String(b.to_string()),
            Bson::ObjectId(o) => Bson::String(o.to_hex()),
            _ => return Err(unsupported(v, to)),
        },
        Target::ObjectId => match v {
            Bson::ObjectId(o) => Bson::ObjectId(*o),
            Bson::String(s) => {
                if s.len() != 24 {
                    return Err(conv_err(format!(
                        "Failed to parse objectId '{s}': Invalid string length for parsing to OID, expected 24 but found {}",
                        s.len()
                    )));
                }
                match ObjectId::parse_str(s) {
                    Ok(o) => Bson::ObjectId(o),
                    Err(_) => return Err(conv_err(format!("Failed to parse objectId '{s}': Invalid character found in hex string"))),
                }
            }
            _ => return Err(unsupported(v, to)),
        },
        Target::Bool => Bson::Boolean(truthy(&Some(v.clone()))),
        Target::Date => match v {
            Bson::DateTime(d) => Bson::DateTime(*d),
            Bson::Double(d) => {
                if !d.is_finite() {
                    return Err(conv_err(format!("Conversion would overflow target type: {}", fmt_g(*d))));
                }
                Bson::DateTime(DateTime::from_millis(d.trunc() as i64))
            }
            Bson::Int64(i) => Bson::DateTime(DateTime::from_millis(*i)),
            Bson::Decimal128(d) => match Dec::decode(d).to_i64_trunc() {
                Some(i) => Bson::DateTime(DateTime::from_millis(i)),
                None => return Err(conv_err(format!("Conversion would overflow target type: {d}"))),
            },
            Bson::ObjectId(o) => Bson::DateTime(o.timestamp()),
            Bson::Timestamp(t) => Bson::DateTime(DateTime::from_millis(t.time as i64 * 1000)),
            Bson::String(s) => match datetime::parse_iso(s, Tz::UTC) {
                Some(ms) => Bson::DateTime(DateTime::from_millis(ms)),
                None => return Err(conv_err(format!("Error parsing date string '{s}'"))),
            },
            _ => return Err(unsupported(v, to)),
        },
        Target::Int | Target::Long => {
            let (lo, hi) = if to == Target::Int { (i32::MIN as i64, i32::MAX as i64) } else { (i64::MIN, i64::MAX) };
            let make = |i: i64| if to == Target::Int { Bson::Int32(i as i32) } else { Bson::Int64(i) };
            let overflow = |shown: String| conv_err(format!("Conversion would overflow target type: {shown}"));
            match v {
                Bson::Int32(i) => make(*i as i64),
                Bson::Int64(i) => {
                    if *i < lo || *i > hi {
                        return Err(overflow(i.to_string()));
                    }
                    make(*i)
                }
                Bson::Double(d) => {
                    if d.is_nan() {
                        return Err(conv_err("Attempt to convert NaN value to integer type"));
                    }
                    if d.is_infinite() {
                        return Err(conv_err("Attempt to convert infinity value to integer type"));
                    }
                    let t = d.trunc();
                    if t < lo as f64 || t >= (hi as f64) + 1.0 {
                        return Err(overflow(fmt_g(*d)));
                    }
                    make(t as i64)
                }
                Bson::Decimal128(d) => {
                    let dec = Dec::decode(d);
                    if dec.is_nan() {
                        return Err(conv_err("Attempt to convert NaN value to integer type"));
                    }
                    if matches!(dec, Dec::Inf { .. }) {
                        return Err(conv_err("Attempt to convert infinity value to integer type"));
                    }
                    match dec.to_i64_trunc() {
                        Some(i) if i >= lo && i <= hi => make(i),
                        _ => return Err(overflow(d.to_string())),
                    }
                }
                Bson::Boolean(b) => make(*b as i64),
                Bson::DateTime(d) if to == Target::Long => Bson::Int64(d.timestamp_millis()),
                Bson::String(s) => {
                    let parsed = parse_integer(s)?;
                    if parsed < lo || parsed > hi {
                        return Err(conv_err(format!("Failed to parse number '{s}': Overflow")));
                    }
                    make(parsed)
                }
                _ => return Err(unsupported(v, to)),
            }
        }
        Target::Decimal => match v {
            Bson::Decimal128(d) => Bson::Decimal128(*d),
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => {
                Bson::Decimal128(num_of(&Some(v.clone())).map(|n| n.to_dec(DecPrecision::Digits15)).unwrap_or(Dec::NaN).encode())
            }
            Bson::Boolean(b) => Bson::Decimal128(Dec::from_i64(*b as i64).encode()),
            Bson::DateTime(d) => Bson::Decimal128(Dec::from_i64(d.timestamp_millis()).encode()),
            Bson::String(s) => match parse_decimal_str(s) {
                Some(d) => Bson::Decimal128(d.encode()),
                None => return Err(conv_err(format!("Failed to parse number '{s}': Failed to parse string to decimal"))),
            },
            _ => return Err(unsupported(v, to)),
        },
    };
    Ok(Some(out))
}

fn parse_decimal_str(s: &str) -> Option<Dec> {
    if s.is_empty() || s.trim() != s {
        return None;
    }
    Dec::from_str(s)
}

fn parse_integer(s: &str) -> Result<i64> {
    let body = s.strip_prefix('-').or_else(|| s.strip_prefix('+')).unwrap_or(s);
    if body.is_empty() {
        return Err(conv_err(format!("Failed to parse number '{s}': No digits")));
    }
    if let Some(bad) = body.chars().find(|c| !c.is_ascii_digit()) {
        return Err(conv_err(format!("Failed to parse number '{s}': Bad digit \"{bad}\" while parsing {s}")));
    }
    s.parse::<i64>().map_err(|_| conv_err(format!("Failed to parse number '{s}': Overflow")))
}

fn parse_double(s: &str) -> Result<f64> {
    let lower = s.to_ascii_lowercase();
    let special = match lower.as_str() {
        "nan" => Some(f64::NAN),
        "inf" | "infinity" | "+inf" | "+infinity" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    };
    if let Some(v) = special {
        return Ok(v);
    }
    if s.is_empty() || s.trim() != s || lower.starts_with("0x") || lower.contains("inf") || lower.contains("nan") {
        return Err(conv_err(format!("Failed to parse number '{s}': Did not consume whole string.")));
    }
    s.parse::<f64>().map_err(|_| conv_err(format!("Failed to parse number '{s}': Did not consume whole string.")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{bson, doc};

    fn ev(e: Bson, d: Document) -> Value {
        Expr::parse(&e).unwrap().eval(&d).unwrap()
    }
    fn ev0(e: Bson) -> Bson {
        ev(e, Document::new()).unwrap_or(Bson::String("<missing>".into()))
    }
    fn code(e: Bson) -> i32 {
        match Expr::parse(&e) {
            Err(err) => err.code,
            Ok(x) => x.eval(&doc! {"s": "str", "n": 5}).unwrap_err().code,
        }
    }
    fn dec(s: &str) -> Bson {
        Bson::Decimal128(s.parse().unwrap())
    }

    #[test]
    fn field_paths_and_variables() {
        let d = doc! {"a": {"b": 1}, "arr": [{"x": 1}, {"y": 2}, {"x": [3]}, 4]};
        assert_eq!(ev(bson!("$a.b"), d.clone()), Some(Bson::Int32(1)));
        assert_eq!(ev(bson!("$arr.x"), d.clone()), Some(bson!([1, [3]])));
        assert_eq!(ev(bson!("$nope"), d.clone()), None);
        assert_eq!(ev(bson!("$$ROOT.a"), d.clone()), Some(bson!({"b": 1})));
        assert_eq!(ev(bson!("$$REMOVE"), d.clone()), None);
        assert!(matches!(ev(bson!("$$NOW"), d.clone()), Some(Bson::DateTime(_))));
        assert_eq!(ev(bson!({"$let": {"vars": {"x": 2, "y": "$a.b"}, "in": {"$add": ["$$x", "$$y"]}}}), d.clone()), Some(Bson::Int32(3)));
        assert_eq!(ev(bson!({"o": "$a.b", "m": "$missing", "l": [1, "$missing"]}), d), Some(bson!({"o": 1, "l": [1, null]})));
        assert_eq!(code(bson!("$$undefinedVar")), 17276);
        assert_eq!(code(bson!({"$foo": 1})), 168);
        assert_eq!(code(bson!({"$add": [1], "b": 2})), 15983);
    }

    #[test]
    fn arithmetic() {
        assert_eq!(ev0(bson!({"$add": [1, 2]})), Bson::Int32(3));
        assert_eq!(ev0(bson!({"$add": [2147483647, 1]})), Bson::Int64(2147483648));
        assert_eq!(ev0(bson!({"$add": [1, 2.5]})), Bson::Double(3.5));
        assert_eq!(ev0(bson!({"$add": [1, null]})), Bson::Null);
        assert_eq!(ev0(bson!({"$add": [dec("1.1"), 1]})), dec("2.1"));
        assert_eq!(ev0(bson!({"$add": [Bson::DateTime(DateTime::from_millis(1000)), 500]})), Bson::DateTime(DateTime::from_millis(1500)));
        assert_eq!(ev0(bson!({"$subtract": [5, 7]})), Bson::Int32(-2));
        assert_eq!(ev0(bson!({"$subtract": [Bson::DateTime(DateTime::from_millis(3000)), Bson::DateTime(DateTime::from_millis(1000))]})), Bson::Int64(2000));
        assert_eq!(ev0(bson!({"$multiply": [2, 3, 4]})), Bson::Int32(24));
        assert_eq!(ev0(bson!({"$divide": [9, 2]})), Bson::Double(4.5));
        assert_eq!(ev0(bson!({"$mod": [9, 4]})), Bson::Int32(1));
        assert_eq!(ev0(bson!({"$mod": [-9, 4]})), Bson::Int32(-1));
        assert_eq!(ev0(bson!({"$mod": [9.5, 4]})), Bson::Double(1.5));
        assert_eq!(ev0(bson!({"$abs": -5})), Bson::Int32(5));
        assert_eq!(ev0(bson!({"$ceil": 1.2})), Bson::Double(2.0));
        assert_eq!(ev0(bson!({"$floor": -1.2})), Bson::Double(-2.0));
        assert_eq!(ev0(bson!({"$sqrt": 25})), Bson::Double(5.0));
        assert_eq!(ev0(bson!({"$pow": [2, 10]})), Bson::Int32(1024));
        assert_eq!(ev0(bson!({"$pow": [2, -1]})), Bson::Double(0.5));
        assert_eq!(ev0(bson!({"$round": [10.5]})), Bson::Double(10.0));
        assert_eq!(ev0(bson!({"$round": [11.5]})), Bson::Double(12.0));
        assert_eq!(ev0(bson!({"$round": [1234.5678, 2]})), Bson::Double(1234.57));
        assert_eq!(ev0(bson!({"$round": [1234.5678, -2]})), Bson::Double(1200.0));
        assert_eq!(ev0(bson!({"$round": [1250, -2]})), Bson::Int32(1200));
        assert_eq!(ev0(bson!({"$trunc": [7.89, 1]})), Bson::Double(7.8));
        assert_eq!(ev0(bson!({"$log10": 100})), Bson::Double(2.0));
        assert_eq!(ev0(bson!({"$ln": 1})), Bson::Double(0.0));
        assert_eq!(code(bson!({"$divide": [1, 0]})), 16608);
        assert_eq!(code(bson!({"$mod": [1, 0]})), 16610);
        assert_eq!(code(bson!({"$add": ["$s", 1]})), 16554);
        assert_eq!(code(bson!({"$subtract": [1]})), 16020);
        assert_eq!(code(bson!({"$sqrt": -1})), 28714);
        assert_eq!(code(bson!({"$ln": 0})), 28766);
        assert_eq!(code(bson!({"$add": [Bson::DateTime(DateTime::from_millis(1)), Bson::DateTime(DateTime::from_millis(1))]})), 16612);
    }

    #[test]
    fn comparison_and_logic() {
        assert_eq!(ev0(bson!({"$eq": [1, 1.0]})), Bson::Boolean(true));
        assert_eq!(ev(bson!({"$eq": ["$missing", null]}), doc! {}), Some(Bson::Boolean(false)));
        assert_eq!(ev0(bson!({"$gt": ["a", 1]})), Bson::Boolean(true));
        assert_eq!(ev0(bson!({"$cmp": [1, 2]})), Bson::Int32(-1));
        assert_eq!(ev0(bson!({"$and": [1, "x", []]})), Bson::Boolean(true));
        assert_eq!(ev0(bson!({"$and": [1, 0]})), Bson::Boolean(false));
        assert_eq!(ev0(bson!({"$or": [null, false]})), Bson::Boolean(false));
        assert_eq!(ev0(bson!({"$not": [0]})), Bson::Boolean(true));
        assert_eq!(ev0(bson!({"$cond": [true, "y", "n"]})), Bson::String("y".into()));
        assert_eq!(ev0(bson!({"$cond": {"if": false, "then": "y", "else": "n"}})), Bson::String("n".into()));
        assert_eq!(ev(bson!({"$ifNull": ["$a", "$b", 3]}), doc! {"b": 2}), Some(Bson::Int32(2)));
        assert_eq!(ev(bson!({"$ifNull": ["$a", 3]}), doc! {"a": null}), Some(Bson::Int32(3)));
        let sw =
            bson!({"$switch": {"branches": [{"case": {"$gt": ["$n", 10]}, "then": "big"}, {"case": {"$gt": ["$n", 1]}, "then": "mid"}], "default": "small"}});
        assert_eq!(ev(sw.clone(), doc! {"n": 5}), Some(Bson::String("mid".into())));
        assert_eq!(ev(sw, doc! {"n": 0}), Some(Bson::String("small".into())));
        assert_eq!(code(bson!({"$switch": {"branches": [{"case": false, "then": 1}]}})), 40066);
        assert_eq!(code(bson!({"$cond": {"if": 1, "then": 2}})), 17082);
    }

    #[test]
    fn strings() {
        assert_eq!(ev0(bson!({"$concat": ["a", "b", "c"]})), Bson::String("abc".into()));
        assert_eq!(ev0(bson!({"$concat": ["a", null]})), Bson::Null);
        assert_eq!(code(bson!({"$concat": ["a", 1]})), 16702);
        assert_eq!(ev0(bson!({"$substr": ["hello", 1, 3]})), Bson::String("ell".into()));
        assert_eq!(ev0(bson!({"$substrBytes": ["hello", 2, -1]})), Bson::String("llo".into()));
        assert_eq!(ev0(bson!({"$substrCP": ["héllo", 1, 2]})), Bson::String("él".into()));
        assert_eq!(code(bson!({"$substrBytes": ["héllo", 2, 1]})), 28656);
        assert_eq!(ev0(bson!({"$toLower": "ABc"})), Bson::String("abc".into()));
        assert_eq!(ev0(bson!({"$toUpper": 5})), Bson::String("5".into()));
        assert_eq!(ev0(bson!({"$toUpper": null})), Bson::String("".into()));
        assert_eq!(ev0(bson!({"$strLenBytes": "héllo"})), Bson::Int32(6));
        assert_eq!(ev0(bson!({"$strLenCP": "héllo"})), Bson::Int32(5));
        assert_eq!(code(bson!({"$strLenCP": 1})), 34471);
        assert_eq!(ev0(bson!({"$split": ["a-b-c", "-"]})), bson!(["a", "b", "c"]));
        assert_eq!(code(bson!({"$split": ["a", ""]})), 40087);
        assert_eq!(ev0(bson!({"$trim": {"input": "  x  "}})), Bson::String("x".into()));
        assert_eq!(ev0(bson!({"$ltrim": {"input": "xxabx", "chars": "x"}})), Bson::String("abx".into()));
        assert_eq!(ev0(bson!({"$rtrim": {"input": "xxabx", "chars": "x"}})), Bson::String("xxab".into()));
        assert_eq!(ev0(bson!({"$indexOfBytes": ["cafeteria", "e"]})), Bson::Int32(3));
        assert_eq!(ev0(bson!({"$indexOfBytes": ["cafeteria", "e", 5]})), Bson::Int32(5));
        assert_eq!(ev0(bson!({"$indexOfBytes": ["cafeteria", "z"]})), Bson::Int32(-1));
        assert_eq!(ev0(bson!({"$indexOfCP": ["héllo", "l"]})), Bson::Int32(2));
        assert_eq!(ev0(bson!({"$strcasecmp": ["ABC", "abc"]})), Bson::Int32(0));
        assert_eq!(ev0(bson!({"$regexMatch": {"input": "Hello", "regex": "^h", "options": "i"}})), Bson::Boolean(true));
        assert_eq!(ev0(bson!({"$regexMatch": {"input": null, "regex": "^h"}})), Bson::Boolean(false));
        assert_eq!(ev0(bson!({"$regexFind": {"input": "xab12", "regex": "([a-z])(\\d)"}})), bson!({"match": "b1", "idx": 2, "captures": ["b", "1"]}));
        assert_eq!(ev0(bson!({"$regexFindAll": {"input": "a1b2", "regex": "\\d"}})).as_array().map(|a| a.len()), Some(2));
        assert_eq!(code(bson!({"$regexMatch": {"input": 1, "regex": "x"}})), 51104);
        assert_eq!(ev0(bson!({"$replaceAll": {"input": "a.b.c", "find": ".", "replacement": "-"}})), Bson::String("a-b-c".into()));
        assert_eq!(ev0(bson!({"$replaceOne": {"input": "a.b.c", "find": ".", "replacement": "-"}})), Bson::String("a-b.c".into()));
    }

    #[test]
    fn arrays() {
        assert_eq!(ev0(bson!({"$arrayElemAt": [[1, 2, 3], -1]})), Bson::Int32(3));
        assert_eq!(ev0(bson!({"$arrayElemAt": [[1, 2, 3], 5]})), Bson::String("<missing>".into()));
        assert_eq!(code(bson!({"$arrayElemAt": ["$s", 0]})), 28689);
        assert_eq!(ev0(bson!({"$first": [[1, 2]]})), Bson::Int32(1));
        assert_eq!(ev0(bson!({"$last": [[1, 2]]})), Bson::Int32(2));
        assert_eq!(ev0(bson!({"$concatArrays": [[1], [2, 3]]})), bson!([1, 2, 3]));
        assert_eq!(ev0(bson!({"$in": [2, [1, 2]]})), Bson::Boolean(true));
        assert_eq!(code(bson!({"$in": [2, "$s"]})), 40081);
        assert_eq!(ev0(bson!({"$size": [[1, 2]]})), Bson::Int32(2));
        assert_eq!(code(bson!({"$size": "$missing"})), 17124);
        assert_eq!(ev0(bson!({"$slice": [[1, 2, 3, 4], 2]})), bson!([1, 2]));
        assert_eq!(ev0(bson!({"$slice": [[1, 2, 3, 4], -2]})), bson!([3, 4]));
        assert_eq!(ev0(bson!({"$slice": [[1, 2, 3, 4], 1, 2]})), bson!([2, 3]));
        assert_eq!(ev0(bson!({"$slice": [[1, 2, 3, 4], -3, 2]})), bson!([2, 3]));
        assert_eq!(ev0(bson!({"$isArray": [[1]]})), Bson::Boolean(true));
        assert_eq!(ev0(bson!({"$reverseArray": [[1, 2]]})), bson!([2, 1]));
        assert_eq!(ev0(bson!({"$range": [0, 10, 3]})), bson!([0, 3, 6, 9]));
        assert_eq!(ev0(bson!({"$range": [5, 0, -2]})), bson!([5, 3, 1]));
        assert_eq!(code(bson!({"$range": [0, 5, 0]})), 34449);
        assert_eq!(ev0(bson!({"$indexOfArray": [["a", "b"], "b"]})), Bson::Int32(1));
        assert_eq!(ev0(bson!({"$filter": {"input": [1, 5, 9], "as": "x", "cond": {"$gt": ["$$x", 3]}}})), bson!([5, 9]));
        assert_eq!(ev0(bson!({"$filter": {"input": [1, 5, 9], "cond": {"$gt": ["$$this", 0]}, "limit": 1}})), bson!([1]));
        assert_eq!(ev0(bson!({"$map": {"input": [1, 2], "as": "v", "in": {"$multiply": ["$$v", 10]}}})), bson!([10, 20]));
        assert_eq!(ev0(bson!({"$reduce": {"input": ["a", "b"], "initialValue": "", "in": {"$concat": ["$$value", "$$this"]}}})), Bson::String("ab".into()));
        assert_eq!(ev0(bson!({"$arrayToObject": [[["a", 1], ["b", 2]]]})), bson!({"a": 1, "b": 2}));
        assert_eq!(ev0(bson!({"$arrayToObject": [[{"k": "a", "v": 1}]]})), bson!({"a": 1}));
        assert_eq!(ev0(bson!({"$objectToArray": {"$literal": {"a": 1}}})), bson!([{"k": "a", "v": 1}]));
        assert_eq!(ev0(bson!({"$mergeObjects": [{"a": 1}, null, {"a": 2, "b": 3}]})), bson!({"a": 2, "b": 3}));
        assert_eq!(ev0(bson!({"$setUnion": [[1, 2], [2, 3]]})), bson!([1, 2, 3]));
        assert_eq!(ev0(bson!({"$setIntersection": [[1, 2], [2, 3]]})), bson!([2]));
        assert_eq!(ev0(bson!({"$setDifference": [[1, 2], [2, 3]]})), bson!([1]));
        assert_eq!(ev0(bson!({"$setEquals": [[1, 2], [2, 1, 1]]})), Bson::Boolean(true));
        assert_eq!(ev0(bson!({"$setIsSubset": [[1], [2, 1]]})), Bson::Boolean(true));
        assert_eq!(ev0(bson!({"$allElementsTrue": [[1, true]]})), Bson::Boolean(true));
        assert_eq!(ev0(bson!({"$anyElementTrue": [[0, false]]})), Bson::Boolean(false));
        assert_eq!(ev0(bson!({"$sum": [[1, 2, "x"]]})), Bson::Int32(3));
        assert_eq!(ev0(bson!({"$sum": [1, 2.5]})), Bson::Double(3.5));
        assert_eq!(ev0(bson!({"$avg": [[1, 2]]})), Bson::Double(1.5));
        assert_eq!(ev0(bson!({"$avg": [["x"]]})), Bson::Null);
        assert_eq!(ev0(bson!({"$max": [[1, 5, null]]})), Bson::Int32(5));
        assert_eq!(ev0(bson!({"$min": [4, 2, 8]})), Bson::Int32(2));
        assert_eq!(ev0(bson!({"$stdDevPop": [[1, 3]]})), Bson::Double(1.0));
    }

    #[test]
    fn types_and_conversion() {
        assert_eq!(ev(bson!({"$type": "$x"}), doc! {}), Some(Bson::String("missing".into())));
        assert_eq!(ev0(bson!({"$type": 1i64})), Bson::String("long".into()));
        assert_eq!(ev0(bson!({"$toString": 1.5})), Bson::String("1.5".into()));
        assert_eq!(ev0(bson!({"$toString": 42i64})), Bson::String("42".into()));
        assert_eq!(ev0(bson!({"$toString": true})), Bson::String("true".into()));
        assert_eq!(ev0(bson!({"$toInt": "42"})), Bson::Int32(42));
        assert_eq!(ev0(bson!({"$toInt": 4.9})), Bson::Int32(4));
        assert_eq!(ev0(bson!({"$toLong": true})), Bson::Int64(1));
        assert_eq!(ev0(bson!({"$toDouble": "2.5"})), Bson::Double(2.5));
        assert_eq!(ev0(bson!({"$toDecimal": 2.5})), dec("2.50000000000000"));
        assert_eq!(ev0(bson!({"$toBool": 0})), Bson::Boolean(false));
        assert_eq!(ev0(bson!({"$toBool": ""})), Bson::Boolean(true));
        assert_eq!(ev0(bson!({"$toInt": null})), Bson::Null);
        assert_eq!(ev0(bson!({"$toObjectId": "5ab9cbfa31c2ab715d42129e"})), Bson::ObjectId(ObjectId::parse_str("5ab9cbfa31c2ab715d42129e").unwrap()));
        assert_eq!(ev0(bson!({"$toDate": "2018-03-27T16:58:51.538Z"})), Bson::DateTime(DateTime::from_millis(1522169931538)));
        assert_eq!(code(bson!({"$toInt": "abc"})), 241);
        assert_eq!(code(bson!({"$toInt": 1e20})), 241);
        assert_eq!(ev0(bson!({"$convert": {"input": "abc", "to": "int", "onError": -1}})), Bson::Int32(-1));
        assert_eq!(ev0(bson!({"$convert": {"input": null, "to": "int", "onNull": 0}})), Bson::Int32(0));
        assert_eq!(ev0(bson!({"$convert": {"input": "7", "to": 16}})), Bson::Int32(7));
        assert_eq!(ev0(bson!({"$isNumber": dec("1")})), Bson::Boolean(true));
    }

    #[test]
    fn dates() {
        let d = doc! {"d": Bson::DateTime(DateTime::from_millis(1_388_564_139_736))}; // 2014-01-01T08:15:39.736Z
        let part = |op: &str| ev(bson!({op: "$d"}), d.clone());
        assert_eq!(part("$year"), Some(Bson::Int32(2014)));
        assert_eq!(part("$month"), Some(Bson::Int32(1)));
        assert_eq!(part("$dayOfMonth"), Some(Bson::Int32(1)));
        assert_eq!(part("$hour"), Some(Bson::Int32(8)));
        assert_eq!(part("$minute"), Some(Bson::Int32(15)));
        assert_eq!(part("$second"), Some(Bson::Int32(39)));
        assert_eq!(part("$millisecond"), Some(Bson::Int32(736)));
        assert_eq!(part("$dayOfWeek"), Some(Bson::Int32(4)));
        assert_eq!(part("$dayOfYear"), Some(Bson::Int32(1)));
        assert_eq!(part("$week"), Some(Bson::Int32(0)));
        assert_eq!(ev(bson!({"$hour": {"date": "$d", "timezone": "+02:00"}}), d.clone()), Some(Bson::Int32(10)));
        assert_eq!(ev(bson!({"$dateToString": {"format": "%Y-%m-%d", "date": "$d"}}), d.clone()), Some(Bson::String("2014-01-01".into())));
        assert_eq!(ev(bson!({"$dateToString": {"date": "$d"}}), d.clone()), Some(Bson::String("2014-01-01T08:15:39.736Z".into())));
        assert_eq!(ev(bson!({"$dateToString": {"date": "$x", "onNull": "none"}}), d.clone()), Some(Bson::String("none".into())));
        assert_eq!(ev(bson!({"$year": "$x"}), d.clone()), Some(Bson::Null));
        assert_eq!(code(bson!({"$year": "$s"})), 16006);
        assert_eq!(ev0(bson!({"$dateFromString": {"dateString": "2014-01-01T08:15:39.736Z"}})), Bson::DateTime(DateTime::from_millis(1_388_564_139_736)));
    }

    #[test]
    fn get_set_field_and_literal() {
        let d = doc! {"a.b": 1, "x": {"y": 2}};
        assert_eq!(ev(bson!({"$getField": "a.b"}), d.clone()), Some(Bson::Int32(1)));
        assert_eq!(ev(bson!({"$getField": {"field": "y", "input": "$x"}}), d.clone()), Some(Bson::Int32(2)));
        assert_eq!(ev(bson!({"$setField": {"field": "z", "input": "$x", "value": 3}}), d.clone()), Some(bson!({"y": 2, "z": 3})));
        assert_eq!(ev(bson!({"$unsetField": {"field": "y", "input": "$x"}}), d.clone()), Some(bson!({})));
        assert_eq!(ev(bson!({"$literal": "$x"}), d), Some(Bson::String("$x".into())));
    }
}
