//! The change-stream benchmark: YCSB workload A (reads and updates, half each, zipfian) runs
//! against a replica set's primary while N change streams follow its collection. Beside the
//! load, a probe writer updates a document of its own in that collection at a steady rate
//! and notes when each update is acknowledged; every stream notes when that update's event
//! arrives. Phases with different N run in turn in one invocation (`--streams 0,1,10,100`),
//! so they compare; each reports YCSB's operations/s, the probe events' latency from
//! acknowledgement to arrival (p50, p99, over every stream), events lost, each watched
//! process's CPU per YCSB update, and the machine's idle CPU.
//!
//! Streams and probe use the lean wire client (one host: the primary, with
//! `directConnection=true`), which reads events as raw BSON: the client's own cost per event
//! stays small beside the server's.

use crate::sys;
use crate::target::Connector;
use crate::ycsb::measure::new_histogram;
use crate::ycsb::props::Properties;
use crate::ycsb::{self, Phase, YcsbOptions};
use anyhow::{bail, Context, Result};
use bson::doc;
use hdrhistogram::Histogram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Streams a phase may open.
pub const STREAMS_MAX: usize = 1000;
/// The probe document's `_id`, outside YCSB's `user…` keys.
const PROBE_ID: &str = "~probe";
/// Time the streams get after the load stops to receive the last probes' events.
const DRAIN: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct WatchOptions {
    pub url: String,
    pub database: String,
    pub collection: String,
    /// One phase per entry: the streams open during it.
    pub streams: Vec<usize>,
    /// YCSB records (loaded first with `load`).
    pub records: u64,
    pub threads: usize,
    pub seconds_per_phase: u64,
    pub probes_per_second: u32,
    pub load: bool,
    /// Server processes whose CPU time the report divides by YCSB updates.
    pub watch_pids: Vec<(String, u32)>,
}

pub struct PhaseReport {
    pub streams: usize,
    pub ops_per_second: f64,
    pub updates: u64,
    pub probes: u64,
    /// Probe events received, over all streams.
    pub probe_events: u64,
    /// Events of every kind received, over all streams.
    pub events: u64,
    pub latency_us: Histogram<u64>,
    pub server_cpu: Vec<(String, Duration)>,
    pub machine_idle_percent: Option<f64>,
}

impl PhaseReport {
    pub fn text(&self) -> String {
        let h = &self.latency_us;
        let expected = self.probes * self.streams as u64;
        let mut out = format!(
            "[watch] {} streams: YCSB A {:.0} ops/s ({} updates); {} probe events of {} expected; event latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {} events delivered",
            self.streams,
            self.ops_per_second,
            self.updates,
            self.probe_events,
            expected,
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.max() as f64 / 1000.0,
            self.events,
        );
        for (name, cpu) in &self.server_cpu {
            out.push_str(&format!("; {name} CPU {:.1} us per update", cpu.as_secs_f64() * 1e6 / self.updates.max(1) as f64));
        }
        if let Some(idle) = self.machine_idle_percent {
            out.push_str(&format!("; machine idle {idle:.0}%"));
        }
        out.push('\n');
        out
    }
}

pub async fn run(o: &WatchOptions) -> Result<Vec<PhaseReport>> {
    if o.streams.is_empty() || o.streams.iter().any(|n| *n > STREAMS_MAX) {
        bail!("--streams takes one to many counts, each at most {STREAMS_MAX}");
    }
    if o.probes_per_second == 0 || o.probes_per_second > 10_000 {
        bail!("--probes-per-second must be 1 to 10000");
    }
    let connector = Arc::new(match Connector::new(&o.url, &o.database).await? {
        Connector::Wire(w) => w,
        _ => bail!("shoal bench watch needs one mongodb:// host without auth or TLS (the primary, with directConnection=true)"),
    });
    let mut props = Properties::load_file("workloada")?;
    props.set("recordcount", o.records.to_string());
    props.set("threadcount", o.threads.to_string());
    props.set("mongodb.url", o.url.clone());
    props.set("table", o.collection.clone());
    if o.load {
        let mut load = YcsbOptions::new(Phase::Load, props.clone());
        load.drop_first = true;
        load.quiet = true;
        ycsb::run(&load).await.context("YCSB load")?;
    }
    props.set("operationcount", "1000000000");
    props.set("maxexecutiontime", o.seconds_per_phase.to_string());
    let mut reports = Vec::with_capacity(o.streams.len());
    for &streams in &o.streams {
        reports.push(phase(o, &connector, &props, streams).await?);
    }
    Ok(reports)
}

