//! A sharded collection's chunks: contiguous key ranges, each owned by one shard, covering
//! the whole key space from MinKey to MaxKey; the routing table a router looks keys up in.

use crate::key::{cmp_keys, Key, ShardKeyPattern};
use bson::{Bson, Document, Timestamp};
use common::{Error, Result};
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// Chunks of one collection a routing table holds at most (mongod's config.chunks has no
/// limit; ours bounds a router's memory and a table's load time).
pub const CHUNKS_MAX: usize = 1_000_000;
/// numInitialChunks: mongod's limit per shard.
pub const INITIAL_CHUNKS_PER_SHARD_MAX: u64 = 8192;
/// Chunks per shard when an empty collection is sharded on a hashed key (mongod's default).
pub const INITIAL_CHUNKS_PER_SHARD: u64 = 2;

/// A chunk's version, config.chunks `lastmod` (a Timestamp of major and minor): a migration
/// raises the major version, a split the minor one. A collection's version is its highest
/// chunk's, a shard's version its highest chunk's on that shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ChunkVersion {
    pub major: u32,
    pub minor: u32,
}

impl ChunkVersion {
    pub fn to_timestamp(self) -> Timestamp {
        Timestamp { time: self.major, increment: self.minor }
    }

    pub fn from_timestamp(t: Timestamp) -> ChunkVersion {
        ChunkVersion { major: t.time, minor: t.increment }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Chunk {
    /// Inclusive.
    pub min: Key,
    /// Exclusive (MaxKey's chunk holds MaxKey too: nothing sorts above it).
    pub max: Key,
    pub shard: String,
    pub lastmod: ChunkVersion,
}

/// A collection's chunks in key order, checked to cover the key space without gap or overlap.
#[derive(Clone, Debug)]
pub struct RoutingTable {
    pub key: ShardKeyPattern,
    chunks: Vec<Chunk>,
}

impl RoutingTable {
    pub fn new(key: ShardKeyPattern, mut chunks: Vec<Chunk>) -> Result<RoutingTable> {
        if chunks.is_empty() || chunks.len() > CHUNKS_MAX {
            return Err(Error::internal(format!("a collection has {} chunks (1 to {CHUNKS_MAX})", chunks.len())));
        }
        chunks.sort_by(|a, b| cmp_keys(&a.min, &b.min));
        // A split writes its right half before it shrinks the chunk it cuts (`split` in
        // the router): until then, or if it stopped there, the right half lies inside the
        // old chunk, ending where it ends. The old chunk ends where the right half begins.
        for i in 1..chunks.len() {
            if chunks[i - 1].max == chunks[i].max && cmp_keys(&chunks[i - 1].min, &chunks[i].min) == Ordering::Less {
                chunks[i - 1].max = chunks[i].min.clone();
            }
        }
        let broken = |why: &str| Err(Error::internal(format!("the chunks of a collection sharded on {} {why}", key.to_doc())));
        if chunks[0].min != key.global_min() || chunks[chunks.len() - 1].max != key.global_max() {
            return broken("do not span MinKey to MaxKey");
        }
        for (i, c) in chunks.iter().enumerate() {
            if c.min.len() != key.len() || c.max.len() != key.len() || cmp_keys(&c.min, &c.max) != Ordering::Less {
                return broken("hold an empty or malformed range");
            }
            if i > 0 && chunks[i - 1].max != c.min {
                return broken("leave a gap or overlap");
            }
        }
        Ok(RoutingTable { key, chunks })
    }

    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// The chunk that holds `key`.
    pub fn chunk_for(&self, key: &[Bson]) -> &Chunk {
        // The last chunk whose min is at or below the key; the first chunk's min is MinKey.
        let i = self.chunks.partition_point(|c| cmp_keys(&c.min, key) != Ordering::Greater);
        &self.chunks[i.saturating_sub(1)]
    }

    /// The shards owning any key from `lo` to `hi`, both inclusive.
    pub fn shards_for_range(&self, lo: &[Bson], hi: &[Bson]) -> BTreeSet<String> {
        let first = self.chunks.partition_point(|c| cmp_keys(&c.min, lo) != Ordering::Greater).saturating_sub(1);
        let mut out = BTreeSet::new();
        for c in &self.chunks[first..] {
            if cmp_keys(&c.min, hi) == Ordering::Greater {
                break;
            }
            out.insert(c.shard.clone());
        }
        out
    }

    /// Every shard owning a chunk.
    pub fn shards(&self) -> BTreeSet<String> {
        self.chunks.iter().map(|c| c.shard.clone()).collect()
    }

    /// The collection's version: its highest chunk version.
    pub fn version(&self) -> ChunkVersion {
        self.chunks.iter().map(|c| c.lastmod).max().unwrap_or_default()
    }

    /// A shard's version: its highest chunk version, zero if it owns none.
    pub fn shard_version(&self, shard: &str) -> ChunkVersion {
        self.chunks.iter().filter(|c| c.shard == shard).map(|c| c.lastmod).max().unwrap_or_default()
    }
}

/// The chunks a collection starts with when sharded on `key` while empty: with a hashed
/// first field, `per_shard` chunks for each shard, evenly spaced over the hash range and
/// handed out in contiguous runs (shard 0 the lowest); otherwise one chunk on `primary`.
pub fn initial_chunks(key: &ShardKeyPattern, shards: &[String], primary: &str, per_shard: u64) -> Vec<Chunk> {
    let v1 = ChunkVersion { major: 1, minor: 0 };
    if key.hashed_field() != Some(0) || shards.is_empty() {
        return vec![Chunk { min: key.global_min(), max: key.global_max(), shard: primary.to_string(), lastmod: v1 }];
    }
    let n = (shards.len() as u64 * per_shard.clamp(1, INITIAL_CHUNKS_PER_SHARD_MAX)) as i128;
    // Split points over the int64 hash range, the rest of a compound key at MinKey.
    let point = |i: i128| {
        let mut k = vec![Bson::Int64((i64::MIN as i128 + (i * (1i128 << 64)) / n) as i64)];
        k.extend(std::iter::repeat_n(Bson::MinKey, key.len() - 1));
        k
    };
    let mut chunks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let min = if i == 0 { key.global_min() } else { point(i) };
        let max = if i + 1 == n { key.global_max() } else { point(i + 1) };
        let shard = shards[(i * shards.len() as i128 / n) as usize].clone();
        // Each chunk its own minor version, as mongod numbers the chunks it creates.
        chunks.push(Chunk { min, max, shard, lastmod: ChunkVersion { major: 1, minor: i as u32 } });
    }
    chunks
}

/// A config.chunks document as a chunk of `key`.
pub fn chunk_from_doc(key: &ShardKeyPattern, d: &Document) -> Result<Chunk> {
    let bad = |what: &str| Error::internal(format!("config.chunks document {d} has no valid {what}"));
    let min = key.key_of_bound(d.get_document("min").map_err(|_| bad("min"))?)?;
    let max = key.key_of_bound(d.get_document("max").map_err(|_| bad("max"))?)?;
    let shard = d.get_str("shard").map_err(|_| bad("shard"))?.to_string();
    let lastmod = ChunkVersion::from_timestamp(d.get_timestamp("lastmod").map_err(|_| bad("lastmod"))?);
    Ok(Chunk { min, max, shard, lastmod })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn shards(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("shard{i}")).collect()
    }

