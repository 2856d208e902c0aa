//! Handshake and diagnostic commands: hello, buildInfo, serverStatus, getParameter, sessions,
//! currentOp/killOp.

use super::Ctx;
use crate::state::Counters;
use bson::{doc, Bson, DateTime, Document};
use common::limits;
use common::value::as_i64;
use common::{Code, Error, Result};
use wire::Compressor;

use common::server::{LOGICAL_SESSION_TIMEOUT_MINUTES, MAX_WIRE_VERSION, VERSION};

pub fn hello(ctx: &mut Ctx) -> Result<Document> {
    let cmd = ctx.cmd;
    // Client metadata may only be sent once per connection (first hello).
    if let Some(client) = cmd.get("client") {
        let Bson::Document(meta) = client else {
            return Err(Error::type_mismatch("BSON field 'client' is the wrong type, expected type 'object'"));
        };
        if ctx.conn.client_metadata.is_some() {
            return Err(Error::new(Code::ClientMetadataCannotBeMutated, "The client metadata document may only be sent in the first hello"));
        }
        ctx.conn.app_name = meta.get_document("application").ok().and_then(|a| a.get_str("name").ok()).map(str::to_string);
        ctx.conn.client_metadata = Some(meta.clone());
    }
    if cmd.contains_key("internalClient") {
        // Another member or a router: failCommand spares it unless told otherwise.
        ctx.conn.internal_client = true;
    }
    if let Some(Bson::Array(offered)) = cmd.get("compression") {
        let ours: Vec<Compressor> = ctx.shared.config.compressors.iter().filter_map(|n| Compressor::from_name(n)).collect();
        ctx.conn.compressors = net::service::negotiate_compressors(&ours, offered);
    }
    let is_legacy = ctx.name != "hello";
    let mut r = Document::new();
    if cmd.get_bool("helloOk").unwrap_or(false) {
        r.insert("helloOk", true);
    }
    r.insert("topologyVersion", ctx.shared.topology_version());
    match &ctx.shared.repl {
        Some(repl) => repl.hello_fields(&ctx.shared.store, is_legacy, &mut r),
        None => {
            r.insert(if is_legacy { "ismaster" } else { "isWritablePrimary" }, true);
        }
    }
    r.insert("maxBsonObjectSize", limits::BSON_OBJECT_SIZE_MAX_BYTES as i32);
    r.insert("maxMessageSizeBytes", limits::MESSAGE_SIZE_MAX_BYTES as i32);
    r.insert("maxWriteBatchSize", limits::WRITE_BATCH_SIZE_MAX as i32);
    r.insert("localTime", DateTime::now());
    r.insert("logicalSessionTimeoutMinutes", LOGICAL_SESSION_TIMEOUT_MINUTES);
    r.insert("connectionId", ctx.conn.id as i64);
    r.insert("minWireVersion", 0);
    r.insert("maxWireVersion", MAX_WIRE_VERSION);
    r.insert("readOnly", false);
    if cmd.contains_key("compression") {
        r.insert("compression", ctx.conn.compressors.iter().map(|c| c.name()).collect::<Vec<_>>());
    }
    super::users::hello_auth_fields(ctx, &mut r)?;
    Ok(r)
}

pub fn ping(_ctx: &mut Ctx) -> Result<Document> {
    Ok(Document::new())
}

pub fn build_info(_ctx: &mut Ctx) -> Result<Document> {
    Ok(common::server::build_info())
}

/// Server parameters readable with getParameter. Values are the ones shoal actually uses.
fn parameters(ctx: &Ctx) -> Document {
    doc! {
        "featureCompatibilityVersion": { "version": "7.0" },
        "authenticationMechanisms": ["SCRAM-SHA-1", "SCRAM-SHA-256"],
        "authFailedDelayMs": ctx.shared.config.auth_failed_delay_ms as i64,
        "cursorTimeoutMillis": ctx.shared.config.cursor_timeout_ms as i64,
        "maxBSONDepth": 100,
        "internalQueryMaxBlockingSortMemoryUsageBytes": ctx.shared.config.sort_memory_bytes_max as i64,
        "internalDocumentSourceGroupMaxMemoryBytes": common::limits::AGG_MEMORY_BYTES_MAX as i64,
        "logicalSessionTimeoutMinutes": LOGICAL_SESSION_TIMEOUT_MINUTES,
        "maxIncomingConnections": ctx.shared.config.connections_max as i64,
        "networkMessageCompressors": ctx.shared.config.compressors.join(","),
        "storageEngine": ctx.shared.config.storage_engine.clone(),
        "enableTestCommands": ctx.shared.config.enable_test_commands,
        "auditAuthorizationSuccess": ctx.shared.config.audit_authorization_success,
        "transactionLifetimeLimitSeconds": ctx.shared.config.transaction_lifetime_secs as i64,
        "minSnapshotHistoryWindowInSeconds": ctx.shared.store.snapshot_history_window() as i64,
        "quiet": false,
    }
}

