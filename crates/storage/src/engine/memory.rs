//! In-memory MVCC engine for simulation tests: every key keeps its versions tagged with the
//! batch sequence number that wrote them; a snapshot reads the newest version at or below
//! its sequence. Versions no open snapshot can see are pruned when their key is next written.

use super::{Batch, BatchOp, Engine, EngineSnapshot, KvIter, KvPair, Space, SPACES};
use common::Result;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Entries copied out per lock acquisition while iterating, so a long scan never holds the
/// lock across the caller's work: the first chunk is small (most scans want a few entries:
/// an oplog's newest, a fetcher's next batch), and each next one twice as big, up to the max.
const ITER_CHUNK_ENTRIES_FIRST: usize = 8;
const ITER_CHUNK_ENTRIES: usize = 256;

type Versions = Vec<(u64, Option<Arc<[u8]>>)>;

struct Shared {
    spaces: RwLock<[BTreeMap<Vec<u8>, Versions>; 3]>,
    /// Sequence of the last fully applied batch; new snapshots read at this sequence.
    visible_seq: AtomicU64,
    /// Open snapshots: sequence -> how many.
    open_snapshots: Mutex<BTreeMap<u64, usize>>,
    bytes: AtomicU64,
    sync_count: AtomicU64,
    /// `visible_seq` at the last sync: what survives a simulated crash (`crash_image`).
    synced_seq: AtomicU64,
    /// Keep the versions the synced state needs, so that `crash_image` can rebuild it.
    crashable: bool,
}

#[derive(Clone)]
pub struct MemoryEngine {
    shared: Arc<Shared>,
}

impl Default for MemoryEngine {
    fn default() -> Self {
        MemoryEngine::new()
    }
}

impl MemoryEngine {
    pub fn new() -> MemoryEngine {
        MemoryEngine::with_spaces([BTreeMap::new(), BTreeMap::new(), BTreeMap::new()], false, 0)
    }

    /// An engine that can lose what was not synced, as a process killed -9 over a real disk
    /// does (`crash_image`). It keeps, besides what snapshots need, each key's newest synced
    /// version until the next sync; a simulation syncs often, so that stays small.
    pub fn crashable() -> MemoryEngine {
        MemoryEngine::with_spaces([BTreeMap::new(), BTreeMap::new(), BTreeMap::new()], true, 0)
    }

    fn with_spaces(spaces: [BTreeMap<Vec<u8>, Versions>; 3], crashable: bool, bytes: u64) -> MemoryEngine {
        MemoryEngine {
            shared: Arc::new(Shared {
                spaces: RwLock::new(spaces),
                visible_seq: AtomicU64::new(0),
                open_snapshots: Mutex::new(BTreeMap::new()),
                bytes: AtomicU64::new(bytes),
                sync_count: AtomicU64::new(0),
                synced_seq: AtomicU64::new(0),
                crashable,
            }),
        }
    }

    /// What a restart after a crash finds: a new engine holding every key's newest version
    /// as of the last `sync` (a crashable engine's), and nothing written after it.
    pub fn crash_image(&self) -> MemoryEngine {
        assert!(self.shared.crashable, "crash_image needs MemoryEngine::crashable");
        let synced = self.shared.synced_seq.load(Ordering::Acquire);
        let spaces = self.shared.spaces.read();
        let mut bytes = 0;
        let image = std::array::from_fn(|i| {
            let mut map = BTreeMap::new();
            for (k, versions) in &spaces[i] {
                if let Some(Some(v)) = visible(versions, synced) {
                    let value = Some(v.clone());
                    bytes += version_bytes(k, &value);
                    map.insert(k.clone(), vec![(0, value)]);
                }
            }
            map
        });
        MemoryEngine::with_spaces(image, true, bytes)
    }
}

fn version_bytes(key: &[u8], v: &Option<Arc<[u8]>>) -> u64 {
    (key.len() + v.as_ref().map_or(0, |v| v.len()) + 16) as u64
}

fn visible(versions: &Versions, seq: u64) -> Option<&Option<Arc<[u8]>>> {
    versions.iter().rev().find(|(s, _)| *s <= seq).map(|(_, v)| v)
}

/// True if lower..upper contains no key (also avoids BTreeMap::range's panics).
pub(crate) fn bounds_empty(lower: &Bound<Vec<u8>>, upper: &Bound<Vec<u8>>) -> bool {
    use Bound::*;
    match (lower, upper) {
        (Included(a), Included(b)) => a > b,
        (Included(a), Excluded(b)) | (Excluded(a), Included(b)) | (Excluded(a), Excluded(b)) => a >= b,
        _ => false,
    }
}

