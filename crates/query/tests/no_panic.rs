//! Whatever a client sends, parsing and evaluating must return Ok or Err, never panic.

use bson::{Bson, Document};
use proptest::prelude::*;
use shoal_query::agg::{Pipeline, RunOptions};
use shoal_query::expr::Expr;
use shoal_query::filter::{Filter, MatchDetails};
use shoal_query::projection::Projection;
use shoal_query::sort::SortSpec;
use shoal_query::update::{upsert_seed, Update};

const NAMES: &[&str] = &[
    "a",
    "b",
    "a.b",
    "a.0",
    "a.$",
    "a.$[]",
    "a.$[x]",
    "_id",
    "$a",
    "$a.b",
    "$$ROOT",
    "$$x",
    "x",
    "0",
    "",
    "$and",
    "$or",
    "$nor",
    "$not",
    "$eq",
    "$ne",
    "$gt",
    "$gte",
    "$lt",
    "$lte",
    "$in",
    "$nin",
    "$exists",
    "$type",
    "$regex",
    "$options",
    "$mod",
    "$all",
    "$elemMatch",
    "$size",
    "$expr",
    "$bitsAllSet",
    "$set",
    "$unset",
    "$inc",
    "$mul",
    "$push",
    "$each",
    "$slice",
    "$sort",
    "$position",
    "$pull",
    "$addToSet",
    "$pop",
    "$rename",
    "$bit",
    "$min",
    "$max",
    "$currentDate",
    "$add",
    "$subtract",
    "$divide",
    "$mod",
    "$concat",
    "$substrBytes",
    "$substrCP",
    "$arrayElemAt",
    "$range",
    "$map",
    "$filter",
    "$reduce",
    "$let",
    "$cond",
    "$switch",
    "$toInt",
    "$toDecimal",
    "$convert",
    "$dateToString",
    "$round",
    "$pow",
    "$split",
    "$indexOfBytes",
    "$trim",
    "$regexMatch",
    "$slice",
    "$arrayToObject",
    "$setUnion",
    "$sum",
    "$avg",
    "$year",
    "input",
    "as",
    "in",
    "cond",
    "vars",
    "to",
    "date",
    "format",
    "branches",
    "case",
    "then",
    "default",
    "$match",
    "$group",
    "$project",
    "$unwind",
    "$limit",
    "$skip",
    "$count",
    "$bucket",
    "$facet",
    "$replaceRoot",
    "$sortByCount",
    "$addFields",
    "groupBy",
    "boundaries",
    "path",
    "newRoot",
    "$literal",
    "$getField",
    "$setField",
    "field",
    "value",
];

fn name() -> impl Strategy<Value = String> {
    prop::sample::select(NAMES).prop_map(str::to_string)
}

fn leaf() -> impl Strategy<Value = Bson> {
    prop_oneof![
        Just(Bson::Null),
        any::<i32>().prop_map(|v| Bson::Int32(v % 7)),
        any::<i32>().prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        any::<f64>().prop_map(Bson::Double),
        Just(Bson::Double(1e300)),
        Just(Bson::Decimal128("1E+6000".parse().unwrap())),
        Just(Bson::Decimal128("-0.000001".parse().unwrap())),
        any::<bool>().prop_map(Bson::Boolean),
        name().prop_map(Bson::String),
        "[a-z\\-é]{0,4}".prop_map(Bson::String),
        (-5i64..5).prop_map(|m| Bson::DateTime(bson::DateTime::from_millis(m * 86_400_000_000))),
        Just(Bson::MinKey),
        Just(Bson::MaxKey),
        Just(Bson::Undefined),
    ]
}

fn value() -> impl Strategy<Value = Bson> {
    leaf().prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
            prop::collection::vec((name(), inner), 0..4).prop_map(|kv| {
                let mut d = Document::new();
                for (k, v) in kv {
                    d.insert(k, v);
                }
                Bson::Document(d)
            }),
        ]
    })
}

fn document() -> impl Strategy<Value = Document> {
    prop::collection::vec((name(), value()), 0..4).prop_map(|kv| {
        let mut d = Document::new();
        for (k, v) in kv {
            d.insert(k, v);
        }
        d
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn nothing_panics(spec in document(), target in document(), e in value()) {
        if let Ok(f) = Filter::parse(&spec) {
            let _ = f.try_matches_details(&target);
        }
        if let Ok(x) = Expr::parse(&e) {
            let _ = x.eval(&target);
        }
        if let Ok(x) = Expr::parse(&Bson::Document(spec.clone())) {
            let _ = x.eval(&target);
        }
        if let Ok(p) = Projection::parse(&spec) {
            let _ = p.apply(&target, &MatchDetails { elem_match_index: Some(1) });
        }
        if let Ok(s) = SortSpec::parse(&spec) {
            let _ = s.compare(&target, &spec);
        }
        let filters = [target.clone()];
        if let Ok(u) = Update::parse(&Bson::Document(spec.clone()), Some(&filters)) {
            let _ = u.apply(&target, &MatchDetails { elem_match_index: Some(0) }, true);
        }
        if let Ok(u) = Update::parse(&Bson::Document(spec.clone()), None) {
            let _ = u.apply(&target, &MatchDetails::default(), false);
        }
        let _ = upsert_seed(&spec);
        if let Ok(p) = Pipeline::parse(std::slice::from_ref(&spec)) {
            let mut input = vec![Ok(target.clone()), Ok(spec.clone())].into_iter();
            let _ = p.run(&mut input, &RunOptions::default());
        }
    }
}

fn op_name() -> impl Strategy<Value = String> {
    name().prop_filter("operators", |n| n.starts_with('$') && !n.starts_with("$$"))
}

/// {op: arg} shapes, nested, so parsers get past their first checks.
fn op_value() -> impl Strategy<Value = Bson> {
    value().prop_recursive(3, 24, 3, |inner| {
        prop_oneof![
            (op_name(), inner.clone()).prop_map(|(o, v)| {
                let mut d = Document::new();
                d.insert(o, v);
                Bson::Document(d)
            }),
            (op_name(), prop::collection::vec(inner.clone(), 0..4)).prop_map(|(o, v)| {
                let mut d = Document::new();
                d.insert(o, Bson::Array(v));
                Bson::Document(d)
            }),
            (name(), inner).prop_map(|(k, v)| {
                let mut d = Document::new();
                d.insert(k, v);
                Bson::Document(d)
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn structured_inputs_never_panic(field in name(), op in op_name(), arg in op_value(), target in document()) {
        let mut inner = Document::new();
        inner.insert(op.clone(), arg.clone());
        let mut spec = Document::new();
        spec.insert(field.clone(), Bson::Document(inner.clone()));
        if let Ok(f) = Filter::parse(&spec) {
            let _ = f.try_matches_details(&target);
        }
        let mut upd = Document::new();
        let mut fields = Document::new();
        fields.insert(field.clone(), arg.clone());
        upd.insert(op.clone(), fields);
        if let Ok(u) = Update::parse(&Bson::Document(upd), None) {
            let _ = u.apply(&target, &MatchDetails { elem_match_index: Some(0) }, true);
        }
        if let Ok(x) = Expr::parse(&Bson::Document(inner.clone())) {
            let _ = x.eval(&target);
        }
        if let Ok(p) = Projection::parse(&spec) {
            let _ = p.apply(&target, &MatchDetails::default());
        }
        if let Ok(p) = Pipeline::parse(&[inner]) {
            let mut input = vec![Ok(target.clone())].into_iter();
            let _ = p.run(&mut input, &RunOptions::default());
        }
    }
}
