//! Server configuration: mongod-style command-line flags and the mongod.conf YAML file.
//! Command-line flags win over the file, as with mongod.

use common::{Code, Error, Result};
pub use net::tls::{TlsConfig, TlsMode};
pub use replication::LogTransport;
use serde_yaml::Value;
use std::path::PathBuf;

/// Default data directory, relative to the working directory ("embedded default under ./data").
pub const DBPATH_DEFAULT: &str = "./data/db";
pub const PORT_DEFAULT: u16 = 27017;
/// Upper bound on simultaneous client connections (mongod: `net.maxIncomingConnections`).
pub const CONNECTIONS_MAX_DEFAULT: usize = 65_536;
/// mongod's internalQueryMaxBlockingSortMemoryUsageBytes default.
pub const SORT_MEMORY_BYTES_MAX_DEFAULT: usize = 100 * 1024 * 1024;
/// mongod's bound on `authFailedDelayMs`.
pub const AUTH_FAILED_DELAY_MS_MAX: u64 = 5_000;
/// mongod's default `transactionLifetimeLimitSeconds`.
pub const TRANSACTION_LIFETIME_SECS_DEFAULT: u64 = 60;
/// mongod's smallest default oplog (it takes 5% of free disk, at least 990 MB).
pub const OPLOG_SIZE_MB_DEFAULT: u64 = 990;

pub use audit_log::{AuditConfig, AuditDestination, AuditFormat, AuditOptions};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub port: u16,
    pub bind_ip: Vec<String>,
    pub dbpath: PathBuf,
    /// Storage engine: "fjall" (durable, default) or "inMemory".
    pub storage_engine: String,
    pub cache_size_bytes: u64,
    /// `--replSet` / `replication.replSetName`: run as a member of this replica set.
    pub repl_set_name: Option<String>,
    /// `--oplogSize` / `replication.oplogSizeMB`: the oplog's cap.
    pub oplog_size_bytes: u64,
    /// Compressors offered in hello, in preference order (mongod default: snappy,zstd,zlib).
    pub compressors: Vec<String>,
    pub connections_max: usize,
    /// Idle cursors are killed after this long (mongod `cursorTimeoutMillis`, default 10 min).
    pub cursor_timeout_ms: u64,
    /// Memory a blocking sort (a find's sort that no index provides) may hold, in bytes
    /// (mongod `internalQueryMaxBlockingSortMemoryUsageBytes`, default 100 MiB).
    pub sort_memory_bytes_max: usize,
    /// `--strictConsistency` / `replication.strictConsistency`: reads on this member, when it
    /// is a secondary, see every write the primary had applied when they arrived (as if
    /// each carried readConcern level "strict").
    pub strict_consistency: bool,
    /// `--logTransport` / `replication.logTransport`: how this member, as a secondary, gets
    /// the oplog from its sync source.
    pub log_transport: LogTransport,
    /// `--auth` / `security.authorization: enabled`: commands need an authenticated user
    /// with the privileges they take.
    pub authorization: bool,
    pub tls: TlsConfig,
    /// `--keyFile` / `security.keyFile`: the key members authenticate to each other with
    /// (implies authorization).
    pub key_file: Option<PathBuf>,
    /// `auditLog`; None: no audit log.
    pub audit: Option<AuditConfig>,
    audit_options: AuditOptions,
    /// `setParameter auditAuthorizationSuccess`: authCheck records for allowed commands too.
    pub audit_authorization_success: bool,
    /// `setParameter authFailedDelayMs`: a failed authentication's reply waits this long
    /// (0 to 5000; mongod's only throttle on password guessing).
    pub auth_failed_delay_ms: u64,
    /// `setParameter enableTestCommands`: fail points (fault injection) are available.
    pub enable_test_commands: bool,
    /// `setParameter transactionLifetimeLimitSeconds`: a transaction open longer is aborted.
    pub transaction_lifetime_secs: u64,
    /// `setParameter minSnapshotHistoryWindowInSeconds`: how far back snapshot reads reach.
    pub snapshot_history_window_secs: u64,
    /// Where the config file was read from, for getCmdLineOpts.
    pub config_file: Option<PathBuf>,
    /// The raw argv, reported by getCmdLineOpts.
    pub argv: Vec<String>,
    /// The effective options as a document, reported as getCmdLineOpts.parsed.
    pub parsed: bson::Document,
    /// Each `setParameter` as given (getCmdLineOpts.parsed.setParameter), values as strings.
    set_parameters_given: bson::Document,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            port: PORT_DEFAULT,
            bind_ip: vec!["127.0.0.1".into()],
            dbpath: PathBuf::from(DBPATH_DEFAULT),
            storage_engine: "fjall".into(),
            cache_size_bytes: cache_size_bytes_default(net::process::total_memory_bytes()),
            repl_set_name: None,
            oplog_size_bytes: OPLOG_SIZE_MB_DEFAULT << 20,
            compressors: vec!["snappy".into(), "zstd".into(), "zlib".into()],
            connections_max: CONNECTIONS_MAX_DEFAULT,
            cursor_timeout_ms: 600_000,
            sort_memory_bytes_max: SORT_MEMORY_BYTES_MAX_DEFAULT,
            strict_consistency: false,
            log_transport: LogTransport::Pull,
            authorization: false,
            tls: TlsConfig::default(),
            key_file: None,
            audit: None,
            audit_options: AuditOptions::default(),
            audit_authorization_success: false,
            auth_failed_delay_ms: 0,
            enable_test_commands: false,
            transaction_lifetime_secs: TRANSACTION_LIFETIME_SECS_DEFAULT,
            snapshot_history_window_secs: storage::SNAPSHOT_HISTORY_WINDOW_SECONDS_DEFAULT,
            config_file: None,
            argv: Vec::new(),
            parsed: bson::Document::new(),
            set_parameters_given: bson::Document::new(),
        }
    }
}

