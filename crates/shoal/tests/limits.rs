//! Resource limits against the real binary: connections beyond `--maxConns` are refused
//! and counted, idle cursors time out (and `noCursorTimeout` ones do not), a client that
//! stops reading its replies holds back only its own connection without growing the
//! server's memory, and a blocking sort beyond its memory limit is refused with MongoDB's
//! error instead of growing without bound, while a sort with a limit holds only its top k.

mod common;

use common::wire::*;
use common::*;
use mongodb::bson::{doc, Binary, Bson, Document};
use std::io::Write;
use std::time::{Duration, Instant};

fn server_status(s: &mut std::net::TcpStream, request_id: i32) -> Document {
    let r = command(s, request_id, &doc! {"serverStatus": 1, "$db": "admin"});
    assert_eq!(num(r.doc.get("ok").unwrap_or(&Bson::Null)), Some(1.0), "{:?}", r.doc);
    r.doc
}

#[test]
fn connections_beyond_max_conns_are_refused_and_counted() {
    const MAX_CONNS: usize = 3;
    let server = Server::start_with_args(&["--maxConns", &MAX_CONNS.to_string()]);
    // The server's own readiness probe may still be counted for a moment: retry until
    // MAX_CONNS connections are served.
    let mut held: Vec<std::net::TcpStream> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while held.len() < MAX_CONNS {
        let mut s = connect(server.port);
        // A refused connection may already be closed when we write: that is a refusal too.
        let sent = s.write_all(&op_msg(1, 0, &doc! {"hello": 1, "$db": "admin"})).map_err(|e| e.to_string());
        match sent.and_then(|_| read_reply(&mut s)) {
            Ok(r) => {
                assert_eq!(r.doc.get_bool("isWritablePrimary").ok(), Some(true), "{:?}", r.doc);
                held.push(s);
            }
            Err(_) => assert!(Instant::now() < deadline, "connection {} of {MAX_CONNS} refused", held.len() + 1),
        }
    }
    let status = server_status(&mut held[0], 2);
    let conns = status.get_document("connections").expect("connections");
    assert_eq!(num_field(conns, "current"), MAX_CONNS as f64, "{conns:?}");
    assert_eq!(num_field(conns, "available"), 0.0, "{conns:?}");
    let rejected_before = num_field(conns, "rejected");

    // One more: accepted by the kernel, closed by the server before any reply.
    let mut extra = connect(server.port);
    let _ = extra.write_all(&op_msg(3, 0, &doc! {"hello": 1, "$db": "admin"}));
    assert!(closed_by_server(&mut extra), "a connection beyond maxConns was served");
    let status = server_status(&mut held[0], 4);
    let conns = status.get_document("connections").expect("connections");
    assert_eq!(num_field(conns, "rejected"), rejected_before + 1.0, "{conns:?}");
    assert_eq!(num_field(conns, "current"), MAX_CONNS as f64, "{conns:?}");

    // The held connections still work, and closing one makes room for a new one.
    for (i, s) in held.iter_mut().enumerate() {
        let r = command(s, 10 + i as i32, &doc! {"ping": 1, "$db": "admin"});
        assert_eq!(num(r.doc.get("ok").unwrap_or(&Bson::Null)), Some(1.0));
    }
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut s = connect(server.port);
        if s.write_all(&op_msg(20, 0, &doc! {"ping": 1, "$db": "admin"})).is_ok() && read_reply(&mut s).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "no room after a connection closed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn idle_cursors_time_out_and_no_timeout_cursors_stay() {
    let server = Server::start_with_args(&["--setParameter", "cursorTimeoutMillis=300"]);
    let mut s = connect(server.port);
    let docs: Vec<Document> = (0..5).map(|i| doc! {"_id": i}).collect();
    let r = command(&mut s, 1, &doc! {"insert": "c", "documents": docs, "$db": "limits"});
    assert_eq!(num_field(&r.doc, "n"), 5.0, "{:?}", r.doc);
    let open = |s: &mut std::net::TcpStream, id: i32, no_timeout: bool| -> i64 {
        let r = command(s, id, &doc! {"find": "c", "batchSize": 1, "noCursorTimeout": no_timeout, "$db": "limits"});
        let cursor = r.doc.get_document("cursor").unwrap_or_else(|_| panic!("{:?}", r.doc));
        cursor.get_i64("id").expect("cursor id")
    };
    let idle = open(&mut s, 2, false);
    let kept = open(&mut s, 3, true);
    assert!(idle != 0 && kept != 0);

    // The reaper runs every 4 s (MongoDB's clientCursorMonitor period). Watch the open count
    // without touching either cursor, since a getMore would make it busy again.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut id = 10;
    loop {
        id += 1;
        let status = server_status(&mut s, id);
        let open = path(&status, "metrics.cursor.open.total").and_then(num).expect("metrics.cursor.open.total");
        if open <= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "an idle cursor outlived its timeout by 20 s: {open} open");
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = command(&mut s, 100, &doc! {"getMore": idle, "collection": "c", "$db": "limits"});
    assert_eq!(num_field(&r.doc, "code"), 43.0, "{:?}", r.doc);
    assert_eq!(r.doc.get_str("codeName").ok(), Some("CursorNotFound"), "{:?}", r.doc);
    let r = command(&mut s, 101, &doc! {"getMore": kept, "collection": "c", "batchSize": 10, "$db": "limits"});
    let batch = path(&r.doc, "cursor.nextBatch").and_then(|b| b.as_array()).unwrap_or_else(|| panic!("{:?}", r.doc));
    assert_eq!(batch.len(), 4, "the noCursorTimeout cursor lost its place: {:?}", r.doc);
}

