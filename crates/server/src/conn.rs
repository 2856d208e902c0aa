//! mongod's side of the connection loop (`net::service`): a connection's state, running a
//! command (off the async worker when it may block) and the waits its reply needs (write
//! concern, the commit point of a majority read, an awaitData getMore's wait for a write),
//! the awaitable hello's topology wait, and a member's oplog push stream, which takes its
//! connection over.

use crate::dispatch;
use crate::state::{Counters, Shared};
use bson::{doc, Bson, Document};
use common::limits::MESSAGE_SIZE_MAX_BYTES;
use net::service::{next_request_id, write_frame};
use net::tls::Stream;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use wire::Request;
use wire::{Compressor, Message, OpMsg};

/// Longest wait of an awaitable hello (drivers send maxAwaitTimeMS = 10 s by default).
const AWAIT_TIME_MS_MAX: i64 = 60_000;

type Reply = net::service::Reply<storage::RawRecord>;

/// Per-connection state that commands may read or change.
pub struct ConnState {
    pub id: u64,
    pub remote: SocketAddr,
    /// Compressors agreed in the handshake (intersection of client and server lists).
    pub compressors: Vec<Compressor>,
    pub client_metadata: Option<Document>,
    pub app_name: Option<String>,
    /// Another member or a router (its hello said `internalClient`).
    pub internal_client: bool,
    /// Who the connection authenticated as, and a SCRAM conversation under way.
    pub auth: crate::auth::ConnAuth,
    /// This end's address (audit records' `local`).
    pub local: Option<SocketAddr>,
    /// The connection's id in audit records (`uuid`).
    pub uuid: bson::Uuid,
    /// The last audit actor made (`actor`).
    pub audit_actor: Option<Arc<crate::audit::Actor>>,
    /// The frame of the request about to run, kept for its authCheck record
    /// (`audit::keep_frame`); empty when none is kept.
    pub audit_frame: Vec<u8>,
    /// The sharding metadata the running command's scans keep to (`sharding::admit`): set
    /// for a versioned read, update or delete from a router, only while it runs.
    pub shard_filter: Option<Arc<crate::sharding::CollMeta>>,
}

impl ConnState {
    /// Who acts, for an audit record: made again only when the user or their roles changed
    /// since the last one, and otherwise shared by the connection's records.
    pub fn actor(&mut self) -> Arc<crate::audit::Actor> {
        self.actor_ref().clone()
    }

    /// `actor`, borrowed.
    pub fn actor_ref(&mut self) -> &Arc<crate::audit::Actor> {
        let user = self.auth.user.as_ref();
        let current = self.audit_actor.as_ref().is_some_and(|a| match user {
            None => a.users.is_empty(),
            Some(u) => a.users.len() == 1 && a.users[0].0 == u.user && a.users[0].1 == u.db && a.roles == u.roles,
        });
        if !current {
            self.audit_actor = None;
        }
        let (local, remote, uuid) = (self.local, self.remote, self.uuid);
        self.audit_actor.get_or_insert_with(|| {
            let users = user.map(|u| vec![(u.user.clone(), u.db.clone())]).unwrap_or_default();
            let roles = user.map(|u| u.roles.clone()).unwrap_or_default();
            Arc::new(crate::audit::Actor::new(local, Some(remote), uuid, users, roles))
        })
    }
}

impl net::service::Service for Shared {
    type Conn = ConnState;
    type Batch = storage::RawRecord;

    fn tls(&self) -> &net::tls::Acceptor {
        &self.tls
    }

    fn admit(&self, remote: SocketAddr) -> bool {
        let current = Counters::get(&self.counters.connections_current);
        if current as usize >= self.config.connections_max {
            Counters::add(&self.counters.connections_rejected, 1);
            tracing::warn!(%remote, "connection refused because too many open connections: {current}");
            return false;
        }
        Counters::add(&self.counters.connections_current, 1);
        Counters::add(&self.counters.connections_total, 1);
        true
    }

    fn release(&self) {
        self.counters.connections_current.fetch_sub(1, Ordering::Relaxed);
    }