/// Values that may come from the command line; `None` means "not given, use the file or default".
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub port: Option<u16>,
    pub bind_ip: Option<String>,
    pub bind_ip_all: bool,
    pub dbpath: Option<PathBuf>,
    pub storage_engine: Option<String>,
    pub config: Option<PathBuf>,
    pub compressors: Option<String>,
    pub max_conns: Option<usize>,
    pub cache_size_gb: Option<f64>,
    pub repl_set: Option<String>,
    pub oplog_size_mb: Option<u64>,
    pub strict_consistency: bool,
    pub log_transport: Option<String>,
    pub auth: bool,
    pub key_file: Option<PathBuf>,
    pub audit_destination: Option<String>,
    pub audit_format: Option<String>,
    pub audit_path: Option<PathBuf>,
    pub audit_filter: Option<String>,
    pub tls_mode: Option<String>,
    pub tls_certificate_key_file: Option<PathBuf>,
    pub tls_ca_file: Option<PathBuf>,
    pub tls_allow_connections_without_certificates: bool,
    /// `--setParameter name=value`, each.
    pub set_parameters: Vec<String>,
}

fn bad_option(msg: impl Into<String>) -> Error {
    Error::new(Code::BadValue, msg)
}

impl ServerConfig {
    pub fn build(o: &Overrides, argv: Vec<String>) -> Result<ServerConfig> {
        let mut c = ServerConfig { argv, ..Default::default() };
        if let Some(path) = &o.config {
            let text = std::fs::read_to_string(path).map_err(|e| bad_option(format!("error reading config file {}: {e}", path.display())))?;
            c.apply_yaml(&text)?;
            c.config_file = Some(path.clone());
        }
        if let Some(p) = o.port {
            c.port = p;
        }
        if let Some(b) = &o.bind_ip {
            c.bind_ip = split_list(b);
        }
        if o.bind_ip_all {
            c.bind_ip = vec!["0.0.0.0".into()];
        }
        if let Some(d) = &o.dbpath {
            c.dbpath = d.clone();
        }
        if let Some(e) = &o.storage_engine {
            c.storage_engine = e.clone();
        }
        if let Some(s) = &o.compressors {
            c.compressors = parse_compressors(s)?;
        }
        if let Some(m) = o.max_conns {
            c.connections_max = m;
        }
        if let Some(gb) = o.cache_size_gb {
            c.cache_size_bytes = cache_size_bytes(gb)?;
        }
        if let Some(name) = &o.repl_set {
            c.repl_set_name = Some(name.clone());
        }
        if let Some(mb) = o.oplog_size_mb {
            c.oplog_size_bytes = oplog_size_bytes(mb)?;
        }
        if o.strict_consistency {
            c.strict_consistency = true;
        }
        if let Some(t) = &o.log_transport {
            c.log_transport = LogTransport::parse(t)?;
        }
        if o.auth {
            c.authorization = true;
        }
        if let Some(k) = &o.key_file {
            c.key_file = Some(k.clone());
        }
        if o.audit_destination.is_some() {
            c.audit_options.destination = o.audit_destination.clone();
        }
        if o.audit_format.is_some() {
            c.audit_options.format = o.audit_format.clone();
        }
        if o.audit_path.is_some() {
            c.audit_options.path = o.audit_path.clone();
        }
        if o.audit_filter.is_some() {
            c.audit_options.filter = o.audit_filter.clone();
        }
        // As with mongod, a keyFile turns authorization on.
        if c.key_file.is_some() {
            c.authorization = true;
        }
        if let Some(m) = &o.tls_mode {
            c.tls.mode = TlsMode::parse(m)?;
        }
        if let Some(f) = &o.tls_certificate_key_file {
            c.tls.certificate_key_file = Some(f.clone());
        }
        if let Some(f) = &o.tls_ca_file {
            c.tls.ca_file = Some(f.clone());
        }
        if o.tls_allow_connections_without_certificates {
            c.tls.allow_connections_without_certificates = true;
        }
        for p in &o.set_parameters {
            let (k, v) = p.split_once('=').ok_or_else(|| bad_option(format!("Illegal --setParameter parameter: \"{p}\"")))?;
            c.set_parameter(k, &Value::String(v.to_string()))?;
        }
        c.audit = c.audit_options.build()?;
        c.validate()?;
        c.parsed = c.to_parsed();
        Ok(c)
    }

