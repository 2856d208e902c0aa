//! Member-to-member protocol: heartbeats (liveness, state, optimes, config propagation),
//! elections (replSetRequestVotes, dry run first, as protocol version 1), step-down, and the
//! commands that other members send (replSetHeartbeat, replSetRequestVotes,
//! replSetUpdatePosition).

use super::{put_single_doc, store_config, ReplCoord, ELECTION_COLLECTION};
use crate::Host;
use bson::{doc, Bson, DateTime, Document};
use common::{Code, Error, Result};
use net::peer::PeerConn;
use repl::election::VoteRequest;
use repl::{MemberState, ReplSetConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};
use storage::OpTime;

/// How often the coordinator checks election and step-down conditions.
const TICK: Duration = Duration::from_millis(50);
/// A vote request waits at most this long for an answer.
const VOTE_TIMEOUT: Duration = Duration::from_secs(5);

fn heartbeat_timeout(config: &ReplSetConfig) -> Duration {
    // An answer later than the election timeout is useless for liveness.
    let ms = (config.settings.heartbeat_timeout_secs * 1000).min(config.settings.election_timeout_ms).max(100);
    Duration::from_millis(ms as u64)
}

/// Start the member's background work: one heartbeat task per other member (restarted when
/// the config changes), the election and step-down ticker, and the oplog fetcher.
pub fn spawn_tasks(shared: Arc<dyn Host>) -> Result<()> {
    let Some(coord) = shared.coord() else { return Ok(()) };
    if coord.tasks_started.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Ok(());
    }
    let _ = coord.shared.set(Arc::downgrade(&shared));
    tokio::spawn(supervise(shared.clone()));
    tokio::spawn(tick_loop(shared.clone()));
    // The fetcher applies each batch on its own thread, in line: no hop to a blocking pool
    // and back per batch, and the server's workers stay free for clients.
    let fetcher = shared.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::internal(format!("cannot start the oplog fetcher's runtime: {e}")))?;
    std::thread::Builder::new()
        .name("shoal-oplog-fetcher".into())
        .spawn(move || rt.block_on(super::fetcher::fetch_loop(fetcher)))
        .map_err(|e| Error::internal(format!("cannot start the oplog fetcher's thread: {e}")))?;
    let flusher = shared.clone();
    std::thread::Builder::new()
        .name("shoal-journal-flusher".into())
        .spawn(move || flusher.coord().expect("replica set member").journal_flush_loop(flusher.store()))
        .map_err(|e| Error::internal(format!("cannot start the journal flusher's thread: {e}")))?;
    tokio::spawn(super::strict::ask_loop(shared.clone()));
    tokio::spawn(super::fetcher::report_loop(shared));
    Ok(())
}

