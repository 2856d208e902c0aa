//! A member's fail points (`configureFailPoint`, with `enableTestCommands`).

use net::fault::Hang;
use std::time::Duration;

/// Added before each sync of the journal flusher (`configureFailPoint: "journalFlushDelay"`):
/// a test makes this member's journal slower than replication to its secondaries.
static JOURNAL_FLUSH_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Longest journal flush delay a test may set.
pub const JOURNAL_FLUSH_DELAY_MS_MAX: u64 = 10_000;

pub fn set_journal_flush_delay(ms: u64) {
    JOURNAL_FLUSH_DELAY_MS.store(ms.min(JOURNAL_FLUSH_DELAY_MS_MAX), std::sync::atomic::Ordering::Relaxed);
}

pub fn journal_flush_delay() -> Option<Duration> {
    let ms = JOURNAL_FLUSH_DELAY_MS.load(std::sync::atomic::Ordering::Relaxed);
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// `initialSyncHangAfterDataCloning` (mongod's name): an initial sync holds after it cloned
/// the data, before it seeds its oplog, so a test can crash a member mid-sync.
pub static INITIAL_SYNC_CLONED_HANG: Hang = Hang::new();
/// `rsSyncApplyStop` (mongod's name): a secondary writes fetched entries to its oplog but
/// applies none, so its newest entry runs ahead of its data.
pub static APPLY_STOP: Hang = Hang::new();
