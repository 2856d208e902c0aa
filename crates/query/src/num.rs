//! Numeric values with MongoDB's type promotion: int32 < int64 < double < decimal128.

use crate::decimal::Dec;
use bson::Bson;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Num {
    I32(i32),
    I64(i64),
    F64(f64),
    Dec(Dec),
}

/// How many significant digits a double keeps when promoted to decimal: expressions use 15
/// (Value::coerceToDecimal), update operators 34 (SafeNum).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum DecPrecision {
    Digits15,
    Digits34,
}

impl Num {
    pub fn from_bson(v: &Bson) -> Option<Num> {
        match v {
            Bson::Int32(i) => Some(Num::I32(*i)),
            Bson::Int64(i) => Some(Num::I64(*i)),
            Bson::Double(d) => Some(Num::F64(*d)),
            Bson::Decimal128(d) => Some(Num::Dec(Dec::decode(d))),
            _ => None,
        }
    }

    pub fn to_bson(self) -> Bson {
        match self {
            Num::I32(i) => Bson::Int32(i),
            Num::I64(i) => Bson::Int64(i),
            Num::F64(d) => Bson::Double(d),
            Num::Dec(d) => Bson::Decimal128(d.encode()),
        }
    }

    pub fn rank(self) -> u8 {
        match self {
            Num::I32(_) => 0,
            Num::I64(_) => 1,
            Num::F64(_) => 2,
            Num::Dec(_) => 3,
        }
    }

    pub fn to_f64(self) -> f64 {
        match self {
            Num::I32(i) => i as f64,
            Num::I64(i) => i as f64,
            Num::F64(d) => d,
            Num::Dec(d) => d.to_f64(),
        }
    }

    pub fn to_i64(self) -> Option<i64> {
        match self {
            Num::I32(i) => Some(i as i64),
            Num::I64(i) => Some(i),
            Num::F64(_) | Num::Dec(_) => None,
        }
    }

    pub fn to_dec(self, p: DecPrecision) -> Dec {
        match self {
            Num::I32(i) => Dec::from_i64(i as i64),
            Num::I64(i) => Dec::from_i64(i),
            Num::F64(d) => match p {
                DecPrecision::Digits15 => Dec::from_f64(d),
                DecPrecision::Digits34 => Dec::from_f64_digits(d, 34),
            },
            Num::Dec(d) => d,
        }
    }

    pub fn is_zero(self) -> bool {
        match self {
            Num::I32(i) => i == 0,
            Num::I64(i) => i == 0,
            Num::F64(d) => d == 0.0,
            Num::Dec(d) => d.is_zero(),
        }
    }

    /// Integral value if this number is a whole number that fits i64 (e.g. 2.0 -> 2).
    pub fn as_exact_i64(self) -> Option<i64> {
        match self {
            Num::I32(i) => Some(i as i64),
            Num::I64(i) => Some(i),
            Num::F64(d) => {
                if d.fract() == 0.0 && (i64::MIN as f64..i64::MAX as f64).contains(&d) {
                    Some(d as i64)
                } else {
                    None
                }
            }
            Num::Dec(d) => {
                let t = d.to_i64_trunc()?;
                if Dec::from_i64(t).cmp(d) == std::cmp::Ordering::Equal {
                    Some(t)
                } else {
                    None
                }
            }
        }
    }

    /// Arithmetic with promotion. `long_overflow_to_double`: expressions turn int64 overflow
    /// into a double; update operators report it (None).
    pub fn arith(self, other: Num, op: ArithOp, p: DecPrecision, long_overflow_to_double: bool) -> Option<Num> {
        let rank = self.rank().max(other.rank());
        match rank {
            3 => {
                let (a, b) = (self.to_dec(p), other.to_dec(p));
                Some(Num::Dec(match op {
                    ArithOp::Add => a.add(b),
                    ArithOp::Sub => a.sub(b),
                    ArithOp::Mul => a.mul(b),
                }))
            }
            2 => {
                let (a, b) = (self.to_f64(), other.to_f64());
                Some(Num::F64(match op {
                    ArithOp::Add => a + b,
                    ArithOp::Sub => a - b,
                    ArithOp::Mul => a * b,
                }))
            }
            _ => {
                let (a, b) = (self.to_i64()?, other.to_i64()?);
                let r = match op {
                    ArithOp::Add => a.checked_add(b),
                    ArithOp::Sub => a.checked_sub(b),
                    ArithOp::Mul => a.checked_mul(b),
                };
                match r {
                    Some(r) => {
                        if rank == 0 {
                            match i32::try_from(r) {
                                Ok(i) => Some(Num::I32(i)),
                                Err(_) => Some(Num::I64(r)),
                            }
                        } else {
                            Some(Num::I64(r))
                        }
                    }
                    None => {
                        if long_overflow_to_double {
                            let (a, b) = (a as f64, b as f64);
                            Some(Num::F64(match op {
                                ArithOp::Add => a + b,
                                ArithOp::Sub => a - b,
                                ArithOp::Mul => a * b,
                            }))
                        } else {
                            None
                        }
                    }
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum ArithOp {
    Add,
    Sub,
    Mul,
}

/// printf("%g") with 6 significant digits, as MongoDB's StringBuilder formats doubles.
pub(crate) fn fmt_g(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf".into() } else { "inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let precision = 6usize;
    let sci = format!("{:.*e}", precision - 1, x);
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if exp < -4 || exp >= precision as i32 {
        let mant = strip_zeros(mant);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (precision as i32 - 1 - exp).max(0) as usize;
        strip_zeros(&format!("{:.*}", decimals, x)).to_string()
    }
}

fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion() {
        let r = Num::I32(i32::MAX).arith(Num::I32(1), ArithOp::Add, DecPrecision::Digits15, true).unwrap();
        assert!(matches!(r, Num::I64(2147483648)));
        let r = Num::I64(i64::MAX).arith(Num::I32(1), ArithOp::Add, DecPrecision::Digits15, true).unwrap();
        assert!(matches!(r, Num::F64(_)));
        assert!(Num::I64(i64::MAX).arith(Num::I32(1), ArithOp::Add, DecPrecision::Digits34, false).is_none());
        let r = Num::I32(2).arith(Num::F64(0.5), ArithOp::Mul, DecPrecision::Digits15, true).unwrap();
        assert!(matches!(r, Num::F64(v) if v == 1.0));
    }

    #[test]
    fn printf_g() {
        assert_eq!(fmt_g(1.0), "1");
        assert_eq!(fmt_g(1.5), "1.5");
        assert_eq!(fmt_g(1.23456789), "1.23457");
        assert_eq!(fmt_g(1e20), "1e+20");
        assert_eq!(fmt_g(0.0001), "0.0001");
        assert_eq!(fmt_g(0.00001), "1e-05");
        assert_eq!(fmt_g(123456.0), "123456");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
    }
}
