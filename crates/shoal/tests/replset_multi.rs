//! Replica sets of several real `shoal` processes: elections, replication along a chain,
//! write concern, failover under load with retryable writes, step-down, and partitions and
//! link latency made with the fault layer (configureFailPoint "replLink").

mod common;

use common::*;
use mongodb::bson::{doc, Bson, Document, Timestamp};
use mongodb::options::{ReadPreference, SelectionCriteria};
use mongodb::Client;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Short timeouts so that elections in tests take a second or two, not ten.
const ELECTION_TIMEOUT_MS: i32 = 1000;
const HEARTBEAT_INTERVAL_MS: i32 = 200;

struct Set {
    members: Vec<Server>,
}

fn host(s: &Server) -> String {
    format!("127.0.0.1:{}", s.port)
}

async fn direct(s: &Server) -> Client {
    s.client_with("directConnection=true").await
}

async fn admin(c: &Client, cmd: Document) -> mongodb::error::Result<Document> {
    c.database("admin").run_command(cmd).await
}

impl Set {
    /// Start `n` members and initiate them with `members_extra[i]` merged into member i.
    async fn start(n: usize, settings: Document, members_extra: &[Document]) -> Set {
        Self::start_with_args(n, settings, members_extra, &[]).await
    }

    /// `start`, with `args[i]` added to member i's command line.
    async fn start_with_args(n: usize, settings: Document, members_extra: &[Document], args: &[&[&str]]) -> Set {
        Self::start_with_client_options(n, settings, members_extra, args, "").await
    }

    /// `start_with_args`, for members whose clients need `client_options` (TLS).
    async fn start_with_client_options(n: usize, settings: Document, members_extra: &[Document], args: &[&[&str]], client_options: &str) -> Set {
        let members: Vec<Server> = (0..n)
            .map(|i| {
                let mut a = vec!["--replSet", "rs0", "--setParameter", "enableTestCommands=1"];
                a.extend_from_slice(args.get(i).copied().unwrap_or(&[]));
                let mut s = Server::start_with_args(&a);
                s.client_options = client_options.to_string();
                s
            })
            .collect();
        let mut config_members = Vec::new();
        for (i, m) in members.iter().enumerate() {
            let mut d = doc! {"_id": i as i32, "host": host(m)};
            if let Some(extra) = members_extra.get(i) {
                d.extend(extra.clone());
            }
            config_members.push(Bson::Document(d));
        }
        let mut s = doc! {"electionTimeoutMillis": ELECTION_TIMEOUT_MS, "heartbeatIntervalMillis": HEARTBEAT_INTERVAL_MS};
        s.extend(settings);
        let first = direct(&members[0]).await;
        admin(&first, doc! {"replSetInitiate": {"_id": "rs0", "version": 1, "members": config_members, "settings": s}}).await.unwrap();
        Set { members }
    }

    fn uri(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(host).collect();
        let tls = self.members.first().map(|m| m.client_options.clone()).filter(|o| !o.is_empty()).map(|o| format!("&{o}")).unwrap_or_default();
        format!("mongodb://{}/?replicaSet=rs0&serverSelectionTimeoutMS=30000{tls}", hosts.join(","))
    }

    async fn client(&self) -> Client {
        Client::with_uri_str(self.uri()).await.unwrap()
    }

    /// replSetGetStatus of member `i`, if it answers.
    async fn status(&self, i: usize) -> Option<Document> {
        let c = direct(&self.members[i]).await;
        admin(&c, doc! {"replSetGetStatus": 1}).await.ok()
    }

    /// Wait until some running member (other than `except`) says it is primary; returns its
    /// index. Other members may still be in STARTUP2 (see `wait_for_secondary`).
    async fn wait_for_primary(&mut self, except: Option<usize>) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut primary = None;
            for i in 0..self.members.len() {
                if Some(i) == except || !self.members[i].is_running() {
                    continue;
                }
                if let Some(s) = self.status(i).await {
                    if s.get_i32("myState").unwrap_or(0) == 1 {
                        primary = Some(i);
                    }
                }
            }
            if let Some(p) = primary {
                return p;
            }
            assert!(Instant::now() < deadline, "no primary within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Wait until member `i` says it is SECONDARY, i.e. its initial sync is done and it
    /// serves reads.
    async fn wait_for_secondary(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let state = self.status(i).await.map(|s| s.get_i32("myState").unwrap_or(0));
            if state == Some(2) {
                return;
            }
            assert!(Instant::now() < deadline, "member {i} is not SECONDARY within 30 s: state {state:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn count_on(&self, i: usize, coll: &str) -> u64 {
        self.try_count_on(i, coll).await.unwrap()
    }

    /// Fails while the member serves no reads (STARTUP, ROLLBACK, RECOVERING).
    async fn try_count_on(&self, i: usize, coll: &str) -> mongodb::error::Result<u64> {
        let c = direct(&self.members[i]).await;
        let opts = mongodb::options::CountOptions::builder()
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred { options: None }))
            .build();
        c.database("app").collection::<Document>(coll).count_documents(doc! {}).with_options(opts).await
    }

