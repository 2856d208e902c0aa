//! The `shoal` binary: `shoal serve` runs a MongoDB-compatible node.

mod cluster;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

// glibc malloc spent a quarter of the server's CPU on the request path (small BSON allocations
// freed across threads); mimalloc's per-thread heaps make those allocations cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "shoal", version, about = "shoal: a MongoDB-compatible document database")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run a database node (like mongod).
    Serve(ServeArgs),
    /// Load generators: YCSB, bench02 insert, and scenarios with reports.
    Bench(bench::cli::BenchArgs),
    /// A local replica set of any shape, or a sharded cluster: up, down, status.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Route clients to a sharded cluster's shards (like mongos).
    Router(RouterArgs),
}

/// TLS for client connections: mongod's and mongos's flags (net.tls).
#[derive(Args)]
pub(crate) struct TlsArgs {
    /// TLS for client connections: disabled, allowTLS, preferTLS or requireTLS
    /// (net.tls.mode) [default: disabled]; a router under preferTLS or requireTLS reaches
    /// the shards with TLS too.
    #[arg(long = "tlsMode")]
    pub tls_mode: Option<String>,
    /// PEM with the process's certificate and private key (net.tls.certificateKeyFile).
    #[arg(long = "tlsCertificateKeyFile")]
    pub tls_certificate_key_file: Option<PathBuf>,
    /// PEM of the CAs certificates are checked against (net.tls.CAFile).
    #[arg(long = "tlsCAFile")]
    pub tls_ca_file: Option<PathBuf>,
    /// With --tlsCAFile, let clients without a certificate connect too.
    #[arg(long = "tlsAllowConnectionsWithoutCertificates")]
    pub tls_allow_connections_without_certificates: bool,
}

/// The audit log: mongod's and mongos's flags (auditLog).
#[derive(Args)]
struct AuditArgs {
    /// Turn the audit log on: file, console or syslog (auditLog.destination).
    #[arg(long = "auditDestination")]
    audit_destination: Option<String>,
    /// JSON (one record per line) or BSON (auditLog.format) [default: JSON].
    #[arg(long = "auditFormat")]
    audit_format: Option<String>,
    /// The audit file, for destination file (auditLog.path).
    #[arg(long = "auditPath")]
    audit_path: Option<PathBuf>,
    /// Which records to write, a query over them as JSON (auditLog.filter).
    #[arg(long = "auditFilter")]
    audit_filter: Option<String>,
}

#[derive(Args)]
struct RouterArgs {
    /// The config servers' replica set: <setName>/<host:port>[,<host:port>...].
    #[arg(long = "configdb")]
    configdb: String,
    /// TCP port to listen on.
    #[arg(long, default_value_t = 27017)]
    port: u16,
    /// Comma-separated addresses to listen on.
    #[arg(long = "bind_ip", alias = "bind-ip", default_value = "127.0.0.1")]
    bind_ip: String,
    /// Maximum simultaneous client connections.
    #[arg(long = "maxConns", default_value_t = 1_000_000)]
    max_conns: usize,
    /// Comma-separated wire compressors offered to clients (snappy,zstd,zlib or disabled).
    #[arg(long = "networkMessageCompressors", default_value = "snappy,zstd,zlib")]
    network_message_compressors: String,
    /// Commands need an authenticated user with the privileges they take; users are kept
    /// on the config servers. Create the first user from this host.
    #[arg(long = "auth")]
    auth: bool,
    /// The key the router authenticates to shards and config servers with (security.keyFile;
    /// implies --auth).
    #[arg(long = "keyFile")]
    key_file: Option<PathBuf>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    audit: AuditArgs,
    /// A router parameter, name=value (repeatable): auditAuthorizationSuccess,
    /// enableTestCommands.
    #[arg(long = "setParameter")]
    set_parameter: Vec<String>,
}

