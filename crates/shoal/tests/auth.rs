//! Authentication and authorization against the real binary started with --auth, through
//! the official Rust driver's SCRAM implementation.

mod common;

use common::Server;
use mongodb::bson::{doc, Bson, Document};
use mongodb::Client;

async fn client_as(s: &Server, user: &str, pwd: &str, options: &str) -> Client {
    Client::with_uri_str(format!("mongodb://{user}:{pwd}@127.0.0.1:{}/{options}", s.port)).await.unwrap()
}

fn code_of(e: &mongodb::error::Error) -> Option<(i32, String)> {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) => Some((c.code, c.code_name.clone())),
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => Some((w.code, w.code_name.clone().unwrap_or_default())),
        mongodb::error::ErrorKind::Authentication { .. } => Some((18, "AuthenticationFailed".into())),
        _ => None,
    }
}

fn unauthorized(r: mongodb::error::Result<impl std::fmt::Debug>, what: &str) -> String {
    let e = r.expect_err(what);
    assert_eq!(code_of(&e).map(|c| c.0), Some(13), "{what}: {e}");
    e.to_string()
}

/// A server with --auth and a root user "admin" created through the localhost exception.
async fn server_with_root() -> (Server, Client) {
    let s = Server::start_with_args(&["--auth"]);
    let anon = s.client().await;
    anon.database("admin").run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    let root = client_as(&s, "admin", "adminpw", "").await;
    (s, root)
}

#[tokio::test]
async fn the_localhost_exception_creates_the_first_user_and_then_closes() {
    let s = Server::start_with_args(&["--auth"]);
    let anon = s.client().await;
    let db = anon.database("app");
    // Before any user: handshake commands run, data commands need a user.
    db.run_command(doc! {"ping": 1}).await.unwrap();
    let msg = unauthorized(db.run_command(doc! {"find": "c"}).await, "find before any user");
    assert!(msg.contains("Command find requires authentication"), "{msg}");
    // Only in admin, and only createUser.
    unauthorized(db.run_command(doc! {"createUser": "u", "pwd": "p", "roles": ["read"]}).await, "createUser outside admin");
    anon.database("admin").run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    // The first user closes the exception.
    unauthorized(
        anon.database("admin").run_command(doc! {"createUser": "second", "pwd": "p", "roles": ["root"]}).await,
        "a second user without authenticating",
    );
    let status = anon.database("admin").run_command(doc! {"connectionStatus": 1}).await.unwrap();
    assert_eq!(status.get_document("authInfo").unwrap().get_array("authenticatedUsers").unwrap().len(), 0);
}

