//! End to end: `shoal bench` drives a real `shoal serve` and its reports parse. Sizes are tiny
//! and nothing asserts on timing (benchmarks are not tests); the checks are on counts, data
//! shape and report format.

mod common;

use bench::ycsb::measure::{check_report, parse_text, row_value};
use common::Server;
use mongodb::bson::{doc, spec::ElementType, Bson, Document};
use std::path::PathBuf;
use std::process::Command;

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-bench-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Runs `shoal bench ...`; returns stdout, panicking with stderr on failure.
fn shoal_bench(args: &[&str]) -> String {
    shoal_bench_with(&[], args)
}

/// `shoal bench ...` with extra environment variables.
fn shoal_bench_with(env: &[(&str, &str)], args: &[&str]) -> String {
    let out = Command::new(common::binary_path()).arg("bench").args(args).envs(env.iter().copied()).output().expect("run shoal bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "shoal bench {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    stdout
}

fn value(rows: &[bench::ycsb::measure::Row], metric: &str, measurement: &str) -> f64 {
    row_value(rows, metric, measurement).unwrap_or_else(|| panic!("no [{metric}], {measurement} in report"))
}

#[tokio::test]
async fn ycsb_load_and_run_against_shoal() {
    let server = Server::start();
    let url = format!("{}ycsb", server.uri());
    let dir = scratch_dir("ycsb");

    // Load: 3 threads x 100 records, batches of 25 -> 12 insertMany calls, 288 buffered.
    let text = shoal_bench(&["ycsb", "load", "-P", "workloada", "-p", "recordcount=300", "-p", "batchsize=25", "-threads", "3", "--url", &url]);
    let rows = parse_text(&text);
    check_report(&rows).expect("complete load report");
    assert_eq!(value(&rows, "INSERT", "Operations"), 300.0);
    assert_eq!(value(&rows, "INSERT", "Return=OK"), 12.0, "{text}");
    assert_eq!(value(&rows, "INSERT", "Return=BATCHED_OK"), 288.0, "{text}");
    assert!(row_value(&rows, "INSERT-FAILED", "Operations").is_none(), "{text}");
    assert_eq!(value(&rows, "CLEANUP", "Operations"), 3.0);
    assert!(text.lines().next().is_some_and(|l| l.starts_with("[OVERALL], RunTime(ms), ")), "{text}");

    // The documents are shaped as YCSB's MongoDB binding writes them.
    let client = server.client().await;
    let coll = client.database("ycsb").collection::<Document>("usertable");
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 300);
    // Key 0 hashes to FNV-1a-64(0) = 6284781860667377211.
    let d = coll.find_one(doc! {"_id": "user6284781860667377211"}).await.expect("find").expect("record 0 exists");
    assert_eq!(d.len(), 11, "{d:?}");
    for i in 0..10 {
        match d.get(format!("field{i}")) {
            Some(Bson::Binary(b)) => assert_eq!(b.bytes.len(), 100),
            other => panic!("field{i} should be 100 bytes of binary, got {other:?}"),
        }
    }

    // Run: workload A, every operation succeeds on loaded keys; JSON export parses.
    let json_path = dir.join("a.json");
    let text = shoal_bench(&[
        "ycsb",
        "run",
        "-P",
        "workloada",
        "-p",
        "recordcount=300",
        "-p",
        "operationcount=400",
        "-threads",
        "4",
        "--url",
        &url,
        "--json",
        json_path.to_str().expect("utf-8 path"),
    ]);
    let rows = parse_text(&text);
    check_report(&rows).expect("complete run report");
    let reads = value(&rows, "READ", "Operations");
    let updates = value(&rows, "UPDATE", "Operations");
    assert_eq!(reads + updates, 400.0, "{text}");
    assert_eq!(value(&rows, "READ", "Return=OK"), reads);
    assert_eq!(value(&rows, "UPDATE", "Return=OK"), updates);
    assert!(value(&rows, "READ", "MaxLatency(us)") >= value(&rows, "READ", "MinLatency(us)"));
    assert!(value(&rows, "CLIENT", "CpuTime(ms)") >= 0.0);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json file")).expect("json parses");
    let arr = json.as_array().expect("JSON array exporter format");
    assert!(arr.iter().any(|e| e["metric"] == "OVERALL" && e["measurement"] == "RunTime(ms)"));
    assert!(arr.iter().any(|e| e["metric"] == "READ" && e["measurement"] == "Operations" && e["value"].as_f64() == Some(reads)));

    // Workload E: scans from zipfian keys plus inserts of new keys (300, 301, ...).
    let text = shoal_bench(&["ycsb", "run", "-P", "workloade", "-p", "recordcount=300", "-p", "operationcount=60", "-p", "maxscanlength=20", "--url", &url]);
    let rows = parse_text(&text);
    let scans = value(&rows, "SCAN", "Operations");
    let inserts = row_value(&rows, "INSERT", "Operations").unwrap_or(0.0);
    assert_eq!(scans + inserts, 60.0, "{text}");
    assert!(row_value(&rows, "SCAN-FAILED", "Operations").is_none(), "{text}");
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 300 + inserts as u64);

    // A bad option fails with a message instead of running.
    let out = Command::new(common::binary_path()).args(["bench", "ycsb", "run", "--bogus"]).output().expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown ycsb option"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The lean wire client (single-host URLs) and the official driver (forced with
/// SHOAL_BENCH_DRIVER=official) give the same answers: scans longer than a first batch follow
/// the cursor with getMore, and server errors (duplicate keys) are counted as errors.
#[tokio::test]
async fn lean_client_and_official_driver_agree() {
    let server = Server::start();
    let client = server.client().await;
    for (driver, env) in [("lean", vec![]), ("official", vec![("SHOAL_BENCH_DRIVER", "official")])] {
        let url = format!("{}ycsb_{driver}", server.uri());
        let run = |args: &[&str]| shoal_bench_with(&env, args);
        let text = run(&["ycsb", "load", "-P", "workloada", "-p", "recordcount=200", "-p", "batchsize=20", "--url", &url]);
        assert_eq!(value(&parse_text(&text), "INSERT", "Operations"), 200.0, "{driver}: {text}");
        let coll = client.database(&format!("ycsb_{driver}")).collection::<Document>("usertable");
        assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 200, "{driver}");

        // Scan lengths up to 180 exceed the default first batch of 101 documents.
        let text = run(&[
            "ycsb",
            "run",
            "-P",
            "workloade",
            "-p",
            "recordcount=200",
            "-p",
            "operationcount=80",
            "-p",
            "maxscanlength=180",
            "-p",
            "scanproportion=1",
            "-p",
            "insertproportion=0",
            "--url",
            &url,
        ]);
        let rows = parse_text(&text);
        assert_eq!(value(&rows, "SCAN", "Operations"), 80.0, "{driver}: {text}");
        assert!(row_value(&rows, "SCAN-FAILED", "Operations").is_none(), "{driver}: {text}");

        // Loading the same keys again: every insert is a duplicate key error.
        let text = run(&["ycsb", "load", "-P", "workloada", "-p", "recordcount=200", "--url", &url]);
        let rows = parse_text(&text);
        assert_eq!(value(&rows, "INSERT-FAILED", "Operations"), 200.0, "{driver}: {text}");
        assert_eq!(value(&rows, "INSERT", "Operations"), 0.0, "{driver}: {text}");
        assert_eq!(value(&rows, "INSERT", "Return=ERROR"), 200.0, "{driver}: {text}");
        assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 200, "{driver}");
    }
}

