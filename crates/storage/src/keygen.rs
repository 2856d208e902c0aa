//! Index key generation: which (encoded key, key values) entries a document contributes to
//! an index, following MongoDB's rules: missing fields index as null, arrays are expanded
//! into one key per element (multikey; an empty array indexes as undefined), at most one
//! array may be expanded per document for a compound index unless the fields share it
//! (CannotIndexParallelArrays), sparse indexes skip documents missing every key field.

use crate::keys::encode_component;
use bson::{Bson, Document};
use common::{Code, Error, Result};

/// Bound on the keys one document may generate for one index (compound keys over a shared
/// array multiply); protects memory against pathological documents.
pub const KEYS_PER_DOCUMENT_MAX: usize = 1_000_000;

#[derive(Clone, Debug)]
pub struct KeyField {
    pub name: String,
    pub path: Vec<String>,
    pub descending: bool,
}

pub fn key_fields(pattern: &Document) -> Vec<KeyField> {
    pattern
        .iter()
        .map(|(name, dir)| KeyField {
            name: name.clone(),
            path: name.split('.').map(str::to_string).collect(),
            descending: crate::keys::is_descending(dir),
        })
        .collect()
}

/// One generated entry: the encoded key (without record id) and the key values.
pub type KeyEntry = (Vec<u8>, Vec<Bson>);

struct FieldValues {
    values: Vec<Bson>,
    missing: bool,
    /// Path prefix length at which an array was expanded.
    array_at: Option<usize>,
}

fn walk_doc(doc: &Document, path: &[String], pos: usize, fv: &mut FieldValues) {
    let Some(comp) = path.get(pos) else { return };
    if let Some(v) = doc.get(comp) {
        walk_val(v, path, pos + 1, fv);
    }
}

fn walk_val(v: &Bson, path: &[String], pos: usize, fv: &mut FieldValues) {
    if pos >= path.len() {
        match v {
            Bson::Array(a) => {
                fv.array_at.get_or_insert(pos);
                if a.is_empty() {
                    fv.values.push(Bson::Undefined);
                } else {
                    fv.values.extend(a.iter().cloned());
                }
            }
            _ => fv.values.push(v.clone()),
        }
        return;
    }
    match v {
        Bson::Document(d) => walk_doc(d, path, pos, fv),
        Bson::Array(a) => {
            // A numeric component addresses an array element positionally.
            if let Some(e) = path.get(pos).and_then(|c| c.parse::<usize>().ok()).and_then(|i| a.get(i)) {
                walk_val(e, path, pos + 1, fv);
                return;
            }
            fv.array_at.get_or_insert(pos);
            let before = fv.values.len();
            for e in a {
                if let Bson::Document(d) = e {
                    walk_doc(d, path, pos, fv);
                }
            }
            if fv.values.len() == before {
                fv.values.push(Bson::Null);
            }
        }
        _ => {}
    }
}

/// All entries of `doc` for an index with these fields, sorted by key and deduplicated, and
/// whether an array was expanded (the index becomes multikey).
pub fn index_keys(fields: &[KeyField], sparse: bool, doc: &Document) -> Result<(Vec<KeyEntry>, bool)> {
    let mut per_field: Vec<FieldValues> = Vec::with_capacity(fields.len());
    for f in fields {
        let mut fv = FieldValues { values: Vec::new(), missing: false, array_at: None };
        walk_doc(doc, &f.path, 0, &mut fv);
        if fv.values.is_empty() {
            fv.missing = true;
            fv.values.push(Bson::Null);
        }
        per_field.push(fv);
    }
    if sparse && per_field.iter().all(|f| f.missing) {
        return Ok((Vec::new(), false));
    }
    let multikey = per_field.iter().any(|f| f.array_at.is_some());
    // Arrays expanded in two fields must be the same array (shared path prefix).
    let mut first_array: Option<(usize, usize)> = None;
    for (i, fv) in per_field.iter().enumerate() {
        if let Some(at) = fv.array_at {
            match first_array {
                None => first_array = Some((i, at)),
                Some((j, at_j)) => {
                    if at != at_j || fields[i].path[..at] != fields[j].path[..at_j] {
                        return Err(Error::new(
                            Code::CannotIndexParallelArrays,
                            format!("cannot index parallel arrays [{}] [{}]", fields[i].path[..at].join("."), fields[j].path[..at_j].join(".")),
                        ));
                    }
                }
            }
        }
    }
    let total = per_field.iter().try_fold(1usize, |acc, f| acc.checked_mul(f.values.len()));
    if total.is_none_or(|t| t > KEYS_PER_DOCUMENT_MAX) {
        return Err(Error::new(Code::CannotCreateIndex, format!("document generates more than {KEYS_PER_DOCUMENT_MAX} index keys")));
    }
    // Cartesian product (only more than one combination when fields share an array).
    let mut out: Vec<KeyEntry> = vec![(Vec::new(), Vec::with_capacity(fields.len()))];
    for (f, fv) in fields.iter().zip(per_field) {
        if fv.values.len() == 1 {
            for (key, vals) in &mut out {
                encode_component(&fv.values[0], f.descending, key);
                vals.push(fv.values[0].clone());
            }
            continue;
        }
        let mut next = Vec::with_capacity(out.len() * fv.values.len());
        for (key, vals) in &out {
            for v in &fv.values {
                let mut k = key.clone();
                encode_component(v, f.descending, &mut k);
                let mut vs = vals.clone();
                vs.push(v.clone());
                next.push((k, vs));
            }
        }
        out = next;
    }
    if out.len() > 1 {
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.dedup_by(|a, b| a.0 == b.0);
    }
    Ok((out, multikey))
}

