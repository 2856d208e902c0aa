//! Hand-built MongoDB wire frames, so tests can send what no driver would.
#![allow(dead_code)]

use mongodb::bson::Document;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub const OP_REPLY: i32 = 1;
pub const OP_QUERY: i32 = 2004;
pub const OP_COMPRESSED: i32 = 2012;
pub const OP_MSG: i32 = 2013;
pub const HEADER_SIZE_BYTES: usize = 16;
pub const FLAG_CHECKSUM_PRESENT: u32 = 1;
pub const FLAG_MORE_TO_COME: u32 = 1 << 1;
pub const FLAG_EXHAUST_ALLOWED: u32 = 1 << 16;
/// Largest reply a test will accept; the server's own cap is 48 MB.
pub const REPLY_SIZE_BYTES_MAX: usize = 64 * 1024 * 1024;
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

pub fn bson_bytes(d: &Document) -> Vec<u8> {
    d.to_vec().expect("serialize document")
}

/// Wraps a body in a standard 16-byte header.
pub fn frame(request_id: i32, response_to: i32, op_code: i32, body: &[u8]) -> Vec<u8> {
    let len = (HEADER_SIZE_BYTES + body.len()) as i32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&response_to.to_le_bytes());
    out.extend_from_slice(&op_code.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// OP_MSG body bytes: flags, a kind-0 section, optional kind-1 document sequences.
pub fn op_msg_body(flags: u32, body: &Document, sequences: &[(&str, Vec<Document>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&flags.to_le_bytes());
    out.push(0);
    out.extend_from_slice(&bson_bytes(body));
    for (id, docs) in sequences {
        out.push(1);
        let mut payload = Vec::new();
        payload.extend_from_slice(id.as_bytes());
        payload.push(0);
        for d in docs {
            payload.extend_from_slice(&bson_bytes(d));
        }
        out.extend_from_slice(&((payload.len() + 4) as i32).to_le_bytes());
        out.extend_from_slice(&payload);
    }
    out
}

pub fn op_msg(request_id: i32, flags: u32, body: &Document) -> Vec<u8> {
    frame(request_id, 0, OP_MSG, &op_msg_body(flags, body, &[]))
}

/// OP_MSG with checksumPresent and a CRC-32C over the whole message; `corrupt` flips the checksum.
pub fn op_msg_with_checksum(request_id: i32, body: &Document, corrupt: bool) -> Vec<u8> {
    let mut inner = op_msg_body(FLAG_CHECKSUM_PRESENT, body, &[]);
    inner.extend_from_slice(&[0, 0, 0, 0]);
    let mut msg = frame(request_id, 0, OP_MSG, &inner);
    let n = msg.len();
    let mut crc = crc32c::crc32c(&msg[..n - 4]);
    if corrupt {
        crc ^= 0xdead_beef;
    }
    msg[n - 4..].copy_from_slice(&crc.to_le_bytes());
    msg
}

/// Legacy OP_QUERY (still used by old drivers for the first isMaster).
pub fn op_query(request_id: i32, full_collection_name: &str, query: &Document) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&0_i32.to_le_bytes()); // flags
    body.extend_from_slice(full_collection_name.as_bytes());
    body.push(0);
    body.extend_from_slice(&0_i32.to_le_bytes()); // numberToSkip
    body.extend_from_slice(&(-1_i32).to_le_bytes()); // numberToReturn
    body.extend_from_slice(&bson_bytes(query));
    frame(request_id, 0, OP_QUERY, &body)
}

pub const COMPRESSOR_SNAPPY: u8 = 1;
pub const COMPRESSOR_ZLIB: u8 = 2;
pub const COMPRESSOR_ZSTD: u8 = 3;

pub fn compress(compressor_id: u8, data: &[u8]) -> Vec<u8> {
    match compressor_id {
        COMPRESSOR_SNAPPY => snap::raw::Encoder::new().compress_vec(data).expect("snappy"),
        COMPRESSOR_ZLIB => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).expect("zlib");
            e.finish().expect("zlib finish")
        }
        COMPRESSOR_ZSTD => zstd::bulk::compress(data, 0).expect("zstd"),
        other => panic!("unknown compressor {other}"),
    }
}

pub fn decompress(compressor_id: u8, data: &[u8], size_bytes: usize) -> Vec<u8> {
    match compressor_id {
        0 => data.to_vec(),
        COMPRESSOR_SNAPPY => snap::raw::Decoder::new().decompress_vec(data).expect("snappy decode"),
        COMPRESSOR_ZLIB => {
            let mut out = Vec::new();
            flate2::read::ZlibDecoder::new(data).read_to_end(&mut out).expect("zlib decode");
            out
        }
        COMPRESSOR_ZSTD => zstd::bulk::decompress(data, size_bytes).expect("zstd decode"),
        other => panic!("reply uses unknown compressor id {other}"),
    }
}

