//! `audit`: what the audit log costs. The vendor's six insert:read:update mixes (100:0:0,
//! 0:0:100, 50:50:0, 0:50:50, 30:70:0, 0:70:30), YCSB with 8 client threads, against two
//! nodes that differ only in auditing: both run with authorization (the client logs in as
//! root); the audited one writes every CRUD command's authCheck record
//! (`auditAuthorizationSuccess`) to a JSON file. The nodes take turns, off then on in odd
//! rounds and on then off in even ones, so that drift (page cache, compaction, the other
//! processes on the machine) falls on both alike. Reports throughput, average latency, the
//! latency auditing adds, server CPU, and the records written per operation (which shows
//! that every operation was audited).

use super::{cpu_avg, PhaseTimeline, Scenario, ScenarioContext, ScenarioReport, Table};
use crate::sys;
use crate::target::BoxFuture;
use crate::ycsb::{props::Properties, Phase, YcsbResult};
use anyhow::{bail, Context, Result};
use mongodb::bson::doc;
use std::path::Path;

pub struct Audit;

/// (insert %, read %, update %), in the vendor report's order.
pub const MIXES: [(u32, u32, u32); 6] = [(100, 0, 0), (0, 0, 100), (50, 50, 0), (0, 50, 50), (30, 70, 0), (0, 70, 30)];
pub const THREADS: usize = 8;
const USER: &str = "bench";
const PASSWORD: &str = "bench";

#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub record_count: u64,
    pub seconds_per_run: u64,
    /// Cycles per mix: each node runs off, on, on, off in each.
    pub rounds: u64,
}

pub fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes { record_count: 20_000, seconds_per_run: 4, rounds: 1 }
    } else {
        Sizes { record_count: 100_000, seconds_per_run: 10, rounds: 2 }
    }
}

/// The CoreWorkload properties of one mix. Reads and updates go to the loaded records
/// (`0..loaded`); inserts take new keys from `first_new_key` on, past every key an earlier
/// run inserted, so that no run repeats another's keys.
pub fn mix_properties(sizes: Sizes, (insert, read, update): (u32, u32, u32), loaded: u64, first_new_key: u64) -> Properties {
    let mut p = Properties::new();
    p.set("recordcount", first_new_key.to_string());
    p.set("insertstart", "0");
    p.set("insertcount", loaded.to_string());
    p.set("operationcount", "0");
    p.set("maxexecutiontime", sizes.seconds_per_run.to_string());
    p.set("threadcount", THREADS.to_string());
    p.set("requestdistribution", "zipfian");
    p.set("readallfields", "true");
    p.set("insertproportion", format!("{}", insert as f64 / 100.0));
    p.set("readproportion", format!("{}", read as f64 / 100.0));
    p.set("updateproportion", format!("{}", update as f64 / 100.0));
    p.set("scanproportion", "0");
    p
}

/// Operations of one run, and their latency averaged over all of them (µs).
fn ops_and_latency(r: &YcsbResult) -> (u64, f64) {
    let mut ops = 0;
    let mut sum_us = 0.0;
    for op in ["INSERT", "READ", "UPDATE"] {
        let n = r.operations_of(op);
        if let Some(avg) = r.latency_us_avg(op) {
            ops += n;
            sum_us += avg * n as f64;
        }
    }
    (ops, if ops == 0 { 0.0 } else { sum_us / ops as f64 })
}

/// Totals of one node over one mix's rounds.
#[derive(Default, Clone, Copy)]
struct Totals {
    ops: u64,
    runtime_ms: u64,
    latency_us_sum: f64,
    cpu_sum: f64,
    cpu_runs: u64,
}

impl Totals {
    fn add(&mut self, r: &YcsbResult, cpu: Option<f64>) {
        let (ops, lat) = ops_and_latency(r);
        self.ops += ops;
        self.runtime_ms += r.runtime_ms;
        self.latency_us_sum += lat * ops as f64;
        if let Some(c) = cpu {
            self.cpu_sum += c;
            self.cpu_runs += 1;
        }
    }
    fn ops_per_s(&self) -> f64 {
        self.ops as f64 * 1000.0 / self.runtime_ms.max(1) as f64
    }
    fn latency_us(&self) -> f64 {
        self.latency_us_sum / self.ops.max(1) as f64
    }
    fn cpu(&self) -> Option<f64> {
        (self.cpu_runs > 0).then(|| self.cpu_sum / self.cpu_runs as f64)
    }
}

