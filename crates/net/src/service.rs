//! The connection loop both roles serve clients with: accept (within maxConns), TLS, read
//! whole frames, decode (decompressing), run each request through the role's `Service`,
//! and write its reply (compressed as the client's was, when negotiated). The wire's push
//! protocols live here too: exhaust cursors (a getMore run again while its cursor stays
//! open, each reply `moreToCome`), the awaitable (streaming) hello, unacknowledged
//! `moreToCome` requests, and the legacy opcodes (`legacy`, each translated into the command
//! it stands for). What a request means is the service's: this loop knows no command but
//! hello and getMore, by name, and those the legacy opcodes become.
//!
//! Invariant: a frame that was read whole but cannot be decoded gets an error reply and the
//! connection goes on (the stream is still in sync); only an unsupported opcode or a broken
//! stream ends it.

use crate::frame::FrameReader;
use crate::legacy;
use crate::tls::Stream;
use bson::{Bson, Document};
use common::limits::MESSAGE_SIZE_MAX_BYTES;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use wire::{Compressor, Message, OpMsg, OpReply, Request};

static NEXT_REQUEST_ID: AtomicI32 = AtomicI32::new(1);

/// Why a connection ends when its service asks to drop it.
pub(crate) const CLOSED: &str = "closed by failCommand (closeConnection)";

/// The request id of the next message this process sends on a client connection.
pub fn next_request_id() -> i32 {
    NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed)
}

/// A command's reply as it goes to the encoder: the body, and a cursor batch kept as BSON
/// (an oplog tail's records as stored) that the encoder writes into the body's empty
/// `cursor.<key>` array, so that a primary sends each entry to its secondaries without
/// decoding and encoding it for every fetch.
pub struct Reply<B> {
    pub body: Document,
    pub batch: Option<RawBatch<B>>,
    /// Drop the connection instead of replying (a test's failCommand `closeConnection`).
    pub close: bool,
}

pub struct RawBatch<B> {
    pub key: &'static str,
    pub docs: Vec<B>,
}

impl<B: AsRef<[u8]>> Reply<B> {
    pub fn new(body: Document) -> Reply<B> {
        Reply { body, batch: None, close: false }
    }

    /// No reply: the connection is dropped.
    pub fn close() -> Reply<B> {
        Reply { body: Document::new(), batch: None, close: true }
    }

    pub fn encode(self, reply_id: i32, response_to: i32, flags: u32, compressor: Option<Compressor>) -> Vec<u8> {
        let batch = self.batch.as_ref().map(|b| wire::RawBatch { key: b.key, docs: &b.docs });
        wire::encode_msg_with_batch(reply_id, response_to, &OpMsg { flags, body: self.body, sequences: vec![] }, batch, compressor)
    }

    /// The body with the raw batch decoded into it, for an encoder that does not take one.
    pub fn into_document(self) -> Document {
        let Some(b) = self.batch else { return self.body };
        let mut body = self.body;
        let docs: Result<Vec<Bson>, _> = b.docs.iter().map(|d| bson::Document::from_reader(d.as_ref()).map(Bson::Document)).collect();
        match (docs, body.get_document_mut("cursor")) {
            (Ok(docs), Ok(c)) => {
                c.insert(b.key, docs);
                body
            }
            (Err(e), _) => common::Error::new(common::Code::InvalidBSON, format!("invalid BSON in a cursor batch: {e}")).to_reply(),
            (_, Err(_)) => common::Error::internal("a raw cursor batch without a cursor reply").to_reply(),
        }
    }

    pub fn cursor_id(&self) -> i64 {
        cursor_id_of(&self.body)
    }
}

/// A cursor reply's cursor id (0 when exhausted or not a cursor reply).
pub fn cursor_id_of(reply: &Document) -> i64 {
    reply.get_document("cursor").ok().and_then(|c| c.get_i64("id").ok()).unwrap_or(0)
}