#[tokio::test]
async fn insert_benchmark_writes_orders_with_three_indexes() {
    let server = Server::start();
    let dir = scratch_dir("insert");
    let json_path = dir.join("insert.json");
    let text = shoal_bench(&[
        "insert",
        "--url",
        &server.uri(),
        "--num-operations",
        "500",
        "--batch-size",
        "50",
        "--workers",
        "2",
        "--indexes",
        "3",
        "--text-size",
        "300",
        "--json",
        json_path.to_str().expect("utf-8 path"),
    ]);
    assert!(text.contains("documents inserted        : 500"), "{text}");
    let client = server.client().await;
    let coll = client.database("bench02").collection::<Document>("orders");
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 500);
    let mut names = coll.list_index_names().await.expect("indexes");
    names.sort();
    assert_eq!(names, vec!["_id_", "customerId_1_orderDate_1", "customerId_1_productId_1", "productId_1_orderDate_1"]);
    let d = coll.find_one(doc! {}).await.expect("find").expect("a document");
    let keys: Vec<&str> = d.keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, vec!["_id", "customerId", "productId", "quantity", "orderDate", "textField"]);
    let types: Vec<ElementType> = keys[1..].iter().map(|k| d.get(*k).expect("field").element_type()).collect();
    assert_eq!(types, vec![ElementType::Int32, ElementType::Int32, ElementType::Int32, ElementType::DateTime, ElementType::String]);
    assert_eq!(d.get_str("textField").expect("text").len(), 300);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json file")).expect("json parses");
    assert_eq!(json["inserted"], 500);
    assert_eq!(json["batches"], 10);

    // Running again drops the collection first.
    shoal_bench(&["insert", "--url", &server.uri(), "--num-operations", "100", "--batch-size", "100", "--indexes", "1"]);
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 100);
    assert_eq!(coll.list_index_names().await.expect("indexes").len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn scenario_instance_writes_report_and_chart() {
    let dir = scratch_dir("scenario");
    let out = dir.join("out");
    shoal_bench(&["scenario", "instance", "--quick", "--records", "300", "--seconds-per-phase", "1", "--out", out.to_str().expect("utf-8 path")]);
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    for mix in ["100:0", "95:5", "50:50", "5:95", "0:100"] {
        assert!(md.contains(&format!("| {mix} | ")), "mix {mix} missing from report:\n{md}");
    }
    assert!(md.contains("## Machine"), "{md}");
    assert!(md.contains("Avg read latency (ms)") && md.contains("Avg write latency (ms)"), "{md}");
    let png = std::fs::read(out.join("chart.png")).expect("chart.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("results.json")).expect("json");
    assert_eq!(results["phases"].as_array().map(|a| a.len()), Some(6), "load + 5 mixes");
    let _ = std::fs::remove_dir_all(&dir);
}
