//! `shoal cluster up|status|down`: a local replica set on 127.0.0.x addresses from one
//! command, used through the connection string it prints.

mod common;

use common::*;
use mongodb::bson::{doc, Document};
use std::process::Command;

#[tokio::test]
async fn cluster_up_starts_a_set_that_drivers_use_and_down_stops_it() {
    let dir = std::env::temp_dir().join(format!("shoal-cluster-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = free_port().to_string();
    let d = dir.to_str().unwrap();
    let up = Command::new(binary_path())
        .args(["cluster", "up", "--members", "3", "--hidden", "1", "--voters", "2", "--chaining", "off", "--port", &port, "--dir", d])
        .output()
        .unwrap();
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let uri = String::from_utf8(up.stdout).unwrap().trim().to_string();
    assert_eq!(uri, format!("mongodb://127.0.0.1:{port},127.0.0.2:{port},127.0.0.3:{port}/?replicaSet=rs0"));
    // A second `up` in the same directory is refused.
    let again = Command::new(binary_path()).args(["cluster", "up", "--port", &port, "--dir", d]).output().unwrap();
    assert!(!again.status.success());

    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let coll = client.database("app").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    let config = client.database("admin").run_command(doc! {"replSetGetConfig": 1}).await.unwrap();
    let members = config.get_document("config").unwrap().get_array("members").unwrap().clone();
    assert!(members[2].as_document().unwrap().get_bool("hidden").unwrap());
    assert!(!config.get_document("config").unwrap().get_document("settings").unwrap().get_bool("chainingAllowed").unwrap());

    let status = Command::new(binary_path()).args(["cluster", "status", "--dir", d]).output().unwrap();
    let text = String::from_utf8(status.stdout).unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    assert_eq!(text.matches("PRIMARY").count(), 1, "{text}");
    assert_eq!(text.matches("SECONDARY").count(), 2, "{text}");

    let down = Command::new(binary_path()).args(["cluster", "down", "--dir", d]).output().unwrap();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    assert_eq!(String::from_utf8(down.stdout).unwrap().trim(), "stopped 3 processes");
    assert!(std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err(), "the members are gone");
    let _ = std::fs::remove_dir_all(&dir);
}
