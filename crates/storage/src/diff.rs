//! An update's change as mongod 5.0+ logs it in the oplog (`{$v: 2, diff: …}`): the delta
//! between a document's old and new versions, and its application.
//!
//! A document diff has up to four kinds of fields, in this order: `d` (fields removed,
//! `{name: false}`), `u` (fields whose value is replaced in place, `{name: value}`), `i`
//! (fields appended at the end, `{name: value}`) and `s<name>` (a field changed inside it:
//! a document diff, or an array diff). An array diff has `a: true`, then `l` (the new
//! length, when the array got shorter), then `u<index>` (an element's new value) and
//! `s<index>` (an element changed inside), in index order.
//!
//! Applying a diff is idempotent, as oplog application needs: every part sets a final
//! value. A diff applies to the document it was computed from, whose field order it keeps;
//! a field the old version had out of the new version's order is appended again (`i`).

use bson::{Bson, Document};
use common::{Code, Error, Result};

/// Nesting limit of a diff applied (from a sync source or applyOps): BSON's own depth.
const DIFF_DEPTH_MAX: usize = 200;

/// The diff that turns `old` into `new` (both with the same `_id`). Empty when they are the
/// same, field order included. `by_path` describes a document changed inside by the paths
/// of what changed in it, as an update by operators (`$set: {"a.b": 1}`) names them, even
/// where the whole new value would be smaller, and an array so when that costs little more
/// (`$push`); otherwise such a value is described by its diff only when that is the smaller.
/// The diff comes from the two versions, not from the operators: a `$set` of a whole
/// subdocument over one of the same fields is described field by field, where mongod logs
/// the whole value.
pub fn compute(old: &Document, new: &Document, by_path: bool) -> Document {
    object_diff(old, new, by_path)
}

/// `doc` with `diff` applied.
pub fn apply(doc: &Document, diff: &Document) -> Result<Document> {
    apply_object(doc, diff, 0)
}

/// Whether an update entry's `o` is a diff (`{$v: 2, diff: {…}}`), and the diff.
pub fn of_update_entry(o: &Document) -> Option<&Document> {
    match o.get("$v") {
        Some(Bson::Int32(2) | Bson::Int64(2)) => o.get_document("diff").ok(),
        Some(Bson::Double(v)) if *v == 2.0 => o.get_document("diff").ok(),
        _ => None,
    }
}

/// The same value, field order and numeric types included (`Document`'s own equality
/// ignores field order).
pub fn same_value(a: &Bson, b: &Bson) -> bool {
    match (a, b) {
        (Bson::Document(a), Bson::Document(b)) => same_document(a, b),
        (Bson::Array(a), Bson::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_value(x, y)),
        _ => a == b,
    }
}

pub fn same_document(a: &Document, b: &Document) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && same_value(va, vb))
}

fn object_diff(old: &Document, new: &Document, by_path: bool) -> Document {
    let mut deletes = Document::new();
    let mut updates = Document::new();
    let mut inserts = Document::new();
    let mut subs = Document::new();
    for k in old.keys() {
        if !new.contains_key(k) {
            deletes.insert(k.clone(), false);
        }
    }
    // The old fields that stay, in their order: the new version keeps them in place up to
    // its first field out of that order; that field and every one after it are appended.
    let mut kept = old.keys().filter(|k| new.contains_key(k.as_str()));
    let mut in_place = true;
    for (k, v) in new {
        if in_place {
            match kept.next() {
                Some(o) if o == k => {
                    let ov = &old[k.as_str()];
                    if !same_value(ov, v) {
                        match value_diff(ov, v, by_path) {
                            Some(sub) => {
                                subs.insert(format!("s{k}"), sub);
                            }
                            None => {
                                updates.insert(k.clone(), v.clone());
                            }
                        }
                    }
                    continue;
                }
                _ => in_place = false,
            }
        }
        inserts.insert(k.clone(), v.clone());
    }
    let mut diff = Document::new();
    for (name, part) in [("d", deletes), ("u", updates), ("i", inserts)] {
        if !part.is_empty() {
            diff.insert(name, part);
        }
    }
    diff.extend(subs);
    diff
}

