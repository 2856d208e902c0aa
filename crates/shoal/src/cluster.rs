//! `shoal cluster up|down|status`: a local replica set of any shape, or a sharded cluster
//! (`--shards`), in one command. Member i of a set listens on 127.0.0.(i+1) at the set's port,
//! keeps its data in `<dir>/<prefix><i>` and its log beside it; `<dir>/cluster.pids` lists
//! each process (members and the router) with its host for `down` and `status`.

use bench::scenario::chaining::{set_config, ChainingMode, VOTERS_MAX};
use clap::{Args, Subcommand, ValueEnum};
use mongodb::bson::{doc, Bson, Document};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// mongod's limit on members (VOTERS_MAX is its limit on voters).
const MEMBERS_MAX: usize = 50;
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Start a replica set and print its connection string.
    Up(UpArgs),
    /// Stop the set started in --dir.
    Down(DirArgs),
    /// Print each member's state and sync source.
    Status(DirArgs),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ChainingArg {
    On,
    Off,
    /// Voters fetch from the primary; members without a vote chain from secondaries.
    Auto,
}

#[derive(Args)]
pub struct UpArgs {
    /// Members, 1 to 50.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Voting members (the first ones; at most 7) [default: min(members, 7)].
    #[arg(long)]
    voters: Option<usize>,
    /// Hidden members among the non-voters (votes 0, priority 0, hidden).
    #[arg(long, default_value_t = 0)]
    hidden: usize,
    /// settings.chainingAllowed.
    #[arg(long, value_enum, default_value = "on")]
    chaining: ChainingArg,
    /// The port every member listens on (each on its own 127.0.0.x address).
    #[arg(long, default_value_t = 27017)]
    port: u16,
    /// Replica set name.
    #[arg(long = "replSet", default_value = "rs0")]
    repl_set: String,
    /// Data and logs of the members.
    #[arg(long, default_value = "data/cluster")]
    dir: PathBuf,
    /// Storage memory per member in GB (--wiredTigerCacheSizeGB).
    #[arg(long = "cacheSizeGB", default_value_t = 0.25)]
    cache_size_gb: f64,
    /// A sharded cluster of this many shards (1 to 64) behind a router on --port, instead of
    /// one replica set: the config servers listen on port+1, shard i on port+2+i.
    #[arg(long)]
    shards: Option<usize>,
    /// Members of each shard's and the config servers' replica set, with --shards.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Access control: a keyFile generated in --dir for every member and router to
    /// authenticate to each other with, and --auth on each. Create the first user from this
    /// host (through the router for a sharded cluster).
    #[arg(long)]
    auth: bool,
    /// TLS on every member and the router, with these flags for each.
    #[command(flatten)]
    tls: crate::TlsArgs,
    /// A server parameter for every member, name=value (repeatable); the router gets those it
    /// takes (enableTestCommands, auditAuthorizationSuccess).
    #[arg(long = "setParameter")]
    set_parameter: Vec<String>,
}

/// Shards `cluster up --shards` starts at most (ports port+2 to port+65).
const SHARDS_MAX: usize = 64;

#[derive(Args)]
pub struct DirArgs {
    #[arg(long, default_value = "data/cluster")]
    dir: PathBuf,
}

pub fn run(cmd: ClusterCommand) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    match cmd {
        ClusterCommand::Up(a) => rt.block_on(up(a)),
        ClusterCommand::Down(a) => down(&a.dir),
        ClusterCommand::Status(a) => rt.block_on(status(&a.dir)),
    }
}

fn host(i: usize, port: u16) -> String {
    format!("127.0.0.{}:{port}", i + 1)
}

fn pids_file(dir: &Path) -> PathBuf {
    dir.join("cluster.pids")
}

/// The keyFile `--auth` generates.
fn key_file(dir: &Path) -> PathBuf {
    dir.join("keyfile")
}

/// How this command connects to the processes it started, kept in --dir for `status`:
/// TLS files, and whether to log in with the keyFile as the internal user.
fn access_file(dir: &Path) -> PathBuf {
    dir.join("cluster.access")
}

/// Characters of a generated key (mongod takes 6 to 1024 base64 characters).
const KEY_CHARS: usize = 64;

/// Write a new random keyFile, readable by its owner only.
fn write_key_file(path: &Path) -> Result<(), String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut random = [0u8; KEY_CHARS];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut random)).map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    let key: String = random.iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect();
    let mut f =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    std::io::Write::write_all(&mut f, key.as_bytes()).map_err(|e| e.to_string())
}

