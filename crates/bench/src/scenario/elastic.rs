//! `elastic`: the elastic-cluster reports' insert test. bench02 inserts (1 KB documents, three
//! compound secondary indexes, unordered batches of 1,000) into a collection hash-sharded on
//! customerId behind a router, over 1, 2, 4... shards (each a one-member replica set), and
//! into one shard written directly (the router's overhead). Each process's CPU is sampled, so
//! the router's and the shards' CPU per insert are measured: scaling past this machine's two
//! cores is projected from them, since here every shard shares the same cores.

use super::{PhaseTimeline, Scenario, ScenarioContext, ScenarioReport, Table};
use crate::insert::{self, InsertOptions, InsertResult};
use crate::sys;
use crate::target::BoxFuture;
use anyhow::{bail, Context, Result};
use mongodb::bson::doc;
use std::time::{Duration, Instant};

pub struct Elastic;

/// Shards a run may have (and a router, config servers: within `NODES_MAX`).
const SHARDS_MAX: usize = 16;
const SET_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Client workers: enough batches in flight to keep every shard busy.
const WORKERS: usize = 16;
const BATCH_SIZE: usize = 1000;

struct Sizes {
    shard_counts: Vec<usize>,
    seconds: u64,
}

fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes { shard_counts: vec![1, 2], seconds: 15 }
    } else {
        Sizes { shard_counts: vec![1, 2, 4, 8, 16], seconds: 60 }
    }
}

async fn direct(port: u16) -> Result<mongodb::Client> {
    mongodb::Client::with_uri_str(format!("mongodb://127.0.0.1:{port}/?directConnection=true")).await.context("connect")
}