    fn validate(&self) -> Result<()> {
        if self.storage_engine != "fjall" && self.storage_engine != "inMemory" {
            return Err(bad_option(format!("Unsupported storage engine '{}'; shoal supports fjall (default) and inMemory", self.storage_engine)));
        }
        if self.connections_max == 0 {
            return Err(bad_option("net.maxIncomingConnections must be at least 1"));
        }
        if let Some(name) = &self.repl_set_name {
            if name.is_empty() || name.contains('/') {
                return Err(bad_option(format!("bad --replSet name '{name}': it must be non-empty and contain no '/'")));
            }
        }
        if self.bind_ip.is_empty() {
            return Err(bad_option("net.bindIp must name at least one address"));
        }
        if self.tls.mode != TlsMode::Disabled && self.tls.certificate_key_file.is_none() {
            return Err(bad_option(format!("net.tls.mode {} needs net.tls.certificateKeyFile", self.tls.mode.name())));
        }
        if self.authorization && self.repl_set_name.is_some() && self.key_file.is_none() {
            // Members authenticate to each other with the key.
            return Err(bad_option("security.authorization with a replica set needs security.keyFile, the key members authenticate to each other with"));
        }
        Ok(())
    }

    /// Apply a mongod.conf YAML document. Unknown options are errors, as with mongod, so a typo
    /// never silently runs a server configured differently from what the operator wrote.
    pub fn apply_yaml(&mut self, text: &str) -> Result<()> {
        let root: Value = serde_yaml::from_str(text).map_err(|e| bad_option(format!("error parsing YAML config file: {e}")))?;
        let root = match root {
            Value::Null => return Ok(()),
            Value::Mapping(m) => m,
            _ => return Err(bad_option("config file must be a YAML mapping")),
        };
        for (k, v) in &root {
            let section = key_str(k)?;
            match section {
                "net" => self.apply_net(v)?,
                "storage" => self.apply_storage(v)?,
                "systemLog" | "processManagement" => {
                    check_known(section, v, &["destination", "path", "logAppend", "verbosity", "quiet", "fork", "pidFilePath", "timeZoneInfo"])?
                }
                "setParameter" => self.apply_set_parameter(v)?,
                "auditLog" => {
                    for (k, v) in mapping("auditLog", v)? {
                        match key_str(k)? {
                            "destination" => self.audit_options.destination = Some(as_str(v, "auditLog.destination")?.to_string()),
                            "format" => self.audit_options.format = Some(as_str(v, "auditLog.format")?.to_string()),
                            "path" => self.audit_options.path = Some(PathBuf::from(as_str(v, "auditLog.path")?)),
                            "filter" => self.audit_options.filter = Some(as_str(v, "auditLog.filter")?.to_string()),
                            other => return Err(bad_option(format!("Unrecognized option: auditLog.{other}"))),
                        }
                    }
                }
                "security" => {
                    for (k, v) in mapping("security", v)? {
                        match key_str(k)? {
                            "authorization" => {
                                self.authorization = match as_str(v, "security.authorization")? {
                                    "enabled" => true,
                                    "disabled" => false,
                                    other => return Err(bad_option(format!("security.authorization must be enabled or disabled, not '{other}'"))),
                                }
                            }
                            "keyFile" => self.key_file = Some(PathBuf::from(as_str(v, "security.keyFile")?)),
                            other => return Err(bad_option(format!("Unrecognized option: security.{other}"))),
                        }
                    }
                }
                "replication" => {
                    for (k, v) in mapping("replication", v)? {
                        match key_str(k)? {
                            "replSetName" => self.repl_set_name = Some(as_str(v, "replication.replSetName")?.to_string()),
                            "oplogSizeMB" => self.oplog_size_bytes = oplog_size_bytes(as_u64(v, "replication.oplogSizeMB")?)?,
                            "strictConsistency" => self.strict_consistency = as_bool(v, "replication.strictConsistency")?,
                            "logTransport" => self.log_transport = LogTransport::parse(as_str(v, "replication.logTransport")?)?,
                            other => return Err(bad_option(format!("Unrecognized option: replication.{other}"))),
                        }
                    }
                }
                other => return Err(bad_option(format!("Unrecognized option: {other}"))),
            }
        }
        Ok(())
    }