/// The options every member and router gets, beyond its own address.
fn server_args(a: &UpArgs) -> Vec<String> {
    let mut args = Vec::new();
    if a.auth {
        args.push("--keyFile".to_string());
        args.push(key_file(&a.dir).display().to_string());
    }
    if let Some(m) = &a.tls.tls_mode {
        args.extend(["--tlsMode".to_string(), m.clone()]);
    }
    if let Some(f) = &a.tls.tls_certificate_key_file {
        args.extend(["--tlsCertificateKeyFile".to_string(), absolute(f).display().to_string()]);
    }
    if let Some(f) = &a.tls.tls_ca_file {
        args.extend(["--tlsCAFile".to_string(), absolute(f).display().to_string()]);
    }
    if a.tls.tls_allow_connections_without_certificates {
        args.push("--tlsAllowConnectionsWithoutCertificates".to_string());
    }
    args
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The connection-string options a client needs for TLS.
fn tls_params(a: &UpArgs) -> String {
    match a.tls.tls_mode.as_deref() {
        None | Some("disabled") | Some("allowTLS") => String::new(),
        Some(_) => {
            let mut p = String::from("tls=true");
            if let Some(f) = &a.tls.tls_ca_file {
                p.push_str(&format!("&tlsCAFile={}", absolute(f).display()));
            }
            if let Some(f) = &a.tls.tls_certificate_key_file {
                p.push_str(&format!("&tlsCertificateKeyFile={}", absolute(f).display()));
            }
            p
        }
    }
}

async fn up(a: UpArgs) -> Result<(), String> {
    if pids_file(&a.dir).exists() {
        return Err(format!("a cluster is already up in {} (shoal cluster down --dir {})", a.dir.display(), a.dir.display()));
    }
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("cannot create {}: {e}", a.dir.display()))?;
    if a.auth {
        let _ = std::fs::remove_file(key_file(&a.dir));
        write_key_file(&key_file(&a.dir))?;
    }
    let access = format!("{}\n{}\n", a.auth, tls_params(&a));
    std::fs::write(access_file(&a.dir), access).map_err(|e| e.to_string())?;
    let result = match a.shards {
        None => up_set(&a).await,
        Some(n) => up_sharded(&a, n).await,
    };
    match result {
        Ok(uri) => {
            println!("{uri}");
            Ok(())
        }
        Err(e) => {
            let _ = down(&a.dir);
            Err(e)
        }
    }
}

/// One replica set, as the arguments shape it; returns its connection string.
async fn up_set(a: &UpArgs) -> Result<String, String> {
    let voters = a.voters.unwrap_or(a.members.min(VOTERS_MAX));
    if a.members == 0 || a.members > MEMBERS_MAX {
        return Err(format!("--members must be 1 to {MEMBERS_MAX}"));
    }
    if voters == 0 || voters > VOTERS_MAX || voters > a.members {
        return Err(format!("--voters must be 1 to {VOTERS_MAX} and at most --members"));
    }
    if a.hidden > a.members - voters {
        return Err("--hidden members come from the non-voters: at most members - voters".into());
    }
    let hosts: Vec<String> = (0..a.members).map(|i| host(i, a.port)).collect();
    let chaining = match a.chaining {
        ChainingArg::On => ChainingMode::On,
        ChainingArg::Off => ChainingMode::Off,
        ChainingArg::Auto => ChainingMode::Auto,
    };
    start_set(a, &a.repl_set, "m", &hosts).await?;
    initiate(&a.dir, &a.repl_set, &hosts, set_config(&a.repl_set, &hosts, voters, a.hidden, chaining)).await?;
    let tls = tls_params(a);
    Ok(format!("mongodb://{}/?replicaSet={}{}{tls}", hosts.join(","), a.repl_set, if tls.is_empty() { "" } else { "&" }))
}

