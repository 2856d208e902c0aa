//! The primary's position page: a page of shared memory (a file in /dev/shm) where a primary
//! keeps how far its acknowledged writes reach and the term it is primary in. A secondary on
//! the same host maps it and answers "where did the primary stand when this read arrived"
//! with a load from memory instead of a round trip (what the vendor does with one-sided
//! RDMA reads of the primary's log position). Elsewhere the file cannot be opened and the
//! secondary asks over TCP (`strict`).
//!
//! Only the owner writes; readers check the magic and a random nonce (from the owner's
//! replSetGetAcknowledged reply), so a leftover file of an earlier process is never taken
//! for the live one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"shoalpos");
const PAGE_BYTES: usize = 4096;
/// The directory of the pages: tmpfs on Linux.
const SHM_DIR: &str = "/dev/shm";

#[repr(C)]
struct Layout {
    magic: AtomicU64,
    nonce: AtomicU64,
    /// The term this member is primary in, or -1 while it is not primary.
    primary_term: AtomicI64,
    /// The newest entry of an acknowledged write (`secs << 32 | inc`).
    acknowledged_ts: AtomicU64,
}

pub struct PositionPage {
    ptr: std::ptr::NonNull<Layout>,
    /// Set on the owner's page: removed when dropped.
    owned: Option<PathBuf>,
}

// SAFETY: the page is only accessed through atomics, and the mapping lives as long as the
// value.
unsafe impl Send for PositionPage {}
unsafe impl Sync for PositionPage {}

impl PositionPage {
    /// Create this process's page for a member serving `port` (None where shared memory is
    /// not available: strict reads then always ask over TCP). Pages left by processes that
    /// are gone (killed, or exited without dropping theirs), or by an earlier server on the
    /// same port, are removed.
    pub fn create(port: u16) -> Option<PositionPage> {
        let prefix = format!("shoal-{port}-");
        if let Ok(entries) = std::fs::read_dir(SHM_DIR) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(rest) = name.strip_prefix("shoal-").and_then(|r| r.strip_suffix(".position")) else { continue };
                let pid = rest.rsplit_once('-').and_then(|(_, pid)| pid.parse::<u32>().ok());
                let gone = pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                if gone || name.starts_with(&prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let path = Path::new(SHM_DIR).join(format!("{prefix}{}.position", std::process::id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).ok()?;
        if file.set_len(PAGE_BYTES as u64).is_err() {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let Some(ptr) = map(&file, true) else {
            let _ = std::fs::remove_file(&path);
            return None;
        };
        let page = PositionPage { ptr, owned: Some(path) };
        let l = page.layout();
        l.nonce.store(rand::random::<u64>() | 1, Ordering::SeqCst);
        l.primary_term.store(-1, Ordering::SeqCst);
        l.acknowledged_ts.store(0, Ordering::SeqCst);
        l.magic.store(MAGIC, Ordering::SeqCst);
        Some(page)
    }

    /// Map another process's page, if it is on this host and is the one `nonce` names.
    pub fn open(path: &str, nonce: u64) -> Option<PositionPage> {
        let path = Path::new(path);
        // Only pages in the shared-memory directory: a peer names the file.
        if path.parent() != Some(Path::new(SHM_DIR)) {
            return None;
        }
        let file = std::fs::File::open(path).ok()?;
        if file.metadata().ok()?.len() < PAGE_BYTES as u64 {
            return None;
        }
        let page = PositionPage { ptr: map(&file, false)?, owned: None };
        let l = page.layout();
        (l.magic.load(Ordering::SeqCst) == MAGIC && l.nonce.load(Ordering::SeqCst) == nonce).then_some(page)
    }

    fn layout(&self) -> &Layout {
        // SAFETY: `ptr` is a live mapping of PAGE_BYTES, aligned to a page.
        unsafe { self.ptr.as_ref() }
    }

    pub fn path(&self) -> Option<&Path> {
        self.owned.as_deref()
    }

    pub fn nonce(&self) -> u64 {
        self.layout().nonce.load(Ordering::SeqCst)
    }

    /// Owner: this member is primary in `term`, or (None) no longer primary.
    pub fn set_primary(&self, term: Option<i64>) {
        self.layout().primary_term.store(term.unwrap_or(-1), Ordering::SeqCst);
    }

    /// Owner: a write logged through `ts` is acknowledged.
    pub fn note_acknowledged(&self, ts: u64) {
        self.layout().acknowledged_ts.fetch_max(ts, Ordering::SeqCst);
    }

    /// Reader: how far the owner's acknowledged writes reach, if it is primary in `term`.
    pub fn acknowledged_in(&self, term: i64) -> Option<u64> {
        let l = self.layout();
        // Read the position after the term: a position read with a term still current when
        // read is one the owner reached as that term's primary (or later).
        (l.primary_term.load(Ordering::SeqCst) == term).then(|| l.acknowledged_ts.load(Ordering::SeqCst))
    }
}

fn map(file: &std::fs::File, writable: bool) -> Option<std::ptr::NonNull<Layout>> {
    use std::os::fd::AsRawFd;
    let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
    // SAFETY: maps PAGE_BYTES of a file at least that long; the result is checked.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), PAGE_BYTES, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return None;
    }
    std::ptr::NonNull::new(p.cast::<Layout>())
}

impl Drop for PositionPage {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `map`, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), PAGE_BYTES) };
        if let Some(p) = &self.owned {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_sees_the_owners_position_only_while_it_is_primary_in_that_term() {
        let Some(owner) = PositionPage::create(1) else { return };
        let path = owner.path().unwrap().to_str().unwrap().to_string();
        assert!(PositionPage::open(&path, owner.nonce() ^ 2).is_none(), "a wrong nonce is another process's page");
        assert!(PositionPage::open("/etc/passwd", owner.nonce()).is_none());
        let reader = PositionPage::open(&path, owner.nonce()).unwrap();
        assert_eq!(reader.acknowledged_in(3), None);
        owner.set_primary(Some(3));
        owner.note_acknowledged(42);
        owner.note_acknowledged(41);
        assert_eq!(reader.acknowledged_in(3), Some(42));
        assert_eq!(reader.acknowledged_in(4), None, "a newer term's primary is another member");
        owner.set_primary(None);
        assert_eq!(reader.acknowledged_in(3), None);
        drop(owner);
        assert!(!Path::new(&path).exists());
    }
}