#[test]
fn a_client_that_stops_reading_holds_back_only_itself() {
    /// Documents of `DOC_BYTES` each: one find returns them all, `REPLY_BYTES` in one batch.
    const DOCS: i32 = 800;
    const DOC_BYTES: usize = 10_000;
    const REPLY_BYTES: u64 = DOCS as u64 * DOC_BYTES as u64;
    /// Finds sent without reading: their replies together are 40 times one reply.
    const REQUESTS: i32 = 40;
    let server = Server::start();
    let mut s = connect(server.port);
    for chunk in 0..DOCS / 100 {
        let docs: Vec<Document> = (0..100).map(|i| doc! {"_id": chunk * 100 + i, "p": Binary { subtype: mongodb::bson::spec::BinarySubtype::Generic, bytes: vec![(i % 251) as u8; DOC_BYTES] }}).collect();
        let r = command(&mut s, chunk + 1, &doc! {"insert": "c", "documents": docs, "$db": "limits"});
        assert_eq!(num_field(&r.doc, "n"), 100.0, "{:?}", r.doc);
    }
    let pid = server.pid().expect("server pid");
    let rss_before = proc_status_bytes(pid, "VmRSS");

    let mut slow = connect(server.port);
    for i in 0..REQUESTS {
        slow.write_all(&op_msg(1000 + i, 0, &doc! {"find": "c", "batchSize": DOCS, "$db": "limits"})).expect("write find");
    }
    // Let the server fill the socket and stall on it.
    std::thread::sleep(Duration::from_secs(2));
    let rss_stalled = proc_status_bytes(pid, "VmRSS");
    // Another client is served meanwhile.
    let mut other = connect(server.port);
    let r = command(&mut other, 1, &doc! {"count": "c", "$db": "limits"});
    assert_eq!(num_field(&r.doc, "n"), DOCS as f64, "{:?}", r.doc);
    // The server holds at most a few replies for the stalled client, not all of them.
    assert!(
        rss_stalled < rss_before + 4 * REPLY_BYTES,
        "RSS grew by {} MB for a client that does not read ({} MB of replies asked for)",
        (rss_stalled.saturating_sub(rss_before)) >> 20,
        (REPLY_BYTES * REQUESTS as u64) >> 20
    );

    // Nothing is lost: every reply arrives whole, in order, when the client reads again.
    for i in 0..REQUESTS {
        let r = read_reply(&mut slow).unwrap_or_else(|e| panic!("reply {i}: {e}"));
        assert_eq!(r.response_to, 1000 + i);
        let batch = path(&r.doc, "cursor.firstBatch").and_then(|b| b.as_array()).unwrap_or_else(|| panic!("{:?}", r.doc.get("errmsg")));
        assert_eq!(batch.len(), DOCS as usize, "reply {i}");
    }
}

