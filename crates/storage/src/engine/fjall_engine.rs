//! The durable engine: one fjall database with one keyspace per [`Space`]. A batch is one
//! fjall write batch (journaled atomically; flushed to the OS on commit, so it survives a
//! process kill); `sync` fsyncs the journal.

use super::memory::bounds_empty;
use super::{Batch, BatchOp, Engine, EngineSnapshot, KvIter, Space, SPACES};
use common::{Error, Result};
use fjall::{AbstractTree, Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use lsm_tree::Guard as _;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

pub(crate) fn engine_error(e: fjall::Error) -> Error {
    Error::internal(format!("storage engine error: {e}"))
}

pub struct FjallEngine {
    db: Database,
    spaces: [Keyspace; 3],
    fsync: bool,
    journal: JournalSync,
}

/// fsyncs fjall's active journal without holding fjall's journal lock.
///
/// `Database::persist(SyncData)` keeps the journal writer locked through the fsync, so no
/// batch can be appended while the disk works and group commit degrades to write, sync,
/// write, sync. Instead, `sync` flushes the journal buffer to the OS under fjall's lock
/// (`PersistMode::Buffer`, microseconds) and then fdatasyncs the same file through a handle
/// of our own; fsync covers the inode, whichever descriptor wrote the pages.
///
/// Which file: the active journal is the highest-numbered `<N>.jnl` in the data directory.
/// If fjall rotated after our flush, the bytes we flushed are in a sealed journal, and fjall
/// fsyncs a journal before sealing it (`journal::writer::Writer::rotate`), so syncing the
/// newest file is still enough. `tests::journal_sync_targets_the_active_journal`
/// checks the naming assumption against the fjall version we build with.
struct JournalSync {
    dir: std::path::PathBuf,
    /// The newest journal's number and an open handle to it.
    active: parking_lot::Mutex<Option<(u64, std::fs::File)>>,
    /// Set by a failed fsync. The kernel may have dropped the dirty pages it could not write,
    /// so a later fsync that succeeds proves nothing: every later sync fails too (as
    /// PostgreSQL and mongod treat fsync failure as fatal).
    failed: std::sync::atomic::AtomicBool,
}

impl JournalSync {
    fn newest_journal(&self) -> std::io::Result<Option<u64>> {
        let mut newest = None;
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let Some(n) = name.to_str().and_then(|n| n.strip_suffix(".jnl")).and_then(|n| n.parse::<u64>().ok()) else { continue };
            newest = newest.max(Some(n));
        }
        Ok(newest)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        if self.failed.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("an earlier journal fsync failed; restart the server"));
        }
        let r = self.sync_newest();
        if r.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        r
    }

    fn sync_newest(&self) -> std::io::Result<()> {
        let mut active = self.active.lock();
        // fjall names each new journal one above the last (`journal::writer::Writer::rotate`),
        // so after the first listing a stat of the next name finds rotations: a directory
        // listing on every sync cost a replica-set secondary 4-5% of its CPU.
        let newest = match active.as_ref() {
            Some((mut n, _)) => {
                while self.dir.join(format!("{}.jnl", n + 1)).try_exists()? {
                    n += 1;
                }
                n
            }
            None => self.newest_journal()?.ok_or_else(|| std::io::Error::other(format!("no journal file in {}", self.dir.display())))?,
        };
        if active.as_ref().map(|(n, _)| *n) != Some(newest) {
            let file = std::fs::File::open(self.dir.join(format!("{newest}.jnl")))?;
            *active = Some((newest, file));
        }
        match active.as_ref() {
            Some((_, file)) => file.sync_data(),
            None => Ok(()),
        }
    }
}

/// Memtable sizes of the records and index keyspaces: a sixteenth of the memory budget,
/// within these bounds. Larger memtables mean fewer tables for a point read to consult (64 MiB
/// costs 10-30% less CPU per YCSB operation here than 16 MiB), smaller ones leave more of a
/// small budget to the block cache.
/// fjall background workers (flushes and compactions); see `FjallEngine::open`.
const FJALL_WORKER_THREADS: usize = 1;
const MEMTABLE_BYTES_MIN: u64 = 8 << 20;
const MEMTABLE_BYTES_MAX: u64 = 64 << 20;
/// The catalog keyspace holds catalog entries and collection statistics: small and few.
const CATALOG_MEMTABLE_BYTES: u64 = 2 << 20;
/// fjall halts writers to a keyspace while 4 sealed memtables wait to be flushed
/// (`Keyspace::local_backpressure`), so a keyspace holds at most 4 sealed and 1 active.
const MEMTABLES_PER_SPACE_MAX: u64 = 5;
/// The block cache never gets less than this.
const BLOCK_CACHE_BYTES_MIN: u64 = 64 << 20;
/// fjall persists a keyspace's memtable size when it creates it, so a restart with another
/// budget keeps the old size. This file in the data directory records the size the
/// directory was created with, so the budget arithmetic uses the size actually in force.
const MEMTABLE_SIZE_FILE: &str = "shoal-memtable-bytes";
/// fjall's default, which data directories created before the file existed use.
const MEMTABLE_BYTES_FJALL_DEFAULT: u64 = 64 << 20;