/// A diff of `old` into `new` when both are documents or both arrays and the diff is
/// smaller than `new` (otherwise the whole new value is logged). With `by_path` a document's
/// diff is taken whatever its size (it names at most each field once), and an array's when
/// it is at most ARRAY_DIFF_SLACK_BYTES larger: an element removed near the front shifts
/// every one after it, which the whole array says in fewer bytes, as mongod logs `$pull`.
fn value_diff(old: &Bson, new: &Bson, by_path: bool) -> Option<Bson> {
    let (diff, slack) = match (old, new) {
        (Bson::Document(o), Bson::Document(n)) if by_path => return Some(Bson::Document(object_diff(o, n, by_path))),
        (Bson::Document(o), Bson::Document(n)) => (object_diff(o, n, by_path), 0),
        (Bson::Array(o), Bson::Array(n)) => (array_diff(o, n, by_path), if by_path { ARRAY_DIFF_SLACK_BYTES } else { 0 }),
        _ => return None,
    };
    (encoded_size(&Bson::Document(diff.clone())) < encoded_size(new) + slack).then_some(Bson::Document(diff))
}

/// How much larger than the array an array's diff by path may be (`value_diff`).
const ARRAY_DIFF_SLACK_BYTES: usize = 32;

fn array_diff(old: &[Bson], new: &[Bson], by_path: bool) -> Document {
    let mut diff = Document::new();
    diff.insert("a", true);
    if new.len() < old.len() {
        diff.insert("l", new.len() as i32);
    }
    for (i, v) in new.iter().enumerate() {
        match old.get(i) {
            Some(ov) if same_value(ov, v) => {}
            Some(ov) => match value_diff(ov, v, by_path) {
                Some(sub) => {
                    diff.insert(format!("s{i}"), sub);
                }
                None => {
                    diff.insert(format!("u{i}"), v.clone());
                }
            },
            None => {
                diff.insert(format!("u{i}"), v.clone());
            }
        }
    }
    diff
}

/// Bytes of `v` as a field value (an estimate is enough for choosing a diff or the whole).
fn encoded_size(v: &Bson) -> usize {
    match v {
        Bson::Document(d) => 5 + d.iter().map(|(k, v)| 2 + k.len() + encoded_size(v)).sum::<usize>(),
        Bson::Array(a) => 5 + a.iter().enumerate().map(|(i, v)| 2 + digits(i) + encoded_size(v)).sum::<usize>(),
        Bson::String(s) => 5 + s.len(),
        Bson::Int32(_) => 4,
        Bson::Boolean(_) => 1,
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => 0,
        Bson::Binary(b) => 5 + b.bytes.len(),
        Bson::Decimal128(_) => 16,
        Bson::ObjectId(_) => 12,
        Bson::RegularExpression(r) => 2 + r.pattern.len() + r.options.len(),
        Bson::JavaScriptCode(c) => 5 + c.len(),
        Bson::JavaScriptCodeWithScope(c) => 9 + c.code.len() + encoded_size(&Bson::Document(c.scope.clone())),
        Bson::Symbol(s) => 5 + s.len(),
        Bson::DbPointer(_) => 29,
        _ => 8,
    }
}

fn digits(i: usize) -> usize {
    i.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::new(Code::FailedToParse, format!("invalid update diff: {what}"))
}

