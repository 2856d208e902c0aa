//! A client of the legacy opcodes, as drivers before OP_MSG spoke (mongod 5.0 took them):
//! writes with OP_INSERT, OP_UPDATE and OP_DELETE and their outcome from getLastError, finds
//! with OP_QUERY and OP_GET_MORE, OP_KILL_CURSORS, and commands on `<db>.$cmd`.

mod common;

use common::wire::*;
use common::*;
use mongodb::bson::{doc, Bson, Document};
use std::io::Write;

fn send(s: &mut std::net::TcpStream, frame: &[u8]) {
    s.write_all(frame).expect("write");
}

fn last_error(s: &mut std::net::TcpStream, id: i32) -> Document {
    send(s, &op_query_find(id, "legacy.$cmd", &doc! {"getLastError": 1}, 0, -1));
    let r = read_op_reply(s);
    assert_eq!(r.response_to, id);
    r.docs.into_iter().next().expect("getLastError's reply")
}

#[tokio::test]
async fn an_old_driver_inserts_finds_updates_and_deletes() {
    let server = Server::start();
    let mut s = connect(server.port);
    let docs: Vec<Document> = (0..5).map(|i| doc! {"_id": i, "x": i * 10}).collect();
    send(&mut s, &op_insert(1, "legacy.c", 0, &docs));
    let gle = last_error(&mut s, 2);
    assert_eq!((gle.get("n").and_then(num), gle.get("err")), (Some(0.0), Some(&Bson::Null)), "{gle:?}");

    // A duplicate key is getLastError's err, with its code.
    send(&mut s, &op_insert(3, "legacy.c", 0, &[doc! {"_id": 1}]));
    let gle = last_error(&mut s, 4);
    assert_eq!(gle.get("code").and_then(num), Some(11000.0), "{gle:?}");

    // A find in batches of two: the first batch, then getMores to the end.
    send(&mut s, &op_query_find(5, "legacy.c", &doc! {"$query": {"x": {"$gte": 10}}, "$orderby": {"_id": 1}}, 0, 2));
    let first = read_op_reply(&mut s);
    assert_eq!(first.flags & 2, 0, "{:?}", first.docs);
    assert_eq!(first.docs.iter().map(|d| d.get_i32("_id").unwrap()).collect::<Vec<_>>(), [1, 2]);
    assert_ne!(first.cursor_id, 0);
    send(&mut s, &op_get_more(6, "legacy.c", 2, first.cursor_id));
    let next = read_op_reply(&mut s);
    assert_eq!((next.starting_from, next.docs.len()), (2, 2));
    send(&mut s, &op_get_more(7, "legacy.c", 2, first.cursor_id));
    let last = read_op_reply(&mut s);
    assert_eq!((last.cursor_id, last.docs.len()), (0, 0));

    // Updates: an upsert, then a multi-update.
    send(&mut s, &op_update(8, "legacy.c", 1, &doc! {"_id": 9}, &doc! {"$set": {"x": 90}}));
    let gle = last_error(&mut s, 9);
    assert_eq!((gle.get_bool("updatedExisting").ok(), gle.get("upserted")), (Some(false), Some(&Bson::Int32(9))), "{gle:?}");
    send(&mut s, &op_update(10, "legacy.c", 2, &doc! {"x": {"$lt": 30}}, &doc! {"$inc": {"x": 1}}));
    let gle = last_error(&mut s, 11);
    assert_eq!((gle.get("n").and_then(num), gle.get_bool("updatedExisting").ok()), (Some(3.0), Some(true)), "{gle:?}");

    // A single-remove delete, then a delete of all that match.
    send(&mut s, &op_delete(12, "legacy.c", 1, &doc! {"x": {"$gte": 0}}));
    assert_eq!(last_error(&mut s, 13).get("n").and_then(num), Some(1.0));
    send(&mut s, &op_delete(14, "legacy.c", 0, &doc! {"x": {"$gte": 40}}));
    assert_eq!(last_error(&mut s, 15).get("n").and_then(num), Some(2.0));

    // A limit in one batch (negative numberToReturn) leaves no cursor.
    send(&mut s, &op_query_find(16, "legacy.c", &doc! {}, 0, -2));
    let r = read_op_reply(&mut s);
    assert_eq!((r.cursor_id, r.docs.len()), (0, 2));

    // A cursor killed with OP_KILL_CURSORS is gone.
    send(&mut s, &op_query_find(17, "legacy.c", &doc! {}, 0, 2));
    let open = read_op_reply(&mut s);
    assert_ne!(open.cursor_id, 0);
    send(&mut s, &op_kill_cursors(18, &[open.cursor_id]));
    send(&mut s, &op_get_more(19, "legacy.c", 2, open.cursor_id));
    let gone = read_op_reply(&mut s);
    assert_eq!(gone.flags & 1, 1, "CursorNotFound");

    // Any command runs over OP_QUERY on <db>.$cmd; an error is in the reply, not the flags.
    send(&mut s, &op_query_find(20, "legacy.$cmd", &doc! {"count": "c"}, 0, -1));
    let count = read_op_reply(&mut s);
    assert_eq!(count.docs[0].get("n").and_then(num), Some(3.0), "{:?}", count.docs);
    send(&mut s, &op_query_find(21, "legacy.$cmd", &doc! {"noSuchCommand": 1}, 0, -1));
    let bad = read_op_reply(&mut s);
    assert_eq!(bad.docs[0].get("code").and_then(num), Some(59.0), "{:?}", bad.docs);

    // A bad legacy query is a QueryFailure with $err.
    send(&mut s, &op_query_find(22, "legacy.c", &doc! {"x": {"$bogus": 1}}, 0, 0));
    let failed = read_op_reply(&mut s);
    assert_eq!(failed.flags & 2, 2);
    assert!(failed.docs[0].get_str("$err").is_ok(), "{:?}", failed.docs);

    // What the old client wrote, a new one reads.
    let client = server.client().await;
    let left = collect(client.database("legacy").collection::<Document>("c").find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await;
    assert_eq!(left, vec![doc! {"_id": 1, "x": 11}, doc! {"_id": 2, "x": 21}, doc! {"_id": 3, "x": 30}]);
}
