//! Many simultaneous clients: 1000 connections held open at once, each doing a ping.

mod common;

use common::wire::{op_msg, parse_reply, HEADER_SIZE_BYTES, REPLY_SIZE_BYTES_MAX};
use common::*;
use mongodb::bson::{doc, Document};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONNECTIONS_COUNT: usize = 1000;
/// Descriptors needed by this process: the connections plus driver pools and slack.
const NOFILE_NEEDED: u64 = CONNECTIONS_COUNT as u64 + 200;
/// Safety bound so a stuck server fails the test instead of hanging the suite.
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);

async fn request(s: &mut TcpStream, request_id: i32, body: &Document) -> Result<Document, String> {
    s.write_all(&op_msg(request_id, 0, body)).await.map_err(|e| format!("write: {e}"))?;
    let mut header = [0u8; 16];
    s.read_exact(&mut header).await.map_err(|e| format!("read header: {e}"))?;
    let len = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if len < HEADER_SIZE_BYTES as i32 || len as usize > REPLY_SIZE_BYTES_MAX {
        return Err(format!("reply length {len}"));
    }
    let mut rest = vec![0u8; len as usize - HEADER_SIZE_BYTES];
    s.read_exact(&mut rest).await.map_err(|e| format!("read body: {e}"))?;
    let r = parse_reply(&header, &rest)?;
    if r.response_to != request_id {
        return Err(format!("responseTo {} for request {request_id}", r.response_to));
    }
    Ok(r.doc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_connections() {
    // The server inherits this limit, so raise it before starting it.
    let nofile = raise_nofile_limit();
    assert!(nofile >= NOFILE_NEEDED, "RLIMIT_NOFILE is {nofile}, need {NOFILE_NEEDED}: raise the hard limit (ulimit -Hn)");
    let server = Server::start();
    let port = server.port;

    // Open all connections and ping on each one, concurrently; every socket stays open.
    let tasks: Vec<_> = (0..CONNECTIONS_COUNT)
        .map(|i| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| format!("connect {i}: {e}"))?;
                s.set_nodelay(true).map_err(|e| e.to_string())?;
                let hello = request(&mut s, 1, &doc! {"hello": 1, "client": {"application": {"name": format!("conn-{i}")}}, "$db": "admin"}).await?;
                if hello.get_bool("isWritablePrimary").ok() != Some(true) {
                    return Err(format!("hello {i}: {hello:?}"));
                }
                let pong = request(&mut s, 2, &doc! {"ping": 1, "$db": "admin"}).await?;
                if pong.get("ok").and_then(num) != Some(1.0) {
                    return Err(format!("ping {i}: {pong:?}"));
                }
                Ok::<TcpStream, String>(s)
            })
        })
        .collect();
    let mut sockets = Vec::with_capacity(CONNECTIONS_COUNT);
    let mut failures = Vec::new();
    let joined = tokio::time::timeout(PHASE_TIMEOUT, async {
        for t in tasks {
            match t.await {
                Ok(Ok(s)) => sockets.push(s),
                Ok(Err(e)) => failures.push(e),
                Err(e) => failures.push(format!("task: {e}")),
            }
        }
    })
    .await;
    assert!(joined.is_ok(), "connections did not all answer within {PHASE_TIMEOUT:?}");
    assert!(failures.is_empty(), "{} of {CONNECTIONS_COUNT} connections failed, e.g. {:?}", failures.len(), failures.iter().take(5).collect::<Vec<_>>());
    assert_eq!(sockets.len(), CONNECTIONS_COUNT);

    // The server counts them all as current.
    let client = server.client().await;
    let status = client.database("admin").run_command(doc! {"serverStatus": 1}).await.expect("serverStatus");
    let current = num_field(status.get_document("connections").expect("connections"), "current");
    assert!(current >= CONNECTIONS_COUNT as f64, "connections.current {current} < {CONNECTIONS_COUNT}");

    // Every held connection still answers, all at once.
    let second: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            tokio::spawn(async move {
                let r = request(&mut s, 3, &doc! {"ping": 1, "$db": "admin"}).await.map_err(|e| format!("second ping {i}: {e}"))?;
                if r.get("ok").and_then(num) != Some(1.0) {
                    return Err(format!("second ping {i}: {r:?}"));
                }
                Ok::<TcpStream, String>(s)
            })
        })
        .collect();
    let mut sockets = Vec::new();
    let joined = tokio::time::timeout(PHASE_TIMEOUT, async {
        for t in second {
            match t.await {
                Ok(Ok(s)) => sockets.push(s),
                Ok(Err(e)) => failures.push(e),
                Err(e) => failures.push(format!("task: {e}")),
            }
        }
    })
    .await;
    assert!(joined.is_ok(), "second pings did not all answer within {PHASE_TIMEOUT:?}");
    assert!(failures.is_empty(), "{failures:?}");
    drop(sockets);

    // After they all close, the server is fine and the count drops again.
    ping(&client).await.expect("ping after closing 1000 connections");
    let mut current = f64::MAX;
    for _ in 0..200 {
        let status = client.database("admin").run_command(doc! {"serverStatus": 1}).await.expect("serverStatus");
        current = num_field(status.get_document("connections").expect("connections"), "current");
        if current < 100.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(current < 100.0, "connections.current stays at {current} after the clients closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_clients_in_parallel() {
    raise_nofile_limit();
    let server = Server::start();
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(server.client_with("maxPoolSize=50").await);
    }
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for i in 0..100 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let coll = client.database("par").collection::<Document>("c");
                coll.insert_one(doc! {"_id": (c * 1000 + i) as i64}).await.map_err(|e| e.to_string())?;
                ping(&client).await.map_err(|e| e.to_string())?;
                Ok::<(), String>(())
            }));
        }
    }
    let mut failures = Vec::new();
    for t in tasks {
        match tokio::time::timeout(PHASE_TIMEOUT, t).await {
            Ok(Ok(Ok(()))) => {}
            other => failures.push(format!("{other:?}")),
        }
    }
    assert!(failures.is_empty(), "{} failures, e.g. {:?}", failures.len(), failures.first());
    let n = clients[0].database("par").collection::<Document>("c").count_documents(doc! {}).await.expect("count");
    assert_eq!(n, 1000);
}
