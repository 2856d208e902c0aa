//! MongoDB wire target (the official Rust driver): YCSB's MongoDbClient binding semantics and
//! bench02's inserts. Works against shoal and against a real mongod/mongos.

use super::{BoxFuture, Order, Record, Target, ORDER_INDEXES};
use crate::ycsb::measure::Status;
use anyhow::{Context, Result};
use bson::{doc, spec::BinarySubtype, Binary, Bson, DateTime, Document, RawDocumentBuf};
use mongodb::{options::ClientOptions, Client, Database, IndexModel};
use std::sync::atomic::{AtomicU64, Ordering};

/// Errors printed to stderr before going quiet: a broken server would otherwise flood it.
pub const ERRORS_PRINTED_MAX: u64 = 20;
static ERRORS_PRINTED: AtomicU64 = AtomicU64::new(0);

pub(crate) fn report_error(what: &str, e: &dyn std::fmt::Display) {
    let n = ERRORS_PRINTED.fetch_add(1, Ordering::Relaxed);
    if n < ERRORS_PRINTED_MAX {
        eprintln!("{what}: {e}");
    } else if n == ERRORS_PRINTED_MAX {
        eprintln!("(further errors are counted but not printed)");
    }
}

pub struct MongoConnector {
    client: Client,
    db: Database,
}

/// YCSB's rule: the URL's database unless absent or "admin", else `default_db` ("ycsb").
pub(crate) fn database_name(options: &ClientOptions, default_db: &str) -> String {
    match options.default_database.as_deref() {
        Some(name) if !name.is_empty() && name != "admin" => name.to_string(),
        _ => default_db.to_string(),
    }
}

impl MongoConnector {
    /// w, journal and readPreference in the URL apply to every operation (driver defaults).
    pub async fn new(options: ClientOptions, db_name: String, url: &str) -> Result<MongoConnector> {
        let client = Client::with_options(options).context("create MongoDB client")?;
        let db = client.database(&db_name);
        // Fail fast with a clear message instead of every operation timing out.
        client.database("admin").run_command(doc! {"ping": 1}).await.with_context(|| format!("connect to {url}"))?;
        Ok(MongoConnector { client, db })
    }

    /// All sessions share the driver's connection pool, as YCSB's static MongoClient does.
    pub fn session(&self) -> MongoTarget {
        MongoTarget { client: self.client.clone(), db: self.db.clone() }
    }
}

pub struct MongoTarget {
    client: Client,
    db: Database,
}

fn binary(bytes: &[u8]) -> Bson {
    Bson::Binary(Binary { subtype: BinarySubtype::Generic, bytes: bytes.to_vec() })
}

pub(crate) fn projection(fields: Option<&[String]>) -> Option<Document> {
    fields.map(|fs| {
        let mut p = Document::new();
        for f in fs {
            p.insert(f.clone(), 1);
        }
        p
    })
}

/// The YCSB record as its MongoDB binding writes it: `{_id: key, field0: BinData, …}`.
pub(crate) fn ycsb_doc(r: &Record) -> Document {
    let mut d = Document::new();
    d.insert("_id", r.key.clone());
    d.extend(fields_doc(&r.fields));
    d
}

/// Field values as BinData, as YCSB's binding `$set`s them.
pub(crate) fn fields_doc(values: &[(String, Vec<u8>)]) -> Document {
    let mut d = Document::new();
    for (k, v) in values {
        d.insert(k.clone(), binary(v));
    }
    d
}

/// One bench02 order, without `_id` (drivers add an ObjectId).
pub(crate) fn order_doc(o: &Order) -> Document {
    doc! {
        "customerId": o.customer_id,
        "productId": o.product_id,
        "quantity": o.quantity,
        "orderDate": DateTime::from_millis(o.order_date_ms),
        "textField": o.text_field.as_str(),
    }
}

/// YCSB's fillMap copies every binary field out of the result; touching each one keeps the
/// client's work comparable without copying.
fn count_binary_fields(doc: &RawDocumentBuf) -> usize {
    doc.iter().filter(|e| matches!(e, Ok((_, bson::RawBsonRef::Binary(_))))).count()
}

