//! Hostile and legacy wire input over raw TCP. After every case the server must still be
//! alive and serve a fresh driver client.

mod common;

use common::wire::*;
use common::*;
use mongodb::bson::{doc, Bson, Document};
use std::io::Write;
use std::net::Shutdown;
use std::time::Duration;

/// Cases where both a reply and a close are fine need not wait the full read timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

async fn assert_alive(server: &mut Server, case: &str) {
    assert!(server.is_running(), "server died after {case}:\n{}", server.stderr_tail());
    let client = server.client().await;
    ping(&client).await.unwrap_or_else(|e| panic!("ping failed after {case}: {e}"));
    // And a raw connection still gets answers.
    let mut s = connect(server.port);
    let r = command(&mut s, 7, &doc! {"ping": 1, "$db": "admin"});
    assert_eq!(r.doc.get("ok").and_then(num), Some(1.0), "after {case}: {:?}", r.doc);
}

/// An error reply (ok:0 with a numeric code) or a closed connection; never a crash or a hang.
fn error_or_close(s: &mut std::net::TcpStream, case: &str) {
    // Closed (or unreadable garbage back) is acceptable.
    if let Ok(r) = read_reply(s) {
        assert_eq!(r.doc.get("ok").and_then(num), Some(0.0), "{case}: expected an error reply, got {:?}", r.doc);
        assert!(r.doc.get("code").and_then(num).is_some(), "{case}: error without code: {:?}", r.doc);
    }
}

#[tokio::test]
async fn garbage_and_broken_frames_do_not_hurt_the_server() {
    let mut server = Server::start();

    // HTTP on the wire port: MongoDB answers with a notice and closes.
    let mut s = connect(server.port);
    s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").expect("write");
    assert!(closed_by_server(&mut s), "server kept an HTTP connection open");
    assert_alive(&mut server, "http garbage").await;

    // Random-looking bytes whose length field is negative.
    let mut s = connect(server.port);
    let garbage: Vec<u8> = (0..1000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 0x80).collect();
    s.write_all(&garbage).expect("write");
    assert!(closed_by_server(&mut s), "server kept a garbage connection open");
    assert_alive(&mut server, "random garbage").await;

    // A header claiming a 2 GB message: refused without allocating it.
    let mut s = connect(server.port);
    let mut header = Vec::new();
    header.extend_from_slice(&0x7FFF_FFF0_i32.to_le_bytes());
    header.extend_from_slice(&1_i32.to_le_bytes());
    header.extend_from_slice(&0_i32.to_le_bytes());
    header.extend_from_slice(&OP_MSG.to_le_bytes());
    s.write_all(&header).expect("write");
    assert!(closed_by_server(&mut s), "server waited for a 2 GB message");
    assert_alive(&mut server, "2 GB header").await;

    // Length smaller than a header.
    let mut s = connect(server.port);
    s.write_all(&frame(1, 0, OP_MSG, &[])[..12]).expect("write");
    let mut tiny = Vec::new();
    tiny.extend_from_slice(&4_i32.to_le_bytes());
    tiny.extend_from_slice(&[0u8; 12]);
    s.write_all(&tiny).expect("write");
    let _ = s.shutdown(Shutdown::Write);
    let _ = closed_by_server(&mut s);
    assert_alive(&mut server, "tiny length").await;

    // A truncated message, then the client goes away.
    let mut s = connect(server.port);
    let full = op_msg(2, 0, &doc! {"ping": 1, "$db": "admin"});
    s.write_all(&full[..full.len() / 2]).expect("write");
    drop(s);
    assert_alive(&mut server, "truncated then close").await;

    // Truncated while the client keeps the socket half-open.
    let mut s = connect(server.port);
    s.write_all(&full[..20]).expect("write");
    let _ = s.shutdown(Shutdown::Write);
    let _ = closed_by_server(&mut s);
    assert_alive(&mut server, "truncated then half-close").await;

    // Unknown op code with a well-formed length.
    let mut s = connect(server.port);
    s.set_read_timeout(Some(PROBE_TIMEOUT)).expect("timeout");
    s.write_all(&frame(3, 0, 9999, &[0u8; 32])).expect("write");
    let _ = closed_by_server(&mut s);
    assert_alive(&mut server, "unknown opcode").await;

    // Legacy op codes (OP_INSERT 2002, OP_GET_MORE 2005, ...) whose bodies do not decode.
    for op in [2002, 2005, 2006, 2007] {
        let mut s = connect(server.port);
        s.set_read_timeout(Some(PROBE_TIMEOUT)).expect("timeout");
        s.write_all(&frame(4, 0, op, &[0u8; 24])).expect("write");
        let _ = closed_by_server(&mut s);
        assert_alive(&mut server, &format!("legacy opcode {op}")).await;
    }
}

