//! The audit log: MongoDB's audit records (atype, ts, uuid, local, remote, users, roles,
//! param, result) for authentication, authorization checks of CRUD commands, DDL, user
//! management, replica-set reconfiguration, startup and shutdown.
//!
//! Off the request path: a command hands over an `Event` that holds what it already has
//! (its body is shared, not copied) through a bounded queue; one writer thread builds the
//! records, applies the filter, encodes them (relaxed extended JSON, one per line, or BSON)
//! and writes each batch with one system call. A full queue blocks the sender: no record is
//! ever dropped. Every batch is written (to the OS) as soon as the writer has it, so a record
//! survives the process's kill -9 once the writer has taken it; a clean shutdown drains the
//! queue first.

use crate::config::{AuditConfig, AuditDestination, AuditFormat};
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use parking_lot::{Mutex, RwLock};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::SystemTime;

/// Events queued for the writer at most; a sender waits beyond (backpressure).
const QUEUE_EVENTS_MAX: usize = 65_536;
/// Events the writer takes per batch at most (one write each batch).
const BATCH_EVENTS_MAX: usize = 4_096;

/// What an event's `param` holds.
pub enum Param {
    Doc(Document),
    /// An authCheck: the command's name, namespace and body (shared with the request).
    Command { name: String, ns: String, args: Arc<Document> },
}

/// Who acted: the connection's addresses, its id, and its user and roles.
#[derive(Clone)]
pub struct Actor {
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
    pub uuid: bson::Uuid,
    pub users: Vec<(String, String)>,
    pub roles: Vec<(String, String)>,
}

impl Actor {
    /// The server itself (startup, shutdown).
    pub fn system() -> Actor {
        Actor { local: None, remote: None, uuid: bson::Uuid::from_bytes([0; 16]), users: Vec::new(), roles: Vec::new() }
    }
}

pub struct Event {
    pub atype: &'static str,
    pub ts: SystemTime,
    pub actor: Actor,
    pub param: Param,
    /// 0, or the error code the action ended with.
    pub result: i32,
}

/// What the writer takes from its queue.
enum Msg {
    Event(Event),
    /// Write what came before, then stop (clean shutdown).
    Close,
}

/// The audit log of a server: None when auditing is off.
pub struct Audit {
    tx: SyncSender<Msg>,
    /// `auditAuthorizationSuccess`: authCheck records for allowed commands too (otherwise
    /// only refusals).
    authorization_success: AtomicBool,
    /// `auditLog.filter`, as a query document and compiled.
    filter: Arc<RwLock<(Document, Option<query::filter::Filter>)>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Audit {
    /// Open the destination and start the writer.
    pub fn start(config: &AuditConfig, authorization_success: bool) -> Result<Audit> {
        let out: Box<dyn Write + Send> = match config.destination {
            AuditDestination::Console => Box::new(std::io::stdout()),
            AuditDestination::Syslog => Box::new(Syslog::open()),
            AuditDestination::File => {
                let path = config.path.as_ref().ok_or_else(|| Error::new(Code::BadValue, "auditLog.destination file needs auditLog.path"))?;
                Box::new(std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| Error::new(Code::BadValue, format!("cannot open auditLog.path {}: {e}", path.display())))?)
            }
        };
        let filter_doc = config.filter.clone().unwrap_or_default();
        let filter = Arc::new(RwLock::new((filter_doc.clone(), compile(&filter_doc)?)));
        let (tx, rx) = sync_channel(QUEUE_EVENTS_MAX);
        let format = config.format;
        let f = filter.clone();
        let writer = std::thread::Builder::new().name("audit-writer".into()).spawn(move || write_loop(rx, out, format, f)).map_err(|e| Error::internal(format!("cannot start the audit writer: {e}")))?;
        Ok(Audit { tx, authorization_success: AtomicBool::new(authorization_success), filter, writer: Mutex::new(Some(writer)) })
    }

    pub fn authorization_success(&self) -> bool {
        self.authorization_success.load(Ordering::Relaxed)
    }

    /// Queue an event; waits while the queue is full.
    pub fn log(&self, event: Event) {
        // Err only once the writer is gone (after `close`): nothing is left to write to.
        let _ = self.tx.send(Msg::Event(event));
    }

