//! `logship`: how fast the replication log reaches a secondary, and what strict-consistency
//! reads on a secondary cost.
//!
//! 1. Log throughput: a secondary cut off from the primary (fault-layer partition) while the
//!    primary takes inserts, then let go: the rate at which it writes (durably) and applies
//!    the primary's oplog while catching up, with the primary otherwise idle. That is the
//!    transport's throughput, the figure the vendor doubles with RDMA.
//! 2. Lag against write rate: inserts at fractions of the peak rate, and how long entries
//!    take from the primary's oplog to durable on the secondary (the primary's
//!    metrics.repl.lag histogram, differenced over each phase).
//! 3. Strict-consistency reads: YCSB reads (workload C) on the secondary against client
//!    threads, readConcern "local" and "strict", while the primary takes a steady stream of
//!    updates; the strict ones wait until the secondary has applied what the primary had
//!    when they arrived.

use super::chaining::direct;
use super::{PhaseTimeline, Scenario, ScenarioContext, ScenarioReport, Table};
use crate::sys;
use crate::target::BoxFuture;
use crate::ycsb::{props::Properties, Phase};
use anyhow::{bail, Context, Result};
use mongodb::bson::{doc, Document};
use std::time::{Duration, Instant};

pub struct Logship;

const SET_READY_TIMEOUT: Duration = Duration::from_secs(60);
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(600);
/// Bytes per YCSB record: 10 fields of 100 bytes.
const RECORD_BYTES: u64 = 1000;

#[derive(Debug, Clone)]
pub struct Sizes {
    /// Entries the secondary catches up on.
    pub catch_up_entries: u64,
    /// Records the read phases read from.
    pub read_records: u64,
    pub read_threads: Vec<usize>,
    pub seconds_per_read_phase: u64,
    /// Updates per second on the primary during the read phases.
    pub background_writes_per_s: u64,
}

pub fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes { catch_up_entries: 100_000, read_records: 10_000, read_threads: vec![1, 8], seconds_per_read_phase: 5, background_writes_per_s: 500 }
    } else {
        Sizes { catch_up_entries: 300_000, read_records: 100_000, read_threads: vec![1, 4, 8, 16], seconds_per_read_phase: 20, background_writes_per_s: 1000 }
    }
}