#[derive(Args)]
struct ServeArgs {
    /// TCP port to listen on [default: 27017].
    #[arg(long)]
    port: Option<u16>,
    /// Comma-separated addresses to listen on [default: 127.0.0.1].
    #[arg(long = "bind_ip", alias = "bind-ip")]
    bind_ip: Option<String>,
    /// Listen on all IPv4 addresses.
    #[arg(long = "bind_ip_all", alias = "bind-ip-all")]
    bind_ip_all: bool,
    /// Data directory [default: ./data/db].
    #[arg(long)]
    dbpath: Option<PathBuf>,
    /// Storage engine: fjall (default, durable) or inMemory.
    #[arg(long = "storageEngine", alias = "storage-engine")]
    storage_engine: Option<String>,
    /// mongod.conf-style YAML configuration file.
    #[arg(long, short = 'f')]
    config: Option<PathBuf>,
    /// Comma-separated wire compressors offered to clients (snappy,zstd,zlib or disabled).
    #[arg(long = "networkMessageCompressors")]
    network_message_compressors: Option<String>,
    /// Maximum simultaneous connections.
    #[arg(long = "maxConns")]
    max_conns: Option<usize>,
    /// Memory for storage caches in GB, 0.25 to 10000 [default: half of (RAM - 1 GB), at most 1].
    #[arg(long = "wiredTigerCacheSizeGB")]
    wired_tiger_cache_size_gb: Option<f64>,
    /// Run as a member of this replica set (then run replSetInitiate once).
    #[arg(long = "replSet")]
    repl_set: Option<String>,
    /// The oplog's size in MB [default: 990].
    #[arg(long = "oplogSize")]
    oplog_size: Option<u64>,
    /// Reads on a secondary see every write the primary had applied when they arrived
    /// (readConcern level "strict" by default).
    #[arg(long = "strictConsistency")]
    strict_consistency: bool,
    /// How this member, as a secondary, gets the oplog: pull (a getMore per batch, as
    /// mongod), push (its sync source streams it) or shm (push through shared memory when
    /// the source is on this host) [default: pull].
    #[arg(long = "logTransport")]
    log_transport: Option<String>,
    /// Commands need an authenticated user with the privileges they take
    /// (security.authorization: enabled). Create the first user from this host.
    #[arg(long = "auth")]
    auth: bool,
    /// The key replica-set members authenticate to each other with (security.keyFile;
    /// implies --auth): 6 to 1024 base64 characters, readable by its owner only.
    #[arg(long = "keyFile")]
    key_file: Option<PathBuf>,
    #[command(flatten)]
    audit: AuditArgs,
    #[command(flatten)]
    tls: TlsArgs,
    /// A server parameter, name=value (repeatable): cursorTimeoutMillis, enableTestCommands.
    #[arg(long = "setParameter")]
    set_parameter: Vec<String>,
}

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, `mi_option_e`): how long freed memory
/// stays with the process before it goes back to the OS.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// mimalloc gives freed memory back after 1 s; a secondary catching up frees and allocates
/// megabytes per batch, and took every page back from the kernel zeroed (a huge page at a
/// time): a third of its CPU. Ten seconds keeps memory in use under load and still returns
/// it when idle.
const MI_PURGE_DELAY_MS: std::os::raw::c_long = 10_000;

