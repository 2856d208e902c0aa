//! Router cursors: one per client query, over the cursors it opened on the shards it
//! targeted. With a sort, the shards' sorted streams are merged (each shard sorted its own);
//! without one, batches are taken as they come. The router applies skip and limit after the
//! merge (each shard was asked for skip + limit and no skip) and a projection it kept back
//! from the shards (a sort on a field the projection drops needs the field to merge).

use bson::{doc, Document, RawDocumentBuf};
use common::{Code, Error, Result};
use net::pool::{raw_error, Pool, COMMAND_TIMEOUT};
use parking_lot::Mutex;
use query::projection::Projection;
use query::sort::SortSpec;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A reply's batch stays under this many bytes of documents (mongod's 16 MiB).
pub const BATCH_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Open router cursors at most; a find beyond it is refused, not queued.
const CURSORS_MAX: usize = 100_000;
/// Idle cursors are killed after this long (mongos's cursorTimeoutMillis default, 10 min).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// One shard's cursor.
pub struct Stream {
    pub host: String,
    pub db: String,
    pub coll: String,
    pub id: i64,
    /// Fetched documents and their sizes in bytes.
    pub buf: VecDeque<(Document, usize)>,
    /// The point a snapshot read read at (`cursor.atClusterTime` of the shard's reply).
    pub at_cluster_time: Option<bson::Timestamp>,
}

impl Stream {
    /// The stream of a shard's cursor reply (`firstBatch`).
    pub fn from_reply(host: String, db: &str, reply: &RawDocumentBuf) -> Result<Stream> {
        let (id, coll, buf) = raw_batch(reply, "firstBatch")?;
        let coll = if coll.is_empty() { String::new() } else { coll };
        let at_cluster_time = reply.get_document("cursor").ok().and_then(|c| c.get_timestamp("atClusterTime").ok());
        Ok(Stream { host, db: db.to_string(), coll, id, buf, at_cluster_time })
    }

    fn has_more(&self) -> bool {
        !self.buf.is_empty() || self.id != 0
    }

    async fn fetch(&mut self, pool: &Pool) -> Result<()> {
        let reply = pool.run_on_host_raw(&self.host, &self.db, doc! {"getMore": self.id, "collection": &self.coll}, None, COMMAND_TIMEOUT).await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                self.id = 0;
                return Err(e);
            }
        };
        if let Some(e) = raw_error(&reply) {
            self.id = 0;
            return Err(e);
        }
        let (id, _, docs) = raw_batch(&reply, "nextBatch")?;
        self.id = id;
        self.buf.extend(docs);
        Ok(())
    }
}

/// A cursor reply's id, collection name (from `ns`) and batch with each document's size.
fn raw_batch(reply: &RawDocumentBuf, key: &str) -> Result<(i64, String, VecDeque<(Document, usize)>)> {
    let bad = || Error::new(Code::ProtocolError, "malformed cursor reply from a shard");
    let c = reply.get_document("cursor").map_err(|_| bad())?;
    let id = c.get_i64("id").map_err(|_| bad())?;
    let coll = c.get_str("ns").ok().and_then(|ns| ns.split_once('.')).map(|(_, c)| c.to_string()).unwrap_or_default();
    let mut out = VecDeque::new();
    for v in c.get_array(key).map_err(|_| bad())? {
        let d = v.map_err(|_| bad())?.as_document().ok_or_else(bad)?;
        out.push_back((Document::try_from(d).map_err(|_| bad())?, d.as_bytes().len()));
    }
    Ok((id, coll, out))
}

pub struct RouterCursor {
    pub ns: String,
    streams: Vec<Stream>,
    sort: Option<SortSpec>,
    skip: u64,
    /// Documents still to return, if limited.
    limit: Option<u64>,
    projection: Option<Projection>,
    last_used: Instant,
}

impl RouterCursor {
    pub fn new(ns: String, streams: Vec<Stream>, sort: Option<SortSpec>, skip: u64, limit: Option<u64>, projection: Option<Projection>) -> RouterCursor {
        RouterCursor { ns, streams, sort, skip, limit, projection, last_used: Instant::now() }
    }

    pub fn exhausted(&self) -> bool {
        self.limit == Some(0) || self.streams.iter().all(|s| !s.has_more())
    }