pub fn get_parameter(ctx: &mut Ctx) -> Result<Document> {
    common::server::select_parameters(parameters(ctx), ctx.cmd)
}

pub fn get_cmd_line_opts(ctx: &mut Ctx) -> Result<Document> {
    Ok(doc! { "argv": ctx.shared.config.argv.clone(), "parsed": ctx.shared.config.parsed.clone() })
}

pub fn server_status(ctx: &mut Ctx) -> Result<Document> {
    let s = ctx.shared;
    let c = &s.counters;
    let uptime = s.started.elapsed();
    let (resident, virt) = net::process::process_memory_bytes();
    let current = Counters::get(&c.connections_current);
    let mut status = doc! {
        "host": s.host_name.clone(),
        "version": VERSION,
        // Tools tell mongod from mongos by this field; shoal's node answers like mongod.
        "process": "mongod",
        "pid": std::process::id() as i64,
        "uptime": uptime.as_secs_f64().floor(),
        "uptimeMillis": uptime.as_millis() as i64,
        "uptimeEstimate": uptime.as_secs() as i64,
        "localTime": DateTime::now(),
        "connections": {
            "current": current as i32,
            "available": (s.config.connections_max as u64).saturating_sub(current) as i32,
            "totalCreated": Counters::get(&c.connections_total) as i64,
            "rejected": Counters::get(&c.connections_rejected) as i64,
            "active": Counters::get(&c.connections_active) as i32,
        },
        "opcounters": {
            "insert": Counters::get(&c.insert) as i64,
            "query": Counters::get(&c.query) as i64,
            "update": Counters::get(&c.update) as i64,
            "delete": Counters::get(&c.delete) as i64,
            "getmore": Counters::get(&c.getmore) as i64,
            "command": Counters::get(&c.command) as i64,
        },
        "network": {
            "bytesIn": Counters::get(&c.bytes_in) as i64,
            "bytesOut": Counters::get(&c.bytes_out) as i64,
            "numRequests": Counters::get(&c.requests) as i64,
        },
        "transactions": s.txns.status(),
        "mem": { "bits": 64, "resident": (resident / (1024 * 1024)) as i32, "virtual": (virt / (1024 * 1024)) as i32, "supported": true },
        "metrics": {
            "cursor": { "open": { "total": s.cursors.open_count() as i64 } },
            // Waits for other members' acknowledgement (w above 1 or "majority").
            "getLastError": {
                "wtime": { "num": Counters::get(&c.wc_waits) as i64, "totalMillis": (Counters::get(&c.wc_wait_us) / 1000) as i64 },
                "wtimeouts": Counters::get(&c.wc_timeouts) as i64,
            },
            // A secondary's fetching and application (the journal sync is in `journal`).
            "repl": {
                "apply": {
                    "batches": { "num": Counters::get(&c.repl.apply_batches) as i64, "totalMillis": (Counters::get(&c.repl.apply_us) / 1000) as i64 },
                    "ops": Counters::get(&c.repl.apply_ops) as i64,
                },
                "network": {
                    "getmores": { "num": Counters::get(&c.repl.getmores) as i64, "totalMillis": (Counters::get(&c.repl.getmore_us) / 1000) as i64 },
                    "bytes": Counters::get(&c.repl.fetched_bytes) as i64,
                    "ops": Counters::get(&c.repl.fetched_ops) as i64,
                    "streamBatches": Counters::get(&c.repl.stream_batches) as i64,
                    "ringBatches": Counters::get(&c.repl.ring_batches) as i64,
                },
                // On a sync source: how long entries took to become durable on the members
                // that report to it (buckets of quarter doublings in µs, see
                // common::metrics::LatencyHistogram).
                "lag": c.repl.lag.to_doc(),
                // Reads that had to find this member applied up to a point (afterClusterTime,
                // level "strict"), and how strict reads learned the primary's position.
                "readWaits": {
                    "num": Counters::get(&c.repl_read_waits) as i64,
                    "totalMillis": (Counters::get(&c.repl_read_wait_us) / 1000) as i64,
                    "primaryAsks": Counters::get(&c.repl.strict_asks) as i64,
                    "positionPageReads": Counters::get(&c.repl_strict_page_reads) as i64,
                },
            },
        },
        "storageEngine": { "name": s.config.storage_engine.clone(), "persistent": s.config.storage_engine != "inMemory", "supportsCommittedReads": true },
        // Journal syncs (fsyncs) so far, group commits counted once: shoal's counterpart of
        // WiredTiger's "log sync operations".
        "journal": { "syncs": s.store.sync_count() as i64, "syncMillis": (s.store.sync_time_us() / 1000) as i64 },
    };
    // A member's serverStatus carries what hello says of the set (mongod's `repl` section).
    if let Some(repl) = &s.repl {
        let mut r = doc! {"topologyVersion": s.topology_version()};
        repl.hello_fields(&s.store, false, &mut r);
        status.insert("repl", r);
    }
    Ok(status)
}