    fn apply_net(&mut self, v: &Value) -> Result<()> {
        for (k, v) in mapping("net", v)? {
            match key_str(k)? {
                "port" => self.port = as_u64(v, "net.port")?.try_into().map_err(|_| bad_option("net.port out of range"))?,
                "bindIp" => self.bind_ip = split_list(as_str(v, "net.bindIp")?),
                "bindIpAll" => {
                    if as_bool(v, "net.bindIpAll")? {
                        self.bind_ip = vec!["0.0.0.0".into()]
                    }
                }
                "maxIncomingConnections" => self.connections_max = as_u64(v, "net.maxIncomingConnections")? as usize,
                "tls" => {
                    for (k, v) in mapping("net.tls", v)? {
                        match key_str(k)? {
                            "mode" => self.tls.mode = TlsMode::parse(as_str(v, "net.tls.mode")?)?,
                            "certificateKeyFile" => self.tls.certificate_key_file = Some(PathBuf::from(as_str(v, "net.tls.certificateKeyFile")?)),
                            "CAFile" => self.tls.ca_file = Some(PathBuf::from(as_str(v, "net.tls.CAFile")?)),
                            "allowConnectionsWithoutCertificates" => {
                                self.tls.allow_connections_without_certificates = as_bool(v, "net.tls.allowConnectionsWithoutCertificates")?
                            }
                            other => return Err(bad_option(format!("Unrecognized option: net.tls.{other}"))),
                        }
                    }
                }
                "compression" => {
                    for (k, v) in mapping("net.compression", v)? {
                        match key_str(k)? {
                            "compressors" => self.compressors = parse_compressors(as_str(v, "net.compression.compressors")?)?,
                            other => return Err(bad_option(format!("Unrecognized option: net.compression.{other}"))),
                        }
                    }
                }
                other => return Err(bad_option(format!("Unrecognized option: net.{other}"))),
            }
        }
        Ok(())
    }