#[tokio::test]
async fn malformed_op_msg_variants() {
    let mut server = Server::start();

    // Body BSON whose length field overruns the section.
    let mut s = connect(server.port);
    let mut body = Vec::new();
    body.extend_from_slice(&0_u32.to_le_bytes());
    body.push(0);
    body.extend_from_slice(&1000_i32.to_le_bytes());
    body.extend_from_slice(&[0x10, b'p', 0, 1, 0, 0, 0, 0]);
    s.write_all(&frame(10, 0, OP_MSG, &body)).expect("write");
    error_or_close(&mut s, "overrunning BSON length");
    assert_alive(&mut server, "overrunning BSON length").await;

    // BSON with a bogus element type and a missing terminator.
    let mut s = connect(server.port);
    let mut bad = bson_bytes(&doc! {"ping": 1, "$db": "admin"});
    bad[4] = 0x77; // element type that does not exist
    let n = bad.len();
    bad[n - 1] = 0x01; // no trailing NUL
    let mut body = Vec::new();
    body.extend_from_slice(&0_u32.to_le_bytes());
    body.push(0);
    body.extend_from_slice(&bad);
    s.write_all(&frame(11, 0, OP_MSG, &body)).expect("write");
    error_or_close(&mut s, "invalid element type");
    assert_alive(&mut server, "invalid element type").await;

    // A string element whose length runs past the document.
    let mut s = connect(server.port);
    let mut d = Vec::new();
    let mut elems = vec![0x02u8, b'a', 0];
    elems.extend_from_slice(&0x7FFF_0000_i32.to_le_bytes());
    elems.extend_from_slice(b"xy\0");
    d.extend_from_slice(&((elems.len() + 5) as i32).to_le_bytes());
    d.extend_from_slice(&elems);
    d.push(0);
    let mut body = Vec::new();
    body.extend_from_slice(&0_u32.to_le_bytes());
    body.push(0);
    body.extend_from_slice(&d);
    s.write_all(&frame(12, 0, OP_MSG, &body)).expect("write");
    error_or_close(&mut s, "overlong string");
    assert_alive(&mut server, "overlong string").await;

    // No sections at all.
    let mut s = connect(server.port);
    s.write_all(&frame(13, 0, OP_MSG, &0_u32.to_le_bytes())).expect("write");
    error_or_close(&mut s, "no sections");
    assert_alive(&mut server, "no sections").await;

    // Unknown section kind.
    let mut s = connect(server.port);
    let mut body = op_msg_body(0, &doc! {"ping": 1, "$db": "admin"}, &[]);
    body.push(9);
    body.extend_from_slice(&[1, 2, 3, 4, 5]);
    s.write_all(&frame(14, 0, OP_MSG, &body)).expect("write");
    error_or_close(&mut s, "unknown section kind");
    assert_alive(&mut server, "unknown section kind").await;

    // Unknown required flag bit (bits 0-15 must be understood).
    let mut s = connect(server.port);
    s.write_all(&op_msg(15, 1 << 5, &doc! {"ping": 1, "$db": "admin"})).expect("write");
    error_or_close(&mut s, "unknown required flag");
    assert_alive(&mut server, "unknown required flag").await;

    // Wrong CRC-32C with checksumPresent; the correct one is accepted.
    let mut s = connect(server.port);
    s.write_all(&op_msg_with_checksum(16, &doc! {"ping": 1, "$db": "admin"}, true)).expect("write");
    error_or_close(&mut s, "wrong checksum");
    assert_alive(&mut server, "wrong checksum").await;
    let mut s = connect(server.port);
    s.write_all(&op_msg_with_checksum(17, &doc! {"ping": 1, "$db": "admin"}, false)).expect("write");
    let r = read_reply(&mut s).expect("reply to a correctly checksummed message");
    assert_eq!(r.response_to, 17);
    assert_eq!(r.doc.get("ok").and_then(num), Some(1.0), "{:?}", r.doc);

    // Command without $db: an error reply (40571), connection stays usable.
    let mut s = connect(server.port);
    let r = command(&mut s, 18, &doc! {"ping": 1});
    assert_eq!(r.doc.get("ok").and_then(num), Some(0.0), "{:?}", r.doc);
    let r = command(&mut s, 19, &doc! {"ping": 1, "$db": "admin"});
    assert_eq!(r.doc.get("ok").and_then(num), Some(1.0));

    // Empty command document.
    let mut s = connect(server.port);
    let r = command(&mut s, 20, &doc! {});
    assert_eq!(r.doc.get("ok").and_then(num), Some(0.0), "{:?}", r.doc);

    // Nesting far deeper than any parser's recursion should follow (MongoDB caps depth).
    let depth_levels = 20_000;
    let mut nested = Vec::new();
    // Built inside out as raw bytes: {a: {a: {... {}}}}
    let mut inner: Vec<u8> = vec![5, 0, 0, 0, 0];
    for _ in 0..depth_levels {
        let mut outer = Vec::with_capacity(inner.len() + 8);
        let len = (4 + 1 + 2 + inner.len() + 1) as i32;
        outer.extend_from_slice(&len.to_le_bytes());
        outer.push(0x03);
        outer.extend_from_slice(b"a\0");
        outer.extend_from_slice(&inner);
        outer.push(0);
        inner = outer;
    }
    nested.extend_from_slice(&inner);
    let cmd_prefix = bson_bytes(&doc! {"insert": "deep", "$db": "test"});
    let mut body = Vec::new();
    body.extend_from_slice(&0_u32.to_le_bytes());
    body.push(0);
    body.extend_from_slice(&cmd_prefix);
    body.push(1);
    let mut payload = b"documents\0".to_vec();
    payload.extend_from_slice(&nested);
    body.extend_from_slice(&((payload.len() + 4) as i32).to_le_bytes());
    body.extend_from_slice(&payload);
    let mut s = connect(server.port);
    s.write_all(&frame(21, 0, OP_MSG, &body)).expect("write");
    if let Ok(r) = read_reply(&mut s) {
        let failed = r.doc.get("ok").and_then(num) == Some(0.0) || r.doc.get_array("writeErrors").map(|w| !w.is_empty()).unwrap_or(false);
        assert!(failed, "a 20000-level document must be rejected: {:?}", r.doc);
    }
    assert_alive(&mut server, "deep nesting").await;
    let client = server.client().await;
    assert_eq!(client.database("test").collection::<Document>("deep").count_documents(doc! {}).await.expect("count"), 0);
}