/// replSetInitiate a one-member set and wait until it is primary.
async fn initiate(port: u16, set: &str) -> Result<()> {
    let c = direct(port).await?;
    let cfg = doc! {"_id": set, "version": 1, "members": [{"_id": 0, "host": format!("127.0.0.1:{port}")}]};
    c.database("admin").run_command(doc! {"replSetInitiate": cfg}).await.with_context(|| format!("replSetInitiate {set}"))?;
    let deadline = Instant::now() + SET_READY_TIMEOUT;
    loop {
        let hello = c.database("admin").run_command(doc! {"hello": 1}).await?;
        if hello.get_bool("isWritablePrimary").unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{set} did not elect itself within {SET_READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A process's CPU averaged over the run (% of one core).
fn cpu(r: &InsertResult, i: usize) -> f64 {
    let v: Vec<f64> = r.timeline.iter().filter_map(|s| s.cpu_percent.get(i).copied()).collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

struct Run {
    label: String,
    shards: usize,
    result: InsertResult,
    /// % of a core, averaged.
    router_cpu: Option<f64>,
    shards_cpu: f64,
}

impl Run {
    /// CPU microseconds per inserted document.
    fn per_insert_us(&self, cpu_percent: f64) -> f64 {
        if self.result.inserts_per_s <= 0.0 {
            0.0
        } else {
            cpu_percent / 100.0 * 1e6 / self.result.inserts_per_s
        }
    }
}

fn insert_options(url: String, seconds: u64, shard: bool, watch: Vec<(String, u32)>) -> InsertOptions {
    InsertOptions {
        url,
        workers: WORKERS,
        batch_size: BATCH_SIZE,
        run_seconds: seconds,
        indexes: 3,
        text_size_bytes: 1000,
        shard,
        watch_pids: watch,
        quiet: true,
        ..InsertOptions::default()
    }
}

impl Scenario for Elastic {
    fn name(&self) -> &'static str {
        "elastic"
    }

    fn description(&self) -> &'static str {
        "bench02 inserts into a collection hash-sharded on customerId behind a router, over 1, 2, 4, 8, 16 shards, and one shard direct"
    }

    fn run<'a>(&'a self, ctx: &'a mut ScenarioContext) -> BoxFuture<'a, Result<ScenarioReport>> {
        Box::pin(async move {
            let mut sizes = sizes(ctx.quick);
            if let Some(s) = ctx.sizes.seconds_per_phase {
                sizes.seconds = s.max(1);
            }
            if let Some(m) = &ctx.sizes.members {
                if m.iter().any(|&n| !(1..=SHARDS_MAX).contains(&n)) {
                    bail!("--members: each run has 1 to {SHARDS_MAX} shards");
                }
                sizes.shard_counts = m.clone();
            }
            let cache = ["--wiredTigerCacheSizeGB".to_string(), "0.25".to_string()];
            let mut runs = Vec::new();

            // One shard, written directly: the baseline the router's overhead is measured on.
            let node = ctx.start_node("direct", &[&["--replSet".to_string(), "direct".to_string()][..], &cache[..]].concat())?;
            let port = ctx.nodes[node].port;
            initiate(port, "direct").await?;
            eprintln!("scenario: one shard, direct ...");
            let r = insert::run(&insert_options(format!("mongodb://127.0.0.1:{port}/"), sizes.seconds, false, ctx.watch_all())).await.context("direct run")?;
            let shards_cpu = cpu(&r, 0);
            runs.push(Run { label: "1 shard, direct".into(), shards: 1, result: r, router_cpu: None, shards_cpu });
            ctx.nodes.clear();

            for &n in &sizes.shard_counts {
                // Config servers, n shards, then the router; every process fresh.
                // Names (and so data directories) of their own per run.
                let cfg = ctx.start_node(&format!("{n}s-cfg"), &[&["--replSet".to_string(), "cfg".to_string()][..], &cache[..]].concat())?;
                let cfg_port = ctx.nodes[cfg].port;
                initiate(cfg_port, "cfg").await?;
                let mut shard_ports = Vec::new();
                for i in 0..n {
                    let set = format!("shard{i}");
                    let node = ctx.start_node(&format!("{n}s-{set}"), &[&["--replSet".to_string(), set.clone()][..], &cache[..]].concat())?;
                    let port = ctx.nodes[node].port;
                    initiate(port, &set).await?;
                    shard_ports.push(port);
                }
                let router = ctx.start_router(&format!("{n}s-router"), &format!("cfg/127.0.0.1:{cfg_port}"))?;
                let router_port = ctx.nodes[router].port;
                let client = mongodb::Client::with_uri_str(format!("mongodb://127.0.0.1:{router_port}/")).await?;
                for (i, p) in shard_ports.iter().enumerate() {
                    client
                        .database("admin")
                        .run_command(doc! {"addShard": format!("shard{i}/127.0.0.1:{p}")})
                        .await
                        .with_context(|| format!("addShard shard{i}"))?;
                }
                // Watch the router first, then the shards (not the idle config servers).
                let all = ctx.watch_all();
                let mut watch = vec![all[router].clone()];
                watch.extend(all.iter().filter(|(name, _)| name.contains("-shard")).cloned());
                eprintln!("scenario: {n} shard(s) behind the router ...");
                let r = insert::run(&insert_options(format!("mongodb://127.0.0.1:{router_port}/"), sizes.seconds, true, watch))
                    .await
                    .with_context(|| format!("{n} shards"))?;
                let router_cpu = cpu(&r, 0);
                let shards_cpu = (1..=n).map(|i| cpu(&r, i)).sum();
                eprintln!("scenario: {n} shard(s): {:.0} docs/s", r.inserts_per_s);
                runs.push(Run { label: format!("{n} shard(s), router"), shards: n, result: r, router_cpu: Some(router_cpu), shards_cpu });
                ctx.nodes.clear();
            }

            let via_router: Vec<&Run> = runs.iter().filter(|r| r.router_cpu.is_some()).collect();
            let one = via_router.iter().find(|r| r.shards == 1).map(|r| r.result.inserts_per_s);
            let direct_rate = runs[0].result.inserts_per_s;
            let mut table = Table {
                title: "bench02 inserts per second and CPU per insert".into(),
                headers: [
                    "Run",
                    "Inserts/s",
                    "vs 1 shard via router",
                    "Router CPU (% of a core)",
                    "Shards CPU (% of a core, sum)",
                    "Router CPU per insert (us)",
                    "Shard CPU per insert (us)",
                    "Client CPU (% of machine)",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                rows: Vec::new(),
            };
            let mut phases = Vec::new();
            for r in &runs {
                table.rows.push(vec![
                    r.label.clone(),
                    format!("{:.0}", r.result.inserts_per_s),
                    one.filter(|o| *o > 0.0 && r.router_cpu.is_some()).map(|o| format!("{:.2}x", r.result.inserts_per_s / o)).unwrap_or_else(|| "-".into()),
                    r.router_cpu.map(|c| format!("{c:.0}")).unwrap_or_else(|| "-".into()),
                    format!("{:.0}", r.shards_cpu),
                    r.router_cpu.map(|c| format!("{:.1}", r.per_insert_us(c))).unwrap_or_else(|| "-".into()),
                    format!("{:.1}", r.per_insert_us(r.shards_cpu)),
                    format!("{:.1}", r.result.client_cpu.share_of_machine_percent),
                ]);
                let mut names = Vec::new();
                if r.router_cpu.is_some() {
                    names.push("router".to_string());
                }
                names.extend((0..r.shards).map(|i| if r.router_cpu.is_some() { format!("shard{i}") } else { "direct".to_string() }));
                phases.push(PhaseTimeline { label: r.label.clone(), timeline: r.result.timeline.clone(), node_names: names });
            }
            // Projection: with each shard on machines of its own and routers added as needed,
            // throughput at N shards is N shards' worth if the CPU an insert costs does not
            // grow with N. Efficiency at N is what an insert cost at 1 shard over what it
            // costs at N (router plus shard CPU per insert).
            let cost = |r: &Run| r.per_insert_us(r.router_cpu.unwrap_or(0.0)) + r.per_insert_us(r.shards_cpu);
            let mut notes = Vec::new();
            if let (Some(first), Some(last)) = (via_router.first(), via_router.last()) {
                if cost(last) > 0.0 {
                    notes.push(format!(
                        "Projected scaling efficiency at {} shards: {:.2} (router + shard CPU per insert {:.1} us at {} shard(s), {:.1} us at {}).",
                        last.shards,
                        cost(first) / cost(last),
                        cost(first),
                        first.shards,
                        cost(last),
                        last.shards
                    ));
                }
            }
            if let Some(o) = one {
                notes.push(format!(
                    "Router overhead: one shard through the router does {:.2}x the inserts of the same shard written directly (vendor: 0.82x).",
                    o / direct_rate.max(1.0)
                ));
            }
            notes.push("Every process shares this machine's cores with the client: throughput with more shards than cores measures contention, not scaling; the CPU per insert is what projects.".into());
            Ok(ScenarioReport {
                title: "Elastic cluster: hash-sharded bench02 inserts behind a router".into(),
                summary: format!(
                    "bench02 (1 KB documents, 3 compound indexes, unordered batches of {BATCH_SIZE}, {WORKERS} workers), {} s per run, shards {:?}.",
                    sizes.seconds, sizes.shard_counts
                ),
                parameters: vec![
                    ("seconds per run".into(), sizes.seconds.to_string()),
                    ("workers".into(), WORKERS.to_string()),
                    ("batch size".into(), BATCH_SIZE.to_string()),
                ],
                machine: sys::machine_info(),
                tables: vec![table],
                phases,
                notes,
            })
        })
    }
}
