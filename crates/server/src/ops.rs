//! In-progress operations: what currentOp reports and killOp interrupts. Every command runs
//! with an `OpCtx` carrying its deadline (maxTimeMS) and kill flag; long loops call `check()`.

use common::{Code, Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

pub struct OpInfo {
    pub opid: u32,
    pub connection_id: u64,
    pub client: std::net::SocketAddr,
    pub app_name: Option<String>,
    pub op: &'static str,
    pub ns: String,
    /// The whole request; currentOp shows a bounded copy (`truncated_command`).
    pub command: Arc<bson::Document>,
    pub started: Instant,
    pub started_wall: SystemTime,
    pub killed: AtomicBool,
}

#[derive(Default)]
pub struct OpRegistry {
    next: AtomicU32,
    ops: Mutex<HashMap<u32, Arc<OpInfo>>>,
}

/// Registration guard: the op leaves currentOp when this drops.
pub struct OpCtx<'a> {
    registry: &'a OpRegistry,
    pub info: Arc<OpInfo>,
    pub deadline: Option<Instant>,
}

impl OpRegistry {
    #[allow(clippy::too_many_arguments)]
    pub fn begin<'a>(
        &'a self,
        connection_id: u64,
        client: std::net::SocketAddr,
        app_name: Option<String>,
        op: &'static str,
        ns: String,
        command: Arc<bson::Document>,
        deadline: Option<Instant>,
    ) -> OpCtx<'a> {
        let opid = self.next.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let info = Arc::new(OpInfo {
            opid,
            connection_id,
            client,
            app_name,
            op,
            ns,
            command,
            started: Instant::now(),
            started_wall: SystemTime::now(),
            killed: AtomicBool::new(false),
        });
        self.ops.lock().insert(opid, info.clone());
        OpCtx { registry: self, info, deadline }
    }

    pub fn kill(&self, opid: u32) -> bool {
        match self.ops.lock().get(&opid) {
            Some(op) => {
                op.killed.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    pub fn snapshot(&self) -> Vec<Arc<OpInfo>> {
        let mut v: Vec<_> = self.ops.lock().values().cloned().collect();
        v.sort_by_key(|o| o.opid);
        v
    }
}

impl OpCtx<'_> {
    /// Fails with MaxTimeMSExpired past the deadline and Interrupted once killOp was called.
    pub fn check(&self) -> Result<()> {
        if self.info.killed.load(Ordering::Relaxed) {
            return Err(Error::new(Code::Interrupted, "operation was interrupted"));
        }
        if let Some(d) = self.deadline {
            if Instant::now() >= d {
                return Err(Error::new(Code::MaxTimeMSExpired, "operation exceeded time limit"));
            }
        }
        Ok(())
    }
}

impl Drop for OpCtx<'_> {
    fn drop(&mut self) {
        self.registry.ops.lock().remove(&self.info.opid);
    }
}

const COMMAND_COPY_SIZE_MAX_BYTES: usize = 1024;

/// A bounded copy of a command for currentOp: huge insert batches are cut off with
/// `$truncated`, as MongoDB does.
pub fn truncated_command(cmd: &bson::Document) -> bson::Document {
    let mut out = bson::Document::new();
    let mut size = 0usize;
    for (k, v) in cmd {
        let approx = match v {
            bson::Bson::Array(a) => a.len() * 64,
            bson::Bson::Document(d) => d.len() * 32,
            bson::Bson::String(s) => s.len(),
            _ => 16,
        };
        size += approx + k.len();
        if size > COMMAND_COPY_SIZE_MAX_BYTES {
            out.insert("$truncated", true);
            break;
        }
        out.insert(k.clone(), v.clone());
    }
    out
}