fn apply_object(doc: &Document, diff: &Document, depth: usize) -> Result<Document> {
    if depth > DIFF_DEPTH_MAX {
        return Err(bad(format!("nested deeper than {DIFF_DEPTH_MAX}")));
    }
    let section = |name: &str| -> Result<Option<&Document>> {
        match diff.get(name) {
            None => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d)),
            Some(_) => Err(bad(format!("'{name}' is not an object"))),
        }
    };
    let (deletes, updates, inserts) = (section("d")?, section("u")?, section("i")?);
    for k in diff.keys() {
        if !matches!(k.as_str(), "d" | "u" | "i") && !k.starts_with('s') {
            return Err(bad(format!("unknown field '{k}'")));
        }
    }
    let has = |part: Option<&Document>, k: &str| part.is_some_and(|p| p.contains_key(k));
    let mut out = Document::new();
    for (k, v) in doc {
        if has(deletes, k) || has(inserts, k) {
            continue;
        }
        if let Some(nv) = updates.and_then(|u| u.get(k)) {
            out.insert(k.clone(), nv.clone());
            continue;
        }
        match diff.get(format!("s{k}")) {
            Some(Bson::Document(sub)) => {
                out.insert(k.clone(), apply_value(v, sub, depth + 1)?);
            }
            Some(_) => return Err(bad(format!("'s{k}' is not an object"))),
            None => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    // An update of a field the document lacks appends it, as an insert does: applying a
    // diff again after a later change removed the field must not fail.
    for (k, v) in updates.into_iter().flatten() {
        if !doc.contains_key(k) && !has(inserts, k) {
            out.insert(k.clone(), v.clone());
        }
    }
    for (k, v) in inserts.into_iter().flatten() {
        out.insert(k.clone(), v.clone());
    }
    Ok(out)
}

/// A sub-diff applied to the value it names: an array diff (`a: true`) to an array, a
/// document diff to a document. A value of another type is left as it is (a later entry
/// changed it, and applying the diff again must not fail).
fn apply_value(v: &Bson, sub: &Document, depth: usize) -> Result<Bson> {
    let is_array_diff = matches!(sub.get("a"), Some(Bson::Boolean(true)));
    match v {
        Bson::Array(a) if is_array_diff => apply_array(a, sub, depth).map(Bson::Array),
        Bson::Document(d) if !is_array_diff => apply_object(d, sub, depth).map(Bson::Document),
        _ => Ok(v.clone()),
    }
}

fn apply_array(arr: &[Bson], diff: &Document, depth: usize) -> Result<Vec<Bson>> {
    if depth > DIFF_DEPTH_MAX {
        return Err(bad(format!("nested deeper than {DIFF_DEPTH_MAX}")));
    }
    let mut out = arr.to_vec();
    if let Some(l) = diff.get("l") {
        let l = match l {
            Bson::Int32(n) if *n >= 0 => *n as usize,
            Bson::Int64(n) if *n >= 0 => *n as usize,
            _ => return Err(bad("'l' is not a non-negative integer")),
        };
        if l > common::limits::BSON_OBJECT_SIZE_MAX_BYTES {
            return Err(bad(format!("array length {l} is larger than a document can hold")));
        }
        out.resize(l, Bson::Null);
    }
    for (k, v) in diff {
        if k == "a" || k == "l" {
            continue;
        }
        let (kind, index) = k.split_at(1.min(k.len()));
        let i: usize = index.parse().map_err(|_| bad(format!("unknown array diff field '{k}'")))?;
        if i > common::limits::BSON_OBJECT_SIZE_MAX_BYTES {
            return Err(bad(format!("array index {i} is larger than a document can hold")));
        }
        match (kind, v) {
            ("u", v) => {
                if out.len() <= i {
                    out.resize(i + 1, Bson::Null);
                }
                out[i] = v.clone();
            }
            ("s", Bson::Document(sub)) => {
                if let Some(e) = out.get(i) {
                    out[i] = apply_value(e, sub, depth + 1)?;
                }
            }
            _ => return Err(bad(format!("unknown array diff field '{k}'"))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn round_trip(old: Document, new: Document) -> Document {
        round_trip_by(old, new, false)
    }

    fn round_trip_by(old: Document, new: Document, by_path: bool) -> Document {
        let diff = compute(&old, &new, by_path);
        let applied = apply(&old, &diff).unwrap();
        assert!(same_document(&applied, &new), "{old} + {diff} gave {applied}, not {new}");
        // Idempotent: applying again leaves the same document.
        assert!(same_document(&apply(&applied, &diff).unwrap(), &new), "{diff} applied twice");
        diff
    }

    #[test]
    fn a_diff_names_what_changed_as_mongod_logs_it() {
        assert_eq!(round_trip(doc! {"_id": 1, "x": 1}, doc! {"_id": 1, "x": 2}), doc! {"u": {"x": 2}});
        assert_eq!(round_trip(doc! {"_id": 1, "x": 1, "y": 2}, doc! {"_id": 1, "y": 2}), doc! {"d": {"x": false}});
        assert_eq!(round_trip(doc! {"_id": 1}, doc! {"_id": 1, "z": "new"}), doc! {"i": {"z": "new"}});
        let long = "a".repeat(40);
        assert_eq!(round_trip(doc! {"_id": 1, "a": {"b": 1, "c": &long}}, doc! {"_id": 1, "a": {"b": 2, "c": &long}}), doc! {"sa": {"u": {"b": 2}}});
        // An array that got shorter, and one that grew.
        let arr = doc! {"_id": 1, "array": ["foo", {"a": "bar"}, 1, 2, 3]};
        assert_eq!(round_trip(arr.clone(), doc! {"_id": 1, "array": ["foo", {"a": "bar"}]}), doc! {"sarray": {"a": true, "l": 2}});
        assert_eq!(round_trip(arr, doc! {"_id": 1, "array": ["foo", {"a": "bar"}, 1, 2, 3, 4]}), doc! {"sarray": {"a": true, "u5": 4}});
        assert!(round_trip(doc! {"_id": 1, "x": 1}, doc! {"_id": 1, "x": 1}).is_empty());
        // A small document changed inside: whole, or by path as operators name it.
        let (old, new) = (doc! {"_id": 1, "a": {"1": 1}, "c": [0]}, doc! {"_id": 1, "a": {"1": 2}, "c": [0, 5]});
        assert_eq!(round_trip(old.clone(), new.clone()), doc! {"u": {"a": {"1": 2}}, "sc": {"a": true, "u1": 5}});
        assert_eq!(round_trip_by(old, new, true), doc! {"sa": {"u": {"1": 2}}, "sc": {"a": true, "u1": 5}});
    }

    #[test]
    fn field_order_and_types_are_kept() {
        // A reordered document: from the first field out of order, fields are appended.
        round_trip(doc! {"_id": 1, "a": 1, "b": 2, "c": 3}, doc! {"_id": 1, "c": 3, "a": 1, "b": 2});
        round_trip(doc! {"_id": 1, "a": {"x": 1, "y": 2}}, doc! {"_id": 1, "a": {"y": 2, "x": 1}});
        // 1 and 1.0 are equal values but not the same document.
        assert_eq!(round_trip(doc! {"_id": 1, "n": 1}, doc! {"_id": 1, "n": 1.0}), doc! {"u": {"n": 1.0}});
        round_trip(doc! {"_id": 1, "a": [1, [2, 3], {"k": [4]}]}, doc! {"_id": 1, "a": [1, [2], {"k": [4, 5]}, null, 7]});
        round_trip(doc! {"_id": 1, "a": [1, 2], "b": {"c": 1}}, doc! {"_id": 1, "a": {"0": 1}, "b": [1]});
        round_trip_by(
            doc! {"_id": 1, "a": [1, [2, 3], {"k": [4]}], "b": {"x": 1, "y": 2}},
            doc! {"_id": 1, "a": [1, [2], {"k": [4, 5]}, null, 7], "b": {"y": 2, "x": 1}},
            true,
        );
    }

    #[test]
    fn a_malformed_diff_is_refused() {
        let d = doc! {"_id": 1, "a": [1]};
        for diff in [doc! {"u": 1}, doc! {"q": {}}, doc! {"sa": 3}, doc! {"sa": {"a": true, "x0": 1}}, doc! {"sa": {"a": true, "l": -1}}] {
            assert_eq!(apply(&d, &diff).unwrap_err().code, Code::FailedToParse.0, "{diff}");
        }
        // A sub-diff for a field of another type, or missing, leaves it.
        assert_eq!(apply(&d, &doc! {"sa": {"u": {"x": 1}}, "sz": {"a": true, "u0": 1}}).unwrap(), d);
    }
}