async fn phase(o: &WatchOptions, connector: &Arc<crate::target::wire::WireConnector>, props: &Properties, streams: usize) -> Result<PhaseReport> {
    let until = Instant::now() + Duration::from_secs(o.seconds_per_phase) + DRAIN * 2 + Duration::from_secs(streams as u64 / 20);
    // Each stream's probe arrivals: (sequence number, when).
    let arrivals: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let (opened_tx, mut opened_rx) = tokio::sync::mpsc::channel::<()>(streams.max(1));
    let mut followers = Vec::with_capacity(streams);
    for _ in 0..streams {
        let (c, coll, arrivals, opened) = (connector.clone(), o.collection.clone(), arrivals.clone(), opened_tx.clone());
        followers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let events = c
                .follow_changes(
                    &coll,
                    until,
                    move || {
                        let _ = opened.try_send(());
                    },
                    |e| {
                        let key = e.get_document("documentKey").ok().and_then(|k| k.get_str("_id").ok());
                        if key == Some(PROBE_ID) {
                            if let Ok(seq) = e.get_document("updateDescription").and_then(|u| u.get_document("updatedFields")).and_then(|f| f.get_i64("seq")) {
                                mine.push((seq, Instant::now()));
                            }
                        }
                    },
                )
                .await?;
            // Each probe's event comes to each stream once.
            let mut seqs: Vec<i64> = mine.iter().map(|(s, _)| *s).collect();
            seqs.sort_unstable();
            let before = seqs.len();
            seqs.dedup();
            let duplicates = (before - seqs.len()) as u64;
            arrivals.lock().map_err(|_| anyhow::anyhow!("arrivals lock poisoned"))?.extend(mine);
            anyhow::Ok((events, duplicates))
        }));
    }
    drop(opened_tx);
    for _ in 0..streams {
        opened_rx.recv().await.context("a stream failed to open")?;
    }
    // The probe: updates at a steady rate, each acknowledgement noted.
    let probe = connector.session().await?;
    probe.upsert_set(&o.collection, PROBE_ID, doc! {"seq": -1i64}).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (coll, rate, stop_probe) = (o.collection.clone(), o.probes_per_second, stop.clone());
    let prober = tokio::spawn(async move {
        let mut acks: Vec<Instant> = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
        while !stop_probe.load(std::sync::atomic::Ordering::Relaxed) {
            tick.tick().await;
            probe.upsert_set(&coll, PROBE_ID, doc! {"seq": acks.len() as i64}).await?;
            acks.push(Instant::now());
        }
        anyhow::Ok(acks)
    });
    let cpu_start: Vec<Option<Duration>> = o.watch_pids.iter().map(|(_, pid)| sys::process_cpu_time(*pid)).collect();
    let machine_start = sys::machine_cpu_ticks();
    let mut opts = YcsbOptions::new(Phase::Run, props.clone());
    opts.quiet = true;
    let result = ycsb::run(&opts).await.context("YCSB run")?;
    let server_cpu = o
        .watch_pids
        .iter()
        .zip(cpu_start)
        .filter_map(|((name, pid), start)| Some((name.clone(), sys::process_cpu_time(*pid)?.saturating_sub(start?))))
        .collect();
    let machine_idle_percent = machine_start.zip(sys::machine_cpu_ticks()).map(|(a, b)| sys::idle_percent(a, b));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acks = prober.await.context("the probe")??;
    let (mut events, mut duplicates) = (0u64, 0u64);
    for f in followers {
        let (n, d) = f.await.context("a stream")??;
        events += n;
        duplicates += d;
    }
    let mut latency_us = new_histogram();
    let arrivals = std::mem::take(&mut *arrivals.lock().map_err(|_| anyhow::anyhow!("arrivals lock poisoned"))?);
    let mut probe_events = 0u64;
    if duplicates > 0 {
        bail!("{duplicates} probe events came to a stream more than once");
    }
    for (seq, at) in &arrivals {
        // An event may beat its acknowledgement to the client: that counts as no wait.
        if let Some(acked) = usize::try_from(*seq).ok().and_then(|s| acks.get(s)) {
            probe_events += 1;
            let _ = latency_us.record(at.saturating_duration_since(*acked).as_micros() as u64);
        }
    }
    Ok(PhaseReport {
        streams,
        ops_per_second: result.throughput_ops_per_s,
        updates: result.operations_of("UPDATE"),
        probes: acks.len() as u64,
        probe_events,
        events,
        latency_us,
        server_cpu,
        machine_idle_percent,
    })
}