    fn open(&self, remote: SocketAddr, local: Option<SocketAddr>, peer_subject: Option<String>) -> ConnState {
        ConnState {
            id: self.next_connection_id.fetch_add(1, Ordering::Relaxed),
            remote,
            compressors: Vec::new(),
            client_metadata: None,
            app_name: None,
            internal_client: false,
            auth: crate::auth::ConnAuth { peer_subject, ..Default::default() },
            local,
            uuid: bson::Uuid::new(),
            audit_actor: None,
            audit_frame: Vec::new(),
            shard_filter: None,
        }
    }

    fn conn_id(conn: &ConnState) -> u64 {
        conn.id
    }

    fn compressors(conn: &ConnState) -> &[Compressor] {
        &conn.compressors
    }

    async fn run(&self, conn: &mut ConnState, request: Request) -> Reply {
        run(self, conn, request).await
    }

    fn note_in(&self, bytes: usize) {
        Counters::add(&self.counters.bytes_in, bytes as u64);
        Counters::add(&self.counters.requests, 1);
    }

    fn note_out(&self, bytes: usize) {
        Counters::add(&self.counters.bytes_out, bytes as u64);
    }

    fn on_request(&self, conn: &mut ConnState, body: Option<&Document>, frame: Option<&[u8]>) {
        crate::audit::keep_frame(self, conn, body, frame);
    }

    fn close_reason(&self, conn: &ConnState) -> Option<String> {
        (conn.auth.failures >= crate::auth::FAILURES_PER_CONNECTION_MAX).then(|| format!("closed after {} failed authentications", conn.auth.failures))
    }

    fn awaitable_hello(&self, body: &Document) -> Option<(Duration, i64)> {
        awaitable_hello_wait(self, body)
    }

    async fn topology_change(&self, seen: i64, wait: Duration) {
        wait_for_topology_change(self, seen, wait).await
    }

    fn takes_over(&self, msg: &OpMsg) -> bool {
        is_oplog_stream(msg)
    }

    async fn take_over(
        &self,
        stream: &mut Stream,
        reader: &mut net::frame::FrameReader,
        conn: &mut ConnState,
        request_id: i32,
        msg: OpMsg,
    ) -> Result<(), String> {
        stream_oplog(self, stream, reader, conn, request_id, msg).await
    }
}

/// Batches a push stream may have sent and not had acknowledged (the receiver asks for fewer).
const STREAM_CREDITS_MAX: i64 = 64;

/// An exhaust getMore with `$replStream`: a downstream member opening a push stream of its
/// sync source's oplog (`replication.logTransport: push`).
fn is_oplog_stream(msg: &OpMsg) -> bool {
    msg.flags & wire::flags::EXHAUST_ALLOWED != 0 && msg.body.contains_key("getMore") && msg.body.contains_key("$replStream")
}

