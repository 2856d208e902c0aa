//! Test harness: runs the real `shoal` binary on a free loopback port with a fresh dbpath.
//! Every test owns its server, so tests are parallel-safe.

#![allow(dead_code)]

pub mod cluster;
pub mod wire;

use mongodb::bson::{doc, Bson, Document};
use mongodb::{Client, Cursor};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the binary gets to accept TCP connections before the test fails.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
const READY_POLL_INTERVAL: Duration = Duration::from_millis(25);
/// A start can lose the race for its free port to another test; retry with a new port.
const START_ATTEMPTS_MAX: u32 = 3;
/// How much of the server's stderr is printed when a start fails or a test panics.
const STDERR_TAIL_BYTES_MAX: u64 = 16 * 1024;

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

pub fn binary_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_shoal"))
}

/// How the server is started: extra CLI flags, or a mongod.conf YAML file.
#[derive(Clone, Default)]
pub struct ServerOptions {
    pub args_extra: Vec<String>,
    /// YAML text for `--config`; `{port}` and `{dbpath}` are substituted.
    /// With a config file, port and dbpath are passed only through the file.
    pub config_yaml: Option<String>,
    /// A router (`shoal router`) for the config servers named so, instead of a server.
    pub router_configdb: Option<String>,
}

pub struct Server {
    child: Option<Child>,
    pub port: u16,
    /// Temp root: holds `db/` (the dbpath) and one log file pair per start.
    pub root: PathBuf,
    pub dbpath: PathBuf,
    options: ServerOptions,
    starts_count: u32,
    /// URI options every client of this server needs (a TLS server's tls=true&tlsCAFile=).
    pub client_options: String,
}

/// Asks the OS for a free loopback port by binding port 0.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

fn fresh_root() -> PathBuf {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let n = DIR_COUNTER.fetch_add(1, Ordering::SeqCst);
    let root = std::env::temp_dir().join(format!("shoal-test-{}-{}-{}", std::process::id(), n, nanos));
    std::fs::create_dir_all(root.join("db")).expect("create temp dbpath");
    root
}

