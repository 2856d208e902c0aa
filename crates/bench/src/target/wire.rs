//! A lean MongoDB wire client for benchmarks: one TCP connection per worker, OP_MSG commands
//! shaped exactly as the official driver sends them for YCSB's and bench02's operations, and
//! replies read as raw BSON without building documents.
//!
//! Why: the official Rust driver spends about 40 µs of CPU per point read (server selection,
//! connection pool, session bookkeeping, typed reply parsing). On a 2-core machine where client
//! and server share the cores, that made the client the bottleneck at ~24k ops/s. This client
//! is the MongoDB counterpart of the PostgreSQL target's tokio-postgres: a thin protocol client.
//!
//! It serves a single-host `mongodb://host:port/db?…` URL without credentials or TLS; other
//! URLs (replica sets, several hosts, auth, TLS, SRV) go through the official driver, which
//! does server discovery and authentication (see `Connector::new`).

use super::mongo::{fields_doc, order_doc, projection, report_error, ycsb_doc};
use super::{BoxFuture, Order, Record, Target, ORDER_INDEXES};
use crate::ycsb::measure::Status;
use anyhow::{anyhow, bail, Context, Result};
use bson::{doc, oid::ObjectId, Bson, Document, RawDocument};
use mongodb::options::{ClientOptions, ReadPreference, SelectionCriteria};
use std::sync::atomic::{AtomicI32, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

const OP_MSG: i32 = 2013;
const HEADER_BYTES: usize = 16;
/// MongoDB's default maxMessageSizeBytes; a longer reply means a broken peer.
const MESSAGE_SIZE_MAX_BYTES: usize = 48_000_000;

static NEXT_REQUEST_ID: AtomicI32 = AtomicI32::new(1);

/// What the official driver would need that this client does not do: discovery, auth, TLS.
pub fn can_serve(options: &ClientOptions) -> bool {
    options.hosts.len() == 1
        && options.credential.is_none()
        && options.repl_set_name.is_none()
        && options.tls.as_ref().is_none_or(|t| matches!(t, mongodb::options::Tls::Disabled))
        && options.load_balanced != Some(true)
}

pub struct WireConnector {
    addr: String,
    db: String,
    /// `writeConcern` added to every write command (from w, journal, wtimeoutMS in the URL).
    write_concern: Option<Document>,
    /// `$readPreference` added to reads when the URL asks for other than primary.
    read_preference: Option<Document>,
    /// `readConcern` added to reads (readConcernLevel in the URL).
    read_concern: Option<Document>,
}

impl WireConnector {
    pub async fn new(options: ClientOptions, db: String) -> Result<WireConnector> {
        let addr = options.hosts[0].to_string();
        let write_concern = match &options.write_concern {
            Some(wc) => Some(bson::serialize_to_document(wc).context("writeConcern from URL")?).filter(|d| !d.is_empty()),
            None => None,
        };
        let mode = match &options.selection_criteria {
            Some(SelectionCriteria::ReadPreference(rp)) => match rp {
                ReadPreference::Primary => None,
                ReadPreference::Secondary { .. } => Some("secondary"),
                ReadPreference::PrimaryPreferred { .. } => Some("primaryPreferred"),
                ReadPreference::SecondaryPreferred { .. } => Some("secondaryPreferred"),
                ReadPreference::Nearest { .. } => Some("nearest"),
                other => bail!("unsupported read preference {other:?}"),
            },
            _ => None,
        };
        let read_concern = match &options.read_concern {
            Some(rc) => Some(bson::serialize_to_document(rc).context("readConcern from URL")?).filter(|d| !d.is_empty()),
            None => None,
        };
        let connector = WireConnector { addr, db, write_concern, read_preference: mode.map(|m| doc! {"mode": m}), read_concern };
        // Fail fast with a clear message instead of every operation failing.
        let mut conn = connector.connect().await?;
        conn.command(doc! {"ping": 1, "$db": "admin"}).await.with_context(|| format!("ping {}", connector.addr))?;
        Ok(connector)
    }

    async fn connect(&self) -> Result<Conn> {
        let stream = TcpStream::connect(&self.addr).await.with_context(|| format!("connect to {}", self.addr))?;
        stream.set_nodelay(true)?;
        Ok(Conn { stream, out: Vec::with_capacity(4096), reply: Vec::with_capacity(4096) })
    }

    /// One connection per worker, as YCSB threads each hold one pooled connection at a time.
    pub async fn session(&self) -> Result<WireTarget> {
        let conn = self.connect().await?;
        Ok(WireTarget {
            conn: Mutex::new(conn),
            lsid: bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: rand::random::<[u8; 16]>().to_vec() },
            txn_number: std::sync::atomic::AtomicI64::new(0),
            db: self.db.clone(),
            write_concern: self.write_concern.clone(),
            read_preference: self.read_preference.clone(),
            read_concern: self.read_concern.clone(),
        })
    }
}

