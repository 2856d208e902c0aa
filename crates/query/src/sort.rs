//! Sort specifications with MongoDB's array semantics: an ascending sort uses the smallest
//! value an array (or a path through arrays) produces, a descending sort the largest; missing
//! sorts as null and an empty array just below null.

use crate::compare::cmp_bson;
use bson::{Bson, Document};
use common::{Code, Error, Result};
use std::cmp::Ordering;

#[derive(Clone, Debug, Default)]
pub struct SortSpec {
    keys: Vec<SortKey>,
}

#[derive(Clone, Debug)]
struct SortKey {
    path: Vec<String>,
    ascending: bool,
}

const NULL: Bson = Bson::Null;
/// Key of an empty array: below null, above MinKey.
const EMPTY_ARRAY_KEY: Bson = Bson::Undefined;

impl SortSpec {
    pub fn parse(spec: &Document) -> Result<SortSpec> {
        let mut keys = Vec::with_capacity(spec.len());
        for (k, v) in spec {
            if k.is_empty() {
                return Err(Error::location(40352, "FieldPath cannot be constructed with empty string"));
            }
            let ascending = match v {
                Bson::Document(d) => {
                    return match d.get("$meta") {
                        Some(Bson::String(m)) if m == "textScore" || m == "searchScore" || m == "randVal" => {
                            Err(Error::new(Code::NotImplemented, format!("$meta sort by \"{m}\" is not supported by shoal")))
                        }
                        Some(m) => Err(Error::location(31138, format!("Illegal $meta sort: $meta: {m}"))),
                        None => Err(Error::location(17312, "$meta is the only expression supported by $sort right now")),
                    };
                }
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                    let n = crate::num::Num::from_bson(v).map(|n| n.to_f64()).unwrap_or(0.0);
                    if n == 1.0 {
                        true
                    } else if n == -1.0 {
                        false
                    } else {
                        return Err(Error::location(15975, "$sort key ordering must be 1 (for ascending) or -1 (for descending)"));
                    }
                }
                other => return Err(Error::location(15974, format!("Illegal key in $sort specification: {k}: {other}"))),
            };
            if k.starts_with('$') {
                return Err(Error::location(16410, "FieldPath field names may not start with '$'."));
            }
            let path: Vec<String> = k.split('.').map(str::to_string).collect();
            if path.iter().any(String::is_empty) {
                return Err(Error::location(15998, "FieldPath field names may not be empty strings."));
            }
            keys.push(SortKey { path, ascending });
        }
        Ok(SortSpec { keys })
    }

    pub fn compare(&self, a: &Document, b: &Document) -> Ordering {
        for key in &self.keys {
            let ka = key_value(a, &key.path, key.ascending);
            let kb = key_value(b, &key.path, key.ascending);
            let o = cmp_bson(ka, kb);
            let o = if key.ascending { o } else { o.reverse() };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The (dotted path, ascending) pairs in priority order.
    pub fn fields(&self) -> Vec<(String, bool)> {
        self.keys.iter().map(|k| (k.path.join("."), k.ascending)).collect()
    }

    /// Precomputed sort key of a document, for sorting many documents.
    pub fn sort_key(&self, doc: &Document) -> Vec<Bson> {
        self.keys.iter().map(|k| key_value(doc, &k.path, k.ascending).clone()).collect()
    }

    /// Compare two keys from `sort_key`.
    pub fn compare_keys(&self, a: &[Bson], b: &[Bson]) -> Ordering {
        for (i, key) in self.keys.iter().enumerate() {
            let (Some(x), Some(y)) = (a.get(i), b.get(i)) else { break };
            let o = cmp_bson(x, y);
            let o = if key.ascending { o } else { o.reverse() };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    }
}

/// Smallest (ascending) or largest (descending) value the path produces.
fn key_value<'a>(doc: &'a Document, path: &[String], ascending: bool) -> &'a Bson {
    let mut best: Option<&'a Bson> = None;
    let mut consider = |v: &'a Bson| {
        let better = match best {
            None => true,
            Some(b) => {
                let o = cmp_bson(v, b);
                if ascending {
                    o == Ordering::Less
                } else {
                    o == Ordering::Greater
                }
            }
        };
        if better {
            best = Some(v);
        }
    };
    collect_doc(doc, path, &mut consider);
    best.unwrap_or(&NULL)
}

