//! Live progress: a 1-second sampler that feeds a timeline (QPS, average latency, CPU of
//! watched processes) and shows an indicatif bar on a terminal, or plain status lines every
//! 10 s otherwise (YCSB's StatusThread format, or bench02's interval lines).

use crate::sys;
use crate::ycsb::measure::{decimal_2, empty_histograms, status_summary, summarize, LiveStats, OpKind, OP_KINDS};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
pub const STATUS_INTERVAL: Duration = Duration::from_secs(10);
/// Timeline samples kept (one per second): a day of run time.
pub const TIMELINE_SAMPLES_MAX: usize = 86_400;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// "2024-01-01 10:00:10:123 10 sec: N operations; X current ops/sec; [READ: ...]".
    Ycsb,
    /// bench02: elapsed, interval and overall inserts/s, interval latency.
    Inserts,
}

#[derive(Debug, Clone)]
pub struct ProgressConfig {
    pub label: String,
    pub style: Style,
    /// Operations the run will do, when known (drives the bar and the completion estimate).
    pub total_ops: Option<u64>,
    pub max_time: Option<Duration>,
    /// Processes whose CPU use is sampled each second (name, pid).
    pub watch_pids: Vec<(String, u32)>,
    /// None: a bar when stderr is a terminal, plain lines otherwise.
    pub interactive: Option<bool>,
    /// No output at all (scenarios print their own summary); the timeline is still sampled.
    pub quiet: bool,
}

#[derive(Debug, Clone, Default)]
pub struct TimelineSample {
    pub elapsed_s: f64,
    pub ops_per_s: f64,
    pub read_latency_us_avg: Option<f64>,
    pub write_latency_us_avg: Option<f64>,
    pub latency_us_avg: Option<f64>,
    /// CPU use of each watched process over the last second, percent of one core.
    pub cpu_percent: Vec<f64>,
}

pub struct Progress {
    stop: Arc<AtomicBool>,
    handle: tokio::task::JoinHandle<Vec<TimelineSample>>,
}

impl Progress {
    pub fn start(cfg: ProgressConfig, live: Arc<LiveStats>) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = tokio::spawn(async move { sampler(cfg, live, stop2).await });
        Progress { stop, handle }
    }

    /// Stops sampling (after one last sample) and returns the timeline.
    pub async fn finish(self) -> Vec<TimelineSample> {
        self.stop.store(true, Ordering::Release);
        self.handle.await.unwrap_or_default()
    }
}

/// Means of the latency histograms split into reads (READ, SCAN) and writes.
fn latency_means(hs: &[hdrhistogram::Histogram<u64>; 5]) -> (Option<f64>, Option<f64>, Option<f64>) {
    let (mut r_sum, mut r_n, mut w_sum, mut w_n) = (0.0, 0u64, 0.0, 0u64);
    for kind in OP_KINDS {
        let h = &hs[kind as usize];
        if h.is_empty() || kind == OpKind::ReadModifyWrite {
            // RMW's inner READ and UPDATE are already counted.
            continue;
        }
        if kind.is_write() {
            w_sum += h.mean() * h.len() as f64;
            w_n += h.len();
        } else {
            r_sum += h.mean() * h.len() as f64;
            r_n += h.len();
        }
    }
    let avg = |s: f64, n: u64| if n == 0 { None } else { Some(s / n as f64) };
    (avg(r_sum, r_n), avg(w_sum, w_n), avg(r_sum + w_sum, r_n + w_n))
}

