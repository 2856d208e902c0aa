//! Decimal128 arithmetic. bson 3 only stores the 16 bytes, so shoal decodes the IEEE 754-2008
//! BID encoding itself. Results are rounded to 34 significant digits, half to even, as MongoDB's
//! Intel decimal library does.

use bson::Decimal128;
use std::cmp::Ordering;

/// Largest coefficient a Decimal128 can hold: 10^34 - 1.
const COEFFICIENT_DIGITS_MAX: usize = 34;
const EXPONENT_BIAS: i32 = 6176;
const EXPONENT_MIN: i32 = -6176;
const EXPONENT_MAX: i32 = 6111;

/// A decoded Decimal128.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dec {
    NaN,
    Inf {
        neg: bool,
    },
    /// value = (-1)^neg * coef * 10^exp, coef < 10^34.
    Finite {
        neg: bool,
        coef: u128,
        exp: i32,
    },
}

fn pow10(n: u32) -> u128 {
    10u128.pow(n)
}

// Named methods rather than std's traits: `cmp` is MongoDB's numeric order (1.0 equals 1.00),
// which the derived PartialEq, comparing representations, does not agree with, and the
// arithmetic rounds as decimal128 does, which an operator would hide.
#[allow(clippy::should_implement_trait)]
impl Dec {
    pub fn decode(d: &Decimal128) -> Dec {
        let bytes = d.bytes();
        let v = u128::from_le_bytes(bytes);
        let neg = (v >> 127) & 1 == 1;
        let high = (v >> 64) as u64;
        if (high >> 58) & 0x1f == 0x1f {
            return Dec::NaN;
        }
        if (high >> 58) & 0x1f == 0x1e {
            return Dec::Inf { neg };
        }
        let (exp_biased, coef) = if (high >> 61) & 0x3 == 0x3 {
            // Coefficient would exceed 2^113: non-canonical, value is zero.
            (((high >> 47) & 0x3fff) as i32, 0u128)
        } else {
            let exp = ((high >> 49) & 0x3fff) as i32;
            let coef = v & ((1u128 << 113) - 1);
            (exp, coef)
        };
        let coef = if coef >= pow10(COEFFICIENT_DIGITS_MAX as u32) { 0 } else { coef };
        Dec::Finite { neg, coef, exp: exp_biased - EXPONENT_BIAS }
    }

    pub fn encode(self) -> Decimal128 {
        let v: u128 = match self {
            Dec::NaN => 0x7c00u128 << 112,
            Dec::Inf { neg } => ((neg as u128) << 127) | (0x7800u128 << 112),
            Dec::Finite { neg, coef, exp } => {
                let (coef, exp) = clamp(coef, exp);
                match exp {
                    None => {
                        return Dec::Inf { neg }.encode();
                    }
                    Some(exp) => {
                        let biased = (exp + EXPONENT_BIAS) as u128;
                        ((neg as u128) << 127) | (biased << 113) | coef
                    }
                }
            }
        };
        Decimal128::from_bytes(v.to_le_bytes())
    }

    pub fn zero() -> Dec {
        Dec::Finite { neg: false, coef: 0, exp: 0 }
    }

    pub fn from_i64(i: i64) -> Dec {
        Dec::Finite { neg: i < 0, coef: i.unsigned_abs() as u128, exp: 0 }
    }

    /// MongoDB converts doubles to decimals with 15 significant digits (kRoundTo15Digits).
    pub fn from_f64(x: f64) -> Dec {
        Self::from_f64_digits(x, 15)
    }

    pub fn from_f64_digits(x: f64, digits: usize) -> Dec {
        if x.is_nan() {
            return Dec::NaN;
        }
        if x.is_infinite() {
            return Dec::Inf { neg: x < 0.0 };
        }
        let neg = x.is_sign_negative();
        if x == 0.0 {
            return Dec::Finite { neg, coef: 0, exp: 0 };
        }
        let s = format!("{:.*e}", digits.saturating_sub(1), x.abs());
        Self::parse_sci(&s, neg).unwrap_or(Dec::NaN)
    }

