//! Type conversion: `$convert` and the `$toX` operators.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Target {
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
    pub(crate) fn name(self) -> &'static str {
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

pub(crate) fn convert_target(to: &Value) -> Result<Target> {
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

pub(crate) fn conv_err(msg: impl std::fmt::Display) -> Error {
    Error::new(Code::ConversionFailure, format!("{msg} in $convert with no onError value"))
}

pub(crate) fn unsupported(from: &Bson, to: Target) -> Error {
    conv_err(format!("Unsupported conversion from {} to {}", type_name(Some(from)), to.name()))
}

pub(crate) fn convert(v: Option<&Bson>, to: Target) -> Result<Value> {
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

pub(crate) fn parse_decimal_str(s: &str) -> Option<Dec> {
    if s.is_empty() || s.trim() != s {
        return None;
    }
    Dec::from_str(s)
}

pub(crate) fn parse_integer(s: &str) -> Result<i64> {
    let body = s.strip_prefix('-').or_else(|| s.strip_prefix('+')).unwrap_or(s);
    if body.is_empty() {
        return Err(conv_err(format!("Failed to parse number '{s}': No digits")));
    }
    if let Some(bad) = body.chars().find(|c| !c.is_ascii_digit()) {
        return Err(conv_err(format!("Failed to parse number '{s}': Bad digit \"{bad}\" while parsing {s}")));
    }
    s.parse::<i64>().map_err(|_| conv_err(format!("Failed to parse number '{s}': Overflow")))
}

pub(crate) fn parse_double(s: &str) -> Result<f64> {
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
