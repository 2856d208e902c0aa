//! The router (`shoal router`, mongos's role): clients connect to it as to one server; it
//! keeps no data, reads the cluster's metadata from the config servers (`catalog`), sends
//! each operation to the shards that own its documents (`shard::target`), and merges their
//! replies (`cursor`, `commands`). Shards and config servers are replica sets, reached
//! through their primaries (`net::pool`).

mod admin;
mod balance;
mod catalog;
mod commands;
mod coordinator;
mod cursor;
mod introspect;
mod migrate;
mod table;
mod txn;
mod users;

use bson::oid::ObjectId;
use common::limits::MESSAGE_SIZE_MAX_BYTES;
use common::{Error, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use wire::{Compressor, Request};

pub struct RouterConfig {
    pub port: u16,
    pub bind_ip: Vec<String>,
    /// The config servers: `<setName>/<host:port>,...` (mongos's --configdb).
    pub config_db: String,
    pub connections_max: usize,
    /// Wire compressors offered to clients, in order of preference.
    pub compressors: Vec<Compressor>,
    /// TLS for client connections, and (under preferTLS and requireTLS) for the router's
    /// own connections to shards and config servers.
    pub tls: net::tls::TlsConfig,
    /// Commands need an authenticated user (users are kept on the config servers).
    pub auth: bool,
    /// The key this router authenticates to shards and config servers with, as the
    /// internal user.
    pub key_file: Option<std::path::PathBuf>,
    /// The command line it was started with (getCmdLineOpts).
    pub argv: Vec<String>,
    /// The audit log, when auditing is on.
    pub audit: Option<audit_log::AuditConfig>,
    /// `auditAuthorizationSuccess`: authCheck records of CRUD commands that pass too.
    pub audit_authorization_success: bool,
    /// `--setParameter enableTestCommands=1`: fail points (configureFailPoint) exist.
    pub enable_test_commands: bool,
    /// Each `--setParameter` as given, for getCmdLineOpts.
    pub set_parameters: bson::Document,
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
    tls: net::tls::Acceptor,
    /// Bumped by every user or role command through this router (`users`).
    users_generation: AtomicU64,
    audit: Option<audit_log::Audit>,
    /// The logical sessions commands named (`$listLocalSessions`).
    pub(crate) sessions: access::sessions::SessionCache,
    /// Sessions' transactions and their shards (`txn`).
    txns: txn::RouterTxns,
}

/// A client connection's state the router's commands see.
pub struct RouterConn {
    pub id: u64,
    pub remote: SocketAddr,
    pub client_metadata_seen: bool,
    /// The client's `application.name` (failCommand's `appName`).
    pub app_name: Option<String>,
    /// Another router (its hello said `internalClient`).
    pub internal_client: bool,
    /// Compressors agreed in the handshake.
    pub compressors: Vec<Compressor>,
    /// Who the connection authenticated as, and a SCRAM conversation under way.
    pub auth: access::ConnAuth,
    /// When its user was last read from the config servers.
    pub user_read: std::time::Instant,
    /// This end's address, the connection's id and the last actor made, for audit records.
    pub local: Option<SocketAddr>,
    pub uuid: bson::Uuid,
    actor: Option<Arc<audit_log::Actor>>,
}

impl RouterConn {
    /// Who acts, for an audit record: made again only when the user changed.
    pub fn actor(&mut self) -> Arc<audit_log::Actor> {
        let user = self.auth.user.as_ref();
        let current = self.actor.as_ref().is_some_and(|a| match user {
            None => a.users.is_empty(),
            Some(u) => a.users.len() == 1 && a.users[0].0 == u.user && a.users[0].1 == u.db && a.roles == u.roles,
        });
        if !current {
            let users = user.map(|u| vec![(u.user.clone(), u.db.clone())]).unwrap_or_default();
            let roles = user.map(|u| u.roles.clone()).unwrap_or_default();
            self.actor = Some(Arc::new(audit_log::Actor::new(self.local, Some(self.remote), self.uuid, users, roles)));
        }
        self.actor.clone().expect("made above")
    }
}

impl Router {
    /// Write an audit record, when auditing is on.
    pub fn audit_event(&self, atype: &'static str, actor: &Arc<audit_log::Actor>, param: audit_log::Param, result: i32) {
        if let Some(a) = &self.audit {
            a.log(atype, actor, param, result);
        }
    }
}

/// Listen and route until SIGINT/SIGTERM.
pub async fn serve(config: RouterConfig) -> Result<()> {
    let config_set = net::pool::ReplicaSet::parse(&config.config_db)?;
    // A bad certificate or key stops the start before anything is opened.
    let tls = net::tls::Acceptor::new(&config.tls)?;
    net::tls::init_member_client(&config.tls)?;
    if let Some(path) = &config.key_file {
        net::key_file::load_key_file(path)?;
    }
    let audit = match &config.audit {
        Some(a) => Some(audit_log::Audit::start(a, config.audit_authorization_success)?),
        None => None,
    };
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
        tls,
        users_generation: AtomicU64::new(0),
        audit,
        sessions: Default::default(),
        txns: Default::default(),
    });
    let options = admin::get_cmd_line_opts(&router).get_document("parsed").cloned().unwrap_or_default();
    router.audit_event("startup", &audit_log::Actor::system(), audit_log::Param::Doc(bson::doc! {"options": options}), 0);
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
        tokio::spawn(net::service::accept_loop(router.clone(), l));
    }
    net::process::shutdown_signal().await;
    tracing::info!("router shutting down");
    router.audit_event("shutdown", &audit_log::Actor::system(), audit_log::Param::Doc(bson::Document::new()), 0);
    if let Some(a) = &router.audit {
        a.close();
    }
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