    /// Parse "d.ddddde[+-]x" as produced by `{:e}` formatting.
    fn parse_sci(s: &str, neg: bool) -> Option<Dec> {
        let (mant, exp) = s.split_once(['e', 'E'])?;
        let exp: i32 = exp.parse().ok()?;
        let (int_part, frac_part) = mant.split_once('.').unwrap_or((mant, ""));
        let digits: String = format!("{int_part}{frac_part}");
        let digits: Vec<u8> = digits.bytes().filter(u8::is_ascii_digit).map(|b| b - b'0').collect();
        let exp = exp - frac_part.len() as i32;
        let (coef, exp, sticky) = digits_to_coef(&digits, exp);
        Some(round_finish(neg, coef, exp, sticky))
    }

    pub fn to_f64(self) -> f64 {
        match self {
            Dec::NaN => f64::NAN,
            Dec::Inf { neg } => {
                if neg {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }
            }
            Dec::Finite { neg, coef, exp } => {
                let v: f64 = format!("{coef}e{exp}").parse().unwrap_or(f64::NAN);
                if neg {
                    -v
                } else {
                    v
                }
            }
        }
    }

    pub fn is_nan(self) -> bool {
        matches!(self, Dec::NaN)
    }

    pub fn is_zero(self) -> bool {
        matches!(self, Dec::Finite { coef: 0, .. })
    }

    pub fn is_neg(self) -> bool {
        match self {
            Dec::NaN => false,
            Dec::Inf { neg } => neg,
            Dec::Finite { neg, coef, .. } => neg && coef != 0,
        }
    }

    pub fn neg(self) -> Dec {
        match self {
            Dec::NaN => Dec::NaN,
            Dec::Inf { neg } => Dec::Inf { neg: !neg },
            Dec::Finite { neg, coef, exp } => Dec::Finite { neg: !neg, coef, exp },
        }
    }

    pub fn abs(self) -> Dec {
        match self {
            Dec::NaN => Dec::NaN,
            Dec::Inf { .. } => Dec::Inf { neg: false },
            Dec::Finite { coef, exp, .. } => Dec::Finite { neg: false, coef, exp },
        }
    }

    /// Digits of the coefficient without trailing zeros and the exponent of its first digit,
    /// for exact comparisons; None for zero.
    fn sci_digits(coef: u128, exp: i32) -> Option<(String, i32)> {
        if coef == 0 {
            return None;
        }
        let s = coef.to_string();
        let sci_exp = exp + s.len() as i32 - 1;
        Some((s.trim_end_matches('0').to_string(), sci_exp))
    }