fn collect_doc<'a>(doc: &'a Document, path: &[String], f: &mut dyn FnMut(&'a Bson)) {
    let Some((first, rest)) = path.split_first() else { return };
    match doc.get(first) {
        None => f(&NULL),
        Some(v) => collect_value(v, rest, f),
    }
}

fn collect_value<'a>(v: &'a Bson, rest: &[String], f: &mut dyn FnMut(&'a Bson)) {
    match v {
        Bson::Array(items) => {
            if rest.is_empty() {
                if items.is_empty() {
                    f(&EMPTY_ARRAY_KEY);
                }
                for i in items {
                    f(i);
                }
                return;
            }
            // A numeric component selects an element of the array.
            if let Some(idx) = rest[0].parse::<usize>().ok().filter(|_| rest[0].bytes().all(|b| b.is_ascii_digit())) {
                if let Some(e) = items.get(idx) {
                    collect_value(e, &rest[1..], f);
                    return;
                }
            }
            if items.is_empty() {
                f(&NULL);
            }
            for i in items {
                match i {
                    Bson::Document(d) => collect_doc(d, rest, f),
                    _ => f(&NULL),
                }
            }
        }
        Bson::Document(d) if !rest.is_empty() => collect_doc(d, rest, f),
        _ if rest.is_empty() => f(v),
        _ => f(&NULL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn sorted(spec: Document, docs: Vec<Document>) -> Vec<Document> {
        let s = SortSpec::parse(&spec).unwrap();
        let mut docs = docs;
        docs.sort_by(|a, b| s.compare(a, b));
        docs
    }

    #[test]
    fn arrays_sort_by_min_or_max() {
        let docs = vec![doc! {"_id": 1, "a": [1, 9]}, doc! {"_id": 2, "a": 5}, doc! {"_id": 3, "a": [3, 4]}];
        let asc: Vec<_> = sorted(doc! {"a": 1}, docs.clone()).iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(asc, vec![1, 3, 2]);
        let desc: Vec<_> = sorted(doc! {"a": -1}, docs).iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(desc, vec![1, 2, 3]);
    }

    #[test]
    fn missing_null_and_types() {
        let docs = vec![doc! {"_id": 1, "a": "s"}, doc! {"_id": 2}, doc! {"_id": 3, "a": 1}, doc! {"_id": 4, "a": null}, doc! {"_id": 5, "a": []}];
        let ids: Vec<_> = sorted(doc! {"a": 1, "_id": 1}, docs).iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(ids, vec![5, 2, 4, 3, 1]);
    }

    #[test]
    fn dotted_paths() {
        let docs = vec![doc! {"_id": 1, "a": [{"b": 5}, {"b": 2}]}, doc! {"_id": 2, "a": {"b": 3}}];
        let ids: Vec<_> = sorted(doc! {"a.b": 1}, docs).iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(ids, vec![1, 2]);
    }

    #[test]
    fn parse_errors() {
        assert_eq!(SortSpec::parse(&doc! {"a": 2}).unwrap_err().code, 15975);
        assert_eq!(SortSpec::parse(&doc! {"a": "x"}).unwrap_err().code, 15974);
        assert_eq!(SortSpec::parse(&doc! {"a": {"$meta": "bogus"}}).unwrap_err().code, 31138);
        assert!(SortSpec::parse(&doc! {"a": -1.0, "b": 1i64}).is_ok());
        assert!(SortSpec::parse(&doc! {}).unwrap().is_empty());
    }
}