    #[test]
    fn hashed_initial_chunks_cover_the_key_space_evenly() {
        let key = ShardKeyPattern::parse(&doc! {"customerId": "hashed"}).unwrap();
        let chunks = initial_chunks(&key, &shards(4), "shard0", 2);
        assert_eq!(chunks.len(), 8);
        let table = RoutingTable::new(key.clone(), chunks).unwrap();
        // Two contiguous chunks per shard.
        for (i, c) in table.chunks().iter().enumerate() {
            assert_eq!(c.shard, format!("shard{}", i / 2));
        }
        assert_eq!(table.chunks()[4].min, vec![Bson::Int64(0)]);
        // Keys land in the chunk whose range holds them.
        let mut per_shard = std::collections::BTreeMap::<String, usize>::new();
        for i in 0..4000 {
            let k = key.key_of_doc(&doc! {"customerId": i}).unwrap();
            let c = table.chunk_for(&k);
            assert!(cmp_keys(&c.min, &k) != Ordering::Greater && cmp_keys(&k, &c.max) == Ordering::Less);
            *per_shard.entry(c.shard.clone()).or_default() += 1;
        }
        assert!(per_shard.values().all(|n| (800..1200).contains(n)), "{per_shard:?}");
        assert_eq!(table.version(), ChunkVersion { major: 1, minor: 7 });
        assert_eq!(table.shard_version("shard0"), ChunkVersion { major: 1, minor: 1 });
        assert_eq!(table.shard_version("shard9"), ChunkVersion::default());
    }

