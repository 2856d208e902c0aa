//! The two-phase commit of a transaction that wrote on several shards, driven by the router
//! that ran it, with its state on the config servers (`config.transaction_coordinators`)
//! so that any router finishes it if this one dies. The steps, as mongod's transaction
//! coordinator:
//!
//! 1. Record the participants (the write shards) under the transaction's id, w:majority.
//!    From here no participant is prepared without a record that names it.
//! 2. `prepareTransaction` on every participant (w:majority): each logs its prepare entry and
//!    answers its prepare timestamp, its vote to commit.
//! 3. The decision: commit at the latest prepare timestamp if every participant voted, else
//!    abort. Written into the record only if it holds none (w:majority), so there is one
//!    decision whoever writes first: a router recovering an abandoned record decides abort
//!    the same way, and this router then follows that.
//! 4. The decision to every participant (`commitTransaction` with `commitTimestamp`, or
//!    `abortTransaction`), until each has it. Each is idempotent.
//! 5. The record goes.
//!
//! The client's commit is answered after step 4 (each participant's commit is applied, so
//! the client reads its writes on every shard), or, if a participant cannot be reached,
//! after the decision: a commit decided is committed, and the record stays until a router's
//! recovery delivers it (`recover_abandoned`, each balancer round, for records older than
//! `COORDINATOR_LEASE`).

use super::Router;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use net::pool::{reply_result, COMMAND_TIMEOUT};
use std::time::{Duration, Instant};

/// `config.transaction_coordinators`.
pub const COORDINATORS: &str = "transaction_coordinators";
/// A record older than this is taken for a dead router's and finished by another router's
/// balancer round: it decides abort unless a decision is recorded.
pub const COORDINATOR_LEASE: Duration = Duration::from_secs(30);
/// How long the router tries to deliver the decision to a participant before it leaves
/// the rest to recovery.
const DELIVERY_TIME_MAX: Duration = Duration::from_secs(30);
/// The pause between delivery attempts to a participant that failed.
const DELIVERY_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long a commit retried through another router waits for a running coordinator's
/// decision, and how often it looks.
const DECISION_WAIT_MAX: Duration = Duration::from_secs(60);
const DECISION_POLL: Duration = Duration::from_millis(100);

/// The decision on a transaction.
#[derive(Clone, Debug, PartialEq)]
enum Decision {
    Commit(bson::Timestamp),
    Abort,
}

impl Decision {
    fn to_doc(&self) -> Document {
        match self {
            Decision::Commit(ts) => doc! {"decision": "commit", "commitTimestamp": *ts},
            Decision::Abort => doc! {"decision": "abort"},
        }
    }

    fn from_record(record: &Document) -> Option<Decision> {
        let d = record.get_document("decision").ok()?;
        match d.get_str("decision").ok()? {
            "commit" => d.get_timestamp("commitTimestamp").ok().map(Decision::Commit),
            _ => Some(Decision::Abort),
        }
    }
}

/// The record's `_id`: the session and the transaction number.
fn record_id(lsid: &[u8], txn_number: i64) -> Document {
    doc! {"lsid": {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: lsid.to_vec() }}, "txnNumber": txn_number}
}

/// A command of the transaction, for a participant.
fn txn_command(name: &str, id: &Document, extra: Document) -> Document {
    let mut body = doc! {name: 1};
    body.insert("lsid", id.get_document("lsid").cloned().unwrap_or_default());
    body.insert("txnNumber", id.get_i64("txnNumber").unwrap_or_default());
    body.insert("autocommit", false);
    body.extend(extra);
    body.insert("writeConcern", doc! {"w": "majority", "wtimeout": 60_000});
    body
}

