//! BSON in and out of wire buffers.
//!
//! Decoding first walks the raw bytes iteratively (structure, lengths, nesting depth) so that a
//! hostile, deeply nested document is rejected before bson's recursive parser sees it; then bson
//! builds the `Document` (which also validates UTF-8).
//! Encoding writes straight into the caller's frame buffer instead of bson's `to_vec` (which
//! would build a separate buffer per document that then has to be copied).

use bson::{Bson, Document};
use common::{limits, Code, Error, Result};

/// Largest document accepted from the wire: user max plus MongoDB's internal slack.
pub const DOCUMENT_SIZE_MAX_BYTES: usize = limits::BSON_OBJECT_SIZE_MAX_BYTES + limits::BSON_USER_OBJECT_SLACK_BYTES;
/// Smallest BSON document: length prefix plus terminating NUL.
const DOCUMENT_SIZE_MIN_BYTES: usize = 5;
/// Encoding recursion bound: far above anything decodable, low enough to never overflow a stack.
const ENCODE_DEPTH_MAX: usize = 1024;

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Code::InvalidBSON, message)
}

fn too_large(size: i64) -> Error {
    Error::new(
        Code::BSONObjectTooLarge,
        format!(
            "BSONObj size: {size} (0x{:X}) is invalid. Size must be between 0 and {}({}MB)",
            size as i32,
            DOCUMENT_SIZE_MAX_BYTES,
            DOCUMENT_SIZE_MAX_BYTES >> 20
        ),
    )
}

