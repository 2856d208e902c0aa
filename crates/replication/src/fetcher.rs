//! A secondary's replication: fetch the oplog from the sync source with a tailable,
//! awaitData find on its `local.oplog.rs` (what mongod's OplogFetcher does), write each
//! batch into our own oplog with the entries' original optimes, make it durable, report
//! progress upstream on the next getMore (`$replProgress`, or replSetUpdatePosition when
//! there is none), and apply the batch while that getMore waits for the next one.
//!
//! As in mongod 8.0, a batch is acknowledged once durable in the oplog, not once applied:
//! a w:"majority" write waits for the fetch, the oplog write and the fsync, not for the
//! apply. Until applied, the entries sit after the oplog's applied-through point
//! (`Store::oplog_applied`); a restart applies them first, as does a member about to take
//! writes. The fetcher runs on a thread of its own (a single-threaded runtime): the batch
//! after an apply is everything the source logged meanwhile.
//!
//! Two transports carry the batches (`replication.logTransport`, `LogTransport`). pull,
//! mongod's, is the above: a batch is written, made durable, reported by the getMore that
//! asks for the next, and applied while that getMore waits. push: one exhaust getMore with
//! `$replStream` opens a stream; the source (the server's `conn::stream_oplog`) sends each
//! batch as soon as it has one and a credit, and the member writes it, hands it to an
//! applier thread (which applies it while the journal syncs), syncs, and acknowledges it on
//! the same connection (a `moreToCome` replSetUpdatePosition that returns the credit). shm
//! is push with the batches in a ring of shared memory (`shm::LogRing`) when the source is
//! on this host: the ring is announced on the stream, and a member that cannot map it falls
//! back to push over TCP from that source. On the source, a batch's entries still in the
//! oplog's memory tail are shared (`storage::RawRecord`), not copied, until each member's
//! frame is encoded.

use crate::{Counters, Host};
use bson::{doc, Bson, Document, RawDocument, RawDocumentBuf};
use common::{Code, Error, Result};
use net::peer::{cursor_batch, cursor_batch_raw, PeerConn};
use repl::sync_source::Mismatch;
use repl::{MemberState, ReplSetConfig};
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
/// How long a source whose oplog starts after our newest entry is passed over (mongod's
/// too-stale denylist period).
const TOO_STALE_DENY: Duration = Duration::from_secs(60);