#[tokio::test]
async fn wrong_field_types_get_error_replies() {
    let mut server = Server::start();
    let mut s = connect(server.port);
    let cases = vec![
        doc! {"insert": 5, "documents": "x", "$db": "test"},
        doc! {"insert": "c", "documents": "x", "$db": "test"},
        doc! {"insert": "c", "documents": [1, 2], "$db": "test"},
        doc! {"find": "c", "filter": "nope", "$db": "test"},
        doc! {"find": "c", "limit": "ten", "$db": "test"},
        doc! {"find": "c", "sort": 1, "$db": "test"},
        doc! {"update": "c", "updates": {"q": {}}, "$db": "test"},
        doc! {"delete": "c", "deletes": [{"q": {}}], "$db": "test"},
        doc! {"getMore": "abc", "collection": "c", "$db": "test"},
        doc! {"aggregate": "c", "pipeline": {"$match": {}}, "cursor": {}, "$db": "test"},
        doc! {"aggregate": "c", "pipeline": [5], "cursor": {}, "$db": "test"},
        doc! {"createIndexes": "c", "indexes": [{"key": 1}], "$db": "test"},
        doc! {"count": ["c"], "$db": "test"},
        doc! {"find": "c", "batchSize": -1, "$db": "test"},
        doc! {"insert": "c", "documents": [{"_id": [1, 2]}], "$db": "test"},
        doc! {"insert": "", "documents": [{}], "$db": "test"},
        doc! {"find": "c", "$db": ""},
        doc! {"find": "c", "$db": 5},
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let r = command(&mut s, 100 + i as i32, &case);
        let failed = r.doc.get("ok").and_then(num) == Some(0.0) || r.doc.get_array("writeErrors").map(|w| !w.is_empty()).unwrap_or(false);
        assert!(failed, "{case:?} must fail, got {:?}", r.doc);
        if r.doc.get("ok").and_then(num) == Some(0.0) {
            assert!(r.doc.get("code").and_then(num).is_some(), "{:?}", r.doc);
            assert!(r.doc.get_str("codeName").is_ok(), "{:?}", r.doc);
            assert!(r.doc.get_str("errmsg").is_ok(), "{:?}", r.doc);
        }
        // The same connection keeps working.
        let p = command(&mut s, 200 + i as i32, &doc! {"ping": 1, "$db": "admin"});
        assert_eq!(p.doc.get("ok").and_then(num), Some(1.0), "after {case:?}");
    }
    // `_id` may not be an array (InvalidIdField 2? MongoDB: code 53 InvalidIdField).
    let r = command(&mut s, 300, &doc! {"insert": "c", "documents": [{"_id": [1]}], "$db": "test"});
    let we = r.doc.get_array("writeErrors").expect("writeErrors")[0].as_document().expect("doc").clone();
    assert_eq!(we.get("code").and_then(num), Some(53.0), "{we:?}");
    assert_alive(&mut server, "wrong field types").await;
}