impl Engine for MemoryEngine {
    fn snapshot(&self) -> Arc<dyn EngineSnapshot> {
        // Register before reading the sequence under the same lock the pruner reads, so a
        // concurrent write never prunes a version this snapshot needs.
        let mut open = self.shared.open_snapshots.lock();
        let seq = self.shared.visible_seq.load(Ordering::Acquire);
        *open.entry(seq).or_insert(0) += 1;
        drop(open);
        Arc::new(MemSnapshot { shared: self.shared.clone(), seq })
    }

    fn position(&self) -> u64 {
        self.shared.visible_seq.load(Ordering::Acquire) + 1
    }

    fn write(&self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut spaces = self.shared.spaces.write();
        let seq = self.shared.visible_seq.load(Ordering::Acquire) + 1;
        let horizon = {
            let open = self.shared.open_snapshots.lock();
            // Snapshots opened later read at >= seq - 1, the current visible sequence.
            let h = open.keys().next().copied().unwrap_or(seq - 1).min(seq - 1);
            if self.shared.crashable {
                h.min(self.shared.synced_seq.load(Ordering::Acquire))
            } else {
                h
            }
        };
        let mut added: u64 = 0;
        let mut removed: u64 = 0;
        for op in batch.ops {
            let (space, key, value) = match op {
                BatchOp::Put(s, k, v) => (s, k, Some(Arc::<[u8]>::from(v))),
                BatchOp::Delete(s, k) => (s, k, None),
            };
            let map = &mut spaces[space as usize];
            added += version_bytes(&key, &value);
            let versions = map.entry(key).or_default();
            // Two ops on one key in one batch: the later wins.
            if let Some(last) = versions.last_mut() {
                if last.0 == seq {
                    removed += version_bytes(&[], &last.1);
                    last.1 = value;
                    continue;
                }
            }
            versions.push((seq, value));
            // Prune: keep the newest version at or below the horizon and everything newer.
            if let Some(keep_from) = versions.iter().rposition(|(s, _)| *s <= horizon) {
                if keep_from > 0 {
                    for (_, v) in versions.drain(..keep_from) {
                        removed += version_bytes(&[], &v);
                    }
                }
            }
        }
        self.shared.bytes.fetch_add(added, Ordering::Relaxed);
        let _ = self.shared.bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some(b.saturating_sub(removed)));
        self.shared.visible_seq.store(seq, Ordering::Release);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.shared.sync_count.fetch_add(1, Ordering::Relaxed);
        // Everything applied so far is visible, so it is what a sync makes durable.
        let _writes = self.shared.spaces.read();
        self.shared.synced_seq.store(self.shared.visible_seq.load(Ordering::Acquire), Ordering::Release);
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    fn space_size_bytes(&self, space: Space) -> u64 {
        let spaces = self.shared.spaces.read();
        let total: usize = SPACES.iter().map(|s| spaces[*s as usize].len()).sum();
        let this = spaces[space as usize].len();
        if total == 0 {
            return 0;
        }
        (self.size_bytes() as u128 * this as u128 / total as u128) as u64
    }
}

struct MemSnapshot {
    shared: Arc<Shared>,
    seq: u64,
}

impl Drop for MemSnapshot {
    fn drop(&mut self) {
        let mut open = self.shared.open_snapshots.lock();
        if let Some(n) = open.get_mut(&self.seq) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.seq);
            }
        }
    }
}

impl MemSnapshot {
    /// Register a snapshot at `seq`, which a held snapshot at or below it keeps readable.
    fn open(shared: &Arc<Shared>, seq: u64) -> MemSnapshot {
        *shared.open_snapshots.lock().entry(seq).or_insert(0) += 1;
        MemSnapshot { shared: shared.clone(), seq }
    }
}

impl EngineSnapshot for MemSnapshot {
    // A snapshot at `seq` sees the batches numbered up to it: its position is one above.
    fn position(&self) -> u64 {
        self.seq + 1
    }

    fn written_at(&self, space: Space, key: &[u8]) -> Result<Option<u64>> {
        let spaces = self.shared.spaces.read();
        let versions = spaces[space as usize].get(key);
        // A deletion is no value: as fjall reports a tombstone.
        Ok(versions.and_then(|v| v.iter().rev().find(|(s, _)| *s <= self.seq)).filter(|(_, v)| v.is_some()).map(|(s, _)| s + 1))
    }

