//! YCSB-compatible load generator: CoreWorkload semantics, Client/ClientThread threading and
//! throttling, DBWrapper measurements and YCSB's text/JSON output.

pub mod generator;
pub mod measure;
pub mod props;
pub mod workload;

use crate::progress::{Progress, ProgressConfig, Style, TimelineSample};
use crate::sys;
use crate::target::Connector;
use anyhow::{bail, Context, Result};
use measure::{LiveStats, Measurements, Row};
use props::Properties;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::{elapsed_us, CoreWorkload};

/// Client tasks a run may start: far more than a 2-core client can drive usefully.
pub const THREADS_MAX: usize = 4096;
pub const DEFAULT_MONGODB_URL: &str = "mongodb://localhost:27017/ycsb?w=1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Load,
    Run,
}

impl Phase {
    pub fn parse(s: &str) -> Result<Phase> {
        match s {
            "load" => Ok(Phase::Load),
            "run" => Ok(Phase::Run),
            other => bail!("phase must be load or run, got {other:?}"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct YcsbOptions {
    pub phase: Phase,
    pub props: Properties,
    /// Drop the table/collection before a load.
    pub drop_first: bool,
    /// Processes whose CPU use is sampled into the timeline.
    pub watch_pids: Vec<(String, u32)>,
    pub quiet: bool,
    pub label: String,
    /// The live counters the run updates, when the caller watches them during the run.
    pub live: Option<Arc<LiveStats>>,
}

impl YcsbOptions {
    pub fn new(phase: Phase, props: Properties) -> YcsbOptions {
        YcsbOptions { phase, props, drop_first: false, watch_pids: Vec::new(), quiet: false, label: String::new(), live: None }
    }

    pub fn url(&self) -> String {
        self.props.get("postgresql.url").or_else(|| self.props.get("mongodb.url")).unwrap_or(DEFAULT_MONGODB_URL).to_string()
    }

    pub fn threads(&self) -> Result<usize> {
        let n = self.props.get_i64("threadcount", 1)?;
        if n < 1 || n as usize > THREADS_MAX {
            bail!("threadcount={n} must be between 1 and {THREADS_MAX}");
        }
        Ok(n as usize)
    }
}

#[derive(Debug, Clone)]
pub struct YcsbResult {
    pub phase: Phase,
    pub target_kind: &'static str,
    pub runtime_ms: u64,
    pub operations: u64,
    pub throughput_ops_per_s: f64,
    pub measurements: Measurements,
    pub client_cpu: sys::CpuUse,
    pub timeline: Vec<TimelineSample>,
    /// The exported rows, in YCSB's order ([OVERALL], [CLIENT], then per operation).
    pub rows: Vec<Row>,
}

impl YcsbResult {
    pub fn text(&self) -> String {
        measure::to_text(&self.rows)
    }
    pub fn json(&self) -> String {
        measure::to_json(&self.rows)
    }
    /// Average latency of an operation, from the merged histogram.
    pub fn latency_us_avg(&self, op: &str) -> Option<f64> {
        self.measurements.get(op).filter(|m| !m.histogram.is_empty()).map(|m| m.histogram.mean())
    }
    pub fn operations_of(&self, op: &str) -> u64 {
        self.measurements.get(op).map(|m| m.histogram.len()).unwrap_or(0)
    }
}

/// Client.java: operations per thread, the remainder going to the first threads.
pub fn thread_op_count(op_count: u64, threads: usize, thread_id: usize) -> u64 {
    let t = threads.max(1) as u64;
    op_count / t + if (thread_id as u64) < op_count % t { 1 } else { 0 }
}

/// Runs one YCSB phase to completion.
pub async fn run(opts: &YcsbOptions) -> Result<YcsbResult> {
    let p = &opts.props;
    let workload = Arc::new(CoreWorkload::init(p)?);
    let threads = opts.threads()?;
    let op_count: u64 = match opts.phase {
        Phase::Load => match p.get("insertcount") {
            Some(_) => p.get_i64("insertcount", 0)?.max(0) as u64,
            None => p.get_i64("recordcount", 0)?.max(0) as u64,
        },
        Phase::Run => p.get_i64("operationcount", 0)?.max(0) as u64,
    };
    let max_execution_time_s = p.get_i64("maxexecutiontime", 0)?.max(0) as u64;
    if opts.phase == Phase::Run && !workload.has_operations() {
        bail!("no operation has a positive proportion");
    }
    if op_count == 0 && max_execution_time_s == 0 {
        bail!("operation count is 0 and maxexecutiontime is not set: the run would never end");
    }
    let target_ops_per_s = p.get_f64("target", 0.0)?.max(0.0);
    // ClientThread: target per thread per ms, and the tick between its operations.
    let tick = if target_ops_per_s > 0.0 {
        let per_thread_per_ms = target_ops_per_s / threads as f64 / 1000.0;
        Some(Duration::from_nanos((1_000_000.0 / per_thread_per_ms) as u64))
    } else {
        None
    };

    let url = opts.url();
    let connector = Arc::new(Connector::new(&url, "ycsb").await?);
    if !opts.quiet {
        eprintln!("{} client connection created with {}", connector.kind(), redact(&url));
    }
    if opts.phase == Phase::Load {
        let session = connector.session().await?;
        session.ycsb_prepare(&workload.table, opts.drop_first).await?;
    }

    let live = opts.live.clone().unwrap_or_default();
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Progress::start(
        ProgressConfig {
            label: if opts.label.is_empty() { format!("ycsb {}", if opts.phase == Phase::Load { "load" } else { "run" }) } else { opts.label.clone() },
            style: Style::Ycsb,
            total_ops: Some(op_count).filter(|n| *n > 0),
            max_time: Some(Duration::from_secs(max_execution_time_s)).filter(|d| !d.is_zero()),
            watch_pids: opts.watch_pids.clone(),
            interactive: None,
            quiet: opts.quiet,
        },
        live.clone(),
    );
    let terminator = if max_execution_time_s > 0 {
        let stop = stop.clone();
        Some(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(max_execution_time_s)).await;
            stop.store(true, Ordering::Release);
        }))
    } else {
        None
    };

    let cpu_start = sys::self_cpu_time();
    let wall_start = Instant::now();
    let mut handles = Vec::with_capacity(threads);
    for thread_id in 0..threads {
        let workload = workload.clone();
        let connector = connector.clone();
        let live = live.clone();
        let stop = stop.clone();
        let phase = opts.phase;
        let my_ops = if op_count == 0 { 0 } else { thread_op_count(op_count, threads, thread_id) };
        handles.push(tokio::spawn(async move { client_thread(phase, workload, connector, live, stop, my_ops, tick).await }));
    }
    let mut measurements = Measurements::new();
    let mut operations = 0u64;
    let mut first_error = None;
    for h in handles {
        match h.await {
            Ok(Ok((m, ops))) => {
                measurements.merge(&m);
                operations += ops;
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(anyhow::anyhow!("client task failed: {e}"));
            }
        }
    }
    let wall = wall_start.elapsed();
    let cpu = sys::self_cpu_time().saturating_sub(cpu_start);
    if let Some(t) = terminator {
        t.abort();
    }
    let timeline = progress.finish().await;
    if let Some(e) = first_error {
        return Err(e);
    }
    let runtime_ms = wall.as_millis() as u64;
    let throughput = 1000.0 * operations as f64 / runtime_ms.max(1) as f64;
    let client_cpu = sys::cpu_use(cpu, wall);
    let mut rows = vec![Row::int("OVERALL", "RunTime(ms)", runtime_ms as i64), Row::float("OVERALL", "Throughput(ops/sec)", throughput)];
    rows.push(Row::int("CLIENT", "CpuTime(ms)", client_cpu.cpu_time_ms as i64));
    rows.push(Row::float("CLIENT", "CpuCoresUsed", round3(client_cpu.cores_used)));
    rows.push(Row::float("CLIENT", "CpuShareOfMachine(%)", round3(client_cpu.share_of_machine_percent)));
    measurements.export_rows(&mut rows);
    Ok(YcsbResult {
        phase: opts.phase,
        target_kind: connector.kind(),
        runtime_ms,
        operations,
        throughput_ops_per_s: throughput,
        measurements,
        client_cpu,
        timeline,
        rows,
    })
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Hides a password in a URL for log lines.
pub fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((cred, host)) = rest.split_once('@') {
            if let Some((user, _)) = cred.split_once(':') {
                return format!("{scheme}://{user}:***@{host}");
            }
        }
    }
    url.to_string()
}

