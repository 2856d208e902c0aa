//! The router (`shoal router`, mongos's role): clients connect to it as to one server; it
//! keeps no data, reads the cluster's metadata from the config servers (`catalog`), sends
//! each operation to the shards that own its documents (`shard::target`), and merges their
//! replies (`cursor`, `commands`). Shards and config servers are replica sets, reached
//! through their primaries (`net::pool`).

mod balance;
mod catalog;
mod commands;
mod cursor;
mod introspect;
mod migrate;

use bson::oid::ObjectId;
use common::limits::MESSAGE_SIZE_MAX_BYTES;
use common::{Code, Error, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use wire::Request;
use wire::{Message, OpMsg, OpReply};

pub struct RouterConfig {
    pub port: u16,
    pub bind_ip: Vec<String>,
    /// The config servers: `<setName>/<host:port>,...` (mongos's --configdb).
    pub config_db: String,
    pub connections_max: usize,
}

pub struct Router {
    pub config: RouterConfig,
    pool: net::pool::Pool,
    catalog: catalog::Catalog,
    cursors: cursor::Cursors,
    process_id: ObjectId,
    next_connection_id: AtomicU64,
    connections_current: AtomicU64,
    balancer: balance::BalancerState,
    /// When this router started (serverStatus's uptime).
    started: std::time::Instant,
}

/// A client connection's state the router's commands see.
pub struct RouterConn {
    pub id: u64,
    pub remote: SocketAddr,
    pub client_metadata_seen: bool,
}

static NEXT_REQUEST_ID: AtomicI32 = AtomicI32::new(1);

fn next_request_id() -> i32 {
    NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed)
}

/// Listen and route until SIGINT/SIGTERM.
pub async fn serve(config: RouterConfig) -> Result<()> {
    let config_set = net::pool::ReplicaSet::parse(&config.config_db)?;
    let mut listeners = Vec::new();
    for ip in &config.bind_ip {
        let addr = format!("{ip}:{}", config.port);
        listeners.push(TcpListener::bind(&addr).await.map_err(|e| Error::internal(format!("cannot listen on {addr}: {e}")))?);
    }
    net::process::raise_fd_limit();
    let router = Arc::new(Router {
        config,
        pool: net::pool::Pool::default(),
        catalog: catalog::Catalog::new(config_set),
        cursors: cursor::Cursors::default(),
        process_id: ObjectId::new(),
        next_connection_id: AtomicU64::new(1),
        connections_current: AtomicU64::new(0),
        balancer: Default::default(),
        started: std::time::Instant::now(),
    });
    match router.reload_shards().await {
        Ok(s) => tracing::info!(shards = s.len(), "read the cluster's shards from the config servers"),
        // mongos starts anyway and keeps asking; so do we, on each command that needs them.
        Err(e) => tracing::warn!("cannot read config.shards yet: {}", e.message),
    }
    tracing::info!(port = router.config.port, configdb = %router.config.config_db, "router waiting for connections");
    let reaper = router.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            for c in reaper.cursors.take_idle() {
                c.lock().await.kill(&reaper.pool).await;
            }
        }
    });
    tokio::spawn(balance::balancer_loop(router.clone()));
    tokio::spawn(ping_loop(router.clone()));
    for l in listeners {
        tokio::spawn(accept_loop(router.clone(), l));
    }
    net::process::shutdown_signal().await;
    tracing::info!("router shutting down");
    Ok(())
}

/// How often a router records itself in config.mongos (mongos's 30 s).
const PING_INTERVAL: Duration = Duration::from_secs(30);

/// Keep the cluster's config.version document (its clusterId, written by the first router
/// to start) and this router's config.mongos entry, which `sh.status()` reads.
async fn ping_loop(router: Arc<Router>) {
    let id = format!("{}:{}", net::process::hostname(), router.config.port);
    let mut tick = tokio::time::interval(PING_INTERVAL);
    loop {
        tick.tick().await;
        let version = bson::doc! {"update": "version", "updates": [{"q": {"_id": 1}, "u": {"$setOnInsert": {"clusterId": ObjectId::new()}}, "upsert": true}]};
        let version_str = common::server::build_info().get_str("version").unwrap_or_default().to_string();
        let ping = bson::doc! {"update": "mongos", "updates": [{"q": {"_id": &id}, "u": {"$set": {
            "ping": bson::DateTime::now(), "up": router.started.elapsed().as_secs() as i64, "waiting": true, "mongoVersion": version_str, "advisoryHostFQDNs": [],
        }}, "upsert": true}]};
        for body in [version, ping] {
            if let Err(e) = router.config_write(body).await {
                tracing::debug!("cannot write to the config servers yet: {}", e.message);
            }
        }
    }
}

