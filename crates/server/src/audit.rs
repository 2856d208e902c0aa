//! The audit log: MongoDB's audit records (atype, ts, uuid, local, remote, users, roles,
//! param, result) for authentication, authorization checks of CRUD commands, DDL, user
//! management, replica-set reconfiguration, startup and shutdown.
//!
//! Off the request path: a command appends an `Event` that holds what it already has (its
//! body is shared, not copied) to a bounded queue, under a lock and without a system call;
//! one writer thread takes the whole queue every `FLUSH_INTERVAL` (or sooner when it fills
//! up), builds the records, applies the filter, encodes them (relaxed extended JSON, one per
//! line, or BSON) and writes them with one system call. Waking the writer for each event
//! cost a futex call and a thread switch per command, most of what auditing cost. A full
//! queue blocks the sender: no record is ever dropped. A record reaches the OS (and survives
//! the process's kill -9) within `FLUSH_INTERVAL`; a clean shutdown drains the queue.

use crate::config::{AuditConfig, AuditDestination, AuditFormat};
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use parking_lot::{Condvar, Mutex, RwLock};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// Events queued for the writer at most; a sender waits beyond (backpressure).
const QUEUE_EVENTS_MAX: usize = 65_536;
/// The writer wakes this often, or when this many events wait.
pub const FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);
const WAKE_EVENTS: usize = 4_096;

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

/// What the writer is asked to do besides writing events.
#[derive(Default)]
struct Pending {
    events: Vec<Event>,
    /// Write what is queued, then stop (clean shutdown).
    closed: bool,
    /// A change for the writer to make once the events queued before it are written
    /// (so a new filter applies to events from then on), answered on the sender.
    control: Option<(Control, std::sync::mpsc::Sender<std::result::Result<(), String>>)>,
}

enum Control {
    /// logRotate: rename the file aside and start a new one.
    Rotate,
    /// setAuditConfig's filter, as given and compiled.
    Filter(Document, Option<query::filter::Filter>),
}

/// Events on their way to the writer.
#[derive(Default)]
struct Queue {
    events: Mutex<Pending>,
    /// The writer waits here for `FLUSH_INTERVAL` or a full batch.
    wake: Condvar,
    /// Senders wait here while the queue is full.
    not_full: Condvar,
}

