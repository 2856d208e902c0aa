//! `audit`: what the audit log costs. The vendor's six insert:read:update mixes (100:0:0,
//! 0:0:100, 50:50:0, 0:50:50, 30:70:0, 0:70:30), YCSB with 8 client threads, against two
//! nodes with authorization (the client logs in as root), one writing its audit log in
//! JSON and one in BSON, one after the other.
//!
//! Off and on are measured in the same run: while YCSB runs, the node is switched between
//! off and on every `window_s` seconds (`setAuditConfig {auditAuthorizationSuccess}`: on,
//! every CRUD command's authCheck is recorded; off, no record for a permitted command), and
//! the client's operations and latencies are read at each switch. Each window is compared
//! with the mean of its two neighbours, which takes out drift (compactions, page cache,
//! the machine's other work) that separate runs of several seconds each scatter by more
//! than the cost being measured. Reports the throughput ratio and the latency added (the
//! median over windows with a 95% interval, and the mean with its standard error), server
//! CPU per operation, and the records written per audited operation (which shows that
//! every operation was audited).

use super::{PhaseTimeline, Scenario, ScenarioContext, ScenarioReport, Table};
use crate::sys;
use crate::target::BoxFuture;
use crate::ycsb::measure::LiveStats;
use crate::ycsb::{props::Properties, Phase};
use anyhow::{bail, Context, Result};
use mongodb::bson::doc;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Audit;

/// (insert %, read %, update %), in the vendor report's order.
pub const MIXES: [(u32, u32, u32); 6] = [(100, 0, 0), (0, 0, 100), (50, 50, 0), (0, 50, 50), (30, 70, 0), (0, 70, 30)];
pub const THREADS: usize = 8;
const USER: &str = "bench";
const PASSWORD: &str = "bench";
/// The target: throughput on / off at least this, latency added at most this, in every mix.
const RATIO_MIN: f64 = 0.97;
const LATENCY_ADDED_US_MAX: f64 = 20.0;
/// Records per audited operation at least this: every CRUD command of an on window writes a
/// record, give or take the few operations in flight at each switch.
const RECORDS_PER_OP_MIN: f64 = 0.99;

#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub record_count: u64,
    /// Windows per run (half off, half on), after one warm-up window.
    pub windows: u64,
    pub window_s: u64,
}

impl Sizes {
    /// A run: the warm-up window, the measured ones, and a second for the last switch.
    pub fn seconds_per_run(self) -> u64 {
        (self.windows + 1) * self.window_s + 1
    }
}

pub fn sizes(quick: bool) -> Sizes {
    if quick {
        Sizes { record_count: 20_000, windows: 6, window_s: 2 }
    } else {
        Sizes { record_count: 100_000, windows: 30, window_s: 2 }
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
    p.set("maxexecutiontime", sizes.seconds_per_run().to_string());
    p.set("threadcount", THREADS.to_string());
    p.set("requestdistribution", "zipfian");
    p.set("readallfields", "true");
    p.set("insertproportion", format!("{}", insert as f64 / 100.0));
    p.set("readproportion", format!("{}", read as f64 / 100.0));
    p.set("updateproportion", format!("{}", update as f64 / 100.0));
    p.set("scanproportion", "0");
    p
}

/// One window of a run: its state, and what the client and the server did in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub on: bool,
    pub seconds: f64,
    pub ops: u64,
    pub latencies: u64,
    pub latency_us_sum: u64,
    /// The server's CPU time in the window (None if it could not be read).
    pub server_cpu_s: Option<f64>,
}

impl Window {
    fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.seconds.max(1e-9)
    }
    fn latency_us(&self) -> f64 {
        self.latency_us_sum as f64 / self.latencies.max(1) as f64
    }
}

