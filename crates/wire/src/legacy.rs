//! The legacy write and cursor opcodes of drivers older than OP_MSG (mongod 5.0 took them;
//! 6.0 dropped them): OP_INSERT, OP_UPDATE, OP_DELETE, OP_GET_MORE and OP_KILL_CURSORS.
//! Decoding only: what they mean is the connection loop's to translate into commands.

use super::{protocol, Reader};
use bson::Document;
use common::Result;

pub const OP_UPDATE: i32 = 2001;
pub const OP_INSERT: i32 = 2002;
pub const OP_GET_MORE: i32 = 2005;
pub const OP_DELETE: i32 = 2006;
pub const OP_KILL_CURSORS: i32 = 2007;

/// OP_INSERT's flag: go on after a document that fails.
pub const INSERT_CONTINUE_ON_ERROR: u32 = 1;
/// OP_UPDATE's flags.
pub const UPDATE_UPSERT: u32 = 1;
pub const UPDATE_MULTI: u32 = 2;
/// OP_DELETE's flag: remove one document at most.
pub const DELETE_SINGLE_REMOVE: u32 = 1;

#[derive(Clone, Debug, PartialEq)]
pub struct OpInsert {
    pub flags: u32,
    pub full_collection_name: String,
    pub documents: Vec<Document>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpUpdate {
    pub full_collection_name: String,
    pub flags: u32,
    pub selector: Document,
    pub update: Document,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpDelete {
    pub full_collection_name: String,
    pub flags: u32,
    pub selector: Document,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpGetMore {
    pub full_collection_name: String,
    pub number_to_return: i32,
    pub cursor_id: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpKillCursors {
    pub cursor_ids: Vec<i64>,
}

fn done(reader: &Reader, what: &str) -> Result<()> {
    if reader.is_empty() {
        Ok(())
    } else {
        Err(protocol(format!("{what} has trailing bytes")))
    }
}

pub(crate) fn decode_insert(body: &[u8]) -> Result<OpInsert> {
    let mut r = Reader::new(body);
    let flags = r.u32("OP_INSERT flags")?;
    let full_collection_name = r.cstr("fullCollectionName")?.to_string();
    let mut documents = Vec::new();
    while !r.is_empty() {
        documents.push(r.document()?);
    }
    if documents.is_empty() {
        return Err(protocol("OP_INSERT holds no documents"));
    }
    Ok(OpInsert { flags, full_collection_name, documents })
}

pub(crate) fn decode_update(body: &[u8]) -> Result<OpUpdate> {
    let mut r = Reader::new(body);
    r.i32("OP_UPDATE reserved field")?;
    let full_collection_name = r.cstr("fullCollectionName")?.to_string();
    let flags = r.u32("OP_UPDATE flags")?;
    let selector = r.document()?;
    let update = r.document()?;
    done(&r, "OP_UPDATE")?;
    Ok(OpUpdate { full_collection_name, flags, selector, update })
}

pub(crate) fn decode_delete(body: &[u8]) -> Result<OpDelete> {
    let mut r = Reader::new(body);
    r.i32("OP_DELETE reserved field")?;
    let full_collection_name = r.cstr("fullCollectionName")?.to_string();
    let flags = r.u32("OP_DELETE flags")?;
    let selector = r.document()?;
    done(&r, "OP_DELETE")?;
    Ok(OpDelete { full_collection_name, flags, selector })
}

pub(crate) fn decode_get_more(body: &[u8]) -> Result<OpGetMore> {
    let mut r = Reader::new(body);
    r.i32("OP_GET_MORE reserved field")?;
    let full_collection_name = r.cstr("fullCollectionName")?.to_string();
    let number_to_return = r.i32("numberToReturn")?;
    let cursor_id = r.i64("cursorID")?;
    done(&r, "OP_GET_MORE")?;
    Ok(OpGetMore { full_collection_name, number_to_return, cursor_id })
}

pub(crate) fn decode_kill_cursors(body: &[u8]) -> Result<OpKillCursors> {
    let mut r = Reader::new(body);
    r.i32("OP_KILL_CURSORS reserved field")?;
    let n = r.i32("numberOfCursorIDs")?;
    // The count must be what the message holds: nothing is allocated for a lie.
    let n = usize::try_from(n)
        .ok()
        .filter(|n| n.checked_mul(8) == Some(r.rest().len()))
        .ok_or_else(|| protocol("OP_KILL_CURSORS numberOfCursorIDs does not match its length"))?;
    let cursor_ids = (0..n).map(|_| r.i64("cursorID")).collect::<Result<Vec<_>>>()?;
    Ok(OpKillCursors { cursor_ids })
}
