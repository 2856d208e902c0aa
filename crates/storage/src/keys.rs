//! Order-preserving encoding of BSON values for index keys.
//!
//! Invariant (proved by the proptest below): for any values a, b,
//! `encode(a).cmp(&encode(b)) == query::compare::cmp_bson(a, b)` under plain memcmp.
//! Every encoded component is prefix-free (no encoding is a proper prefix of another), so a
//! compound key is the plain concatenation of its components and still compares
//! component-wise; a descending component is the bitwise complement of its ascending form
//! (complement reverses memcmp order and keeps prefix-freeness).
//!
//! Layout of one value: a type tag (one per canonical type rank, so ints, longs, doubles and
//! decimals share a tag, as do strings and symbols), then a type-specific payload:
//! - MinKey, Undefined, Null, MaxKey: no payload.
//! - Numbers are encoded by exact value, so 1, 1L, 1.0 and 1.00M encode identically: one class
//!   byte (NaN < -inf < negative < zero < positive < +inf); finite non-zero numbers then carry
//!   the decimal exponent E and the significant digits of value = 0.d1d2..dn × 10^E (d1 != 0,
//!   dn != 0): E as u16 big-endian biased by 0x8000, the digits as nibbles (digit+1) packed
//!   two per byte and ended by a 0 nibble (a whole 0x00 byte if n is even). Negative numbers
//!   complement those bytes. Doubles are expanded to their exact decimal value.
//! - Strings, symbols, JavaScript code: bytes with 0x00 escaped as 0x00 0xFF, ended by 0x00 0x00.
//! - Documents: per field, the value's tag, the escaped field name, the value's payload; then 0x00.
//!   (Matches `cmp_docs`: type rank, then name, then value; shorter is less.)
//! - Arrays: each element's full encoding, then 0x00.
//! - Binary: length u32 BE, subtype, bytes. ObjectId: 12 bytes. Boolean: one byte.
//!   Date: i64 with the sign bit flipped, BE. Timestamp: time BE, increment BE.
//! - Regex: escaped pattern, escaped options. DBPointer: its escaped Debug rendering (the
//!   order `cmp_bson` uses). Code with scope: escaped code, then the scope as a document.

use bson::{Bson, Document};

/// Terminator of documents and arrays; lower than every tag.
const END: u8 = 0x00;

fn tag(v: &Bson) -> u8 {
    // Spaced out so a tag never equals END and stays ordered by canonical rank.
    0x10 + 8 * query::compare::canonical_rank(v)
}

const NUM_NAN: u8 = 0x01;
const NUM_NEG_INF: u8 = 0x02;
const NUM_NEG: u8 = 0x03;
const NUM_ZERO: u8 = 0x04;
const NUM_POS: u8 = 0x05;
const NUM_POS_INF: u8 = 0x06;

/// Encode `v` ascending, appending to `out`.
pub fn encode_value(v: &Bson, out: &mut Vec<u8>) {
    out.push(tag(v));
    encode_payload(v, out);
}

/// Encode `v` as one index key component; descending components are complemented.
pub fn encode_component(v: &Bson, descending: bool, out: &mut Vec<u8>) {
    let start = out.len();
    encode_value(v, out);
    if descending {
        for b in &mut out[start..] {
            *b = !*b;
        }
    }
}

/// Encode a compound index key: `values[i]` goes with the i-th field of `key_pattern`, whose
/// value's sign gives the direction (negative = descending). Extra values are encoded
/// ascending; missing values are not encoded (a shorter key, usable as a prefix bound).
pub fn encode_index_key(key_pattern: &Document, values: &[Bson]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 * values.len());
    let mut dirs = key_pattern.values();
    for v in values {
        let descending = dirs.next().is_some_and(is_descending);
        encode_component(v, descending, &mut out);
    }
    out
}

/// True if a key pattern direction means descending order.
pub fn is_descending(dir: &Bson) -> bool {
    match dir {
        Bson::Int32(i) => *i < 0,
        Bson::Int64(i) => *i < 0,
        Bson::Double(d) => *d < 0.0,
        Bson::Decimal128(d) => d.bytes()[15] & 0x80 != 0,
        _ => false,
    }
}

