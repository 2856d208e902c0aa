//! Reads at a past point in time (readConcern "snapshot" with `atClusterTime`).
//!
//! Three pieces, all in memory:
//! - **Pins**: an engine snapshot taken about once a second (`Store::keep_snapshot_history`),
//!   kept for the history window (mongod's `minSnapshotHistoryWindowInSeconds`). The oldest
//!   pin's registration keeps, through the engine's compactions, every version written since
//!   it, so a view at any later position reads exactly (`EngineSnapshot::later`).
//! - **Boundaries**: for each write that moved the applied point of the oplog (a primary's
//!   logged batch, a secondary's applied batch), the newest entry's timestamp and the engine
//!   position just after it. A read at cluster time T reads at the position of the newest
//!   boundary at or before T, if no entry between that boundary and T was applied later
//!   (T inside a batch cannot be read exactly: SnapshotUnavailable).
//! - **Catalog changes**: the position of each namespace's last drop or rename, so a read
//!   at an earlier position refuses (SnapshotUnavailable), since the catalog it would read
//!   through is today's. An index that became ready after a view's position is hidden from
//!   that view (`CollState::snapshot`).
//!
//! History is kept while it is used: from the first read at a point in time until a window
//! passes without one (`last_used_secs`). A pin keeps, in fjall, every version written since
//! and the table and memtable sets of that time, so an idle window costs nothing: no pins,
//! no boundaries. The first read without a point of its own reads now
//! (`Store::snapshot_now`), which needs no history, and starts it.
//!
//! Cost while in use: ordinary reads pay nothing; each logged or applied write pushes 16
//! bytes under the oplog lock it already holds; the engine keeps superseded versions, and
//! the memtables and tables they are in, for the window.

use super::*;
use std::collections::VecDeque;

/// Write batches whose boundaries are kept, whatever the window: 16 MiB. Past this, history
/// is the newest this many batches.
pub const SNAPSHOT_BOUNDARIES_MAX: usize = 1 << 20;
/// mongod's default `minSnapshotHistoryWindowInSeconds`.
pub const SNAPSHOT_HISTORY_WINDOW_SECONDS_DEFAULT: u64 = 300;

pub(crate) struct History {
    /// Held snapshots, oldest first, with the second (of the caller's clock) each was taken.
    pins: VecDeque<(u64, Arc<dyn EngineSnapshot>)>,
    /// (newest applied entry's timestamp, engine position after it), oldest first.
    boundaries: VecDeque<(u64, u64)>,
    /// Namespace -> the engine position after its last drop or rename.
    catalog_changes: HashMap<(String, String), u64>,
    pub(crate) window_secs: u64,
    /// The clock of the last `keep_snapshot_history` call, in seconds.
    now_secs: u64,
    /// When a read last used history; None while it is not kept.
    last_used_secs: Option<u64>,
}

impl Default for History {
    fn default() -> Self {
        History {
            pins: VecDeque::new(),
            boundaries: VecDeque::new(),
            catalog_changes: HashMap::new(),
            window_secs: SNAPSHOT_HISTORY_WINDOW_SECONDS_DEFAULT,
            now_secs: 0,
            last_used_secs: None,
        }
    }
}

impl History {
    /// A read uses history: keep it (from `pin`, the state as of entry `applied`, if none is
    /// kept yet).
    fn use_from(&mut self, pin: Arc<dyn EngineSnapshot>, applied: Option<u64>) {
        self.last_used_secs = Some(self.now_secs);
        if self.pins.is_empty() {
            self.push_pin(pin, applied);
        }
    }

    /// Keep `pin`, with its boundary when it is the state as of entry `applied`.
    fn push_pin(&mut self, pin: Arc<dyn EngineSnapshot>, applied: Option<u64>) {
        if let Some(ts) = applied.filter(|ts| *ts > 0 && self.boundaries.back().is_none_or(|&(t, _)| t < *ts)) {
            self.boundaries.push_back((ts, pin.position()));
        }
        let now = self.now_secs;
        self.pins.push_back((now, pin));
    }
}

