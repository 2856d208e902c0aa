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
                // shoal-<port>-<pid>.position and shoal-<port>-<pid>-<stream>.ring.
                let Some(rest) = name.strip_prefix("shoal-").and_then(|r| r.strip_suffix(".position").or_else(|| r.strip_suffix(".ring"))) else { continue };
                let pid = rest.split('-').nth(1).and_then(|pid| pid.parse::<u32>().ok());
                let gone = pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                if gone || (name.starts_with(&prefix) && name.ends_with(".position")) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let path = Path::new(SHM_DIR).join(format!("{prefix}{}.position", std::process::id()));
        let ptr = create_mapped(&path, PAGE_BYTES)?.cast::<Layout>();
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
        let page = PositionPage { ptr: map_bytes(&file, PAGE_BYTES, false)?.cast::<Layout>(), owned: None };
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

impl Drop for PositionPage {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `map`, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), PAGE_BYTES) };
        if let Some(p) = &self.owned {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A push stream's ring of frames in shared memory (`logTransport: shm`), for a member on
/// its sync source's host: the source copies each batch's reply frame into the next slot
/// and the member reads it from there, with no socket in between and no system call while
/// frames keep coming (a futex wakes a member that waits). Credits keep the source from
/// reusing a slot the member has not released: there are as many slots as credits, and the
/// member returns a credit only after it released the slot. Acknowledgements still go over
/// the stream's TCP connection, which also announces the ring.
pub struct LogRing {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    slots: u64,
    /// Set on the source's side: the file is removed when dropped.
    owned: Option<PathBuf>,
}

// SAFETY: the header is only accessed through atomics; a slot is written by the source only
// while it holds the slot's credit and read by the member only after `written` published it.
unsafe impl Send for LogRing {}
unsafe impl Sync for LogRing {}

#[repr(C)]
struct RingHeader {
    magic: AtomicU64,
    nonce: AtomicU64,
    slots: AtomicU64,
    /// Frames published (monotonic); slot `n % slots` holds frame `n`.
    written: AtomicU64,
    /// Frames the member has released.
    read: AtomicU64,
    /// The futex word: bumped after every publish and on close.
    seq: std::sync::atomic::AtomicU32,
    /// The member sleeps on `seq`.
    waiting: std::sync::atomic::AtomicU32,
    closed: std::sync::atomic::AtomicU32,
}

const RING_MAGIC: u64 = u64::from_le_bytes(*b"shoalrng");
/// The header's page; slots follow.
const RING_HEADER_BYTES: usize = 4096;
/// A slot holds any frame the wire allows, after its 8-byte length.
const RING_SLOT_BYTES: usize = common::limits::MESSAGE_SIZE_MAX_BYTES + 8;
/// Slots (and so credits) of one ring.
pub const RING_SLOTS_MAX: u64 = 4;

impl LogRing {
    fn bytes(slots: u64) -> usize {
        RING_HEADER_BYTES + slots as usize * RING_SLOT_BYTES
    }

    /// The source's side: a ring of `slots` slots for stream `id` of this process.
    pub fn create(port: u16, id: u64, slots: u64) -> Option<LogRing> {
        let slots = slots.clamp(1, RING_SLOTS_MAX);
        let path = Path::new(SHM_DIR).join(format!("shoal-{port}-{}-{id}.ring", std::process::id()));
        // Sparse: only the pages frames touch take memory.
        let ptr = create_mapped(&path, Self::bytes(slots))?;
        let ring = LogRing { ptr, len: Self::bytes(slots), slots, owned: Some(path) };
        let h = ring.header();
        h.nonce.store(rand::random::<u64>() | 1, Ordering::SeqCst);
        h.slots.store(slots, Ordering::SeqCst);
        h.magic.store(RING_MAGIC, Ordering::SeqCst);
        Some(ring)
    }

    /// The member's side: the ring `path` names, if it is on this host and is the one
    /// `nonce` names.
    pub fn open(path: &str, nonce: u64) -> Option<LogRing> {
        let path = Path::new(path);
        if path.parent() != Some(Path::new(SHM_DIR)) {
            return None;
        }
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path).ok()?;
        let head = map_bytes(&file, RING_HEADER_BYTES, false)?;
        // SAFETY: a live mapping of the header page.
        let (magic, n, slots) = unsafe {
            let h = head.cast::<RingHeader>().as_ref();
            (h.magic.load(Ordering::SeqCst), h.nonce.load(Ordering::SeqCst), h.slots.load(Ordering::SeqCst))
        };
        // SAFETY: unmaps the header mapping made above.
        unsafe { libc::munmap(head.as_ptr().cast(), RING_HEADER_BYTES) };
        if magic != RING_MAGIC || n != nonce || !(1..=RING_SLOTS_MAX).contains(&slots) || file.metadata().ok()?.len() < Self::bytes(slots) as u64 {
            return None;
        }
        let ptr = map_bytes(&file, Self::bytes(slots), true)?;
        // Both sides have it mapped: the name is no longer needed, and without it a source
        // killed mid-stream leaves nothing behind in /dev/shm.
        let _ = std::fs::remove_file(path);
        Some(LogRing { ptr, len: Self::bytes(slots), slots, owned: None })
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: the mapping starts with the header page, page-aligned.
        unsafe { self.ptr.cast::<RingHeader>().as_ref() }
    }

    fn slot(&self, n: u64) -> *mut u8 {
        // SAFETY: n % slots < slots, so the slot lies within the mapping.
        unsafe { self.ptr.as_ptr().add(RING_HEADER_BYTES + (n % self.slots) as usize * RING_SLOT_BYTES) }
    }

    pub fn path(&self) -> Option<&Path> {
        self.owned.as_deref()
    }

    pub fn nonce(&self) -> u64 {
        self.header().nonce.load(Ordering::SeqCst)
    }

    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Source: publish `frame` in the next slot. The caller holds a credit for it, so the
    /// slot is free; a frame that cannot be in a slot (longer than the wire allows) or a slot
    /// still held is an error that ends the stream.
    pub fn publish(&self, frame: &[u8]) -> Result<(), String> {
        let h = self.header();
        let n = h.written.load(Ordering::SeqCst);
        if frame.len() + 8 > RING_SLOT_BYTES {
            return Err(format!("a {}-byte frame does not fit a ring slot", frame.len()));
        }
        if n - h.read.load(Ordering::SeqCst) >= self.slots {
            return Err("the ring's member holds every slot: a credit was returned early".into());
        }
        let slot = self.slot(n);
        // SAFETY: the slot is RING_SLOT_BYTES long, free (checked above), and only this
        // side writes it until `written` publishes it.
        unsafe {
            std::ptr::copy_nonoverlapping((frame.len() as u64).to_le_bytes().as_ptr(), slot, 8);
            std::ptr::copy_nonoverlapping(frame.as_ptr(), slot.add(8), frame.len());
        }
        h.written.store(n + 1, Ordering::SeqCst);
        self.wake();
        Ok(())
    }

    fn wake(&self) {
        let h = self.header();
        h.seq.fetch_add(1, Ordering::SeqCst);
        if h.waiting.load(Ordering::SeqCst) != 0 {
            futex_wake(&h.seq);
        }
    }

    /// Member: wait (at most `timeout`) for the next frame and run `f` on it; the slot is
    /// released when `f` returns. Err when the source closed the ring, nothing came, or
    /// `live` (asked every 100 ms of waiting) says to stop: a source killed outright never
    /// closes its ring, but its connection ends.
    pub fn recv<T>(&self, timeout: std::time::Duration, live: impl Fn() -> bool, f: impl FnOnce(&[u8]) -> T) -> Result<T, String> {
        let h = self.header();
        let deadline = std::time::Instant::now() + timeout;
        let n = h.read.load(Ordering::SeqCst);
        loop {
            if h.written.load(Ordering::SeqCst) > n {
                break;
            }
            if h.closed.load(Ordering::SeqCst) != 0 || !live() {
                return Err("the source closed the ring".into());
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(format!("nothing in the ring within {} ms", timeout.as_millis()));
            }
            // Announce the wait, then look again: a publish in between bumped `seq`, and the
            // futex returns at once.
            let seq = h.seq.load(Ordering::SeqCst);
            h.waiting.store(1, Ordering::SeqCst);
            if h.written.load(Ordering::SeqCst) == n && h.closed.load(Ordering::SeqCst) == 0 {
                futex_wait(&h.seq, seq, (deadline - now).min(std::time::Duration::from_millis(100)));
            }
            h.waiting.store(0, Ordering::SeqCst);
        }
        let slot = self.slot(n);
        // SAFETY: frame n is published (written > n), and the source does not touch its slot
        // until `read` moves past it; the length was written by the source, bounded below.
        let out = unsafe {
            let mut len = [0u8; 8];
            std::ptr::copy_nonoverlapping(slot, len.as_mut_ptr(), 8);
            let len = (u64::from_le_bytes(len) as usize).min(RING_SLOT_BYTES - 8);
            f(std::slice::from_raw_parts(slot.add(8), len))
        };
        h.read.store(n + 1, Ordering::SeqCst);
        Ok(out)
    }
}

