//! MongoDB wire protocol: message framing and codecs (OP_MSG, OP_QUERY, OP_REPLY,
//! OP_COMPRESSED, and the legacy opcodes in `legacy`). No I/O and no command semantics: bytes in, messages out, and back.
//!
//! Error codes follow mongod 7.0 (`op_msg.cpp`, `message_compressor_manager.cpp`): generic
//! framing problems are ProtocolError, OP_MSG specific ones keep MongoDB's own codes.

mod bson_codec;
mod compression;
pub mod legacy;
mod request;

pub use bson_codec::{document_size_bytes, DOCUMENT_SIZE_MAX_BYTES};
pub use request::{is_hello, Request};

/// Append `doc` as BSON to `buf` (the encoder replies use; faster than the bson crate's).
pub fn encode_document_into(buf: &mut Vec<u8>, doc: &bson::Document) -> common::Result<()> {
    bson_codec::write_document(buf, doc)
}
pub use compression::{compress, decompress, is_compressible_command, Compressor, ZLIB_LEVEL, ZSTD_LEVEL};

use bson::Document;
use common::{limits, Code, Error, Result};

pub const OP_REPLY: i32 = 1;
pub const OP_QUERY: i32 = 2004;
pub const OP_COMPRESSED: i32 = 2012;
pub const OP_MSG: i32 = 2013;

pub const HEADER_SIZE_BYTES: usize = 16;
/// originalOpcode (4) + uncompressedSize (4) + compressorId (1).
pub const COMPRESSION_HEADER_SIZE_BYTES: usize = 9;
const CHECKSUM_SIZE_BYTES: usize = 4;
/// MongoDB 7.0 accepts at most two kind-1 sections per OP_MSG.
pub const DOCUMENT_SEQUENCES_MAX: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub message_length: i32,
    pub request_id: i32,
    pub response_to: i32,
    pub op_code: i32,
}

impl Header {
    /// Parse the first 16 bytes of `bytes` (no validation of the values).
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        let field = |i: usize| -> Result<i32> {
            bytes
                .get(i * 4..i * 4 + 4)
                .and_then(|b| b.try_into().ok())
                .map(i32::from_le_bytes)
                .ok_or_else(|| protocol(format!("message of {} bytes is shorter than its header", bytes.len())))
        };
        Ok(Header { message_length: field(0)?, request_id: field(1)?, response_to: field(2)?, op_code: field(3)? })
    }

    pub fn to_bytes(&self) -> [u8; HEADER_SIZE_BYTES] {
        let mut out = [0u8; HEADER_SIZE_BYTES];
        out[0..4].copy_from_slice(&self.message_length.to_le_bytes());
        out[4..8].copy_from_slice(&self.request_id.to_le_bytes());
        out[8..12].copy_from_slice(&self.response_to.to_le_bytes());
        out[12..16].copy_from_slice(&self.op_code.to_le_bytes());
        out
    }
}

