//! Real processes under faults, Jepsen-style: clients read, write and compare-and-set a few
//! registers (documents) on a 3-member replica set, with w:"majority" writes and
//! linearizable reads, while a nemesis kills the primary (-9), pauses a member (SIGSTOP),
//! partitions the primary away or from one secondary only (a bridge: the other secondary
//! still reaches both), makes a member's links slow and lossy (these with the fault layer,
//! configureFailPoint "replLink"), and points a secondary at the other one
//! (replSetSyncFrom). Every operation is recorded with
//! when it was invoked and when its reply came; each register's history is then checked
//! for linearizability (`linearizable::check`). The test prints a report (operations by
//! outcome, faults injected, anomalies) and fails on any anomaly.
//!
//! SHOAL_JEPSEN_SECONDS sets how long the clients run (default 30; hours for a soak),
//! SHOAL_JEPSEN_FAULT picks one kind of fault for every round, and SHOAL_JEPSEN_SEED
//! replays a run's choices (each run prints its seed; the processes'
//! timing is not replayed).

mod common;
mod elle;
mod linearizable;

use common::*;
use linearizable::{Entry, Op, Verdict};
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{ReadConcern, ReadPreference, SelectionCriteria, WriteConcern};
use mongodb::{Client, Collection};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MEMBERS: usize = 3;
const KEYS: i64 = 4;
const CLIENTS: u64 = 4;
const RUN_SECONDS_DEFAULT: u64 = 30;
/// An operation without a reply by then has an unknown outcome.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long each fault lasts, and the calm between faults.
const FAULT_DURATION: Duration = Duration::from_secs(3);
const CALM_DURATION: Duration = Duration::from_secs(2);
const ELECTION_TIMEOUT_MS: i32 = 1000;
const HEARTBEAT_INTERVAL_MS: i32 = 200;

fn host(s: &Server) -> String {
    format!("127.0.0.1:{}", s.port)
}

async fn admin(s: &Server, cmd: Document) -> mongodb::error::Result<Document> {
    let c = s.client_with("directConnection=true&serverSelectionTimeoutMS=2000").await;
    c.database("admin").run_command(cmd).await
}

/// The member that says it is primary, if one does.
async fn primary(members: &mut [Server]) -> Option<usize> {
    for (i, m) in members.iter_mut().enumerate() {
        if !m.is_running() {
            continue;
        }
        if let Ok(s) = admin(m, doc! {"replSetGetStatus": 1}).await {
            if s.get_i32("myState").ok() == Some(1) {
                return Some(i);
            }
        }
    }
    None
}

