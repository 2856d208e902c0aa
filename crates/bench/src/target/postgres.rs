//! PostgreSQL target (tokio-postgres, no TLS): the same benchmarks with documents as JSONB.
//! YCSB: table (ycsb_key TEXT COLLATE "C" PRIMARY KEY, data JSONB), so scans order keys
//! bytewise like MongoDB's _id. bench02: (id BIGSERIAL PRIMARY KEY, doc JSONB) with the three
//! compound indexes as expression indexes, inserted with multi-row INSERTs of the same size.

use super::{mongo::report_error, BoxFuture, Order, Record, Target, ORDER_INDEXES};
use crate::ycsb::measure::Status;
use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use tokio_postgres::{types::ToSql, Client, NoTls, Statement};

/// PostgreSQL allows 65535 bind parameters per statement; batches are split below that.
pub const INSERT_ROWS_PER_STATEMENT_MAX: usize = 10_000;
/// Prepared statements kept per connection (one per distinct SQL text).
pub const STATEMENT_CACHE_ENTRIES_MAX: usize = 64;

pub struct PostgresConnector {
    url: String,
}

impl PostgresConnector {
    pub fn new(url: &str) -> PostgresConnector {
        PostgresConnector { url: url.to_string() }
    }

    /// One connection per worker, as YCSB's JDBC binding opens one per thread.
    pub async fn session(&self) -> Result<PostgresTarget> {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await.with_context(|| format!("connect to {}", self.url))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                report_error("postgresql connection", &e);
            }
        });
        Ok(PostgresTarget { client, statements: Mutex::new(HashMap::new()) })
    }
}

pub struct PostgresTarget {
    client: Client,
    statements: Mutex<HashMap<String, Statement>>,
}

/// Quotes an SQL identifier.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A JSON string literal for field bytes (YCSB's values are printable ASCII).
fn json_string(bytes: &[u8]) -> String {
    serde_json::to_string(&String::from_utf8_lossy(bytes)).unwrap_or_else(|_| "\"\"".into())
}

fn fields_json(fields: &[(String, Vec<u8>)]) -> String {
    let mut s = String::with_capacity(fields.len() * 120 + 2);
    s.push('{');
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&serde_json::to_string(k).unwrap_or_else(|_| "\"\"".into()));
        s.push(':');
        s.push_str(&json_string(v));
    }
    s.push('}');
    s
}

/// ISO-8601 UTC with milliseconds: sorts as text in time order, so expression indexes on
/// `doc->>'orderDate'` order like MongoDB's Date index keys.
pub fn iso8601_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let ms_of_day = ms.rem_euclid(86_400_000);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    let (h, rem) = (ms_of_day / 3_600_000, ms_of_day % 3_600_000);
    let (min, rem) = (rem / 60_000, rem % 60_000);
    let (s, milli) = (rem / 1000, rem % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

pub fn order_json(o: &Order) -> String {
    format!(
        "{{\"customerId\":{},\"productId\":{},\"quantity\":{},\"orderDate\":\"{}\",\"textField\":{}}}",
        o.customer_id,
        o.product_id,
        o.quantity,
        iso8601_ms(o.order_date_ms),
        serde_json::to_string(&o.text_field).unwrap_or_else(|_| "\"\"".into())
    )
}

/// `VALUES ($1, $2::text::jsonb), ($3, ...)` for `rows` rows of `per_row` parameters; the
/// last parameter of each row is JSON text.
fn values_clause(rows: usize, per_row: usize) -> String {
    let mut s = String::new();
    for r in 0..rows {
        if r > 0 {
            s.push_str(", ");
        }
        s.push('(');
        for c in 0..per_row {
            if c > 0 {
                s.push_str(", ");
            }
            let n = r * per_row + c + 1;
            if c + 1 == per_row {
                s.push_str(&format!("${n}::text::jsonb"));
            } else {
                s.push_str(&format!("${n}"));
            }
        }
        s.push(')');
    }
    s
}

impl PostgresTarget {
    async fn statement(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(s) = self.statements.lock().get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).await?;
        let mut cache = self.statements.lock();
        if cache.len() >= STATEMENT_CACHE_ENTRIES_MAX {
            cache.clear();
        }
        cache.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    /// The selected part of `data`: all of it, or an object of the requested fields.
    fn projection_sql(fields: Option<&[String]>) -> &'static str {
        match fields {
            None => "data::text",
            Some(_) => "(SELECT jsonb_object_agg(k, data->k) FROM unnest($2::text[]) AS k)::text",
        }
    }
}

