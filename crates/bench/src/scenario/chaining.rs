//! `chaining`: the vendor's replica-set matrix. Sets of 3, 7 and 15 members (at most 7
//! voters; the others are read-only: votes 0, priority 0), chaining on, off and "auto",
//! each under YCSB inserts with 8 client threads at w:1 and at w:"majority". Reports
//! throughput, the primary's CPU and the average insert latency, grouped by configuration
//! and by member count. The read-only members sit in a second data center (fault-layer
//! link delays), so that chaining on has something to chain across.

use super::{cpu_avg, PhaseTimeline, Scenario, ScenarioContext, ScenarioReport, Table};
use crate::sys;
use crate::target::BoxFuture;
use crate::ycsb::{props::Properties, Phase, YcsbResult};
use anyhow::{bail, Context, Result};
use mongodb::bson::{doc, Bson, Document};
use std::time::{Duration, Instant};

pub struct Chaining;

pub const THREADS: usize = 8;
/// mongod's limit on voting members.
pub const VOTERS_MAX: usize = 7;
/// mongod's limit on members.
pub const MEMBERS_MAX: usize = 50;
const SET_READY_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, Clone)]
pub struct Sizes {
    pub member_counts: Vec<usize>,
    pub seconds_per_run: u64,
}

pub fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes { member_counts: vec![3, 7, 15], seconds_per_run: 10 }
    } else {
        Sizes { member_counts: vec![3, 7, 15], seconds_per_run: 60 }
    }
}

/// The unmeasured warm-up before each configuration's measured runs: a third of a run.
pub fn warmup_seconds(seconds_per_run: u64) -> u64 {
    (seconds_per_run / 3).max(1)
}

/// `settings.chainingAllowed`: mongod's on and off, and shoal's "auto" (voters fetch from
/// the primary, the members without a vote chain from secondaries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainingMode {
    On,
    Off,
    Auto,
}

impl ChainingMode {
    pub const ALL: [ChainingMode; 3] = [ChainingMode::On, ChainingMode::Off, ChainingMode::Auto];

    pub fn label(self) -> &'static str {
        match self {
            ChainingMode::On => "on",
            ChainingMode::Off => "off",
            ChainingMode::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<ChainingMode> {
        ChainingMode::ALL.into_iter().find(|m| m.label() == s)
    }

    fn to_bson(self) -> Bson {
        match self {
            ChainingMode::On => Bson::Boolean(true),
            ChainingMode::Off => Bson::Boolean(false),
            ChainingMode::Auto => Bson::String("auto".into()),
        }
    }
}

/// A replica-set config for `hosts` in the reports' shape: the first `voters` members vote;
/// the rest are read-only (votes 0, priority 0), the first `hidden` of them hidden.
pub fn set_config(name: &str, hosts: &[String], voters: usize, hidden: usize, chaining: ChainingMode) -> Document {
    let members: Vec<Bson> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let mut m = doc! {"_id": i as i32, "host": h.clone()};
            if i >= voters {
                m.insert("votes", 0);
                m.insert("priority", 0);
                if i < voters + hidden {
                    m.insert("hidden", true);
                }
            }
            Bson::Document(m)
        })
        .collect();
    doc! {"_id": name, "version": 1, "members": members, "settings": {"chainingAllowed": chaining.to_bson()}}
}

/// YCSB inserts for `seconds`: a load phase with more records than can be written.
fn insert_properties(seconds: u64) -> Properties {
    let mut p = Properties::new();
    p.set("recordcount", "100000000");
    p.set("maxexecutiontime", seconds.to_string());
    p.set("threadcount", THREADS.to_string());
    p.set("batchsize", "1");
    p
}

/// A client of the node on `port` alone.
pub(super) async fn direct(port: u16) -> Result<mongodb::Client> {
    Ok(mongodb::Client::with_uri_str(format!("mongodb://127.0.0.1:{port}/?directConnection=true")).await?)
}

/// One-way delay between the two data centers (a heartbeat's round trip is twice this).
pub const REMOTE_DELAY_MS: i64 = 5;