/// Commit, by two-phase commit, the transaction `txn_number` of session `lsid` that wrote
/// on `participants` (two or more shards).
pub async fn commit(router: &Router, lsid: &[u8], txn_number: i64, participants: &[String]) -> Result<Document> {
    debug_assert!(participants.len() >= 2);
    let id = record_id(lsid, txn_number);
    let record = doc! {"_id": id.clone(), "participants": participants, "started": bson::DateTime::now()};
    match router.config_write(doc! {"insert": COORDINATORS, "documents": [record]}).await {
        Ok(_) => {}
        // This transaction's commit ran before (a client's retry after an answer it did not
        // get): follow its record, or, once that is gone, ask the first participant how it
        // ended.
        Err(e) if e.code == Code::DuplicateKey.0 => {
            return match recover_for_client(router, lsid, txn_number).await? {
                Some(answer) => answer,
                None => decision_on(router, &id, &participants[0]).await,
            };
        }
        Err(e) => return Err(e),
    }
    let votes = futures_util::future::join_all(participants.iter().map(|shard| prepare(router, &id, shard))).await;
    let mut refusal = None;
    let mut commit_ts = bson::Timestamp { time: 0, increment: 0 };
    for v in votes {
        match v {
            Ok(ts) => commit_ts = commit_ts.max(ts),
            Err(e) => {
                refusal.get_or_insert(e);
            }
        }
    }
    let wanted = match refusal {
        None => Decision::Commit(commit_ts),
        Some(_) => Decision::Abort,
    };
    let decided = decide(router, &id, wanted).await?;
    finish(router, &id, participants, &decided).await;
    answer(&decided, refusal)
}

/// The client's answer to a decided transaction.
fn answer(decided: &Decision, refusal: Option<Error>) -> Result<Document> {
    match decided {
        Decision::Commit(_) => Ok(Document::new()),
        Decision::Abort => {
            let why = refusal.map(|e| format!(": a participant did not prepare ({}: {})", e.code_name, e.message)).unwrap_or_default();
            Err(Error::new(Code::NoSuchTransaction, format!("Transaction was aborted{why}")))
        }
    }
}

/// How the transaction ended on `shard`, once its record is gone: committed, or an error
/// (the shard aborts it if it is still undecided there, as mongos's commit recovery).
async fn decision_on(router: &Router, id: &Document, shard: &str) -> Result<Document> {
    let set = router.shard(shard).await?;
    let body = txn_command("coordinateCommitTransaction", id, doc! {"participants": []});
    reply_result(router.pool.run(&set, "admin", body, None, COMMAND_TIMEOUT).await?.1).map(|_| Document::new())
}

/// Step 2 on one participant: its prepare timestamp.
async fn prepare(router: &Router, id: &Document, shard: &str) -> Result<bson::Timestamp> {
    let set = router.shard(shard).await?;
    let (_, reply) = router.pool.run(&set, "admin", txn_command("prepareTransaction", id, Document::new()), None, COMMAND_TIMEOUT).await?;
    let reply = reply_result(reply)?;
    if let Ok(wce) = reply.get_document("writeConcernError") {
        return Err(Error::new(Code::WriteConcernFailed, format!("shard {shard} prepared without a majority: {}", wce.get_str("errmsg").unwrap_or_default())));
    }
    reply.get_timestamp("prepareTimestamp").map_err(|_| Error::internal(format!("shard {shard} prepared without a prepareTimestamp")))
}

/// Step 3: record `wanted` unless the record holds a decision; returns the one recorded.
/// A record gone was finished by a recovery, which decides abort only.
async fn decide(router: &Router, id: &Document, wanted: Decision) -> Result<Decision> {
    let update = doc! {
        "update": COORDINATORS,
        "updates": [{"q": {"_id": id.clone(), "decision": {"$exists": false}}, "u": {"$set": {"decision": wanted.to_doc()}}}],
    };
    router.config_write(update).await?;
    let found = router.config_find(COORDINATORS, doc! {"_id": id.clone()}, doc! {}).await?;
    Ok(found.first().and_then(Decision::from_record).unwrap_or(Decision::Abort))
}

/// Steps 4 and 5: the decision to every participant, then the record goes (kept if some
/// participant could not be reached: recovery delivers the rest).
async fn finish(router: &Router, id: &Document, participants: &[String], decided: &Decision) {
    let delivered = futures_util::future::join_all(participants.iter().map(|shard| deliver(router, id, shard, decided))).await;
    if delivered.iter().all(|d| *d) {
        let delete = doc! {"delete": COORDINATORS, "deletes": [{"q": {"_id": id.clone()}, "limit": 1}]};
        if let Err(e) = router.config_write(delete).await {
            tracing::warn!("cannot delete a finished transaction coordinator's record: {}", e.message);
        }
    }
}