/// The smallest budget `FjallEngine::open` accepts for a new data directory (mongod's
/// smallest cacheSizeGB, 0.25 GB).
pub const MEMORY_BYTES_MIN: u64 = 256 << 20;

/// The memtable size a new data directory gets for `memory_bytes`.
pub fn memtable_bytes_for(memory_bytes: u64) -> u64 {
    (memory_bytes / 16).clamp(MEMTABLE_BYTES_MIN, MEMTABLE_BYTES_MAX)
}

/// The most memory the memtables of all keyspaces can hold with data memtables of
/// `memtable_bytes`. The active memtable is rotated after the write that fills it, so each
/// keyspace can also briefly exceed this by the batches in flight; a batch is bounded by the
/// 48 MB message limit.
pub fn memtables_bytes_max(memtable_bytes: u64) -> u64 {
    MEMTABLES_PER_SPACE_MAX * (2 * memtable_bytes + CATALOG_MEMTABLE_BYTES)
}

fn memtable_bytes(space: Space, data_memtable_bytes: u64) -> u64 {
    match space {
        Space::Catalog => CATALOG_MEMTABLE_BYTES,
        Space::Records | Space::Index => data_memtable_bytes,
    }
}

/// The data memtable size of the directory at `path`: recorded, or chosen now for a new
/// directory (and recorded), or fjall's default for a directory from before the record.
fn data_memtable_bytes(path: &Path, memory_bytes: u64) -> Result<u64> {
    let file = path.join(MEMTABLE_SIZE_FILE);
    let io = |e: std::io::Error| Error::internal(format!("cannot use {}: {e}", file.display()));
    match std::fs::read_to_string(&file) {
        Ok(text) => text.trim().parse::<u64>().map_err(|_| Error::internal(format!("{} does not hold a number", file.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let existing = path.join("keyspaces").exists();
            let bytes = if existing { MEMTABLE_BYTES_FJALL_DEFAULT } else { memtable_bytes_for(memory_bytes) };
            std::fs::write(&file, bytes.to_string()).map_err(io)?;
            Ok(bytes)
        }
        Err(e) => Err(io(e)),
    }
}

impl FjallEngine {
    /// Open the engine with `memory_bytes` for its caches: the memtables take at most
    /// [`memtables_bytes_max`] of it and the block cache the rest, whatever the data size.
    pub fn open(path: &Path, memory_bytes: u64, fsync: bool) -> Result<FjallEngine> {
        if memory_bytes < MEMORY_BYTES_MIN {
            return Err(Error::new(
                common::Code::BadValue,
                format!("the storage cache must be at least {} MiB, not {} MiB", MEMORY_BYTES_MIN >> 20, memory_bytes >> 20),
            ));
        }
        std::fs::create_dir_all(path).map_err(|e| Error::internal(format!("cannot create data directory {}: {e}", path.display())))?;
        let memtable = data_memtable_bytes(path, memory_bytes)?;
        let memtables = memtables_bytes_max(memtable);
        let needed = (memtables + BLOCK_CACHE_BYTES_MIN).max(MEMORY_BYTES_MIN);
        if memory_bytes < needed {
            return Err(Error::new(
                common::Code::BadValue,
                format!(
                    "the storage cache must be at least {} MiB for this data directory ({} MiB memtables), not {} MiB",
                    needed >> 20,
                    memtable >> 20,
                    memory_bytes >> 20
                ),
            ));
        }
        // One background worker. With two or more, fjall's worker 0 hands every compaction
        // request back to the queue (so that it stays free for flushes) and takes it again at
        // once: while another worker compacts, worker 0 spins, a whole core on this 2-core
        // machine (seen as fjall::worker_pool::worker_tick and flume sends in profiles).
        let db = Database::builder(path).cache_size(memory_bytes - memtables).worker_threads(FJALL_WORKER_THREADS).open().map_err(engine_error)?;
        let open = |s: Space| db.keyspace(s.name(), || KeyspaceCreateOptions::default().max_memtable_size(memtable_bytes(s, memtable))).map_err(engine_error);
        let spaces = [open(Space::Catalog)?, open(Space::Records)?, open(Space::Index)?];
        let journal = JournalSync { dir: path.to_path_buf(), active: parking_lot::Mutex::new(None), failed: Default::default() };
        Ok(FjallEngine { db, spaces, fsync, journal })
    }
}

impl Engine for FjallEngine {
    fn snapshot(&self) -> Arc<dyn EngineSnapshot> {
        let snap = self.db.snapshot();
        Arc::new(FjallSnapshot { instant: snap.seqno(), snap, spaces: self.spaces.clone() })
    }

    fn position(&self) -> u64 {
        self.db.visible_seqno()
    }

    fn write(&self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut b = self.db.batch();
        for op in batch.ops {
            match op {
                BatchOp::Put(s, k, v) => b.insert(&self.spaces[s as usize], k, v),
                BatchOp::Delete(s, k) => b.remove(&self.spaces[s as usize], k),
            }
        }
        b.commit().map_err(engine_error)
    }

    fn sync(&self) -> Result<()> {
        self.db.persist(PersistMode::Buffer).map_err(engine_error)?;
        if self.fsync {
            self.journal.sync_data().map_err(|e| Error::internal(format!("journal fsync failed: {e}")))?;
        }
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.db.disk_space().unwrap_or_else(|_| SPACES.iter().map(|s| self.spaces[*s as usize].disk_space()).sum())
    }

    fn space_size_bytes(&self, space: Space) -> u64 {
        self.spaces[space as usize].disk_space()
    }
}

/// Reads at `instant` (fjall's sequence number: it sees the batches numbered below it),
/// which is the held snapshot's own or, for a view into the past (`later`), one after it.
/// The held snapshot stays registered with fjall, which keeps every version from its
/// instant on through compactions, so reads at any later instant stay exact.
///
/// Reads go to each keyspace's tree at the instant, as `fjall::Snapshot`'s own reads do.
struct FjallSnapshot {
    snap: fjall::Snapshot,
    instant: fjall::SeqNo,
    spaces: [Keyspace; 3],
}

fn lsm_error(e: lsm_tree::Error) -> Error {
    engine_error(fjall::Error::from(e))
}

impl EngineSnapshot for FjallSnapshot {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.spaces[space as usize].tree.get(key, self.instant).map_err(lsm_error)?.map(|v| v.to_vec()))
    }

    fn iter(&self, space: Space, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>, reverse: bool) -> KvIter<'_> {
        if bounds_empty(&lower, &upper) {
            return Box::new(std::iter::empty());
        }
        let it = self.spaces[space as usize].tree.range((lower, upper), self.instant, None);
        let map = |g: lsm_tree::IterGuardImpl| g.into_inner().map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(lsm_error);
        if reverse {
            Box::new(it.rev().map(map))
        } else {
            Box::new(it.map(map))
        }
    }

    fn position(&self) -> u64 {
        self.instant
    }

    fn written_at(&self, space: Space, key: &[u8]) -> Result<Option<u64>> {
        // A batch's entries all carry its sequence number; the view including it starts one
        // above.
        let entry = self.spaces[space as usize].tree.get_internal_entry(key, self.instant).map_err(lsm_error)?;
        Ok(entry.map(|e| e.key.seqno + 1))
    }

    fn later(&self, position: u64) -> Arc<dyn EngineSnapshot> {
        assert!(position >= self.instant, "a view reads at or after the snapshot it holds");
        Arc::new(FjallSnapshot { snap: self.snap.clone(), instant: position, spaces: self.spaces.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fjall_engine_suite() {
        let dir = crate::tests::TempDir::new("engine");
        let e = FjallEngine::open(dir.path(), MEMORY_BYTES_MIN, true).unwrap();
        super::super::tests::engine_suite(&e);
    }

    #[test]
    fn fjall_engine_survives_reopen() {
        let dir = crate::tests::TempDir::new("engine-reopen");
        {
            let e = FjallEngine::open(dir.path(), MEMORY_BYTES_MIN, true).unwrap();
            let mut b = Batch::new();
            b.put(Space::Catalog, b"a".to_vec(), b"1".to_vec());
            e.write(b).unwrap();
            e.sync().unwrap();
        }
        let e = FjallEngine::open(dir.path(), MEMORY_BYTES_MIN, true).unwrap();
        assert_eq!(e.snapshot().get(Space::Catalog, b"a").unwrap(), Some(b"1".to_vec()));
    }

    /// A view into the past reads the versions it needs after flushes and a major compaction,
    /// which drop every version no open snapshot can see.
    #[test]
    fn a_view_into_the_past_survives_compaction() {
        let dir = crate::tests::TempDir::new("engine-history");
        let e = FjallEngine::open(dir.path(), MEMORY_BYTES_MIN, true).unwrap();
        let put = |v: u32| {
            let mut b = Batch::new();
            b.put(Space::Records, b"k".to_vec(), v.to_be_bytes().to_vec());
            e.write(b).unwrap();
        };
        put(0);
        let pin = e.snapshot();
        let mut positions = Vec::new();
        for v in 1..50u32 {
            put(v);
            positions.push((v, e.position()));
            if v % 10 == 0 {
                e.spaces[Space::Records as usize].rotate_memtable_and_wait().unwrap();
            }
        }
        e.spaces[Space::Records as usize].major_compact().unwrap();
        for (v, at) in positions {
            assert_eq!(pin.later(at).get(Space::Records, b"k").unwrap(), Some(v.to_be_bytes().to_vec()), "version {v}");
        }
        drop(pin);
    }

    /// A directory keeps the memtable size it was created with: reopening it with a budget
    /// too small for those memtables is refused instead of exceeding the budget.
    #[test]
    fn a_directory_keeps_its_memtable_size_and_the_budget_must_cover_it() {
        let dir = crate::tests::TempDir::new("engine-memtable");
        assert!(FjallEngine::open(dir.path(), MEMORY_BYTES_MIN - 1, true).is_err());
        drop(FjallEngine::open(dir.path(), 1 << 30, true).unwrap());
        assert_eq!(data_memtable_bytes(dir.path(), MEMORY_BYTES_MIN).unwrap(), MEMTABLE_BYTES_MAX);
        assert!(memtables_bytes_max(MEMTABLE_BYTES_MAX) + BLOCK_CACHE_BYTES_MIN > MEMORY_BYTES_MIN);
        let e = FjallEngine::open(dir.path(), MEMORY_BYTES_MIN, true).err().expect("too small for 64 MiB memtables");
        assert!(e.message.contains("64 MiB memtables"), "{}", e.message);
        drop(FjallEngine::open(dir.path(), 1 << 30, true).unwrap());
        assert_eq!(memtable_bytes_for(MEMORY_BYTES_MIN), 16 << 20);
    }

    /// The journal file `JournalSync` fsyncs is the one fjall appends to: after a sync, the
    /// batch just written is in the newest `.jnl` file and in no other, also after fjall
    /// rotated to a new journal. (fjall preallocates journals, so look for the bytes, not the
    /// file length.)
    #[test]
    fn journal_sync_targets_the_active_journal() {
        let tmp = crate::tests::TempDir::new("engine-journal");
        let engine = FjallEngine::open(tmp.path(), MEMORY_BYTES_MIN, true).unwrap();
        let mut seen = Vec::new();
        for round in 0..3u8 {
            let marker: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(31).wrapping_add(round).wrapping_add(0x5a)).collect();
            let mut batch = Batch::new();
            batch.put(Space::Records, vec![round; 8], marker.clone());
            let before = engine.journal.newest_journal().unwrap().unwrap();
            engine.write(batch).unwrap();
            engine.sync().unwrap();
            let newest = engine.journal.newest_journal().unwrap().unwrap();
            seen.push(newest);
            let holding: Vec<String> = std::fs::read_dir(tmp.path())
                .unwrap()
                .map(|e| e.unwrap())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".jnl"))
                // fjall deletes journals it no longer needs in the background: one listed
                // but gone by the time it is read held nothing live.
                .filter(|e| std::fs::read(e.path()).is_ok_and(|bytes| bytes.windows(marker.len()).any(|w| w == marker.as_slice())))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            // fjall may rotate to a new journal in the background right after the write (seen
            // in CI): the batch is then in the journal it sealed, and fjall syncs a journal
            // when it seals it (`journal::Writer::rotate`), so it is durable either way.
            let sealed_after_write = newest > before && holding == vec![format!("{before}.jnl")];
            if !sealed_after_write {
                assert_eq!(holding, vec![format!("{newest}.jnl")], "round {round}");
                assert_eq!(engine.journal.active.lock().as_ref().map(|(n, _)| *n), Some(newest));
            }
            // fjall starts a new journal when a flush finds the active one over 64 MB: fill it
            // and flush, so that the next round writes to a new journal, which the sync must
            // find.
            if round < 2 {
                // Incompressible values: fjall may compress what it journals.
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ round as u64;
                for i in 0..65u32 {
                    let value: Vec<u8> = (0..1 << 20)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        })
                        .collect();
                    let mut batch = Batch::new();
                    batch.put(Space::Records, [&[round][..], &i.to_be_bytes()].concat(), value);
                    engine.write(batch).unwrap();
                }
                engine.spaces[Space::Records as usize].rotate_memtable_and_wait().unwrap();
            }
        }
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "each round used a newer journal: {seen:?}");
    }
}