/// Serve a push stream: run the getMore again and again, sending each batch as a reply with
/// `moreToCome` as soon as there is one, with no request per batch, while the downstream
/// member sends back, on the same connection, `moreToCome` messages that acknowledge batches
/// (`replSetUpdatePosition` with its optimes) and return credits. A batch goes out only
/// against a credit (`$replStream.credits` to start with, then one per batch acknowledged),
/// so the member decides how far ahead of its writes the stream may run; while it has none,
/// entries accumulate into the next, larger batch.
async fn stream_oplog(
    shared: &Shared,
    stream: &mut Stream,
    reader: &mut net::frame::FrameReader,
    conn: &mut ConnState,
    request_id: i32,
    msg: OpMsg,
) -> Result<(), String> {
    let credits_asked = msg.body.get_document("$replStream").ok().and_then(|s| s.get("credits")).and_then(integer);
    let OpMsg { body, sequences, .. } = msg;
    let request = match (Request::from_msg(body, sequences), credits_asked) {
        (Ok(r), Some(c)) if (1..=STREAM_CREDITS_MAX).contains(&c) => (r, c),
        (Err(e), _) => return refuse_stream(shared, stream, request_id, &e).await,
        _ => {
            return refuse_stream(shared, stream, request_id, &common::Error::bad_value(format!("$replStream.credits must be 1 to {STREAM_CREDITS_MAX}"))).await
        }
    };
    let (mut request, mut credits) = request;
    let wants_ring = request.body.get_document("$replStream").ok().and_then(|s| s.get_bool("shm").ok()).unwrap_or(false);
    let ring = if wants_ring { replication::shm::LogRing::create(shared.config.port, conn.id, credits as u64) } else { None };
    // (tokio's split: a TLS stream has no split of its own; a push stream makes few calls.)
    let (mut rd, mut wr) = tokio::io::split(&mut *stream);
    let mut response_to = request_id;
    if let Some(ring) = &ring {
        // Announce the ring; batches go there from now on (a member that cannot map it, on
        // another host, closes the stream and opens one without).
        credits = credits.min(ring.slots() as i64);
        let path = ring.path().map(|p| p.display().to_string()).unwrap_or_default();
        let body = doc! {"ok": 1.0, "$replRing": {"path": path, "nonce": ring.nonce() as i64}};
        let reply_id = next_request_id();
        let out = wire::encode_msg(reply_id, response_to, &OpMsg { flags: wire::flags::MORE_TO_COME, body, sequences: vec![] }, None);
        wr.write_all(&out).await.map_err(|e| format!("write error: {e}"))?;
        response_to = reply_id;
    }
    enum Next {
        Ack(Result<Option<std::ops::Range<usize>>, String>),
        Batch(Reply),
    }
    loop {
        let next = if credits == 0 {
            Next::Ack(reader.next(&mut rd).await)
        } else {
            // Acknowledgements first; a getMore waiting for entries is dropped and run again
            // (it has taken nothing from the cursor until it returns).
            tokio::select! {
                biased;
                f = reader.next(&mut rd) => Next::Ack(f),
                r = run(shared, conn, request.clone()) => Next::Batch(r),
            }
        };
        match next {
            Next::Batch(reply) => {
                let open = reply.cursor_id() != 0;
                let ok = reply_ok(&reply.body);
                let reply_id = next_request_id();
                let out = reply.encode(reply_id, response_to, if open && ok { wire::flags::MORE_TO_COME } else { 0 }, None);
                match &ring {
                    Some(ring) => ring.publish(&out)?,
                    None => {
                        Counters::add(&shared.counters.bytes_out, out.len() as u64);
                        wr.write_all(&out).await.map_err(|e| format!("write error: {e}"))?;
                    }
                }
                if !(open && ok) {
                    return Ok(());
                }
                response_to = reply_id;
                credits -= 1;
                if request.body.contains_key("$replProgress") {
                    // The opening getMore's report counts once; acknowledgements carry the rest.
                    let mut body = (*request.body).clone();
                    body.remove("$replProgress");
                    request.body = Arc::new(body);
                }
            }
            Next::Ack(frame) => {
                let Some(range) = frame? else { return Ok(()) };
                let buf = &reader.buf[range];
                Counters::add(&shared.counters.bytes_in, buf.len() as u64);
                let ack = match wire::decode(buf, MESSAGE_SIZE_MAX_BYTES) {
                    Ok(wire::Decoded { message: Message::Msg(m), .. }) if m.flags & wire::flags::MORE_TO_COME != 0 => m,
                    _ => return Err("a push stream takes only moreToCome acknowledgements".into()),
                };
                let returned = ack.body.get("$replCredits").and_then(integer).unwrap_or(0);
                if !(0..=STREAM_CREDITS_MAX).contains(&returned) {
                    return Err(format!("a push stream acknowledgement returned {returned} credits"));
                }
                credits = (credits + returned).min(STREAM_CREDITS_MAX);
                let mut body = ack.body;
                body.remove("$replCredits");
                if body.contains_key("replSetUpdatePosition") {
                    let positions = Request::from_msg(body, ack.sequences).map_err(|e| e.message)?;
                    let reply = run(shared, conn, positions).await;
                    if !reply_ok(&reply.body) {
                        tracing::debug!(conn = conn.id, "a push stream's position report failed: {}", reply.body);
                    }
                }
            }
        }
    }
}

/// An int32 or int64 (a stream's credits).
fn integer(v: &Bson) -> Option<i64> {
    v.as_i64().or(v.as_i32().map(i64::from))
}

use net::fail_point::reply_ok;

async fn refuse_stream(shared: &Shared, stream: &mut Stream, request_id: i32, e: &common::Error) -> Result<(), String> {
    let out = wire::encode_msg(next_request_id(), request_id, &OpMsg { flags: 0, body: e.to_reply(), sequences: vec![] }, None);
    write_frame(shared, stream, &out).await
}

