//! Which shards a query filter can match documents on. The answer is a superset: every shard
//! that may hold a matching document is in it, and the shards' own matching decides the rest.
//! A filter that fixes every shard-key field (equality or `$in`, at top level or under
//! `$and`) targets the chunks of those keys; one that fixes or bounds the first field
//! targets the chunks of that range; any other targets every shard.

use crate::chunks::RoutingTable;
use crate::key::{Key, ShardKeyPattern};
use bson::{Bson, Document};
use query::compare::cmp_bson;
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// Combinations of `$in` values a filter is expanded into before it is treated as a range.
const POINTS_MAX: usize = 1024;

/// What a filter says about one shard-key field.
#[derive(Clone, Debug, Default)]
struct FieldConstraint {
    /// The field equals one of these (raw values, not hashed).
    points: Option<Vec<Bson>>,
    /// Inclusive bounds (a superset of `$gt`/`$lt` too).
    lo: Option<Bson>,
    hi: Option<Bson>,
}

/// The shards that may hold documents matching `filter`.
pub fn shards_for_filter(table: &RoutingTable, filter: &Document) -> BTreeSet<String> {
    let key = &table.key;
    let names: Vec<&str> = key.field_names().collect();
    let mut constraints = vec![FieldConstraint::default(); names.len()];
    collect(filter, &names, &mut constraints, 0);
    // Every field fixed: the chunks of each combination.
    if constraints.iter().all(|c| c.points.is_some()) {
        let mut keys: Vec<Key> = vec![Vec::new()];
        for (i, c) in constraints.iter().enumerate() {
            let points = c.points.as_deref().unwrap_or_default();
            if keys.len().saturating_mul(points.len()) > POINTS_MAX {
                keys.clear();
                break;
            }
            keys = keys
                .iter()
                .flat_map(|k| points.iter().map(move |p| (k, p)))
                .map(|(k, p)| {
                    let mut k = k.clone();
                    k.push(key.key_value(i, p));
                    k
                })
                .collect();
        }
        if !keys.is_empty() || constraints.iter().any(|c| c.points.as_ref().is_some_and(Vec::is_empty)) {
            return keys.iter().map(|k| table.chunk_for(k).shard.clone()).collect();
        }
    }
    // The first field fixed or bounded: the chunks between its bounds, the other fields
    // anywhere.
    let first = &constraints[0];
    let with_rest = |v: Bson, fill: Bson| {
        let mut k = vec![v];
        k.extend(std::iter::repeat_n(fill, names.len() - 1));
        k
    };
    if let Some(points) = first.points.as_ref().filter(|p| p.len() <= POINTS_MAX) {
        let mut out = BTreeSet::new();
        for p in points {
            let v = key.key_value(0, p);
            out.extend(table.shards_for_range(&with_rest(v.clone(), Bson::MinKey), &with_rest(v, Bson::MaxKey)));
        }
        return out;
    }
    if !key.is_hashed(0) && (first.lo.is_some() || first.hi.is_some()) {
        let lo = with_rest(first.lo.clone().unwrap_or(Bson::MinKey), Bson::MinKey);
        let hi = with_rest(first.hi.clone().unwrap_or(Bson::MaxKey), Bson::MaxKey);
        return table.shards_for_range(&lo, &hi);
    }
    table.shards()
}

/// The shard key `filter` fixes, if it sets every field of `key` to one value (at top level
/// or under `$and`): what a findAndModify on a sharded collection needs, as mongos does.
pub fn exact_key(key: &ShardKeyPattern, filter: &Document) -> Option<Key> {
    let names: Vec<&str> = key.field_names().collect();
    let mut constraints = vec![FieldConstraint::default(); names.len()];
    collect(filter, &names, &mut constraints, 0);
    constraints
        .iter()
        .enumerate()
        .map(|(i, c)| match c.points.as_deref() {
            Some([p]) => Some(key.key_value(i, p)),
            _ => None,
        })
        .collect()
}

/// Depth of nested `$and`s looked into (deeper ones are ignored: still a superset).
const AND_DEPTH_MAX: usize = 8;

fn collect(filter: &Document, names: &[&str], out: &mut [FieldConstraint], depth: usize) {
    for (k, v) in filter {
        if k == "$and" && depth < AND_DEPTH_MAX {
            if let Bson::Array(items) = v {
                for item in items {
                    if let Bson::Document(d) = item {
                        collect(d, names, out, depth + 1);
                    }
                }
            }
            continue;
        }
        if let Some(i) = names.iter().position(|n| n == k) {
            constrain(&mut out[i], v);
        }
    }
}

/// Narrow `c` by a filter's condition on its field. Any operator not understood here only
/// narrows the match further, so ignoring it keeps the answer a superset.
fn constrain(c: &mut FieldConstraint, v: &Bson) {
    let point = |c: &mut FieldConstraint, values: Vec<Bson>| {
        // Two equalities on one field: either set is a superset of the answer; keep the smaller.
        if c.points.as_ref().is_none_or(|p| p.len() > values.len()) {
            c.points = Some(values);
        }
    };
    match v {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            for (op, arg) in d {
                match op.as_str() {
                    "$eq" if is_point(arg) => point(c, vec![arg.clone()]),
                    "$in" => {
                        if let Bson::Array(values) = arg {
                            if values.iter().all(is_point) {
                                point(c, values.clone());
                            }
                        }
                    }
                    "$gt" | "$gte" if c.lo.as_ref().is_none_or(|lo| cmp_bson(arg, lo) == Ordering::Greater) => {
                        c.lo = Some(arg.clone());
                    }
                    "$lt" | "$lte" if c.hi.as_ref().is_none_or(|hi| cmp_bson(arg, hi) == Ordering::Less) => {
                        c.hi = Some(arg.clone());
                    }
                    _ => {}
                }
            }
        }
        v if is_point(v) => point(c, vec![v.clone()]),
        _ => {}
    }
}

