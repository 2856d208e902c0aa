//! Strict-consistency reads on a secondary: a read waits until this member has applied
//! every write the primary had acknowledged when the read arrived (w:1 included), as a read
//! on the primary would see them.
//!
//! Where the primary stood is asked of the primary (replSetGetAcknowledged), once
//! for many reads: an ask that starts after a read arrived answers for that read, so every
//! read that arrived while an ask was in flight shares the next one (the ReadIndex batching
//! of Raft). One asker task, one connection: under any number of reading threads the
//! primary sees at most one ask in flight from each secondary. A secondary on the
//! primary's host reads the primary's position page instead (`shm`): no ask at all.

use crate::{Counters, Host};
use bson::doc;
use common::{Code, Error, Result};
use net::peer::PeerConn;
use parking_lot::Mutex;
use repl::MemberState;
use std::sync::Arc;
use std::time::Duration;
use storage::OpTime;

/// How long one ask of the primary may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

pub struct PrimaryPosition {
    /// The primary's position page, when it is on this host (`shm`): read instead of asking.
    page: parking_lot::RwLock<Option<super::shm::PositionPage>>,
    state: Mutex<AskState>,
    /// Wakes the asker when `wanted` moves past `started`.
    wake: tokio::sync::Notify,
    /// The newest finished ask's generation.
    done: tokio::sync::watch::Sender<u64>,
}

struct AskState {
    /// The newest generation a reader waits for.
    wanted: u64,
    /// The newest generation whose ask has started.
    started: u64,
    /// The newest finished ask: its generation and what the primary said.
    last: (u64, Result<OpTime>),
}

impl Default for PrimaryPosition {
    fn default() -> Self {
        PrimaryPosition {
            page: parking_lot::RwLock::new(None),
            state: Mutex::new(AskState { wanted: 0, started: 0, last: (0, Ok(OpTime::default())) }),
            wake: tokio::sync::Notify::new(),
            done: tokio::sync::watch::channel(0).0,
        }
    }
}

impl PrimaryPosition {
    /// Where the primary's acknowledged writes reach now, read from its position page, if
    /// this member maps one and its owner is primary in `term` (the newest this member knows).
    pub fn read_page(&self, term: i64) -> Option<u64> {
        self.page.read().as_ref()?.acknowledged_in(term)
    }

    /// Where the primary's acknowledged writes reach, asked after this call began; None when
    /// `deadline` passed first.
    pub async fn after_now(&self, deadline: tokio::time::Instant) -> Option<Result<OpTime>> {
        let mut done = self.done.subscribe();
        let generation = {
            let mut s = self.state.lock();
            // An ask already started may have begun before this read arrived: the next one.
            let g = s.started + 1;
            s.wanted = s.wanted.max(g);
            g
        };
        self.wake.notify_one();
        loop {
            if *done.borrow_and_update() >= generation {
                let s = self.state.lock();
                debug_assert!(s.last.0 >= generation);
                return Some(s.last.1.clone());
            }
            if tokio::time::timeout_at(deadline, done.changed()).await.is_err() {
                return None;
            }
        }
    }
}

/// The asker: whenever readers wait, ask the primary where it stands, one ask for all of
/// them.
pub async fn ask_loop(shared: Arc<dyn Host>) {
    let coord = shared.coord().expect("replica set member");
    let position = &coord.primary_position;
    let mut conn: Option<PeerConn> = None;
    loop {
        let notified = position.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let generation = {
            let mut s = position.state.lock();
            if s.wanted <= s.started {
                None
            } else {
                // Every reader registered so far arrived before this ask starts.
                s.started = s.wanted;
                Some(s.wanted)
            }
        };
        let Some(generation) = generation else {
            notified.await;
            continue;
        };
        Counters::add(&shared.counters().strict_asks, 1);
        let r = ask(shared.as_ref(), &mut conn).await;
        if r.is_err() {
            conn = None;
        }
        position.state.lock().last = (generation, r);
        position.done.send_replace(generation);
    }
}

async fn ask(shared: &dyn Host, conn: &mut Option<PeerConn>) -> Result<OpTime> {
    let coord = shared.coord().expect("replica set member");
    let host = {
        let inner = coord.inner.lock();
        if inner.state == MemberState::Primary {
            drop(inner);
            return Ok(coord.acknowledged(shared.store()));
        }
        let config = inner.config.as_ref().ok_or_else(|| Error::new(Code::NotYetInitialized, "no replica set config"))?;
        let primary = inner.peers.iter().position(|p| p.view.up && p.view.state == Some(MemberState::Primary));
        match primary {
            Some(p) => config.members[p].host.clone(),
            None => return Err(no_primary("no primary is known")),
        }
    };
    if conn.as_ref().is_some_and(|c| c.is_broken() || c.host != host) {
        *conn = None;
    }
    if conn.is_none() {
        *conn = Some(PeerConn::connect(&host, ASK_TIMEOUT).await?);
    }
    let reply = conn.as_mut().expect("connected").command("admin", doc! {"replSetGetAcknowledged": 1}, ASK_TIMEOUT).await?;
    if !reply.get_bool("isWritablePrimary").unwrap_or(false) {
        return Err(no_primary(&format!("{host} is no longer primary")));
    }
    if let Ok(p) = reply.get_document("positionPage") {
        let (path, nonce) = (p.get_str("path").unwrap_or(""), p.get_i64("nonce").unwrap_or(0) as u64);
        let position = &coord.primary_position;
        if position.page.read().as_ref().is_none_or(|page| page.nonce() != nonce) {
            // Opens only on the same host; elsewhere the asks go on.
            *position.page.write() = super::shm::PositionPage::open(path, nonce);
        }
    }
    reply
        .get_document("acknowledgedOpTime")
        .ok()
        .and_then(OpTime::from_doc)
        .ok_or_else(|| Error::new(Code::ProtocolError, format!("{host}'s replSetGetAcknowledged has no acknowledgedOpTime")))
}

fn no_primary(why: &str) -> Error {
    Error::new(Code::FailedToSatisfyReadPreference, format!("cannot serve a strict-consistency read: {why}"))
}
