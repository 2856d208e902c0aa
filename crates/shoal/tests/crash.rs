//! Crash safety: acknowledged journaled writes survive kill -9, and the data stays consistent.
//!
//! One server is killed 100 times at random points of a mixed load (single and batched
//! inserts, heavy 50 KB batches, updates, deletes, from six clients). After each restart
//! every acknowledged write is there, no unacknowledged write is half there, `validate`
//! passes, and each index read whole holds exactly the records' keys. What survived one
//! crash must survive the next. A failing run replays from the seed it prints
//! (SHOAL_CRASH_SEED); SHOAL_CRASH_ROUNDS runs a longer soak.

mod common;

use common::*;
use mongodb::bson::{doc, Document};
use mongodb::options::{IndexOptions, WriteConcern};
use mongodb::{Client, Collection, IndexModel};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TASKS_COUNT: u64 = 6;
/// Acknowledged operations (all tasks together) before the kill, per round, at most: each
/// round kills at a random point below it, so that kills land anywhere in the engine's
/// cycle (memtable writes, flushes, journal rotation, compactions).
const ACKED_OPS_BEFORE_KILL_MAX: u64 = 1200;
/// Safety bound on one round's load phase; a healthy server needs a small fraction of it.
const LOAD_PHASE_TIMEOUT: Duration = Duration::from_secs(120);
/// Kills per run; SHOAL_CRASH_ROUNDS sets another count (a long soak), and SHOAL_CRASH_SEED
/// replays a run (each round prints its seed).
const ROUNDS_COUNT: u64 = 100;
/// Documents per key space: keeps task ids disjoint across tasks and rounds.
const IDS_PER_TASK: i64 = 1_000_000;
/// Rounds whose documents stay: older ones are deleted (acknowledged, before the next
/// load), which keeps verification's cost flat and adds deletes' tombstones to the engine.
const KEPT_ROUNDS: u64 = 4;
/// The heavy task's batches: documents, and bytes of padding each, so that the engine
/// flushes and compacts during the run.
const HEAVY_BATCH_DOCS: i64 = 50;
const HEAVY_PAD_BYTES: usize = 1000;

/// What the client knows about one document.
#[derive(Clone, Debug, Default)]
struct Known {
    /// Last acknowledged state: Some(v) present with value v, None absent.
    acked: Option<i64>,
    /// A write that was sent but never acknowledged: Some(Some(v)) set to v, Some(None) deleted.
    pending: Option<Option<i64>>,
}

impl Known {
    fn allowed(&self) -> Vec<Option<i64>> {
        let mut v = vec![self.acked];
        if let Some(p) = self.pending {
            v.push(p);
        }
        v
    }
}

fn key(id: i64) -> String {
    format!("k-{id}")
}