fn tail(path: &Path) -> String {
    let Ok(mut f) = std::fs::File::open(path) else { return String::from("<no stderr file>") };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > STDERR_TAIL_BYTES_MAX {
        use std::io::Seek;
        let _ = f.seek(std::io::SeekFrom::Start(len - STDERR_TAIL_BYTES_MAX));
    }
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(ServerOptions::default())
    }

    pub fn start_with_args(args: &[&str]) -> Server {
        Server::start_with(ServerOptions { args_extra: args.iter().map(|s| s.to_string()).collect(), ..Default::default() })
    }

    /// A router for the config servers `configdb` (`cfg/host:port,...`).
    pub fn start_router(configdb: &str, args: &[&str]) -> Server {
        Server::start_with(ServerOptions {
            args_extra: args.iter().map(|s| s.to_string()).collect(),
            config_yaml: None,
            router_configdb: Some(configdb.to_string()),
        })
    }

    pub fn start_with(options: ServerOptions) -> Server {
        let root = fresh_root();
        let dbpath = root.join("db");
        let mut server = Server { child: None, port: 0, root, dbpath, options, starts_count: 0, client_options: String::new() };
        server.spawn_until_ready(None);
        server
    }

    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/", self.port)
    }

    /// A driver client with default options.
    pub async fn client(&self) -> Client {
        self.client_with("").await
    }

    /// A driver client with extra URI options, e.g. "compressors=zlib".
    pub async fn client_with(&self, uri_options: &str) -> Client {
        let options = [uri_options, &self.client_options].iter().filter(|o| !o.is_empty()).copied().collect::<Vec<_>>().join("&");
        let uri = if options.is_empty() { self.uri() } else { format!("{}?{options}", self.uri()) };
        Client::with_uri_str(uri).await.expect("client from uri")
    }

    pub fn stderr_path(&self, start_index: u32) -> PathBuf {
        self.root.join(format!("stderr-{start_index}.log"))
    }

    pub fn stderr_tail(&self) -> String {
        tail(&self.stderr_path(self.starts_count.saturating_sub(1)))
    }

    /// The server process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL: no shutdown code runs, like a power cut for the process.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for exit (SIGKILL after `timeout`). Returns the exit status code.
    pub fn stop_graceful(&mut self, timeout: Duration) -> Option<i32> {
        let mut c = self.child.take()?;
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match c.try_wait() {
                Ok(Some(status)) => return status.code(),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(READY_POLL_INTERVAL),
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return None;
                }
            }
        }
    }

    /// Starts again on the same dbpath with other extra arguments (a standalone joining a
    /// replica set); prefers the same port.
    pub fn restart_with_args(&mut self, args: &[&str]) {
        self.options.args_extra = args.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    /// Starts again on the same dbpath (after kill9 or stop_graceful); prefers the same port.
    pub fn restart(&mut self) {
        self.kill9();
        let port = self.port;
        self.spawn_until_ready(Some(port));
    }

    fn spawn_until_ready(&mut self, port_preferred: Option<u16>) {
        let mut port_next = port_preferred;
        let mut failures = String::new();
        for _attempt in 0..START_ATTEMPTS_MAX {
            let port = port_next.take().unwrap_or_else(free_port);
            match self.spawn_once(port) {
                Ok(()) => return,
                Err(msg) => failures.push_str(&msg),
            }
        }
        panic!("shoal did not become ready after {START_ATTEMPTS_MAX} attempts:\n{failures}");
    }

    fn spawn_once(&mut self, port: u16) -> Result<(), String> {
        let index = self.starts_count;
        self.starts_count += 1;
        let stderr_path = self.stderr_path(index);
        let stdout_path = self.root.join(format!("stdout-{index}.log"));
        let stderr = std::fs::File::create(&stderr_path).map_err(|e| e.to_string())?;
        let stdout = std::fs::File::create(&stdout_path).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(binary_path());
        if let Some(configdb) = &self.options.router_configdb {
            cmd.args(["router", "--configdb", configdb, "--port", &port.to_string(), "--bind_ip", "127.0.0.1"]);
        } else if let Some(yaml) = &self.options.config_yaml {
            cmd.arg("serve");
            let text = yaml.replace("{port}", &port.to_string()).replace("{dbpath}", &self.dbpath.display().to_string());
            let conf = self.root.join(format!("mongod-{index}.conf"));
            std::fs::write(&conf, text).map_err(|e| e.to_string())?;
            cmd.arg("--config").arg(conf);
        } else {
            cmd.arg("serve");
            cmd.args(["--port", &port.to_string(), "--bind_ip", "127.0.0.1", "--dbpath"]).arg(&self.dbpath);
        }
        cmd.args(&self.options.args_extra);
        cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        let child = cmd.spawn().map_err(|e| format!("spawn {}: {e}", binary_path().display()))?;
        self.child = Some(child);
        self.port = port;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            let exited = match self.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => Some(status.to_string()),
                _ => None,
            };
            if let Some(status) = exited {
                self.child = None;
                return Err(format!("--- start {index} on port {port} exited ({status}); stderr:\n{}\n", tail(&stderr_path)));
            }
            if Instant::now() >= deadline {
                self.kill9();
                panic!("shoal not accepting connections on port {port} within {:?}; stderr:\n{}", READY_TIMEOUT, tail(&stderr_path));
            }
            std::thread::sleep(READY_POLL_INTERVAL);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            // Keep the files for a post-mortem, and show the server's side of the story.
            eprintln!("--- shoal stderr ({}):\n{}", self.root.display(), self.stderr_tail());
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Drains a driver cursor (no `futures` dependency needed).
pub async fn collect(mut cursor: Cursor<Document>) -> Vec<Document> {
    let mut out = Vec::new();
    while cursor.advance().await.expect("cursor advance") {
        out.push(cursor.deserialize_current().expect("cursor document"));
    }
    out
}

/// Any BSON number as f64 (servers may answer Int32, Int64 or Double).
pub fn num(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(i) => Some(*i as f64),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(d) => Some(*d),
        Bson::Decimal128(d) => d.to_string().parse().ok(),
        _ => None,
    }
}