#[tokio::test]
async fn oversized_documents() {
    let mut server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("big");

    // Just under 16 MiB is legal and round-trips.
    let near = "n".repeat(16 * 1024 * 1024 - 100);
    coll.insert_one(doc! {"_id": "near", "s": near.clone()}).await.expect("insert 16 MiB - 100 B document");
    let back = coll.find_one(doc! {"_id": "near"}).await.expect("find").expect("present");
    assert_eq!(back.get_str("s").map(|s| s.len()).ok(), Some(near.len()));
    drop(back);

    // 17 MB through the driver: rejected by the driver or with BSONObjectTooLarge (10334).
    let huge = "h".repeat(17 * 1024 * 1024);
    let r = coll.insert_one(doc! {"_id": "huge", "s": huge.clone()}).await;
    let e = r.expect_err("17 MB document must be rejected");
    if let Some(code) = error_code(&e) {
        assert_eq!(code, 10334, "{e}");
    }
    assert_alive(&mut server, "17 MB driver insert").await;

    // 17 MB by hand, bypassing any driver-side check: the server answers 10334.
    let mut s = connect(server.port);
    let body = op_msg_body(0, &doc! {"insert": "big", "$db": "test"}, &[("documents", vec![doc! {"_id": "huge", "s": huge}])]);
    s.write_all(&frame(30, 0, OP_MSG, &body)).expect("write");
    let r = read_reply(&mut s).expect("server must answer a 17 MB insert, not drop it");
    let top = r.doc.get("code").and_then(num);
    let per_doc = r.doc.get_array("writeErrors").ok().and_then(|w| w.first()).and_then(|w| w.as_document()).and_then(|w| w.get("code")).and_then(num);
    assert!(top == Some(10334.0) || per_doc == Some(10334.0), "expected BSONObjectTooLarge (10334): {:?}", r.doc);
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("big");
    assert_eq!(coll.count_documents(doc! {"_id": "huge"}).await.expect("count"), 0);

    // A message over maxMessageSizeBytes (48 MB) is refused by length alone.
    let mut s = connect(server.port);
    let mut header = Vec::new();
    header.extend_from_slice(&(49_000_000_i32).to_le_bytes());
    header.extend_from_slice(&31_i32.to_le_bytes());
    header.extend_from_slice(&0_i32.to_le_bytes());
    header.extend_from_slice(&OP_MSG.to_le_bytes());
    s.write_all(&header).expect("write");
    assert!(closed_by_server(&mut s), "server accepted a 49 MB length");
    assert_alive(&mut server, "49 MB header").await;
}