/// One writer: inserts (single and batched), updates and deletes in its own id range.
/// Stops at the first error (the server was killed) and returns what it knows.
async fn writer(
    coll: Collection<Document>,
    task: u64,
    round: u64,
    seed: u64,
    acked_total: Arc<AtomicU64>,
    killed: Arc<AtomicBool>,
    errors: Arc<Mutex<Vec<String>>>,
) -> HashMap<i64, Known> {
    let base = ((round * TASKS_COUNT + task) as i64) * IDS_PER_TASK;
    let mut rng = Rng(seed ^ (task + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut known: HashMap<i64, Known> = HashMap::new();
    let mut live: Vec<i64> = Vec::new();
    let mut next_id = base;
    let mut seq: i64 = 1;
    loop {
        seq += 1;
        let choice = if live.is_empty() { 0 } else { rng.below(10) };
        let r: mongodb::error::Result<()> = match choice {
            0..=3 => {
                let id = next_id;
                next_id += 1;
                known.insert(id, Known { acked: None, pending: Some(Some(0)) });
                let r = coll.insert_one(doc! {"_id": id, "k": key(id), "v": 0_i64, "pad": "p".repeat(200)}).await;
                if r.is_ok() {
                    known.insert(id, Known { acked: Some(0), pending: None });
                    live.push(id);
                }
                r.map(|_| ())
            }
            4 => {
                // Task 0 writes the heavy batches.
                let (n, pad) = if task == 0 { (HEAVY_BATCH_DOCS, "h".repeat(HEAVY_PAD_BYTES)) } else { (10, String::new()) };
                let batch: Vec<i64> = (0..n).map(|i| next_id + i).collect();
                next_id += n;
                for id in &batch {
                    known.insert(*id, Known { acked: None, pending: Some(Some(0)) });
                }
                let docs: Vec<Document> = batch.iter().map(|id| doc! {"_id": *id, "k": key(*id), "v": 0_i64, "pad": &pad}).collect();
                let r = coll.insert_many(docs).await;
                if r.is_ok() {
                    for id in &batch {
                        known.insert(*id, Known { acked: Some(0), pending: None });
                        live.push(*id);
                    }
                }
                r.map(|_| ())
            }
            5..=8 => {
                let id = live[rng.below(live.len() as u64) as usize];
                let entry = known.entry(id).or_default();
                entry.pending = Some(Some(seq));
                let r = coll.update_one(doc! {"_id": id}, doc! {"$set": {"v": seq}}).await;
                if let Ok(res) = &r {
                    assert_eq!(res.matched_count, 1, "acknowledged live document {id} not matched");
                    *entry = Known { acked: Some(seq), pending: None };
                }
                r.map(|_| ())
            }
            _ => {
                let at = rng.below(live.len() as u64) as usize;
                let id = live[at];
                let entry = known.entry(id).or_default();
                entry.pending = Some(None);
                let r = coll.delete_one(doc! {"_id": id}).await;
                if let Ok(res) = &r {
                    assert_eq!(res.deleted_count, 1, "acknowledged live document {id} not deleted");
                    *entry = Known { acked: None, pending: None };
                    live.swap_remove(at);
                }
                r.map(|_| ())
            }
        };
        if let Err(e) = r {
            if !killed.load(Ordering::SeqCst) {
                errors.lock().expect("errors lock").push(format!("task {task}: write failed before the kill: {e}"));
            }
            break;
        }
        acked_total.fetch_add(1, Ordering::Relaxed);
    }
    known
}

fn journaled(client: &Client) -> Collection<Document> {
    // j:true is what makes an acknowledgement a durability promise in MongoDB.
    let wc = WriteConcern::builder().journal(true).build();
    client.database("crash").collection_with_options::<Document>("c", mongodb::options::CollectionOptions::builder().write_concern(wc).build())
}

async fn fast_fail_client(server: &Server) -> Client {
    // A short server selection timeout makes writers notice the kill quickly.
    server.client_with("serverSelectionTimeoutMS=2000&connectTimeoutMS=2000").await
}

/// Check what the restarted server holds against what was acknowledged, and the indexes
/// against the records. Returns each document's value found.
async fn verify(server: &Server, known: &HashMap<i64, Known>) -> HashMap<i64, i64> {
    let client = server.client().await;
    let coll = client.database("crash").collection::<Document>("c");
    let docs = collect(coll.find(doc! {}).await.expect("find all after restart")).await;
    let mut present: HashMap<i64, Document> = HashMap::new();
    for d in docs {
        let id = d.get_i64("_id").unwrap_or_else(|_| panic!("bad _id in {d:?}"));
        assert!(known.contains_key(&id), "document {id} was never written: {d:?}");
        assert!(present.insert(id, d).is_none(), "duplicate _id {id}");
    }
    let mut lost = Vec::new();
    for (id, k) in known {
        let got = present.get(id).map(|d| d.get_i64("v").unwrap_or_else(|_| panic!("bad v in {d:?}")));
        if !k.allowed().contains(&got) {
            lost.push(format!("_id {id}: found {got:?}, acknowledged {:?}, pending {:?}", k.acked, k.pending));
        }
        if let Some(d) = present.get(id) {
            assert_eq!(d.get_str("k").ok(), Some(key(*id).as_str()), "indexed field corrupted: {d:?}");
        }
    }
    lost.sort();
    assert!(lost.is_empty(), "{} acknowledged writes lost or wrong, e.g.:\n{}", lost.len(), lost.iter().take(20).cloned().collect::<Vec<_>>().join("\n"));

    // Indexes agree with the records.
    let v = client.database("crash").run_command(doc! {"validate": "c", "full": true}).await.expect("validate");
    assert_eq!(v.get_bool("valid").ok(), Some(true), "{v:?}");
    let nrecords = num_field(&v, "nrecords");
    assert_eq!(nrecords, present.len() as f64, "{v:?}");
    let kpi = v.get_document("keysPerIndex").expect("keysPerIndex");
    assert_eq!(kpi.len(), 3, "{kpi:?}");
    for (name, keys) in kpi {
        assert_eq!(num(keys), Some(nrecords), "index {name} key count differs from record count: {v:?}");
    }
    // Each index, read whole through a hinted scan, holds exactly the records' keys: an entry
    // missing, left over or pointing at the wrong document fails here.
    let want_k: std::collections::BTreeSet<(String, i64)> = present.keys().map(|id| (key(*id), *id)).collect();
    let want_v: std::collections::BTreeSet<(i64, i64)> = present.iter().map(|(id, d)| (d.get_i64("v").unwrap_or_default(), *id)).collect();
    let by_k =
        collect(coll.find(doc! {"k": {"$gte": ""}}).hint(mongodb::options::Hint::Name("k_1".into())).projection(doc! {"k": 1}).await.expect("scan k_1")).await;
    let got_k: Vec<(String, i64)> = by_k.iter().map(|d| (d.get_str("k").unwrap_or_default().to_string(), d.get_i64("_id").unwrap_or_default())).collect();
    assert_eq!(got_k.len(), want_k.len(), "k_1 scan returned {} entries for {} records", got_k.len(), want_k.len());
    assert!(got_k.iter().cloned().collect::<std::collections::BTreeSet<_>>() == want_k, "k_1 entries differ from the records");
    let by_v =
        collect(coll.find(doc! {"v": {"$gte": i64::MIN}}).hint(mongodb::options::Hint::Name("v_1".into())).projection(doc! {"v": 1}).await.expect("scan v_1"))
            .await;
    let got_v: Vec<(i64, i64)> = by_v.iter().map(|d| (d.get_i64("v").unwrap_or(-1), d.get_i64("_id").unwrap_or_default())).collect();
    assert_eq!(got_v.len(), want_v.len(), "v_1 scan returned {} entries for {} records", got_v.len(), want_v.len());
    assert!(got_v.iter().copied().collect::<std::collections::BTreeSet<_>>() == want_v, "v_1 entries differ from the records");
    // The index scans return in key order (among equal keys, in record order).
    assert!(got_k.windows(2).all(|w| w[0].0 < w[1].0) && got_v.windows(2).all(|w| w[0].0 <= w[1].0), "an index scan is out of key order");
    // The unique index still rejects duplicates after recovery.
    if let Some(id) = present.keys().next() {
        assert_code(coll.insert_one(doc! {"_id": -1_i64, "k": key(*id)}).await, 11000);
    }
    present.into_iter().map(|(id, d)| (id, d.get_i64("v").unwrap_or_default())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_kill_9() {
    let mut server = Server::start();
    {
        let client = server.client().await;
        let coll = client.database("crash").collection::<Document>("c");
        coll.create_index(IndexModel::builder().keys(doc! {"k": 1}).options(IndexOptions::builder().unique(true).build()).build()).await.expect("unique index");
        coll.create_index(IndexModel::builder().keys(doc! {"v": 1}).build()).await.expect("index v");
    }
    let mut known: HashMap<i64, Known> = HashMap::new();
    let rounds: u64 = std::env::var("SHOAL_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(ROUNDS_COUNT);
    let run_seed = seed_from_env("SHOAL_CRASH_SEED");
    eprintln!("SHOAL_CRASH_ROUNDS={rounds}");
    let mut plan = Rng(run_seed | 1);
    let (mut acked_all, mut in_flight_all) = (0u64, 0usize);
    for round in 0..rounds {
        let seed = plan.next();
        let kill_after = Rng(seed).below(ACKED_OPS_BEFORE_KILL_MAX);
        let kill_delay = Duration::from_micros(Rng(seed ^ 0xD1B5_4A32_D192_ED03).below(2000));
        let t_load = Instant::now();
        let client = fast_fail_client(&server).await;
        let coll = journaled(&client);
        if let Some(old) = round.checked_sub(KEPT_ROUNDS) {
            let ids = (old * TASKS_COUNT) as i64 * IDS_PER_TASK..((old + 1) * TASKS_COUNT) as i64 * IDS_PER_TASK;
            coll.delete_many(doc! {"_id": {"$gte": ids.start, "$lt": ids.end}}).await.expect("delete an old round's documents");
            known.retain(|id, _| !ids.contains(id));
        }
        let acked_total = Arc::new(AtomicU64::new(0));
        let killed = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> =
            (0..TASKS_COUNT).map(|t| tokio::spawn(writer(coll.clone(), t, round, seed, acked_total.clone(), killed.clone(), errors.clone()))).collect();
        let deadline = Instant::now() + LOAD_PHASE_TIMEOUT;
        while acked_total.load(Ordering::Relaxed) < kill_after {
            assert!(Instant::now() < deadline, "only {} writes acknowledged in {:?}", acked_total.load(Ordering::Relaxed), LOAD_PHASE_TIMEOUT);
            assert!(server.is_running(), "server died under load:\n{}", server.stderr_tail());
            let errs = errors.lock().expect("errors lock").clone();
            assert!(errs.is_empty(), "writes failed while the server was up:\n{}", errs.join("\n"));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Mid-load: writers have requests in flight right now.
        tokio::time::sleep(kill_delay).await;
        killed.store(true, Ordering::SeqCst);
        server.kill9();
        acked_all += acked_total.load(Ordering::Relaxed);
        for h in handles {
            let task_known = h.await.expect("writer task panicked");
            known.extend(task_known);
        }
        drop(client);
        let pending = known.values().filter(|k| k.pending.is_some()).count();
        in_flight_all += pending;
        let present = known.values().filter(|k| k.acked.is_some()).count();
        eprintln!("round {round} (seed {seed}, kill after {kill_after} acknowledged + {kill_delay:?}): {} documents tracked, {present} acknowledged present, {pending} unacknowledged in flight at the kill", known.len());
        let load = t_load.elapsed();
        let t_restart = Instant::now();
        server.restart();
        let restart = t_restart.elapsed();
        let t_verify = Instant::now();
        // What survived is now settled: a write found after one crash must survive the next.
        let found = verify(&server, &known).await;
        for (id, k) in known.iter_mut() {
            *k = Known { acked: found.get(id).copied(), pending: None };
        }
        eprintln!("round {round}: load {load:?}, restart {restart:?}, verify {:?}", t_verify.elapsed());
        // Drop the probe document the unique check may have inserted (it must have failed anyway).
        let client = server.client().await;
        client.database("crash").collection::<Document>("c").delete_one(doc! {"_id": -1_i64}).await.expect("cleanup");
    }
    eprintln!(
        "{rounds} kills: {acked_all} writes acknowledged, {in_flight_all} in flight at a kill, {} documents at the end, none lost",
        known.values().filter(|k| k.acked.is_some()).count()
    );
}