/// What a role (mongod, the router) puts behind the loop.
pub trait Service: Send + Sync + Sized + 'static {
    /// A connection's state, made when it is accepted.
    type Conn: Send;
    /// A raw cursor batch's documents.
    type Batch: AsRef<[u8]> + Send + Sync;

    /// How client connections are accepted: TLS or not.
    fn tls(&self) -> &crate::tls::Acceptor;
    /// Whether one more connection may be taken (maxConns); if so it is counted open.
    fn admit(&self, remote: SocketAddr) -> bool;
    /// A connection taken by `admit` ended.
    fn release(&self);
    /// State for a new connection, after its TLS handshake.
    fn open(&self, remote: SocketAddr, local: Option<SocketAddr>, peer_subject: Option<String>) -> Self::Conn;
    /// The connection's id, for logs.
    fn conn_id(conn: &Self::Conn) -> u64;
    /// The compressors the connection negotiated in its handshake.
    fn compressors(conn: &Self::Conn) -> &[Compressor];

    /// Run one request.
    fn run(&self, conn: &mut Self::Conn, request: Request) -> impl Future<Output = Reply<Self::Batch>> + Send;

    /// Bytes read (one request) and written, for serverStatus's network section.
    fn note_in(&self, _bytes: usize) {}
    fn note_out(&self, _bytes: usize) {}

    /// A decoded request before it runs, with its frame when it came uncompressed.
    fn on_request(&self, _conn: &mut Self::Conn, _body: Option<&Document>, _frame: Option<&[u8]>) {}

    /// A reason to close the connection after the reply just sent (failed logins).
    fn close_reason(&self, _conn: &Self::Conn) -> Option<String> {
        None
    }

    /// A request the service answers from its frame alone, undecoded (the router's insert
    /// into a sharded collection); `None` leaves it to the loop.
    fn run_frame(&self, _conn: &mut Self::Conn, _frame: &[u8]) -> impl Future<Output = Option<Reply<Self::Batch>>> + Send {
        async { None }
    }

    /// If this hello is awaitable (maxAwaitTimeMS with the current topologyVersion): how
    /// long to wait at most, and the topologyVersion counter the client has seen.
    fn awaitable_hello(&self, _body: &Document) -> Option<(Duration, i64)> {
        None
    }
    /// Wait until the topologyVersion counter differs from `seen`, at most `wait`.
    fn topology_change(&self, _seen: i64, wait: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(wait)
    }

    /// Whether the service takes the connection over for this request (a member's oplog
    /// push stream): then `take_over` serves it, reading from `reader`, until it ends.
    fn takes_over(&self, _msg: &OpMsg) -> bool {
        false
    }
    fn take_over(
        &self,
        _stream: &mut Stream,
        _reader: &mut FrameReader,
        _conn: &mut Self::Conn,
        _request_id: i32,
        _msg: OpMsg,
    ) -> impl Future<Output = Result<(), String>> + Send {
        async { Err("this server takes over no connection".to_string()) }
    }
}

/// Accept connections on `listener` for ever, each served on its own task.
pub async fn accept_loop<S: Service>(service: Arc<S>, listener: TcpListener) {
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if !service.admit(remote) {
            drop(stream);
            continue;
        }
        tokio::spawn(serve(service.clone(), stream, remote));
    }
}

/// Serve one connection until it closes.
pub async fn serve<S: Service>(service: Arc<S>, stream: TcpStream, remote: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    match service.tls().accept(stream).await {
        Ok(mut stream) => {
            let mut conn = service.open(remote, local, stream.peer_subject());
            tracing::debug!(conn = S::conn_id(&conn), %remote, "connection accepted");
            if let Err(reason) = serve_loop(&*service, &mut stream, &mut conn).await {
                tracing::info!(conn = S::conn_id(&conn), %remote, "connection ended: {reason}");
            }
        }
        Err(reason) => tracing::info!(%remote, "connection refused: {reason}"),
    }
    service.release();
}

async fn serve_loop<S: Service>(service: &S, stream: &mut Stream, conn: &mut S::Conn) -> Result<(), String> {
    let mut reader = FrameReader::new();
    let mut legacy = legacy::Legacy::default();
    loop {
        let Some(frame) = reader.next(stream).await? else { return Ok(()) };
        let buf = &reader.buf[frame];
        service.note_in(buf.len());
        let request_id = i32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
        let op_code = i32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]);
        // (An OP_MSG too short for its flags is refused by the decoder below.)
        if op_code == wire::OP_MSG && buf.len() >= wire::HEADER_SIZE_BYTES + 4 {
            if let Some(reply) = service.run_frame(conn, buf).await {
                let flags = u32::from_le_bytes([buf[16], buf[17], buf[18], buf[19]]);
                if flags & wire::flags::MORE_TO_COME == 0 {
                    write_frame(service, stream, &reply.encode(next_request_id(), request_id, 0, None)).await?;
                }
                continue;
            }
        }
        let decoded = match wire::decode(buf, MESSAGE_SIZE_MAX_BYTES) {
            Ok(d) => d,
            Err(e) => {
                // Read whole, so the stream is still in sync: answer with the error (the
                // client learns why) and keep serving.
                tracing::warn!(conn = S::conn_id(conn), "invalid message: {}", e);
                let body = e.to_reply();
                let out = if op_code == wire::OP_QUERY {
                    let reply = OpReply { response_flags: 2, cursor_id: 0, starting_from: 0, documents: vec![body] };
                    wire::encode_reply(next_request_id(), request_id, &reply, None)
                } else if op_code == wire::OP_MSG || op_code == wire::OP_COMPRESSED {
                    wire::encode_msg(next_request_id(), request_id, &OpMsg { flags: 0, body, sequences: vec![] }, None)
                } else {
                    // Legacy opcodes (OP_INSERT, OP_GET_MORE...) and unknown ones: mongod 6+ closes.
                    return Err(format!("unsupported opcode {op_code}"));
                };
                write_frame(service, stream, &out).await?;
                continue;
            }
        };
        let compressor = decoded.compressor;
        let body = match &decoded.message {
            Message::Msg(m) => Some(&m.body),
            _ => None,
        };
        service.on_request(conn, body, compressor.is_none().then_some(buf));
        match decoded.message {
            Message::Msg(msg) if service.takes_over(&msg) => service.take_over(stream, &mut reader, conn, request_id, msg).await?,
            Message::Msg(msg) => handle_msg(service, stream, conn, request_id, compressor, msg).await?,
            Message::Reply(_) => return Err("client sent OP_REPLY".into()),
            message => match legacy::handle(service, conn, &mut legacy, message).await {
                legacy::Outcome::Reply(reply) => write_frame(service, stream, &wire::encode_reply(next_request_id(), request_id, &reply, None)).await?,
                legacy::Outcome::Nothing => {}
                legacy::Outcome::Close => return Err(CLOSED.into()),
            },
        }
    }
}

