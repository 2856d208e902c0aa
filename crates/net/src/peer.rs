//! A connection from this member to another: OP_MSG commands over TCP, each with a timeout.
//! Members talk to members with the same commands drivers use (hello-free: a member knows
//! its peers are shoal), so every exchange is visible to tools and tests.
//!
//! After any error the connection is unusable (a reply may be in flight) and the caller
//! opens a new one.

use bson::{Document, RawDocument, RawDocumentBuf};
use common::{Code, Error, Result};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest reply a member accepts (the wire's message limit).
const REPLY_BYTES_MAX: usize = common::limits::MESSAGE_SIZE_MAX_BYTES;

/// The connection to another member: TLS when members must use it (`tls::member_client`).
type PeerStream = crate::tls::MaybeTls<tokio_rustls::client::TlsStream<TcpStream>>;

/// The TCP connection under a member connection, TLS or not.
fn tcp_of(s: &PeerStream) -> &TcpStream {
    match s {
        PeerStream::Plain(s) => s,
        PeerStream::Tls(s) => s.get_ref().0,
    }
}

pub struct PeerConn {
    stream: PeerStream,
    pub host: String,
    next_id: i32,
    broken: bool,
    /// The frame being read, kept between frames: an oplog batch is megabytes, and a fresh
    /// buffer for each was memory the kernel zeroed again every time.
    frame: Vec<u8>,
}

impl PeerConn {
    pub async fn connect(host: &str, timeout: Duration) -> Result<PeerConn> {
        crate::fault::before_connect(host).await?;
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(host)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Error::new(Code::HostUnreachable, format!("cannot connect to {host}: {e}"))),
            Err(_) => return Err(Error::new(Code::NetworkTimeout, format!("timed out connecting to {host}"))),
        };
        let _ = stream.set_nodelay(true);
        let stream = match crate::tls::member_client() {
            None => PeerStream::Plain(stream),
            Some(tls) => {
                // The host as the member's certificate names it: its address or DNS name.
                let name = host.rsplit_once(':').map_or(host, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(name.to_string())
                    .map_err(|e| Error::new(Code::HostUnreachable, format!("bad host name {host}: {e}")))?;
                match tokio::time::timeout(timeout, tls.connect(name, stream)).await {
                    Ok(Ok(s)) => PeerStream::Tls(Box::new(s)),
                    Ok(Err(e)) => return Err(Error::new(Code::HostUnreachable, format!("TLS handshake with {host} failed: {e}"))),
                    Err(_) => return Err(Error::new(Code::NetworkTimeout, format!("timed out in the TLS handshake with {host}"))),
                }
            }
        };
        let mut conn = PeerConn { stream, host: host.to_string(), next_id: 1, broken: false, frame: Vec::new() };
        // As mongod's internal connections: the other side knows a member or a router, which
        // a test's failCommand spares.
        let max_wire = common::server::MAX_WIRE_VERSION;
        conn.command("admin", bson::doc! {"hello": 1, "internalClient": {"minWireVersion": max_wire, "maxWireVersion": max_wire}}, timeout).await?;
        if let Some(key) = crate::key_file::internal_key() {
            conn.authenticate(key.key(), timeout).await?;
        }
        Ok(conn)
    }

    /// Log in as the internal user with the keyFile's key (SCRAM-SHA-256), checking that
    /// the other member knows the key too.
    async fn authenticate(&mut self, key: &str, timeout: Duration) -> Result<()> {
        use crate::scram::{ClientConversation, Mechanism};
        use bson::{doc, spec::BinarySubtype, Binary};
        let host = self.host.clone();
        let failed = |why: String| Error::new(Code::AuthenticationFailed, format!("internal authentication to {host} failed: {why}"));
        let bin = |bytes: Vec<u8>| Binary { subtype: BinarySubtype::Generic, bytes };
        let (mut client, first) = ClientConversation::start(Mechanism::Sha256, crate::key_file::INTERNAL_USER, key);
        let reply = self
            .command(
                crate::key_file::INTERNAL_USER_DB,
                doc! {"saslStart": 1, "mechanism": Mechanism::Sha256.name(), "payload": bin(first), "options": {"skipEmptyExchange": true}},
                timeout,
            )
            .await?;
        let server_first = reply.get_binary_generic("payload").map_err(|_| failed("no payload in the saslStart reply".into()))?;
        let proof = client.respond(server_first).map_err(failed)?;
        let reply = self.command(crate::key_file::INTERNAL_USER_DB, doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(proof)}, timeout).await?;
        let server_final = reply.get_binary_generic("payload").map_err(|_| failed("no payload in the saslContinue reply".into()))?;
        client.verify(server_final).map_err(failed)?;
        if !reply.get_bool("done").unwrap_or(false) {
            return Err(failed("the conversation did not end".into()));
        }
        Ok(())
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Whether the other side closed the connection (it sends nothing meanwhile: a stream
    /// whose batches come through shared memory). Does not wait or consume anything.
    pub fn peer_closed(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut b = [0u8; 1];
        // SAFETY: peeks at most one byte into a live buffer, without blocking.
        let n = unsafe { libc::recv(tcp_of(&self.stream).as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        n == 0 || (n < 0 && !matches!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN | libc::EINTR)))
    }

    /// Run `body` on database `db` and return the reply; a reply with ok:0 is an `Err` with
    /// the reply's code, and any network error or timeout breaks the connection.
    pub async fn command(&mut self, db: &str, body: Document, timeout: Duration) -> Result<Document> {
        let raw = self.command_raw(db, body, timeout).await?;
        Document::try_from(raw.as_ref()).map_err(|e| Error::new(Code::InvalidBSON, format!("invalid BSON in a reply from {}: {e}", self.host)))
    }

    /// `command`, with the reply left as BSON (its structure checked, not decoded): the oplog
    /// fetcher writes the entries of a batch into its own oplog as they came.
    pub async fn command_raw(&mut self, db: &str, body: Document, timeout: Duration) -> Result<RawDocumentBuf> {
        let request = self.send(db, body, timeout).await?;
        self.recv_raw(request, timeout).await
    }

    /// Run `body` on `db`, its `sequence` (if any) sent as an OP_MSG document sequence, and
    /// return the reply whatever its `ok`: the router passes shards' errors on with every
    /// field they carry. Only network errors and timeouts are `Err` (and break the
    /// connection).
    pub async fn command_reply_raw(&mut self, db: &str, body: Document, sequence: Option<&wire::RawSequence<'_>>, timeout: Duration) -> Result<RawDocumentBuf> {
        let id = self.send_message(db, body, 0, sequence, timeout).await?;
        let r = match tokio::time::timeout(timeout, self.read_reply(id)).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(Code::NetworkTimeout, format!("no reply from {} within {} ms", self.host, timeout.as_millis()))),
        };
        self.break_on_network_error(r)
    }

    /// Send a command without waiting for its reply, which `recv_raw` reads: the oplog
    /// fetcher applies a batch while its getMore for the next is out. Returns the request id.
    pub async fn send(&mut self, db: &str, body: Document, timeout: Duration) -> Result<i32> {
        self.send_flags(db, body, 0, timeout).await
    }

    /// `send` with OP_MSG `flags`: `EXHAUST_ALLOWED` opens a push stream of replies,
    /// `MORE_TO_COME` sends a message that gets no reply (a push stream's acknowledgement).
    pub async fn send_flags(&mut self, db: &str, body: Document, flags: u32, timeout: Duration) -> Result<i32> {
        self.send_message(db, body, flags, None, timeout).await
    }

    /// Send `body` on `db` with `flags`, and `sequence` beside it (then with no flags).
    async fn send_message(&mut self, db: &str, mut body: Document, flags: u32, sequence: Option<&wire::RawSequence<'_>>, timeout: Duration) -> Result<i32> {
        if self.broken {
            return Err(Error::new(Code::HostUnreachable, format!("connection to {} was broken by an earlier error", self.host)));
        }
        body.insert("$db", db);
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let frame = match sequence {
            None => wire::try_encode_msg(id, 0, &wire::OpMsg { flags, body, sequences: Vec::new() }, None)?,
            Some(seq) => wire::try_encode_msg_raw_sequence(id, &body, seq)?,
        };
        let r = match tokio::time::timeout(timeout, self.write_frame(&frame)).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(Code::NetworkTimeout, format!("could not send to {} within {} ms", self.host, timeout.as_millis()))),
        };
        self.break_on_network_error(r).map(|()| id)
    }

    /// The reply to `request`; a reply with ok:0 is an `Err` with the reply's code.
    pub async fn recv_raw(&mut self, request: i32, timeout: Duration) -> Result<RawDocumentBuf> {
        let r = match tokio::time::timeout(timeout, self.read_reply(request)).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(Code::NetworkTimeout, format!("no reply from {} within {} ms", self.host, timeout.as_millis()))),
        };
        let reply = self.break_on_network_error(r)?;
        if is_ok(&reply) {
            return Ok(reply);
        }
        Err(remote_error(&self.host, &reply))
    }

    /// The next reply of a push stream, which answers `response_to` (the request that opened
    /// the stream, then each reply the one before): its id, whether more follow, and its
    /// body; a reply with ok:0 is an `Err` and ends the stream.
    /// `f` reads the body, borrowed from the connection's buffer (only what it keeps is
    /// copied).
    pub async fn recv_streamed<T>(&mut self, response_to: i32, timeout: Duration, f: impl FnOnce(&RawDocument) -> Result<T>) -> Result<(i32, bool, T)> {
        let r = match tokio::time::timeout(timeout, self.read_frame_bytes()).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(Code::NetworkTimeout, format!("nothing from {} within {} ms", self.host, timeout.as_millis()))),
        };
        let len = self.break_on_network_error(r)?;
        let r = parse_streamed(&self.frame[..len], &self.host, response_to, f);
        // The stream ended (no more to come) or went wrong: the caller starts over with a new
        // connection.
        if !matches!(r, Ok((_, true, _))) {
            self.broken = true;
        }
        r
    }

    /// After a network error or a timeout a reply may be in flight: the connection is done.
    fn break_on_network_error<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.as_ref().is_err_and(|e| e.code == Code::HostUnreachable.0 || e.code == Code::NetworkTimeout.0 || e.code == Code::ProtocolError.0) {
            self.broken = true;
        }
        r
    }

    async fn write_frame(&mut self, frame: &[u8]) -> Result<()> {
        crate::fault::before_send(&self.host).await?;
        let io = |e: std::io::Error| Error::new(Code::HostUnreachable, format!("connection to {} failed: {e}", self.host));
        self.stream.write_all(frame).await.map_err(io)
    }

    async fn read_reply(&mut self, request: i32) -> Result<RawDocumentBuf> {
        let (header, _, body) = self.read_frame().await?;
        if header.response_to != request {
            return Err(Error::new(Code::ProtocolError, format!("unexpected reply from {}", self.host)));
        }
        Ok(body)
    }

    async fn read_frame(&mut self) -> Result<(wire::Header, u32, RawDocumentBuf)> {
        let len = self.read_frame_bytes().await?;
        wire::decode_raw_msg(&self.frame[..len], REPLY_BYTES_MAX)
    }

    /// Read the next frame into `frame`; returns its length.
    async fn read_frame_bytes(&mut self) -> Result<usize> {
        let io = |e: std::io::Error| Error::new(Code::HostUnreachable, format!("connection to {} failed: {e}", self.host));
        let mut prefix = [0u8; 4];
        self.stream.read_exact(&mut prefix).await.map_err(io)?;
        let len = wire::frame_length(prefix, REPLY_BYTES_MAX)?;
        if self.frame.len() < len {
            self.frame.resize(len, 0);
        }
        self.frame[..4].copy_from_slice(&prefix);
        self.stream.read_exact(&mut self.frame[4..len]).await.map_err(io)?;
        crate::fault::after_receive(&self.host).await?;
        Ok(len)
    }
}