#[tokio::test]
async fn legacy_op_query_handshake() {
    let mut server = Server::start();
    for name in ["isMaster", "ismaster", "hello"] {
        let mut s = connect(server.port);
        s.write_all(&op_query(40, "admin.$cmd", &doc! {name: 1, "helloOk": true, "client": {"driver": {"name": "old", "version": "1"}}})).expect("write");
        let r = read_reply(&mut s).unwrap_or_else(|e| panic!("no OP_REPLY to OP_QUERY {name}: {e}"));
        assert_eq!(r.op_code, OP_REPLY, "legacy queries get OP_REPLY");
        assert_eq!(r.response_to, 40);
        assert_eq!(r.flags & 2, 0, "QueryFailure must not be set: {:?}", r.doc);
        if name == "hello" {
            assert_eq!(r.doc.get_bool("isWritablePrimary").ok(), Some(true), "{:?}", r.doc);
        } else {
            assert_eq!(r.doc.get_bool("ismaster").ok(), Some(true), "{:?}", r.doc);
        }
        assert_eq!(r.doc.get_bool("helloOk").ok(), Some(true), "{:?}", r.doc);
        assert_eq!(r.doc.get("maxWireVersion").and_then(num), Some(21.0));
        assert_eq!(r.doc.get("ok").and_then(num), Some(1.0));
        // After a legacy handshake the same socket speaks OP_MSG.
        let p = command(&mut s, 41, &doc! {"ping": 1, "$db": "admin"});
        assert_eq!(p.op_code, OP_MSG);
        assert_eq!(p.doc.get("ok").and_then(num), Some(1.0));
    }
    // A namespace that is not <db>.<collection> is a QueryFailure.
    let mut s = connect(server.port);
    s.write_all(&op_query(43, "nodot", &doc! {})).expect("write");
    let r = read_reply(&mut s).expect("OP_REPLY");
    assert!(r.flags & 2 != 0 && r.doc.get("$err").is_some(), "{:?}", r.doc);
    assert_alive(&mut server, "legacy OP_QUERY").await;
}

#[tokio::test]
async fn more_to_come_and_pipelined_requests() {
    let server = Server::start();
    let mut s = connect(server.port);
    // Fire-and-forget insert: moreToCome means no reply at all.
    let insert = doc! {"insert": "fire", "documents": [{"_id": 1}], "writeConcern": {"w": 0}, "$db": "test"};
    s.write_all(&op_msg(50, FLAG_MORE_TO_COME, &insert)).expect("write");
    let r = command(&mut s, 51, &doc! {"ping": 1, "$db": "admin"});
    assert_eq!(r.response_to, 51, "the first reply must answer the ping, not the fire-and-forget insert");
    // Pipelined: three requests written back to back, answered in order.
    let mut batch = Vec::new();
    for id in 60..63 {
        batch.extend_from_slice(&op_msg(id, 0, &doc! {"count": "fire", "$db": "test"}));
    }
    s.write_all(&batch).expect("write");
    for id in 60..63 {
        let r = read_reply(&mut s).expect("pipelined reply");
        assert_eq!(r.response_to, id);
        assert_eq!(r.doc.get("n").and_then(num), Some(1.0), "{:?}", r.doc);
    }
    // Documents in a kind-1 sequence are inserted like the array form.
    let body = op_msg_body(0, &doc! {"insert": "seq", "$db": "test"}, &[("documents", (0..5).map(|i| doc! {"_id": i}).collect())]);
    s.write_all(&frame(70, 0, OP_MSG, &body)).expect("write");
    let r = read_reply(&mut s).expect("reply");
    assert_eq!(r.doc.get("n").and_then(num), Some(5.0), "{:?}", r.doc);
    // Replies carry their own requestID and a non-compressed OP_MSG by default.
    assert_eq!(r.op_code, OP_MSG);
    assert!(r.compressor_id.is_none());
}

