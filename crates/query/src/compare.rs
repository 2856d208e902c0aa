//! MongoDB's total order over BSON values (BSONElement::woCompare / compareElementValues).

use crate::decimal::Dec;
use bson::{Bson, Document};
use std::cmp::Ordering;

/// MongoDB canonical type order (canonicalizeBSONType), compressed into consecutive ranks.
pub fn canonical_rank(v: &Bson) -> u8 {
    match v {
        Bson::MinKey => 0,
        Bson::Undefined => 1,
        Bson::Null => 2,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 3,
        Bson::String(_) | Bson::Symbol(_) => 4,
        Bson::Document(_) => 5,
        Bson::Array(_) => 6,
        Bson::Binary(_) => 7,
        Bson::ObjectId(_) => 8,
        Bson::Boolean(_) => 9,
        Bson::DateTime(_) => 10,
        Bson::Timestamp(_) => 11,
        Bson::RegularExpression(_) => 12,
        Bson::DbPointer(_) => 13,
        Bson::JavaScriptCode(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::MaxKey => 16,
    }
}

/// Rank of a numeric type for choosing result types: int < long < double < decimal.
pub(crate) fn is_number(v: &Bson) -> bool {
    matches!(v, Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_))
}

/// Exact comparison of i64 with f64 (NaN sorts lowest).
pub(crate) fn cmp_i64_f64(i: i64, d: f64) -> Ordering {
    if d.is_nan() {
        return Ordering::Greater;
    }
    // 2^63 as f64 is exact; every i64 is below it.
    if d >= 9_223_372_036_854_775_808.0 {
        return Ordering::Less;
    }
    if d < -9_223_372_036_854_775_808.0 {
        return Ordering::Greater;
    }
    let t = d.trunc();
    let ti = t as i64;
    match i.cmp(&ti) {
        Ordering::Equal => {
            let frac = d - t;
            if frac > 0.0 {
                Ordering::Less
            } else if frac < 0.0 {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        }
        o => o,
    }
}

fn cmp_f64(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        // -0 == 0 under partial_cmp.
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Compare two numeric values exactly across int32/int64/double/decimal128.
pub(crate) fn cmp_numbers(a: &Bson, b: &Bson) -> Ordering {
    use Bson::*;
    match (a, b) {
        (Int32(x), Int32(y)) => x.cmp(y),
        (Int32(x), Int64(y)) => (*x as i64).cmp(y),
        (Int64(x), Int32(y)) => x.cmp(&(*y as i64)),
        (Int64(x), Int64(y)) => x.cmp(y),
        (Double(x), Double(y)) => cmp_f64(*x, *y),
        (Int32(x), Double(y)) => cmp_i64_f64(*x as i64, *y),
        (Int64(x), Double(y)) => cmp_i64_f64(*x, *y),
        (Double(x), Int32(y)) => cmp_i64_f64(*y as i64, *x).reverse(),
        (Double(x), Int64(y)) => cmp_i64_f64(*y, *x).reverse(),
        (Decimal128(x), Decimal128(y)) => Dec::decode(x).cmp(Dec::decode(y)),
        (Decimal128(x), Int32(y)) => Dec::decode(x).cmp(Dec::from_i64(*y as i64)),
        (Decimal128(x), Int64(y)) => Dec::decode(x).cmp(Dec::from_i64(*y)),
        (Decimal128(x), Double(y)) => Dec::decode(x).cmp_f64(*y),
        (Int32(_) | Int64(_) | Double(_), Decimal128(_)) => cmp_numbers(b, a).reverse(),
        _ => Ordering::Equal,
    }
}

/// Total order used by sort and comparison operators.
pub fn cmp_bson(a: &Bson, b: &Bson) -> Ordering {
    let (ra, rb) = (canonical_rank(a), canonical_rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    use Bson::*;
    match (a, b) {
        (MinKey, _) | (MaxKey, _) | (Null, _) | (Undefined, _) => Ordering::Equal,
        _ if ra == 3 => cmp_numbers(a, b),
        _ if ra == 4 => str_of(a).as_bytes().cmp(str_of(b).as_bytes()),
        (Document(x), Document(y)) => cmp_docs(x, y),
        (Array(x), Array(y)) => cmp_arrays(x, y),
        (Binary(x), Binary(y)) => {
            x.bytes.len().cmp(&y.bytes.len()).then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype))).then_with(|| x.bytes.cmp(&y.bytes))
        }
        (ObjectId(x), ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Boolean(x), Boolean(y)) => x.cmp(y),
        (DateTime(x), DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Timestamp(x), Timestamp(y)) => (x.time, x.increment).cmp(&(y.time, y.increment)),
        (RegularExpression(x), RegularExpression(y)) => {
            x.pattern.as_str().as_bytes().cmp(y.pattern.as_str().as_bytes()).then_with(|| x.options.as_str().as_bytes().cmp(y.options.as_str().as_bytes()))
        }
        // bson keeps DbPointer's fields private; its Debug rendering orders namespace then id.
        (DbPointer(x), DbPointer(y)) => format!("{x:?}").cmp(&format!("{y:?}")),
        (JavaScriptCode(x), JavaScriptCode(y)) => x.as_bytes().cmp(y.as_bytes()),
        (JavaScriptCodeWithScope(x), JavaScriptCodeWithScope(y)) => x.code.as_bytes().cmp(y.code.as_bytes()).then_with(|| cmp_docs(&x.scope, &y.scope)),
        _ => Ordering::Equal,
    }
}

