//! YCSB measurements: per-operation HdrHistograms of microsecond latencies plus return-code
//! counts, exported in YCSB's text format (TextMeasurementsExporter) or JSON array format
//! (JSONArrayMeasurementsExporter), and live interval statistics for status lines.

use anyhow::{bail, Result};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// HdrHistogram precision YCSB uses (hdrhistogram.significantdigits default... 3 digits).
pub const HISTOGRAM_SIGNIFICANT_DIGITS: u8 = 3;
/// YCSB's default hdrhistogram.percentiles.
pub const EXPORT_PERCENTILES: [f64; 2] = [95.0, 99.0];

/// site.ycsb.Status: the outcome of one DB call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Ok,
    BatchedOk,
    NotFound,
    Error,
    UnexpectedState,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::BatchedOk => "BATCHED_OK",
            Status::NotFound => "NOT_FOUND",
            Status::Error => "ERROR",
            Status::UnexpectedState => "UNEXPECTED_STATE",
        }
    }
    /// Status.isOk(): OK and BATCHED_OK.
    pub fn is_ok(self) -> bool {
        matches!(self, Status::Ok | Status::BatchedOk)
    }
}

pub fn new_histogram() -> Histogram<u64> {
    // Auto-resizing, so any latency is recordable; 3 significant digits cannot fail.
    Histogram::<u64>::new(HISTOGRAM_SIGNIFICANT_DIGITS).unwrap_or_else(|_| Histogram::<u64>::new(2).unwrap_or_else(|_| unreachable_histogram()))
}

#[cold]
fn unreachable_histogram() -> Histogram<u64> {
    // Histogram::new only fails for sigfig > 5; both calls above use valid precision.
    panic!("hdrhistogram rejected a valid precision")
}

/// One measurement name ("READ", "READ-FAILED", "CLEANUP", ...).
#[derive(Debug, Clone)]
pub struct OneMeasurement {
    pub histogram: Histogram<u64>,
    pub returns: Vec<(Status, u64)>,
    /// Global order of first use: YCSB's ConcurrentHashMap keeps insertion order within a bin.
    pub first_use: u64,
}

impl OneMeasurement {
    fn new(first_use: u64) -> OneMeasurement {
        OneMeasurement { histogram: new_histogram(), returns: Vec::new(), first_use }
    }
    fn add_return(&mut self, status: Status, count: u64) {
        match self.returns.iter_mut().find(|(s, _)| *s == status) {
            Some((_, n)) => *n += count,
            None => self.returns.push((status, count)),
        }
    }
}

static FIRST_USE_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Per-client-task measurements; merged once at the end so the hot path takes no lock.
#[derive(Debug, Clone, Default)]
pub struct Measurements {
    pub ops: HashMap<String, OneMeasurement>,
}

impl Measurements {
    pub fn new() -> Measurements {
        Measurements::default()
    }

    fn entry(&mut self, name: &str) -> &mut OneMeasurement {
        if !self.ops.contains_key(name) {
            let seq = FIRST_USE_SEQUENCE.fetch_add(1, Ordering::Relaxed);
            self.ops.insert(name.to_string(), OneMeasurement::new(seq));
        }
        // Just inserted or present.
        self.ops.get_mut(name).unwrap_or_else(|| unreachable!())
    }

    pub fn measure(&mut self, name: &str, latency_us: u64) {
        // record grows the auto-resizing histogram; it fails only beyond u64 range.
        self.entry(name).histogram.record(latency_us).unwrap_or(());
    }

    pub fn report_status(&mut self, name: &str, status: Status) {
        self.entry(name).add_return(status, 1);
    }

    /// DBWrapper.measure: failures are measured under "<OP>-FAILED", the status under "<OP>".
    pub fn record(&mut self, op: &str, status: Status, latency_us: u64) {
        if status.is_ok() {
            self.measure(op, latency_us);
        } else {
            let failed = format!("{op}-FAILED");
            self.measure(&failed, latency_us);
        }
        self.report_status(op, status);
    }

    pub fn merge(&mut self, other: &Measurements) {
        for (name, m) in &other.ops {
            match self.ops.get_mut(name) {
                Some(mine) => {
                    // Both histograms auto-resize, so add cannot run out of range.
                    let _ = mine.histogram.add(&m.histogram);
                    for (s, n) in &m.returns {
                        mine.add_return(*s, *n);
                    }
                    mine.first_use = mine.first_use.min(m.first_use);
                }
                None => {
                    self.ops.insert(name.clone(), m.clone());
                }
            }
        }
    }