/// A numeric field, panicking with the document when it is missing or not a number.
pub fn num_field(d: &Document, key: &str) -> f64 {
    d.get(key).and_then(num).unwrap_or_else(|| panic!("field {key:?} missing or not numeric in {d:?}"))
}

/// Follows a dotted path through embedded documents.
pub fn path<'a>(d: &'a Document, dotted: &str) -> Option<&'a Bson> {
    let mut cur = d;
    let mut parts = dotted.split('.').peekable();
    while let Some(p) = parts.next() {
        let v = cur.get(p)?;
        if parts.peek().is_none() {
            return Some(v);
        }
        cur = v.as_document()?;
    }
    None
}

/// Server error code from a driver error: command errors, write errors and bulk write errors.
pub fn error_code(e: &mongodb::error::Error) -> Option<i32> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        ErrorKind::InsertMany(m) => m.write_errors.as_ref().and_then(|w| w.first()).map(|w| w.code),
        _ => None,
    }
}

pub fn error_code_name(e: &mongodb::error::Error) -> Option<String> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code_name.clone()),
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code_name.clone(),
        _ => None,
    }
}

/// Asserts that `r` failed with server error `code`, showing the whole result otherwise.
#[track_caller]
pub fn assert_code<T: std::fmt::Debug>(r: mongodb::error::Result<T>, code: i32) -> mongodb::error::Error {
    match r {
        Ok(v) => panic!("expected error code {code}, got success: {v:?}"),
        Err(e) => {
            assert_eq!(error_code(&e), Some(code), "wrong error: {e:?}");
            e
        }
    }
}

/// Asserts code and codeName together (MongoDB pairs them).
#[track_caller]
pub fn assert_code_name<T: std::fmt::Debug>(r: mongodb::error::Result<T>, code: i32, code_name: &str) -> mongodb::error::Error {
    let e = assert_code(r, code);
    assert_eq!(error_code_name(&e).as_deref(), Some(code_name), "wrong codeName: {e:?}");
    e
}

pub async fn ping(client: &Client) -> mongodb::error::Result<Document> {
    client.database("admin").run_command(doc! {"ping": 1}).await
}

/// Raises this process's open-file soft limit to the hard limit (children inherit it).
pub fn raise_nofile_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
        lim.rlim_cur
    }
}

/// Exact comparison including field order and numeric types (bson's `==` ignores order).
#[track_caller]
pub fn assert_same(got: &Document, want: &Document) {
    let g = got.to_vec().expect("serialize got");
    let w = want.to_vec().expect("serialize want");
    assert!(g == w, "documents differ (order/types matter)\n got: {got:?}\nwant: {want:?}");
}

#[track_caller]
pub fn assert_same_all(got: &[Document], want: &[Document]) {
    assert_eq!(got.len(), want.len(), "lengths differ\n got: {got:?}\nwant: {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert_same(g, w);
    }
}

/// Deterministic xorshift, so that a failing run's choices replay from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A run's seed: from the environment variable `var` when set (to replay a run), else
/// from the clock. Printed, so that a failing run can be replayed.
pub fn seed_from_env(var: &str) -> u64 {
    let seed =
        std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64));
    eprintln!("{var}={seed}");
    seed
}

/// A size field of /proc/PID/status (`VmRSS`, `VmHWM`, ...), in bytes.
pub fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let line = status.lines().find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':'))).unwrap_or_else(|| panic!("no {field} line"));
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {field} value"));
    kib * 1024
}