/// The audit log of a server: None when auditing is off.
pub struct Audit {
    queue: Arc<Queue>,
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
        let queue = Arc::new(Queue::default());
        let format = config.format;
        let (f, q) = (filter.clone(), queue.clone());
        let path = config.path.clone().filter(|_| config.destination == AuditDestination::File);
        let writer = std::thread::Builder::new().name("audit-writer".into()).spawn(move || write_loop(&q, out, path, format, f)).map_err(|e| Error::internal(format!("cannot start the audit writer: {e}")))?;
        Ok(Audit { queue, authorization_success: AtomicBool::new(authorization_success), filter, writer: Mutex::new(Some(writer)) })
    }

    pub fn authorization_success(&self) -> bool {
        self.authorization_success.load(Ordering::Relaxed)
    }

    /// Queue an event; waits while the queue is full.
    pub fn log(&self, event: Event) {
        let mut q = self.queue.events.lock();
        while q.events.len() >= QUEUE_EVENTS_MAX && !q.closed {
            self.queue.not_full.wait(&mut q);
        }
        if q.closed {
            return; // Closed: nothing is left to write to.
        }
        q.events.push(event);
        if q.events.len() == WAKE_EVENTS {
            self.queue.wake.notify_one();
        }
    }

    /// {filter, auditAuthorizationSuccess}: getAuditConfig's reply.
    pub fn config(&self) -> Document {
        doc! {"filter": self.filter.read().0.clone(), "auditAuthorizationSuccess": self.authorization_success()}
    }

    /// setAuditConfig: a new filter and/or auditAuthorizationSuccess, for events from now on
    /// (events queued before are written under the old filter first).
    pub fn set_config(&self, filter: Option<Document>, authorization_success: Option<bool>) -> Result<()> {
        if let Some(f) = filter {
            let compiled = compile(&f)?;
            self.control(Control::Filter(f, compiled)).map_err(Error::internal)?;
        }
        if let Some(s) = authorization_success {
            self.authorization_success.store(s, Ordering::Relaxed);
        }
        Ok(())
    }

    /// logRotate: the file so far is renamed `<path>.<UTC time>` and a new one started, after
    /// everything queued before is written to the old one. Nothing to do for console and
    /// syslog.
    pub fn rotate(&self) -> Result<()> {
        self.control(Control::Rotate).map_err(|e| Error::new(Code::FileRenameFailed, e))
    }

    /// Have the writer make `c` after writing what is queued, and wait until it has. One
    /// change at a time: a second waits for the first.
    fn control(&self, c: Control) -> std::result::Result<(), String> {
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let mut q = self.queue.events.lock();
            while q.control.is_some() && !q.closed {
                self.queue.not_full.wait(&mut q);
            }
            if q.closed {
                return Err("the audit writer has stopped".into());
            }
            q.control = Some((c, tx));
        }
        self.queue.wake.notify_one();
        rx.recv().unwrap_or_else(|_| Err("the audit writer has stopped".into()))
    }

    /// Write everything queued, then stop the writer (clean shutdown).
    pub fn close(&self) {
        self.queue.events.lock().closed = true;
        self.queue.wake.notify_one();
        self.queue.not_full.notify_all();
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

fn write_loop(queue: &Queue, mut out: Box<dyn Write + Send>, path: Option<std::path::PathBuf>, format: AuditFormat, filter: Arc<RwLock<(Document, Option<query::filter::Filter>)>>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut batch = Vec::new();
    loop {
        let (closing, control) = {
            let mut q = queue.events.lock();
            if q.events.len() < WAKE_EVENTS && !q.closed && q.control.is_none() {
                queue.wake.wait_for(&mut q, FLUSH_INTERVAL);
            }
            // Swap in the (empty) vector written last time: no allocation per batch.
            std::mem::swap(&mut q.events, &mut batch);
            (q.closed, q.control.take())
        };
        queue.not_full.notify_all();
        buf.clear();
        let f = filter.read();
        for event in batch.drain(..) {
            // Without a filter, JSON records are written straight from the event: no
            // record document, no copy of the command.
            if f.1.is_none() && format == AuditFormat::Json {
                json::record(&mut buf, &event);
                buf.push(b'\n');
                continue;
            }
            let record = record(event);
            if f.1.as_ref().is_some_and(|f| !f.matches(&record)) {
                continue;
            }
            match format {
                AuditFormat::Json => {
                    json::value(&mut buf, &Bson::Document(record));
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
        // One write per batch; a failure is reported and the writer goes on, so that a
        // full disk does not also stop the server.
        if !buf.is_empty() {
            if let Err(e) = out.write_all(&buf).and_then(|_| out.flush()) {
                tracing::error!("audit log write failed: {e}");
            }
        }
        match control {
            Some((Control::Rotate, reply)) => {
                let _ = reply.send(match &path {
                    Some(p) => rotate_file(p).map(|new| out = new),
                    None => Ok(()),
                });
            }
            Some((Control::Filter(doc, compiled), reply)) => {
                *filter.write() = (doc, compiled);
                let _ = reply.send(Ok(()));
            }
            None => {}
        }
        if closing {
            return;
        }
    }
}

/// Rename the audit file `<path>.<UTC time>` (mongod's rotated name) and open a new one.
fn rotate_file(path: &std::path::Path) -> std::result::Result<Box<dyn Write + Send>, String> {
    let stamp = bson::DateTime::now().try_to_rfc3339_string().unwrap_or_default().replace(':', "-");
    let stamp = stamp.split('.').next().unwrap_or_default().trim_end_matches('Z').to_string();
    let mut aside = std::path::PathBuf::from(format!("{}.{stamp}", path.display()));
    // Two rotations within a second: number the later ones.
    let mut n = 1;
    while aside.exists() {
        aside = std::path::PathBuf::from(format!("{}.{stamp}.{n}", path.display()));
        n += 1;
    }
    std::fs::rename(path, &aside).map_err(|e| format!("cannot rename {} to {}: {e}", path.display(), aside.display()))?;
    let f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    tracing::info!("audit log rotated to {}", aside.display());
    Ok(Box::new(f))
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

/// Relaxed extended JSON (MongoDB's canonical text for audit records), written straight into
/// a buffer: what `Bson::into_relaxed_extjson` produces, without building a `serde_json`
/// tree for every record.
mod json {
    use super::{Event, Param};
    use bson::{Bson, Document};
    use std::io::Write as _;

    pub fn record(buf: &mut Vec<u8>, e: &Event) {
        buf.extend_from_slice(b"{\"atype\":");
        string(buf, e.atype);
        buf.extend_from_slice(b",\"ts\":");
        value(buf, &Bson::DateTime(bson::DateTime::from_system_time(e.ts)));
        buf.extend_from_slice(b",\"uuid\":");
        binary(buf, &e.actor.uuid.bytes(), 4);
        buf.extend_from_slice(b",\"local\":");
        value(buf, &super::address(e.actor.local));
        buf.extend_from_slice(b",\"remote\":");
        value(buf, &super::address(e.actor.remote));
        buf.extend_from_slice(b",\"users\":");
        pairs(buf, &e.actor.users, "user");
        buf.extend_from_slice(b",\"roles\":");
        pairs(buf, &e.actor.roles, "role");
        buf.extend_from_slice(b",\"param\":");
        match &e.param {
            Param::Doc(d) => document(buf, d, &[]),
            Param::Command { name, ns, args } => {
                buf.extend_from_slice(b"{\"command\":");
                string(buf, name);
                buf.extend_from_slice(b",\"ns\":");
                string(buf, ns);
                buf.extend_from_slice(b",\"args\":");
                document(buf, args, &crate::auth::SECRET_FIELDS);
                buf.push(b'}');
            }
        }
        let _ = write!(buf, ",\"result\":{}}}", e.result);
    }

    fn pairs(buf: &mut Vec<u8>, v: &[(String, String)], key: &str) {
        buf.push(b'[');
        for (i, (n, d)) in v.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            buf.extend_from_slice(b"{\"");
            buf.extend_from_slice(key.as_bytes());
            buf.extend_from_slice(b"\":");
            string(buf, n);
            buf.extend_from_slice(b",\"db\":");
            string(buf, d);
            buf.push(b'}');
        }
        buf.push(b']');
    }

    /// A document, with the top-level fields named in `secrets` written as "xxx".
    fn document(buf: &mut Vec<u8>, d: &Document, secrets: &[&str]) {
        buf.push(b'{');
        for (i, (k, v)) in d.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            string(buf, k);
            buf.push(b':');
            if secrets.contains(&k.as_str()) {
                string(buf, "xxx");
            } else {
                value(buf, v);
            }
        }
        buf.push(b'}');
    }

    fn binary(buf: &mut Vec<u8>, bytes: &[u8], subtype: u8) {
        use base64::Engine as _;
        buf.extend_from_slice(b"{\"$binary\":{\"base64\":\"");
        buf.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(bytes).as_bytes());
        let _ = write!(buf, "\",\"subType\":\"{subtype:02x}\"}}}}");
    }

    pub fn value(buf: &mut Vec<u8>, v: &Bson) {
        match v {
            Bson::String(s) => string(buf, s),
            Bson::Int32(n) => {
                let _ = write!(buf, "{n}");
            }
            Bson::Int64(n) => {
                let _ = write!(buf, "{n}");
            }
            Bson::Boolean(b) => buf.extend_from_slice(if *b { b"true" } else { b"false" }),
            Bson::Null => buf.extend_from_slice(b"null"),
            Bson::Double(f) if f.is_finite() && f.fract() != 0.0 => {
                let _ = write!(buf, "{f}");
            }
            Bson::Document(d) => document(buf, d, &[]),
            Bson::Array(a) => {
                buf.push(b'[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        buf.push(b',');
                    }
                    value(buf, x);
                }
                buf.push(b']');
            }
            Bson::ObjectId(o) => {
                let _ = write!(buf, "{{\"$oid\":\"{o}\"}}");
            }
            Bson::Binary(b) => binary(buf, &b.bytes, u8::from(b.subtype)),
            // Everything else as the bson crate writes it (dates, doubles that are whole or
            // not finite, timestamps, decimals, regexes...).
            other => {
                let _ = write!(buf, "{}", other.clone().into_relaxed_extjson());
            }
        }
    }

    fn string(buf: &mut Vec<u8>, s: &str) {
        buf.push(b'"');
        for c in s.chars() {
            match c {
                '"' => buf.extend_from_slice(b"\\\""),
                '\\' => buf.extend_from_slice(b"\\\\"),
                '\n' => buf.extend_from_slice(b"\\n"),
                '\r' => buf.extend_from_slice(b"\\r"),
                '\t' => buf.extend_from_slice(b"\\t"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(buf, "\\u{:04x}", c as u32);
                }
                c => {
                    let mut b = [0u8; 4];
                    buf.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                }
            }
        }
        buf.push(b'"');
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use bson::doc;

        #[test]
        fn values_encode_as_the_bson_crate_writes_relaxed_extended_json() {
            let d = doc! {
                "s": "a\"b\\c\n\u{1}é", "i": 5, "l": 1i64 << 40, "t": true, "n": Bson::Null, "f": 1.5, "whole": 2.0, "inf": f64::INFINITY,
                "o": bson::oid::ObjectId::new(), "b": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] },
                "a": [1, "x", {"y": [2]}], "ts": bson::Timestamp { time: 1, increment: 2 }, "date": bson::DateTime::from_millis(1_700_000_000_000),
                "dec": "1.5".parse::<bson::Decimal128>().unwrap(),
            };
            let mut buf = Vec::new();
            value(&mut buf, &Bson::Document(d.clone()));
            let ours: serde_json::Value = serde_json::from_slice(&buf).unwrap();
            assert_eq!(ours, Bson::Document(d).into_relaxed_extjson());
        }
    }
}