    fn later(&self, position: u64) -> Arc<dyn EngineSnapshot> {
        assert!(position > self.seq, "a view reads at or after the snapshot it holds");
        // Registered at its own sequence: pruning keeps the newest version at or below the
        // lowest open sequence, and this snapshot's registration keeps those from here on.
        Arc::new(MemSnapshot::open(&self.shared, position - 1))
    }

    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let spaces = self.shared.spaces.read();
        Ok(spaces[space as usize].get(key).and_then(|v| visible(v, self.seq)).and_then(|v| v.as_ref().map(|b| b.to_vec())))
    }

    fn iter(&self, space: Space, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>, reverse: bool) -> KvIter<'_> {
        Box::new(MemIter { snap: self, space, lower, upper, reverse, buf: VecDeque::new(), done: false, chunk: ITER_CHUNK_ENTRIES_FIRST })
    }
}

struct MemIter<'a> {
    snap: &'a MemSnapshot,
    space: Space,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    reverse: bool,
    buf: VecDeque<KvPair>,
    done: bool,
    /// Entries to copy out in the next fill.
    chunk: usize,
}

impl MemIter<'_> {
    fn fill(&mut self) {
        if bounds_empty(&self.lower, &self.upper) {
            self.done = true;
            return;
        }
        let spaces = self.snap.shared.spaces.read();
        let map = &spaces[self.space as usize];
        let range = map.range::<Vec<u8>, _>((self.lower.clone(), self.upper.clone()));
        let mut last: Option<Vec<u8>> = None;
        let mut scanned = 0usize;
        let chunk = self.chunk;
        self.chunk = (chunk * 2).min(ITER_CHUNK_ENTRIES);
        let mut push = |k: &Vec<u8>, v: &Versions, buf: &mut VecDeque<KvPair>| {
            scanned += 1;
            if let Some(Some(val)) = visible(v, self.snap.seq) {
                buf.push_back((k.clone(), val.to_vec()));
            }
            last = Some(k.clone());
            scanned < chunk
        };
        if self.reverse {
            for (k, v) in range.rev() {
                if !push(k, v, &mut self.buf) {
                    break;
                }
            }
        } else {
            for (k, v) in range {
                if !push(k, v, &mut self.buf) {
                    break;
                }
            }
        }
        match last {
            None => self.done = true,
            Some(k) => {
                if self.reverse {
                    self.upper = Bound::Excluded(k);
                } else {
                    self.lower = Bound::Excluded(k);
                }
            }
        }
    }
}

impl Iterator for MemIter<'_> {
    type Item = Result<KvPair>;
    fn next(&mut self) -> Option<Self::Item> {
        while self.buf.is_empty() && !self.done {
            self.fill();
        }
        self.buf.pop_front().map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_engine_suite() {
        super::super::tests::engine_suite(&MemoryEngine::new());
    }

    #[test]
    fn a_crash_image_holds_what_was_synced_and_nothing_after() {
        let e = MemoryEngine::crashable();
        let put = |k: &[u8], v: u32| {
            let mut b = Batch::new();
            b.put(Space::Records, k.to_vec(), v.to_be_bytes().to_vec());
            e.write(b).unwrap();
        };
        put(b"a", 1);
        put(b"b", 1);
        e.sync().unwrap();
        // Overwritten many times after the sync: the synced version must survive pruning.
        for v in 2..50 {
            put(b"a", v);
        }
        put(b"c", 1);
        let mut del = Batch::new();
        del.delete(Space::Records, b"b".to_vec());
        e.write(del).unwrap();
        let image = e.crash_image();
        let snap = image.snapshot();
        assert_eq!(snap.get(Space::Records, b"a").unwrap(), Some(1u32.to_be_bytes().to_vec()));
        assert_eq!(snap.get(Space::Records, b"b").unwrap(), Some(1u32.to_be_bytes().to_vec()));
        assert_eq!(snap.get(Space::Records, b"c").unwrap(), None);
        // The image is crashable in turn, and a sync moves what survives.
        e.sync().unwrap();
        let snap = e.crash_image().snapshot();
        assert_eq!(snap.get(Space::Records, b"a").unwrap(), Some(49u32.to_be_bytes().to_vec()));
        assert_eq!(snap.get(Space::Records, b"b").unwrap(), None);
        drop(snap);
        let again = image.crash_image();
        assert_eq!(again.snapshot().get(Space::Records, b"c").unwrap(), None);
    }

    #[test]
    fn old_versions_are_pruned_when_no_snapshot_needs_them() {
        let e = MemoryEngine::new();
        for i in 0..100u32 {
            let mut b = Batch::new();
            b.put(Space::Records, b"k".to_vec(), i.to_be_bytes().to_vec());
            e.write(b).unwrap();
        }
        let spaces = e.shared.spaces.read();
        // The newest version, plus the one before it (visible to a snapshot that registers
        // while a write is in progress) until the key is written again.
        assert!(spaces[Space::Records as usize].get(b"k".as_slice()).is_some_and(|v| v.len() <= 2));
    }
}