fn str_of(v: &Bson) -> &str {
    match v {
        Bson::String(s) | Bson::Symbol(s) => s,
        _ => "",
    }
}

fn cmp_arrays(x: &[Bson], y: &[Bson]) -> Ordering {
    for (a, b) in x.iter().zip(y.iter()) {
        let o = canonical_rank(a).cmp(&canonical_rank(b)).then_with(|| cmp_bson(a, b));
        if o != Ordering::Equal {
            return o;
        }
    }
    x.len().cmp(&y.len())
}

/// Documents compare field by field: type rank, then field name, then value; shorter is less.
pub fn cmp_docs(a: &Document, b: &Document) -> Ordering {
    let mut ia = a.iter();
    let mut ib = b.iter();
    loop {
        match (ia.next(), ib.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((ka, va)), Some((kb, vb))) => {
                let o = canonical_rank(va).cmp(&canonical_rank(vb)).then_with(|| ka.as_bytes().cmp(kb.as_bytes())).then_with(|| cmp_bson(va, vb));
                if o != Ordering::Equal {
                    return o;
                }
            }
        }
    }
}

/// Equality as MongoDB's $eq (1 == 1.0 == Decimal("1")).
pub fn bson_eq(a: &Bson, b: &Bson) -> bool {
    cmp_bson(a, b) == Ordering::Equal
}