/// Wraps an already framed message in OP_COMPRESSED.
pub fn op_compressed(request_id: i32, compressor_id: u8, framed: &[u8]) -> Vec<u8> {
    let original_op = i32::from_le_bytes([framed[12], framed[13], framed[14], framed[15]]);
    let payload = &framed[HEADER_SIZE_BYTES..];
    let mut body = Vec::new();
    body.extend_from_slice(&original_op.to_le_bytes());
    body.extend_from_slice(&(payload.len() as i32).to_le_bytes());
    body.push(compressor_id);
    body.extend_from_slice(&compress(compressor_id, payload));
    frame(request_id, 0, OP_COMPRESSED, &body)
}

#[derive(Debug)]
pub struct Reply {
    pub request_id: i32,
    pub response_to: i32,
    /// The op code after undoing OP_COMPRESSED.
    pub op_code: i32,
    /// Compressor id the reply came with (None when not compressed).
    pub compressor_id: Option<u8>,
    pub flags: u32,
    pub doc: Document,
}

pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Parses one reply from raw bytes (header included).
pub fn parse_reply(header: &[u8; 16], rest: &[u8]) -> Result<Reply, String> {
    let request_id = i32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let response_to = i32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    let mut op_code = i32::from_le_bytes([header[12], header[13], header[14], header[15]]);
    let mut compressor_id = None;
    let owned;
    let mut body: &[u8] = rest;
    if op_code == OP_COMPRESSED {
        if body.len() < 9 {
            return Err("short OP_COMPRESSED".into());
        }
        op_code = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
        let size = i32::from_le_bytes([body[4], body[5], body[6], body[7]]) as usize;
        let id = body[8];
        compressor_id = Some(id);
        owned = decompress(id, &body[9..], size);
        if owned.len() != size {
            return Err(format!("uncompressedSize {size} but got {}", owned.len()));
        }
        body = &owned;
    }
    match op_code {
        OP_MSG => {
            if body.len() < 5 || body[4] != 0 {
                return Err(format!("OP_MSG reply without a kind-0 section first: {body:?}"));
            }
            let flags = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
            let doc = Document::from_reader(&body[5..]).map_err(|e| format!("reply BSON: {e}"))?;
            Ok(Reply { request_id, response_to, op_code, compressor_id, flags, doc })
        }
        OP_REPLY => {
            if body.len() < 20 {
                return Err("short OP_REPLY".into());
            }
            let flags = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
            let returned = i32::from_le_bytes([body[16], body[17], body[18], body[19]]);
            if returned != 1 {
                return Err(format!("OP_REPLY numberReturned {returned}"));
            }
            let doc = Document::from_reader(&body[20..]).map_err(|e| format!("reply BSON: {e}"))?;
            Ok(Reply { request_id, response_to, op_code, compressor_id, flags, doc })
        }
        other => Err(format!("unexpected reply op code {other}")),
    }
}

/// Reads one reply. Err means closed, timed out, or unparseable.
pub fn read_reply(s: &mut TcpStream) -> Result<Reply, String> {
    let mut header = [0u8; 16];
    s.read_exact(&mut header).map_err(|e| format!("read header: {e}"))?;
    let len = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if len < HEADER_SIZE_BYTES as i32 || len as usize > REPLY_SIZE_BYTES_MAX {
        return Err(format!("reply length {len}"));
    }
    let mut rest = vec![0u8; len as usize - HEADER_SIZE_BYTES];
    s.read_exact(&mut rest).map_err(|e| format!("read body: {e}"))?;
    parse_reply(&header, &rest)
}

/// Sends a command and reads its reply, checking responseTo.
pub fn command(s: &mut TcpStream, request_id: i32, body: &Document) -> Reply {
    s.write_all(&op_msg(request_id, 0, body)).expect("write");
    let r = read_reply(s).unwrap_or_else(|e| panic!("no reply to {body:?}: {e}"));
    assert_eq!(r.response_to, request_id, "responseTo must echo the requestID");
    r
}

