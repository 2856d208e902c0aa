//! The operators' functions once their arguments are evaluated: arithmetic, strings,
//! arrays, sets, dates, regular expressions.

use super::*;

pub(crate) fn arg(vals: &[Value], i: usize) -> &Value {
    const NONE: Value = None;
    vals.get(i).unwrap_or(&NONE)
}

/// An operator applied to its evaluated arguments, by family.
pub(crate) fn apply_op(op: Op, vals: Vec<Value>) -> Result<Value> {
    match op {
        Op::Add
        | Op::Subtract
        | Op::Multiply
        | Op::Divide
        | Op::Mod
        | Op::Abs
        | Op::Ceil
        | Op::Floor
        | Op::Sqrt
        | Op::Exp
        | Op::Ln
        | Op::Log10
        | Op::Trig(_)
        | Op::Atan2
        | Op::Log
        | Op::Pow
        | Op::Round
        | Op::Trunc => arithmetic(op, vals),
        Op::Eq | Op::Ne | Op::Gt | Op::Gte | Op::Lt | Op::Lte | Op::Cmp | Op::Not | Op::And | Op::Or | Op::IfNull => comparison(op, vals),
        Op::Concat
        | Op::SubstrBytes
        | Op::SubstrCP
        | Op::ToLower
        | Op::ToUpper
        | Op::StrLenBytes
        | Op::StrLenCP
        | Op::Split
        | Op::IndexOfBytes
        | Op::IndexOfCP
        | Op::Strcasecmp => string(op, vals),
        Op::ArrayElemAt
        | Op::First
        | Op::Last
        | Op::ConcatArrays
        | Op::In
        | Op::Size
        | Op::Slice
        | Op::IsArray
        | Op::ReverseArray
        | Op::Range
        | Op::IndexOfArray
        | Op::ArrayToObject
        | Op::ObjectToArray
        | Op::MergeObjects => array(op, vals),
        Op::Type | Op::IsNumber | Op::ToString | Op::ToInt | Op::ToLong | Op::ToDouble | Op::ToDecimal | Op::ToBool | Op::ToObjectId | Op::ToDate => {
            type_op(op, vals)
        }
        Op::Sum | Op::Avg | Op::Min | Op::Max | Op::StdDevPop | Op::StdDevSamp => array_accumulator(op, vals),
        Op::SetUnion | Op::SetIntersection | Op::SetDifference | Op::SetEquals | Op::SetIsSubset | Op::AllElementsTrue | Op::AnyElementTrue => set(op, vals),
        Op::Rand => Ok(Some(Bson::Double(rand::random::<f64>()))),
    }
}

/// Arithmetic: $add, $subtract, $multiply, $divide, $mod, the unary math operators, trigonometry, $log, $pow, $round and $trunc.
fn arithmetic(op: Op, vals: Vec<Value>) -> Result<Value> {
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
        _ => Err(Error::internal(format!("{} is not arithmetic operator", op_name(op)))),
    }
}

/// Comparison and $not ($and, $or and $ifNull short-circuit in `eval`).
fn comparison(op: Op, vals: Vec<Value>) -> Result<Value> {
    let a0 = arg(&vals, 0);
    match op {
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
        _ => Err(Error::internal(format!("{} is not comparison operator", op_name(op)))),
    }
}

/// Strings: $concat, substrings, case, lengths, $split, $indexOfBytes/CP, $strcasecmp.
fn string(op: Op, vals: Vec<Value>) -> Result<Value> {
    let a0 = arg(&vals, 0);
    match op {
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
        _ => Err(Error::internal(format!("{} is not string operator", op_name(op)))),
    }
}

/// Arrays and objects: element access, $concatArrays, $in, $size, $slice, $range, $indexOfArray, $arrayToObject, $objectToArray, $mergeObjects.
fn array(op: Op, vals: Vec<Value>) -> Result<Value> {
    let a0 = arg(&vals, 0);
    match op {
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
        _ => Err(Error::internal(format!("{} is not array operator", op_name(op)))),
    }
}