    /// Exact total comparison; NaN sorts below everything and equals NaN.
    pub fn cmp(self, other: Dec) -> Ordering {
        match (self, other) {
            (Dec::NaN, Dec::NaN) => Ordering::Equal,
            (Dec::NaN, _) => Ordering::Less,
            (_, Dec::NaN) => Ordering::Greater,
            (Dec::Inf { neg: a }, Dec::Inf { neg: b }) => b.cmp(&a),
            (Dec::Inf { neg }, _) => {
                if neg {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            }
            (_, Dec::Inf { neg }) => {
                if neg {
                    Ordering::Greater
                } else {
                    Ordering::Less
                }
            }
            (Dec::Finite { neg: na, coef: ca, exp: ea }, Dec::Finite { neg: nb, coef: cb, exp: eb }) => {
                let sa = if ca == 0 {
                    0
                } else if na {
                    -1
                } else {
                    1
                };
                let sb = if cb == 0 {
                    0
                } else if nb {
                    -1
                } else {
                    1
                };
                if sa != sb {
                    return sa.cmp(&sb);
                }
                if sa == 0 {
                    return Ordering::Equal;
                }
                let mag = match (Self::sci_digits(ca, ea), Self::sci_digits(cb, eb)) {
                    (Some(a), Some(b)) => cmp_sci(&a.0, a.1, &b.0, b.1),
                    _ => Ordering::Equal,
                };
                if sa < 0 {
                    mag.reverse()
                } else {
                    mag
                }
            }
        }
    }

    /// Exact comparison with a double (used by the BSON total order).
    pub fn cmp_f64(self, x: f64) -> Ordering {
        if x.is_nan() {
            return if self.is_nan() { Ordering::Equal } else { Ordering::Greater };
        }
        if self.is_nan() {
            return Ordering::Less;
        }
        let approx = self.to_f64();
        // Rounding is monotonic, so a difference in the rounded value is decisive.
        match approx.partial_cmp(&x) {
            Some(Ordering::Equal) | None => {}
            Some(o) => return o,
        }
        if x.is_infinite() {
            return match self {
                Dec::Inf { neg } => {
                    if neg == (x < 0.0) {
                        Ordering::Equal
                    } else if neg {
                        Ordering::Less
                    } else {
                        Ordering::Greater
                    }
                }
                // A finite decimal beyond f64 range rounds to infinity but is smaller.
                _ => {
                    if x > 0.0 {
                        Ordering::Less
                    } else {
                        Ordering::Greater
                    }
                }
            };
        }
        self.cmp(exact_f64(x))
    }

    pub fn add(self, other: Dec) -> Dec {
        match (self, other) {
            (Dec::NaN, _) | (_, Dec::NaN) => Dec::NaN,
            (Dec::Inf { neg: a }, Dec::Inf { neg: b }) => {
                if a == b {
                    Dec::Inf { neg: a }
                } else {
                    Dec::NaN
                }
            }
            (Dec::Inf { neg }, _) | (_, Dec::Inf { neg }) => Dec::Inf { neg },
            (Dec::Finite { neg: na, coef: ca, exp: ea }, Dec::Finite { neg: nb, coef: cb, exp: eb }) => add_finite(na, ca, ea, nb, cb, eb),
        }
    }

    pub fn sub(self, other: Dec) -> Dec {
        self.add(other.neg())
    }

    pub fn mul(self, other: Dec) -> Dec {
        match (self, other) {
            (Dec::NaN, _) | (_, Dec::NaN) => Dec::NaN,
            (Dec::Inf { neg: a }, b) | (b, Dec::Inf { neg: a }) => {
                if b.is_zero() {
                    Dec::NaN
                } else {
                    Dec::Inf { neg: a != b.is_sign_neg() }
                }
            }
            (Dec::Finite { neg: na, coef: ca, exp: ea }, Dec::Finite { neg: nb, coef: cb, exp: eb }) => {
                let digits = mul_digits(&to_digits(ca), &to_digits(cb));
                let (coef, exp, sticky) = digits_to_coef(&digits, ea + eb);
                round_finish(na != nb, coef, exp, sticky)
            }
        }
    }

    fn is_sign_neg(self) -> bool {
        match self {
            Dec::NaN => false,
            Dec::Inf { neg } | Dec::Finite { neg, .. } => neg,
        }
    }

    /// Division; `None` when dividing a finite non-zero by zero is not wanted by the caller is
    /// handled by callers (MongoDB raises before dividing).
    pub fn div(self, other: Dec) -> Dec {
        match (self, other) {
            (Dec::NaN, _) | (_, Dec::NaN) => Dec::NaN,
            (Dec::Inf { .. }, Dec::Inf { .. }) => Dec::NaN,
            (Dec::Inf { neg }, b) => Dec::Inf { neg: neg != b.is_sign_neg() },
            (a, Dec::Inf { neg }) => Dec::Finite { neg: a.is_sign_neg() != neg, coef: 0, exp: 0 },
            (Dec::Finite { neg: na, coef: ca, exp: ea }, Dec::Finite { neg: nb, coef: cb, exp: eb }) => {
                let neg = na != nb;
                if cb == 0 {
                    return if ca == 0 { Dec::NaN } else { Dec::Inf { neg } };
                }
                if ca == 0 {
                    return Dec::Finite { neg, coef: 0, exp: (ea - eb).clamp(EXPONENT_MIN, EXPONENT_MAX) };
                }
                let ideal_exp = ea - eb;
                // Scale the dividend so the quotient has at least 36 digits.
                let a_digits = to_digits(ca);
                let b_digits = to_digits(cb);
                let shift = (COEFFICIENT_DIGITS_MAX + 2 + b_digits.len()).saturating_sub(a_digits.len());
                let mut scaled = a_digits.clone();
                scaled.extend(std::iter::repeat_n(0u8, shift));
                let (q, rem_zero) = div_digits(&scaled, &b_digits);
                let mut exp = ideal_exp - shift as i32;
                let mut q = q;
                if rem_zero {
                    // Exact: use the exponent closest to the ideal one.
                    while exp < ideal_exp && q.len() > 1 && q.last() == Some(&0) {
                        q.pop();
                        exp += 1;
                    }
                }
                let (coef, exp, sticky) = digits_to_coef(&q, exp);
                round_finish(neg, coef, exp, sticky || !rem_zero)
            }
        }
    }

    /// Round to `place` decimal places (negative: to tens, hundreds...). `half_even` false
    /// means truncation toward zero.
    pub fn round_to_place(self, place: i32, truncate: bool) -> Dec {
        let Dec::Finite { neg, coef, exp } = self else { return self };
        let target_exp = -place;
        if exp >= target_exp {
            return self;
        }
        let drop = (target_exp - exp) as usize;
        let digits = to_digits(coef);
        if drop > digits.len() {
            // All digits are dropped and they are below half a unit.
            return Dec::Finite { neg, coef: 0, exp: target_exp };
        }
        let keep = &digits[..digits.len() - drop];
        let rest = &digits[digits.len() - drop..];
        let mut coef = digits_value(keep);
        if !truncate {
            let first = rest.first().copied().unwrap_or(0);
            let tail_nonzero = rest.iter().skip(1).any(|&d| d != 0);
            let round_up = first > 5 || (first == 5 && (tail_nonzero || coef % 2 == 1));
            if round_up {
                coef += 1;
            }
        }
        let (coef, exp, sticky) = digits_to_coef(&to_digits(coef), target_exp);
        round_finish(neg, coef, exp, sticky)
    }

    pub fn floor(self) -> Dec {
        self.integral(true)
    }

    pub fn ceil(self) -> Dec {
        self.integral(false)
    }

    fn integral(self, floor: bool) -> Dec {
        let t = self.round_to_place(0, true);
        let Dec::Finite { neg, .. } = self else { return self };
        if t.cmp(self) == Ordering::Equal {
            return t;
        }
        let one = Dec::from_i64(1);
        if floor && neg {
            t.sub(one)
        } else if !floor && !neg {
            t.add(one)
        } else {
            t
        }
    }

    /// Integral value truncated toward zero, if it fits in i64.
    pub fn to_i64_trunc(self) -> Option<i64> {
        let Dec::Finite { neg, .. } = self else { return None };
        let Dec::Finite { coef, exp, .. } = self.round_to_place(0, true) else { return None };
        if coef == 0 {
            return Some(0);
        }
        if exp > 20 {
            return None;
        }
        let mag = coef.checked_mul(pow10(exp.max(0) as u32))?;
        if neg {
            if mag <= (i64::MAX as u128) + 1 {
                Some((mag as i128).wrapping_neg() as i64)
            } else {
                None
            }
        } else {
            i64::try_from(mag).ok()
        }
    }

    pub fn from_str(s: &str) -> Option<Dec> {
        let d: Decimal128 = s.parse().ok()?;
        Some(Dec::decode(&d))
    }
}

/// Exact decimal value of a finite double (at most 767 significant digits).
fn exact_f64(x: f64) -> Dec {
    // A Dec cannot hold 767 digits, so compare through an exact digit string instead:
    // encode as a finite Dec only when it fits, else fall back to a wider representation.
    let s = format!("{:.800e}", x.abs());
    let neg = x.is_sign_negative() && x != 0.0;
    match s.split_once('e') {
        Some((mant, e)) => {
            let e: i32 = e.parse().unwrap_or(0);
            let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
            let digits = digits.trim_end_matches('0');
            if digits.is_empty() || digits.trim_start_matches('0').is_empty() {
                return Dec::zero();
            }
            if digits.len() <= COEFFICIENT_DIGITS_MAX {
                let coef: u128 = digits.parse().unwrap_or(0);
                let exp = e - (digits.len() as i32 - 1);
                Dec::Finite { neg, coef, exp }
            } else {
                // More digits than a decimal can hold: the double cannot equal any decimal,
                // so keep 34 digits and nudge by one unit in the direction of the excess.
                let head = &digits[..COEFFICIENT_DIGITS_MAX];
                let coef: u128 = head.parse().unwrap_or(0);
                let exp = e - (COEFFICIENT_DIGITS_MAX as i32 - 1);
                // The true value is strictly between coef and coef+1 (in units of 10^exp).
                // Represent it as coef*10 + 5 at exp-1: same ordering against any 34-digit
                // decimal, since such a decimal cannot lie strictly inside that gap.
                Dec::Finite { neg, coef: coef * 10 + 5, exp: exp - 1 }
            }
        }
        None => Dec::NaN,
    }
}

fn cmp_sci(a: &str, ae: i32, b: &str, be: i32) -> Ordering {
    ae.cmp(&be).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

fn to_digits(mut v: u128) -> Vec<u8> {
    if v == 0 {
        return vec![0];
    }
    let mut out = Vec::with_capacity(40);
    while v > 0 {
        out.push((v % 10) as u8);
        v /= 10;
    }
    out.reverse();
    out
}

fn digits_value(d: &[u8]) -> u128 {
    d.iter().fold(0u128, |acc, &x| acc.saturating_mul(10).saturating_add(x as u128))
}

/// Take the 34 most significant digits (msd first); returns (coef, exp, dropped_nonzero) and
/// applies half-even rounding on the first dropped digit.
fn digits_to_coef(digits: &[u8], exp: i32) -> (u128, i32, bool) {
    let start = digits.iter().position(|&d| d != 0).unwrap_or(digits.len());
    let digits = &digits[start..];
    if digits.is_empty() {
        return (0, exp, false);
    }
    if digits.len() <= COEFFICIENT_DIGITS_MAX {
        return (digits_value(digits), exp, false);
    }
    let drop = digits.len() - COEFFICIENT_DIGITS_MAX;
    let keep = &digits[..COEFFICIENT_DIGITS_MAX];
    let first = digits[COEFFICIENT_DIGITS_MAX];
    let tail_nonzero = digits[COEFFICIENT_DIGITS_MAX + 1..].iter().any(|&d| d != 0);
    let mut coef = digits_value(keep);
    let round_up = first > 5 || (first == 5 && (tail_nonzero || coef % 2 == 1));
    let mut exp = exp + drop as i32;
    if round_up {
        coef += 1;
        if coef == pow10(COEFFICIENT_DIGITS_MAX as u32) {
            coef /= 10;
            exp += 1;
        }
    }
    (coef, exp, first != 0 || tail_nonzero)
}

fn round_finish(neg: bool, coef: u128, exp: i32, _sticky: bool) -> Dec {
    match clamp(coef, exp) {
        (c, Some(e)) => Dec::Finite { neg, coef: c, exp: e },
        (_, None) => Dec::Inf { neg },
    }
}

/// Fit the exponent into range: scale up the coefficient (clamping) or round away digits.
fn clamp(mut coef: u128, mut exp: i32) -> (u128, Option<i32>) {
    if coef == 0 {
        return (0, Some(exp.clamp(EXPONENT_MIN, EXPONENT_MAX)));
    }
    while exp > EXPONENT_MAX {
        match coef.checked_mul(10) {
            Some(c) if c < pow10(COEFFICIENT_DIGITS_MAX as u32) => {
                coef = c;
                exp -= 1;
            }
            _ => return (coef, None),
        }
    }
    if exp < EXPONENT_MIN {
        let drop = (EXPONENT_MIN - exp) as usize;
        let digits = to_digits(coef);
        if drop > digits.len() {
            return (0, Some(EXPONENT_MIN));
        }
        let keep = &digits[..digits.len() - drop];
        let rest = &digits[digits.len() - drop..];
        let mut c = digits_value(keep);
        let first = rest.first().copied().unwrap_or(0);
        let tail = rest.iter().skip(1).any(|&d| d != 0);
        if first > 5 || (first == 5 && (tail || c % 2 == 1)) {
            c += 1;
        }
        coef = c;
        exp = EXPONENT_MIN;
    }
    (coef, Some(exp))
}

fn add_finite(na: bool, ca: u128, ea: i32, nb: bool, cb: u128, eb: i32) -> Dec {
    let exp = ea.min(eb);
    if ca == 0 && cb == 0 {
        return Dec::Finite { neg: na && nb, coef: 0, exp };
    }
    if ca == 0 {
        return round_digits(nb, &to_digits(cb), eb, exp);
    }
    if cb == 0 {
        return round_digits(na, &to_digits(ca), ea, exp);
    }
    // Bound the alignment: an addend far below the other's last digit only matters as a
    // sticky bit, and 80 extra digits are more than enough to round correctly.
    let (sa, sb) = (ea + to_digits(ca).len() as i32, eb + to_digits(cb).len() as i32);
    let top = sa.max(sb);
    let exp = exp.max(top - (COEFFICIENT_DIGITS_MAX as i32 + 80));
    let a = align(ca, ea, exp);
    let b = align(cb, eb, exp);
    let (neg, digits) = if na == nb {
        (na, add_digits(&a, &b))
    } else {
        match cmp_digits(&a, &b) {
            Ordering::Equal => return Dec::Finite { neg: false, coef: 0, exp },
            Ordering::Greater => (na, sub_digits(&a, &b)),
            Ordering::Less => (nb, sub_digits(&b, &a)),
        }
    };
    let (coef, exp, sticky) = digits_to_coef(&digits, exp);
    round_finish(neg, coef, exp, sticky)
}

fn round_digits(neg: bool, digits: &[u8], exp: i32, _preferred: i32) -> Dec {
    let (coef, exp, sticky) = digits_to_coef(digits, exp);
    round_finish(neg, coef, exp, sticky)
}

/// Digits of coef*10^(e - target) (e >= target), or truncated when e < target.
fn align(coef: u128, e: i32, target: i32) -> Vec<u8> {
    let mut d = to_digits(coef);
    if e >= target {
        d.extend(std::iter::repeat_n(0u8, (e - target) as usize));
    } else {
        let cut = ((target - e) as usize).min(d.len());
        d.truncate(d.len() - cut);
        if d.is_empty() {
            d.push(0);
        }
    }
    d
}

fn strip(d: &[u8]) -> &[u8] {
    let start = d.iter().position(|&x| x != 0).unwrap_or(d.len());
    &d[start..]
}

fn cmp_digits(a: &[u8], b: &[u8]) -> Ordering {
    let (a, b) = (strip(a), strip(b));
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

fn add_digits(a: &[u8], b: &[u8]) -> Vec<u8> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n + 1);
    let mut carry = 0u8;
    for i in 0..n {
        let x = if i < a.len() { a[a.len() - 1 - i] } else { 0 };
        let y = if i < b.len() { b[b.len() - 1 - i] } else { 0 };
        let s = x + y + carry;
        out.push(s % 10);
        carry = s / 10;
    }
    if carry > 0 {
        out.push(carry);
    }
    out.reverse();
    out
}

/// a - b with a >= b.
fn sub_digits(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len());
    let mut borrow = 0i8;
    for i in 0..a.len() {
        let x = a[a.len() - 1 - i] as i8;
        let y = if i < b.len() { b[b.len() - 1 - i] as i8 } else { 0 };
        let mut s = x - y - borrow;
        if s < 0 {
            s += 10;
            borrow = 1;
        } else {
            borrow = 0;
        }
        out.push(s as u8);
    }
    out.reverse();
    out
}

