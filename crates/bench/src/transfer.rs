//! The transfer benchmark: transactions that move an amount from one account to another
//! (debit one document, credit another, commit), from N workers over a table of accounts,
//! against shoal or MongoDB (multi-document transactions: through the lean wire client on one
//! host, the official driver's session API otherwise) and
//! PostgreSQL (`BEGIN; UPDATE; UPDATE; COMMIT` on JSONB rows). A transaction that conflicts
//! runs again; the report counts transactions, attempts, latency and CPU, and checks that
//! the total balance is kept.

use crate::sys;
use crate::target::Connector;
use crate::ycsb::measure::new_histogram;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

pub const WORKERS_MAX: usize = 1024;
pub const ACCOUNTS_MAX: u32 = 100_000_000;
/// Every account's balance at the start.
pub const BALANCE_START: i64 = 1_000_000;

#[derive(Debug, Clone)]
pub struct TransferOptions {
    pub url: String,
    pub database: String,
    pub table: String,
    pub accounts: u32,
    pub workers: usize,
    pub run_seconds: u64,
    /// Reload the accounts first.
    pub load: bool,
    /// Server processes whose CPU time the report divides by transactions.
    pub watch_pids: Vec<(String, u32)>,
}

pub struct TransferReport {
    pub target: &'static str,
    pub transactions: u64,
    pub attempts: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
    /// CPU seconds each watched process used during the run.
    pub server_cpu: Vec<(String, Duration)>,
    pub client_cpu: sys::CpuUse,
    /// The machine's idle CPU during the run, percent.
    pub machine_idle_percent: Option<f64>,
    pub total_kept: bool,
}

impl TransferReport {
    pub fn text(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let tps = self.transactions as f64 / secs;
        let h = &self.latency_us;
        let mut out = format!(
            "[transfer] target {}: {} transactions in {:.1} s: {:.0} transactions/s; latency avg {:.2} ms, p50 {:.2} ms, p99 {:.2} ms; {} attempts ({:.3} per transaction); {} errors; total balance {}\n",
            self.target,
            self.transactions,
            secs,
            tps,
            h.mean() / 1000.0,
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            self.attempts,
            self.attempts as f64 / self.transactions.max(1) as f64,
            self.errors,
            if self.total_kept { "kept" } else { "NOT KEPT" },
        );
        for (name, cpu) in &self.server_cpu {
            out.push_str(&format!("[transfer] {name} CPU: {:.1} us per transaction\n", cpu.as_secs_f64() * 1e6 / self.transactions.max(1) as f64));
        }
        out.push_str(&format!("[transfer] client CPU: {:.2} cores\n", self.client_cpu.cores_used));
        if let Some(idle) = self.machine_idle_percent {
            out.push_str(&format!("[transfer] machine idle: {idle:.0}%\n"));
        }
        out
    }
}

pub async fn run(o: &TransferOptions) -> Result<TransferReport> {
    if o.workers == 0 || o.workers > WORKERS_MAX {
        bail!("--workers must be 1 to {WORKERS_MAX}");
    }
    if o.accounts < 2 || o.accounts > ACCOUNTS_MAX {
        bail!("--accounts must be 2 to {ACCOUNTS_MAX}");
    }
    let connector = Connector::new(&o.url, &o.database).await?;
    let setup = connector.session().await?;
    if o.load {
        setup.accounts_prepare(&o.table, o.accounts, BALANCE_START, true).await?;
    }
    let expected = setup.accounts_total(&o.table).await?;
    let cpu_start: Vec<Option<Duration>> = o.watch_pids.iter().map(|(_, pid)| sys::process_cpu_time(*pid)).collect();
    let self_start = sys::self_cpu_time();
    let machine_start = sys::machine_cpu_ticks();
    let started = Instant::now();
    let until = started + Duration::from_secs(o.run_seconds);
    let mut tasks = Vec::with_capacity(o.workers);
    for w in 0..o.workers {
        let target = connector.session().await?;
        let table = o.table.clone();
        let accounts = o.accounts;
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(0x5EED ^ w as u64);
            let mut latency = new_histogram();
            let (mut transactions, mut attempts, mut errors) = (0u64, 0u64, 0u64);
            while Instant::now() < until {
                let from = rng.gen_range(0..accounts);
                let to = (from + rng.gen_range(1..accounts)) % accounts;
                let amount = rng.gen_range(1..100);
                let t = Instant::now();
                match target.transfer(&table, from, to, amount).await {
                    Ok(n) => {
                        transactions += 1;
                        attempts += u64::from(n);
                        let _ = latency.record(t.elapsed().as_micros() as u64);
                    }
                    Err(e) => {
                        errors += 1;
                        if errors <= 3 {
                            eprintln!("transfer error: {e:#}");
                        }
                    }
                }
            }
            (transactions, attempts, errors, latency)
        }));
    }
    let mut report = TransferReport {
        target: connector.kind(),
        transactions: 0,
        attempts: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        latency_us: new_histogram(),
        server_cpu: Vec::new(),
        client_cpu: sys::cpu_use(Duration::ZERO, Duration::from_secs(1)),
        machine_idle_percent: None,
        total_kept: false,
    };
    for t in tasks {
        let (n, a, e, h) = t.await.context("a worker")?;
        report.transactions += n;
        report.attempts += a;
        report.errors += e;
        report.latency_us.add(&h).context("merge latencies")?;
    }
    report.elapsed = started.elapsed();
    report.client_cpu = sys::cpu_use(sys::self_cpu_time().saturating_sub(self_start), report.elapsed);
    report.machine_idle_percent = machine_start.zip(sys::machine_cpu_ticks()).map(|(a, b)| sys::idle_percent(a, b));
    for ((name, pid), start) in o.watch_pids.iter().zip(cpu_start) {
        if let (Some(a), Some(b)) = (start, sys::process_cpu_time(*pid)) {
            report.server_cpu.push((name.clone(), b.saturating_sub(a)));
        }
    }
    report.total_kept = setup.accounts_total(&o.table).await? == expected;
    Ok(report)
}