/// Wait until the topologyVersion counter differs from `seen`, at most `wait`.
async fn wait_for_topology_change(shared: &Shared, seen: i64, wait: Duration) {
    let Some(repl) = &shared.repl else {
        tokio::time::sleep(wait).await;
        return;
    };
    let mut changes = repl.topology_changes();
    if *changes.borrow_and_update() != seen {
        return;
    }
    let _ = tokio::time::timeout(wait, changes.changed()).await;
}

/// If this hello is awaitable (has maxAwaitTimeMS and our current topologyVersion), how long
/// to wait at most before answering, and the topologyVersion counter the client has seen.
fn awaitable_hello_wait(shared: &Shared, body: &Document) -> Option<(Duration, i64)> {
    let max_await = match body.get("maxAwaitTimeMS")? {
        Bson::Int32(v) => *v as i64,
        Bson::Int64(v) => *v,
        Bson::Double(v) => *v as i64,
        _ => return None,
    };
    let tv = body.get_document("topologyVersion").ok()?;
    let same_process = tv.get_object_id("processId").ok() == Some(shared.process_id);
    if !same_process {
        // The client saw another process (we restarted): answer at once so it learns.
        return None;
    }
    let seen = tv.get_i64("counter").unwrap_or(0);
    Some((Duration::from_millis(max_await.clamp(0, AWAIT_TIME_MS_MAX) as u64), seen))
}

/// Run a command: on the async worker when it cannot block, otherwise off it (write locks and
/// group commit wait on condition variables). A test's failCommand acts first.
async fn run(shared: &Shared, conn: &mut ConnState, request: Request) -> Reply {
    let mut label_kind = common::labels::kind(&request.name, &request.body);
    if request.name == "getMore" && matches!(request.body.get("getMore"), Some(Bson::Int64(id)) if shared.cursors.is_change_stream(*id)) {
        label_kind = common::labels::Kind::ChangeStream;
    }
    let fired = fail_command(shared, conn, &request);
    let error_reply = |e| dispatch::with_topology_version(shared, e).to_reply();
    let mut reply = net::fail_point::around_command(fired, label_kind, error_reply, |wce| execute(shared, conn, request, wce)).await;
    if let Some(repl) = &shared.repl {
        // Replies carry the times causally consistent sessions chain their reads with.
        if let Some((cluster_time, operation_time)) = repl.reply_times(&shared.store) {
            reply.body.insert("$clusterTime", cluster_time);
            reply.body.insert("operationTime", operation_time);
        }
    }
    reply
}

/// failCommand, for a command that exists and that this client may run (one atomic load
/// while it is off).
fn fail_command(shared: &Shared, conn: &mut ConnState, request: &Request) -> Option<common::Result<net::fail_point::Injected>> {
    if !net::fail_point::FAIL_COMMAND.is_active() || crate::commands::lookup(&request.name).is_none() {
        return None;
    }
    if crate::auth::check(shared, conn, &request.db, &request.name, &request.body).is_err() {
        return None;
    }
    let ns = request.namespace();
    let internal = conn.internal_client || conn.auth.user.as_ref().is_some_and(|u| u.user == "__system" && u.db == "local");
    let app_name = net::fail_point::app_name(conn.app_name.as_deref(), &request.name, &request.body);
    net::fail_point::fail_command(&request.name, &ns, &net::fail_point::Client { app_name, internal })
}

