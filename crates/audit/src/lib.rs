//! The audit log: MongoDB's audit records (atype, ts, uuid, local, remote, users, roles,
//! param, result) for authentication, authorization checks of CRUD commands, creations of
//! databases and collections (implicit ones too), other DDL, user and role management,
//! replica-set reconfiguration, startup and shutdown.
//!
//! Off the request path: a command appends an `Event` to a bounded queue, under a lock,
//! without a system call or an allocation (an authorization check's command is copied into
//! the queue's byte buffer as the OP_MSG frame it came in; the connection's identity,
//! rendered once, is named by an index into the batch's table of actors);
//! one writer thread takes the whole queue every `FLUSH_INTERVAL` (or sooner when it fills
//! up), applies the filter, encodes the records (relaxed extended JSON, one per line,
//! walked straight from the command's bytes; or BSON, the command's bytes copied) and
//! writes them with one system call. Waking the writer for each event
//! cost a futex call and a thread switch per command, most of what auditing cost. A full
//! queue blocks the sender: no record is ever dropped. A record reaches the OS (and survives
//! the process's kill -9) within `FLUSH_INTERVAL`; a clean shutdown drains the queue.
//!
//! An authCheck record may be queued as the request's OP_MSG frame, and the writer merges
//! the frame's document sequences into the command (`wire::msg_command_into`); otherwise
//! the command is queued encoded as BSON. A record's args never show a password or a SCRAM
//! payload (`access::SECRET_FIELDS`). mongod and the router each run one `Audit`; what
//! they record, and when, is theirs.

use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use parking_lot::{Condvar, Mutex, RwLock};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `auditLog.destination`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditDestination {
    File,
    Console,
    Syslog,
}

/// `auditLog.format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditFormat {
    /// Relaxed extended JSON, one record per line.
    Json,
    /// BSON documents back to back.
    Bson,
}

/// `auditLog`: present when auditing is on (a destination is set).
#[derive(Clone, Debug)]
pub struct AuditConfig {
    pub destination: AuditDestination,
    pub format: AuditFormat,
    pub path: Option<PathBuf>,
    /// Which records are written (a query over them); None: all.
    pub filter: Option<bson::Document>,
}

/// The pieces of `auditLog` as given, before they are checked together.
#[derive(Clone, Debug, Default)]
pub struct AuditOptions {
    pub destination: Option<String>,
    pub format: Option<String>,
    pub path: Option<PathBuf>,
    pub filter: Option<String>,
}

impl AuditOptions {
    /// The auditLog configuration, checked; None when auditing is off.
    pub fn build(&self) -> Result<Option<AuditConfig>> {
        let Some(d) = &self.destination else {
            if self.format.is_some() || self.path.is_some() || self.filter.is_some() {
                return Err(bad_option("auditLog options need auditLog.destination"));
            }
            return Ok(None);
        };
        let destination = match d.as_str() {
            "file" => AuditDestination::File,
            "console" => AuditDestination::Console,
            "syslog" => AuditDestination::Syslog,
            other => return Err(bad_option(format!("auditLog.destination must be file, console or syslog, not '{other}'"))),
        };
        let format = match self.format.as_deref() {
            None | Some("JSON") => AuditFormat::Json,
            Some("BSON") => AuditFormat::Bson,
            Some(other) => return Err(bad_option(format!("auditLog.format must be JSON or BSON, not '{other}'"))),
        };
        if format == AuditFormat::Bson && destination != AuditDestination::File {
            return Err(bad_option("auditLog.format BSON is for auditLog.destination file only"));
        }
        if destination == AuditDestination::File && self.path.is_none() {
            return Err(bad_option("auditLog.destination file needs auditLog.path"));
        }
        let filter = match &self.filter {
            None => None,
            Some(text) => {
                let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad_option(format!("auditLog.filter is not JSON: {e}")))?;
                let b = bson::Bson::try_from(v).map_err(|e| bad_option(format!("auditLog.filter: {e}")))?;
                let bson::Bson::Document(d) = b else { return Err(bad_option("auditLog.filter must be a JSON object")) };
                query::filter::Filter::parse(&d).map_err(|e| bad_option(format!("auditLog.filter: {}", e.message)))?;
                Some(d)
            }
        };
        Ok(Some(AuditConfig { destination, format, path: self.path.clone(), filter }))
    }
}

fn bad_option(msg: impl Into<String>) -> Error {
    Error::new(Code::BadValue, msg)
}

/// Events queued for the writer at most, and bytes of their commands; a sender waits
/// beyond either (backpressure).
const QUEUE_EVENTS_MAX: usize = 65_536;
const QUEUE_BYTES_MAX: usize = 64 << 20;
/// The writer wakes this often, or when this many events wait.
pub const FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);
const WAKE_EVENTS: usize = 4_096;

/// What an event's `param` holds.
pub enum Param {
    Doc(Document),
    /// An authCheck: the command as BSON, at this range of the queue's byte buffer. Its
    /// name, namespace and args are read from it by the writer.
    Command(std::ops::Range<usize>),
    /// An authCheck: the OP_MSG frame that carried the command, at this range of the
    /// queue's byte buffer; the writer merges its document sequences into the body.
    Frame(std::ops::Range<usize>),
}

/// Who acted: the connection's addresses, its id, and its user and roles. A connection
/// keeps one and shares it with each of its events (`ConnState::actor`); its JSON is
/// rendered once, when it is made.
pub struct Actor {
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
    pub uuid: bson::Uuid,
    pub users: Vec<(String, String)>,
    pub roles: Vec<(String, String)>,
    /// `"uuid":…,"local":…,"remote":…,"users":[…],"roles":[…]` as written in a JSON record.
    json: Box<[u8]>,
    /// The same fields as BSON elements, as written in a BSON record.
    bson: Box<[u8]>,
}

impl Actor {
    pub fn new(local: Option<SocketAddr>, remote: Option<SocketAddr>, uuid: bson::Uuid, users: Vec<(String, String)>, roles: Vec<(String, String)>) -> Actor {
        let mut a = Actor { local, remote, uuid, users, roles, json: Box::default(), bson: Box::default() };
        // Both renderings are the fields document's, without what encloses its fields: the
        // braces in JSON, the length prefix and terminating NUL in BSON.
        let fields = a.fields();
        let mut json = Vec::with_capacity(256);
        json::value(&mut json, &Bson::Document(fields.clone()));
        a.json = json.get(1..json.len().saturating_sub(1)).unwrap_or_default().into();
        let bytes = fields.to_vec().unwrap_or_default();
        a.bson = bytes.get(4..bytes.len().saturating_sub(1)).unwrap_or_default().into();
        a
    }