    fn apply_storage(&mut self, v: &Value) -> Result<()> {
        for (k, v) in mapping("storage", v)? {
            match key_str(k)? {
                "dbPath" => self.dbpath = PathBuf::from(as_str(v, "storage.dbPath")?),
                "engine" => self.storage_engine = as_str(v, "storage.engine")?.to_string(),
                // Journaling is always on in shoal; accept the explicit "enabled: true" mongod 4.x files carry.
                "journal" => {
                    for (k, v) in mapping("storage.journal", v)? {
                        match key_str(k)? {
                            "enabled" if as_bool(v, "storage.journal.enabled")? => {}
                            "enabled" => return Err(bad_option("storage.journal.enabled: false is not supported; shoal always journals")),
                            other => return Err(bad_option(format!("Unrecognized option: storage.journal.{other}"))),
                        }
                    }
                }
                // mongod's key; shoal's engine is not WiredTiger, but the budget means the same:
                // all the memory storage may hold for data, whatever the data size.
                "wiredTiger" => {
                    for (k, v) in mapping("storage.wiredTiger", v)? {
                        match key_str(k)? {
                            "engineConfig" => {
                                for (k, v) in mapping("storage.wiredTiger.engineConfig", v)? {
                                    match key_str(k)? {
                                        "cacheSizeGB" => self.cache_size_bytes = cache_size_bytes(as_f64(v, "storage.wiredTiger.engineConfig.cacheSizeGB")?)?,
                                        other => return Err(bad_option(format!("Unrecognized option: storage.wiredTiger.engineConfig.{other}"))),
                                    }
                                }
                            }
                            other => return Err(bad_option(format!("Unrecognized option: storage.wiredTiger.{other}"))),
                        }
                    }
                }
                other => return Err(bad_option(format!("Unrecognized option: storage.{other}"))),
            }
        }
        Ok(())
    }

    fn apply_set_parameter(&mut self, v: &Value) -> Result<()> {
        for (k, v) in mapping("setParameter", v)? {
            self.set_parameter(key_str(k)?, v)?;
        }
        Ok(())
    }

