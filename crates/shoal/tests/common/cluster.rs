//! Sharded clusters for tests: `shoal cluster up --shards N` (config servers, N shard sets,
//! a router) as real processes, stopped when dropped, and more routers beside it.

use super::*;
use std::path::PathBuf;
use std::process::Command;

/// A cluster started by `shoal cluster up`, stopped when dropped.
pub struct Cluster {
    pub dir: PathBuf,
    pub port: u16,
    pub shards: usize,
    /// This cluster's block of ports, claimed while it lives (`claim_port_block`).
    _port_claim: std::fs::File,
}

/// Claim a block of `ports` consecutive free ports (the router's, the config servers',
/// then one per shard). Blocks come from below the kernel's ephemeral range (32768 and up),
/// where other tests' servers (`free_port`) and every client's own end take theirs. Test
/// processes run side by side (nextest runs each test in its own), so a block is claimed
/// by an exclusive lock on a file named after it, held until the returned file is dropped.
pub fn claim_port_block(ports: u16) -> (u16, std::fs::File) {
    use std::os::fd::AsRawFd;
    const BLOCK_PORTS: u16 = 40;
    const BLOCKS: u16 = 300;
    assert!(ports <= BLOCK_PORTS);
    let dir = std::env::temp_dir().join("shoal-test-port-blocks");
    std::fs::create_dir_all(&dir).unwrap();
    let first = (std::process::id() % BLOCKS as u32) as u16;
    for i in 0..BLOCKS {
        let block = (first + i) % BLOCKS;
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(block.to_string())).unwrap();
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        let port = 20_000 + block * BLOCK_PORTS;
        if (0..ports).all(|i| std::net::TcpListener::bind(("127.0.0.1", port + i)).is_ok()) {
            return (port, file);
        }
    }
    panic!("no free block of {ports} ports between 20000 and {}", 20_000 + BLOCKS * BLOCK_PORTS);
}

impl Cluster {
    pub fn up(shards: usize) -> Cluster {
        Cluster::up_with(shards, 1)
    }

    pub fn up_with(shards: usize, replicas: usize) -> Cluster {
        let (port, port_claim) = claim_port_block(shards as u16 + 2);
        let dir = std::env::temp_dir().join(format!("shoal-sharding-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let up = Command::new(binary_path())
            .args([
                "cluster",
                "up",
                "--shards",
                &shards.to_string(),
                "--replicas",
                &replicas.to_string(),
                "--port",
                &port.to_string(),
                "--dir",
                dir.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(up.status.success(), "cluster up failed: {}", String::from_utf8_lossy(&up.stderr));
        assert_eq!(String::from_utf8_lossy(&up.stdout).trim(), format!("mongodb://127.0.0.1:{port}/"));
        Cluster { dir, port, shards, _port_claim: port_claim }
    }

    pub async fn client(&self) -> mongodb::Client {
        mongodb::Client::with_uri_str(format!("mongodb://127.0.0.1:{}/", self.port)).await.unwrap()
    }

    /// A direct connection to shard `i`'s only member.
    pub async fn shard(&self, i: usize) -> mongodb::Client {
        mongodb::Client::with_uri_str(format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port + 2 + i as u16)).await.unwrap()
    }

    /// The pid of the process listening on `host`.
    pub fn pid_of(&self, host: &str) -> i32 {
        let pids = std::fs::read_to_string(self.dir.join("cluster.pids")).unwrap();
        pids.lines().filter(|l| l.split_whitespace().nth(1) == Some(host)).filter_map(|l| l.split_whitespace().next()?.parse().ok()).next_back().unwrap()
    }

    pub fn router_pid(&self) -> i32 {
        let pids = std::fs::read_to_string(self.dir.join("cluster.pids")).unwrap();
        pids.lines().filter(|l| l.ends_with(" router")).filter_map(|l| l.split_whitespace().next()?.parse().ok()).next_back().unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(binary_path()).args(["cluster", "down", "--dir", self.dir.to_str().unwrap()]).output();
        // SHOAL_KEEP=1 keeps the members' logs for a failed test.
        if std::env::var_os("SHOAL_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A process the test started, killed when dropped (a failed test leaves none behind).
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start another router on a free port for the cluster's config servers.
pub fn second_router(cluster: &Cluster) -> (Proc, u16) {
    let port = free_port();
    let configdb = format!("cfg/127.0.0.1:{}", cluster.port + 1);
    let log = std::fs::File::create(cluster.dir.join(format!("router-{port}.log"))).unwrap();
    let child = Proc(
        Command::new(binary_path())
            .args(["router", "--configdb", &configdb, "--port", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "the second router did not listen");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (child, port)
}