#[tokio::test]
async fn users_authenticate_with_scram_sha_256_and_sha_1_and_wrong_passwords_are_refused() {
    let (s, root) = server_with_root().await;
    let admin = root.database("admin");
    let status = admin.run_command(doc! {"connectionStatus": 1}).await.unwrap();
    let info = status.get_document("authInfo").unwrap();
    assert_eq!(info.get_array("authenticatedUsers").unwrap(), &vec![Bson::Document(doc! {"user": "admin", "db": "admin"})]);
    assert_eq!(info.get_array("authenticatedUserRoles").unwrap(), &vec![Bson::Document(doc! {"role": "root", "db": "admin"})]);
    root.database("app").collection::<Document>("c").insert_one(doc! {"_id": 1}).await.unwrap();

    let app = root.database("app");
    app.run_command(doc! {"createUser": "ann", "pwd": "annpw", "roles": [{"role": "readWrite", "db": "app"}]}).await.unwrap();
    app.run_command(doc! {"createUser": "old", "pwd": "oldpw", "roles": ["read"], "mechanisms": ["SCRAM-SHA-1"]}).await.unwrap();
    let dup = app.run_command(doc! {"createUser": "ann", "pwd": "x", "roles": []}).await.unwrap_err();
    assert_eq!(code_of(&dup), Some((51003, "Location51003".into())), "{dup}");
    let missing_role = app.run_command(doc! {"createUser": "bob", "pwd": "x", "roles": ["reader"]}).await.unwrap_err();
    assert_eq!(code_of(&missing_role), Some((31, "RoleNotFound".into())), "{missing_role}");

    // The driver's default negotiation (saslSupportedMechs, speculative SCRAM-SHA-256) and
    // each mechanism named explicitly.
    for options in ["?authSource=app", "?authSource=app&authMechanism=SCRAM-SHA-256", "?authSource=app&authMechanism=SCRAM-SHA-1"] {
        let c = client_as(&s, "ann", "annpw", options).await;
        c.database("app").collection::<Document>("c").insert_one(doc! {"by": options}).await.unwrap();
    }
    // A user with only SCRAM-SHA-1 credentials: the default picks SHA-1 from
    // saslSupportedMechs; asking for SHA-256 fails.
    let c = client_as(&s, "old", "oldpw", "?authSource=app").await;
    assert_eq!(c.database("app").collection::<Document>("c").count_documents(doc! {}).await.unwrap(), 4);
    let c = client_as(&s, "old", "oldpw", "?authSource=app&authMechanism=SCRAM-SHA-256").await;
    let e = c.database("app").collection::<Document>("c").count_documents(doc! {}).await.unwrap_err();
    assert!(matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Authentication { .. }), "{e}");

    // Wrong password, unknown user, wrong database: the same refusal.
    for (user, pwd, options) in [("ann", "wrong", "?authSource=app"), ("nobody", "x", "?authSource=app"), ("ann", "annpw", "?authSource=admin")] {
        let c = client_as(&s, user, pwd, options).await;
        let e = c.database("app").run_command(doc! {"ping": 1}).await.unwrap_err();
        assert!(matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Authentication { .. }), "{user}/{pwd}{options}: {e}");
        assert!(e.to_string().contains("Authentication failed"), "{e}");
    }
    // Nothing secret reaches the server's log, though it logs every login and failure.
    let log = std::fs::read_to_string(s.stderr_path(0)).unwrap();
    assert!(log.contains("authenticated as ann@app") && log.contains("authentication"), "{log}");
    for secret in ["adminpw", "annpw", "oldpw"] {
        assert!(!log.contains(secret), "{secret} in the log");
    }
}