/// Compare optional values where `None` (missing) sorts with Undefined, below null, as
/// MongoDB's Value comparison does for EOO.
pub fn cmp_opt(a: Option<&Bson>, b: Option<&Bson>) -> Ordering {
    const MISSING: Bson = Bson::Undefined;
    cmp_bson(a.unwrap_or(&MISSING), b.unwrap_or(&MISSING))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId, Binary, Decimal128};
    use proptest::prelude::*;

    fn dec(s: &str) -> Bson {
        Bson::Decimal128(s.parse::<Decimal128>().unwrap())
    }

    #[test]
    fn type_order_matches_mongodb() {
        let ordered = vec![
            Bson::MinKey,
            Bson::Null,
            Bson::Int32(1),
            Bson::String("a".into()),
            Bson::Document(doc! {}),
            Bson::Array(vec![]),
            Bson::Binary(Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![] }),
            Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bson::Boolean(false),
            Bson::DateTime(bson::DateTime::from_millis(0)),
            Bson::Timestamp(bson::Timestamp { time: 0, increment: 0 }),
            Bson::RegularExpression(bson::Regex { pattern: "a".try_into().unwrap(), options: "".try_into().unwrap() }),
            Bson::JavaScriptCode("x".into()),
            Bson::MaxKey,
        ];
        for w in ordered.windows(2) {
            assert_eq!(cmp_bson(&w[0], &w[1]), Ordering::Less, "{:?} < {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(bson_eq(&Bson::Int32(1), &Bson::Double(1.0)));
        assert!(bson_eq(&Bson::Int64(1), &dec("1.0")));
        assert!(bson_eq(&Bson::Double(-0.0), &Bson::Int32(0)));
        assert_eq!(cmp_bson(&Bson::Double(f64::NAN), &Bson::Double(f64::NEG_INFINITY)), Ordering::Less);
        assert!(bson_eq(&Bson::Double(f64::NAN), &dec("NaN")));
        assert_eq!(cmp_bson(&Bson::Int64(i64::MAX), &Bson::Double(i64::MAX as f64)), Ordering::Less);
        assert_eq!(cmp_bson(&Bson::Int64(9007199254740993), &Bson::Double(9007199254740992.0)), Ordering::Greater);
        assert_eq!(cmp_bson(&Bson::Double(1.5), &Bson::Int32(1)), Ordering::Greater);
        assert_eq!(cmp_bson(&dec("2.5"), &Bson::Int32(3)), Ordering::Less);
    }

    #[test]
    fn strings_docs_arrays_bindata() {
        assert_eq!(cmp_bson(&Bson::String("B".into()), &Bson::String("a".into())), Ordering::Less);
        assert_eq!(cmp_bson(&Bson::String("a".into()), &Bson::String("ab".into())), Ordering::Less);
        assert_eq!(cmp_docs(&doc! {"a": 1}, &doc! {"a": 1, "b": 1}), Ordering::Less);
        assert_eq!(cmp_docs(&doc! {"a": 2}, &doc! {"b": 1}), Ordering::Less);
        // Type rank of the value dominates the field name.
        assert_eq!(cmp_docs(&doc! {"b": 1}, &doc! {"a": "x"}), Ordering::Less);
        assert_eq!(cmp_bson(&bson::bson!([1, 2]), &bson::bson!([1, 3])), Ordering::Less);
        assert_eq!(cmp_bson(&bson::bson!([1, 2]), &bson::bson!([1])), Ordering::Greater);
        let bin = |st: u8, b: Vec<u8>| Bson::Binary(Binary { subtype: st.into(), bytes: b });
        assert_eq!(cmp_bson(&bin(0, vec![9]), &bin(0, vec![0, 0])), Ordering::Less);
        assert_eq!(cmp_bson(&bin(5, vec![0]), &bin(0, vec![9])), Ordering::Greater);
    }

    fn arb_leaf() -> impl Strategy<Value = Bson> {
        prop_oneof![
            Just(Bson::Null),
            Just(Bson::MinKey),
            Just(Bson::MaxKey),
            Just(Bson::Undefined),
            any::<i32>().prop_map(|v| Bson::Int32(v % 5)),
            any::<i64>().prop_map(Bson::Int64),
            (-5i64..5).prop_map(Bson::Int64),
            any::<f64>().prop_map(Bson::Double),
            (-10i32..10).prop_map(|v| Bson::Double(v as f64 / 2.0)),
            (-50i64..50, -3i32..3).prop_map(|(c, e)| dec(&format!("{c}E{e}"))),
            Just(dec("NaN")),
            Just(dec("-Infinity")),
            "[a-c]{0,3}".prop_map(Bson::String),
            any::<bool>().prop_map(Bson::Boolean),
            (-3i64..3).prop_map(|m| Bson::DateTime(bson::DateTime::from_millis(m))),
        ]
    }

    fn arb_bson() -> impl Strategy<Value = Bson> {
        arb_leaf().prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Bson::Array),
                prop::collection::vec(("[ab]", inner), 0..3).prop_map(|kv| {
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
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn cmp_is_a_total_order(a in arb_bson(), b in arb_bson(), c in arb_bson()) {
            prop_assert_eq!(cmp_bson(&a, &a), Ordering::Equal);
            prop_assert_eq!(cmp_bson(&a, &b), cmp_bson(&b, &a).reverse());
            if cmp_bson(&a, &b) != Ordering::Greater && cmp_bson(&b, &c) != Ordering::Greater {
                prop_assert_ne!(cmp_bson(&a, &c), Ordering::Greater, "{:?} {:?} {:?}", a, b, c);
            }
            if cmp_bson(&a, &b) == Ordering::Equal && cmp_bson(&b, &c) == Ordering::Equal {
                prop_assert_eq!(cmp_bson(&a, &c), Ordering::Equal);
            }
        }
    }
}