/// `run` without the reply's times: the wait a read needs before it runs, the command, and
/// the waits its reply needs.
/// `write_concern_error`: a fail point's, answered instead of waiting for the write concern.
async fn execute(shared: &Shared, conn: &mut ConnState, request: Request, write_concern_error: Option<Document>) -> Reply {
    if let Some(repl) = &shared.repl {
        match common::optime::gossiped_cluster_time(&request.body) {
            Ok(Some(t)) => repl.gossip_cluster_time(&shared.store, t),
            Ok(None) => {}
            Err(e) => return Reply::new(dispatch::with_topology_version(shared, e).to_reply()),
        }
        let waited = match dispatch::read_after(shared, &request) {
            Ok(Some(after)) => wait_before_read(shared, after).await,
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = waited {
            return Reply::new(dispatch::with_topology_version(shared, e).to_reply());
        }
    }
    // A router's operation on a sharded collection (shardVersion) or on an unsharded one
    // (databaseVersion): the version checked, and a write admitted through the collection's
    // or database's gate (held until the command is done, not through its replication wait).
    let admission = if request.body.contains_key("shardVersion") || request.body.contains_key("databaseVersion") {
        match admit(shared, conn, &request).await {
            Ok(a) => a,
            Err(e) => return Reply::new(dispatch::with_topology_version(shared, e).to_reply()),
        }
    } else {
        Default::default()
    };
    conn.shard_filter = admission.filter;
    let authenticating = matches!(request.name.as_str(), "saslStart" | "saslContinue");
    let outcome = if crate::commands::never_blocks(&request.name) || crate::txn::runs_inline(&request, || shared.repl.as_ref().is_some_and(|r| r.replicates()))
    {
        await_data_loop(shared, conn, request).await
    } else {
        tokio::task::block_in_place(|| dispatch::run_command(shared, conn, request, None))
    };
    conn.shard_filter = None;
    drop(admission.gate);
    let dispatch::Outcome { mut reply, raw_batch, replication_wait, read_wait, await_data: _, close_connection } = outcome;
    if close_connection {
        return Reply::close();
    }
    if authenticating && reply.get_i32("code").is_ok_and(|c| c == common::Code::AuthenticationFailed.0) {
        conn.auth.failures += 1;
        if shared.config.auth_failed_delay_ms > 0 {
            // authFailedDelayMs slows password guessing; the wait holds this connection only.
            tokio::time::sleep(Duration::from_millis(shared.config.auth_failed_delay_ms)).await;
        }
    }
    if let Some(wce) = write_concern_error {
        reply.insert("writeConcernError", wce);
    } else if let Some(wait) = replication_wait {
        let at = wait.at;
        wait_for_replication(shared, wait, &mut reply).await;
        if let Some(repl) = &shared.repl {
            // The reply goes out now: strict reads on secondaries must see this write.
            repl.note_acknowledged(at);
        }
    }
    if let Some(wait) = read_wait {
        if let Err(e) = wait_for_commit_point(shared, wait).await {
            reply = dispatch::with_topology_version(shared, e).to_reply();
        }
    }
    // A raw batch belongs to a successful cursor reply only.
    let ok = reply_ok(&reply);
    Reply { body: reply, batch: raw_batch.filter(|_| ok), close: false }
}

/// `sharding::ShardingState::admit`, on a primary (a secondary answers the command's own
/// not-primary error: a versioned operation is the primary's), for a client authorized to
/// run the command.
async fn admit(shared: &Shared, conn: &mut ConnState, request: &Request) -> common::Result<crate::sharding::Admission> {
    let Some(repl) = shared.repl.as_ref().filter(|r| r.is_writable_primary()) else { return Ok(Default::default()) };
    // Only for a client that may run the command (admission may read the config servers);
    // any other is refused by dispatch, as without a version.
    if crate::auth::check(shared, conn, &request.db, &request.name, &request.body).is_err() {
        return Ok(Default::default());
    }
    shared.sharding.on_term(repl.term());
    shared.sharding.admit(request).await
}

/// Wait until a read's entries are majority-committed (dispatch::ReadWait). Without
/// maxTimeMS it waits as long as mongod would: until the set commits or this member steps
/// down.
async fn wait_for_commit_point(shared: &Shared, wait: dispatch::ReadWait) -> common::Result<()> {
    let Some(repl) = &shared.repl else { return Ok(()) };
    // The commit point counts a primary's entries once its journal has them.
    if repl.is_writable_primary() {
        repl.request_journal_flush_through(&shared.store, wait.at);
    }
    let deadline = wait.deadline.map(tokio::time::Instant::from_std);
    match wait_for_progress(repl, deadline, None, || repl.read_status(&shared.store, wait.at, wait.linearizable)).await {
        Waited::Satisfied => Ok(()),
        Waited::SteppedDown => Err(common::Error::new(common::Code::PrimarySteppedDown, "stepped down while waiting to confirm a linearizable read")),
        Waited::TimedOut => Err(common::Error::new(common::Code::MaxTimeMSExpired, "operation exceeded time limit waiting for the majority commit point")),
    }
}

/// Wait until this member has applied what a read must see (`dispatch::ReadAfter`): for a
/// strict read, first where the primary stood once the read arrived.
async fn wait_before_read(shared: &Shared, after: dispatch::ReadAfter) -> common::Result<()> {
    let Some(repl) = &shared.repl else { return Ok(()) };
    let started = std::time::Instant::now();
    // No maxTimeMS: wait as long as it takes, as mongod waits for afterClusterTime.
    let deadline = tokio::time::Instant::from_std(after.deadline.unwrap_or_else(|| started + Duration::from_secs(365 * 86_400)));
    let timed_out = || common::Error::new(common::Code::MaxTimeMSExpired, "operation exceeded time limit waiting to apply what the read must see");
    let mut ts = after.ts;
    if after.strict {
        let position = match repl.primary_position.read_page(repl.term()) {
            Some(ts) => {
                Counters::add(&shared.counters.repl_strict_page_reads, 1);
                Some(Ok(storage::OpTime { ts, term: 0 }))
            }
            None => repl.primary_position.after_now(deadline).await,
        };
        match position {
            None => return Err(timed_out()),
            Some(Err(e)) => return Err(e),
            Some(Ok(p)) => ts = ts.max(p.ts),
        }
    }
    // Applied already (the usual case): no subscription to progress.
    if shared.store.oplog_applied().unwrap_or_default().ts >= ts {
        Counters::add(&shared.counters.repl_read_waits, 1);
        return Ok(());
    }
    // A primary that has logged nothing since that time (a shard the client's earlier
    // operation did not reach) logs a no-op to reach it, as mongod does: its clock is past
    // it already (the time was at most the cluster time it was told).
    let behind = shared.store.oplog_last().unwrap_or_default().ts < ts;
    match repl.state() {
        repl::MemberState::Primary if behind => {
            let store = shared.store.clone();
            tokio::task::spawn_blocking(move || store.log_noop("reach a read's cluster time"))
                .await
                .map_err(|e| common::Error::internal(format!("the no-op write failed: {e}")))??;
        }
        // A secondary asks its primary for that no-op (which it then fetches and applies).
        // Should the ask fail, the read waits on as mongod's does, for the set's next write.
        repl::MemberState::Secondary if behind => {
            let asked = tokio::time::timeout_at(deadline, replication::reach::ask_primary_to_reach(repl, common::optime::ts_of(ts))).await;
            if let Ok(Err(e)) = asked {
                tracing::debug!("asking the primary to log past a read's cluster time failed: {}", e.message);
            }
        }
        _ => {}
    }
    let mut changes = repl.progress_changes();
    loop {
        // Subscribe before looking, so that an apply in between wakes the wait.
        changes.borrow_and_update();
        if shared.store.oplog_applied().unwrap_or_default().ts >= ts {
            break;
        }
        match tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + WRITE_CONCERN_RECHECK), changes.changed()).await {
            Ok(_) => {}
            Err(_) if tokio::time::Instant::now() >= deadline => return Err(timed_out()),
            Err(_) => {}
        }
    }
    Counters::add(&shared.counters.repl_read_waits, 1);
    Counters::add(&shared.counters.repl_read_wait_us, started.elapsed().as_micros() as u64);
    Ok(())
}

