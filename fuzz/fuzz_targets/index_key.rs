//! Any BSON document's values as index key components: the order-preserving encoding
//! orders every pair as `query::compare::cmp_bson` does (ascending and, complemented,
//! descending), no encoding is a proper prefix of another, and two-component keys compare
//! component by component.
#![no_main]

use bson::Document;
use libfuzzer_sys::fuzz_target;
use shoal_query::compare::cmp_bson;
use shoal_storage::keys::encode_component;

fn key(v: &bson::Bson, descending: bool) -> Vec<u8> {
    let mut out = Vec::new();
    encode_component(v, descending, &mut out);
    out
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(doc) = Document::from_reader(bytes) else { return };
    let values: Vec<&bson::Bson> = doc.values().take(8).collect();
    for a in &values {
        for b in &values {
            let order = cmp_bson(a, b);
            let (ka, kb) = (key(a, false), key(b, false));
            assert_eq!(ka.cmp(&kb), order, "ascending keys of {a:?} and {b:?}");
            assert_eq!(key(a, true).cmp(&key(b, true)), order.reverse(), "descending keys of {a:?} and {b:?}");
            if ka != kb {
                assert!(!kb.starts_with(&ka) && !ka.starts_with(&kb), "the key of {a:?} or {b:?} is a prefix of the other's");
            }
            // A compound key (a, b) against (b, a): first components decide unless equal.
            let (mut ab, mut ba) = (ka.clone(), kb.clone());
            ab.extend_from_slice(&kb);
            ba.extend_from_slice(&ka);
            assert_eq!(ab.cmp(&ba), order.then(cmp_bson(b, a)), "compound keys of {a:?} and {b:?}");
        }
    }
});
