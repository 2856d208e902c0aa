//! Connections to replica sets (a router's to its shards and config servers): each set's
//! primary, found by asking its members, and a pool of idle connections per host.

use crate::peer::PeerConn;
use bson::{doc, Bson, Document, RawDocumentBuf};
use common::{Code, Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a command on a shard may take when the client set no maxTimeMS: an index build
/// or a scan of a large collection runs long, a stopped shard must not hold the client forever.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);
/// Idle connections kept per host; more are opened when needed and closed when returned.
const IDLE_PER_HOST_MAX: usize = 64;
/// How long a command waits for a set that has no primary (mongos's server selection
/// timeout).
const PRIMARY_WAIT: Duration = Duration::from_secs(20);
const PRIMARY_RETRY: Duration = Duration::from_millis(200);
/// Hosts in a connection string.
const HOSTS_MAX: usize = 50;

/// A replica set as a connection string names it: `set/host1:port,host2:port`.
pub struct ReplicaSet {
    /// As given (config.shards `host`).
    pub conn_string: String,
    pub set_name: String,
    pub hosts: Vec<String>,
    /// The member last found primary.
    primary: Mutex<Option<String>>,
    /// Whether its primary was told its shard identity (`_addShard`) since it last answered
    /// ShardingStateNotInitialized.
    pub identity_sent: std::sync::atomic::AtomicBool,
}

impl ReplicaSet {
    pub fn parse(conn_string: &str) -> Result<ReplicaSet> {
        let bad = |why: &str| Error::new(Code::FailedToParse, format!("invalid replica set connection string '{conn_string}': {why}"));
        let (set_name, hosts) =
            conn_string.split_once('/').ok_or_else(|| bad("expected <setName>/<host:port>[,<host:port>...] (shards and config servers are replica sets)"))?;
        if set_name.is_empty() {
            return Err(bad("empty set name"));
        }
        let hosts: Vec<String> = hosts.split(',').map(|h| h.trim().to_string()).collect();
        if hosts.is_empty() || hosts.len() > HOSTS_MAX || hosts.iter().any(|h| h.is_empty() || !h.contains(':')) {
            return Err(bad("every host needs a port"));
        }
        Ok(ReplicaSet {
            conn_string: conn_string.to_string(),
            set_name: set_name.to_string(),
            hosts,
            primary: Mutex::new(None),
            identity_sent: Default::default(),
        })
    }

    fn forget_primary(&self, host: &str) {
        let mut p = self.primary.lock();
        if p.as_deref() == Some(host) {
            *p = None;
        }
    }
}

/// Idle connections by host.
#[derive(Default)]
pub struct Pool {
    idle: Mutex<HashMap<String, Vec<PeerConn>>>,
    /// The newest `$clusterTime` any reply carried (`secs << 32 | inc`): the cluster time of
    /// whoever holds the pool, as mongos keeps its own from what its shards tell it.
    cluster_time: std::sync::atomic::AtomicU64,
}

/// Errors after which a set's primary must be looked up again.
fn is_not_primary(code: i32) -> bool {
    matches!(code, 10107 | 13435 | 13436 | 11600 | 11602 | 189 | 91)
}

fn is_network(e: &Error) -> bool {
    e.code == Code::HostUnreachable.0 || e.code == Code::NetworkTimeout.0
}

fn reply_code(reply: &Document) -> Option<i32> {
    let ok =
        matches!(reply.get("ok"), Some(Bson::Double(v)) if *v == 1.0) || matches!(reply.get("ok"), Some(Bson::Int32(1) | Bson::Int64(1) | Bson::Boolean(true)));
    if ok {
        None
    } else {
        Some(reply.get_i32("code").unwrap_or(Code::UnknownError.0))
    }
}

impl Pool {
    async fn checkout(&self, host: &str) -> Result<PeerConn> {
        let idle = self.idle.lock().get_mut(host).and_then(Vec::pop);
        match idle {
            Some(c) => Ok(c),
            None => PeerConn::connect(host, CONNECT_TIMEOUT).await,
        }
    }

    fn checkin(&self, conn: PeerConn) {
        if conn.is_broken() {
            return;
        }
        let mut idle = self.idle.lock();
        let list = idle.entry(conn.host.clone()).or_default();
        if list.len() < IDLE_PER_HOST_MAX {
            list.push(conn);
        }
    }

    /// Run a command on `host` and return its reply, `ok: 0` included.
    pub async fn run_on_host(&self, host: &str, db: &str, body: Document, sequence: Option<&wire::RawSequence<'_>>, timeout: Duration) -> Result<Document> {
        decode(self.run_on_host_raw(host, db, body, sequence, timeout).await?)
    }

    /// `run_on_host` with the reply as BSON.
    pub async fn run_on_host_raw(
        &self,
        host: &str,
        db: &str,
        mut body: Document,
        sequence: Option<&wire::RawSequence<'_>>,
        timeout: Duration,
    ) -> Result<RawDocumentBuf> {
        self.gossip_out(&mut body);
        let mut conn = self.checkout(host).await?;
        let r = conn.command_reply_raw(db, body, sequence, timeout).await;
        self.checkin(conn);
        if let Ok(reply) = &r {
            self.note_cluster_time(reply);
        }
        r
    }

    fn note_cluster_time(&self, reply: &bson::RawDocument) {
        if let Ok(t) = reply.get_document("$clusterTime").and_then(|c| c.get_timestamp("clusterTime")) {
            self.cluster_time.fetch_max(common::optime::ts_value(t), std::sync::atomic::Ordering::Relaxed);
        }
        if let Ok(t) = reply.get_timestamp("operationTime") {
            let _ = OPERATION_TIME.try_with(|newest| newest.set(newest.get().max(common::optime::ts_value(t))));
        }
    }

    /// Learn a cluster time a client told (checked by `common::optime::gossiped_cluster_time`).
    pub fn gossip_in(&self, t: bson::Timestamp) {
        self.cluster_time.fetch_max(common::optime::ts_value(t), std::sync::atomic::Ordering::Relaxed);
    }

    /// `body` carrying this pool's cluster time, unless it carries a newer one: every
    /// command tells the process it reaches the newest time this one knows, as mongos and
    /// mongod gossip it, so a write there is stamped after every point read through here.
    fn gossip_out(&self, body: &mut Document) {
        let Some(t) = self.cluster_time() else { return };
        let carried = body.get_document("$clusterTime").ok().and_then(|c| c.get_timestamp("clusterTime").ok());
        if carried.is_none_or(|c| common::optime::ts_value(c) < common::optime::ts_value(t)) {
            body.insert("$clusterTime", common::optime::cluster_time_doc(t));
        }
    }

    /// The newest cluster time a reply through this pool carried, if any did.
    pub fn cluster_time(&self) -> Option<bson::Timestamp> {
        let t = self.cluster_time.load(std::sync::atomic::Ordering::Relaxed);
        (t > 0).then(|| common::optime::ts_of(t))
    }

    /// The set's primary: the member last found, or the one its members name now. While
    /// they name none (an election), asks again for up to `PRIMARY_WAIT`, as mongos waits
    /// for a shard's new primary rather than fail at once.
    pub async fn primary(&self, set: &ReplicaSet) -> Result<String> {
        if let Some(p) = set.primary.lock().clone() {
            return Ok(p);
        }
        let deadline = tokio::time::Instant::now() + PRIMARY_WAIT;
        loop {
            match self.find_primary(set).await {
                Ok(p) => return Ok(p),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(PRIMARY_RETRY).await,
            }
        }
    }

    async fn find_primary(&self, set: &ReplicaSet) -> Result<String> {
        let mut last_error = None;
        for host in &set.hosts {
            match self.run_on_host(host, "admin", doc! {"hello": 1}, None, CONNECT_TIMEOUT).await {
                Ok(reply) => {
                    if reply.get_str("setName").ok() != Some(set.set_name.as_str()) {
                        last_error = Some(format!("{host} is not a member of replica set {}", set.set_name));
                        continue;
                    }
                    let primary = if reply.get_bool("isWritablePrimary").unwrap_or(false) {
                        Some(host.clone())
                    } else {
                        reply.get_str("primary").ok().map(str::to_string)
                    };
                    if let Some(p) = primary {
                        *set.primary.lock() = Some(p.clone());
                        return Ok(p);
                    }
                    last_error = Some(format!("{host} knows no primary"));
                }
                Err(e) => last_error = Some(e.message),
            }
        }
        Err(Error::new(
            Code::FailedToSatisfyReadPreference,
            format!("Could not find host matching read preference {{ mode: \"primary\" }} for set {}: {}", set.set_name, last_error.unwrap_or_default()),
        ))
    }

    /// Run a command on the set's primary and return the host and its reply (`ok: 0`
    /// included). A primary that is no longer one, or cannot be reached before the command
    /// is sent, is looked up again and the command sent once more: it did not run.
    pub async fn run(
        &self,
        set: &ReplicaSet,
        db: &str,
        body: Document,
        sequence: Option<&wire::RawSequence<'_>>,
        timeout: Duration,
    ) -> Result<(String, Document)> {
        let (host, raw) = self.run_raw(set, db, body, sequence, timeout).await?;
        Ok((host, decode(raw)?))
    }

    /// `run` with the reply as BSON.
    pub async fn run_raw(
        &self,
        set: &ReplicaSet,
        db: &str,
        mut body: Document,
        sequence: Option<&wire::RawSequence<'_>>,
        timeout: Duration,
    ) -> Result<(String, RawDocumentBuf)> {
        self.gossip_out(&mut body);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let host = self.primary(set).await?;
            let mut conn = match self.checkout(&host).await {
                Ok(c) => c,
                Err(e) => {
                    set.forget_primary(&host);
                    if attempts < 2 && is_network(&e) {
                        continue;
                    }
                    return Err(e);
                }
            };
            let r = conn.command_reply_raw(db, body.clone(), sequence, timeout).await;
            self.checkin(conn);
            if let Ok(reply) = &r {
                self.note_cluster_time(reply);
            }
            match r {
                Ok(reply) => match raw_reply_code(&reply) {
                    // NotWritablePrimary and its kin are answered before a command runs.
                    Some(code) if is_not_primary(code) => {
                        set.forget_primary(&host);
                        if attempts < 2 && matches!(code, 10107 | 13435) {
                            continue;
                        }
                        return Ok((host, reply));
                    }
                    _ => return Ok((host, reply)),
                },
                Err(e) => {
                    if is_network(&e) {
                        set.forget_primary(&host);
                    }
                    return Err(e);
                }
            }
        }
    }
}