/// Run a command on the worker; an awaitData getMore that found nothing new
/// (`dispatch::Outcome::await_data`) waits here for a write and runs again, until it has data or
/// its wait ends. Waiting here, not in a blocked thread, is what lets any number of tailing
/// cursors (every secondary's oplog fetcher holds one) wait at once: a thread per waiting
/// getMore would take from tokio's bounded pool of blocking threads, which writes need.
async fn await_data_loop(shared: &Shared, conn: &mut ConnState, request: Request) -> dispatch::Outcome {
    let mut resumed = None;
    loop {
        let outcome = dispatch::run_command(shared, conn, request.clone(), resumed);
        let Some(w) = outcome.await_data else { return outcome };
        let deadline = tokio::time::Instant::from_std(w.deadline);
        let mut progress = w.commit_point.and(shared.repl.as_ref()).map(|r| r.progress_changes());
        let _waiting = progress.is_some().then(|| shared.change_feed.waiting());
        // With one data-bearing member, an entry commits once durable, which no replication
        // progress reports: the store's listener does (writes, and the durable point's moves).
        let alone = shared.repl.as_ref().is_some_and(|r| !r.replicates());
        loop {
            // Registered before the look, so a write in between is not missed; a deadline
            // already past ends the wait at once.
            let notified = shared.writes.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(p) = progress.as_mut() {
                p.borrow_and_update();
            }
            // A change stream has news only when the commit point moves (it reads no entry
            // past it): it wakes on replication progress, not on writes, which with many
            // streams open would each wake every one of them for nothing.
            let news = match (w.commit_point, shared.repl.as_ref()) {
                (Some(seen), Some(r)) => r.commit_point(&shared.store) != seen,
                _ => shared.store.write_seq() != w.seen,
            };
            if news {
                if progress.is_some() {
                    // Let other streams' news gather (see `Feed::coalesce_delay`).
                    let _ = tokio::time::timeout_at(deadline, tokio::time::sleep(shared.change_feed.coalesce_delay())).await;
                }
                break;
            }
            let woken = async {
                match progress.as_mut() {
                    Some(p) if alone => tokio::select! {
                        _ = notified => {}
                        _ = p.changed() => {}
                    },
                    Some(p) => {
                        let _ = p.changed().await;
                    }
                    None => notified.await,
                }
            };
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                break;
            }
        }
        resumed = Some(w.deadline);
    }
}

