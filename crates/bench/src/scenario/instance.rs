//! `instance`: one shoal node, YCSB read:write mixes 100:0, 95:5, 50:50, 5:95, 0:100 with
//! zipfian requests and 8 client threads (read + update), in the vendor reports' table layout.

use super::{cpu_avg, PhaseTimeline, Scenario, ScenarioContext, ScenarioReport, Table};
use crate::sys;
use crate::target::BoxFuture;
use crate::ycsb::{props::Properties, Phase, YcsbResult};
use anyhow::Result;

pub struct Instance;

/// (read %, write %) mixes, in report order.
pub const MIXES: [(u32, u32); 5] = [(100, 0), (95, 5), (50, 50), (5, 95), (0, 100)];
pub const THREADS: usize = 8;

#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub record_count: u64,
    pub seconds_per_mix: u64,
    pub load_batch_size: u64,
}

/// `--quick` fits a few minutes on a 2-core machine; the full size is the reports' scale of a
/// working set that does not fit one batch of caches (1M x 1 KB records, 5 minutes per mix).
pub fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes { record_count: 20_000, seconds_per_mix: 15, load_batch_size: 100 }
    } else {
        Sizes { record_count: 1_000_000, seconds_per_mix: 300, load_batch_size: 100 }
    }
}

/// The CoreWorkload properties of one mix.
pub fn mix_properties(sizes: Sizes, read_percent: u32, write_percent: u32) -> Properties {
    let mut p = Properties::new();
    p.set("recordcount", sizes.record_count.to_string());
    p.set("operationcount", "0");
    p.set("maxexecutiontime", sizes.seconds_per_mix.to_string());
    p.set("threadcount", THREADS.to_string());
    p.set("requestdistribution", "zipfian");
    p.set("readallfields", "true");
    p.set("readproportion", format!("{}", read_percent as f64 / 100.0));
    p.set("updateproportion", format!("{}", write_percent as f64 / 100.0));
    p.set("insertproportion", "0");
    p.set("scanproportion", "0");
    p
}

fn ms(us: Option<f64>) -> String {
    us.map(|v| format!("{:.3}", v / 1000.0)).unwrap_or_else(|| "-".into())
}

fn p99_ms(r: &YcsbResult, op: &str) -> String {
    r.measurements
        .get(op)
        .filter(|m| !m.histogram.is_empty())
        .map(|m| format!("{:.3}", m.histogram.value_at_percentile(99.0) as f64 / 1000.0))
        .unwrap_or_else(|| "-".into())
}

