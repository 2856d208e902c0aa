//! Shard key patterns (`{customerId: "hashed"}`, `{region: 1, ts: 1}`): their validation, and
//! the key a document or a chunk bound has under one.
//!
//! A key is the list of its fields' values in the pattern's order, a hashed field's value
//! replaced by its hash (an int64, `storage::hash_bson`, equal to mongod's), so keys compare
//! with `query`'s BSON order, field by field, as mongod compares chunk bounds.

use bson::{Bson, Document, RawBsonRef, RawDocument};
use common::{Code, Error, Result};
use std::cmp::Ordering;

/// Fields in a shard key: an index holds at most 32.
pub const KEY_FIELDS_MAX: usize = 32;

#[derive(Clone, Debug, PartialEq)]
pub struct ShardKeyPattern {
    /// Each field as its dotted path split into parts, and whether it is hashed.
    fields: Vec<(Vec<String>, bool)>,
    /// The pattern as given, with every ranged field's value normalized to 1.
    doc: Document,
}

/// A key: one value per pattern field.
pub type Key = Vec<Bson>;

impl ShardKeyPattern {
    pub fn parse(pattern: &Document) -> Result<ShardKeyPattern> {
        let unsupported = || {
            Error::bad_value(format!("Unsupported shard key pattern {pattern}. Pattern must either be a single hashed field, or a list of ascending fields"))
        };
        if pattern.is_empty() || pattern.len() > KEY_FIELDS_MAX {
            return Err(unsupported());
        }
        let mut fields = Vec::with_capacity(pattern.len());
        let mut doc = Document::new();
        for (name, v) in pattern {
            let parts: Vec<String> = name.split('.').map(str::to_string).collect();
            if parts.iter().any(|p| p.is_empty() || p.starts_with('$')) {
                return Err(unsupported());
            }
            let hashed = match v {
                Bson::String(s) if s == "hashed" => true,
                Bson::Int32(1) | Bson::Int64(1) => false,
                Bson::Double(d) if *d == 1.0 => false,
                _ => return Err(unsupported()),
            };
            if hashed && fields.iter().any(|(_, h)| *h) {
                return Err(unsupported());
            }
            doc.insert(name.clone(), if hashed { Bson::String("hashed".into()) } else { Bson::Int32(1) });
            fields.push((parts, hashed));
        }
        Ok(ShardKeyPattern { fields, doc })
    }