#[tokio::test]
async fn roles_decide_what_a_user_may_do_and_changes_take_effect_at_once() {
    let (s, root) = server_with_root().await;
    let app = root.database("app");
    app.collection::<Document>("c").insert_one(doc! {"_id": 1}).await.unwrap();
    root.database("other").collection::<Document>("c").insert_one(doc! {"_id": 1}).await.unwrap();
    app.run_command(doc! {"createUser": "reader", "pwd": "pw", "roles": ["read"]}).await.unwrap();

    let reader = client_as(&s, "reader", "pw", "?authSource=app").await;
    let c = reader.database("app").collection::<Document>("c");
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 1);
    let msg = unauthorized(c.insert_one(doc! {"_id": 2}).await, "insert with read");
    assert!(msg.contains("not authorized on app to execute command"), "{msg}");
    unauthorized(reader.database("other").collection::<Document>("c").find_one(doc! {}).await, "read on another database");
    unauthorized(reader.database("admin").run_command(doc! {"serverStatus": 1}).await, "serverStatus");
    unauthorized(c.drop().await, "drop with read");
    // $out writes: read alone does not allow it.
    unauthorized(c.aggregate(vec![doc! {"$out": "copy"}]).await, "$out with read");
    // listDatabases shows only the databases the user's roles name.
    let names = reader.list_database_names().await.unwrap();
    assert_eq!(names, vec!["app".to_string()]);

    // A refusal repeats the command, without its password.
    let msg = unauthorized(reader.database("app").run_command(doc! {"createUser": "x", "pwd": "topsecret", "roles": []}).await, "createUser with read");
    assert!(msg.contains("createUser") && !msg.contains("topsecret"), "{msg}");

    // A cursor belongs to the user who opened it: another user who may read the collection
    // can neither continue nor kill it.
    for i in 0..10 {
        app.collection::<Document>("many").insert_one(doc! {"_id": i}).await.unwrap();
    }
    app.run_command(doc! {"createUser": "other", "pwd": "pw", "roles": ["read"]}).await.unwrap();
    let other = client_as(&s, "other", "pw", "?authSource=app").await;
    let opened = reader.database("app").run_command(doc! {"find": "many", "batchSize": 2}).await.unwrap();
    let id = opened.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0);
    let msg = unauthorized(other.database("app").run_command(doc! {"getMore": id, "collection": "many"}).await, "another user's getMore");
    assert!(msg.contains("not created by the authenticated user"), "{msg}");
    let killed = other.database("app").run_command(doc! {"killCursors": "many", "cursors": [id]}).await.unwrap();
    assert_eq!(killed.get_array("cursorsKilled").unwrap().len(), 0);
    let more = reader.database("app").run_command(doc! {"getMore": id, "collection": "many"}).await.unwrap();
    assert_eq!(more.get_document("cursor").unwrap().get_array("nextBatch").unwrap().len(), 8);

    // Granting readWrite works on the open connection, without logging in again.
    app.run_command(doc! {"grantRolesToUser": "reader", "roles": ["readWrite"]}).await.unwrap();
    c.insert_one(doc! {"_id": 2}).await.unwrap();
    app.run_command(doc! {"revokeRolesFromUser": "reader", "roles": ["readWrite"]}).await.unwrap();
    unauthorized(c.insert_one(doc! {"_id": 3}).await, "insert after the revoke");

    // usersInfo: the stored user without its secrets, with its mechanisms.
    let info = app.run_command(doc! {"usersInfo": "reader"}).await.unwrap();
    let users = info.get_array("users").unwrap();
    assert_eq!(users.len(), 1);
    let u = users[0].as_document().unwrap();
    assert_eq!(u.get_str("_id").unwrap(), "app.reader");
    assert_eq!(u.get_array("roles").unwrap(), &vec![Bson::Document(doc! {"role": "read", "db": "app"})]);
    assert_eq!(u.get_array("mechanisms").unwrap(), &vec![Bson::from("SCRAM-SHA-1"), Bson::from("SCRAM-SHA-256")]);
    assert!(!u.contains_key("credentials"));
    // Stored credentials hold no password: only salted keys.
    let with = app.run_command(doc! {"usersInfo": "reader", "showCredentials": true}).await.unwrap();
    let stored = format!("{with}");
    assert!(stored.contains("storedKey") && !stored.contains("\"pw\""), "{stored}");
    // A user sees their own document; others' need viewUser.
    reader.database("app").run_command(doc! {"usersInfo": "reader"}).await.unwrap();
    unauthorized(reader.database("app").run_command(doc! {"usersInfo": 1}).await, "usersInfo of every user");

    // A new password works at once and the old one no longer does.
    app.run_command(doc! {"updateUser": "reader", "pwd": "newpw"}).await.unwrap();
    client_as(&s, "reader", "newpw", "?authSource=app").await.database("app").run_command(doc! {"ping": 1}).await.unwrap();
    let e = client_as(&s, "reader", "pw", "?authSource=app").await.database("app").run_command(doc! {"ping": 1}).await.unwrap_err();
    assert!(matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Authentication { .. }), "{e}");

    // A dropped user's open connections lose their rights.
    app.run_command(doc! {"dropUser": "reader"}).await.unwrap();
    unauthorized(c.find_one(doc! {}).await, "find after dropUser");
    let e = app.run_command(doc! {"dropUser": "reader"}).await.unwrap_err();
    assert_eq!(code_of(&e), Some((11, "UserNotFound".into())), "{e}");
}

