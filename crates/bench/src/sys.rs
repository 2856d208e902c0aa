//! Machine facts and CPU accounting: the client's own CPU time (getrusage) and other
//! processes' CPU time from /proc/<pid>/stat, so reports show who used the cores.

use std::time::Duration;

/// CPU time (user + system) this process has used so far.
pub fn self_cpu_time() -> Duration {
    // SAFETY: getrusage writes into a zeroed, properly sized struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

pub fn cpu_count() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// utime + stime of `pid` from /proc/<pid>/stat; None when the process is gone.
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu_ticks(&text).map(|ticks| Duration::from_secs_f64(ticks as f64 / clock_ticks_per_s() as f64))
}

/// Fields 14 and 15 (utime, stime) follow the parenthesised command name, which may itself
/// contain spaces and parentheses: split after the last ')'.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // after ')' the fields start at field 3 (state); utime is field 14 -> index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Describes the machine for reports: CPU model and count, memory, kernel.
#[derive(Debug, Clone, Default)]
pub struct MachineInfo {
    pub cpu_model: String,
    pub cpu_count: usize,
    pub memory_total_bytes: u64,
    pub kernel: String,
    pub os: String,
}

pub fn machine_info() -> MachineInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_total_bytes = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default();
    let os = std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string()))
        .unwrap_or_default();
    MachineInfo { cpu_model, cpu_count: cpu_count(), memory_total_bytes, kernel, os }
}

/// The client's CPU use over a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuUse {
    pub cpu_time_ms: u64,
    pub wall_time_ms: u64,
    /// Share of the whole machine (all cores), percent.
    pub share_of_machine_percent: f64,
    /// Cores kept busy on average.
    pub cores_used: f64,
}

pub fn cpu_use(cpu: Duration, wall: Duration) -> CpuUse {
    let wall_ms = wall.as_millis().max(1) as f64;
    let cpu_ms = cpu.as_millis() as f64;
    let cores_used = cpu_ms / wall_ms;
    CpuUse {
        cpu_time_ms: cpu.as_millis() as u64,
        wall_time_ms: wall.as_millis() as u64,
        share_of_machine_percent: 100.0 * cores_used / cpu_count() as f64,
        cores_used,
    }
}

/// The machine's CPU time so far, from `/proc/stat`'s first line: (busy, idle) in clock
/// ticks, idle counting iowait. None where there is no `/proc/stat`.
pub fn machine_cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    let total: u64 = v.iter().take(8).sum();
    Some((total.saturating_sub(idle), idle))
}

/// The share of the machine's CPU time that was idle between two `machine_cpu_ticks`, in
/// percent.
pub fn idle_percent(before: (u64, u64), after: (u64, u64)) -> f64 {
    let busy = after.0.saturating_sub(before.0) as f64;
    let idle = after.1.saturating_sub(before.1) as f64;
    if busy + idle == 0.0 {
        return 0.0;
    }
    100.0 * idle / (busy + idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_handles_odd_command_names() {
        let stat = "1234 (my (odd) prog) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 100 1000 10 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(300));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn own_process_is_visible() {
        // Burn a little CPU so the counters move.
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_time(std::process::id()).is_some());
        assert!(self_cpu_time() > Duration::ZERO);
        let info = machine_info();
        assert!(info.cpu_count >= 1);
        let u = cpu_use(Duration::from_millis(500), Duration::from_millis(1000));
        assert!((u.cores_used - 0.5).abs() < 1e-9);
    }
}