    /// Wait until member `i` has `want` documents in app.`coll`.
    async fn wait_for_count(&self, i: usize, coll: &str, want: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let n = self.try_count_on(i, coll).await;
            if n.as_ref().is_ok_and(|n| *n == want) {
                return;
            }
            if Instant::now() >= deadline {
                // Say why: a member stuck outside SECONDARY shows its state and initial sync here.
                let c = direct(&self.members[i]).await;
                let status = admin(&c, doc! {"replSetGetStatus": 1, "initialSync": 1}).await;
                panic!("member {i} has {n:?} documents, not {want}; its replSetGetStatus: {status:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Insert `n` documents (_id 0..n) into app.`coll` and wait until every member has them;
    /// returns the collection, through a client of the set.
    async fn seed(&self, coll: &str, n: i32) -> mongodb::Collection<Document> {
        let c = self.client().await.database("app").collection::<Document>(coll);
        for i in 0..n {
            c.insert_one(doc! {"_id": i}).await.unwrap();
        }
        for i in 0..self.members.len() {
            self.wait_for_count(i, coll, n as u64).await;
        }
        c
    }

    /// replSetReconfig on member `primary`: `newcomer` joins as member 3, without a vote
    /// (as rs.add with votes: 0).
    async fn add_non_voter(&self, primary: usize, newcomer: &Server) {
        let primary = direct(&self.members[primary]).await;
        let mut config = admin(&primary, doc! {"replSetGetConfig": 1}).await.unwrap().get_document("config").unwrap().clone();
        let mut members = config.get_array("members").unwrap().clone();
        members.push(Bson::Document(doc! {"_id": 3, "host": host(newcomer), "votes": 0, "priority": 0}));
        config.insert("members", members);
        config.insert("version", config.get_i32("version").unwrap() + 1);
        admin(&primary, doc! {"replSetReconfig": config}).await.unwrap();
    }

    /// Member `i` killed and started again with an empty data directory: it joins again by
    /// initial sync.
    fn start_over_empty(&mut self, i: usize) {
        self.members[i].kill9();
        std::fs::remove_dir_all(&self.members[i].dbpath).unwrap();
        std::fs::create_dir_all(&self.members[i].dbpath).unwrap();
        self.members[i].restart_with_args(&["--replSet", "rs0", "--setParameter", "enableTestCommands=1"]);
    }

    async fn fail_point(&self, i: usize, mode: &str, data: Document) {
        let c = direct(&self.members[i]).await;
        admin(&c, doc! {"configureFailPoint": "replLink", "mode": mode, "data": data}).await.unwrap();
    }
}

/// Inserts into app.bg without pause until stopped: keeps secondaries moving ahead of a
/// member choosing its sync source (a candidate must be strictly ahead of it).
struct BackgroundWriter {
    writing: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl BackgroundWriter {
    fn start(client: &Client) -> BackgroundWriter {
        let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (w, bg) = (writing.clone(), client.database("app").collection::<Document>("bg"));
        let task = tokio::spawn(async move {
            while w.load(std::sync::atomic::Ordering::Relaxed) {
                bg.insert_one(doc! {}).await.unwrap();
            }
        });
        BackgroundWriter { writing, task }
    }

    async fn stop(self) {
        self.writing.store(false, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap();
    }
}

fn member(status: &Document, i: usize) -> &Document {
    status.get_array("members").unwrap()[i].as_document().unwrap()
}

#[tokio::test]
async fn three_members_elect_a_primary_replicate_and_honour_write_concern() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    assert_eq!(p, 0, "the initiator stands first");
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("c");
    for i in 0..50 {
        coll.insert_one(doc! {"_id": i, "x": "y"}).await.unwrap();
    }
    // w:"majority" (the default) returned, so a majority has them; then all three do.
    for i in 0..3 {
        set.wait_for_count(i, "c", 50).await;
    }
    // The collection has one UUID across the set (secondaries create it with the UUID in
    // the primary's oplog entry).
    let uuid_on = |i: usize| collection_uuid(&set.members[i], "app", "c");
    let want = uuid_on(0).await;
    for i in 1..3 {
        assert_eq!(uuid_on(i).await, want, "member {i}");
    }
    let status = set.status(0).await.unwrap();
    assert_eq!(status.get_i32("majorityVoteCount").unwrap(), 2);
    let committed = path(&status, "optimes.lastCommittedOpTime").unwrap().clone();
    assert_eq!(committed, Bson::Document(path(&status, "optimes.appliedOpTime").unwrap().as_document().unwrap().clone()), "everything is committed");
    for i in 1..3 {
        let s = set.status(i).await.unwrap();
        assert_eq!(s.get_i32("myState").unwrap(), 2);
        assert!(!s.get_str("syncSourceHost").unwrap().is_empty(), "a secondary has a sync source");
        // Each member's own oplog holds the same entries as the primary's, once it has
        // logged the batch whose documents it applied.
        let oplog_count = |m: usize| {
            let c = &set.members[m];
            async move { direct(c).await.database("local").collection::<Document>("oplog.rs").count_documents(doc! {}).await.unwrap() }
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (theirs, ours) = (oplog_count(i).await, oplog_count(0).await);
            if theirs == ours {
                break;
            }
            assert!(Instant::now() < deadline, "member {i} logs {theirs} entries, the primary {ours}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let db = client.database("app");
    // An acknowledged write is in the primary's journal (j defaults to true): a sync that
    // began after the write was logged ended before its reply. (It may be shared with a
    // sync something else asked for, so syncs are counted per write, not in total.)
    let syncs =
        || async { path(&admin(&direct(&set.members[0]).await, doc! {"serverStatus": 1}).await.unwrap(), "journal.syncs").and_then(|v| v.as_i64()).unwrap() };
    const WRITES: i64 = 20;
    // Sent to member 0 itself: the syncs counted are those of the member that acknowledged.
    // With a 1 s election timeout a loaded machine may elect another primary meanwhile (a
    // replica-set client then writes there; seen once in CI); member 0 then refuses, and
    // the count stops there.
    let app0 = direct(&set.members[0]).await.database("app");
    for i in 0..WRITES {
        let before = syncs().await;
        match app0.run_command(doc! {"insert": "c", "documents": [{"_id": 200 + i}], "writeConcern": {"w": 1}}).await {
            Ok(_) => {}
            Err(e) if e.to_string().contains("NotWritablePrimary") => break,
            Err(e) => panic!("w:1 write {i}: {e}"),
        }
        let after = syncs().await;
        assert!(after > before, "w:1 write {i} was acknowledged without a sync on the primary ({before} syncs before, {after} after)");
    }
    // With the primary's journal slower than replication, a secondary has each write applied
    // before the primary's sync ends: w:1 still waits for the primary's own journal (seen
    // failing in CI before the fix: a secondary's applied optime met w:1).
    admin(&direct(&set.members[0]).await, doc! {"configureFailPoint": "journalFlushDelay", "mode": "alwaysOn", "data": {"delayMs": 200}}).await.unwrap();
    for i in 0..3 {
        let before = syncs().await;
        match app0.run_command(doc! {"insert": "slow", "documents": [{"_id": i}], "writeConcern": {"w": 1}}).await {
            Ok(_) => {}
            Err(e) if e.to_string().contains("NotWritablePrimary") => break,
            Err(e) => panic!("w:1 write {i} with a slow journal: {e}"),
        }
        let after = syncs().await;
        assert!(after > before, "w:1 write {i} was acknowledged before the primary's slow sync ended ({before} syncs before, {after} after)");
    }
    admin(&direct(&set.members[0]).await, doc! {"configureFailPoint": "journalFlushDelay", "mode": "off"}).await.unwrap();
    let before = syncs().await;
    for i in 0..WRITES {
        db.run_command(doc! {"insert": "c", "documents": [{"_id": 300 + i}], "writeConcern": {"w": 1, "j": false}}).await.unwrap();
    }
    let unjournaled = syncs().await - before;
    assert!(unjournaled < WRITES, "j:false writes take no sync of their own: {unjournaled} syncs for {WRITES} writes");
    // A secondary reports each applied batch on its next getMore: majority writes take no
    // replSetUpdatePosition each (two per write if both secondaries sent one).
    // (The count also holds heartbeats, driver monitoring and the second serverStatus.)
    let primary = direct(&set.members[0]).await;
    let metric = |status: &Document, p: &str| path(status, p).and_then(|v| v.as_i64()).unwrap_or_else(|| panic!("serverStatus has no {p}"));
    let secondary = direct(&set.members[1]).await;
    let (p0, s0) = (admin(&primary, doc! {"serverStatus": 1}).await.unwrap(), admin(&secondary, doc! {"serverStatus": 1}).await.unwrap());
    for i in 0..WRITES {
        db.run_command(doc! {"insert": "c", "documents": [{"_id": 400 + i}], "writeConcern": {"w": "majority"}}).await.unwrap();
    }
    let (p1, s1) = (admin(&primary, doc! {"serverStatus": 1}).await.unwrap(), admin(&secondary, doc! {"serverStatus": 1}).await.unwrap());
    let commands = metric(&p1, "opcounters.command") - metric(&p0, "opcounters.command");
    assert!(commands < WRITES, "{commands} commands on the primary during {WRITES} majority writes");
    // mongod's replication metrics: each write waited for the others once
    // (metrics.getLastError.wtime); the secondary applies at least the writes' entries, in
    // batches it fetched with getMores. It acknowledges a batch once durable in its oplog
    // and applies it after (as mongod 8.0), so the last batch may still be applying.
    let delta = |a: &Document, b: &Document, p: &str| metric(b, p) - metric(a, p);
    assert_eq!(delta(&p0, &p1, "metrics.getLastError.wtime.num"), WRITES);
    assert_eq!(delta(&p0, &p1, "metrics.getLastError.wtimeouts"), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s1 = s1;
    while delta(&s0, &s1, "metrics.repl.apply.ops") < WRITES {
        assert!(Instant::now() < deadline, "{s1:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        s1 = admin(&secondary, doc! {"serverStatus": 1}).await.unwrap();
    }
    assert!((1..=delta(&s0, &s1, "metrics.repl.apply.ops")).contains(&delta(&s0, &s1, "metrics.repl.apply.batches.num")));
    assert!(delta(&s0, &s1, "metrics.repl.network.getmores.num") >= 1);
    assert!(metric(&s1, "journal.syncMillis") >= 0 && metric(&s1, "journal.syncs") > 0);
    // w:3 waits for all three.
    let r = db.run_command(doc! {"insert": "c", "documents": [{"_id": 100}], "writeConcern": {"w": 3, "wtimeout": 10000}}).await.unwrap();
    assert!(r.get("writeConcernError").is_none(), "{r:?}");
    // More members than the set has: refused at once, beside the applied write.
    let r = db.run_command(doc! {"insert": "c", "documents": [{"_id": 101}], "writeConcern": {"w": 4}}).await.unwrap();
    assert_eq!(path(&r, "writeConcernError.code"), Some(&Bson::Int32(100)));
    // With one secondary gone, w:3 times out (code 64, errInfo.wtimeout) and majority works.
    set.members[2].kill9();
    let r = db.run_command(doc! {"insert": "c", "documents": [{"_id": 102}], "writeConcern": {"w": 3, "wtimeout": 300}}).await.unwrap();
    assert_eq!(r.get_i32("n").unwrap(), 1, "the write itself is applied: {r:?}");
    assert_eq!(path(&r, "writeConcernError.code"), Some(&Bson::Int32(64)), "{r:?}");
    assert_eq!(path(&r, "writeConcernError.errInfo.wtimeout"), Some(&Bson::Boolean(true)));
    let p2 = admin(&primary, doc! {"serverStatus": 1}).await.unwrap();
    assert_eq!(delta(&p1, &p2, "metrics.getLastError.wtimeouts"), 1, "the timed-out wait is counted");
    assert!(delta(&p1, &p2, "metrics.getLastError.wtime.totalMillis") >= 300, "{p2:?}");
    let r = db.run_command(doc! {"insert": "c", "documents": [{"_id": 103}], "writeConcern": {"w": "majority", "wtimeout": 10000}}).await.unwrap();
    assert!(r.get("writeConcernError").is_none(), "{r:?}");
    // A secondary refuses writes and serves reads that allow it.
    let sec = direct(&set.members[1]).await;
    assert_code_name(sec.database("app").run_command(doc! {"insert": "c", "documents": [{"_id": 1000}]}).await, 10107, "NotWritablePrimary");
    // The restarted member catches up from where its oplog ends.
    set.members[2].restart();
    set.wait_for_count(2, "c", 54 + 3 * WRITES as u64).await;

    // The progress a getMore carries counts as replSetUpdatePosition's would: here a
    // position far ahead for member 1, which the primary then reports.
    let p = direct(&set.members[0]).await;
    let local = p.database("local");
    let r = local
        .run_command(doc! {"find": "oplog.rs", "filter": {"ts": {"$gte": Timestamp { time: 0, increment: 0 }}}, "tailable": true, "batchSize": 1})
        .await
        .unwrap();
    let id = path(&r, "cursor.id").and_then(|v| v.as_i64()).unwrap();
    let term = path(&set.status(0).await.unwrap(), "term").and_then(|v| v.as_i64()).unwrap();
    let ahead = doc! {"ts": Timestamp { time: 4_000_000_000, increment: 1 }, "t": term};
    let progress = vec![doc! {"memberId": 1, "cfgver": 1, "appliedOpTime": ahead.clone(), "durableOpTime": ahead.clone()}];
    assert_code(local.run_command(doc! {"getMore": id, "collection": "oplog.rs", "batchSize": 1, "$replProgress": 1}).await, 14);
    let r = local.run_command(doc! {"getMore": id, "collection": "oplog.rs", "batchSize": 1, "$replProgress": progress}).await;
    assert!(r.is_ok(), "{r:?}");
    let status = set.status(0).await.unwrap();
    assert_eq!(path(member(&status, 1), "optimeDurable.ts"), Some(&Bson::Timestamp(Timestamp { time: 4_000_000_000, increment: 1 })), "{status:?}");
}

#[tokio::test]
async fn failover_under_load_keeps_every_acknowledged_write_exactly_once() {
    failover_under_load("pull").await;
}

#[tokio::test]
async fn failover_under_load_with_pushed_oplogs_keeps_every_acknowledged_write_exactly_once() {
    failover_under_load("push").await;
}

#[tokio::test]
async fn failover_under_load_with_oplogs_in_shared_memory_keeps_every_acknowledged_write_exactly_once() {
    failover_under_load("shm").await;
}

/// Kill the primary of a 3-member set whose members get the oplog by `transport` while a
/// client inserts with retryable writes; every acknowledged insert is on the new primary, once.
async fn failover_under_load(transport: &str) {
    let args: &[&str] = &["--logTransport", transport];
    let mut set = Set::start_with_args(3, doc! {}, &[], &[args, args, args]).await;
    let p = set.wait_for_primary(None).await;
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("load");
    let writer = {
        let coll = coll.clone();
        tokio::spawn(async move {
            // Retryable writes (the driver's default): a write interrupted by the failover
            // is retried once on the new primary and must not fail as a duplicate.
            let mut acknowledged = Vec::new();
            let started = Instant::now();
            let mut i = 0i64;
            while started.elapsed() < Duration::from_secs(6) {
                coll.insert_one(doc! {"_id": i, "pad": "p".repeat(100)}).await.unwrap_or_else(|e| panic!("insert {i} failed: {e}"));
                acknowledged.push(i);
                i += 1;
            }
            acknowledged
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set.members[p].kill9();
    let acknowledged = writer.await.unwrap();
    let new_primary = set.wait_for_primary(Some(p)).await;
    assert_ne!(new_primary, p);
    let c = direct(&set.members[new_primary]).await;
    let coll = c.database("app").collection::<Document>("load");
    let n = coll.count_documents(doc! {}).await.unwrap();
    assert_eq!(n, acknowledged.len() as u64, "every acknowledged insert, once");
    let max = coll.find_one(doc! {}).sort(doc! {"_id": -1}).await.unwrap().unwrap();
    assert_eq!(max.get_i64("_id").unwrap(), *acknowledged.last().unwrap());
    let status = set.status(new_primary).await.unwrap();
    assert!(status.get_i64("term").unwrap() >= 2);
    assert_eq!(member(&status, p).get_str("stateStr").unwrap(), "(not reachable/healthy)");
}

#[tokio::test]
async fn step_down_hands_over_and_freeze_is_for_secondaries() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let c = direct(&set.members[p]).await;
    assert_code_name(admin(&c, doc! {"replSetFreeze": 10}).await, 95, "NotSecondary");
    admin(&c, doc! {"replSetStepDown": 30, "secondaryCatchUpPeriodSecs": 5}).await.unwrap();
    let next = set.wait_for_primary(Some(p)).await;
    assert_ne!(next, p);
    // The old primary is frozen: it does not stand again while the new one runs.
    let s = set.status(p).await.unwrap();
    assert_eq!(s.get_i32("myState").unwrap(), 2);
    let s = set.status(next).await.unwrap();
    assert!(s.get_i64("term").unwrap() >= 2);
    // Not primary any more: stepping down again is refused.
    assert_code_name(admin(&c, doc! {"replSetStepDown": 30}).await, 10107, "NotWritablePrimary");
    // replSetStepUp asks for an election at once, frozen or not, and wins it. The same
    // client goes on at once: the NotWritablePrimary above carried the topologyVersion its
    // monitor had already seen, so the driver did not mark the server unknown (without it,
    // the Rust driver waited out its monitor's 10 s awaitable hello first).
    tokio::time::timeout(Duration::from_secs(5), admin(&c, doc! {"replSetStepUp": 1})).await.expect("the driver stalled after NotWritablePrimary").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while set.status(next).await.unwrap().get_i32("myState").unwrap() == 1 {
        assert!(Instant::now() < deadline, "the old primary did not step down for the higher term");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(set.wait_for_primary(None).await, p);
    // replSetSyncFrom points a secondary at another member.
    let other = (0..3).find(|&i| i != p && i != next).unwrap();
    let sec = direct(&set.members[other]).await;
    let r = admin(&sec, doc! {"replSetSyncFrom": host(&set.members[next])}).await.unwrap();
    assert_eq!(r.get_str("syncFromRequested").unwrap(), host(&set.members[next]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while set.status(other).await.unwrap().get_str("syncSourceHost").unwrap() != host(&set.members[next]) {
        assert!(Instant::now() < deadline, "replSetSyncFrom was not followed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_code(admin(&sec, doc! {"replSetSyncFrom": host(&set.members[other])}).await, 72);
    assert_code_name(admin(&sec, doc! {"replSetSyncFrom": "127.0.0.1:1"}).await, 74, "NodeNotFound");
}

#[tokio::test]
async fn a_partitioned_primary_steps_down_and_the_majority_elects_another() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let old = host(&set.members[p]);
    // Cut the primary off in both directions.
    set.fail_point(p, "alwaysOn", doc! {"host": "*", "partition": true}).await;
    for i in (0..3).filter(|&i| i != p) {
        set.fail_point(i, "alwaysOn", doc! {"host": old.clone(), "partition": true}).await;
    }
    // Until it notices, the old primary still takes w:1 writes that no other member gets.
    let old_client = direct(&set.members[p]).await;
    let lost = old_client.database("app").run_command(doc! {"insert": "lost", "documents": [{"_id": "w1"}], "writeConcern": {"w": 1}}).await.unwrap();
    assert_eq!(lost.get_i32("n").unwrap(), 1, "{lost:?}");
    let next = set.wait_for_primary(Some(p)).await;
    // The old primary has noticed it lost the majority.
    let deadline = Instant::now() + Duration::from_secs(10);
    while set.status(p).await.unwrap().get_i32("myState").unwrap() == 1 {
        assert!(Instant::now() < deadline, "the partitioned primary did not step down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Heal: it rejoins as a secondary of the new primary and gets the new writes.
    for i in 0..3 {
        set.fail_point(i, "off", doc! {"host": if i == p { "*".to_string() } else { old.clone() }}).await;
    }
    let client = set.client().await;
    client.database("app").collection::<Document>("after").insert_one(doc! {"_id": 1}).await.unwrap();
    set.wait_for_count(p, "after", 1).await;
    assert_eq!(set.wait_for_primary(None).await, next);
    // Its unreplicated write was rolled back, and kept in a rollback file as mongod keeps it.
    assert_eq!(set.count_on(p, "lost").await, 0);
    let dir = set.members[p].dbpath.join("rollback").join("app.lost");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).collect();
    assert_eq!(files.len(), 1);
    let bytes = std::fs::read(files[0].as_ref().unwrap().path()).unwrap();
    assert_eq!(Document::from_reader(&mut bytes.as_slice()).unwrap(), doc! {"_id": "w1"});
    let s = set.status(p).await.unwrap();
    assert_eq!(s.get_i32("myState").unwrap(), 2);
}

#[tokio::test]
async fn chaining_follows_the_closest_member_and_can_be_turned_off() {
    // Member 2 is 25 ms from the primary (each way) and near member 1: it chains from 1.
    // (The delay applies to the links a member opens, so it is set on member 2.)
    let mut set = Set::start(3, doc! {}, &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}]).await;
    let p = set.wait_for_primary(None).await;
    assert_eq!(p, 0);
    set.fail_point(2, "alwaysOn", doc! {"host": host(&set.members[0]), "delayMs": 25}).await;
    // And member 1 is far from member 2, so it never chains from 2 (which would forbid the
    // reverse: a member does not fetch from one that fetches from it).
    set.fail_point(1, "alwaysOn", doc! {"host": host(&set.members[2]), "delayMs": 25}).await;
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("c");
    let want = host(&set.members[1]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    // A secondary is a candidate only when strictly ahead of member 2 (what keeps chains
    // acyclic), so keep writing until the end: member 1, nearer the primary, is then ahead
    // whenever member 2 looks, not only in the moments after a write.
    let writer = BackgroundWriter::start(&client);
    loop {
        coll.insert_one(doc! {"_id": n as i64}).await.unwrap();
        n += 1;
        let s = set.status(2).await.unwrap();
        if s.get_str("syncSourceHost").unwrap() == want {
            break;
        }
        assert!(Instant::now() < deadline, "member 2 syncs from {:?}, not {want}", s.get_str("syncSourceHost"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    set.wait_for_count(2, "c", n).await;
    // The primary sees the chain in its heartbeats.
    let s = set.status(0).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = member(&s, 2).get_str("syncSourceHost").unwrap().to_string();
    while seen != want {
        assert!(Instant::now() < deadline, "the primary reports member 2 syncing from {seen}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = member(&set.status(0).await.unwrap(), 2).get_str("syncSourceHost").unwrap().to_string();
    }
    writer.stop().await;
}

#[tokio::test]
async fn without_chaining_every_member_fetches_from_the_primary() {
    let mut set = Set::start(3, doc! {"chainingAllowed": false}, &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}]).await;
    let p = set.wait_for_primary(None).await;
    // Even when the primary is far, member 2 does not chain.
    set.fail_point(2, "alwaysOn", doc! {"host": host(&set.members[p]), "delayMs": 25}).await;
    let client = set.client().await;
    for i in 0..20 {
        client.database("app").collection::<Document>("c").insert_one(doc! {"_id": i}).await.unwrap();
    }
    set.wait_for_count(2, "c", 20).await;
    tokio::time::sleep(Duration::from_millis(3 * HEARTBEAT_INTERVAL_MS as u64)).await;
    for i in 1..3 {
        assert_eq!(set.status(i).await.unwrap().get_str("syncSourceHost").unwrap(), host(&set.members[p]));
    }
}

#[tokio::test]
async fn auto_chaining_keeps_voters_on_the_primary_and_chains_the_others() {
    // One host: every member within 5 ms of every other, where chaining "on" would send
    // all of them to the primary. Under "auto" the voters do go to the primary and the
    // member without a vote fetches from a secondary.
    let mut set =
        Set::start(4, doc! {"chainingAllowed": "auto"}, &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}, doc! {"priority": 0, "votes": 0}]).await;
    let p = set.wait_for_primary(None).await;
    assert_eq!(p, 0);
    let config = admin(&direct(&set.members[0]).await, doc! {"replSetGetConfig": 1}).await.unwrap();
    assert_eq!(config.get_document("config").unwrap().get_document("settings").unwrap().get_str("chainingAllowed").unwrap(), "auto");
    let client = set.client().await;
    // A secondary is a candidate only when strictly ahead of member 3: keep writing.
    let writer = BackgroundWriter::start(&client);
    let primary = host(&set.members[0]);
    let secondaries = [host(&set.members[1]), host(&set.members[2])];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let source = set.status(3).await.unwrap().get_str("syncSourceHost").unwrap().to_string();
        if secondaries.contains(&source) {
            break;
        }
        assert!(Instant::now() < deadline, "member 3 syncs from {source:?}, not a secondary");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The voters settle on the primary (while no primary was up they fetched from each
    // other, and a member between two sources shows none for a moment).
    for i in 1..3 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let source = set.status(i).await.unwrap().get_str("syncSourceHost").unwrap().to_string();
            if source == primary {
                break;
            }
            assert!(Instant::now() < deadline, "voter {i} syncs from {source:?}, not the primary");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    writer.stop().await;
    let coll = client.database("app").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    set.wait_for_count(3, "c", 1).await;
}

fn w1() -> mongodb::options::WriteConcern {
    mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(1)).build()
}

/// Member 2 of a fresh 3-member set whose links to the primary are slow (25 ms each way),
/// so that its plain reads trail the primary.
/// With `strict_by_default`, member 2 runs with --strictConsistency.
async fn set_with_a_slow_secondary(strict_by_default: bool) -> Set {
    let members = [doc! {}, doc! {"priority": 0}, doc! {"priority": 0}];
    let member_2: &[&str] = if strict_by_default { &["--strictConsistency"] } else { &[] };
    let mut set = Set::start_with_args(3, doc! {"chainingAllowed": false}, &members, &[&[], &[], member_2]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    // The tests read on member 2 at once: a member still in initial sync would refuse.
    set.wait_for_secondary(2).await;
    set.fail_point(2, "alwaysOn", doc! {"host": host(&set.members[0]), "delayMs": 25}).await;
    set
}

#[tokio::test]
async fn strict_reads_on_a_secondary_see_every_acknowledged_write() {
    // Member 2 reads strictly by default (a read that names "local" still gets local).
    let set = set_with_a_slow_secondary(true).await;
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("c");
    let secondary = direct(&set.members[2]).await;
    let db = secondary.database("app");
    let find = |id: i32, level: &str| doc! {"find": "c", "filter": {"_id": id}, "readConcern": {"level": level}, "$readPreference": {"mode": "secondary"}};
    let found = |r: &Document| !r.get_document("cursor").unwrap().get_array("firstBatch").unwrap().is_empty();
    let (mut stale_local, mut stale_strict, mut stale_default) = (0, 0, 0);
    let find_default = |id: i32| doc! {"find": "c", "filter": {"_id": id}, "$readPreference": {"mode": "secondary"}};
    for i in 0..20 {
        coll.insert_one(doc! {"_id": i}).write_concern(w1()).await.unwrap();
        // A plain read right after the w:1 acknowledgement usually misses the write ...
        if !found(&db.run_command(find(i, "local")).await.unwrap()) {
            stale_local += 1;
        }
        // ... a strict one never does, nor one without a read concern on a member started
        // with --strictConsistency.
        if !found(&db.run_command(find(i, "strict")).await.unwrap()) {
            stale_strict += 1;
        }
        coll.update_one(doc! {"_id": i}, doc! {"$set": {"seen": true}}).write_concern(w1()).await.unwrap();
        if db
            .run_command(find_default(i))
            .await
            .unwrap()
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap()
            .first()
            .and_then(|d| d.as_document())
            .is_none_or(|d| !d.contains_key("seen"))
        {
            stale_default += 1;
        }
    }
    assert_eq!(stale_default, 0, "reads on a --strictConsistency member returned stale data");
    assert!(stale_local > 0, "the slow secondary was never behind: the test shows nothing");
    assert_eq!(stale_strict, 0, "strict reads returned stale data");
    let status = admin(&secondary, doc! {"serverStatus": 1}).await.unwrap();
    let waits = status.get_document("metrics").unwrap().get_document("repl").unwrap().get_document("readWaits").unwrap();
    assert!(waits.get_i64("num").unwrap() >= 40 && waits.get_i64("primaryAsks").unwrap() >= 1, "{waits}");
    // On one host, after the first ask, the secondary reads the primary's position page.
    assert!(waits.get_i64("positionPageReads").unwrap() >= 1, "{waits}");
    // Lag and transport metrics: the secondary counts what it fetched, the primary how long
    // entries took to reach it, and how far each member trails.
    let network = status.get_document("metrics").unwrap().get_document("repl").unwrap().get_document("network").unwrap();
    assert!(network.get_i64("ops").unwrap() >= 20 && network.get_i64("bytes").unwrap() > 20 * 20, "{network}");
    let primary = direct(&set.members[0]).await;
    let lag = admin(&primary, doc! {"serverStatus": 1})
        .await
        .unwrap()
        .get_document("metrics")
        .unwrap()
        .get_document("repl")
        .unwrap()
        .get_document("lag")
        .unwrap()
        .clone();
    assert!(lag.get_i64("samples").unwrap() >= 1, "{lag}");
    // Each write took at least the slow link's 25 ms one way to arrive there.
    assert!(lag.get_i64("maxMicros").unwrap() >= 25_000, "{lag}");
    let st = admin(&primary, doc! {"replSetGetStatus": 1}).await.unwrap();
    let m2 = member(&st, 2);
    assert!(m2.get_i64("lagEntries").is_ok() && m2.get_f64("lagMillis").is_ok() && m2.get_f64("durableLagMillis").is_ok(), "{m2}");
    // Bad read concerns are refused as mongod refuses them.
    let e = db.run_command(doc! {"find": "c", "readConcern": {"afterClusterTime": 5}, "$readPreference": {"mode": "secondary"}}).await.unwrap_err();
    assert!(matches!(*e.kind, mongodb::error::ErrorKind::Command(ref c) if c.code == 14), "{e}");
    let far = Timestamp { time: u32::MAX, increment: 1 };
    let e = db.run_command(doc! {"find": "c", "readConcern": {"afterClusterTime": far}, "$readPreference": {"mode": "secondary"}}).await.unwrap_err();
    assert!(matches!(*e.kind, mongodb::error::ErrorKind::Command(ref c) if c.code == 72), "{e}");
}

#[tokio::test]
async fn causally_consistent_sessions_read_their_writes_on_a_secondary() {
    let set = set_with_a_slow_secondary(false).await;
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("c");
    // Only member 2 serves the reads.
    let to_member_2 = SelectionCriteria::Predicate(Arc::new({
        let h = host(&set.members[2]);
        move |s: &mongodb::ServerInfo| s.address().to_string() == h
    }));
    let mut session = client.start_session().causal_consistency(true).await.unwrap();
    for i in 0..10 {
        coll.insert_one(doc! {"_id": i}).write_concern(w1()).session(&mut session).await.unwrap();
        assert!(session.operation_time().is_some(), "replies carry operationTime");
        let got = coll.find_one(doc! {"_id": i}).selection_criteria(to_member_2.clone()).session(&mut session).await.unwrap();
        assert_eq!(got, Some(doc! {"_id": i}), "read {i} on the secondary missed the session's own write");
    }
    let secondary = direct(&set.members[2]).await;
    let status = admin(&secondary, doc! {"serverStatus": 1}).await.unwrap();
    let waits = status.get_document("metrics").unwrap().get_document("repl").unwrap().get_document("readWaits").unwrap();
    assert!(waits.get_i64("num").unwrap() >= 1, "no read waited: {waits}");
}

/// Every member's oplog from the first entry, in order.
async fn oplog_of(s: &Server) -> Vec<Document> {
    let c = direct(s).await;
    let mut cursor = c.database("local").collection::<Document>("oplog.rs").find(doc! {}).sort(doc! {"$natural": 1}).await.unwrap();
    let mut out = Vec::new();
    while cursor.advance().await.unwrap() {
        out.push(cursor.deserialize_current().unwrap());
    }
    out
}

#[tokio::test]
async fn pull_push_and_shm_deliver_the_same_oplog_under_faults() {
    // Member 1 pulls, member 2 has the oplog pushed over TCP, member 3 through shared memory;
    // every link loses and delays messages.
    let mut set = Set::start_with_args(
        4,
        doc! {"chainingAllowed": false},
        &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}, doc! {"priority": 0, "votes": 0}],
        &[&[], &["--logTransport", "pull"], &["--logTransport", "push"], &["--logTransport", "shm"]],
    )
    .await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    // Every member done with its initial sync before the workload: then each one's oplog
    // holds all of the workload's entries.
    for i in 1..4 {
        set.wait_for_secondary(i).await;
    }
    for i in 1..4 {
        set.fail_point(i, "alwaysOn", doc! {"host": host(&set.members[0]), "delayMs": 2, "lossPercent": 3}).await;
    }
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("c");
    for round in 0..20i64 {
        let docs: Vec<Document> = (0..100i64).map(|i| doc! {"_id": round * 100 + i, "v": 0i64, "pad": "x".repeat(200)}).collect();
        coll.insert_many(docs).write_concern(w1()).await.unwrap();
        coll.update_many(doc! {"_id": {"$lt": round * 100 + 50}}, doc! {"$inc": {"v": 1i64}}).write_concern(w1()).await.unwrap();
        coll.delete_one(doc! {"_id": round * 100 + 99}).write_concern(w1()).await.unwrap();
    }
    for i in 1..4 {
        set.fail_point(i, "off", doc! {"host": host(&set.members[0])}).await;
    }
    coll.insert_one(doc! {"_id": "last"}).await.unwrap();
    for i in 1..4 {
        set.wait_for_count(i, "c", 20 * 99 + 1).await;
    }
    let want = oplog_of(&set.members[0]).await;
    assert!(want.len() > 20 * 150, "{} entries", want.len());
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 1..4 {
        loop {
            let got = oplog_of(&set.members[i]).await;
            // A member's oplog starts where its initial sync began, before any write of the
            // workload: from there on it is the primary's.
            let first = got.first().map(|e| e.get_timestamp("ts").unwrap());
            let from = want.iter().position(|e| Some(e.get_timestamp("ts").unwrap()) == first).unwrap_or(usize::MAX);
            let first_write = want.iter().position(|e| e.get_str("ns").ok() == Some("app.c")).unwrap();
            if from <= first_write && got[..] == want[from..] {
                break;
            }
            if Instant::now() >= deadline {
                let want = &want[from.min(want.len())..];
                let first_diff = got.iter().zip(want.iter()).position(|(a, b)| a != b);
                panic!(
                    "member {i}'s oplog differs from the primary's: {} entries against {}; first difference at {first_diff:?}: {:?} against {:?}; last {:?} against {:?}",
                    got.len(),
                    want.len(),
                    first_diff.map(|d| &got[d]),
                    first_diff.map(|d| &want[d]),
                    got.last(),
                    want.last()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // And the data agrees.
    let all = |i: usize| {
        let s = &set.members[i];
        async move {
            let c = direct(s).await;
            let mut cursor = c
                .database("app")
                .collection::<Document>("c")
                .find(doc! {})
                .sort(doc! {"_id": 1})
                .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred { options: None }))
                .await
                .unwrap();
            let mut out = Vec::new();
            while cursor.advance().await.unwrap() {
                out.push(cursor.deserialize_current().unwrap());
            }
            out
        }
    };
    let primary_docs = all(0).await;
    for i in 1..4 {
        assert_eq!(all(i).await, primary_docs, "member {i}'s data");
    }
    // Each transport did the work: member 1 asked for batches, members 2 and 3 were sent
    // them, member 3's through a ring.
    let network = |d: Document| d.get_document("metrics").unwrap().get_document("repl").unwrap().get_document("network").unwrap().clone();
    let n1 = network(admin(&direct(&set.members[1]).await, doc! {"serverStatus": 1}).await.unwrap());
    let n2 = network(admin(&direct(&set.members[2]).await, doc! {"serverStatus": 1}).await.unwrap());
    let n3 = network(admin(&direct(&set.members[3]).await, doc! {"serverStatus": 1}).await.unwrap());
    assert!(n1.get_document("getmores").unwrap().get_i64("num").unwrap() > 0 && n1.get_i64("streamBatches").unwrap() == 0, "{n1}");
    assert!(n2.get_i64("streamBatches").unwrap() > 0 && n2.get_i64("ringBatches").unwrap() == 0, "{n2}");
    assert!(n3.get_i64("ringBatches").unwrap() > 0, "{n3}");
}

#[tokio::test]
async fn reconfig_adds_a_member_that_catches_up_and_removes_it_again() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("c");
    for i in 0..200 {
        coll.insert_one(doc! {"_id": i}).await.unwrap();
    }
    let primary = direct(&set.members[p]).await;
    let mut config = admin(&primary, doc! {"replSetGetConfig": 1}).await.unwrap().get_document("config").unwrap().clone();
    let version = config.get_i32("version").unwrap();
    // Two voters at once, or the same version: refused as mongod refuses them.
    let mut two = config.clone();
    let mut members = two.get_array("members").unwrap().clone();
    members.push(Bson::Document(doc! {"_id": 3, "host": "127.0.0.1:1"}));
    members.push(Bson::Document(doc! {"_id": 4, "host": "127.0.0.1:2"}));
    two.insert("members", members);
    two.insert("version", version + 1);
    assert_code_name(admin(&primary, doc! {"replSetReconfig": two}).await, 103, "NewReplicaSetConfigurationIncompatible");
    assert_code_name(admin(&primary, doc! {"replSetReconfig": config.clone()}).await, 103, "NewReplicaSetConfigurationIncompatible");
    // A new, empty member (a non-voter, as rs.add with votes: 0) joins and replays the oplog
    // while writes continue.
    let newcomer = Server::start_with_args(&["--replSet", "rs0"]);
    let mut members = config.get_array("members").unwrap().clone();
    members.push(Bson::Document(doc! {"_id": 3, "host": host(&newcomer), "votes": 0, "priority": 0}));
    config.insert("members", members);
    config.insert("version", version + 1);
    admin(&primary, doc! {"replSetReconfig": config.clone()}).await.unwrap();
    for i in 200..300 {
        coll.insert_one(doc! {"_id": i}).await.unwrap();
    }
    set.members.push(newcomer);
    set.wait_for_count(3, "c", 300).await;
    let s = set.status(3).await.unwrap();
    assert_eq!(s.get_i32("myState").unwrap(), 2);
    assert_eq!(path(&s, "members.3.self"), None, "members is an array");
    // Every member sees version + 1.
    for i in 0..4 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let c = direct(&set.members[i]).await;
            let v = admin(&c, doc! {"replSetGetConfig": 1}).await.unwrap().get_document("config").unwrap().get_i32("version").unwrap();
            if v == version + 1 {
                break;
            }
            assert!(Instant::now() < deadline, "member {i} has config version {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Remove it again: it learns it is no longer in the set.
    let mut members = config.get_array("members").unwrap().clone();
    members.pop();
    config.insert("members", members);
    config.insert("version", version + 2);
    admin(&primary, doc! {"replSetReconfig": config}).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while set.status(3).await.unwrap().get_i32("myState").unwrap() != 10 {
        assert!(Instant::now() < deadline, "the removed member does not report REMOVED");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    coll.insert_one(doc! {"_id": 300}).await.unwrap();
}

/// Every document of `db.coll` on member `i`, by _id, read as a secondary-tolerant client.
async fn all_on(s: &Server, db: &str, coll: &str) -> Vec<Document> {
    try_all_on(s, db, coll).await.unwrap()
}

/// `all_on`, failing while the member serves no reads.
async fn try_all_on(s: &Server, db: &str, coll: &str) -> mongodb::error::Result<Vec<Document>> {
    let c = direct(s).await;
    let opts = mongodb::options::FindOptions::builder()
        .sort(doc! {"_id": 1})
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred { options: None }))
        .build();
    let mut cursor = c.database(db).collection::<Document>(coll).find(doc! {}).with_options(opts).await?;
    let mut out = Vec::new();
    while cursor.advance().await? {
        out.push(cursor.deserialize_current()?);
    }
    Ok(out)
}

#[tokio::test]
async fn an_empty_member_joins_by_initial_sync_while_writes_continue() {
    use mongodb::options::IndexOptions;
    use mongodb::IndexModel;
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let client = set.client().await;
    let app = client.database("app");
    // Data of several shapes: a capped collection, a unique secondary index, a second
    // database, and enough documents to take several clone batches.
    app.run_command(doc! {"create": "capped", "capped": true, "size": 1 << 20}).await.unwrap();
    app.collection::<Document>("capped").insert_one(doc! {"_id": 0, "note": "capped"}).await.unwrap();
    let coll = app.collection::<Document>("c");
    coll.create_index(IndexModel::builder().keys(doc! {"k": 1}).options(IndexOptions::builder().unique(true).name("k_unique".to_string()).build()).build())
        .await
        .unwrap();
    for chunk in 0..12 {
        let docs: Vec<Document> = (chunk * 1000..(chunk + 1) * 1000).map(|i| doc! {"_id": i, "k": i, "pad": "x".repeat(100)}).collect();
        coll.insert_many(docs).await.unwrap();
    }
    client.database("other").collection::<Document>("x").insert_one(doc! {"_id": "o"}).await.unwrap();
    // Every member has applied the data, so whichever the newcomer syncs from, it copies the
    // documents (a source still behind them would pass them on through its oplog instead).
    for i in 0..3 {
        set.wait_for_count(i, "c", 12_000).await;
    }
    // A new member joins while inserts, updates and deletes go on. It ran standalone before:
    // what it held is dropped (without logging its own drops), not merged.
    let mut newcomer = Server::start();
    let old = newcomer.client().await;
    old.database("app").collection::<Document>("c").insert_one(doc! {"_id": "stale", "k": "stale"}).await.unwrap();
    old.database("gone").collection::<Document>("x").insert_one(doc! {"_id": 1}).await.unwrap();
    drop(old);
    newcomer.restart_with_args(&["--replSet", "rs0"]);
    let primary = direct(&set.members[p]).await;
    let mut config = admin(&primary, doc! {"replSetGetConfig": 1}).await.unwrap().get_document("config").unwrap().clone();
    let version = config.get_i32("version").unwrap();
    let mut members = config.get_array("members").unwrap().clone();
    members.push(Bson::Document(doc! {"_id": 3, "host": host(&newcomer), "votes": 0, "priority": 0}));
    config.insert("members", members);
    config.insert("version", version + 1);
    let writer = {
        let coll = coll.clone();
        tokio::spawn(async move {
            for i in 0..400i32 {
                coll.insert_one(doc! {"_id": 20_000 + i, "k": 20_000 + i}).await.unwrap();
                coll.update_one(doc! {"_id": i}, doc! {"$set": {"v": i}}).await.unwrap();
                coll.delete_one(doc! {"_id": 6000 + i}).await.unwrap();
            }
        })
    };
    admin(&primary, doc! {"replSetReconfig": config}).await.unwrap();
    set.members.push(newcomer);
    writer.await.unwrap();
    // w:4 counts the newcomer: once this is acknowledged it has applied everything before.
    coll.insert_one(doc! {"_id": "last", "k": -1})
        .with_options(
            mongodb::options::InsertOneOptions::builder()
                .write_concern(
                    mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(4)).w_timeout(Duration::from_secs(60)).build(),
                )
                .build(),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while set.status(3).await.unwrap().get_i32("myState").unwrap() != 2 {
        assert!(Instant::now() < deadline, "the newcomer did not become SECONDARY");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The same documents, the same indexes, the same collection options.
    let want = all_on(&set.members[p], "app", "c").await;
    assert_eq!(want.len(), 12_000 + 400 - 400 + 1);
    assert_eq!(all_on(&set.members[3], "app", "c").await, want);
    assert_eq!(all_on(&set.members[3], "app", "capped").await, vec![doc! {"_id": 0, "note": "capped"}]);
    assert_eq!(all_on(&set.members[3], "other", "x").await, vec![doc! {"_id": "o"}]);
    let new = direct(&set.members[3]).await;
    assert!(!new.list_database_names().await.unwrap().contains(&"gone".to_string()));
    // Its oplog is the source's from where the copy began: no entry of its own.
    let first = new.database("local").collection::<Document>("oplog.rs").find_one(doc! {}).await.unwrap().unwrap();
    let on_primary = direct(&set.members[p])
        .await
        .database("local")
        .collection::<Document>("oplog.rs")
        .find_one(doc! {"ts": first.get_timestamp("ts").unwrap()})
        .await
        .unwrap();
    assert_eq!(on_primary.as_ref(), Some(&first));
    let idx = new.database("app").run_command(doc! {"listIndexes": "c", "$readPreference": {"mode": "secondaryPreferred"}}).await.unwrap();
    let specs = idx.get_document("cursor").unwrap().get_array("firstBatch").unwrap();
    assert!(
        specs.iter().any(|s| s.as_document().is_some_and(|s| s.get_str("name").ok() == Some("k_unique") && s.get_bool("unique").unwrap_or(false))),
        "{specs:?}"
    );
    let colls = new
        .database("app")
        .run_command(doc! {"listCollections": 1, "filter": {"name": "capped"}, "$readPreference": {"mode": "secondaryPreferred"}})
        .await
        .unwrap();
    let opts = colls.get_document("cursor").unwrap().get_array("firstBatch").unwrap()[0].as_document().unwrap().get_document("options").unwrap().clone();
    assert!(opts.get_bool("capped").unwrap());
    // replSetGetStatus reports the sync: it copied the documents rather than replaying them.
    let s = admin(&new, doc! {"replSetGetStatus": 1, "initialSync": 1}).await.unwrap();
    let st = s.get_document("initialSyncStatus").unwrap();
    assert_eq!(st.get_i32("failedInitialSyncAttempts").unwrap(), 0);
    assert!(st.get_document("databases").unwrap().get_i32("databasesCloned").unwrap() >= 2, "{st:?}\nnewcomer's log:\n{}", set.members[3].stderr_tail());
    assert!(st.get_i64("documentsCopied").unwrap() >= 12_000, "{st:?}");
    assert!(st.get_datetime("initialSyncEnd").is_ok());
    // The copies keep the source's collection UUIDs.
    assert_eq!(collection_uuid(&set.members[3], "app", "c").await, collection_uuid(&set.members[p], "app", "c").await);
    assert_eq!(collection_uuid(&set.members[3], "app", "capped").await, collection_uuid(&set.members[p], "app", "capped").await);
}

/// A secondary reports a durable batch at once: the getMore it sends as soon as the batch is
/// durable carries it. Left to a getMore sent before, which waits for entries as between
/// these one-at-a-time writes, each write would wait out its 1 s await (or the 2 s periodic
/// report at the default heartbeat interval): 20 s or so in all, against well under one.
#[tokio::test]
async fn majority_writes_do_not_wait_for_the_fetchers_next_getmore() {
    const WRITES: i32 = 20;
    let mut set = Set::start(3, doc! {"heartbeatIntervalMillis": 2000, "electionTimeoutMillis": 10_000}, &[]).await;
    set.wait_for_primary(None).await;
    let client = set.client().await;
    let db = client.database("app");
    db.run_command(doc! {"insert": "c", "documents": [{"_id": -1}]}).await.unwrap();
    let started = Instant::now();
    for i in 0..WRITES {
        let r = db.run_command(doc! {"insert": "c", "documents": [{"_id": i}], "writeConcern": {"w": "majority", "wtimeout": 30_000}}).await.unwrap();
        assert!(r.get("writeConcernError").is_none(), "write {i}: {r:?}");
    }
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(8), "{WRITES} majority writes one at a time took {elapsed:?}");
}

#[tokio::test]
async fn majority_and_linearizable_reads_wait_for_the_commit_point() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let client = set.client().await;
    client.database("app").collection::<Document>("r").insert_one(doc! {"_id": "committed"}).await.unwrap();
    let others: Vec<usize> = (0..3).filter(|&i| i != p).collect();
    // The secondaries stand for no election and can no longer fetch from the primary (the
    // primary still reaches them, so it keeps its majority and stays primary).
    for &i in &others {
        admin(&direct(&set.members[i]).await, doc! {"replSetFreeze": 60}).await.unwrap();
        set.fail_point(i, "alwaysOn", doc! {"host": host(&set.members[p]), "partition": true}).await;
    }
    let primary = direct(&set.members[p]).await;
    let app = primary.database("app");
    app.run_command(doc! {"insert": "r", "documents": [{"_id": "uncommitted"}], "writeConcern": {"w": 1}}).await.unwrap();
    let find = |level: &str| doc! {"find": "r", "filter": {}, "readConcern": {"level": level}, "maxTimeMS": 800};
    // A local read sees the w:1 write; majority and linearizable reads do not return it.
    let local = app.run_command(find("local")).await.unwrap();
    assert_eq!(local.get_document("cursor").unwrap().get_array("firstBatch").unwrap().len(), 2);
    assert_code_name(app.run_command(find("majority")).await, 50, "MaxTimeMSExpired");
    assert_code_name(app.run_command(find("linearizable")).await, 50, "MaxTimeMSExpired");
    // Linearizable reads are for the primary only.
    let sec = direct(&set.members[others[0]]).await;
    let mut on_secondary = find("linearizable");
    on_secondary.insert("$readPreference", doc! {"mode": "secondaryPreferred"});
    assert_code_name(sec.database("app").run_command(on_secondary).await, 10107, "NotWritablePrimary");
    // Healed: the write commits and both reads return it, on the secondaries too.
    for &i in &others {
        set.fail_point(i, "off", doc! {"host": host(&set.members[p])}).await;
    }
    let mut no_limit = find("majority");
    no_limit.remove("maxTimeMS");
    let r = app.run_command(no_limit.clone()).await.unwrap();
    assert_eq!(r.get_document("cursor").unwrap().get_array("firstBatch").unwrap().len(), 2);
    let mut lin = find("linearizable");
    lin.remove("maxTimeMS");
    assert_eq!(app.run_command(lin).await.unwrap().get_document("cursor").unwrap().get_array("firstBatch").unwrap().len(), 2);
    no_limit.insert("$readPreference", doc! {"mode": "secondaryPreferred"});
    // (A secondary's majority read returns what it has applied and knows committed: it may
    // lag, so this waits until it has caught up.)
    for &i in &others {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = direct(&set.members[i]).await.database("app").run_command(no_limit.clone()).await.unwrap();
            if r.get_document("cursor").unwrap().get_array("firstBatch").unwrap().len() == 2 {
                break;
            }
            assert!(Instant::now() < deadline, "member {i} does not return the committed write");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // A majority cursor's getMore waits as its find did (batchSize 1: the rest comes by getMore).
    let mut batched = find("majority");
    batched.insert("batchSize", 1);
    let r = app.run_command(batched).await.unwrap();
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    let more = app.run_command(doc! {"getMore": id, "collection": "r"}).await.unwrap();
    assert_eq!(more.get_document("cursor").unwrap().get_array("nextBatch").unwrap().len(), 1);
}

#[tokio::test]
async fn a_member_given_a_higher_priority_takes_over() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let target = (p + 1) % 3;
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("t");
    coll.insert_one(doc! {"_id": 0}).await.unwrap();
    let primary = direct(&set.members[p]).await;
    let mut config = admin(&primary, doc! {"replSetGetConfig": 1}).await.unwrap().get_document("config").unwrap().clone();
    let version = config.get_i32("version").unwrap();
    let mut members = config.get_array("members").unwrap().clone();
    members[target].as_document_mut().unwrap().insert("priority", 5);
    config.insert("members", members);
    config.insert("version", version + 1);
    admin(&primary, doc! {"replSetReconfig": config}).await.unwrap();
    // Caught up and outranking the primary, it stands after one election timeout and wins.
    let deadline = Instant::now() + Duration::from_secs(20);
    while set.status(target).await.unwrap().get_i32("myState").unwrap() != 1 {
        assert!(Instant::now() < deadline, "member {target} (priority 5) did not take over from member {p}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(set.wait_for_primary(None).await, target);
    // Nothing was lost, and the set takes writes through the new primary.
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    set.wait_for_count(p, "t", 2).await;
    assert_eq!(set.status(p).await.unwrap().get_i32("myState").unwrap(), 2);
}

#[tokio::test]
async fn an_arbiter_votes_but_holds_no_data() {
    let mut set = Set::start(3, doc! {}, &[doc! {}, doc! {}, doc! {"arbiterOnly": true}]).await;
    let p = set.wait_for_primary(None).await;
    assert_ne!(p, 2, "an arbiter never becomes primary");
    let client = set.client().await;
    let hello = admin(&client, doc! {"hello": 1}).await.unwrap();
    assert_eq!(hello.get_array("arbiters").unwrap(), &vec![Bson::String(host(&set.members[2]))]);
    assert_eq!(hello.get_array("hosts").unwrap().len(), 2);
    let coll = client.database("app").collection::<Document>("a");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let s = set.status(2).await.unwrap();
    assert_eq!(s.get_i32("myState").unwrap(), 7);
    // It holds no data and serves no reads.
    assert_code_name(set.try_count_on(2, "a").await, 13436, "NotPrimaryOrSecondary");
    // With the primary gone, the other data-bearing member wins with the arbiter's vote; a
    // majority of the data-bearing voters is then out of reach, so w:"majority" times out.
    set.members[p].kill9();
    let next = set.wait_for_primary(Some(p)).await;
    assert_eq!(next, 1 - p);
    let c = direct(&set.members[next]).await;
    let r = c.database("app").run_command(doc! {"insert": "a", "documents": [{"_id": 2}], "writeConcern": {"w": 1}}).await.unwrap();
    assert_eq!(r.get_i32("n").unwrap(), 1);
    let r = c.database("app").run_command(doc! {"insert": "a", "documents": [{"_id": 3}], "writeConcern": {"w": "majority", "wtimeout": 500}}).await.unwrap();
    assert_eq!(r.get_document("writeConcernError").unwrap().get_i32("code").unwrap(), 64, "{r:?}");
}

#[tokio::test]
async fn a_member_too_stale_for_one_source_fetches_from_another() {
    // Members 1 and 3 are non-voters, so member 1 may take member 3 as its source; member 1
    // is hidden, so member 3 never takes it as its own.
    let mut set =
        Set::start(4, doc! {}, &[doc! {}, doc! {"votes": 0, "priority": 0, "hidden": true}, doc! {"priority": 0}, doc! {"votes": 0, "priority": 0}]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    let coll = set.seed("c", 10).await;
    // Cut member 1 off (faults act on the links it opens), then write on.
    for j in [0, 2, 3] {
        set.fail_point(1, "alwaysOn", doc! {"host": host(&set.members[j]), "partition": true}).await;
    }
    for i in 10..20 {
        coll.insert_one(doc! {"_id": i}).await.unwrap();
    }
    // Member 3 starts over empty: its initial sync copies the data, and its oplog begins
    // after member 1's newest entry.
    set.start_over_empty(3);
    set.wait_for_count(3, "c", 20).await;
    let (ours, theirs) = (oplog_edge(&set.members[1], -1).await, oplog_edge(&set.members[3], 1).await);
    assert!((ours.time, ours.increment) < (theirs.time, theirs.increment), "member 3's oplog starts at {theirs:?}, member 1's ends at {ours:?}");
    // Member 1 can reach member 3 only: member 3 cannot serve it, and that is no reason to
    // roll back (there would be no common point) or to stop serving reads.
    set.fail_point(1, "off", doc! {"host": host(&set.members[3])}).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = set.status(1).await.unwrap();
        if member(&s, 1).get_str("infoMessage").unwrap().contains("too stale") {
            assert_eq!(s.get_i32("myState").unwrap(), 2, "{s:?}");
            break;
        }
        assert!(Instant::now() < deadline, "member 1 never found member 3 too far ahead: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Reachable again, the primary serves it.
    for j in [0, 2] {
        set.fail_point(1, "off", doc! {"host": host(&set.members[j])}).await;
    }
    set.wait_for_count(1, "c", 20).await;
    assert_eq!(set.status(1).await.unwrap().get_i32("myState").unwrap(), 2);
    assert!(!set.members[1].dbpath.join("rollback").exists(), "member 1 rolled back");
}

/// Without chaining a member fetches from the primary only. A member that joined by
/// initial sync and was then elected begins its oplog after the newest entry of a member
/// that was cut off meanwhile: that member catches up from a secondary that still holds its
/// entry, instead of waiting for good on a primary too far ahead of it.
#[tokio::test]
async fn a_member_too_stale_for_the_primary_catches_up_from_a_secondary_without_chaining() {
    let mut set =
        Set::start(4, doc! {"chainingAllowed": false}, &[doc! {}, doc! {"votes": 0, "priority": 0}, doc! {"priority": 0}, doc! {"priority": 0}]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    let coll = set.seed("c", 10).await;
    for j in [0, 2, 3] {
        set.fail_point(1, "alwaysOn", doc! {"host": host(&set.members[j]), "partition": true}).await;
    }
    for i in 10..20 {
        coll.insert_one(doc! {"_id": i}).await.unwrap();
    }
    set.start_over_empty(3);
    set.wait_for_count(3, "c", 20).await;
    let (ours, theirs) = (oplog_edge(&set.members[1], -1).await, oplog_edge(&set.members[3], 1).await);
    assert!((ours.time, ours.increment) < (theirs.time, theirs.increment), "member 3's oplog starts at {theirs:?}, member 1's ends at {ours:?}");
    // Member 3 takes over by priority.
    let primary = direct(&set.members[0]).await;
    let mut config = admin(&primary, doc! {"replSetGetConfig": 1}).await.unwrap().get_document("config").unwrap().clone();
    let mut members = config.get_array("members").unwrap().clone();
    members[3].as_document_mut().unwrap().insert("priority", 5);
    config.insert("members", members);
    config.insert("version", config.get_i32("version").unwrap() + 1);
    admin(&primary, doc! {"replSetReconfig": config}).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while set.status(3).await.unwrap().get_i32("myState").unwrap() != 1 {
        assert!(Instant::now() < deadline, "member 3 (priority 5) did not take over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for j in [0, 2, 3] {
        set.fail_point(1, "off", doc! {"host": host(&set.members[j])}).await;
    }
    // Too stale for the primary (denied for a minute), member 1 catches up from a secondary
    // well before.
    let all = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(4)).w_timeout(Duration::from_secs(30)).build();
    coll.insert_one(doc! {"_id": "last"}).write_concern(all).await.unwrap();
    // Acknowledged once written to its oplog; applied a moment later.
    set.wait_for_count(1, "c", 21).await;
    assert_eq!(all_on(&set.members[1], "app", "c").await, all_on(&set.members[3], "app", "c").await);
    assert!(!set.members[1].dbpath.join("rollback").exists(), "member 1 rolled back");
}

/// Without chaining a member fetches from the primary only; with no primary up, from a
/// secondary ahead of it. Here the entries the one electable member lacks are on an
/// unelectable one only, which refuses its vote to a candidate behind it: fetching from no
/// one, the set would never elect a primary again.
#[tokio::test]
async fn without_a_primary_a_member_behind_fetches_from_a_secondary_and_is_elected() {
    let mut set = Set::start(3, doc! {"chainingAllowed": false}, &[doc! {}, doc! {}, doc! {"priority": 0}]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    let coll = set.seed("c", 10).await;
    // Member 1 cannot reach member 0; writes go on with member 2.
    set.fail_point(1, "alwaysOn", doc! {"host": host(&set.members[0]), "partition": true}).await;
    set.fail_point(0, "alwaysOn", doc! {"host": host(&set.members[1]), "partition": true}).await;
    let two = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(2)).w_timeout(Duration::from_secs(30)).build();
    for i in 10..20 {
        coll.insert_one(doc! {"_id": i}).write_concern(two.clone()).await.unwrap();
    }
    set.members[0].kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while set.status(1).await.and_then(|s| s.get_i32("myState").ok()) != Some(1) {
        assert!(Instant::now() < deadline, "member 1 was not elected: {:?}", set.status(1).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    set.wait_for_count(1, "c", 20).await;
}

/// A deposed primary's entries can be newer than the first entry of the next primary's
/// term, and a member that joined by initial sync then begins its oplog at that entry. The
/// newest entry both share with the deposed primary is older than that oplog: it cannot
/// serve the deposed primary's rollback, which says so, leaves its data as it was, and
/// rolls back once it reaches a member that holds the common point.
#[tokio::test]
async fn a_rollback_source_whose_oplog_begins_after_the_common_point_is_left_for_another() {
    // Cut off, member 0 stays primary for an election timeout: 3 s, time for what follows.
    let mut set = Set::start(4, doc! {"electionTimeoutMillis": 3000}, &[doc! {}, doc! {}, doc! {"priority": 0}, doc! {"priority": 0}]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    let coll = set.seed("c", 10).await;
    // Member 0 is cut off; member 1 is elected at once while member 0 still takes writes.
    for j in 1..4 {
        set.fail_point(0, "alwaysOn", doc! {"host": host(&set.members[j]), "partition": true}).await;
        set.fail_point(j, "alwaysOn", doc! {"host": host(&set.members[0]), "partition": true}).await;
    }
    admin(&direct(&set.members[1]).await, doc! {"replSetStepUp": 1}).await.unwrap();
    assert_eq!(set.wait_for_primary(Some(0)).await, 1);
    // A majority write of the new term: the commit point a member syncing later begins at.
    let majority = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Majority).build();
    direct(&set.members[1]).await.database("app").collection::<Document>("c").insert_one(doc! {"_id": "new term"}).write_concern(majority).await.unwrap();
    let first_of_term = oplog_edge(&set.members[1], -1).await;
    let old = direct(&set.members[0]).await.database("app").collection::<Document>("c");
    let mut diverged = 0;
    for i in 0..100_000 {
        if old.insert_one(doc! {"_id": format!("lost{i}")}).write_concern(w1()).await.is_err() {
            break;
        }
        diverged += 1;
    }
    let ours = oplog_edge(&set.members[0], -1).await;
    assert!(
        diverged > 0 && (ours.time, ours.increment) > (first_of_term.time, first_of_term.increment),
        "member 0 wrote {diverged}, its newest {ours:?}, the new term's first {first_of_term:?}"
    );
    // Member 3 starts over empty, copying from member 1 or 2 (not member 0): its oplog
    // begins at their commit point, the new term's majority write, older than member 0's
    // newest.
    let deadline = Instant::now() + Duration::from_secs(20);
    while set.status(2).await.unwrap().get_document("optimes").unwrap().get_document("lastCommittedOpTime").unwrap().get_timestamp("ts").unwrap()
        != first_of_term
    {
        assert!(Instant::now() < deadline, "member 2 did not learn the commit point");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    set.start_over_empty(3);
    set.fail_point(3, "alwaysOn", doc! {"host": host(&set.members[0]), "partition": true}).await;
    set.wait_for_count(3, "c", 11).await;
    assert_eq!(oplog_edge(&set.members[3], 1).await, first_of_term);
    // Member 0 reaches member 3 only: it cannot roll back to it, and changes nothing.
    set.fail_point(0, "off", doc! {"host": host(&set.members[3])}).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = set.status(0).await.unwrap();
        let info = member(&s, 0).get_str("infoMessage").unwrap_or_default().to_string();
        if info.contains("too stale to roll back") {
            break;
        }
        assert!(!info.contains("resync"), "{info}");
        assert!(Instant::now() < deadline, "member 0 never found member 3's oplog too short: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!set.members[0].dbpath.join("rollback").exists(), "member 0 changed its data");
    // Reachable again, it rolls back to a member that holds the common point.
    for j in 1..4 {
        set.fail_point(0, "off", doc! {"host": host(&set.members[j])}).await;
        set.fail_point(j, "off", doc! {"host": host(&set.members[0])}).await;
    }
    let all = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(4)).w_timeout(Duration::from_secs(30)).build();
    coll.insert_one(doc! {"_id": "last"}).write_concern(all).await.unwrap();
    set.wait_for_count(0, "c", 12).await;
    assert_eq!(all_on(&set.members[0], "app", "c").await, all_on(&set.members[1], "app", "c").await);
    assert!(set.members[0].dbpath.join("rollback").exists(), "member 0 kept its divergent writes somewhere");
}

/// A member pointed at a source that is behind it (replSetSyncFrom, or heartbeat news
/// already stale) must not take the source's shorter oplog for a divergence: rolling back
/// would undo majority-committed entries. It says why and waits for a usable source.
#[tokio::test]
async fn a_member_ahead_of_its_source_does_not_roll_back_to_it() {
    let mut set = Set::start(3, doc! {}, &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    let coll = set.seed("c", 10).await;
    // Member 2 stops fetching (faults act on the links it opens) and falls behind member 1.
    set.fail_point(2, "alwaysOn", doc! {"host": "*", "partition": true}).await;
    let w2 = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(2)).build();
    for i in 10..20 {
        coll.insert_one(doc! {"_id": i}).write_concern(w2.clone()).await.unwrap();
    }
    set.wait_for_count(1, "c", 20).await;
    let sec = direct(&set.members[1]).await;
    admin(&sec, doc! {"replSetSyncFrom": host(&set.members[2])}).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(!set.members[1].dbpath.join("rollback").exists(), "member 1 rolled back to a source behind it:\n{}", set.members[1].stderr_tail());
        let s = set.status(1).await.unwrap();
        if member(&s, 1).get_str("infoMessage").unwrap_or_default().contains("is behind us") {
            assert_eq!(s.get_i32("myState").unwrap(), 2, "{s:?}");
            break;
        }
        assert!(Instant::now() < deadline, "member 1 never found member 2 behind it: {s:?}\n{}", set.members[1].stderr_tail());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(set.count_on(1, "c").await, 20);
    // Member 2 catches up once it can fetch again, and the set agrees.
    set.fail_point(2, "off", doc! {"host": "*"}).await;
    for i in 0..3 {
        set.wait_for_count(i, "c", 20).await;
    }
    assert!(!set.members[1].dbpath.join("rollback").exists(), "member 1 rolled back");
}

/// The timestamp of a member's newest (`order` -1) or oldest (1) oplog entry.
async fn oplog_edge(s: &Server, order: i32) -> mongodb::bson::Timestamp {
    let e = direct(s).await.database("local").collection::<Document>("oplog.rs").find_one(doc! {}).sort(doc! {"$natural": order}).await.unwrap().unwrap();
    e.get_timestamp("ts").unwrap()
}

/// `info.uuid` of `db.coll` in listCollections on a member.
async fn collection_uuid(s: &Server, db: &str, coll: &str) -> Bson {
    let r = direct(s)
        .await
        .database(db)
        .run_command(doc! {"listCollections": 1, "filter": {"name": coll}, "$readPreference": {"mode": "secondaryPreferred"}})
        .await
        .unwrap();
    let first = r.get_document("cursor").unwrap().get_array("firstBatch").unwrap()[0].as_document().unwrap().clone();
    first.get_document("info").unwrap().get("uuid").unwrap().clone()
}

#[tokio::test]
async fn a_new_primary_catches_up_from_a_member_ahead_of_it() {
    // Member 1 is the only electable one besides member 0. Member 3 is hidden, so no
    // secondary fetches from it on its own: only catch-up does.
    let extras = [doc! {"priority": 2}, doc! {}, doc! {"priority": 0}, doc! {"priority": 0, "hidden": true}, doc! {"priority": 0}];
    let mut set = Set::start(5, doc! {}, &extras).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    let coll = set.seed("c", 10).await;
    // Members 1, 2 and 4 hear nothing from 0 and 3; member 1 may not stand yet.
    admin(&direct(&set.members[1]).await, doc! {"replSetFreeze": 120}).await.unwrap();
    for i in [1, 2, 4] {
        for j in [0, 3] {
            set.fail_point(i, "alwaysOn", doc! {"host": host(&set.members[j]), "partition": true}).await;
        }
    }
    // A write that only members 0 and 3 take, then member 0 dies.
    let w2 = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(2)).w_timeout(Duration::from_secs(20)).build();
    coll.insert_one(doc! {"_id": "x"}).with_options(mongodb::options::InsertOneOptions::builder().write_concern(w2).build()).await.unwrap();
    set.members[0].kill9();
    for i in [1, 2, 4] {
        set.fail_point(i, "off", doc! {"host": host(&set.members[3])}).await;
    }
    // Once member 1 sees member 3 ahead of it, it may stand; members 2 and 4 elect it
    // (member 3, ahead, refuses).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = set.status(1).await.unwrap();
        let (mine, theirs) = (
            member(&s, 1).get_document("optime").unwrap().get_timestamp("ts").unwrap(),
            member(&s, 3).get_document("optime").unwrap().get_timestamp("ts").unwrap(),
        );
        if member(&s, 3).get_f64("health").unwrap() == 1.0 && (theirs.time, theirs.increment) > (mine.time, mine.increment) {
            break;
        }
        assert!(Instant::now() < deadline, "member 1 never saw member 3 ahead: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin(&direct(&set.members[1]).await, doc! {"replSetFreeze": 0}).await.unwrap();
    assert_eq!(set.wait_for_primary(Some(0)).await, 1);
    // The new primary fetched the write before taking over, so nobody rolls it back.
    let on_new = all_on(&set.members[1], "app", "c").await;
    assert!(on_new.contains(&doc! {"_id": "x"}), "the new primary lacks the write member 3 had");
    for i in [2, 3, 4] {
        set.wait_for_count(i, "c", 11).await;
    }
    assert!(!set.members[3].dbpath.join("rollback").exists(), "member 3 rolled back");
}

#[tokio::test]
async fn rollback_undoes_catalog_changes_by_copying_the_collections_again() {
    use mongodb::options::IndexOptions;
    use mongodb::IndexModel;
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let client = set.client().await;
    let app = client.database("app");
    let keep = app.collection::<Document>("keep");
    keep.create_index(IndexModel::builder().keys(doc! {"k": 1}).options(IndexOptions::builder().name("k_1".to_string()).build()).build()).await.unwrap();
    keep.insert_many((0..20).map(|i| doc! {"_id": i, "k": i})).await.unwrap();
    app.collection::<Document>("other").insert_many((0..5).map(|i| doc! {"_id": i})).await.unwrap();
    // A retryable write's session, written by the set and then by the cut-off primary alone:
    // its record there names the lost write until the rollback copies the set's.
    let session_insert = |txn: i64, id: &str, w: Document| {
        let lsid = doc! {"id": Bson::Binary(mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Uuid, bytes: vec![42; 16] })};
        doc! {"insert": "sess", "documents": [{"_id": id}], "lsid": lsid, "txnNumber": txn, "writeConcern": w, "$db": "app"}
    };
    let mut raw = wire::connect(set.members[p].port);
    let r = wire::command(&mut raw, 1, &session_insert(1, "kept", doc! {"w": "majority"})).doc;
    assert_eq!(r.get_i32("n").unwrap(), 1, "{r:?}");
    for i in 0..3 {
        set.wait_for_count(i, "other", 5).await;
    }
    let old = host(&set.members[p]);
    set.fail_point(p, "alwaysOn", doc! {"host": "*", "partition": true}).await;
    for i in (0..3).filter(|&i| i != p) {
        set.fail_point(i, "alwaysOn", doc! {"host": old.clone(), "partition": true}).await;
    }
    // On the cut-off primary, w:1 catalog changes no other member gets.
    let lone = direct(&set.members[p]).await.database("app");
    let w1 = doc! {"w": 1};
    lone.run_command(doc! {"createIndexes": "keep", "indexes": [{"key": {"v": 1}, "name": "v_1"}], "writeConcern": w1.clone()}).await.unwrap();
    lone.run_command(doc! {"dropIndexes": "keep", "index": "k_1", "writeConcern": w1.clone()}).await.unwrap();
    lone.run_command(doc! {"insert": "keep", "documents": [{"_id": "lost", "k": -1}], "writeConcern": w1.clone()}).await.unwrap();
    lone.run_command(doc! {"drop": "other", "writeConcern": w1.clone()}).await.unwrap();
    let r = wire::command(&mut raw, 2, &session_insert(2, "lost", w1)).doc;
    assert_eq!(r.get_i32("n").unwrap(), 1, "{r:?}");
    let next = set.wait_for_primary(Some(p)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while set.status(p).await.unwrap().get_i32("myState").unwrap() == 1 {
        assert!(Instant::now() < deadline, "the partitioned primary did not step down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Meanwhile the majority writes on.
    keep.insert_one(doc! {"_id": "new", "k": 100}).await.unwrap();
    for i in 0..3 {
        set.fail_point(i, "off", doc! {"host": if i == p { "*".to_string() } else { old.clone() }}).await;
    }
    // The old primary has the set's collections again: documents, indexes, UUIDs.
    let want = all_on(&set.members[next], "app", "keep").await;
    assert!(want.contains(&doc! {"_id": "new", "k": 100}));
    let deadline = Instant::now() + Duration::from_secs(20);
    while set.try_count_on(p, "other").await.ok() != Some(5) || try_all_on(&set.members[p], "app", "keep").await.ok().as_ref() != Some(&want) {
        assert!(Instant::now() < deadline, "the old primary did not roll back: {:?}", set.status(p).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(set.wait_for_primary(None).await, next);
    assert_eq!(all_on(&set.members[p], "app", "other").await, (0..5).map(|i| doc! {"_id": i}).collect::<Vec<_>>());
    let index_names = |s: usize| {
        let c = direct(&set.members[s]);
        async move {
            let r = c.await.database("app").run_command(doc! {"listIndexes": "keep", "$readPreference": {"mode": "secondaryPreferred"}}).await.unwrap();
            let mut names: Vec<String> = r
                .get_document("cursor")
                .unwrap()
                .get_array("firstBatch")
                .unwrap()
                .iter()
                .map(|d| d.as_document().unwrap().get_str("name").unwrap().to_string())
                .collect();
            names.sort();
            names
        }
    };
    assert_eq!(index_names(p).await, vec!["_id_".to_string(), "k_1".to_string()]);
    for coll in ["keep", "other"] {
        assert_eq!(collection_uuid(&set.members[p], "app", coll).await, collection_uuid(&set.members[next], "app", coll).await, "{coll}");
    }
    // Its own keep (with "lost") is in a rollback file. (Its other was gone already: it had
    // dropped it.)
    let dir = set.members[p].dbpath.join("rollback").join("app.keep");
    let mut saved = Vec::new();
    for f in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let bytes = std::fs::read(f.unwrap().path()).unwrap();
        let mut r = bytes.as_slice();
        while !r.is_empty() {
            saved.push(Document::from_reader(&mut r).unwrap());
        }
    }
    assert!(saved.contains(&doc! {"_id": "lost", "k": -1}), "{saved:?}");
    assert_eq!(saved.len(), 21, "its whole collection");
    assert_eq!(set.status(p).await.unwrap().get_i32("myState").unwrap(), 2);
    // The session's lost write is undone, and its record is the set's again (txnNum 1).
    assert_eq!(all_on(&set.members[p], "app", "sess").await, vec![doc! {"_id": "kept"}]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while try_all_on(&set.members[p], "config", "transactions").await.ok() != try_all_on(&set.members[next], "config", "transactions").await.ok() {
        assert!(Instant::now() < deadline, "session records differ after the rollback");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let records = all_on(&set.members[p], "config", "transactions").await;
    let ours = records.iter().find(|r| matches!(path(r, "_id.id"), Some(Bson::Binary(b)) if b.bytes == vec![42; 16])).expect("the session's record");
    assert_eq!(ours.get_i64("txnNum").unwrap(), 1, "{ours:?}");
}

/// A retryable write retried on a new primary after a step-down gets its first attempt's
/// results, rebuilt from the oplog entries the write left (mongod's design: the entries
/// carry lsid, txnNumber, stmtId and prevOpTime, and every member derives the session's
/// config.transactions record from them), and nothing is applied twice.
#[tokio::test]
async fn a_write_retried_after_failover_gets_its_first_results_and_applies_nothing_twice() {
    use mongodb::bson::spec::BinarySubtype;
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    // One session per command: a retry is of a session's newest transaction.
    let with_session = |i: usize, cmd: &Document| {
        let mut c = cmd.clone();
        c.insert("lsid", doc! {"id": Bson::Binary(mongodb::bson::Binary { subtype: BinarySubtype::Uuid, bytes: vec![i as u8 + 1; 16] })});
        c.insert("txnNumber", 5i64);
        c.insert("writeConcern", doc! {"w": "majority"});
        c.insert("$db", "app");
        c
    };
    let commands = [
        // An ordered insert that stops at a duplicate: the retry inserts nothing and fails alike.
        doc! {"insert": "r", "documents": [{"_id": 1, "n": 0}, {"_id": 2, "n": 0}, {"_id": 2}]},
        // An update and an upsert.
        doc! {"update": "r", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}, {"q": {"_id": 3}, "u": {"$inc": {"n": 1}}, "upsert": true}]},
        // findAndModify returning the document before, after (projected), and removed.
        doc! {"findAndModify": "r", "query": {"_id": 2}, "update": {"$inc": {"n": 10}}},
        doc! {"findAndModify": "r", "query": {"_id": 2}, "update": {"$inc": {"n": 100}}, "new": true, "fields": {"n": 1}},
        doc! {"findAndModify": "r", "query": {"_id": 3}, "remove": true},
        doc! {"delete": "r", "deletes": [{"q": {"_id": 1}, "limit": 1}]},
    ];
    let mut s = wire::connect(set.members[p].port);
    let mut firsts = Vec::new();
    for (i, c) in commands.iter().enumerate() {
        let r = wire::command(&mut s, i as i32 + 1, &with_session(i, c)).doc;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r:?}");
        firsts.push(r);
    }
    assert_eq!(firsts[0].get_i32("n").unwrap(), 2);
    assert_eq!(path(&firsts[2], "value.n"), Some(&Bson::Int32(0)));
    let data_before = all_on(&set.members[p], "app", "r").await;
    assert_eq!(data_before, vec![doc! {"_id": 2, "n": 110}]);
    let c = direct(&set.members[p]).await;
    admin(&c, doc! {"replSetStepDown": 30, "secondaryCatchUpPeriodSecs": 5}).await.unwrap();
    let q = set.wait_for_primary(Some(p)).await;
    // Every member derived the six sessions' records.
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(10);
        while try_all_on(&set.members[i], "config", "transactions").await.map_or(0, |r| r.len()) != 6 {
            assert!(Instant::now() < deadline, "member {i} lacks session records");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut s = wire::connect(set.members[q].port);
    let fields = ["n", "nModified", "upserted", "writeErrors", "lastErrorObject", "value"];
    for (i, c) in commands.iter().enumerate() {
        let r = wire::command(&mut s, 100 + i as i32, &with_session(i, c)).doc;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r:?}");
        for f in fields {
            let (a, b) = (firsts[i].get(f), r.get(f));
            match (f, a, b) {
                // The duplicate's message is the same; compare what identifies it.
                ("writeErrors", Some(Bson::Array(a)), Some(Bson::Array(b))) => {
                    let key = |e: &Bson| e.as_document().map(|d| (d.get_i32("index").ok(), d.get_i32("code").ok()));
                    assert_eq!(a.iter().map(key).collect::<Vec<_>>(), b.iter().map(key).collect::<Vec<_>>(), "command {i}");
                }
                _ => assert_eq!(a, b, "command {i}, field {f}: first {:?}, retry {r:?}", firsts[i]),
            }
        }
        let retried = r.get_array("retriedStmtIds").map(|a| a.len()).or_else(|_| r.get_i32("retriedStmtId").map(|_| 1));
        assert_eq!(retried.unwrap_or(0), if i < 2 { 2 } else { 1 }, "command {i}: {r:?}");
    }
    assert_eq!(all_on(&set.members[q], "app", "r").await, data_before, "a retry applied nothing again");
    // A new transaction of a session runs; an older one is refused.
    let mut next = with_session(5, &doc! {"insert": "r", "documents": [{"_id": 9}]});
    next.insert("txnNumber", 6i64);
    assert_eq!(wire::command(&mut s, 200, &next).doc.get_i32("n").unwrap(), 1);
    let old = wire::command(&mut s, 201, &with_session(5, &commands[5])).doc;
    assert_eq!(old.get_i32("code").unwrap(), 225, "{old:?}");
}

#[tokio::test]
async fn members_with_a_key_file_authenticate_to_each_other_and_clients_must_log_in() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("shoal-keyfile-{}-{}", std::process::id(), line!()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_path = dir.join("key");
    // Whitespace in a keyFile is ignored.
    std::fs::write(&key_path, "c2hvYWwta2V5ZmlsZS1mb3ItdGVzdHM=\n  \n").unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = key_path.display().to_string();
    let args: &[&str] = &["--keyFile", &key];
    // Initiated through the localhost exception (no user yet).
    let mut set = Set::start_with_args(3, doc! {"chainingAllowed": false}, &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}], &[args, args, args]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    for i in 1..3 {
        set.wait_for_secondary(i).await;
    }
    admin(&direct(&set.members[0]).await, doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    let hosts: Vec<String> = set.members.iter().map(host).collect();
    let root = Client::with_uri_str(format!("mongodb://admin:adminpw@{}/?replicaSet=rs0", hosts.join(","))).await.unwrap();
    // Majority writes need the secondaries' acknowledgements, which come over the members'
    // authenticated connections.
    let majority = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Majority).build();
    root.database("app").collection::<Document>("c").insert_one(doc! {"_id": 1}).write_concern(majority).await.unwrap();
    for (i, host) in hosts.iter().enumerate().skip(1) {
        // The user replicated too: a client logs in on a secondary with it.
        let c = Client::with_uri_str(format!("mongodb://admin:adminpw@{host}/?directConnection=true&readPreference=secondaryPreferred")).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.database("app").collection::<Document>("c").count_documents(doc! {}).await.unwrap() != 1 {
            assert!(Instant::now() < deadline, "member {i} lacks the write");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let anon = direct(&set.members[i]).await;
        let e = anon.database("app").run_command(doc! {"count": "c"}).await.unwrap_err();
        assert!(e.to_string().contains("requires authentication"), "{e}");
    }
    // A role revoked on the primary is gone on a secondary too, for a client already
    // logged in there.
    root.database("app").run_command(doc! {"createUser": "reader", "pwd": "pw", "roles": ["read"], "writeConcern": {"w": 3}}).await.unwrap();
    let reader = Client::with_uri_str(format!("mongodb://reader:pw@{}/?directConnection=true&authSource=app&readPreference=secondaryPreferred", hosts[1]))
        .await
        .unwrap();
    let on_secondary = reader.database("app").collection::<Document>("c");
    // w:3 waits for the user to be durable on the secondary, not applied: until it is, the
    // login fails.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match on_secondary.count_documents(doc! {}).await {
            Ok(n) => {
                assert_eq!(n, 1);
                break;
            }
            Err(e) => assert!(
                Instant::now() < deadline && matches!(*e.kind, mongodb::error::ErrorKind::Authentication { .. }),
                "the new user cannot log in on the secondary: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    root.database("app").run_command(doc! {"revokeRolesFromUser": "reader", "roles": ["read"], "writeConcern": {"w": 3}}).await.unwrap();
    // (w:3 waits for the entry to be durable there, not applied: poll until it is.)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match on_secondary.count_documents(doc! {}).await {
            Err(e) if e.to_string().contains("not authorized") => break,
            other => assert!(Instant::now() < deadline, "the revoked role still reads on the secondary: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Users change on the primary only.
    let on_secondary_root = Client::with_uri_str(format!("mongodb://admin:adminpw@{}/?directConnection=true", hosts[2])).await.unwrap();
    let e = on_secondary_root.database("app").run_command(doc! {"createUser": "local_only", "pwd": "x", "roles": []}).await.unwrap_err();
    assert!(e.to_string().contains("not primary") || e.to_string().contains("NotWritablePrimary"), "{e}");
    // The internal user logs in with the key only.
    let internal = |key: &str| format!("mongodb://__system:{key}@{}/?directConnection=true&authSource=local", hosts[0]);
    let ok = Client::with_uri_str(internal("c2hvYWwta2V5ZmlsZS1mb3ItdGVzdHM=")).await.unwrap();
    admin(&ok, doc! {"replSetGetStatus": 1}).await.unwrap();
    let wrong = Client::with_uri_str(internal("d3Jvbmcta2V5")).await.unwrap();
    let e = admin(&wrong, doc! {"ping": 1}).await.unwrap_err();
    assert!(e.to_string().contains("Authentication failed"), "{e}");
    // A keyFile others can read is refused, as are bad characters and a short key.
    for (text, mode) in [("c2hvYWwta2V5", 0o644), ("c2hv*WwtaAa", 0o600), ("abc", 0o600)] {
        std::fs::write(&key_path, text).unwrap();
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = std::process::Command::new(binary_path()).args(["serve", "--port", "0", "--storageEngine", "inMemory", "--keyFile", &key]).output().unwrap();
        assert!(!out.status.success(), "{text} {mode:o}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn members_that_require_tls_replicate_over_tls_with_each_others_certificates() {
    let dir = std::env::temp_dir().join(format!("shoal-member-tls-{}", std::process::id()));
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/compat/make_test_certs.sh");
    assert!(std::process::Command::new("bash").arg(script).arg(&dir).status().unwrap().success());
    let (ca, pem) = (dir.join("ca.pem").display().to_string(), dir.join("server.pem").display().to_string());
    // requireTLS with a CA file: every connection, the members' own included, is TLS with a
    // certificate the CA signed; a plaintext link could not replicate at all.
    let args: &[&str] = &["--tlsMode", "requireTLS", "--tlsCertificateKeyFile", &pem, "--tlsCAFile", &ca];
    let client_options = format!("tls=true&tlsCAFile={ca}&tlsCertificateKeyFile={}", dir.join("client.pem").display());
    let mut set = Set::start_with_client_options(
        3,
        doc! {"chainingAllowed": false},
        &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}],
        &[args, args, args],
        &client_options,
    )
    .await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    for i in 1..3 {
        set.wait_for_secondary(i).await;
    }
    let majority = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Majority).build();
    set.client().await.database("app").collection::<Document>("c").insert_one(doc! {"_id": 1}).write_concern(majority).await.unwrap();
    for i in 1..3 {
        set.wait_for_count(i, "c", 1).await;
    }
    // A plaintext client gets nothing.
    let plain = Client::with_uri_str(format!("mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=1000", host(&set.members[0]))).await.unwrap();
    assert!(admin(&plain, doc! {"ping": 1}).await.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// getAuditConfig of member `i`.
async fn audit_config(set: &Set, i: usize) -> Document {
    admin(&direct(&set.members[i]).await, doc! {"getAuditConfig": 1}).await.unwrap()
}

#[tokio::test]
async fn set_audit_config_on_the_primary_reaches_every_member_and_outlives_a_restart() {
    let dir = std::env::temp_dir().join(format!("shoal-audit-set-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<String> = (0..3).map(|i| dir.join(format!("m{i}.json")).display().to_string()).collect();
    let args: Vec<Vec<&str>> = paths.iter().map(|p| vec!["--auditDestination", "file", "--auditPath", p.as_str()]).collect();
    let args: Vec<&[&str]> = args.iter().map(|a| a.as_slice()).collect();
    let mut set = Set::start_with_args(3, doc! {"chainingAllowed": false}, &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}], &args).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    for i in 1..3 {
        set.wait_for_secondary(i).await;
    }
    let filter = doc! {"atype": {"$in": ["createCollection", "dropCollection"]}};
    let primary = direct(&set.members[0]).await;
    admin(&primary, doc! {"setAuditConfig": 1, "filter": filter.clone(), "auditAuthorizationSuccess": true}).await.unwrap();
    let on_primary = audit_config(&set, 0).await;
    let generation = on_primary.get_object_id("generation").expect("a generation").to_owned();
    assert_eq!(on_primary.get_document("filter").unwrap(), &filter);
    // Only the primary takes a new configuration; a secondary says so as mongod does.
    let e = admin(&direct(&set.members[1]).await, doc! {"setAuditConfig": 1, "auditAuthorizationSuccess": false}).await.unwrap_err();
    assert_eq!(error_code(&e), Some(10107), "{e}");
    // The secondaries take it from the oplog.
    for i in 1..3 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let c = audit_config(&set, i).await;
            if c.get_object_id("generation").ok() == Some(generation) {
                assert_eq!(c.get_document("filter").unwrap(), &filter);
                assert!(c.get_bool("auditAuthorizationSuccess").unwrap());
                break;
            }
            assert!(Instant::now() < deadline, "member {i} did not take the audit configuration: {c}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The primary applies the new filter: the insert's new collection is recorded, its new
    // database (which the filter leaves out) is not.
    set.client().await.database("app").collection::<Document>("c").insert_one(doc! {"_id": 1}).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&paths[0]).unwrap_or_default();
        let records: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let is = |r: &serde_json::Value, atype: &str, ns: &str| r["atype"] == atype && r["param"]["ns"] == ns;
        if records.iter().any(|r| is(r, "createCollection", "app.c")) {
            assert!(!records.iter().any(|r| is(r, "createDatabase", "app")), "{records:#?}");
            break;
        }
        assert!(Instant::now() < deadline, "no createCollection record for app.c: {records:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A restarted member comes back with the configuration it had.
    set.members[2].restart();
    set.wait_for_secondary(2).await;
    assert_eq!(audit_config(&set, 2).await.get_object_id("generation").ok(), Some(generation));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two documents of about 15 MB each, one insert: their oplog entries cannot share a 16 MiB
/// batch. Each transport must still carry them, one entry per batch when it has to, and the
/// set must go on acknowledging w:3 writes.
async fn near_limit_documents_replicate(transport: &str) {
    let mut set = Set::start_with_args(
        3,
        doc! {},
        &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}],
        &[&[], &["--logTransport", transport], &["--logTransport", transport]],
    )
    .await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    for i in 1..3 {
        set.wait_for_secondary(i).await;
    }
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("big");
    let big = |id: i32| doc! {"_id": id, "s": "x".repeat(15_000_000)};
    coll.insert_many(vec![big(1), big(2)]).write_concern(w1()).await.unwrap();
    let w3 = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(3)).w_timeout(Duration::from_secs(20)).build();
    let started = Instant::now();
    coll.insert_one(doc! {"_id": 3}).write_concern(w3.clone()).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "the w:3 write took {:?}", started.elapsed());
    // The largest document there is ({_id: 4, s} of exactly 16 MiB; its oplog entry is a
    // little larger), then small writes again.
    coll.insert_one(doc! {"_id": 4, "s": "y".repeat(16 * 1024 * 1024 - 22)}).write_concern(w1()).await.unwrap();
    coll.insert_one(doc! {"_id": 5}).write_concern(w3).await.unwrap();
    for i in 1..3 {
        set.wait_for_count(i, "big", 5).await;
        let c = direct(&set.members[i]).await;
        let opts = mongodb::options::FindOptions::builder()
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred { options: None }))
            .projection(doc! {"len": {"$strLenBytes": {"$ifNull": ["$s", ""]}}})
            .sort(doc! {"_id": 1})
            .build();
        let got = collect(c.database("app").collection::<Document>("big").find(doc! {}).with_options(opts).await.unwrap()).await;
        let lens: Vec<i32> = got.iter().map(|d| d.get_i32("len").unwrap()).collect();
        assert_eq!(lens, vec![15_000_000, 15_000_000, 0, 16 * 1024 * 1024 - 22, 0], "member {i}");
    }
    // An empty member's initial sync clones them (each in a batch of its own) and then
    // fetches by the same transport.
    let newcomer = Server::start_with_args(&["--replSet", "rs0", "--logTransport", transport]);
    set.add_non_voter(0, &newcomer).await;
    set.members.push(newcomer);
    set.wait_for_secondary(3).await;
    coll.insert_one(doc! {"_id": 6, "s": "z".repeat(15_000_000)})
        .write_concern(mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(4)).w_timeout(Duration::from_secs(20)).build())
        .await
        .unwrap();
    set.wait_for_count(3, "big", 6).await;
}

#[tokio::test]
async fn near_limit_documents_replicate_by_pull() {
    near_limit_documents_replicate("pull").await;
}

#[tokio::test]
async fn near_limit_documents_replicate_by_push() {
    near_limit_documents_replicate("push").await;
}

#[tokio::test]
async fn near_limit_documents_replicate_through_shared_memory() {
    near_limit_documents_replicate("shm").await;
}

/// A w:0 write asks for no journal sync. A command after it that waits for this member's
/// journal to reach the newest entry (a drop of a missing collection waits for the newest
/// entry, as a no-op write does; so does a majority read) must not wait for some later
/// write to ask for one.
#[tokio::test]
async fn waits_after_an_unacknowledged_write_answer_at_once() {
    let mut set = Set::start(3, doc! {}, &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    set.seed("c", 1).await;
    let port = set.members[0].port;
    tokio::task::spawn_blocking(move || {
        // One connection: the w:0 insert (moreToCome, no reply) runs before the next command.
        let mut raw = wire::connect(port);
        for round in 0..5 {
            let insert = doc! {"insert": "c", "documents": [{"round": round}], "writeConcern": {"w": 0}, "$db": "app"};
            raw.write_all(&wire::op_msg(100 + round, 2, &insert)).unwrap();
            let started = Instant::now();
            let r = wire::command(&mut raw, 200 + round, &doc! {"drop": format!("missing{round}"), "$db": "app"}).doc;
            assert!(r.get_f64("ok").is_ok_and(|ok| ok == 1.0) || r.get_i32("code").ok() == Some(26), "round {round}: {r:?}");
            let r = wire::command(&mut raw, 300 + round, &doc! {"count": "c", "readConcern": {"level": "majority"}, "$db": "app"}).doc;
            assert_eq!(r.get_i32("n").ok(), Some(2 + round), "round {round}: {r:?}");
            let took = started.elapsed();
            // Milliseconds here; the bound leaves room for a loaded machine (without the fix
            // the drop waits until the read times out).
            assert!(took < Duration::from_secs(5), "round {round}: the drop and the majority read took {took:?}");
        }
    })
    .await
    .unwrap();
}

/// A member killed in the middle of its initial sync starts the sync over when it restarts
/// (the initial-sync flag says it did not finish, although its oplog may hold entries by
/// then); a member whose sync finished keeps its data across restarts and never syncs again.
#[tokio::test]
async fn an_unfinished_initial_sync_starts_over_and_a_finished_one_never_does() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("c");
    let docs: Vec<Document> = (0..3000).map(|i| doc! {"_id": i, "pad": "x".repeat(100)}).collect();
    coll.insert_many(docs).await.unwrap();
    let mut newcomer = Server::start_with_args(&["--replSet", "rs0", "--setParameter", "enableTestCommands=1"]);
    let c = direct(&newcomer).await;
    admin(&c, doc! {"configureFailPoint": "initialSyncHangAfterDataCloning", "mode": "alwaysOn"}).await.unwrap();
    set.add_non_voter(p, &newcomer).await;
    // Held after its clone: the data is here, the oplog not yet seeded.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = admin(&c, doc! {"configureFailPoint": "initialSyncHangAfterDataCloning", "mode": "alwaysOn"}).await.unwrap();
        if held.get_i64("count").unwrap() > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the initial sync did not reach the end of its clone");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(c);
    newcomer.kill9();
    newcomer.restart_with_args(&["--replSet", "rs0"]);
    set.members.push(newcomer);
    coll.insert_one(doc! {"_id": "after"})
        .write_concern(mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(4)).w_timeout(Duration::from_secs(60)).build())
        .await
        .unwrap();
    set.wait_for_secondary(3).await;
    let s = admin(&direct(&set.members[3]).await, doc! {"replSetGetStatus": 1, "initialSync": 1}).await.unwrap();
    let st = s.get_document("initialSyncStatus").unwrap();
    assert!(st.get_str("reason").unwrap().contains("did not finish"), "{st:?}");
    let want = all_on(&set.members[p], "app", "c").await;
    assert_eq!(want.len(), 3001);
    set.wait_for_count(3, "c", 3001).await;
    assert_eq!(all_on(&set.members[3], "app", "c").await, want);
    // Finished: killed and restarted twice, it keeps its data and starts no sync.
    for round in 0..2 {
        set.members[3].kill9();
        set.members[3].restart_with_args(&["--replSet", "rs0"]);
        coll.insert_one(doc! {"_id": format!("round{round}")})
            .write_concern(mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(4)).w_timeout(Duration::from_secs(60)).build())
            .await
            .unwrap();
        set.wait_for_secondary(3).await;
        let s = admin(&direct(&set.members[3]).await, doc! {"replSetGetStatus": 1, "initialSync": 1}).await.unwrap();
        assert!(s.get("initialSyncStatus").is_none(), "round {round}: {s:?}");
        assert!(!set.members[3].stderr_tail().contains("starting an initial sync"), "round {round}:\n{}", set.members[3].stderr_tail());
        // (w:4 counts an entry durable in its oplog; it is applied just after.)
        set.wait_for_count(3, "c", 3002 + round as u64).await;
    }
}

/// An initial sync is done when its oplog reaches minValid: until then the copy may hold
/// writes that only those entries confirm. A member restarted in between copies again.
#[tokio::test]
async fn a_restart_before_min_valid_copies_again() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("c");
    coll.insert_many((0..1000).map(|i| doc! {"_id": i}).collect::<Vec<_>>()).await.unwrap();
    let mut newcomer = Server::start_with_args(&["--replSet", "rs0", "--setParameter", "enableTestCommands=1"]);
    let c = direct(&newcomer).await;
    admin(&c, doc! {"configureFailPoint": "initialSyncHangAfterDataCloning", "mode": "alwaysOn"}).await.unwrap();
    set.add_non_voter(p, &newcomer).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin(&c, doc! {"configureFailPoint": "initialSyncHangAfterDataCloning", "mode": "alwaysOn"}).await.unwrap().get_i64("count").unwrap() == 0 {
        assert!(Instant::now() < deadline, "the initial sync did not reach the end of its clone");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Writes after the copy began: minValid is past them. The newcomer writes what it
    // fetches but applies nothing, so it stays short of minValid. Written to all three
    // members: the newcomer's sync source may be a secondary, whose newest entry is minValid.
    let all = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(3)).w_timeout(Duration::from_secs(60)).build();
    coll.insert_many((1000..1100).map(|i| doc! {"_id": i}).collect::<Vec<_>>()).write_concern(all).await.unwrap();
    admin(&c, doc! {"configureFailPoint": "rsSyncApplyStop", "mode": "alwaysOn"}).await.unwrap();
    admin(&c, doc! {"configureFailPoint": "initialSyncHangAfterDataCloning", "mode": "off"}).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin(&c, doc! {"replSetGetStatus": 1}).await.ok().and_then(|s| s.get_i32("myState").ok()) != Some(3) {
        assert!(Instant::now() < deadline, "the newcomer did not seed its oplog");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(c);
    newcomer.kill9();
    newcomer.restart_with_args(&["--replSet", "rs0"]);
    set.members.push(newcomer);
    set.wait_for_secondary(3).await;
    let s = admin(&direct(&set.members[3]).await, doc! {"replSetGetStatus": 1, "initialSync": 1}).await.unwrap();
    let st = s.get_document("initialSyncStatus").unwrap_or_else(|_| panic!("no second initial sync: {s:?}"));
    assert!(st.get_str("reason").unwrap().contains("did not finish"), "{st:?}");
    set.wait_for_count(3, "c", 1100).await;
    assert_eq!(all_on(&set.members[3], "app", "c").await, all_on(&set.members[p], "app", "c").await);
}

/// With an arbiter, a majority needs the primary's own journal. A majority read on the
/// secondary after a w:0 write waits for the commit point to pass that write, which no one
/// on the primary waits for: the journal flusher's interval must make it durable, as
/// mongod's does, not some later write's request.
#[tokio::test]
async fn a_majority_read_on_a_secondary_after_an_unacknowledged_write_answers_at_once() {
    let mut set = Set::start(3, doc! {}, &[doc! {}, doc! {"priority": 0}, doc! {"arbiterOnly": true}]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    set.wait_for_secondary(1).await;
    let (primary, secondary) = (set.members[0].port, set.members[1].port);
    tokio::task::spawn_blocking(move || {
        let mut p = wire::connect(primary);
        let mut s = wire::connect(secondary);
        for round in 0..5 {
            let insert = doc! {"insert": "c", "documents": [{"_id": round}], "writeConcern": {"w": 0}, "$db": "app"};
            p.write_all(&wire::op_msg(100 + round, 2, &insert)).unwrap();
            // Applied on the secondary first (so its read waits for the write's commit).
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let r = wire::command(&mut s, 200 + round, &doc! {"count": "c", "$db": "app", "$readPreference": {"mode": "secondaryPreferred"}}).doc;
                if r.get_i32("n").ok() == Some(round + 1) {
                    break;
                }
                assert!(Instant::now() < deadline, "round {round}: the secondary did not apply the write: {r:?}");
                std::thread::sleep(Duration::from_millis(10));
            }
            let started = Instant::now();
            let r = wire::command(
                &mut s,
                300 + round,
                &doc! {"count": "c", "readConcern": {"level": "majority"}, "$db": "app", "$readPreference": {"mode": "secondaryPreferred"}},
            )
            .doc;
            assert_eq!(r.get_i32("n").ok(), Some(round + 1), "round {round}: {r:?}");
            let took = started.elapsed();
            // About the flusher's 100 ms interval; the bound leaves room for a loaded machine.
            assert!(took < Duration::from_secs(5), "round {round}: the majority read took {took:?}");
        }
    })
    .await
    .unwrap();
}

/// A secondary writes fetched entries to its oplog before it applies them. An empty member
/// that syncs from it while its newest entry is ahead of its data must start its oplog at
/// the source's applied entry: from the newest one it would never apply the entries in
/// between, whose changes its clone did not see either.
#[tokio::test]
async fn an_initial_sync_from_a_secondary_whose_data_trails_its_oplog_loses_nothing() {
    let mut set = Set::start_with_args(3, doc! {}, &[doc! {}, doc! {"priority": 0}, doc! {"priority": 0}], &[&[], &[], &["--logTransport", "pull"]]).await;
    assert_eq!(set.wait_for_primary(None).await, 0);
    let coll = set.seed("c", 10).await;
    let source = direct(&set.members[2]).await;
    admin(&source, doc! {"configureFailPoint": "rsSyncApplyStop", "mode": "alwaysOn"}).await.unwrap();
    let docs: Vec<Document> = (10..510).map(|i| doc! {"_id": i}).collect();
    coll.insert_many(docs).write_concern(w1()).await.unwrap();
    // Member 2 has written entries it has not applied.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = admin(&source, doc! {"replSetGetStatus": 1}).await.unwrap();
        let optimes = s.get_document("optimes").unwrap();
        let ts = |k: &str| optimes.get_document(k).unwrap().get_timestamp("ts").unwrap();
        if ts("writtenOpTime") > ts("appliedOpTime") {
            break;
        }
        assert!(Instant::now() < deadline, "member 2 wrote nothing past what it applied: {optimes:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The newcomer reaches only member 2.
    let newcomer = Server::start_with_args(&["--replSet", "rs0", "--setParameter", "enableTestCommands=1"]);
    let nc = direct(&newcomer).await;
    for i in 0..2 {
        admin(&nc, doc! {"configureFailPoint": "replLink", "mode": "alwaysOn", "data": {"host": host(&set.members[i]), "partition": true}}).await.unwrap();
    }
    set.add_non_voter(0, &newcomer).await;
    set.members.push(newcomer);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = admin(&nc, doc! {"replSetGetStatus": 1, "initialSync": 1}).await;
        if let Some(st) = s.as_ref().ok().and_then(|s| s.get_document("initialSyncStatus").ok()) {
            if st.get_datetime("initialSyncEnd").is_ok() {
                assert_eq!(st.get_str("syncSourceHost").unwrap(), host(&set.members[2]), "{st:?}");
                break;
            }
        }
        assert!(Instant::now() < deadline, "the newcomer did not finish its initial sync: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin(&source, doc! {"configureFailPoint": "rsSyncApplyStop", "mode": "off"}).await.unwrap();
    for i in 0..2 {
        admin(&nc, doc! {"configureFailPoint": "replLink", "mode": "off", "data": {"host": host(&set.members[i])}}).await.unwrap();
    }
    coll.insert_one(doc! {"_id": "last"})
        .write_concern(mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(4)).w_timeout(Duration::from_secs(30)).build())
        .await
        .unwrap();
    set.wait_for_count(3, "c", 511).await;
    assert_eq!(all_on(&set.members[3], "app", "c").await, all_on(&set.members[0], "app", "c").await);
}

/// A rollback copies each document its undone entries touched from the new primary. Two of
/// 10 MB cannot come in one 16 MiB batch: the second comes in the next, and is not taken
/// for a document the new primary lacks (which the rollback would delete).
#[tokio::test]
async fn a_rollback_copies_back_documents_that_take_several_batches() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    let client = set.client().await;
    let coll = client.database("app").collection::<Document>("big");
    for id in 0..2 {
        coll.insert_one(doc! {"_id": id, "v": 0, "s": "x".repeat(10_000_000)}).await.unwrap();
    }
    for i in 0..3 {
        set.wait_for_count(i, "big", 2).await;
    }
    let old = host(&set.members[p]);
    set.fail_point(p, "alwaysOn", doc! {"host": "*", "partition": true}).await;
    for i in (0..3).filter(|&i| i != p) {
        set.fail_point(i, "alwaysOn", doc! {"host": old.clone(), "partition": true}).await;
    }
    // Changes only the cut-off primary gets, then rolls back.
    let lone = direct(&set.members[p]).await.database("app");
    lone.run_command(doc! {"update": "big", "updates": [{"q": {}, "u": {"$set": {"v": 1}}, "multi": true}], "writeConcern": {"w": 1}}).await.unwrap();
    let next = set.wait_for_primary(Some(p)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while set.status(p).await.unwrap().get_i32("myState").unwrap() == 1 {
        assert!(Instant::now() < deadline, "the partitioned primary did not step down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    coll.insert_one(doc! {"_id": "new"}).await.unwrap();
    for i in 0..3 {
        set.fail_point(i, "off", doc! {"host": if i == p { "*".to_string() } else { old.clone() }}).await;
    }
    let versions =
        |docs: Vec<Document>| docs.iter().map(|d| (d.get("_id").cloned(), d.get_i32("v").ok(), d.get_str("s").map_or(0, |s| s.len()))).collect::<Vec<_>>();
    let want = versions(all_on(&set.members[next], "app", "big").await);
    assert_eq!(want.len(), 3);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = try_all_on(&set.members[p], "app", "big").await.ok().map(versions);
        if got.as_ref() == Some(&want) {
            break;
        }
        assert!(Instant::now() < deadline, "the old primary has {got:?}, not {want:?}: {:?}", set.status(p).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `_id: id`'s balance in `coll`, read through `client`.
async fn balance(coll: &mongodb::Collection<Document>, id: i32) -> i32 {
    coll.find_one(doc! {"_id": id}).await.unwrap().unwrap().get_i32("balance").unwrap()
}

/// Multi-document transactions on a set: a commit's changes (a collection created in it
/// included) are invisible until it commits and then replicate whole; a second transaction
/// on a written document fails with WriteConflict (TransientTransactionError); an ordinary
/// write to it waits for the transaction; a transaction larger than one oplog entry logs a
/// chain that secondaries apply whole; and a primary that steps down aborts its open ones.
#[tokio::test]
async fn transactions_commit_whole_conflict_wait_and_end_with_the_term() {
    let mut set = Set::start(3, doc! {}, &[]).await;
    let p = set.wait_for_primary(None).await;
    for i in (0..3).filter(|i| *i != p) {
        set.wait_for_secondary(i).await;
    }
    let client = set.client().await;
    let db = client.database("bank");
    let accounts = db.collection::<Document>("accounts");
    accounts.insert_many((0..10).map(|i| doc! {"_id": i, "balance": 100})).await.unwrap();

    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    accounts.update_one(doc! {"_id": 1}, doc! {"$inc": {"balance": -30}}).session(&mut s).await.unwrap();
    accounts.update_one(doc! {"_id": 2}, doc! {"$inc": {"balance": 30}}).session(&mut s).await.unwrap();
    db.collection::<Document>("log").insert_one(doc! {"_id": "t1", "from": 1, "to": 2}).session(&mut s).await.unwrap();
    let seen = accounts.find_one(doc! {"_id": 1}).session(&mut s).await.unwrap().unwrap();
    assert_eq!(seen.get_i32("balance").unwrap(), 70, "a transaction reads its own writes");
    assert_eq!(balance(&accounts, 1).await, 100, "others do not see them before the commit");
    assert!(!db.list_collection_names().await.unwrap().contains(&"log".to_string()), "nor the collection it created");

    let mut s2 = client.start_session().await.unwrap();
    s2.start_transaction().await.unwrap();
    let e = accounts.update_one(doc! {"_id": 1}, doc! {"$inc": {"balance": 1}}).session(&mut s2).await.unwrap_err();
    assert_eq!(error_code(&e), Some(112), "{e:?}");
    assert!(e.contains_label("TransientTransactionError"), "{e:?}");
    let _ = s2.abort_transaction().await;

    let waiting = accounts.clone();
    let ordinary = tokio::spawn(async move { waiting.update_one(doc! {"_id": 1}, doc! {"$inc": {"balance": 1000}}).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!ordinary.is_finished(), "an ordinary write waits for the transaction that wrote its document");
    s.commit_transaction().await.unwrap();
    assert_eq!(ordinary.await.unwrap().unwrap().modified_count, 1);
    assert_eq!((balance(&accounts, 1).await, balance(&accounts, 2).await), (1070, 130));

    let entries = oplog_entries(&client, doc! {"op": "c", "ns": "admin.$cmd", "o.applyOps": {"$exists": true}}).await;
    assert_eq!(entries.len(), 1, "one entry for the transaction: {entries:?}");
    assert!(entries[0].get_document("lsid").is_ok() && entries[0].get_i64("txnNumber").is_ok());
    assert_eq!(entries[0].get_document("o").unwrap().get_array("applyOps").unwrap().len(), 4, "create, two updates, an insert");

    // A transaction of ~20 MiB: two entries, linked by prevOpTime.
    let big = "x".repeat(1 << 20);
    let mut s3 = client.start_session().await.unwrap();
    s3.start_transaction().await.unwrap();
    for i in 0..20 {
        db.collection::<Document>("big").insert_one(doc! {"_id": i, "pad": big.clone()}).session(&mut s3).await.unwrap();
    }
    s3.commit_transaction().await.unwrap();
    let chain = oplog_entries(&client, doc! {"op": "c", "ns": "admin.$cmd", "o.applyOps.ns": "bank.big"}).await;
    assert_eq!(chain.len(), 2, "a chain of two entries");
    assert!(chain[0].get_document("o").unwrap().get_bool("partialTxn").unwrap());
    assert_eq!(chain[1].get_document("o").unwrap().get_i64("count").unwrap(), 21);

    let status = admin(&direct(&set.members[p]).await, doc! {"serverStatus": 1}).await.unwrap();
    let txns = status.get_document("transactions").unwrap();
    assert!(txns.get_i64("totalCommitted").unwrap() >= 2 && txns.get_i64("totalAborted").unwrap() >= 1, "{txns:?}");

    // Every secondary applied both transactions whole.
    for i in (0..3).filter(|i| *i != p) {
        let c = direct(&set.members[i]).await;
        let sdb = c.database("bank");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let big_count = sdb.collection::<Document>("big").count_documents(doc! {}).await.unwrap_or(0);
            if big_count == 20 && balance(&sdb.collection("accounts"), 1).await == 1070 {
                break;
            }
            assert!(big_count == 0 || big_count == 20, "member {i} shows part of a transaction: {big_count} documents");
            assert!(Instant::now() < deadline, "member {i} did not apply the transactions");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(balance(&sdb.collection("accounts"), 2).await, 130);
        assert!(sdb.collection::<Document>("log").find_one(doc! {"_id": "t1"}).await.unwrap().is_some());
    }

    // A primary that steps down aborts its open transactions.
    let mut s4 = client.start_session().await.unwrap();
    s4.start_transaction().await.unwrap();
    accounts.insert_one(doc! {"_id": 99, "balance": 1}).session(&mut s4).await.unwrap();
    let _ = admin(&direct(&set.members[p]).await, doc! {"replSetStepDown": 30, "force": true}).await;
    let q = set.wait_for_primary(Some(p)).await;
    assert!(s4.commit_transaction().await.is_err(), "a transaction of a deposed primary does not commit");
    let on_new = direct(&set.members[q]).await;
    assert!(on_new.database("bank").collection::<Document>("accounts").find_one(doc! {"_id": 99}).await.unwrap().is_none());
    // A commit retried on the new primary finds the transaction committed, from its record.
    s.commit_transaction().await.unwrap();
}

async fn oplog_entries(client: &Client, filter: Document) -> Vec<Document> {
    let oplog = client.database("local").collection::<Document>("oplog.rs");
    collect(oplog.find(filter).sort(doc! {"$natural": 1}).await.unwrap()).await
}