impl WireConnector {
    /// Follow a change stream on `collection` (all its changes, from now) until `until`:
    /// `opened` is called once the stream is open, and `visit` sees each event as it arrives.
    /// Returns the number of events seen.
    pub async fn follow_changes(&self, collection: &str, until: std::time::Instant, opened: impl FnOnce(), mut visit: impl FnMut(&RawDocument)) -> Result<u64> {
        let mut conn = self.connect().await?;
        let mut events = 0u64;
        let open = doc! {"aggregate": collection, "pipeline": [{"$changeStream": {}}], "cursor": {}, "$db": self.db.as_str()};
        let reply = conn.command(open).await.context("open a change stream")?;
        let cursor = reply.get_document("cursor").context("aggregate reply without cursor")?;
        let id = cursor.get_i64("id").context("cursor id")?;
        for e in cursor.get_array("firstBatch").context("firstBatch")? {
            if let Some(e) = e?.as_document() {
                visit(e);
                events += 1;
            }
        }
        opened();
        while std::time::Instant::now() < until {
            let get_more = doc! {"getMore": id, "collection": collection, "maxTimeMS": 100i64, "$db": self.db.as_str()};
            let reply = conn.command(get_more).await.context("getMore of a change stream")?;
            let cursor = reply.get_document("cursor").context("getMore reply without cursor")?;
            for e in cursor.get_array("nextBatch").context("getMore reply without nextBatch")? {
                if let Some(e) = e?.as_document() {
                    visit(e);
                    events += 1;
                }
            }
            if cursor.get_i64("id").context("cursor id")? == 0 {
                bail!("the change stream ended (invalidated) after {events} events");
            }
        }
        let _ = conn.command(doc! {"killCursors": collection, "cursors": [id], "$db": self.db.as_str()}).await;
        Ok(events)
    }
}

struct Conn {
    stream: TcpStream,
    out: Vec<u8>,
    reply: Vec<u8>,
}

/// A command that failed: the server's `ok: 0`, a write error or a write concern error.
#[derive(Debug)]
struct CommandError {
    code: i32,
    message: String,
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for CommandError {}

impl Conn {
    /// Send one OP_MSG (flags 0, one body section) and return the reply body. A reply with
    /// `ok: 0`, `writeErrors` or `writeConcernError` is an error.
    async fn command(&mut self, body: Document) -> Result<&RawDocument> {
        self.out.clear();
        self.out.extend_from_slice(&[0u8; HEADER_BYTES]);
        self.out.extend_from_slice(&0u32.to_le_bytes()); // flagBits
        self.out.push(0); // section kind 0: the body
        body.to_writer(&mut self.out).context("encode command")?;
        let len = i32::try_from(self.out.len()).map_err(|_| anyhow!("command too large"))?;
        let request_id = NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed);
        self.out[0..4].copy_from_slice(&len.to_le_bytes());
        self.out[4..8].copy_from_slice(&request_id.to_le_bytes());
        self.out[12..16].copy_from_slice(&OP_MSG.to_le_bytes());
        self.stream.write_all(&self.out).await.context("send command")?;

        let mut prefix = [0u8; 4];
        self.stream.read_exact(&mut prefix).await.context("read reply")?;
        let reply_len = i32::from_le_bytes(prefix) as usize;
        if !(HEADER_BYTES + 5 + 5..=MESSAGE_SIZE_MAX_BYTES).contains(&reply_len) {
            bail!("bad reply length {reply_len}");
        }
        self.reply.clear();
        self.reply.resize(reply_len, 0);
        self.reply[..4].copy_from_slice(&prefix);
        self.stream.read_exact(&mut self.reply[4..]).await.context("read reply")?;
        let response_to = i32::from_le_bytes(self.reply[8..12].try_into().unwrap_or_default());
        let op_code = i32::from_le_bytes(self.reply[12..16].try_into().unwrap_or_default());
        if op_code != OP_MSG || response_to != request_id {
            bail!("unexpected reply (opCode {op_code}, responseTo {response_to}, expected {request_id})");
        }
        // flagBits (4 bytes), then section kind 0.
        if self.reply[HEADER_BYTES + 4] != 0 {
            bail!("reply does not start with a body section");
        }
        let reply = RawDocument::from_bytes(&self.reply[HEADER_BYTES + 5..]).context("reply body")?;
        check_reply(reply)?;
        Ok(reply)
    }
}