fn shown(ts: u64) -> String {
    format!("Timestamp({}, {})", ts >> 32, ts & 0xffff_ffff)
}

fn snapshot_too_old(ts: u64) -> Error {
    Error::new(Code::SnapshotTooOld, format!("Read timestamp {} is older than the oldest available timestamp.", shown(ts)))
}

impl Shared {
    /// The oplog's applied point moved to `ts` with the write that just completed (the
    /// caller holds the oplog lock, so boundaries arrive in order).
    pub(crate) fn note_applied(&self, ts: u64) {
        let mut h = self.history.lock();
        if h.pins.is_empty() {
            // No reader can use history before the first pin.
            return;
        }
        let position = self.engine.position();
        if h.boundaries.back().is_some_and(|&(t, _)| t >= ts) {
            return;
        }
        if h.boundaries.len() >= SNAPSHOT_BOUNDARIES_MAX {
            h.boundaries.pop_front();
        }
        h.boundaries.push_back((ts, position));
    }

    /// Forget the boundaries after `ts` (rollback took those entries back).
    pub(crate) fn forget_boundaries_after(&self, ts: u64) {
        let mut h = self.history.lock();
        while h.boundaries.back().is_some_and(|&(t, _)| t > ts) {
            h.boundaries.pop_back();
        }
    }

    /// A namespace was dropped or renamed by the write that just completed.
    pub(crate) fn note_catalog_change(&self, db: &str, name: &str) {
        let position = self.engine.position();
        let mut h = self.history.lock();
        if !h.pins.is_empty() {
            h.catalog_changes.insert((db.to_string(), name.to_string()), position);
        }
    }
}

impl Store {
    /// Take a pin and let go of those the window no longer needs; `now_secs` is the
    /// caller's clock in seconds. Called about once a second.
    pub fn keep_snapshot_history(&self, now_secs: u64) {
        let shared = &self.inner.shared;
        {
            let mut h = shared.history.lock();
            h.now_secs = now_secs;
            if h.last_used_secs.is_none_or(|used| used + h.window_secs < now_secs) {
                // Unused for a window: keep nothing.
                h.last_used_secs = None;
                h.pins.clear();
                h.boundaries.clear();
                h.catalog_changes.clear();
                return;
            }
        }
        self.with_pin(|h, pin, applied| {
            h.push_pin(pin, applied);
            // Keep the newest pin taken at or before the window's start: it covers the window.
            let start = now_secs.saturating_sub(h.window_secs);
            while h.pins.len() > 1 && h.pins[1].0 <= start {
                h.pins.pop_front();
            }
            let floor = h.pins.front().map_or(0, |(_, p)| p.position());
            while h.boundaries.front().is_some_and(|&(_, p)| p < floor) {
                h.boundaries.pop_front();
            }
            h.catalog_changes.retain(|_, p| *p >= floor);
        });
    }

    /// `f` with the history, an engine snapshot and, with every written entry applied, the
    /// newest entry's timestamp: the snapshot is the state as of that entry. (Mid-batch, a
    /// secondary may have applied part of the next entries: then no entry.) All under the
    /// oplog lock, so no write slips between the snapshot and what `f` records of it.
    fn with_pin(&self, f: impl FnOnce(&mut History, Arc<dyn EngineSnapshot>, Option<u64>)) {
        let shared = &self.inner.shared;
        let log = shared.oplog.read().clone();
        let st = log.as_ref().map(|l| l.state.lock());
        let pin = shared.engine.snapshot();
        let applied = st.as_ref().filter(|st| st.applied_through.is_none()).map(|st| st.last.ts);
        f(&mut shared.history.lock(), pin, applied);
    }

