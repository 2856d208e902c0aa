//! `logship`: how fast the replication log reaches a secondary, and what strict-consistency
//! reads on a secondary cost.
//!
//! 1. Log throughput: a secondary cut off from the primary (fault-layer partition) while the
//!    primary takes inserts, then let go: the rate at which it writes (durably) and applies
//!    the primary's oplog while catching up, with the primary otherwise idle. That is the
//!    transport's throughput, the figure the vendor doubles with RDMA.
//! 2. Strict-consistency reads: YCSB reads (workload C) on the secondary against client
//!    threads, readConcern "local" and "strict", while the primary takes a steady stream of
//!    updates; the strict ones wait until the secondary has applied what the primary had
//!    when they arrived.

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
        Sizes { catch_up_entries: 20_000, read_records: 10_000, read_threads: vec![1, 8], seconds_per_read_phase: 5, background_writes_per_s: 500 }
    } else {
        Sizes { catch_up_entries: 200_000, read_records: 100_000, read_threads: vec![1, 4, 8, 16], seconds_per_read_phase: 20, background_writes_per_s: 1000 }
    }
}

async fn direct(port: u16) -> Result<mongodb::Client> {
    Ok(mongodb::Client::with_uri_str(format!("mongodb://127.0.0.1:{port}/?directConnection=true")).await?)
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
            let states: Vec<String> = st.get_array("members").map(|m| m.iter().filter_map(|d| Some(d.as_document()?.get_str("stateStr").ok()?.to_string())).collect()).unwrap_or_default();
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
pub const TRANSPORTS: [&str; 2] = ["pull", "push"];

struct CatchUp {
    transport: &'static str,
    entries: u64,
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
    let started = Instant::now();
    secondary.database("admin").run_command(link_fault(format!("127.0.0.1:{p}"), false)).await.context("heal")?;
    let mut written_s = None;
    loop {
        let (w, a) = optimes(&secondary).await?;
        if w >= target && written_s.is_none() {
            written_s = Some(started.elapsed().as_secs_f64());
        }
        if a >= target {
            let applied_s = started.elapsed().as_secs_f64();
            let c = CatchUp { transport, entries, written_s: written_s.unwrap_or(applied_s), applied_s };
            eprintln!("scenario: catch-up ({transport}): written in {:.2} s, applied in {:.2} s", c.written_s, c.applied_s);
            return Ok(c);
        }
        if started.elapsed() > CATCH_UP_TIMEOUT {
            bail!("the secondary did not catch up within {CATCH_UP_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct ReadRun {
    level: &'static str,
    threads: usize,
    ops_per_s: f64,
    latency_us: Option<f64>,
}

/// YCSB reads on the secondary, `local` and `strict`, against client threads, while the
/// primary takes `background_writes_per_s` updates.
async fn strict_reads(ctx: &mut ScenarioContext, sz: &Sizes, seconds: u64, phases: &mut Vec<PhaseTimeline>) -> Result<Vec<ReadRun>> {
    let (p, s) = start_pair(ctx, "reads", "pull").await?;
    let mut load = Properties::new();
    load.set("recordcount", sz.read_records.to_string());
    load.set("threadcount", "8");
    load.set("batchsize", "100");
    let primary_url = format!("mongodb://127.0.0.1:{p}/ycsb?directConnection=true&w=1");
    ctx.ycsb("reads: load", Phase::Load, &primary_url, &load).await?;
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
            let label = format!("reads: {threads} threads, readConcern {level}, {} updates/s on the primary", sz.background_writes_per_s);
            let writer_label = format!("{label} (writer)");
            let (r, w) = tokio::join!(ctx.ycsb(&label, Phase::Run, &secondary_url, &reads), ctx.ycsb(&writer_label, Phase::Run, &primary_url, &writes));
            w?;
            let r = r?;
            phases.push(PhaseTimeline { label, timeline: r.timeline.clone(), node_names: node_names.clone() });
            runs.push(ReadRun { level, threads, ops_per_s: r.throughput_ops_per_s, latency_us: r.latency_us_avg("READ") });
        }
    }
    Ok(runs)
}

impl Scenario for Logship {
    fn name(&self) -> &'static str {
        "logship"
    }

    fn description(&self) -> &'static str {
        "replication-log shipping: a secondary's catch-up throughput, and strict-consistency secondary reads against client threads"
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
            let reads = strict_reads(ctx, &sz, seconds, &mut phases).await?;
            ctx.nodes.clear();
            let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
            let throughput = Table {
                title: "Log throughput: a secondary catching up".into(),
                headers: ["Transport", "Entries", "Written (entries/s)", "Written (MB/s)", "Applied (entries/s)"].iter().map(|s| s.to_string()).collect(),
                rows: catch_ups
                    .iter()
                    .map(|c| {
                        vec![
                            c.transport.into(),
                            c.entries.to_string(),
                            format!("{:.0}", rate(c.entries, c.written_s)),
                            format!("{:.1}", rate(c.entries * RECORD_BYTES, c.written_s) / 1e6),
                            format!("{:.0}", rate(c.entries, c.applied_s)),
                        ]
                    })
                    .collect(),
            };
            let fmt = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into());
            let by_threads = Table {
                title: "Secondary reads: local and strict".into(),
                headers: ["Threads", "local (reads/s)", "strict (reads/s)", "strict / local", "local latency (µs)", "strict latency (µs)"].iter().map(|s| s.to_string()).collect(),
                rows: sz
                    .read_threads
                    .iter()
                    .map(|&t| {
                        let find = |l: &str| reads.iter().find(|r| r.threads == t && r.level == l);
                        let (local, strict) = (find("local"), find("strict"));
                        let ratio = match (local, strict) {
                            (Some(l), Some(s)) if l.ops_per_s > 0.0 => format!("{:.2}", s.ops_per_s / l.ops_per_s),
                            _ => "-".into(),
                        };
                        vec![t.to_string(), fmt(local.map(|r| r.ops_per_s)), fmt(strict.map(|r| r.ops_per_s)), ratio, fmt(local.and_then(|r| r.latency_us)), fmt(strict.and_then(|r| r.latency_us))]
                    })
                    .collect(),
            };
            Ok(ScenarioReport {
                title: "shoal replication-log shipping".into(),
                summary: format!(
                    "A primary and one secondary (votes 0) on this machine. Log throughput: the secondary is cut off (fault-layer partition) while {entries} inserts of \
                     {RECORD_BYTES}-byte documents go to the primary, then let go; the rate at which it writes the entries durably to its oplog, and applies them, \
                     with the primary otherwise idle. Secondary reads: YCSB reads (zipfian) on the secondary for {seconds} s per run, readConcern \"local\" and \
                     \"strict\" (wait until the secondary has applied what the primary had when the read arrived), while the primary takes {} updates/s.",
                    sz.background_writes_per_s
                ),
                parameters: vec![
                    ("mode".into(), if ctx.quick { "quick".into() } else { "full".into() }),
                    ("catch-up entries".into(), entries.to_string()),
                    ("read threads".into(), format!("{:?}", sz.read_threads)),
                    ("seconds per read run".into(), seconds.to_string()),
                ],
                machine: sys::machine_info(),
                tables: vec![throughput, by_threads],
                phases,
                notes: vec!["Written: durable in the secondary's oplog (what a write concern counts). Applied: visible to reads on the secondary.".into()],
            })
        })
    }
}
