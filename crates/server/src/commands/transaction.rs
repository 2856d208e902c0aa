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

/// coordinateCommitTransaction (mongod's internal command): with no participants, a router
/// recovering the decision of a transaction it did not run; a commit across shards (with
/// participants) needs prepared transactions, which shoal does not have.
pub fn coordinate_commit(ctx: &mut Ctx) -> Result<Document> {
    let Some(session) = ctx.txn.as_deref_mut() else { return Err(outside("coordinateCommitTransaction")) };
    match ctx.cmd.get_array("participants") {
        Ok(p) if p.is_empty() => ctx.shared.txns.recover_decision(session)?,
        Ok(_) => return Err(Error::new(Code::CommandNotSupported, "a commit across shards (two-phase commit) is not supported by shoal yet")),
        Err(_) => return Err(Error::location(40414, "BSON field 'coordinateCommitTransaction.participants' is missing but a required field")),
    }
    Ok(Document::new())
}
