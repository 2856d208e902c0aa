//! Fault injection on this member's links to other members: added latency, message loss
//! and partitions, per destination host. The kernel here has no netem, so tests make slow
//! or broken networks with this instead. Faults apply only to connections this member
//! opens to peers (heartbeats, votes, oplog fetching, progress reports), which is enough to
//! cut or slow any link in either direction: each side of a link is set on its own member.
//!
//! Set with `configureFailPoint: "replLink"`, which needs `--setParameter
//! enableTestCommands=1`, as mongod's fail points do. `Hang` is the mechanism of the fail
//! points that hold an operation in one place; each feature declares its own.

use common::{Code, Error, Result};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkFault {
    /// Added to each message in each direction.
    pub delay_ms: u64,
    /// Chance (0-100) that a message is lost: the request then fails as a timeout would.
    pub loss_percent: u32,
    /// No message gets through.
    pub partitioned: bool,
}

static FAULTS: LazyLock<RwLock<HashMap<String, LinkFault>>> = LazyLock::new(Default::default);

/// A fail point that holds an operation at one place while it is on, and counts the
/// operations it held, as mongod's fail points count their hits.
pub struct Hang {
    on: std::sync::atomic::AtomicBool,
    held: std::sync::atomic::AtomicU64,
}

impl Default for Hang {
    fn default() -> Hang {
        Hang::new()
    }
}

impl Hang {
    pub const fn new() -> Hang {
        Hang { on: std::sync::atomic::AtomicBool::new(false), held: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Turn it on or off; returns how many operations it has held so far.
    pub fn set(&self, on: bool) -> u64 {
        self.on.store(on, std::sync::atomic::Ordering::Relaxed);
        self.held.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many operations it has held so far.
    pub fn set_count(&self) -> u64 {
        self.held.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn enter(&self) -> bool {
        let on = self.on.load(std::sync::atomic::Ordering::Relaxed);
        if on {
            self.held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        on
    }

    /// Wait on this thread while it is on; `check` ends the wait early (the operation was
    /// killed or timed out).
    pub fn hold(&self, check: impl Fn() -> Result<()>) -> Result<()> {
        if self.enter() {
            while self.on.load(std::sync::atomic::Ordering::Relaxed) {
                check()?;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Wait, as a task, while it is on.
    pub async fn hold_async(&self) {
        if self.enter() {
            while self.on.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Set the fault on the link to `host` (`None` clears it); `"*"` is every host.
pub fn set(host: &str, fault: Option<LinkFault>) {
    let mut f = FAULTS.write();
    match fault {
        Some(l) if l != LinkFault::default() => {
            f.insert(host.to_string(), l);
        }
        _ => {
            f.remove(host);
        }
    }
}

fn get(host: &str) -> Option<LinkFault> {
    let f = FAULTS.read();
    if f.is_empty() {
        return None;
    }
    f.get(host).or_else(|| f.get("*")).cloned()
}

fn cut(host: &str) -> Error {
    Error::new(Code::HostUnreachable, format!("link to {host} is partitioned (fault injection)"))
}

pub async fn before_connect(host: &str) -> Result<()> {
    match get(host) {
        Some(f) if f.partitioned => Err(cut(host)),
        Some(f) if f.delay_ms > 0 => {
            tokio::time::sleep(Duration::from_millis(f.delay_ms)).await;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Before a request goes out: the outbound half of the delay, or a loss.
pub async fn before_send(host: &str) -> Result<()> {
    let Some(f) = get(host) else { return Ok(()) };
    if f.partitioned {
        return Err(cut(host));
    }
    if f.loss_percent > 0 && rand::random::<u32>() % 100 < f.loss_percent {
        return Err(Error::new(Code::NetworkTimeout, format!("message to {host} lost (fault injection)")));
    }
    if f.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(f.delay_ms)).await;
    }
    Ok(())
}

/// After a reply arrived: the return half of the delay, or a partition that began meanwhile.
pub async fn after_receive(host: &str) -> Result<()> {
    let Some(f) = get(host) else { return Ok(()) };
    if f.partitioned {
        return Err(cut(host));
    }
    if f.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(f.delay_ms)).await;
    }
    Ok(())
}