pub fn host_info(ctx: &mut Ctx) -> Result<Document> {
    Ok(net::process::host_info(&ctx.shared.host_name))
}

pub fn connection_status(ctx: &mut Ctx) -> Result<Document> {
    if ctx.bool_arg("showPrivileges")? == Some(true) {
        return Err(Error::new(Code::CommandNotSupported, "connectionStatus showPrivileges is not supported by shoal yet"));
    }
    let (users, roles): (Vec<Bson>, Vec<Bson>) = match &ctx.conn.auth.user {
        Some(u) => {
            (vec![Bson::Document(doc! {"user": &u.user, "db": &u.db})], u.roles.iter().map(|(r, d)| Bson::Document(doc! {"role": r, "db": d})).collect())
        }
        None => (Vec::new(), Vec::new()),
    };
    Ok(doc! { "authInfo": { "authenticatedUsers": users, "authenticatedUserRoles": roles } })
}

pub fn whatsmyuri(ctx: &mut Ctx) -> Result<Document> {
    Ok(doc! { "you": ctx.conn.remote.to_string() })
}

pub fn get_log(ctx: &mut Ctx) -> Result<Document> {
    common::server::get_log(ctx.cmd)
}

pub fn list_commands(ctx: &mut Ctx) -> Result<Document> {
    let mut cmds = Document::new();
    let tests = ctx.shared.config.enable_test_commands;
    for n in super::NAMES.iter().filter(|n| tests || !common::server::TEST_COMMANDS.contains(n)) {
        cmds.insert(*n, doc! { "help": "", "adminOnly": false });
    }
    Ok(doc! { "commands": cmds })
}

fn session_ids(ctx: &Ctx, field: &str) -> Result<Vec<Bson>> {
    let Some(arr) = ctx.array_arg(field)? else { return Ok(Vec::new()) };
    let mut ids = Vec::with_capacity(arr.len());
    for v in arr {
        match v {
            Bson::Document(d) => match d.get("id") {
                Some(id @ Bson::Binary(_)) => ids.push(id.clone()),
                _ => return Err(Error::location(40414, format!("BSON field '{field}.id' is missing but a required field"))),
            },
            _ => return Err(Error::type_mismatch(format!("BSON field '{field}' elements must be objects"))),
        }
    }
    Ok(ids)
}

/// endSessions and killSessions: both end the sessions' cursors (shoal keeps no other
/// per-session state until transactions exist).
pub fn end_sessions(ctx: &mut Ctx) -> Result<Document> {
    for id in session_ids(ctx, ctx.name)? {
        ctx.shared.cursors.kill_for_session(&id);
        if let Bson::Binary(b) = &id {
            ctx.shared.sessions.end(&b.bytes);
            ctx.shared.txns.end_sessions(std::slice::from_ref(&b.bytes));
        }
    }
    Ok(Document::new())
}

pub fn kill_all_sessions(ctx: &mut Ctx) -> Result<Document> {
    // Sessions do not record their user, so any user list, empty or not, kills every
    // session's cursors.
    ctx.array_arg("killAllSessions")?;
    ctx.shared.cursors.kill_all_with_session();
    ctx.shared.txns.kill_all();
    Ok(Document::new())
}

pub fn refresh_sessions(ctx: &mut Ctx) -> Result<Document> {
    session_ids(ctx, "refreshSessions")?;
    Ok(Document::new())
}

pub fn start_session(_ctx: &mut Ctx) -> Result<Document> {
    let id = bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: bson::Uuid::new().bytes().to_vec() };
    Ok(doc! { "id": { "id": id }, "timeoutMinutes": LOGICAL_SESSION_TIMEOUT_MINUTES })
}

