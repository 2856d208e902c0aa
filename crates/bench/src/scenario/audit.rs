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
use std::path::PathBuf;

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
    /// Runs of each mix on each node (alternating which node goes first).
    pub rounds: u64,
}

pub fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes { record_count: 20_000, seconds_per_run: 8, rounds: 1 }
    } else {
        Sizes { record_count: 100_000, seconds_per_run: 30, rounds: 3 }
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

/// Lines in the audit file: one record each.
fn records_in(path: &PathBuf) -> Result<u64> {
    let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    Ok(bytes.iter().filter(|b| **b == b'\n').count() as u64)
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
            let audit_path = ctx.work_dir.join("audit.json");
            let off = ctx.start_node("audit-off", &["--auth".to_string()])?;
            let on_args: Vec<String> = [
                "--auth",
                "--auditDestination",
                "file",
                "--auditFormat",
                "JSON",
                "--auditPath",
                audit_path.to_str().context("work dir path is not UTF-8")?,
                "--setParameter",
                "auditAuthorizationSuccess=true",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let on = ctx.start_node("audit-on", &on_args)?;
            let mut urls = Vec::new();
            for node in [off, on] {
                // The localhost exception lets the first user in.
                let port = ctx.nodes[node].port;
                let c = super::chaining::direct(port).await?;
                c.database("admin")
                    .run_command(doc! {"createUser": USER, "pwd": PASSWORD, "roles": [{"role": "root", "db": "admin"}]})
                    .await
                    .context("createUser")?;
                urls.push(format!("mongodb://{USER}:{PASSWORD}@127.0.0.1:{port}/ycsb?authSource=admin"));
            }
            let node_names: Vec<String> = ctx.nodes.iter().map(|n| n.name.clone()).collect();

            let mut phases = Vec::new();
            let mut load_props = mix_properties(sizes, (0, 100, 0), sizes.record_count, sizes.record_count);
            load_props.set("batchsize", "100");
            for (i, url) in urls.iter().enumerate() {
                let label = format!("load {}", node_names[[off, on][i]]);
                let r = ctx.ycsb(&label, Phase::Load, url, &load_props).await?;
                phases.push(PhaseTimeline { label, timeline: r.timeline.clone(), node_names: node_names.clone() });
            }
            let records_before = records_in(&audit_path)?;

            let mut table = Table {
                title: "Audit off and on, per insert:read:update mix".into(),
                headers: [
                    "Mix (insert:read:update)",
                    "Off (ops/s)",
                    "On (ops/s)",
                    "On / off",
                    "Avg latency off (µs)",
                    "Avg latency on (µs)",
                    "Latency added (µs)",
                    "Server CPU off (% of a core)",
                    "Server CPU on (% of a core)",
                    "Audit records per operation",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                rows: Vec::new(),
            };
            // The next new key per node: each node's inserts go past all of its earlier ones.
            let mut next_key = [sizes.record_count; 2];
            let mut worst_ratio = f64::MAX;
            let mut worst_added_us = f64::MIN;
            let mut round_index = 0u64;
            for mix in MIXES {
                let (i, r, u) = mix;
                let mix_label = format!("{i}:{r}:{u}");
                let mut totals = [Totals::default(); 2];
                let mut audited_ops = 0u64;
                let records = records_in(&audit_path)?;
                for _ in 0..sizes.rounds {
                    let order = if round_index % 2 == 0 { [0, 1] } else { [1, 0] };
                    round_index += 1;
                    for which in order {
                        let node = [off, on][which];
                        let label = format!("{mix_label} {}", if which == 0 { "off" } else { "on" });
                        let props = mix_properties(sizes, mix, sizes.record_count, next_key[which]);
                        let result = ctx.ycsb(&label, Phase::Run, &urls[which], &props).await?;
                        next_key[which] += result.operations_of("INSERT");
                        totals[which].add(&result, cpu_avg(&result, node));
                        if which == 1 {
                            audited_ops += ops_and_latency(&result).0;
                        }
                        phases.push(PhaseTimeline { label, timeline: result.timeline.clone(), node_names: node_names.clone() });
                    }
                }
                // Records reach the file within the writer's flush interval.
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                let written = records_in(&audit_path)?;
                let per_op = (written - records) as f64 / audited_ops.max(1) as f64;
                if per_op < 1.0 {
                    bail!("mix {mix_label}: {audited_ops} audited operations wrote only {per_op:.3} records each; every CRUD command must be audited");
                }
                let ratio = totals[1].ops_per_s() / totals[0].ops_per_s().max(1e-9);
                let added = totals[1].latency_us() - totals[0].latency_us();
                worst_ratio = worst_ratio.min(ratio);
                worst_added_us = worst_added_us.max(added);
                table.rows.push(vec![
                    mix_label,
                    format!("{:.0}", totals[0].ops_per_s()),
                    format!("{:.0}", totals[1].ops_per_s()),
                    format!("{ratio:.3}"),
                    format!("{:.0}", totals[0].latency_us()),
                    format!("{:.0}", totals[1].latency_us()),
                    format!("{added:+.0}"),
                    totals[0].cpu().map(|c| format!("{c:.0}")).unwrap_or_else(|| "-".into()),
                    totals[1].cpu().map(|c| format!("{c:.0}")).unwrap_or_else(|| "-".into()),
                    format!("{per_op:.3}"),
                ]);
            }
            let records_total = records_in(&audit_path)?;
            let audit_bytes = std::fs::metadata(&audit_path).map(|m| m.len()).unwrap_or(0);
            Ok(ScenarioReport {
                title: "shoal audit log: cost per insert:read:update mix".into(),
                summary: format!(
                    "Two `shoal serve` nodes on this machine, both with `--auth` (the client logs in as a root user). `audit-on` also \
                     writes the audit log: JSON to a file, with `auditAuthorizationSuccess` so that every CRUD command's authCheck is \
                     recorded. Each node is loaded with {} YCSB records (10 fields x 100 bytes), then each mix runs {} s on each node, \
                     {} round(s), the nodes taking turns (off first in odd rounds, on first in even ones). {THREADS} client threads, zipfian \
                     requests; inserts are single 1 KB documents, reads read all fields by _id, updates $set one field. Client and servers \
                     share the machine. Worst mix: on/off throughput {:.3}, latency added {:+.0} µs.",
                    sizes.record_count, sizes.seconds_per_run, sizes.rounds, worst_ratio, worst_added_us
                ),
                parameters: vec![
                    ("mode".into(), if ctx.quick { "quick".into() } else { "full".into() }),
                    ("recordcount".into(), sizes.record_count.to_string()),
                    ("seconds per run".into(), sizes.seconds_per_run.to_string()),
                    ("rounds".into(), sizes.rounds.to_string()),
                    ("threads".into(), THREADS.to_string()),
                    ("audit format".into(), "JSON file".into()),
                    ("audit records written".into(), format!("{} ({} after the loads), {:.1} MB", records_total, records_total - records_before, audit_bytes as f64 / 1e6)),
                ],
                machine: sys::machine_info(),
                tables: vec![table],
                phases,
                notes: vec![
                    "Latencies are measured by the client per operation and averaged over all of a mix's operations.".into(),
                    "Audit records per operation counts the file's records written during a mix's audited runs, divided by their operations; \
                     it is at least 1 because every CRUD command writes an authCheck record (the rest are the client's authentications)."
                        .into(),
                    "CPU figures come from /proc/<pid>/stat, sampled every second; a node's CPU is averaged over its own runs.".into(),
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
        // --quick stays within a few minutes: 6 mixes x 2 nodes x rounds.
        assert!(s.seconds_per_run * 12 * s.rounds <= 120);
    }
}