    /// The record fields that say who acted: uuid, local, remote, users, roles.
    fn fields(&self) -> Document {
        let pairs = |v: &[(String, String)], key: &str| -> Vec<Bson> { v.iter().map(|(n, d)| Bson::Document(doc! {key: n, "db": d})).collect() };
        doc! {
            "uuid": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: self.uuid.bytes().to_vec() }),
            "local": address(self.local),
            "remote": address(self.remote),
            "users": pairs(&self.users, "user"),
            "roles": pairs(&self.roles, "role"),
        }
    }

    /// The server itself (startup, shutdown).
    pub fn system() -> Arc<Actor> {
        Arc::new(Actor::new(None, None, bson::Uuid::from_bytes([0; 16]), Vec::new(), Vec::new()))
    }
}

struct Event {
    atype: &'static str,
    /// Milliseconds since the epoch (a record's `ts` has millisecond precision).
    ts_ms: i64,
    /// Who acted: an index into the batch's `Pending::actors`.
    actor: u32,
    param: Param,
    /// 0, or the error code the action ended with.
    result: i32,
}

/// Actors a sender looks for among the batch's newest before adding its own again: a batch
/// holds the events of a few busy connections, so the search is short and usually finds it.
const ACTOR_SEARCH_MAX: usize = 16;

/// What the writer is asked to do besides writing events.
#[derive(Default)]
struct Pending {
    events: Vec<Event>,
    /// The bytes of the events' commands and frames (`Param::Command`, `Param::Frame`),
    /// one after another.
    bytes: Vec<u8>,
    /// The actors of the batch's events, each held once: an event names its actor by index,
    /// so that queueing one changes no reference count (a count written by the requests'
    /// threads and by the writer moves its cache line between cores at every event).
    actors: Vec<Arc<Actor>>,
    /// Write what is queued, then stop (clean shutdown).
    closed: bool,
    /// A change for the writer to make once the events queued before it are written
    /// (so a new filter applies to events from then on), answered on the sender.
    control: Option<(Control, std::sync::mpsc::Sender<std::result::Result<(), String>>)>,
}

impl Pending {
    /// `actor`'s index in the batch's table, added when it is not among the newest.
    fn actor(&mut self, actor: &Arc<Actor>) -> u32 {
        let newest = self.actors.iter().rev().take(ACTOR_SEARCH_MAX).position(|a| Arc::ptr_eq(a, actor));
        match newest {
            Some(back) => (self.actors.len() - 1 - back) as u32,
            None => {
                self.actors.push(actor.clone());
                (self.actors.len() - 1) as u32
            }
        }
    }
}