/// The lowest and highest of a node's per-cycle on/off throughput ratios: how far single
/// cycles scatter around the mix's ratio.
fn cycle_spread(cycles: &[(f64, f64)]) -> String {
    let ratios: Vec<f64> = cycles.iter().map(|(off, on)| on / off.max(1e-9)).collect();
    let lo = ratios.iter().cloned().fold(f64::MAX, f64::min);
    let hi = ratios.iter().cloned().fold(f64::MIN, f64::max);
    format!("{lo:.2}–{hi:.2}")
}

/// Rotate the audited node's file (logRotate writes every record queued before it first),
/// count the rotated file's records (one per line) and delete it: the report needs the
/// count, and a full run writes several GB of records.
async fn rotate_and_count(client: &mongodb::Client, path: &Path, format: Format) -> Result<(u64, u64)> {
    client.database("admin").run_command(doc! {"logRotate": "audit"}).await.context("logRotate")?;
    let name = path.file_name().and_then(|n| n.to_str()).context("audit file name")?.to_string();
    let dir = path.parent().context("audit file directory")?;
    let (mut records, mut bytes) = (0, 0);
    for entry in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let entry = entry?;
        let rotated = entry.file_name().to_str().is_some_and(|n| n.starts_with(&format!("{name}.")));
        if rotated {
            let n = std::fs::metadata(entry.path())?.len();
            records += match format {
                Format::Json => count_lines(&entry.path())?,
                Format::Bson => count_documents(&entry.path())?,
            };
            bytes += n;
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok((records, bytes))
}

#[derive(Clone, Copy)]
enum Format {
    Json,
    Bson,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Json => "JSON",
            Format::Bson => "BSON",
        }
    }
}

/// Records in a JSON audit file: one per line.
fn count_lines(path: &Path) -> Result<u64> {
    use std::io::Read as _;
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut lines = 0;
    loop {
        let n = f.read(&mut chunk)?;
        if n == 0 {
            return Ok(lines);
        }
        lines += chunk[..n].iter().filter(|b| **b == b'\n').count() as u64;
    }
}

/// Records in a BSON audit file: documents one after another, each led by its length.
fn count_documents(path: &Path) -> Result<u64> {
    use std::io::Read as _;
    let mut f = std::io::BufReader::new(std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?);
    let len = f.get_ref().metadata()?.len();
    let (mut at, mut docs) = (0u64, 0u64);
    let mut prefix = [0u8; 4];
    while at < len {
        f.read_exact(&mut prefix).with_context(|| format!("{}: a record cut short at byte {at}", path.display()))?;
        let n = u32::from_le_bytes(prefix) as u64;
        if n < 5 || at + n > len {
            bail!("{}: a record of {n} bytes at byte {at} does not fit the file ({len} bytes)", path.display());
        }
        f.seek_relative(n as i64 - 4)?;
        at += n;
        docs += 1;
    }
    Ok(docs)
}

