//! Aggregation expression language: parsed once into a tree, evaluated per document.

use crate::compare::cmp_opt;
use crate::datetime::{self, Tz};
use crate::decimal::Dec;
use crate::num::{fmt_g, ArithOp, DecPrecision, Num};
use bson::{oid::ObjectId, Bson, DateTime, Document};
use common::{Code, Error, Result};
use std::cmp::Ordering;

mod convert;
mod eval;
mod ops;
mod parse;
#[cfg(test)]
mod tests;

use convert::*;
pub use eval::*;
use ops::*;
pub use parse::*;

/// Result of evaluating an expression: `None` is "missing".
pub type Value = Option<Bson>;

/// Largest array `$range` may build (MongoDB bounds it by memory, ~100 MB of values).
pub(crate) const RANGE_ELEMENTS_MAX: usize = 4 * 1024 * 1024;
/// Deepest expression nesting accepted, so hostile input cannot overflow the stack.
pub(crate) const EXPR_DEPTH_MAX: usize = 150;

#[derive(Clone, Debug)]
pub struct Expr {
    pub(crate) node: Node,
    pub(crate) slots: usize,
}

#[derive(Clone, Debug)]
pub(crate) enum Var {
    Root,
    Current,
    Remove,
    Now,
    ClusterTime,
    User(usize),
}

#[derive(Clone, Debug)]
pub(crate) enum Node {
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
pub(crate) enum TrimKind {
    Both,
    Left,
    Right,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RegexKind {
    Match,
    Find,
    FindAll,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum DatePart {
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
pub(crate) enum Op {
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
pub(crate) enum Trig {
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
pub(crate) enum Arity {
    Exactly(usize),
    AtLeast(usize),
    Between(usize, usize),
    Any,
}

pub(crate) fn simple_op(name: &str) -> Option<(Op, Arity)> {
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

pub(crate) fn date_part(name: &str) -> Option<DatePart> {
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
pub(crate) const UNSUPPORTED_OPERATORS: &[&str] = &[
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