/// Types: $type, $isNumber and the $toX conversions.
fn type_op(op: Op, vals: Vec<Value>) -> Result<Value> {
    let a0 = arg(&vals, 0);
    match op {
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
        _ => Err(Error::internal(format!("{} is not type operator", op_name(op)))),
    }
}

/// $sum, $avg, $min, $max, $stdDevPop and $stdDevSamp over their arguments or one array.
fn array_accumulator(op: Op, vals: Vec<Value>) -> Result<Value> {
    match op {
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
        _ => Err(Error::internal(format!("{} is not array accumulator operator", op_name(op)))),
    }
}

/// Sets: $setUnion, $setIntersection, $setDifference, $setEquals, $setIsSubset, $allElementsTrue, $anyElementTrue.
fn set(op: Op, vals: Vec<Value>) -> Result<Value> {
    let a0 = arg(&vals, 0);
    match op {
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
        _ => Err(Error::internal(format!("{} is not set operator", op_name(op)))),
    }
}

pub(crate) fn push_unique(out: &mut Vec<Bson>, v: Bson) {
    if !out.iter().any(|x| crate::compare::bson_eq(x, &v)) {
        out.push(v);
    }
}

/// int32 when it fits, else int64 (lengths and indexes).
pub(crate) fn int_result(v: i64) -> Bson {
    match i32::try_from(v) {
        Ok(i) => Bson::Int32(i),
        Err(_) => Bson::Int64(v),
    }
}

pub(crate) fn num_to_millis(n: Num) -> Result<i64> {
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

pub(crate) fn dec_shortest(x: f64) -> Bson {
    Bson::Decimal128(dec_from_f64_shortest(x).encode())
}

pub(crate) fn dec_from_f64_shortest(x: f64) -> Dec {
    if !x.is_finite() {
        return Dec::from_f64(x);
    }
    let s = format!("{x:e}");
    Dec::from_str(&s).unwrap_or_else(|| Dec::from_f64(x))
}

pub(crate) fn num_mod(x: Num, y: Num) -> Bson {
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

pub(crate) fn unary_math(op: Op, n: Num) -> Result<Value> {
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

pub(crate) fn trig(t: Trig, n: Num) -> Result<Value> {
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

pub(crate) fn pow(base: Num, exp: Num) -> Result<Value> {
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

pub(crate) fn round_num(n: Num, place: i32, truncate: bool) -> Bson {
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
pub(crate) fn coerce_to_string(v: &Value) -> Result<String> {
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

pub(crate) fn substr_bytes(vals: &[Value]) -> Result<Value> {
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

pub(crate) fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

pub(crate) fn trunc_i64(n: Num) -> i64 {
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

pub(crate) fn substr_cp(vals: &[Value]) -> Result<Value> {
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
pub(crate) fn index_bounds(name: &str, vals: &[Value], len: usize) -> Result<(usize, usize)> {
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

pub(crate) fn index_of_str(op: Op, vals: &[Value]) -> Result<Value> {
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

pub(crate) fn slice(vals: &[Value]) -> Result<Value> {
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

pub(crate) fn range(vals: &[Value]) -> Result<Value> {
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

pub(crate) fn array_to_object(v: &Value) -> Result<Value> {
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

pub(crate) fn eval_trim(kind: TrimKind, input: &Node, chars: Option<&Node>, ctx: &mut Ctx) -> Result<Value> {
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
pub(crate) fn compile_expr_regex(name: &str, regex: Option<&Bson>, options: Option<&Bson>) -> Result<Option<regex::Regex>> {
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

pub(crate) fn eval_regex(kind: RegexKind, input: &Node, regex: &Node, options: Option<&Node>, compiled: Option<&regex::Regex>, ctx: &mut Ctx) -> Result<Value> {
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