impl Target for PostgresTarget {
    fn kind(&self) -> &'static str {
        "postgresql"
    }

    fn ycsb_prepare<'a>(&'a self, table: &'a str, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let t = ident(table);
            if drop_first {
                self.client.batch_execute(&format!("DROP TABLE IF EXISTS {t}")).await.with_context(|| format!("drop table {table}"))?;
            }
            self.client
                .batch_execute(&format!("CREATE TABLE IF NOT EXISTS {t} (ycsb_key TEXT COLLATE \"C\" PRIMARY KEY, data JSONB NOT NULL)"))
                .await
                .with_context(|| format!("create table {table}"))?;
            Ok(())
        })
    }

    fn ycsb_insert<'a>(&'a self, table: &'a str, records: &'a [Record]) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            for chunk in records.chunks(INSERT_ROWS_PER_STATEMENT_MAX) {
                let sql = format!("INSERT INTO {} (ycsb_key, data) VALUES {}", ident(table), values_clause(chunk.len(), 2));
                let jsons: Vec<String> = chunk.iter().map(|r| fields_json(&r.fields)).collect();
                let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(chunk.len() * 2);
                for (r, j) in chunk.iter().zip(&jsons) {
                    params.push(&r.key);
                    params.push(j);
                }
                let result = match self.statement(&sql).await {
                    Ok(stmt) => self.client.execute(&stmt, &params).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = result {
                    report_error("insert", &e);
                    return Status::Error;
                }
            }
            Status::Ok
        })
    }

    fn ycsb_read<'a>(&'a self, table: &'a str, key: &'a str, fields: Option<&'a [String]>) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let sql = format!("SELECT {} FROM {} WHERE ycsb_key = $1", Self::projection_sql(fields), ident(table));
            let stmt = match self.statement(&sql).await {
                Ok(s) => s,
                Err(e) => {
                    report_error("read", &e);
                    return Status::Error;
                }
            };
            let field_list: Vec<String> = fields.map(|f| f.to_vec()).unwrap_or_default();
            let result = match fields {
                None => self.client.query_opt(&stmt, &[&key]).await,
                Some(_) => self.client.query_opt(&stmt, &[&key, &field_list]).await,
            };
            match result {
                Ok(Some(row)) => {
                    let data: Option<&str> = row.try_get(0).unwrap_or(None);
                    std::hint::black_box(data.map(|d| d.len()));
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
            let sql = format!("UPDATE {} SET data = data || $2::text::jsonb WHERE ycsb_key = $1", ident(table));
            let json = fields_json(values);
            let result = match self.statement(&sql).await {
                Ok(stmt) => self.client.execute(&stmt, &[&key, &json]).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(0) => Status::NotFound,
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
            let (sql, field_list) = match fields {
                None => (format!("SELECT ycsb_key, data::text FROM {} WHERE ycsb_key >= $1 ORDER BY ycsb_key LIMIT $2", ident(table)), Vec::new()),
                Some(f) => (
                    format!(
                        "SELECT ycsb_key, (SELECT jsonb_object_agg(k, data->k) FROM unnest($3::text[]) AS k)::text FROM {} WHERE ycsb_key >= $1 ORDER BY ycsb_key LIMIT $2",
                        ident(table)
                    ),
                    f.to_vec(),
                ),
            };
            let stmt = match self.statement(&sql).await {
                Ok(s) => s,
                Err(e) => {
                    report_error("scan", &e);
                    return Status::Error;
                }
            };
            let result = if fields.is_none() {
                self.client.query(&stmt, &[&start_key, &limit]).await
            } else {
                self.client.query(&stmt, &[&start_key, &limit, &field_list]).await
            };
            match result {
                Ok(rows) if rows.is_empty() => Status::Error,
                Ok(rows) => {
                    std::hint::black_box(rows.iter().filter_map(|r| r.try_get::<_, Option<&str>>(1).ok().flatten()).map(|d| d.len()).sum::<usize>());
                    Status::Ok
                }
                Err(e) => {
                    report_error("scan", &e);
                    Status::Error
                }
            }
        })
    }

    fn orders_prepare<'a>(&'a self, collection: &'a str, indexes_count: usize, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let t = ident(collection);
            if drop_first {
                self.client.batch_execute(&format!("DROP TABLE IF EXISTS {t}")).await.with_context(|| format!("drop table {collection}"))?;
            }
            self.client
                .batch_execute(&format!("CREATE TABLE IF NOT EXISTS {t} (id BIGSERIAL PRIMARY KEY, doc JSONB NOT NULL)"))
                .await
                .with_context(|| format!("create table {collection}"))?;
            for (i, [a, b]) in ORDER_INDEXES.iter().take(indexes_count).enumerate() {
                let expr = |f: &str| if f == "orderDate" { format!("(doc->>'{f}')") } else { format!("((doc->>'{f}')::int)") };
                let name = ident(&format!("{collection}_idx{}", i + 1));
                let sql = format!("CREATE INDEX IF NOT EXISTS {name} ON {t} ({}, {})", expr(a), expr(b));
                self.client.batch_execute(&sql).await.with_context(|| format!("create index {name}"))?;
            }
            Ok(())
        })
    }

    fn orders_shard<'a>(&'a self, _collection: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { bail!("sharding is a MongoDB feature; the PostgreSQL target cannot shard a table") })
    }

    fn orders_insert<'a>(&'a self, collection: &'a str, orders: &'a [Order], _ordered: bool) -> BoxFuture<'a, Result<()>> {
        // A multi-row INSERT is atomic, so ordered and unordered batches behave alike here.
        Box::pin(async move {
            for chunk in orders.chunks(INSERT_ROWS_PER_STATEMENT_MAX) {
                let sql = format!("INSERT INTO {} (doc) VALUES {}", ident(collection), values_clause(chunk.len(), 1));
                let jsons: Vec<String> = chunk.iter().map(order_json).collect();
                let params: Vec<&(dyn ToSql + Sync)> = jsons.iter().map(|j| j as &(dyn ToSql + Sync)).collect();
                let stmt = self.statement(&sql).await.context("prepare INSERT")?;
                self.client.execute(&stmt, &params).await.context("INSERT")?;
            }
            Ok(())
        })
    }

    fn accounts_prepare<'a>(&'a self, table: &'a str, count: u32, balance: i64, drop_first: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let t = ident(table);
            if drop_first {
                self.client.batch_execute(&format!("DROP TABLE IF EXISTS {t}")).await.context("drop table")?;
            }
            self.client.batch_execute(&format!("CREATE TABLE IF NOT EXISTS {t} (id INT PRIMARY KEY, doc JSONB NOT NULL)")).await.context("create table")?;
            let sql = format!("INSERT INTO {t} (id, doc) SELECT i, jsonb_build_object('balance', $3::bigint) FROM generate_series($1::int, $2::int) AS i");
            let mut start = 0;
            while start < count {
                let end = (start + super::ACCOUNTS_BATCH).min(count);
                self.client.execute(&sql, &[&(start as i32), &(end as i32 - 1), &balance]).await.context("insert accounts")?;
                start = end;
            }
            Ok(())
        })
    }

    fn transfer<'a>(&'a self, table: &'a str, from: u32, to: u32, amount: i64) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            let sql =
                format!("UPDATE {} SET doc = jsonb_set(doc, '{{balance}}', to_jsonb((doc->>'balance')::bigint + $2::bigint)) WHERE id = $1", ident(table));
            let stmt = self.statement(&sql).await.context("prepare the transfer")?;
            for attempt in 1..=super::TRANSFER_ATTEMPTS_MAX {
                let r = async {
                    self.client.batch_execute("BEGIN").await?;
                    self.client.execute(&stmt, &[&(from as i32), &-amount]).await?;
                    self.client.execute(&stmt, &[&(to as i32), &amount]).await?;
                    self.client.batch_execute("COMMIT").await
                }
                .await;
                match r {
                    Ok(()) => return Ok(attempt),
                    Err(e) => {
                        let _ = self.client.batch_execute("ROLLBACK").await;
                        // Serialization failures and deadlocks: run it again.
                        let retry = e.code().is_some_and(|c| c.code() == "40001" || c.code() == "40P01");
                        if !retry {
                            return Err(e).context("transfer");
                        }
                    }
                }
            }
            anyhow::bail!("a transfer conflicted {} times", super::TRANSFER_ATTEMPTS_MAX)
        })
    }

    fn accounts_total<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<i64>> {
        Box::pin(async move {
            let row = self
                .client
                .query_one(&format!("SELECT COALESCE(SUM((doc->>'balance')::bigint), 0)::bigint FROM {}", ident(table)), &[])
                .await
                .context("sum balances")?;
            Ok(row.get::<_, i64>(0))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_dates() {
        assert_eq!(iso8601_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso8601_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn sql_text() {
        assert_eq!(values_clause(2, 2), "($1, $2::text::jsonb), ($3, $4::text::jsonb)");
        assert_eq!(values_clause(1, 1), "($1::text::jsonb)");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        let j = fields_json(&[("field0".into(), b"a\"\\b".to_vec()), ("field1".into(), b"x".to_vec())]);
        let v: serde_json::Value = serde_json::from_str(&j).expect("valid json");
        assert_eq!(v["field0"], "a\"\\b");
        let o = Order { customer_id: 1, product_id: 2, quantity: 3, order_date_ms: 0, text_field: "t\"".into() };
        let v: serde_json::Value = serde_json::from_str(&order_json(&o)).expect("valid json");
        assert_eq!(v["customerId"], 1);
        assert_eq!(v["orderDate"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["textField"], "t\"");
    }
}