fn encode_payload(v: &Bson, out: &mut Vec<u8>) {
    match v {
        Bson::MinKey | Bson::MaxKey | Bson::Null | Bson::Undefined => {}
        Bson::Int32(i) => encode_integer(*i < 0, i.unsigned_abs() as u128, out),
        Bson::Int64(i) => encode_integer(*i < 0, i.unsigned_abs() as u128, out),
        Bson::Double(d) => encode_f64(*d, out),
        Bson::Decimal128(d) => encode_decimal(d, out),
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => encode_bytes(s.as_bytes(), out),
        Bson::Document(d) => encode_doc_body(d, out),
        Bson::Array(a) => {
            for e in a {
                encode_value(e, out);
            }
            out.push(END);
        }
        Bson::Binary(b) => {
            out.extend_from_slice(&(b.bytes.len() as u32).to_be_bytes());
            out.push(u8::from(b.subtype));
            out.extend_from_slice(&b.bytes);
        }
        Bson::ObjectId(o) => out.extend_from_slice(&o.bytes()),
        Bson::Boolean(b) => out.push(*b as u8),
        Bson::DateTime(d) => out.extend_from_slice(&((d.timestamp_millis() as u64) ^ (1 << 63)).to_be_bytes()),
        Bson::Timestamp(t) => {
            out.extend_from_slice(&t.time.to_be_bytes());
            out.extend_from_slice(&t.increment.to_be_bytes());
        }
        Bson::RegularExpression(r) => {
            encode_bytes(r.pattern.as_str().as_bytes(), out);
            encode_bytes(r.options.as_str().as_bytes(), out);
        }
        Bson::DbPointer(p) => encode_bytes(format!("{p:?}").as_bytes(), out),
        Bson::JavaScriptCodeWithScope(c) => {
            encode_bytes(c.code.as_bytes(), out);
            encode_doc_body(&c.scope, out);
        }
    }
}

fn encode_doc_body(d: &Document, out: &mut Vec<u8>) {
    for (k, v) in d {
        out.push(tag(v));
        encode_bytes(k.as_bytes(), out);
        encode_payload(v, out);
    }
    out.push(END);
}