/// Config servers, `shards` shards and a router; returns the router's connection string.
async fn up_sharded(a: &UpArgs, shards: usize) -> Result<String, String> {
    if shards == 0 || shards > SHARDS_MAX {
        return Err(format!("--shards must be 1 to {SHARDS_MAX}"));
    }
    if a.replicas == 0 || a.replicas > VOTERS_MAX {
        return Err(format!("--replicas must be 1 to {VOTERS_MAX}"));
    }
    if a.port as usize + 2 + shards > u16::MAX as usize {
        return Err("--port leaves no room for the shards' ports".into());
    }
    let set_hosts = |port: u16| (0..a.replicas).map(|i| host(i, port)).collect::<Vec<String>>();
    let mut sets = vec![("cfg".to_string(), set_hosts(a.port + 1))];
    for i in 0..shards {
        sets.push((format!("shard{i}"), set_hosts(a.port + 2 + i as u16)));
    }
    for (name, hosts) in &sets {
        start_set(a, name, &format!("{name}-m"), hosts).await?;
    }
    for (name, hosts) in &sets {
        initiate(&a.dir, name, hosts, set_config(name, hosts, hosts.len(), 0, ChainingMode::On)).await?;
    }
    let router = host(0, a.port);
    let configdb = format!("cfg/{}", sets[0].1.join(","));
    let log = std::fs::File::create(a.dir.join("router.log")).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(["router", "--configdb", &configdb, "--port", &a.port.to_string(), "--bind_ip", "127.0.0.1"])
        .args(server_args(a))
        .args(
            a.set_parameter
                .iter()
                .filter(|p| p.starts_with("enableTestCommands=") || p.starts_with("auditAuthorizationSuccess="))
                .flat_map(|p| ["--setParameter", p.as_str()]),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd.spawn().map_err(|e| format!("cannot start the router: {e}"))?;
    append_pid(&a.dir, child.id(), &router, "router")?;
    wait_listening(std::slice::from_ref(&router), &a.dir).await?;
    let client = client(&a.dir, &router).await?;
    for (name, hosts) in &sets[1..] {
        client.database("admin").run_command(doc! {"addShard": format!("{name}/{}", hosts.join(","))}).await.map_err(|e| format!("addShard {name}: {e}"))?;
    }
    let tls = tls_params(a);
    Ok(format!("mongodb://{router}/{}{tls}", if tls.is_empty() { "" } else { "?" }))
}

/// Start a set's members (each on its own 127.0.0.x address), data in `<dir>/<prefix><i>`.
async fn start_set(a: &UpArgs, set: &str, prefix: &str, hosts: &[String]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    for (i, h) in hosts.iter().enumerate() {
        let data = a.dir.join(format!("{prefix}{i}"));
        std::fs::create_dir_all(&data).map_err(|e| format!("cannot create {}: {e}", data.display()))?;
        let log = std::fs::File::create(a.dir.join(format!("{prefix}{i}.log"))).map_err(|e| e.to_string())?;
        let (ip, port) = h.rsplit_once(':').unwrap_or(("127.0.0.1", "27017"));
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["serve", "--bind_ip", ip, "--port", port, "--replSet", set, "--wiredTigerCacheSizeGB", &a.cache_size_gb.to_string()])
            .args(server_args(a))
            .args(a.set_parameter.iter().flat_map(|p| ["--setParameter", p.as_str()]))
            .arg("--dbpath")
            .arg(&data)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        // Its own process group: the members outlive this command and a Ctrl-C in its terminal.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().map_err(|e| format!("cannot start member {i} of {set}: {e}"))?;
        append_pid(&a.dir, child.id(), h, "member")?;
    }
    wait_listening(hosts, &a.dir).await
}

/// Record a started process in the pids file, for `down` and `status`.
fn append_pid(dir: &Path, pid: u32, host: &str, role: &str) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(pids_file(dir)).map_err(|e| e.to_string())?;
    writeln!(f, "{pid} {host} {role}").map_err(|e| e.to_string())
}