    fn set_parameter(&mut self, k: &str, v: &Value) -> Result<()> {
        let given = match v {
            Value::String(s) => s.clone(),
            other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
        };
        self.set_parameters_given.insert(k, given);
        match k {
            "cursorTimeoutMillis" => {
                self.cursor_timeout_ms = match v {
                    Value::String(s) => s.parse().map_err(|_| bad_option(format!("Bad value for parameter \"{k}\": {s}")))?,
                    _ => as_u64(v, "setParameter.cursorTimeoutMillis")?,
                }
            }
            "internalQueryMaxBlockingSortMemoryUsageBytes" => {
                let bytes = match v {
                    Value::String(s) => s.parse().ok(),
                    _ => v.as_u64(),
                };
                self.sort_memory_bytes_max = bytes
                    .filter(|b| *b > 0)
                    .and_then(|b| usize::try_from(b).ok())
                    .ok_or_else(|| bad_option(format!("Bad value for parameter \"{k}\": it must be a positive number of bytes")))?;
            }
            "auditAuthorizationSuccess" => {
                self.audit_authorization_success = match v {
                    Value::Bool(b) => *b,
                    Value::String(s) if matches!(s.as_str(), "1" | "true") => true,
                    Value::String(s) if matches!(s.as_str(), "0" | "false") => false,
                    _ => return Err(bad_option(format!("Bad value for parameter \"{k}\""))),
                }
            }
            "transactionLifetimeLimitSeconds" => {
                let secs = match v {
                    Value::String(s) => s.parse().ok(),
                    _ => v.as_u64(),
                };
                self.transaction_lifetime_secs =
                    secs.filter(|s| *s >= 1).ok_or_else(|| bad_option(format!("Bad value for parameter \"{k}\": it must be at least 1 second")))?;
            }
            "minSnapshotHistoryWindowInSeconds" => {
                let secs = match v {
                    Value::String(s) => s.parse().ok(),
                    _ => v.as_u64(),
                };
                self.snapshot_history_window_secs =
                    secs.ok_or_else(|| bad_option(format!("Bad value for parameter \"{k}\": it must be a number of seconds, at least 0")))?;
            }
            "authFailedDelayMs" => {
                let ms = match v {
                    Value::String(s) => s.parse().ok(),
                    _ => v.as_u64(),
                };
                self.auth_failed_delay_ms = ms
                    .filter(|ms| *ms <= AUTH_FAILED_DELAY_MS_MAX)
                    .ok_or_else(|| bad_option(format!("Invalid value for authFailedDelayMs: it must be 0 to {AUTH_FAILED_DELAY_MS_MAX}")))?;
            }
            "enableTestCommands" => {
                self.enable_test_commands = match v {
                    Value::Bool(b) => *b,
                    Value::String(s) if matches!(s.as_str(), "1" | "true") => true,
                    Value::String(s) if matches!(s.as_str(), "0" | "false") => false,
                    Value::Number(n) => n.as_u64() != Some(0),
                    _ => return Err(bad_option(format!("Bad value for parameter \"{k}\""))),
                }
            }
            other => return Err(bad_option(format!("Unrecognized setParameter: {other}"))),
        }
        Ok(())
    }

    fn to_parsed(&self) -> bson::Document {
        let mut parsed = bson::doc! {
            "net": { "bindIp": self.bind_ip.join(","), "port": self.port as i32,
                     "maxIncomingConnections": self.connections_max as i64,
                     "compression": { "compressors": self.compressors.join(",") } },
            "storage": { "dbPath": self.dbpath.display().to_string(), "engine": self.storage_engine.clone(),
                         "wiredTiger": { "engineConfig": { "cacheSizeGB": self.cache_size_bytes as f64 / (1u64 << 30) as f64 } } },
        };
        if let Some(f) = &self.config_file {
            parsed.insert("config", f.display().to_string());
        }
        if !self.set_parameters_given.is_empty() {
            parsed.insert("setParameter", self.set_parameters_given.clone());
        }
        if let Some(a) = &self.audit {
            let mut audit = bson::doc! {"destination": format!("{:?}", a.destination).to_lowercase(), "format": if a.format == AuditFormat::Json { "JSON" } else { "BSON" }};
            if let Some(p) = &a.path {
                audit.insert("path", p.display().to_string());
            }
            if let Some(f) = &a.filter {
                audit.insert("filter", f.clone());
            }
            parsed.insert("auditLog", audit);
        }
        if self.authorization {
            let mut security = bson::doc! {"authorization": "enabled"};
            if let Some(k) = &self.key_file {
                security.insert("keyFile", k.display().to_string());
            }
            parsed.insert("security", security);
        }
        if self.tls.mode != TlsMode::Disabled {
            let mut tls = bson::doc! {"mode": self.tls.mode.name()};
            if let Some(f) = &self.tls.certificate_key_file {
                tls.insert("certificateKeyFile", f.display().to_string());
            }
            if let Some(f) = &self.tls.ca_file {
                tls.insert("CAFile", f.display().to_string());
            }
            if let Ok(net) = parsed.get_document_mut("net") {
                net.insert("tls", tls);
            }
        }
        if let Some(name) = &self.repl_set_name {
            parsed.insert("replication", bson::doc! {"replSet": name.clone(), "oplogSizeMB": (self.oplog_size_bytes >> 20) as i64, "strictConsistency": self.strict_consistency, "logTransport": self.log_transport.name()});
        }
        parsed
    }
}