    /// Names in the order YCSB 0.17 prints them: Java ConcurrentHashMap iteration order
    /// (bin of String.hashCode spread over a 16-slot table, then insertion order).
    pub fn names_in_ycsb_order(&self) -> Vec<&String> {
        let mut names: Vec<&String> = self.ops.keys().collect();
        let table_size = java_map_table_size(names.len());
        names.sort_by_key(|n| (java_bin(n, table_size), self.ops.get(*n).map(|m| m.first_use).unwrap_or(0)));
        names
    }

    pub fn get(&self, name: &str) -> Option<&OneMeasurement> {
        self.ops.get(name)
    }

    /// Rows as OneMeasurementHdrHistogram.exportMeasurements writes them.
    pub fn export_rows(&self, rows: &mut Vec<Row>) {
        for name in self.names_in_ycsb_order() {
            let Some(m) = self.ops.get(name) else { continue };
            let h = &m.histogram;
            rows.push(Row::int(name, "Operations", h.len() as i64));
            rows.push(Row::float(name, "AverageLatency(us)", if h.is_empty() { 0.0 } else { h.mean() }));
            rows.push(Row::int(name, "MinLatency(us)", if h.is_empty() { 0 } else { h.min() as i64 }));
            rows.push(Row::int(name, "MaxLatency(us)", if h.is_empty() { 0 } else { h.max() as i64 }));
            for p in EXPORT_PERCENTILES {
                let v = if h.is_empty() { 0 } else { h.value_at_percentile(p) as i64 };
                rows.push(Row::int(name, &format!("{}PercentileLatency(us)", ordinal(p)), v));
            }
            for (status, count) in &m.returns {
                rows.push(Row::int(name, &format!("Return={}", status.name()), *count as i64));
            }
        }
    }
}

fn java_string_hash(s: &str) -> i32 {
    // Java hashes UTF-16 code units; measurement names are ASCII.
    s.encode_utf16().fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32))
}

fn java_bin(s: &str, table_size: usize) -> usize {
    let h = java_string_hash(s);
    let spread = (h ^ ((h as u32) >> 16) as i32) & 0x7fff_ffff;
    (spread as usize) & (table_size - 1)
}

/// ConcurrentHashMap starts at 16 bins and doubles once its size passes 3/4 of the table.
fn java_map_table_size(entries: usize) -> usize {
    let mut n = 16;
    while entries > n * 3 / 4 {
        n *= 2;
    }
    n
}

/// OneMeasurementHdrHistogram.ordinal: 95.0 -> "95th", 99.9 -> "99.9th", 1 -> "1st".
pub fn ordinal(p: f64) -> String {
    let suffixes = ["th", "st", "nd", "rd", "th", "th", "th", "th", "th", "th"];
    if p.fract() == 0.0 {
        let i = p as i64;
        let s = match i % 100 {
            11..=13 => "th",
            _ => suffixes[(i % 10) as usize],
        };
        format!("{i}{s}")
    } else {
        format!("{}th", java_double(p).trim_end_matches(".0"))
    }
}

/// A value in an exported row.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub metric: String,
    pub measurement: String,
    pub value: Value,
}

impl Row {
    pub fn int(metric: &str, measurement: &str, v: i64) -> Row {
        Row { metric: metric.to_string(), measurement: measurement.to_string(), value: Value::Int(v) }
    }
    pub fn float(metric: &str, measurement: &str, v: f64) -> Row {
        Row { metric: metric.to_string(), measurement: measurement.to_string(), value: Value::Float(v) }
    }
}

