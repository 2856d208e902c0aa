//! The storage memory budget (`--wiredTigerCacheSizeGB`) bounds the server's memory whatever
//! the data size.

mod common;

use common::*;
use mongodb::bson::{doc, spec::BinarySubtype, Binary, Document};
use mongodb::options::FindOptions;

/// mongod's smallest cacheSizeGB; shoal splits it between memtables and the block cache.
const BUDGET_GB: f64 = 0.25;
const BUDGET_BYTES: u64 = 256 << 20;
/// Data written: twice the budget, incompressible, so neither the memtables nor the block
/// cache can hold it and compression cannot shrink it.
const DATA_BYTES: u64 = 2 * BUDGET_BYTES;
const DOC_PAYLOAD_BYTES: usize = 16 << 10;
const BATCH_DOCS: usize = 128;
/// What the server holds besides the storage budget: code, runtime, per-connection buffers,
/// and one request and reply in flight (a 2 MiB insert batch decoded and encoded, 16 MiB
/// find batches). Measured peak above the budget: see the test's message when it fails.
const OVERHEAD_BYTES_MAX: u64 = 160 << 20;

/// xorshift64: incompressible bytes without a dependency.
fn fill(state: &mut u64, out: &mut [u8]) {
    for chunk in out.chunks_mut(8) {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_cache_budget_whatever_the_data_size() {
    let server = Server::start_with_args(&["--wiredTigerCacheSizeGB", &BUDGET_GB.to_string()]);
    let pid = server.pid().expect("server pid");
    let client = server.client().await;
    let opts = client.database("admin").run_command(doc! {"getCmdLineOpts": 1}).await.unwrap();
    assert_eq!(num(path(&opts, "parsed.storage.wiredTiger.engineConfig.cacheSizeGB").unwrap()), Some(BUDGET_GB));
    let coll = client.database("mem").collection::<Document>("big");

    let docs_total = (DATA_BYTES as usize).div_ceil(DOC_PAYLOAD_BYTES);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut payload = vec![0u8; DOC_PAYLOAD_BYTES];
    let mut next_id = 0i64;
    while (next_id as usize) < docs_total {
        let mut batch = Vec::with_capacity(BATCH_DOCS);
        for _ in 0..BATCH_DOCS.min(docs_total - next_id as usize) {
            fill(&mut rng, &mut payload);
            batch.push(doc! {"_id": next_id, "k": next_id % 1000, "p": Binary { subtype: BinarySubtype::Generic, bytes: payload.clone() }});
            next_id += 1;
        }
        coll.insert_many(batch).await.unwrap();
    }
    let stats = client.database("mem").run_command(doc! {"collStats": "big"}).await.unwrap();
    assert!(num_field(&stats, "size") as u64 >= DATA_BYTES, "{stats:?}");

    // Read everything back twice, so the block cache fills and turns over.
    for _ in 0..2 {
        let mut seen = 0usize;
        let mut cursor = coll.find(doc! {}).with_options(FindOptions::builder().projection(doc! {"k": 1}).build()).await.unwrap();
        while cursor.advance().await.unwrap() {
            seen += 1;
        }
        assert_eq!(seen, docs_total);
    }
    // And whole documents, which carry the payload through the reply path.
    let full = collect(coll.find(doc! {"_id": {"$lt": 2000}}).await.unwrap()).await;
    assert_eq!(full.len(), 2000);

    let peak = proc_status_bytes(pid, "VmHWM");
    assert!(
        peak <= BUDGET_BYTES + OVERHEAD_BYTES_MAX,
        "peak RSS {} MiB with a {} MiB budget and {} MiB of data (allowed overhead {} MiB)",
        peak >> 20,
        BUDGET_BYTES >> 20,
        DATA_BYTES >> 20,
        OVERHEAD_BYTES_MAX >> 20
    );
    eprintln!("peak RSS {} MiB with a {} MiB budget and {} MiB of data", peak >> 20, BUDGET_BYTES >> 20, DATA_BYTES >> 20);
}
