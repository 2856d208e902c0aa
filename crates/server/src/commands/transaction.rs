//! commitTransaction and abortTransaction: the end of a session's transaction
//! (`crate::txn`). Dispatch has checked the statement against the session's state; the
//! write concern is waited for after the reply is built, as for any write.

use super::Ctx;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};

fn outside(name: &str) -> Error {
    Error::new(Code::InvalidOptions, format!("{name} must be run within a transaction (with lsid, txnNumber and autocommit: false)"))
}

/// commitTransaction; a prepared transaction's names its `commitTimestamp` (the
/// coordinator's decision).
pub fn commit(ctx: &mut Ctx) -> Result<Document> {
    let commit_ts = match ctx.cmd.get("commitTimestamp") {
        None => None,
        Some(Bson::Timestamp(t)) if t.time > 0 || t.increment > 0 => Some(common::optime::ts_value(*t)),
        Some(Bson::Timestamp(_)) => return Err(Error::new(Code::InvalidOptions, "'commitTimestamp' cannot be null")),
        Some(_) => return Err(Error::type_mismatch("BSON field 'commitTransaction.commitTimestamp' is the wrong type, expected type 'timestamp'")),
    };
    let Some(session) = ctx.txn.as_deref_mut() else { return Err(outside("commitTransaction")) };
    ctx.shared.txns.commit(ctx.shared, session, commit_ts)?;
    ctx.commit_write()?;
    Ok(Document::new())
}

pub fn abort(ctx: &mut Ctx) -> Result<Document> {
    let Some(session) = ctx.txn.as_deref_mut() else { return Err(outside("abortTransaction")) };
    ctx.shared.txns.abort(ctx.shared, session)?;
    ctx.commit_write()?;
    Ok(Document::new())
}

/// prepareTransaction (a participant of a transaction that writes on several shards): log
/// the prepare entry and answer its timestamp, the participant's vote. The router sends it
/// with writeConcern majority, so the vote stands through a failover.
pub fn prepare(ctx: &mut Ctx) -> Result<Document> {
    let Some(session) = ctx.txn.as_deref_mut() else { return Err(outside("prepareTransaction")) };
    let at = ctx.shared.txns.prepare(ctx.shared, session)?;
    ctx.commit_write()?;
    Ok(doc! {"prepareTimestamp": common::optime::ts_of(at.ts)})
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