    /// {filter, auditAuthorizationSuccess}: getAuditConfig's reply.
    pub fn config(&self) -> Document {
        doc! {"filter": self.filter.read().0.clone(), "auditAuthorizationSuccess": self.authorization_success()}
    }

    /// setAuditConfig: a new filter and/or auditAuthorizationSuccess, for events from now on.
    pub fn set_config(&self, filter: Option<Document>, authorization_success: Option<bool>) -> Result<()> {
        if let Some(f) = filter {
            let compiled = compile(&f)?;
            *self.filter.write() = (f, compiled);
        }
        if let Some(s) = authorization_success {
            self.authorization_success.store(s, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Write everything queued, then stop the writer (clean shutdown).
    pub fn close(&self) {
        let _ = self.tx.send(Msg::Close);
        if let Some(w) = self.writer.lock().take() {
            let _ = w.join();
        }
    }
}

/// CRUD commands: their authorization checks are audited when they pass too
/// (`auditAuthorizationSuccess`); every command's refusal is.
fn is_crud(name: &str) -> bool {
    matches!(name, "find" | "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "aggregate" | "count" | "distinct" | "getMore" | "killCursors")
}

/// The authCheck record of a command, under authorization: `refused` is the refusal's code.
pub fn auth_check(shared: &crate::state::Shared, conn: &crate::conn::ConnState, db: &str, name: &str, cmd: &Arc<Document>, refused: Option<i32>) {
    let Some(audit) = &shared.audit else { return };
    if !shared.auth.enabled || (refused.is_none() && !(is_crud(name) && audit.authorization_success())) {
        return;
    }
    let ns = match cmd.get(name) {
        Some(Bson::String(c)) => format!("{db}.{c}"),
        _ => db.to_string(),
    };
    shared.audit_event("authCheck", &conn.actor(), Param::Command { name: name.to_string(), ns, args: cmd.clone() }, refused.unwrap_or(0));
}

/// The record of a command that changed the catalog, users or the set's configuration,
/// once it succeeded.
pub fn command_done(shared: &crate::state::Shared, conn: &crate::conn::ConnState, db: &str, name: &str, cmd: &Document) {
    let coll = cmd.get_str(name).unwrap_or("");
    let ns = format!("{db}.{coll}");
    let user = |extra: Document| {
        let mut d = doc! {"user": coll, "db": db};
        d.extend(extra);
        d
    };
    let roles = || cmd.get("roles").cloned().unwrap_or(Bson::Array(Vec::new()));
    let events: Vec<(&'static str, Document)> = match name {
        "create" => vec![("createCollection", doc! {"ns": &ns})],
        "drop" => vec![("dropCollection", doc! {"ns": &ns})],
        "dropDatabase" => vec![("dropDatabase", doc! {"ns": db})],
        "createIndexes" => cmd
            .get_array("indexes")
            .map(|ix| ix.iter().filter_map(|i| i.as_document()).map(|i| ("createIndex", doc! {"ns": &ns, "indexName": i.get_str("name").unwrap_or(""), "indexSpec": i.clone()})).collect())
            .unwrap_or_default(),
        "dropIndexes" | "deleteIndexes" => vec![("dropIndex", doc! {"ns": &ns, "indexName": cmd.get("index").cloned().unwrap_or(Bson::Null)})],
        "renameCollection" => vec![("renameCollection", doc! {"old": cmd.get("renameCollection").cloned().unwrap_or(Bson::Null), "new": cmd.get("to").cloned().unwrap_or(Bson::Null)})],
        "createUser" => vec![("createUser", user(doc! {"roles": roles()}))],
        "updateUser" => vec![("updateUser", user(doc! {"passwordChanged": cmd.contains_key("pwd"), "roles": roles()}))],
        "dropUser" => vec![("dropUser", user(Document::new()))],
        "dropAllUsersFromDatabase" => vec![("dropAllUsersFromDatabase", doc! {"db": db})],
        "grantRolesToUser" => vec![("grantRolesToUser", user(doc! {"roles": roles()}))],
        "revokeRolesFromUser" => vec![("revokeRolesFromUser", user(doc! {"roles": roles()}))],
        "replSetReconfig" => vec![("replSetReconfig", doc! {"new": cmd.get("replSetReconfig").cloned().unwrap_or(Bson::Null)})],
        _ => return,
    };
    let actor = conn.actor();
    for (atype, param) in events {
        shared.audit_event(atype, &actor, Param::Doc(param), 0);
    }
}

/// An empty filter matches every record.
fn compile(filter: &Document) -> Result<Option<query::filter::Filter>> {
    if filter.is_empty() {
        return Ok(None);
    }
    query::filter::Filter::parse(filter).map(Some)
}

fn write_loop(rx: Receiver<Msg>, mut out: Box<dyn Write + Send>, format: AuditFormat, filter: Arc<RwLock<(Document, Option<query::filter::Filter>)>>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut closing = false;
    while !closing {
        let Ok(first) = rx.recv() else { break };
        buf.clear();
        let mut batch = Vec::new();
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Event(e) => batch.push(e),
                Msg::Close => {
                    closing = true;
                    break;
                }
            }
            if batch.len() < BATCH_EVENTS_MAX {
                next = rx.try_recv().ok();
            }
        }
        let f = filter.read();
        for event in batch {
            let record = record(event);
            if f.1.as_ref().is_some_and(|f| !f.matches(&record)) {
                continue;
            }
            match format {
                AuditFormat::Json => {
                    let line = Bson::Document(record).into_relaxed_extjson().to_string();
                    buf.extend_from_slice(line.as_bytes());
                    buf.push(b'\n');
                }
                AuditFormat::Bson => {
                    if let Ok(bytes) = record.to_vec() {
                        buf.extend_from_slice(&bytes);
                    }
                }
            }
        }
        drop(f);
        if buf.is_empty() {
            continue;
        }
        // One write per batch; a failure is reported and the writer goes on, so that a
        // full disk does not also stop the server.
        if let Err(e) = out.write_all(&buf).and_then(|_| out.flush()) {
            tracing::error!("audit log write failed: {e}");
        }
    }
    let _ = out.flush();
}

fn address(a: Option<SocketAddr>) -> Bson {
    match a {
        Some(a) => Bson::Document(doc! {"ip": a.ip().to_string(), "port": a.port() as i32}),
        None => Bson::Document(doc! {"isSystemUser": true}),
    }
}

/// The record MongoDB writes for an event.
fn record(e: Event) -> Document {
    let pairs = |v: &[(String, String)], key: &str| -> Vec<Bson> { v.iter().map(|(n, d)| Bson::Document(doc! {key: n, "db": d})).collect() };
    let param = match e.param {
        Param::Doc(d) => d,
        Param::Command { name, ns, args } => doc! {"command": name, "ns": ns, "args": crate::auth::redacted(&args)},
    };
    doc! {
        "atype": e.atype,
        "ts": bson::DateTime::from_system_time(e.ts),
        "uuid": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: e.actor.uuid.bytes().to_vec() }),
        "local": address(e.actor.local),
        "remote": address(e.actor.remote),
        "users": pairs(&e.actor.users, "user"),
        "roles": pairs(&e.actor.roles, "role"),
        "param": param,
        "result": e.result,
    }
}

/// The syslog destination: one message per record, facility user, priority info.
struct Syslog {
    pending: Vec<u8>,
}

impl Syslog {
    fn open() -> Syslog {
        // SAFETY: a static NUL-terminated identity; openlog keeps the pointer.
        unsafe { libc::openlog(c"shoal-audit".as_ptr(), libc::LOG_PID, libc::LOG_USER) };
        Syslog { pending: Vec::new() }
    }
}

impl Write for Syslog {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        for line in self.pending.split(|c| *c == b'\n').filter(|l| !l.is_empty()) {
            if let Ok(c) = std::ffi::CString::new(line) {
                // SAFETY: both strings are NUL-terminated and live through the call.
                unsafe { libc::syslog(libc::LOG_INFO, c"%s".as_ptr(), c.as_ptr()) };
            }
        }
        self.pending.clear();
        Ok(())
    }
}