/// (Re)start the heartbeat tasks whenever the config epoch changes.
async fn supervise(shared: Arc<dyn Host>) {
    let coord = shared.coord().expect("replica set member");
    let mut started = u64::MAX;
    loop {
        let epoch = coord.epoch();
        if epoch != started {
            started = epoch;
            if let Some((config, me)) = coord.config() {
                for i in 0..config.members.len() {
                    if i != me {
                        tokio::spawn(heartbeat_loop(shared.clone(), epoch, i, config.members[i].host.clone()));
                    }
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_millis(500), coord.wake.notified()).await;
    }
}

/// The heartbeat request this member sends.
fn heartbeat_request(coord: &ReplCoord) -> Document {
    let inner = coord.inner.lock();
    match &inner.config {
        Some(c) => doc! {
            "replSetHeartbeat": c.set_name.clone(), "configVersion": c.version, "configTerm": c.term.unwrap_or(0), "hbv": 1,
            "from": c.members[inner.self_index].host.clone(), "fromId": c.members[inner.self_index].id, "term": inner.term,
        },
        None => {
            doc! {"replSetHeartbeat": coord.set_name.clone(), "configVersion": -2, "configTerm": -1, "hbv": 1, "from": coord.default_host.clone(), "term": inner.term}
        }
    }
}

async fn heartbeat_loop(shared: Arc<dyn Host>, epoch: u64, index: usize, host: String) {
    let coord = shared.coord().expect("replica set member");
    let mut conn: Option<PeerConn> = None;
    while coord.epoch() == epoch {
        let Some((config, _)) = coord.config() else { return };
        let timeout = heartbeat_timeout(&config);
        let started = Instant::now();
        let sent_at = DateTime::now();
        let reply = async {
            if conn.as_ref().is_none_or(|c| c.is_broken()) {
                conn = Some(PeerConn::connect(&host, timeout).await?);
            }
            conn.as_mut().expect("connected").command("admin", heartbeat_request(coord), timeout).await
        }
        .await;
        let rtt = started.elapsed();
        if coord.epoch() != epoch {
            return;
        }
        match reply {
            Ok(r) => on_heartbeat_reply(&shared, index, &r, rtt, sent_at).await,
            Err(e) => {
                let mut inner = coord.inner.lock();
                if let Some(p) = inner.peers.get_mut(index) {
                    let was_up = p.view.up;
                    p.view.up = false;
                    p.up_since = None;
                    p.message = e.message.clone();
                    p.last_heartbeat = Some(sent_at);
                    drop(inner);
                    if was_up {
                        tracing::info!(member = %host, "member is down: {}", e.message);
                        coord.changed();
                    }
                }
            }
        }
        let interval = Duration::from_millis(config.settings.heartbeat_interval_ms.max(1) as u64);
        let wait = interval.saturating_sub(started.elapsed());
        let _ = tokio::time::timeout(wait, coord.wake.notified()).await;
    }
}

async fn on_heartbeat_reply(shared: &Arc<dyn Host>, index: usize, r: &Document, rtt: Duration, sent_at: DateTime) {
    let coord = shared.coord().expect("replica set member");
    let term = r.get_i64("term").unwrap_or(0);
    if term > coord.term() {
        coord.observe_term(term);
    }
    // A newer config (or ours is missing where theirs exists): take it.
    if let Ok(cfg) = r.get_document("config") {
        if let Err(e) = adopt_config(shared, cfg).await {
            tracing::warn!("cannot adopt the config from a heartbeat: {}", e.message);
        }
        return;
    }
    let state = r.get_i32("state").ok().and_then(state_of);
    let applied = r.get_document("opTime").ok().and_then(OpTime::from_doc).unwrap_or_default();
    let durable = r.get_document("durableOpTime").ok().and_then(OpTime::from_doc).unwrap_or_default();
    let mut changed = false;
    let mut learned_commit = None;
    {
        let mut inner = coord.inner.lock();
        let my_term = inner.term;
        let Some(p) = inner.peers.get_mut(index) else { return };
        changed |= !p.view.up || p.view.state != state;
        if !p.view.up {
            p.up_since = Some(Instant::now());
        }
        p.view.up = true;
        p.view.state = state;
        p.view.applied = p.view.applied.max(applied);
        p.durable = p.durable.max(durable);
        p.applied_wall = r.get_datetime("wallTime").ok().copied();
        p.durable_wall = r.get_datetime("durableWallTime").ok().copied();
        p.view.ping_us = Some(rtt.as_micros() as u64);
        p.view.sync_source = r.get_i32("syncSourceIndex").ok().and_then(|i| usize::try_from(i).ok());
        p.term = term;
        p.config_version = r.get_i32("configVersion").unwrap_or(0);
        p.config_term = r.get_i64("configTerm").unwrap_or(0);
        p.election_time = r.get_timestamp("electionTime").ok();
        p.last_heartbeat = Some(sent_at);
        p.last_response = Some(Instant::now());
        p.message.clear();
        let theirs = (p.config_term, p.config_version);
        let newer_config = inner.config.as_ref().is_some_and(|c| theirs > (c.term.unwrap_or(0), c.version));
        coord.wake_majority_waiters(shared.store(), &inner);
        if state == Some(MemberState::Primary) && term >= my_term {
            inner.primary_seen = Instant::now();
            learned_commit = r.get_document("commitPoint").ok().and_then(OpTime::from_doc);
        }
        if newer_config {
            // Ask again with our (older) version: the reply then carries the config.
            coord.wake.notify_waiters();
        }
    }
    if let Some(cp) = learned_commit {
        coord.learn_commit_point(shared.store(), cp, false);
    }
    if state == Some(MemberState::Primary) && coord.is_writable_primary() && term >= coord.term() {
        coord.step_down("another member is primary in the same or a later term");
    }
    if changed {
        coord.changed();
    }
}

fn state_of(code: i32) -> Option<MemberState> {
    use MemberState::*;
    [Startup, Primary, Secondary, Recovering, Startup2, Unknown, Arbiter, Down, Rollback, Removed].into_iter().find(|s| s.code() == code)
}

/// Install a config received from another member, if it is newer and names this member.
async fn adopt_config(shared: &Arc<dyn Host>, cfg: &Document) -> Result<()> {
    let coord = shared.coord().expect("replica set member");
    let config = ReplSetConfig::parse(cfg)?;
    config.validate()?;
    if config.set_name != coord.set_name {
        return Err(Error::new(Code(185, "InconsistentReplicaSetNames"), format!("config is for set {}, not {}", config.set_name, coord.set_name)));
    }
    if let Some((mine, _)) = coord.config() {
        if (config.term.unwrap_or(0), config.version) <= (mine.term.unwrap_or(0), mine.version) {
            return Ok(());
        }
    }
    if !coord.is_member_of(&config) {
        // Removed from the set: no elections, no fetching, until a config names us again.
        if coord.state() != MemberState::Removed {
            tracing::info!(version = config.version, "this member is not in the set's new config: REMOVED");
            coord.step_down("removed from the config");
            coord.set_state(MemberState::Removed);
        }
        return Ok(());
    }
    let shared2 = shared.clone();
    tokio::task::spawn_blocking(move || {
        let coord = shared2.coord().expect("replica set member");
        let store = &shared2.store();
        store_config(store, &config)?;
        store.enable_oplog(coord.oplog_size_bytes)?;
        tracing::info!(version = config.version, "installing the replica set config received from a member");
        coord.install_config(store, config)
    })
    .await
    .map_err(|e| Error::internal(format!("config installation failed: {e}")))?
}

/// replSetHeartbeat: answer with this member's state and optimes (and the config when the
/// sender's is older); note a sender in a higher term or with a newer config.
pub fn heartbeat(shared: &dyn Host, cmd: &Document) -> Result<Document> {
    let coord = shared.coord().ok_or_else(|| Error::new(Code::NoReplicationEnabled, "not running with --replSet"))?;
    let set = cmd.get_str("replSetHeartbeat").map_err(|_| Error::type_mismatch("replSetHeartbeat must name the set"))?;
    if set != coord.set_name {
        return Err(Error::new(
            Code(185, "InconsistentReplicaSetNames"),
            format!("Our set name of {} does not match name {set} reported by remote node", coord.set_name),
        ));
    }
    let their_version = cmd.get_i32("configVersion").unwrap_or(-2);
    let their_config_term = cmd.get_i64("configTerm").unwrap_or(-1);
    let their_term = cmd.get_i64("term").unwrap_or(0);
    if their_term > coord.term() {
        coord.observe_term(their_term);
    }
    let store = &shared.store();
    let last = store.oplog_last().unwrap_or_default();
    let durable = store.oplog_durable().unwrap_or_default();
    let mut inner = coord.inner.lock();
    let Some(config) = inner.config.clone() else {
        drop(inner);
        // Not in a set yet: a member that is tells us its config when we ask it.
        if their_version > 0 {
            if let Ok(from) = cmd.get_str("from") {
                if let Some(arc) = coord.shared() {
                    tokio::spawn(fetch_config_from(arc, from.to_string()));
                }
            }
        }
        return Ok(
            doc! {"set": coord.set_name.clone(), "state": MemberState::Startup.code(), "term": 0i64, "configVersion": -2, "configTerm": -1i64, "opTime": OpTime::default().to_doc(), "durableOpTime": OpTime::default().to_doc()},
        );
    };
    if let Some(i) = cmd.get_i32("fromId").ok().and_then(|id| config.members.iter().position(|m| m.id == id)) {
        inner.peers[i].last_heartbeat_recv = Some(DateTime::now());
    }
    let mut r = doc! {
        "set": config.set_name.clone(), "state": inner.state.code(), "term": inner.term,
        "configVersion": config.version, "configTerm": config.term.unwrap_or(0),
        "opTime": last.to_doc(), "wallTime": super::wall_of(last), "durableOpTime": durable.to_doc(), "durableWallTime": super::wall_of(durable),
        "syncSourceIndex": inner.sync_source.map_or(-1, |i| i as i32),
        "syncingTo": inner.sync_source.map(|i| config.members[i].host.clone()).unwrap_or_default(),
        "electable": config.members[inner.self_index].is_electable(),
    };
    if inner.state == MemberState::Primary {
        let cp = ReplCoord::reported_commit_point(&inner, store);
        r.insert("commitPoint", cp.to_doc());
        if let Some(e) = inner.election {
            r.insert("electionTime", e.timestamp());
        }
    }
    if (their_config_term, their_version) < (config.term.unwrap_or(0), config.version) {
        r.insert("config", config.to_doc());
    } else if (their_config_term, their_version) > (config.term.unwrap_or(0), config.version) {
        // The sender has a newer config: our next heartbeat to it fetches it.
        coord.wake.notify_waiters();
    }
    Ok(r)
}

/// A member that is not in a set yet asks `from` (which sent it a heartbeat) for the config.
async fn fetch_config_from(shared: Arc<dyn Host>, from: String) {
    let coord = shared.coord().expect("replica set member");
    let timeout = Duration::from_secs(10);
    let r = async {
        let mut c = PeerConn::connect(&from, timeout).await?;
        c.command("admin", heartbeat_request(coord), timeout).await
    }
    .await;
    match r {
        Ok(r) => match r.get_document("config") {
            Ok(cfg) => {
                if let Err(e) = adopt_config(&shared, cfg).await {
                    tracing::warn!(%from, "cannot adopt the config: {}", e.message);
                }
            }
            Err(_) => tracing::debug!(%from, "heartbeat reply without a config"),
        },
        Err(e) => tracing::debug!(%from, "cannot fetch the config: {}", e.message),
    }
}

/// replSetInitiate's quorum check: every other member answers a heartbeat and is not in a
/// set already.
pub async fn check_quorum_for_initiate(config: &ReplSetConfig, self_index: usize) -> Result<()> {
    // heartbeatTimeoutSecs as mongod's quorum checker, not cut to the election timeout as for
    // liveness: a member slow to answer once on a loaded machine is still a member.
    let timeout = Duration::from_secs(config.settings.heartbeat_timeout_secs.clamp(1, 10) as u64);
    let mut set = tokio::task::JoinSet::new();
    for (i, m) in config.members.iter().enumerate() {
        if i == self_index {
            continue;
        }
        let host = m.host.clone();
        let req = doc! {"replSetHeartbeat": config.set_name.clone(), "configVersion": -2, "configTerm": -1i64, "hbv": 1, "from": config.members[self_index].host.clone(), "term": 0i64};
        set.spawn(async move {
            let r = async {
                let mut c = PeerConn::connect(&host, timeout).await?;
                c.command("admin", req, timeout).await
            }
            .await;
            (host, r)
        });
    }
    let mut failed = Vec::new();
    while let Some(joined) = set.join_next().await {
        let Ok((host, r)) = joined else { continue };
        match r {
            Ok(r) if r.get_i32("configVersion").unwrap_or(-2) > 0 => failed.push(format!("{host} is already in a replica set")),
            Ok(_) => {}
            Err(e) => failed.push(format!("{host} failed with {}", e.message)),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::new(
            Code::NodeNotFound,
            format!("replSetInitiate quorum check failed because not all proposed set members responded affirmatively: {}", failed.join(", ")),
        ))
    }
}

/// Election and step-down conditions, checked every TICK.
async fn tick_loop(shared: Arc<dyn Host>) {
    let coord = shared.coord().expect("replica set member");
    loop {
        tokio::time::sleep(TICK).await;
        shared.store().set_ttl_deletes_enabled(coord.is_writable_primary());
        let Some((config, me)) = coord.config() else { continue };
        if coord.is_writable_primary() {
            // This member's own durable optime moves with every sync, without a report.
            let mut inner = coord.inner.lock();
            coord.advance_commit_point(shared.store(), &mut inner);
        }
        let now = Instant::now();
        let election_timeout = Duration::from_millis(config.settings.election_timeout_ms.max(1) as u64);
        let mut stand = false;
        let mut lost_majority = false;
        {
            let mut inner = coord.inner.lock();
            let responsive = |p: &super::Peer| p.view.up && p.last_response.is_some_and(|t| now.duration_since(t) < election_timeout);
            match inner.state {
                MemberState::Primary => {
                    let primary_for_ms = u64::try_from(DateTime::now().timestamp_millis() - inner.election_date.timestamp_millis()).unwrap_or(0);
                    lost_majority =
                        repl::election::lost_majority(&config, me, |i| responsive(&inner.peers[i]), primary_for_ms, election_timeout.as_millis() as u64);
                }
                MemberState::Secondary => {
                    let electable = config.members[me].is_electable() && config.members[me].is_voter();
                    let primary =
                        (0..inner.peers.len()).find(|&i| i != me && responsive(&inner.peers[i]) && inner.peers[i].view.state == Some(MemberState::Primary));
                    let may_stand = electable && !inner.election_running && now >= inner.frozen_until;
                    // Priority takeover (repl::election::priority_takeover_wait_ms).
                    let last = shared.store().oplog_last().unwrap_or_default();
                    let takeover = primary.filter(|_| may_stand).and_then(|pi| {
                        repl::election::priority_takeover_wait_ms(&config, me, pi, last, inner.peers[pi].view.applied, election_timeout.as_millis() as u64)
                    });
                    match takeover {
                        Some(wait_ms) => {
                            let since = *inner.takeover_since.get_or_insert(now);
                            stand = now.duration_since(since) >= Duration::from_millis(wait_ms);
                        }
                        None => {
                            inner.takeover_since = None;
                            let since_ms = now.duration_since(inner.primary_seen).as_millis() as u64;
                            stand = repl::election::stands_for_want_of_primary(
                                &config,
                                me,
                                may_stand,
                                primary.is_some(),
                                since_ms,
                                inner.election_timeout.as_millis() as u64,
                            );
                        }
                    }
                    if stand {
                        inner.election_running = true;
                        inner.takeover_since = None;
                    }
                }
                _ => {}
            }
        }
        if lost_majority {
            coord.step_down("can no longer see a majority of the set");
        }
        if stand {
            let shared2 = shared.clone();
            tokio::spawn(async move {
                let coord = shared2.coord().expect("replica set member");
                if let Err(e) = run_election(&shared2).await {
                    tracing::info!("election failed: {}", e.message);
                }
                let mut inner = coord.inner.lock();
                inner.election_running = false;
                // The next try waits a fresh randomized timeout.
                inner.primary_seen = Instant::now();
                let ms = inner.config.as_ref().map_or(10_000, |c| c.settings.election_timeout_ms);
                inner.election_timeout = Duration::from_millis(repl::election::randomized_timeout_ms(ms, rand::random()));
            });
        }
    }
}

/// Ask every other voter for its vote in `term`; count the grants (this member's own
/// included). Stops early at a majority.
async fn collect_votes(shared: &Arc<dyn Host>, config: &ReplSetConfig, me: usize, term: i64, dry_run: bool, last: OpTime) -> usize {
    let coord = shared.coord().expect("replica set member");
    let mut set = tokio::task::JoinSet::new();
    for (i, m) in config.members.iter().enumerate() {
        if i == me || !m.is_voter() {
            continue;
        }
        let host = m.host.clone();
        let req = doc! {
            "replSetRequestVotes": 1, "setName": config.set_name.clone(), "dryRun": dry_run, "term": term,
            "candidateIndex": me as i32, "configVersion": config.version, "configTerm": config.term.unwrap_or(0),
            "lastAppliedOpTime": last.to_doc(),
        };
        set.spawn(async move {
            let mut c = PeerConn::connect(&host, VOTE_TIMEOUT).await?;
            c.command("admin", req, VOTE_TIMEOUT).await
        });
    }
    let mut votes = 1;
    while let Some(joined) = set.join_next().await {
        let Ok(Ok(r)) = joined else { continue };
        let their_term = r.get_i64("term").unwrap_or(0);
        if their_term > term {
            coord.observe_term(their_term);
        }
        if r.get_bool("voteGranted").unwrap_or(false) {
            votes += 1;
            if votes >= config.majority_vote_count() {
                break;
            }
        } else {
            tracing::debug!("vote refused: {}", r.get_str("reason").unwrap_or(""));
        }
    }
    votes
}

/// Stand for election: a dry run in the next term, then the real vote, then primary.
async fn run_election(shared: &Arc<dyn Host>) -> Result<()> {
    run_election_steps(shared, true).await
}

async fn run_election_steps(shared: &Arc<dyn Host>, dry_run_first: bool) -> Result<()> {
    let coord = shared.coord().expect("replica set member");
    let Some((config, me)) = coord.config() else { return Ok(()) };
    let term = coord.term();
    let last = shared.store().oplog_last().unwrap_or_default();
    tracing::info!(term = term + 1, dry_run_first, "standing for election");
    if dry_run_first && collect_votes(shared, &config, me, term + 1, true, last).await < config.majority_vote_count() {
        return Err(Error::new(Code(211, "ElectionFailed"), "the dry run did not get a majority"));
    }
    // The real election: a new term, our own vote recorded durably first.
    let new_term = {
        let mut inner = coord.inner.lock();
        if inner.term != term || inner.state != MemberState::Secondary {
            return Err(Error::new(Code(211, "ElectionFailed"), "the term or state changed during the dry run"));
        }
        inner.term = term + 1;
        inner.last_vote_term = Some(term + 1);
        term + 1
    };
    let s = shared.clone();
    let vote = doc! {"_id": "lastVote", "term": new_term, "candidateIndex": me as i32};
    super::blocking(move || put_single_doc(s.store(), ELECTION_COLLECTION, &vote)).await?;
    if collect_votes(shared, &config, me, new_term, false, last).await < config.majority_vote_count() {
        return Err(Error::new(Code(211, "ElectionFailed"), format!("did not get a majority in term {new_term}")));
    }
    catch_up(shared, &config, me, new_term).await;
    let s = shared.clone();
    super::blocking(move || {
        let coord = s.coord().expect("replica set member");
        // The fetcher writes and applies nothing more once these hold (fetcher::write_batch
        // and apply_written check the role under them).
        let _write = coord.oplog_write_lock.lock();
        let _apply = coord.apply_lock.lock();
        {
            let inner = coord.inner.lock();
            if inner.term != new_term || inner.state != MemberState::Secondary {
                return Err(Error::new(Code(211, "ElectionFailed"), "a later term began during the election"));
            }
        }
        coord.become_primary(s.store(), new_term)
    })
    .await
}

/// How often catch-up checks its progress.
const CATCH_UP_POLL: Duration = Duration::from_millis(10);

/// Primary catch-up (mongod's): a member that won an election may still lack entries that
/// another member has (w:1 writes the voters for it never received). Before writing its
/// own first entry it fetches them from the member furthest ahead, by what heartbeats
/// last said, so they are kept rather than rolled back there. Ends when caught up, after
/// `settings.catchUpTimeoutMillis` (-1: no limit), when that member goes down, or when a
/// later term begins. mongod reports the member PRIMARY (not writable) meanwhile; here it
/// stays SECONDARY until it takes over.
async fn catch_up(shared: &Arc<dyn Host>, config: &ReplSetConfig, me: usize, term: i64) {
    let coord = shared.coord().expect("replica set member");
    let ahead = {
        let inner = coord.inner.lock();
        let src = (0..inner.peers.len())
            .filter(|&i| i != me && inner.peers[i].view.up && !config.members[i].arbiter_only)
            .max_by_key(|&i| inner.peers[i].view.applied);
        src.map(|i| (i, inner.peers[i].view.applied))
    };
    let Some((src, target)) = ahead else { return };
    if shared.store().oplog_last().unwrap_or_default() >= target {
        return;
    }
    tracing::info!(term, host = %config.members[src].host, ?target, "won the election; catching up before taking over");
    let started = Instant::now();
    let limit = u64::try_from(config.settings.catch_up_timeout_ms).ok().map(Duration::from_millis);
    // The fetcher takes this as a replSetSyncFrom request (which may name a hidden member).
    coord.inner.lock().sync_from = Some(src);
    coord.wake.notify_waiters();
    loop {
        if shared.store().oplog_last().unwrap_or_default() >= target {
            tracing::info!(term, elapsed_ms = started.elapsed().as_millis() as u64, "caught up");
            break;
        }
        let (same_term, up) = {
            let inner = coord.inner.lock();
            (inner.term == term && inner.state == MemberState::Secondary, inner.peers[src].view.up)
        };
        if !same_term || !up || limit.is_some_and(|l| started.elapsed() >= l) {
            tracing::info!(term, same_term, source_up = up, "catch-up ended before reaching its target");
            break;
        }
        tokio::time::sleep(CATCH_UP_POLL).await;
    }
    // Not taken yet (ended early): no request outlives the catch-up.
    let mut inner = coord.inner.lock();
    if inner.sync_from == Some(src) {
        inner.sync_from = None;
    }
}

/// replSetRequestVotes: grant or refuse a vote (repl::election::decide); a granted real
/// vote is durable before the reply.
pub fn request_votes(shared: &dyn Host, cmd: &Document) -> Result<Document> {
    let coord = shared.coord().ok_or_else(|| Error::new(Code::NoReplicationEnabled, "not running with --replSet"))?;
    let req = VoteRequest {
        set_name: cmd.get_str("setName").unwrap_or("").to_string(),
        dry_run: cmd.get_bool("dryRun").unwrap_or(false),
        term: cmd.get_i64("term").map_err(|_| Error::type_mismatch("replSetRequestVotes needs a long 'term'"))?,
        candidate_index: cmd.get_i32("candidateIndex").ok().and_then(|i| usize::try_from(i).ok()).unwrap_or(usize::MAX),
        config_version: cmd.get_i32("configVersion").unwrap_or(0),
        config_term: cmd.get_i64("configTerm").unwrap_or(0),
        last_applied: cmd.get_document("lastAppliedOpTime").ok().and_then(OpTime::from_doc).unwrap_or_default(),
    };
    if req.term > coord.term() && !req.dry_run {
        coord.observe_term(req.term);
    }
    let last_applied = shared.store().oplog_last().unwrap_or_default();
    let mut inner = coord.inner.lock();
    let Some(config) = inner.config.clone() else { return Err(super::not_initialized()) };
    let voter = repl::election::Voter { config: &config, self_index: inner.self_index, term: inner.term, last_vote_term: inner.last_vote_term, last_applied };
    let decision = repl::election::decide(&voter, &req);
    let term = inner.term;
    if decision.is_ok() && !req.dry_run {
        inner.last_vote_term = Some(req.term);
        // Granting a vote resets our own election timer, as hearing from a primary does.
        inner.primary_seen = Instant::now();
        drop(inner);
        put_single_doc(shared.store(), ELECTION_COLLECTION, &doc! {"_id": "lastVote", "term": req.term, "candidateIndex": req.candidate_index as i32})?;
    }
    Ok(match decision {
        Ok(()) => doc! {"term": term, "voteGranted": true, "reason": ""},
        Err(reason) => doc! {"term": term, "voteGranted": false, "reason": reason},
    })
}

/// replSetUpdatePosition: members downstream report their applied and durable optimes; a
/// primary advances the commit point, a secondary passes them on (fetcher::report_loop).
pub fn update_position(shared: &dyn Host, cmd: &Document) -> Result<Document> {
    let Ok(optimes) = cmd.get_array("optimes") else {
        return Err(Error::type_mismatch("replSetUpdatePosition needs an 'optimes' array"));
    };
    update_positions(shared, optimes, reporter_term(cmd.get("term"))?)?;
    Ok(Document::new())
}

/// The `term` of a progress report (replSetUpdatePosition, a fetcher's getMore), if any.
pub fn reporter_term(term: Option<&Bson>) -> Result<Option<i64>> {
    match term {
        None => Ok(None),
        Some(Bson::Int64(t)) => Ok(Some(*t)),
        Some(Bson::Int32(t)) => Ok(Some(i64::from(*t))),
        Some(_) => Err(Error::type_mismatch("'term' must be a number")),
    }
}

/// Record downstream members' progress (replSetUpdatePosition's `optimes`, or a fetcher's
/// getMore's `$replProgress`), moving the commit point and waking the writes it satisfies.
/// `term` is the reporter's, read after its optimes (fetcher::progress_optimes): a later one
/// than ours is taken first, so a primary steps down before it counts them (mongod's
/// getMore takes the fetcher's term the same way).
pub fn update_positions(shared: &dyn Host, optimes: &[Bson], term: Option<i64>) -> Result<()> {
    let coord = shared.coord().ok_or_else(|| Error::new(Code::NoReplicationEnabled, "not running with --replSet"))?;
    if let Some(t) = term.filter(|&t| t > coord.term()) {
        coord.observe_term(t);
    }
    let mut guard = coord.inner.lock();
    // Borrowed field by field: the config is not copied for every report.
    let inner = &mut *guard;
    let Some(config) = inner.config.as_ref() else { return Err(super::not_initialized()) };
    let mut moved = false;
    for o in optimes {
        let Bson::Document(o) = o else { continue };
        let Some(i) = o.get_i32("memberId").ok().and_then(|id| config.members.iter().position(|m| m.id == id)) else { continue };
        if i == inner.self_index {
            continue;
        }
        let applied = o.get_document("appliedOpTime").ok().and_then(OpTime::from_doc).unwrap_or_default();
        let durable = o.get_document("durableOpTime").ok().and_then(OpTime::from_doc).unwrap_or_default();
        let p = &mut inner.peers[i];
        if durable > p.durable {
            // The entries this report makes durable there: the oldest was logged here this
            // long ago (the longest any of them took to replicate).
            if let Some((_, age)) = shared.store().oplog_lag(p.durable) {
                shared.counters().lag.record(age.as_micros() as u64);
            }
        }
        if applied > p.view.applied || durable > p.durable {
            p.view.applied = p.view.applied.max(applied);
            p.durable = p.durable.max(durable);
            p.applied_wall = o.get_datetime("appliedWallTime").ok().copied().or(p.applied_wall);
            p.durable_wall = o.get_datetime("durableWallTime").ok().copied().or(p.durable_wall);
            moved = true;
        }
    }
    if moved {
        coord.advance_commit_point(shared.store(), &mut guard);
        coord.wake_majority_waiters(shared.store(), &guard);
        drop(guard);
        coord.positions.send_modify(|c| *c += 1);
        coord.progress.send_modify(|c| *c += 1);
    }
    Ok(())
}

/// replSetStepDown: stop being primary once an electable secondary has caught up (within
/// secondaryCatchUpPeriodSecs, unless force), and stand for no election for stepDownSecs.
pub async fn step_down_command(shared: &dyn Host, step_down_secs: u64, catch_up_secs: u64, force: bool) -> Result<()> {
    let coord = shared.coord().ok_or_else(|| Error::new(Code::NoReplicationEnabled, "not running with --replSet"))?;
    if !coord.is_writable_primary() {
        return Err(Error::new(Code::NotWritablePrimary, "not primary so can't step down"));
    }
    let deadline = Instant::now() + Duration::from_secs(catch_up_secs);
    loop {
        let caught_up = {
            let inner = coord.inner.lock();
            let last = shared.store().oplog_last().unwrap_or_default();
            let config = inner.config.as_ref().expect("a primary has a config");
            inner.peers.iter().enumerate().any(|(i, p)| i != inner.self_index && p.view.up && config.members[i].is_electable() && p.view.applied >= last)
        };
        if caught_up || force {
            break;
        }
        if Instant::now() >= deadline {
            return Err(Error::new(Code::ExceededTimeLimit, "No electable secondaries caught up as of the step down deadline"));
        }
        let mut changes = coord.progress_changes();
        let _ = tokio::time::timeout(Duration::from_millis(100), changes.changed()).await;
    }
    coord.inner.lock().frozen_until = Instant::now() + Duration::from_secs(step_down_secs);
    coord.step_down("replSetStepDown");
    Ok(())
}

/// replSetFreeze: no election of this member for `secs` (0 unfreezes).
pub fn freeze(shared: &dyn Host, secs: u64) -> Result<Document> {
    let coord = shared.coord().ok_or_else(|| Error::new(Code::NoReplicationEnabled, "not running with --replSet"))?;
    if coord.is_writable_primary() {
        return Err(Error::new(Code::NotSecondary, "cannot freeze node when primary or running for election. state: Primary"));
    }
    coord.inner.lock().frozen_until = Instant::now() + Duration::from_secs(secs);
    Ok(if secs == 0 {
        doc! {"info": "unfreezing"}
    } else {
        Document::new()
    })
}

/// replSetSyncFrom: fetch from `host` next (mongod's temporary override of the sync
/// source). Replies with the previous sync source.
pub fn sync_from(shared: &dyn Host, host: &str) -> Result<Document> {
    let coord = shared.coord().ok_or_else(|| Error::new(Code::NoReplicationEnabled, "not running with --replSet"))?;
    let mut inner = coord.inner.lock();
    let Some(config) = inner.config.clone() else { return Err(super::not_initialized()) };
    if inner.state == MemberState::Primary {
        return Err(Error::new(Code::NotSecondary, "primaries don't sync"));
    }
    let Some(i) = config.members.iter().position(|m| m.host.eq_ignore_ascii_case(host)) else {
        return Err(Error::new(Code::NodeNotFound, format!("Could not find member \"{host}\" in replica set")));
    };
    if i == inner.self_index {
        return Err(Error::new(Code::InvalidOptions, "I cannot sync from myself"));
    }
    if config.members[i].arbiter_only {
        return Err(Error::new(Code::InvalidOptions, format!("Cannot sync from \"{host}\" because it is an arbiter")));
    }
    let prev = inner.sync_source.map(|s| config.members[s].host.clone()).unwrap_or_default();
    inner.sync_from = Some(i);
    Ok(doc! {"syncFromRequested": host, "prevSyncTarget": prev})
}

/// replSetStepUp: stand for election now, without the dry run (mongod's step-up request).
pub async fn step_up(shared: &dyn Host) -> Result<()> {
    let coord = shared.coord().ok_or_else(|| Error::new(Code::NoReplicationEnabled, "not running with --replSet"))?;
    let arc = coord.shared().ok_or_else(|| Error::internal("the member's tasks are not running"))?;
    {
        let mut inner = coord.inner.lock();
        let Some(config) = &inner.config else { return Err(super::not_initialized()) };
        if inner.state == MemberState::Primary {
            return Ok(());
        }
        let me = &config.members[inner.self_index];
        if inner.state != MemberState::Secondary || !me.is_electable() || !me.is_voter() {
            return Err(Error::new(Code(125, "CommandFailed"), "Election failed: this member is not an electable secondary"));
        }
        if inner.election_running {
            return Err(Error::new(Code(125, "CommandFailed"), "Election failed: an election is already running"));
        }
        inner.election_running = true;
        inner.frozen_until = Instant::now();
    }
    let r = run_election_steps(&arc, false).await;
    coord.inner.lock().election_running = false;
    r.map_err(|e| Error::new(Code(125, "CommandFailed"), format!("Election failed: {}", e.message)))
}