fn mul_digits(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut acc = vec![0u32; a.len() + b.len()];
    for (i, &x) in a.iter().rev().enumerate() {
        for (j, &y) in b.iter().rev().enumerate() {
            acc[i + j] += x as u32 * y as u32;
        }
    }
    let mut carry = 0u32;
    for v in acc.iter_mut() {
        let s = *v + carry;
        *v = s % 10;
        carry = s / 10;
    }
    let mut out: Vec<u8> = acc.into_iter().rev().map(|v| v as u8).collect();
    if out.is_empty() {
        out.push(0);
    }
    out
}

/// Long division of digit strings; returns (quotient digits, remainder is zero).
fn div_digits(a: &[u8], b: &[u8]) -> (Vec<u8>, bool) {
    let b = strip(b).to_vec();
    let mut q = Vec::with_capacity(a.len());
    let mut rem: Vec<u8> = Vec::new();
    for &d in a {
        rem.push(d);
        let r = strip(&rem).to_vec();
        rem = r;
        let mut count = 0u8;
        while cmp_digits(&rem, &b) != Ordering::Less {
            rem = strip(&sub_digits(&rem, &b)).to_vec();
            count += 1;
        }
        q.push(count);
    }
    (q, strip(&rem).is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Dec {
        Dec::from_str(s).unwrap()
    }
    fn show(x: Dec) -> String {
        x.encode().to_string()
    }

    #[test]
    fn roundtrip_and_arith() {
        assert_eq!(show(d("1.5")), "1.5");
        assert_eq!(show(d("1.5").add(d("2.25"))), "3.75");
        assert_eq!(show(d("10").div(d("4"))), "2.5");
        assert_eq!(show(d("1").div(d("3"))), "0.3333333333333333333333333333333333");
        assert_eq!(show(d("2").mul(d("3.0"))), "6.0");
        assert_eq!(show(d("5").sub(d("7"))), "-2");
        assert_eq!(show(Dec::from_f64(0.1)), "0.100000000000000");
        assert_eq!(show(Dec::from_i64(-42)), "-42");
        assert_eq!(show(d("2.5").round_to_place(0, false)), "2");
        assert_eq!(show(d("3.5").round_to_place(0, false)), "4");
        assert_eq!(show(d("-3.7").round_to_place(0, true)), "-3");
        assert_eq!(show(d("-3.2").floor()), "-4");
        assert_eq!(show(d("3.2").ceil()), "4");
        assert_eq!(d("123.9").to_i64_trunc(), Some(123));
    }

    #[test]
    fn exact_comparisons() {
        assert_eq!(d("1").cmp(d("1.000")), Ordering::Equal);
        assert_eq!(d("0.1").cmp_f64(0.1), Ordering::Less); // 0.1 as double is slightly larger
        assert_eq!(d("0.5").cmp_f64(0.5), Ordering::Equal);
        assert_eq!(d("-0").cmp(d("0")), Ordering::Equal);
        assert_eq!(d("NaN").cmp(d("-Infinity")), Ordering::Less);
        assert_eq!(d("1E+400").cmp_f64(f64::INFINITY), Ordering::Less);
    }
}