    #[test]
    fn a_ranged_key_starts_with_one_chunk_and_ranges_find_their_shards() {
        let key = ShardKeyPattern::parse(&doc! {"a": 1}).unwrap();
        assert_eq!(initial_chunks(&key, &shards(3), "shard2", 2).len(), 1);
        let c = |lo: Bson, hi: Bson, s: &str| Chunk { min: vec![lo], max: vec![hi], shard: s.into(), lastmod: ChunkVersion { major: 1, minor: 0 } };
        let table = RoutingTable::new(
            key,
            vec![c(Bson::Int32(10), Bson::Int32(20), "b"), c(Bson::MinKey, Bson::Int32(10), "a"), c(Bson::Int32(20), Bson::MaxKey, "c")],
        )
        .unwrap();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(table.shards_for_range(&[Bson::Int32(12)], &[Bson::Int32(15)]), set(&["b"]));
        assert_eq!(table.shards_for_range(&[Bson::Int32(5)], &[Bson::Int32(20)]), set(&["a", "b", "c"]));
        assert_eq!(table.shards_for_range(&[Bson::MinKey], &[Bson::Int32(9)]), set(&["a"]));
        assert_eq!(table.chunk_for(&[Bson::MaxKey]).shard, "c");
        assert_eq!(table.chunk_for(&[Bson::Int32(20)]).shard, "c");
    }

    #[test]
    fn tables_with_gaps_or_overlaps_are_refused() {
        let key = ShardKeyPattern::parse(&doc! {"a": 1}).unwrap();
        let c = |lo: Bson, hi: Bson| Chunk { min: vec![lo], max: vec![hi], shard: "s".into(), lastmod: ChunkVersion::default() };
        assert!(RoutingTable::new(key.clone(), vec![c(Bson::MinKey, Bson::Int32(1)), c(Bson::Int32(2), Bson::MaxKey)]).is_err());
        assert!(RoutingTable::new(key.clone(), vec![c(Bson::MinKey, Bson::Int32(3)), c(Bson::Int32(2), Bson::MaxKey)]).is_err());
        assert!(RoutingTable::new(key.clone(), vec![c(Bson::MinKey, Bson::Int32(3))]).is_err());
        assert!(RoutingTable::new(key.clone(), vec![]).is_err());
        // A split cut short: the right half inside the old chunk, ending where it ends. The
        // old chunk ends where the right half begins.
        let t = RoutingTable::new(key, vec![c(Bson::MinKey, Bson::MaxKey), c(Bson::Int32(5), Bson::MaxKey)]).unwrap();
        assert_eq!(t.chunks()[0].max, vec![Bson::Int32(5)]);
        assert_eq!(t.chunk_for(&[Bson::Int32(7)]).min, vec![Bson::Int32(5)]);
    }
}