pub async fn fetch_loop(shared: Arc<dyn Host>) {
    let coord = shared.coord().expect("replica set member");
    loop {
        // Read before the config: a config installed after it moves the epoch and ends the
        // fetch, which uses this config throughout.
        let epoch = coord.epoch();
        let fetching = matches!(coord.state(), MemberState::Secondary | MemberState::Startup2 | MemberState::Recovering);
        let Some((config, me)) = coord.config().filter(|_| fetching) else {
            let _ = tokio::time::timeout(Duration::from_millis(200), coord.wake.notified()).await;
            continue;
        };
        let last = shared.store().oplog_last().unwrap_or_default();
        let source = {
            let mut inner = coord.inner.lock();
            let views = source_views(&inner.peers);
            // replSetSyncFrom's member, if it is up; otherwise the usual choice.
            let forced = inner.sync_from.take().filter(|&i| views[i].up);
            let s = forced.or_else(|| repl::sync_source::choose(&config, me, &views, last));
            inner.sync_source = s;
            s.map(|s| (s, forced.is_some()))
        };
        let Some((src, forced)) = source else {
            let _ = tokio::time::timeout(Duration::from_millis(100), coord.wake.notified()).await;
            continue;
        };
        match fetch_from(&shared, epoch, &config, me, src, forced).await {
            Ok(()) => {}
            Err(e) => {
                tracing::info!(source = %config.members[src].host, "oplog fetching stopped: {}", e.message);
                coord.set_info_message(e.message.clone());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Tail `host`'s oplog until this member should stop (it became primary, the config
/// changed, a better source appeared) or an error. A source `forced` by replSetSyncFrom is
/// kept, as mongod keeps it, until the link breaks or it falls behind. `config` (with our
/// index `me`) is the one of `epoch`: the fetch ends when the epoch moves.
async fn fetch_from(shared: &Arc<dyn Host>, epoch: u64, config: &ReplSetConfig, me: usize, src: usize, forced: bool) -> Result<()> {
    let coord = shared.coord().expect("replica set member");
    let host = config.members[src].host.as_str();
    // A batch whose apply failed last time is applied first: rollback, and the comparison
    // with the source below, take the oplog as applied.
    apply_unapplied(shared.as_ref())?;
    let mut conn = PeerConn::connect(host, CONNECT_TIMEOUT).await?;
    if let Some(reason) = coord.initial_sync_reason(shared.store())? {
        // An empty member copies the data first (initial sync), then tails from where the
        // copy began.
        super::initial_sync::run(shared, &mut conn, host, reason).await?;
        return Ok(());
    }
    let last = shared.store().oplog_last().unwrap_or_default();
    let find = doc! {"find": "oplog.rs", "filter": {"ts": {"$gte": last.timestamp()}}, "tailable": true, "awaitData": true, "batchSize": FETCH_BATCH_DOCS, "$replData": 1};
    let reply = conn.command_raw("local", find, CONNECT_TIMEOUT + REPLY_SLACK).await?;
    let (mut id, mut batch) = cursor_batch_raw(&reply, "firstBatch")?;
    on_repl_data(shared.as_ref(), &reply);
    // The first entry must be our newest one: then the two oplogs agree up to here.
    let first = batch.first().and_then(|e| OpTime::from_raw(e));
    if first != Some(last) {
        // Why not (repl::sync_source::Mismatch says what each case means).
        let oldest = oplog_edge(&mut conn, 1).await?;
        let newest = oplog_edge(&mut conn, -1).await?;
        match repl::sync_source::classify_mismatch(last, coord.term(), oldest, newest) {
            Mismatch::TooStale => {
                coord.inner.lock().peers[src].denied_until = Some(std::time::Instant::now() + TOO_STALE_DENY);
                return Err(Error::new(
                    Code::TooStaleToSyncFromSource,
                    format!("too stale to sync from {host}: our newest entry {last:?} is older than its oldest {:?}", oldest.unwrap_or_default()),
                ));
            }
            Mismatch::Behind => {
                return Err(Error::new(Code::InvalidSyncSource, format!("{host} is behind us: its newest entry {newest:?} is older than ours {last:?}")));
            }
            Mismatch::OlderTerm => {
                return Err(Error::new(
                    Code::InvalidSyncSource,
                    format!("{host}'s newest entry {newest:?} is of a term before ours ({}): not rolling back to it", coord.term()),
                ));
            }
            Mismatch::Diverged => {}
        }
        if coord.inner.lock().sync_pending.is_some() {
            // Our oplog starts at the copy's begin: a divergence this early means the copy
            // may hold writes the set took back, which no rollback here could undo.
            coord.restart_initial_sync(shared.store(), &format!("{host}'s oplog diverged from ours before the initial sync reached minValid"));
            return Ok(());
        }
        let r = roll_back(shared, &mut conn, host, last, oldest).await;
        if r.as_ref().is_err_and(|e| e.is(Code::TooStaleToSyncFromSource)) {
            coord.inner.lock().peers[src].denied_until = Some(std::time::Instant::now() + TOO_STALE_DENY);
        }
        return r;
    }
    batch.remove(0);
    coord.set_info_message("");
    if shared.log_transport() != crate::LogTransport::Pull {
        return push_loop(shared, &mut conn, epoch, config, me, src, forced, id, batch).await;
    }
    // Write a batch to the oplog and make it durable, send the getMore that reports it
    // (`$replProgress`, replSetUpdatePosition's `optimes`) and asks for the next, and apply
    // the batch while the source waits for new entries: one round trip per batch both
    // reports and fetches, and the next batch is everything the source logged meanwhile.
    // Fetching during the write instead got back, under load, a batch of the few entries
    // logged just after the getMore went out, and left the rest to the batch after: smaller
    // batches, an fsync and a report each, and a longer wait for w:"majority".
    let mut commit_seen = OpTime::default();
    loop {
        let written = if batch.is_empty() { None } else { Some(write_batch(shared.as_ref(), std::mem::take(&mut batch), epoch)?) };
        if written.is_some() {
            coord.learn_commit_point(shared.store(), commit_seen, true);
        }
        let stop = id == 0 || superseded(coord, epoch) || should_change(shared.as_ref(), config, me, src, forced);
        if stop {
            if let Some(logged) = &written {
                apply_written(shared.as_ref(), logged)?;
                // No getMore carries it: the reporter does.
                coord.after_apply(shared.store().oplog_applied().unwrap_or_default(), false);
            }
            if id == 0 {
                return Err(Error::new(Code::CursorNotFound, format!("{host} closed the oplog cursor")));
            }
            return Ok(());
        }
        let (progress, term) = progress_optimes(shared.as_ref(), config, me, src);
        let mut get_more =
            doc! {"getMore": id, "collection": "oplog.rs", "batchSize": FETCH_BATCH_DOCS, "maxTimeMS": AWAIT_DATA_MS, "term": term, "$replData": 1};
        get_more.insert("$replProgress", progress);
        let started = std::time::Instant::now();
        let wait = Duration::from_millis(AWAIT_DATA_MS as u64) + REPLY_SLACK;
        let sent = conn.send("local", get_more, wait).await;
        if let Some(logged) = &written {
            apply_written(shared.as_ref(), logged)?;
            // The getMore in flight reported the batch durable (what a write concern
            // counts); the next one reports it applied.
            coord.after_apply(shared.store().oplog_applied().unwrap_or_default(), sent.is_ok());
        }
        let reply = match sent {
            Ok(request) => conn.recv_raw(request, wait).await,
            Err(e) => Err(e),
        };
        Counters::add(&shared.counters().getmores, 1);
        Counters::add(&shared.counters().getmore_us, started.elapsed().as_micros() as u64);
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                if written.is_some() {
                    // The source may not have heard of the batch: leave it to the reporter.
                    coord.after_apply(shared.store().oplog_applied().unwrap_or_default(), false);
                }
                return Err(e);
            }
        };
        (id, batch) = cursor_batch_raw(&reply, "nextBatch")?;
        if let Some(cp) = on_repl_data(shared.as_ref(), &reply) {
            commit_seen = commit_seen.max(cp);
        }
        if batch.is_empty() {
            coord.learn_commit_point(shared.store(), commit_seen, true);
        }
    }
}

/// Batches a push stream may send ahead of this member's acknowledgements: one being written
/// here while the next travels. More only lets the source cut smaller batches.
const PUSH_CREDITS: i32 = 2;
/// Written batches waiting for the applier (at most 16 MiB each, so at most 256 MiB); the
/// fetcher waits (and stops returning credits) beyond this, so the source's stream slows
/// to the apply rate. Deep enough that a member catching up writes (and acknowledges) at the
/// rate the log arrives, applying behind.
const APPLY_QUEUE_BATCHES: usize = 16;

/// `logTransport: push`: open a stream on the oplog cursor `id` (an exhaust getMore with
/// `$replStream`); the source sends each batch as soon as it has one and a credit. Each
/// batch is written to the oplog and made durable, then acknowledged on the same connection
/// (replSetUpdatePosition with `moreToCome`, returning its credit), and handed to the applier
/// thread, which applies batches in order while the next is written. `first` is the find's
/// batch, past the entry both oplogs share.
#[allow(clippy::too_many_arguments)]
async fn push_loop(
    shared: &Arc<dyn Host>,
    conn: &mut PeerConn,
    epoch: u64,
    config: &ReplSetConfig,
    me: usize,
    src: usize,
    forced: bool,
    id: i64,
    first: Vec<RawDocumentBuf>,
) -> Result<()> {
    let coord = shared.coord().expect("replica set member");
    let host = config.members[src].host.clone();
    let mut applier = Applier::start(shared.clone())?;
    let r = async {
        if !first.is_empty() {
            applier.send(write_batch(shared.as_ref(), first, epoch)?)?;
        }
        // shm: ask for a ring unless this source is known to be on another host.
        let want_ring = shared.log_transport() == crate::LogTransport::Shm && !NO_RING.with(|n| n.borrow().contains(&host));
        let (progress, term) = progress_optimes(shared.as_ref(), config, me, src);
        let mut open = doc! {"getMore": id, "collection": "oplog.rs", "batchSize": FETCH_BATCH_DOCS, "maxTimeMS": AWAIT_DATA_MS, "term": term, "$replData": 1, "$replStream": {"credits": PUSH_CREDITS, "shm": want_ring}};
        open.insert("$replProgress", progress);
        let wait = Duration::from_millis(AWAIT_DATA_MS as u64) + REPLY_SLACK;
        let mut response_to = conn.send_flags("local", open, wire::flags::EXHAUST_ALLOWED, wait).await?;
        let mut commit_seen = OpTime::default();
        let mut ring: Option<super::shm::LogRing> = None;
        loop {
            let parse = |reply: &RawDocument| -> Result<StreamFrame> {
                if let Ok(r) = reply.get_document("$replRing") {
                    let path = r.get_str("path").map_err(|_| Error::new(Code::ProtocolError, "a ring announcement without a path"))?;
                    return Ok(StreamFrame::Ring(path.to_string(), r.get_i64("nonce").unwrap_or(0) as u64));
                }
                let (id, batch) = cursor_batch_raw(reply, "nextBatch")?;
                Ok(StreamFrame::Batch(id, batch, on_repl_data(shared.as_ref(), reply)))
            };
            let (reply_id, more, frame) = match &ring {
                None => conn.recv_streamed(response_to, wait, parse).await?,
                Some(r) => {
                    // Waits in this thread: the fetcher's runtime has nothing else to run.
                    let live = || !conn.peer_closed() && !superseded(coord, epoch);
                    let frame = r.recv(wait, live, |f| net::peer::parse_streamed(f, &host, response_to, parse)).map_err(|e| Error::new(Code::HostUnreachable, format!("{host}'s ring: {e}")))??;
                    net::fault::after_receive(&host).await?;
                    frame
                }
            };
            response_to = reply_id;
            let (id, batch, cp) = match frame {
                StreamFrame::Batch(id, batch, cp) => (id, batch, cp),
                StreamFrame::Ring(path, nonce) => {
                    ring = super::shm::LogRing::open(&path, nonce);
                    if ring.is_none() {
                        NO_RING.with(|n| n.borrow_mut().insert(host.clone()));
                        return Err(Error::new(Code::HostUnreachable, format!("cannot map {host}'s ring (another host?): pushing over TCP from now on")));
                    }
                    continue;
                }
            };
            if let Some(cp) = cp {
                commit_seen = commit_seen.max(cp);
            }
            if !batch.is_empty() {
                // The applier takes the batch as soon as it is in the engine, and applies it
                // while the journal syncs: the journal keeps engine writes in order, so no
                // apply is durable before the entries it applied.
                applier.send(write_batch_unsynced(shared.as_ref(), batch, epoch)?)?;
                shared.store().commit_durable()?;
            }
            coord.learn_commit_point(shared.store(), commit_seen, true);
            if !more || id == 0 {
                return Err(Error::new(Code::CursorNotFound, format!("{host} ended the oplog stream")));
            }
            // The batch is durable: report it and return its credit.
            let (progress, term) = progress_optimes(shared.as_ref(), config, me, src);
            let ack = doc! {"replSetUpdatePosition": 1, "optimes": progress, "term": term, "$replCredits": 1};
            conn.send_flags("admin", ack, wire::flags::MORE_TO_COME, wait).await?;
            Counters::add(&shared.counters().stream_batches, 1);
            if ring.is_some() {
                Counters::add(&shared.counters().ring_batches, 1);
            }
            if superseded(coord, epoch) || should_change(shared.as_ref(), config, me, src, forced) {
                return Ok(());
            }
        }
    }
    .await;
    // Nothing returns before the applier is done: the next fetch may roll back the oplog.
    let applied = applier.finish();
    r.and(applied)
}

/// What a push stream brings: a batch (cursor id, entries, the source's commit point), or
/// the announcement of the ring the batches come through from now on (path, nonce).
enum StreamFrame {
    Batch(i64, Vec<RawDocumentBuf>, Option<OpTime>),
    Ring(String, u64),
}

thread_local! {
    /// Sources whose ring this member could not map (another host): their streams stay on
    /// TCP. The fetcher runs on one thread.
    static NO_RING: std::cell::RefCell<std::collections::HashSet<String>> = Default::default();
}

/// The most a push stream's applier applies in one engine write, when batches queued up.
const APPLY_COALESCE_BYTES_MAX: usize = 32 << 20;

/// A thread that applies written batches in order (`apply_written`), for a push stream.
struct Applier {
    tx: Option<std::sync::mpsc::SyncSender<Vec<(OpTime, Vec<u8>)>>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Applier {
    fn start(shared: Arc<dyn Host>) -> Result<Applier> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<(OpTime, Vec<u8>)>>(APPLY_QUEUE_BATCHES);
        let thread = std::thread::Builder::new()
            .name("shoal-oplog-applier".into())
            .spawn(move || -> Result<()> {
                let coord = shared.coord().expect("replica set member");
                while let Ok(mut logged) = rx.recv() {
                    // Batches that queued up while the last apply ran are applied as one: one
                    // engine write, and each document touched in several written once.
                    let mut bytes: usize = logged.iter().map(|(_, e)| e.len()).sum();
                    while bytes < APPLY_COALESCE_BYTES_MAX {
                        let Ok(more) = rx.try_recv() else { break };
                        bytes += more.iter().map(|(_, e)| e.len()).sum::<usize>();
                        logged.extend(more);
                    }
                    apply_written(shared.as_ref(), &logged)?;
                    // Applied: the reporter tells the source (the stream carries durability).
                    coord.after_apply(shared.store().oplog_applied().unwrap_or_default(), false);
                }
                Ok(())
            })
            .map_err(|e| Error::internal(format!("cannot start the oplog applier's thread: {e}")))?;
        Ok(Applier { tx: Some(tx), thread: Some(thread) })
    }

    /// Queue a written batch; waits while the queue is full. Fails once the applier stopped
    /// (an apply failed: `finish` says why).
    fn send(&mut self, logged: Vec<(OpTime, Vec<u8>)>) -> Result<()> {
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(logged).is_ok());
        if sent {
            return Ok(());
        }
        match self.finish() {
            Err(e) => Err(e),
            Ok(()) => Err(Error::internal("the oplog applier stopped")),
        }
    }

    /// Apply what is queued, stop the thread and report how it ended.
    fn finish(&mut self) -> Result<()> {
        self.tx = None;
        match self.thread.take().map(|t| t.join()) {
            None => Ok(()),
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(Error::internal("the oplog applier panicked")),
        }
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// The optime of the source's oldest (`order` 1) or newest (`order` -1) oplog entry.
async fn oplog_edge(conn: &mut PeerConn, order: i32) -> Result<Option<OpTime>> {
    let reply = conn
        .command(
            "local",
            doc! {"find": "oplog.rs", "sort": {"$natural": order}, "limit": 1, "singleBatch": true, "projection": {"ts": 1, "t": 1}},
            CONNECT_TIMEOUT,
        )
        .await?;
    let (_, batch) = cursor_batch(&reply, "firstBatch")?;
    Ok(batch.first().and_then(OpTime::from_doc))
}

/// Our oplog entries that rollback examines at most (mongod bounds rollback by time; this
/// bounds it by size, so that the set of documents to refetch stays in memory).
const ROLLBACK_ENTRIES_MAX: usize = 100_000;
/// Entries read per step while looking for the common point.
const ROLLBACK_CHUNK: usize = 1000;

/// Rollback by refetch (mongod's original algorithm): find the newest entry both oplogs
/// share, save our current version of every document our later entries touched to a
/// rollback file, replace each with the source's version (or delete it where the source has
/// none), and cut our oplog back to the common point. A collection that a later catalog
/// command changed (create, drop, an index, a rename, a dropped database) is instead saved
/// whole and copied whole from the source, as initial sync copies it. The member is then
/// RECOVERING until it has applied the source's oplog up to where the source was after the
/// last read (minValid), since until then a document may be newer than the entries around
/// it.
async fn roll_back(shared: &Arc<dyn Host>, conn: &mut PeerConn, host: &str, our_last: OpTime, source_oldest: Option<OpTime>) -> Result<()> {
    let coord = shared.coord().expect("replica set member");
    coord.set_state(MemberState::Rollback);
    let r = roll_back_inner(shared, conn, host, our_last, source_oldest).await;
    if let Err(e) = &r {
        tracing::error!("rollback failed: {}", e.message);
        // The prepared transactions are the ones the records name, whatever it changed.
        shared.store().forget_prepared();
        if let Err(e) = crate::apply::recover_prepared(shared.store()) {
            tracing::error!("finding the prepared transactions after a failed rollback failed: {}", e.message);
        }
        // The next fetch attempt tries again. One that failed after it changed something
        // (minValid, written first, is ahead of the oplog) stays out of the set's reads until
        // minValid; one that failed before left the data as it was. (RECOVERING without a
        // minValid was forever: nothing would end it.)
        match super::ReplCoord::persisted_min_valid(shared.store()).filter(|mv| *mv > shared.store().oplog_last().unwrap_or_default()) {
            Some(mv) => coord.recover_until(mv, shared.store().oplog_applied().unwrap_or_default()),
            None => coord.set_state(MemberState::Secondary),
        }
    }
    r
}

async fn roll_back_inner(shared: &Arc<dyn Host>, conn: &mut PeerConn, host: &str, our_last: OpTime, source_oldest: Option<OpTime>) -> Result<()> {
    let store = shared.store().clone();
    let oplog = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).ok_or_else(|| Error::internal("no oplog"))?;
    // Walk our oplog back from the newest entry, a chunk at a time, until an entry is also in
    // the source's oplog with the same term.
    let mut ours: Vec<Document> = Vec::new();
    let mut before = None;
    let common = loop {
        let chunk = oplog.snapshot().scan_reverse(before, ROLLBACK_CHUNK)?;
        if chunk.is_empty() {
            return Err(Error::new(Code::OplogStartMissing, format!("no common point with {host}'s oplog: this member needs a resync")));
        }
        before = chunk.last().map(|(rid, _)| *rid);
        let oldest = chunk.last().and_then(|(_, d)| OpTime::from_doc(d)).unwrap_or_default();
        let theirs = source_entries_from(conn, oldest, our_last).await?;
        let mut found = None;
        for (_, d) in chunk {
            let at = OpTime::from_doc(&d).unwrap_or_default();
            if theirs.contains(&at) {
                found = Some(at);
                break;
            }
            ours.push(d);
        }
        if let Some(at) = found {
            break at;
        }
        // Past the source's oldest entry nothing can match: the common point is older than
        // its oplog (a member that joined by initial sync began it later). Another source
        // may hold it; nothing has changed here yet.
        if source_oldest.is_none_or(|o| oldest.ts < o.ts) {
            return Err(Error::new(
                Code::TooStaleToSyncFromSource,
                format!("too stale to roll back to {host}: the newest entry we share is older than its oldest {:?}", source_oldest.unwrap_or_default()),
            ));
        }
        if ours.len() >= ROLLBACK_ENTRIES_MAX {
            return Err(Error::new(Code::OplogStartMissing, format!("more than {ROLLBACK_ENTRIES_MAX} entries to roll back: this member needs a resync")));
        }
    };
    // The documents our divergent entries touched, by namespace, and the namespaces a
    // divergent catalog command changed: those are copied whole from the source.
    let mut touched: std::collections::BTreeMap<String, Vec<Bson>> = Default::default();
    let mut resync: std::collections::BTreeSet<String> = Default::default();
    let mut resync_dbs: std::collections::BTreeSet<String> = Default::default();
    for e in &ours {
        // A retryable write's session record was derived from the entry: the source's is
        // copied too (mongod's rollback refetches the sessions it undoes).
        if let Some(lsid) = e.get_document("lsid").ok().and_then(|l| l.get("id")) {
            let ids = touched.entry(format!("{}.{}", storage::SESSION_RECORDS_DB, storage::SESSION_RECORDS_COLLECTION)).or_default();
            let id = Bson::Document(doc! {"id": lsid.clone()});
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        // A transaction's entry is undone as its operations are; a prepared transaction's
        // commit as the operations of its prepare entry (a prepare or an abort applied none,
        // and the transactions prepared here are found again from the records once this
        // member has recovered).
        let o = e.get_document("o").ok();
        let prepared_ops;
        let ops: Vec<&Document> = match o.and_then(|o| o.get_array("applyOps").ok()) {
            Some(inner) if e.get_str("op").ok() == Some("c") => inner.iter().filter_map(|op| op.as_document()).collect(),
            _ if o.is_some_and(|o| o.contains_key("commitTransaction")) => {
                prepared_ops = crate::apply::operations_before(&store, e)?;
                prepared_ops.iter().collect()
            }
            _ if o.is_some_and(|o| o.contains_key("abortTransaction")) => Vec::new(),
            _ => vec![e],
        };
        for e in ops {
            let op = e.get_str("op").unwrap_or("");
            let ns = e.get_str("ns").unwrap_or("").to_string();
            let id = match op {
                "n" => continue,
                "c" => {
                    catalog_namespaces(e, &mut resync, &mut resync_dbs)?;
                    continue;
                }
                "i" | "d" => e.get_document("o").ok().and_then(|o| o.get("_id")).cloned(),
                "u" => e.get_document("o2").ok().and_then(|o| o.get("_id")).cloned(),
                _ => return Err(Error::new(Code::OplogStartMissing, format!("cannot roll back oplog operation '{op}' on {ns}: this member needs a resync"))),
            };
            if let Some(id) = id {
                let ids = touched.entry(ns).or_default();
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
    }
    // The source's collections (name, options, UUID) by database, each listed once.
    let mut source_colls: std::collections::BTreeMap<String, Vec<(String, Document, Option<bson::Uuid>)>> = Default::default();
    // A dropped database: every collection it has here or on the source.
    for db in &resync_dbs {
        resync.extend(store.list_collections(db).into_iter().map(|m| format!("{db}.{}", m.name)));
        let theirs = super::initial_sync::list_collections(conn, host, db).await?;
        resync.extend(theirs.iter().map(|(name, _, _)| format!("{db}.{name}")));
        source_colls.insert(db.clone(), theirs);
    }
    touched.retain(|ns, _| !resync.contains(ns));
    // minValid, first estimate: the source's newest entry before we read from it. Recorded
    // before the first change, so a crash during rollback leaves this member RECOVERING.
    let min_valid_early = source_applied(conn).await?.unwrap_or(common);
    let mut fetched: Vec<(String, Bson, Option<Document>)> = Vec::new();
    for (ns, ids) in &touched {
        let Some((db, coll)) = ns.split_once('.') else { continue };
        for chunk in ids.chunks(500) {
            // Every batch: one stops at 16 MiB, and a document missing here would be
            // deleted below as one the source does not have.
            let find = doc! {"find": coll, "filter": {"_id": {"$in": chunk.to_vec()}}, "batchSize": 100_000, "$readPreference": {"mode": "secondaryPreferred"}};
            let docs = super::initial_sync::all_docs(conn, host, db, "find", find).await?;
            for id in chunk {
                let theirs = docs.iter().find(|d| d.get("_id") == Some(id)).cloned();
                fetched.push((ns.clone(), id.clone(), theirs));
            }
        }
    }
    let dbpath = shared.dbpath().to_path_buf();
    let undone = ours.len();
    let stamp = bson::DateTime::now().try_to_rfc3339_string().unwrap_or_default().replace(':', "-");
    let s = shared.clone();
    let (st, resync_list) = (stamp.clone(), resync.clone());
    super::blocking(move || -> Result<()> {
        let coord = s.coord().expect("replica set member");
        let _write = coord.oplog_write_lock.lock();
        let _apply = coord.apply_lock.lock();
        // Counted before anything changes: a member copying from this one starts over.
        // (This member's own write, logged.)
        super::ReplCoord::bump_rollback_id(&store)?;
        // What follows copies the source's documents: not logged. The prepared transactions
        // kept here let go of their documents first; this member finds the ones that are
        // prepared once it has recovered (from the records, copied from the source with the
        // sessions undone).
        let store = store.replicated();
        store.forget_prepared();
        // From the first replaced document on, the data is inconsistent until minValid.
        super::ReplCoord::persist_min_valid(&store, min_valid_early)?;
        for (ns, id, theirs) in fetched {
            let (db, coll) = ns.split_once('.').expect("split above");
            let Some(c) = store.collection(db, coll) else {
                if let Some(d) = theirs {
                    crate::apply::apply_entry(&store, &doc! {"op": "i", "ns": ns.clone(), "o": d})?;
                }
                continue;
            };
            let mine = c.snapshot().find_by_id(&id)?.map(|(_, d)| d);
            if let Some(m) = &mine {
                save_rollback_doc(&dbpath, &ns, &st, m)?;
            }
            match theirs {
                Some(d) => crate::apply::apply_entry(&store, &doc! {"op": "i", "ns": ns.clone(), "o": d})?,
                None => crate::apply::apply_entry(&store, &doc! {"op": "d", "ns": ns.clone(), "o": {"_id": id}})?,
            }
        }
        // Collections to copy whole: keep ours in the rollback files, then drop them.
        for ns in resync_list {
            let Some((db, coll)) = ns.split_once('.') else { continue };
            if let Some(c) = store.collection(db, coll) {
                for (_, d) in c.snapshot().scan(None, usize::MAX)? {
                    save_rollback_doc(&dbpath, &ns, &st, &d)?;
                }
                store.drop_collection(db, coll)?;
            }
        }
        store.truncate_oplog_after(common)?;
        store.commit_durable()
    })
    .await?;
    // Copy them as initial sync does (with the source's options, UUID and indexes).
    for ns in &resync {
        let Some((db, coll)) = ns.split_once('.') else { continue };
        if !source_colls.contains_key(db) {
            let list = super::initial_sync::list_collections(conn, host, db).await?;
            source_colls.insert(db.to_string(), list);
        }
        if let Some((name, options, uuid)) = source_colls[db].iter().find(|(n, _, _)| n == coll).cloned() {
            super::initial_sync::clone_collection(shared, conn, host, db, &name, options, uuid).await?;
        }
    }
    // minValid: the source's newest entry after every read from it.
    let min_valid = source_applied(conn).await?.unwrap_or(min_valid_early).max(min_valid_early);
    let s = shared.clone();
    super::blocking(move || -> Result<()> {
        let coord = s.coord().expect("replica set member");
        super::ReplCoord::persist_min_valid(s.store(), min_valid)?;
        s.store().commit_durable()?;
        coord.recover_until(min_valid, s.store().oplog_applied().unwrap_or_default());
        Ok(())
    })
    .await?;
    tracing::info!(%host, undone, ?common, ?min_valid, "rolled back entries no majority had");
    Ok(())
}

/// The namespaces a divergent catalog command changed (added to `colls`), or the database
/// it dropped (added to `dbs`); rollback copies them whole from the source.
fn catalog_namespaces(e: &Document, colls: &mut std::collections::BTreeSet<String>, dbs: &mut std::collections::BTreeSet<String>) -> Result<()> {
    let ns = e.get_str("ns").unwrap_or("");
    let db = ns.strip_suffix(".$cmd").unwrap_or(ns);
    let o = e.get_document("o").ok();
    let Some((name, arg)) = o.and_then(|o| o.iter().next()) else {
        return Err(Error::new(Code::OplogStartMissing, format!("cannot roll back a malformed command entry on {ns}: this member needs a resync")));
    };
    match (name.as_str(), arg) {
        ("create" | "drop" | "createIndexes" | "dropIndexes" | "deleteIndexes" | "collMod", Bson::String(coll)) => {
            colls.insert(format!("{db}.{coll}"));
        }
        ("renameCollection", Bson::String(from)) => {
            colls.insert(from.clone());
            if let Some(to) = o.and_then(|o| o.get_str("to").ok()) {
                colls.insert(to.to_string());
            }
        }
        ("dropDatabase", _) => {
            dbs.insert(db.to_string());
        }
        _ => {
            return Err(Error::new(
                Code::OplogStartMissing,
                format!("cannot roll back the catalog command {} on {ns}: this member needs a resync", o.map(|o| o.to_string()).unwrap_or_default()),
            ))
        }
    }
    Ok(())
}

/// The source's newest applied optime (replSetGetStatus).
async fn source_applied(conn: &mut PeerConn) -> Result<Option<OpTime>> {
    let status = conn.command("admin", doc! {"replSetGetStatus": 1}, CONNECT_TIMEOUT).await?;
    Ok(status.get_document("optimes").ok().and_then(|o| o.get_document("appliedOpTime").ok()).and_then(OpTime::from_doc))
}

/// The optimes of the source's entries from `from` on, at most up to `to` (a bounded read
/// of its oplog, positioned by timestamp).
async fn source_entries_from(conn: &mut PeerConn, from: OpTime, to: OpTime) -> Result<Vec<OpTime>> {
    let mut out = Vec::new();
    let reply = conn
        .command(
            "local",
            doc! {"find": "oplog.rs", "filter": {"ts": {"$gte": from.timestamp()}}, "tailable": true, "batchSize": ROLLBACK_ENTRIES_MAX as i32, "projection": {"ts": 1, "t": 1}},
            CONNECT_TIMEOUT + REPLY_SLACK,
        )
        .await?;
    let (id, batch) = cursor_batch(&reply, "firstBatch")?;
    for e in batch {
        match OpTime::from_doc(&e) {
            Some(at) if at.ts <= to.ts => out.push(at),
            _ => break,
        }
    }
    if id != 0 {
        let _ = conn.command("local", doc! {"killCursors": "oplog.rs", "cursors": [id]}, CONNECT_TIMEOUT).await;
    }
    Ok(out)
}

/// Append `doc` to `<dbpath>/rollback/<ns>/removed.<stamp>.bson`, as mongod keeps what a
/// rollback replaced.
fn save_rollback_doc(dbpath: &std::path::Path, ns: &str, stamp: &str, doc: &Document) -> Result<()> {
    use std::io::Write;
    let dir = dbpath.join("rollback").join(ns);
    let io = |e: std::io::Error| Error::internal(format!("cannot write rollback file in {}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("removed.{stamp}.bson"))).map_err(io)?;
    let bytes = doc.to_vec().map_err(|e| Error::internal(e.to_string()))?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)
}

/// Whether to leave source `current`. `config` is the fetch's (the caller ends the fetch
/// first when the epoch moved), so it is not copied for every batch.
fn should_change(shared: &dyn Host, config: &ReplSetConfig, me: usize, current: usize, forced: bool) -> bool {
    let coord = shared.coord().expect("replica set member");
    let last = shared.store().oplog_last().unwrap_or_default();
    let inner = coord.inner.lock();
    if inner.sync_from.is_some() {
        return true;
    }
    let views = source_views(&inner.peers);
    if forced {
        return repl::sync_source::is_unusable(&views, me, last, current);
    }
    repl::sync_source::should_change(config, me, &views, last, current)
}

/// What heartbeats say of each member, for choosing a source, with the members denied for a
/// while (their oplog began after our newest entry).
fn source_views(peers: &[super::Peer]) -> Vec<repl::sync_source::PeerView> {
    let now = std::time::Instant::now();
    peers
        .iter()
        .map(|p| {
            let mut v = p.view.clone();
            v.denied = p.denied_until.is_some_and(|t| t > now);
            v
        })
        .collect()
}

/// The sync source's term and commit point from `$replData`.
fn on_repl_data(shared: &dyn Host, reply: &RawDocument) -> Option<OpTime> {
    let coord = shared.coord().expect("replica set member");
    let d = reply.get_document("$replData").ok()?;
    if let Ok(t) = d.get_i64("term") {
        if t > coord.term() {
            coord.observe_term(t);
        }
    }
    d.get_document("lastOpCommitted").ok().and_then(OpTime::from_raw)
}

/// Whether a fetch begun in config `epoch` must end: the config changed, or this member
/// became primary (it takes no more fetched entries).
fn superseded(coord: &super::ReplCoord, epoch: u64) -> bool {
    // STARTUP2 while tailing: an initial sync starts over (`ReplCoord::restart_initial_sync`).
    coord.epoch() != epoch || matches!(coord.state(), MemberState::Primary | MemberState::Startup2)
}

/// Write fetched entries to our oplog with their own optimes and make them durable (what
/// a write concern counts); returns them for `apply_written`.
fn write_batch(shared: &dyn Host, entries: Vec<RawDocumentBuf>, epoch: u64) -> Result<Vec<(OpTime, Vec<u8>)>> {
    let logged = write_batch_unsynced(shared, entries, epoch)?;
    shared.store().commit_durable()?;
    Ok(logged)
}

/// `write_batch` without the sync: the entries are in the engine, not yet durable.
fn write_batch_unsynced(shared: &dyn Host, entries: Vec<RawDocumentBuf>, epoch: u64) -> Result<Vec<(OpTime, Vec<u8>)>> {
    let coord = shared.coord().expect("replica set member");
    // Written as they came: decoded only when applied entry by entry.
    let logged = entries
        .into_iter()
        .map(|raw| {
            let at = OpTime::from_raw(&raw).ok_or_else(|| Error::new(Code::FailedToParse, "fetched oplog entry has no ts and t"))?;
            Ok((at, raw.into_bytes()))
        })
        .collect::<Result<Vec<_>>>()?;
    Counters::add(&shared.counters().fetched_ops, logged.len() as u64);
    Counters::add(&shared.counters().fetched_bytes, logged.iter().map(|(_, b)| b.len() as u64).sum());
    {
        let _write = coord.oplog_write_lock.lock();
        if superseded(coord, epoch) {
            return Err(Error::new(Code::InterruptedDueToReplStateChange, "the member's role or config changed while fetching"));
        }
        crate::apply::write_fetched(shared.store(), &logged)?;
    }
    Ok(logged)
}

/// Apply a batch `write_batch` wrote, unless a member that became primary meanwhile
/// applied it already (`ReplCoord::become_primary`). Durable with the next batch's fsync;
/// a restart before then applies it again from the oplog.
fn apply_written(shared: &dyn Host, logged: &[(OpTime, Vec<u8>)]) -> Result<()> {
    let coord = shared.coord().expect("replica set member");
    let Some(&(through, _)) = logged.last() else { return Ok(()) };
    crate::fail_points::APPLY_STOP.hold(|| Ok(()))?;
    let _apply = coord.apply_lock.lock();
    if shared.store().oplog_applied().unwrap_or_default() >= through {
        return Ok(());
    }
    let started = std::time::Instant::now();
    crate::apply::apply_written(shared.store(), logged)?;
    // Writes to users and roles (the admin database) and to config.settings matter to the
    // host beyond the data: one look at each entry's namespace serves both.
    if shared.watches_replicated_writes() {
        let (mut admin, mut settings) = (false, false);
        for (_, bytes) in logged {
            if let Some(ns) = bson::RawDocument::from_bytes(bytes).ok().and_then(|d| d.get_str("ns").ok()) {
                admin |= ns.starts_with("admin.");
                settings |= ns == "config.settings";
            }
        }
        shared.on_replicated_writes(admin, settings);
    }
    let c = shared.counters();
    Counters::add(&c.apply_batches, 1);
    Counters::add(&c.apply_us, started.elapsed().as_micros() as u64);
    Counters::add(&c.apply_ops, logged.len() as u64);
    Ok(())
}

/// Apply whatever is written and not applied (a batch whose apply failed).
fn apply_unapplied(shared: &dyn Host) -> Result<()> {
    let coord = shared.coord().expect("replica set member");
    let _apply = coord.apply_lock.lock();
    crate::apply::apply_unapplied(shared.store()).map(|_| ())
}

/// Send this member's progress, and what it knows of the members downstream, to its sync
/// source whenever it changes (and at least every heartbeat interval).
pub async fn report_loop(shared: Arc<dyn Host>) {
    let coord = shared.coord().expect("replica set member");
    let mut changes = coord.position_changes();
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
        let (optimes, term) = progress_optimes(shared.as_ref(), &config, me, src);
        if conn.as_ref().is_some_and(|c| c.is_broken() || c.host != *host) {
            conn = None;
        }
        let r = async {
            if conn.is_none() {
                conn = Some(PeerConn::connect(host, CONNECT_TIMEOUT).await?);
            }
            conn.as_mut().expect("connected").command("admin", doc! {"replSetUpdatePosition": 1, "optimes": optimes, "term": term}, CONNECT_TIMEOUT).await
        }
        .await;
        if let Err(e) = r {
            tracing::debug!(%host, "replSetUpdatePosition failed: {}", e.message);
            conn = None;
        }
    }
}

/// This member's applied and durable optimes, and what it knows of the members other than
/// `src` (those downstream of it, when it is their sync source), in replSetUpdatePosition's
/// `optimes` shape; and this member's term, read after them, which the report carries.
///
/// The source takes a later term from the report and, if primary, steps down before it
/// counts the optimes (`member::update_positions`). Without that, a member that voted in a
/// new term and went on fetching from the old primary made the old primary's new writes
/// majority-durable there, and acknowledged, while the new primary, elected without them,
/// would roll them back (the simulation found it, seed 9). Read after the optimes, the term
/// is the one of a vote cast before any entry they count was fetched, or a later one.
fn progress_optimes(shared: &dyn Host, config: &ReplSetConfig, me: usize, src: usize) -> (Vec<Bson>, i64) {
    let coord = shared.coord().expect("replica set member");
    let mut optimes = Vec::with_capacity(config.members.len());
    let applied = shared.store().oplog_applied().unwrap_or_default();
    let durable = shared.store().oplog_durable().unwrap_or_default();
    optimes.push(position(config.members[me].id, config.version, applied, durable));
    let inner = coord.inner.lock();
    for (i, p) in inner.peers.iter().enumerate() {
        if i != me && i != src && p.view.applied > OpTime::default() {
            optimes.push(position(config.members[i].id, config.version, p.view.applied, p.durable));
        }
    }
    (optimes, inner.term)
}

fn position(member_id: i32, cfgver: i32, applied: OpTime, durable: OpTime) -> Bson {
    Bson::Document(doc! {
        "memberId": member_id, "cfgver": cfgver,
        "appliedOpTime": applied.to_doc(), "durableOpTime": durable.to_doc(),
        "appliedWallTime": super::wall_of(applied), "durableWallTime": super::wall_of(durable),
    })
}
