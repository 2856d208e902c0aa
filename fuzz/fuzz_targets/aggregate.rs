//! Any BSON document `{p: [<stages>], in: [<documents>]}`: parsing the pipeline never
//! panics, and running one that parses over a few documents gives documents or an error,
//! within the default memory limit.
#![no_main]

use bson::{doc, Bson, Document};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(input) = Document::from_reader(bytes) else { return };
    let Ok(stages) = input.get_array("p") else { return };
    let stages: Vec<Document> = stages.iter().filter_map(|s| s.as_document().cloned()).collect();
    let Ok(pipeline) = shoal_query::agg::Pipeline::parse(&stages) else { return };
    let docs: Vec<Document> = match input.get("in") {
        Some(Bson::Array(a)) => a.iter().filter_map(|v| v.as_document().cloned()).collect(),
        _ => vec![doc! {"_id": 1, "a": 1, "b": [1, 2]}, doc! {"_id": 2, "a": "x", "c": {"d": 1}}, doc! {"_id": 3}],
    };
    let mut it = docs.into_iter().map(Ok);
    let _ = pipeline.run(&mut it, &shoal_query::agg::RunOptions::default());
});
