//! Benchmark scenarios: scripted runs that start the servers they need, drive them with the
//! YCSB/insert clients and write a Markdown report plus a chart. A new scenario (replication,
//! audit, sharding, log shipping) implements `Scenario` using `ScenarioContext` to start nodes
//! and run phases; the report and chart writers are shared.
//!
//! The scenarios (`registry`):
//!
//! - `instance`: YCSB read:write mixes on one node.
//! - `chaining`: replica sets of 3, 7 and 15 members, chaining on, off and auto, at w:1 and
//!   w:"majority".
//! - `logship`: the log transports pull, push and shm: a secondary's catch-up rate, lag
//!   against write rate, and strict-consistency secondary reads against client threads.
//! - `audit`: the six insert:read:update mixes on a node switched between auditing off and
//!   on every 2 s, in JSON and in BSON.
//! - `elastic`: bench02 inserts into a collection hash-sharded on customerId behind a
//!   router over 1 to 16 shards, and into one shard directly, with the router's and the
//!   shards' CPU per insert.

pub mod audit;
pub mod chaining;
pub mod chart;
pub mod elastic;
pub mod instance;
pub mod logship;

use crate::progress::TimelineSample;
use crate::sys::{self, MachineInfo};
use crate::target::BoxFuture;
use crate::ycsb::{self, props::Properties, Phase, YcsbOptions, YcsbResult};
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a started node gets to accept connections.
pub const NODE_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Nodes one scenario may start (a sharded cluster with replicas stays well below this).
pub const NODES_MAX: usize = 32;

pub trait Scenario: Send + Sync {
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    fn run<'a>(&'a self, ctx: &'a mut ScenarioContext) -> BoxFuture<'a, Result<ScenarioReport>>;
}

/// Every scenario `shoal bench scenario NAME` knows.
pub fn registry() -> Vec<Box<dyn Scenario>> {
    vec![Box::new(instance::Instance), Box::new(chaining::Chaining), Box::new(logship::Logship), Box::new(audit::Audit), Box::new(elastic::Elastic)]
}

/// A server process started by a scenario; killed when dropped.
pub struct Node {
    pub name: String,
    pub port: u16,
    pub dbpath: PathBuf,
    child: Child,
}

impl Node {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Command-line overrides of a scenario's sizes.
#[derive(Debug, Clone, Default)]
pub struct SizeOverrides {
    pub records: Option<u64>,
    pub seconds_per_phase: Option<u64>,
    /// Replica-set sizes (the chaining scenario).
    pub members: Option<Vec<usize>>,
    /// settings.chainingAllowed modes to run: on, off, auto (the chaining scenario).
    pub chaining: Option<Vec<String>>,
    /// The shoal binary to start servers from, instead of the running one.
    pub server: Option<PathBuf>,
}

pub struct ScenarioContext {
    pub quick: bool,
    pub sizes: SizeOverrides,
    pub out_dir: PathBuf,
    /// Scratch space for data directories and logs; removed at the end.
    pub work_dir: PathBuf,
    pub nodes: Vec<Node>,
    /// The shoal binary to start (the running executable).
    pub server_exe: PathBuf,
}

pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(l.local_addr().context("local_addr")?.port())
}

