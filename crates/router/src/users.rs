//! Authentication and authorization on the router, as on mongos: users and roles live on
//! the config servers (admin.system.users and admin.system.roles there), the user and role
//! commands are sent to the config servers' primary, and every command a client sends is
//! checked here (`access::authorize`, mongod's table) before it is routed. The router
//! reaches shards and config servers as the internal user (its keyFile), so a shard runs
//! what the router let through.
//!
//! A connection's user is read again (with its roles) after a user or role command through
//! this router, and at least every `USER_CACHE_SECONDS` (mongos's
//! userCacheInvalidationIntervalSecs), so that a change made through another router takes
//! effect within that time.

use crate::{Router, RouterConn};
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use wire::Request;

/// How long a connection's user, as read from the config servers, is trusted.
pub const USER_CACHE_SECONDS: u64 = 30;
/// User-defined roles read, at most, to resolve one user's roles.
const ROLES_READ_MAX: i64 = 10_000;

/// Users and roles read from the config servers for one resolution.
#[derive(Default)]
struct Snapshot {
    users: HashMap<String, Document>,
    roles: HashMap<String, Document>,
}

impl access::Directory for Snapshot {
    fn find_user(&self, db: &str, user: &str) -> Result<Option<Document>> {
        Ok(self.users.get(&format!("{db}.{user}")).cloned())
    }

    fn find_role(&self, db: &str, role: &str) -> Result<Option<Document>> {
        Ok(self.roles.get(&format!("{db}.{role}")).cloned())
    }
}

impl Router {
    /// `find` on the config servers' admin database.
    async fn admin_find(&self, coll: &str, filter: Document, limit: i64) -> Result<Vec<Document>> {
        let reply =
            self.config_command(access::USERS_DB, doc! {"find": coll, "filter": filter, "limit": limit, "batchSize": limit, "singleBatch": true}).await?;
        Ok(net::peer::cursor_batch(&reply, "firstBatch")?.1)
    }

    async fn user_doc(&self, db: &str, user: &str) -> Result<Option<Document>> {
        Ok(self.admin_find(access::USERS_COLLECTION, doc! {"_id": format!("{db}.{user}")}, 1).await?.into_iter().next())
    }

    /// `user`@`db` with its roles resolved, as the config servers hold them now.
    async fn authed_user(&self, user: &str, db: &str) -> Result<access::AuthedUser> {
        let generation = self.users_generation.load(Ordering::SeqCst);
        let mut snapshot = Snapshot::default();
        if !access::is_internal(user, db) {
            if let Some(d) = self.user_doc(db, user).await? {
                snapshot.users.insert(format!("{db}.{user}"), d);
            }
            for r in self.admin_find(access::ROLES_COLLECTION, doc! {}, ROLES_READ_MAX).await? {
                if let Ok(id) = r.get_str("_id") {
                    snapshot.roles.insert(id.to_string(), r.clone());
                }
            }
        }
        access::authed_user(&snapshot, user, db, generation)
    }

    /// Whether no user exists yet (the localhost exception holds).
    async fn no_users(&self) -> Result<bool> {
        Ok(self.admin_find(access::USERS_COLLECTION, doc! {}, 1).await?.is_empty())
    }
}

/// Check that the connection may run the command, and write its authCheck record: every
/// refusal, and with `auditAuthorizationSuccess` every CRUD command that passes.
pub async fn authorize(router: &Router, conn: &mut RouterConn, req: &Request) -> Result<()> {
    let checked = check(router, conn, req).await;
    if let Some(audit) = &router.audit {
        let crud = crate::table::lookup(&req.name).is_some_and(|r| r.crud);
        if checked.is_err() || (crud && audit.authorization_success()) {
            audit.log_command(&conn.actor(), &req.body, checked.as_ref().err().map_or(0, |e| e.code));
        }
    }
    checked
}