async fn sampler(cfg: ProgressConfig, live: Arc<LiveStats>, stop: Arc<AtomicBool>) -> Vec<TimelineSample> {
    let start = Instant::now();
    let interactive = !cfg.quiet && cfg.interactive.unwrap_or_else(|| std::io::stderr().is_terminal());
    let bar = if interactive { Some(make_bar(&cfg)) } else { None };
    let mut timeline: Vec<TimelineSample> = Vec::new();
    let mut window = empty_histograms();
    let mut last_sample = start;
    let mut last_status = start;
    let mut ops_at_last_sample = 0u64;
    let mut ops_at_last_status = 0u64;
    let mut cpu_prev: Vec<Option<Duration>> = cfg.watch_pids.iter().map(|(_, pid)| sys::process_cpu_time(*pid)).collect();
    if !cfg.quiet && cfg.style == Style::Inserts && !interactive {
        eprintln!("{:>10} {:>14} {:>14} {:>12} {:>12} {:>12}", "elapsed_s", "interval_ins/s", "overall_ins/s", "lat_avg_ms", "lat_p95_ms", "lat_p99_ms");
    }
    loop {
        let stopping = stop.load(Ordering::Acquire);
        if !stopping {
            // Sleep in short steps so finish() returns promptly.
            let next = last_sample + SAMPLE_INTERVAL;
            while Instant::now() < next && !stop.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(50).min(next.saturating_duration_since(Instant::now()))).await;
            }
        }
        let now = Instant::now();
        let dt = now.duration_since(last_sample).as_secs_f64().max(1e-6);
        last_sample = now;
        let hs = live.drain_histograms();
        let ops = live.ops_total();
        let (read_avg, write_avg, avg) = latency_means(&hs);
        let mut cpu_percent = Vec::with_capacity(cfg.watch_pids.len());
        for (i, (_, pid)) in cfg.watch_pids.iter().enumerate() {
            let cur = sys::process_cpu_time(*pid);
            let pct = match (cpu_prev.get(i).copied().flatten(), cur) {
                (Some(a), Some(b)) => 100.0 * b.saturating_sub(a).as_secs_f64() / dt,
                _ => 0.0,
            };
            cpu_percent.push(pct);
            if let Some(slot) = cpu_prev.get_mut(i) {
                *slot = cur;
            }
        }
        if timeline.len() < TIMELINE_SAMPLES_MAX && (dt > 0.2 || !stopping) {
            timeline.push(TimelineSample {
                elapsed_s: now.duration_since(start).as_secs_f64(),
                ops_per_s: (ops - ops_at_last_sample) as f64 / dt,
                read_latency_us_avg: read_avg,
                write_latency_us_avg: write_avg,
                latency_us_avg: avg,
                cpu_percent,
            });
        }
        ops_at_last_sample = ops;
        for (w, h) in window.iter_mut().zip(hs.iter()) {
            let _ = w.add(h);
        }
        if let Some(bar) = &bar {
            update_bar(bar, &cfg, start, ops, &timeline);
        }
        let status_due = now.duration_since(last_status) >= STATUS_INTERVAL || stopping;
        if status_due && !interactive && !cfg.quiet {
            let interval_s = now.duration_since(last_status).as_secs_f64().max(1e-6);
            let line = match cfg.style {
                Style::Ycsb => ycsb_status_line(&cfg, &live, start, now, ops, ops_at_last_status, interval_s, &window),
                Style::Inserts => inserts_status_line(start, now, ops, ops_at_last_status, interval_s, &window),
            };
            eprintln!("{line}");
        }
        if status_due {
            last_status = now;
            ops_at_last_status = ops;
            window = empty_histograms();
        }
        if stopping {
            break;
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    timeline
}

fn make_bar(cfg: &ProgressConfig) -> ProgressBar {
    let len = cfg.total_ops.filter(|n| *n > 0).or(cfg.max_time.map(|d| d.as_secs().max(1)));
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
    let template =
        if len.is_some() { "{prefix} [{elapsed_precise}] {wide_bar:.cyan/blue} {percent:>3}% {msg}" } else { "{prefix} [{elapsed_precise}] {spinner} {msg}" };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(cfg.label.clone());
    bar
}

fn update_bar(bar: &ProgressBar, cfg: &ProgressConfig, start: Instant, ops: u64, timeline: &[TimelineSample]) {
    if cfg.total_ops.filter(|n| *n > 0).is_some() {
        bar.set_position(ops);
    } else if cfg.max_time.is_some() {
        bar.set_position(start.elapsed().as_secs());
    } else {
        bar.tick();
    }
    let Some(last) = timeline.last() else { return };
    let lat = |v: Option<f64>| v.map(|us| format!("{:.0}us", us)).unwrap_or_else(|| "-".into());
    let unit = if cfg.style == Style::Inserts { "ins/s" } else { "ops/s" };
    bar.set_message(format!(
        "{ops} ops, {:.0} {unit}, read avg {}, write avg {}",
        last.ops_per_s,
        lat(last.read_latency_us_avg),
        lat(last.write_latency_us_avg)
    ));
}

/// "yyyy-MM-dd HH:mm:ss:SSS" in local time, as YCSB's StatusThread prints.
pub fn local_timestamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs() as libc::time_t;
    // SAFETY: localtime_r writes into our zeroed struct; secs is a valid time_t.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&secs, &mut tm).is_null() };
    if !ok {
        return String::new();
    }
    format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02}:{:03}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, now.subsec_millis())
}

