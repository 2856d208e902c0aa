//! shoal's server layer: connections, command dispatch, cursors, sessions and operations.
//! It owns no data format: documents come from `wire`, are evaluated by `query`, and are
//! stored by `storage`.

pub mod audit;
pub mod auth;
mod change_stream;
mod commands;
pub mod config;
mod conn;
mod cursor;
mod dispatch;
mod exec;
mod fault;
mod ops;
mod plan;
mod retry;
mod sharding;
mod state;
mod txn;

use crate::state::Shared;
use config::ServerConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const TTL_MONITOR_INTERVAL_SECS: u64 = 60;

/// Open the store and serve until SIGINT/SIGTERM; returns after a clean shutdown.
pub async fn serve(config: ServerConfig) -> common::Result<()> {
    // A bad certificate or key stops the start before anything is opened.
    let tls = net::tls::Acceptor::new(&config.tls)?;
    if config.repl_set_name.is_some() {
        net::tls::init_member_client(&config.tls)?;
    }
    if let Some(path) = &config.key_file {
        net::key_file::load_key_file(path)?;
    }
    let fds = net::process::raise_fd_limit();
    let store = if config.storage_engine == "inMemory" {
        storage::Store::open_in_memory()
    } else {
        std::fs::create_dir_all(&config.dbpath).map_err(|e| common::Error::internal(format!("cannot create dbpath {}: {e}", config.dbpath.display())))?;
        storage::Store::open(&config.dbpath, storage::StoreOptions { cache_size_bytes: config.cache_size_bytes, fsync: true })?
    };
    let mut listeners = Vec::new();
    for ip in &config.bind_ip {
        let addr = format!("{ip}:{}", config.port);
        let l = TcpListener::bind(&addr).await.map_err(|e| common::Error::internal(format!("cannot listen on {addr}: {e}")))?;
        listeners.push(l);
    }
    // TTL indexes: MongoDB's TTLMonitor wakes every ttlMonitorSleepSecs (60 s).
    store.start_ttl_monitor(Duration::from_secs(TTL_MONITOR_INTERVAL_SECS));
    let repl = match &config.repl_set_name {
        Some(name) => {
            // The host this member calls itself in a default config: the first address it
            // listens on, unless that is every address.
            let host = match config.bind_ip.first().map(String::as_str) {
                Some("0.0.0.0") | Some("::") | None => net::process::hostname(),
                Some(ip) => ip.to_string(),
            };
            Some(replication::ReplCoord::start(&store, name.clone(), format!("{host}:{}", config.port), config.port, config.oplog_size_bytes)?)
        }
        None => None,
    };
    let audit = match &config.audit {
        Some(a) => Some(audit::Audit::start(a, config.audit_authorization_success)?),
        None => None,
    };
    let shared = Arc::new(Shared::new(config, store, repl, tls, audit));
    shared.audit_event("startup", &audit::Actor::system(), audit::Param::Doc(bson::doc! {"options": shared.config.parsed.clone()}), 0);
    if shared.audit.is_some() {
        // A runtime configuration set before (setAuditConfig) replaces auditLog.filter and
        // auditAuthorizationSuccess from the configuration file, as in mongod. One that
        // cannot be taken (a document written into config.settings by hand) leaves the
        // file's, rather than stopping the server from starting.
        if let Err(e) = audit::load_stored(&shared) {
            tracing::error!("the stored audit configuration in config.settings cannot be used; keeping the startup one: {}", e.message);
        }
    }
    replication::spawn_tasks(shared.clone())?;
    tracing::info!(port = shared.config.port, dbpath = %shared.config.dbpath.display(), fd_limit = fds, "waiting for connections");

    if shared.repl.is_some() {
        tokio::spawn(txn::reap_loop(shared.clone()));
        shared.store.set_snapshot_history_window(shared.config.snapshot_history_window_secs);
        tokio::spawn(snapshot_history_loop(shared.clone()));
    }
    // Idle cursor reaper (MongoDB's clientCursorMonitor runs every 4 s).
    let reaper = shared.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(4));
        loop {
            tick.tick().await;
            let n = reaper.cursors.reap_idle();
            if n > 0 {
                tracing::info!("killed {n} idle cursors");
            }
            reaper.retry.reap_idle();
        }
    });

    for l in listeners {
        let shared = shared.clone();
        tokio::spawn(net::service::accept_loop(shared, l));
    }
    tokio::select! {
        _ = net::process::shutdown_signal() => {}
        _ = shared.shutdown.notified() => {}
    }
    tracing::info!("shutting down: flushing storage");
    shared.store.commit_durable()?;
    shared.audit_event("shutdown", &audit::Actor::system(), audit::Param::Doc(bson::Document::new()), 0);
    if let Some(a) = &shared.audit {
        a.close();
    }
    Ok(())
}

/// Snapshot reads reach back `minSnapshotHistoryWindowInSeconds`: the store takes a pin of
/// its history each second (`storage::Store::keep_snapshot_history`).
async fn snapshot_history_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now_secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        shared.store.keep_snapshot_history(now_secs);
    }
}