const WRITE_CONCERN_RECHECK: Duration = Duration::from_secs(1);

enum Waited {
    Satisfied,
    SteppedDown,
    TimedOut,
}

/// Re-evaluate `status` whenever replication makes progress, until it is settled or
/// `deadline` passes. Woken by progress; the periodic look is a backstop, not the mechanism.
/// A wait for a majority to have `majority_durable`'s optime durable is woken only when
/// that may have happened (`ReplCoord::majority_durable_waiter`), not on every report.
async fn wait_for_progress(
    repl: &replication::ReplCoord,
    deadline: Option<tokio::time::Instant>,
    majority_durable: Option<(&storage::Store, storage::OpTime)>,
    mut status: impl FnMut() -> replication::WcStatus,
) -> Waited {
    use replication::WcStatus;
    let mut changes = repl.progress_changes();
    loop {
        // Subscribe before looking, so that a change in between wakes the wait.
        let majority = majority_durable.map(|(store, at)| repl.majority_durable_waiter(store, at));
        changes.borrow_and_update();
        match status() {
            WcStatus::Satisfied => return Waited::Satisfied,
            WcStatus::SteppedDown => return Waited::SteppedDown,
            WcStatus::Pending => {}
        }
        let recheck = tokio::time::Instant::now() + WRITE_CONCERN_RECHECK;
        let until = deadline.map_or(recheck, |d| d.min(recheck));
        match majority {
            Some(woken) => {
                let _ = tokio::time::timeout_at(until, woken).await;
            }
            None => {
                let _ = tokio::time::timeout_at(until, changes.changed()).await;
            }
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Waited::TimedOut;
        }
    }
}

/// Wait until the members a write concern needs have the write; on a timeout or a step-down
/// the reply gets a writeConcernError beside the write's own result, as mongod's does.
async fn wait_for_replication(shared: &Shared, wait: dispatch::ReplicationWait, reply: &mut Document) {
    let Some(repl) = &shared.repl else { return };
    if wait.durable || wait.own_durable {
        repl.request_journal_flush_through(&shared.store, wait.at);
    }
    let deadline = wait.timeout.map(|t| tokio::time::Instant::now() + t);
    let majority = (wait.durable && wait.mode == repl::progress::WMode::Majority).then_some((&shared.store, wait.at));
    let started = std::time::Instant::now();
    let waited =
        wait_for_progress(repl, deadline, majority, || repl.write_concern_status(&shared.store, wait.at, &wait.mode, wait.durable, wait.own_durable)).await;
    let c = &shared.counters;
    if wait.mode.needs_others() {
        // mongod's metrics.getLastError.wtime counts waits for other members only.
        Counters::add(&c.wc_waits, 1);
        Counters::add(&c.wc_wait_us, started.elapsed().as_micros() as u64);
    }
    let error = match waited {
        Waited::Satisfied => return,
        Waited::SteppedDown => {
            doc! {"code": 189, "codeName": "PrimarySteppedDown", "errmsg": "Primary stepped down while waiting for replication", "errInfo": {"writeConcern": wait.write_concern.clone()}}
        }
        Waited::TimedOut => {
            Counters::add(&c.wc_timeouts, 1);
            doc! {"code": 64, "codeName": "WriteConcernFailed", "errmsg": "waiting for replication timed out", "errInfo": {"wtimeout": true, "writeConcern": wait.write_concern.clone()}}
        }
    };
    if reply_ok(reply) {
        reply.insert("writeConcernError", error);
    }
}