/// Write one whole message.
pub async fn write_frame<S: Service>(service: &S, stream: &mut Stream, frame: &[u8]) -> Result<(), String> {
    service.note_out(frame.len());
    stream.write_all(frame).await.map_err(|e| format!("write error: {e}"))
}

/// A hello's compression negotiation: the server's list order wins, filtered by what the
/// client offers.
pub fn negotiate_compressors(ours: &[Compressor], offered: &[Bson]) -> Vec<Compressor> {
    ours.iter().copied().filter(|c| offered.iter().any(|o| o.as_str() == Some(c.name()))).collect()
}

/// Reply with the compressor the client used, if it was negotiated and the command may be
/// compressed.
fn reply_compressor(negotiated: &[Compressor], request_compressor: Option<Compressor>, command: &str) -> Option<Compressor> {
    match request_compressor {
        Some(c) if negotiated.contains(&c) && wire::is_compressible_command(command) => Some(c),
        _ => None,
    }
}

async fn handle_msg<S: Service>(
    service: &S,
    stream: &mut Stream,
    conn: &mut S::Conn,
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
                write_frame(service, stream, &out).await?;
            }
            return Ok(());
        }
    };
    let reply_comp = reply_compressor(S::compressors(conn), compressor, &request.name);

    if wire::is_hello(&request.name) {
        if let Some((wait, mut seen)) = service.awaitable_hello(&request.body) {
            // Streaming SDAM monitor: wait for a topology change (a standalone has none, so
            // the full maxAwaitTimeMS), reply, and with exhaustAllowed keep pushing replies.
            let mut response_to = request_id;
            loop {
                service.topology_change(seen, wait).await;
                let reply = service.run(conn, request.clone()).await;
                if reply.close {
                    return Err(CLOSED.into());
                }
                seen = reply.body.get_document("topologyVersion").ok().and_then(|t| t.get_i64("counter").ok()).unwrap_or(seen);
                let flags = if exhaust { wire::flags::MORE_TO_COME } else { 0 };
                let reply_id = next_request_id();
                write_frame(service, stream, &reply.encode(reply_id, response_to, flags, reply_comp)).await?;
                if !exhaust {
                    return Ok(());
                }
                response_to = reply_id;
            }
        }
    }

    // Only an exhaust getMore runs its request again; big insert batches are not copied.
    let again = (exhaust && request.name == "getMore").then(|| request.clone());
    let reply = service.run(conn, request).await;
    if reply.close {
        return Err(CLOSED.into());
    }
    if more_to_come {
        // Unacknowledged (w:0) request: the client expects no reply.
        return Ok(());
    }
    let mut cursor_open = again.is_some() && reply.cursor_id() != 0;
    let reply_id = next_request_id();
    let flags = if cursor_open { wire::flags::MORE_TO_COME } else { 0 };
    write_frame(service, stream, &reply.encode(reply_id, request_id, flags, reply_comp)).await?;
    if let Some(reason) = service.close_reason(conn) {
        return Err(reason);
    }
    // Exhaust cursor: keep sending batches until the cursor is exhausted, each reply
    // responding to the previous one, as the OP_MSG spec describes.
    let mut response_to = reply_id;
    while let (true, Some(request)) = (cursor_open, &again) {
        let reply = service.run(conn, request.clone()).await;
        if reply.close {
            return Err(CLOSED.into());
        }
        cursor_open = reply.cursor_id() != 0;
        let reply_id = next_request_id();
        let flags = if cursor_open { wire::flags::MORE_TO_COME } else { 0 };
        write_frame(service, stream, &reply.encode(reply_id, response_to, flags, reply_comp)).await?;
        response_to = reply_id;
    }
    Ok(())
}