/// YCSB's RemainingFormatter: "N days M hours", "N hours M minutes", "N minutes", "N seconds".
pub fn format_remaining(secs: u64) -> String {
    let plural = |n: u64, unit: &str| if n == 1 { format!("{n} {unit}") } else { format!("{n} {unit}s") };
    let (d, h, m, s) = (secs / 86_400, secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    if d > 0 {
        format!("{} {}", plural(d, "day"), plural(h, "hour"))
    } else if h > 0 {
        format!("{} {}", plural(h, "hour"), plural(m, "minute"))
    } else if m > 0 {
        plural(m, "minute")
    } else {
        plural(s, "second")
    }
}

#[allow(clippy::too_many_arguments)]
fn ycsb_status_line(
    cfg: &ProgressConfig,
    live: &LiveStats,
    start: Instant,
    now: Instant,
    ops: u64,
    ops_before: u64,
    interval_s: f64,
    window: &[hdrhistogram::Histogram<u64>; 5],
) -> String {
    let elapsed = now.duration_since(start);
    let mut line = format!("{} {} sec: {} operations; ", local_timestamp(), elapsed.as_secs(), ops);
    if ops != 0 {
        line.push_str(&format!("{} current ops/sec; ", decimal_2((ops - ops_before) as f64 / interval_s)));
    }
    if let Some(total) = cfg.total_ops.filter(|t| *t > 0 && ops > 0 && ops < *t) {
        let remaining_s = elapsed.as_secs_f64() / ops as f64 * (total - ops) as f64;
        line.push_str(&format!("est completion in {} ", format_remaining(remaining_s.ceil() as u64)));
    }
    let summaries: Vec<_> = OP_KINDS.iter().filter(|k| live.total(**k) > 0).map(|k| summarize(*k, &window[*k as usize])).collect();
    line.push_str(&status_summary(&summaries));
    line
}

fn inserts_status_line(start: Instant, now: Instant, ops: u64, ops_before: u64, interval_s: f64, window: &[hdrhistogram::Histogram<u64>; 5]) -> String {
    let elapsed = now.duration_since(start).as_secs_f64().max(1e-6);
    let h = &window[OpKind::Insert as usize];
    let ms = |v: f64| v / 1000.0;
    let (avg, p95, p99) =
        if h.is_empty() { (0.0, 0.0, 0.0) } else { (ms(h.mean()), ms(h.value_at_percentile(95.0) as f64), ms(h.value_at_percentile(99.0) as f64)) };
    format!("{:>10.1} {:>14.1} {:>14.1} {:>12.2} {:>12.2} {:>12.2}", elapsed, (ops - ops_before) as f64 / interval_s, ops as f64 / elapsed, avg, p95, p99)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_format() {
        assert_eq!(format_remaining(1), "1 second");
        assert_eq!(format_remaining(59), "59 seconds");
        assert_eq!(format_remaining(61), "1 minute");
        assert_eq!(format_remaining(3 * 3600 + 120), "3 hours 2 minutes");
        assert_eq!(format_remaining(86_400 + 3600), "1 day 1 hour");
    }

    #[test]
    fn timestamp_shape() {
        let t = local_timestamp();
        assert_eq!(t.len(), "2024-01-01 10:00:00:000".len(), "{t}");
    }

    #[tokio::test]
    async fn sampler_builds_a_timeline() {
        let live = Arc::new(LiveStats::new());
        let cfg = ProgressConfig {
            label: "t".into(),
            style: Style::Ycsb,
            total_ops: Some(10),
            max_time: None,
            watch_pids: vec![("self".into(), std::process::id())],
            interactive: Some(false),
            quiet: true,
        };
        let p = Progress::start(cfg, live.clone());
        for _ in 0..10 {
            live.record(OpKind::Read, 100);
            live.record(OpKind::Update, 300);
            live.op_done();
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let timeline = p.finish().await;
        assert!(!timeline.is_empty());
        let first = &timeline[0];
        assert_eq!(first.read_latency_us_avg, Some(100.0));
        assert_eq!(first.write_latency_us_avg, Some(300.0));
        assert_eq!(first.latency_us_avg, Some(200.0));
        assert_eq!(first.cpu_percent.len(), 1);
        assert!(first.ops_per_s > 0.0);
    }
}