#[test]
fn a_blocking_sort_beyond_its_memory_limit_is_refused_and_a_top_k_sort_is_not() {
    /// mongod's internalQueryMaxBlockingSortMemoryUsageBytes, set low so that a few MB of
    /// documents exceed it.
    const SORT_BYTES_MAX: usize = 2_000_000;
    const DOCS: usize = 40;
    const DOC_BYTES: usize = 100_000;
    let server = Server::start_with_args(&["--setParameter", &format!("internalQueryMaxBlockingSortMemoryUsageBytes={SORT_BYTES_MAX}")]);
    let mut s = connect(server.port);
    let r = command(&mut s, 1, &doc! {"getParameter": 1, "internalQueryMaxBlockingSortMemoryUsageBytes": 1, "$db": "admin"});
    assert_eq!(num_field(&r.doc, "internalQueryMaxBlockingSortMemoryUsageBytes"), SORT_BYTES_MAX as f64, "{:?}", r.doc);
    // Twice the limit, unindexed on k.
    let docs: Vec<Document> = (0..DOCS).map(|i| doc! {"_id": i as i64, "k": (i * 7919 % 1000) as i64, "p": Binary { subtype: mongodb::bson::spec::BinarySubtype::Generic, bytes: vec![7; DOC_BYTES] }}).collect();
    let r = command(&mut s, 2, &doc! {"insert": "c", "documents": docs, "$db": "limits"});
    assert_eq!(num_field(&r.doc, "n"), DOCS as f64, "{:?}", r.doc);

    let r = command(&mut s, 3, &doc! {"find": "c", "sort": {"k": 1}, "projection": {"p": 0}, "$db": "limits"});
    assert_eq!(num_field(&r.doc, "code"), 292.0, "{:?}", r.doc);
    assert_eq!(r.doc.get_str("codeName").ok(), Some("QueryExceededMemoryLimitNoDiskUseAllowed"));
    let errmsg = r.doc.get_str("errmsg").unwrap_or_default();
    assert!(errmsg.contains(&format!("Sort exceeded memory limit of {SORT_BYTES_MAX} bytes")), "{errmsg}");

    // With a limit, only the best skip + limit are held (mongod's top-k sort): allowed, and
    // in the right order.
    let r = command(&mut s, 4, &doc! {"find": "c", "sort": {"k": 1}, "skip": 2, "limit": 3, "projection": {"p": 0}, "$db": "limits"});
    let batch = path(&r.doc, "cursor.firstBatch").and_then(|b| b.as_array()).unwrap_or_else(|| panic!("{:?}", r.doc));
    let mut ks: Vec<i64> = (0..DOCS).map(|i| (i * 7919 % 1000) as i64).collect();
    ks.sort();
    let got: Vec<i64> = batch.iter().map(|d| d.as_document().and_then(|d| d.get_i64("k").ok()).unwrap_or(-1)).collect();
    assert_eq!(got, ks[2..5].to_vec(), "{:?}", r.doc);
    // findOne-style: limit 1, the smallest.
    let r = command(&mut s, 5, &doc! {"find": "c", "sort": {"k": -1}, "limit": 1, "singleBatch": true, "projection": {"p": 0}, "$db": "limits"});
    let batch = path(&r.doc, "cursor.firstBatch").and_then(|b| b.as_array()).unwrap_or_else(|| panic!("{:?}", r.doc));
    assert_eq!(batch.len(), 1);
    assert_eq!(batch[0].as_document().and_then(|d| d.get_i64("k").ok()), ks.last().copied());
    // A limit so large that its top k is the whole collection is refused like no limit.
    let r = command(&mut s, 6, &doc! {"find": "c", "sort": {"k": 1}, "limit": 1000, "projection": {"p": 0}, "$db": "limits"});
    assert_eq!(num_field(&r.doc, "code"), 292.0, "{:?}", r.doc);
    // allowDiskUse lifts the limit (shoal sorts in memory up to its own larger bound).
    let r = command(&mut s, 7, &doc! {"find": "c", "sort": {"k": 1}, "allowDiskUse": true, "batchSize": DOCS as i32, "projection": {"p": 0}, "$db": "limits"});
    let batch = path(&r.doc, "cursor.firstBatch").and_then(|b| b.as_array()).unwrap_or_else(|| panic!("{:?}", r.doc));
    assert_eq!(batch.len(), DOCS);
    // The parameter is checked at startup.
    let mut bad = std::process::Command::new(binary_path())
        .args([
            "serve",
            "--port",
            &free_port().to_string(),
            "--dbpath",
            server.root.join("bad").to_str().unwrap(),
            "--setParameter",
            "internalQueryMaxBlockingSortMemoryUsageBytes=0",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let status = bad.wait().expect("wait");
    assert!(!status.success(), "a zero sort memory limit was accepted");
}
