//! The audit log's CPU cost per record, without the noise of a whole workload: YCSB-shaped
//! commands (a 1 KB insert, a find by _id, a one-field $set update) handed to a real
//! `Audit` writing to a file, in JSON and in BSON.
//!
//! For each, it reports the request path's cost (`Audit::log_frame`: the request's OP_MSG
//! frame, as a driver sends it, copied into the queue; timed on the calling thread) and the whole cost (the process's CPU time from the first record until `close`
//! has written the last, which adds the writer thread and the kernel's write), in µs per
//! record, at a server's pace (bursts with pauses, 10,000 records/s). Against a server's CPU per operation under YCSB on this machine (120 to 150 µs,
//! `docs/benchmarks.md`), that is the share of throughput auditing can cost a CPU-bound
//! server.
//!
//! `cargo bench -p shoal-server --bench audit`; SHOAL_BENCH_RECORDS (default 50000),
//! SHOAL_BENCH_DIR (default the temp directory).

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use shoal_server::audit::{Actor, Audit};
use shoal_server::config::{AuditConfig, AuditDestination, AuditFormat};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Records handed over at a time, then `PAUSE`: 100 records per 10 ms is 10,000 records/s,
/// the rate of the YCSB runs in `shoal bench scenario audit`.
const BURST: u64 = 100;
const PAUSE: Duration = Duration::from_millis(10);

fn cpu_time_s() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU time of the whole machine (every process, kernel threads and interrupts), from
/// /proc/stat: the kernel's writeback of the file runs in its own threads, which the
/// process's time leaves out. Clock ticks, so only a long case gives a usable figure.
fn machine_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().next().unwrap_or_default();
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let ticks: Vec<f64> = line.split_whitespace().skip(1).take(8).filter_map(|t| t.parse().ok()).collect();
    let busy: f64 = ticks.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, t)| t).sum();
    // SAFETY: sysconf has no preconditions.
    busy / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn field(i: u64) -> Bson {
    Bson::Binary(Binary { subtype: BinarySubtype::Generic, bytes: (0..100).map(|j| ((i * 31 + j) % 94 + 33) as u8).collect() })
}

/// The frames of the commands the YCSB client sends: inserted documents and updates in
/// document sequences, as drivers send them.
fn frame(kind: &str, i: u64) -> Vec<u8> {
    let key = format!("user{}", 6_000_000_000_000_000_000u64 + i * 7919);
    let lsid = doc! {"id": Bson::Binary(Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] })};
    match kind {
        "insert" => {
            let mut d = doc! {"_id": &key};
            for f in 0..10 {
                d.insert(format!("field{f}"), field(i + f));
            }
            msg(doc! {"insert": "usertable", "ordered": true, "$db": "ycsb", "lsid": lsid}, "documents", d)
        }
        "find" => wire::encode_msg(
            1,
            0,
            &wire::OpMsg {
                flags: 0,
                body: doc! {"find": "usertable", "filter": {"_id": &key}, "limit": 1, "singleBatch": true, "$db": "ycsb", "lsid": lsid},
                sequences: Vec::new(),
            },
            None,
        ),
        _ => msg(
            doc! {"update": "usertable", "ordered": true, "$db": "ycsb", "lsid": lsid},
            "updates",
            doc! {"q": {"_id": &key}, "u": {"$set": {"field3": field(i)}}},
        ),
    }
}

fn msg(body: Document, identifier: &str, d: Document) -> Vec<u8> {
    wire::encode_msg(1, 0, &wire::OpMsg { flags: 0, body, sequences: vec![wire::DocumentSequence { identifier: identifier.into(), documents: vec![d] }] }, None)
}

fn main() {
    let records: u64 = std::env::var("SHOAL_BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(50_000);
    let dir = std::env::var("SHOAL_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir())
        .join(format!("shoal-audit-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench directory");
    let actor = Arc::new(Actor::new(
        Some("127.0.0.1:27017".parse().unwrap()),
        Some("127.0.0.1:40000".parse().unwrap()),
        bson::Uuid::new(),
        vec![("u".into(), "admin".into())],
        vec![("root".into(), "admin".into())],
    ));
    println!("records per case: {records}");
    println!("{:<8} {:<6} {:>16} {:>18} {:>18} {:>14}", "command", "format", "request µs/rec", "total CPU µs/rec", "machine CPU µs/rec", "bytes/record");
    // The pacing loop alone (its sleeps and wakeups), to subtract from the cases below.
    let (cpu0, machine0) = (cpu_time_s(), machine_cpu_s());
    for _ in 0..records / BURST {
        std::thread::sleep(PAUSE);
    }
    let per_record = |s: f64| s * 1e6 / records as f64;
    let (idle, idle_machine) = (per_record(cpu_time_s() - cpu0), per_record(machine_cpu_s() - machine0));
    println!("{:<8} {:<6} {:>16} {:>18.2} {:>18.2} {:>14}", "none", "-", "-", idle, idle_machine, "-");
    for kind in ["insert", "find", "update"] {
        // Built before the clock starts: the server has the command already.
        let frames: Vec<Vec<u8>> = (0..1000).map(|i| frame(kind, i)).collect();
        for (format, name) in [(AuditFormat::Json, "JSON"), (AuditFormat::Bson, "BSON")] {
            let path = dir.join(format!("{kind}.{name}"));
            let _ = std::fs::remove_file(&path);
            let config = AuditConfig { destination: AuditDestination::File, format, path: Some(path.clone()), filter: None };
            let audit = Audit::start(&config, true).expect("audit start");
            let (cpu0, machine0) = (cpu_time_s(), machine_cpu_s());
            let mut request_s = 0.0;
            // Bursts of BURST records with a pause between them, as a server sends them: a
            // producer flat out would fill the queue and time the writer's pace instead.
            for burst in 0..records / BURST {
                let t = Instant::now();
                for i in 0..BURST {
                    audit.log_frame(&actor, &frames[((burst * BURST + i) % 1000) as usize], 0);
                }
                request_s += t.elapsed().as_secs_f64();
                std::thread::sleep(PAUSE);
            }
            audit.close();
            let (cpu, machine) = (cpu_time_s() - cpu0, machine_cpu_s() - machine0);
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            println!(
                "{kind:<8} {name:<6} {:>16.2} {:>18.2} {:>18.2} {:>14.0}",
                per_record(request_s),
                per_record(cpu),
                per_record(machine),
                bytes as f64 / records as f64,
            );
            let _ = std::fs::remove_file(&path);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