/// `{field: value, ...}` as MongoDB reports keyValue in duplicate key errors.
pub fn key_value_doc(fields: &[KeyField], values: &[Bson]) -> Document {
    let mut d = Document::new();
    for (f, v) in fields.iter().zip(values) {
        d.insert(f.name.clone(), v.clone());
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn vals(pattern: Document, sparse: bool, d: Document) -> Vec<Vec<Bson>> {
        index_keys(&key_fields(&pattern), sparse, &d).unwrap().0.into_iter().map(|(_, v)| v).collect()
    }

    #[test]
    fn single_field_rules() {
        assert_eq!(vals(doc! {"a": 1}, false, doc! {"a": 5}), vec![vec![Bson::Int32(5)]]);
        assert_eq!(vals(doc! {"a": 1}, false, doc! {"b": 5}), vec![vec![Bson::Null]]);
        assert!(vals(doc! {"a": 1}, true, doc! {"b": 5}).is_empty());
        assert_eq!(vals(doc! {"a": 1}, false, doc! {"a": [3, 1, 3]}), vec![vec![Bson::Int32(1)], vec![Bson::Int32(3)]]);
        assert_eq!(vals(doc! {"a": 1}, false, doc! {"a": []}), vec![vec![Bson::Undefined]]);
        assert_eq!(vals(doc! {"a": 1}, false, doc! {"a": [[1]]}), vec![vec![bson::bson!([1])]]);
        assert_eq!(vals(doc! {"a.b": 1}, false, doc! {"a": {"b": 2}}), vec![vec![Bson::Int32(2)]]);
        assert_eq!(vals(doc! {"a.b": 1}, false, doc! {"a": [{"b": 2}, {"b": 1}]}), vec![vec![Bson::Int32(1)], vec![Bson::Int32(2)]]);
        assert_eq!(vals(doc! {"a.b": 1}, false, doc! {"a": [{"c": 2}]}), vec![vec![Bson::Null]]);
        assert_eq!(vals(doc! {"a.1": 1}, false, doc! {"a": [5, 6]}), vec![vec![Bson::Int32(6)]]);
        // 1 and 1.0 are one key.
        assert_eq!(vals(doc! {"a": 1}, false, doc! {"a": [1, 1.0]}).len(), 1);
    }

    #[test]
    fn compound_rules() {
        assert_eq!(vals(doc! {"a": 1, "b": -1}, false, doc! {"a": [1, 2], "b": "x"}).len(), 2);
        let e = index_keys(&key_fields(&doc! {"a": 1, "b": 1}), false, &doc! {"a": [1], "b": [2]}).unwrap_err();
        assert_eq!(e.code, 171);
        assert_eq!(e.message, "cannot index parallel arrays [b] [a]");
        // Fields sharing one array are fine.
        assert_eq!(vals(doc! {"a.x": 1, "a.y": 1}, false, doc! {"a": [{"x": 1, "y": 2}, {"x": 3, "y": 4}]}).len(), 4);
        // Sparse compound: indexed if any field is present.
        assert_eq!(vals(doc! {"a": 1, "b": 1}, true, doc! {"b": 1}), vec![vec![Bson::Null, Bson::Int32(1)]]);
        assert!(vals(doc! {"a": 1, "b": 1}, true, doc! {"c": 1}).is_empty());
    }
}
