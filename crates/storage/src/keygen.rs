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

/// The key pattern value of a hashed field.
pub const HASHED: &str = "hashed";

pub fn is_hashed(dir: &Bson) -> bool {
    matches!(dir, Bson::String(s) if s == HASHED)
}

#[derive(Clone, Debug)]
pub struct KeyField {
    pub name: String,
    pub path: Vec<String>,
    pub descending: bool,
    /// Indexed as MongoDB's hash of the value (an Int64 key component).
    pub hashed: bool,
}

pub fn key_fields(pattern: &Document) -> Vec<KeyField> {
    pattern
        .iter()
        .map(|(name, dir)| KeyField {
            name: name.clone(),
            path: name.split('.').map(str::to_string).collect(),
            descending: crate::keys::is_descending(dir),
            hashed: is_hashed(dir),
        })
        .collect()
}

/// The common case without allocation or copies: each field's value when every field
/// resolves to one non-array value (None for a missing field). None (use [`index_keys`])
/// if any field meets an array, or for hashed fields.
pub fn scalar_key_values<'a>(fields: &[KeyField], doc: &'a Document) -> Option<Vec<Option<&'a Bson>>> {
    let mut out = Vec::with_capacity(fields.len());
    'fields: for f in fields {
        if f.hashed {
            return None;
        }
        let mut cur = doc;
        for (i, comp) in f.path.iter().enumerate() {
            match cur.get(comp) {
                None => {
                    out.push(None);
                    continue 'fields;
                }
                Some(Bson::Array(_)) => return None,
                Some(Bson::Document(d)) if i + 1 < f.path.len() => cur = d,
                // A scalar before the end of the path: the field is missing.
                Some(_) if i + 1 < f.path.len() => {
                    out.push(None);
                    continue 'fields;
                }
                Some(v) => {
                    out.push(Some(v));
                    continue 'fields;
                }
            }
        }
        out.push(None);
    }
    Some(out)
}

/// The value at `path` for a hashed index, which allows no array anywhere along the path
/// (error 16766, naming the path up to the array). None if missing.
fn hashed_path_value<'a>(doc: &'a Document, path: &[String]) -> Result<Option<&'a Bson>> {
    let mut cur = doc;
    for (i, comp) in path.iter().enumerate() {
        let Some(v) = cur.get(comp) else { return Ok(None) };
        match v {
            Bson::Array(_) => return Err(crate::hash::array_error(&path[..=i].join("."))),
            Bson::Document(d) if i + 1 < path.len() => cur = d,
            _ if i + 1 < path.len() => return Ok(None),
            _ => return Ok(Some(v)),
        }
    }
    Ok(None)
}

/// The single entry of a document for an index with a hashed field: missing fields index
/// as null (hashed fields as the hash of null); sparse skips documents missing every field.
fn hashed_index_keys(fields: &[KeyField], sparse: bool, doc: &Document) -> Result<(Vec<KeyEntry>, bool)> {
    let mut key = Vec::with_capacity(16 * fields.len());
    let mut values = Vec::with_capacity(fields.len());
    let mut any_present = false;
    for f in fields {
        let v = hashed_path_value(doc, &f.path)?;
        any_present |= v.is_some();
        let v = v.unwrap_or(&Bson::Null);
        let component = if f.hashed { Bson::Int64(crate::hash::hash_bson(v)) } else { v.clone() };
        encode_component(&component, f.descending, &mut key);
        values.push(component);
    }
    if sparse && !any_present {
        return Ok((Vec::new(), false));
    }
    Ok((vec![(key, values)], false))
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
    if fields.iter().any(|f| f.hashed) {
        return hashed_index_keys(fields, sparse, doc);
    }
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
    fn hashed_rules() {
        let h = |v: Bson| Bson::Int64(crate::hash::hash_bson(&v));
        assert_eq!(vals(doc! {"a": "hashed"}, false, doc! {"a": 42}), vec![vec![Bson::Int64(-944302157085130861)]]);
        assert_eq!(vals(doc! {"a": "hashed"}, false, doc! {"b": 1}), vec![vec![h(Bson::Null)]]);
        assert!(vals(doc! {"a": "hashed"}, true, doc! {"b": 1}).is_empty());
        assert_eq!(vals(doc! {"a.b": "hashed"}, false, doc! {"a": {"b": {"c": 1}}}), vec![vec![h(bson::bson!({"c": 1}))]]);
        // A scalar along the path: missing.
        assert_eq!(vals(doc! {"a.b": "hashed"}, false, doc! {"a": 5}), vec![vec![h(Bson::Null)]]);
        // Compound: the other fields keep their values; no field may be an array.
        assert_eq!(vals(doc! {"a": 1, "b": "hashed"}, false, doc! {"a": "x", "b": 2}), vec![vec![Bson::String("x".into()), h(Bson::Int32(2))]]);
        assert_eq!(vals(doc! {"a": 1, "b": "hashed"}, true, doc! {"a": "x"}), vec![vec![Bson::String("x".into()), h(Bson::Null)]]);
        for (pattern, d, path) in [
            (doc! {"a": "hashed"}, doc! {"a": [1]}, "a"),
            (doc! {"a.b": "hashed"}, doc! {"a": [{"b": 1}]}, "a"),
            (doc! {"a.b.c": "hashed"}, doc! {"a": {"b": []}}, "a.b"),
            (doc! {"x": 1, "a": "hashed"}, doc! {"x": [1], "a": 1}, "x"),
        ] {
            let e = index_keys(&key_fields(&pattern), false, &d).unwrap_err();
            assert_eq!(e.code, 16766);
            assert_eq!(e.message, format!("Error: hashed indexes do not currently support array values. Found array at path: {path}"));
        }
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
