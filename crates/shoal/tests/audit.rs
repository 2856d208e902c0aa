//! The audit log of the real binary: which events it records, with what fields, through
//! the filter, in JSON and BSON, and across kill -9.

mod common;

use common::Server;
use mongodb::bson::{doc, Bson, Document};
use mongodb::Client;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A server auditing to `file`, in a directory of the test's own; returns the file's path.
fn start(extra: &[&str], file: &str) -> (Server, PathBuf) {
    let dir = std::env::temp_dir().join(format!("shoal-audit-{}-{}", std::process::id(), file));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file);
    let path_arg = path.display().to_string();
    let mut args = vec!["--auditDestination", "file", "--auditPath", path_arg.as_str()];
    args.extend_from_slice(extra);
    (Server::start_with_args(&args), path)
}

/// The JSON records in `path`, one per line.
fn json_records(path: &Path) -> Vec<Document> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}"));
            match Bson::try_from(v).unwrap() {
                Bson::Document(d) => d,
                other => panic!("{other:?}"),
            }
        })
        .collect()
}

/// Wait until `pred` holds for the records (the writer is asynchronous), at most 10 s.
fn wait_for(path: &Path, pred: impl Fn(&[Document]) -> bool) -> Vec<Document> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let records = json_records(path);
        if pred(&records) {
            return records;
        }
        assert!(Instant::now() < deadline, "audit records never matched; they are: {records:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn of<'a>(records: &'a [Document], atype: &str) -> Vec<&'a Document> {
    records.iter().filter(|r| r.get_str("atype").ok() == Some(atype)).collect()
}

async fn client_as(s: &Server, user: &str, pwd: &str, db: &str) -> Client {
    Client::with_uri_str(format!("mongodb://{user}:{pwd}@127.0.0.1:{}/?authSource={db}", s.port)).await.unwrap()
}

