//! One client connection: read frames, decode, dispatch, encode, write. Also the two
//! server-push protocols of the wire: exhaust getMore and the awaitable (streaming) hello.

use crate::dispatch;
use crate::state::{Counters, Shared};
use bson::{doc, Bson, Document};
use common::limits::MESSAGE_SIZE_MAX_BYTES;
use net::tls::Stream;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use wire::Request;
use wire::{Compressor, Message, OpMsg, OpReply};

static NEXT_REQUEST_ID: AtomicI32 = AtomicI32::new(1);

fn next_request_id() -> i32 {
    NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed)
}

/// Longest wait of an awaitable hello (drivers send maxAwaitTimeMS = 10 s by default).
const AWAIT_TIME_MS_MAX: i64 = 60_000;

/// Per-connection state that commands may read or change.
pub struct ConnState {
    pub id: u64,
    pub remote: SocketAddr,
    /// Compressors agreed in the handshake (intersection of client and server lists).
    pub compressors: Vec<Compressor>,
    pub client_metadata: Option<Document>,
    pub app_name: Option<String>,
    /// Set by a write on a primary that must wait for other members before replying.
    pub replication_wait: Option<dispatch::ReplicationWait>,
    /// Set by a majority or linearizable read that must wait for the commit point.
    pub read_wait: Option<dispatch::ReadWait>,
    /// An awaitData getMore found nothing new: the connection waits (on the async worker)
    /// for a write after `write_seq` `seen`, until `deadline`, then runs it again.
    pub await_data: Option<AwaitData>,
    /// The deadline of the awaitData getMore being run again, so that its wait does not
    /// start over.
    pub await_deadline: Option<Instant>,
    /// Set by a command whose reply batch is raw BSON (`commands::cursor_batch_reply`).
    pub raw_batch: Option<RawReplyBatch>,
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

/// A cursor batch kept as BSON (an oplog tail's records as stored), written into the
/// reply's empty `cursor.<key>` array when the reply is encoded: a primary sends each entry
/// to its secondaries without decoding and encoding it for every fetch.
pub struct RawReplyBatch {
    pub key: &'static str,
    pub docs: Vec<storage::RawRecord>,
}

/// A command's reply as it goes to the encoder.
struct Reply {
    body: Document,
    batch: Option<RawReplyBatch>,
}

impl Reply {
    fn encode(self, reply_id: i32, response_to: i32, flags: u32, compressor: Option<Compressor>) -> Vec<u8> {
        let batch = self.batch.as_ref().map(|b| wire::RawBatch { key: b.key, docs: &b.docs });
        wire::encode_msg_with_batch(reply_id, response_to, &OpMsg { flags, body: self.body, sequences: vec![] }, batch, compressor)
    }