/// A value whose equality match is a single shard-key value: not a regex (a pattern), not an
/// array (it matches arrays' elements, and no shard key holds an array).
fn is_point(v: &Bson) -> bool {
    !matches!(v, Bson::RegularExpression(_) | Bson::Array(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunks::{initial_chunks, Chunk, ChunkVersion};
    use crate::key::ShardKeyPattern;
    use bson::doc;

    fn hashed_table() -> RoutingTable {
        let key = ShardKeyPattern::parse(&doc! {"c": "hashed"}).unwrap();
        let shards: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
        RoutingTable::new(key.clone(), initial_chunks(&key, &shards, "s0", 2)).unwrap()
    }

    fn ranged_table() -> RoutingTable {
        let key = ShardKeyPattern::parse(&doc! {"a": 1, "b": 1}).unwrap();
        let v = ChunkVersion { major: 1, minor: 0 };
        let c = |lo: Key, hi: Key, s: &str| Chunk { min: lo, max: hi, shard: s.into(), lastmod: v };
        let chunks = vec![
            c(vec![Bson::MinKey, Bson::MinKey], vec![Bson::Int32(10), Bson::MinKey], "x"),
            c(vec![Bson::Int32(10), Bson::MinKey], vec![Bson::Int32(10), Bson::Int32(5)], "y"),
            c(vec![Bson::Int32(10), Bson::Int32(5)], vec![Bson::Int32(20), Bson::MinKey], "z"),
            c(vec![Bson::Int32(20), Bson::MinKey], vec![Bson::MaxKey, Bson::MaxKey], "w"),
        ];
        RoutingTable::new(key, chunks).unwrap()
    }

    fn names(s: BTreeSet<String>) -> Vec<String> {
        s.into_iter().collect()
    }

    #[test]
    fn an_exact_key_needs_every_field_at_one_value() {
        let key = ShardKeyPattern::parse(&doc! {"a": 1, "b": "hashed"}).unwrap();
        let fixed = exact_key(&key, &doc! {"a": 5, "$and": [{"b": {"$eq": "x"}}], "other": 1}).unwrap();
        assert_eq!(fixed, vec![Bson::Int32(5), key.key_value(1, &Bson::String("x".into()))]);
        assert_eq!(exact_key(&key, &doc! {"a": 5}), None, "b is not fixed");
        assert_eq!(exact_key(&key, &doc! {"a": 5, "b": {"$in": [1, 2]}}), None, "two values");
        assert_eq!(exact_key(&key, &doc! {"a": {"$gt": 5}, "b": 1}), None, "a range");
    }

    #[test]
    fn hashed_equality_and_in_target_the_owning_shards() {
        let t = hashed_table();
        let one = shards_for_filter(&t, &doc! {"c": 42});
        assert_eq!(one.len(), 1);
        let owner = t.chunk_for(&t.key.key_of_doc(&doc! {"c": 42}).unwrap()).shard.clone();
        assert_eq!(names(one), vec![owner.clone()]);
        assert_eq!(names(shards_for_filter(&t, &doc! {"c": {"$eq": 42}, "x": 1})), vec![owner.clone()]);
        assert_eq!(names(shards_for_filter(&t, &doc! {"$and": [{"c": 42}, {"y": 2}]})), vec![owner]);
        let many = shards_for_filter(&t, &doc! {"c": {"$in": (0..200).collect::<Vec<i32>>()}});
        assert_eq!(many.len(), 4);
        // A range on a hashed key, a regex, or no shard key: every shard.
        for f in [doc! {"c": {"$gt": 5}}, doc! {"c": {"$regex": "^a"}}, doc! {"x": 1}, doc! {}, doc! {"c": [1, 2]}] {
            assert_eq!(shards_for_filter(&t, &f).len(), 4, "{f}");
        }
        // $in of nothing matches nothing.
        assert!(shards_for_filter(&t, &doc! {"c": {"$in": []}}).is_empty());
    }

    #[test]
    fn ranged_prefixes_and_bounds_target_the_chunks_between() {
        let t = ranged_table();
        assert_eq!(names(shards_for_filter(&t, &doc! {"a": 10, "b": 7})), vec!["z"]);
        assert_eq!(names(shards_for_filter(&t, &doc! {"a": 10})), vec!["y", "z"]);
        assert_eq!(names(shards_for_filter(&t, &doc! {"a": {"$gte": 11, "$lt": 15}})), vec!["z"]);
        assert_eq!(names(shards_for_filter(&t, &doc! {"a": {"$lt": 5}})), vec!["x"]);
        assert_eq!(names(shards_for_filter(&t, &doc! {"a": {"$gt": 25}})), vec!["w"]);
        assert_eq!(names(shards_for_filter(&t, &doc! {"b": 7})), vec!["w", "x", "y", "z"]);
        assert_eq!(names(shards_for_filter(&t, &doc! {"a": {"$in": [1, 30]}, "b": 1})), vec!["w", "x"]);
    }
}
