//! Events made once and shared by every stream that would make the same ones: streams of
//! one kind (`Kind`: what they watch and the options that shape events, with no stage after
//! `$changeStream`) return the same bytes for an oplog entry, so the first stream to reach
//! an entry decodes it, builds its events and encodes them, and the others take the encoded
//! events from here and send them as they are. The cost of an event is then paid once per
//! kind, not once per stream.
//!
//! The cache keeps the newest entries' events, up to FEED_BYTES_MAX; a stream that reads
//! further back makes its own events, which are not kept.

use super::token::Position;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of encoded events the cache keeps.
pub const FEED_BYTES_MAX: usize = 32 << 20;

/// What decides a stream's events, besides the oplog: equal kinds make equal bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kind {
    /// The scope (`Collection`, `Database`, `Cluster` with its names), as text.
    pub scope: String,
    pub show_expanded_events: bool,
    pub full_document: u8,
    pub before_change: u8,
    pub split_large: bool,
}

/// One event (or fragment) as sent.
#[derive(Clone)]
pub struct Encoded {
    pub at: Position,
    pub bytes: Arc<[u8]>,
    /// The stream ends after it (an invalidate).
    pub ends: bool,
}

/// The events of one entry for one kind, in order (none when the entry has none for it).
pub type Events = Arc<[Encoded]>;

#[derive(Default)]
pub struct Feed {
    inner: Mutex<Inner>,
    /// Streams waiting for the commit point to move (`Waiting`).
    waiting: AtomicUsize,
}

/// A woken stream's wait per stream waiting (`Feed::coalesce_delay`), and the most it waits.
const COALESCE_PER_STREAM: Duration = Duration::from_micros(40);
const COALESCE_MAX: Duration = Duration::from_millis(4);

/// A stream counted as waiting while this lives.
pub struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Inner {
    by_entry: HashMap<(u64, Kind), Events>,
    /// Insertion order, for eviction: the oldest first.
    order: VecDeque<((u64, Kind), usize)>,
    bytes: usize,
}

impl Feed {
    /// Count a stream as waiting for news until the guard is dropped.
    pub fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(&self.waiting)
    }

    /// How long a stream woken by news waits before it looks: each look (a getMore's round
    /// trip and wake-up) costs the server about as much as the events it returns, and with
    /// many streams open every commit point's move wakes them all. Waiting in proportion to
    /// the streams waiting, each looks less often and finds more, so the streams' cost grows
    /// with the events, not with the streams times the moves; one stream barely waits.
    pub fn coalesce_delay(&self) -> Duration {
        let n = self.waiting.load(Ordering::Relaxed) as u32;
        COALESCE_PER_STREAM.saturating_mul(n).min(COALESCE_MAX)
    }

    /// The events of the entry at `ts` for `kind`, if made.
    pub fn get(&self, ts: u64, kind: &Kind) -> Option<Events> {
        // The key is cloned for the lookup: a kind is a few small fields.
        self.inner.lock().by_entry.get(&(ts, kind.clone())).cloned()
    }

    /// Keep the events of the entry at `ts` for `kind`, evicting the oldest kept beyond
    /// FEED_BYTES_MAX.
    pub fn put(&self, ts: u64, kind: &Kind, events: Events) {
        // The events, and the key held twice (map and order) with its overhead.
        let size: usize = events.iter().map(|e| e.bytes.len() + 48).sum::<usize>() + 2 * (kind.scope.len() + 96);
        if size > FEED_BYTES_MAX / 4 {
            return;
        }
        let mut inner = self.inner.lock();
        let key = (ts, kind.clone());
        // Made by two streams at once: the first kept stays.
        if inner.by_entry.contains_key(&key) {
            return;
        }
        inner.by_entry.insert(key.clone(), events);
        inner.order.push_back((key, size));
        inner.bytes += size;
        while inner.bytes > FEED_BYTES_MAX {
            let Some((old, size)) = inner.order.pop_front() else { break };
            inner.by_entry.remove(&old);
            inner.bytes -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_events_are_kept_within_the_limit() {
        let feed = Feed::default();
        let kind = Kind { scope: "c:db.c".into(), show_expanded_events: false, full_document: 0, before_change: 0, split_large: false };
        let other = Kind { show_expanded_events: true, ..kind.clone() };
        let event = |ts: u64, n: usize| -> Events {
            Arc::from(vec![Encoded { at: Position { ts, index: 0, invalidate: false, fragment: 0 }, bytes: Arc::from(vec![0u8; n]), ends: false }])
        };
        feed.put(1, &kind, event(1, 10));
        assert!(feed.get(1, &kind).is_some());
        assert!(feed.get(1, &other).is_none());
        // Entries of a megabyte each: the oldest go once the cache is full.
        for ts in 2..100 {
            feed.put(ts, &kind, event(ts, 1 << 20));
        }
        assert!(feed.get(1, &kind).is_none());
        assert!(feed.get(99, &kind).is_some());
        assert!(feed.inner.lock().bytes <= FEED_BYTES_MAX);
    }
}