pub mod flags {
    pub const CHECKSUM_PRESENT: u32 = 1;
    pub const MORE_TO_COME: u32 = 2;
    pub const EXHAUST_ALLOWED: u32 = 1 << 16;
    /// Low 16 bits are "required": a receiver must reject ones it does not know.
    pub const REQUIRED_MASK: u32 = 0xffff;
    pub const KNOWN_REQUIRED: u32 = CHECKSUM_PRESENT | MORE_TO_COME;
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpMsg {
    pub flags: u32,
    pub body: Document,
    pub sequences: Vec<DocumentSequence>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DocumentSequence {
    pub identifier: String,
    pub documents: Vec<Document>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpQuery {
    pub flags: u32,
    pub full_collection_name: String,
    pub number_to_skip: i32,
    pub number_to_return: i32,
    pub query: Document,
    pub return_fields_selector: Option<Document>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpReply {
    pub response_flags: u32,
    pub cursor_id: i64,
    pub starting_from: i32,
    pub documents: Vec<Document>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Msg(OpMsg),
    Query(OpQuery),
    Reply(OpReply),
    Insert(legacy::OpInsert),
    Update(legacy::OpUpdate),
    Delete(legacy::OpDelete),
    GetMore(legacy::OpGetMore),
    KillCursors(legacy::OpKillCursors),
}

/// A decoded frame. For OP_COMPRESSED input, `header` is the reconstructed header of the inner
/// message (its op code and uncompressed length; same request id and responseTo) and
/// `compressor` says which compressor the peer used, so the reply can use the same one.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub header: Header,
    pub message: Message,
    pub compressor: Option<Compressor>,
}

fn protocol(message: impl Into<String>) -> Error {
    Error::new(Code::ProtocolError, message)
}

/// Validate the 4-byte little-endian length prefix of a frame before allocating for it.
pub fn frame_length(prefix: [u8; 4], max_message_size_bytes: usize) -> Result<usize> {
    let length = i32::from_le_bytes(prefix);
    if length < HEADER_SIZE_BYTES as i32 || length as usize > max_message_size_bytes {
        return Err(protocol(format!("recv(): message msgLen {length} is invalid. Min {HEADER_SIZE_BYTES} Max: {max_message_size_bytes}")));
    }
    Ok(length as usize)
}

/// Decode one whole frame (header included). See the crate docs for the checks made.
pub fn decode(frame: &[u8], max_message_size_bytes: usize) -> Result<Decoded> {
    let (header, bytes, compressor) = uncompressed(frame, max_message_size_bytes)?;
    let message = decode_uncompressed(&header, &bytes)?;
    Ok(Decoded { header, message, compressor })
}

/// Decode an OP_MSG frame's body without building a `Document`: its structure is checked as
/// `decode` checks it, and its strings are checked for UTF-8 when read. A member fetching the
/// oplog reads its batches this way, since it writes the entries into its own oplog as they
/// came. Returns the header, the OP_MSG flags (a streamed reply has `flags::MORE_TO_COME`)
/// and the body. Document sequences (which replies do not use) are refused.
pub fn decode_raw_msg(frame: &[u8], max_message_size_bytes: usize) -> Result<(Header, u32, bson::RawDocumentBuf)> {
    with_raw_msg(frame, max_message_size_bytes, |header, flags, body| Ok((header, flags, body.to_owned())))
}

/// Run `f` on an OP_MSG's header, flags and body, the body borrowed from `frame` unless
/// the message was compressed: a reader that keeps only parts of a large reply copies
/// only those.
pub fn with_raw_msg<T>(frame: &[u8], max_message_size_bytes: usize, f: impl FnOnce(Header, u32, &bson::RawDocument) -> Result<T>) -> Result<T> {
    let (header, bytes, _) = uncompressed(frame, max_message_size_bytes)?;
    if header.op_code != OP_MSG {
        return Err(protocol(format!("expected an OP_MSG, got op code {}", header.op_code)));
    }
    let (flags, sections) = msg_sections(&bytes)?;
    let mut reader = Reader::new(sections);
    if reader.u8("section kind")? != 0 {
        return Err(protocol("expected an OP_MSG with only a body section"));
    }
    let len = bson_codec::read_raw_document(reader.rest())?;
    let body = reader.take(len, "body")?;
    if !reader.is_empty() {
        return Err(protocol("expected an OP_MSG with only a body section"));
    }
    let body = bson::RawDocument::from_bytes(body).map_err(|e| Error::new(Code::InvalidBSON, format!("Invalid BSON: {e}")))?;
    f(header, flags, body)
}

/// A document sequence whose documents are kept as BSON: a router reads a client's batch
/// this way and passes each document on to its shard as the bytes it came as.
#[derive(Clone, Debug)]
pub struct RawSequence<'a> {
    pub identifier: &'a str,
    /// Each a whole BSON document (its length checked, not its contents).
    pub documents: Vec<&'a [u8]>,
}

/// An uncompressed OP_MSG read without decoding its document sequences.
pub struct RawMsg<'a> {
    pub flags: u32,
    pub body: &'a bson::RawDocument,
    pub sequences: Vec<RawSequence<'a>>,
}

/// `frame` as a `RawMsg`, borrowing from it; `None` for another opcode or a compressed
/// message (the caller decodes those with `decode`). Flags, checksum, section kinds, the
/// sequences' sizes and each document's length are checked as `decode` checks them; the
/// documents' contents are not.
pub fn raw_msg(frame: &[u8], max_message_size_bytes: usize) -> Result<Option<RawMsg<'_>>> {
    let (header, bytes, _) = uncompressed(frame, max_message_size_bytes)?;
    if header.op_code != OP_MSG || matches!(bytes, std::borrow::Cow::Owned(_)) {
        return Ok(None);
    }
    let (flags, sections) = msg_sections(frame)?;
    let mut reader = Reader::new(sections);
    let mut body = None;
    let mut sequences: Vec<RawSequence> = Vec::new();
    while !reader.is_empty() {
        match reader.u8("section kind")? {
            0 if body.is_none() => {
                let len = bson_codec::read_raw_document(reader.rest())?;
                let bytes = reader.take(len, "body")?;
                body = Some(bson::RawDocument::from_bytes(bytes).map_err(|e| Error::new(Code::InvalidBSON, format!("Invalid BSON: {e}")))?);
            }
            0 => return Err(Error::location(40430, "Multiple body sections in message")),
            1 => {
                if sequences.len() >= DOCUMENT_SEQUENCES_MAX {
                    return Err(Error::new(Code::TooManyDocumentSequences, "Too many document sequences in OP_MSG"));
                }
                let size = reader.i32("document sequence size")?;
                let size = usize::try_from(size).ok().filter(|&s| s > 4).ok_or_else(|| protocol(format!("invalid document sequence size {size}")))?;
                let mut sequence = Reader::new(reader.take(size - 4, "document sequence")?);
                let identifier = sequence.cstr("document sequence identifier")?;
                if sequences.iter().any(|s| s.identifier == identifier) {
                    return Err(Error::location(40431, format!("Duplicate document sequence: {identifier}")));
                }
                let mut documents = Vec::new();
                while !sequence.is_empty() {
                    let len = bson_codec::read_raw_document(sequence.rest())?;
                    documents.push(sequence.take(len, "document")?);
                }
                sequences.push(RawSequence { identifier, documents });
            }
            2 => return Err(Error::new(Code::Unauthorized, "Unsupported Security Token provided")),
            kind => return Err(Error::location(40432, format!("Unknown section kind {kind}"))),
        }
    }
    let body = body.ok_or_else(|| Error::location(40587, "OP_MSG messages must have a body"))?;
    Ok(Some(RawMsg { flags, body, sequences }))
}