/// The decision to one participant, tried until it has it or `DELIVERY_TIME_MAX` passes.
async fn deliver(router: &Router, id: &Document, shard: &str, decided: &Decision) -> bool {
    let body = match decided {
        Decision::Commit(ts) => txn_command("commitTransaction", id, doc! {"commitTimestamp": *ts}),
        Decision::Abort => txn_command("abortTransaction", id, Document::new()),
    };
    let until = Instant::now() + DELIVERY_TIME_MAX;
    loop {
        let sent = async {
            let set = router.shard(shard).await?;
            let (_, reply) = router.pool.run(&set, "admin", body.clone(), None, COMMAND_TIMEOUT).await?;
            // An answer counts once its write concern was met, an error's too (an abort that
            // found no transaction waited for the shard's newest entry: see the shard's
            // dispatch).
            if reply.contains_key("writeConcernError") {
                return Ok(reply);
            }
            reply_result(reply)
        };
        match sent.await {
            Ok(reply) if !reply.contains_key("writeConcernError") => return true,
            // An abort finds nothing to abort where the transaction never got far.
            Err(e) if *decided == Decision::Abort && e.code == Code::NoSuchTransaction.0 => return true,
            Err(e) if *decided == Decision::Abort && e.code == Code::TransactionCommitted.0 => {
                tracing::error!("shard {shard} committed a transaction whose decision is abort");
                return false;
            }
            Ok(_) => tracing::debug!("shard {shard} took the decision without a majority yet"),
            Err(e) => tracing::debug!("delivering a transaction's decision to shard {shard}: {}", e.message),
        }
        if Instant::now() >= until {
            tracing::warn!("shard {shard} did not take a transaction's decision; recovery delivers it");
            return false;
        }
        tokio::time::sleep(DELIVERY_RETRY_PAUSE).await;
    }
}

/// A commit retried through a router that did not run the transaction: follow the
/// coordinator's record if there is one (waiting for a running coordinator's decision, or
/// deciding abort for an abandoned one). None: no record (no two-phase commit runs for it).
pub async fn recover_for_client(router: &Router, lsid: &[u8], txn_number: i64) -> Result<Option<Result<Document>>> {
    let id = record_id(lsid, txn_number);
    let until = Instant::now() + DECISION_WAIT_MAX;
    loop {
        let Some(record) = router.config_find(COORDINATORS, doc! {"_id": id.clone()}, doc! {}).await?.into_iter().next() else { return Ok(None) };
        let decided = match Decision::from_record(&record) {
            Some(d) => Some(d),
            None if is_abandoned(&record) || Instant::now() >= until => Some(decide(router, &id, Decision::Abort).await?),
            None => None,
        };
        if let Some(decided) = decided {
            finish(router, &id, &participants_of(&record), &decided).await;
            return Ok(Some(answer(&decided, None)));
        }
        tokio::time::sleep(DECISION_POLL).await;
    }
}

fn participants_of(record: &Document) -> Vec<String> {
    record.get_array("participants").map(|a| a.iter().filter_map(Bson::as_str).map(str::to_string).collect()).unwrap_or_default()
}

fn is_abandoned(record: &Document) -> bool {
    super::migrate::is_older_than(record.get_datetime("started").ok(), COORDINATOR_LEASE)
}

/// Finish the records older than `COORDINATOR_LEASE`: their router died or could not
/// deliver. Undecided ones are aborted.
pub async fn recover_abandoned(router: &Router) -> Result<()> {
    for record in router.config_find(COORDINATORS, doc! {}, doc! {}).await? {
        if !is_abandoned(&record) {
            continue;
        }
        let Ok(id) = record.get_document("_id").cloned() else { continue };
        let decided = match Decision::from_record(&record) {
            Some(d) => d,
            None => decide(router, &id, Decision::Abort).await?,
        };
        finish(router, &id, &participants_of(&record), &decided).await;
    }
    Ok(())
}
