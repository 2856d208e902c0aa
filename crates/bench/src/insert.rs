//! bench02-compatible insert benchmark: N workers insert batches of order documents
//! {customerId, productId, quantity, orderDate, textField} into a freshly dropped collection
//! with 0–3 compound secondary indexes, for a time or a document count, reporting interval and
//! overall inserts/s and batch latency.

use crate::progress::{Progress, ProgressConfig, Style, TimelineSample};
use crate::sys;
use crate::target::{Connector, Order, ORDER_INDEXES};
use crate::ycsb::measure::{new_histogram, LiveStats, OpKind};
use crate::ycsb::workload::elapsed_us;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const WORKERS_MAX: usize = 1024;
pub const BATCH_SIZE_MAX: usize = 100_000;
/// textField stays far below the 16 MiB document limit.
pub const TEXT_SIZE_BYTES_MAX: usize = 1024 * 1024;
/// orderDate is spread over the year before the run.
pub const ORDER_DATE_SPAN_MS: i64 = 365 * 86_400_000;
/// Batch errors printed before going quiet.
const BATCH_ERRORS_PRINTED_MAX: u64 = 10;

#[derive(Debug, Clone)]
pub struct InsertOptions {
    pub url: String,
    pub database: String,
    pub collection: String,
    pub workers: usize,
    pub batch_size: usize,
    /// Stop after this long (0: no time limit).
    pub run_seconds: u64,
    /// Stop after this many documents (0: no count limit).
    pub num_operations: u64,
    /// How many of ORDER_INDEXES to create (0..=3).
    pub indexes: usize,
    pub text_size_bytes: usize,
    /// Fraction of textField that is one repeated character (0: random, 1: all repeated).
    pub compressibility: f64,
    pub drop_collection: bool,
    pub ordered: bool,
    pub shard: bool,
    pub customers: i32,
    pub products: i32,
    pub watch_pids: Vec<(String, u32)>,
    pub quiet: bool,
}

impl Default for InsertOptions {
    fn default() -> Self {
        InsertOptions {
            url: "mongodb://localhost:27017/".into(),
            database: "bench02".into(),
            collection: "orders".into(),
            workers: 4,
            batch_size: 100,
            run_seconds: 60,
            num_operations: 0,
            indexes: 3,
            text_size_bytes: 1000,
            compressibility: 0.25,
            drop_collection: true,
            ordered: false,
            shard: false,
            customers: 100_000,
            products: 10_000,
            watch_pids: Vec::new(),
            quiet: false,
        }
    }
}

