//! A command as a handler sees it: its name, its database, and its body with the message's
//! document sequences merged in. Knows the envelope, not what any command means.

use bson::{Bson, Document};
use common::{Code, Error, Result};
use std::sync::Arc;

use crate::DocumentSequence;

#[derive(Clone, Debug)]
pub struct Request {
    pub name: String,
    pub db: String,
    /// The command body with any OP_MSG document sequences merged in as arrays. Shared, so
    /// currentOp and exhaust re-runs hold it without copying.
    pub body: Arc<Document>,
}

impl Request {
    pub fn from_msg(mut body: Document, sequences: Vec<DocumentSequence>) -> Result<Request> {
        let name = match body.keys().next() {
            Some(k) => k.clone(),
            None => return Err(Error::new(Code::FailedToParse, "Command body must not be empty")),
        };
        let db = match body.get("$db") {
            Some(Bson::String(s)) => s.clone(),
            Some(_) => return Err(Error::new(Code::TypeMismatch, "BSON field '$db' is the wrong type, expected type 'string'")),
            None => return Err(Error::location(40571, "OP_MSG requests require a $db argument")),
        };
        check_db_name(&db)?;
        for seq in sequences {
            if body.contains_key(&seq.identifier) {
                return Err(Error::location(40413, format!("Duplicate field '{}' in OP_MSG body and document sequence", seq.identifier)));
            }
            body.insert(seq.identifier, Bson::Array(seq.documents.into_iter().map(Bson::Document).collect()));
        }
        Ok(Request { name, db, body: Arc::new(body) })
    }

    /// The namespace the command names: `db.collection` when its first field is a
    /// collection's name, else `db.$cmd` (currentOp's `ns`, failCommand's `namespace`).
    pub fn namespace(&self) -> String {
        match self.body.get(&self.name) {
            Some(Bson::String(c)) => format!("{}.{c}", self.db),
            _ => format!("{}.$cmd", self.db),
        }
    }
}

/// Database names as MongoDB allows them: non-empty, < 64 bytes, none of `/\. "$` or NUL;
/// and "$external", where X.509 users are defined (it holds no data).
fn check_db_name(db: &str) -> Result<()> {
    const DB_NAME_LENGTH_MAX_BYTES: usize = 63;
    if db == common::server::EXTERNAL_DB {
        return Ok(());
    }
    if db.is_empty() || db.len() > DB_NAME_LENGTH_MAX_BYTES || db.contains(['/', '\\', '.', ' ', '"', '$', '\0']) {
        return Err(Error::new(Code::InvalidNamespace, format!("Invalid database name: '{db}'")));
    }
    Ok(())
}

pub fn is_hello(name: &str) -> bool {
    matches!(name, "hello" | "isMaster" | "ismaster")
}