impl ScenarioContext {
    pub fn new(quick: bool, sizes: SizeOverrides, out_dir: &Path) -> Result<ScenarioContext> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let work_dir = std::env::temp_dir().join(format!("shoal-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&work_dir).with_context(|| format!("create {}", work_dir.display()))?;
        std::fs::create_dir_all(out_dir).with_context(|| format!("create {}", out_dir.display()))?;
        let server_exe = match &sizes.server {
            Some(p) if p.is_file() => p.clone(),
            Some(p) => bail!("--server {}: no such file", p.display()),
            None => std::env::current_exe().context("locate the shoal executable")?,
        };
        Ok(ScenarioContext { quick, sizes, out_dir: out_dir.to_path_buf(), work_dir, nodes: Vec::new(), server_exe })
    }

    /// Starts `shoal serve` on a free loopback port with a fresh dbpath and waits until it
    /// accepts connections. Returns the node's index in `nodes`.
    pub fn start_node(&mut self, name: &str, args_extra: &[String]) -> Result<usize> {
        let dbpath = self.work_dir.join(format!("{name}-db"));
        std::fs::create_dir_all(&dbpath).with_context(|| format!("create {}", dbpath.display()))?;
        let mut args = vec!["serve".to_string(), "--bind_ip".into(), "127.0.0.1".into(), "--dbpath".into(), dbpath.display().to_string()];
        args.extend(args_extra.iter().cloned());
        self.start_process(name, args, dbpath)
    }

    /// Starts `shoal router` for the config servers `configdb` (`set/host:port`) on a free
    /// port; returns its index in `nodes`.
    pub fn start_router(&mut self, name: &str, configdb: &str) -> Result<usize> {
        let args = vec!["router".to_string(), "--bind_ip".into(), "127.0.0.1".into(), "--configdb".into(), configdb.to_string()];
        let dir = self.work_dir.clone();
        self.start_process(name, args, dir)
    }

    /// Runs the shoal binary with `args` and `--port <free port>`, and waits until it accepts
    /// connections.
    fn start_process(&mut self, name: &str, args: Vec<String>, dbpath: PathBuf) -> Result<usize> {
        if self.nodes.len() >= NODES_MAX {
            bail!("a scenario may start at most {NODES_MAX} nodes");
        }
        let port = free_port()?;
        let log = std::fs::File::create(self.work_dir.join(format!("{name}.log"))).context("create node log")?;
        let mut cmd = Command::new(&self.server_exe);
        cmd.args(&args).args(["--port", &port.to_string()]);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        let mut child = cmd.spawn().with_context(|| format!("start {} serve", self.server_exe.display()))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + NODE_READY_TIMEOUT;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(self.work_dir.join(format!("{name}.log"))).unwrap_or_default();
                bail!("node {name} exited ({status}) before accepting connections:\n{log}");
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("node {name} did not accept connections on port {port} within {NODE_READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.nodes.push(Node { name: name.to_string(), port, dbpath, child });
        Ok(self.nodes.len() - 1)
    }

    pub fn watch_all(&self) -> Vec<(String, u32)> {
        self.nodes.iter().map(|n| (n.name.clone(), n.pid())).collect()
    }

    /// Runs one YCSB phase against `url`, sampling the CPU of every node.
    pub async fn ycsb(&self, label: &str, phase: Phase, url: &str, props: &Properties) -> Result<YcsbResult> {
        self.ycsb_watched(label, phase, url, props, None).await
    }

    /// `ycsb`, updating `live` as it goes (for a caller that reads the counters mid-run).
    pub async fn ycsb_watched(
        &self,
        label: &str,
        phase: Phase,
        url: &str,
        props: &Properties,
        live: Option<std::sync::Arc<crate::ycsb::measure::LiveStats>>,
    ) -> Result<YcsbResult> {
        let mut p = props.clone();
        p.set("mongodb.url", url);
        let mut opts = YcsbOptions::new(phase, p);
        opts.live = live;
        opts.watch_pids = self.watch_all();
        opts.quiet = true;
        opts.label = label.to_string();
        eprintln!("scenario: {label} ...");
        let r = ycsb::run(&opts).await.with_context(|| format!("phase {label}"))?;
        eprintln!(
            "scenario: {label}: {:.0} ops/s over {:.1} s, client CPU {:.1}% of the machine",
            r.throughput_ops_per_s,
            r.runtime_ms as f64 / 1000.0,
            r.client_cpu.share_of_machine_percent
        );
        Ok(r)
    }
}

impl Drop for ScenarioContext {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.work_dir);
    }
}