/// Encode an OP_MSG of `body` and the raw document sequence `sequence` (no checksum, no
/// compression).
pub fn try_encode_msg_raw_sequence(request_id: i32, body: &Document, sequence: &RawSequence) -> Result<Vec<u8>> {
    if sequence.identifier.as_bytes().contains(&0) {
        return Err(Error::new(Code::InvalidBSON, "document sequence identifier contains a NUL byte"));
    }
    let docs_bytes: usize = sequence.documents.iter().map(|d| d.len()).sum();
    let mut buf = frame_start(request_id, 0, OP_MSG, 4 + 1 + document_size_bytes(body) + 1 + 4 + sequence.identifier.len() + 1 + docs_bytes);
    buf.extend_from_slice(&0u32.to_le_bytes());
    buf.push(0);
    bson_codec::write_document(&mut buf, body)?;
    buf.push(1);
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(sequence.identifier.as_bytes());
    buf.push(0);
    for d in &sequence.documents {
        buf.extend_from_slice(d);
    }
    bson_codec::patch_length(&mut buf, start)?;
    frame_finish(&mut buf)?;
    Ok(buf)
}

/// The frame with OP_COMPRESSED undone (the inner message behind a reconstructed header),
/// and the compressor that was used.
fn uncompressed(frame: &[u8], max_message_size_bytes: usize) -> Result<(Header, std::borrow::Cow<'_, [u8]>, Option<Compressor>)> {
    let header = Header::parse(frame)?;
    let prefix = [frame[0], frame[1], frame[2], frame[3]];
    let length = frame_length(prefix, max_message_size_bytes)?;
    if length != frame.len() {
        return Err(protocol(format!("message length {length} in header does not match the {} bytes of the frame", frame.len())));
    }
    if header.op_code != OP_COMPRESSED {
        return Ok((header, std::borrow::Cow::Borrowed(frame), None));
    }

    let body = &frame[HEADER_SIZE_BYTES..];
    if body.len() < COMPRESSION_HEADER_SIZE_BYTES {
        return Err(Error::new(Code::BadValue, "Invalid compressed message header"));
    }
    let original_op_code = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
    let uncompressed_size = i32::from_le_bytes([body[4], body[5], body[6], body[7]]);
    let compressor =
        Compressor::from_id(body[8]).ok_or_else(|| Error::new(Code::InternalError, "Compression algorithm specified in message is not available"))?;
    // Bound the output before decompressing anything (decompression bombs).
    let total = usize::try_from(uncompressed_size)
        .ok()
        .and_then(|n| n.checked_add(HEADER_SIZE_BYTES))
        .filter(|&n| n <= max_message_size_bytes)
        .ok_or_else(|| Error::new(Code::BadValue, "Decompressed message would be larger than maximum message size"))?;
    if !matches!(
        original_op_code,
        OP_MSG | OP_QUERY | OP_REPLY | legacy::OP_INSERT | legacy::OP_UPDATE | legacy::OP_DELETE | legacy::OP_GET_MORE | legacy::OP_KILL_CURSORS
    ) {
        return Err(unsupported_op_code(original_op_code));
    }
    let inner = Header { message_length: total as i32, request_id: header.request_id, response_to: header.response_to, op_code: original_op_code };
    let mut buffer = vec![0u8; total];
    buffer[..HEADER_SIZE_BYTES].copy_from_slice(&inner.to_bytes());
    compression::decompress_into(compressor, &body[COMPRESSION_HEADER_SIZE_BYTES..], &mut buffer[HEADER_SIZE_BYTES..])?;
    Ok((inner, std::borrow::Cow::Owned(buffer), Some(compressor)))
}