impl Drop for LogRing {
    fn drop(&mut self) {
        if self.owned.is_some() {
            self.header().closed.store(1, Ordering::SeqCst);
            self.wake();
        }
        // SAFETY: unmaps the mapping made in `create` or `open`, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if let Some(p) = &self.owned {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Create `path` (replacing any file there) `len` bytes long and map it shared, writable;
/// None (and no file left) where that fails.
fn create_mapped(path: &Path, len: usize) -> Option<std::ptr::NonNull<u8>> {
    let mapped = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .ok()
        .filter(|file| file.set_len(len as u64).is_ok())
        .and_then(|file| map_bytes(&file, len, true));
    if mapped.is_none() {
        let _ = std::fs::remove_file(path);
    }
    mapped
}

fn map_bytes(file: &std::fs::File, len: usize, writable: bool) -> Option<std::ptr::NonNull<u8>> {
    use std::os::fd::AsRawFd;
    let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
    // SAFETY: maps `len` bytes of a file at least that long; the result is checked.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return None;
    }
    std::ptr::NonNull::new(p.cast::<u8>())
}

fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout: std::time::Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: a shared (not private) futex wait on a live, aligned u32; it returns on a wake,
    // a changed value, a signal or the timeout.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec) };
}

fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: wakes waiters on a live, aligned u32 of a shared mapping.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
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

    #[test]
    fn a_ring_carries_frames_in_order_across_mappings_and_reports_its_close() {
        let Some(source) = LogRing::create(2, 7, 2) else { return };
        let path = source.path().unwrap().to_str().unwrap().to_string();
        assert!(LogRing::open(&path, source.nonce() ^ 2).is_none());
        let member = LogRing::open(&path, source.nonce()).unwrap();
        assert_eq!(member.slots(), 2);
        let timeout = std::time::Duration::from_millis(50);
        assert!(member.recv(timeout, || true, |_| ()).is_err(), "nothing published yet");
        assert!(member.recv(std::time::Duration::from_secs(5), || false, |_| ()).is_err(), "the caller stops the wait");
        source.publish(b"first").unwrap();
        source.publish(&vec![7u8; 100_000]).unwrap();
        assert!(source.publish(b"third").is_err(), "both slots are held");
        assert_eq!(member.recv(timeout, || true, |f| f.to_vec()).unwrap(), b"first");
        source.publish(b"third").unwrap();
        assert_eq!(member.recv(timeout, || true, |f| f.len()).unwrap(), 100_000);
        assert_eq!(member.recv(timeout, || true, |f| f.to_vec()).unwrap(), b"third");
        // A member that waits is woken by the next publish.
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| member.recv(std::time::Duration::from_secs(5), || true, |f| f.to_vec()));
            std::thread::sleep(std::time::Duration::from_millis(50));
            source.publish(b"fourth").unwrap();
            assert_eq!(waiter.join().unwrap().unwrap(), b"fourth");
        });
        // The member removed the name once it had the ring mapped.
        assert!(!Path::new(&path).exists());
        drop(source);
        assert!(member.recv(timeout, || true, |_| ()).is_err(), "the source closed the ring");
    }
}