fn check_reply(reply: &RawDocument) -> Result<()> {
    let ok = match reply.get("ok")? {
        Some(v) => v.as_f64().or_else(|| v.as_i32().map(f64::from)).or_else(|| v.as_i64().map(|x| x as f64)).unwrap_or(0.0),
        None => 0.0,
    };
    let error = |d: &RawDocument| CommandError { code: d.get_i32("code").unwrap_or(0), message: d.get_str("errmsg").unwrap_or("(no errmsg)").to_string() };
    if ok != 1.0 {
        return Err(error(reply).into());
    }
    if let Ok(errors) = reply.get_array("writeErrors") {
        if let Some(Ok(first)) = errors.into_iter().next() {
            if let Some(d) = first.as_document() {
                return Err(error(d).into());
            }
        }
    }
    if let Ok(wce) = reply.get_document("writeConcernError") {
        return Err(error(wce).into());
    }
    Ok(())
}

pub struct WireTarget {
    conn: Mutex<Conn>,
    /// This worker's logical session, for transactions (the transfer benchmark).
    lsid: bson::Binary,
    txn_number: std::sync::atomic::AtomicI64,
    db: String,
    write_concern: Option<Document>,
    read_preference: Option<Document>,
    read_concern: Option<Document>,
}

impl WireTarget {
    fn write_command(&self, mut body: Document) -> Document {
        if let Some(wc) = &self.write_concern {
            body.insert("writeConcern", wc.clone());
        }
        body.insert("$db", self.db.as_str());
        body
    }

    fn read_command(&self, mut body: Document) -> Document {
        body.insert("$db", self.db.as_str());
        if let Some(rp) = &self.read_preference {
            body.insert("$readPreference", rp.clone());
        }
        if let Some(rc) = &self.read_concern {
            body.insert("readConcern", rc.clone());
        }
        body
    }

    /// Set `set` on document `_id: id` of `table` (upserted), acknowledged with the URL's
    /// write concern when this returns.
    pub async fn upsert_set(&self, table: &str, id: &str, set: Document) -> Result<()> {
        self.run(self.write_command(doc! {"update": table, "updates": [{"q": {"_id": id}, "u": {"$set": set}, "upsert": true}]})).await
    }

    /// Runs a command whose reply only matters for success.
    async fn run(&self, body: Document) -> Result<()> {
        self.conn.lock().await.command(body).await.map(|_| ())
    }

    /// find, then getMore until the cursor is exhausted; `visit` sees every document.
    async fn find_all(&self, table: &str, find: Document, mut visit: impl FnMut(&RawDocument)) -> Result<()> {
        let mut conn = self.conn.lock().await;
        let mut reply = conn.command(find).await?;
        let mut batch_key = "firstBatch";
        loop {
            let cursor = reply.get_document("cursor").context("find reply without cursor")?;
            for d in cursor.get_array(batch_key).context("cursor batch")? {
                if let Some(d) = d?.as_document() {
                    visit(d);
                }
            }
            let id = cursor.get_i64("id").context("cursor id")?;
            if id == 0 {
                return Ok(());
            }
            let get_more = self.read_command(doc! {"getMore": id, "collection": table});
            reply = conn.command(get_more).await?;
            batch_key = "nextBatch";
        }
    }
}

/// YCSB's fillMap copies every binary field out of the result; count them instead.
fn count_binary_fields(doc: &RawDocument) -> usize {
    doc.iter().filter(|e| matches!(e, Ok((_, bson::RawBsonRef::Binary(_))))).count()
}

fn status_of(what: &str, r: Result<()>) -> Status {
    match r {
        Ok(()) => Status::Ok,
        Err(e) => {
            report_error(what, &e);
            Status::Error
        }
    }
}