fn unsupported_op_code(op_code: i32) -> Error {
    if op_code == OP_COMPRESSED {
        return protocol(format!("Unsupported network op {op_code} (nested OP_COMPRESSED)"));
    }
    protocol(format!("Unsupported network op {op_code}"))
}

/// `frame` is the whole uncompressed message, header included.
fn decode_uncompressed(header: &Header, frame: &[u8]) -> Result<Message> {
    match header.op_code {
        OP_MSG => decode_msg(frame).map(Message::Msg),
        OP_QUERY => decode_query(&frame[HEADER_SIZE_BYTES..]).map(Message::Query),
        OP_REPLY => decode_reply(&frame[HEADER_SIZE_BYTES..]).map(Message::Reply),
        legacy::OP_INSERT => legacy::decode_insert(&frame[HEADER_SIZE_BYTES..]).map(Message::Insert),
        legacy::OP_UPDATE => legacy::decode_update(&frame[HEADER_SIZE_BYTES..]).map(Message::Update),
        legacy::OP_DELETE => legacy::decode_delete(&frame[HEADER_SIZE_BYTES..]).map(Message::Delete),
        legacy::OP_GET_MORE => legacy::decode_get_more(&frame[HEADER_SIZE_BYTES..]).map(Message::GetMore),
        legacy::OP_KILL_CURSORS => legacy::decode_kill_cursors(&frame[HEADER_SIZE_BYTES..]).map(Message::KillCursors),
        other => Err(unsupported_op_code(other)),
    }
}

/// Bounds-checked cursor over a message body.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }
    fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }
    fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.pos..).unwrap_or(&[])
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let out = self
            .pos
            .checked_add(n)
            .and_then(|end| self.bytes.get(self.pos..end))
            .ok_or_else(|| protocol(format!("message is truncated: not enough bytes for {what}")))?;
        self.pos += n;
        Ok(out)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn i32(&mut self, what: &str) -> Result<i32> {
        let b = self.take(4, what)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(self.i32(what)? as u32)
    }
    fn i64(&mut self, what: &str) -> Result<i64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }
    fn cstr(&mut self, what: &str) -> Result<&'a str> {
        let rest = self.rest();
        let nul = rest.iter().position(|&b| b == 0).ok_or_else(|| protocol(format!("{what} is not NUL terminated")))?;
        let s = std::str::from_utf8(&rest[..nul]).map_err(|_| Error::new(Code::InvalidBSON, format!("{what} is not valid UTF-8")))?;
        self.pos += nul + 1;
        Ok(s)
    }
    fn document(&mut self) -> Result<Document> {
        let (doc, len) = bson_codec::read_document(self.rest())?;
        self.pos += len;
        Ok(doc)
    }
}

/// An OP_MSG's flags and its sections (after the flags, before the checksum), with the
/// flags and the checksum checked.
fn msg_sections(frame: &[u8]) -> Result<(u32, &[u8])> {
    let mut reader = Reader::new(&frame[HEADER_SIZE_BYTES..]);
    let flag_bits = reader.u32("OP_MSG flags")?;
    if flag_bits & flags::REQUIRED_MASK & !flags::KNOWN_REQUIRED != 0 {
        return Err(Error::new(Code::IllegalOpMsgFlag, format!("Message contains illegal flags value: Ob{flag_bits:032b}")));
    }
    let mut sections_end = frame.len();
    if flag_bits & flags::CHECKSUM_PRESENT != 0 {
        if frame.len() <= HEADER_SIZE_BYTES + 4 + CHECKSUM_SIZE_BYTES {
            return Err(Error::location(51251, "Invalid message size for an OpMsg containing a checksum"));
        }
        sections_end -= CHECKSUM_SIZE_BYTES;
        let stored = u32::from_le_bytes([frame[sections_end], frame[sections_end + 1], frame[sections_end + 2], frame[sections_end + 3]]);
        // Verified before parsing: a corrupt message should not be interpreted at all.
        if stored != crc32c::crc32c(&frame[..sections_end]) {
            return Err(Error::new(Code::ChecksumMismatch, "OP_MSG checksum does not match contents"));
        }
    }
    Ok((flag_bits, &frame[HEADER_SIZE_BYTES + 4..sections_end]))
}