/// A push stream's frame (from the socket or a shared-memory ring): it must answer
/// `response_to` and be ok; `f` reads the body. Returns the frame's id and whether more follow.
pub fn parse_streamed<T>(frame: &[u8], host: &str, response_to: i32, f: impl FnOnce(&RawDocument) -> Result<T>) -> Result<(i32, bool, T)> {
    wire::with_raw_msg(frame, REPLY_BYTES_MAX, |header, flags, reply| {
        if header.response_to != response_to {
            return Err(Error::new(Code::ProtocolError, format!("out-of-order reply in the stream from {host}")));
        }
        if !is_ok(reply) {
            return Err(remote_error(host, reply));
        }
        Ok((header.request_id, flags & wire::flags::MORE_TO_COME != 0, f(reply)?))
    })
}

fn remote_error(host: &str, reply: &RawDocument) -> Error {
    let code = reply.get_i32("code").ok().unwrap_or(Code::UnknownError.0);
    let name = reply.get_str("codeName").ok().unwrap_or("UnknownError");
    let msg = reply.get_str("errmsg").ok().unwrap_or("");
    Error::remote(code, name, format!("{host} replied: {msg}"))
}

/// A cursor reply's id and its `key` batch ("firstBatch" or "nextBatch").
pub fn cursor_batch(reply: &Document, key: &str) -> Result<(i64, Vec<Document>)> {
    let bad = || Error::new(Code::ProtocolError, "malformed cursor reply");
    let c = reply.get_document("cursor").map_err(|_| bad())?;
    let id = c.get_i64("id").map_err(|_| bad())?;
    let docs = c.get_array(key).map_err(|_| bad())?.iter().filter_map(|d| if let bson::Bson::Document(d) = d { Some(d.clone()) } else { None }).collect();
    Ok((id, docs))
}

/// `cursor_batch` of a raw reply: the batch's documents as BSON.
pub fn cursor_batch_raw(reply: &RawDocument, key: &str) -> Result<(i64, Vec<RawDocumentBuf>)> {
    let bad = || Error::new(Code::ProtocolError, "malformed cursor reply");
    let c = reply.get_document("cursor").ok().ok_or_else(bad)?;
    let id = c.get_i64("id").ok().ok_or_else(bad)?;
    let mut docs = Vec::new();
    for v in c.get_array(key).ok().ok_or_else(bad)? {
        if let Some(d) = v.map_err(|_| bad())?.as_document() {
            docs.push(d.to_owned());
        }
    }
    Ok((id, docs))
}

pub fn is_ok(reply: &RawDocument) -> bool {
    use bson::RawBsonRef;
    matches!(reply.get("ok"), Ok(Some(RawBsonRef::Double(v))) if v == 1.0)
        || matches!(reply.get("ok"), Ok(Some(RawBsonRef::Int32(1) | RawBsonRef::Int64(1) | RawBsonRef::Boolean(true))))
}