fn read_i32(bytes: &[u8], pos: usize) -> Option<i32> {
    let b = bytes.get(pos..pos.checked_add(4)?)?;
    Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Length of the document starting at `bytes[0]`, checked against the size bounds and the
/// bytes available; does not look inside.
pub(crate) fn document_length(bytes: &[u8]) -> Result<usize> {
    let size = read_i32(bytes, 0).ok_or_else(|| invalid("Invalid BSON: not enough bytes for a document length"))?;
    if size < 0 || size as usize > DOCUMENT_SIZE_MAX_BYTES {
        return Err(too_large(size as i64));
    }
    let size = size as usize;
    if size < DOCUMENT_SIZE_MIN_BYTES {
        return Err(invalid(format!("Invalid BSON: document length {size} is too small")));
    }
    if size > bytes.len() {
        return Err(invalid(format!("Invalid BSON: document length {size} exceeds the {} bytes remaining in the message", bytes.len())));
    }
    Ok(size)
}

/// Structural validation of one complete document (`doc.len()` is its declared length):
/// element types, lengths, NUL terminators and nesting depth, without recursion.
pub(crate) fn validate_structure(doc: &[u8]) -> Result<()> {
    // Ends (exclusive) of the open documents; top-level is depth 0.
    let mut ends: Vec<usize> = Vec::with_capacity(16);
    ends.push(doc.len());
    let mut pos = 4usize;
    let eoo = |m: &str| invalid(format!("Invalid BSON: {m}"));
    while let Some(&end) = ends.last() {
        let element_type = *doc.get(pos).filter(|_| pos < end).ok_or_else(|| eoo("missing EOO"))?;
        pos += 1;
        if element_type == 0 {
            if pos != end {
                return Err(eoo("EOO before end of object"));
            }
            ends.pop();
            continue;
        }
        // The last byte of the enclosing document is its EOO, so values must end before it.
        let limit = end - 1;
        pos = cstring_end(doc, pos, limit).ok_or_else(|| eoo("field name is not terminated"))?;
        let fixed = |pos: usize, n: usize| -> Result<usize> {
            pos.checked_add(n).filter(|&e| e <= limit).ok_or_else(|| invalid("Invalid BSON: value extends past end of object"))
        };
        pos = match element_type {
            0x01 | 0x09 | 0x11 | 0x12 => fixed(pos, 8)?,
            0x10 => fixed(pos, 4)?,
            0x07 => fixed(pos, 12)?,
            0x13 => fixed(pos, 16)?,
            0x06 | 0x0A | 0x7F | 0xFF => pos,
            0x08 => {
                let b = *doc.get(pos).filter(|_| pos < limit).ok_or_else(|| eoo("truncated boolean"))?;
                if b > 1 {
                    return Err(eoo("boolean must be 0 or 1"));
                }
                pos + 1
            }
            0x02 | 0x0D | 0x0E => string_end(doc, pos, limit)?,
            0x0C => {
                let p = string_end(doc, pos, limit)?;
                fixed(p, 12)?
            }
            0x0B => {
                let p = cstring_end(doc, pos, limit).ok_or_else(|| eoo("regex pattern is not terminated"))?;
                cstring_end(doc, p, limit).ok_or_else(|| eoo("regex options are not terminated"))?
            }
            0x05 => {
                let len = read_i32(doc, pos).ok_or_else(|| eoo("truncated binary"))?;
                if len < 0 {
                    return Err(eoo("negative binary length"));
                }
                fixed(pos, 4 + 1 + len as usize)?
            }
            0x03 | 0x04 => {
                let len = nested_length(doc, pos, limit)?;
                if ends.len() > limits::BSON_DEPTH_MAX {
                    return Err(depth_exceeded());
                }
                ends.push(pos + len);
                pos += 4;
                continue;
            }
            0x0F => {
                // code_w_scope: int32 total, string code, document scope; all inside total.
                let total = read_i32(doc, pos).ok_or_else(|| eoo("truncated code with scope"))?;
                if total < 4 + 5 + 5 {
                    return Err(eoo("code with scope is too small"));
                }
                let total_end = fixed(pos, total as usize)?;
                let scope = string_end(doc, pos + 4, total_end)?;
                let len = nested_length(doc, scope, total_end)?;
                if scope + len != total_end {
                    return Err(eoo("code with scope length does not match its contents"));
                }
                if ends.len() > limits::BSON_DEPTH_MAX {
                    return Err(depth_exceeded());
                }
                ends.push(total_end);
                scope + 4
            }
            other => return Err(eoo(&format!("unknown element type 0x{other:02x}"))),
        };
    }
    if pos != doc.len() {
        return Err(eoo("trailing bytes after document"));
    }
    Ok(())
}

fn depth_exceeded() -> Error {
    Error::new(Code::Overflow, format!("BSONObj exceeds maximum nested object depth: {}", limits::BSON_DEPTH_MAX))
}

/// Length of an embedded document at `pos` that must end by `limit`, with its trailing NUL.
fn nested_length(doc: &[u8], pos: usize, limit: usize) -> Result<usize> {
    let len = read_i32(doc, pos).ok_or_else(|| invalid("Invalid BSON: truncated embedded document"))?;
    if len < DOCUMENT_SIZE_MIN_BYTES as i32 {
        return Err(invalid("Invalid BSON: embedded document is too small"));
    }
    let end = pos.checked_add(len as usize).filter(|&e| e <= limit).ok_or_else(|| invalid("Invalid BSON: embedded document extends past end of object"))?;
    if doc.get(end - 1) != Some(&0) {
        return Err(invalid("Invalid BSON: embedded document does not end with EOO"));
    }
    Ok(len as usize)
}

/// End of a NUL-terminated string starting at `pos` that must end by `limit`.
fn cstring_end(doc: &[u8], pos: usize, limit: usize) -> Option<usize> {
    let hay = doc.get(pos..limit)?;
    hay.iter().position(|&b| b == 0).map(|i| pos + i + 1)
}

/// End of a length-prefixed BSON string at `pos` (int32 length including NUL, bytes, NUL).
fn string_end(doc: &[u8], pos: usize, limit: usize) -> Result<usize> {
    let len = read_i32(doc, pos).ok_or_else(|| invalid("Invalid BSON: truncated string"))?;
    if len < 1 {
        return Err(invalid("Invalid BSON: string length must be at least 1"));
    }
    let end = (pos + 4).checked_add(len as usize).filter(|&e| e <= limit).ok_or_else(|| invalid("Invalid BSON: string extends past end of object"))?;
    if doc.get(end - 1) != Some(&0) {
        return Err(invalid("Invalid BSON: string is not NUL terminated"));
    }
    Ok(end)
}

/// Read and fully validate one document at the start of `bytes`; returns it and its length.
pub(crate) fn read_document(bytes: &[u8]) -> Result<(Document, usize)> {
    let len = document_length(bytes)?;
    let raw = &bytes[..len];
    validate_structure(raw)?;
    let raw_doc = bson::RawDocument::from_bytes(raw).map_err(|e| invalid(format!("Invalid BSON: {e}")))?;
    let doc = Document::try_from(raw_doc).map_err(|e| invalid(format!("Invalid BSON: {e}")))?;
    Ok((doc, len))
}

/// Check one document at the start of `bytes` as `read_document` does, without building a
/// `Document`; returns its length. (Strings are checked for UTF-8 when decoded.)
pub(crate) fn read_raw_document(bytes: &[u8]) -> Result<usize> {
    let len = document_length(bytes)?;
    validate_structure(&bytes[..len])?;
    Ok(len)
}

/// Exact encoded size of `doc` in bytes (used to pre-size frames; also handy for batching).
pub fn document_size_bytes(doc: &Document) -> usize {
    doc_size(doc, 0)
}

fn doc_size(doc: &Document, depth: usize) -> usize {
    let mut size = 4 + 1;
    for (key, value) in doc {
        size += 1 + key.len() + 1 + value_size(value, depth);
    }
    size
}

fn value_size(value: &Bson, depth: usize) -> usize {
    if depth > ENCODE_DEPTH_MAX {
        return 0; // Encoding will fail anyway; the size is only a capacity hint then.
    }
    match value {
        Bson::Double(_) | Bson::Int64(_) | Bson::DateTime(_) | Bson::Timestamp(_) => 8,
        Bson::Int32(_) => 4,
        Bson::String(s) | Bson::JavaScriptCode(s) | Bson::Symbol(s) => 4 + s.len() + 1,
        Bson::Document(d) => doc_size(d, depth + 1),
        Bson::Array(a) => {
            let mut size = 4 + 1;
            for (i, v) in a.iter().enumerate() {
                size += 1 + decimal_digits(i) + 1 + value_size(v, depth + 1);
            }
            size
        }
        Bson::Boolean(_) => 1,
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => 0,
        Bson::RegularExpression(r) => r.pattern.as_str().len() + 1 + r.options.as_str().len() + 1,
        Bson::JavaScriptCodeWithScope(c) => 4 + 4 + c.code.len() + 1 + doc_size(&c.scope, depth + 1),
        Bson::Binary(b) => {
            let old = matches!(b.subtype, bson::spec::BinarySubtype::BinaryOld);
            4 + 1 + if old { 4 } else { 0 } + b.bytes.len()
        }
        Bson::ObjectId(_) => 12,
        Bson::Decimal128(_) => 16,
        // Namespace is private in bson 3; 4 + NUL + 12 plus a typical namespace is a fine hint.
        Bson::DbPointer(_) => 4 + 1 + 12 + 32,
    }
}

fn decimal_digits(mut n: usize) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// Append `doc` as BSON to `buf`.
pub(crate) fn write_document(buf: &mut Vec<u8>, doc: &Document) -> Result<()> {
    write_doc(buf, doc, 0)
}

fn write_doc(buf: &mut Vec<u8>, doc: &Document, depth: usize) -> Result<()> {
    if depth > ENCODE_DEPTH_MAX {
        return Err(depth_exceeded());
    }
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    for (key, value) in doc {
        buf.push(value.element_type() as u8);
        write_key(buf, key)?;
        write_value(buf, value, depth)?;
    }
    buf.push(0);
    patch_length(buf, start)
}

/// Append `body` as BSON, with the empty array `cursor.<batch_key>` written from `batch`, a
/// cursor batch whose documents are already BSON (an oplog tail's records as stored): they
/// are copied into the frame instead of being decoded and encoded again.
pub(crate) fn write_cursor_reply(buf: &mut Vec<u8>, body: &Document, batch_key: &str, batch: &[impl AsRef<[u8]>]) -> Result<()> {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    let mut spliced = false;
    for (key, value) in body {
        buf.push(value.element_type() as u8);
        write_key(buf, key)?;
        match value {
            Bson::Document(cursor) if key == "cursor" => {
                let cursor_start = buf.len();
                buf.extend_from_slice(&[0; 4]);
                for (k, v) in cursor {
                    buf.push(v.element_type() as u8);
                    write_key(buf, k)?;
                    if k == batch_key && matches!(v, Bson::Array(a) if a.is_empty()) {
                        write_raw_array(buf, batch)?;
                        spliced = true;
                    } else {
                        write_value(buf, v, 1)?;
                    }
                }
                buf.push(0);
                patch_length(buf, cursor_start)?;
            }
            _ => write_value(buf, value, 0)?,
        }
    }
    buf.push(0);
    patch_length(buf, start)?;
    if !spliced {
        return Err(Error::internal(format!("reply has no empty cursor.{batch_key} to hold its batch")));
    }
    Ok(())
}

fn write_key(buf: &mut Vec<u8>, key: &str) -> Result<()> {
    if key.as_bytes().contains(&0) {
        return Err(invalid(format!("Invalid BSON: field name contains a NUL byte: {key:?}")));
    }
    buf.extend_from_slice(key.as_bytes());
    buf.push(0);
    Ok(())
}

/// The documents are written as they are; each is checked to be framed as one (its length
/// prefix is its length and it ends in NUL), so the frame stays well formed.
fn write_raw_array(buf: &mut Vec<u8>, docs: &[impl AsRef<[u8]>]) -> Result<()> {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    let mut digits = [0u8; 20];
    for (i, d) in docs.iter().enumerate() {
        let d = d.as_ref();
        let framed = d.len() >= 5 && d.last() == Some(&0) && d[..4] == i32::try_from(d.len()).unwrap_or(-1).to_le_bytes();
        if !framed {
            return Err(invalid(format!("Invalid BSON: batch document {i} is not framed as a document")));
        }
        buf.push(bson::spec::ElementType::EmbeddedDocument as u8);
        buf.extend_from_slice(format_index(i, &mut digits));
        buf.push(0);
        buf.extend_from_slice(d);
    }
    buf.push(0);
    patch_length(buf, start)
}

/// Encoded size of `cursor.<key>` array holding `batch` (for pre-sizing a frame).
pub(crate) fn raw_array_size_bytes(batch: &[impl AsRef<[u8]>]) -> usize {
    5 + batch.iter().enumerate().map(|(i, d)| 2 + decimal_digits(i) + d.as_ref().len()).sum::<usize>()
}

/// Write the int32 length of the object that starts at `start` and runs to the end of `buf`.
pub(crate) fn patch_length(buf: &mut [u8], start: usize) -> Result<()> {
    let len = i32::try_from(buf.len() - start).map_err(|_| Error::new(Code::BSONObjectTooLarge, "object larger than 2GiB"))?;
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

fn write_string(buf: &mut Vec<u8>, s: &str) -> Result<()> {
    let len = i32::try_from(s.len() + 1).map_err(|_| Error::new(Code::BSONObjectTooLarge, "string larger than 2GiB"))?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
    Ok(())
}

fn write_value(buf: &mut Vec<u8>, value: &Bson, depth: usize) -> Result<()> {
    match value {
        Bson::Double(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Bson::String(s) | Bson::JavaScriptCode(s) | Bson::Symbol(s) => write_string(buf, s)?,
        Bson::Document(d) => write_doc(buf, d, depth + 1)?,
        Bson::Array(a) => {
            if depth + 1 > ENCODE_DEPTH_MAX {
                return Err(depth_exceeded());
            }
            let start = buf.len();
            buf.extend_from_slice(&[0; 4]);
            let mut digits = [0u8; 20];
            for (i, v) in a.iter().enumerate() {
                buf.push(v.element_type() as u8);
                buf.extend_from_slice(format_index(i, &mut digits));
                buf.push(0);
                write_value(buf, v, depth + 1)?;
            }
            buf.push(0);
            patch_length(buf, start)?;
        }
        Bson::Boolean(b) => buf.push(*b as u8),
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => {}
        Bson::RegularExpression(r) => {
            // CString guarantees no interior NUL.
            buf.extend_from_slice(r.pattern.as_str().as_bytes());
            buf.push(0);
            buf.extend_from_slice(r.options.as_str().as_bytes());
            buf.push(0);
        }
        Bson::JavaScriptCodeWithScope(c) => {
            let start = buf.len();
            buf.extend_from_slice(&[0; 4]);
            write_string(buf, &c.code)?;
            write_doc(buf, &c.scope, depth + 1)?;
            patch_length(buf, start)?;
        }
        Bson::Int32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Bson::Int64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Bson::Timestamp(ts) => {
            buf.extend_from_slice(&ts.increment.to_le_bytes());
            buf.extend_from_slice(&ts.time.to_le_bytes());
        }
        Bson::Binary(b) => {
            let old = matches!(b.subtype, bson::spec::BinarySubtype::BinaryOld);
            let inner = i32::try_from(b.bytes.len()).map_err(|_| Error::new(Code::BSONObjectTooLarge, "binary larger than 2GiB"))?;
            let outer = if old { inner.checked_add(4) } else { Some(inner) }.ok_or_else(|| Error::new(Code::BSONObjectTooLarge, "binary larger than 2GiB"))?;
            buf.extend_from_slice(&outer.to_le_bytes());
            buf.push(u8::from(b.subtype));
            if old {
                buf.extend_from_slice(&inner.to_le_bytes());
            }
            buf.extend_from_slice(&b.bytes);
        }
        Bson::ObjectId(oid) => buf.extend_from_slice(&oid.bytes()),
        Bson::DateTime(dt) => buf.extend_from_slice(&dt.timestamp_millis().to_le_bytes()),
        Bson::Decimal128(d) => buf.extend_from_slice(&d.bytes()),
        Bson::DbPointer(_) => {
            // Fields are private in bson 3: let bson encode `{"": ptr}` and take the value bytes
            // (after length, type byte and the empty key's NUL; before the final EOO).
            let wrapped = bson::doc! { "": value.clone() }.to_vec().map_err(|e| invalid(format!("Invalid BSON: {e}")))?;
            let bytes = wrapped.get(6..wrapped.len().saturating_sub(1)).ok_or_else(|| Error::internal("DBPointer encoding is malformed"))?;
            buf.extend_from_slice(bytes);
        }
    }
    Ok(())
}

pub(crate) fn format_index(mut i: usize, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (i % 10) as u8;
        i /= 10;
        if i == 0 {
            break;
        }
    }
    &digits[at..]
}