fn encode_bytes(s: &[u8], out: &mut Vec<u8>) {
    for &b in s {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

/// A finite non-zero magnitude: 0.digits × 10^exp, digits without leading/trailing zeros.
fn encode_finite(neg: bool, digits: &[u8], exp: i32, out: &mut Vec<u8>) {
    out.push(if neg { NUM_NEG } else { NUM_POS });
    let start = out.len();
    let biased = (exp.clamp(i16::MIN as i32, i16::MAX as i32) + 0x8000) as u16;
    out.extend_from_slice(&biased.to_be_bytes());
    let mut pairs = digits.chunks_exact(2);
    for p in &mut pairs {
        out.push(((p[0] + 1) << 4) | (p[1] + 1));
    }
    match pairs.remainder() {
        [d] => out.push((d + 1) << 4),
        _ => out.push(0),
    }
    if neg {
        for b in &mut out[start..] {
            *b = !*b;
        }
    }
}

/// Decimal digits of n (n > 0), most significant first.
fn u128_digits(mut n: u128, digits: &mut Vec<u8>) {
    let start = digits.len();
    while n > 0 {
        digits.push((n % 10) as u8);
        n /= 10;
    }
    digits[start..].reverse();
}

/// Encode ±n × 10^scale given n's decimal digits (n > 0).
fn encode_scaled(neg: bool, mut digits: Vec<u8>, scale: i32, out: &mut Vec<u8>) {
    let exp = digits.len() as i32 + scale;
    while digits.last() == Some(&0) {
        digits.pop();
    }
    encode_finite(neg, &digits, exp, out);
}

fn encode_integer(neg: bool, n: u128, out: &mut Vec<u8>) {
    if n == 0 {
        out.push(NUM_ZERO);
        return;
    }
    let mut digits = Vec::with_capacity(40);
    u128_digits(n, &mut digits);
    encode_scaled(neg, digits, 0, out);
}

fn encode_f64(d: f64, out: &mut Vec<u8>) {
    if d.is_nan() {
        out.push(NUM_NAN);
        return;
    }
    if d.is_infinite() {
        out.push(if d < 0.0 { NUM_NEG_INF } else { NUM_POS_INF });
        return;
    }
    if d == 0.0 {
        out.push(NUM_ZERO);
        return;
    }
    let neg = d < 0.0;
    let bits = d.to_bits();
    let exp_bits = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    let (mut mant, mut e2) = if exp_bits == 0 { (frac, -1074) } else { (frac | (1u64 << 52), exp_bits - 1075) };
    let tz = mant.trailing_zeros();
    mant >>= tz;
    e2 += tz as i32;
    // |d| = mant × 2^e2 exactly; as a decimal: mant × 2^e2, or mant × 5^k × 10^-k for e2 = -k.
    let mut digits = Vec::with_capacity(24);
    if e2 >= 0 {
        if e2 + (64 - mant.leading_zeros() as i32) <= 127 {
            u128_digits((mant as u128) << e2, &mut digits);
        } else {
            let mut big = BigDec::from_u64(mant);
            big.mul_pow2(e2 as u32);
            big.digits(&mut digits);
        }
        encode_scaled(neg, digits, 0, out);
    } else {
        let k = (-e2) as u32;
        // 5^27 < 2^63 and mant < 2^53 keep the product below 2^116.
        if k <= 27 {
            u128_digits(mant as u128 * 5u128.pow(k), &mut digits);
        } else {
            let mut big = BigDec::from_u64(mant);
            big.mul_pow5(k);
            big.digits(&mut digits);
        }
        encode_scaled(neg, digits, e2, out);
    }
}

const DECIMAL_EXPONENT_BIAS: i32 = 6176;

fn encode_decimal(d: &bson::Decimal128, out: &mut Vec<u8>) {
    let v = u128::from_le_bytes(d.bytes());
    let neg = (v >> 127) & 1 == 1;
    let high = (v >> 64) as u64;
    match (high >> 58) & 0x1f {
        0x1f => return out.push(NUM_NAN),
        0x1e => return out.push(if neg { NUM_NEG_INF } else { NUM_POS_INF }),
        _ => {}
    }
    // Coefficients with the "11" combination prefix exceed 2^113 > 10^34: non-canonical, zero.
    let (exp, coef) = if (high >> 61) & 0x3 == 0x3 { (0, 0u128) } else { (((high >> 49) & 0x3fff) as i32 - DECIMAL_EXPONENT_BIAS, v & ((1u128 << 113) - 1)) };
    if coef == 0 || coef >= 10u128.pow(34) {
        out.push(NUM_ZERO);
        return;
    }
    let mut digits = Vec::with_capacity(36);
    u128_digits(coef, &mut digits);
    encode_scaled(neg, digits, exp, out);
}

/// Minimal unsigned big integer in base 10^9 (little-endian limbs), for exact expansion of
/// doubles outside u128 range. At most ~770 decimal digits (subnormals), so ~86 limbs.
struct BigDec {
    limbs: Vec<u32>,
}

const LIMB_BASE: u64 = 1_000_000_000;

impl BigDec {
    fn from_u64(mut n: u64) -> BigDec {
        let mut limbs = Vec::with_capacity(8);
        while n > 0 {
            limbs.push((n % LIMB_BASE) as u32);
            n /= LIMB_BASE;
        }
        BigDec { limbs }
    }

    fn mul_small(&mut self, m: u32) {
        let mut carry: u64 = 0;
        for l in &mut self.limbs {
            let v = *l as u64 * m as u64 + carry;
            *l = (v % LIMB_BASE) as u32;
            carry = v / LIMB_BASE;
        }
        while carry > 0 {
            self.limbs.push((carry % LIMB_BASE) as u32);
            carry /= LIMB_BASE;
        }
    }

    fn mul_pow5(&mut self, mut k: u32) {
        while k >= 13 {
            self.mul_small(1_220_703_125); // 5^13
            k -= 13;
        }
        self.mul_small(5u32.pow(k));
    }

    fn mul_pow2(&mut self, mut k: u32) {
        while k >= 31 {
            self.mul_small(1 << 31);
            k -= 31;
        }
        self.mul_small(1 << k);
    }

    fn digits(&self, out: &mut Vec<u8>) {
        let mut first = true;
        for &l in self.limbs.iter().rev() {
            let mut chunk = [0u8; 9];
            let mut v = l;
            for slot in chunk.iter_mut().rev() {
                *slot = (v % 10) as u8;
                v /= 10;
            }
            if first {
                let skip = chunk.iter().position(|&d| d != 0).unwrap_or(9);
                out.extend_from_slice(&chunk[skip..]);
                first = false;
            } else {
                out.extend_from_slice(&chunk);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId, Binary, Decimal128};
    use proptest::prelude::*;
    use query::compare::cmp_bson;
    use std::cmp::Ordering;

    fn enc(v: &Bson) -> Vec<u8> {
        let mut out = Vec::new();
        encode_value(v, &mut out);
        out
    }

    fn dec(s: &str) -> Bson {
        Bson::Decimal128(s.parse::<Decimal128>().unwrap())
    }

    fn check(a: &Bson, b: &Bson) {
        assert_eq!(enc(a).cmp(&enc(b)), cmp_bson(a, b), "{a:?} vs {b:?}: {:x?} {:x?}", enc(a), enc(b));
    }

    #[test]
    fn numbers_encode_by_value() {
        assert_eq!(enc(&Bson::Int32(1)), enc(&Bson::Double(1.0)));
        assert_eq!(enc(&Bson::Int64(1)), enc(&dec("1.000")));
        assert_eq!(enc(&Bson::Double(-0.0)), enc(&Bson::Int32(0)));
        assert_eq!(enc(&Bson::Double(f64::NAN)), enc(&dec("NaN")));
        assert_eq!(enc(&Bson::Double(0.5)), enc(&dec("0.5")));
        check(&Bson::Double(1e300), &dec("1E300"));
        check(&Bson::Double(0.1), &dec("0.1"));
        check(&Bson::Double(1e-300), &dec("1E-300"));
        let ordered = [
            Bson::Double(f64::NAN),
            Bson::Double(f64::NEG_INFINITY),
            dec("-1E+6000"),
            Bson::Double(-1e300),
            Bson::Int64(i64::MIN),
            Bson::Int32(-10),
            Bson::Double(-9.5),
            Bson::Double(-5e-324),
            Bson::Int32(0),
            dec("1E-6000"),
            Bson::Double(5e-324),
            dec("0.1"),
            Bson::Double(0.1),
            Bson::Double(0.5),
            Bson::Int32(1),
            dec("1.000000000000000000000000000000001"),
            Bson::Double(1.0000000000000002),
            Bson::Int32(9),
            Bson::Int32(10),
            Bson::Int64(9007199254740992),
            Bson::Int64(9007199254740993),
            Bson::Double(9007199254740994.0),
            Bson::Int64(i64::MAX),
            Bson::Double(i64::MAX as f64),
            Bson::Double(f64::MAX),
            dec("1E+6000"),
            Bson::Double(f64::INFINITY),
        ];
        for w in ordered.windows(2) {
            check(&w[0], &w[1]);
            assert_eq!(cmp_bson(&w[0], &w[1]), Ordering::Less, "{:?} < {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn compound_and_descending() {
        let pat = doc! {"a": 1, "b": -1};
        let k = |a: i32, b: &str| encode_index_key(&pat, &[Bson::Int32(a), Bson::String(b.into())]);
        assert!(k(1, "z") < k(2, "a"));
        assert!(k(1, "b") < k(1, "a"));
        assert!(k(1, "a") < k(1, ""));
        // A prefix key (only the first field) sorts before every full key with that prefix.
        assert!(encode_index_key(&pat, &[Bson::Int32(1)]) < k(1, "zzz"));
    }

    #[test]
    fn other_types() {
        let vals = vec![
            Bson::MinKey,
            Bson::Undefined,
            Bson::Null,
            Bson::String("".into()),
            Bson::String("a\0".into()),
            Bson::String("a\0b".into()),
            Bson::String("a\x01".into()),
            Bson::Symbol("ab".into()),
            Bson::Document(doc! {}),
            Bson::Document(doc! {"a": 1}),
            Bson::Document(doc! {"a": 1, "b": 1}),
            Bson::Document(doc! {"b": 1}),
            Bson::Document(doc! {"a": "x"}),
            Bson::Array(vec![]),
            Bson::Array(vec![Bson::Int32(1)]),
            Bson::Array(vec![Bson::Int32(1), Bson::Null]),
            Bson::Array(vec![Bson::Int32(1), Bson::Int32(2)]),
            Bson::Binary(Binary { subtype: 5u8.into(), bytes: vec![] }),
            Bson::Binary(Binary { subtype: 0u8.into(), bytes: vec![9] }),
            Bson::Binary(Binary { subtype: 0u8.into(), bytes: vec![0, 0] }),
            Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bson::ObjectId(ObjectId::from_bytes([1; 12])),
            Bson::Boolean(false),
            Bson::Boolean(true),
            Bson::DateTime(bson::DateTime::from_millis(-5)),
            Bson::DateTime(bson::DateTime::from_millis(3)),
            Bson::Timestamp(bson::Timestamp { time: 1, increment: 9 }),
            Bson::Timestamp(bson::Timestamp { time: 2, increment: 0 }),
            Bson::RegularExpression(bson::Regex { pattern: "a".try_into().unwrap(), options: "".try_into().unwrap() }),
            Bson::RegularExpression(bson::Regex { pattern: "a".try_into().unwrap(), options: "i".try_into().unwrap() }),
            Bson::JavaScriptCode("x".into()),
            Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope { code: "x".into(), scope: doc! {"a": 1} }),
            Bson::MaxKey,
        ];
        for a in &vals {
            for b in &vals {
                check(a, b);
            }
        }
    }

    fn arb_f64() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>(),
            (-1000i64..1000, -40i32..40).prop_map(|(m, e)| m as f64 * 2f64.powi(e)),
            (-20i32..20).prop_map(|v| v as f64 / 4.0),
            Just(5e-324),
            Just(-0.0),
            Just(f64::MAX),
            Just(i64::MAX as f64),
        ]
    }

    fn arb_leaf() -> impl Strategy<Value = Bson> {
        prop_oneof![
            Just(Bson::Null),
            Just(Bson::MinKey),
            Just(Bson::MaxKey),
            Just(Bson::Undefined),
            any::<i32>().prop_map(Bson::Int32),
            (-5i32..5).prop_map(Bson::Int32),
            any::<i64>().prop_map(Bson::Int64),
            (-5i64..5).prop_map(Bson::Int64),
            (-(1i64 << 54)..(1i64 << 54)).prop_map(Bson::Int64),
            arb_f64().prop_map(Bson::Double),
            (-50i64..50, -3i32..3).prop_map(|(c, e)| dec(&format!("{c}E{e}"))),
            (any::<i64>(), -30i32..30).prop_map(|(c, e)| dec(&format!("{c}E{e}"))),
            (-6100i32..6100).prop_map(|e| dec(&format!("7E{e}"))),
            Just(dec("NaN")),
            Just(dec("-Infinity")),
            Just(dec("Infinity")),
            Just(dec("-0")),
            "[a-c\\x00]{0,3}".prop_map(Bson::String),
            "[a-c]{0,3}".prop_map(Bson::Symbol),
            any::<bool>().prop_map(Bson::Boolean),
            (-3i64..3).prop_map(|m| Bson::DateTime(bson::DateTime::from_millis(m))),
            any::<i64>().prop_map(|m| Bson::DateTime(bson::DateTime::from_millis(m))),
            (0u32..3, 0u32..3).prop_map(|(t, i)| Bson::Timestamp(bson::Timestamp { time: t, increment: i })),
            (0u8..3, prop::collection::vec(0u8..3, 0..3)).prop_map(|(s, b)| Bson::Binary(Binary { subtype: s.into(), bytes: b })),
            prop::array::uniform12(0u8..2).prop_map(|b| Bson::ObjectId(ObjectId::from_bytes(b))),
        ]
    }

    fn arb_bson() -> impl Strategy<Value = Bson> {
        arb_leaf().prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Bson::Array),
                prop::collection::vec(("[ab]{1,2}", inner), 0..3).prop_map(|kv| {
                    let mut d = Document::new();
                    for (k, v) in kv {
                        d.insert(k, v);
                    }
                    Bson::Document(d)
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5000))]
        #[test]
        fn encoding_preserves_cmp_bson(a in arb_bson(), b in arb_bson()) {
            prop_assert_eq!(enc(&a).cmp(&enc(&b)), cmp_bson(&a, &b), "{:?} vs {:?}", a, b);
        }

        #[test]
        fn compound_keys_compare_componentwise(a1 in arb_leaf(), a2 in arb_bson(), b1 in arb_leaf(), b2 in arb_bson(), d1 in any::<bool>(), d2 in any::<bool>()) {
            let pat = doc! {"x": if d1 { -1 } else { 1 }, "y": if d2 { -1 } else { 1 }};
            let ka = encode_index_key(&pat, &[a1.clone(), a2.clone()]);
            let kb = encode_index_key(&pat, &[b1.clone(), b2.clone()]);
            let dir = |o: Ordering, d: bool| if d { o.reverse() } else { o };
            let expected = dir(cmp_bson(&a1, &b1), d1).then_with(|| dir(cmp_bson(&a2, &b2), d2));
            prop_assert_eq!(ka.cmp(&kb), expected);
        }
    }
}
