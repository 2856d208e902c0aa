//! A secondary's replication: fetch the oplog from the sync source with a tailable,
//! awaitData find on its `local.oplog.rs` (what mongod's OplogFetcher does), apply each
//! batch, write the same entries into our own oplog with their original optimes, make them
//! durable, and report progress upstream with replSetUpdatePosition.
//!
//! Fetching and applying overlap: the next batch is fetched while the previous one is being
//! applied (at most one of each in flight).

use super::peer::PeerConn;
use crate::state::Shared;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use repl::MemberState;
use std::sync::Arc;
use std::time::Duration;
use storage::OpTime;

/// Entries per fetched batch.
const FETCH_BATCH_DOCS: i32 = 5000;
/// How long the sync source holds an empty getMore open waiting for new entries.
const AWAIT_DATA_MS: i64 = 1000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a command to the sync source may take beyond its own wait.
const REPLY_SLACK: Duration = Duration::from_secs(10);

pub async fn fetch_loop(shared: Arc<Shared>) {
    let coord = shared.repl.as_ref().expect("replica set member");
    loop {
        let fetching = matches!(coord.state(), MemberState::Secondary | MemberState::Startup2 | MemberState::Recovering);
        let Some((config, me)) = coord.config().filter(|_| fetching) else {
            let _ = tokio::time::timeout(Duration::from_millis(200), coord.wake.notified()).await;
            continue;
        };
        let last = shared.store.oplog_last().unwrap_or_default();
        let source = {
            let mut inner = coord.inner.lock();
            let views: Vec<repl::sync_source::PeerView> = inner.peers.iter().map(|p| p.view.clone()).collect();
            let s = repl::sync_source::choose(&config, me, &views, last);
            inner.sync_source = s;
            s
        };
        let Some(src) = source else {
            let _ = tokio::time::timeout(Duration::from_millis(100), coord.wake.notified()).await;
            continue;
        };
        let epoch = coord.epoch();
        match fetch_from(&shared, epoch, src, &config.members[src].host).await {
            Ok(()) => coord.set_info_message(""),
            Err(e) => {
                tracing::info!(source = %config.members[src].host, "oplog fetching stopped: {}", e.message);
                coord.set_info_message(e.message.clone());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Tail `host`'s oplog until this member should stop (it became primary, the config
/// changed, a better source appeared) or an error.
async fn fetch_from(shared: &Arc<Shared>, epoch: u64, src: usize, host: &str) -> Result<()> {
    let coord = shared.repl.as_ref().expect("replica set member");
    let mut conn = PeerConn::connect(host, CONNECT_TIMEOUT).await?;
    let last = shared.store.oplog_last().unwrap_or_default();
    let filter = if last == OpTime::default() { Document::new() } else { doc! {"ts": {"$gte": last.timestamp()}} };
    let find = doc! {"find": "oplog.rs", "filter": filter, "tailable": true, "awaitData": true, "batchSize": FETCH_BATCH_DOCS, "$replData": 1};
    let reply = conn.command("local", find, CONNECT_TIMEOUT + REPLY_SLACK).await?;
    let (mut id, mut batch) = cursor_batch(&reply, "firstBatch")?;
    on_repl_data(shared, &reply);
    // The first entry must be our newest one: then the two oplogs agree up to here.
    if last == OpTime::default() {
        let starts_set = batch.first().is_some_and(|e| e.get_str("op").ok() == Some("n") && e.get_document("o").is_ok_and(|o| o.get_str("msg").ok() == Some("initiating set")));
        if !starts_set {
            return Err(Error::new(
                Code::OplogStartMissing,
                format!("{host}'s oplog no longer starts at the set's beginning; this member needs an initial sync by copying data, which shoal does not do yet"),
            ));
        }
    } else {
        let first = batch.first().and_then(|e| OpTime::from_doc(e));
        if first != Some(last) {
            return Err(Error::new(
                Code::OplogStartMissing,
                format!("our last oplog entry {last:?} is not in {host}'s oplog (it has {first:?}): this member has writes the set does not, and rolling them back is not implemented yet"),
            ));
        }
        batch.remove(0);
    }
    let mut pending: Option<tokio::task::JoinHandle<Result<()>>> = None;
    let mut commit_seen = OpTime::default();
    loop {
        if !batch.is_empty() {
            if let Some(p) = pending.take() {
                p.await.map_err(|e| Error::internal(e.to_string()))??;
                coord.learn_commit_point(&shared.store, commit_seen);
            }
            let s = shared.clone();
            let entries = std::mem::take(&mut batch);
            pending = Some(tokio::task::spawn_blocking(move || apply_batch(&s, entries, epoch)));
        }
        if id == 0 {
            return Err(Error::new(Code::CursorNotFound, format!("{host} closed the oplog cursor")));
        }
        if coord.epoch() != epoch || coord.state() == MemberState::Primary || should_change(shared, src) {
            if let Some(p) = pending.take() {
                let _ = p.await;
            }
            return Ok(());
        }
        let get_more = doc! {"getMore": id, "collection": "oplog.rs", "batchSize": FETCH_BATCH_DOCS, "maxTimeMS": AWAIT_DATA_MS, "term": coord.term(), "$replData": 1};
        let reply = conn.command("local", get_more, Duration::from_millis(AWAIT_DATA_MS as u64) + REPLY_SLACK).await?;
        (id, batch) = cursor_batch(&reply, "nextBatch")?;
        if let Some(cp) = on_repl_data(shared, &reply) {
            commit_seen = commit_seen.max(cp);
        }
        if batch.is_empty() {
            if let Some(p) = pending.take() {
                p.await.map_err(|e| Error::internal(e.to_string()))??;
            }
            coord.learn_commit_point(&shared.store, commit_seen);
        }
    }
}

fn should_change(shared: &Shared, current: usize) -> bool {
    let coord = shared.repl.as_ref().expect("replica set member");
    let Some((config, me)) = coord.config() else { return true };
    let last = shared.store.oplog_last().unwrap_or_default();
    let inner = coord.inner.lock();
    let views: Vec<repl::sync_source::PeerView> = inner.peers.iter().map(|p| p.view.clone()).collect();
    repl::sync_source::should_change(&config, me, &views, last, current)
}

fn cursor_batch(reply: &Document, key: &str) -> Result<(i64, Vec<Document>)> {
    let bad = || Error::new(Code::ProtocolError, "malformed oplog cursor reply");
    let c = reply.get_document("cursor").map_err(|_| bad())?;
    let id = c.get_i64("id").map_err(|_| bad())?;
    let docs = c.get_array(key).map_err(|_| bad())?.iter().filter_map(|d| if let Bson::Document(d) = d { Some(d.clone()) } else { None }).collect();
    Ok((id, docs))
}

/// The sync source's term and commit point from `$replData`.
fn on_repl_data(shared: &Shared, reply: &Document) -> Option<OpTime> {
    let coord = shared.repl.as_ref().expect("replica set member");
    let d = reply.get_document("$replData").ok()?;
    if let Ok(t) = d.get_i64("term") {
        if t > coord.term() {
            coord.observe_term(&shared.store, t);
        }
    }
    d.get_document("lastOpCommitted").ok().and_then(OpTime::from_doc)
}

/// Apply fetched entries, log them with their own optimes, make them durable, and let the
/// reporter tell upstream.
fn apply_batch(shared: &Shared, entries: Vec<Document>, epoch: u64) -> Result<()> {
    let coord = shared.repl.as_ref().expect("replica set member");
    let store = &shared.store;
    {
        let _apply = coord.apply_lock.lock();
        if coord.epoch() != epoch || coord.state() == MemberState::Primary {
            return Err(Error::new(Code::InterruptedDueToReplStateChange, "the member's role or config changed while fetching"));
        }
        let mut logged = Vec::with_capacity(entries.len());
        {
            let _replicated = storage::applying_replicated_ops();
            for e in &entries {
                let at = OpTime::from_doc(e).ok_or_else(|| Error::new(Code::FailedToParse, "fetched oplog entry has no ts and t"))?;
                crate::apply::apply_entry(store, e).map_err(|err| Error::new(Code(err.code, err.code_name), format!("applying oplog entry {at:?} failed: {}", err.message)))?;
                logged.push((at, e.to_vec().map_err(|e| Error::internal(e.to_string()))?));
            }
        }
        store.append_oplog_replicated(&logged)?;
    }
    store.commit_durable()?;
    coord.progress.send_modify(|c| *c += 1);
    Ok(())
}

/// Send this member's progress, and what it knows of the members downstream, to its sync
/// source whenever it changes (and at least every heartbeat interval).
pub async fn report_loop(shared: Arc<Shared>) {
    let coord = shared.repl.as_ref().expect("replica set member");
    let mut changes = coord.progress_changes();
    let mut conn: Option<PeerConn> = None;
    loop {
        let interval = coord.config().map_or(2000, |(c, _)| c.settings.heartbeat_interval_ms).max(1) as u64;
        let _ = tokio::time::timeout(Duration::from_millis(interval), changes.changed()).await;
        changes.borrow_and_update();
        if coord.state() != MemberState::Secondary {
            continue;
        }
        let Some((config, me)) = coord.config() else { continue };
        let Some(src) = coord.sync_source() else { continue };
        let host = &config.members[src].host;
        let mut optimes = Vec::with_capacity(config.members.len());
        let applied = shared.store.oplog_last().unwrap_or_default();
        let durable = shared.store.oplog_durable().unwrap_or_default();
        optimes.push(position(config.members[me].id, config.version, applied, durable));
        {
            let inner = coord.inner.lock();
            for (i, p) in inner.peers.iter().enumerate() {
                if i != me && i != src && p.view.applied > OpTime::default() {
                    optimes.push(position(config.members[i].id, config.version, p.view.applied, p.durable));
                }
            }
        }
        if conn.as_ref().is_some_and(|c| c.is_broken() || c.host != *host) {
            conn = None;
        }
        let r = async {
            if conn.is_none() {
                conn = Some(PeerConn::connect(host, CONNECT_TIMEOUT).await?);
            }
            conn.as_mut().expect("connected").command("admin", doc! {"replSetUpdatePosition": 1, "optimes": optimes}, CONNECT_TIMEOUT).await
        }
        .await;
        if let Err(e) = r {
            tracing::debug!(%host, "replSetUpdatePosition failed: {}", e.message);
            conn = None;
        }
    }
}

fn position(member_id: i32, cfgver: i32, applied: OpTime, durable: OpTime) -> Bson {
    Bson::Document(doc! {
        "memberId": member_id, "cfgver": cfgver,
        "appliedOpTime": applied.to_doc(), "durableOpTime": durable.to_doc(),
        "appliedWallTime": super::wall_of(applied), "durableWallTime": super::wall_of(durable),
    })
}