#[tokio::test]
async fn every_command_refuses_a_client_that_has_not_authenticated() {
    let (s, root) = server_with_root().await;
    root.database("app").collection::<Document>("c").insert_one(doc! {"_id": 1}).await.unwrap();
    // Every command the server has, from listCommands (which itself needs no user).
    let anon = s.client().await;
    let list = anon.database("admin").run_command(doc! {"listCommands": 1}).await.unwrap();
    let names: Vec<String> = list.get_document("commands").unwrap().keys().cloned().collect();
    assert!(names.len() > 50, "{names:?}");
    // What mongod also runs before authentication.
    let open = [
        "hello",
        "isMaster",
        "ismaster",
        "ping",
        "buildInfo",
        "buildinfo",
        "saslStart",
        "saslContinue",
        "authenticate",
        "connectionStatus",
        "listCommands",
        "logout",
        "configureFailPoint",
    ];
    let mut refused = 0;
    for name in &names {
        if open.contains(&name.as_str()) {
            continue;
        }
        let cmd = doc! {name.as_str(): "c"};
        match anon.database("app").run_command(cmd.clone()).await {
            Err(e) if code_of(&e).map(|c| c.0) == Some(13) => refused += 1,
            other => panic!("{cmd} without authentication: {other:?}"),
        }
    }
    assert!(refused > 50);
    // The data is untouched.
    assert_eq!(root.database("app").collection::<Document>("c").count_documents(doc! {}).await.unwrap(), 1);
}

#[tokio::test]
async fn bad_auth_conversations_get_mongodb_errors() {
    let (s, _root) = server_with_root().await;
    let anon = s.client().await;
    let admin = anon.database("admin");
    let bin = |b: &[u8]| Bson::Binary(mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Generic, bytes: b.to_vec() });
    let e = admin.run_command(doc! {"saslStart": 1, "mechanism": "PLAIN", "payload": bin(b"x")}).await.unwrap_err();
    assert_eq!(code_of(&e), Some((334, "MechanismUnavailable".into())), "{e}");
    let e = admin.run_command(doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(b"")}).await.unwrap_err();
    assert_eq!(code_of(&e), Some((17, "ProtocolError".into())), "{e}");
    for payload in [&b"garbage"[..], b"n,,n=admin", b"p=x,,n=admin,r=abcd", &[0xff; 10][..]] {
        let e = admin.run_command(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(payload)}).await.unwrap_err();
        assert_eq!(code_of(&e), Some((18, "AuthenticationFailed".into())), "{e}");
    }
    // A conversation with a made-up proof fails, and leaves nothing to continue.
    let r = admin
        .run_command(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(b"n,,n=admin,r=abcdefgh"), "options": {"skipEmptyExchange": true}})
        .await
        .unwrap();
    assert!(!r.get_bool("done").unwrap());
    let server_first = String::from_utf8(r.get_binary_generic("payload").unwrap().clone()).unwrap();
    let nonce = server_first.split(',').next().unwrap().trim_start_matches("r=");
    let final_msg = format!("c=biws,r={nonce},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=");
    let e = admin.run_command(doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(final_msg.as_bytes())}).await.unwrap_err();
    assert_eq!(code_of(&e), Some((18, "AuthenticationFailed".into())), "{e}");
    let e = admin.run_command(doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(b"")}).await.unwrap_err();
    assert_eq!(code_of(&e), Some((17, "ProtocolError".into())), "{e}");
    // Still refused afterwards.
    unauthorized(anon.database("app").run_command(doc! {"find": "c"}).await, "find after a failed conversation");

    // A connection that keeps failing is closed after ten failures (raw wire: one
    // connection, no driver reconnecting behind our back).
    let mut raw = common::wire::connect(s.port);
    for i in 1..=10 {
        let reply =
            common::wire::command(&mut raw, i, &doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(b"n,,n=nobody,r=abcdefgh"), "$db": "admin"});
        assert_eq!(reply.doc.get_i32("code").unwrap(), 18, "attempt {i}: {:?}", reply.doc);
    }
    assert!(common::wire::closed_by_server(&mut raw), "the connection stays open after ten failures");
}