pub fn current_op(ctx: &mut Ctx) -> Result<Document> {
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, "currentOp may only be run against the admin database."));
    }
    // Everything but the known flags is a filter over the op documents, as in MongoDB.
    let mut filter = Document::new();
    let mut include_idle = false;
    for (k, v) in ctx.cmd.iter().skip(1) {
        match k.as_str() {
            "$all" => include_idle = v.as_bool().unwrap_or(false),
            "$ownOps" | "idleConnections" | "idleCursors" | "idleSessions" | "localOps" | "backtrace" | "truncateOps" => {}
            k if common::value::GENERIC_ARGS.contains(&k) => {}
            _ => {
                filter.insert(k.clone(), v.clone());
            }
        }
    }
    let _ = include_idle; // shoal tracks only running operations; idle connections are not listed.
    let filter = query::filter::Filter::parse(&filter)?;
    let mut inprog = Vec::new();
    for op in ctx.shared.ops.snapshot() {
        let elapsed = op.started.elapsed();
        let mut d = doc! {
            "type": "op",
            "host": ctx.shared.host_port(),
            "desc": format!("conn{}", op.connection_id),
            "connectionId": op.connection_id as i64,
            "client": op.client.to_string(),
            "active": true,
            "opid": op.opid as i64,
            "secs_running": elapsed.as_secs() as i64,
            "microsecs_running": elapsed.as_micros() as i64,
            "op": op.op,
            "ns": op.ns.clone(),
            "command": crate::ops::truncated_command(&op.command),
            "currentOpTime": DateTime::from_system_time(op.started_wall),
            "killPending": op.killed.load(std::sync::atomic::Ordering::Relaxed),
        };
        if let Some(app) = &op.app_name {
            d.insert("appName", app.clone());
        }
        if filter.matches(&d) {
            inprog.push(Bson::Document(d));
        }
    }
    // Index builds run inside createIndexes; their progress is reported as MongoDB does.
    for b in ctx.shared.store.index_builds() {
        let d = doc! {
            "type": "op",
            "host": ctx.shared.host_port(),
            "active": true,
            "op": "command",
            "ns": b.ns.clone(),
            "desc": "IndexBuildsCoordinator",
            "msg": format!("Index Build: scanning collection Index Build: scanning collection: {}/{}", b.done_records, b.total_records),
            "progress": { "done": b.done_records as i64, "total": b.total_records as i64 },
            "command": { "createIndexes": b.ns.split_once('.').map(|(_, c)| c.to_string()).unwrap_or_default(), "indexes": [ { "name": b.index_name.clone() } ] },
        };
        if filter.matches(&d) {
            inprog.push(Bson::Document(d));
        }
    }
    Ok(doc! { "inprog": inprog })
}

pub fn kill_op(ctx: &mut Ctx) -> Result<Document> {
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, "killOp may only be run against the admin database."));
    }
    let opid = match ctx.cmd.get("op") {
        Some(v) => as_i64(v).ok_or_else(|| Error::type_mismatch("killOp: op must be a number"))?,
        None => return Err(Error::location(40414, "BSON field 'killOp.op' is missing but a required field")),
    };
    let opid = u32::try_from(opid).map_err(|_| Error::bad_value(format!("invalid opid {opid}")))?;
    ctx.shared.ops.kill(opid);
    Ok(doc! { "info": "attempting to kill op" })
}

/// fsync: make every write so far durable (`lock`, mongod's write lock for backups, is not
/// one shoal has: refused).
pub fn fsync(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("fsync", ctx.cmd, &["lock", "async", "forBackup"])?;
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, "fsync may only be run against the admin database."));
    }
    if ctx.bool_arg("lock")?.unwrap_or(false) {
        return Err(Error::new(Code::CommandNotSupported, "fsync with lock: true is not supported by shoal yet"));
    }
    ctx.shared.store.commit_durable()?;
    Ok(doc! {"numFiles": 1})
}

pub fn shutdown(ctx: &mut Ctx) -> Result<Document> {
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, "shutdown may only be run against the admin database."));
    }
    common::value::check_fields("shutdown", ctx.cmd, &["force", "timeoutSecs"])?;
    // Flush before signalling, so a client that sees the connection drop knows all is durable.
    ctx.shared.store.commit_durable()?;
    tracing::info!("shutdown requested by {}", ctx.conn.remote);
    ctx.shared.shutdown.notify_one();
    Ok(Document::new())
}