/// Switch the node between off and on every `window_s` while the run goes, reading the
/// client's counters and the server's CPU at each switch; off again at the end.
async fn alternate(client: &mongodb::Client, live: &LiveStats, pid: u32, sizes: Sizes) -> Result<Vec<Window>> {
    let set = |on: bool| async move {
        client.database("admin").run_command(doc! {"setAuditConfig": 1, "auditAuthorizationSuccess": on}).await.context("setAuditConfig")
    };
    let cpu_s = || sys::process_cpu_time(pid).map(|d| d.as_secs_f64());
    let window = Duration::from_secs(sizes.window_s);
    let start = tokio::time::Instant::now();
    set(false).await?;
    // The warm-up window: connections made, caches warm.
    tokio::time::sleep_until(start + window).await;
    let mut windows = Vec::new();
    for i in 0..sizes.windows {
        let on = i % 2 == 0;
        set(on).await?;
        let (t0, ops0, (n0, sum0), cpu0) = (Instant::now(), live.ops_total(), live.latency_totals(), cpu_s());
        tokio::time::sleep_until(start + window * (i as u32 + 2)).await;
        let (t1, ops1, (n1, sum1), cpu1) = (Instant::now(), live.ops_total(), live.latency_totals(), cpu_s());
        windows.push(Window {
            on,
            seconds: t1.duration_since(t0).as_secs_f64(),
            ops: ops1 - ops0,
            latencies: n1 - n0,
            latency_us_sum: sum1 - sum0,
            server_cpu_s: cpu0.zip(cpu1).map(|(a, b)| b - a),
        });
    }
    set(false).await?;
    Ok(windows)
}

/// What a set of per-window values says: their median with a 95% interval (from the order
/// statistics, assuming nothing of their distribution), and their mean with its standard
/// error. The median is the figure reported: a window hit by a stall (a compaction, the
/// other node's background work) swings the mean by a percent or more.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub median: f64,
    pub low: f64,
    pub high: f64,
    pub mean: f64,
    pub se: f64,
}

/// Each window against the mean of its two neighbours (which are in the other state): the
/// on/off throughput ratio, and the latency on minus off. A drift that is linear over three
/// windows cancels. None with fewer than two such windows, or a window without operations.
pub fn paired(windows: &[Window]) -> Option<(Estimate, Estimate)> {
    let (mut ratios, mut added) = (Vec::new(), Vec::new());
    for w in windows.windows(3) {
        let (before, this, after) = (&w[0], &w[1], &w[2]);
        if this.ops == 0 || before.ops == 0 || after.ops == 0 {
            return None;
        }
        let (rate, rate_around) = (this.ops_per_s(), (before.ops_per_s() + after.ops_per_s()) / 2.0);
        let (lat, lat_around) = (this.latency_us(), (before.latency_us() + after.latency_us()) / 2.0);
        if this.on {
            ratios.push(rate / rate_around);
            added.push(lat - lat_around);
        } else {
            ratios.push(rate_around / rate);
            added.push(lat_around - lat);
        }
    }
    Some((estimate(&ratios)?, estimate(&added)?))
}

