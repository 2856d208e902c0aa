//! Transactions through the router, as mongos runs them: the router follows each session's
//! transaction number and its participants. A statement runs through the router's ordinary
//! handler for its command, which targets and merges as outside a transaction; each send
//! to a shard passes through `on_shard`, which makes it the transaction's statement there
//! (the client's `lsid`, `txnNumber` and `autocommit`; on the shard's first, also
//! `startTransaction` and the transaction's `readConcern`) and notes the shard as a
//! participant, and a write shard if the statement writes.
//!
//! - **One point for every shard.** At readConcern "snapshot" every participant reads at
//!   the transaction's `atClusterTime`: the client's, or the router's cluster time when the
//!   first statement ran. (At "local" and "majority" each reads its own newest, as mongos.)
//! - **Stale routing.** A shard that answers StaleConfig to the statement that began the
//!   transaction there ran nothing: it stops being a participant and the statement goes
//!   again (to whichever shard now owns what it names). A participant that had run earlier
//!   statements is not sent it again (its snapshot may miss what moved to it since): the
//!   error ends the statement, and the client runs the transaction again
//!   (TransientTransactionError).
//! - **The commit.** The commit ends the read-only participants first. A transaction that
//!   wrote on one shard then commits there, whose commit is the transaction's (mongos's
//!   single-write-shard commit); one that wrote on several commits by two-phase commit
//!   (`coordinator`).
//!
//! Every reply carries the `recoveryToken` (the first write shard, else the first
//! participant), so that a commit sent to another router after this one failed still
//! reaches the transaction: through the coordinator's record if it has one, else through
//! that shard.

use super::commands::{forwarded, stale_backoff, timeout_of, STALE_RETRIES_MAX};
use super::{Router, RouterConn};
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use net::pool::reply_result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use wire::Request;

/// Sessions whose transaction the router follows (mongod's logical session cache bound).
pub const SESSIONS_MAX: usize = 1_000_000;

/// Every session's transaction, as the router sees it.
#[derive(Default)]
pub struct RouterTxns {
    sessions: Mutex<HashMap<Vec<u8>, Arc<tokio::sync::Mutex<Session>>>>,
    /// serverStatus's `transactions` counters.
    started: AtomicU64,
    committed: AtomicU64,
    aborted: AtomicU64,
    /// By `COMMIT_TYPES`: commits initiated, successful, and the successful ones' time.
    commits: [[AtomicU64; 3]; COMMIT_TYPES.len()],
}

/// mongos's kinds of commit (serverStatus `transactions.commitTypes`).
const COMMIT_TYPES: [&str; 6] = ["noShards", "singleShard", "singleWriteShard", "readOnly", "twoPhaseCommit", "recoverWithToken"];

#[derive(Default)]
struct Session {
    txn_number: i64,
    /// The shards the transaction runs on, in the order statements reached them.
    participants: Vec<String>,
    /// The shards it wrote on, in the order of their first write.
    write_shards: Vec<String>,
    /// The first statement's readConcern, with the point every participant reads at.
    read_concern: Option<Document>,
    /// A two-phase commit's answer, which a retried commit gets again.
    committed: Option<Result<Document>>,
}

impl Session {
    fn new(txn_number: i64) -> Session {
        Session { txn_number, ..Default::default() }
    }

    /// The shard a recovery token names: the first write shard, else the first participant.
    fn recovery_shard(&self) -> Option<&String> {
        self.write_shards.first().or(self.participants.first())
    }
}

/// Statements that write (their shard becomes the write shard): creating a collection or an
/// index in a transaction is a write too.
fn writes(name: &str) -> bool {
    matches!(name, "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "create" | "createIndexes")
}

impl RouterTxns {
    fn session(&self, lsid: &[u8]) -> Result<Arc<tokio::sync::Mutex<Session>>> {
        let mut sessions = self.sessions.lock();
        if let Some(s) = sessions.get(lsid) {
            return Ok(s.clone());
        }
        if sessions.len() >= SESSIONS_MAX {
            sessions.retain(|_, s| Arc::strong_count(s) > 1);
            if sessions.len() >= SESSIONS_MAX {
                return Err(Error::new(Code::TooManyLogicalSessions, format!("cannot follow transactions of more than {SESSIONS_MAX} sessions")));
            }
        }
        let s = Arc::new(tokio::sync::Mutex::new(Session::new(-1)));
        sessions.insert(lsid.to_vec(), s.clone());
        Ok(s)
    }

    /// serverStatus's `transactions` section, in mongos's shape.
    pub fn status(&self) -> Document {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed) as i64;
        let mut types = Document::new();
        for (name, [initiated, successful, micros]) in COMMIT_TYPES.iter().zip(&self.commits) {
            types.insert(*name, doc! {"initiated": n(initiated), "successful": n(successful), "successfulDurationMicros": n(micros)});
        }
        doc! {
            "currentOpen": self.sessions.lock().len() as i64,
            "totalStarted": n(&self.started),
            "totalCommitted": n(&self.committed),
            "totalAborted": n(&self.aborted),
            "commitTypes": types,
        }
    }

    /// Forget ended sessions.
    pub fn end_sessions(&self, lsids: &[Vec<u8>]) {
        let mut sessions = self.sessions.lock();
        for l in lsids {
            sessions.remove(l);
        }
    }
}