/// mongod's oplogSizeMB range: 990 MB to 1 PB.
fn oplog_size_bytes(mb: u64) -> Result<u64> {
    if !(OPLOG_SIZE_MB_DEFAULT..=1 << 30).contains(&mb) {
        return Err(bad_option(format!("oplogSizeMB must be between {OPLOG_SIZE_MB_DEFAULT} and {}, not {mb}", 1u64 << 30)));
    }
    Ok(mb << 20)
}

/// mongod's cacheSizeGB range, 0.25 to 10000 GB.
fn cache_size_bytes(gb: f64) -> Result<u64> {
    if !(0.25..=10_000.0).contains(&gb) {
        return Err(bad_option(format!("cacheSizeGB must be between 0.25 and 10000, not {gb}")));
    }
    Ok((gb * (1u64 << 30) as f64) as u64)
}

/// mongod's default cache, 50% of (RAM - 1 GB) with a floor of 256 MB, capped at 1 GiB so that
/// a default shoal stays within the 1 GiB bound whatever the machine.
pub fn cache_size_bytes_default(ram_bytes: u64) -> u64 {
    (ram_bytes.saturating_sub(1 << 30) / 2).clamp(256 << 20, storage::CACHE_SIZE_BYTES_DEFAULT)
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect()
}

fn parse_compressors(s: &str) -> Result<Vec<String>> {
    if s == "disabled" || s.is_empty() {
        return Ok(Vec::new());
    }
    let list = split_list(s);
    for c in &list {
        if !matches!(c.as_str(), "snappy" | "zstd" | "zlib" | "noop") {
            return Err(bad_option(format!("Unsupported compressor: {c}")));
        }
    }
    Ok(list)
}

fn key_str(k: &Value) -> Result<&str> {
    k.as_str().ok_or_else(|| bad_option("config file keys must be strings"))
}

fn mapping<'a>(name: &str, v: &'a Value) -> Result<&'a serde_yaml::Mapping> {
    v.as_mapping().ok_or_else(|| bad_option(format!("{name} must be a mapping")))
}

fn check_known(section: &str, v: &Value, known: &[&str]) -> Result<()> {
    for (k, _) in mapping(section, v)? {
        let k = key_str(k)?;
        if !known.contains(&k) {
            return Err(bad_option(format!("Unrecognized option: {section}.{k}")));
        }
    }
    Ok(())
}