fn decode_msg(frame: &[u8]) -> Result<OpMsg> {
    let (flag_bits, sections) = msg_sections(frame)?;
    let mut reader = Reader::new(sections);
    let mut body: Option<Document> = None;
    let mut sequences: Vec<DocumentSequence> = Vec::new();
    while !reader.is_empty() {
        match reader.u8("section kind")? {
            0 => {
                if body.is_some() {
                    return Err(Error::location(40430, "Multiple body sections in message"));
                }
                body = Some(reader.document()?);
            }
            1 => {
                if sequences.len() >= DOCUMENT_SEQUENCES_MAX {
                    return Err(Error::new(Code::TooManyDocumentSequences, "Too many document sequences in OP_MSG"));
                }
                let size = reader.i32("document sequence size")?;
                let size = usize::try_from(size).ok().filter(|&s| s > 4).ok_or_else(|| protocol(format!("invalid document sequence size {size}")))?;
                let mut sequence = Reader::new(reader.take(size - 4, "document sequence")?);
                let identifier = sequence.cstr("document sequence identifier")?;
                if sequences.iter().any(|s| s.identifier == identifier) {
                    return Err(Error::location(40431, format!("Duplicate document sequence: {identifier}")));
                }
                let mut documents = Vec::new();
                while !sequence.is_empty() {
                    documents.push(sequence.document()?);
                }
                sequences.push(DocumentSequence { identifier: identifier.to_string(), documents });
            }
            2 => return Err(Error::new(Code::Unauthorized, "Unsupported Security Token provided")),
            kind => return Err(Error::location(40432, format!("Unknown section kind {kind}"))),
        }
    }
    let body = body.ok_or_else(|| Error::location(40587, "OP_MSG messages must have a body"))?;
    for sequence in &sequences {
        if has_path(&body, &sequence.identifier) {
            return Err(Error::location(40433, format!("Duplicate field between body and document sequence {}", sequence.identifier)));
        }
    }
    Ok(OpMsg { flags: flag_bits, body, sequences })
}

/// Append the command an OP_MSG frame carries to `buf`, as one BSON document: the body's
/// fields, then each document sequence as an array named by its identifier, which is the
/// document a server runs (`decode`, then the sequences merged into the body). Meant for a
/// frame that `decode` accepted, kept as bytes to be read later (the audit log copies a
/// request's frame and builds its record on another thread). The frame's structure is
/// checked again, but not its checksum or what is inside the documents. On an error,
/// `buf` may hold part of the document.
pub fn msg_command_into(buf: &mut Vec<u8>, frame: &[u8]) -> Result<()> {
    let header = Header::parse(frame)?;
    if header.op_code != OP_MSG {
        return Err(protocol(format!("expected an OP_MSG, got op code {}", header.op_code)));
    }
    let mut reader = Reader::new(&frame[HEADER_SIZE_BYTES..]);
    let flag_bits = reader.u32("OP_MSG flags")?;
    let checksum = if flag_bits & flags::CHECKSUM_PRESENT != 0 { CHECKSUM_SIZE_BYTES } else { 0 };
    let sections = reader.rest();
    let sections = sections.get(..sections.len().checked_sub(checksum).ok_or_else(|| protocol("message is truncated"))?).unwrap_or_default();
    let mut reader = Reader::new(sections);
    let mut body: Option<&[u8]> = None;
    // (identifier, the documents one after another), in the frame's order.
    let mut sequences: [Option<(&[u8], &[u8])>; DOCUMENT_SEQUENCES_MAX] = [None; DOCUMENT_SEQUENCES_MAX];
    let mut sequence_count = 0;
    while !reader.is_empty() {
        match reader.u8("section kind")? {
            0 if body.is_none() => {
                let len = bson_codec::document_length(reader.rest())?;
                body = Some(reader.take(len, "body")?);
            }
            1 if sequence_count < DOCUMENT_SEQUENCES_MAX => {
                let size =
                    usize::try_from(reader.i32("document sequence size")?).ok().filter(|&s| s > 4).ok_or_else(|| protocol("invalid document sequence size"))?;
                let mut sequence = Reader::new(reader.take(size - 4, "document sequence")?);
                let identifier = sequence.cstr("document sequence identifier")?;
                sequences[sequence_count] = Some((identifier.as_bytes(), sequence.rest()));
                sequence_count += 1;
            }
            _ => return Err(protocol("not an OP_MSG that decode accepts")),
        }
    }
    let body = body.ok_or_else(|| Error::location(40587, "OP_MSG messages must have a body"))?;
    let start = buf.len();
    // The body without its terminating NUL; its length prefix is patched at the end.
    buf.extend_from_slice(&body[..body.len() - 1]);
    let mut digits = [0u8; 20];
    for (identifier, mut documents) in sequences.into_iter().flatten() {
        buf.push(bson::spec::ElementType::Array as u8);
        buf.extend_from_slice(identifier);
        buf.push(0);
        let array = buf.len();
        buf.extend_from_slice(&[0; 4]);
        let mut i = 0;
        while !documents.is_empty() {
            let len = bson_codec::document_length(documents)?;
            buf.push(bson::spec::ElementType::EmbeddedDocument as u8);
            buf.extend_from_slice(bson_codec::format_index(i, &mut digits));
            buf.push(0);
            buf.extend_from_slice(&documents[..len]);
            documents = &documents[len..];
            i += 1;
        }
        buf.push(0);
        bson_codec::patch_length(buf, array)?;
    }
    buf.push(0);
    bson_codec::patch_length(buf, start)
}