/// Start a primary and one secondary without a vote (so the primary keeps its role while the
/// secondary is cut off) and wait until both are up.
async fn start_pair(ctx: &mut ScenarioContext, tag: &str, transport: &str) -> Result<(u16, u16)> {
    ctx.nodes.clear();
    for i in 0..2 {
        let args = ["--replSet", "rs0", "--wiredTigerCacheSizeGB", "0.25", "--setParameter", "enableTestCommands=1", "--logTransport", transport];
        ctx.start_node(&format!("{tag}-{i}"), &args.map(String::from))?;
    }
    let (p, s) = (ctx.nodes[0].port, ctx.nodes[1].port);
    let config = doc! {"_id": "rs0", "version": 1, "members": [
        {"_id": 0, "host": format!("127.0.0.1:{p}")},
        {"_id": 1, "host": format!("127.0.0.1:{s}"), "priority": 0, "votes": 0},
    ]};
    let first = direct(p).await?;
    first.database("admin").run_command(doc! {"replSetInitiate": config}).await.context("replSetInitiate")?;
    let deadline = Instant::now() + SET_READY_TIMEOUT;
    loop {
        if let Ok(st) = first.database("admin").run_command(doc! {"replSetGetStatus": 1}).await {
            let states: Vec<String> = st
                .get_array("members")
                .map(|m| m.iter().filter_map(|d| Some(d.as_document()?.get_str("stateStr").ok()?.to_string())).collect())
                .unwrap_or_default();
            if states == ["PRIMARY", "SECONDARY"] {
                return Ok((p, s));
            }
        }
        if Instant::now() >= deadline {
            bail!("the pair was not ready within {SET_READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A member's newest written and applied optimes' timestamps (replSetGetStatus).
async fn optimes(c: &mongodb::Client) -> Result<(u64, u64)> {
    let st = c.database("admin").run_command(doc! {"replSetGetStatus": 1}).await?;
    let o = st.get_document("optimes")?;
    let ts = |k: &str| -> Result<u64> {
        let t = o.get_document(k)?.get_timestamp("ts")?;
        Ok((u64::from(t.time) << 32) | u64::from(t.increment))
    };
    Ok((ts("writtenOpTime")?, ts("appliedOpTime")?))
}

fn link_fault(host: String, partition: bool) -> Document {
    doc! {"configureFailPoint": "replLink", "mode": if partition { "alwaysOn" } else { "off" }, "data": {"host": host, "partition": partition}}
}

/// The transports compared: mongod's pull first, the baseline.
pub const TRANSPORTS: [&str; 3] = ["pull", "push", "shm"];

struct CatchUp {
    transport: &'static str,
    entries: u64,
    /// CPU the primary and the secondary spent from the heal to the last apply.
    cpu_s: (f64, f64),
    written_s: f64,
    applied_s: f64,
}

/// Cut the secondary off, insert `entries` documents on the primary, let the secondary go
/// and time its catch-up.
async fn catch_up(ctx: &mut ScenarioContext, transport: &'static str, entries: u64) -> Result<CatchUp> {
    let (p, s) = start_pair(ctx, &format!("catchup-{transport}"), transport).await?;
    let secondary = direct(s).await?;
    secondary.database("admin").run_command(link_fault(format!("127.0.0.1:{p}"), true)).await.context("partition")?;
    let mut props = Properties::new();
    props.set("recordcount", entries.to_string());
    props.set("threadcount", "8");
    props.set("batchsize", "100");
    let url = format!("mongodb://127.0.0.1:{p}/ycsb?directConnection=true&w=1");
    ctx.ycsb(&format!("catch-up ({transport}): {entries} inserts on the primary while the secondary is cut off"), Phase::Load, &url, &props).await?;
    let primary = direct(p).await?;
    let (target, _) = optimes(&primary).await?;
    eprintln!("scenario: catch-up ({transport}): the secondary catches up ...");
    let (before, _) = optimes(&secondary).await?;
    let pids = (ctx.nodes[0].pid(), ctx.nodes[1].pid());
    let cpu = move || (sys::process_cpu_time(pids.0).unwrap_or_default(), sys::process_cpu_time(pids.1).unwrap_or_default());
    let cpu_before = cpu();
    let healed = Instant::now();
    secondary.database("admin").run_command(link_fault(format!("127.0.0.1:{p}"), false)).await.context("heal")?;
    // Timed from the first entry written, not from the heal: reconnecting to the source is
    // not shipping.
    let mut started = None;
    let mut written_s = None;
    loop {
        let (w, a) = optimes(&secondary).await?;
        if started.is_none() && w > before {
            started = Some(Instant::now());
        }
        let Some(t0) = started else {
            if healed.elapsed() > CATCH_UP_TIMEOUT {
                bail!("the secondary wrote nothing within {CATCH_UP_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        };
        if w >= target && written_s.is_none() {
            written_s = Some(t0.elapsed().as_secs_f64());
        }
        if a >= target {
            let applied_s = t0.elapsed().as_secs_f64();
            let cpu_after = cpu();
            let cpu_s = ((cpu_after.0 - cpu_before.0).as_secs_f64(), (cpu_after.1 - cpu_before.1).as_secs_f64());
            let c = CatchUp { transport, entries, cpu_s, written_s: written_s.unwrap_or(applied_s), applied_s };
            eprintln!(
                "scenario: catch-up ({transport}): written in {:.2} s, applied in {:.2} s; CPU: primary {:.2} s, secondary {:.2} s",
                c.written_s, c.applied_s, cpu_s.0, cpu_s.1
            );
            return Ok(c);
        }
        if healed.elapsed() > CATCH_UP_TIMEOUT {
            bail!("the secondary did not catch up within {CATCH_UP_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The primary's replication-lag histogram (serverStatus metrics.repl.lag.counts): bucket
/// `i` counts lags below 2^(i/4) µs.
async fn lag_counts(c: &mongodb::Client) -> Result<Vec<i64>> {
    let st = c.database("admin").run_command(doc! {"serverStatus": 1}).await?;
    let counts = st.get_document("metrics")?.get_document("repl")?.get_document("lag")?.get_array("counts")?;
    Ok(counts.iter().map(|v| v.as_i64().unwrap_or(0)).collect())
}

/// The `p` quantile (0-1) of the samples between two histogram snapshots, in µs (a bucket's
/// upper bound), and the sample count.
fn lag_quantile(before: &[i64], after: &[i64], p: f64) -> (Option<f64>, i64) {
    let diff: Vec<i64> = after.iter().zip(before.iter().chain(std::iter::repeat(&0))).map(|(a, b)| a - b).collect();
    let n: i64 = diff.iter().sum();
    if n == 0 {
        return (None, 0);
    }
    let want = ((n as f64) * p).ceil().max(1.0) as i64;
    let mut seen = 0;
    for (i, c) in diff.iter().enumerate() {
        seen += c;
        if seen >= want {
            return (Some(if i == 0 { 0.0 } else { 2f64.powf(i as f64 / 4.0) }), n);
        }
    }
    (None, n)
}

struct LagRun {
    transport: &'static str,
    percent_of_peak: u64,
    writes_per_s: f64,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    samples: i64,
}

/// Write rates from `LAG_RATES_PERCENT` of the peak: the lag (how long an entry takes from
/// the primary's oplog to durable on the secondary, as the primary sees the reports) at each.
const LAG_RATES_PERCENT: [u64; 4] = [20, 40, 60, 80];

async fn lag_curve(ctx: &mut ScenarioContext, transport: &'static str, seconds: u64, phases: &mut Vec<PhaseTimeline>) -> Result<(f64, Vec<LagRun>)> {
    let (p, _s) = start_pair(ctx, &format!("lag-{transport}"), transport).await?;
    let primary = direct(p).await?;
    // A database per phase: each phase's inserts start from the same keys.
    let url = |phase: &str| format!("mongodb://127.0.0.1:{p}/ycsb_{phase}?directConnection=true&w=1");
    let node_names: Vec<String> = ctx.nodes.iter().map(|n| n.name.clone()).collect();
    let inserts = |target: Option<f64>| {
        let mut props = Properties::new();
        props.set("recordcount", "100000000");
        props.set("maxexecutiontime", seconds.to_string());
        props.set("threadcount", "8");
        props.set("batchsize", "1");
        if let Some(t) = target {
            props.set("target", format!("{t:.0}"));
        }
        props
    };
    let peak = ctx.ycsb(&format!("lag ({transport}): peak insert rate"), Phase::Load, &url("peak"), &inserts(None)).await?.throughput_ops_per_s;
    let mut runs = Vec::new();
    for pct in LAG_RATES_PERCENT {
        let rate = peak * pct as f64 / 100.0;
        let before = lag_counts(&primary).await?;
        let label = format!("lag ({transport}): inserts at {pct}% of the peak ({rate:.0}/s)");
        let r = ctx.ycsb(&label, Phase::Load, &url(&format!("at{pct}")), &inserts(Some(rate))).await?;
        let after = lag_counts(&primary).await?;
        let (p50, samples) = lag_quantile(&before, &after, 0.5);
        let (p99, _) = lag_quantile(&before, &after, 0.99);
        phases.push(PhaseTimeline { label, timeline: r.timeline.clone(), node_names: node_names.clone() });
        runs.push(LagRun { transport, percent_of_peak: pct, writes_per_s: r.throughput_ops_per_s, p50_us: p50, p99_us: p99, samples });
    }
    Ok((peak, runs))
}

struct ReadRun {
    transport: &'static str,
    level: &'static str,
    threads: usize,
    ops_per_s: f64,
    latency_us: Option<f64>,
}

/// YCSB reads on the secondary, `local` and `strict`, against client threads, while the
/// primary takes `background_writes_per_s` updates.
async fn strict_reads(ctx: &mut ScenarioContext, transport: &'static str, sz: &Sizes, seconds: u64, phases: &mut Vec<PhaseTimeline>) -> Result<Vec<ReadRun>> {
    let (p, s) = start_pair(ctx, &format!("reads-{transport}"), transport).await?;
    let mut load = Properties::new();
    load.set("recordcount", sz.read_records.to_string());
    load.set("threadcount", "8");
    load.set("batchsize", "100");
    let primary_url = format!("mongodb://127.0.0.1:{p}/ycsb?directConnection=true&w=1");
    ctx.ycsb(&format!("reads ({transport}): load"), Phase::Load, &primary_url, &load).await?;
    let node_names: Vec<String> = ctx.nodes.iter().map(|n| n.name.clone()).collect();
    let mut runs = Vec::new();
    for &threads in &sz.read_threads {
        for level in ["local", "strict"] {
            let mut reads = Properties::new();
            reads.set("recordcount", sz.read_records.to_string());
            reads.set("operationcount", "1000000000");
            reads.set("maxexecutiontime", seconds.to_string());
            reads.set("threadcount", threads.to_string());
            reads.set("readproportion", "1");
            reads.set("updateproportion", "0");
            reads.set("requestdistribution", "zipfian");
            let mut writes = Properties::new();
            writes.set("recordcount", sz.read_records.to_string());
            writes.set("operationcount", "1000000000");
            writes.set("maxexecutiontime", seconds.to_string());
            writes.set("threadcount", "2");
            writes.set("readproportion", "0");
            writes.set("updateproportion", "1");
            writes.set("target", sz.background_writes_per_s.to_string());
            let secondary_url = format!("mongodb://127.0.0.1:{s}/ycsb?directConnection=true&readPreference=secondary&readConcernLevel={level}");
            let label = format!("reads ({transport}): {threads} threads, readConcern {level}, {} updates/s on the primary", sz.background_writes_per_s);
            let writer_label = format!("{label} (writer)");
            let (r, w) = tokio::join!(ctx.ycsb(&label, Phase::Run, &secondary_url, &reads), ctx.ycsb(&writer_label, Phase::Run, &primary_url, &writes));
            w?;
            let r = r?;
            phases.push(PhaseTimeline { label, timeline: r.timeline.clone(), node_names: node_names.clone() });
            runs.push(ReadRun { transport, level, threads, ops_per_s: r.throughput_ops_per_s, latency_us: r.latency_us_avg("READ") });
        }
    }
    Ok(runs)
}

impl Scenario for Logship {
    fn name(&self) -> &'static str {
        "logship"
    }

    fn description(&self) -> &'static str {
        "replication-log shipping, pull, push and shm: a secondary's catch-up throughput, lag against write rate, strict-consistency secondary reads against client threads"
    }

    fn run<'a>(&'a self, ctx: &'a mut ScenarioContext) -> BoxFuture<'a, Result<ScenarioReport>> {
        Box::pin(async move {
            let sz = sizes(ctx.quick);
            let seconds = ctx.sizes.seconds_per_phase.unwrap_or(sz.seconds_per_read_phase).max(1);
            let entries = ctx.sizes.records.unwrap_or(sz.catch_up_entries).max(1);
            let mut phases = Vec::new();
            let mut catch_ups = Vec::new();
            for t in TRANSPORTS {
                catch_ups.push(catch_up(ctx, t, entries).await?);
            }
            let mut lags = Vec::new();
            let mut peaks = Vec::new();
            for t in TRANSPORTS {
                let (peak, runs) = lag_curve(ctx, t, seconds, &mut phases).await?;
                peaks.push((t, peak));
                lags.extend(runs);
            }
            let mut reads = Vec::new();
            for t in TRANSPORTS {
                reads.extend(strict_reads(ctx, t, &sz, seconds, &mut phases).await?);
            }
            ctx.nodes.clear();
            let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
            let throughput = Table {
                title: "Log throughput: a secondary catching up".into(),
                headers: ["Transport", "Entries", "Written (entries/s)", "Written (MB/s)", "Applied (entries/s)", "Primary CPU (s)", "Secondary CPU (s)"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                rows: catch_ups
                    .iter()
                    .map(|c| {
                        vec![
                            c.transport.into(),
                            c.entries.to_string(),
                            format!("{:.0}", rate(c.entries, c.written_s)),
                            format!("{:.1}", rate(c.entries * RECORD_BYTES, c.written_s) / 1e6),
                            format!("{:.0}", rate(c.entries, c.applied_s)),
                            format!("{:.2}", c.cpu_s.0),
                            format!("{:.2}", c.cpu_s.1),
                        ]
                    })
                    .collect(),
            };
            let fmt = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into());
            let by_threads = Table {
                title: "Secondary reads: local and strict".into(),
                headers: ["Transport", "Threads", "local (reads/s)", "strict (reads/s)", "strict / local", "local latency (µs)", "strict latency (µs)"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                rows: TRANSPORTS
                    .iter()
                    .flat_map(|&tr| sz.read_threads.iter().map(move |&t| (tr, t)))
                    .map(|(tr, t)| {
                        let find = |l: &str| reads.iter().find(|r| r.transport == tr && r.threads == t && r.level == l);
                        let (local, strict) = (find("local"), find("strict"));
                        let ratio = match (local, strict) {
                            (Some(l), Some(s)) if l.ops_per_s > 0.0 => format!("{:.2}", s.ops_per_s / l.ops_per_s),
                            _ => "-".into(),
                        };
                        vec![
                            tr.to_string(),
                            t.to_string(),
                            fmt(local.map(|r| r.ops_per_s)),
                            fmt(strict.map(|r| r.ops_per_s)),
                            ratio,
                            fmt(local.and_then(|r| r.latency_us)),
                            fmt(strict.and_then(|r| r.latency_us)),
                        ]
                    })
                    .collect(),
            };
            let ms = |v: Option<f64>| v.map(|x| format!("{:.2}", x / 1000.0)).unwrap_or_else(|| "-".into());
            let lag_table = Table {
                title: "Replication lag against write rate".into(),
                headers: ["Transport", "Peak inserts/s", "% of peak", "Inserts/s", "Lag p50 (ms)", "Lag p99 (ms)", "Samples"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                rows: lags
                    .iter()
                    .map(|l| {
                        let peak = peaks.iter().find(|(t, _)| *t == l.transport).map_or(0.0, |(_, p)| *p);
                        vec![
                            l.transport.into(),
                            format!("{peak:.0}"),
                            l.percent_of_peak.to_string(),
                            format!("{:.0}", l.writes_per_s),
                            ms(l.p50_us),
                            ms(l.p99_us),
                            l.samples.to_string(),
                        ]
                    })
                    .collect(),
            };
            Ok(ScenarioReport {
                title: "shoal replication-log shipping".into(),
                summary: format!(
                    "A primary and one secondary (votes 0) on this machine. Log throughput: the secondary is cut off (fault-layer partition) while {entries} inserts of \
                     {RECORD_BYTES}-byte documents go to the primary, then let go; the rate at which it writes the entries durably to its oplog, and applies them, \
                     with the primary otherwise idle. Lag: YCSB inserts at 20-80% of the peak rate, and how long entries take to become durable on \
                     the secondary. Secondary reads: YCSB reads (zipfian) on the secondary for {seconds} s per run, readConcern \"local\" and \
                     \"strict\" (wait until the secondary has applied every write the primary had acknowledged when the read arrived), while the primary takes {} updates/s.",
                    sz.background_writes_per_s
                ),
                parameters: vec![
                    ("mode".into(), if ctx.quick { "quick".into() } else { "full".into() }),
                    ("catch-up entries".into(), entries.to_string()),
                    ("read threads".into(), format!("{:?}", sz.read_threads)),
                    ("seconds per read run".into(), seconds.to_string()),
                ],
                machine: sys::machine_info(),
                tables: vec![throughput, lag_table, by_threads],
                phases,
                notes: vec![
                    "Written: durable in the secondary's oplog (what a write concern counts). Applied: visible to reads on the secondary.".into(),
                    "Lag: each time the secondary reports entries durable, how long ago the oldest of them was logged on the primary (serverStatus metrics.repl.lag, \
                     buckets of a quarter doubling: a percentile is its bucket's upper bound). Peak: YCSB inserts, one document each, from 8 threads at w:1."
                        .into(),
                    "Strict reads ask the primary where its acknowledged writes reach (replSetGetAcknowledged), once for all reads that arrived meanwhile, \
                     or, on the primary's host, read its shared-memory position page."
                        .into(),
                ],
            })
        })
    }
}