async fn accept_loop(router: Arc<Router>, listener: TcpListener) {
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let current = router.connections_current.load(Ordering::Relaxed);
        if current as usize >= router.config.connections_max {
            tracing::warn!(%remote, "connection refused because too many open connections: {current}");
            continue;
        }
        router.connections_current.fetch_add(1, Ordering::Relaxed);
        let r = router.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let id = r.next_connection_id.fetch_add(1, Ordering::Relaxed);
            let mut conn = RouterConn { id, remote, client_metadata_seen: false };
            if let Err(reason) = serve_conn(&r, stream, &mut conn).await {
                tracing::info!(conn = id, %remote, "connection ended: {reason}");
            }
            r.connections_current.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

async fn serve_conn(router: &Arc<Router>, mut stream: TcpStream, conn: &mut RouterConn) -> std::result::Result<(), String> {
    let mut reader = net::frame::FrameReader::new();
    loop {
        let Some(frame) = reader.next(&mut stream).await? else { return Ok(()) };
        let buf = &reader.buf[frame];
        let (request_id, op_code) = (i32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]), i32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]));
        // An insert batch into a sharded collection passes its documents on undecoded.
        if op_code == wire::OP_MSG {
            if let Ok(Some(msg)) = wire::raw_msg(buf, MESSAGE_SIZE_MAX_BYTES) {
                if let Some(reply) = commands::raw_insert(router, &msg).await {
                    if msg.flags & wire::flags::MORE_TO_COME == 0 {
                        stream.write_all(&msg_reply(request_id, reply)).await.map_err(|e| format!("write error: {e}"))?;
                    }
                    continue;
                }
            }
        }
        let out = match wire::decode(buf, MESSAGE_SIZE_MAX_BYTES) {
            Err(e) if op_code == wire::OP_QUERY => wire::encode_reply(
                next_request_id(),
                request_id,
                &OpReply { response_flags: 2, cursor_id: 0, starting_from: 0, documents: vec![e.to_reply()] },
                None,
            ),
            Err(e) if op_code == wire::OP_MSG || op_code == wire::OP_COMPRESSED => msg_reply(request_id, e.to_reply()),
            Err(_) => return Err(format!("unsupported opcode {op_code}")),
            Ok(d) => match d.message {
                Message::Msg(m) => {
                    let more_to_come = m.flags & wire::flags::MORE_TO_COME != 0;
                    let reply = match Request::from_msg(m.body, m.sequences) {
                        Ok(req) => commands::run(router, conn, req).await,
                        Err(e) => e.to_reply(),
                    };
                    if more_to_come {
                        continue;
                    }
                    msg_reply(request_id, reply)
                }
                Message::Query(q) => {
                    let reply = legacy_hello(router, conn, q).await;
                    wire::encode_reply(
                        next_request_id(),
                        request_id,
                        &OpReply { response_flags: 0, cursor_id: 0, starting_from: 0, documents: vec![reply] },
                        None,
                    )
                }
                Message::Reply(_) => return Err("client sent OP_REPLY".into()),
            },
        };
        stream.write_all(&out).await.map_err(|e| format!("write error: {e}"))?;
    }
}

fn msg_reply(request_id: i32, body: bson::Document) -> Vec<u8> {
    wire::encode_msg(next_request_id(), request_id, &OpMsg { flags: 0, body, sequences: vec![] }, None)
}

/// Legacy OP_QUERY: only the handshake (`isMaster` on `admin.$cmd`), as mongos 6+.
async fn legacy_hello(router: &Arc<Router>, conn: &mut RouterConn, q: wire::OpQuery) -> bson::Document {
    let Some(db) = q.full_collection_name.strip_suffix(".$cmd") else {
        return bson::doc! { "$err": "OP_QUERY is no longer supported. The client driver may require an upgrade.", "code": 5739101, "ok": 0.0 };
    };
    let mut cmd = q.query.get_document("$query").cloned().unwrap_or(q.query);
    let name = cmd.keys().next().cloned().unwrap_or_default();
    if !wire::is_hello(&name) {
        return Error::new(Code(352, "UnsupportedOpQueryCommand"), format!("Unsupported OP_QUERY command: {name}. The client driver may require an upgrade."))
            .to_reply();
    }
    cmd.insert("$db", db);
    match Request::from_msg(cmd, Vec::new()) {
        Ok(r) => commands::run(router, conn, r).await,
        Err(e) => e.to_reply(),
    }
}
