//! Any BSON document as a query filter: parsing never panics, and a filter that parses is
//! matched against documents of every shape without a panic. Matching is deterministic,
//! and `matches` agrees with `try_matches`.
#![no_main]

use bson::{doc, Bson, Document};
use libfuzzer_sys::fuzz_target;

fn targets() -> Vec<Document> {
    vec![
        doc! {},
        doc! {"_id": 1, "a": 1, "b": "x", "c": [1, 2, [3]], "d": {"e": null, "f": [{"g": 1}, {"g": "2"}]}},
        doc! {"a": [], "b": Bson::Undefined, "c": {"$x": 1}, "n": f64::NAN, "dec": Bson::Decimal128("1.5".parse().unwrap())},
        doc! {"a": {"b": {"c": {"d": [[{"e": 5}]]}}}, "t": bson::DateTime::from_millis(0), "r": Bson::RegularExpression(bson::Regex { pattern: "^a".try_into().unwrap(), options: "i".try_into().unwrap() })},
    ]
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(filter_doc) = Document::from_reader(bytes) else { return };
    let Ok(filter) = shoal_query::filter::Filter::parse(&filter_doc) else { return };
    for target in targets() {
        let tried = filter.try_matches(&target);
        if let Ok(m) = tried {
            assert_eq!(filter.matches(&target), m);
            assert_eq!(filter.try_matches(&target).ok(), Some(m), "matching is not deterministic");
        }
    }
});