pub fn decode(raw: RawDocumentBuf) -> Result<Document> {
    Document::try_from(raw.as_ref()).map_err(|e| Error::new(Code::InvalidBSON, format!("invalid BSON in a reply: {e}")))
}

/// The error a raw reply carries, if it is not ok.
pub fn raw_error(reply: &RawDocumentBuf) -> Option<Error> {
    raw_reply_code(reply)?;
    Some(match decode(reply.clone()).and_then(reply_result) {
        Err(e) => e,
        Ok(_) => Error::new(Code::UnknownError, "a reply without ok:1"),
    })
}

fn raw_reply_code(reply: &bson::RawDocument) -> Option<i32> {
    if crate::peer::is_ok(reply) {
        None
    } else {
        Some(reply.get_i32("code").unwrap_or(Code::UnknownError.0))
    }
}

tokio::task_local! {
    /// The newest `operationTime` of the replies a command's sends got (a router's reply
    /// carries it, as mongos's: causally consistent sessions chain their next reads on it).
    static OPERATION_TIME: std::cell::Cell<u64>;
}

/// Run `f`, with the newest `operationTime` its sends through any pool got, if any did.
pub async fn with_operation_time<F: std::future::Future>(f: F) -> (F::Output, Option<bson::Timestamp>) {
    let newest = std::cell::Cell::new(0);
    let (out, newest) = OPERATION_TIME
        .scope(newest, async {
            let out = f.await;
            (out, OPERATION_TIME.with(|n| n.get()))
        })
        .await;
    (out, (newest > 0).then(|| common::optime::ts_of(newest)))
}