/// Check that the connection may run the command, reading its user again when it may be
/// stale.
async fn check(router: &Router, conn: &mut RouterConn, req: &Request) -> Result<()> {
    let generation = router.users_generation.load(Ordering::SeqCst);
    let stale = conn.auth.user.as_ref().is_some_and(|u| u.generation != generation) || conn.user_read.elapsed() > Duration::from_secs(USER_CACHE_SECONDS);
    if let Some(u) = conn.auth.user.as_ref().filter(|u| stale && !access::is_internal(&u.user, &u.db)) {
        let (user, db) = (u.user.clone(), u.db.clone());
        conn.auth.user = match router.user_doc(&db, &user).await? {
            Some(_) => Some(router.authed_user(&user, &db).await?),
            None => None,
        };
        conn.user_read = Instant::now();
    }
    // The localhost exception asks the config servers only for a bootstrap command.
    let bootstrap = conn.auth.user.is_none() && access::privileges::is_bootstrap(&req.name, &req.db) && conn.remote.ip().is_loopback();
    let exception = bootstrap && router.no_users().await?;
    access::authorize(conn.auth.user.as_ref(), &req.db, &req.name, &req.body, || exception)
}

/// saslStart on `db` (also hello's speculativeAuthenticate).
pub async fn sasl_start(router: &Router, conn: &mut RouterConn, db: &str, cmd: &Document) -> Result<Document> {
    let start = access::sasl::parse_start(&mut conn.auth, db, cmd)?;
    let credentials = if access::is_internal(&start.user, db) {
        access::internal_key().and_then(|k| k.credentials(start.mechanism))
    } else {
        router.user_doc(db, &start.user).await?.and_then(|d| access::credentials_in(&d, start.mechanism))
    };
    access::sasl::begin(&mut conn.auth, db, start, credentials)
}

pub async fn sasl_continue(router: &Router, conn: &mut RouterConn, cmd: &Document) -> Result<Document> {
    match access::sasl::step(&mut conn.auth, cmd)? {
        access::sasl::Step::Continue(reply) => Ok(reply),
        access::sasl::Step::Done(reply, login) => {
            log_in(router, conn, &login.user, &login.db, login.mechanism).await?;
            Ok(reply)
        }
        access::sasl::Step::Failed(login) => {
            let param = doc! {"user": &login.user, "db": &login.db, "mechanism": login.mechanism};
            router.audit_event("authenticate", &conn.actor(), audit_log::Param::Doc(param), Code::AuthenticationFailed.0);
            Err(access::sasl::auth_failed())
        }
    }
}

async fn log_in(router: &Router, conn: &mut RouterConn, user: &str, db: &str, mechanism: &str) -> Result<()> {
    conn.auth.check_one_user(user, db)?;
    conn.auth.user = Some(router.authed_user(user, db).await?);
    conn.user_read = Instant::now();
    tracing::info!(conn = conn.id, "authenticated as {user}@{db}");
    router.audit_event("authenticate", &conn.actor(), audit_log::Param::Doc(doc! {"user": user, "db": db, "mechanism": mechanism}), 0);
    Ok(())
}

const X509: &str = "MONGODB-X509";

/// MONGODB-X509: the user is the subject of the client's verified certificate, defined on
/// $external.
pub async fn authenticate(router: &Router, conn: &mut RouterConn, db: &str, cmd: &Document) -> Result<Document> {
    let mechanism = cmd.get_str("mechanism").map_err(|_| Error::bad_value("authenticate needs a mechanism string"))?;
    if mechanism != X509 {
        return Err(Error::new(Code::MechanismUnavailable, format!("Unsupported mechanism '{mechanism}' on authentication database '{db}'")));
    }
    let subject = match &conn.auth.peer_subject {
        Some(s) if db == access::EXTERNAL_DB && cmd.get_str("user").map_or(true, |u| u == s) => s.clone(),
        _ => return Err(access::sasl::auth_failed()),
    };
    if router.user_doc(db, &subject).await?.is_none() {
        return Err(access::sasl::auth_failed());
    }
    log_in(router, conn, &subject, db, X509).await?;
    Ok(doc! {"dbname": db, "user": subject})
}