async fn wait_for_primary(members: &mut [Server]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(p) = primary(members).await {
            return p;
        }
        assert!(Instant::now() < deadline, "no primary within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Set `fault` (the fault layer's replLink data, without host) on every link to and from
/// member `p`; None heals them.
async fn fault_links(members: &[Server], p: usize, fault: Option<Document>) {
    let old = host(&members[p]);
    for (i, m) in members.iter().enumerate() {
        let target = if i == p { "*".to_string() } else { old.clone() };
        let mut data = doc! {"host": target};
        let mode = match &fault {
            Some(f) => {
                data.extend(f.clone());
                "alwaysOn"
            }
            None => "off",
        };
        set_fail_point(m, i, doc! {"configureFailPoint": "replLink", "mode": mode, "data": data}).await;
    }
}

/// Cut (or with `on` false, heal) the link between members `a` and `b` alone, both ways.
async fn cut_link(members: &[Server], a: usize, b: usize, on: bool) {
    for (from, to) in [(a, b), (b, a)] {
        let data = doc! {"host": host(&members[to]), "partition": true};
        let mode = if on { "alwaysOn" } else { "off" };
        set_fail_point(&members[from], from, doc! {"configureFailPoint": "replLink", "mode": mode, "data": data}).await;
    }
}

/// Configure a fail point on member `i`. A member that is busy (catching up after a restart,
/// on two shared cores) may miss the client's 2 s; one that does not answer for 30 s is stuck,
/// and the panic shows where.
async fn set_fail_point(m: &Server, i: usize, cmd: Document) {
    let deadline = Instant::now() + FAIL_POINT_ANSWER_WITHIN;
    loop {
        match admin(m, cmd.clone()).await {
            Ok(_) => return,
            Err(e) if Instant::now() >= deadline => panic!("fail point on member {i}: {e}\n{}", stacks(m)),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// How long a member may take to answer the nemesis.
const FAIL_POINT_ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// Where a member that does not answer is stuck: its threads' stacks (gdb, where installed).
fn stacks(s: &Server) -> String {
    let Some(pid) = s.pid() else { return "(not running)".into() };
    match std::process::Command::new("gdb").args(["-p", &pid.to_string(), "-batch", "-ex", "thread apply all bt 30"]).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with('#') || l.starts_with("Thread")).collect::<Vec<_>>().join("\n"),
        Err(e) => format!("(no stacks: {e})"),
    }
}

fn signal(s: &Server, sig: i32) {
    if let Some(pid) = s.pid() {
        // SAFETY: a signal to our own child process.
        unsafe { libc::kill(pid as i32, sig) };
    }
}

/// The history, in microseconds since the run began.
struct Recorder {
    start: Instant,
    entries: Mutex<Vec<(i64, Entry)>>,
}

impl Recorder {
    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn record(&self, key: i64, op: Op, invoked: u64, returned: Option<u64>) {
        self.entries.lock().expect("history lock").push((key, Entry { op, invoked, returned }));
    }
}

/// An error that proves the operation never reached a server (no server could be chosen),
/// so it had no effect; any other error leaves the outcome unknown.
fn never_sent(e: &mongodb::error::Error) -> bool {
    matches!(*e.kind, mongodb::error::ErrorKind::ServerSelection { .. })
}

async fn client_loop(coll: Collection<Document>, id: u64, seed: u64, until: Instant, history: Arc<Recorder>) {
    let mut rng = Rng(seed ^ (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut last_read: Vec<Option<i64>> = vec![None; KEYS as usize];
    let mut seq = 0i64;
    let linearizable = mongodb::options::FindOneOptions::builder()
        .read_concern(ReadConcern::linearizable())
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        .build();
    while Instant::now() < until {
        let key = rng.below(KEYS as u64) as i64;
        let kind = rng.below(10);
        let invoked = history.now_us();
        match (kind, last_read[key as usize]) {
            (0..=3, _) | (8.., None) => {
                let r = tokio::time::timeout(OP_TIMEOUT, coll.find_one(doc! {"_id": key}).with_options(linearizable.clone())).await;
                // A read that failed says nothing: left out of the history.
                if let Ok(Ok(found)) = r {
                    let value = found.map(|d| d.get_i64("v").expect("v is an i64"));
                    history.record(key, Op::Read(value), invoked, Some(history.now_us()));
                    last_read[key as usize] = value;
                }
            }
            (4..=7, _) => {
                seq += 1;
                let value = (id as i64 + 1) * 1_000_000_000 + seq;
                let r = tokio::time::timeout(OP_TIMEOUT, coll.update_one(doc! {"_id": key}, doc! {"$set": {"v": value}}).upsert(true)).await;
                match r {
                    Ok(Ok(_)) => history.record(key, Op::Write(value), invoked, Some(history.now_us())),
                    Ok(Err(e)) if never_sent(&e) => {}
                    _ => history.record(key, Op::Write(value), invoked, None),
                }
            }
            (_, Some(from)) => {
                seq += 1;
                let to = (id as i64 + 1) * 1_000_000_000 + seq;
                let r = tokio::time::timeout(OP_TIMEOUT, coll.find_one_and_update(doc! {"_id": key, "v": from}, doc! {"$set": {"v": to}})).await;
                match r {
                    Ok(Ok(found)) => history.record(key, Op::Cas { from, to, swapped: Some(found.is_some()) }, invoked, Some(history.now_us())),
                    Ok(Err(e)) if never_sent(&e) => {}
                    _ => history.record(key, Op::Cas { from, to, swapped: None }, invoked, None),
                }
            }
        }
    }
}

/// A 3-member set with short election timeouts and fail points, its primary elected.
async fn start_set() -> Vec<Server> {
    start_named_set("rs0", MEMBERS).await
}

/// A set `name` of `n` members with short election timeouts and fail points, its primary
/// elected.
async fn start_named_set(name: &str, n: usize) -> Vec<Server> {
    let mut members: Vec<Server> = (0..n).map(|_| Server::start_with_args(&["--replSet", name, "--setParameter", "enableTestCommands=1"])).collect();
    let config_members: Vec<Bson> = members.iter().enumerate().map(|(i, m)| Bson::Document(doc! {"_id": i as i32, "host": host(m)})).collect();
    admin(&members[0], doc! {"replSetInitiate": {"_id": name, "version": 1, "members": config_members, "settings": {"electionTimeoutMillis": ELECTION_TIMEOUT_MS, "heartbeatIntervalMillis": HEARTBEAT_INTERVAL_MS}}}).await.expect("replSetInitiate");
    wait_for_primary(&mut members).await;
    members
}

fn set_string(name: &str, members: &[Server]) -> String {
    format!("{name}/{}", members.iter().map(host).collect::<Vec<_>>().join(","))
}

/// The faults a nemesis injected.
struct Faults {
    kills: u32,
    pauses: u32,
    partitions: u32,
    slow_links: u32,
    resyncs: u32,
}

impl std::fmt::Display for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Faults { kills, pauses, partitions, slow_links, resyncs } = self;
        write!(f, "{kills} kills, {pauses} pauses, {partitions} partitions, {slow_links} slow and lossy links, {resyncs} sync sources changed")
    }
}

/// Inject faults into `members` until `until`, one at a time, each healed before the next,
/// with calm between them.
async fn nemesis(members: &mut [Server], seed: u64, until: Instant) -> Faults {
    // The nemesis: one fault at a time, each healed before the next. SHOAL_JEPSEN_FAULT
    // (kill, pause, isolate, bridge, syncfrom, lossy) makes every fault that one.
    let only = std::env::var("SHOAL_JEPSEN_FAULT").ok().map(|f| match f.as_str() {
        "kill" => 0,
        "pause" => 1,
        "isolate" => 2,
        "bridge" => 3,
        "syncfrom" => 4,
        "lossy" => 5,
        other => panic!("SHOAL_JEPSEN_FAULT: unknown fault {other}"),
    });
    let mut rng = Rng(seed | 1);
    let (mut kills, mut pauses, mut partitions, mut slow_links, mut resyncs) = (0u32, 0u32, 0u32, 0u32, 0u32);
    while Instant::now() + CALM_DURATION + FAULT_DURATION < until {
        tokio::time::sleep(CALM_DURATION).await;
        let p = wait_for_primary(members).await;
        // 0 kill, 1 pause, 2 isolate the primary, 3 bridge, 4 replSetSyncFrom, 5 lossy links.
        let fault = match only {
            Some(f) => f,
            None => match rng.below(5) {
                2 => 2 + rng.below(2),
                4 => 5,
                f => f,
            },
        };
        match fault {
            0 => {
                members[p].kill9();
                kills += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                members[p].restart();
            }
            1 => {
                // Any member: pausing the primary stalls it mid-write; a secondary, its votes.
                let m = rng.below(MEMBERS as u64) as usize;
                signal(&members[m], libc::SIGSTOP);
                pauses += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                signal(&members[m], libc::SIGCONT);
            }
            2 => {
                fault_links(members, p, Some(doc! {"partition": true})).await;
                partitions += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                fault_links(members, p, None).await;
            }
            3 => {
                // A bridge: the primary and one secondary lose each other; the other
                // secondary votes the cut-off one in and may still fetch from the old
                // primary (the simulation's seed 9: such a member's progress must not
                // count in the old term).
                let cut_off = (p + 1 + rng.below(2) as usize) % MEMBERS;
                cut_link(members, p, cut_off, true).await;
                partitions += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                cut_link(members, p, cut_off, false).await;
            }
            4 => {
                // A secondary told to fetch from the other secondary, which may be behind it
                // (replSetSyncFrom): a source behind is not a divergence to roll back.
                let (a, b) = ((p + 1) % MEMBERS, (p + 2) % MEMBERS);
                let (from, to) = if rng.below(2) == 0 { (a, b) } else { (b, a) };
                // Refused while the target is not yet a secondary (just restarted): fine.
                let _ = admin(&members[from], doc! {"replSetSyncFrom": host(&members[to])}).await;
                resyncs += 1;
                tokio::time::sleep(FAULT_DURATION).await;
            }
            _ => {
                // Any member's links slow and lossy: late heartbeats, votes and oplog batches.
                let m = rng.below(MEMBERS as u64) as usize;
                fault_links(members, m, Some(doc! {"delayMs": 1 + rng.below(300) as i64, "lossPercent": rng.below(50) as i64})).await;
                slow_links += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                fault_links(members, m, None).await;
            }
        }
    }
    Faults { kills, pauses, partitions, slow_links, resyncs }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registers_stay_linearizable_through_kills_pauses_partitions_and_lossy_links() {
    let seconds: u64 = std::env::var("SHOAL_JEPSEN_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(RUN_SECONDS_DEFAULT);
    let seed = seed_from_env("SHOAL_JEPSEN_SEED");
    eprintln!("SHOAL_JEPSEN_SECONDS={seconds}");

    let mut members = start_set().await;

    let hosts: Vec<String> = members.iter().map(host).collect();
    // No retryable writes: a write the driver retried on a new primary after a network
    // error would also sit, as the old primary's entry, in that member's rollback file, and
    // the check below could not tell it from a lost write. A write that fails has an
    // unknown outcome instead.
    let uri =
        format!("mongodb://{}/?replicaSet=rs0&serverSelectionTimeoutMS=3000&connectTimeoutMS=1000&heartbeatFrequencyMS=500&retryWrites=false", hosts.join(","));
    let majority = mongodb::options::CollectionOptions::builder().write_concern(WriteConcern::majority()).build();
    let history = Arc::new(Recorder { start: Instant::now(), entries: Mutex::new(Vec::new()) });
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut clients = Vec::new();
    for id in 0..CLIENTS {
        let client = Client::with_uri_str(&uri).await.expect("client");
        let coll = client.database("jepsen").collection_with_options::<Document>("registers", majority.clone());
        clients.push(tokio::spawn(client_loop(coll, id, seed, until, history.clone())));
    }

    let faults = nemesis(&mut members, seed, until).await;
    for c in clients {
        c.await.expect("client task");
    }

    // Healed: a last linearizable read of each register closes its history.
    wait_for_primary(&mut members).await;
    let client = Client::with_uri_str(&uri).await.expect("client");
    let coll = client.database("jepsen").collection::<Document>("registers");
    for key in 0..KEYS {
        let invoked = history.now_us();
        let found = coll.find_one(doc! {"_id": key}).read_concern(ReadConcern::linearizable()).await.expect("final read");
        history.record(key, Op::Read(found.map(|d| d.get_i64("v").expect("v"))), invoked, Some(history.now_us()));
    }

    let entries = std::mem::take(&mut *history.entries.lock().expect("history lock"));
    let count = |f: &dyn Fn(&Entry) -> bool| entries.iter().filter(|(_, e)| f(e)).count();
    let unknown = count(&|e| e.returned.is_none());
    let reads = count(&|e| matches!(e.op, Op::Read(_)));
    let writes = count(&|e| matches!(e.op, Op::Write(_)) && e.returned.is_some());
    let swaps = count(&|e| matches!(e.op, Op::Cas { swapped: Some(true), .. }));
    let failed_swaps = count(&|e| matches!(e.op, Op::Cas { swapped: Some(false), .. }));
    let mut anomalies = Vec::new();
    for key in 0..KEYS {
        let h: Vec<Entry> = entries.iter().filter(|(k, _)| *k == key).map(|(_, e)| *e).collect();
        let t = Instant::now();
        let verdict = linearizable::check(&h);
        let (what, near) = match &verdict {
            Verdict::Linearizable => ("linearizable".to_string(), Vec::new()),
            Verdict::Undecided => ("undecided".to_string(), Vec::new()),
            Verdict::NotLinearizable { linearized_max } => {
                // Where it breaks: the first operations, by invocation, outside the longest
                // prefix that could be linearized.
                let mut rest: Vec<&Entry> = h.iter().enumerate().filter(|(i, _)| linearized_max.binary_search(i).is_err()).map(|(_, e)| e).collect();
                rest.sort_by_key(|e| e.invoked);
                (
                    format!("NOT linearizable ({} of {} operations linearized at most)", linearized_max.len(), h.len()),
                    rest.into_iter().take(10).copied().collect(),
                )
            }
        };
        eprintln!("register {key}: {} operations, {what}, checked in {:?}", h.len(), t.elapsed());
        if verdict != Verdict::Linearizable {
            anomalies.push(format!("register {key}: {what}; first operations past the break: {near:?}"));
        }
    }
    // Rolled-back writes are saved in rollback files, each document as the member held it
    // after its last write that no majority took (fetching applies every written entry
    // before a rollback). Values are unique and writes are not retried, so none may be an
    // acknowledged one.
    let acknowledged: std::collections::HashSet<i64> = entries
        .iter()
        .filter_map(|(_, e)| match e.op {
            Op::Write(v) if e.returned.is_some() => Some(v),
            Op::Cas { to, swapped: Some(true), .. } => Some(to),
            _ => None,
        })
        .collect();
    let mut rolled_back = 0usize;
    for m in &members {
        let dir = m.dbpath.join("rollback").join("jepsen.registers");
        for file in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let bytes = std::fs::read(file.path()).expect("read a rollback file");
            let mut rest = bytes.as_slice();
            while !rest.is_empty() {
                let d = Document::from_reader(&mut rest).expect("a rollback file holds BSON documents");
                rolled_back += 1;
                if let Ok(v) = d.get_i64("v") {
                    if acknowledged.contains(&v) {
                        anomalies.push(format!("member {}: the acknowledged write of {v} was rolled back ({})", host(m), file.path().display()));
                    }
                }
            }
        }
    }
    eprintln!("rollback files hold {rolled_back} documents, none of them acknowledged unless reported");
    eprintln!(
        "jepsen report: {} operations ({reads} reads, {writes} writes, {swaps} swaps, {failed_swaps} failed swaps, {unknown} with unknown outcome); faults: {faults}; anomalies: {}",
        entries.len(),
        anomalies.len()
    );
    assert!(writes > 0 && reads > 0 && swaps > 0, "the run did too little to check anything");
    assert!(anomalies.is_empty(), "{}", anomalies.join("\n"));
}

/// Keys of the list-append workload, and micro-operations per transaction at most.
const LISTS: u64 = 8;
const LIST_OPS_MAX: u64 = 4;

/// A statement of a list-append transaction: one micro-operation, or the reads of several
/// lists in one find (across shards, through a router: one statement on several).
enum Statement {
    One(elle::Mop),
    Reads(Vec<i64>),
}

/// One client of the list-append workload: transactions of appends (`$push` of a unique
/// value) and reads (the whole list), recorded with their outcome.
async fn list_append_loop(client: Client, id: u64, seed: u64, until: Instant, history: Arc<Mutex<Vec<elle::Txn>>>) {
    let coll = client.database("jepsen").collection::<Document>("lists");
    let mut rng = Rng(seed ^ (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut seq = 0i64;
    let options = mongodb::options::TransactionOptions::builder().read_concern(ReadConcern::snapshot()).write_concern(WriteConcern::majority()).build();
    while Instant::now() < until {
        let planned: Vec<Statement> = (0..1 + rng.below(LIST_OPS_MAX))
            .map(|_| {
                let key = rng.below(LISTS) as i64;
                match rng.below(4) {
                    0 | 1 => {
                        seq += 1;
                        Statement::One(elle::Mop::Append(key, (id as i64 + 1) * 1_000_000_000 + seq))
                    }
                    2 => Statement::One(elle::Mop::Read(key, None)),
                    _ => {
                        let mut keys: Vec<i64> = (0..2 + rng.below(3)).map(|_| rng.below(LISTS) as i64).collect();
                        keys.sort_unstable();
                        keys.dedup();
                        Statement::Reads(keys)
                    }
                }
            })
            .collect();
        let Ok(mut session) = client.start_session().await else { continue };
        if session.start_transaction().with_options(options.clone()).await.is_err() {
            continue;
        }
        let mut done = Vec::with_capacity(planned.len());
        let mut failed = false;
        let list_of = |d: Option<&Document>| -> Vec<i64> {
            let list = d.and_then(|d| d.get_array("l").ok().cloned()).unwrap_or_default();
            list.iter().map(|v| v.as_i64().expect("list values are i64")).collect()
        };
        for statement in planned {
            let r: Result<mongodb::error::Result<Vec<elle::Mop>>, _> = match statement {
                Statement::One(m @ elle::Mop::Append(k, v)) => {
                    let push = coll.update_one(doc! {"_id": k}, doc! {"$push": {"l": v}}).upsert(true).session(&mut session);
                    tokio::time::timeout(OP_TIMEOUT, push).await.map(|r| r.map(|_| vec![m]))
                }
                Statement::One(elle::Mop::Read(k, _)) => {
                    let read = coll.find_one(doc! {"_id": k}).session(&mut session);
                    tokio::time::timeout(OP_TIMEOUT, read).await.map(|r| r.map(|d| vec![elle::Mop::Read(k, Some(list_of(d.as_ref())))]))
                }
                Statement::Reads(keys) => {
                    let read = async {
                        let mut cursor = coll.find(doc! {"_id": {"$in": &keys}}).batch_size(2).session(&mut session).await?;
                        let mut found = std::collections::BTreeMap::new();
                        while let Some(d) = cursor.next(&mut session).await.transpose()? {
                            found.insert(d.get_i64("_id").or_else(|_| d.get_i32("_id").map(i64::from)).expect("_id"), d);
                        }
                        Ok(keys.iter().map(|k| elle::Mop::Read(*k, Some(list_of(found.get(k))))).collect())
                    };
                    tokio::time::timeout(OP_TIMEOUT, read).await
                }
            };
            match r {
                Ok(Ok(ms)) => done.extend(ms),
                _ => {
                    failed = true;
                    break;
                }
            }
        }
        // A transaction whose statement failed was never committed: its appends must not
        // be seen.
        let outcome = if failed {
            let _ = tokio::time::timeout(OP_TIMEOUT, session.abort_transaction()).await;
            // Its appends as planned are unknown only if sent; those that failed were, so
            // every append sent counts as aborted.
            elle::Outcome::Aborted
        } else {
            match tokio::time::timeout(OP_TIMEOUT, session.commit_transaction()).await {
                Ok(Ok(())) => elle::Outcome::Committed,
                _ => elle::Outcome::Unknown,
            }
        };
        history.lock().expect("history lock").push(elle::Txn { ops: done, outcome });
    }
}

/// Transactions under faults, checked as Elle checks list-append histories: clients run
/// transactions of appends and whole-list reads (readConcern "snapshot", w:"majority") on a
/// 3-member set while the nemesis kills, pauses, partitions and slows members; the history
/// must show none of the anomalies snapshot isolation forbids (`elle::check`: G0, G1a, G1b,
/// G1c, G-single and lost updates, incompatible orders). SHOAL_LIST_APPEND_SECONDS sets how
/// long the clients run (default 20), SHOAL_JEPSEN_FAULT and SHOAL_JEPSEN_SEED as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_keep_snapshot_isolation_through_kills_pauses_partitions_and_lossy_links() {
    let seconds: u64 = std::env::var("SHOAL_LIST_APPEND_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(LIST_APPEND_SECONDS_DEFAULT);
    let seed = seed_from_env("SHOAL_JEPSEN_SEED");
    eprintln!("SHOAL_LIST_APPEND_SECONDS={seconds}");
    let mut members = start_set().await;
    let hosts: Vec<String> = members.iter().map(host).collect();
    let uri = format!("mongodb://{}/?replicaSet=rs0&serverSelectionTimeoutMS=3000&connectTimeoutMS=1000&heartbeatFrequencyMS=500", hosts.join(","));
    let until = Instant::now() + Duration::from_secs(seconds);
    let workload = ListAppend::start(&uri, false, seed, until).await;
    let faults = nemesis(&mut members, seed, until).await;
    wait_for_primary(&mut members).await;
    let history = workload.finish(&uri).await;
    report_list_append(&history, &faults.to_string());
}

/// The list-append workload's clients, and the history they record.
struct ListAppend {
    clients: Vec<tokio::task::JoinHandle<()>>,
    history: Arc<Mutex<Vec<elle::Txn>>>,
}

impl ListAppend {
    /// Make the lists (hash-sharded first when `sharded`) and start `CLIENTS` clients through
    /// `uri`, each running transactions until `until`.
    async fn start(uri: &str, sharded: bool, seed: u64, until: Instant) -> ListAppend {
        let client = Client::with_uri_str(uri).await.expect("client");
        if sharded {
            client.database("admin").run_command(doc! {"shardCollection": "jepsen.lists", "key": {"_id": "hashed"}}).await.expect("shardCollection");
        }
        let lists = client.database("jepsen").collection::<Document>("lists");
        lists.insert_many((0..LISTS as i64).map(|k| doc! {"_id": k, "l": []})).write_concern(WriteConcern::majority()).await.expect("the lists");
        let history = Arc::new(Mutex::new(Vec::new()));
        let mut clients = Vec::new();
        for id in 0..CLIENTS {
            let client = Client::with_uri_str(uri).await.expect("client");
            clients.push(tokio::spawn(list_append_loop(client, id, seed, until, history.clone())));
        }
        ListAppend { clients, history }
    }

    /// Wait for the clients, then (the faults healed) add a last transaction that reads every
    /// list, so each key's order is known whole. The history.
    async fn finish(self, uri: &str) -> Vec<elle::Txn> {
        for c in self.clients {
            c.await.expect("client task");
        }
        let client = Client::with_uri_str(uri).await.expect("client");
        let reads = final_reads(&client).await;
        let mut history = std::mem::take(&mut *self.history.lock().expect("history lock"));
        history.push(elle::Txn { ops: reads, outcome: elle::Outcome::Committed });
        history
    }
}

/// A last transaction reads every list, so each key's order is known whole. Its reads count
/// once it commits (w:"majority"): a primary deposed meanwhile may have shown writes it then
/// rolled back, so it runs again until it commits.
async fn final_reads(client: &Client) -> Vec<elle::Mop> {
    let lists = client.database("jepsen").collection::<Document>("lists");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = async {
            let mut session = client.start_session().await?;
            session.start_transaction().read_concern(ReadConcern::snapshot()).write_concern(WriteConcern::majority()).await?;
            let mut reads = Vec::new();
            for k in 0..LISTS as i64 {
                let d = lists.find_one(doc! {"_id": k}).session(&mut session).await?.expect("every list exists");
                reads.push(elle::Mop::Read(k, Some(d.get_array("l").expect("l").iter().map(|v| v.as_i64().expect("i64")).collect())));
            }
            session.commit_transaction().await?;
            mongodb::error::Result::Ok(reads)
        };
        match attempt.await {
            Ok(reads) => return reads,
            Err(e) => assert!(Instant::now() < deadline, "the final reads did not commit within 60 s: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Check a list-append history, print the report, and fail on any anomaly.
fn report_list_append(history: &[elle::Txn], faults: &str) {
    let count = |o: elle::Outcome| history.iter().filter(|t| t.outcome == o).count();
    let (committed, aborted, unknown) = (count(elle::Outcome::Committed), count(elle::Outcome::Aborted), count(elle::Outcome::Unknown));
    let appends = history.iter().flat_map(|t| &t.ops).filter(|m| matches!(m, elle::Mop::Append(..))).count();
    let t = Instant::now();
    let anomalies = elle::check(history);
    eprintln!(
        "list-append report: {} transactions ({committed} committed, {aborted} aborted, {unknown} unknown; {appends} appends), checked in {:?}; faults: {faults}; anomalies: {}",
        history.len(),
        t.elapsed(),
        anomalies.len()
    );
    for a in anomalies.iter().take(20) {
        eprintln!("  {a}");
    }
    assert!(anomalies.is_empty(), "{} anomalies", anomalies.len());
    assert!(committed > 1, "no transaction committed but the final reads");
}

const LIST_APPEND_SECONDS_DEFAULT: u64 = 20;

/// A sharded cluster under faults: config servers (one member), shards of 3 members, and
/// routers, as real processes.
struct Sharded {
    config: Vec<Server>,
    shards: Vec<Vec<Server>>,
    routers: Vec<Server>,
}

const SHARDS: usize = 2;
const ROUTERS: usize = 2;

async fn start_sharded() -> Sharded {
    let config = start_named_set("cfg", 1).await;
    let mut shards = Vec::new();
    for i in 0..SHARDS {
        shards.push(start_named_set(&format!("shard{i}"), MEMBERS).await);
    }
    let configdb = set_string("cfg", &config);
    let routers: Vec<Server> = (0..ROUTERS).map(|_| Server::start_router(&configdb, &["--setParameter", "enableTestCommands=1"])).collect();
    let client = routers[0].client().await;
    for (i, s) in shards.iter().enumerate() {
        client.database("admin").run_command(doc! {"addShard": set_string(&format!("shard{i}"), s)}).await.expect("addShard");
    }
    Sharded { config, shards, routers }
}

/// The faults a sharded nemesis injected.
#[derive(Default)]
struct ShardedFaults {
    member_kills: u32,
    member_pauses: u32,
    partitions: u32,
    router_kills: u32,
    router_pauses: u32,
    /// Two-phase commits the routers ran (`serverStatus`), counted before each is killed.
    two_phase_commits: i64,
}

impl std::fmt::Display for ShardedFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ShardedFaults { member_kills, member_pauses, partitions, router_kills, router_pauses, two_phase_commits } = self;
        write!(
            f,
            "{member_kills} shard primaries killed, {member_pauses} shard members paused, {partitions} shard primaries isolated, {router_kills} routers killed, {router_pauses} routers paused; {two_phase_commits} two-phase commits"
        )
    }
}

/// Inject faults into a sharded cluster until `until`, one at a time, each healed before the
/// next: a shard's primary killed (-9) or isolated, any shard member paused, a router killed
/// or paused. SHOAL_JEPSEN_FAULT (kill, pause, isolate, router-kill, router-pause) makes
/// every fault that one.
async fn sharded_nemesis(c: &mut Sharded, seed: u64, until: Instant) -> ShardedFaults {
    let only = std::env::var("SHOAL_JEPSEN_FAULT").ok().map(|f| match f.as_str() {
        "kill" => 0,
        "pause" => 1,
        "isolate" => 2,
        "router-kill" => 3,
        "router-pause" => 4,
        other => panic!("SHOAL_JEPSEN_FAULT: unknown fault {other} for a sharded cluster"),
    });
    let mut rng = Rng(seed | 1);
    let mut faults = ShardedFaults::default();
    while Instant::now() + CALM_DURATION + FAULT_DURATION < until {
        tokio::time::sleep(CALM_DURATION).await;
        let shard = rng.below(SHARDS as u64) as usize;
        let members = &mut c.shards[shard];
        let p = wait_for_primary(members).await;
        match only.unwrap_or_else(|| rng.below(5)) {
            0 => {
                members[p].kill9();
                faults.member_kills += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                members[p].restart();
            }
            1 => {
                let m = rng.below(MEMBERS as u64) as usize;
                signal(&members[m], libc::SIGSTOP);
                faults.member_pauses += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                signal(&members[m], libc::SIGCONT);
            }
            2 => {
                fault_links(members, p, Some(doc! {"partition": true})).await;
                faults.partitions += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                fault_links(members, p, None).await;
            }
            3 => {
                // A router dies mid-transaction, perhaps mid-commit: a commit the client
                // retries through the other router follows the coordinator's record, and
                // any router's recovery finishes what it left.
                let r = rng.below(ROUTERS as u64) as usize;
                faults.two_phase_commits += two_phase_commits(&c.routers[r]).await;
                c.routers[r].kill9();
                faults.router_kills += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                c.routers[r].restart();
            }
            _ => {
                let r = rng.below(ROUTERS as u64) as usize;
                signal(&c.routers[r], libc::SIGSTOP);
                faults.router_pauses += 1;
                tokio::time::sleep(FAULT_DURATION).await;
                signal(&c.routers[r], libc::SIGCONT);
            }
        }
    }
    faults
}

/// The two-phase commits a router ran since it started (0 if it does not answer).
async fn two_phase_commits(router: &Server) -> i64 {
    let status = router.client_with("serverSelectionTimeoutMS=2000").await.database("admin").run_command(doc! {"serverStatus": 1}).await;
    status.ok().and_then(|s| path(&s, "transactions.commitTypes.twoPhaseCommit.successful").and_then(Bson::as_i64)).unwrap_or(0)
}

/// Transactions across shards under faults, checked as Elle checks list-append histories:
/// the lists are hash-sharded over two 3-member shards, so transactions read one point
/// across shards (readConcern "snapshot") and commit by two-phase commit when they append on
/// both; clients reach the cluster through two routers while the nemesis kills, pauses and
/// isolates shard members and kills and pauses routers. The history must show none of the
/// anomalies snapshot isolation forbids. SHOAL_LIST_APPEND_SECONDS sets how long the clients
/// run (default 20), SHOAL_JEPSEN_FAULT and SHOAL_JEPSEN_SEED as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_across_shards_keep_snapshot_isolation_through_member_and_router_faults() {
    let seconds: u64 = std::env::var("SHOAL_LIST_APPEND_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(LIST_APPEND_SECONDS_DEFAULT);
    let seed = seed_from_env("SHOAL_JEPSEN_SEED");
    eprintln!("SHOAL_LIST_APPEND_SECONDS={seconds}");
    let mut cluster = start_sharded().await;
    let routers: Vec<String> = cluster.routers.iter().map(host).collect();
    let uri = format!("mongodb://{}/?serverSelectionTimeoutMS=3000&connectTimeoutMS=1000&heartbeatFrequencyMS=500", routers.join(","));
    let until = Instant::now() + Duration::from_secs(seconds);
    let workload = ListAppend::start(&uri, true, seed, until).await;
    let mut faults = sharded_nemesis(&mut cluster, seed, until).await;
    for shard in cluster.shards.iter_mut() {
        wait_for_primary(shard).await;
    }
    let history = workload.finish(&uri).await;
    for r in &cluster.routers {
        faults.two_phase_commits += two_phase_commits(r).await;
    }
    report_list_append(&history, &faults.to_string());
    assert!(faults.two_phase_commits > 0, "no transaction committed on both shards");
    drop(cluster.config);
}