fn main() {
    // SAFETY: sets a process-wide allocator option; any value is valid for this option.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, MI_PURGE_DELAY_MS) };
    debug_assert_eq!(unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }, MI_PURGE_DELAY_MS);
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG").unwrap_or_else(|_| "info,lsm_tree=warn,fjall=warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let argv: Vec<String> = std::env::args().collect();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(a) => {
            let overrides = server::config::Overrides {
                port: a.port,
                bind_ip: a.bind_ip,
                bind_ip_all: a.bind_ip_all,
                dbpath: a.dbpath,
                storage_engine: a.storage_engine,
                config: a.config,
                compressors: a.network_message_compressors,
                max_conns: a.max_conns,
                cache_size_gb: a.wired_tiger_cache_size_gb,
                repl_set: a.repl_set,
                oplog_size_mb: a.oplog_size,
                strict_consistency: a.strict_consistency,
                log_transport: a.log_transport,
                auth: a.auth,
                key_file: a.key_file,
                audit_destination: a.audit.audit_destination,
                audit_format: a.audit.audit_format,
                audit_path: a.audit.audit_path,
                audit_filter: a.audit.audit_filter,
                tls_mode: a.tls.tls_mode,
                tls_certificate_key_file: a.tls.tls_certificate_key_file,
                tls_ca_file: a.tls.tls_ca_file,
                tls_allow_connections_without_certificates: a.tls.tls_allow_connections_without_certificates,
                set_parameters: a.set_parameter,
            };
            let config = match server::config::ServerConfig::build(&overrides, argv) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("shoal: {}", e.message);
                    std::process::exit(2);
                }
            };
            let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("shoal: cannot start runtime: {e}");
                    std::process::exit(1);
                }
            };
            if let Err(e) = rt.block_on(server::serve(config)) {
                eprintln!("shoal: {}", e.message);
                std::process::exit(1);
            }
        }
        Command::Bench(a) => std::process::exit(bench::cli::run(a)),
        Command::Router(a) => {
            let config = match router_config(a, argv) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("shoal router: {e}");
                    std::process::exit(2);
                }
            };
            let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("shoal: cannot start runtime: {e}");
                    std::process::exit(1);
                }
            };
            if let Err(e) = rt.block_on(router::serve(config)) {
                eprintln!("shoal router: {}", e.message);
                std::process::exit(1);
            }
        }
        Command::Cluster(c) => {
            if let Err(e) = cluster::run(c) {
                eprintln!("shoal cluster: {e}");
                std::process::exit(1);
            }
        }
    }
}

fn router_config(a: RouterArgs, argv: Vec<String>) -> Result<router::RouterConfig, String> {
    let mut compressors = Vec::new();
    if a.network_message_compressors != "disabled" {
        for name in a.network_message_compressors.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            compressors.push(wire::Compressor::from_name(name).ok_or_else(|| format!("Unsupported compressor: {name}"))?);
        }
    }
    let mode = match &a.tls.tls_mode {
        Some(m) => net::tls::TlsMode::parse(m).map_err(|e| e.message)?,
        None => net::tls::TlsMode::Disabled,
    };
    let audit = audit_log::AuditOptions {
        destination: a.audit.audit_destination,
        format: a.audit.audit_format,
        path: a.audit.audit_path,
        filter: a.audit.audit_filter,
    }
    .build()
    .map_err(|e| e.message)?;
    let mut audit_authorization_success = false;
    let mut enable_test_commands = false;
    let mut set_parameters = bson::Document::new();
    for p in &a.set_parameter {
        let flag = |v: &str| match v {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(format!("Bad value for parameter in '{p}': expected true or false")),
        };
        match p.split_once('=') {
            Some(("auditAuthorizationSuccess", v)) => audit_authorization_success = flag(v)?,
            Some(("enableTestCommands", v)) => enable_test_commands = flag(v)?,
            _ => return Err(format!("Unrecognized setParameter '{p}' (the router takes auditAuthorizationSuccess and enableTestCommands)")),
        }
        if let Some((k, v)) = p.split_once('=') {
            set_parameters.insert(k, v);
        }
    }
    Ok(router::RouterConfig {
        port: a.port,
        bind_ip: a.bind_ip.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        config_db: a.configdb,
        connections_max: a.max_conns,
        compressors,
        tls: net::tls::TlsConfig {
            mode,
            certificate_key_file: a.tls.tls_certificate_key_file,
            ca_file: a.tls.tls_ca_file,
            allow_connections_without_certificates: a.tls.tls_allow_connections_without_certificates,
        },
        auth: a.auth || a.key_file.is_some(),
        key_file: a.key_file,
        argv,
        audit,
        audit_authorization_success,
        enable_test_commands,
        set_parameters,
    })
}