/// Whether the dotted `path` names a field of `doc` (through embedded documents and arrays).
fn has_path(doc: &Document, path: &str) -> bool {
    let (head, tail) = match path.split_once('.') {
        Some((h, t)) => (h, Some(t)),
        None => (path, None),
    };
    match (doc.get(head), tail) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(bson::Bson::Document(d)), Some(t)) => has_path(d, t),
        (Some(bson::Bson::Array(a)), Some(t)) => a.iter().any(|v| match v {
            bson::Bson::Document(d) => has_path(d, t),
            _ => false,
        }),
        (Some(_), Some(_)) => false,
    }
}

fn decode_query(body: &[u8]) -> Result<OpQuery> {
    let mut reader = Reader::new(body);
    let flags = reader.u32("OP_QUERY flags")?;
    let full_collection_name = reader.cstr("fullCollectionName")?.to_string();
    let number_to_skip = reader.i32("numberToSkip")?;
    let number_to_return = reader.i32("numberToReturn")?;
    let query = reader.document()?;
    let return_fields_selector = if reader.is_empty() { None } else { Some(reader.document()?) };
    if !reader.is_empty() {
        return Err(protocol("OP_QUERY has trailing bytes after returnFieldsSelector"));
    }
    Ok(OpQuery { flags, full_collection_name, number_to_skip, number_to_return, query, return_fields_selector })
}

fn decode_reply(body: &[u8]) -> Result<OpReply> {
    let mut reader = Reader::new(body);
    let response_flags = reader.u32("OP_REPLY responseFlags")?;
    let cursor_id = reader.i64("cursorID")?;
    let starting_from = reader.i32("startingFrom")?;
    let number_returned = reader.i32("numberReturned")?;
    let mut documents = Vec::new();
    while !reader.is_empty() {
        documents.push(reader.document()?);
    }
    if usize::try_from(number_returned).ok() != Some(documents.len()) {
        return Err(protocol(format!("OP_REPLY numberReturned is {number_returned} but it holds {} documents", documents.len())));
    }
    Ok(OpReply { response_flags, cursor_id, starting_from, documents })
}

// ---------------------------------------------------------------------------------------------
// Encoding.

/// Start a frame: header with placeholder length, capacity for `body_size_bytes` more.
fn frame_start(request_id: i32, response_to: i32, op_code: i32, body_size_bytes: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_SIZE_BYTES + body_size_bytes);
    buf.extend_from_slice(&Header { message_length: 0, request_id, response_to, op_code }.to_bytes());
    buf
}