/// Whether `req` is a statement of a transaction.
pub fn is_statement(req: &Request) -> bool {
    req.body.contains_key("autocommit") || req.body.contains_key("startTransaction")
}

/// Run a transaction's statement (`is_statement`).
pub async fn run(router: &Router, conn: &mut RouterConn, row: &super::table::Row, req: &Request) -> Result<Document> {
    let lsid = match req.body.get_document("lsid").ok().and_then(|l| l.get("id")) {
        Some(Bson::Binary(b)) => b.bytes.clone(),
        _ => return Err(Error::new(Code::InvalidOptions, "Transaction number requires a session ID to also be specified")),
    };
    let txn_number = match req.body.get("txnNumber") {
        Some(Bson::Int64(n)) => *n,
        Some(_) => return Err(Error::type_mismatch("BSON field 'txnNumber' is the wrong type, expected type 'long'")),
        None => return Err(Error::new(Code::InvalidOptions, "'autocommit' field requires a transaction number to also be specified")),
    };
    let session = router.txns.session(&lsid)?;
    let mut s = session.lock().await;
    let start = matches!(req.body.get("startTransaction"), Some(Bson::Boolean(true)));
    if txn_number < s.txn_number {
        return Err(Error::new(
            Code::TransactionTooOld,
            format!("Cannot start transaction {txn_number} on session because a newer transaction {} has already started.", s.txn_number),
        ));
    }
    if start && txn_number > s.txn_number {
        *s = Session::new(txn_number);
        router.txns.started.fetch_add(1, Ordering::Relaxed);
        let mut rc = req.body.get_document("readConcern").cloned().unwrap_or_default();
        if rc.get_str("level").ok() == Some("snapshot") && !rc.contains_key("atClusterTime") {
            let t = router.pool.cluster_time().ok_or_else(|| Error::new(Code::SnapshotUnavailable, "the router knows no cluster time yet; please retry"))?;
            // A causally consistent session's point is at or after what it saw (and the
            // point replaces afterClusterTime, which a shard does not take beside it).
            let t = match rc.remove("afterClusterTime") {
                Some(Bson::Timestamp(after)) => t.max(after),
                _ => t,
            };
            rc.insert("atClusterTime", t);
        }
        s.read_concern = (!rc.is_empty()).then_some(rc);
    }
    match req.name.as_str() {
        "commitTransaction" => {
            let kind = match (txn_number == s.txn_number, s.participants.len(), s.write_shards.len()) {
                (false, _, _) => 5,
                (true, 0, _) => 0,
                (true, 1, _) => 1,
                (true, _, 0) => 3,
                (true, _, 1) => 2,
                (true, _, _) => 4,
            };
            let counters = &router.txns.commits[kind];
            counters[0].fetch_add(1, Ordering::Relaxed);
            let began = std::time::Instant::now();
            let r = end(router, req, &mut s, &lsid, txn_number).await;
            match &r {
                Ok(_) => {
                    counters[1].fetch_add(1, Ordering::Relaxed);
                    counters[2].fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
                    router.txns.committed.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.code == Code::NoSuchTransaction.0 => {
                    router.txns.aborted.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {}
            }
            r
        }
        "abortTransaction" => {
            router.txns.aborted.fetch_add(1, Ordering::Relaxed);
            end(router, req, &mut s, &lsid, txn_number).await
        }
        // Cursors remember their shard.
        "getMore" => super::commands::get_more(router, req).await,
        "killCursors" => super::commands::kill_cursors(router, req).await,
        _ => statement(router, conn, row, req, &mut s).await,
    }
}

/// commitTransaction or abortTransaction.
async fn end(router: &Router, req: &Request, s: &mut Session, lsid: &[u8], txn_number: i64) -> Result<Document> {
    // The participant, or the one a recovery token names (a commit retried through
    // another router).
    let token = req.body.get_document("recoveryToken").ok().and_then(|t| t.get_str("recoveryShardId").ok()).map(str::to_string);
    let known = if txn_number == s.txn_number { s.recovery_shard().cloned() } else { None };
    // Read-only participants end first (an abort ends them all). A read-only participant's
    // commit waits for its write concern, which makes what the transaction read there
    // majority-committed (a primary cut off from its set may have shown writes it will roll
    // back): the transaction commits only once each of them did.
    if known.is_some() {
        let others: Vec<String> = s.participants.iter().filter(|p| Some(*p) != known.as_ref() && !s.write_shards.contains(p)).cloned().collect();
        let ended = end_participants(router, req, &others).await;
        if req.name == "commitTransaction" {
            if let Some(failed) = ended? {
                return Ok(failed);
            }
        }
        if s.write_shards.len() > 1 {
            return match req.name.as_str() {
                "commitTransaction" => {
                    if let Some(answer) = &s.committed {
                        return answer.clone();
                    }
                    let answer = super::coordinator::commit(router, lsid, txn_number, &s.write_shards).await;
                    // A network error to the config servers leaves the outcome open: a
                    // retry asks again.
                    if answer.as_ref().is_ok() || answer.as_ref().is_err_and(|e| e.code == Code::NoSuchTransaction.0) {
                        s.committed = Some(answer.clone());
                    }
                    answer
                }
                _ => {
                    let rest: Vec<String> = s.write_shards[1..].to_vec();
                    let _ = end_participants(router, req, &rest).await;
                    end_one(router, req, known.as_deref().unwrap_or_default()).await
                }
            };
        }
    } else if req.name == "commitTransaction" {
        // Not this router's transaction: a two-phase commit's record decides it.
        if let Some(answer) = super::coordinator::recover_for_client(router, lsid, txn_number).await? {
            return answer;
        }
    }
    let shard = known.clone().or(token);
    let Some(shard) = shard else {
        return match req.name.as_str() {
            // A transaction that reached no shard has nothing to commit.
            "commitTransaction" if txn_number == s.txn_number => Ok(Document::new()),
            _ => Err(Error::new(Code::NoSuchTransaction, format!("Transaction {txn_number} has been aborted or was never started."))),
        };
    };
    let mut body = forwarded(req);
    body.remove("recoveryToken");
    if known.is_none() && req.name == "commitTransaction" {
        // Not this router's transaction: ask its shard for the decision, which
        // aborts it if none was made (mongos's commit recovery).
        let mut recover = doc! {"coordinateCommitTransaction": 1, "participants": []};
        body.remove("commitTransaction");
        recover.extend(body);
        body = recover;
    }
    let set = router.shard(&shard).await?;
    let (_, reply) = router.pool.run(&set, "admin", body, None, timeout_of(req)).await?;
    reply_result(reply)
}

tokio::task_local! {
    /// The transaction of the statement the running task sends to the shards.
    static STATEMENT: Arc<Mutex<Scope>>;
}

/// What the sends of a statement need of its transaction, and what they add to it.
#[derive(Default)]
struct Scope {
    participants: Vec<String>,
    write_shards: Vec<String>,
    read_concern: Option<Document>,
    /// The statement writes: each shard it reaches becomes a write shard.
    writes: bool,
    /// A participant that had run earlier statements answered that the routing is stale:
    /// the statement is not sent again, and this is its answer.
    stale: Option<Error>,
}

/// A send of a statement to a shard, for `answered`.
pub(crate) struct Sent {
    shard: String,
    first_here: bool,
    new_write_shard: bool,
}

/// Make `body` the running transaction's statement for `shard`, if a task runs one
/// (`statement`): the shard's first starts the transaction there, at the transaction's
/// point. `None` outside a transaction.
pub(crate) fn on_shard(shard: &str, body: &mut Document) -> Option<Sent> {
    STATEMENT
        .try_with(|scope| {
            let mut s = scope.lock();
            let first_here = !s.participants.iter().any(|p| p == shard);
            let new_write_shard = s.writes && !s.write_shards.iter().any(|p| p == shard);
            // Recorded before it is sent: a write whose reply is lost may have happened there.
            if new_write_shard {
                s.write_shards.push(shard.to_string());
            }
            if first_here {
                body.insert("startTransaction", true);
                match &s.read_concern {
                    Some(rc) => {
                        if let Ok(t) = rc.get_timestamp("atClusterTime") {
                            super::commands::gossip_cluster_time(body, t);
                        }
                        body.insert("readConcern", rc.clone());
                    }
                    None => {
                        body.remove("readConcern");
                    }
                }
                s.participants.push(shard.to_string());
            } else {
                body.remove("startTransaction");
                body.remove("readConcern");
            }
            Sent { shard: shard.to_string(), first_here, new_write_shard }
        })
        .ok()
}

/// Note a shard's answer to `sent` (its error, if it failed). A shard that answered stale
/// to the statement that began the transaction there ran nothing: it is no participant.
pub(crate) fn answered(sent: Option<Sent>, error: Option<&Error>) {
    let (Some(sent), Some(e)) = (sent, error) else { return };
    if !super::commands::is_stale_code(e.code) {
        return;
    }
    let _ = STATEMENT.try_with(|scope| {
        let mut s = scope.lock();
        if sent.first_here {
            s.participants.retain(|p| *p != sent.shard);
            if sent.new_write_shard {
                s.write_shards.retain(|p| *p != sent.shard);
            }
        } else if s.stale.is_none() {
            s.stale = Some(e.clone());
        }
    });
}

/// Whether a statement may be sent again after a stale answer: always outside a
/// transaction; in one, unless a participant that had run earlier statements gave it.
pub(crate) fn may_retry_stale() -> bool {
    STATEMENT.try_with(|scope| scope.lock().stale.is_none()).unwrap_or(true)
}

/// A statement before the transaction's end, through the command's own handler with each
/// send to a shard made the transaction's (`on_shard`).
async fn statement(router: &Router, conn: &mut RouterConn, row: &super::table::Row, req: &Request, s: &mut Session) -> Result<Document> {
    let txn_number = req.body.get_i64("txnNumber").unwrap_or_default();
    if txn_number != s.txn_number {
        return Err(Error::new(Code::NoSuchTransaction, format!("Transaction {txn_number} has been aborted or was never started.")));
    }
    if !common::server::allowed_in_transaction(&req.name) {
        return Err(Error::new(Code::OperationNotSupportedInTransaction, format!("Cannot run '{}' in a multi-document transaction.", req.name)));
    }
    let scope = Arc::new(Mutex::new(Scope {
        participants: std::mem::take(&mut s.participants),
        write_shards: std::mem::take(&mut s.write_shards),
        read_concern: s.read_concern.clone(),
        writes: writes(&req.name),
        stale: None,
    }));
    let mut attempt = 0;
    let answer = loop {
        let r = STATEMENT.scope(scope.clone(), (row.run)(router, conn, req)).await;
        match r {
            // An unsharded collection's database moved: its primary shard ran nothing.
            Err(e) if e.code == Code::StaleDbVersion.0 && scope.lock().stale.is_none() && attempt < STALE_RETRIES_MAX => {
                attempt += 1;
                router.forget_database(&req.db);
                tokio::time::sleep(stale_backoff(attempt)).await;
            }
            r => break r,
        }
    };
    let scope = std::mem::take(&mut *scope.lock());
    s.participants = scope.participants;
    s.write_shards = scope.write_shards;
    // A write's stale answer from a participant comes back as a write error: in a
    // transaction it is the statement's error, which the client sees as transient.
    let mut reply = match (answer, scope.stale) {
        (Err(e), _) | (Ok(_), Some(e)) => return Err(e),
        (Ok(reply), None) => reply,
    };
    if let Some(recovery) = s.recovery_shard() {
        reply.insert("recoveryToken", doc! {"recoveryShardId": recovery.clone()});
    }
    Ok(reply)
}

/// End the transaction on `shard` with the client's command (abort), answering its reply.
async fn end_one(router: &Router, req: &Request, shard: &str) -> Result<Document> {
    let mut body = forwarded(req);
    body.remove("recoveryToken");
    let set = router.shard(shard).await?;
    let (_, reply) = router.pool.run(&set, "admin", body, None, timeout_of(req)).await?;
    reply_result(reply)
}

/// End the transaction on `shards` with the client's command (commit or abort): read-only
/// participants. The first error, or else the first reply with a write concern error.
async fn end_participants(router: &Router, req: &Request, shards: &[String]) -> Result<Option<Document>> {
    let ends = shards.iter().map(|shard| async move {
        let mut body = forwarded(req);
        body.remove("recoveryToken");
        let set = router.shard(shard).await?;
        reply_result(router.pool.run(&set, "admin", body, None, timeout_of(req)).await?.1)
    });
    let mut failed = None;
    for r in futures_util::future::join_all(ends).await {
        match r {
            Err(e) => return Err(e),
            Ok(reply) if reply.contains_key("writeConcernError") => failed = failed.or(Some(reply)),
            Ok(_) => {}
        }
    }
    Ok(failed)
}
