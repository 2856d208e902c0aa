//! commitTransaction and abortTransaction: the end of a session's transaction
//! (`crate::txn`). Dispatch has checked the statement against the session's state; the
//! write concern is waited for after the reply is built, as for any write.

use super::Ctx;
use bson::Document;
use common::{Code, Error, Result};

fn outside(name: &str) -> Error {
    Error::new(Code::InvalidOptions, format!("{name} must be run within a transaction (with lsid, txnNumber and autocommit: false)"))
}

pub fn commit(ctx: &mut Ctx) -> Result<Document> {
    let Some(session) = ctx.txn.as_deref_mut() else { return Err(outside("commitTransaction")) };
    ctx.shared.txns.commit(session)?;
    ctx.commit_write()?;
    Ok(Document::new())
}

pub fn abort(ctx: &mut Ctx) -> Result<Document> {
    let Some(session) = ctx.txn.as_deref_mut() else { return Err(outside("abortTransaction")) };
    ctx.shared.txns.abort(session)?;
    Ok(Document::new())
}