/// ClientThread.run: init, the operation loop with throttling, cleanup (measured).
async fn client_thread(
    phase: Phase,
    workload: Arc<CoreWorkload>,
    connector: Arc<Connector>,
    live: Arc<LiveStats>,
    stop: Arc<AtomicBool>,
    op_count: u64,
    tick: Option<Duration>,
) -> Result<(Measurements, u64)> {
    let db = connector.session().await.context("client session")?;
    let mut st = workload.init_thread();
    let mut m = Measurements::new();
    let mut ops_done = 0u64;
    if let Some(t) = tick {
        // Spread the threads' first operations over one tick (YCSB does this for slow targets).
        if t >= Duration::from_millis(1) {
            let delay_ns = rand::Rng::gen_range(&mut rand::thread_rng(), 0..t.as_nanos().max(1) as u64);
            tokio::time::sleep(Duration::from_nanos(delay_ns)).await;
        }
    }
    let start = tokio::time::Instant::now();
    while (op_count == 0 || ops_done < op_count) && !stop.load(Ordering::Acquire) {
        let more = match phase {
            Phase::Load => workload.do_insert(db.as_ref(), &mut st, &mut m, &live).await,
            Phase::Run => workload.do_transaction(db.as_ref(), &mut st, &mut m, &live).await,
        };
        if !more {
            break;
        }
        ops_done += 1;
        if let Some(t) = tick {
            // Deadline-based, so a slow operation is caught up by the next ones.
            let deadline = start + t.saturating_mul(u32::try_from(ops_done).unwrap_or(u32::MAX));
            tokio::time::sleep_until(deadline).await;
        }
    }
    let cleanup_start = Instant::now();
    workload.flush(db.as_ref(), &mut st, &mut m, &live).await;
    drop(db);
    let us = elapsed_us(cleanup_start);
    m.measure("CLEANUP", us);
    m.report_status("CLEANUP", measure::Status::Ok);
    Ok((m, ops_done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_split_like_ycsb_client() {
        let split: Vec<u64> = (0..3).map(|t| thread_op_count(10, 3, t)).collect();
        assert_eq!(split, vec![4, 3, 3]);
        assert_eq!((0..8).map(|t| thread_op_count(1000, 8, t)).sum::<u64>(), 1000);
        assert_eq!(thread_op_count(2, 4, 3), 0);
    }

    #[test]
    fn urls() {
        let mut o = YcsbOptions::new(Phase::Load, Properties::new());
        assert_eq!(o.url(), DEFAULT_MONGODB_URL);
        o.props.set("mongodb.url", "mongodb://h:1/db?w=majority");
        assert_eq!(o.url(), "mongodb://h:1/db?w=majority");
        assert_eq!(redact("postgresql://u:secret@h/db"), "postgresql://u:***@h/db");
        assert_eq!(redact("mongodb://h/"), "mongodb://h/");
        assert!(Phase::parse("load").is_ok() && Phase::parse("x").is_err());
    }
}
