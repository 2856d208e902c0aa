//! MongoDB's hashed-index function (`BSONElementHasher::hash64`, seed 0, hash version 0), so
//! hashed keys (and later hashed shard keys) equal mongod's bit for bit.
//!
//! MD5 over: the seed as i32 LE; then, for the value, its canonical type as i32 LE followed
//! by its payload: numbers as the i64 LE of `safeNumberLongForHash` (all numeric types squash
//! to one integer, doubles truncated toward zero); documents and arrays as each element
//! (canonical type, field name with its NUL, payload) and a closing EOO (canonical type 0,
//! nothing else); code with scope as its code string (with NUL, no length) then its scope's
//! elements; every other type as its raw BSON value bytes. The result is the first 8 digest
//! bytes read as i64 LE.

use bson::{Bson, Document};
use common::{Error, Result};
use md5::{Digest, Md5};

/// MongoDB's `BSONElementHasher::DEFAULT_HASH_SEED`.
const HASH_SEED: i32 = 0;

/// The i64 a hashed index stores for `v`. Arrays are refused (error 16766), as a hashed index
/// cannot hold them; use [`hash_bson`] to hash any value (e.g. `$toHashedIndexKey`).
pub fn hashed_value(v: &Bson) -> Result<i64> {
    if matches!(v, Bson::Array(_)) {
        return Err(array_error(""));
    }
    Ok(hash_bson(v))
}

/// MongoDB's hash64 of any value, arrays included.
pub fn hash_bson(v: &Bson) -> i64 {
    let mut h = Md5::new();
    h.update(HASH_SEED.to_le_bytes());
    hash_value(&mut h, v);
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_le_bytes(first)
}

pub(crate) fn array_error(path: &str) -> Error {
    Error::location(16766, format!("Error: hashed indexes do not currently support array values. Found array at path: {path}"))
}

/// `canonicalizeBSONType`.
fn canonical_type(v: &Bson) -> i32 {
    match v {
        Bson::MinKey => -1,
        Bson::Undefined => 0,
        Bson::Null => 5,
        Bson::Double(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Decimal128(_) => 10,
        Bson::String(_) | Bson::Symbol(_) => 15,
        Bson::Document(_) => 20,
        Bson::Array(_) => 25,
        Bson::Binary(_) => 30,
        Bson::ObjectId(_) => 35,
        Bson::Boolean(_) => 40,
        Bson::DateTime(_) => 45,
        Bson::Timestamp(_) => 47,
        Bson::RegularExpression(_) => 50,
        Bson::DbPointer(_) => 55,
        Bson::JavaScriptCode(_) => 60,
        Bson::JavaScriptCodeWithScope(_) => 65,
        Bson::MaxKey => 127,
    }
}

/// Canonical type of the EOO element that ends an embedded document.
const EOO_CANONICAL_TYPE: i32 = 0;

fn hash_value(h: &mut Md5, v: &Bson) {
    h.update(canonical_type(v).to_le_bytes());
    hash_payload(h, v);
}

fn hash_elements<'a>(h: &mut Md5, elements: impl Iterator<Item = (std::borrow::Cow<'a, str>, &'a Bson)>) {
    for (name, v) in elements {
        h.update(canonical_type(v).to_le_bytes());
        h.update(name.as_bytes());
        h.update([0u8]);
        hash_payload(h, v);
    }
    h.update(EOO_CANONICAL_TYPE.to_le_bytes());
}

fn hash_doc(h: &mut Md5, d: &Document) {
    hash_elements(h, d.iter().map(|(k, v)| (std::borrow::Cow::Borrowed(k.as_str()), v)));
}

fn hash_string(h: &mut Md5, s: &str) {
    h.update(((s.len() + 1) as i32).to_le_bytes());
    h.update(s.as_bytes());
    h.update([0u8]);
}

fn hash_payload(h: &mut Md5, v: &Bson) {
    match v {
        Bson::Int32(i) => h.update((*i as i64).to_le_bytes()),
        Bson::Int64(i) => h.update(i.to_le_bytes()),
        Bson::Double(d) => h.update(double_for_hash(*d).to_le_bytes()),
        Bson::Decimal128(d) => h.update(decimal_for_hash(d).to_le_bytes()),
        Bson::Document(d) => hash_doc(h, d),
        Bson::Array(a) => hash_elements(h, a.iter().enumerate().map(|(i, v)| (std::borrow::Cow::Owned(i.to_string()), v))),
        Bson::JavaScriptCodeWithScope(c) => {
            h.update(c.code.as_bytes());
            h.update([0u8]);
            hash_doc(h, &c.scope);
        }
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => hash_string(h, s),
        Bson::ObjectId(o) => h.update(o.bytes()),
        Bson::Boolean(b) => h.update([*b as u8]),
        Bson::DateTime(d) => h.update(d.timestamp_millis().to_le_bytes()),
        Bson::Timestamp(t) => {
            h.update(t.increment.to_le_bytes());
            h.update(t.time.to_le_bytes());
        }
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => {}
        Bson::Binary(_) | Bson::RegularExpression(_) | Bson::DbPointer(_) => {
            let mut bytes = Vec::new();
            // These never fail to encode (no field names inside).
            let _ = crate::bsonenc::append_value(v, &mut bytes);
            h.update(&bytes);
        }
    }
}