#[tokio::test]
async fn wire_compression_negotiation_and_op_compressed() {
    let mut server = Server::start();
    for (name, id) in [("snappy", COMPRESSOR_SNAPPY), ("zlib", COMPRESSOR_ZLIB), ("zstd", COMPRESSOR_ZSTD)] {
        let mut s = connect(server.port);
        let hello = command(&mut s, 80, &doc! {"hello": 1, "compression": ["bogus", name], "$db": "admin"});
        assert_eq!(hello.doc.get_array("compression").ok(), Some(&vec![Bson::String(name.into())]), "{name}: {:?}", hello.doc);
        // A compressed ping: the reply is compressed with the same compressor (or plain).
        let framed = op_msg(81, 0, &doc! {"ping": 1, "$db": "admin"});
        s.write_all(&op_compressed(81, id, &framed)).expect("write");
        let r = read_reply(&mut s).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.response_to, 81);
        assert_eq!(r.op_code, OP_MSG);
        assert_eq!(r.compressor_id, Some(id), "MongoDB compresses replies to compressed requests");
        assert_eq!(r.doc.get("ok").and_then(num), Some(1.0), "{:?}", r.doc);
        // A large compressed insert and its read-back.
        let payload = "z".repeat(2_000_000);
        let framed =
            frame(82, 0, OP_MSG, &op_msg_body(0, &doc! {"insert": name, "$db": "test"}, &[("documents", vec![doc! {"_id": 1, "p": payload.clone()}])]));
        s.write_all(&op_compressed(82, id, &framed)).expect("write");
        let r = read_reply(&mut s).expect("reply");
        assert_eq!(r.doc.get("n").and_then(num), Some(1.0), "{:?}", r.doc);
        let framed = op_msg(83, 0, &doc! {"find": name, "filter": {"_id": 1}, "$db": "test"});
        s.write_all(&op_compressed(83, id, &framed)).expect("write");
        let r = read_reply(&mut s).expect("reply");
        let first = r.doc.get_document("cursor").and_then(|c| c.get_array("firstBatch")).expect("firstBatch");
        assert_eq!(first[0].as_document().and_then(|d| d.get_str("p").ok()).map(|p| p.len()), Some(payload.len()));
        // Corrupt compressed data: error or close, never a crash.
        let mut s2 = connect(server.port);
        let mut bad = op_compressed(84, id, &op_msg(84, 0, &doc! {"ping": 1, "$db": "admin"}));
        let n = bad.len();
        for b in &mut bad[25..n] {
            *b ^= 0x5A;
        }
        s2.write_all(&bad).expect("write");
        error_or_close(&mut s2, "corrupt compressed data");
        // uncompressedSize lying about the size.
        let mut s3 = connect(server.port);
        let mut lie = op_compressed(85, id, &op_msg(85, 0, &doc! {"ping": 1, "$db": "admin"}));
        lie[20..24].copy_from_slice(&(40_000_000_i32).to_le_bytes());
        s3.write_all(&lie).expect("write");
        error_or_close(&mut s3, "lying uncompressedSize");
        assert_alive(&mut server, &format!("{name} corruption")).await;
    }
    // No common compressor: the reply has no compression list (or an empty one), and plain OP_MSG works.
    let mut s = connect(server.port);
    let hello = command(&mut s, 90, &doc! {"hello": 1, "compression": ["bogus"], "$db": "admin"});
    let list = hello.doc.get_array("compression").map(|a| a.len()).unwrap_or(0);
    assert_eq!(list, 0, "{:?}", hello.doc);
}

