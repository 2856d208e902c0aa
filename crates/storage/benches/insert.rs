//! Insert-path throughput: bench02-shaped orders ({_id, customerId, productId, quantity,
//! orderDate, textField of 1 KB}) with three compound indexes, in 1000-document batches, each
//! made durable before the next, written (a) through `Collection::insert_many` +
//! `Store::commit_durable` and (b) straight into fjall with the same keys and values (one
//! fjall batch per 1000 records with their index entries, then a synced persist). Prints
//! docs/s for each and the ratio (insert_many's goal: at least 70% of the raw engine's).
//!
//! `cargo bench -p shoal-storage --bench insert`; environment: SHOAL_BENCH_DOCS (per round,
//! default 200000), SHOAL_BENCH_ROUNDS (default 2; the modes alternate), SHOAL_BENCH_DIR, SHOAL_BENCH_MODES
//! (subset of store,raw,raw-enc).

use bson::{doc, oid::ObjectId, Bson, DateTime, Document};
use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use shoal_storage::{encode_index_key, memtable_bytes_for, memtables_bytes_max, IndexSpec, Store, StoreOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const BATCH_DOCS: usize = 1000;
const TEXT_SIZE_BYTES: usize = 1000;
const CUSTOMERS: u64 = 100_000;
const PRODUCTS: u64 = 10_000;
const CACHE_SIZE_BYTES: u64 = shoal_storage::CACHE_SIZE_BYTES_DEFAULT;
/// bench02's secondary indexes.
const INDEXES: [[&str; 2]; 3] = [["customerId", "orderDate"], ["customerId", "productId"], ["productId", "orderDate"]];

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn orders(rng: &mut Rng, n: usize) -> Vec<Document> {
    let now_ms = DateTime::now().timestamp_millis();
    (0..n)
        .map(|_| {
            // bench02's default: a quarter of the text is one repeated character.
            let repeated = TEXT_SIZE_BYTES / 4;
            let mut text = String::with_capacity(TEXT_SIZE_BYTES);
            text.extend(std::iter::repeat_n('x', repeated));
            text.extend((repeated..TEXT_SIZE_BYTES).map(|_| (b'a' + rng.below(26) as u8) as char));
            doc! {
                "_id": ObjectId::new(),
                "customerId": 1 + rng.below(CUSTOMERS) as i32,
                "productId": 1 + rng.below(PRODUCTS) as i32,
                "quantity": 1 + rng.below(10) as i32,
                "orderDate": DateTime::from_millis(now_ms - rng.below(365 * 86_400_000) as i64),
                "textField": text,
            }
        })
        .collect()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(base: &Path, tag: &str) -> TempDir {
        let p = base.join(format!("shoal-insert-bench-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create bench directory");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// (a) The store's insert path.
fn run_store(dir: &Path, batches: &[Vec<Document>]) -> Cost {
    let store = Store::open(dir, StoreOptions { cache_size_bytes: CACHE_SIZE_BYTES, fsync: true }).expect("open store");
    let c = store.collection_or_create("bench02", "orders").expect("create collection");
    for [a, b] in INDEXES {
        c.create_index(IndexSpec::new(doc! {a: 1, b: 1}, &format!("{a}_1_{b}_1"))).expect("create index");
    }
    let start = Start::now();
    for docs in batches {
        let out = c.insert_many(docs, false);
        assert_eq!(out.inserted, docs.len(), "insert errors: {:?}", out.errors.first());
        store.commit_durable().expect("commit");
    }
    start.cost()
}

/// One batch's keys and values as the store lays them out: records `coll_id rid` → BSON;
/// `_id_` (unique) `index_id key` → `rid values`; others `index_id key rid` → `rid values`.
type Kv = (Vec<u8>, Vec<u8>);

fn raw_batch(docs: &[Document], first_rid: u64) -> (Vec<Kv>, Vec<Kv>) {
    const COLL_ID: u64 = 1;
    const ID_INDEX_ID: u64 = 2;
    let id_pattern = doc! {"_id": 1};
    let patterns: Vec<Document> = INDEXES.iter().map(|[a, b]| doc! {*a: 1, *b: 1}).collect();
    let mut records = Vec::with_capacity(docs.len());
    let mut index = Vec::with_capacity(docs.len() * 4);
    for (i, d) in docs.iter().enumerate() {
        let rid = first_rid + i as u64;
        let mut rk = COLL_ID.to_be_bytes().to_vec();
        rk.extend_from_slice(&rid.to_be_bytes());
        records.push((rk, d.to_vec().expect("serialize")));
        let entry = |iid: u64, pattern: &Document, values: Vec<Bson>, unique: bool| {
            let mut k = iid.to_be_bytes().to_vec();
            k.extend_from_slice(&encode_index_key(pattern, &values));
            if !unique {
                k.extend_from_slice(&rid.to_be_bytes());
            }
            let mut v = rid.to_be_bytes().to_vec();
            let mut vd = Document::new();
            for (n, x) in values.into_iter().enumerate() {
                vd.insert(n.to_string(), x);
            }
            vd.to_writer(&mut v).expect("serialize");
            (k, v)
        };
        let get = |f: &str| d.get(f).cloned().unwrap_or(Bson::Null);
        index.push(entry(ID_INDEX_ID, &id_pattern, vec![get("_id")], true));
        for (n, [a, b]) in INDEXES.iter().enumerate() {
            index.push(entry(3 + n as u64, &patterns[n], vec![get(a), get(b)], false));
        }
    }
    (records, index)
}

/// (b) fjall directly, with keys and values prepared before the clock starts (or, with
/// `encode_in_loop`, prepared per batch inside the timed loop).
fn run_raw(dir: &Path, batches: &[Vec<Document>], encode_in_loop: bool) -> Cost {
    // As FjallEngine opens them: the same block cache and memtable sizes.
    let memtable_bytes = memtable_bytes_for(CACHE_SIZE_BYTES);
    let db = Database::builder(dir).cache_size(CACHE_SIZE_BYTES - memtables_bytes_max(memtable_bytes)).open().expect("open fjall");
    let options = || KeyspaceCreateOptions::default().max_memtable_size(memtable_bytes);
    let records = db.keyspace("records", options).expect("keyspace");
    let index = db.keyspace("index", options).expect("keyspace");
    let mut prepared = Vec::new();
    if !encode_in_loop {
        for (n, docs) in batches.iter().enumerate() {
            prepared.push(raw_batch(docs, 1 + (n * BATCH_DOCS) as u64));
        }
    }
    let start = Start::now();
    for (n, docs) in batches.iter().enumerate() {
        let (recs, ix) = if encode_in_loop { raw_batch(docs, 1 + (n * BATCH_DOCS) as u64) } else { std::mem::take(&mut prepared[n]) };
        let mut b = db.batch();
        for (k, v) in recs {
            b.insert(&records, k, v);
        }
        for (k, v) in ix {
            b.insert(&index, k, v);
        }
        b.commit().expect("commit");
        db.persist(PersistMode::SyncAll).expect("persist");
    }
    start.cost()
}

fn rate(docs: usize, d: Duration) -> f64 {
    docs as f64 / d.as_secs_f64()
}

/// CPU time used by this process so far (all threads, incl. fjall's background workers),
/// from /proc/self/stat (utime + stime in USER_HZ = 100 ticks per second).
fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return Duration::ZERO };
    // Fields after the parenthesized command name; utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after.split_whitespace().skip(11).take(2).filter_map(|f| f.parse().ok()).collect();
    Duration::from_millis(fields.iter().sum::<u64>() * 10)
}

/// Wall time and process CPU time of one mode.
#[derive(Default, Clone, Copy)]
struct Cost {
    wall: Duration,
    cpu: Duration,
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, o: Cost) {
        self.wall += o.wall;
        self.cpu += o.cpu;
    }
}

/// The start of a timed section.
struct Start {
    wall: Instant,
    cpu: Duration,
}

impl Start {
    fn now() -> Start {
        Start { wall: Instant::now(), cpu: process_cpu() }
    }
    fn cost(&self) -> Cost {
        Cost { wall: self.wall.elapsed(), cpu: process_cpu().saturating_sub(self.cpu) }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument other than "insert" skips the run.
    if std::env::args().skip(1).any(|a| !a.starts_with("--") && a != "insert") {
        return;
    }
    let docs_per_round = env_usize("SHOAL_BENCH_DOCS", 200_000).max(BATCH_DOCS) / BATCH_DOCS * BATCH_DOCS;
    let rounds = env_usize("SHOAL_BENCH_ROUNDS", 2).max(1);
    // Comma-separated subset of store,raw,raw-enc (for profiling one mode).
    let modes = std::env::var("SHOAL_BENCH_MODES").unwrap_or_else(|_| "store,raw,raw-enc".to_string());
    let base = std::env::var_os("SHOAL_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    println!("bench02 shape: {docs_per_round} docs/round in {BATCH_DOCS}-doc batches, 3 compound indexes, fsync per batch, {rounds} rounds");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let on = |m: &str| modes.split(',').any(|x| x == m);
    let (mut store_total, mut raw_total, mut raw_enc_total) = (Cost::default(), Cost::default(), Cost::default());
    for round in 1..=rounds {
        let batches: Vec<Vec<Document>> = (0..docs_per_round / BATCH_DOCS).map(|_| orders(&mut rng, BATCH_DOCS)).collect();
        let (mut t_store, mut t_raw, mut t_raw_enc) = (Cost::default(), Cost::default(), Cost::default());
        // Alternate the order so drift in machine load does not favour one mode.
        let order: [&str; 3] = if round % 2 == 1 { ["store", "raw", "raw-enc"] } else { ["raw-enc", "raw", "store"] };
        for mode in order.into_iter().filter(|m| on(m)) {
            let dir = TempDir::new(&base, mode);
            match mode {
                "store" => t_store = run_store(&dir.0, &batches),
                "raw" => t_raw = run_raw(&dir.0, &batches, false),
                _ => t_raw_enc = run_raw(&dir.0, &batches, true),
            }
        }
        println!(
            "round {round}: insert_many+commit_durable {:>7.0} docs/s | raw fjall {:>7.0} docs/s | raw fjall incl. encoding {:>7.0} docs/s",
            rate(docs_per_round, t_store.wall),
            rate(docs_per_round, t_raw.wall),
            rate(docs_per_round, t_raw_enc.wall)
        );
        store_total += t_store;
        raw_total += t_raw;
        raw_enc_total += t_raw_enc;
    }
    let total = docs_per_round * rounds;
    let us_per_doc = |c: Cost| c.cpu.as_secs_f64() * 1e6 / total as f64;
    let (s, r, re) = (rate(total, store_total.wall), rate(total, raw_total.wall), rate(total, raw_enc_total.wall));
    println!("insert_many + commit_durable: {s:>7.0} docs/s, {:.1} CPU-us/doc", us_per_doc(store_total));
    println!("raw fjall (same keys/values): {r:>7.0} docs/s, {:.1} CPU-us/doc", us_per_doc(raw_total));
    println!("raw fjall incl. encoding:     {re:>7.0} docs/s, {:.1} CPU-us/doc", us_per_doc(raw_enc_total));
    println!(
        "ratio insert_many / raw: {:.1}% by throughput, {:.1}% by CPU per doc (vs raw incl. encoding: {:.1}%, {:.1}%)",
        100.0 * s / r,
        100.0 * us_per_doc(raw_total) / us_per_doc(store_total),
        100.0 * s / re,
        100.0 * us_per_doc(raw_enc_total) / us_per_doc(store_total)
    );
}