impl Target for WireTarget {
    fn kind(&self) -> &'static str {
        "mongodb"
    }

    fn ycsb_prepare<'a>(&'a self, table: &'a str, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if drop_first {
                drop_collection(self, table).await?;
            }
            Ok(())
        })
    }

    fn ycsb_insert<'a>(&'a self, table: &'a str, records: &'a [Record]) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let docs: Vec<Bson> = records.iter().map(|r| Bson::Document(ycsb_doc(r))).collect();
            // insertOne and insertMany(ordered: false) are the same command on the wire.
            let ordered = docs.len() == 1;
            let cmd = self.write_command(doc! {"insert": table, "ordered": ordered, "documents": docs});
            status_of("insert", self.run(cmd).await)
        })
    }

    fn ycsb_read<'a>(&'a self, table: &'a str, key: &'a str, fields: Option<&'a [String]>) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            // find_one: limit 1 in a single batch, as the driver sends it.
            let mut find = doc! {"find": table, "filter": {"_id": key}, "limit": 1_i64, "singleBatch": true};
            if let Some(p) = projection(fields) {
                find.insert("projection", p);
            }
            let mut found = 0usize;
            let r = self.find_all(table, self.read_command(find), |d| {
                found += 1;
                std::hint::black_box(count_binary_fields(d));
            });
            match r.await {
                Ok(()) if found == 0 => Status::NotFound,
                r => status_of("read", r),
            }
        })
    }

    fn ycsb_update<'a>(&'a self, table: &'a str, key: &'a str, values: &'a [(String, Vec<u8>)]) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let set = fields_doc(values);
            let cmd = self.write_command(doc! {"update": table, "ordered": true, "updates": [{"q": {"_id": key}, "u": {"$set": set}}]});
            let mut conn = self.conn.lock().await;
            match conn.command(cmd).await {
                Ok(reply) if reply.get_i32("n").unwrap_or(0) == 0 => {
                    report_error("update", &format!("Nothing updated for key {key}"));
                    Status::NotFound
                }
                Ok(_) => Status::Ok,
                Err(e) => {
                    report_error("update", &e);
                    Status::Error
                }
            }
        })
    }

    fn ycsb_scan<'a>(&'a self, table: &'a str, start_key: &'a str, count: usize, fields: Option<&'a [String]>) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let limit = i64::try_from(count).unwrap_or(i64::MAX);
            let mut find = doc! {"find": table, "filter": {"_id": {"$gte": start_key}}, "sort": {"_id": 1}, "limit": limit};
            if let Some(p) = projection(fields) {
                find.insert("projection", p);
            }
            let mut n = 0usize;
            let r = self.find_all(table, self.read_command(find), |d| {
                n += 1;
                std::hint::black_box(d.iter().count());
            });
            match r.await {
                Ok(()) if n == 0 => {
                    // YCSB: "Nothing found in scan for key" is an ERROR.
                    report_error("scan", &format!("Nothing found in scan for key {start_key}"));
                    Status::Error
                }
                r => status_of("scan", r),
            }
        })
    }

    fn orders_prepare<'a>(&'a self, collection: &'a str, indexes_count: usize, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if drop_first {
                drop_collection(self, collection).await?;
            }
            match self.run(self.write_command(doc! {"create": collection})).await {
                Ok(()) => {}
                // NamespaceExists (48) when not dropped: keep the existing collection.
                Err(e) if e.downcast_ref::<CommandError>().is_some_and(|c| c.code == 48) => {}
                Err(e) => return Err(e.context(format!("create {collection}"))),
            }
            let indexes: Vec<Bson> =
                ORDER_INDEXES.iter().take(indexes_count).map(|[a, b]| Bson::Document(doc! {"key": {*a: 1, *b: 1}, "name": format!("{a}_1_{b}_1")})).collect();
            if !indexes.is_empty() {
                self.run(self.write_command(doc! {"createIndexes": collection, "indexes": indexes})).await.context("createIndexes")?;
            }
            Ok(())
        })
    }

    fn orders_shard<'a>(&'a self, collection: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let ns = format!("{}.{}", self.db, collection);
            self.run(doc! {"enableSharding": self.db.as_str(), "$db": "admin"}).await.context("enableSharding")?;
            self.run(doc! {"shardCollection": &ns, "key": {"customerId": "hashed"}, "$db": "admin"}).await.with_context(|| format!("shardCollection {ns}"))?;
            Ok(())
        })
    }

    fn orders_insert<'a>(&'a self, collection: &'a str, orders: &'a [Order], ordered: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            // Drivers give every inserted document an ObjectId `_id` before sending it.
            let docs: Vec<Bson> = orders
                .iter()
                .map(|o| {
                    let mut d = doc! {"_id": ObjectId::new()};
                    d.extend(order_doc(o));
                    Bson::Document(d)
                })
                .collect();
            self.run(self.write_command(doc! {"insert": collection, "ordered": ordered, "documents": docs})).await
        })
    }

    fn accounts_prepare<'a>(&'a self, table: &'a str, count: u32, balance: i64, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if drop_first {
                match self.run(doc! {"drop": table, "$db": self.db.as_str()}).await {
                    Err(e) if e.downcast_ref::<CommandError>().is_some_and(|c| c.code == 26) => {}
                    r => r.context("drop the accounts")?,
                }
            }
            let mut start = 0;
            while start < count {
                let end = (start + super::ACCOUNTS_BATCH).min(count);
                let docs: Vec<Bson> = (start..end).map(|i| Bson::Document(doc! {"_id": i as i64, "balance": balance})).collect();
                self.run(self.write_command(doc! {"insert": table, "documents": docs})).await.context("insert accounts")?;
                start = end;
            }
            Ok(())
        })
    }

    fn transfer<'a>(&'a self, table: &'a str, from: u32, to: u32, amount: i64) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            let lsid = doc! {"id": self.lsid.clone()};
            let statement = |id: u32, by: i64, n: i64, first: bool| {
                let mut b =
                    doc! {"update": table, "updates": [{"q": {"_id": id as i64}, "u": {"$inc": {"balance": by}}}], "lsid": lsid.clone(), "txnNumber": n};
                if first {
                    b.insert("startTransaction", true);
                }
                b.insert("autocommit", false);
                b.insert("$db", self.db.as_str());
                b
            };
            for attempt in 1..=super::TRANSFER_ATTEMPTS_MAX {
                let n = self.txn_number.fetch_add(1, Ordering::Relaxed) + 1;
                let mut end = doc! {"commitTransaction": 1, "lsid": lsid.clone(), "txnNumber": n, "autocommit": false};
                if let Some(wc) = &self.write_concern {
                    end.insert("writeConcern", wc.clone());
                }
                end.insert("$db", "admin");
                let r = async {
                    self.run(statement(from, -amount, n, true)).await?;
                    self.run(statement(to, amount, n, false)).await?;
                    self.run(end).await
                }
                .await;
                match r {
                    Ok(()) => return Ok(attempt),
                    // WriteConflict or NoSuchTransaction: the transaction ran into another.
                    Err(e) if e.downcast_ref::<CommandError>().is_some_and(|c| c.code == 112 || c.code == 251) => {
                        let abort = doc! {"abortTransaction": 1, "lsid": lsid.clone(), "txnNumber": n, "autocommit": false, "$db": "admin"};
                        let _ = self.run(abort).await;
                    }
                    Err(e) => return Err(e).context("transfer"),
                }
            }
            bail!("a transfer conflicted {} times", super::TRANSFER_ATTEMPTS_MAX)
        })
    }

    fn accounts_total<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<i64>> {
        Box::pin(async move {
            let mut conn = self.conn.lock().await;
            let reply = conn
                .command(doc! {"aggregate": table, "pipeline": [{"$group": {"_id": null, "t": {"$sum": "$balance"}}}], "cursor": {}, "$db": self.db.as_str()})
                .await?;
            let batch = reply.get_document("cursor")?.get_array("firstBatch")?;
            let total = batch
                .into_iter()
                .next()
                .and_then(|d| d.ok())
                .and_then(|d| d.as_document())
                .and_then(|d| d.get("t").ok().flatten())
                .and_then(|t| t.as_i64().or(t.as_i32().map(i64::from)));
            Ok(total.unwrap_or(0))
        })
    }
}

/// drop, where a missing collection (NamespaceNotFound, 26) is success, as in the driver.
async fn drop_collection(t: &WireTarget, name: &str) -> Result<()> {
    match t.run(t.write_command(doc! {"drop": name})).await {
        Ok(()) => Ok(()),
        Err(e) if e.downcast_ref::<CommandError>().is_some_and(|c| c.code == 26) => Ok(()),
        Err(e) => Err(e.context(format!("drop collection {name}"))),
    }
}