/// Put the read-only members (those after the voters) in a second data center,
/// 2 × REMOTE_DELAY_MS away, with the fault layer's link delays. The reports' read-only
/// members serve reads elsewhere; on one host every ping would be within mongod's
/// changeSyncSourceThresholdMillis (5 ms), and then, chaining on or off, every member
/// would fetch from the primary. Across the gap, chaining on lets the remote members chain
/// from each other. A delay applies to the links a member opens, so it is set on both sides.
async fn place_read_only_members_remotely(ports: &[u16]) -> Result<()> {
    if ports.len() <= VOTERS_MAX {
        return Ok(());
    }
    let (local, remote) = ports.split_at(VOTERS_MAX);
    for (side, other) in [(local, remote), (remote, local)] {
        for &from in side {
            let c = direct(from).await?;
            for &to in other {
                let cmd = doc! {"configureFailPoint": "replLink", "mode": "alwaysOn", "data": {"host": format!("127.0.0.1:{to}"), "delayMs": REMOTE_DELAY_MS}};
                c.database("admin").run_command(cmd).await.context("configureFailPoint replLink")?;
            }
        }
    }
    Ok(())
}

/// Initiate the set through its first member and wait until every member is primary or
/// secondary.
async fn initiate(ports: &[u16], chaining: ChainingMode) -> Result<()> {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let first = direct(ports[0]).await?;
    first.database("admin").run_command(doc! {"replSetInitiate": set_config("rs0", &hosts, VOTERS_MAX, 0, chaining)}).await.context("replSetInitiate")?;
    let deadline = Instant::now() + SET_READY_TIMEOUT;
    loop {
        if let Ok(s) = first.database("admin").run_command(doc! {"replSetGetStatus": 1}).await {
            let states: Vec<&str> =
                s.get_array("members").map(|m| m.iter().filter_map(|d| d.as_document()?.get_str("stateStr").ok()).collect()).unwrap_or_default();
            if states.len() == ports.len() && states[0] == "PRIMARY" && states[1..].iter().all(|s| *s == "SECONDARY") {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            bail!("the {}-member set was not ready within {SET_READY_TIMEOUT:?}", ports.len());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// CPU of all members together, averaged over the run (% of one core).
fn cpu_all(r: &YcsbResult, nodes: usize) -> f64 {
    (0..nodes).filter_map(|i| cpu_avg(r, i)).sum()
}

/// The halves of one write concern's run, as one: operations over total time, latency
/// weighted by operations, CPU averaged over the halves (they run equally long).
fn combine(members: usize, chaining: ChainingMode, w: &'static str, rs: &[&YcsbResult]) -> Run {
    let ops: u64 = rs.iter().map(|r| r.operations).sum();
    let ms: u64 = rs.iter().map(|r| r.runtime_ms).sum();
    let weighted = |f: &dyn Fn(&YcsbResult) -> Option<f64>| -> Option<f64> {
        let mut sum = 0.0;
        let mut weight = 0.0;
        for r in rs {
            let v = f(r)?;
            sum += v * r.operations as f64;
            weight += r.operations as f64;
        }
        (weight > 0.0).then(|| sum / weight)
    };
    let mean = |f: &dyn Fn(&YcsbResult) -> Option<f64>| -> Option<f64> {
        let vs: Vec<f64> = rs.iter().filter_map(|r| f(r)).collect();
        (!vs.is_empty()).then(|| vs.iter().sum::<f64>() / vs.len() as f64)
    };
    Run {
        members,
        chaining,
        w,
        ops_per_s: if ms == 0 { 0.0 } else { ops as f64 * 1000.0 / ms as f64 },
        latency_us: weighted(&|r| r.latency_us_avg("INSERT")),
        primary_cpu: mean(&|r| cpu_avg(r, 0)),
        all_cpu: mean(&|r| Some(cpu_all(r, members))).unwrap_or(0.0),
    }
}

struct Run {
    members: usize,
    chaining: ChainingMode,
    w: &'static str,
    ops_per_s: f64,
    latency_us: Option<f64>,
    primary_cpu: Option<f64>,
    all_cpu: f64,
}

impl Scenario for Chaining {
    fn name(&self) -> &'static str {
        "chaining"
    }

    fn description(&self) -> &'static str {
        "replica sets of 3, 7 and 15 members x chaining on/off/auto x w:1/majority: YCSB inserts with 8 threads"
    }

    fn run<'a>(&'a self, ctx: &'a mut ScenarioContext) -> BoxFuture<'a, Result<ScenarioReport>> {
        Box::pin(async move {
            let mut sizes = sizes(ctx.quick);
            if let Some(s) = ctx.sizes.seconds_per_phase {
                sizes.seconds_per_run = s.max(1);
            }
            if let Some(m) = &ctx.sizes.members {
                if m.iter().any(|&n| !(1..=MEMBERS_MAX).contains(&n)) {
                    bail!("--members: each set has 1 to {} members", MEMBERS_MAX);
                }
                sizes.member_counts = m.clone();
            }
            let modes: Vec<ChainingMode> = match &ctx.sizes.chaining {
                Some(m) => {
                    m.iter().map(|s| ChainingMode::parse(s).with_context(|| format!("--chaining: {s} is not on, off or auto"))).collect::<Result<_>>()?
                }
                None => ChainingMode::ALL.to_vec(),
            };
            let mut runs = Vec::new();
            let mut phases = Vec::new();
            for &n in &sizes.member_counts {
                for &chaining in &modes {
                    ctx.nodes.clear();
                    let tag = format!("m{n}-chain-{}", chaining.label());
                    for i in 0..n {
                        let args = ["--replSet", "rs0", "--wiredTigerCacheSizeGB", "0.25", "--setParameter", "enableTestCommands=1"];
                        ctx.start_node(&format!("{tag}-{i}"), &args.map(String::from))?;
                    }
                    let ports: Vec<u16> = ctx.nodes.iter().map(|n| n.port).collect();
                    place_read_only_members_remotely(&ports).await?;
                    initiate(&ports, chaining).await?;
                    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
                    let node_names: Vec<String> = ctx.nodes.iter().map(|n| n.name.clone()).collect();
                    // Warm-up, not measured: a new set's first seconds run faster than later
                    // ones (nothing flushed or compacted yet: the first ten seconds of the first
                    // w:1 segment ran 14-31% above the rest of that segment in five of six
                    // 3-member configurations), and the first measured segment, always w:1,
                    // would get them.
                    let warmup_url = format!("mongodb://{}/ycsb_warmup?replicaSet=rs0&w=1", hosts.join(","));
                    let warmup_label = format!("{n} members, chaining {}, warm-up (not measured)", chaining.label());
                    ctx.ycsb(&warmup_label, Phase::Load, &warmup_url, &insert_properties(warmup_seconds(sizes.seconds_per_run))).await?;
                    // ABBA: w:1, majority, majority, w:1, each half the run. The disk's
                    // fsync latency and the LSM's background work drift over a run (this
                    // VM's fsync ranged 0.2-1 ms between minutes); interleaving puts the
                    // same drift on both write concerns.
                    let mut parts: Vec<(&str, YcsbResult)> = Vec::new();
                    for (round, w) in ["1", "majority", "majority", "1"].into_iter().enumerate() {
                        let url = format!("mongodb://{}/ycsb_w{w}_{round}?replicaSet=rs0&w={w}", hosts.join(","));
                        let label = format!("{n} members, chaining {}, w:{w} ({}/2)", chaining.label(), if round < 2 { 1 } else { 2 });
                        let r = ctx.ycsb(&label, Phase::Load, &url, &insert_properties(sizes.seconds_per_run.div_ceil(2))).await?;
                        phases.push(PhaseTimeline { label, timeline: r.timeline.clone(), node_names: node_names.clone() });
                        parts.push((w, r));
                    }
                    for w in ["1", "majority"] {
                        let rs: Vec<&YcsbResult> = parts.iter().filter(|(pw, _)| *pw == w).map(|(_, r)| r).collect();
                        runs.push(combine(n, chaining, if w == "1" { "1" } else { "majority" }, &rs));
                    }
                }
            }
            ctx.nodes.clear();
            let fmt = |v: Option<f64>, d: usize| v.map(|x| format!("{x:.d$}")).unwrap_or_else(|| "-".into());
            let by_config = Table {
                title: "By configuration".into(),
                headers: [
                    "Members",
                    "Chaining",
                    "w",
                    "Inserts/s",
                    "Avg insert latency (ms)",
                    "Primary CPU (% of a core)",
                    "All members' CPU (% of a core)",
                    "CPU per insert, all members (µs)",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                rows: runs
                    .iter()
                    .map(|r| {
                        vec![
                            r.members.to_string(),
                            r.chaining.label().into(),
                            r.w.into(),
                            format!("{:.0}", r.ops_per_s),
                            fmt(r.latency_us.map(|u| u / 1000.0), 2),
                            fmt(r.primary_cpu, 0),
                            format!("{:.0}", r.all_cpu),
                            // % of a core is centiseconds of CPU per second.
                            fmt((r.ops_per_s > 0.0).then(|| r.all_cpu * 10_000.0 / r.ops_per_s), 0),
                        ]
                    })
                    .collect(),
            };
            let find =
                |n: usize, chaining: ChainingMode, w: &str| runs.iter().find(|r| r.members == n && r.chaining == chaining && r.w == w).map(|r| r.ops_per_s);
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "-".into(),
            };
            use ChainingMode::{Auto, Off, On};
            let by_members = Table {
                title: "By member count (inserts/s and ratios)".into(),
                headers: [
                    "Members",
                    "w:1 chain on",
                    "w:1 chain off",
                    "w:1 chain auto",
                    "majority chain on",
                    "majority chain off",
                    "majority chain auto",
                    "majority / w:1 (chain on)",
                    "w:1 chain off / on",
                    "auto / best of on, off (w:1)",
                    "auto / best of on, off (majority)",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                rows: sizes
                    .member_counts
                    .iter()
                    .map(|&n| {
                        let best = |w: &str| match (find(n, On, w), find(n, Off, w)) {
                            (Some(a), Some(b)) => Some(a.max(b)),
                            _ => None,
                        };
                        let (a, b, c, d) = (find(n, On, "1"), find(n, Off, "1"), find(n, On, "majority"), find(n, Off, "majority"));
                        let (a_auto, c_auto) = (find(n, Auto, "1"), find(n, Auto, "majority"));
                        vec![
                            n.to_string(),
                            fmt(a, 0),
                            fmt(b, 0),
                            fmt(a_auto, 0),
                            fmt(c, 0),
                            fmt(d, 0),
                            fmt(c_auto, 0),
                            ratio(c, a),
                            ratio(b, a),
                            ratio(a_auto, best("1")),
                            ratio(c_auto, best("majority")),
                        ]
                    })
                    .collect(),
            };
            Ok(ScenarioReport {
                title: "shoal replica sets: chaining and write concern".into(),
                summary: format!(
                    "Replica sets of {:?} members started on this machine (the first {VOTERS_MAX} vote; the rest have votes 0 and priority 0), \
                     with settings.chainingAllowed on, off and \"auto\" (voters fetch from the primary, the others chain from secondaries). Each set takes YCSB inserts (one document per insert, 10 fields x 100 bytes) \
                     from {THREADS} client threads for {} s at each write concern, run as w:1, w:\"majority\", w:\"majority\", w:1 in halves so that drift \
                     (fsync latency, background compaction) falls on both alike, after {} s of unmeasured w:1 inserts that take the new set past its \
                     first flushes and compactions. Every member and the client share this machine's cores and disk, \
                     so absolute figures are far below a set with a machine per member; the ratios are what compare with the vendor reports.",
                    sizes.member_counts,
                    sizes.seconds_per_run,
                    warmup_seconds(sizes.seconds_per_run)
                ),
                parameters: vec![
                    ("mode".into(), if ctx.quick { "quick".into() } else { "full".into() }),
                    ("members".into(), format!("{:?}", sizes.member_counts)),
                    ("chaining".into(), modes.iter().map(|m| m.label()).collect::<Vec<_>>().join(", ")),
                    ("seconds per run".into(), sizes.seconds_per_run.to_string()),
                    ("warm-up seconds per configuration".into(), warmup_seconds(sizes.seconds_per_run).to_string()),
                    ("threads".into(), THREADS.to_string()),
                    ("cache per member".into(), "0.25 GB".into()),
                ],
                machine: sys::machine_info(),
                tables: vec![by_config, by_members],
                phases,
                notes: vec![
                    "w:\"majority\" waits until a majority of voters has the insert durable (writeConcernMajorityJournalDefault).".into(),
                    "CPU figures come from /proc/<pid>/stat, sampled every second; the primary is the first member.".into(),
                    format!(
                        "The read-only members (after the first {VOTERS_MAX}) are in a second data center, {} ms round trip away (fault-layer link delays): on one host every member is within 5 ms of the primary, where mongod's rule takes the primary as source and nothing chains.",
                        2 * REMOTE_DELAY_MS
                    ),
                ],
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_have_at_most_seven_voters() {
        let hosts: Vec<String> = (0..15).map(|i| format!("127.0.0.1:{}", 30000 + i)).collect();
        let c = set_config("rs0", &hosts, VOTERS_MAX, 1, ChainingMode::Off);
        let members = c.get_array("members").unwrap();
        assert_eq!(members.len(), 15);
        let voters = members.iter().filter(|m| m.as_document().unwrap().get_i32("votes").unwrap_or(1) > 0).count();
        assert_eq!(voters, 7);
        assert_eq!(members.iter().filter(|m| m.as_document().unwrap().get_bool("hidden").unwrap_or(false)).count(), 1);
        assert!(!c.get_document("settings").unwrap().get_bool("chainingAllowed").unwrap());
        assert!(sizes(true).member_counts.contains(&15));
        let auto = set_config("rs0", &hosts, VOTERS_MAX, 0, ChainingMode::Auto);
        assert_eq!(auto.get_document("settings").unwrap().get_str("chainingAllowed").unwrap(), "auto");
    }
}