impl InsertOptions {
    pub fn validate(&self) -> Result<()> {
        if self.workers == 0 || self.workers > WORKERS_MAX {
            bail!("workers must be between 1 and {WORKERS_MAX}");
        }
        if self.batch_size == 0 || self.batch_size > BATCH_SIZE_MAX {
            bail!("batch size must be between 1 and {BATCH_SIZE_MAX}");
        }
        if self.indexes > ORDER_INDEXES.len() {
            bail!("indexes must be between 0 and {}", ORDER_INDEXES.len());
        }
        if self.text_size_bytes > TEXT_SIZE_BYTES_MAX {
            bail!("text size must be at most {TEXT_SIZE_BYTES_MAX} bytes");
        }
        if !(0.0..=1.0).contains(&self.compressibility) {
            bail!("compressibility must be between 0 and 1");
        }
        if self.customers < 1 || self.products < 1 {
            bail!("customers and products must be positive");
        }
        if self.run_seconds == 0 && self.num_operations == 0 {
            bail!("set a run time (--run-seconds) or a document count (--num-operations)");
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct InsertResult {
    pub target_kind: &'static str,
    pub inserted: u64,
    pub batches: u64,
    pub batch_errors: u64,
    pub elapsed_s: f64,
    pub inserts_per_s: f64,
    pub batch_latency_ms_avg: f64,
    pub batch_latency_ms_p50: f64,
    pub batch_latency_ms_p95: f64,
    pub batch_latency_ms_p99: f64,
    pub batch_latency_ms_max: f64,
    pub client_cpu: sys::CpuUse,
    pub timeline: Vec<TimelineSample>,
}

/// Generates order documents; each worker owns one.
pub struct OrderGenerator {
    rng: StdRng,
    now_ms: i64,
    customers: i32,
    products: i32,
    text_size_bytes: usize,
    random_bytes: usize,
}

const TEXT_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

impl OrderGenerator {
    pub fn new(o: &InsertOptions, rng: StdRng) -> OrderGenerator {
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        let random_bytes = ((1.0 - o.compressibility) * o.text_size_bytes as f64).round() as usize;
        OrderGenerator { rng, now_ms, customers: o.customers, products: o.products, text_size_bytes: o.text_size_bytes, random_bytes }
    }

    /// Random alphanumerics for the incompressible share, then one repeated character.
    pub fn text(&mut self) -> String {
        let mut s = String::with_capacity(self.text_size_bytes);
        for _ in 0..self.random_bytes.min(self.text_size_bytes) {
            s.push(TEXT_ALPHABET[self.rng.gen_range(0..TEXT_ALPHABET.len())] as char);
        }
        while s.len() < self.text_size_bytes {
            s.push('x');
        }
        s
    }

    pub fn order(&mut self) -> Order {
        Order {
            customer_id: self.rng.gen_range(1..=self.customers),
            product_id: self.rng.gen_range(1..=self.products),
            quantity: self.rng.gen_range(1..=100),
            order_date_ms: self.now_ms - self.rng.gen_range(0..ORDER_DATE_SPAN_MS),
            text_field: self.text(),
        }
    }
}

/// Reserves up to `batch` documents of the shared budget; 0 when it is spent.
fn reserve(budget: &AtomicU64, limit: u64, batch: u64) -> u64 {
    if limit == 0 {
        return batch;
    }
    let prev = budget.fetch_add(batch, Ordering::Relaxed);
    if prev >= limit {
        0
    } else {
        batch.min(limit - prev)
    }
}

pub async fn run(o: &InsertOptions) -> Result<InsertResult> {
    o.validate()?;
    let connector = Arc::new(Connector::new(&o.url, &o.database).await?);
    {
        let s = connector.session().await?;
        s.orders_prepare(&o.collection, o.indexes, o.drop_collection).await?;
        if o.shard {
            s.orders_shard(&o.collection).await?;
        }
    }
    if !o.quiet {
        eprintln!(
            "bench02 insert: target={} workers={} batch={} indexes={} ordered={} text={}B compressibility={} {}",
            connector.kind(),
            o.workers,
            o.batch_size,
            o.indexes,
            o.ordered,
            o.text_size_bytes,
            o.compressibility,
            if o.num_operations > 0 { format!("documents={}", o.num_operations) } else { format!("seconds={}", o.run_seconds) }
        );
    }
    let live = Arc::new(LiveStats::new());
    let stop = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(
        ProgressConfig {
            label: "insert".into(),
            style: Style::Inserts,
            total_ops: Some(o.num_operations).filter(|n| *n > 0),
            max_time: Some(Duration::from_secs(o.run_seconds)).filter(|d| !d.is_zero()),
            watch_pids: o.watch_pids.clone(),
            interactive: None,
            quiet: o.quiet,
        },
        live.clone(),
    );
    let cpu_start = sys::self_cpu_time();
    let start = Instant::now();
    let deadline = if o.run_seconds > 0 { Some(start + Duration::from_secs(o.run_seconds)) } else { None };
    let mut handles = Vec::new();
    for _ in 0..o.workers {
        let (connector, live, stop, budget, errors) = (connector.clone(), live.clone(), stop.clone(), budget.clone(), errors.clone());
        let o = o.clone();
        handles.push(tokio::spawn(async move {
            let db = connector.session().await.context("worker session")?;
            let mut gen = OrderGenerator::new(&o, StdRng::from_entropy());
            let mut hist = new_histogram();
            let mut inserted = 0u64;
            let mut batches = 0u64;
            while !stop.load(Ordering::Acquire) && deadline.is_none_or(|d| Instant::now() < d) {
                let n = reserve(&budget, o.num_operations, o.batch_size as u64);
                if n == 0 {
                    break;
                }
                let orders: Vec<Order> = (0..n).map(|_| gen.order()).collect();
                let t = Instant::now();
                let result = db.orders_insert(&o.collection, &orders, o.ordered).await;
                let us = elapsed_us(t);
                hist.record(us).unwrap_or(());
                live.record(OpKind::Insert, us);
                batches += 1;
                match result {
                    Ok(()) => {
                        inserted += n;
                        live.ops_add(n);
                    }
                    Err(e) => {
                        if errors.fetch_add(1, Ordering::Relaxed) < BATCH_ERRORS_PRINTED_MAX {
                            eprintln!("insert batch failed: {e:#}");
                        }
                    }
                }
            }
            Ok::<(Histogram<u64>, u64, u64), anyhow::Error>((hist, inserted, batches))
        }));
    }
    let mut hist = new_histogram();
    let (mut inserted, mut batches) = (0u64, 0u64);
    let mut first_error = None;
    for h in handles {
        match h.await {
            Ok(Ok((wh, i, b))) => {
                let _ = hist.add(&wh);
                inserted += i;
                batches += b;
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(anyhow::anyhow!("worker failed: {e}"));
            }
        }
        stop.store(true, Ordering::Release);
    }
    let elapsed = start.elapsed();
    let cpu = sys::self_cpu_time().saturating_sub(cpu_start);
    let timeline = progress.finish().await;
    if let Some(e) = first_error {
        return Err(e);
    }
    let ms = |us: u64| us as f64 / 1000.0;
    let empty = hist.is_empty();
    let elapsed_s = elapsed.as_secs_f64();
    Ok(InsertResult {
        target_kind: connector.kind(),
        inserted,
        batches,
        batch_errors: errors.load(Ordering::Relaxed),
        elapsed_s,
        inserts_per_s: inserted as f64 / elapsed_s.max(1e-9),
        batch_latency_ms_avg: if empty { 0.0 } else { hist.mean() / 1000.0 },
        batch_latency_ms_p50: if empty { 0.0 } else { ms(hist.value_at_percentile(50.0)) },
        batch_latency_ms_p95: if empty { 0.0 } else { ms(hist.value_at_percentile(95.0)) },
        batch_latency_ms_p99: if empty { 0.0 } else { ms(hist.value_at_percentile(99.0)) },
        batch_latency_ms_max: if empty { 0.0 } else { ms(hist.max()) },
        client_cpu: sys::cpu_use(cpu, elapsed),
        timeline,
    })
}

impl InsertResult {
    /// The final summary, in bench02's spirit: totals, rate, batch latency, client CPU.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "target                    : {}", self.target_kind);
        let _ = writeln!(s, "documents inserted        : {}", self.inserted);
        let _ = writeln!(s, "batches                   : {} ({} failed)", self.batches, self.batch_errors);
        let _ = writeln!(s, "elapsed seconds           : {:.3}", self.elapsed_s);
        let _ = writeln!(s, "overall inserts per second: {:.1}", self.inserts_per_s);
        let _ = writeln!(
            s,
            "batch latency ms          : avg {:.3}, p50 {:.3}, p95 {:.3}, p99 {:.3}, max {:.3}",
            self.batch_latency_ms_avg, self.batch_latency_ms_p50, self.batch_latency_ms_p95, self.batch_latency_ms_p99, self.batch_latency_ms_max
        );
        let _ = writeln!(
            s,
            "client cpu                : {:.1} s, {:.2} cores, {:.1}% of the machine",
            self.client_cpu.cpu_time_ms as f64 / 1000.0,
            self.client_cpu.cores_used,
            self.client_cpu.share_of_machine_percent
        );
        s
    }

    pub fn json(&self) -> String {
        let v = serde_json::json!({
            "target": self.target_kind,
            "inserted": self.inserted,
            "batches": self.batches,
            "batch_errors": self.batch_errors,
            "elapsed_s": self.elapsed_s,
            "inserts_per_s": self.inserts_per_s,
            "batch_latency_ms": {
                "avg": self.batch_latency_ms_avg, "p50": self.batch_latency_ms_p50, "p95": self.batch_latency_ms_p95,
                "p99": self.batch_latency_ms_p99, "max": self.batch_latency_ms_max,
            },
            "client_cpu": {
                "cpu_time_ms": self.client_cpu.cpu_time_ms,
                "cores_used": self.client_cpu.cores_used,
                "share_of_machine_percent": self.client_cpu.share_of_machine_percent,
            },
            "timeline": self.timeline.iter().map(|t| serde_json::json!({
                "elapsed_s": t.elapsed_s, "inserts_per_s": t.ops_per_s, "batch_latency_us_avg": t.write_latency_us_avg,
            })).collect::<Vec<_>>(),
        });
        serde_json::to_string_pretty(&v).unwrap_or_else(|_| "{}".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_follow_the_options() {
        let o = InsertOptions { text_size_bytes: 200, compressibility: 0.75, customers: 10, products: 5, ..InsertOptions::default() };
        let mut g = OrderGenerator::new(&o, StdRng::seed_from_u64(1));
        for _ in 0..500 {
            let d = g.order();
            assert!((1..=10).contains(&d.customer_id));
            assert!((1..=5).contains(&d.product_id));
            assert!((1..=100).contains(&d.quantity));
            assert!(d.order_date_ms <= g.now_ms && d.order_date_ms > g.now_ms - ORDER_DATE_SPAN_MS);
            assert_eq!(d.text_field.len(), 200);
            // 25% random (50 chars), then 150 repeated characters.
            assert!(d.text_field[50..].bytes().all(|b| b == b'x'));
        }
        // Compressibility 0: all random; the text is not one repeated character.
        let o = InsertOptions { text_size_bytes: 100, compressibility: 0.0, ..InsertOptions::default() };
        let t = OrderGenerator::new(&o, StdRng::seed_from_u64(2)).text();
        assert!(t.bytes().any(|b| b != t.as_bytes()[0]));
    }

    #[test]
    fn budget_reservation() {
        let b = AtomicU64::new(0);
        assert_eq!(reserve(&b, 250, 100), 100);
        assert_eq!(reserve(&b, 250, 100), 100);
        assert_eq!(reserve(&b, 250, 100), 50);
        assert_eq!(reserve(&b, 250, 100), 0);
        assert_eq!(reserve(&AtomicU64::new(0), 0, 100), 100);
    }

    #[test]
    fn validation() {
        assert!(InsertOptions::default().validate().is_ok());
        assert!(InsertOptions { indexes: 4, ..InsertOptions::default() }.validate().is_err());
        assert!(InsertOptions { workers: 0, ..InsertOptions::default() }.validate().is_err());
        assert!(InsertOptions { compressibility: 1.5, ..InsertOptions::default() }.validate().is_err());
        assert!(InsertOptions { run_seconds: 0, num_operations: 0, ..InsertOptions::default() }.validate().is_err());
    }
}