impl net::service::Service for Router {
    type Conn = RouterConn;
    type Batch = Vec<u8>;

    fn tls(&self) -> &net::tls::Acceptor {
        &self.tls
    }

    fn admit(&self, remote: SocketAddr) -> bool {
        let current = self.connections_current.load(Ordering::Relaxed);
        if current as usize >= self.config.connections_max {
            tracing::warn!(%remote, "connection refused because too many open connections: {current}");
            return false;
        }
        self.connections_current.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn release(&self) {
        self.connections_current.fetch_sub(1, Ordering::Relaxed);
    }

    fn open(&self, remote: SocketAddr, local: Option<SocketAddr>, peer_subject: Option<String>) -> RouterConn {
        RouterConn {
            id: self.next_connection_id.fetch_add(1, Ordering::Relaxed),
            remote,
            client_metadata_seen: false,
            app_name: None,
            internal_client: false,
            compressors: Vec::new(),
            auth: access::ConnAuth { peer_subject, ..Default::default() },
            user_read: std::time::Instant::now(),
            local,
            uuid: bson::Uuid::new(),
            actor: None,
        }
    }

    fn conn_id(conn: &RouterConn) -> u64 {
        conn.id
    }

    fn compressors(conn: &RouterConn) -> &[Compressor] {
        &conn.compressors
    }

    async fn run(&self, conn: &mut RouterConn, request: Request) -> net::service::Reply<Vec<u8>> {
        commands::run(self, conn, request).await
    }

    /// An insert batch into a sharded collection passes its documents on undecoded.
    async fn run_frame(&self, conn: &mut RouterConn, frame: &[u8]) -> Option<net::service::Reply<Vec<u8>>> {
        if net::fail_point::FAIL_COMMAND.is_active() {
            // Decoded, through `commands::run`, where failCommand acts.
            return None;
        }
        let msg = wire::raw_msg(frame, MESSAGE_SIZE_MAX_BYTES).ok()??;
        commands::raw_insert(self, conn, &msg).await.map(net::service::Reply::new)
    }

    fn close_reason(&self, conn: &RouterConn) -> Option<String> {
        (conn.auth.failures >= access::FAILURES_PER_CONNECTION_MAX).then(|| format!("closed after {} failed authentications", conn.auth.failures))
    }
}