pub fn logout(router: &Router, conn: &mut RouterConn, db: &str) -> Document {
    if conn.auth.user.as_ref().is_some_and(|u| u.db == db) {
        let before = conn.actor();
        conn.auth.user = None;
        let initial: Vec<Bson> = before.users.iter().map(|(u, d)| Bson::Document(doc! {"user": u, "db": d})).collect();
        let param = doc! {"reason": format!("Explicit logout from db '{db}'"), "initialUsers": initial, "updatedUsers": []};
        router.audit_event("logout", &before, audit_log::Param::Doc(param), 0);
    }
    Document::new()
}

/// hello's saslSupportedMechs and speculativeAuthenticate.
pub async fn hello_fields(router: &Router, conn: &mut RouterConn, name: &str, cmd: &Document, reply: &mut Document) -> Result<()> {
    if let Some(v) = cmd.get("saslSupportedMechs") {
        let Bson::String(who) = v else { return Err(Error::type_mismatch("saslSupportedMechs must be a string \"<db>.<user>\"")) };
        if let Some((db, user)) = who.split_once('.') {
            let mechs = if access::is_internal(user, db) {
                access::internal_key().map(|_| net::scram::Mechanism::ALL.iter().map(|m| m.name()).collect())
            } else {
                router.user_doc(db, user).await.ok().flatten().map(|d| access::mechanisms_in(&d))
            };
            if let Some(m) = mechs {
                reply.insert("saslSupportedMechs", m);
            }
        }
    }
    if let Some(v) = cmd.get("speculativeAuthenticate") {
        let spec = match v {
            Bson::Document(d) if !d.is_empty() => d.clone(),
            _ => return Err(Error::bad_value(format!("{name}.speculativeAuthenticate must be a non-empty Object"))),
        };
        let answer = match spec.keys().next().map(String::as_str) {
            // Without a db it is ignored, as mongod does.
            Some("saslStart") => match spec.get_str("db") {
                Ok(db) => sasl_start(router, conn, db, &spec).await.ok(),
                Err(_) => None,
            },
            Some("authenticate") => {
                let db = spec.get_str("db").unwrap_or(access::EXTERNAL_DB).to_string();
                authenticate(router, conn, &db, &spec).await.ok()
            }
            Some(other) => return Err(Error::location(51769, format!("hello.speculativeAuthenticate unknown command: {other}"))),
            None => None,
        };
        if let Some(r) = answer {
            reply.insert("speculativeAuthenticate", r);
        }
    }
    Ok(())
}

/// A user or role command, on the config servers' primary; one that changes users makes
/// this router's connections read their users again.
pub async fn user_command(router: &Router, conn: &mut RouterConn, req: &Request) -> Result<Document> {
    let reply = router.config_command(&req.db, crate::commands::forwarded(req)).await;
    if !matches!(req.name.as_str(), "usersInfo" | "rolesInfo") {
        router.users_generation.fetch_add(1, Ordering::SeqCst);
    }
    if reply.is_ok() && router.audit.is_some() {
        let actor = conn.actor();
        for (atype, param) in audit_log::command_events(&req.db, &req.name, &req.body) {
            router.audit_event(atype, &actor, audit_log::Param::Doc(param), 0);
        }
    }
    reply
}

/// connectionStatus: who the connection is.
pub fn connection_status(conn: &RouterConn, req: &Request) -> Document {
    let (users, roles): (Vec<Bson>, Vec<Bson>) = match &conn.auth.user {
        Some(u) => {
            (vec![Bson::Document(doc! {"user": &u.user, "db": &u.db})], u.roles.iter().map(|(r, d)| Bson::Document(doc! {"role": r, "db": d})).collect())
        }
        None => (Vec::new(), Vec::new()),
    };
    let mut info = doc! {"authenticatedUsers": users, "authenticatedUserRoles": roles};
    if req.body.get_bool("showPrivileges").unwrap_or(false) {
        info.insert("authenticatedUserPrivileges", Vec::<Bson>::new());
    }
    doc! {"authInfo": info}
}