/// True when the server closed the connection (EOF or reset) before `READ_TIMEOUT`.
/// Any bytes it sends first (an error reply, an HTTP notice) are skipped.
pub fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    let mut bytes_total = 0usize;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                bytes_total += n;
                if bytes_total > REPLY_SIZE_BYTES_MAX {
                    return false;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

pub const OP_UPDATE: i32 = 2001;
pub const OP_INSERT: i32 = 2002;
pub const OP_GET_MORE: i32 = 2005;
pub const OP_DELETE: i32 = 2006;
pub const OP_KILL_CURSORS: i32 = 2007;

fn cstring(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// A legacy find: OP_QUERY on a collection, with numberToSkip and numberToReturn.
pub fn op_query_find(request_id: i32, ns: &str, query: &Document, skip: i32, to_return: i32) -> Vec<u8> {
    let mut body = 0_i32.to_le_bytes().to_vec();
    cstring(&mut body, ns);
    body.extend_from_slice(&skip.to_le_bytes());
    body.extend_from_slice(&to_return.to_le_bytes());
    body.extend_from_slice(&bson_bytes(query));
    frame(request_id, 0, OP_QUERY, &body)
}

pub fn op_insert(request_id: i32, ns: &str, flags: u32, docs: &[Document]) -> Vec<u8> {
    let mut body = flags.to_le_bytes().to_vec();
    cstring(&mut body, ns);
    for d in docs {
        body.extend_from_slice(&bson_bytes(d));
    }
    frame(request_id, 0, OP_INSERT, &body)
}

pub fn op_update(request_id: i32, ns: &str, flags: u32, selector: &Document, update: &Document) -> Vec<u8> {
    let mut body = 0_i32.to_le_bytes().to_vec();
    cstring(&mut body, ns);
    body.extend_from_slice(&flags.to_le_bytes());
    body.extend_from_slice(&bson_bytes(selector));
    body.extend_from_slice(&bson_bytes(update));
    frame(request_id, 0, OP_UPDATE, &body)
}

pub fn op_delete(request_id: i32, ns: &str, flags: u32, selector: &Document) -> Vec<u8> {
    let mut body = 0_i32.to_le_bytes().to_vec();
    cstring(&mut body, ns);
    body.extend_from_slice(&flags.to_le_bytes());
    body.extend_from_slice(&bson_bytes(selector));
    frame(request_id, 0, OP_DELETE, &body)
}

pub fn op_get_more(request_id: i32, ns: &str, to_return: i32, cursor_id: i64) -> Vec<u8> {
    let mut body = 0_i32.to_le_bytes().to_vec();
    cstring(&mut body, ns);
    body.extend_from_slice(&to_return.to_le_bytes());
    body.extend_from_slice(&cursor_id.to_le_bytes());
    frame(request_id, 0, OP_GET_MORE, &body)
}

pub fn op_kill_cursors(request_id: i32, ids: &[i64]) -> Vec<u8> {
    let mut body = 0_i32.to_le_bytes().to_vec();
    body.extend_from_slice(&(ids.len() as i32).to_le_bytes());
    for id in ids {
        body.extend_from_slice(&id.to_le_bytes());
    }
    frame(request_id, 0, OP_KILL_CURSORS, &body)
}

/// An OP_REPLY with any number of documents.
pub struct OpReply {
    pub response_to: i32,
    pub flags: u32,
    pub cursor_id: i64,
    pub starting_from: i32,
    pub docs: Vec<Document>,
}

pub fn read_op_reply(s: &mut TcpStream) -> OpReply {
    let mut header = [0u8; 16];
    s.read_exact(&mut header).expect("read header");
    let len = i32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    assert!((HEADER_SIZE_BYTES + 20..=REPLY_SIZE_BYTES_MAX).contains(&len), "reply length {len}");
    let op_code = i32::from_le_bytes([header[12], header[13], header[14], header[15]]);
    assert_eq!(op_code, OP_REPLY, "a legacy request is answered with OP_REPLY");
    let mut body = vec![0u8; len - HEADER_SIZE_BYTES];
    s.read_exact(&mut body).expect("read body");
    let flags = u32::from_le_bytes(body[0..4].try_into().unwrap());
    let cursor_id = i64::from_le_bytes(body[4..12].try_into().unwrap());
    let starting_from = i32::from_le_bytes(body[12..16].try_into().unwrap());
    let returned = i32::from_le_bytes(body[16..20].try_into().unwrap()) as usize;
    let mut docs = Vec::new();
    let mut rest = &body[20..];
    while !rest.is_empty() {
        let n = i32::from_le_bytes(rest[0..4].try_into().unwrap()) as usize;
        docs.push(Document::from_reader(&rest[..n]).expect("reply BSON"));
        rest = &rest[n..];
    }
    assert_eq!(docs.len(), returned, "numberReturned");
    OpReply { response_to: i32::from_le_bytes([header[8], header[9], header[10], header[11]]), flags, cursor_id, starting_from, docs }
}
