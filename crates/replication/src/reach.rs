//! A read on a secondary after a cluster time beyond every entry it has: the time may come
//! from another shard or a router, and this set's primary may log nothing after it for a
//! long while. As mongod's `makeNoopWriteIfNeeded`, the secondary asks the primary to log a
//! no-op after that time (appendOplogNote with `maxClusterTime`), then waits to apply it.

use crate::ReplCoord;
use bson::{doc, Timestamp};
use common::{Code, Error, Result};
use net::peer::PeerConn;
use repl::MemberState;
use std::time::Duration;

/// How long the ask may take; the read's own wait goes on after it either way.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// The note mongod's secondaries ask for.
pub const NOTE: &str = "noop write for afterClusterTime read concern";

/// What the asks so far brought: the primary asked and the newest time it has logged past.
/// One ask at a time per member: reads that queue behind it need none when that primary
/// logged past their time already.
static ASKED: tokio::sync::Mutex<Option<(String, u64)>> = tokio::sync::Mutex::const_new(None);

/// Ask the primary this member knows of to log a no-op after `cluster_time`.
pub async fn ask_primary_to_reach(coord: &ReplCoord, cluster_time: Timestamp) -> Result<()> {
    let host = {
        let inner = coord.inner.lock();
        let config = inner.config.as_ref().ok_or_else(super::not_initialized)?;
        let primary = inner.peers.iter().position(|p| p.view.up && p.view.state == Some(MemberState::Primary));
        match primary {
            Some(p) if p != inner.self_index => config.members[p].host.clone(),
            _ => return Err(Error::new(Code::NotWritablePrimary, "no primary is known to log a no-op at the read's cluster time")),
        }
    };
    let ts = common::optime::ts_value(cluster_time);
    let mut asked = ASKED.lock().await;
    if asked.as_ref().is_some_and(|(h, through)| *h == host && *through >= ts) {
        return Ok(());
    }
    let mut conn = PeerConn::connect(&host, ASK_TIMEOUT).await?;
    let cmd = doc! {"appendOplogNote": 1, "maxClusterTime": cluster_time, "data": {NOTE: 1}};
    conn.command("admin", cmd, ASK_TIMEOUT).await?;
    *asked = Some((host, ts));
    Ok(())
}
