//! The narrow ordered key-value engine everything above is written against.
//!
//! An engine holds a fixed set of ordered keyspaces ([`Space`]); it offers point reads and
//! range iteration over an immutable snapshot, atomic multi-space write batches that are
//! visible to every snapshot taken after `write` returns, and `sync`, which makes every
//! write applied so far durable. Two implementations: [`fjall_engine::FjallEngine`] (disk)
//! and [`memory::MemoryEngine`] (simulation tests).

pub mod fjall_engine;
pub mod memory;

use common::Result;
use std::ops::Bound;
use std::sync::Arc;

/// The keyspaces of an engine. Fixed, so an engine never creates keyspaces at runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Space {
    /// Catalog metadata, per-collection statistics, garbage markers.
    Catalog = 0,
    /// Documents: collection id ‖ record id → BSON.
    Records = 1,
    /// Index entries: index id ‖ encoded key [‖ record id] → record id ‖ key values.
    Index = 2,
}

pub const SPACES: [Space; 3] = [Space::Catalog, Space::Records, Space::Index];

impl Space {
    pub fn name(self) -> &'static str {
        match self {
            Space::Catalog => "catalog",
            Space::Records => "records",
            Space::Index => "index",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOp {
    Put(Space, Vec<u8>, Vec<u8>),
    Delete(Space, Vec<u8>),
}

/// An atomic group of puts and deletes; applied all-or-nothing (also across a crash).
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub ops: Vec<BatchOp>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch { ops: Vec::new() }
    }
    pub fn put(&mut self, space: Space, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push(BatchOp::Put(space, key, value));
    }
    pub fn delete(&mut self, space: Space, key: Vec<u8>) {
        self.ops.push(BatchOp::Delete(space, key));
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

pub type KvPair = (Vec<u8>, Vec<u8>);
pub type KvIter<'a> = Box<dyn Iterator<Item = Result<KvPair>> + Send + 'a>;

/// A point-in-time, immutable view of the engine. Must stay valid (and cheap to hold) for as
/// long as it lives, independent of later writes or of the catalog dropping data.
pub trait EngineSnapshot: Send + Sync {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Keys within (lower, upper), ascending, or descending if `reverse`.
    fn iter(&self, space: Space, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>, reverse: bool) -> KvIter<'_>;
    /// Where this snapshot reads: it sees every batch whose position is below this one.
    /// Positions grow with each batch, and survive restarts.
    fn position(&self) -> u64;
    /// The position of the batch that wrote the value of `key` this snapshot sees (None if
    /// it sees none). Two keys written by one batch have the same position.
    fn written_at(&self, space: Space, key: &[u8]) -> Result<Option<u64>>;
    /// A view at `position`, which lies between this snapshot's and the engine's newest: it
    /// sees the batches below `position`. The view holds this snapshot, whose open
    /// registration keeps every version from this snapshot's position on, so the view stays
    /// readable for as long as it lives (reads at a past point in time).
    fn later(&self, position: u64) -> Arc<dyn EngineSnapshot>;
}

pub trait Engine: Send + Sync + 'static {
    fn snapshot(&self) -> Arc<dyn EngineSnapshot>;
    /// The position a snapshot taken now would read at (`EngineSnapshot::position`).
    fn position(&self) -> u64;
    /// Apply atomically. Visible to snapshots taken after return; durable after `sync`.
    fn write(&self, batch: Batch) -> Result<()>;
    /// Make every write applied so far durable (journal flushed and fsynced when `fsync`).
    fn sync(&self) -> Result<()>;
    /// Bytes the engine occupies (disk for fjall, memory for the in-memory engine).
    fn size_bytes(&self) -> u64;
    /// Bytes one keyspace occupies (approximate).
    fn space_size_bytes(&self, space: Space) -> u64;
}

/// Smallest key strictly greater than every key that starts with `prefix`, or None if no
/// such key exists (prefix all 0xFF).
pub fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut out = prefix.to_vec();
    while let Some(last) = out.pop() {
        if last != 0xFF {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

/// Bounds covering exactly the keys starting with `prefix`.
pub fn prefix_bounds(prefix: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let upper = match prefix_successor(prefix) {
        Some(s) => Bound::Excluded(s),
        None => Bound::Unbounded,
    };
    (Bound::Included(prefix.to_vec()), upper)
}

#[cfg(test)]
pub(crate) mod tests {
    //! One suite, run against both engines.
    use super::*;

    pub fn collect(s: &dyn EngineSnapshot, space: Space, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>, rev: bool) -> Vec<KvPair> {
        s.iter(space, lo, hi, rev).collect::<Result<Vec<_>>>().unwrap()
    }

    pub fn engine_suite(e: &dyn Engine) {
        let mut b = Batch::new();
        for i in 0u32..300 {
            b.put(Space::Records, i.to_be_bytes().to_vec(), format!("v{i}").into_bytes());
        }
        b.put(Space::Catalog, b"k".to_vec(), b"cat".to_vec());
        e.write(b).unwrap();
        let s1 = e.snapshot();
        assert_eq!(s1.get(Space::Records, &7u32.to_be_bytes()).unwrap(), Some(b"v7".to_vec()));
        // Spaces are independent.
        assert_eq!(s1.get(Space::Index, b"k").unwrap(), None);
        assert_eq!(s1.get(Space::Catalog, b"k").unwrap(), Some(b"cat".to_vec()));

        let mut b = Batch::new();
        b.delete(Space::Records, 7u32.to_be_bytes().to_vec());
        b.put(Space::Records, 8u32.to_be_bytes().to_vec(), b"new".to_vec());
        b.put(Space::Records, 1000u32.to_be_bytes().to_vec(), b"late".to_vec());
        e.write(b).unwrap();
        let s2 = e.snapshot();
        // s1 is isolated from the later batch.
        assert_eq!(s1.get(Space::Records, &7u32.to_be_bytes()).unwrap(), Some(b"v7".to_vec()));
        assert_eq!(s1.get(Space::Records, &8u32.to_be_bytes()).unwrap(), Some(b"v8".to_vec()));
        assert_eq!(s2.get(Space::Records, &7u32.to_be_bytes()).unwrap(), None);
        assert_eq!(s2.get(Space::Records, &8u32.to_be_bytes()).unwrap(), Some(b"new".to_vec()));
        assert_eq!(collect(&*s1, Space::Records, Bound::Unbounded, Bound::Unbounded, false).len(), 300);
        assert_eq!(collect(&*s2, Space::Records, Bound::Unbounded, Bound::Unbounded, false).len(), 300);

        // Ranges, both directions, all bound kinds.
        let k = |i: u32| i.to_be_bytes().to_vec();
        let fwd = collect(&*s2, Space::Records, Bound::Included(k(5)), Bound::Excluded(k(10)), false);
        let keys: Vec<u32> = fwd.iter().map(|(k, _)| u32::from_be_bytes(k[..4].try_into().unwrap())).collect();
        assert_eq!(keys, vec![5, 6, 8, 9]);
        let rev = collect(&*s2, Space::Records, Bound::Excluded(k(5)), Bound::Included(k(10)), true);
        let keys: Vec<u32> = rev.iter().map(|(k, _)| u32::from_be_bytes(k[..4].try_into().unwrap())).collect();
        assert_eq!(keys, vec![10, 9, 8, 6]);
        let last = s2.iter(Space::Records, Bound::Unbounded, Bound::Unbounded, true).next().unwrap().unwrap();
        assert_eq!(last, (k(1000), b"late".to_vec()));
        // A long iteration (crosses the in-memory engine's chunking) sees every key once, in order.
        let all = collect(&*s2, Space::Records, Bound::Unbounded, Bound::Unbounded, false);
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
        let all_rev = collect(&*s2, Space::Records, Bound::Unbounded, Bound::Unbounded, true);
        assert!(all_rev.windows(2).all(|w| w[0].0 > w[1].0));
        assert_eq!(all_rev.len(), all.len());

        // Iteration is isolated from writes made while it runs.
        let mut it = s2.iter(Space::Records, Bound::Unbounded, Bound::Unbounded, false);
        let first = it.next().unwrap().unwrap();
        assert_eq!(first.0, k(0));
        let mut b = Batch::new();
        for i in 0u32..300 {
            b.delete(Space::Records, k(i));
        }
        e.write(b).unwrap();
        assert_eq!(it.count(), 299);
        assert_eq!(collect(&*e.snapshot(), Space::Records, Bound::Unbounded, Bound::Unbounded, false).len(), 1);

        // Prefix bounds.
        let mut b = Batch::new();
        for key in [&b"ab"[..], b"abc", b"ab\xff", b"ac", b"a"] {
            b.put(Space::Index, key.to_vec(), vec![]);
        }
        e.write(b).unwrap();
        let (lo, hi) = prefix_bounds(b"ab");
        let got: Vec<Vec<u8>> = collect(&*e.snapshot(), Space::Index, lo, hi, false).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            got,
            vec![b"ab".to_vec(), b"ab\xff".to_vec(), b"abc".to_vec()].into_iter().collect::<std::collections::BTreeSet<_>>().into_iter().collect::<Vec<_>>()
        );
        e.sync().unwrap();
        assert!(e.size_bytes() > 0);
        history_suite(e);
    }

    /// Reads at a past position through a held snapshot (`EngineSnapshot::later`).
    fn history_suite(e: &dyn Engine) {
        let put = |key: &[u8], v: &[u8]| {
            let mut b = Batch::new();
            b.put(Space::Records, key.to_vec(), v.to_vec());
            b.put(Space::Index, key.to_vec(), v.to_vec());
            e.write(b).unwrap();
        };
        put(b"h", b"0");
        let pin = e.snapshot();
        assert_eq!(pin.position(), e.position());
        put(b"h", b"1");
        let first = pin.written_at(Space::Records, b"h").unwrap().expect("written");
        let after_one = e.snapshot();
        let one = after_one.written_at(Space::Records, b"h").unwrap().expect("written");
        assert_eq!(after_one.written_at(Space::Index, b"h").unwrap(), Some(one), "one batch, one position");
        assert!(one > first && one > pin.position());
        drop(after_one);
        // Many later versions, with a compaction's chance to drop what no snapshot holds.
        for i in 2..200u32 {
            put(b"h", i.to_string().as_bytes());
            put(b"h-other", b"x");
        }
        // `written_at` is the position of the view that first includes the batch.
        let view = pin.later(one);
        drop(pin);
        assert_eq!(view.position(), one);
        assert_eq!(view.get(Space::Records, b"h").unwrap(), Some(b"1".to_vec()));
        assert_eq!(view.get(Space::Records, b"h-other").unwrap(), None);
        let seen = collect(&*view, Space::Index, Bound::Included(b"h".to_vec()), Bound::Included(b"h-other".to_vec()), true);
        assert_eq!(seen, vec![(b"h".to_vec(), b"1".to_vec())]);
        assert_eq!(view.written_at(Space::Records, b"h").unwrap(), Some(one));
        assert_eq!(e.snapshot().get(Space::Records, b"h").unwrap(), Some(b"199".to_vec()));
        // A deletion is no value, with no position.
        let mut b = Batch::new();
        b.delete(Space::Records, b"h".to_vec());
        e.write(b).unwrap();
        assert_eq!(e.snapshot().written_at(Space::Records, b"h").unwrap(), None);
        assert_eq!(view.written_at(Space::Records, b"h").unwrap(), Some(one));
    }

    #[test]
    fn prefix_successor_works() {
        assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_successor(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_successor(b"\xff\xff"), None);
    }
}