fn as_str<'a>(v: &'a Value, name: &str) -> Result<&'a str> {
    v.as_str().ok_or_else(|| bad_option(format!("{name} must be a string")))
}
fn as_u64(v: &Value, name: &str) -> Result<u64> {
    v.as_u64().ok_or_else(|| bad_option(format!("{name} must be a non-negative integer")))
}
fn as_f64(v: &Value, name: &str) -> Result<f64> {
    v.as_f64().ok_or_else(|| bad_option(format!("{name} must be a number")))
}
fn as_bool(v: &Value, name: &str) -> Result<bool> {
    v.as_bool().ok_or_else(|| bad_option(format!("{name} must be a boolean")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_config_applies_and_flags_override() {
        let dir = std::env::temp_dir().join(format!("shoal-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("mongod.conf");
        std::fs::write(&f, "net:\n  port: 27999\n  bindIp: 127.0.0.1,127.0.0.2\nstorage:\n  dbPath: /tmp/x\n  journal:\n    enabled: true\n").unwrap();
        let c = ServerConfig::build(&Overrides { config: Some(f.clone()), ..Default::default() }, vec![]).unwrap();
        assert_eq!(c.port, 27999);
        assert_eq!(c.bind_ip, vec!["127.0.0.1", "127.0.0.2"]);
        assert_eq!(c.dbpath, PathBuf::from("/tmp/x"));
        let c = ServerConfig::build(&Overrides { config: Some(f), port: Some(1234), ..Default::default() }, vec![]).unwrap();
        assert_eq!(c.port, 1234);
        let mut c = ServerConfig::default();
        assert!(!c.strict_consistency);
        c.apply_yaml("replication:\n  replSetName: rs0\n  strictConsistency: true\n").unwrap();
        let mut s = ServerConfig::default();
        s.apply_yaml("security:\n  authorization: enabled\n").unwrap();
        assert!(s.authorization);
        assert!(s.apply_yaml("security:\n  authorization: maybe\n").is_err());
        s.apply_yaml("security:\n  keyFile: /k\n").unwrap();
        assert_eq!(s.key_file.as_deref(), Some(std::path::Path::new("/k")));
        s.apply_yaml("net:\n  tls:\n    mode: requireTLS\n    certificateKeyFile: /s.pem\n    CAFile: /ca.pem\n").unwrap();
        assert_eq!((s.tls.mode, s.tls.ca_file.as_deref()), (TlsMode::Require, Some(std::path::Path::new("/ca.pem"))));
        assert!(s.apply_yaml("net:\n  tls:\n    mode: sometimes\n").is_err());
        assert!(ServerConfig::build(&Overrides { tls_mode: Some("preferTLS".into()), ..Default::default() }, vec![]).is_err(), "TLS needs a certificate");
        assert!(c.strict_consistency);
        assert!(c.apply_yaml("replication:\n  strictConsistency: sometimes\n").is_err());
        assert_eq!(c.log_transport, LogTransport::Pull);
        c.apply_yaml("replication:\n  logTransport: push\n").unwrap();
        assert_eq!(c.log_transport, LogTransport::Push);
        assert!(c.apply_yaml("replication:\n  logTransport: carrier-pigeon\n").is_err());
    }

    #[test]
    fn unknown_options_are_rejected() {
        let mut c = ServerConfig::default();
        assert!(c.apply_yaml("net:\n  prot: 1\n").is_err());
        assert!(c.apply_yaml("bogus: {}\n").is_err());
        assert!(c.apply_yaml("storage:\n  journal:\n    enabled: false\n").is_err());
        assert!(c.apply_yaml("net: [1]\n").is_err());
    }

    #[test]
    fn cache_size_comes_from_mongod_options_within_mongod_range() {
        let mut c = ServerConfig::default();
        c.apply_yaml("storage:\n  wiredTiger:\n    engineConfig:\n      cacheSizeGB: 0.5\n").unwrap();
        assert_eq!(c.cache_size_bytes, 512 << 20);
        assert!(c.apply_yaml("storage:\n  wiredTiger:\n    engineConfig:\n      cacheSizeGB: 0.1\n").is_err());
        assert!(c.apply_yaml("storage:\n  wiredTiger:\n    engineConfig:\n      cacheSizGB: 1\n").is_err());
        let flag = ServerConfig::build(&Overrides { cache_size_gb: Some(2.0), ..Default::default() }, vec![]).unwrap();
        assert_eq!(flag.cache_size_bytes, 2 << 30);
        assert!(ServerConfig::build(&Overrides { cache_size_gb: Some(20_000.0), ..Default::default() }, vec![]).is_err());
        // The default follows mongod's rule, within [256 MiB, 1 GiB].
        assert_eq!(cache_size_bytes_default(24 << 30), 1 << 30);
        assert_eq!(cache_size_bytes_default(2 << 30), 512 << 20);
        assert_eq!(cache_size_bytes_default(1 << 30), 256 << 20);
        assert!(cache_size_bytes_default(0) >= storage::CACHE_SIZE_BYTES_MIN);
    }
}