async fn wait_listening(hosts: &[String], dir: &Path) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    for h in hosts {
        while tokio::net::TcpStream::connect(h).await.is_err() {
            if Instant::now() >= deadline {
                return Err(format!("{h} did not start; see its log in {}", dir.display()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// replSetInitiate on the first member, then wait for one primary and the rest secondaries.
async fn initiate(dir: &Path, set: &str, hosts: &[String], cfg: Document) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    // Before any user exists, a client on this host may initiate (the localhost exception);
    // with a keyFile, this command logs in as the internal user once the set has one.
    let first = client_unauthenticated(dir, &hosts[0]).await?;
    first.database("admin").run_command(doc! {"replSetInitiate": cfg}).await.map_err(|e| format!("replSetInitiate of {set}: {e}"))?;
    let first = client(dir, &hosts[0]).await?;
    loop {
        let s = first.database("admin").run_command(doc! {"replSetGetStatus": 1}).await.map_err(|e| e.to_string())?;
        let states = member_states(&s);
        if states.iter().filter(|s| *s == "PRIMARY").count() == 1 && states.iter().all(|s| s == "PRIMARY" || s == "SECONDARY") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{set} did not settle within {READY_TIMEOUT:?}: {states:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client of one process this command started: over TLS when the cluster takes it, and
/// logged in as the internal user with the keyFile when access control is on.
async fn client(dir: &Path, host: &str) -> Result<mongodb::Client, String> {
    let (auth, tls) = read_access(dir);
    let login = match auth {
        true => {
            let key = std::fs::read_to_string(key_file(dir)).map_err(|e| format!("cannot read the keyFile: {e}"))?;
            format!("__system:{}@", key.trim())
        }
        false => String::new(),
    };
    let login_opts = if auth { "&authSource=local&authMechanism=SCRAM-SHA-256" } else { "" };
    let tls = if tls.is_empty() { String::new() } else { format!("&{tls}") };
    mongodb::Client::with_uri_str(format!("mongodb://{login}{host}/?directConnection=true&serverSelectionTimeoutMS=5000{login_opts}{tls}"))
        .await
        .map_err(|e| e.to_string())
}

async fn client_unauthenticated(dir: &Path, host: &str) -> Result<mongodb::Client, String> {
    let (_, tls) = read_access(dir);
    let tls = if tls.is_empty() { String::new() } else { format!("&{tls}") };
    mongodb::Client::with_uri_str(format!("mongodb://{host}/?directConnection=true&serverSelectionTimeoutMS=5000{tls}")).await.map_err(|e| e.to_string())
}

/// (access control on, TLS connection-string options) as `up` recorded them.
fn read_access(dir: &Path) -> (bool, String) {
    let text = std::fs::read_to_string(access_file(dir)).unwrap_or_default();
    let mut lines = text.lines();
    (lines.next() == Some("true"), lines.next().unwrap_or("").to_string())
}

fn member_states(status: &Document) -> Vec<String> {
    status.get_array("members").map(|m| m.iter().filter_map(|d| d.as_document()?.get_str("stateStr").ok().map(str::to_string)).collect()).unwrap_or_default()
}

/// (pid, host, role) of each process: "member" or "router".
fn read_pids(dir: &Path) -> Result<Vec<(i32, String, String)>, String> {
    let text = std::fs::read_to_string(pids_file(dir)).map_err(|e| format!("no cluster in {}: {e}", dir.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.to_string(), f.next().unwrap_or("member").to_string()))
        })
        .collect())
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn down(dir: &Path) -> Result<(), String> {
    let pids: Vec<i32> = read_pids(dir)?.into_iter().map(|(p, _, _)| p).collect();
    for &p in &pids {
        // SAFETY: SIGTERM to a member this command started; it flushes and exits.
        unsafe {
            libc::kill(p, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for &p in pids.iter().filter(|&&p| alive(p)) {
        // SAFETY: as above; a member that did not stop in time is killed.
        unsafe {
            libc::kill(p, libc::SIGKILL);
        }
    }
    std::fs::remove_file(pids_file(dir)).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(access_file(dir));
    let _ = std::fs::remove_file(key_file(dir));
    println!("stopped {} processes", pids.len());
    Ok(())
}

async fn status(dir: &Path) -> Result<(), String> {
    // Ask the members in turn until one answers (any member knows the whole set).
    let mut last_error = String::from("no member answered");
    let procs = read_pids(dir)?;
    if let Some((_, router, _)) = procs.iter().find(|(pid, _, role)| role == "router" && alive(*pid)) {
        // A sharded cluster: its shards as the router lists them.
        let shards = client(dir, router).await?.database("admin").run_command(doc! {"listShards": 1}).await.map_err(|e| e.to_string())?;
        println!("router {router}");
        for s in shards.get_array("shards").into_iter().flatten().filter_map(Bson::as_document) {
            println!("shard {:<12} {}", s.get_str("_id").unwrap_or("?"), s.get_str("host").unwrap_or("?"));
        }
        return Ok(());
    }
    for (pid, host, _) in procs {
        if !alive(pid) {
            continue;
        }
        match client(dir, &host).await {
            Ok(c) => match c.database("admin").run_command(doc! {"replSetGetStatus": 1}).await {
                Ok(s) => {
                    print_status(&s);
                    return Ok(());
                }
                Err(e) => last_error = e.to_string(),
            },
            Err(e) => last_error = e,
        }
    }
    Err(last_error)
}

fn print_status(s: &Document) {
    println!("set {}  term {}", s.get_str("set").unwrap_or("?"), s.get_i64("term").unwrap_or(0));
    println!("{:<22} {:<26} {:<22} optime", "member", "state", "sync source");
    for m in s.get_array("members").into_iter().flatten().filter_map(Bson::as_document) {
        let optime = m.get_document("optime").ok().and_then(|o| o.get_timestamp("ts").ok()).map(|t| format!("{}:{}", t.time, t.increment)).unwrap_or_default();
        println!(
            "{:<22} {:<26} {:<22} {}",
            m.get_str("name").unwrap_or("?"),
            m.get_str("stateStr").unwrap_or("?"),
            m.get_str("syncSourceHost").unwrap_or(""),
            optime
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_have_voters_then_hidden_then_read_only() {
        let hosts: Vec<String> = (0..15).map(|i| host(i, 27017)).collect();
        let c = set_config("rs0", &hosts, 7, 1, ChainingMode::On);
        let m: Vec<&Document> = c.get_array("members").unwrap().iter().map(|b| b.as_document().unwrap()).collect();
        assert_eq!(m.iter().filter(|d| d.get_i32("votes").unwrap_or(1) == 1).count(), 7);
        assert_eq!(m.iter().filter(|d| d.get_bool("hidden").unwrap_or(false)).count(), 1);
        assert!(m[7].get_bool("hidden").unwrap());
        assert_eq!(m[14].get_str("host").unwrap(), "127.0.0.15:27017");
    }
}