impl Target for MongoTarget {
    fn kind(&self) -> &'static str {
        "mongodb"
    }

    fn ycsb_prepare<'a>(&'a self, table: &'a str, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if drop_first {
                self.db.collection::<Document>(table).drop().await.with_context(|| format!("drop collection {table}"))?;
            }
            Ok(())
        })
    }

    fn ycsb_insert<'a>(&'a self, table: &'a str, records: &'a [Record]) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let docs: Vec<Document> = records.iter().map(ycsb_doc).collect();
            let coll = self.db.collection::<Document>(table);
            let result = if docs.len() == 1 {
                // batchsize=1: insertOne, as YCSB does.
                let Some(d) = docs.into_iter().next() else { return Status::Error };
                coll.insert_one(d).await.map(|_| ())
            } else {
                coll.insert_many(docs).ordered(false).await.map(|_| ())
            };
            match result {
                Ok(()) => Status::Ok,
                Err(e) => {
                    report_error("insert", &e);
                    Status::Error
                }
            }
        })
    }

    fn ycsb_read<'a>(&'a self, table: &'a str, key: &'a str, fields: Option<&'a [String]>) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let coll = self.db.collection::<RawDocumentBuf>(table);
            let mut find = coll.find_one(doc! {"_id": key});
            if let Some(p) = projection(fields) {
                find = find.projection(p);
            }
            match find.await {
                Ok(Some(d)) => {
                    std::hint::black_box(count_binary_fields(&d));
                    Status::Ok
                }
                Ok(None) => Status::NotFound,
                Err(e) => {
                    report_error("read", &e);
                    Status::Error
                }
            }
        })
    }

    fn ycsb_update<'a>(&'a self, table: &'a str, key: &'a str, values: &'a [(String, Vec<u8>)]) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let set = fields_doc(values);
            let coll = self.db.collection::<Document>(table);
            match coll.update_one(doc! {"_id": key}, doc! {"$set": set}).await {
                Ok(r) if r.matched_count == 0 => {
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
            let coll = self.db.collection::<RawDocumentBuf>(table);
            let limit = i64::try_from(count).unwrap_or(i64::MAX);
            let mut find = coll.find(doc! {"_id": {"$gte": start_key}}).sort(doc! {"_id": 1}).limit(limit);
            if let Some(p) = projection(fields) {
                find = find.projection(p);
            }
            let mut cursor = match find.await {
                Ok(c) => c,
                Err(e) => {
                    report_error("scan", &e);
                    return Status::Error;
                }
            };
            let mut n = 0usize;
            loop {
                match cursor.advance().await {
                    Ok(true) => {
                        n += 1;
                        std::hint::black_box(cursor.current().iter().count());
                    }
                    Ok(false) => break,
                    Err(e) => {
                        report_error("scan", &e);
                        return Status::Error;
                    }
                }
            }
            if n == 0 {
                // YCSB: "Nothing found in scan for key" is an ERROR.
                report_error("scan", &format!("Nothing found in scan for key {start_key}"));
                return Status::Error;
            }
            Status::Ok
        })
    }

    fn orders_prepare<'a>(&'a self, collection: &'a str, indexes_count: usize, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let coll = self.db.collection::<Document>(collection);
            if drop_first {
                coll.drop().await.with_context(|| format!("drop collection {collection}"))?;
            }
            self.db.create_collection(collection).await.or_else(|e| {
                // NamespaceExists (48) when not dropped: keep the existing collection.
                match e.kind.as_ref() {
                    mongodb::error::ErrorKind::Command(c) if c.code == 48 => Ok(()),
                    _ => Err(e),
                }
            })?;
            let models: Vec<IndexModel> =
                ORDER_INDEXES.iter().take(indexes_count).map(|[a, b]| IndexModel::builder().keys(doc! {*a: 1, *b: 1}).build()).collect();
            if !models.is_empty() {
                coll.create_indexes(models).await.context("createIndexes")?;
            }
            Ok(())
        })
    }

    fn orders_shard<'a>(&'a self, collection: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let admin = self.client.database("admin");
            let ns = format!("{}.{}", self.db.name(), collection);
            admin.run_command(doc! {"enableSharding": self.db.name()}).await.context("enableSharding")?;
            admin.run_command(doc! {"shardCollection": &ns, "key": {"customerId": "hashed"}}).await.with_context(|| format!("shardCollection {ns}"))?;
            Ok(())
        })
    }

    fn orders_insert<'a>(&'a self, collection: &'a str, orders: &'a [Order], ordered: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let docs: Vec<Document> = orders.iter().map(order_doc).collect();
            self.db.collection::<Document>(collection).insert_many(docs).ordered(ordered).await?;
            Ok(())
        })
    }

    fn accounts_prepare<'a>(&'a self, table: &'a str, count: u32, balance: i64, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let coll = self.db.collection::<Document>(table);
            if drop_first {
                coll.drop().await.with_context(|| format!("drop collection {table}"))?;
            }
            let mut start = 0;
            while start < count {
                let end = (start + super::ACCOUNTS_BATCH).min(count);
                coll.insert_many((start..end).map(|i| doc! {"_id": i as i64, "balance": balance})).await.context("insert accounts")?;
                start = end;
            }
            Ok(())
        })
    }

    fn transfer<'a>(&'a self, table: &'a str, from: u32, to: u32, amount: i64) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            let coll = self.db.collection::<Document>(table);
            for attempt in 1..=super::TRANSFER_ATTEMPTS_MAX {
                let mut s = self.client.start_session().await.context("start a session")?;
                s.start_transaction().await.context("start a transaction")?;
                let r = async {
                    coll.update_one(doc! {"_id": from as i64}, doc! {"$inc": {"balance": -amount}}).session(&mut s).await?;
                    coll.update_one(doc! {"_id": to as i64}, doc! {"$inc": {"balance": amount}}).session(&mut s).await?;
                    s.commit_transaction().await
                }
                .await;
                match r {
                    Ok(()) => return Ok(attempt),
                    // A conflict (or a failover): the driver's advice is to run it again.
                    Err(e) if e.contains_label(mongodb::error::TRANSIENT_TRANSACTION_ERROR) => {
                        let _ = s.abort_transaction().await;
                    }
                    Err(e) => return Err(e).context("transfer"),
                }
            }
            anyhow::bail!("a transfer conflicted {} times", super::TRANSFER_ATTEMPTS_MAX)
        })
    }

    fn accounts_total<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<i64>> {
        Box::pin(async move {
            let coll = self.db.collection::<Document>(table);
            let mut c = coll.aggregate(vec![doc! {"$group": {"_id": null, "t": {"$sum": "$balance"}}}]).await.context("sum balances")?;
            let d = if c.advance().await.context("sum balances")? { c.deserialize_current().context("sum balances")? } else { Document::new() };
            Ok(match d.get("t") {
                Some(Bson::Int64(t)) => *t,
                Some(Bson::Int32(t)) => *t as i64,
                _ => 0,
            })
        })
    }
}