/// 2^63 as a double: the least double that overflows i64.
const I64_MAX_PLUS_ONE_AS_F64: f64 = 9_223_372_036_854_775_808.0;

/// `safeNumberLongForHash` of a double: NaN → 0; exactly 2^63 → i64::MIN (preserving the old
/// undefined cast); larger → i64::MAX; below -2^63 → i64::MIN; else truncated toward zero.
fn double_for_hash(d: f64) -> i64 {
    if d.is_nan() {
        return 0;
    }
    if d == I64_MAX_PLUS_ONE_AS_F64 {
        return i64::MIN;
    }
    if d >= I64_MAX_PLUS_ONE_AS_F64 {
        return i64::MAX;
    }
    // `as` truncates toward zero and saturates below -2^63.
    d as i64
}

/// `safeNumberLong` of a decimal: NaN → 0; clamped to the i64 range; else rounded to the
/// nearest integer, ties to even (`Decimal128::toLong`'s default rounding).
fn decimal_for_hash(d: &bson::Decimal128) -> i64 {
    let v = u128::from_le_bytes(d.bytes());
    let negative = (v >> 127) & 1 == 1;
    let high = (v >> 64) as u64;
    match (high >> 58) & 0x1f {
        0x1f => return 0,
        0x1e => return if negative { i64::MIN } else { i64::MAX },
        _ => {}
    }
    // Combination bits "11": a coefficient above 10^34, non-canonical, which reads as zero.
    if (high >> 61) & 0x3 == 0x3 {
        return 0;
    }
    let exponent = ((high >> 49) & 0x3fff) as i32 - 6176;
    let coefficient = v & ((1u128 << 113) - 1);
    if coefficient == 0 || coefficient >= 10u128.pow(34) {
        return 0;
    }
    // Magnitude rounded to an integer, None when it certainly exceeds 2^63.
    let magnitude: Option<u128> = if exponent >= 0 {
        if exponent > 19 {
            None
        } else {
            coefficient.checked_mul(10u128.pow(exponent as u32))
        }
    } else if -exponent > 38 {
        Some(0)
    } else {
        let p = 10u128.pow((-exponent) as u32);
        let (q, r) = (coefficient / p, coefficient % p);
        // 2r compared with p without overflow: r < p <= 10^38 < 2^127.
        let twice_r = r * 2;
        Some(if twice_r > p || (twice_r == p && q % 2 == 1) { q + 1 } else { q })
    };
    match (magnitude, negative) {
        (Some(m), false) if m <= i64::MAX as u128 => m as i64,
        (Some(m), true) if m <= 1u128 << 63 => (m as i128).wrapping_neg() as i64,
        (_, false) => i64::MAX,
        (_, true) => i64::MIN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{bson, doc, Decimal128};
    use std::str::FromStr;

    fn dec(s: &str) -> Bson {
        Bson::Decimal128(Decimal128::from_str(s).unwrap())
    }

    #[test]
    fn mongodb_test_vector() {
        // hasher.cpp's startup check: hash64 of the element {check: 42}.
        assert_eq!(hashed_value(&Bson::Int32(42)).unwrap(), -944302157085130861);
    }

    #[test]
    fn numbers_squash_to_int64() {
        let h = hash_bson(&Bson::Int32(42));
        assert_eq!(hash_bson(&Bson::Int64(42)), h);
        assert_eq!(hash_bson(&Bson::Double(42.0)), h);
        assert_eq!(hash_bson(&Bson::Double(42.9)), h);
        assert_eq!(hash_bson(&dec("42")), h);
        assert_eq!(hash_bson(&dec("42.4")), h);
        assert_eq!(hash_bson(&dec("4.2E+1")), h);
        // Decimals round ties to even; doubles truncate.
        assert_eq!(hash_bson(&dec("42.5")), h);
        assert_eq!(hash_bson(&dec("41.5")), h);
        assert_eq!(hash_bson(&dec("43.5")), hash_bson(&Bson::Int32(44)));
        assert_eq!(hash_bson(&Bson::Double(-2.9)), hash_bson(&Bson::Int32(-2)));
        assert_ne!(hash_bson(&Bson::Int32(43)), h);
        // NaN hashes as 0; 2^63 keeps its legacy -2^63; larger values clamp.
        assert_eq!(hash_bson(&Bson::Double(f64::NAN)), hash_bson(&Bson::Int32(0)));
        assert_eq!(hash_bson(&dec("NaN")), hash_bson(&Bson::Int32(0)));
        assert_eq!(hash_bson(&Bson::Double(9_223_372_036_854_775_808.0)), hash_bson(&Bson::Int64(i64::MIN)));
        assert_eq!(hash_bson(&Bson::Double(1e19)), hash_bson(&Bson::Int64(i64::MAX)));
        assert_eq!(hash_bson(&Bson::Double(f64::INFINITY)), hash_bson(&Bson::Int64(i64::MAX)));
        assert_eq!(hash_bson(&Bson::Double(f64::NEG_INFINITY)), hash_bson(&Bson::Int64(i64::MIN)));
        assert_eq!(hash_bson(&Bson::Double(-1e30)), hash_bson(&Bson::Int64(i64::MIN)));
        assert_eq!(hash_bson(&dec("1E+30")), hash_bson(&Bson::Int64(i64::MAX)));
        assert_eq!(hash_bson(&dec("-Infinity")), hash_bson(&Bson::Int64(i64::MIN)));
        assert_eq!(hash_bson(&dec("-9223372036854775808")), hash_bson(&Bson::Int64(i64::MIN)));
        assert_eq!(hash_bson(&dec("1E-40")), hash_bson(&Bson::Int32(0)));
    }

    #[test]
    fn layout_matches_hand_built_md5() {
        // "ab": seed, canonical type 15, i32 length 3, bytes, NUL.
        let mut m = Md5::new();
        m.update(0i32.to_le_bytes());
        m.update(15i32.to_le_bytes());
        m.update(3i32.to_le_bytes());
        m.update(b"ab\0");
        let d = m.finalize();
        assert_eq!(hash_bson(&Bson::String("ab".into())), i64::from_le_bytes(d[..8].try_into().unwrap()));
        // {x: 1}: type 20, then element (10, "x\0", 1i64), then EOO (0).
        let mut m = Md5::new();
        m.update(0i32.to_le_bytes());
        m.update(20i32.to_le_bytes());
        m.update(10i32.to_le_bytes());
        m.update(b"x\0");
        m.update(1i64.to_le_bytes());
        m.update(0i32.to_le_bytes());
        let d = m.finalize();
        assert_eq!(hash_bson(&bson!({"x": 1.5})), i64::from_le_bytes(d[..8].try_into().unwrap()));
        // Null: only its canonical type; MinKey's is -1.
        let mut m = Md5::new();
        m.update(0i32.to_le_bytes());
        m.update(5i32.to_le_bytes());
        assert_eq!(hash_bson(&Bson::Null), i64::from_le_bytes(m.finalize()[..8].try_into().unwrap()));
        let mut m = Md5::new();
        m.update(0i32.to_le_bytes());
        m.update((-1i32).to_le_bytes());
        assert_eq!(hash_bson(&Bson::MinKey), i64::from_le_bytes(m.finalize()[..8].try_into().unwrap()));
    }

    #[test]
    fn types_and_field_names_matter() {
        assert_ne!(hash_bson(&Bson::Null), hash_bson(&Bson::Undefined));
        assert_eq!(hash_bson(&Bson::String("a".into())), hash_bson(&Bson::Symbol("a".into())));
        assert_ne!(hash_bson(&bson!({"a": 1})), hash_bson(&bson!({"b": 1})));
        assert_ne!(hash_bson(&bson!({"a": 1})), hash_bson(&bson!([1])));
        assert_ne!(hash_bson(&bson!({"a": 1, "b": 2})), hash_bson(&bson!({"b": 2, "a": 1})));
        assert_eq!(hash_bson(&bson!({"a": 1})), hash_bson(&Bson::Document(doc! {"a": 1.0})));
        assert!(hashed_value(&bson!([1])).is_err_and(|e| e.code == 16766));
        // Other types hash without panicking and distinctly.
        let vals = [
            Bson::Boolean(true),
            Bson::Boolean(false),
            Bson::ObjectId(bson::oid::ObjectId::from_bytes([1; 12])),
            Bson::DateTime(bson::DateTime::from_millis(5)),
            Bson::Timestamp(bson::Timestamp { time: 1, increment: 2 }),
            Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2] }),
            Bson::RegularExpression(bson::Regex { pattern: "a".to_string().try_into().unwrap(), options: "i".to_string().try_into().unwrap() }),
            Bson::JavaScriptCode("x".into()),
            Bson::MaxKey,
        ];
        let hashes: std::collections::HashSet<i64> = vals.iter().map(hash_bson).collect();
        assert_eq!(hashes.len(), vals.len());
    }
}