/// A node's CPU averaged over a phase's samples (% of one core).
pub fn cpu_avg(r: &YcsbResult, node: usize) -> Option<f64> {
    let v: Vec<f64> = r.timeline.iter().filter_map(|s| s.cpu_percent.get(node).copied()).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

#[derive(Debug, Clone, Default)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// One timed phase of a scenario, with its per-second samples.
#[derive(Debug, Clone)]
pub struct PhaseTimeline {
    pub label: String,
    pub timeline: Vec<TimelineSample>,
    /// Names of the sampled processes, in `TimelineSample::cpu_percent` order.
    pub node_names: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ScenarioReport {
    pub title: String,
    pub summary: String,
    pub parameters: Vec<(String, String)>,
    pub machine: MachineInfo,
    pub tables: Vec<Table>,
    pub phases: Vec<PhaseTimeline>,
    pub notes: Vec<String>,
}

fn md_table(out: &mut String, t: &Table) {
    if !t.title.is_empty() {
        let _ = writeln!(out, "### {}\n", t.title);
    }
    let _ = writeln!(out, "| {} |", t.headers.join(" | "));
    let _ = writeln!(out, "|{}|", t.headers.iter().map(|_| " --- ").collect::<Vec<_>>().join("|"));
    for r in &t.rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out.push('\n');
}

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|x| format!("{x:.decimals$}")).unwrap_or_else(|| "-".into())
}

