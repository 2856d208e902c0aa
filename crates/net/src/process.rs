//! What a process reads of its host and asks of it: facts from /proc (Linux) for
//! serverStatus and hostInfo, the file descriptor limit, and the signals that stop it.

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "localhost".to_string())
}

/// (resident, virtual) memory of this process in bytes, from /proc/self/status.
pub fn process_memory_bytes() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmSize:"))
}

pub fn total_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()))
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

pub fn num_cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

pub fn os_release() -> (String, String) {
    let name = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("PRETTY_NAME=")).map(|l| l["PRETTY_NAME=".len()..].trim_matches('"').to_string()))
        .unwrap_or_else(|| "Linux".into());
    let version = std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default();
    (name, version)
}

/// Raise RLIMIT_NOFILE to the hard limit so that many client connections can be held open.
pub fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let wanted = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
                return wanted.rlim_cur;
            }
        }
        lim.rlim_cur
    }
}

/// Resolves on SIGINT or SIGTERM: a server then shuts down cleanly.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// hostInfo's reply: this host's system and OS, as mongod shows them.
pub fn host_info(hostname: &str) -> bson::Document {
    let (os_name, os_version) = os_release();
    let mem_mb = (total_memory_bytes() / (1024 * 1024)) as i64;
    bson::doc! {
        "system": {
            "currentTime": bson::DateTime::now(),
            "hostname": hostname,
            "cpuAddrSize": 64,
            "memSizeMB": mem_mb,
            "memLimitMB": mem_mb,
            "numCores": num_cores() as i32,
            "cpuArch": std::env::consts::ARCH,
            "numaEnabled": false,
        },
        "os": { "type": "Linux", "name": os_name, "version": os_version },
        "extra": {},
    }
}