impl Scenario for Audit {
    fn name(&self) -> &'static str {
        "audit"
    }

    fn description(&self) -> &'static str {
        "audit log off vs on (every CRUD command audited): YCSB insert:read:update mixes 100:0:0, 0:0:100, 50:50:0, 0:50:50, 30:70:0, 0:70:30 (8 threads)"
    }

    fn run<'a>(&'a self, ctx: &'a mut ScenarioContext) -> BoxFuture<'a, Result<ScenarioReport>> {
        Box::pin(async move {
            let mut sizes = sizes(ctx.quick);
            if let Some(n) = ctx.sizes.records {
                sizes.record_count = n.max(1);
            }
            if let Some(s) = ctx.sizes.seconds_per_phase {
                sizes.seconds_per_run = s.max(1);
            }
            // One node per audit format; each is switched between off and on at runtime.
            let formats = [Format::Json, Format::Bson];
            let mut nodes = Vec::new();
            let mut paths = Vec::new();
            for f in formats {
                let name = format!("audit-{}", f.name().to_lowercase());
                let p = ctx.work_dir.join(format!("{name}.audit"));
                let p_str = p.to_str().context("work dir path is not UTF-8")?.to_string();
                let args = ["--auth", "--auditDestination", "file", "--auditFormat", f.name(), "--auditPath", &p_str, "--setParameter", "auditAuthorizationSuccess=true"].map(String::from);
                nodes.push(ctx.start_node(&name, &args)?);
                paths.push(p);
            }
            let mut urls = Vec::new();
            let mut clients = Vec::new();
            for &node in &nodes {
                // The localhost exception lets the first user in.
                let port = ctx.nodes[node].port;
                let c = super::chaining::direct(port).await?;
                c.database("admin")
                    .run_command(doc! {"createUser": USER, "pwd": PASSWORD, "roles": [{"role": "root", "db": "admin"}]})
                    .await
                    .context("createUser")?;
                let url = format!("mongodb://{USER}:{PASSWORD}@127.0.0.1:{port}/ycsb?authSource=admin");
                clients.push(mongodb::Client::with_uri_str(&url).await?);
                urls.push(url);
            }
            let node_names: Vec<String> = ctx.nodes.iter().map(|n| n.name.clone()).collect();

            let mut phases = Vec::new();
            let mut load_props = mix_properties(sizes, (0, 100, 0), sizes.record_count, sizes.record_count);
            load_props.set("batchsize", "100");
            for (i, url) in urls.iter().enumerate() {
                let label = format!("load {}", node_names[nodes[i]]);
                let r = ctx.ycsb(&label, Phase::Load, url, &load_props).await?;
                phases.push(PhaseTimeline { label, timeline: r.timeline.clone(), node_names: node_names.clone() });
            }
            let (mut records_total, mut audit_bytes) = (0u64, 0u64);
            for k in 0..formats.len() {
                let (n, b) = rotate_and_count(&clients[k], &paths[k], formats[k]).await?;
                records_total += n;
                audit_bytes += b;
            }

            let headers = [
                "Mix (insert:read:update)",
                "JSON node off / on (ops/s)",
                "JSON on / off",
                "BSON node off / on (ops/s)",
                "BSON on / off",
                "Avg latency off, JSON / BSON node (µs)",
                "Latency added, JSON (µs)",
                "Latency added, BSON (µs)",
                "Server CPU off / on, JSON; BSON (% of a core)",
                "Records per audited operation (JSON, BSON)",
                "Per-cycle on / off, JSON; BSON (lowest–highest)",
            ];
            let mut table = Table { title: "Audit off and on, per insert:read:update mix".into(), headers: headers.iter().map(|s| s.to_string()).collect(), rows: Vec::new() };
            // The next new key per node: each node's inserts go past all of its earlier ones.
            let mut next_key = [sizes.record_count; 2];
            // Worst on/off ratio and latency added, per format.
            let mut worst = [(f64::MAX, f64::MIN); 2];
            // One cycle: each node runs off, on, on, off (ABBA, so that a trend within the
            // cycle falls on both states alike), the two nodes interleaved in opposite
            // phase: JSON off, BSON on, JSON on, BSON off, JSON on, BSON off, JSON off, BSON on.
            const CYCLE: [(usize, bool); 8] = [(0, false), (1, true), (0, true), (1, false), (0, true), (1, false), (0, false), (1, true)];
            for mix in MIXES {
                let (i, r, u) = mix;
                let mix_label = format!("{i}:{r}:{u}");
                // [node][on]
                let mut totals = [[Totals::default(); 2]; 2];
                let mut audited_ops = [0u64; 2];
                let mut cycles: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
                for _ in 0..sizes.rounds {
                    let mut ops_per_s = [[0.0; 2]; 2];
                    for (k, on) in CYCLE {
                        clients[k].database("admin").run_command(doc! {"setAuditConfig": 1, "auditAuthorizationSuccess": on}).await.context("setAuditConfig")?;
                        let node = nodes[k];
                        let label = format!("{mix_label} {} {}", node_names[node], if on { "on" } else { "off" });
                        let props = mix_properties(sizes, mix, sizes.record_count, next_key[k]);
                        let result = ctx.ycsb(&label, Phase::Run, &urls[k], &props).await?;
                        next_key[k] += result.operations_of("INSERT");
                        totals[k][on as usize].add(&result, cpu_avg(&result, node));
                        let ops = ops_and_latency(&result).0;
                        if on {
                            audited_ops[k] += ops;
                        }
                        // Two runs per state per cycle: their mean rate.
                        ops_per_s[k][on as usize] += ops as f64 * 1000.0 / result.runtime_ms.max(1) as f64 / 2.0;
                        phases.push(PhaseTimeline { label, timeline: result.timeline.clone(), node_names: node_names.clone() });
                    }
                    for k in 0..2 {
                        cycles[k].push((ops_per_s[k][0], ops_per_s[k][1]));
                    }
                }
                let mut per_op = [0.0; 2];
                for k in 0..2 {
                    let (written, bytes) = rotate_and_count(&clients[k], &paths[k], formats[k]).await?;
                    records_total += written;
                    audit_bytes += bytes;
                    per_op[k] = written as f64 / audited_ops[k].max(1) as f64;
                    if per_op[k] < 1.0 {
                        bail!("mix {mix_label}: {} audited operations wrote only {:.3} records each; every CRUD command must be audited", audited_ops[k], per_op[k]);
                    }
                }
                let ratio = |k: usize| totals[k][1].ops_per_s() / totals[k][0].ops_per_s().max(1e-9);
                let added = |k: usize| totals[k][1].latency_us() - totals[k][0].latency_us();
                for k in 0..2 {
                    worst[k].0 = worst[k].0.min(ratio(k));
                    worst[k].1 = worst[k].1.max(added(k));
                }
                let cpu = |k: usize, on: usize| totals[k][on].cpu().map(|c| format!("{c:.0}")).unwrap_or_else(|| "-".into());
                table.rows.push(vec![
                    mix_label,
                    format!("{:.0} / {:.0}", totals[0][0].ops_per_s(), totals[0][1].ops_per_s()),
                    format!("{:.3}", ratio(0)),
                    format!("{:.0} / {:.0}", totals[1][0].ops_per_s(), totals[1][1].ops_per_s()),
                    format!("{:.3}", ratio(1)),
                    format!("{:.0} / {:.0}", totals[0][0].latency_us(), totals[1][0].latency_us()),
                    format!("{:+.0}", added(0)),
                    format!("{:+.0}", added(1)),
                    format!("{} / {}; {} / {}", cpu(0, 0), cpu(0, 1), cpu(1, 0), cpu(1, 1)),
                    format!("{:.3}, {:.3}", per_op[0], per_op[1]),
                    format!("{}; {}", cycle_spread(&cycles[0]), cycle_spread(&cycles[1])),
                ]);
            }
            Ok(ScenarioReport {
                title: "shoal audit log: cost per insert:read:update mix".into(),
                summary: format!(
                    "Two `shoal serve` nodes on this machine, both with `--auth` (the client logs in as a root user) and an audit log \
                     file, one in JSON and one in BSON. Each node is switched at runtime between off (`setAuditConfig \
                     {{auditAuthorizationSuccess: false}}`: no record for a permitted command, and none is refused here) and on \
                     (`auditAuthorizationSuccess: true`: every CRUD command's authCheck is recorded), so that off and on are measured \
                     in the same process over the same data. Each node is loaded with {} YCSB records (10 fields x 100 bytes); then, \
                     per mix, {} cycle(s) in which each node runs off, on, on, off ({} s each), the two nodes interleaved. {THREADS} \
                     client threads, zipfian requests; inserts are single 1 KB documents, reads read all fields by _id, updates $set \
                     one field. Client and servers share the machine. Worst mix, JSON: on/off throughput {:.3}, latency added {:+.0} \
                     µs; BSON: {:.3}, {:+.0} µs.",
                    sizes.record_count, sizes.rounds, sizes.seconds_per_run, worst[0].0, worst[0].1, worst[1].0, worst[1].1
                ),
                parameters: vec![
                    ("mode".into(), if ctx.quick { "quick".into() } else { "full".into() }),
                    ("recordcount".into(), sizes.record_count.to_string()),
                    ("seconds per run".into(), sizes.seconds_per_run.to_string()),
                    ("cycles per mix".into(), sizes.rounds.to_string()),
                    ("threads".into(), THREADS.to_string()),
                    ("audit records written".into(), format!("{records_total}, {:.1} MB (each mix's files rotated away after they are counted)", audit_bytes as f64 / 1e6)),
                ],
                machine: sys::machine_info(),
                tables: vec![table],
                phases,
                notes: vec![
                    "Latencies are measured by the client per operation and averaged over all of a mix's operations.".into(),
                    "Records per audited operation counts the records a node wrote during a mix, divided by the operations of its on \
                     runs; it is at least 1 because every CRUD command of an on run writes an authCheck record (the rest are the \
                     client's authentications, which are recorded in both states)."
                        .into(),
                    "CPU figures come from /proc/<pid>/stat, sampled every second, averaged over a node's runs in each state.".into(),
                ],
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_keys_and_sizes() {
        let s = sizes(true);
        let p = mix_properties(s, (30, 70, 0), 1000, 1500);
        assert_eq!(p.get("insertproportion"), Some("0.3"));
        assert_eq!(p.get("readproportion"), Some("0.7"));
        assert_eq!(p.get("updateproportion"), Some("0"));
        let w = crate::ycsb::workload::CoreWorkload::init(&p).expect("valid workload");
        // Inserts start past every key inserted before; reads stay within the loaded ones.
        assert_eq!(w.next_insert_key(), 1500);
        for (i, r, u) in MIXES {
            assert_eq!(i + r + u, 100);
        }
        // --quick stays within a few minutes: 6 mixes x 8 runs per cycle.
        assert!(s.seconds_per_run * 48 * s.rounds <= 240);
    }
}