enum Control {
    /// logRotate: rename the file aside and start a new one.
    Rotate,
    /// setAuditConfig's filter, as given and compiled.
    Filter(Document, Option<Box<query::filter::Filter>>),
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
    /// The runtime configuration's id (setAuditConfig's), once there is one.
    generation: Mutex<Option<bson::oid::ObjectId>>,
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
                Box::new(AuditFile::open(path).map_err(|e| Error::new(Code::BadValue, format!("cannot open auditLog.path {}: {e}", path.display())))?)
            }
        };
        let filter_doc = config.filter.clone().unwrap_or_default();
        let filter = Arc::new(RwLock::new((filter_doc.clone(), compile(&filter_doc)?)));
        let queue = Arc::new(Queue::default());
        let format = config.format;
        let (f, q) = (filter.clone(), queue.clone());
        let path = config.path.clone().filter(|_| config.destination == AuditDestination::File);
        let writer = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_loop(&q, out, path, format, f))
            .map_err(|e| Error::internal(format!("cannot start the audit writer: {e}")))?;
        Ok(Audit {
            queue,
            authorization_success: AtomicBool::new(authorization_success),
            filter,
            generation: Mutex::new(None),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// The runtime configuration's id (setAuditConfig's), once there is one.
    pub fn generation(&self) -> Option<bson::oid::ObjectId> {
        *self.generation.lock()
    }

    pub fn authorization_success(&self) -> bool {
        self.authorization_success.load(Ordering::Relaxed)
    }

    /// Queue an event; waits while the queue is full.
    pub fn log(&self, atype: &'static str, actor: &Arc<Actor>, param: Param, result: i32) {
        let ts_ms = bson::DateTime::now().timestamp_millis();
        let Some(mut q) = self.room() else { return };
        let actor = q.actor(actor);
        q.events.push(Event { atype, ts_ms, actor, param, result });
        self.pushed(&q);
    }

    /// Queue the authCheck record of the command that `frame` (an uncompressed OP_MSG that
    /// `wire::decode` accepted) carried: the frame is copied into the queue's byte buffer
    /// under the lock, and the writer makes the command of it. The cheapest way to record a
    /// command: one copy, no encoding, no allocation.
    pub fn log_frame(&self, actor: &Arc<Actor>, frame: &[u8], result: i32) {
        self.log_bytes(actor, frame, Param::Frame, result);
    }

    /// Queue the authCheck record of `command`, for a request whose frame was not kept. The
    /// command is encoded as BSON into a buffer of this thread's, outside the queue's lock,
    /// then copied into the queue's byte buffer: no allocation, and the request's own
    /// document is freed by the request (a document freed on the writer's thread cost the
    /// allocator more than the copy does).
    pub fn log_command(&self, actor: &Arc<Actor>, command: &Document, result: i32) {
        thread_local! {
            static ENCODED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        /// A buffer grown beyond this by a huge command is given back after it.
        const ENCODED_KEPT_BYTES_MAX: usize = 1 << 20;
        ENCODED.with(|encoded| {
            let mut encoded = encoded.borrow_mut();
            encoded.clear();
            match wire::encode_document_into(&mut encoded, command) {
                Ok(()) => self.log_bytes(actor, &encoded, Param::Command, result),
                // Not reachable for a command that was decoded from BSON; recorded anyway.
                Err(e) => self.log(
                    "authCheck",
                    actor,
                    Param::Doc(doc! {"command": command.keys().next().map(String::as_str).unwrap_or(""), "error": e.message}),
                    result,
                ),
            }
            if encoded.capacity() > ENCODED_KEPT_BYTES_MAX {
                *encoded = Vec::new();
            }
        });
    }

    /// Queue an authCheck whose param is `bytes`, copied into the queue's byte buffer.
    fn log_bytes(&self, actor: &Arc<Actor>, bytes: &[u8], param: fn(std::ops::Range<usize>) -> Param, result: i32) {
        let ts_ms = bson::DateTime::now().timestamp_millis();
        let Some(mut q) = self.room() else { return };
        let start = q.bytes.len();
        q.bytes.extend_from_slice(bytes);
        let param = param(start..q.bytes.len());
        let actor = q.actor(actor);
        q.events.push(Event { atype: "authCheck", ts_ms, actor, param, result });
        self.pushed(&q);
    }

    /// The queue, once it has room (or None once the writer has stopped).
    fn room(&self) -> Option<parking_lot::MutexGuard<'_, Pending>> {
        let mut q = self.queue.events.lock();
        while (q.events.len() >= QUEUE_EVENTS_MAX || q.bytes.len() >= QUEUE_BYTES_MAX) && !q.closed {
            self.queue.not_full.wait(&mut q);
        }
        // Closed: nothing is left to write to.
        (!q.closed).then_some(q)
    }

    /// Wake the writer early when a batch's worth waits.
    fn pushed(&self, q: &Pending) {
        if q.events.len() == WAKE_EVENTS {
            self.queue.wake.notify_one();
        }
    }

    /// {generation, filter, auditAuthorizationSuccess}: getAuditConfig's reply.
    pub fn config(&self) -> Document {
        let mut d = Document::new();
        if let Some(g) = *self.generation.lock() {
            d.insert("generation", g);
        }
        d.insert("filter", self.filter.read().0.clone());
        d.insert("auditAuthorizationSuccess", self.authorization_success());
        d
    }

    /// A new filter and/or auditAuthorizationSuccess (setAuditConfig's, here or replicated),
    /// for events from now on (events queued before are written under the old filter first).
    pub fn set_config(&self, filter: Option<Document>, authorization_success: Option<bool>, generation: Option<bson::oid::ObjectId>) -> Result<()> {
        // Checked before anything changes: a filter that does not compile changes nothing.
        let filter = match filter {
            Some(f) => {
                let compiled = compile(&f)?;
                Some((f, compiled))
            }
            None => None,
        };
        if generation.is_some() {
            *self.generation.lock() = generation;
        }
        if let Some((f, compiled)) = filter {
            self.control(Control::Filter(f, compiled.map(Box::new))).map_err(Error::internal)?;
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

/// The records (atype, param) of a command that changed the catalog, users, roles or a
/// set's configuration, to write once it succeeded; none for other commands.
pub fn command_events(db: &str, name: &str, cmd: &Document) -> Vec<(&'static str, Document)> {
    let coll = cmd.get_str(name).unwrap_or("");
    let ns = format!("{db}.{coll}");
    let user = |extra: Document| {
        let mut d = doc! {"user": coll, "db": db};
        d.extend(extra);
        d
    };
    let roles = || cmd.get("roles").cloned().unwrap_or(Bson::Array(Vec::new()));
    // A role command's param: the role, and the roles and privileges it gave.
    let role = || {
        let mut d = doc! {"role": coll, "db": db};
        for field in ["roles", "privileges"] {
            if let Some(v) = cmd.get(field) {
                d.insert(field, v.clone());
            }
        }
        d
    };
    match name {
        "drop" => vec![("dropCollection", doc! {"ns": &ns})],
        "dropDatabase" => vec![("dropDatabase", doc! {"ns": db})],
        "createIndexes" => cmd
            .get_array("indexes")
            .map(|ix| {
                ix.iter()
                    .filter_map(|i| i.as_document())
                    .map(|i| ("createIndex", doc! {"ns": &ns, "indexName": i.get_str("name").unwrap_or(""), "indexSpec": i.clone()}))
                    .collect()
            })
            .unwrap_or_default(),
        "dropIndexes" | "deleteIndexes" => vec![("dropIndex", doc! {"ns": &ns, "indexName": cmd.get("index").cloned().unwrap_or(Bson::Null)})],
        "renameCollection" => vec![(
            "renameCollection",
            doc! {"old": cmd.get("renameCollection").cloned().unwrap_or(Bson::Null), "new": cmd.get("to").cloned().unwrap_or(Bson::Null)},
        )],
        "createUser" => vec![("createUser", user(doc! {"roles": roles()}))],
        "updateUser" => vec![("updateUser", user(doc! {"passwordChanged": cmd.contains_key("pwd"), "roles": roles()}))],
        "dropUser" => vec![("dropUser", user(Document::new()))],
        "dropAllUsersFromDatabase" => vec![("dropAllUsersFromDatabase", doc! {"db": db})],
        "grantRolesToUser" => vec![("grantRolesToUser", user(doc! {"roles": roles()}))],
        "revokeRolesFromUser" => vec![("revokeRolesFromUser", user(doc! {"roles": roles()}))],
        "replSetReconfig" => vec![("replSetReconfig", doc! {"new": cmd.get("replSetReconfig").cloned().unwrap_or(Bson::Null)})],
        "createRole" => vec![("createRole", role())],
        "updateRole" => vec![("updateRole", role())],
        "grantRolesToRole" => vec![("grantRolesToRole", role())],
        "revokeRolesFromRole" => vec![("revokeRolesFromRole", role())],
        "grantPrivilegesToRole" => vec![("grantPrivilegesToRole", role())],
        "revokePrivilegesFromRole" => vec![("revokePrivilegesFromRole", role())],
        "dropRole" => vec![("dropRole", doc! {"role": coll, "db": db})],
        "dropAllRolesFromDatabase" => vec![("dropAllRolesFromDatabase", doc! {"db": db})],
        _ => Vec::new(),
    }
}

/// An empty filter matches every record.
pub fn compile(filter: &Document) -> Result<Option<query::filter::Filter>> {
    if filter.is_empty() {
        return Ok(None);
    }
    query::filter::Filter::parse(filter).map(Some)
}

/// The writer's nice value. Writing records is background work: when every core is busy it
/// should yield to the threads serving requests, and catch up between them (at nice 10 it
/// still gets about a tenth of a contended core, several times what it needs). The bounded
/// queue absorbs the delay; if it ever fills, commands wait, so nothing is lost.
const WRITER_NICE: i32 = 10;

fn write_loop(
    queue: &Queue,
    mut out: Box<dyn Write + Send>,
    path: Option<std::path::PathBuf>,
    format: AuditFormat,
    filter: Arc<RwLock<(Document, Option<query::filter::Filter>)>>,
) {
    // SAFETY: plain system calls on this thread's own id. Linux applies PRIO_PROCESS with a
    // thread id to that thread alone; lowering one's own priority needs no privilege.
    let lowered = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, WRITER_NICE) };
    if lowered != 0 {
        tracing::warn!("cannot lower the audit writer's priority: {}", std::io::Error::last_os_error());
    }
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut batch = Vec::new();
    let mut bytes = Vec::new();
    let mut actors = Vec::new();
    // The command of a `Param::Frame`, made from the frame.
    let mut merged = Vec::new();
    let mut ts = json::TsCache::default();
    loop {
        let (closing, control) = {
            let mut q = queue.events.lock();
            if q.events.len() < WAKE_EVENTS && !q.closed && q.control.is_none() {
                queue.wake.wait_for(&mut q, FLUSH_INTERVAL);
            }
            // Swap in the (empty) vectors written last time: no allocation per batch.
            std::mem::swap(&mut q.events, &mut batch);
            std::mem::swap(&mut q.bytes, &mut bytes);
            std::mem::swap(&mut q.actors, &mut actors);
            (q.closed, q.control.take())
        };
        queue.not_full.notify_all();
        buf.clear();
        let f = filter.read();
        for event in batch.drain(..) {
            let Some(actor) = actors.get(event.actor as usize) else { continue };
            let param = match &event.param {
                Param::Doc(d) => Source::Doc(d),
                Param::Command(range) => Source::Command(&bytes[range.clone()]),
                Param::Frame(range) => {
                    merged.clear();
                    match wire::msg_command_into(&mut merged, &bytes[range.clone()]) {
                        Ok(()) => Source::Command(&merged),
                        Err(e) => Source::Unreadable(e.message),
                    }
                }
            };
            // Without a filter, records are written straight from the event and the
            // command's BSON: no record document is built.
            if f.1.is_none() {
                match format {
                    AuditFormat::Json => {
                        json::record(&mut buf, &event, actor, &param, &mut ts);
                        buf.push(b'\n');
                        continue;
                    }
                    AuditFormat::Bson if bson_record(&mut buf, &event, actor, &param).is_some() => continue,
                    AuditFormat::Bson => {}
                }
            }
            let record = record(&event, actor, &param);
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
        bytes.clear();
        actors.clear();
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
                *filter.write() = (doc, compiled.map(|c| *c));
                let _ = reply.send(Ok(()));
            }
            None => {}
        }
        if closing {
            return;
        }
    }
}

/// An event's param, as the writer reads it.
enum Source<'a> {
    Doc(&'a Document),
    /// A command's BSON.
    Command(&'a [u8]),
    /// A frame that did not give a command (not reachable for a frame `wire::decode`
    /// accepted): why, recorded in its place.
    Unreadable(String),
}

/// What a record tells of a command besides its args, read from its BSON in one pass over
/// its top-level fields.
struct CommandFields<'a> {
    /// The first field's name.
    name: &'a str,
    /// `$db`, and the first field's value when that is a string (a collection name): the
    /// namespace is `db.collection`, or `db` alone.
    db: &'a str,
    collection: Option<&'a str>,
    /// A top-level field holds a secret (`auth::SECRET_FIELDS`) to hide.
    secret: bool,
}

/// Reading BSON bytes in place, for the writer: no iterator machinery and no allocation.
/// Every read is bounds-checked; None for bytes that are not what they should be.
mod scan {
    pub fn i32_at(b: &[u8], at: usize) -> Option<i32> {
        Some(i32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
    }

    pub fn i64_at(b: &[u8], at: usize) -> Option<i64> {
        Some(i64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
    }

    /// The length-prefixed bytes at `at` (documents, arrays).
    pub fn sized(b: &[u8], at: usize) -> Option<&[u8]> {
        let len = usize::try_from(i32_at(b, at)?).ok()?;
        b.get(at..at.checked_add(len)?)
    }

    /// The string value at `at` (a length including its NUL, then the bytes).
    pub fn string(b: &[u8], at: usize) -> Option<&str> {
        let len = usize::try_from(i32_at(b, at)?).ok()?;
        std::str::from_utf8(b.get(at + 4..(at + 4).checked_add(len)?.checked_sub(1)?)?).ok()
    }

    /// Where the value of type `kind` at `at` ends.
    pub fn value_end(b: &[u8], kind: u8, at: usize) -> Option<usize> {
        let prefixed = |extra: usize| Some(at + 4 + usize::try_from(i32_at(b, at)?).ok()? + extra);
        let cstring_end = |from: usize| Some(from + b.get(from..)?.iter().position(|c| *c == 0)? + 1);
        let end = match kind {
            0x06 | 0x0A | 0x7F | 0xFF => at,
            0x08 => at + 1,
            0x10 => at + 4,
            0x01 | 0x09 | 0x11 | 0x12 => at + 8,
            0x07 => at + 12,
            0x13 => at + 16,
            0x02 | 0x0D | 0x0E => prefixed(0)?,
            0x05 => prefixed(1)?,
            0x0C => prefixed(12)?,
            0x03 | 0x04 | 0x0F => at + usize::try_from(i32_at(b, at)?).ok()?,
            0x0B => cstring_end(cstring_end(at)?)?,
            _ => return None,
        };
        (end <= b.len()).then_some(end)
    }

    /// Call `f` with each top-level field of the document `doc`: its type, its name and
    /// where its value starts. None when `doc` is not well-formed or `f` returns None.
    pub fn fields<'a>(doc: &'a [u8], mut f: impl FnMut(u8, &'a str, usize) -> Option<()>) -> Option<()> {
        let len = usize::try_from(i32_at(doc, 0)?).ok()?;
        if len < 5 || len > doc.len() || doc[len - 1] != 0 {
            return None;
        }
        // Without the terminating NUL.
        let body = &doc[..len - 1];
        let mut at = 4;
        while at < body.len() {
            let kind = body[at];
            let key_len = body.get(at + 1..)?.iter().position(|c| *c == 0)?;
            let key = std::str::from_utf8(&body[at + 1..at + 1 + key_len]).ok()?;
            let value = at + 2 + key_len;
            let next = value_end(body, kind, value)?;
            f(kind, key, value)?;
            at = next;
        }
        Some(())
    }
}

/// The name, namespace and secrecy of the command `cmd`; None when it is not well-formed.
fn command_fields(cmd: &[u8]) -> Option<CommandFields<'_>> {
    let mut fields = CommandFields { name: "", db: "", collection: None, secret: false };
    let mut first = true;
    scan::fields(cmd, |kind, key, at| {
        if first {
            first = false;
            fields.name = key;
            if kind == 0x02 {
                fields.collection = Some(scan::string(cmd, at)?);
            }
        }
        if key == "$db" && kind == 0x02 {
            fields.db = scan::string(cmd, at)?;
        }
        fields.secret |= access::SECRET_FIELDS.contains(&key);
        Some(())
    })?;
    Some(fields)
}

impl CommandFields<'_> {
    fn ns(&self) -> String {
        match self.collection {
            Some(c) => format!("{}.{c}", self.db),
            None => self.db.to_string(),
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
    let f = AuditFile::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    tracing::info!("audit log rotated to {}", aside.display());
    Ok(Box::new(f))
}

/// Bytes of the audit file written back and dropped from the page cache at a time.
const WRITEBACK_CHUNK_BYTES: u64 = 4 << 20;

/// The audit file, appended to. Records are written once and never read back by the server,
/// so their pages should not stay in the page cache: every `WRITEBACK_CHUNK_BYTES` the
/// writer starts the newest chunk's writeback and drops the one before from the cache, once
/// it is on disk. Without this, a busy audit log fills memory with gigabytes of dirty pages
/// that the kernel writes back in bursts, and each new page is memory touched for the first
/// time: measured on this VM, the kernel's copy into those fresh pages cost 8 µs per 1.6 KB
/// record, more than building the record.
struct AuditFile {
    file: std::fs::File,
    /// Bytes in the file.
    len_bytes: u64,
    /// Where the chunk under writeback starts; everything before is dropped from the cache.
    writeback_from: u64,
}

impl AuditFile {
    fn open(path: &std::path::Path) -> std::io::Result<AuditFile> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        let len_bytes = file.metadata()?.len();
        Ok(AuditFile { file, len_bytes, writeback_from: len_bytes })
    }

    /// Once a chunk's worth is written past the chunk under writeback: wait for that chunk,
    /// drop it from the cache, and start the writeback of what follows it.
    fn write_back(&mut self) {
        use std::os::fd::AsRawFd as _;
        if self.len_bytes - self.writeback_from < 2 * WRITEBACK_CHUNK_BYTES {
            return;
        }
        let fd = self.file.as_raw_fd();
        let (old, new) = (self.writeback_from, self.writeback_from + WRITEBACK_CHUNK_BYTES);
        let chunk = WRITEBACK_CHUNK_BYTES as libc::off64_t;
        // SAFETY: system calls on our own open descriptor, with ranges inside the file.
        // Failures only leave pages cached, as without these calls.
        unsafe {
            libc::sync_file_range(
                fd,
                old as libc::off64_t,
                chunk,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            );
            libc::posix_fadvise(fd, old as libc::off_t, chunk, libc::POSIX_FADV_DONTNEED);
            libc::sync_file_range(fd, new as libc::off64_t, (self.len_bytes - new) as libc::off64_t, libc::SYNC_FILE_RANGE_WRITE);
        }
        self.writeback_from = new;
    }
}

impl Write for AuditFile {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(b)?;
        self.len_bytes += n as u64;
        Ok(n)
    }

    /// Called once per batch, after its write.
    fn flush(&mut self) -> std::io::Result<()> {
        self.write_back();
        Ok(())
    }
}

fn address(a: Option<SocketAddr>) -> Bson {
    match a {
        Some(a) => Bson::Document(doc! {"ip": a.ip().to_string(), "port": a.port() as i32}),
        None => Bson::Document(doc! {"isSystemUser": true}),
    }
}

/// A BSON record written straight from the event: the command's bytes are copied as they
/// are. None (and nothing written) for what `record` must build: a command with a secret
/// to hide, or anything but a well-formed command.
fn bson_record(buf: &mut Vec<u8>, e: &Event, actor: &Actor, param: &Source) -> Option<()> {
    fn cstring(buf: &mut Vec<u8>, kind: u8, key: &str) {
        buf.push(kind);
        buf.extend_from_slice(key.as_bytes());
        buf.push(0);
    }
    /// A string field whose value is the concatenation of `parts`.
    fn string(buf: &mut Vec<u8>, key: &str, parts: &[&str]) {
        cstring(buf, 0x02, key);
        let len: usize = parts.iter().map(|p| p.len()).sum();
        buf.extend_from_slice(&(len as i32 + 1).to_le_bytes());
        for p in parts {
            buf.extend_from_slice(p.as_bytes());
        }
        buf.push(0);
    }
    fn patch(buf: &mut [u8], start: usize) {
        let len = (buf.len() - start) as i32;
        buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }
    let Source::Command(cmd) = param else { return None };
    let fields = command_fields(cmd).filter(|f| !f.secret)?;
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    string(buf, "atype", &[e.atype]);
    cstring(buf, 0x09, "ts");
    buf.extend_from_slice(&e.ts_ms.to_le_bytes());
    buf.extend_from_slice(&actor.bson);
    cstring(buf, 0x03, "param");
    let param = buf.len();
    buf.extend_from_slice(&[0; 4]);
    string(buf, "command", &[fields.name]);
    match fields.collection {
        Some(c) => string(buf, "ns", &[fields.db, ".", c]),
        None => string(buf, "ns", &[fields.db]),
    }
    cstring(buf, 0x03, "args");
    buf.extend_from_slice(cmd);
    buf.push(0);
    patch(buf, param);
    cstring(buf, 0x10, "result");
    buf.extend_from_slice(&e.result.to_le_bytes());
    buf.push(0);
    patch(buf, start);
    Some(())
}

/// The record MongoDB writes for an event.
fn record(e: &Event, actor: &Actor, param: &Source) -> Document {
    let param = match param {
        Source::Doc(d) => (*d).clone(),
        Source::Command(cmd) => match (command_fields(cmd), bson::RawDocument::from_bytes(cmd).ok().and_then(|raw| Document::try_from(raw).ok())) {
            (Some(fields), Some(args)) => doc! {"command": fields.name, "ns": fields.ns(), "args": access::redacted(&args)},
            _ => doc! {"error": "the command is not well-formed BSON"},
        },
        Source::Unreadable(why) => doc! {"error": why},
    };
    let mut d = doc! {"atype": e.atype, "ts": bson::DateTime::from_millis(e.ts_ms)};
    d.extend(actor.fields());
    d.insert("param", param);
    d.insert("result", e.result);
    d
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
    use super::{Actor, Event, Source};
    use bson::{Bson, Document};
    use std::io::Write as _;

    /// The last timestamp written, so that the events of one millisecond format it once.
    #[derive(Default)]
    pub struct TsCache {
        ms: Option<i64>,
        text: Vec<u8>,
    }

    pub fn record(buf: &mut Vec<u8>, e: &Event, actor: &Actor, param: &Source, ts: &mut TsCache) {
        buf.extend_from_slice(b"{\"atype\":");
        string(buf, e.atype);
        buf.extend_from_slice(b",\"ts\":");
        if ts.ms != Some(e.ts_ms) {
            ts.text.clear();
            date(&mut ts.text, e.ts_ms);
            ts.ms = Some(e.ts_ms);
        }
        buf.extend_from_slice(&ts.text);
        buf.push(b',');
        buf.extend_from_slice(&actor.json);
        buf.extend_from_slice(b",\"param\":");
        match param {
            Source::Doc(d) => document(buf, d, &[]),
            Source::Command(cmd) => match super::command_fields(cmd) {
                Some(fields) => {
                    buf.extend_from_slice(b"{\"command\":");
                    string(buf, fields.name);
                    buf.extend_from_slice(b",\"ns\":");
                    match fields.collection {
                        Some(c) => strings(buf, &[fields.db, ".", c]),
                        None => string(buf, fields.db),
                    }
                    buf.extend_from_slice(b",\"args\":");
                    args(buf, cmd, if fields.secret { &access::SECRET_FIELDS } else { &[] });
                    buf.push(b'}');
                }
                None => document(buf, &bson::doc! {"error": "the command is not well-formed BSON"}, &[]),
            },
            Source::Unreadable(why) => document(buf, &bson::doc! {"error": why}, &[]),
        }
        buf.extend_from_slice(b",\"result\":");
        integer(buf, e.result as i64);
        buf.push(b'}');
    }

    /// A walk over BSON bytes that writes relaxed extended JSON for the types commands carry
    /// (strings, numbers, booleans, null, documents, arrays, binary, ObjectIds, dates) with
    /// no iterator machinery; None for anything else (or bytes that are not well-formed),
    /// after which the caller writes the document the slower way.
    mod walk {
        use super::super::scan::{i32_at, i64_at, sized};
        use super::{binary, date, integer, quoted, string, value};
        use bson::Bson;

        /// Write the document (or array) `doc`; the top-level fields named in `secrets` as
        /// "xxx".
        pub fn document(buf: &mut Vec<u8>, doc: &[u8], secrets: &[&str], array: bool) -> Option<()> {
            let len = usize::try_from(i32_at(doc, 0)?).ok()?;
            if len < 5 || len > doc.len() || doc[len - 1] != 0 {
                return None;
            }
            let end = len - 1;
            let mut at = 4;
            buf.push(if array { b'[' } else { b'{' });
            let mut first = true;
            while at < end {
                let kind = doc[at];
                at += 1;
                let key_len = doc.get(at..end)?.iter().position(|c| *c == 0)?;
                let key = &doc[at..at + key_len];
                at += key_len + 1;
                if !first {
                    buf.push(b',');
                }
                first = false;
                if !array {
                    quoted(buf, key);
                    buf.push(b':');
                }
                let hide = secrets.iter().any(|s| s.as_bytes() == key);
                at = element(buf, doc, kind, at, hide)?;
            }
            buf.push(if array { b']' } else { b'}' });
            Some(())
        }

        /// Write the value of type `kind` at `at` ("xxx" instead when `hide`); returns where
        /// the next element starts.
        fn element(buf: &mut Vec<u8>, b: &[u8], kind: u8, at: usize, hide: bool) -> Option<usize> {
            let mark = buf.len();
            let next = match kind {
                0x01 => {
                    value(buf, &Bson::Double(f64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?)));
                    at + 8
                }
                0x02 => {
                    let len = usize::try_from(i32_at(b, at)?).ok()?;
                    quoted(buf, b.get(at + 4..(at + 4).checked_add(len)?.checked_sub(1)?)?);
                    at + 4 + len
                }
                0x03 | 0x04 => {
                    let d = sized(b, at)?;
                    document(buf, d, &[], kind == 0x04)?;
                    at + d.len()
                }
                0x05 => {
                    let len = usize::try_from(i32_at(b, at)?).ok()?;
                    let subtype = *b.get(at + 4)?;
                    binary(buf, b.get(at + 5..(at + 5).checked_add(len)?)?, subtype);
                    at + 5 + len
                }
                0x07 => {
                    let oid: [u8; 12] = b.get(at..at + 12)?.try_into().ok()?;
                    value(buf, &Bson::ObjectId(bson::oid::ObjectId::from_bytes(oid)));
                    at + 12
                }
                0x08 => {
                    buf.extend_from_slice(if *b.get(at)? != 0 { b"true" } else { b"false" });
                    at + 1
                }
                0x09 => {
                    date(buf, i64_at(b, at)?);
                    at + 8
                }
                0x0A => {
                    buf.extend_from_slice(b"null");
                    at
                }
                0x10 => {
                    integer(buf, i32_at(b, at)?.into());
                    at + 4
                }
                0x12 => {
                    integer(buf, i64_at(b, at)?);
                    at + 8
                }
                _ => return None,
            };
            if hide {
                buf.truncate(mark);
                string(buf, "xxx");
            }
            Some(next)
        }
    }

    /// A command's BSON as relaxed extended JSON, with the top-level fields named in
    /// `secrets` written as "xxx": walked in place, or, for a type the walker leaves alone
    /// (rare in commands), decoded and written as a document.
    fn args(buf: &mut Vec<u8>, cmd: &[u8], secrets: &[&str]) {
        let at = buf.len();
        if walk::document(buf, cmd, secrets, false).is_none() {
            buf.truncate(at);
            let d = bson::RawDocument::from_bytes(cmd).ok().and_then(|raw| Document::try_from(raw).ok()).unwrap_or_default();
            document(buf, &d, secrets);
        }
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
        // Encoded in place, without a String per value.
        let at = buf.len();
        buf.resize(at + base64::encoded_len(bytes.len(), true).unwrap_or(0), 0);
        let n = base64::engine::general_purpose::STANDARD.encode_slice(bytes, &mut buf[at..]).unwrap_or(0);
        buf.truncate(at + n);
        const HEX: &[u8; 16] = b"0123456789abcdef";
        buf.extend_from_slice(b"\",\"subType\":\"");
        buf.extend_from_slice(&[HEX[usize::from(subtype >> 4)], HEX[usize::from(subtype & 15)]]);
        buf.extend_from_slice(b"\"}}");
    }

    pub fn value(buf: &mut Vec<u8>, v: &Bson) {
        match v {
            Bson::String(s) => string(buf, s),
            Bson::Int32(n) => integer(buf, (*n).into()),
            Bson::Int64(n) => integer(buf, *n),
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

    /// A date as relaxed extended JSON: `{"$date": "<ISO-8601, UTC, milliseconds unless 0>"}` for
    /// years 1970 to 9999, written directly (the bson crate's way builds a JSON tree);
    /// other dates as the bson crate writes them.
    fn date(buf: &mut Vec<u8>, ms: i64) {
        /// 10000-01-01T00:00:00Z.
        const YEAR_10000_MS: i64 = 253_402_300_800_000;
        if !(0..YEAR_10000_MS).contains(&ms) {
            let _ = write!(buf, "{}", Bson::DateTime(bson::DateTime::from_millis(ms)).into_relaxed_extjson());
            return;
        }
        let (secs, millis) = (ms / 1000, ms % 1000);
        let (days, day_secs) = (secs / 86_400, secs % 86_400);
        // The civil date of a day count (Howard Hinnant's days-to-civil, for days >= 0).
        let z = days + 719_468;
        let era = z / 146_097;
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let mut text = *b"{\"$date\":\"0000-00-00T00:00:00.000Z\"}";
        let mut put = |at: usize, v: i64, width: usize| {
            let mut v = v;
            for i in (0..width).rev() {
                text[at + i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        put(10, year, 4);
        put(15, month, 2);
        put(18, day, 2);
        put(21, day_secs / 3600, 2);
        put(24, day_secs / 60 % 60, 2);
        put(27, day_secs % 60, 2);
        put(30, millis, 3);
        // Whole seconds go without a fraction, as the bson crate writes them.
        if millis == 0 {
            buf.extend_from_slice(&text[..29]);
            buf.extend_from_slice(b"Z\"}");
        } else {
            buf.extend_from_slice(&text);
        }
    }

    /// An integer in decimal, without the formatting machinery.
    fn integer(buf: &mut Vec<u8>, n: i64) {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut v = n.unsigned_abs();
        loop {
            at -= 1;
            digits[at] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        if n < 0 {
            buf.push(b'-');
        }
        buf.extend_from_slice(&digits[at..]);
    }

    /// A JSON string.
    fn string(buf: &mut Vec<u8>, s: &str) {
        quoted(buf, s.as_bytes());
    }

    /// A JSON string of a BSON string's bytes. They are not checked for UTF-8 again: they
    /// come from a command that was decoded (which checks) or encoded from a `Document`
    /// (which holds only valid strings), and escaping works on bytes.
    fn quoted(buf: &mut Vec<u8>, s: &[u8]) {
        buf.push(b'"');
        escape(buf, s);
        buf.push(b'"');
    }

    /// One JSON string of the concatenation of `parts`.
    fn strings(buf: &mut Vec<u8>, parts: &[&str]) {
        buf.push(b'"');
        for s in parts {
            escape(buf, s.as_bytes());
        }
        buf.push(b'"');
    }

    /// The escaped text of a JSON string's content: runs that need no escape are copied
    /// whole.
    fn escape(buf: &mut Vec<u8>, bytes: &[u8]) {
        let mut run = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let escaped: &[u8] = match b {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                b'\t' => b"\\t",
                0..=0x1f => b"",
                _ => continue,
            };
            buf.extend_from_slice(&bytes[run..i]);
            run = i + 1;
            if escaped.is_empty() {
                let _ = write!(buf, "\\u{b:04x}");
            } else {
                buf.extend_from_slice(escaped);
            }
        }
        buf.extend_from_slice(&bytes[run..]);
    }

    #[cfg(test)]
    mod tests {
        use super::super::{bson_record, command_fields, Param};
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
            assert_eq!(ours, Bson::Document(d.clone()).into_relaxed_extjson());
            // Read from BSON (timestamps and decimals take the walker's way out), the same text.
            let mut raw_buf = Vec::new();
            let bytes = d.to_vec().unwrap();
            args(&mut raw_buf, &bytes, &[]);
            assert_eq!(String::from_utf8(raw_buf).unwrap(), String::from_utf8(buf).unwrap());
        }

        #[test]
        fn dates_are_written_as_the_bson_crate_writes_them() {
            for ms in [
                0,
                1,
                999,
                86_399_999,
                951_782_400_000,
                951_868_799_999,
                1_700_000_000_123,
                4_102_444_800_000,
                253_402_300_799_999,
                253_402_300_800_000,
                -1,
                -86_400_001,
                i64::MAX,
                i64::MIN,
            ] {
                let mut ours = Vec::new();
                date(&mut ours, ms);
                let theirs = Bson::DateTime(bson::DateTime::from_millis(ms)).into_relaxed_extjson();
                assert_eq!(serde_json::from_slice::<serde_json::Value>(&ours).unwrap(), theirs, "{ms}");
            }
        }

        #[test]
        fn the_walker_writes_what_the_bson_crate_writes_or_declines() {
            let d = doc! {
                "s": "a\"b\\c\n\u{1}é", "i": 5, "l": 1i64 << 40, "t": true, "n": Bson::Null, "f": 1.5, "whole": 2.0, "neg": -0.0,
                "o": bson::oid::ObjectId::new(), "b": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] },
                "a": [1, "x", {"y": [2, []]}, {}], "date": bson::DateTime::from_millis(1_700_000_000_000), "pwd": {"nested": 1},
            };
            let bytes = d.to_vec().unwrap();
            let mut fast = Vec::new();
            walk::document(&mut fast, &bytes, &["pwd"], false).expect("every type here is walked");
            let mut slow = Vec::new();
            document(&mut slow, &d, &["pwd"]);
            assert_eq!(String::from_utf8(fast).unwrap(), String::from_utf8(slow).unwrap());
            // Types it leaves to the bson crate, and bytes that are not a document.
            let ts = doc! {"t": bson::Timestamp { time: 1, increment: 2 }}.to_vec().unwrap();
            assert!(walk::document(&mut Vec::new(), &ts, &[], false).is_none());
            for bad in [&bytes[..bytes.len() - 1], &[5, 0, 0, 0, 1][..], &[200, 0, 0, 0, 0][..], &[][..]] {
                assert!(walk::document(&mut Vec::new(), bad, &[], false).is_none());
            }
        }

        #[test]
        fn a_command_record_names_the_command_and_hides_secrets() {
            let cmd = doc! {"createUser": "ann", "pwd": "secret", "roles": [], "$db": "admin"};
            let bytes = cmd.to_vec().unwrap();
            let actor = std::sync::Arc::new(crate::Actor::new(
                None,
                None,
                bson::Uuid::from_bytes([7; 16]),
                vec![("u".into(), "admin".into())],
                vec![("root".into(), "admin".into())],
            ));
            let e = Event { atype: "authCheck", ts_ms: 1_700_000_000_123, actor: 0, param: Param::Command(0..bytes.len()), result: 13 };
            let mut buf = Vec::new();
            record(&mut buf, &e, &actor, &Source::Command(&bytes), &mut TsCache::default());
            let json: serde_json::Value = serde_json::from_slice(&buf).unwrap();
            let owned = Bson::Document(super::super::record(&e, &actor, &Source::Command(&bytes))).into_relaxed_extjson();
            assert_eq!(json, owned);
            assert_eq!(json["param"]["command"], "createUser");
            assert_eq!(json["param"]["ns"], "admin.ann");
            assert_eq!(json["param"]["args"]["pwd"], "xxx");
            assert_eq!(json["users"][0]["user"], "u");
            assert_eq!(json["ts"]["$date"], "2023-11-14T22:13:20.123Z");
        }

        #[test]
        fn a_bson_record_copies_the_command_and_reads_back_as_the_built_one() {
            let actor = std::sync::Arc::new(crate::Actor::new(
                None,
                Some("127.0.0.1:5".parse().unwrap()),
                bson::Uuid::from_bytes([7; 16]),
                vec![("u".into(), "admin".into())],
                vec![("root".into(), "admin".into())],
            ));
            let event = |cmd: &bson::Document| {
                let bytes = cmd.to_vec().unwrap();
                (Event { atype: "authCheck", ts_ms: 1_700_000_000_123, actor: 0, param: Param::Command(0..bytes.len()), result: 0 }, bytes)
            };
            let (e, bytes) = event(
                &doc! {"insert": "c", "documents": [{"_id": 1, "b": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![9; 100] }}], "$db": "app"},
            );
            let mut buf = Vec::new();
            super::super::bson_record(&mut buf, &e, &actor, &Source::Command(&bytes)).expect("written");
            assert_eq!(bson::Document::from_reader(&buf[..]).unwrap(), super::super::record(&e, &actor, &Source::Command(&bytes)));
            // A secret to hide: left to `record`.
            let (e, bytes) = event(&doc! {"createUser": "ann", "pwd": "secret", "$db": "admin"});
            assert!(super::super::bson_record(&mut Vec::new(), &e, &actor, &Source::Command(&bytes)).is_none());
        }

        #[test]
        fn a_record_from_a_frame_is_the_record_from_its_command() {
            let actor = std::sync::Arc::new(crate::Actor::new(
                None,
                Some("127.0.0.1:5".parse().unwrap()),
                bson::Uuid::from_bytes([7; 16]),
                vec![("u".into(), "admin".into())],
                vec![("root".into(), "admin".into())],
            ));
            let body = doc! {"insert": "c", "ordered": true, "$db": "app", "lsid": {"id": bson::Uuid::from_bytes([1; 16])}};
            let documents = vec![doc! {"_id": "k1", "f": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![b'"'; 30] }}, doc! {"_id": 2}];
            for checksum in [0, wire::flags::CHECKSUM_PRESENT] {
                let msg = wire::OpMsg {
                    flags: checksum,
                    body: body.clone(),
                    sequences: vec![wire::DocumentSequence { identifier: "documents".into(), documents: documents.clone() }],
                };
                let frame = wire::encode_msg(1, 0, &msg, None);
                let mut merged = Vec::new();
                wire::msg_command_into(&mut merged, &frame).unwrap();
                let mut command = body.clone();
                command.insert("documents", documents.iter().cloned().map(Bson::Document).collect::<Vec<_>>());
                let e = Event { atype: "authCheck", ts_ms: 1_700_000_000_123, actor: 0, param: Param::Command(0..0), result: 0 };
                let from_command = super::super::record(&e, &actor, &Source::Command(&command.to_vec().unwrap()));
                assert_eq!(super::super::record(&e, &actor, &Source::Command(&merged)), from_command);
                let (mut json, mut bson) = (Vec::new(), Vec::new());
                record(&mut json, &e, &actor, &Source::Command(&merged), &mut TsCache::default());
                assert_eq!(serde_json::from_slice::<serde_json::Value>(&json).unwrap(), Bson::Document(from_command.clone()).into_relaxed_extjson());
                bson_record(&mut bson, &e, &actor, &Source::Command(&merged)).unwrap();
                assert_eq!(bson::Document::from_reader(&bson[..]).unwrap(), from_command);
            }
        }

        #[test]
        fn command_fields_read_well_formed_commands_and_refuse_the_rest() {
            let cmd = doc! {"find": "c", "filter": {"a": {"$regularExpression": {"pattern": "x", "options": ""}}}, "r": bson::Regex { pattern: "p".to_string().try_into().unwrap(), options: "i".to_string().try_into().unwrap() },
            "ts": bson::Timestamp { time: 1, increment: 2 }, "d": "1.5".parse::<bson::Decimal128>().unwrap(), "code": bson::Bson::JavaScriptCode("f()".into()),
            "min": bson::Bson::MinKey, "max": bson::Bson::MaxKey, "u": bson::Bson::Undefined, "$db": "app", "pwd": "s"};
            let bytes = cmd.to_vec().unwrap();
            let f = command_fields(&bytes).expect("well-formed");
            assert_eq!((f.name, f.db, f.collection, f.secret, f.ns()), ("find", "app", Some("c"), true, "app.c".to_string()));
            let ping = doc! {"ping": 1, "$db": "admin"}.to_vec().unwrap();
            let f = command_fields(&ping).unwrap();
            assert_eq!((f.name, f.collection, f.secret, f.ns()), ("ping", None, false, "admin".to_string()));
            // Every cut, and every byte changed, is read without a panic; cut, it is refused.
            for cut in 0..bytes.len() {
                assert!(command_fields(&bytes[..cut]).is_none(), "cut at {cut}");
            }
            for at in 0..bytes.len() {
                for v in [0u8, 1, 0x7f, 0xff] {
                    let mut b = bytes.clone();
                    b[at] = v;
                    let _ = command_fields(&b);
                    let _ = walk::document(&mut Vec::new(), &b, &[], false);
                }
            }
        }
    }
}