    /// A read at the newest applied point, for a snapshot read that names none: the view,
    /// the point and its entry's optime (which the read waits to be majority-committed).
    /// Starts keeping history, so later reads at this point find it. None on a secondary in
    /// the middle of applying a batch.
    /// Waits while a prepared transaction is undecided (`prepared.rs`).
    pub fn snapshot_now(&self) -> Result<Option<(Arc<dyn EngineSnapshot>, OpTime)>> {
        let shared = &self.inner.shared;
        let Some(log) = shared.oplog.read().clone() else { return Ok(None) };
        loop {
            shared.wait_for_prepared(None)?;
            let st = log.state.lock();
            if st.applied_through.is_some() || st.last.ts == 0 {
                return Ok(None);
            }
            // Prepared since the wait: its commit may come at or before this point.
            if shared.prepared_conflict(None) {
                continue;
            }
            let view = shared.engine.snapshot();
            let last = st.last;
            shared.history.lock().use_from(view.clone(), Some(last.ts));
            return Ok(Some((view, last)));
        }
    }

    /// mongod's `minSnapshotHistoryWindowInSeconds`.
    pub fn set_snapshot_history_window(&self, secs: u64) {
        self.inner.shared.history.lock().window_secs = secs;
    }

    pub fn snapshot_history_window(&self) -> u64 {
        self.inner.shared.history.lock().window_secs
    }

    /// Forget every boundary: the data before now is not a state any reader may see (an
    /// initial sync's copy, until the oplog brings it to a consistent point).
    pub fn reset_snapshot_history(&self) {
        let mut h = self.inner.shared.history.lock();
        h.boundaries.clear();
    }

    /// The newest applied boundary at or before `ts` (what a read without a chosen time
    /// reads at, for `ts` the majority commit point): None if history holds none.
    pub fn snapshot_boundary_at_or_before(&self, ts: u64) -> Option<u64> {
        self.use_history();
        let h = self.inner.shared.history.lock();
        let i = h.boundaries.partition_point(|&(t, _)| t <= ts);
        (i > 0).then(|| h.boundaries[i - 1].0)
    }

    /// An engine view of the data as of cluster time `ts`, which this member has applied,
    /// and the optime of the newest entry at or before `ts` (what must be majority-committed
    /// for the read to be): SnapshotTooOld when history no longer reaches it,
    /// SnapshotUnavailable when `ts` falls inside one write of several entries.
    /// Waits while a transaction prepared at or before `ts` is undecided, and sees those
    /// committed at or before it (`prepared.rs`).
    pub fn snapshot_at(&self, ts: u64) -> Result<(Arc<dyn EngineSnapshot>, OpTime)> {
        let shared = &self.inner.shared;
        // Entries logged from now on come after `ts` (applied already): none prepares at or
        // before it.
        shared.wait_for_prepared(Some(ts))?;
        self.use_history();
        let (bts, position, pin, newest) = {
            let h = shared.history.lock();
            let i = h.boundaries.partition_point(|&(t, _)| t <= ts);
            let Some(&(bts, position)) = i.checked_sub(1).and_then(|i| h.boundaries.get(i)) else { return Err(snapshot_too_old(ts)) };
            // The newest pin at or before the position holds what the view reads.
            let j = h.pins.partition_point(|(_, p)| p.position() <= position);
            let Some((_, pin)) = j.checked_sub(1).and_then(|j| h.pins.get(j)) else { return Err(snapshot_too_old(ts)) };
            (bts, position, pin.clone(), i == h.boundaries.len())
        };
        let Some(log) = shared.oplog.read().clone() else { return Err(snapshot_too_old(ts)) };
        let now = shared.engine.snapshot();
        let lower = Bound::Included(record_key(log.coll.id, bts));
        let upper = Bound::Included(record_key(log.coll.id, ts));
        let mut entries = now.iter(Space::Records, lower, upper, true);
        let Some((_, newest_entry)) = entries.next().transpose()? else { return Err(snapshot_too_old(ts)) };
        let entry = bson::RawDocument::from_bytes(&newest_entry).ok().and_then(OpTime::from_raw).ok_or_else(|| corrupt("oplog entry"))?;
        // A later write applied entries after the boundary: one at or before `ts` makes
        // the point unreadable. (With no later boundary, none is applied yet.)
        if entry.ts > bts && !newest {
            return Err(Error::new(Code::SnapshotUnavailable, format!("Unable to read at {}: it falls within one write of several oplog entries", shown(ts))));
        }
        Ok((shared.with_prepared_commits(pin.later(position), ts), entry))
    }