    /// The body with the raw batch decoded into it, for an encoder that does not take one.
    fn into_document(self) -> Document {
        let Some(b) = self.batch else { return self.body };
        let mut body = self.body;
        let docs: Result<Vec<Bson>, _> = b.docs.iter().map(|d| storage::decode_record(d.as_ref()).map(Bson::Document)).collect();
        match (docs, body.get_document_mut("cursor")) {
            (Ok(docs), Ok(c)) => {
                c.insert(b.key, docs);
                body
            }
            (Err(e), _) => common::Error::new(common::Code::InvalidBSON, format!("invalid BSON in a cursor batch: {}", e.message)).to_reply(),
            (_, Err(_)) => common::Error::internal("a raw cursor batch without a cursor reply").to_reply(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct AwaitData {
    pub seen: u64,
    pub deadline: Instant,
}

pub async fn serve(shared: Arc<Shared>, stream: TcpStream, remote: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let id = shared.next_connection_id.fetch_add(1, Ordering::Relaxed);
    let mut conn = ConnState {
        id,
        remote,
        compressors: Vec::new(),
        client_metadata: None,
        app_name: None,
        replication_wait: None,
        read_wait: None,
        await_data: None,
        await_deadline: None,
        raw_batch: None,
        auth: Default::default(),
        local: stream.local_addr().ok(),
        uuid: bson::Uuid::new(),
        audit_actor: None,
        audit_frame: Vec::new(),
        shard_filter: None,
    };
    tracing::debug!(conn = id, %remote, "connection accepted");
    match shared.tls.accept(stream).await {
        Ok(mut stream) => {
            conn.auth.peer_subject = stream.peer_subject();
            if let Err(reason) = serve_loop(&shared, &mut stream, &mut conn).await {
                tracing::info!(conn = id, %remote, "connection ended: {reason}");
            }
        }
        Err(reason) => tracing::info!(conn = id, %remote, "connection refused: {reason}"),
    }
    shared.counters.connections_current.fetch_sub(1, Ordering::Relaxed);
}

async fn serve_loop(shared: &Arc<Shared>, stream: &mut Stream, conn: &mut ConnState) -> Result<(), String> {
    let mut reader = net::frame::FrameReader::new();
    loop {
        let Some(frame) = reader.next(stream).await? else { return Ok(()) };
        let buf = &reader.buf[frame];
        let len = buf.len();
        Counters::add(&shared.counters.bytes_in, len as u64);
        Counters::add(&shared.counters.requests, 1);

        let decoded = match wire::decode(buf, MESSAGE_SIZE_MAX_BYTES) {
            Ok(d) => d,
            Err(e) => {
                // The frame was read whole, so the stream is still in sync: answer with the error
                // (the client learns why) and keep serving.
                let request_id = i32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
                let op_code = i32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]);
                tracing::warn!(conn = conn.id, "invalid message: {}", e);
                let body = e.to_reply();
                let out = if op_code == wire::OP_QUERY {
                    wire::encode_reply(
                        next_request_id(),
                        request_id,
                        &OpReply { response_flags: 2, cursor_id: 0, starting_from: 0, documents: vec![body] },
                        None,
                    )
                } else if op_code == wire::OP_MSG || op_code == wire::OP_COMPRESSED {
                    wire::encode_msg(next_request_id(), request_id, &OpMsg { flags: 0, body, sequences: vec![] }, None)
                } else {
                    // Legacy opcodes (OP_INSERT, OP_GET_MORE...) and unknown ones: mongod 6+ closes.
                    return Err(format!("unsupported opcode {op_code}"));
                };
                write_frame(shared, stream, &out).await?;
                continue;
            }
        };
        let request_id = decoded.header.request_id;
        let compressor = decoded.compressor;
        let body = match &decoded.message {
            Message::Msg(m) => Some(&m.body),
            _ => None,
        };
        crate::audit::keep_frame(shared, conn, body, compressor.is_none().then_some(buf));
        match decoded.message {
            Message::Msg(msg) if is_oplog_stream(&msg) => stream_oplog(shared, stream, &mut reader, conn, request_id, msg).await?,
            Message::Msg(msg) => handle_msg(shared, stream, conn, request_id, compressor, msg).await?,
            Message::Query(q) => {
                let reply = handle_op_query(shared, conn, q).await;
                let out = wire::encode_reply(next_request_id(), request_id, &reply, None);
                write_frame(shared, stream, &out).await?;
            }
            Message::Reply(_) => return Err("client sent OP_REPLY".into()),
        }
    }
}

async fn write_frame(shared: &Shared, stream: &mut Stream, frame: &[u8]) -> Result<(), String> {
    Counters::add(&shared.counters.bytes_out, frame.len() as u64);
    stream.write_all(frame).await.map_err(|e| format!("write error: {e}"))
}

fn reply_compressor(conn: &ConnState, request_compressor: Option<Compressor>, command: &str) -> Option<Compressor> {
    // Reply with the compressor the client used, if it was negotiated and the command may be compressed.
    match request_compressor {
        Some(c) if conn.compressors.contains(&c) && wire::is_compressible_command(command) => Some(c),
        _ => None,
    }
}

async fn handle_msg(
    shared: &Arc<Shared>,
    stream: &mut Stream,
    conn: &mut ConnState,
    request_id: i32,
    compressor: Option<Compressor>,
    msg: OpMsg,
) -> Result<(), String> {
    let more_to_come = msg.flags & wire::flags::MORE_TO_COME != 0;
    let exhaust = msg.flags & wire::flags::EXHAUST_ALLOWED != 0;
    let OpMsg { body, sequences, .. } = msg;
    let request = match Request::from_msg(body, sequences) {
        Ok(r) => r,
        Err(e) => {
            if !more_to_come {
                let out = wire::encode_msg(next_request_id(), request_id, &OpMsg { flags: 0, body: e.to_reply(), sequences: vec![] }, None);
                write_frame(shared, stream, &out).await?;
            }
            return Ok(());
        }
    };
    let name = request.name.clone();
    let reply_comp = reply_compressor(conn, compressor, &name);

    if wire::is_hello(&name) {
        if let Some((wait, mut seen)) = awaitable_hello_wait(shared, &request.body) {
            // Streaming SDAM monitor: wait for a topology change (a standalone has none, so the
            // full maxAwaitTimeMS), reply, and with exhaustAllowed keep pushing replies.
            let mut response_to = request_id;
            loop {
                wait_for_topology_change(shared, seen, wait).await;
                let reply = run(shared, conn, request.clone()).await;
                seen = reply.body.get_document("topologyVersion").ok().and_then(|t| t.get_i64("counter").ok()).unwrap_or(seen);
                let flags = if exhaust { wire::flags::MORE_TO_COME } else { 0 };
                let reply_id = next_request_id();
                let out = reply.encode(reply_id, response_to, flags, reply_comp);
                write_frame(shared, stream, &out).await?;
                if !exhaust {
                    return Ok(());
                }
                response_to = reply_id;
            }
        }
    }

    // Only an exhaust getMore re-runs its request; don't copy big insert batches otherwise.
    let again = (exhaust && name == "getMore").then(|| request.clone());
    let reply = run(shared, conn, request).await;
    if more_to_come {
        // Unacknowledged (w:0) request: the client expects no reply.
        return Ok(());
    }
    let mut cursor_open = again.is_some() && cursor_id_of(&reply.body) != 0;
    let reply_id = next_request_id();
    let flags = if cursor_open { wire::flags::MORE_TO_COME } else { 0 };
    let out = reply.encode(reply_id, request_id, flags, reply_comp);
    write_frame(shared, stream, &out).await?;
    if conn.auth.failures >= crate::auth::FAILURES_PER_CONNECTION_MAX {
        return Err(format!("closed after {} failed authentications", conn.auth.failures));
    }
    // Exhaust cursor: keep sending batches until the cursor is exhausted, each reply
    // responding to the previous one, as the OP_MSG spec describes.
    let mut response_to = reply_id;
    while let (true, Some(request)) = (cursor_open, &again) {
        let reply = run(shared, conn, request.clone()).await;
        cursor_open = cursor_id_of(&reply.body) != 0;
        let reply_id = next_request_id();
        let flags = if cursor_open { wire::flags::MORE_TO_COME } else { 0 };
        let out = reply.encode(reply_id, response_to, flags, reply_comp);
        write_frame(shared, stream, &out).await?;
        response_to = reply_id;
    }
    Ok(())
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
    shared: &Arc<Shared>,
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
        // A getMore dropped while it waited for entries starts its wait over when run again.
        conn.await_deadline = None;
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
                let open = cursor_id_of(&reply.body) != 0;
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

/// A reply with ok:1.
fn reply_ok(reply: &Document) -> bool {
    matches!(reply.get("ok"), Some(Bson::Double(v)) if *v == 1.0)
}

async fn refuse_stream(shared: &Shared, stream: &mut Stream, request_id: i32, e: &common::Error) -> Result<(), String> {
    let out = wire::encode_msg(next_request_id(), request_id, &OpMsg { flags: 0, body: e.to_reply(), sequences: vec![] }, None);
    write_frame(shared, stream, &out).await
}

fn cursor_id_of(reply: &Document) -> i64 {
    reply.get_document("cursor").ok().and_then(|c| c.get_i64("id").ok()).unwrap_or(0)
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
/// group commit wait on condition variables).
async fn run(shared: &Arc<Shared>, conn: &mut ConnState, request: Request) -> Reply {
    let mut reply = execute(shared, conn, request).await;
    if let Some(repl) = &shared.repl {
        // Replies carry the times causally consistent sessions chain their reads with.
        if let Some((cluster_time, operation_time)) = repl.reply_times(&shared.store) {
            reply.body.insert("$clusterTime", cluster_time);
            reply.body.insert("operationTime", operation_time);
        }
    }
    reply
}

/// `run` without the reply's times: the wait a read needs before it runs, the command, and
/// the waits its reply needs.
async fn execute(shared: &Arc<Shared>, conn: &mut ConnState, request: Request) -> Reply {
    if let Some(repl) = &shared.repl {
        if let Ok(t) = request.body.get_document("$clusterTime").and_then(|c| c.get_timestamp("clusterTime")) {
            repl.gossip_cluster_time(t);
        }
        let waited = match dispatch::read_after(shared, &request) {
            Ok(Some(after)) => wait_before_read(shared, after).await,
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = waited {
            return Reply { body: dispatch::with_topology_version(shared, e).to_reply(), batch: None };
        }
    }
    // A router's operation on a sharded collection (shardVersion) or on an unsharded one
    // (databaseVersion): the version checked, and a write admitted through the collection's
    // or database's gate (held until the command is done, not through its replication wait).
    let admission = if request.body.contains_key("shardVersion") || request.body.contains_key("databaseVersion") {
        match admit(shared, conn, &request).await {
            Ok(a) => a,
            Err(e) => return Reply { body: dispatch::with_topology_version(shared, e).to_reply(), batch: None },
        }
    } else {
        Default::default()
    };
    conn.shard_filter = admission.filter;
    let authenticating = matches!(request.name.as_str(), "saslStart" | "saslContinue");
    let mut reply = if crate::commands::never_blocks(&request.name) {
        await_data_loop(shared, conn, request).await
    } else {
        tokio::task::block_in_place(|| dispatch::run_command(shared, conn, request))
    };
    conn.shard_filter = None;
    drop(admission.gate);
    if authenticating && reply.get_i32("code").is_ok_and(|c| c == common::Code::AuthenticationFailed.0) {
        conn.auth.failures += 1;
        if shared.config.auth_failed_delay_ms > 0 {
            // authFailedDelayMs slows password guessing; the wait holds this connection only.
            tokio::time::sleep(Duration::from_millis(shared.config.auth_failed_delay_ms)).await;
        }
    }
    if let Some(wait) = conn.replication_wait.take() {
        let at = wait.at;
        wait_for_replication(shared, wait, &mut reply).await;
        if let Some(repl) = &shared.repl {
            // The reply goes out now: strict reads on secondaries must see this write.
            repl.note_acknowledged(at);
        }
    }
    if let Some(wait) = conn.read_wait.take() {
        if let Err(e) = wait_for_commit_point(shared, wait).await {
            reply = dispatch::with_topology_version(shared, e).to_reply();
        }
    }
    // A raw batch belongs to a successful cursor reply only.
    let ok = reply_ok(&reply);
    let batch = conn.raw_batch.take().filter(|_| ok);
    Reply { body: reply, batch }
}

/// `sharding::ShardingState::admit`, on a primary (a secondary answers the command's own
/// not-primary error: a versioned operation is the primary's), for a client authorized to
/// run the command.
async fn admit(shared: &Arc<Shared>, conn: &mut ConnState, request: &Request) -> common::Result<crate::sharding::Admission> {
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
/// (`ConnState::await_data`) waits here for a write and runs again, until it has data or
/// its wait ends. Waiting here, not in a blocked thread, is what lets any number of tailing
/// cursors (every secondary's oplog fetcher holds one) wait at once: a thread per waiting
/// getMore would take from tokio's bounded pool of blocking threads, which writes need.
async fn await_data_loop(shared: &Arc<Shared>, conn: &mut ConnState, request: Request) -> Document {
    loop {
        let reply = dispatch::run_command(shared, conn, request.clone());
        let Some(w) = conn.await_data.take() else {
            conn.await_deadline = None;
            return reply;
        };
        let deadline = tokio::time::Instant::from_std(w.deadline);
        loop {
            // Registered before the look, so a write in between is not missed; a deadline
            // already past ends the wait at once.
            let notified = shared.writes.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if shared.store.write_seq() != w.seen || tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        conn.await_deadline = Some(w.deadline);
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

/// Legacy OP_QUERY: only commands on `<db>.$cmd` (the isMaster handshake of old drivers).
async fn handle_op_query(shared: &Arc<Shared>, conn: &mut ConnState, q: wire::OpQuery) -> OpReply {
    let reply_doc = match q.full_collection_name.strip_suffix(".$cmd") {
        Some(db) => {
            // Old drivers may wrap the command as {$query: {...}, $readPreference: ...}.
            let cmd = match q.query.get_document("$query") {
                Ok(inner) => inner.clone(),
                Err(_) => q.query.clone(),
            };
            let name = cmd.keys().next().cloned().unwrap_or_default();
            if wire::is_hello(&name) {
                let mut body = cmd;
                body.insert("$db", db);
                match Request::from_msg(body, Vec::new()) {
                    Ok(r) => run(shared, conn, r).await.into_document(),
                    Err(e) => e.to_reply(),
                }
            } else {
                doc! { "ok": 0.0, "errmsg": format!("Unsupported OP_QUERY command: {name}. The client driver may require an upgrade. For more details see https://dochub.mongodb.org/core/legacy-opcode-removal"), "code": 352, "codeName": "UnsupportedOpQueryCommand" }
            }
        }
        None => doc! { "$err": "OP_QUERY is no longer supported. The client driver may require an upgrade.", "code": 5739101, "ok": 0.0 },
    };
    OpReply { response_flags: 0, cursor_id: 0, starting_from: 0, documents: vec![reply_doc] }
}
