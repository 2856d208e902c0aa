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

/// A port for a sharded cluster: it takes the ports up to port+3 too.
fn cluster_port() -> u16 {
    loop {
        let p = free_port();
        if p < 60_000 && (1..4).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            return p;
        }
    }
}

#[tokio::test]
async fn a_sharded_cluster_with_auth_takes_scram_logins_through_the_router_and_refuses_the_rest() {
    use mongodb::options::{AuthMechanism, ClientOptions, Credential};
    let dir = std::env::temp_dir().join(format!("shoal-cluster-auth-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = cluster_port();
    let d = dir.to_str().unwrap();
    let up = Command::new(binary_path()).args(["cluster", "up", "--shards", "2", "--auth", "--port", &port.to_string(), "--dir", d]).output().unwrap();
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let uri = String::from_utf8(up.stdout).unwrap().trim().to_string();
    let login = |user: &str, password: &str, source: &str| {
        let (user, password, source, uri) = (user.to_string(), password.to_string(), source.to_string(), uri.clone());
        async move {
            let mut o = ClientOptions::parse(&uri).await.unwrap();
            o.credential = Some(Credential::builder().username(user).password(password).source(source).mechanism(AuthMechanism::ScramSha256).build());
            mongodb::Client::with_options(o).unwrap()
        }
    };
    let code = |e: mongodb::error::Error| match *e.kind {
        mongodb::error::ErrorKind::Command(c) => c.code,
        mongodb::error::ErrorKind::Authentication { .. } => 18,
        other => panic!("unexpected error {other:?}"),
    };

    let anon = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let refused = anon.database("app").collection::<Document>("c").insert_one(doc! {"_id": 1}).await.unwrap_err();
    assert_eq!(code(refused), 13);
    anon.database("admin").run_command(doc! {"createUser": "root", "pwd": "rootpw", "roles": ["root"]}).await.unwrap();

    let root = login("root", "rootpw", "admin").await;
    root.database("admin").run_command(doc! {"shardCollection": "app.c", "key": {"_id": "hashed"}}).await.unwrap();
    let docs: Vec<Document> = (0..100).map(|i| doc! {"_id": i}).collect();
    root.database("app").collection::<Document>("c").insert_many(docs).await.unwrap();
    assert_eq!(root.database("app").collection::<Document>("c").count_documents(doc! {}).await.unwrap(), 100);

    let wrong = login("root", "nope", "admin").await;
    assert_eq!(code(wrong.database("admin").run_command(doc! {"ping": 1}).await.unwrap_err()), 18);

    root.database("app").run_command(doc! {"createUser": "reader", "pwd": "readerpw", "roles": ["read"]}).await.unwrap();
    let reader = login("reader", "readerpw", "app").await;
    let c = reader.database("app").collection::<Document>("c");
    assert_eq!(c.count_documents(doc! {"_id": {"$lt": 5}}).await.unwrap(), 5);
    assert_eq!(code(c.insert_one(doc! {"_id": 1000}).await.unwrap_err()), 13);
    assert_eq!(code(c.update_many(doc! {}, doc! {"$set": {"x": 1}}).await.unwrap_err()), 13);

    let down = Command::new(binary_path()).args(["cluster", "down", "--dir", d]).output().unwrap();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}