    /// A view at `ts`, a point after every entry this member has: today's state, as no entry
    /// logged from now on is stamped at or before `ts` (`Shared::clock_floor`). For a member
    /// that logs its own writes (a primary). It then logs a no-op, stamped after `ts`, whose
    /// optime it returns: once that is majority-committed, any later primary holds it, so no
    /// primary after a failover stamps an entry at or before `ts` either (as mongod writes a
    /// no-op to reach a read's cluster time).
    pub fn snapshot_now_at(&self, ts: u64) -> Result<(Arc<dyn EngineSnapshot>, OpTime)> {
        let shared = &self.inner.shared;
        let Some(log) = shared.oplog.read().clone() else { return Err(snapshot_too_old(ts)) };
        let view = loop {
            shared.wait_for_prepared(None)?;
            let st = log.state.lock();
            if st.applied_through.is_some() {
                return Err(Error::internal("snapshot_now_at: a member that logs its writes applied every entry"));
            }
            if st.last.ts > ts {
                // Entries came after the point since the caller looked: it is in history now.
                drop(st);
                return self.snapshot_at(ts);
            }
            shared.clock_floor.fetch_max(ts, Ordering::AcqRel);
            // Prepared since the wait (at or before `ts`): its commit may come at or before it.
            if shared.prepared_conflict(None) {
                continue;
            }
            let view = shared.engine.snapshot();
            shared.history.lock().use_from(view.clone(), Some(st.last.ts));
            break view;
        };
        let noop = oplog::noop_entry(&doc! {"msg": "snapshot read at a later cluster time"}, oplog::wall_now_ms()).map_err(Error::bad_value)?;
        let at = shared.apply_logged_with(Batch::new(), vec![noop], None)?.ok_or_else(|| Error::internal("snapshot_now_at: the no-op was not logged"))?;
        debug_assert!(at.ts > ts);
        Ok((view, at))
    }

    /// A read uses history: keep it from now on if it is not kept.
    fn use_history(&self) {
        let shared = &self.inner.shared;
        {
            let mut h = shared.history.lock();
            if h.last_used_secs.is_some() {
                h.last_used_secs = Some(h.now_secs);
                return;
            }
        }
        // Under the oplog lock: a write between the first pin and its boundary would find no
        // pin, record no boundary, and the pin's would stand for a state without it.
        self.with_pin(|h, pin, applied| h.use_from(pin, applied));
    }

    /// This handle, reading through `view` (a snapshot read's): every collection it opens
    /// reads there. Writes through it fail.
    pub fn reading_at(&self, view: Arc<dyn EngineSnapshot>) -> Store {
        Store { inner: self.inner.clone(), ctx: self.ctx.read_at(view) }
    }

    /// A read through this handle's view (`reading_at`) of `db.name`, which was dropped or
    /// renamed after the view's position, would read today's catalog: SnapshotUnavailable.
    pub fn check_catalog_at_view(&self, db: &str, name: &str) -> Result<()> {
        let Some(view) = self.ctx.read_view() else { return Ok(()) };
        let h = self.inner.shared.history.lock();
        match h.catalog_changes.get(&(db.to_string(), name.to_string())) {
            Some(&changed) if changed > view.position() => Err(Error::new(
                Code::SnapshotUnavailable,
                format!("Unable to read from a snapshot due to pending collection catalog changes to {db}.{name}; please retry the operation."),
            )),
            _ => Ok(()),
        }
    }
}