/// Java's Double.toString: shortest round-trip digits, ".0" for integral values, and
/// computerized scientific notation ("1.0E7") outside [10^-3, 10^7).
pub fn java_double(d: f64) -> String {
    if d.is_nan() {
        return "NaN".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if d == 0.0 {
        return if d.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let a = d.abs();
    if (1e-3..1e7).contains(&a) {
        let s = format!("{d}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        // Rust's {:e} gives "1.2345e7" or "1e7"; Java wants "1.2345E7" / "1.0E7".
        let s = format!("{d:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = if mantissa.contains('.') { mantissa.to_string() } else { format!("{mantissa}.0") };
        format!("{mantissa}E{exp}")
    }
}

/// TextMeasurementsExporter: "[METRIC], Measurement, value" per line.
pub fn to_text(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows {
        let v = match r.value {
            Value::Int(i) => i.to_string(),
            Value::Float(f) => java_double(f),
        };
        let _ = writeln!(out, "[{}], {}, {}", r.metric, r.measurement, v);
    }
    out
}

/// JSONArrayMeasurementsExporter: [{"metric": ..., "measurement": ..., "value": ...}, ...].
pub fn to_json(rows: &[Row]) -> String {
    let arr: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let v = match r.value {
                Value::Int(i) => serde_json::Value::from(i),
                Value::Float(f) => serde_json::Number::from_f64(f).map(serde_json::Value::Number).unwrap_or(serde_json::Value::Null),
            };
            serde_json::json!({"metric": r.metric, "measurement": r.measurement, "value": v})
        })
        .collect();
    serde_json::to_string_pretty(&arr).unwrap_or_else(|_| "[]".into())
}

/// Parses YCSB text output back into rows (lines not in the format are skipped, as YCSB
/// output mixes in other lines). Used by scenarios and tests.
pub fn parse_text(text: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix('[') else { continue };
        let Some((metric, rest)) = rest.split_once("], ") else { continue };
        let Some((measurement, value)) = rest.rsplit_once(", ") else { continue };
        let value = value.trim();
        let v = if let Ok(i) = value.parse::<i64>() {
            Value::Int(i)
        } else if let Ok(f) = value.parse::<f64>() {
            Value::Float(f)
        } else {
            continue;
        };
        rows.push(Row { metric: metric.to_string(), measurement: measurement.to_string(), value: v });
    }
    rows
}

/// Looks up a numeric value in exported rows.
pub fn row_value(rows: &[Row], metric: &str, measurement: &str) -> Option<f64> {
    rows.iter().find(|r| r.metric == metric && r.measurement == measurement).map(|r| match r.value {
        Value::Int(i) => i as f64,
        Value::Float(f) => f,
    })
}

/// Operation kinds tracked live (status lines, progress bar, scenario timelines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read = 0,
    Update = 1,
    Insert = 2,
    Scan = 3,
    ReadModifyWrite = 4,
}

pub const OP_KINDS: [OpKind; 5] = [OpKind::Read, OpKind::Update, OpKind::Insert, OpKind::Scan, OpKind::ReadModifyWrite];

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "READ",
            OpKind::Update => "UPDATE",
            OpKind::Insert => "INSERT",
            OpKind::Scan => "SCAN",
            OpKind::ReadModifyWrite => "READ-MODIFY-WRITE",
        }
    }
    /// Writes change data; the scenario report splits read and write latency on this.
    pub fn is_write(self) -> bool {
        matches!(self, OpKind::Update | OpKind::Insert | OpKind::ReadModifyWrite)
    }
}

/// Interval statistics shared by all client tasks, drained by the status reporter.
#[derive(Debug)]
pub struct LiveStats {
    ops_total: AtomicU64,
    interval: [Mutex<Histogram<u64>>; 5],
    totals: [AtomicU64; 5],
    /// Latencies recorded so far, and their sum, over every kind but READ-MODIFY-WRITE
    /// (whose READ and UPDATE are recorded too): a watcher reads the average of any span
    /// from two readings.
    latency_count: AtomicU64,
    latency_us_sum: AtomicU64,
}

/// One drained interval of one operation kind.
#[derive(Debug, Clone)]
pub struct IntervalSummary {
    pub kind: OpKind,
    pub count: u64,
    pub latency_us_max: u64,
    pub latency_us_min: u64,
    pub latency_us_avg: f64,
    pub latency_us_p90: u64,
    pub latency_us_p99: u64,
    pub latency_us_p999: u64,
    pub latency_us_p9999: u64,
}

impl Default for LiveStats {
    fn default() -> Self {
        LiveStats {
            ops_total: AtomicU64::new(0),
            interval: std::array::from_fn(|_| Mutex::new(new_histogram())),
            totals: std::array::from_fn(|_| AtomicU64::new(0)),
            latency_count: AtomicU64::new(0),
            latency_us_sum: AtomicU64::new(0),
        }
    }
}

impl LiveStats {
    pub fn new() -> LiveStats {
        LiveStats::default()
    }

    pub fn record(&self, kind: OpKind, latency_us: u64) {
        self.interval[kind as usize].lock().record(latency_us).unwrap_or(());
        self.totals[kind as usize].fetch_add(1, Ordering::Relaxed);
        if kind != OpKind::ReadModifyWrite {
            self.latency_count.fetch_add(1, Ordering::Relaxed);
            self.latency_us_sum.fetch_add(latency_us, Ordering::Relaxed);
        }
    }

    /// (latencies recorded, their sum in µs) so far; see `latency_count`.
    pub fn latency_totals(&self) -> (u64, u64) {
        (self.latency_count.load(Ordering::Relaxed), self.latency_us_sum.load(Ordering::Relaxed))
    }