impl Scenario for Instance {
    fn name(&self) -> &'static str {
        "instance"
    }

    fn description(&self) -> &'static str {
        "one shoal node: YCSB zipfian read:write mixes 100:0, 95:5, 50:50, 5:95, 0:100 (8 threads)"
    }

    fn run<'a>(&'a self, ctx: &'a mut ScenarioContext) -> BoxFuture<'a, Result<ScenarioReport>> {
        Box::pin(async move {
            let mut sizes = sizes(ctx.quick);
            if let Some(n) = ctx.sizes.records {
                sizes.record_count = n.max(1);
            }
            if let Some(s) = ctx.sizes.seconds_per_phase {
                sizes.seconds_per_mix = s.max(1);
            }
            let node = ctx.start_node("shoal", &[])?;
            let url = format!("{}ycsb", ctx.nodes[node].uri());
            let node_names: Vec<String> = ctx.nodes.iter().map(|n| n.name.clone()).collect();

            let mut load_props = mix_properties(sizes, 100, 0);
            load_props.set("batchsize", sizes.load_batch_size.to_string());
            let load = ctx.ycsb("load", Phase::Load, &url, &load_props).await?;

            let mut table = Table {
                title: "Throughput and latency per read:write mix".into(),
                headers: [
                    "Read:write mix",
                    "Throughput (ops/s)",
                    "Avg read latency (ms)",
                    "Avg write latency (ms)",
                    "p99 read (ms)",
                    "p99 write (ms)",
                    "Server CPU avg (% of a core)",
                    "Client CPU (% of machine)",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                rows: Vec::new(),
            };
            let mut phases = vec![PhaseTimeline { label: "load".into(), timeline: load.timeline.clone(), node_names: node_names.clone() }];
            for (r, w) in MIXES {
                let label = format!("{r}:{w}");
                let result = ctx.ycsb(&label, Phase::Run, &url, &mix_properties(sizes, r, w)).await?;
                table.rows.push(vec![
                    label.clone(),
                    format!("{:.0}", result.throughput_ops_per_s),
                    ms(result.latency_us_avg("READ")),
                    ms(result.latency_us_avg("UPDATE")),
                    p99_ms(&result, "READ"),
                    p99_ms(&result, "UPDATE"),
                    cpu_avg(&result, node).map(|c| format!("{c:.0}")).unwrap_or_else(|| "-".into()),
                    format!("{:.1}", result.client_cpu.share_of_machine_percent),
                ]);
                phases.push(PhaseTimeline { label, timeline: result.timeline.clone(), node_names: node_names.clone() });
            }
            let load_table = Table {
                title: "Load".into(),
                headers: ["Records", "Batch size", "Seconds", "Inserts/s", "Server CPU avg (% of a core)"].iter().map(|s| s.to_string()).collect(),
                rows: vec![vec![
                    sizes.record_count.to_string(),
                    sizes.load_batch_size.to_string(),
                    format!("{:.1}", load.runtime_ms as f64 / 1000.0),
                    format!("{:.0}", load.operations as f64 * 1000.0 / load.runtime_ms.max(1) as f64),
                    cpu_avg(&load, node).map(|c| format!("{c:.0}")).unwrap_or_else(|| "-".into()),
                ]],
            };
            Ok(ScenarioReport {
                title: "shoal single instance: YCSB read:write mixes".into(),
                summary: format!(
                    "One `shoal serve` node on this machine, loaded with {} YCSB records (10 fields x 100 bytes), then driven by the \
                     built-in YCSB client with {THREADS} threads, zipfian (scrambled, 0.99) request distribution, for {} s per mix. \
                     Reads read all fields by _id; writes are single-field $set updates (YCSB's defaults). Client and server share the machine.",
                    sizes.record_count, sizes.seconds_per_mix
                ),
                parameters: vec![
                    ("mode".into(), if ctx.quick { "quick".into() } else { "full".into() }),
                    ("recordcount".into(), sizes.record_count.to_string()),
                    ("seconds per mix".into(), sizes.seconds_per_mix.to_string()),
                    ("threads".into(), THREADS.to_string()),
                    ("requestdistribution".into(), "zipfian".into()),
                    ("write concern".into(), "driver default (w:1; shoal acknowledges after a durable group commit)".into()),
                ],
                machine: sys::machine_info(),
                tables: vec![table, load_table],
                phases,
                notes: vec![
                    "Latencies are measured by the client per operation (YCSB's DBWrapper), in milliseconds.".into(),
                    "CPU figures come from /proc/<pid>/stat (server) and getrusage (client), sampled every second.".into(),
                ],
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_and_sizes() {
        let p = mix_properties(sizes(true), 95, 5);
        assert_eq!(p.get("readproportion"), Some("0.95"));
        assert_eq!(p.get("updateproportion"), Some("0.05"));
        assert_eq!(p.get("requestdistribution"), Some("zipfian"));
        assert_eq!(p.get("threadcount"), Some("8"));
        let p = mix_properties(sizes(false), 0, 100);
        assert_eq!(p.get("readproportion"), Some("0"));
        assert_eq!(p.get("updateproportion"), Some("1"));
        // --quick: load plus five mixes must stay within a few minutes.
        let q = sizes(true);
        assert!(q.seconds_per_mix * MIXES.len() as u64 <= 120);
        crate::ycsb::workload::CoreWorkload::init(&p).expect("valid workload");
    }
}