    /// The pattern as a document (`config.collections.key`, the shard-key index's key).
    pub fn to_doc(&self) -> &Document {
        &self.doc
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The field that is hashed, by position, if any.
    pub fn hashed_field(&self) -> Option<usize> {
        self.fields.iter().position(|(_, h)| *h)
    }

    /// The dotted names of the fields, in order.
    pub fn field_names(&self) -> impl Iterator<Item = &str> {
        self.doc.keys().map(String::as_str)
    }

    pub fn is_hashed(&self, field: usize) -> bool {
        self.fields[field].1
    }

    /// The key `doc` has: a missing field counts as null (as mongod places documents that
    /// lack a shard key field since 4.4), an array anywhere on a path is refused.
    pub fn key_of_doc(&self, doc: &Document) -> Result<Key> {
        self.key_with(|parts| value_at(doc, parts))
    }

    /// `key_of_doc` of a document still in BSON: only the key's fields are decoded (a
    /// router routes a batch's documents without decoding them).
    pub fn key_of_raw(&self, doc: &RawDocument) -> Result<Key> {
        self.key_with(|parts| raw_value_at(doc, parts))
    }

    fn key_with(&self, value_at: impl Fn(&[String]) -> Result<Option<Bson>>) -> Result<Key> {
        let mut key = Vec::with_capacity(self.fields.len());
        for (parts, hashed) in &self.fields {
            let v = value_at(parts)?.unwrap_or(Bson::Null);
            key.push(if *hashed { Bson::Int64(storage::hash_bson(&v)) } else { v });
        }
        Ok(key)
    }

    /// A field's value in the key space: its hash for the hashed field.
    pub fn key_value(&self, field: usize, v: &Bson) -> Bson {
        if self.fields[field].1 {
            Bson::Int64(storage::hash_bson(v))
        } else {
            v.clone()
        }
    }

    /// `key` as a bound document (`{customerId: NumberLong(...)}`), as config.chunks holds.
    pub fn key_doc(&self, key: &[Bson]) -> Document {
        self.doc.keys().zip(key).map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// A bound document back into a key: it must name the pattern's fields in order.
    pub fn key_of_bound(&self, bound: &Document) -> Result<Key> {
        if bound.len() != self.fields.len() || bound.keys().zip(self.doc.keys()).any(|(a, b)| a != b) {
            return Err(Error::bad_value(format!("bound {bound} does not match the shard key pattern {}", self.doc)));
        }
        Ok(bound.values().cloned().collect())
    }

    /// The key below every other: MinKey in each field.
    pub fn global_min(&self) -> Key {
        vec![Bson::MinKey; self.fields.len()]
    }

    pub fn global_max(&self) -> Key {
        vec![Bson::MaxKey; self.fields.len()]
    }
}

/// The value at a dotted path; an array on the way (or at the end) is an error, as a shard
/// key cannot hold one.
fn value_at(doc: &Document, parts: &[String]) -> Result<Option<Bson>> {
    let array = || Error::new(Code::ShardKeyNotFound, "Shard key cannot contain array values or array descendants.");
    let mut cur = doc;
    for (i, p) in parts.iter().enumerate() {
        match cur.get(p) {
            None => return Ok(None),
            Some(Bson::Array(_)) => return Err(array()),
            Some(Bson::Document(d)) if i + 1 < parts.len() => cur = d,
            Some(_) if i + 1 < parts.len() => return Ok(None),
            Some(v) => return Ok(Some(v.clone())),
        }
    }
    Ok(None)
}

/// `value_at` in a raw document.
fn raw_value_at(doc: &RawDocument, parts: &[String]) -> Result<Option<Bson>> {
    let array = || Error::new(Code::ShardKeyNotFound, "Shard key cannot contain array values or array descendants.");
    let invalid = |e: bson::error::Error| Error::new(Code::InvalidBSON, format!("Invalid BSON: {e}"));
    let mut cur = doc;
    for (i, p) in parts.iter().enumerate() {
        match cur.get(p).map_err(invalid)? {
            None => return Ok(None),
            Some(RawBsonRef::Array(_)) => return Err(array()),
            Some(RawBsonRef::Document(d)) if i + 1 < parts.len() => cur = d,
            Some(_) if i + 1 < parts.len() => return Ok(None),
            Some(v) => return Ok(Some(Bson::try_from(v).map_err(invalid)?)),
        }
    }
    Ok(None)
}

/// Keys compare field by field in BSON order.
pub fn cmp_keys(a: &[Bson], b: &[Bson]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let o = query::compare::cmp_bson(x, y);
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn patterns_are_validated_as_mongod_does() {
        assert!(ShardKeyPattern::parse(&doc! {"customerId": "hashed"}).is_ok());
        assert!(ShardKeyPattern::parse(&doc! {"a": 1, "b.c": 1.0}).is_ok());
        assert!(ShardKeyPattern::parse(&doc! {"a": "hashed", "b": 1}).is_ok());
        for bad in [doc! {}, doc! {"a": -1}, doc! {"a": "hashed", "b": "hashed"}, doc! {"$a": 1}, doc! {"a..b": 1}, doc! {"a": "text"}] {
            assert_eq!(ShardKeyPattern::parse(&bad).unwrap_err().code, Code::BadValue.0, "{bad}");
        }
    }

    #[test]
    fn a_documents_key_hashes_the_hashed_field_and_takes_missing_as_null() {
        let p = ShardKeyPattern::parse(&doc! {"check": "hashed"}).unwrap();
        // The hashed-index test vector: hash of 42 is mongod's.
        assert_eq!(p.key_of_doc(&doc! {"check": 42}).unwrap(), vec![Bson::Int64(-944302157085130861)]);
        assert_eq!(p.key_of_doc(&doc! {"x": 1}).unwrap(), vec![Bson::Int64(storage::hash_bson(&Bson::Null))]);
        let p = ShardKeyPattern::parse(&doc! {"a.b": 1, "c": 1}).unwrap();
        assert_eq!(p.key_of_doc(&doc! {"a": {"b": "x"}, "c": 2}).unwrap(), vec![Bson::String("x".into()), Bson::Int32(2)]);
        assert_eq!(p.key_of_doc(&doc! {"a": {"b": [1]}}).unwrap_err().code, Code::ShardKeyNotFound.0);
        assert_eq!(p.key_of_doc(&doc! {"a": [{"b": 1}]}).unwrap_err().code, Code::ShardKeyNotFound.0);
        assert_eq!(p.key_doc(&p.global_min()), doc! {"a.b": Bson::MinKey, "c": Bson::MinKey});
        // The same keys from BSON.
        for d in [doc! {"a": {"b": "x"}, "c": 2}, doc! {"c": 1.5}, doc! {"a": 1}, doc! {"a": {"b": [1]}}] {
            let raw = bson::RawDocumentBuf::try_from(&d).unwrap();
            assert_eq!(p.key_of_raw(&raw).map_err(|e| e.code), p.key_of_doc(&d).map_err(|e| e.code), "{d}");
        }
    }

    #[test]
    fn keys_order_field_by_field_across_numeric_types() {
        assert_eq!(cmp_keys(&[Bson::Int32(1), Bson::MaxKey], &[Bson::Double(1.5), Bson::MinKey]), Ordering::Less);
        assert_eq!(cmp_keys(&[Bson::Int64(2)], &[Bson::Double(2.0)]), Ordering::Equal);
        assert_eq!(cmp_keys(&[Bson::MinKey], &[Bson::Null]), Ordering::Less);
    }
}