    /// Counts one finished client operation (a batched insert counts when it is buffered).
    pub fn op_done(&self) {
        self.ops_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` finished units at once (bench02 counts inserted documents per batch).
    pub fn ops_add(&self, n: u64) {
        self.ops_total.fetch_add(n, Ordering::Relaxed);
    }

    pub fn ops_total(&self) -> u64 {
        self.ops_total.load(Ordering::Relaxed)
    }

    pub fn total(&self, kind: OpKind) -> u64 {
        self.totals[kind as usize].load(Ordering::Relaxed)
    }

    /// Takes and resets the interval histograms, indexed by `OpKind as usize`.
    pub fn drain_histograms(&self) -> [Histogram<u64>; 5] {
        std::array::from_fn(|i| std::mem::replace(&mut *self.interval[i].lock(), new_histogram()))
    }

    /// Takes and resets the interval histograms, summarized for kinds that ever ran.
    pub fn drain_interval(&self) -> Vec<IntervalSummary> {
        let hs = self.drain_histograms();
        OP_KINDS.iter().filter(|k| self.total(**k) > 0).map(|k| summarize(*k, &hs[*k as usize])).collect()
    }
}

pub fn empty_histograms() -> [Histogram<u64>; 5] {
    std::array::from_fn(|_| new_histogram())
}

pub fn summarize(kind: OpKind, h: &Histogram<u64>) -> IntervalSummary {
    let empty = h.is_empty();
    let at = |p: f64| if empty { 0 } else { h.value_at_percentile(p) };
    IntervalSummary {
        kind,
        count: h.len(),
        latency_us_max: if empty { 0 } else { h.max() },
        latency_us_min: if empty { 0 } else { h.min() },
        latency_us_avg: if empty { 0.0 } else { h.mean() },
        latency_us_p90: at(90.0),
        latency_us_p99: at(99.0),
        latency_us_p999: at(99.9),
        latency_us_p9999: at(99.99),
    }
}

/// DecimalFormat("#.##"): at most two decimals, no trailing zeros.
pub fn decimal_2(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

/// The bracketed per-operation part of a YCSB status line.
pub fn status_summary(intervals: &[IntervalSummary]) -> String {
    let mut out = String::new();
    for s in intervals {
        let _ = write!(
            out,
            "[{}: Count={}, Max={}, Min={}, Avg={}, 90={}, 99={}, 99.9={}, 99.99={}] ",
            s.kind.name(),
            s.count,
            s.latency_us_max,
            s.latency_us_min,
            decimal_2(s.latency_us_avg),
            s.latency_us_p90,
            s.latency_us_p99,
            s.latency_us_p999,
            s.latency_us_p9999
        );
    }
    out.trim_end().to_string()
}

/// Validates that text is a complete YCSB report (has RunTime and Throughput).
pub fn check_report(rows: &[Row]) -> Result<()> {
    if row_value(rows, "OVERALL", "RunTime(ms)").is_none() {
        bail!("report has no [OVERALL], RunTime(ms)");
    }
    if row_value(rows, "OVERALL", "Throughput(ops/sec)").is_none() {
        bail!("report has no [OVERALL], Throughput(ops/sec)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_double_formatting() {
        assert_eq!(java_double(2148.0), "2148.0");
        assert_eq!(java_double(98.91196834817012), "98.91196834817012");
        assert_eq!(java_double(0.5), "0.5");
        assert_eq!(java_double(0.0), "0.0");
        assert_eq!(java_double(1e7), "1.0E7");
        assert_eq!(java_double(12345678.9), "1.23456789E7");
        assert_eq!(java_double(0.0001), "1.0E-4");
        assert_eq!(java_double(9999999.0), "9999999.0");
        assert_eq!(java_double(f64::NAN), "NaN");
    }

    #[test]
    fn ordinals() {
        assert_eq!(ordinal(95.0), "95th");
        assert_eq!(ordinal(99.0), "99th");
        assert_eq!(ordinal(1.0), "1st");
        assert_eq!(ordinal(2.0), "2nd");
        assert_eq!(ordinal(3.0), "3rd");
        assert_eq!(ordinal(11.0), "11th");
        assert_eq!(ordinal(99.9), "99.9th");
    }

    #[test]
    fn text_export_in_ycsb_format_and_order() {
        let mut m = Measurements::new();
        for us in [100u64, 200, 300, 400] {
            m.record("UPDATE", Status::Ok, us);
        }
        m.record("CLEANUP", Status::Ok, 5);
        for us in 1..=100u64 {
            m.record("READ", Status::Ok, us * 10);
        }
        m.record("READ", Status::NotFound, 7);
        let mut rows = vec![Row::int("OVERALL", "RunTime(ms)", 10110), Row::float("OVERALL", "Throughput(ops/sec)", 98.91196834817012)];
        m.export_rows(&mut rows);
        let text = to_text(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "[OVERALL], RunTime(ms), 10110");
        assert_eq!(lines[1], "[OVERALL], Throughput(ops/sec), 98.91196834817012");
        // YCSB's map order: READ, READ-FAILED?, CLEANUP, UPDATE by hash bin (0, 10, 8, 10).
        let metrics: Vec<&str> = lines[2..].iter().filter_map(|l| l.strip_prefix('[').and_then(|l| l.split(']').next())).collect();
        let mut order: Vec<&str> = Vec::new();
        for m in metrics {
            if order.last() != Some(&m) {
                order.push(m);
            }
        }
        assert_eq!(order, vec!["READ", "CLEANUP", "UPDATE", "READ-FAILED"]);
        assert!(lines.contains(&"[READ], Operations, 100"));
        assert!(lines.contains(&"[READ], MinLatency(us), 10"));
        assert!(lines.contains(&"[READ], MaxLatency(us), 1000"));
        assert!(lines.contains(&"[READ], 95thPercentileLatency(us), 950"));
        assert!(lines.contains(&"[READ], 99thPercentileLatency(us), 990"));
        assert!(lines.contains(&"[READ], Return=OK, 100"));
        assert!(lines.contains(&"[READ], Return=NOT_FOUND, 1"));
        assert!(lines.contains(&"[READ-FAILED], Operations, 1"));
        assert!(lines.contains(&"[UPDATE], AverageLatency(us), 250.0"));
        assert!(lines.contains(&"[CLEANUP], Operations, 1"));
        // Round trip through the parser.
        let parsed = parse_text(&text);
        assert_eq!(parsed.len(), rows.len());
        assert_eq!(row_value(&parsed, "READ", "Operations"), Some(100.0));
        assert_eq!(row_value(&parsed, "OVERALL", "Throughput(ops/sec)"), Some(98.91196834817012));
        check_report(&parsed).expect("complete report");
        assert!(check_report(&parsed[2..]).is_err());
        // JSON array exporter shape.
        let json: serde_json::Value = serde_json::from_str(&to_json(&rows)).expect("json");
        assert_eq!(json[0]["metric"], "OVERALL");
        assert_eq!(json[0]["measurement"], "RunTime(ms)");
        assert_eq!(json[0]["value"], 10110);
    }

    #[test]
    fn large_latencies_are_recorded_not_clamped() {
        let mut m = Measurements::new();
        m.record("SCAN", Status::Ok, 2);
        m.record("SCAN", Status::Ok, 5_000_000);
        let h = &m.get("SCAN").expect("scan").histogram;
        assert!((h.max() as f64 - 5_000_000.0).abs() / 5_000_000.0 < 0.001, "max {}", h.max());
        let live = LiveStats::new();
        live.record(OpKind::Scan, 123_456);
        let s = live.drain_interval();
        assert!(s[0].latency_us_max >= 123_456 && s[0].latency_us_max < 123_600, "{:?}", s[0]);
    }

    #[test]
    fn merge_adds_counts_and_histograms() {
        let mut a = Measurements::new();
        let mut b = Measurements::new();
        a.record("READ", Status::Ok, 10);
        b.record("READ", Status::Ok, 30);
        b.record("INSERT", Status::BatchedOk, 1);
        a.merge(&b);
        let r = a.get("READ").expect("read");
        assert_eq!(r.histogram.len(), 2);
        assert_eq!(r.returns, vec![(Status::Ok, 2)]);
        assert_eq!(a.get("INSERT").expect("insert").returns, vec![(Status::BatchedOk, 1)]);
    }

    #[test]
    fn live_stats_intervals_reset() {
        let live = LiveStats::new();
        live.record(OpKind::Read, 100);
        live.record(OpKind::Read, 300);
        let first = live.drain_interval();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].count, 2);
        assert_eq!(first[0].latency_us_avg, 200.0);
        let second = live.drain_interval();
        assert_eq!(second[0].count, 0);
        assert_eq!(live.total(OpKind::Read), 2);
        let s = status_summary(&first);
        assert!(s.starts_with("[READ: Count=2, Max=300, Min=100, Avg=200, 90=300"), "{s}");
        assert_eq!(decimal_2(1.005), "1");
        assert_eq!(decimal_2(12.5), "12.5");
    }
}
