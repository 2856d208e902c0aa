//! The durable engine: one fjall database with one keyspace per [`Space`]. A batch is one
//! fjall write batch (journaled atomically; flushed to the OS on commit, so it survives a
//! process kill); `sync` fsyncs the journal.

use super::memory::bounds_empty;
use super::{Batch, BatchOp, Engine, EngineSnapshot, KvIter, Space, SPACES};
use common::{Error, Result};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable};
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
}

impl FjallEngine {
    pub fn open(path: &Path, cache_size_bytes: u64, fsync: bool) -> Result<FjallEngine> {
        std::fs::create_dir_all(path).map_err(|e| Error::internal(format!("cannot create data directory {}: {e}", path.display())))?;
        let db = Database::builder(path).cache_size(cache_size_bytes).open().map_err(engine_error)?;
        let open = |s: Space| db.keyspace(s.name(), KeyspaceCreateOptions::default).map_err(engine_error);
        let spaces = [open(Space::Catalog)?, open(Space::Records)?, open(Space::Index)?];
        Ok(FjallEngine { db, spaces, fsync })
    }
}

impl Engine for FjallEngine {
    fn snapshot(&self) -> Arc<dyn EngineSnapshot> {
        Arc::new(FjallSnapshot { snap: self.db.snapshot(), spaces: self.spaces.clone() })
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
        let mode = if self.fsync { PersistMode::SyncAll } else { PersistMode::Buffer };
        self.db.persist(mode).map_err(engine_error)
    }

    fn size_bytes(&self) -> u64 {
        self.db.disk_space().unwrap_or_else(|_| SPACES.iter().map(|s| self.spaces[*s as usize].disk_space()).sum())
    }

    fn space_size_bytes(&self, space: Space) -> u64 {
        self.spaces[space as usize].disk_space()
    }
}

struct FjallSnapshot {
    snap: fjall::Snapshot,
    spaces: [Keyspace; 3],
}

impl EngineSnapshot for FjallSnapshot {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.snap.get(&self.spaces[space as usize], key).map_err(engine_error)?.map(|v| v.to_vec()))
    }

    fn iter(&self, space: Space, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>, reverse: bool) -> KvIter<'_> {
        if bounds_empty(&lower, &upper) {
            return Box::new(std::iter::empty());
        }
        let it = self.snap.range(&self.spaces[space as usize], (lower, upper));
        let map = |g: fjall::Guard| g.into_inner().map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(engine_error);
        if reverse {
            Box::new(it.rev().map(map))
        } else {
            Box::new(it.map(map))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fjall_engine_suite() {
        let dir = crate::tests::TempDir::new("engine");
        let e = FjallEngine::open(dir.path(), 8 << 20, true).unwrap();
        super::super::tests::engine_suite(&e);
    }

    #[test]
    fn fjall_engine_survives_reopen() {
        let dir = crate::tests::TempDir::new("engine-reopen");
        {
            let e = FjallEngine::open(dir.path(), 8 << 20, true).unwrap();
            let mut b = Batch::new();
            b.put(Space::Catalog, b"a".to_vec(), b"1".to_vec());
            e.write(b).unwrap();
            e.sync().unwrap();
        }
        let e = FjallEngine::open(dir.path(), 8 << 20, true).unwrap();
        assert_eq!(e.snapshot().get(Space::Catalog, b"a").unwrap(), Some(b"1".to_vec()));
    }
}
