//! Any BSON document `{u: <update>, d: <document>, f: [<arrayFilters>]}`: parsing the update
//! never panics, and applying one that parses to the document (as an update and as an
//! upsert's insert) either gives a document or an error, never a panic.
#![no_main]

use bson::{doc, Bson, Document};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(input) = Document::from_reader(bytes) else { return };
    let Some(u) = input.get("u") else { return };
    let filters: Option<Vec<Document>> = match input.get("f") {
        Some(Bson::Array(a)) => Some(a.iter().filter_map(|v| v.as_document().cloned()).collect()),
        _ => None,
    };
    let Ok(update) = shoal_query::update::Update::parse(u, filters.as_deref()) else { return };
    let target = input.get_document("d").cloned().unwrap_or_else(|_| doc! {"_id": 1, "a": [1, {"b": 2}], "c": {"d": "e"}});
    let details = shoal_query::filter::MatchDetails { elem_match_index: input.get_i32("i").ok().and_then(|i| usize::try_from(i).ok()) };
    for is_insert in [false, true] {
        if let Ok(out) = update.apply(&target, &details, is_insert) {
            // Whatever it built must be encodable BSON.
            let _ = out.to_vec();
        }
    }
});