/// A reply's error as an `Error` with its code, name and extra fields; `Ok` for ok:1.
pub fn reply_result(reply: Document) -> Result<Document> {
    let Some(code) = reply_code(&reply) else { return Ok(reply) };
    let name = reply.get_str("codeName").unwrap_or("UnknownError").to_string();
    let msg = reply.get_str("errmsg").unwrap_or("").to_string();
    let mut extra = Document::new();
    for (k, v) in &reply {
        if !matches!(k.as_str(), "ok" | "errmsg" | "code" | "codeName" | "$clusterTime" | "operationTime") {
            extra.insert(k.clone(), v.clone());
        }
    }
    let e = Error::remote(code, &name, msg);
    Err(if extra.is_empty() { e } else { e.with_extra(extra) })
}

/// Every document of `config.<coll>` on the config servers `config` matching `filter`, in
/// `sort` order, read from their primary (routers and shards read their metadata so); at most
/// `docs_max` of them.
pub async fn config_find(pool: &Pool, config: &ReplicaSet, coll: &str, filter: Document, sort: Document, docs_max: usize) -> Result<Vec<Document>> {
    let (host, reply) = pool.run(config, "config", doc! {"find": coll, "filter": filter, "sort": sort, "batchSize": 10_000}, None, COMMAND_TIMEOUT).await?;
    let reply = reply_result(reply)?;
    let (mut id, mut docs) = crate::peer::cursor_batch(&reply, "firstBatch")?;
    while id != 0 {
        if docs.len() > docs_max {
            let _ = pool.run_on_host(&host, "config", doc! {"killCursors": coll, "cursors": [id]}, None, COMMAND_TIMEOUT).await;
            return Err(Error::internal(format!("config.{coll} holds more than {docs_max} matching documents")));
        }
        let reply =
            reply_result(pool.run_on_host(&host, "config", doc! {"getMore": id, "collection": coll, "batchSize": 10_000}, None, COMMAND_TIMEOUT).await?)?;
        let (next, more) = crate::peer::cursor_batch(&reply, "nextBatch")?;
        id = next;
        docs.extend(more);
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_name_a_set_and_its_hosts() {
        let s = ReplicaSet::parse("rs0/127.0.0.1:27018,127.0.0.2:27018").unwrap();
        assert_eq!(s.set_name, "rs0");
        assert_eq!(s.hosts, vec!["127.0.0.1:27018", "127.0.0.2:27018"]);
        for bad in ["127.0.0.1:27018", "/h:1", "rs0/", "rs0/h", "rs0/h:1,"] {
            assert_eq!(ReplicaSet::parse(bad).err().map(|e| e.code), Some(Code::FailedToParse.0), "{bad}");
        }
    }

    #[test]
    fn a_replys_error_keeps_its_code_and_fields() {
        let e = reply_result(doc! {"ok": 0.0, "errmsg": "dup", "code": 11000, "codeName": "DuplicateKey", "keyValue": {"a": 1}}).unwrap_err();
        assert_eq!((e.code, e.code_name), (11000, "DuplicateKey"));
        assert_eq!(e.extra.unwrap().get_document("keyValue").unwrap(), &doc! {"a": 1});
        assert!(reply_result(doc! {"ok": 1.0, "n": 1}).is_ok());
    }
}
