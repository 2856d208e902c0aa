//! `shoal cluster up|down|status`: a local replica set of any shape in one command. Member i
//! listens on 127.0.0.(i+1) at one port, keeps its data in `<dir>/m<i>` and its log in
//! `<dir>/m<i>.log`; `<dir>/cluster.pids` lists each member's process and host for `down`
//! and `status`.

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
}

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

async fn up(a: UpArgs) -> Result<(), String> {
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
    if pids_file(&a.dir).exists() {
        return Err(format!("a cluster is already up in {} (shoal cluster down --dir {})", a.dir.display(), a.dir.display()));
    }
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("cannot create {}: {e}", a.dir.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let hosts: Vec<String> = (0..a.members).map(|i| host(i, a.port)).collect();
    let mut pids = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let data = a.dir.join(format!("m{i}"));
        std::fs::create_dir_all(&data).map_err(|e| format!("cannot create {}: {e}", data.display()))?;
        let log = std::fs::File::create(a.dir.join(format!("m{i}.log"))).map_err(|e| e.to_string())?;
        let ip = h.rsplit_once(':').map(|(ip, _)| ip).unwrap_or("127.0.0.1");
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["serve", "--bind_ip", ip, "--port", &a.port.to_string(), "--replSet", &a.repl_set, "--wiredTigerCacheSizeGB", &a.cache_size_gb.to_string(), "--dbpath"])
            .arg(&data)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        // Its own process group: the members outlive this command and a Ctrl-C in its terminal.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().map_err(|e| format!("cannot start member {i}: {e}"))?;
        pids.push(format!("{} {h}", child.id()));
    }
    std::fs::write(pids_file(&a.dir), pids.join("\n")).map_err(|e| e.to_string())?;
    let result = async {
        let deadline = Instant::now() + READY_TIMEOUT;
        for h in &hosts {
            while tokio::net::TcpStream::connect(h).await.is_err() {
                if Instant::now() >= deadline {
                    return Err(format!("member {h} did not start; see its log in {}", a.dir.display()));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let first = client(&hosts[0]).await?;
        let cfg = set_config(&a.repl_set, &hosts, voters, a.hidden, match a.chaining {
            ChainingArg::On => ChainingMode::On,
            ChainingArg::Off => ChainingMode::Off,
            ChainingArg::Auto => ChainingMode::Auto,
        });
        first.database("admin").run_command(doc! {"replSetInitiate": cfg}).await.map_err(|e| format!("replSetInitiate: {e}"))?;
        loop {
            let s = first.database("admin").run_command(doc! {"replSetGetStatus": 1}).await.map_err(|e| e.to_string())?;
            let states = member_states(&s);
            if states.iter().filter(|s| *s == "PRIMARY").count() == 1 && states.iter().all(|s| s == "PRIMARY" || s == "SECONDARY") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("the set did not settle within {READY_TIMEOUT:?}: {states:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    .await;
    if let Err(e) = result {
        let _ = down(&a.dir);
        return Err(e);
    }
    println!("mongodb://{}/?replicaSet={}", hosts.join(","), a.repl_set);
    Ok(())
}

async fn client(host: &str) -> Result<mongodb::Client, String> {
    mongodb::Client::with_uri_str(format!("mongodb://{host}/?directConnection=true&serverSelectionTimeoutMS=5000")).await.map_err(|e| e.to_string())
}

fn member_states(status: &Document) -> Vec<String> {
    status.get_array("members").map(|m| m.iter().filter_map(|d| d.as_document()?.get_str("stateStr").ok().map(str::to_string)).collect()).unwrap_or_default()
}

/// (pid, host) of each member.
fn read_pids(dir: &Path) -> Result<Vec<(i32, String)>, String> {
    let text = std::fs::read_to_string(pids_file(dir)).map_err(|e| format!("no cluster in {}: {e}", dir.display()))?;
    Ok(text.lines().filter_map(|l| l.trim().split_once(' ')).filter_map(|(p, h)| Some((p.parse().ok()?, h.to_string()))).collect())
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn down(dir: &Path) -> Result<(), String> {
    let pids: Vec<i32> = read_pids(dir)?.into_iter().map(|(p, _)| p).collect();
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
    println!("stopped {} members", pids.len());
    Ok(())
}

async fn status(dir: &Path) -> Result<(), String> {
    // Ask the members in turn until one answers (any member knows the whole set).
    let mut last_error = String::from("no member answered");
    for (pid, host) in read_pids(dir)? {
        if !alive(pid) {
            continue;
        }
        match client(&host).await {
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
    println!("{:<22} {:<26} {:<22} {}", "member", "state", "sync source", "optime");
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