impl ScenarioReport {
    /// The Markdown report; `chart_file` is linked when present.
    pub fn markdown(&self, chart_file: Option<&str>) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# {}\n", self.title);
        if !self.summary.is_empty() {
            let _ = writeln!(out, "{}\n", self.summary);
        }
        let _ = writeln!(out, "## Machine\n");
        let m = &self.machine;
        let _ = writeln!(out, "- CPU: {} ({} cores)", m.cpu_model, m.cpu_count);
        let _ = writeln!(out, "- Memory: {:.1} GiB", m.memory_total_bytes as f64 / (1u64 << 30) as f64);
        let _ = writeln!(out, "- OS: {} (kernel {})\n", m.os, m.kernel);
        if !self.parameters.is_empty() {
            let _ = writeln!(out, "## Parameters\n");
            for (k, v) in &self.parameters {
                let _ = writeln!(out, "- {k}: {v}");
            }
            out.push('\n');
        }
        let _ = writeln!(out, "## Results\n");
        for t in &self.tables {
            md_table(&mut out, t);
        }
        if let Some(chart) = chart_file {
            let _ = writeln!(out, "![QPS, response time and CPU over time]({chart})\n");
        }
        if !self.phases.is_empty() {
            let _ = writeln!(out, "## Over time\n");
            let _ = writeln!(out, "Per-phase averages of the 1-second samples (CPU in % of one core).\n");
            let node_names = self.phases.first().map(|p| p.node_names.clone()).unwrap_or_default();
            let mut headers =
                vec!["Phase".to_string(), "Seconds".into(), "QPS avg".into(), "QPS min".into(), "QPS max".into(), "Response time avg (us)".into()];
            headers.extend(node_names.iter().map(|n| format!("{n} CPU avg (%)")));
            let mut t = Table { title: String::new(), headers, rows: Vec::new() };
            for p in &self.phases {
                let n = p.timeline.len().max(1) as f64;
                let qps: Vec<f64> = p.timeline.iter().map(|s| s.ops_per_s).collect();
                let lat: Vec<f64> = p.timeline.iter().filter_map(|s| s.latency_us_avg).collect();
                let mut row = vec![
                    p.label.clone(),
                    format!("{:.0}", p.timeline.last().map(|s| s.elapsed_s).unwrap_or(0.0)),
                    format!("{:.0}", qps.iter().sum::<f64>() / n),
                    format!("{:.0}", qps.iter().cloned().reduce(f64::min).unwrap_or(0.0)),
                    format!("{:.0}", qps.iter().cloned().fold(0.0, f64::max)),
                    fmt_opt(if lat.is_empty() { None } else { Some(lat.iter().sum::<f64>() / lat.len() as f64) }, 0),
                ];
                for i in 0..node_names.len() {
                    let cpu: Vec<f64> = p.timeline.iter().filter_map(|s| s.cpu_percent.get(i).copied()).collect();
                    row.push(fmt_opt(if cpu.is_empty() { None } else { Some(cpu.iter().sum::<f64>() / cpu.len() as f64) }, 0));
                }
                t.rows.push(row);
            }
            md_table(&mut out, &t);
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out, "## Notes\n");
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
            out.push('\n');
        }
        out
    }

    /// Raw results: the tables and every timeline sample.
    pub fn json(&self) -> String {
        let v = serde_json::json!({
            "title": self.title,
            "parameters": self.parameters.iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect::<Vec<_>>(),
            "machine": {
                "cpu_model": self.machine.cpu_model, "cpu_count": self.machine.cpu_count,
                "memory_total_bytes": self.machine.memory_total_bytes, "kernel": self.machine.kernel, "os": self.machine.os,
            },
            "tables": self.tables.iter().map(|t| serde_json::json!({"title": t.title, "headers": t.headers, "rows": t.rows})).collect::<Vec<_>>(),
            "phases": self.phases.iter().map(|p| serde_json::json!({
                "label": p.label,
                "nodes": p.node_names,
                "samples": p.timeline.iter().map(|s| serde_json::json!({
                    "elapsed_s": s.elapsed_s, "ops_per_s": s.ops_per_s, "latency_us_avg": s.latency_us_avg,
                    "read_latency_us_avg": s.read_latency_us_avg, "write_latency_us_avg": s.write_latency_us_avg,
                    "cpu_percent": s.cpu_percent,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        serde_json::to_string_pretty(&v).unwrap_or_else(|_| "{}".into())
    }
}

/// Runs a scenario and writes report.md, chart.png (or chart.svg) and results.json into
/// `out`; returns the report's path.
pub async fn run_scenario(s: &dyn Scenario, quick: bool, sizes: SizeOverrides, out: &Path) -> Result<PathBuf> {
    let mut ctx = ScenarioContext::new(quick, sizes, out)?;
    let mut report = s.run(&mut ctx).await?;
    drop(ctx);
    if report.machine.cpu_count == 0 {
        report.machine = sys::machine_info();
    }
    let chart = chart::write_chart(&report, out)?;
    let chart_name = chart.as_ref().and_then(|p| p.file_name()).and_then(|n| n.to_str()).map(String::from);
    let md_path = out.join("report.md");
    std::fs::write(&md_path, report.markdown(chart_name.as_deref())).with_context(|| format!("write {}", md_path.display()))?;
    let json_path = out.join("results.json");
    std::fs::write(&json_path, report.json()).with_context(|| format!("write {}", json_path.display()))?;
    Ok(md_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, qps: f64) -> TimelineSample {
        TimelineSample {
            elapsed_s: t,
            ops_per_s: qps,
            read_latency_us_avg: Some(100.0),
            write_latency_us_avg: None,
            latency_us_avg: Some(100.0),
            cpu_percent: vec![50.0],
        }
    }

    #[test]
    fn markdown_has_tables_machine_and_timeline_summary() {
        let report = ScenarioReport {
            title: "T".into(),
            summary: "S".into(),
            parameters: vec![("threads".into(), "8".into())],
            machine: sys::machine_info(),
            tables: vec![Table { title: "Mixes".into(), headers: vec!["Mix".into(), "Throughput".into()], rows: vec![vec!["100:0".into(), "123".into()]] }],
            phases: vec![PhaseTimeline { label: "100:0".into(), timeline: vec![sample(1.0, 10.0), sample(2.0, 30.0)], node_names: vec!["shoal".into()] }],
            notes: vec!["n".into()],
        };
        let md = report.markdown(Some("chart.png"));
        assert!(md.starts_with("# T\n"));
        assert!(md.contains("| Mix | Throughput |"));
        assert!(md.contains("| 100:0 | 123 |"));
        assert!(md.contains("- threads: 8"));
        assert!(md.contains("![QPS, response time and CPU over time](chart.png)"));
        assert!(md.contains("| 100:0 | 2 | 20 | 10 | 30 | 100 | 50 |"), "{md}");
        let json: serde_json::Value = serde_json::from_str(&report.json()).expect("json");
        assert_eq!(json["phases"][0]["samples"][1]["ops_per_s"], 30.0);
    }

    #[test]
    fn registry_names_are_unique() {
        let r = registry();
        let mut names: Vec<_> = r.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), r.len());
        assert!(names.contains(&"instance"));
    }
}
