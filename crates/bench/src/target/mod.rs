//! Databases a benchmark drives. Every benchmark talks to a `Target` only, so shoal, a real
//! mongod and PostgreSQL are measured by the same client code path.

pub mod mongo;
pub mod postgres;
pub mod wire;

use crate::ycsb::measure::Status;
use anyhow::{Context, Result};
use std::future::Future;
use std::pin::Pin;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One YCSB record: key plus (field name, value bytes) pairs.
#[derive(Debug, Clone)]
pub struct Record {
    pub key: String,
    pub fields: Vec<(String, Vec<u8>)>,
}

/// One bench02 order document.
#[derive(Debug, Clone)]
pub struct Order {
    pub customer_id: i32,
    pub product_id: i32,
    pub quantity: i32,
    /// Milliseconds since the Unix epoch.
    pub order_date_ms: i64,
    pub text_field: String,
}

/// bench02's secondary indexes, in the order `--indexes N` creates them.
pub const ORDER_INDEXES: [[&str; 2]; 3] = [["customerId", "orderDate"], ["customerId", "productId"], ["productId", "orderDate"]];

/// A per-worker session on a target (a pooled client handle or one SQL connection).
pub trait Target: Send + Sync {
    /// "mongodb" or "postgresql", for reports.
    fn kind(&self) -> &'static str;

    /// YCSB: makes sure the table exists (PostgreSQL needs DDL; MongoDB creates on insert).
    fn ycsb_prepare<'a>(&'a self, table: &'a str, drop_first: bool) -> BoxFuture<'a, Result<()>>;
    fn ycsb_insert<'a>(&'a self, table: &'a str, records: &'a [Record]) -> BoxFuture<'a, Status>;
    /// `fields` None reads the whole record.
    fn ycsb_read<'a>(&'a self, table: &'a str, key: &'a str, fields: Option<&'a [String]>) -> BoxFuture<'a, Status>;
    fn ycsb_update<'a>(&'a self, table: &'a str, key: &'a str, values: &'a [(String, Vec<u8>)]) -> BoxFuture<'a, Status>;
    fn ycsb_scan<'a>(&'a self, table: &'a str, start_key: &'a str, count: usize, fields: Option<&'a [String]>) -> BoxFuture<'a, Status>;

    /// bench02: drops (when asked) and recreates the collection with the first `indexes_count`
    /// of `ORDER_INDEXES`.
    fn orders_prepare<'a>(&'a self, collection: &'a str, indexes_count: usize, drop_first: bool) -> BoxFuture<'a, Result<()>>;
    /// bench02: shards the collection on a hashed customerId, as the elastic-cluster reports do
    /// (MongoDB sharded clusters only).
    fn orders_shard<'a>(&'a self, collection: &'a str) -> BoxFuture<'a, Result<()>>;
    /// Inserts one batch; Err carries the database's message.
    fn orders_insert<'a>(&'a self, collection: &'a str, orders: &'a [Order], ordered: bool) -> BoxFuture<'a, Result<()>>;

    /// transfer: drops (when asked) and fills `table` with accounts `0..count`, each with
    /// `balance`.
    fn accounts_prepare<'a>(&'a self, table: &'a str, count: u32, balance: i64, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        let _ = (table, count, balance, drop_first);
        Box::pin(async move { anyhow::bail!("{} targets do not run the transfer benchmark", self.kind()) })
    }

    /// transfer: one transaction that debits account `from` and credits `to` by `amount`,
    /// run again after a conflict; returns how many attempts it took.
    fn transfer<'a>(&'a self, table: &'a str, from: u32, to: u32, amount: i64) -> BoxFuture<'a, Result<u32>> {
        let _ = (table, from, to, amount);
        Box::pin(async move { anyhow::bail!("{} targets do not run the transfer benchmark", self.kind()) })
    }

    /// transfer: the sum of every balance (the benchmark checks that it is kept).
    fn accounts_total<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<i64>> {
        let _ = table;
        Box::pin(async move { anyhow::bail!("{} targets do not run the transfer benchmark", self.kind()) })
    }
}

/// Attempts a transfer makes before it reports the conflict as an error.
pub const TRANSFER_ATTEMPTS_MAX: u32 = 100;
/// Accounts per insert while filling the table.
pub const ACCOUNTS_BATCH: u32 = 1000;

/// Creates per-worker `Target` sessions from one URL. One per run.
#[allow(clippy::large_enum_variant)]
pub enum Connector {
    /// The official driver: replica sets, several hosts, auth, TLS.
    Mongo(mongo::MongoConnector),
    /// The lean wire client: one host, no auth (see `wire`).
    Wire(wire::WireConnector),
    Postgres(postgres::PostgresConnector),
}

impl Connector {
    /// `mongodb://` to one host without auth or TLS uses the lean wire client, other
    /// `mongodb://` / `mongodb+srv://` URLs the official driver; `postgres://` /
    /// `postgresql://` use tokio-postgres. `SHOAL_BENCH_DRIVER=official` in the environment
    /// forces the official driver.
    pub async fn new(url: &str, default_db: &str) -> Result<Connector> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Connector::Postgres(postgres::PostgresConnector::new(url)))
        } else if url.starts_with("mongodb://") || url.starts_with("mongodb+srv://") {
            let options = mongodb::options::ClientOptions::parse(url).await.with_context(|| format!("parse MongoDB URL {url}"))?;
            let db = mongo::database_name(&options, default_db);
            let official = std::env::var("SHOAL_BENCH_DRIVER").is_ok_and(|d| d == "official");
            if !official && wire::can_serve(&options) {
                Ok(Connector::Wire(wire::WireConnector::new(options, db).await?))
            } else {
                Ok(Connector::Mongo(mongo::MongoConnector::new(options, db, url).await?))
            }
        } else {
            anyhow::bail!("unsupported URL {url:?}: use mongodb://... or postgresql://...")
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Connector::Mongo(_) | Connector::Wire(_) => "mongodb",
            Connector::Postgres(_) => "postgresql",
        }
    }

    /// A session for one worker.
    pub async fn session(&self) -> Result<Box<dyn Target>> {
        match self {
            Connector::Mongo(m) => Ok(Box::new(m.session())),
            Connector::Wire(w) => Ok(Box::new(w.session().await?)),
            Connector::Postgres(p) => Ok(Box::new(p.session().await?)),
        }
    }
}