fn frame_finish(buf: &mut [u8]) -> Result<()> {
    let len = i32::try_from(buf.len()).map_err(|_| protocol("message larger than 2GiB"))?;
    buf[0..4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Encode an OP_MSG; adds the CRC-32C when `msg.flags` has CHECKSUM_PRESENT. Fails only on
/// documents that cannot be BSON (a NUL in a field name, absurd nesting).
pub fn try_encode_msg(request_id: i32, response_to: i32, msg: &OpMsg, compressor: Option<Compressor>) -> Result<Vec<u8>> {
    try_encode_msg_with_batch(request_id, response_to, msg, None::<RawBatch<Vec<u8>>>, compressor)
}

/// A cursor batch already in BSON, for the empty array `cursor.<key>` of a reply body
/// (`key` is "firstBatch" or "nextBatch"). The documents' bytes go into the frame as they
/// are, so a batch can refer to buffers it shares with other replies.
pub struct RawBatch<'a, D: AsRef<[u8]>> {
    pub key: &'a str,
    pub docs: &'a [D],
}

/// `try_encode_msg`, with the body's cursor batch written from `batch` when given.
pub fn try_encode_msg_with_batch(
    request_id: i32,
    response_to: i32,
    msg: &OpMsg,
    batch: Option<RawBatch<impl AsRef<[u8]>>>,
    compressor: Option<Compressor>,
) -> Result<Vec<u8>> {
    let checksum = msg.flags & flags::CHECKSUM_PRESENT != 0;
    let batch_size = batch.as_ref().map_or(0, |b| bson_codec::raw_array_size_bytes(b.docs));
    let mut size = 4 + 1 + document_size_bytes(&msg.body) + batch_size + if checksum { CHECKSUM_SIZE_BYTES } else { 0 };
    for s in &msg.sequences {
        size += 1 + 4 + s.identifier.len() + 1 + s.documents.iter().map(document_size_bytes).sum::<usize>();
    }
    let mut buf = frame_start(request_id, response_to, OP_MSG, size);
    buf.extend_from_slice(&msg.flags.to_le_bytes());
    buf.push(0);
    match batch {
        Some(b) => bson_codec::write_cursor_reply(&mut buf, &msg.body, b.key, b.docs)?,
        None => bson_codec::write_document(&mut buf, &msg.body)?,
    }
    for s in &msg.sequences {
        if s.identifier.as_bytes().contains(&0) {
            return Err(Error::new(Code::InvalidBSON, "document sequence identifier contains a NUL byte"));
        }
        buf.push(1);
        let start = buf.len();
        buf.extend_from_slice(&[0; 4]);
        buf.extend_from_slice(s.identifier.as_bytes());
        buf.push(0);
        for d in &s.documents {
            bson_codec::write_document(&mut buf, d)?;
        }
        bson_codec::patch_length(&mut buf, start)?;
    }
    if checksum {
        let total = buf.len() + CHECKSUM_SIZE_BYTES;
        let len = i32::try_from(total).map_err(|_| protocol("message larger than 2GiB"))?;
        buf[0..4].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
    }
    frame_finish(&mut buf)?;
    Ok(maybe_compress(buf, compressor))
}

/// Encode an OP_REPLY (numberReturned is `reply.documents.len()`).
pub fn try_encode_reply(request_id: i32, response_to: i32, reply: &OpReply, compressor: Option<Compressor>) -> Result<Vec<u8>> {
    let size = 20 + reply.documents.iter().map(document_size_bytes).sum::<usize>();
    let mut buf = frame_start(request_id, response_to, OP_REPLY, size);
    buf.extend_from_slice(&reply.response_flags.to_le_bytes());
    buf.extend_from_slice(&reply.cursor_id.to_le_bytes());
    buf.extend_from_slice(&reply.starting_from.to_le_bytes());
    let returned = i32::try_from(reply.documents.len()).map_err(|_| protocol("too many documents"))?;
    buf.extend_from_slice(&returned.to_le_bytes());
    for d in &reply.documents {
        bson_codec::write_document(&mut buf, d)?;
    }
    frame_finish(&mut buf)?;
    Ok(maybe_compress(buf, compressor))
}

/// Encode an OP_QUERY (client side).
pub fn try_encode_query(request_id: i32, q: &OpQuery) -> Result<Vec<u8>> {
    if q.full_collection_name.as_bytes().contains(&0) {
        return Err(Error::new(Code::InvalidBSON, "fullCollectionName contains a NUL byte"));
    }
    let size = 4 + q.full_collection_name.len() + 1 + 8 + document_size_bytes(&q.query) + q.return_fields_selector.as_ref().map_or(0, document_size_bytes);
    let mut buf = frame_start(request_id, 0, OP_QUERY, size);
    buf.extend_from_slice(&q.flags.to_le_bytes());
    buf.extend_from_slice(q.full_collection_name.as_bytes());
    buf.push(0);
    buf.extend_from_slice(&q.number_to_skip.to_le_bytes());
    buf.extend_from_slice(&q.number_to_return.to_le_bytes());
    bson_codec::write_document(&mut buf, &q.query)?;
    if let Some(selector) = &q.return_fields_selector {
        bson_codec::write_document(&mut buf, selector)?;
    }
    frame_finish(&mut buf)?;
    Ok(buf)
}

/// The `{ok: 0, errmsg, code, codeName}` document sent instead of an unencodable one.
fn error_document(e: &Error) -> Document {
    bson::doc! { "ok": 0.0, "errmsg": e.message.clone(), "code": e.code, "codeName": e.code_name }
}

/// Encode an OP_MSG. A body that cannot be encoded as BSON is replaced by an error reply
/// document, so the peer always gets a well-formed answer.
pub fn encode_msg(request_id: i32, response_to: i32, msg: &OpMsg, compressor: Option<Compressor>) -> Vec<u8> {
    encode_msg_with_batch(request_id, response_to, msg, None::<RawBatch<Vec<u8>>>, compressor)
}

/// `encode_msg`, with the body's cursor batch written from `batch` when given.
pub fn encode_msg_with_batch(
    request_id: i32,
    response_to: i32,
    msg: &OpMsg,
    batch: Option<RawBatch<impl AsRef<[u8]>>>,
    compressor: Option<Compressor>,
) -> Vec<u8> {
    try_encode_msg_with_batch(request_id, response_to, msg, batch, compressor).unwrap_or_else(|e| {
        let fallback = OpMsg { flags: msg.flags & flags::CHECKSUM_PRESENT, body: error_document(&e), sequences: Vec::new() };
        try_encode_msg(request_id, response_to, &fallback, compressor).unwrap_or_default()
    })
}

/// Encode an OP_REPLY; unencodable documents are replaced by a single error document.
pub fn encode_reply(request_id: i32, response_to: i32, reply: &OpReply, compressor: Option<Compressor>) -> Vec<u8> {
    try_encode_reply(request_id, response_to, reply, compressor).unwrap_or_else(|e| {
        let fallback = OpReply {
            // QueryFailure: tells legacy clients the single document is an error.
            response_flags: 2,
            cursor_id: 0,
            starting_from: 0,
            documents: vec![error_document(&e)],
        };
        try_encode_reply(request_id, response_to, &fallback, compressor).unwrap_or_default()
    })
}

/// Encode an OP_QUERY (client side); an unencodable query is replaced by an error document
/// (use `try_encode_query` to see the error instead).
pub fn encode_query(request_id: i32, q: &OpQuery) -> Vec<u8> {
    try_encode_query(request_id, q).unwrap_or_else(|e| {
        let fallback = OpQuery {
            flags: q.flags,
            full_collection_name: q.full_collection_name.replace('\0', ""),
            number_to_skip: q.number_to_skip,
            number_to_return: q.number_to_return,
            query: error_document(&e),
            return_fields_selector: None,
        };
        try_encode_query(request_id, &fallback).unwrap_or_default()
    })
}

/// Wrap an encoded uncompressed frame in OP_COMPRESSED, unless the result would exceed the
/// maximum message size (then, like mongod, the uncompressed frame is sent).
fn maybe_compress(frame: Vec<u8>, compressor: Option<Compressor>) -> Vec<u8> {
    let Some(c) = compressor else { return frame };
    let Ok(header) = Header::parse(&frame) else {
        return frame;
    };
    let body = &frame[HEADER_SIZE_BYTES..];
    let Some(bound) = c.compressed_size_bytes_max(body.len()) else {
        return frame;
    };
    if HEADER_SIZE_BYTES + COMPRESSION_HEADER_SIZE_BYTES + bound > limits::MESSAGE_SIZE_MAX_BYTES {
        return frame;
    }
    let Ok(uncompressed_size) = i32::try_from(body.len()) else {
        return frame;
    };
    let mut out = frame_start(header.request_id, header.response_to, OP_COMPRESSED, COMPRESSION_HEADER_SIZE_BYTES + bound);
    out.extend_from_slice(&header.op_code.to_le_bytes());
    out.extend_from_slice(&uncompressed_size.to_le_bytes());
    out.push(c.id());
    if compression::compress_append(c, body, &mut out).is_err() || frame_finish(&mut out).is_err() {
        return frame;
    }
    out
}

#[cfg(test)]
mod tests;