fn estimate(v: &[f64]) -> Option<Estimate> {
    if v.len() < 2 {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = (sorted[(sorted.len() - 1) / 2] + sorted[sorted.len() / 2]) / 2.0;
    // The median lies between the k-th smallest and the k-th largest value with about 95%
    // probability, for k = n/2 - 1.96 sqrt(n)/2 (the binomial's normal approximation).
    let k = (n / 2.0 - 0.98 * n.sqrt()).floor().max(0.0) as usize;
    Some(Estimate { median, low: sorted[k], high: sorted[sorted.len() - 1 - k], mean, se: (var / n).sqrt() })
}

/// Throughput (ops/s) and server CPU per operation (µs) over the windows in one state.
fn state_totals(windows: &[Window], on: bool) -> (f64, Option<f64>) {
    let ws: Vec<&Window> = windows.iter().filter(|w| w.on == on).collect();
    let ops: u64 = ws.iter().map(|w| w.ops).sum();
    let secs: f64 = ws.iter().map(|w| w.seconds).sum();
    let cpu: Option<f64> = ws.iter().map(|w| w.server_cpu_s).sum();
    (ops as f64 / secs.max(1e-9), cpu.map(|c| c * 1e6 / ops.max(1) as f64))
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

/// What one node's run of one mix showed.
struct MixResult {
    ratio: Estimate,
    added: Estimate,
    /// Off / on ops/s, the on/off ratio and the latency added, as table cells.
    cells: Vec<String>,
    latency_off_us: f64,
    cpu: String,
    per_op: f64,
    within: bool,
}

impl MixResult {
    fn new(windows: &[Window], ratio: Estimate, added: Estimate, per_op: f64) -> MixResult {
        let (off_rate, off_cpu) = state_totals(windows, false);
        let (on_rate, on_cpu) = state_totals(windows, true);
        let off: Vec<&Window> = windows.iter().filter(|w| !w.on).collect();
        let latency_off_us = off.iter().map(|w| w.latency_us_sum).sum::<u64>() as f64 / off.iter().map(|w| w.latencies).sum::<u64>().max(1) as f64;
        let cpu = match (off_cpu, on_cpu) {
            (Some(a), Some(b)) => format!("{a:.0} / {b:.0}"),
            _ => "-".into(),
        };
        MixResult {
            ratio,
            added,
            cells: vec![
                format!("{off_rate:.0} / {on_rate:.0}"),
                format!("{:.3} [{:.3}, {:.3}]; {:.3} ± {:.3}", ratio.median, ratio.low, ratio.high, ratio.mean, ratio.se),
                format!("{:+.0} [{:+.0}, {:+.0}]; {:+.0} ± {:.0}", added.median, added.low, added.high, added.mean, added.se),
            ],
            latency_off_us,
            cpu,
            per_op,
            within: ratio.median >= RATIO_MIN && added.median <= LATENCY_ADDED_US_MAX,
        }
    }
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
                // The run's length: as many windows as fit, at least two pairs.
                sizes.windows = (s / sizes.window_s).saturating_sub(1).max(4);
            }
            // One node per audit format, each switched between off and on at runtime. The
            // nodes run one after the other: an idle node's background work (compactions of
            // what it inserted) would otherwise fall on the other's windows.
            let formats = [Format::Json, Format::Bson];
            let mut phases = Vec::new();
            let (mut records_total, mut audit_bytes) = (0u64, 0u64);
            // [mix][format]
            let mut results: Vec<[Option<MixResult>; 2]> = MIXES.iter().map(|_| [None, None]).collect();
            for (k, format) in formats.into_iter().enumerate() {
                let name = format!("audit-{}", format.name().to_lowercase());
                let path = ctx.work_dir.join(format!("{name}.audit"));
                let path_str = path.to_str().context("work dir path is not UTF-8")?.to_string();
                let args = ["--auth", "--auditDestination", "file", "--auditFormat", format.name(), "--auditPath", &path_str].map(String::from);
                let node = ctx.start_node(&name, &args)?;
                // The localhost exception lets the first user in.
                let port = ctx.nodes[node].port;
                super::chaining::direct(port)
                    .await?
                    .database("admin")
                    .run_command(doc! {"createUser": USER, "pwd": PASSWORD, "roles": [{"role": "root", "db": "admin"}]})
                    .await
                    .context("createUser")?;
                let url = format!("mongodb://{USER}:{PASSWORD}@127.0.0.1:{port}/ycsb?authSource=admin");
                let client = mongodb::Client::with_uri_str(&url).await?;
                let node_names: Vec<String> = ctx.nodes.iter().map(|n| n.name.clone()).collect();

                let mut load_props = mix_properties(sizes, (0, 100, 0), sizes.record_count, sizes.record_count);
                load_props.set("batchsize", "100");
                load_props.set("maxexecutiontime", "0");
                let label = format!("load {name}");
                let r = ctx.ycsb(&label, Phase::Load, &url, &load_props).await?;
                phases.push(PhaseTimeline { label, timeline: r.timeline.clone(), node_names: node_names.clone() });
                let (n, b) = rotate_and_count(&client, &path, format).await?;
                records_total += n;
                audit_bytes += b;
                // Each run's inserts go past all of the node's earlier ones.
                let mut next_key = sizes.record_count;
                for (m, mix) in MIXES.into_iter().enumerate() {
                    let (i, r, u) = mix;
                    let mix_label = format!("{i}:{r}:{u}");
                    let label = format!("{mix_label} {name} off/on every {} s", sizes.window_s);
                    let props = mix_properties(sizes, mix, sizes.record_count, next_key);
                    let live = Arc::new(LiveStats::new());
                    let pid = ctx.nodes[node].pid();
                    let (result, windows) =
                        tokio::join!(ctx.ycsb_watched(&label, Phase::Run, &url, &props, Some(live.clone())), alternate(&client, &live, pid, sizes));
                    let (result, windows) = (result?, windows?);
                    next_key += result.operations_of("INSERT");
                    phases.push(PhaseTimeline { label: label.clone(), timeline: result.timeline.clone(), node_names: node_names.clone() });
                    let series: Vec<String> = windows.iter().map(|w| format!("{}{:.0}", if w.on { "+" } else { "-" }, w.ops_per_s())).collect();
                    eprintln!("scenario: {label}: ops/s per window (+ on, - off): {}", series.join(" "));
                    let Some((ratio, added)) = paired(&windows) else { bail!("mix {mix_label}: a window without operations on {name}") };
                    let on_ops: u64 = windows.iter().filter(|w| w.on).map(|w| w.ops).sum();
                    let (written, bytes) = rotate_and_count(&client, &path, format).await?;
                    records_total += written;
                    audit_bytes += bytes;
                    let per_op = written as f64 / on_ops.max(1) as f64;
                    if per_op < RECORDS_PER_OP_MIN {
                        bail!("mix {mix_label}: {on_ops} operations in on windows wrote only {per_op:.3} records each; every CRUD command must be audited");
                    }
                    results[m][k] = Some(MixResult::new(&windows, ratio, added, per_op));
                }
                // Stop the node before the next starts (it exits once the shutdown's reply is
                // due, so the command itself fails).
                let _ = client.database("admin").run_command(doc! {"shutdown": 1}).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }

            let headers = [
                "Mix (insert:read:update)",
                "JSON node off / on (ops/s)",
                "JSON on / off: median [95% interval]; mean ± s.e.",
                "JSON latency added (µs): median [95% interval]; mean ± s.e.",
                "BSON node off / on (ops/s)",
                "BSON on / off: median [95% interval]; mean ± s.e.",
                "BSON latency added (µs): median [95% interval]; mean ± s.e.",
                "Avg latency off, JSON / BSON (µs)",
                "Server CPU per op off / on, JSON; BSON (µs)",
                "Records per audited operation (JSON, BSON)",
                "Within ≤ 3% and ≤ 20 µs (JSON, BSON)",
            ];
            let mut table = Table {
                title: "Audit off and on, per insert:read:update mix".into(),
                headers: headers.iter().map(|s| s.to_string()).collect(),
                rows: Vec::new(),
            };
            // Worst on/off ratio and latency added, per format.
            let mut worst = [(f64::MAX, f64::MIN); 2];
            let mut all_within = true;
            for (mix, result) in MIXES.iter().zip(&results) {
                let [Some(json), Some(bson)] = result else { bail!("a mix without results") };
                let yes = |b: bool| if b { "yes" } else { "no" };
                let mut row = vec![format!("{}:{}:{}", mix.0, mix.1, mix.2)];
                for (k, r) in [json, bson].into_iter().enumerate() {
                    row.extend(r.cells.iter().cloned());
                    worst[k].0 = worst[k].0.min(r.ratio.median);
                    worst[k].1 = worst[k].1.max(r.added.median);
                    all_within &= r.within;
                }
                row.push(format!("{:.0} / {:.0}", json.latency_off_us, bson.latency_off_us));
                row.push(format!("{}; {}", json.cpu, bson.cpu));
                row.push(format!("{:.3}, {:.3}", json.per_op, bson.per_op));
                row.push(format!("{}, {}", yes(json.within), yes(bson.within)));
                table.rows.push(row);
            }
            Ok(ScenarioReport {
                title: "shoal audit log: cost per insert:read:update mix".into(),
                summary: format!(
                    "Two `shoal serve` nodes on this machine, one after the other, both with `--auth` (the client logs in as a root \
                     user) and an audit log file, one in JSON and one in BSON. Each is loaded with {} YCSB records (10 fields x 100 bytes). Then, per mix and \
                     node, one YCSB run ({THREADS} client threads, zipfian requests; inserts are single 1 KB documents, reads read \
                     all fields by _id, updates $set one field) during which the node is switched every {} s between off \
                     (`setAuditConfig {{auditAuthorizationSuccess: false}}`: no record for a permitted command, and none is refused \
                     here) and on (`auditAuthorizationSuccess: true`: every CRUD command's authCheck is recorded): {} windows after \
                     a warm-up, half in each state. Each window is compared with the mean of its neighbours, and the median \
                     over windows is reported. Client and servers share the machine. Worst mix, JSON: on/off throughput {:.3}, latency added {:+.0} µs; BSON: {:.3}, {:+.0} µs. \
                     Target (≥ {RATIO_MIN} and ≤ {LATENCY_ADDED_US_MAX} µs in every mix): {}.",
                    sizes.record_count,
                    sizes.window_s,
                    sizes.windows,
                    worst[0].0,
                    worst[0].1,
                    worst[1].0,
                    worst[1].1,
                    if all_within { "met" } else { "not met" }
                ),
                parameters: vec![
                    ("mode".into(), if ctx.quick { "quick".into() } else { "full".into() }),
                    ("recordcount".into(), sizes.record_count.to_string()),
                    ("window".into(), format!("{} s", sizes.window_s)),
                    ("windows per run".into(), format!("{} after a warm-up window", sizes.windows)),
                    ("threads".into(), THREADS.to_string()),
                    ("audit records written".into(), format!("{records_total}, {:.1} MB (each run's file rotated away after it is counted)", audit_bytes as f64 / 1e6)),
                ],
                machine: sys::machine_info(),
                tables: vec![table],
                phases,
                notes: vec![
                    "On / off compares each window's throughput with the mean of its two neighbours (on against off, or off \
                     against on, inverted); latency added likewise, from the client's latencies of the operations that completed \
                     in each window. The table gives the median over windows with a 95% interval from the order statistics, \
                     and the mean with its standard error (somewhat optimistic: neighbouring windows share a neighbour). The \
                     median is the figure judged against the target: a window hit by a stall (a compaction, the other node's \
                     background work) moves the mean by a percent or more. Off / on ops/s are plain totals over each state's \
                     windows."
                        .into(),
                    "Records per audited operation counts the records a node wrote in a run, divided by the operations that \
                     completed in its on windows. It is about 1: every CRUD command of an on window writes an authCheck record, \
                     give or take the few operations in flight at each switch; the client's authentications add a few records."
                        .into(),
                    "Server CPU per operation comes from /proc/<pid>/stat at each switch (10 ms ticks), over the windows of each state.".into(),
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
        assert_eq!(p.get("maxexecutiontime"), Some(s.seconds_per_run().to_string().as_str()));
        let w = crate::ycsb::workload::CoreWorkload::init(&p).expect("valid workload");
        // Inserts start past every key inserted before; reads stay within the loaded ones.
        assert_eq!(w.next_insert_key(), 1500);
        for (i, r, u) in MIXES {
            assert_eq!(i + r + u, 100);
        }
        // --quick stays within a few minutes: 6 mixes x 2 nodes x one run.
        assert!(s.seconds_per_run() * 12 <= 240);
        assert!(s.windows.is_multiple_of(2) && s.windows >= 4, "as many windows on as off, and at least two pairs");
    }

    fn window(on: bool, ops: u64, latency_us: u64) -> Window {
        Window { on, seconds: 2.0, ops, latencies: ops, latency_us_sum: ops * latency_us, server_cpu_s: Some(1.0) }
    }

    #[test]
    fn paired_windows_take_out_a_drift() {
        // On costs 5% of throughput and adds 40 µs, while throughput drifts up by 100 ops/s per window.
        let ws: Vec<Window> = (0..10)
            .map(|i| {
                let on = i % 2 == 0;
                let base = 10_000.0 + 100.0 * i as f64;
                window(on, (if on { base * 0.95 } else { base }) as u64 * 2, if on { 840 } else { 800 })
            })
            .collect();
        let (ratio, added) = paired(&ws).unwrap();
        assert!((ratio.mean - 0.95).abs() < 0.002 && (ratio.median - 0.95).abs() < 0.002, "{ratio:?}");
        assert!(ratio.low <= ratio.median && ratio.median <= ratio.high, "{ratio:?}");
        assert!((added.mean - 40.0).abs() < 0.5 && (added.median - 40.0).abs() < 0.5, "{added:?}");
        // A stall in one window moves the mean, not the median.
        let mut stalled = ws.clone();
        stalled[5].ops /= 2;
        let (r, _) = paired(&stalled).unwrap();
        assert!((r.median - 0.95).abs() < 0.01 && (r.mean - 0.95).abs() > 0.02, "{r:?}");
        // Comparing the totals instead would be off by the drift.
        let (off, _) = state_totals(&ws, false);
        let (on, _) = state_totals(&ws, true);
        assert!((on / off - 0.95).abs() > 0.004);
        // No cost, no drift: 1 and 0, with no error.
        let flat: Vec<Window> = (0..6).map(|i| window(i % 2 == 0, 20_000, 800)).collect();
        let (r, a) = paired(&flat).unwrap();
        assert_eq!((r.median, r.low, r.high, r.mean, r.se), (1.0, 1.0, 1.0, 1.0, 0.0));
        assert_eq!((a.median, a.low, a.high, a.mean, a.se), (0.0, 0.0, 0.0, 0.0, 0.0));
        // A window without operations, or too few windows: no estimate.
        let mut stalled = flat.clone();
        stalled[3].ops = 0;
        assert!(paired(&stalled).is_none());
        assert!(paired(&flat[..3]).is_none());
    }
}