#[tokio::test]
async fn push_streams_enforce_their_credits_and_take_only_acknowledgements() {
    let mut server = Server::start();
    let mut s = connect(server.port);
    let r = command(&mut s, 1, &doc! {"create": "log", "capped": true, "size": 1_000_000, "$db": "test"});
    assert_eq!(r.doc.get("ok").and_then(num), Some(1.0), "{:?}", r.doc);
    let r = command(&mut s, 2, &doc! {"insert": "log", "documents": [{"_id": 0}], "$db": "test"});
    assert_eq!(r.doc.get("ok").and_then(num), Some(1.0), "{:?}", r.doc);
    let open = |s: &mut std::net::TcpStream, id: i32| -> i64 {
        let r = command(s, id, &doc! {"find": "log", "tailable": true, "awaitData": true, "batchSize": 1, "$db": "test"});
        r.doc.get_document("cursor").unwrap().get_i64("id").unwrap()
    };
    let stream =
        |cursor: i64, credits: Bson| doc! {"getMore": cursor, "collection": "log", "maxTimeMS": 100, "$replStream": {"credits": credits}, "$db": "test"};
    // Credits out of range (1 to 64): refused with a reply, the connection kept.
    for (i, credits) in [Bson::Int32(0), Bson::Int32(65), Bson::String("many".into())].into_iter().enumerate() {
        let cursor = open(&mut s, 10 + i as i32);
        s.write_all(&op_msg(20 + i as i32, FLAG_EXHAUST_ALLOWED, &stream(cursor, credits.clone()))).expect("write");
        let r = read_reply(&mut s).expect("reply");
        assert_eq!(r.doc.get("code").and_then(num), Some(2.0), "credits {credits}: {:?}", r.doc);
    }
    // A valid stream sends batches with moreToCome, each against a credit: with one credit,
    // one batch and then nothing until an acknowledgement returns it.
    let cursor = open(&mut s, 30);
    s.write_all(&op_msg(31, FLAG_EXHAUST_ALLOWED, &stream(cursor, Bson::Int32(1)))).expect("write");
    let first = read_reply(&mut s).expect("first batch");
    assert_eq!(first.response_to, 31);
    assert_ne!(first.flags & FLAG_MORE_TO_COME, 0, "{:?}", first.doc);
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    assert!(read_reply(&mut s).is_err(), "a second batch came without a credit");
    s.set_read_timeout(Some(PROBE_TIMEOUT)).unwrap();
    s.write_all(&op_msg(32, FLAG_MORE_TO_COME, &doc! {"ping": 1, "$replCredits": 1, "$db": "admin"})).expect("write");
    let second = read_reply(&mut s).expect("a batch after the credit came back");
    assert_eq!(second.response_to, first.request_id, "each batch answers the one before");
    // Anything but a moreToCome acknowledgement ends the stream, as do credits out of range.
    s.write_all(&op_msg(33, 0, &doc! {"ping": 1, "$db": "admin"})).expect("write");
    closed_soon(&mut s, "a request that wants a reply");
    let mut s = connect(server.port);
    let cursor = open(&mut s, 40);
    s.write_all(&op_msg(41, FLAG_EXHAUST_ALLOWED, &stream(cursor, Bson::Int32(1)))).expect("write");
    read_reply(&mut s).expect("first batch");
    s.write_all(&op_msg(42, FLAG_MORE_TO_COME, &doc! {"ping": 1, "$replCredits": 1000, "$db": "admin"})).expect("write");
    closed_soon(&mut s, "credits out of range");
    assert_alive(&mut server, "push streams").await;
}

/// The server closes `s` (empty batches still in flight are read past).
fn closed_soon(s: &mut std::net::TcpStream, case: &str) {
    s.set_read_timeout(Some(PROBE_TIMEOUT)).unwrap();
    for _ in 0..100 {
        if read_reply(s).is_err() {
            return;
        }
    }
    panic!("{case}: the stream went on");
}