#[test]
fn auth_with_a_replica_set_needs_a_key_file() {
    let out = std::process::Command::new(common::binary_path()).args(["serve", "--auth", "--replSet", "rs0", "--port", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("keyFile"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A throwaway CA and a server certificate for 127.0.0.1 in `dir` (ca.pem, server.pem), by
/// the script every client's TLS tests share.
fn make_certs(dir: &std::path::Path) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/compat/make_test_certs.sh");
    let out = std::process::Command::new("bash").arg(script).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn scram_sha_256_over_tls_and_plaintext_refused_when_tls_is_required() {
    let dir = std::env::temp_dir().join(format!("shoal-tls-{}", std::process::id()));
    make_certs(&dir);
    let (ca, pem) = (dir.join("ca.pem").display().to_string(), dir.join("server.pem").display().to_string());
    let s = Server::start_with_args(&["--auth", "--tlsMode", "requireTLS", "--tlsCertificateKeyFile", &pem]);
    let tls = format!("tls=true&tlsCAFile={ca}");
    let anon = Client::with_uri_str(format!("mongodb://127.0.0.1:{}/?{tls}", s.port)).await.unwrap();
    anon.database("admin").run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    let root = client_as(&s, "admin", "adminpw", &format!("?{tls}&authMechanism=SCRAM-SHA-256")).await;
    root.database("app").collection::<Document>("c").insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(root.database("app").collection::<Document>("c").count_documents(doc! {}).await.unwrap(), 1);
    // Plaintext is refused: the connection closes, and the driver finds no server.
    let plain = Client::with_uri_str(format!("mongodb://admin:adminpw@127.0.0.1:{}/?serverSelectionTimeoutMS=1000", s.port)).await.unwrap();
    let e = plain.database("admin").run_command(doc! {"ping": 1}).await.unwrap_err();
    assert!(matches!(e.kind.as_ref(), mongodb::error::ErrorKind::ServerSelection { .. }), "{e}");
    // A client that does not trust the server's CA does not connect either.
    let untrusting = Client::with_uri_str(format!("mongodb://127.0.0.1:{}/?tls=true&serverSelectionTimeoutMS=1000", s.port)).await.unwrap();
    assert!(untrusting.database("admin").run_command(doc! {"ping": 1}).await.is_err());

    // preferTLS takes both on one port.
    let both = Server::start_with_args(&["--tlsMode", "preferTLS", "--tlsCertificateKeyFile", &pem]);
    for options in [format!("?{tls}"), String::new()] {
        let c = Client::with_uri_str(format!("mongodb://127.0.0.1:{}/{options}", both.port)).await.unwrap();
        c.database("app").collection::<Document>("c").insert_one(doc! {"tls": !options.is_empty()}).await.unwrap();
    }
    // With a CA file for client certificates, a client without one is refused unless
    // allowed.
    let strict = Server::start_with_args(&["--tlsMode", "requireTLS", "--tlsCertificateKeyFile", &pem, "--tlsCAFile", &ca]);
    let c = Client::with_uri_str(format!("mongodb://127.0.0.1:{}/?{tls}&serverSelectionTimeoutMS=1000", strict.port)).await.unwrap();
    assert!(c.database("admin").run_command(doc! {"ping": 1}).await.is_err());
    let lenient =
        Server::start_with_args(&["--tlsMode", "requireTLS", "--tlsCertificateKeyFile", &pem, "--tlsCAFile", &ca, "--tlsAllowConnectionsWithoutCertificates"]);
    let c = Client::with_uri_str(format!("mongodb://127.0.0.1:{}/?{tls}", lenient.port)).await.unwrap();
    c.database("admin").run_command(doc! {"ping": 1}).await.unwrap();

    // A server without a usable certificate does not start.
    for args in [
        vec!["--tlsMode", "requireTLS"],
        vec!["--tlsMode", "requireTLS", "--tlsCertificateKeyFile", &ca],
        vec!["--tlsMode", "requireTLS", "--tlsCertificateKeyFile", "/nonexistent.pem"],
    ] {
        let out =
            std::process::Command::new(common::binary_path()).arg("serve").args(["--port", "0", "--storageEngine", "inMemory"]).args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} started");
        assert!(String::from_utf8_lossy(&out.stderr).contains("certificate"), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn auth_failed_delay_ms_slows_each_failed_attempt() {
    let s = Server::start_with_args(&["--auth", "--setParameter", "authFailedDelayMs=300"]);
    let anon = s.client().await;
    anon.database("admin").run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    let root = client_as(&s, "admin", "adminpw", "").await;
    let p = root.database("admin").run_command(doc! {"getParameter": 1, "authFailedDelayMs": 1}).await.unwrap();
    assert_eq!(p.get_i64("authFailedDelayMs").unwrap(), 300);
    // The right password is not slowed; a wrong one waits before its refusal.
    let started = std::time::Instant::now();
    let e = client_as(&s, "admin", "wrong", "").await.database("admin").run_command(doc! {"ping": 1}).await.unwrap_err();
    assert!(e.to_string().contains("Authentication failed"), "{e}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(300), "{:?}", started.elapsed());
    for bad in ["authFailedDelayMs=5001", "authFailedDelayMs=-1", "authFailedDelayMs=soon"] {
        let out = std::process::Command::new(common::binary_path())
            .args(["serve", "--port", "0", "--storageEngine", "inMemory", "--setParameter", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
}

#[tokio::test]
async fn x509_clients_log_in_as_their_certificates_subject() {
    let dir = std::env::temp_dir().join(format!("shoal-x509-{}", std::process::id()));
    make_certs(&dir);
    let path = |f: &str| dir.join(f).display().to_string();
    let s = Server::start_with_args(&[
        "--auth",
        "--tlsMode",
        "requireTLS",
        "--tlsCertificateKeyFile",
        &path("server.pem"),
        "--tlsCAFile",
        &path("ca.pem"),
        "--tlsAllowConnectionsWithoutCertificates",
    ]);
    let tls = format!("tls=true&tlsCAFile={}", path("ca.pem"));
    let anon = Client::with_uri_str(format!("mongodb://127.0.0.1:{}/?{tls}", s.port)).await.unwrap();
    anon.database("admin").run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]}).await.unwrap();
    let root = client_as(&s, "admin", "adminpw", &format!("?{tls}")).await;
    root.database("app").collection::<Document>("c").insert_one(doc! {"_id": 1}).await.unwrap();
    let external = root.database("$external");
    let e = external.run_command(doc! {"createUser": "CN=ann,OU=clients,O=shoal", "pwd": "x", "roles": []}).await.unwrap_err();
    assert_eq!(code_of(&e).map(|c| c.0), Some(2), "{e}");
    external.run_command(doc! {"createUser": "CN=ann,OU=clients,O=shoal", "roles": [{"role": "read", "db": "app"}]}).await.unwrap();
    let info = external.run_command(doc! {"usersInfo": "CN=ann,OU=clients,O=shoal"}).await.unwrap();
    assert_eq!(info.get_array("users").unwrap()[0].as_document().unwrap().get_array("mechanisms").unwrap(), &vec![Bson::from("external")]);

    // The driver's MONGODB-X509 login (speculative, in the handshake), with the client
    // certificate.
    let with_cert = format!("{tls}&tlsCertificateKeyFile={}", path("client.pem"));
    let ann = Client::with_uri_str(format!("mongodb://127.0.0.1:{}/?{with_cert}&authMechanism=MONGODB-X509", s.port)).await.unwrap();
    let c = ann.database("app").collection::<Document>("c");
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 1);
    unauthorized(c.insert_one(doc! {"_id": 2}).await, "insert with read");
    let status = ann.database("admin").run_command(doc! {"connectionStatus": 1}).await.unwrap();
    assert_eq!(
        status.get_document("authInfo").unwrap().get_array("authenticatedUsers").unwrap(),
        &vec![Bson::Document(doc! {"user": "CN=ann,OU=clients,O=shoal", "db": "$external"})]
    );

    // The authenticate command itself: without a certificate, or naming another user, it
    // fails; with the certificate it logs in.
    let e = anon.database("$external").run_command(doc! {"authenticate": 1, "mechanism": "MONGODB-X509"}).await.unwrap_err();
    assert_eq!(code_of(&e), Some((18, "AuthenticationFailed".into())), "{e}");
    let certified = Client::with_uri_str(format!("mongodb://127.0.0.1:{}/?{with_cert}", s.port)).await.unwrap();
    let db = certified.database("$external");
    let e = db.run_command(doc! {"authenticate": 1, "mechanism": "MONGODB-X509", "user": "CN=bob"}).await.unwrap_err();
    assert_eq!(code_of(&e), Some((18, "AuthenticationFailed".into())), "{e}");
    let e = db.run_command(doc! {"authenticate": 1, "mechanism": "MONGODB-CR"}).await.unwrap_err();
    assert_eq!(code_of(&e).map(|c| c.0), Some(334), "{e}");
    let r = db.run_command(doc! {"authenticate": 1, "mechanism": "MONGODB-X509"}).await.unwrap();
    assert_eq!(r.get_str("user").unwrap(), "CN=ann,OU=clients,O=shoal");
    // A certificate whose subject is no user gets nothing.
    external.run_command(doc! {"dropUser": "CN=ann,OU=clients,O=shoal"}).await.unwrap();
    let gone = Client::with_uri_str(format!("mongodb://127.0.0.1:{}/?{with_cert}&authMechanism=MONGODB-X509", s.port)).await.unwrap();
    assert!(gone.database("app").collection::<Document>("c").count_documents(doc! {}).await.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

fn code(r: mongodb::error::Result<impl std::fmt::Debug>, what: &str) -> i32 {
    let e = r.expect_err(what);
    code_of(&e).map(|c| c.0).unwrap_or_else(|| panic!("{what}: {e}"))
}

#[tokio::test]
async fn user_defined_roles_grant_their_privileges_inherit_and_go_away() {
    let (s, root) = server_with_root().await;
    let app = root.database("app");
    let find_c = doc! {"resource": {"db": "app", "collection": "c"}, "actions": ["find"]};
    app.run_command(doc! {"createRole": "readerC", "privileges": [find_c.clone()], "roles": []}).await.unwrap();
    // MongoDB's errors for bad roles.
    assert_eq!(code(app.run_command(doc! {"createRole": "readerC", "privileges": [], "roles": []}).await, "a second readerC"), 51002);
    assert_eq!(code(app.run_command(doc! {"createRole": "read", "privileges": [], "roles": []}).await, "a built-in name"), 2);
    assert_eq!(code(app.run_command(doc! {"createRole": "x", "roles": []}).await, "no privileges"), 40414);
    assert_eq!(
        code(
            app.run_command(doc! {"createRole": "x", "privileges": [{"resource": {"db": "other", "collection": ""}, "actions": ["find"]}], "roles": []}).await,
            "another database"
        ),
        49
    );
    assert_eq!(code(app.run_command(doc! {"createRole": "x", "privileges": [], "roles": ["nosuch"]}).await, "an unknown role"), 31);
    assert_eq!(code(app.run_command(doc! {"grantPrivilegesToRole": "read", "privileges": [find_c.clone()]}).await, "a built-in role"), 2);
    assert_eq!(code(app.run_command(doc! {"dropRole": "nosuch"}).await, "dropping an unknown role"), 31);

    app.run_command(doc! {"createUser": "u", "pwd": "upw", "roles": ["readerC"]}).await.unwrap();
    let u = client_as(&s, "u", "upw", "?authSource=app").await;
    let (uc, ud) = (u.database("app").collection::<Document>("c"), u.database("app").collection::<Document>("d"));
    uc.find_one(doc! {}).await.unwrap();
    unauthorized(uc.insert_one(doc! {"_id": 1}).await, "insert without the privilege");
    unauthorized(ud.find_one(doc! {}).await, "find on another collection");
    // A granted privilege takes effect on the user's open connection.
    app.run_command(doc! {"grantPrivilegesToRole": "readerC", "privileges": [{"resource": {"db": "app", "collection": "c"}, "actions": ["insert"]}]})
        .await
        .unwrap();
    uc.insert_one(doc! {"_id": 1}).await.unwrap();
    app.run_command(doc! {"revokePrivilegesFromRole": "readerC", "privileges": [{"resource": {"db": "app", "collection": "c"}, "actions": ["insert"]}]})
        .await
        .unwrap();
    unauthorized(uc.insert_one(doc! {"_id": 2}).await, "insert once revoked");
    // Inherited roles: writer's privileges reach u through readerC; no cycles.
    app.run_command(doc! {"createRole": "writer", "privileges": [{"resource": {"db": "app", "collection": ""}, "actions": ["insert"]}], "roles": ["read"]})
        .await
        .unwrap();
    app.run_command(doc! {"grantRolesToRole": "readerC", "roles": ["writer"]}).await.unwrap();
    ud.insert_one(doc! {"_id": 1}).await.unwrap();
    ud.find_one(doc! {}).await.unwrap();
    assert_eq!(code(app.run_command(doc! {"grantRolesToRole": "writer", "roles": ["readerC"]}).await, "a cycle"), 49);
    let info = app.run_command(doc! {"rolesInfo": "readerC"}).await.unwrap();
    let r = info.get_array("roles").unwrap()[0].as_document().unwrap().clone();
    assert_eq!((r.get_str("role").unwrap(), r.get_str("db").unwrap(), r.get_bool("isBuiltin").unwrap()), ("readerC", "app", false));
    assert_eq!(r.get_array("roles").unwrap(), &vec![Bson::Document(doc! {"role": "writer", "db": "app"})]);
    let inherited: Vec<&Document> = r.get_array("inheritedRoles").unwrap().iter().filter_map(|v| v.as_document()).collect();
    assert!(inherited.contains(&&doc! {"role": "read", "db": "app"}) && inherited.len() == 2, "{r}");
    assert_eq!(app.run_command(doc! {"rolesInfo": 1}).await.unwrap().get_array("roles").unwrap().len(), 2);
    // As a shell sends it (a double), with the database's five built-in roles too.
    assert_eq!(app.run_command(doc! {"rolesInfo": 1.0, "showBuiltinRoles": true}).await.unwrap().get_array("roles").unwrap().len(), 7);
    let solo = app.run_command(doc! {"rolesInfo": {"role": "writer", "db": "app"}, "showPrivileges": false}).await.unwrap();
    assert_eq!(solo.get_array("roles").unwrap().len(), 1);
    // Dropping a role takes it from the roles and users that hold it.
    app.run_command(doc! {"dropRole": "writer"}).await.unwrap();
    unauthorized(ud.insert_one(doc! {"_id": 2}).await, "insert once writer is dropped");
    let info = app.run_command(doc! {"rolesInfo": "readerC", "showPrivileges": true}).await.unwrap();
    let r = info.get_array("roles").unwrap()[0].as_document().unwrap().clone();
    assert!(r.get_array("roles").unwrap().is_empty(), "{r}");
    assert_eq!(r.get_array("privileges").unwrap(), &vec![Bson::Document(find_c.clone())]);
    assert_eq!(app.run_command(doc! {"dropAllRolesFromDatabase": 1}).await.unwrap().get_i32("n").unwrap(), 1);
    unauthorized(uc.find_one(doc! {}).await, "find once readerC is dropped");
    let users = app.run_command(doc! {"usersInfo": "u"}).await.unwrap();
    assert!(users.get_array("users").unwrap()[0].as_document().unwrap().get_array("roles").unwrap().is_empty());
    // Without the privileges to manage roles, u may not.
    unauthorized(u.database("app").run_command(doc! {"createRole": "mine", "privileges": [], "roles": []}).await, "createRole without createRole");
}