    /// Up to `docs_max` documents (and `BATCH_BYTES_MAX` bytes), fetching from the shards
    /// as the merge needs.
    pub async fn next_batch(&mut self, pool: &Pool, docs_max: usize) -> Result<Vec<Document>> {
        self.last_used = Instant::now();
        let mut out = Vec::new();
        let mut bytes = 0;
        while out.len() < docs_max && self.limit != Some(0) {
            // A sorted merge needs the head of every stream that has more; an unsorted one
            // any document, and fetches only when none is buffered.
            let starved: Vec<bool> = self.streams.iter().map(|s| s.buf.is_empty() && s.id != 0).collect();
            let must_fetch =
                if self.sort.is_some() { starved.iter().any(|s| *s) } else { self.streams.iter().all(|s| s.buf.is_empty()) && starved.iter().any(|s| *s) };
            if must_fetch {
                if !out.is_empty() && self.sort.is_none() {
                    break;
                }
                let fetches = self.streams.iter_mut().zip(&starved).filter(|(_, s)| **s).map(|(st, _)| st.fetch(pool));
                for r in futures_util::future::join_all(fetches).await {
                    r?;
                }
                continue;
            }
            let next = match &self.sort {
                Some(sort) => {
                    let mut best: Option<usize> = None;
                    for (i, s) in self.streams.iter().enumerate() {
                        let Some((d, _)) = s.buf.front() else { continue };
                        if best.is_none_or(|b| sort.compare(d, &self.streams[b].buf[0].0) == std::cmp::Ordering::Less) {
                            best = Some(i);
                        }
                    }
                    best
                }
                None => self.streams.iter().position(|s| !s.buf.is_empty()),
            };
            let Some(i) = next else { break };
            // A batch holds at least one document, and past that no more than
            // BATCH_BYTES_MAX: two documents near 16 MiB go in two batches.
            let size = self.streams[i].buf.front().map_or(0, |(_, size)| *size);
            if !out.is_empty() && bytes + size > BATCH_BYTES_MAX {
                break;
            }
            let Some((d, size)) = self.streams[i].buf.pop_front() else { break };
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            if let Some(l) = &mut self.limit {
                *l -= 1;
            }
            let d = match &self.projection {
                Some(p) => p.apply(&d, &query::filter::MatchDetails::default())?,
                None => d,
            };
            bytes += size;
            out.push(d);
        }
        Ok(out)
    }

    /// Kill the shards' cursors still open.
    pub async fn kill(&mut self, pool: &Pool) {
        let kills = self.streams.iter_mut().filter(|s| s.id != 0).map(|s| {
            let id = std::mem::take(&mut s.id);
            pool.run_on_host(&s.host, &s.db, doc! {"killCursors": &s.coll, "cursors": [id]}, None, COMMAND_TIMEOUT)
        });
        futures_util::future::join_all(kills).await;
    }
}

/// The router's open cursors by id.
#[derive(Default)]
pub struct Cursors {
    map: Mutex<HashMap<i64, Arc<tokio::sync::Mutex<RouterCursor>>>>,
}

impl Cursors {
    pub fn register(&self, cursor: RouterCursor) -> Result<i64> {
        let mut map = self.map.lock();
        if map.len() >= CURSORS_MAX {
            return Err(Error::new(Code::OperationFailed, format!("the router has {CURSORS_MAX} open cursors; close some first")));
        }
        loop {
            let id = (rand::random::<u64>() >> 2) as i64;
            if id != 0 && !map.contains_key(&id) {
                map.insert(id, Arc::new(tokio::sync::Mutex::new(cursor)));
                return Ok(id);
            }
        }
    }

    pub fn get(&self, id: i64) -> Option<Arc<tokio::sync::Mutex<RouterCursor>>> {
        self.map.lock().get(&id).cloned()
    }

    pub fn remove(&self, id: i64) -> Option<Arc<tokio::sync::Mutex<RouterCursor>>> {
        self.map.lock().remove(&id)
    }

    /// Cursors idle longer than `IDLE_TIMEOUT`, removed (the caller kills their shards' cursors).
    pub fn take_idle(&self) -> Vec<Arc<tokio::sync::Mutex<RouterCursor>>> {
        let mut map = self.map.lock();
        let idle: Vec<i64> = map.iter().filter(|(_, c)| c.try_lock().is_ok_and(|c| c.last_used.elapsed() > IDLE_TIMEOUT)).map(|(id, _)| *id).collect();
        idle.iter().filter_map(|id| map.remove(id)).collect()
    }
}