#[tokio::test]
async fn every_audited_event_is_recorded_once_with_its_fields() {
    let (s, path) = start(&["--auth", "--setParameter", "auditAuthorizationSuccess=true"], "all.json");
    let anon = s.client().await;
    anon.database("admin").run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    let root = client_as(&s, "admin", "adminpw", "admin").await;
    let app = root.database("app");
    let c = app.collection::<Document>("c");
    c.insert_one(doc! {"_id": 1, "v": "secret-value"}).await.unwrap();
    c.find_one(doc! {"_id": 1}).await.unwrap();
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 2}}).await.unwrap();
    c.delete_one(doc! {"_id": 1}).await.unwrap();
    app.run_command(doc! {"create": "made"}).await.unwrap();
    app.run_command(doc! {"createIndexes": "made", "indexes": [{"key": {"a": 1}, "name": "a_1"}]}).await.unwrap();
    app.run_command(doc! {"dropIndexes": "made", "index": "a_1"}).await.unwrap();
    root.database("admin").run_command(doc! {"renameCollection": "app.made", "to": "app.renamed"}).await.unwrap();
    app.run_command(doc! {"drop": "renamed"}).await.unwrap();
    app.run_command(doc! {"createUser": "ann", "pwd": "annpw", "roles": ["read"]}).await.unwrap();
    app.run_command(doc! {"grantRolesToUser": "ann", "roles": ["readWrite"]}).await.unwrap();
    app.run_command(doc! {"revokeRolesFromUser": "ann", "roles": ["readWrite"]}).await.unwrap();
    app.run_command(doc! {"updateUser": "ann", "pwd": "annpw2"}).await.unwrap();
    let find_c = doc! {"resource": {"db": "app", "collection": "c"}, "actions": ["find"]};
    app.run_command(doc! {"createRole": "r1", "privileges": [find_c.clone()], "roles": []}).await.unwrap();
    app.run_command(doc! {"createRole": "r2", "privileges": [], "roles": []}).await.unwrap();
    app.run_command(doc! {"updateRole": "r1", "privileges": [find_c.clone()]}).await.unwrap();
    app.run_command(doc! {"grantRolesToRole": "r1", "roles": ["r2"]}).await.unwrap();
    app.run_command(doc! {"revokeRolesFromRole": "r1", "roles": ["r2"]}).await.unwrap();
    app.run_command(doc! {"grantPrivilegesToRole": "r2", "privileges": [find_c.clone()]}).await.unwrap();
    app.run_command(doc! {"revokePrivilegesFromRole": "r2", "privileges": [find_c.clone()]}).await.unwrap();
    app.run_command(doc! {"dropRole": "r2"}).await.unwrap();
    app.run_command(doc! {"dropAllRolesFromDatabase": 1}).await.unwrap();
    // A refused command, by a user with read only, and a failed login.
    let ann = client_as(&s, "ann", "annpw2", "app").await;
    assert!(ann.database("app").collection::<Document>("c").insert_one(doc! {"_id": 9}).await.is_err());
    assert!(client_as(&s, "ann", "wrong", "app").await.database("app").run_command(doc! {"ping": 1}).await.is_err());
    app.run_command(doc! {"dropUser": "ann"}).await.unwrap();
    app.run_command(doc! {"dropDatabase": 1}).await.unwrap();

    let records = wait_for(&path, |r| !of(r, "dropDatabase").is_empty());
    // Each record has MongoDB's fields.
    for r in &records {
        for field in ["atype", "ts", "uuid", "local", "remote", "users", "roles", "param", "result"] {
            assert!(r.contains_key(field), "{field} missing in {r}");
        }
    }
    assert_eq!(of(&records, "startup").len(), 1);
    // The CRUD commands' authorization checks, once each, by the root user.
    for (command, ns) in [("insert", "app.c"), ("find", "app.c"), ("update", "app.c"), ("delete", "app.c")] {
        let checks: Vec<_> = of(&records, "authCheck")
            .into_iter()
            .filter(|r| r.get_document("param").unwrap().get_str("command").ok() == Some(command) && r.get_i32("result").ok() == Some(0))
            .collect();
        assert_eq!(checks.len(), 1, "{command}: {checks:#?}");
        let r = checks[0];
        assert_eq!(r.get_document("param").unwrap().get_str("ns").unwrap(), ns);
        assert_eq!(r.get_array("users").unwrap(), &vec![Bson::Document(doc! {"user": "admin", "db": "admin"})]);
        assert_eq!(r.get_array("roles").unwrap(), &vec![Bson::Document(doc! {"role": "root", "db": "admin"})]);
        assert_eq!(r.get_document("remote").unwrap().get_str("ip").unwrap(), "127.0.0.1");
    }
    // The args are the command as the server ran it: written from the request's frame, the
    // driver's document sequence merged into the body.
    let insert = of(&records, "authCheck").into_iter().find(|r| r.get_document("param").unwrap().get_str("command").ok() == Some("insert")).unwrap();
    let args = insert.get_document("param").unwrap().get_document("args").unwrap();
    assert_eq!((args.get_str("insert").unwrap(), args.get_str("$db").unwrap()), ("c", "app"), "{args}");
    assert_eq!(args.get_array("documents").unwrap().len(), 1, "{args}");
    assert_eq!(args.get_array("documents").unwrap()[0].as_document().unwrap().get_str("v").unwrap(), "secret-value");
    let update = of(&records, "authCheck").into_iter().find(|r| r.get_document("param").unwrap().get_str("command").ok() == Some("update")).unwrap();
    let updates = update.get_document("param").unwrap().get_document("args").unwrap().get_array("updates").unwrap();
    assert_eq!(updates[0].as_document().unwrap().get_document("u").unwrap(), &doc! {"$set": {"v": 2}});
    // The refusal: authCheck with code 13, by ann.
    let refused: Vec<_> = of(&records, "authCheck").into_iter().filter(|r| r.get_i32("result").ok() == Some(13)).collect();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0].get_document("param").unwrap().get_str("command").unwrap(), "insert");
    assert_eq!(refused[0].get_array("users").unwrap()[0].as_document().unwrap().get_str("user").unwrap(), "ann");
    // Logins: root's and ann's succeeded, ann's wrong password failed with 18.
    let logins = of(&records, "authenticate");
    let ok: Vec<_> =
        logins.iter().filter(|r| r.get_i32("result").ok() == Some(0)).map(|r| r.get_document("param").unwrap().get_str("user").unwrap().to_string()).collect();
    assert!(ok.contains(&"admin".to_string()) && ok.contains(&"ann".to_string()), "{logins:#?}");
    assert_eq!(logins.iter().filter(|r| r.get_i32("result").ok() == Some(18)).count(), 1, "{logins:#?}");
    // DDL and user management, once each.
    // Creations, explicit (create) and implicit (the first insert), each with the database
    // it started, once.
    let ns_of =
        |atype: &str| -> Vec<String> { of(&records, atype).iter().map(|r| r.get_document("param").unwrap().get_str("ns").unwrap().to_string()).collect() };
    let created = ns_of("createCollection");
    for ns in ["app.c", "app.made"] {
        assert_eq!(created.iter().filter(|c| *c == ns).count(), 1, "{created:?}");
    }
    let dbs = ns_of("createDatabase");
    assert_eq!(dbs.iter().filter(|d| *d == "app").count(), 1, "{dbs:?}");
    let first_create = records
        .iter()
        .position(|r| r.get_str("atype").ok() == Some("createCollection") && r.get_document("param").unwrap().get_str("ns").ok() == Some("app.c"))
        .unwrap();
    assert_eq!(records[first_create - 1].get_str("atype").unwrap(), "createDatabase", "the database's record comes first");
    for (atype, n) in [
        ("createIndex", 1),
        ("dropIndex", 1),
        ("renameCollection", 1),
        ("dropCollection", 1),
        ("dropDatabase", 1),
        ("grantRolesToUser", 1),
        ("revokeRolesFromUser", 1),
        ("updateUser", 1),
        ("dropUser", 1),
        ("createRole", 2),
        ("updateRole", 1),
        ("grantRolesToRole", 1),
        ("revokeRolesFromRole", 1),
        ("grantPrivilegesToRole", 1),
        ("revokePrivilegesFromRole", 1),
        ("dropRole", 1),
        ("dropAllRolesFromDatabase", 1),
    ] {
        assert_eq!(of(&records, atype).len(), n, "{atype}");
    }
    assert_eq!(of(&records, "createUser").len(), 2, "admin through the localhost exception, then ann");
    let rename = of(&records, "renameCollection")[0].get_document("param").unwrap().clone();
    assert_eq!(rename, doc! {"old": "app.made", "new": "app.renamed"});
    assert_eq!(of(&records, "createIndex")[0].get_document("param").unwrap().get_str("indexName").unwrap(), "a_1");
    let role = of(&records, "createRole")[0].get_document("param").unwrap().clone();
    assert_eq!(role, doc! {"role": "r1", "db": "app", "roles": [], "privileges": [find_c.clone()]});
    // No password is ever written.
    let text = std::fs::read_to_string(&path).unwrap();
    for secret in ["adminpw", "annpw", "annpw2", "wrong"] {
        assert!(!text.contains(&format!("\"{secret}\"")), "{secret} in the audit log");
    }
    // A clean shutdown writes its record and everything before it.
    let _ = root.database("admin").run_command(doc! {"shutdown": 1}).await;
    wait_for(&path, |r| of(r, "shutdown").len() == 1);
}

#[tokio::test]
async fn the_filter_selects_records_and_can_change_at_runtime() {
    let (s, path) = start(&["--auth", "--setParameter", "auditAuthorizationSuccess=true", "--auditFilter", r#"{"atype": "authenticate"}"#], "filtered.json");
    s.client().await.database("admin").run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    let root = client_as(&s, "admin", "adminpw", "admin").await;
    root.database("app").collection::<Document>("c").insert_one(doc! {"_id": 1}).await.unwrap();
    let records = wait_for(&path, |r| !r.is_empty());
    assert!(records.iter().all(|r| r.get_str("atype").ok() == Some("authenticate")), "{records:#?}");
    // At runtime: only authorization checks of inserts from now on.
    let admin = root.database("admin");
    admin.run_command(doc! {"setAuditConfig": 1, "filter": {"atype": "authCheck", "param.command": "insert"}}).await.unwrap();
    let config = admin.run_command(doc! {"getAuditConfig": 1}).await.unwrap();
    assert_eq!(config.get_document("filter").unwrap(), &doc! {"atype": "authCheck", "param.command": "insert"});
    assert!(config.get_bool("auditAuthorizationSuccess").unwrap());
    let c = root.database("app").collection::<Document>("c");
    c.find_one(doc! {}).await.unwrap();
    c.insert_one(doc! {"_id": 2}).await.unwrap();
    let records = wait_for(&path, |r| r.iter().any(|r| r.get_str("atype").ok() == Some("authCheck")));
    let checks = of(&records, "authCheck");
    assert_eq!(checks.len(), 1, "{checks:#?}");
    assert_eq!(checks[0].get_document("param").unwrap().get_document("args").unwrap().get_array("documents").unwrap().len(), 1);
    // A bad filter is refused and changes nothing.
    let e = admin.run_command(doc! {"setAuditConfig": 1, "filter": {"$bogus": 1}}).await.unwrap_err();
    assert!(e.to_string().contains("bogus") || e.to_string().contains("unknown"), "{e}");
    // Without privileges: refused.
    root.database("app").run_command(doc! {"createUser": "ann", "pwd": "pw", "roles": ["readWrite"]}).await.unwrap();
    let ann = client_as(&s, "ann", "pw", "app").await;
    assert!(ann.database("admin").run_command(doc! {"setAuditConfig": 1, "auditAuthorizationSuccess": false}).await.is_err());
}

#[tokio::test]
async fn records_written_before_a_kill_9_survive_it_and_bson_reads_back() {
    let (mut s, path) = start(&["--auth", "--setParameter", "auditAuthorizationSuccess=true", "--auditFormat", "BSON"], "killed.bson");
    s.client().await.database("admin").run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    let root = client_as(&s, "admin", "adminpw", "admin").await;
    let c = root.database("app").collection::<Document>("c");
    for i in 0..200 {
        c.insert_one(doc! {"_id": i}).await.unwrap();
    }
    let read = |path: &Path| -> Vec<Document> {
        let bytes = std::fs::read(path).unwrap_or_default();
        let mut out = Vec::new();
        let mut at = 0;
        while at + 4 <= bytes.len() {
            let len = i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            out.push(Document::from_reader(&bytes[at..at + len]).unwrap());
            at += len;
        }
        assert_eq!(at, bytes.len(), "a torn record");
        out
    };
    let inserts = |r: &[Document]| {
        r.iter().filter(|r| r.get_str("atype").ok() == Some("authCheck") && r.get_document("param").unwrap().get_str("command").ok() == Some("insert")).count()
    };
    // The writer takes each record as it comes; give it its (short) flush interval, then
    // kill the server outright.
    let deadline = Instant::now() + Duration::from_secs(10);
    while inserts(&read(&path)) < 200 {
        assert!(Instant::now() < deadline, "the writer did not write every record");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.kill9();
    let records = read(&path);
    assert_eq!(inserts(&records), 200, "each insert's check exactly once");
    let ids: std::collections::BTreeSet<i64> = records
        .iter()
        .filter(|r| r.get_str("atype").ok() == Some("authCheck") && r.get_document("param").unwrap().get_str("command").ok() == Some("insert"))
        .map(|r| {
            r.get_document("param").unwrap().get_document("args").unwrap().get_array("documents").unwrap()[0]
                .as_document()
                .unwrap()
                .get("_id")
                .and_then(|v| v.as_i32().map(i64::from).or(v.as_i64()))
                .unwrap()
        })
        .collect();
    assert_eq!(ids.len(), 200);
    assert!(of(&records, "shutdown").is_empty(), "a kill -9 writes no shutdown record");
}

#[test]
fn audit_options_are_checked_at_startup() {
    for args in [
        vec!["--auditDestination", "file"],
        vec!["--auditDestination", "tape"],
        vec!["--auditDestination", "console", "--auditFormat", "BSON"],
        vec!["--auditDestination", "console", "--auditFilter", "{not json"],
        vec!["--auditDestination", "console", "--auditFilter", r#"{"$bogus": 1}"#],
        vec!["--auditPath", "/tmp/x.json"],
    ] {
        let out = std::process::Command::new(common::binary_path()).args(["serve", "--port", "0", "--storageEngine", "inMemory"]).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[tokio::test]
async fn log_rotate_starts_a_new_file_after_writing_the_old_one() {
    let (s, path) = start(&["--auth", "--setParameter", "auditAuthorizationSuccess=true"], "rotated.json");
    s.client().await.database("admin").run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    let root = client_as(&s, "admin", "adminpw", "admin").await;
    let c = root.database("app").collection::<Document>("c");
    c.insert_one(doc! {"_id": "before"}).await.unwrap();
    root.database("admin").run_command(doc! {"logRotate": 1}).await.unwrap();
    c.insert_one(doc! {"_id": "after"}).await.unwrap();
    let dir = path.parent().unwrap();
    let aside: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p != &path).collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(aside[0].file_name().unwrap().to_str().unwrap().starts_with("rotated.json.2"), "{aside:?}");
    let old = json_records(&aside[0]);
    let inserted = |records: &[Document], id: &str| {
        records.iter().any(|r| {
            r.get_document("param")
                .ok()
                .and_then(|p| p.get_document("args").ok())
                .and_then(|a| a.get_array("documents").ok())
                .is_some_and(|d| d[0].as_document().unwrap().get_str("_id").ok() == Some(id))
        })
    };
    assert!(inserted(&old, "before") && !inserted(&old, "after"));
    let new = wait_for(&path, |r| inserted(r, "after"));
    assert!(!inserted(&new, "before"));
    let e = root.database("admin").run_command(doc! {"logRotate": "tape"}).await.unwrap_err();
    assert!(e.to_string().contains("Unknown log type"), "{e}");
}

#[tokio::test]
async fn set_audit_config_outlives_a_restart_and_a_bad_stored_one_is_set_aside() {
    let (mut s, _path) = start(&["--auditFilter", r#"{"atype": "authenticate"}"#], "stored.json");
    let admin = s.client().await.database("admin");
    admin.run_command(doc! {"setAuditConfig": 1, "filter": {"atype": "createCollection"}}).await.unwrap();
    let generation = admin.run_command(doc! {"getAuditConfig": 1}).await.unwrap().get_object_id("generation").unwrap();
    // Stored in config.settings, as mongod keeps it; a restart takes it over the file's.
    let stored = s.client().await.database("config").collection::<Document>("settings").find_one(doc! {"_id": "audit"}).await.unwrap().unwrap();
    assert_eq!(stored.get_object_id("generation").unwrap(), generation);
    s.restart();
    let config = s.client().await.database("admin").run_command(doc! {"getAuditConfig": 1}).await.unwrap();
    assert_eq!(config.get_object_id("generation").unwrap(), generation);
    assert_eq!(config.get_document("filter").unwrap(), &doc! {"atype": "createCollection"});
    // A document nobody could set through setAuditConfig, written by hand: the server still
    // starts, with the configuration it was started with.
    let settings = s.client().await.database("config").collection::<Document>("settings");
    settings
        .replace_one(doc! {"_id": "audit"}, doc! {"_id": "audit", "filter": {"$bogus": 1}, "generation": mongodb::bson::oid::ObjectId::new()})
        .await
        .unwrap();
    s.restart();
    let config = s.client().await.database("admin").run_command(doc! {"getAuditConfig": 1}).await.unwrap();
    assert_eq!(config.get_document("filter").unwrap(), &doc! {"atype": "authenticate"}, "{config}");
    assert!(config.get("generation").is_none(), "{config}");
    assert!(s.stderr_tail().contains("cannot be used"), "{}", s.stderr_tail());
}
